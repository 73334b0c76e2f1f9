"""The ``stripes`` dataset (throwaway, to measure what a new dataset touches): 8x8 grey images of horizontal or
vertical stripes, read from one ``stripes.npz`` under its root."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.utils.data import Dataset

from trainables.data.bundle import DataBundle, DatasetError, _describe, _make_mixup
from trainables.data.registry import DATASETS, expected_layout
from trainables.data.sets import _TensorImages

if TYPE_CHECKING:
    from trainables.config import DataConfig

__all__ = ["load"]


def load(cfg: "DataConfig", root: Path | None, train_indices_for, resident: bool) -> DataBundle:
    """The registry's loader of ``stripes``: the arrays of ``<root>/stripes.npz``, normalised by the registry's."""
    spec = DATASETS[cfg.name]
    assert root is not None  # the registry entry needs a root; DataConfig enforces it
    path = root / "stripes.npz"
    if not path.is_file():
        raise DatasetError(
            f"stripes data at '{root}' is not usable: expected {expected_layout('stripes')}; "
            f"found {_describe(root)}. Fix: set `root` to the folder holding stripes.npz."
        )
    arrays = np.load(path)
    mean, std = spec.mean[0], spec.std[0]

    def images(x: np.ndarray) -> torch.Tensor:
        return (torch.from_numpy(x.astype(np.float32) / 255).unsqueeze(1) - mean) / std

    train_y, val_y = arrays["train_y"].astype(np.int64), arrays["val_y"].astype(np.int64)
    indices = train_indices_for(train_y)
    train: Dataset = _TensorImages(images(arrays["train_x"]), train_y, indices)
    val: Dataset = _TensorImages(images(arrays["val_x"]), val_y, np.arange(len(val_y)))
    return DataBundle(
        train=train,
        val=val,
        num_classes=spec.num_classes,
        in_chans=1,
        img_size=spec.default_size,
        num_train_full=len(train_y),
        train_indices=indices,
        mixup=_make_mixup(cfg, spec.num_classes),
        mean=spec.mean,
        std=spec.std,
        name=spec.name,
        classes=("horizontal", "vertical"),
    )
