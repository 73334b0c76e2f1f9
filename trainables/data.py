"""Datasets for sharpscale: digits, CIFAR-10/100 and ImageFolder trees, fraction subsets and augmentation."""

from __future__ import annotations

import difflib
import functools
import math
import numbers
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from timm.data import Mixup, create_transform
from timm.data.auto_augment import rand_augment_transform
from timm.data.mixup import mixup_target
from torch.utils.data import Dataset
from torchvision import transforms as T
from torchvision.datasets import ImageFolder

from trainables.staging import stage_root

__all__ = [
    "AUGMENTATIONS",
    "DATASETS",
    "DataBundle",
    "DatasetError",
    "fraction_indices",
    "load_dataset",
]

DATASETS = ("digits", "cifar10", "cifar100", "imagefolder", "synthetic")
AUGMENTATIONS = ("none", "basic", "strong")

DatasetName = Literal["digits", "cifar10", "cifar100", "imagefolder", "synthetic"]
Augmentation = Literal["none", "basic", "strong"]
MixupFn = Callable[[torch.Tensor, torch.Tensor], "tuple[torch.Tensor, torch.Tensor]"]

# The true per-pixel statistics of the training sets. The often copied CIFAR-10 std
# (0.2023, 0.1994, 0.2010) is the mean of per-image stds, not the dataset std.
_CIFAR_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)

# The digits train/val split never depends on `fraction_seed`, so every trial of a study
# is scored on the same validation images.
_DIGITS_SPLIT_SEED = 20240601
_DIGITS_VAL_FRACTION = 0.2
_DIGITS_NATIVE_SIZE = 8

_CIFAR_LAYOUT = {
    "cifar10": (
        "<root>/cifar-10-batches-py/{data_batch_1, ..., data_batch_5, test_batch, batches.meta} "
        "(the 'CIFAR-10 python version' pickles), or root pointing at the cifar-10-batches-py folder itself"
    ),
    "cifar100": (
        "<root>/cifar-100-python/{train, test, meta} "
        "(the 'CIFAR-100 python version' pickles), or root pointing at the cifar-100-python folder itself"
    ),
}
_IMAGEFOLDER_LAYOUT = (
    "<root>/train/<class_name>/<image>.jpg|png and <root>/val/<class_name>/<image>.jpg|png "
    "with the same class folders in train and val"
)


class DatasetError(ValueError):
    """A dataset argument or the data on disk is not what sharpscale expects."""


@dataclass(frozen=True, eq=False)
class DataBundle:
    """Everything a trainer needs from a dataset.

    Items of `train` and `val` are `(image, label, index)`: a CHW float32 normalised image, an
    int label and an int index. A train item's index is its position in the FULL training set
    (also inside a fraction subset: SAF's buffer is keyed by it); a val item's index is its
    position in the val set. The default collate turns labels and indices into int64 tensors.
    """

    train: Dataset
    val: Dataset
    num_classes: int
    in_chans: int
    img_size: int
    num_train_full: int
    train_indices: np.ndarray
    mixup: MixupFn | None
    mean: tuple[float, ...]
    std: tuple[float, ...]
    name: str = ""
    classes: tuple[str, ...] = field(default=())

    @property
    def num_train(self) -> int:
        return int(len(self.train_indices))


# --------------------------------------------------------------------------- fractions


def fraction_indices(labels: Sequence[int] | np.ndarray | torch.Tensor, fraction: float, seed: int) -> np.ndarray:
    """Sorted indices of a class-stratified `fraction` of the samples with these `labels`.

    Each class keeps `round(fraction * n_c)` samples, at least one. For one seed the subsets are
    nested: a smaller fraction's subset is contained in a larger one's, so runs at growing
    fractions see growing supersets of the same data.
    """
    _check_fraction(fraction)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise DatasetError(f"`seed` must be an integer >= 0, got seed={seed!r}")
    labels = _as_label_array(labels)
    return _stratified_prefix(labels, float(fraction), int(seed))


def _check_fraction(fraction: object, name: str = "fraction") -> None:
    problem = _fraction_problem(fraction, name)
    if problem:
        raise DatasetError(problem)


def _fraction_problem(fraction: object, name: str = "fraction") -> str | None:
    ok = (
        isinstance(fraction, numbers.Real)
        and not isinstance(fraction, bool)
        and math.isfinite(float(fraction))
        and 0.0 < float(fraction) <= 1.0
    )
    if ok:
        return None
    return (
        f"`{name}` must satisfy 0 < {name} <= 1 (the share of each class to train on), "
        f"got {name}={fraction!r}; use e.g. 0.1 for 10% of every class or 1.0 for all data"
    )


def _as_label_array(labels: object) -> np.ndarray:
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    arr = np.asarray(labels)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise DatasetError(
            f"`labels` must be a non-empty 1-D sequence of integer class labels, "
            f"got shape {arr.shape} and dtype {arr.dtype}"
        )
    return arr.astype(np.int64, copy=False)


def _stratified_prefix(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    # One permutation per class, drawn from one generator in sorted class order, and then a
    # prefix: the permutation does not depend on `fraction`, which is what makes subsets nested.
    rng = np.random.default_rng(seed)
    chosen = []
    for cls in np.unique(labels):
        members = np.flatnonzero(labels == cls)
        order = rng.permutation(members)
        keep = max(1, int(math.floor(fraction * len(members) + 0.5)))
        chosen.append(order[:keep])
    out = np.sort(np.concatenate(chosen)).astype(np.int64)
    out.setflags(write=False)
    return out


# --------------------------------------------------------------------------- datasets


class _IndexedDataset(Dataset):
    """Items `(image, label, index)` for the samples `indices` of a split whose labels are `labels`."""

    def __init__(self, labels: np.ndarray, indices: np.ndarray) -> None:
        self._labels = labels
        self.indices = np.asarray(indices, dtype=np.int64)
        self.targets = labels[self.indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        index = int(self.indices[i])
        return self._image(index), int(self._labels[index]), index

    def _image(self, index: int) -> torch.Tensor:
        raise NotImplementedError


class _TensorImages(_IndexedDataset):
    """Pre-normalised in-memory images; optional random translation by slicing a pre-padded copy."""

    def __init__(self, images: torch.Tensor, labels: np.ndarray, indices: np.ndarray, pad: int = 0) -> None:
        super().__init__(labels, indices)
        self._images = images
        self._pad = pad

    def _image(self, index: int) -> torch.Tensor:
        img = self._images[index]
        if self._pad:
            # Padding was done once at load; a crop is two random offsets and a slice.
            size = img.shape[-1] - 2 * self._pad
            dy, dx = torch.randint(0, 2 * self._pad + 1, (2,)).tolist()
            img = img[:, dy : dy + size, dx : dx + size]
        # The images are a shared cache: hand out a copy the caller may modify.
        return img.clone()


class _UInt8Images(_IndexedDataset):
    """uint8 HWC images in memory, converted to PIL and passed through a torchvision transform."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, indices: np.ndarray, transform: Callable) -> None:
        super().__init__(labels, indices)
        self._images = images
        self.transform = transform

    def _image(self, index: int) -> torch.Tensor:
        return self.transform(Image.fromarray(self._images[index]))


class _FolderImages(_IndexedDataset):
    """Files of a torchvision ImageFolder, loaded on access."""

    def __init__(self, folder, indices: np.ndarray) -> None:
        super().__init__(np.asarray(folder.targets, dtype=np.int64), indices)
        self._folder = folder

    def _image(self, index: int) -> torch.Tensor:
        return self._folder[index][0]


class _SyntheticImages(Dataset):
    """Random normalised images and labels for throughput measurements: no decoding, no augmentation.

    A small pool of images is reused so that memory stays flat at any size; `get_batch` hands out a whole
    batch with one gather (on the GPU after `to_device`), so the loader costs almost nothing next to a step.
    """

    _POOL = 256

    def __init__(self, num_samples: int, num_classes: int, img_size: int, seed: int, keep: np.ndarray | None = None):
        g = torch.Generator().manual_seed(seed)
        self._pool = torch.randn(min(self._POOL, num_samples), 3, img_size, img_size, generator=g)
        self.indices = np.arange(num_samples, dtype=np.int64) if keep is None else np.asarray(keep, dtype=np.int64)
        self.targets = self.indices % num_classes
        self._index = torch.from_numpy(self.indices.copy())
        self._labels = torch.from_numpy(self.targets.copy())

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        index = int(self.indices[i])
        return self._pool[index % len(self._pool)].cpu().clone(), int(self.targets[i]), index

    def to_device(self, device: torch.device) -> None:
        """Keep the pool where the model is: a benchmark then measures the loop, not a host-to-device copy."""
        self._pool, self._labels = self._pool.to(device), self._labels.to(device)

    def get_batch(self, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pos = torch.as_tensor(positions, dtype=torch.int64)
        index = self._index[pos]
        dev = self._pool.device
        images = self._pool.index_select(0, (index % len(self._pool)).to(dev, non_blocking=True))
        return images, self._labels.index_select(0, pos.to(dev, non_blocking=True)), index


def _load_synthetic(img_size: int | None, num_samples: int, num_classes: int, train_indices_for) -> DataBundle:
    size = img_size or 32
    keep = train_indices_for(np.arange(num_samples, dtype=np.int64) % num_classes)
    return DataBundle(
        train=_SyntheticImages(num_samples, num_classes, size, seed=0, keep=keep),
        val=_SyntheticImages(max(num_samples // 8, num_classes), num_classes, size, seed=1),
        num_classes=num_classes, in_chans=3, img_size=size, num_train_full=num_samples,
        train_indices=keep, mixup=None, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), name="synthetic",
    )


# --------------------------------------------------------------------------- mixup


class _BatchMixup(Mixup):
    """timm's batch-mode Mixup that also takes the odd-sized last batch of an epoch."""

    def __call__(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Batch mode pairs sample i with n-1-i, defined for odd n too (the middle sample is
        # paired with itself); timm's even-size assert is there for its per-pair modes.
        lam = self._mix_batch(x)
        return x, mixup_target(target, self.num_classes, lam, self.label_smoothing)


def _make_mixup(alpha: float, num_classes: int) -> MixupFn | None:
    if alpha <= 0:
        return None
    # Label smoothing is the loss's business, not the data's: 0 here.
    return _BatchMixup(mixup_alpha=alpha, cutmix_alpha=0.0, mode="batch", label_smoothing=0.0, num_classes=num_classes)


# --------------------------------------------------------------------------- digits


@functools.lru_cache(maxsize=4)
def _digits_arrays(img_size: int) -> tuple[torch.Tensor, np.ndarray, torch.Tensor, np.ndarray, float, float]:
    from sklearn.datasets import load_digits

    raw = load_digits()
    images = torch.from_numpy(raw.data.astype(np.float32) / 16.0).view(-1, 1, _DIGITS_NATIVE_SIZE, _DIGITS_NATIVE_SIZE)
    if img_size != _DIGITS_NATIVE_SIZE:
        images = F.interpolate(
            images,
            size=(img_size, img_size),
            mode="bilinear",
            align_corners=False,
            antialias=img_size < _DIGITS_NATIVE_SIZE,
        )
    targets = raw.target.astype(np.int64)
    val_idx = _stratified_prefix(targets, _DIGITS_VAL_FRACTION, _DIGITS_SPLIT_SEED)
    train_mask = np.ones(len(targets), dtype=bool)
    train_mask[val_idx] = False
    train_idx = np.flatnonzero(train_mask)
    # Statistics of the full training split, so they do not change with `fraction`.
    train_x = images[torch.tensor(train_idx)]
    mean, std = float(train_x.mean()), float(train_x.std())
    val_x = (images[torch.tensor(val_idx)] - mean) / std
    train_x = (train_x - mean) / std
    train_y, val_y = targets[train_idx], targets[val_idx]
    # Cached and shared by every bundle: read-only so that no caller can alter later trials' data.
    train_y.setflags(write=False)
    val_y.setflags(write=False)
    return train_x.contiguous(), train_y, val_x.contiguous(), val_y, mean, std


def _load_digits(img_size: int | None, augment: str, train_indices_for, mixup_alpha: float) -> DataBundle:
    size = _DIGITS_NATIVE_SIZE if img_size is None else img_size
    train_x, train_y, val_x, val_y, mean, std = _digits_arrays(size)
    pad = 0
    if augment != "none":
        # One native pixel of translation whatever the resize, so the augmentation means the same.
        pad = max(1, round(size / _DIGITS_NATIVE_SIZE))
        # Pad with the normalised background value (raw 0), which is what a shifted digit shows.
        train_x = F.pad(train_x, (pad, pad, pad, pad), value=-mean / std)
    indices = train_indices_for(train_y)
    return DataBundle(
        train=_TensorImages(train_x, train_y, indices, pad=pad),
        val=_TensorImages(val_x, val_y, np.arange(len(val_y))),
        num_classes=10,
        in_chans=1,
        img_size=size,
        num_train_full=len(train_y),
        train_indices=indices,
        mixup=_make_mixup(mixup_alpha, 10) if augment == "strong" else None,
        mean=(mean,),
        std=(std,),
        name="digits",
        classes=tuple(str(c) for c in range(10)),
    )


# --------------------------------------------------------------------------- CIFAR


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


def _describe(path: Path) -> str:
    if not path.exists():
        return "no such file or directory"
    if not path.is_dir():
        return "a file, not a directory"
    entries = sorted(p.name for p in path.iterdir())
    if not entries:
        return "an empty directory"
    shown = ", ".join(entries[:8])
    more = f" (+{len(entries) - 8} more)" if len(entries) > 8 else ""
    return f"a directory containing: {shown}{more}"


def _cifar_error(name: str, path: Path, found: str) -> DatasetError:
    folder = "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"
    return DatasetError(
        f"{name} data at '{path}' is not usable: expected {_CIFAR_LAYOUT[name]}; found {found}. "
        f"Fix: extract the official python-version archive so that '{folder}' is complete, and set "
        f"`root` to the folder that contains '{folder}' (or to '{folder}' itself)."
    )


def _cifar_files(name: str) -> tuple[str, tuple[str, ...], tuple[str, ...], str]:
    if name == "cifar10":
        return "cifar-10-batches-py", tuple(f"data_batch_{i}" for i in range(1, 6)), ("test_batch",), "batches.meta"
    return "cifar-100-python", ("train",), ("test",), "meta"


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
    label_key = "labels" if name == "cifar10" else "fine_labels"
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
    key = "label_names" if name == "cifar10" else "fine_label_names"
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


def _cifar_transforms(augment: str, size: int, mean, std, randaugment: str):
    resize = [T.Resize(size, interpolation=T.InterpolationMode.BICUBIC)] if size != 32 else []
    tail = [T.ToTensor(), T.Normalize(mean, std)]
    eval_tf = T.Compose(resize + tail)
    if augment == "none":
        return eval_tf, eval_tf
    # The classic 4-pixel padding at 32 px, scaled with the image.
    train = resize + [T.RandomCrop(size, padding=max(1, 4 * size // 32)), T.RandomHorizontalFlip()]
    if augment == "strong":
        train.append(_rand_augment(randaugment, size, mean))
    return T.Compose(train + tail), eval_tf


def _rand_augment(config: str, size: int, mean: Sequence[float]):
    # The same hyper-parameters timm's create_transform passes: translation relative to the
    # image size and fill with the dataset mean.
    hparams = dict(translate_const=int(size * 0.45), img_mean=tuple(min(255, round(255 * m)) for m in mean))
    return rand_augment_transform(config, hparams)


def _load_cifar(name: str, root: Path, img_size, augment, train_indices_for, mixup_alpha, randaugment) -> DataBundle:
    num_classes = 10 if name == "cifar10" else 100
    base = _find_cifar_dir(name, root)
    _, train_files, test_files, meta_file = _cifar_files(name)
    absent = [f for f in (*train_files, *test_files, meta_file) if not (base / f).is_file()]
    if absent:
        raise _cifar_error(name, base, f"{_describe(base)}; missing: {', '.join(absent)}")
    classes = _read_cifar_classes(name, base / meta_file, num_classes)
    parts = [_read_cifar_batch(name, base / f, num_classes) for f in train_files]
    train_x = np.concatenate([p[0] for p in parts])
    train_y = np.concatenate([p[1] for p in parts])
    val_parts = [_read_cifar_batch(name, base / f, num_classes) for f in test_files]
    val_x = np.concatenate([p[0] for p in val_parts])
    val_y = np.concatenate([p[1] for p in val_parts])

    size = 32 if img_size is None else img_size
    mean, std = _CIFAR_STATS[name]
    train_tf, eval_tf = _cifar_transforms(augment, size, mean, std, randaugment)
    indices = train_indices_for(train_y)
    return DataBundle(
        train=_UInt8Images(train_x, train_y, indices, train_tf),
        # CIFAR has no separate validation split: val is the official test batch.
        val=_UInt8Images(val_x, val_y, np.arange(len(val_y)), eval_tf),
        num_classes=num_classes,
        in_chans=3,
        img_size=size,
        num_train_full=len(train_y),
        train_indices=indices,
        mixup=_make_mixup(mixup_alpha, num_classes) if augment == "strong" else None,
        mean=mean,
        std=std,
        name=name,
        classes=classes,
    )


# --------------------------------------------------------------------------- ImageFolder


def _imagefolder_error(path: Path, found: str) -> DatasetError:
    return DatasetError(
        f"imagefolder data at '{path}' is not usable: expected {_IMAGEFOLDER_LAYOUT}; found {found}. "
        f"Fix: set `root` to the folder holding 'train' and 'val', each with one sub-folder of images per class."
    )


def _open_folder(split_dir: Path, transform):
    if not split_dir.is_dir():
        raise _imagefolder_error(split_dir, _describe(split_dir))
    try:
        return ImageFolder(str(split_dir), transform=transform)
    except (FileNotFoundError, RuntimeError) as exc:
        raise _imagefolder_error(split_dir, f"{_describe(split_dir)} ({exc})") from exc


def _load_imagefolder(root: Path, img_size, augment, train_indices_for, mixup_alpha, randaugment) -> DataBundle:
    if not root.is_dir():
        raise _imagefolder_error(root, _describe(root))
    size = 224 if img_size is None else img_size
    # Bicubic as in the ViT/DeiT recipes; colour jitter off so that `basic` is crop + flip only.
    common = dict(interpolation="bicubic", mean=_IMAGENET_MEAN, std=_IMAGENET_STD)
    eval_tf = create_transform(size, is_training=False, **common)
    if augment == "none":
        train_tf = eval_tf
    else:
        train_tf = create_transform(
            size,
            is_training=True,
            color_jitter=None,
            auto_augment=randaugment if augment == "strong" else None,
            **common,
        )
    train = _open_folder(root / "train", train_tf)
    val = _open_folder(root / "val", eval_tf)
    if train.classes != val.classes:
        only_train = sorted(set(train.classes) - set(val.classes))
        only_val = sorted(set(val.classes) - set(train.classes))
        raise _imagefolder_error(
            root,
            f"different class folders in train and val (only in train: {only_train}; only in val: {only_val})",
        )
    targets = np.asarray(train.targets, dtype=np.int64)
    indices = train_indices_for(targets)
    num_classes = len(train.classes)
    return DataBundle(
        train=_FolderImages(train, indices),
        val=_FolderImages(val, np.arange(len(val.targets))),
        num_classes=num_classes,
        in_chans=3,
        img_size=size,
        num_train_full=len(targets),
        train_indices=indices,
        mixup=_make_mixup(mixup_alpha, num_classes) if augment == "strong" else None,
        mean=_IMAGENET_MEAN,
        std=_IMAGENET_STD,
        name="imagefolder",
        classes=tuple(train.classes),
    )


# --------------------------------------------------------------------------- entry point


def _closest(value: object, options: Sequence[str]) -> str:
    match = difflib.get_close_matches(str(value), options, n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _argument_problems(name, root, img_size, augment, fraction, fraction_seed, mixup_alpha, randaugment) -> list[str]:
    problems = []
    if name not in DATASETS:
        problems.append(f"`name` must be one of {list(DATASETS)}, got name={name!r}{_closest(name, DATASETS)}")
    if augment not in AUGMENTATIONS:
        problems.append(
            f"`augment` must be one of {list(AUGMENTATIONS)}, got augment={augment!r}{_closest(augment, AUGMENTATIONS)}"
        )
    fraction_problem = _fraction_problem(fraction)
    if fraction_problem:
        problems.append(fraction_problem)
    if isinstance(fraction_seed, bool) or not isinstance(fraction_seed, numbers.Integral) or fraction_seed < 0:
        problems.append(f"`fraction_seed` must be an integer >= 0, got fraction_seed={fraction_seed!r}")
    bad_size = isinstance(img_size, bool) or not isinstance(img_size, numbers.Integral) or img_size < 1
    if img_size is not None and bad_size:
        problems.append(
            f"`img_size` must be None (the dataset's native size) or an integer >= 1, got img_size={img_size!r}"
        )
    if (
        isinstance(mixup_alpha, bool)
        or not isinstance(mixup_alpha, numbers.Real)
        or not math.isfinite(mixup_alpha)
        or mixup_alpha < 0
    ):
        problems.append(
            f"`mixup_alpha` must be a finite number >= 0 (0 turns mixup off), got mixup_alpha={mixup_alpha!r}"
        )
    if name in ("cifar10", "cifar100", "imagefolder") and root is None:
        problems.append(f"`root` is required for name={name!r}: set it to the folder that holds the data")
    if root is not None and not isinstance(root, (str, os.PathLike)):
        problems.append(f"`root` must be a path, got root={root!r}")
    if not isinstance(randaugment, str):
        problems.append(
            f"`randaugment` must be a timm RandAugment string such as 'rand-m9-mstd0.5', "
            f"got randaugment={randaugment!r}"
        )
    elif augment == "strong" and name in ("cifar10", "cifar100", "imagefolder"):
        try:
            _rand_augment(randaugment, 32, _IMAGENET_MEAN)
        except Exception as exc:  # noqa: BLE001 - timm signals a bad string with asserts and ValueErrors
            problems.append(
                f"`randaugment` must be a timm RandAugment string such as 'rand-m9-mstd0.5' "
                f"(sections m, n, p, mstd, mmax, inc, t after 'rand'), got randaugment={randaugment!r} "
                f"({type(exc).__name__}: {exc})"
            )
    return problems


def load_dataset(
    name: DatasetName,
    *,
    root: str | os.PathLike | None = None,
    img_size: int | None = None,
    augment: Augmentation = "basic",
    fraction: float = 1.0,
    fraction_seed: int = 0,
    mixup_alpha: float = 0.8,
    randaugment: str = "rand-m9-mstd0.5",
    synthetic_samples: int = 4096,
    synthetic_classes: int = 10,
) -> DataBundle:
    """Load dataset `name` with a stratified `fraction` of its training set and the chosen augmentation.

    - digits: scikit-learn's 8x8 digits, a fixed stratified 80/20 train/val split, in-memory tensors;
      `img_size` (default 8) resizes once at load. `basic` = random translation by one native
      pixel; `strong` = basic + mixup (no RandAugment on 8x8 glyphs).
    - cifar10 / cifar100: the python-pickle files under `root`; val is the test batch;
      `basic` = pad-and-crop + horizontal flip; `strong` = basic + RandAugment + mixup.
    - synthetic: random images (`synthetic_samples` of them, `synthetic_classes` classes, `img_size`
      default 32), for throughput benchmarks; no augmentation.
    - imagefolder: `root/train/<class>/...` and `root/val/<class>/...`; `basic` = timm's
      Inception-style random-resized crop + flip; `strong` adds RandAugment + mixup;
      `none` uses the eval resize + centre crop for training too.

    `mixup` in the bundle is batch-level and set only for `augment="strong"` with
    `mixup_alpha > 0`; it mixes `x` in place and returns soft targets. Every argument problem is
    reported in one DatasetError; a bad path or file raises DatasetError naming the path, the
    expected layout, what was found and the fix.
    """
    problems = _argument_problems(name, root, img_size, augment, fraction, fraction_seed, mixup_alpha, randaugment)
    if problems:
        raise DatasetError("load_dataset got invalid arguments:\n  - " + "\n  - ".join(problems))

    def train_indices_for(labels: np.ndarray) -> np.ndarray:
        return _stratified_prefix(labels, float(fraction), int(fraction_seed))

    mixup_alpha = float(mixup_alpha)
    if name == "digits":
        return _load_digits(img_size, augment, train_indices_for, mixup_alpha)
    if name == "synthetic":
        return _load_synthetic(img_size, int(synthetic_samples), int(synthetic_classes), train_indices_for)
    path = stage_root(root)
    if name in ("cifar10", "cifar100"):
        return _load_cifar(name, path, img_size, augment, train_indices_for, mixup_alpha, randaugment)
    return _load_imagefolder(path, img_size, augment, train_indices_for, mixup_alpha, randaugment)
