"""What a loader hands the loop (DataBundle), the data's errors, and what every loader shares: mixup, host tensors
on the device, a path described in words."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from trainables.errors import UserError

if TYPE_CHECKING:
    from trainables.config import DataConfig

__all__ = ["DataBundle", "DatasetError", "MixupFn"]

MixupFn = Callable[[torch.Tensor, torch.Tensor], "tuple[torch.Tensor, torch.Tensor]"]


class DatasetError(UserError):
    """A dataset argument or the data on disk is not what sharpscale expects."""


@dataclass(frozen=True, eq=False)
class DataBundle:
    """Everything a trainer needs from a dataset.

    Items of `train` and `val` are `(image, label, index)`: a CHW image (float32 and normalised, or
    uint8 pixels that `prepare` normalises on the device), an int label and an int index. A train item's index is its position in the FULL training set
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
    resident: bool = False  # whole splits live on the training device; batches are gathered and augmented there

    @property
    def num_train(self) -> int:
        return int(len(self.train_indices))

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """A batch as the model takes it: uint8 pixels are normalised here, on whatever device they are.

        Host workers hand over uint8 (a quarter of the bytes to collate, pin and copy); the arithmetic is
        torchvision's ToTensor + Normalize, so the result equals the host-side transform's.
        """
        if x.dtype != torch.uint8:
            return x
        mean, std = _stats_on(self.mean, self.std, x.device)
        return x.float().div(255).sub(mean).div(std)


@functools.lru_cache(maxsize=16)
def _stats_on(
    mean: tuple[float, ...], std: tuple[float, ...], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    # Made once per device: a tensor built from host values every step is a pageable copy, which makes the
    # host wait for the device and leaves the device idle while the next step is launched.
    return (torch.tensor(mean, device=device).view(1, -1, 1, 1), torch.tensor(std, device=device).view(1, -1, 1, 1))


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without a stall: through pinned memory, asynchronously, when that is a GPU."""
    if device.type != "cuda":
        return t.to(device)
    # A copy from pageable memory synchronises with the device; one from pinned memory does not (PyTorch's
    # caching host allocator keeps the pinned block until the copy has finished).
    return t.pin_memory().to(device, non_blocking=True)


# --------------------------------------------------------------------------- mixup


@functools.cache
def _batch_mixup_class():
    from timm.data import Mixup
    from timm.data.mixup import mixup_target

    class _BatchMixup(Mixup):
        """timm's batch-mode Mixup that also takes the odd-sized last batch of an epoch."""

        def __call__(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # Batch mode pairs sample i with n-1-i, defined for odd n too (the middle sample is
            # paired with itself); timm's even-size assert is there for its per-pair modes.
            lam = self._mix_batch(x)
            return x, mixup_target(target, self.num_classes, lam, self.label_smoothing)

    return _BatchMixup


def _make_mixup(cfg: "DataConfig", num_classes: int) -> MixupFn | None:
    # Mixup works on whole batches on the training device, after the batch is there (the loop applies it).
    if cfg.augment != "strong" or cfg.mixup_alpha <= 0:
        return None
    # Label smoothing is the loss's business, not the data's: 0 here.
    return _batch_mixup_class()(
        mixup_alpha=cfg.mixup_alpha, cutmix_alpha=0.0, mode="batch", label_smoothing=0.0, num_classes=num_classes
    )


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
