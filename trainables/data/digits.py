"""The ``digits`` dataset: scikit-learn's embedded 8x8 digits, read without importing scikit-learn, in a fixed
stratified train/val split."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from trainables.data.bundle import DataBundle, _make_mixup
from trainables.data.registry import DATASETS, package_file
from trainables.data.seeds import _stratified_prefix
from trainables.data.sets import _ResidentImages, _TensorImages

if TYPE_CHECKING:
    from trainables.config import DataConfig

__all__ = ["digits_raw", "load"]

# The digits train/val split never depends on `fraction_seed`, so every trial of a study
# is scored on the same validation images.
_DIGITS_SPLIT_SEED = 20240601
_DIGITS_VAL_FRACTION = 0.2
_DIGITS_NATIVE_SIZE = 8  # the embedded file's pixel grid (64 columns)


def digits_raw() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's embedded digits as `load_digits()` gives them: (1797, 64) pixel values 0..16, and labels.

    Read straight from the file `load_digits` reads (`sklearn/datasets/data/digits.csv.gz`, 64 pixel columns and
    the label), found without importing scikit-learn: importing it costs 4-12 s of CPU on a small machine, paid
    by every trial process of a study on digits. If the file is not where it has been since scikit-learn 0.x, the
    public `load_digits` is used. tests/trainables/test_data.py pins the two to be equal.
    """
    import gzip

    path = package_file("sklearn", "datasets", "data", "digits.csv.gz")
    if path is not None:
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",")
        return table[:, :-1], table[:, -1].astype(int)
    from sklearn.datasets import load_digits

    raw = load_digits()
    return raw.data, raw.target


@functools.lru_cache(maxsize=4)
def _digits_arrays(img_size: int) -> tuple[torch.Tensor, np.ndarray, torch.Tensor, np.ndarray, float, float]:
    pixels, labels = digits_raw()
    images = torch.from_numpy(pixels.astype(np.float32) / 16.0).view(-1, 1, _DIGITS_NATIVE_SIZE, _DIGITS_NATIVE_SIZE)
    if img_size != _DIGITS_NATIVE_SIZE:
        images = F.interpolate(
            images,
            size=(img_size, img_size),
            mode="bilinear",
            align_corners=False,
            antialias=img_size < _DIGITS_NATIVE_SIZE,
        )
    targets = labels.astype(np.int64)
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


def load(cfg: "DataConfig", root: Path | None, train_indices_for, resident: bool) -> DataBundle:
    """The registry's loader of ``digits``: the embedded images, normalised by their training split's statistics."""
    spec = DATASETS[cfg.name]
    size = spec.default_size if cfg.img_size is None else cfg.img_size
    train_x, train_y, val_x, val_y, mean, std = _digits_arrays(size)
    # One native pixel of translation whatever the resize, so the augmentation means the same.
    pad = 0 if cfg.augment == "none" else max(1, round(size / _DIGITS_NATIVE_SIZE))
    # Padding shows the normalised background value (raw 0), which is what a shifted digit shows.
    background = -mean / std
    indices = train_indices_for(train_y)
    if resident:
        train: Dataset = _ResidentImages(train_x, train_y, indices, pad=pad, fill=background)
        val: Dataset = _ResidentImages(val_x, val_y, np.arange(len(val_y)))
    else:
        if pad:
            train_x = F.pad(train_x, (pad, pad, pad, pad), value=background)
        train = _TensorImages(train_x, train_y, indices, pad=pad)
        val = _TensorImages(val_x, val_y, np.arange(len(val_y)))
    return DataBundle(
        train=train,
        val=val,
        resident=resident,
        num_classes=spec.num_classes,
        in_chans=1,
        img_size=size,
        num_train_full=len(train_y),
        train_indices=indices,
        mixup=_make_mixup(cfg, spec.num_classes),
        mean=(mean,),
        std=(std,),
        name=spec.name,
        classes=tuple(str(c) for c in range(spec.num_classes)),
    )
