"""The ``imagefolder`` dataset: a train/val tree of class folders, or what `data prepare` made of one, decoded on the
host or on the device (through DALI or torch)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Dataset

from trainables.data.bundle import DataBundle, DatasetError, _describe, _make_mixup
from trainables.data.registry import DATASETS, expected_layout
from trainables.data.sets import _FolderImages, _PixelImages

if TYPE_CHECKING:
    from trainables.config import DataConfig

__all__ = ["load"]


def _imagefolder_error(path: Path, found: str) -> DatasetError:
    return DatasetError(
        f"imagefolder data at '{path}' is not usable: expected {expected_layout('imagefolder')} (or a folder "
        f"`sharpscale data prepare` wrote from one); found {found}. "
        f"Fix: set `root` to the folder holding 'train' and 'val', each with one sub-folder of images per class."
    )


def _open_folder(split_dir: Path, transform):
    from torchvision.datasets import ImageFolder

    if not split_dir.is_dir():
        raise _imagefolder_error(split_dir, _describe(split_dir))
    try:
        return ImageFolder(str(split_dir), transform=transform)
    except (FileNotFoundError, RuntimeError) as exc:
        raise _imagefolder_error(split_dir, f"{_describe(split_dir)} ({exc})") from exc


def load(cfg: "DataConfig", root: Path | None, train_indices_for, resident: bool) -> DataBundle:
    """The registry's loader of ``imagefolder``: a train/val tree of class folders, or what `data prepare` made of one."""
    from timm.data import create_transform

    spec = DATASETS[cfg.name]
    assert root is not None  # the registry entry needs a root; DataConfig enforces it
    augment = cfg.augment
    if not root.is_dir():
        raise _imagefolder_error(root, _describe(root))
    size = spec.default_size if cfg.img_size is None else cfg.img_size
    from trainables.data.prepare import read_manifest

    prepared = read_manifest(root)
    # Bicubic as in the ViT/DeiT recipes; colour jitter off so that `basic` is crop + flip only.
    common = dict(interpolation="bicubic", mean=spec.mean, std=spec.std)
    eval_tf = create_transform(size, is_training=False, **common)
    if augment == "none":
        train_tf = eval_tf
    else:
        train_tf = create_transform(
            size,
            is_training=True,
            color_jitter=None,
            auto_augment=cfg.randaugment if augment == "strong" else None,
            **common,
        )
    if prepared is not None and prepared.form == "pixels":
        return _load_pixels(cfg, root, prepared, size, train_tf, eval_tf, train_indices_for)
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
    val_indices = np.arange(len(val.targets))
    if cfg.decode == "device" and cfg.loader == "dali":
        from trainables.data.dali import FolderDali

        stats = dict(mean=spec.mean, std=spec.std)
        train_split: Dataset = FolderDali(
            train.samples, indices, size, train=augment != "none", rand_augment=_rand_augment_of(train_tf), **stats
        )
        val_split: Dataset = FolderDali(val.samples, val_indices, size, train=False, **stats)
    elif cfg.decode == "device":
        from trainables.data.folders import FolderBytes

        train_split = FolderBytes(
            train.samples, indices, size, train=augment != "none", rand_augment=_rand_augment_of(train_tf)
        )
        val_split = FolderBytes(val.samples, val_indices, size, train=False)
    else:
        train_split = _FolderImages(train, indices, plain_transform=eval_tf)
        val_split = _FolderImages(val, val_indices)
    return _folder_bundle(cfg, train_split, val_split, tuple(train.classes), size, len(targets), indices)


def _folder_bundle(cfg, train: Dataset, val: Dataset, classes: tuple, size: int, num_full: int, indices) -> DataBundle:
    """The DataBundle of an image folder, in any of its forms."""
    spec = DATASETS[cfg.name]
    return DataBundle(
        train=train,
        val=val,
        num_classes=len(classes),
        in_chans=3,
        img_size=size,
        num_train_full=num_full,
        train_indices=indices,
        mixup=_make_mixup(cfg, len(classes)),
        mean=spec.mean,
        std=spec.std,
        name=spec.name,
        classes=classes,
    )


def _rand_augment_of(transform) -> Any:
    """The host transform's own RandAugment (its ops, magnitudes, fill and interpolation), for the device to apply."""
    from timm.data.auto_augment import RandAugment

    return next((t for t in getattr(transform, "transforms", ()) if isinstance(t, RandAugment)), None)


def _load_pixels(
    cfg: "DataConfig", root: Path, prepared, size: int, train_tf, eval_tf, train_indices_for
) -> DataBundle:
    """An image folder prepared in the pixel form: the same splits, classes and transforms as the folder it came
    from, read from its pixel files (trainables.data.prepare; each checked as it opens) instead of decoded from files."""
    from trainables.data.prepare import PixelSplit, PrepareError

    train, val = PixelSplit(root / "train", prepared.source), PixelSplit(root / "val", prepared.source)
    classes = tuple(prepared.classes)
    for name, split in (("train", train), ("val", val)):
        if not len(split):
            raise PrepareError(
                f"a folder prepared as pixels at '{root}' holds no {name} images. Fix: prepare a source whose {name}/ "
                "holds images."
            )
        if not (0 <= split.labels.min() and split.labels.max() < len(classes)):
            raise PixelSplit.damaged(prepared.source, f"its {name} labels leave the manifest's {len(classes)} classes")
    indices = train_indices_for(np.asarray(train.labels, dtype=np.int64))
    val_indices = np.arange(len(val))
    if cfg.decode == "device":
        from trainables.data.folders import FolderPixels

        augmented = cfg.augment != "none"
        train_split: Dataset = FolderPixels(
            train, indices, size, train=augmented, rand_augment=_rand_augment_of(train_tf)
        )
        val_split: Dataset = FolderPixels(val, val_indices, size, train=False)
    else:
        train_split = _PixelImages(train, indices, train_tf, plain_transform=eval_tf)
        val_split = _PixelImages(val, val_indices, eval_tf)
    return _folder_bundle(cfg, train_split, val_split, classes, size, len(train), indices)
