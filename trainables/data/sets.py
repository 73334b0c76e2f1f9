"""The in-memory and host-decoded splits every loader builds on: items (image, label, index) read under a batch's
seed, tensors and uint8 arrays on the host, a whole split resident on the device, image-folder and pixel files."""

from __future__ import annotations

import copy
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from trainables.data.bundle import _to_device
from trainables.data.seeds import _seeded_draws

__all__ = ["random_crop_flip"]


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

    def __getitems__(self, positions: list[int]) -> list[tuple[torch.Tensor, int, int]]:
        """A batch's items, as DataLoader's fetcher asks for them; a SeededBatch's random draws made from its seed."""
        seed = getattr(positions, "seed", None)
        if seed is None:
            return [self[i] for i in positions]
        with _seeded_draws(seed, torch_only=self._torch_draws_only()):
            return [self[i] for i in positions]

    def _torch_draws_only(self) -> bool:
        """Whether every random draw of an item comes from torch's generator (no PIL transform, which draws from
        Python's and numpy's too): a batch then seeds, and in the training process saves and restores, that one."""
        return False

    def _image(self, index: int) -> torch.Tensor:
        raise NotImplementedError


class _TensorImages(_IndexedDataset):
    """Pre-normalised in-memory images; optional random translation by slicing a pre-padded copy."""

    def __init__(self, images: torch.Tensor, labels: np.ndarray, indices: np.ndarray, pad: int = 0) -> None:
        super().__init__(labels, indices)
        self._images = images
        self._pad = pad

    def _torch_draws_only(self) -> bool:
        return True

    def _image(self, index: int) -> torch.Tensor:
        img = self._images[index]
        if self._pad:
            # Padding was done once at load; a crop is two random offsets and a slice.
            size = img.shape[-1] - 2 * self._pad
            dy, dx = torch.randint(0, 2 * self._pad + 1, (2,)).tolist()
            img = img[:, dy : dy + size, dx : dx + size]
        # The images are a shared cache: hand out a copy the caller may modify.
        return img.clone()

    def unaugmented(self) -> "_TensorImages":
        """The same samples without the random translation (a view: nothing is copied or read again)."""
        plain = copy.copy(self)
        if self._pad:
            p = self._pad
            plain._images, plain._pad = self._images[..., p:-p, p:-p], 0
        return plain


class _UInt8Images(_IndexedDataset):
    """uint8 HWC images in memory, out as CHW uint8: an optional random crop/flip by slicing, then a PIL transform.

    `pad` > 0: the images are stored padded by `pad` and each item is a random crop back to the original size,
    `flip` adds a random horizontal flip. The draws are torchvision's RandomCrop(padding=pad) and
    RandomHorizontalFlip() draws, in their order, so the pixels equal that pipeline's; slicing a padded array
    is only several times cheaper than PIL's pad-and-crop. `transform` (PIL in, tensor out), when given, runs
    after, e.g. RandAugment + PILToTensor.
    """

    decodes_on_host = True  # per-sample work on the host: worth DataLoader workers

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        indices: np.ndarray,
        transform: Callable | None,
        *,
        pad: int = 0,
        flip: bool = False,
        plain_transform: Callable | None = None,
    ) -> None:
        super().__init__(labels, indices)
        self._images = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0))) if pad else images
        self._pad, self._flip = pad, flip
        self.transform = transform
        self._plain_transform = plain_transform  # what `unaugmented` applies instead (e.g. a resize alone)

    def unaugmented(self) -> "_UInt8Images":
        """The same samples without crop, flip or `transform` (but `plain_transform`), sharing the arrays."""
        plain = copy.copy(self)
        if self._pad:
            p = self._pad
            plain._images = self._images[:, p:-p, p:-p]
        plain._pad, plain._flip, plain.transform = 0, False, self._plain_transform
        return plain

    def _torch_draws_only(self) -> bool:
        return self.transform is None  # crop and flip by slicing; a transform is PIL's (RandAugment: timm's)

    def _image(self, index: int) -> torch.Tensor:
        img = self._images[index]
        if self._pad:
            size = img.shape[0] - 2 * self._pad
            top = int(torch.randint(0, 2 * self._pad + 1, size=(1,)))
            left = int(torch.randint(0, 2 * self._pad + 1, size=(1,)))
            img = img[top : top + size, left : left + size]
        if self._flip and torch.rand(1) < 0.5:
            img = img[:, ::-1]
        if self.transform is None:
            return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))
        from PIL import Image

        return self.transform(Image.fromarray(np.ascontiguousarray(img)))


class _FolderImages(_IndexedDataset):
    """Files of a torchvision ImageFolder, loaded on access."""

    decodes_on_host = True

    def __init__(self, folder, indices: np.ndarray, plain_transform: Callable | None = None) -> None:
        super().__init__(np.asarray(folder.targets, dtype=np.int64), indices)
        self._folder = folder
        self._plain_transform = plain_transform  # the evaluation transform, for `unaugmented`

    def unaugmented(self) -> "_FolderImages":
        """The same files under the evaluation transform (the folder is not scanned again)."""
        folder = copy.copy(self._folder)
        folder.transform = self._plain_transform
        plain = copy.copy(self)
        plain._folder = folder
        return plain

    def _image(self, index: int) -> torch.Tensor:
        return self._folder[index][0]


class _ResidentImages(Dataset):
    """A whole split as one tensor on the training device: each batch is gathered and augmented there at once.

    `pad` > 0 takes a random crop of the padded image (offsets uniform in 0..2*pad, per sample), `flip` a
    random horizontal flip (probability 1/2, per sample): the distribution of the host path's RandomCrop +
    RandomHorizontalFlip. The draws come from torch's global generator on the host, which the loop seeds per
    (seed, epoch, rank) exactly as for the host path, so a run is reproducible and a resumed epoch redraws
    the same crops.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: np.ndarray,
        indices: np.ndarray,
        *,
        pad: int = 0,
        flip: bool = False,
        fill: float = 0.0,
    ) -> None:
        self.indices = np.asarray(indices, dtype=np.int64)
        self.targets = labels[self.indices]
        self._images = images  # the full split: indices are positions in it
        self._labels = torch.tensor(labels, dtype=torch.int64)  # a copy: the cached label arrays are read-only
        self._index = torch.from_numpy(self.indices.copy())
        self._pad, self._flip, self._fill = pad, flip, fill

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        x, y, index = self.get_batch([i])
        return x[0].cpu(), int(y[0]), int(index[0])

    def to_device(self, device: torch.device) -> None:
        """Move the split once; every later batch is a gather on the device."""
        self._images, self._labels = self._images.to(device), self._labels.to(device)

    def unaugmented(self) -> "_ResidentImages":
        """The same samples, wherever they are now, without crop or flip (no random draw at all)."""
        plain = copy.copy(self)
        plain._pad, plain._flip = 0, False
        return plain

    def get_batch(self, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        index = self._index[torch.as_tensor(positions, dtype=torch.int64)]
        on_dev = _to_device(index, self._images.device)
        x = self._images.index_select(0, on_dev)
        if self._pad or self._flip:
            x = random_crop_flip(x, pad=self._pad, flip=self._flip, fill=self._fill)
        return x, self._labels.index_select(0, on_dev), index


def random_crop_flip(
    x: torch.Tensor, *, pad: int, flip: bool, fill: float = 0.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Per-sample random crop of the `pad`-padded batch `x` (N, C, H, W) back to H x W, then a random flip.

    Offsets and flips are drawn on the host (from `generator`, default torch's global one), with the
    distributions of torchvision's RandomCrop(padding=pad) and RandomHorizontalFlip(); the crop is one gather
    on x's device, and a flip only reverses the gathered columns, so it costs nothing extra.
    """
    n, c, h, w = x.shape
    draws = torch.empty(n, 3, dtype=torch.int64)
    draws[:, :2] = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator)
    draws[:, 2] = (torch.rand(n, generator=generator) < 0.5) if flip else 0
    draws = _to_device(draws, x.device)
    if pad:
        x = F.pad(x, (pad, pad, pad, pad), value=fill)
    wp = w + 2 * pad
    rows = draws[:, 0:1] + torch.arange(h, device=x.device)  # (N, H)
    cols = draws[:, 1:2] + torch.arange(w, device=x.device)  # (N, W)
    if flip:
        cols = torch.where(draws[:, 2:3].bool(), cols.flip(1), cols)
    flat = (rows[:, :, None] * wp + cols[:, None, :]).view(n, 1, h * w).expand(n, c, h * w)
    return x.reshape(n, c, -1).gather(2, flat).view(n, c, h, w)


class _PixelImages(_IndexedDataset):
    """A pixel-form split (trainables.data.prepare.PixelSplit) under a PIL transform, for the host decode path."""

    decodes_on_host = True

    def __init__(self, split, indices: np.ndarray, transform: Callable, plain_transform: Callable | None = None):
        super().__init__(np.asarray(split.labels, dtype=np.int64), indices)
        self._split, self.transform = split, transform
        self._plain_transform = plain_transform  # the evaluation transform, for `unaugmented`

    def unaugmented(self) -> "_PixelImages":
        """The same samples under the evaluation transform."""
        plain = copy.copy(self)
        plain.transform = self._plain_transform
        return plain

    def _image(self, index: int) -> torch.Tensor:
        from PIL import Image

        return self.transform(Image.fromarray(np.ascontiguousarray(self._split.pixels(index))))
