"""The CIFAR-shaped datasets (cifar10, cifar100): their python-version pickles read safely and checked, cached per
process, in the host or device-resident form."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from trainables.data.bundle import DataBundle, DatasetError, _describe, _make_mixup
from trainables.data.registry import DATASETS, Archive, expected_layout, rand_augment_hparams
from trainables.data.sets import _ResidentImages, _UInt8Images

if TYPE_CHECKING:
    from trainables.config import DataConfig

__all__ = ["load"]


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays only: a path in a study file must not run code."""

    _ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        # Python 3 writes bytes as _codecs.encode(...) under pickle protocol 2.
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")
        return super().find_class(module, name)


def _cifar_error(name: str, path: Path, found: str) -> DatasetError:
    folder = _archive(name).folder
    return DatasetError(
        f"{name} data at '{path}' is not usable: expected {expected_layout(name)}; found {found}. "
        f"Fix: extract the official python-version archive so that '{folder}' is complete, and set "
        f"`root` to the folder that contains '{folder}' (or to '{folder}' itself)."
    )


def _archive(name: str) -> Archive:
    archive = DATASETS[name].archive
    assert archive is not None  # a CIFAR-shaped entry has its archive
    return archive


def _cifar_files(name: str) -> tuple[str, tuple[str, ...], tuple[str, ...], str]:
    a = _archive(name)
    (meta_file,) = a.parts["meta"]
    return a.folder, a.parts["train"], a.parts["test"], meta_file


def _read_pickle(name: str, path: Path) -> dict:
    try:
        with open(path, "rb") as fh:
            # encoding="bytes": the official files were written by Python 2.
            obj = _RestrictedUnpickler(fh, encoding="bytes").load()
    except OSError as exc:
        raise _cifar_error(name, path, f"a file that cannot be read ({exc.strerror or exc})") from exc
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a corrupt file
        raise _cifar_error(name, path, f"a file that is not a valid pickle ({type(exc).__name__}: {exc})") from exc
    if not isinstance(obj, dict):
        raise _cifar_error(name, path, f"a pickle of {type(obj).__name__}, not a dict")
    return {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in obj.items()}


def _read_cifar_batch(name: str, path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    label_key = _archive(name).keys["labels"]
    batch = _read_pickle(name, path)
    missing = [k for k in ("data", label_key) if k not in batch]
    if missing:
        raise _cifar_error(name, path, f"a dict without the key(s) {missing} (keys: {sorted(map(str, batch))})")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch[label_key])
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or not np.issubdtype(data.dtype, np.integer):
        raise _cifar_error(
            name, path, f"'data' of shape {data.shape} and dtype {data.dtype}, not an (N, 3072) uint8 array"
        )
    if labels.shape != (data.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise _cifar_error(
            name, path, f"'{label_key}' of shape {labels.shape} and dtype {labels.dtype}, not {data.shape[0]} integers"
        )
    if data.size and (data.min() < 0 or data.max() > 255):
        raise _cifar_error(name, path, "'data' values outside 0..255")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise _cifar_error(
            name, path, f"'{label_key}' values in {labels.min()}..{labels.max()}, outside 0..{num_classes - 1}"
        )
    # Stored channel-major (R plane, G plane, B plane); PIL wants HWC.
    images = data.astype(np.uint8, copy=False).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels.astype(np.int64)


def _read_cifar_classes(name: str, path: Path, num_classes: int) -> tuple[str, ...]:
    key = _archive(name).keys["class_names"]
    meta = _read_pickle(name, path)
    names = meta.get(key)
    if not isinstance(names, (list, tuple)) or len(names) != num_classes:
        raise _cifar_error(name, path, f"no list of {num_classes} class names under '{key}'")
    return tuple(n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in names)


def _find_cifar_dir(name: str, root: Path) -> Path:
    folder, train_files, _, _ = _cifar_files(name)
    if (root / folder).is_dir():
        return root / folder
    if root.is_dir() and (root.name == folder or (root / train_files[0]).exists()):
        return root
    raise _cifar_error(name, root, _describe(root))


def _cifar_pad(size: int) -> int:
    # The classic 4-pixel padding at 32 px, scaled with the image.
    return max(1, 4 * size // 32)


def _cifar_host_splits(cfg: "DataConfig", train: tuple, val: tuple, size: int, mean) -> tuple[Dataset, Dataset]:
    """The host-side (DataLoader worker) form of CIFAR's splits; items are CHW uint8, normalised on the device."""
    from torchvision import transforms as T

    # uint8 out: workers collate and pin a quarter of the bytes; DataBundle.prepare normalises on the device.
    rand_aug = [_rand_augment(cfg.randaugment, size, mean), T.PILToTensor()] if cfg.augment == "strong" else []
    if size == 32:
        # Native size: crop and flip by slicing (same draws, same pixels as torchvision's), PIL only for RandAugment.
        pad = 0 if cfg.augment == "none" else _cifar_pad(size)
        return (
            _UInt8Images(*train, T.Compose(rand_aug) if rand_aug else None, pad=pad, flip=pad > 0),
            _UInt8Images(*val, None),
        )
    resize = [T.Resize(size, interpolation=T.InterpolationMode.BICUBIC)]
    eval_tf = T.Compose([*resize, T.PILToTensor()])
    train_tf = eval_tf
    if cfg.augment != "none":
        crop_flip = [T.RandomCrop(size, padding=_cifar_pad(size)), T.RandomHorizontalFlip()]
        train_tf = T.Compose([*resize, *crop_flip, *(rand_aug or [T.PILToTensor()])])
    return _UInt8Images(*train, train_tf, plain_transform=eval_tf), _UInt8Images(*val, eval_tf)


def _rand_augment(config: str, size: int, mean: Sequence[float]):
    from timm.data.auto_augment import rand_augment_transform

    return rand_augment_transform(config, rand_augment_hparams(size, mean))


# (name, folder, files' stamp) -> the arrays _cifar_arrays read; a Tune actor runs trial after trial in one process,
# and reading and checking the pickles took 1.2-1.6 s a trial on an H200 host (docs/benchmarks.md, issue 21).
_CIFAR_CACHE: dict[tuple, tuple] = {}
_CIFAR_CACHE_SIZE = 2  # CIFAR-10 and CIFAR-100 side by side; ~180 MB each


def _cifar_arrays(name: str, base: str, stamp: tuple) -> tuple:
    """(classes, train images, train labels, val images, val labels) of the CIFAR folder `base`, read once per
    process for the files' `stamp`. Shared by every bundle: read-only so that no caller can alter later trials' data."""
    key = (name, base, stamp)
    if key in _CIFAR_CACHE:
        _CIFAR_CACHE[key] = _CIFAR_CACHE.pop(key)  # the most recently used last
        return _CIFAR_CACHE[key]
    num_classes = DATASETS[name].num_classes
    folder = Path(base)
    _, train_files, test_files, meta_file = _cifar_files(name)
    classes = _read_cifar_classes(name, folder / meta_file, num_classes)
    arrays = []
    for files in (train_files, test_files):
        parts = [_read_cifar_batch(name, folder / f, num_classes) for f in files]
        arrays += [np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])]
    for a in arrays:
        a.setflags(write=False)
    while len(_CIFAR_CACHE) >= _CIFAR_CACHE_SIZE:
        _CIFAR_CACHE.pop(next(iter(_CIFAR_CACHE)))
    _CIFAR_CACHE[key] = (classes, *arrays)
    return _CIFAR_CACHE[key]


def load(cfg: "DataConfig", root: Path | None, train_indices_for, resident: bool) -> DataBundle:
    """The registry's loader of CIFAR-shaped datasets (cifar10, cifar100): the pickles its archive names."""
    name = cfg.name
    spec = DATASETS[name]
    num_classes = spec.num_classes
    assert root is not None  # the registry entry needs a root; DataConfig enforces it
    base = _find_cifar_dir(name, root)
    _, train_files, test_files, meta_file = _cifar_files(name)
    absent = [f for f in (*train_files, *test_files, meta_file) if not (base / f).is_file()]
    if absent:
        raise _cifar_error(name, base, f"{_describe(base)}; missing: {', '.join(absent)}")
    # The files as they are now: a file rewritten since the last read is read again.
    stamp = tuple(
        (f, (st := (base / f).stat()).st_mtime_ns, st.st_size) for f in (*train_files, *test_files, meta_file)
    )
    classes, train_x, train_y, val_x, val_y = _cifar_arrays(name, str(base.resolve()), stamp)

    size = spec.default_size if cfg.img_size is None else cfg.img_size
    mean, std = spec.mean, spec.std
    indices = train_indices_for(train_y)
    # CIFAR has no separate validation split: val is the official test batch.
    if resident:

        def chw(images: np.ndarray) -> torch.Tensor:
            # One copy, writable (the cached arrays are read-only): the device copy is made from it.
            return torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))

        pad = 0 if cfg.augment == "none" else _cifar_pad(size)
        train: Dataset = _ResidentImages(chw(train_x), train_y, indices, pad=pad, flip=pad > 0)
        val: Dataset = _ResidentImages(chw(val_x), val_y, np.arange(len(val_y)))
    else:
        train, val = _cifar_host_splits(
            cfg, (train_x, train_y, indices), (val_x, val_y, np.arange(len(val_y))), size, mean
        )
    return DataBundle(
        train=train,
        val=val,
        resident=resident,
        num_classes=num_classes,
        in_chans=3,
        img_size=size,
        num_train_full=len(train_y),
        train_indices=indices,
        mixup=_make_mixup(cfg, num_classes),
        mean=mean,
        std=std,
        name=name,
        classes=classes,
    )
