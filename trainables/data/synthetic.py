"""The ``synthetic`` dataset: random images for throughput measurements, no decoding and no augmentation."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.utils.data import Dataset

from trainables.data.bundle import DataBundle, _to_device
from trainables.data.registry import DATASETS

if TYPE_CHECKING:
    from trainables.config import DataConfig

__all__ = ["load"]


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

    def unaugmented(self) -> "_SyntheticImages":
        return self  # never augmented

    def get_batch(self, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pos = torch.as_tensor(positions, dtype=torch.int64)
        index = self._index[pos]
        dev = self._pool.device
        images = self._pool.index_select(0, _to_device(index % len(self._pool), dev))
        return images, self._labels.index_select(0, _to_device(pos, dev)), index


def load(cfg: "DataConfig", root: Path | None, train_indices_for, resident: bool) -> DataBundle:
    """The registry's loader of ``synthetic``: random images of ``cfg.synthetic_classes`` classes."""
    spec = DATASETS[cfg.name]
    size, num_samples, num_classes = cfg.img_size or spec.default_size, cfg.synthetic_samples, cfg.synthetic_classes
    keep = train_indices_for(np.arange(num_samples, dtype=np.int64) % num_classes)
    return DataBundle(
        train=_SyntheticImages(num_samples, num_classes, size, seed=0, keep=keep),
        val=_SyntheticImages(max(num_samples // 8, num_classes), num_classes, size, seed=1),
        num_classes=num_classes,
        in_chans=3,
        img_size=size,
        num_train_full=num_samples,
        train_indices=keep,
        mixup=None,
        mean=spec.mean,
        std=spec.std,
        name=spec.name,
    )
