"""The seeds of a trial's random draws (each epoch's, each batch's), the nested class-stratified fraction subsets, and
the validation set's fixed halves."""

from __future__ import annotations

import contextlib
import math
import numbers
import random
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import get_worker_info

from trainables.data.bundle import DatasetError
from trainables.data.registry import fraction_keep

__all__ = ["SeededBatch", "batch_seeds", "epoch_seed", "eval_positions", "fraction_indices"]


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
