"""Datasets for sharpscale: the dataset registry, fraction subsets, augmentation on the host or on the device, and the seeds of its draws."""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import numbers
import os
import pickle
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, get_worker_info

if TYPE_CHECKING:
    from trainables.config import DataConfig

# timm, torchvision and PIL are imported where they are used; the registry (trainables.datasets) needs no torch.

from trainables.datasets import (
    DATASETS,
    Archive,
    DatasetSpec,
    device_rand_augment_problem,
    expected_layout,
    fraction_keep,
    package_file,
    rand_augment_hparams,
    resident_problem,
)
from trainables.errors import UserError
from trainables.staging import stage_root

__all__ = [
    "DATASETS",
    "DataBundle",
    "DatasetError",
    "fixed_batches",
    "DatasetSpec",
    "SeededBatch",
    "batch_seeds",
    "epoch_seed",
    "eval_positions",
    "fraction_indices",
    "load_dataset",
    "random_crop_flip",
]

MixupFn = Callable[[torch.Tensor, torch.Tensor], "tuple[torch.Tensor, torch.Tensor]"]

# Each dataset's classes, default size, split sizes, normalisation, archive and root layout are its registry entry's
# (trainables.datasets.DATASETS); the loaders below read them.

# The digits train/val split never depends on `fraction_seed`, so every trial of a study
# is scored on the same validation images.
_DIGITS_SPLIT_SEED = 20240601
_DIGITS_VAL_FRACTION = 0.2
_DIGITS_NATIVE_SIZE = 8  # the embedded file's pixel grid (64 columns)


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


# --------------------------------------------------------------------------- the seeds of random draws


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """The seed of a trial's random draws at `epoch` on data-parallel rank `rank`: the loop seeds the training
    process's global generators with it each epoch (augmentation drawn there, dropout, mixup), and each batch's host
    augmentation draws from a seed of its own drawn from it (`batch_seeds`). A function of these alone, so that a
    resumed trial draws at each epoch what the uninterrupted trial drew there, with no generator state saved."""
    return (seed * 1_000_003 + epoch * 7919 + rank) % (2**31)


def batch_seeds(seed: int, epoch: int, rank: int, batches: int) -> list[int]:
    """The seeds of the host augmentation of the first `batches` batches of `epoch` on `rank` (SeededBatch.seed):
    numpy's SeedSequence of `epoch_seed`, whose k-th word does not depend on how many are asked for."""
    return np.random.SeedSequence(epoch_seed(seed, epoch, rank)).generate_state(batches).tolist()


class SeededBatch(list):
    """A batch's positions in a split, as a batch sampler yields them, with the seed its host augmentation draws from
    (`batch_seeds`): DataLoader hands the batch as it is to the dataset's `__getitems__`, in whichever process reads
    it (a worker's, or the training process without workers). The seed travels on this list alone: a wrapper between
    the loader and the dataset that rebuilds the list (torch's Subset does) loses it, and the draws go unseeded, so
    the loop hands its datasets to the loader unwrapped."""

    def __init__(self, positions, seed: int) -> None:
        super().__init__(positions)
        self.seed = seed


@contextlib.contextmanager
def _seeded_draws(seed: int, *, torch_only: bool = False):
    """torch's CPU, Python's and numpy's global generators (what torchvision's, timm's and our transforms draw from;
    `torch_only`: torch's alone) seeded with `seed` for the draws made inside; in the training process (no DataLoader
    workers) put back as they were after, so that its own draws (dropout, mixup) go on as they do beside workers.

    Seeded per batch, not per sample: a batch is read whole by one process, so its draws are a function of its seed
    whichever worker reads it, however many there are, whether they persist across epochs and whether the trial was
    resumed, at one seeding per batch (9 us in a worker: benchmarks/bench_seeded_batches.py) rather than one per
    image. Saving and restoring numpy's state in the training process costs about 0.1 ms (its public get_state and
    set_state), hence `torch_only` for splits that draw nothing else.
    """
    restore = get_worker_info() is None  # the training process, whose own draws go on after the batch
    saved_torch = torch.default_generator.get_state() if restore else None
    saved_others = (random.getstate(), np.random.get_state()) if restore and not torch_only else None
    torch.default_generator.manual_seed(seed)  # the CPU generator alone: torch.manual_seed would seed CUDA's too
    if not torch_only:
        random.seed(seed)
        np.random.seed(seed)
    try:
        yield
    finally:
        if saved_torch is not None:
            torch.default_generator.set_state(saved_torch)
        if saved_others is not None:
            random.setstate(saved_others[0])
            np.random.set_state(saved_others[1])


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
        keep = fraction_keep(fraction, len(members))
        chosen.append(order[:keep])
    out = np.sort(np.concatenate(chosen)).astype(np.int64)
    out.setflags(write=False)
    return out


# --------------------------------------------------------------------------- evaluation splits

# The validation set's two halves (DataConfig.eval_split): one fixed permutation of its positions, the same for every
# trial, seed and fraction, so that what a study's search chose on ('selection') and what its confirm runs report on
# ('test') never share an image.
_EVAL_SPLIT_SEED = 20261126


def eval_positions(n: int, split: str) -> np.ndarray:
    """Sorted positions in a validation set of `n` items that the evaluation split `split` scores on.

    'all': every position; 'selection' and 'test': the first and second half of one fixed permutation (disjoint,
    together everything; 'test' takes the odd one out of an odd n).
    """
    if split == "all":
        return np.arange(n, dtype=np.int64)
    if split not in ("selection", "test"):
        raise ValueError(f"eval_split must be 'all', 'selection' or 'test', got {split!r}")
    order = np.random.default_rng(_EVAL_SPLIT_SEED).permutation(n)
    half = order[: n // 2] if split == "selection" else order[n // 2 :]
    return np.sort(half).astype(np.int64)


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


def load_synthetic(cfg: "DataConfig", root: Path | None, train_indices_for, resident: bool) -> DataBundle:
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


# --------------------------------------------------------------------------- digits


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


def load_digits(cfg: "DataConfig", root: Path | None, train_indices_for, resident: bool) -> DataBundle:
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


def load_cifar(cfg: "DataConfig", root: Path | None, train_indices_for, resident: bool) -> DataBundle:
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


# --------------------------------------------------------------------------- ImageFolder


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


def load_imagefolder(cfg: "DataConfig", root: Path | None, train_indices_for, resident: bool) -> DataBundle:
    """The registry's loader of ``imagefolder``: a train/val tree of class folders, or what `data prepare` made of one."""
    from timm.data import create_transform

    spec = DATASETS[cfg.name]
    assert root is not None  # the registry entry needs a root; DataConfig enforces it
    augment = cfg.augment
    if not root.is_dir():
        raise _imagefolder_error(root, _describe(root))
    size = spec.default_size if cfg.img_size is None else cfg.img_size
    from trainables.prepare import read_manifest

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
    if cfg.decode == "device":
        from trainables.jpeg import FolderBytes

        train_split: Dataset = FolderBytes(
            train.samples, indices, size, train=augment != "none", rand_augment=_rand_augment_of(train_tf)
        )
        val_split: Dataset = FolderBytes(val.samples, val_indices, size, train=False)
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


class _PixelImages(_IndexedDataset):
    """A pixel-form split (trainables.prepare.PixelSplit) under a PIL transform, for the host decode path."""

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


def _load_pixels(
    cfg: "DataConfig", root: Path, prepared, size: int, train_tf, eval_tf, train_indices_for
) -> DataBundle:
    """An image folder prepared in the pixel form: the same splits, classes and transforms as the folder it came
    from, read from its pixel files (trainables.prepare; each checked as it opens) instead of decoded from files."""
    from trainables.prepare import PixelSplit, PrepareError

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
        from trainables.jpeg import FolderPixels

        augmented = cfg.augment != "none"
        train_split: Dataset = FolderPixels(
            train, indices, size, train=augmented, rand_augment=_rand_augment_of(train_tf)
        )
        val_split: Dataset = FolderPixels(val, val_indices, size, train=False)
    else:
        train_split = _PixelImages(train, indices, train_tf, plain_transform=eval_tf)
        val_split = _PixelImages(val, val_indices, eval_tf)
    return _folder_bundle(cfg, train_split, val_split, classes, size, len(train), indices)


# --------------------------------------------------------------------------- loading (the registry: trainables.datasets)


Loader = Callable[["DataConfig", "Path | None", Callable[[np.ndarray], np.ndarray], bool], DataBundle]


def load_dataset(data: "DataConfig | str", /, *, device: torch.device | str | None = None, **fields: Any) -> DataBundle:
    """The dataset that `data` (a DataConfig, or a registry name plus DataConfig fields) describes.

    `data.device_resident` None (auto) builds the device-resident form when `device` is a CUDA device and
    the dataset allows it (`resident_problem`); True builds it on any device. `data.decode` auto decodes and
    augments an image folder on the device when `device` is a CUDA device (trainables.jpeg), else in host workers. Every field problem is
    reported at once in one DatasetError; a bad path or file raises DatasetError naming the path, the
    expected layout, what was found and the fix. See `DATASETS` for what each dataset is and how
    `basic`/`strong` augment it (`strong` adds mixup, applied by the loop to whole batches on the device).
    """
    from trainables.config import DataConfig, format_validation_error

    if isinstance(data, DataConfig):
        if fields:
            raise TypeError("load_dataset: pass either a DataConfig or a name with fields, not both")
        cfg = data
    else:
        from pydantic import ValidationError

        try:
            paths_as_str = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in fields.items()}
            cfg = DataConfig.model_validate({"name": data, **paths_as_str})
        except ValidationError as err:
            lines = format_validation_error(err, prefix="data.")
            raise DatasetError("load_dataset got invalid arguments:\n  - " + "\n  - ".join(lines)) from None
    spec = DATASETS[cfg.name]
    on_cuda = device is not None and torch.device(device).type == "cuda"
    resident = cfg.device_resident
    if resident is None:
        resident = on_cuda and resident_problem(spec, cfg.augment, cfg.img_size) is None
    if spec.device_decode and cfg.decode == "auto":
        ops_fit = cfg.augment != "strong" or device_rand_augment_problem(cfg.randaugment) is None
        cfg = cfg.model_copy(update={"decode": "device" if on_cuda and ops_fit else "cpu"})

    def train_indices_for(labels: np.ndarray) -> np.ndarray:
        return _stratified_prefix(labels, float(cfg.fraction), int(cfg.fraction_seed))

    # A URI root is staged once per node into its local cache; a path is used in place.
    root = None if cfg.root is None else stage_root(cfg.root)
    return spec.load(cfg, root, train_indices_for, resident)


def fixed_batches(
    data: "DataConfig",
    *,
    samples: int,
    batch_size: int,
    seed: int = 0,
    data_root: str | None = None,
    device: torch.device | str | None = None,
    bundle: DataBundle | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed batches of a trial's own training set (its dataset, fraction and fraction seed), unaugmented.

    `samples` examples (at most the subset's size) drawn once by `seed` from the training subset, in batches of
    `batch_size`, normalised as the model takes them, on `device`. The one definition of a geometry measurement
    set: the in-trial probe (trainables.loop) and the checkpoint measures (analysis.record) both draw theirs here.
    data_root: where the dataset lives here, when not at `data.root`. bundle: the trial's own loaded `data`
    (augmented or not, on the host or the device): its training split's unaugmented view is taken instead of
    loading the dataset again, with the same samples and values.
    """
    for name, value in (("samples", samples), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}. Fix: e.g. {name}=128.")
    train = getattr(bundle.train, "unaugmented", lambda: None)() if bundle is not None else None
    if train is None:
        update: dict[str, Any] = {"augment": "none", "device_resident": False}
        if data_root is not None:
            update["root"] = data_root
        bundle = load_dataset(data.model_copy(update=update))
        train = bundle.train
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))[:samples].tolist()
    batches = []
    for start in range(0, len(order), batch_size):
        positions = order[start : start + batch_size]
        if hasattr(train, "get_batch"):  # a whole batch at once, where the split lives (the device, maybe)
            x, y, _ = train.get_batch(positions)
        else:
            items = [train[i] for i in positions]
            x = torch.stack([torch.as_tensor(item[0]) for item in items])
            y = torch.tensor([int(item[1]) for item in items])
        x = bundle.prepare(x)
        batches.append((x.to(device) if device is not None else x, y.to(device) if device is not None else y))
    return batches
