"""The one training loop: every method, every model, in-process or as one worker of a data-parallel group."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import platform
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Sampler

import optim
from trainables import compiled as compiled_step
from trainables.config import CHECKPOINT_AUTO_RATIO, TrialConfig
from trainables.data.bundle import DataBundle
from trainables.data.load import load_dataset
from trainables.data.seeds import SeededBatch, batch_seeds, epoch_seed, eval_positions
from trainables.errors import TrialRefused, UserError, shown
from trainables.metrics import FIXED_PHASES, VALIDATION_SAMPLES
from trainables.models import create_model, weight_norm
from trainables.naming import CHECKPOINT_ARTIFACT
from trainables.scored import ScoredImages
from trainables.tracking import BEST_EPOCH_METRICS

__all__ = [
    "CHECKPOINT_FILE",
    "GEOMETRY_TIME_METRIC",
    "Probe",
    "Reporter",
    "Recorder",
    "RunLengthWarning",
    "TrialDiverged",
    "TrialStopped",
    "evaluate",
    "fit",
    "load_checkpoint",
    "load_model",
]

CHECKPOINT_FILE = "checkpoint.pt"
# Seconds a geometry measurement took, logged beside its measures; never part of epoch_time_s or images_per_sec.
GEOMETRY_TIME_METRIC = "geometry_time_s"
# 1.0 at an epoch whose measurement raised: the epoch is kept and recorded without its measures (the trial's log,
# and the warning it carries, say why).
GEOMETRY_FAILED_METRIC = "geometry_failed"


class TrialDiverged(RuntimeError):
    """The training loss became nan or inf: the trial stops at once, its record says why."""

    def __init__(self, epoch: int, step: int, value: float):
        self.epoch, self.step, self.value = epoch, step, value
        super().__init__(f"training loss became {value} at epoch {epoch}, step {step}")


class RunLengthWarning(UserWarning):
    """The run is too short for its method's settings (e.g. MESA's EMA decay or a trajectory loss that never starts)."""


class TrialStopped(Exception):
    """The trial's driver stopped it after taking this epoch's result: Tune's scheduler (e.g. ASHA), the study's
    time limit, or an interrupt of the study (which the study's driver then records as such)."""

    def __init__(self, epoch: int, final: bool):
        self.epoch, self.final = epoch, final
        super().__init__(f"stopped by Ray Tune after epoch {epoch} (its scheduler or the study's time limit)")


class Reporter(Protocol):
    """Receives each epoch's metrics and, when one was written, the directory of that epoch's checkpoint."""

    def __call__(self, metrics: dict[str, float], checkpoint_dir: Path | None) -> None: ...


class Recorder(Protocol):
    """Persists a trial's metrics (MLflow in practice); only the rank-0 process records."""

    wants_checkpoint: bool  # keep the final checkpoint as an artifact of the run

    def log_epoch(self, metrics: dict[str, float], epoch: int, timestamp_ms: int) -> None: ...

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...

    # Optional: `log_scored(text)`, the final evaluation's per-image correctness (trainables.scored.ScoredImages
    # .to_text); fit looks it up with getattr, and a recorder without it records the trial without it.


class Probe(Protocol):
    """Measures a model's loss geometry on fixed batches of (inputs, labels); returns metrics by their logged names.

    `analysis.geometry.probes.make_probe(config)` builds the real one; trainables never imports analysis.
    The model is the bare module (never the DDP wrapper), its parameters in their training dtype.
    """

    def __call__(self, model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]: ...

    # Optional: `check(model, batches)`, called once before the first epoch, raises for what the measures could only
    # refuse after training (fit looks it up with getattr; a probe without it is not checked).


@dataclass(frozen=True)
class _Dist:
    rank: int = 0
    world: int = 1

    @classmethod
    def detect(cls) -> "_Dist":
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()


class _GlobalBatchSampler(Sampler[list[int]]):
    """Each rank gets its contiguous slice of every global batch, so N workers see the same global batches as one.

    The order is a function of (seed, epoch) alone, which makes a resumed run draw exactly the batches the
    uninterrupted one would have drawn. The last incomplete global batch is dropped so every rank takes the
    same number of steps (DDP would hang otherwise). Each batch is a SeededBatch: its host augmentation draws from
    the seed of its (seed, epoch, rank, number) (trainables.data.batch_seeds), in whichever process reads it.
    """

    def __init__(self, n: int, global_batch: int, rank: int, world: int, seed: int):
        self.n, self.global_batch, self.rank, self.world, self.seed = n, global_batch, rank, world, seed
        self.local = global_batch // world
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @property
    def batch_size(self) -> int:
        """The batches this rank gets (torch's BatchSampler's name for it)."""
        return self.local

    def __len__(self) -> int:
        return self.n // self.global_batch

    def __iter__(self) -> Iterator[SeededBatch]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        perm = torch.randperm(self.n, generator=g).tolist()
        seeds = batch_seeds(self.seed, self.epoch, self.rank, len(self))
        for b in range(len(self)):
            start = b * self.global_batch + self.rank * self.local
            yield SeededBatch(perm[start : start + self.local], seeds[b])


class _Batched(torch.utils.data.Dataset):
    def __init__(self, dataset):
        self.dataset = dataset

    def __getitem__(self, items: list[int]):
        return self.dataset.get_batch(items)


class _CheckpointCadence:
    """Which epochs are checkpointed (the last always): every `train.checkpoint_every`-th, or under 'auto' the first
    (which measures what a checkpoint costs) and then each epoch that ends CHECKPOINT_AUTO_RATIO times that cost
    after the last checkpoint was handed over, by the wall clock."""

    def __init__(self, every: int | str):
        self.every = every
        self.cost: float | None = None  # seconds the last checkpoint took to write and hand over
        self.since = time.perf_counter()  # when it was handed over

    def due(self, epoch: int) -> bool:
        if self.every != "auto":
            return (epoch + 1) % self.every == 0
        return self.cost is None or time.perf_counter() - self.since >= CHECKPOINT_AUTO_RATIO * self.cost

    def took(self, seconds: float) -> None:
        self.cost, self.since = seconds, time.perf_counter()


def _spent(timings: dict[str, float] | None, phase: str, since: float) -> float:
    """Adds the seconds since `since` (a perf_counter) to `timings[phase]`, where the caller keeps timings; returns
    them."""
    assert phase in FIXED_PHASES, phase
    seconds = time.perf_counter() - since
    if timings is not None:
        timings[phase] = timings.get(phase, 0.0) + seconds
    return seconds


@contextlib.contextmanager
def _timed(timings: dict[str, float] | None, phase: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _spent(timings, phase, t0)


def _resolve_device(cfg: TrialConfig) -> torch.device:
    want = cfg.train.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("train.device: 'cuda' asked for, but torch sees no GPU. Fix: use 'auto' or 'cpu'.")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", local % torch.cuda.device_count())
    return torch.device("cpu")


def _precision(cfg: TrialConfig, device: torch.device) -> str:
    if cfg.train.precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return cfg.train.precision


def _autocast(device: torch.device, precision: str) -> Callable[[], contextlib.AbstractContextManager]:
    if precision == "fp32":
        return contextlib.nullcontext
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def _base_optimizer(model: nn.Module, cfg: TrialConfig, device: torch.device) -> torch.optim.Optimizer:
    from timm.optim import param_groups_weight_decay

    opt = cfg.optimizer
    # No weight decay on 1-D tensors (biases, norms, position embeddings as timm lists them).
    skip = model.no_weight_decay() if hasattr(model, "no_weight_decay") else ()
    groups = param_groups_weight_decay(model, opt.weight_decay, no_weight_decay_list=skip)
    fused = device.type == "cuda"
    if opt.base == "adamw":
        return torch.optim.AdamW(groups, lr=opt.lr, betas=opt.betas, fused=fused)
    return torch.optim.SGD(groups, lr=opt.lr, momentum=opt.momentum, fused=fused)


def _scheduler(base: torch.optim.Optimizer, cfg: TrialConfig, steps_per_epoch: int):
    from timm.scheduler import create_scheduler_v2

    s = cfg.schedule
    if s.sched == "constant":
        return None
    # timm calls the linear-decay schedule "poly" with power 1.
    sched, _ = create_scheduler_v2(
        base,
        sched="cosine" if s.sched == "cosine" else "poly",
        num_epochs=s.epochs,
        decay_rate=1.0,
        min_lr=s.min_lr,
        warmup_lr=s.warmup_lr,
        warmup_epochs=s.warmup_epochs,
        step_on_epochs=False,
        updates_per_epoch=steps_per_epoch,
    )
    return sched


def _num_workers(cfg: TrialConfig, dataset) -> int:
    if cfg.data.num_workers is not None:
        return cfg.data.num_workers
    if not getattr(dataset, "decodes_on_host", False):
        return 0  # in memory or on the device: a worker would only add a copy
    # What the trial's CPUs allow: torch's thread count follows them (Ray sets OMP_NUM_THREADS to a trial's
    # CPUs; train.threads overrides it), and one CPU stays with the process that drives the device; a dataset may
    # need fewer (`max_workers`: what its measured throughput stops growing at).
    return max(0, min(getattr(dataset, "max_workers", 16), torch.get_num_threads() - 1))


def _batch_loader(dataset, sampler) -> DataLoader:
    # A dataset that gathers a whole batch at once (on the device) skips per-sample fetching and collation.
    return DataLoader(_Batched(dataset), sampler=sampler, batch_size=None, num_workers=0)


def _data_ranks(cfg: TrialConfig, d: _Dist) -> _Dist:
    """How the training batches are dealt: each rank its slice of every global batch (d itself), or, for a method
    form whose ranks each take the whole batch (optim.SharedBatch: SAMPa's two-rank form), every rank all of it, with
    rank 0's draws, as one process would."""
    return _Dist() if optim.METHODS[cfg.optimizer.method].shares_batch(cfg.optimizer.hparams) else d


def _loaders(bundle: DataBundle, cfg: TrialConfig, d: _Dist, device: torch.device):
    feed = _data_ranks(cfg, d)
    if cfg.data.batch_size % feed.world:
        raise TrialRefused(
            f"data.batch_size: must be divisible by the {d.world} data-parallel workers, got {cfg.data.batch_size}. "
            f"Fix: use a multiple of {d.world}."
        )
    n = len(bundle.train)
    if n < cfg.data.batch_size:
        raise TrialRefused(
            f"data.batch_size: must not exceed the training-set size ({n} samples at data.fraction="
            f"{cfg.data.fraction}), got {cfg.data.batch_size}. Fix: lower the batch size or raise the fraction."
        )
    share = cfg.data.batch_size // feed.world
    if share < cfg.data.accumulate:
        raise TrialRefused(
            f"data.accumulate: each of the {feed.world} workers gets {share} samples per batch, fewer than accumulate="
            f"{cfg.data.accumulate} micro-batches. Fix: lower data.accumulate to at most {share} or raise data.batch_size."
        )
    sampler = _GlobalBatchSampler(n, cfg.data.batch_size, feed.rank, feed.world, cfg.train.seed)
    pin = device.type == "cuda"

    def common(dataset) -> dict[str, Any]:
        workers = _num_workers(cfg, dataset)
        # The loader's own generator: starting an iteration draws its workers' base seed from it, which would
        # otherwise come from the training process's global generator and shift the draws after it (dropout, mixup)
        # in just the epochs a loader starts in (every epoch without workers, the first after a start or a resume
        # with persistent ones). The workers' own seeds are not used: each batch seeds its draws (SeededBatch).
        return dict(num_workers=workers, pin_memory=pin, persistent_workers=workers > 0, generator=torch.Generator())

    if hasattr(bundle.train, "device_loader"):  # reads on the host, decodes and augments each batch on the device
        train = bundle.train.device_loader(sampler, device, **common(bundle.train))
    elif hasattr(bundle.train, "get_batch"):
        bundle.train.to_device(device)
        train = _batch_loader(bundle.train, sampler)
    else:
        train = DataLoader(bundle.train, batch_sampler=sampler, **common(bundle.train))
    # Evaluation is never subsampled: each rank takes a strided share of the trial's evaluation split (all of the
    # validation set, or one of its fixed halves: DataConfig.eval_split), sums are all-reduced.
    val_idx = eval_positions(len(bundle.val), cfg.data.eval_split)[d.rank :: d.world].tolist()
    if hasattr(bundle.val, "device_loader"):
        val_batches = torch.utils.data.BatchSampler(val_idx, cfg.data.eval_batch_size, drop_last=False)
        val = bundle.val.device_loader(val_batches, device, **common(bundle.val))
    elif hasattr(bundle.val, "get_batch"):
        bundle.val.to_device(device)
        val = _batch_loader(
            bundle.val, torch.utils.data.BatchSampler(val_idx, cfg.data.eval_batch_size, drop_last=False)
        )
    else:
        subset = torch.utils.data.Subset(bundle.val, val_idx)
        val = DataLoader(subset, batch_size=cfg.data.eval_batch_size, **common(bundle.val))
    return train, val, sampler


def _seed_epoch(seed: int, epoch: int, rank: int) -> None:
    # Dropout, mixup and augmentation drawn in this process (resident data, the device loader's generator) draw from
    # the global generators; seeding them from (seed, epoch, rank) makes every epoch reproducible on its own, so a
    # resumed run needs no saved generator state. Host augmentation draws from its batch's seed (SeededBatch).
    import random

    import numpy as np

    s = epoch_seed(seed, epoch, rank)
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s)


def _all_reduce(t: torch.Tensor, d: _Dist) -> torch.Tensor:
    if d.world > 1:
        dist.all_reduce(t)
    return t


def _training_sums(sums: torch.Tensor, d: _Dist, sampler: _GlobalBatchSampler) -> torch.Tensor:
    """The epoch's training sums of the trial: the ranks' slices added, or, where every rank took the whole batch
    (_data_ranks), rank 0's: its loss and logits are those one process's first pass has (SAMPa's g(x~) pass)."""
    if sampler.world == d.world:
        return _all_reduce(sums, d)
    dist.broadcast(sums, src=0)
    return sums


def _check_finite(loss: torch.Tensor, d: _Dist, epoch: int, step: int) -> None:
    # Collective: if one rank alone raised, the others would wait forever in their next all-reduce.
    bad = (~torch.isfinite(loss.detach().float())).float().reshape(1)
    if d.world > 1:
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    if bad.item():
        raise TrialDiverged(epoch, step, float(loss))


def _forward(model, x, target, autocast, smoothing) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    def forward(rows=None, reduction="mean"):
        # optim's Forward: the method asks for rows of the batch (micro-batches, m-sharpness, ESAM's
        # selection) and, where it needs them, one loss per sample.
        xs, ts = (x, target) if rows is None else (x[rows], target[rows])
        with autocast():
            logits = model(xs)
            if ts.dtype.is_floating_point:  # soft mixup targets
                loss = torch.sum(-ts * F.log_softmax(logits.float(), dim=-1), dim=-1)
                loss = loss.mean() if reduction == "mean" else loss
            else:
                loss = F.cross_entropy(logits.float(), ts, label_smoothing=smoothing, reduction=reduction)
        return loss, logits

    return forward


def _batch(bundle, x, y, device, channels_last):
    """A loader's batch on the device, prepared (and mixed up): (inputs, labels, loss targets)."""
    x = bundle.prepare(x.to(device, non_blocking=True))
    y = y.to(device, non_blocking=True)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    target = y
    if bundle.mixup is not None:
        x, target = bundle.mixup(x, y)
    return x, y, target


def _train_epoch(
    model, method, loader, sampler, scheduler, bundle, cfg, device, d, epoch, autocast, num_updates, warm_up=None
):
    """One pass over the training set; returns its metrics and the updates taken so far.

    warm_up: given on the first epoch a compiled trial trains, `warm_up(forward, rows)` compiles the step on the
    epoch's first batch before that batch's step and returns the seconds it took, which the epoch's clock leaves out
    (they are its compile_time_s). No batch is read for the compile alone, and nothing of the trial moves.
    """
    model.train()
    sampler.set_epoch(epoch)
    # Sums stay on the device: reading them every step would stall the GPU.
    # loss, correct, seen, gap, gap_steps, 2h/rho^2, perturbed steps, passes (the last two host floats: no sync)
    sums = torch.zeros(6, dtype=torch.float64, device=device)
    perturbed_steps = passes = 0.0
    steps = 0
    smoothing = cfg.train.label_smoothing
    check_every = cfg.train.divergence_check_every
    channels_last = _channels_last(cfg, device)
    compile_seconds: float | None = None
    t0 = time.perf_counter()
    for step, (x, y, idx) in enumerate(loader):
        x, y, target = _batch(bundle, x, y, device, channels_last)
        forward = _forward(model, x, target, autocast, smoothing)
        if warm_up is not None and step == 0:
            compile_seconds = warm_up(forward, x.shape[0])
        out = method.train_step(forward, inputs=x, indices=idx, epoch=epoch)
        num_updates += 1
        if scheduler is not None:
            scheduler.step_update(num_updates=num_updates)

        bs = y.shape[0]
        sums[0] += out.loss.detach().double() * bs
        sums[1] += (out.logits.argmax(dim=-1) == y).sum()
        sums[2] += bs
        if out.perturbed_loss is not None:
            gap = (out.perturbed_loss.detach() - out.loss.detach()).double()
            sums[3] += gap
            sums[4] += 1
            if out.rho:
                sums[5] += 2.0 * gap / out.rho**2
        perturbed_steps += out.perturbed
        passes += out.passes
        steps += 1
        if (step + 1) % check_every == 0:
            _check_finite(out.loss, d, epoch, step)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0 - (compile_seconds or 0.0)
    _training_sums(sums, d, sampler)
    loss, correct, seen, gap, gap_steps, sharp = sums.tolist()
    if not math.isfinite(loss):
        raise TrialDiverged(epoch, len(loader) - 1, loss)
    metrics = {
        "train_loss": loss / seen,
        "train_acc": correct / seen,
        "images_per_sec": seen / elapsed,
        "epoch_time_s": elapsed,
        # What the epoch's steps were (optimizer.schedule, LookSAM's one-pass steps): the same on every rank.
        "perturbed_share": perturbed_steps / steps if steps else 0.0,
        "passes_per_step": passes / steps if steps else 0.0,
    }
    if gap_steps:
        metrics["surrogate_gap"] = gap / gap_steps
        metrics["sharpness_2h_rho2"] = sharp / gap_steps
    if compile_seconds is not None:
        metrics[compiled_step.COMPILE_TIME_METRIC] = compile_seconds
    return metrics, num_updates


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: DataLoader,
    device: torch.device,
    autocast,
    d: _Dist = _Dist(),
    prepare: Callable[[torch.Tensor], torch.Tensor] = lambda x: x,
) -> dict[str, float]:
    """Loss, top-1 and top-5 accuracy over the whole loader and its sample count (summed over ranks); `prepare` is
    the bundle's."""
    return _evaluate(model, loader, device, autocast, d, prepare)[0]


@torch.no_grad()
def _evaluate(
    model: nn.Module,
    loader: DataLoader,
    device: torch.device,
    autocast,
    d: _Dist = _Dist(),
    prepare: Callable[[torch.Tensor], torch.Tensor] = lambda x: x,
    positions: np.ndarray | None = None,
) -> tuple[dict[str, float], np.ndarray | None]:
    """evaluate's metrics and, given the sorted dataset positions the loader scores (across all ranks), a (3, len)
    array of each one's top-1 correctness, label and how many times it was scored (summed over ranks; 1 everywhere
    when every image was scored once)."""
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, top1, top5, seen
    where = per_image = None
    if positions is not None:
        where = torch.as_tensor(positions, dtype=torch.int64, device=device)
        per_image = torch.zeros(3, len(positions), dtype=torch.int64, device=device)
    for x, y, index in loader:
        x, y = prepare(x.to(device, non_blocking=True)), y.to(device, non_blocking=True)
        with autocast():
            logits = model(x).float()
        sums[0] += F.cross_entropy(logits, y, reduction="sum").double()
        top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
        hit = top[:, 0] == y
        sums[1] += hit.sum()
        sums[2] += (top == y[:, None]).any(dim=-1).sum()
        sums[3] += y.shape[0]
        if per_image is not None:
            # Placed by each item's own dataset index (a loader may reorder a batch's items), found among the
            # positions; an index outside them lands on a neighbour, whose count then reads 2 and voids the record.
            slot = torch.searchsorted(where, torch.as_tensor(index, device=device).long()).clamp_(max=len(where) - 1)
            per_image[0].index_add_(0, slot, hit.long())
            per_image[1].index_add_(0, slot, y.long())
            per_image[2].index_add_(0, slot, torch.ones_like(slot))
    _all_reduce(sums, d)
    loss, top1, top5, seen = sums.tolist()
    metrics = {"val_loss": loss / seen, "val_acc": top1 / seen, "val_top5": top5 / seen, VALIDATION_SAMPLES: seen}
    if per_image is None:
        return metrics, None
    _all_reduce(per_image, d)
    return metrics, per_image.cpu().numpy()


def _channels_last(cfg: TrialConfig, device: torch.device) -> bool:
    return cfg.train.channels_last if cfg.train.channels_last is not None else device.type == "cuda"


def _unwrap(model: nn.Module) -> nn.Module:
    return compiled_step.unwrap(model)


def _save(
    path: Path, *, model, method, scheduler, scaler, epoch, num_updates, cfg, best, metrics, logged_at, meta, scored
) -> None:
    state = {
        "format": 1,
        "model_meta": meta,  # what create_model needs besides the config: load_model works without the data
        "epoch": epoch,
        "metrics": metrics,
        "logged_at": logged_at,
        "num_updates": num_updates,
        "config": cfg.model_dump(mode="json"),
        "model": _unwrap(model).state_dict(),
        "method": method.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "best": best,
        "scored": scored,
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # a crash mid-write never leaves a torn checkpoint


def _checkpoint_file(path: str | os.PathLike, name: str) -> Path:
    """The checkpoint file that `path` names: itself (under any name), or the CHECKPOINT_FILE of the folder it names
    (as fit and Tune keep one). A UserError naming `name` (the argument that was given it) when there is none."""
    p = Path(path)
    file = p / CHECKPOINT_FILE if p.is_dir() else p
    if file.is_file():
        return file
    found = f"a folder without {CHECKPOINT_FILE}" if p.is_dir() else "no such file" if not p.exists() else "not a file"
    raise UserError(
        f"{name}: must be a checkpoint file (under any name) or a folder holding {CHECKPOINT_FILE}, got "
        f"{shown(str(path))} ({found}). Fix: give the checkpoint file, or the folder a trial kept its checkpoints in "
        "(fit's checkpoint_dir, a Tune trial's checkpoint folder)."
    )


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint file (under any name, or the directory holding one as CHECKPOINT_FILE) safely: tensors and
    plain containers only."""
    return torch.load(_checkpoint_file(path, "checkpoint path"), map_location="cpu", weights_only=True)


def load_model(path: str | os.PathLike) -> tuple[nn.Module, TrialConfig]:
    """The trained model of a checkpoint (file or directory), on the CPU in eval mode, and its trial config."""
    state = load_checkpoint(path)
    cfg = TrialConfig.load(state["config"])
    model = create_model(cfg.model, **state["model_meta"], load_init=False)  # the trained weights replace them
    model.load_state_dict(state["model"])
    return model.eval(), cfg


def fit(
    config: TrialConfig | dict[str, Any],
    *,
    checkpoint_dir: str | os.PathLike | None = None,
    resume_from: str | os.PathLike | None = None,
    reporter: Reporter | None = None,
    recorder: Recorder | None = None,
    report_resumed: bool = False,
    probe: Probe | None = None,
    timings: dict[str, float] | None = None,
) -> dict[str, float]:
    """Train one trial in this process (or as one rank of an initialised process group); return final metrics.

    checkpoint_dir: where each epoch's checkpoint is kept (the latest overwrites the previous); None keeps them
    only as long as the reporter needs them. resume_from: the checkpoint to continue from, a file under any name or
    a folder holding CHECKPOINT_FILE; refused before any compute when it names neither.
    reporter: gets (metrics, checkpoint directory) every epoch, on every rank (Ray Train and Tune want that).
    recorder: persists metrics; called on rank 0 only.
    report_resumed: hand the resumed checkpoint's epoch to the reporter again before going on, for a reporter
    whose own record stops before that checkpoint (Tune's, when its snapshot is older than the checkpoint).
    probe: takes the measures of `config.geometry` (`analysis.geometry.probes.make_probe(config)`); required when
    it names any. Rank 0 alone measures, after the epochs `geometry.due` names, on fixed unaugmented training
    samples; the results join that epoch's metrics, with the time taken as `geometry_time_s`.
    timings: a dict to which fit adds the seconds of its parts outside the training passes, by their names in
    `trainables.metrics.FIXED_PHASES` (data_load, model_build, compile, validation, geometry, checkpoint).
    """
    cfg = TrialConfig.load(config)
    _require_probe(cfg, probe)
    resume_file = None if resume_from is None else _checkpoint_file(resume_from, "resume_from")
    d, device = _place(cfg)
    with _timed(timings, "data_load"):
        bundle = load_dataset(cfg.data, device=device)
    # model_build: from the model to a resumed trial's restored state, counted once that is done (no `finally`,
    # unlike data_load): a trial refused or failed on the way leaves that time in its "other" part.
    t_build = time.perf_counter()
    trial = _build(
        cfg,
        d,
        device,
        bundle,
        fresh=resume_file is None,
        reporter=reporter,
        recorder=recorder,
        probe=probe,
        timings=timings,
    )
    resumed = _resume(trial, resume_file)
    _spent(timings, "model_build", t_build)
    if resumed is not None:
        _redeliver_resumed(trial, resumed, resume_file, report_resumed)
    del resumed  # the checkpoint's host copies of every state: not held through the epochs

    own_dir = checkpoint_dir is None
    ckpt_root = Path(tempfile.mkdtemp(prefix="sharpscale-ckpt-")) if own_dir else Path(checkpoint_dir)
    ckpt_root.mkdir(parents=True, exist_ok=True)
    try:  # from here every way out removes a temporary checkpoint folder, a failed compile's too
        _run_epochs(trial, ckpt_root)
    finally:
        if own_dir:
            shutil.rmtree(ckpt_root, ignore_errors=True)
    return trial.metrics


@dataclass(eq=False)
class _Trial:
    """One trial's built parts, what fit was handed, and the state its steps carry from epoch to epoch."""

    cfg: TrialConfig
    d: _Dist
    device: torch.device
    autocast: Callable[[], contextlib.AbstractContextManager]
    bundle: DataBundle
    model: nn.Module  # the bare module: its weights are checkpointed, normed and measured
    net: nn.Module  # what trains: the model compiled (per plan), inside DDP on several ranks
    plan: compiled_step.CompilePlan
    train_loader: Any
    val_loader: Any
    sampler: _GlobalBatchSampler
    geometry_batches: list[tuple[torch.Tensor, torch.Tensor]] | None
    base: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    method: optim.Method
    scheduler: Any
    reporter: Reporter | None
    recorder: Recorder | None
    probe: Probe | None
    timings: dict[str, float] | None
    start_epoch: int = 0
    num_updates: int = 0  # optimiser updates taken, the scheduler's clock
    best: dict[str, float] = field(default_factory=dict)  # BEST_EPOCH_METRICS of the best evaluated epoch so far
    metrics: dict[str, float] = field(default_factory=dict)  # the last epoch's, what fit returns
    scored: str | None = None  # the last epoch's per-image correctness (ScoredImages.to_text), once evaluated


def _require_probe(cfg: TrialConfig, probe: Probe | None) -> None:
    """Refuses a config that asks for geometry measures when fit was handed no probe to take them."""
    if cfg.geometry.enabled and probe is None:
        raise ValueError(
            f"geometry.measures: {cfg.geometry.measures} asked for, but fit got no probe to take them. Fix: pass "
            "probe=analysis.geometry.probes.make_probe(config), or leave geometry.measures empty."
        )


def _place(cfg: TrialConfig) -> tuple[_Dist, torch.device]:
    """This process's rank in its group, its thread count (train.threads), and the device it trains on."""
    d = _Dist.detect()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    return d, _resolve_device(cfg)


def _build(
    cfg: TrialConfig,
    d: _Dist,
    device: torch.device,
    bundle: DataBundle,
    *,
    fresh: bool,
    reporter: Reporter | None,
    recorder: Recorder | None,
    probe: Probe | None,
    timings: dict[str, float] | None,
) -> _Trial:
    """The trial's model (compiled, in DDP), loaders, geometry batches, optimiser, method and scheduler.

    fresh: not resumed (the model loads its initial weights; the method's run-length warnings are given); the
    rest is fit's, kept with the trial for the steps that use it.
    """
    precision = _precision(cfg, device)
    autocast = _autocast(device, precision)
    # Identical initial weights on every rank come from the seed, not from a broadcast.
    torch.manual_seed(cfg.train.seed)
    with _refused_if_invalid("model"):
        model = create_model(
            cfg.model,
            num_classes=bundle.num_classes,
            in_chans=bundle.in_chans,
            img_size=bundle.img_size,
            load_init=fresh,  # a resumed trial's checkpoint holds its trained weights
        )
    model.to(device)
    if _channels_last(cfg, device):
        model.to(memory_format=torch.channels_last)
    plan = compiled_step.resolve_compile(cfg, device, d.world)
    if d.rank == 0 and plan.warn:
        # stacklevel 3: the warning names fit's caller (_build <- fit <- caller).
        warnings.warn(plan.reason, compiled_step.CompileFallbackWarning, stacklevel=3)
    if plan.enabled:
        compiled_step.use_cache_dir(cfg.train.compile_cache)
    # Compiled inside DDP: DDP's gradient hooks stay eager, and every pass of the step runs the compiled graphs.
    net: nn.Module = compiled_step.compile_module(model, plan)
    if d.world > 1:
        net = nn.parallel.DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)

    train_loader, val_loader, sampler = _loaders(bundle, cfg, d, device)
    geometry_batches = _geometry_batches(bundle, cfg, d, device)
    if cfg.geometry.enabled:
        _check_probe(probe, model, geometry_batches, d, device)  # before any compute is spent on the trial
    with _refused_if_invalid("optimizer"):
        base = _base_optimizer(model, cfg, device)
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    # The method is built before the scheduler so that lr_max-style defaults see the configured peak lr. Its scope's
    # patterns meet the model here first: one that names no parameter refuses the trial before any step.
    with _refused_if_invalid("optimizer.scope"):
        method = optim.create(
            cfg.optimizer.method,
            base,
            model=net,
            num_samples=bundle.num_train_full,
            num_classes=bundle.num_classes,
            grad_clip=cfg.optimizer.grad_clip,
            scaler=scaler,
            global_perturbation=cfg.optimizer.global_perturbation,
            accumulate=cfg.data.accumulate,
            scope=cfg.optimizer.scope,
            schedule=cfg.optimizer.schedule,
            epochs=cfg.schedule.epochs,
            **cfg.optimizer.hparams,
        )
    if plan.enabled:
        method.compile_modules(lambda module: compiled_step.compile_module(module, plan))
    scheduler = _scheduler(base, cfg, len(train_loader))
    # A method may know that this run is too short for its settings: say so once, at the start, on rank 0.
    if d.rank == 0 and fresh:
        for note in method.run_warnings(epochs=cfg.schedule.epochs, steps_per_epoch=len(train_loader)):
            warnings.warn(note, RunLengthWarning, stacklevel=3)  # fit's caller, as above
    return _Trial(
        cfg=cfg,
        d=d,
        device=device,
        autocast=autocast,
        bundle=bundle,
        model=model,
        net=net,
        plan=plan,
        train_loader=train_loader,
        val_loader=val_loader,
        sampler=sampler,
        geometry_batches=geometry_batches,
        base=base,
        scaler=scaler,
        method=method,
        scheduler=scheduler,
        reporter=reporter,
        recorder=recorder,
        probe=probe,
        timings=timings,
    )


def _resume(trial: _Trial, checkpoint: Path | None) -> dict[str, Any] | None:
    """A resumed trial's state restored from its checkpoint file (returned; None when fresh), the scheduler set to the
    updates taken."""
    resumed: dict[str, Any] | None = None
    if checkpoint is not None:
        resumed = load_checkpoint(checkpoint)
        trial.model.load_state_dict(resumed["model"])
        trial.method.load_state_dict(resumed["method"])
        if trial.scheduler is not None and resumed["scheduler"] is not None:
            trial.scheduler.load_state_dict(resumed["scheduler"])
        if trial.scaler is not None and resumed["scaler"] is not None:
            trial.scaler.load_state_dict(resumed["scaler"])
        trial.start_epoch, trial.num_updates = resumed["epoch"] + 1, resumed["num_updates"]
        trial.best = dict(resumed["best"])
    if trial.scheduler is not None:
        trial.scheduler.step_update(num_updates=trial.num_updates)
    return resumed


def _redeliver_resumed(trial: _Trial, resumed: dict[str, Any], checkpoint: Path, report_resumed: bool) -> None:
    """The resumed checkpoint's epoch handed on again (reported and recorded, or recorded), and its final artifact
    kept where the trial had already trained its last epoch. `checkpoint` is the file it was read from."""
    trial.metrics = resumed["metrics"]
    trial.scored = resumed.get("scored")  # absent from checkpoints written before it was recorded
    final = trial.start_epoch >= trial.cfg.schedule.epochs
    if not report_resumed and trial.recorder is not None and trial.d.rank == 0:
        # The interruption may have come between the checkpoint and the record: log that epoch again,
        # with its original timestamp, which MLflow stores once however often it is sent.
        trial.recorder.log_epoch(trial.metrics, resumed["epoch"], resumed["logged_at"])
    if not (report_resumed or final):
        return
    with _checkpoint_folder(checkpoint) as where:
        if report_resumed:
            _deliver(trial, trial.metrics, resumed["epoch"], where, resumed["logged_at"])
        if final:
            # Interrupted between its last checkpoint and its end: the record may lack the final artifact.
            _keep_scored(trial)
            _keep_final(trial, where / CHECKPOINT_FILE)


@contextlib.contextmanager
def _checkpoint_folder(checkpoint: Path) -> Iterator[Path]:
    """A folder holding the checkpoint file as CHECKPOINT_FILE, the layout what it is handed to expects (Tune resumes
    a trial from the folder its reporter got; analysis.record finds a run's checkpoint/checkpoint.pt): the file's own
    folder where it has that name (as fit and Tune keep it), else a temporary folder with a copy of it, removed once
    it has been handed on (the reporter and the recorder copy what they keep before they return)."""
    if checkpoint.name == CHECKPOINT_FILE:
        yield checkpoint.parent
        return
    with tempfile.TemporaryDirectory(prefix="sharpscale-resumed-") as folder:
        shutil.copyfile(checkpoint, Path(folder) / CHECKPOINT_FILE)
        yield Path(folder)


def _warm_up_compile(trial: _Trial, forward: Callable[..., tuple[torch.Tensor, torch.Tensor]], rows: int) -> float:
    """A compiled trial's step compiled on the first batch it trains, just before that batch's step (timed as
    compile); returns the seconds it took, its compile_time_s.

    On that batch, rather than on one drawn for it before the first epoch: a batch drawn alone started a pass over
    the data that the epoch then threw away (a persistent loader's workers had read prefetch_factor batches each for
    it, and drawn its augmentation from their random streams; the pixel loader's slots waited for the next pass), and
    the loader's exact batch compiles the very graph the epoch runs. The warm-up moves nothing of the trial
    (compiled.warm_up), so the step that follows is the one an uncompiled trial takes.
    """
    # One reading of the clock for the compile phase of fit's timings and for what the epoch leaves out: the two are
    # the same number.
    t0 = time.perf_counter()
    try:
        compiled_step.warm_up(
            trial.net,
            forward,
            rows=rows,
            accumulate=trial.cfg.data.accumulate,
            device=trial.device,
            buffers_of=trial.model,
        )
    finally:
        seconds = _spent(trial.timings, "compile", t0)
    return seconds


def _run_epochs(trial: _Trial, ckpt_root: Path) -> None:
    """The epochs left to train, each seeded, trained, measured, checkpointed when due, and delivered; a compiled
    trial's step compiled inside the first of them (_warm_up_compile), timed apart from it."""
    cfg, d = trial.cfg, trial.d
    cadence = _CheckpointCadence(cfg.train.checkpoint_every)
    warm_up = functools.partial(_warm_up_compile, trial) if trial.plan.enabled else None
    for epoch in range(trial.start_epoch, cfg.schedule.epochs):
        # The data rank: ranks that take the same batches draw alike too (mixup, dropout), as one process would.
        _seed_epoch(cfg.train.seed, epoch, trial.sampler.rank)
        train_metrics, trial.num_updates = _train_epoch(
            trial.net,
            trial.method,
            trial.train_loader,
            trial.sampler,
            trial.scheduler,
            trial.bundle,
            cfg,
            trial.device,
            d,
            epoch,
            trial.autocast,
            trial.num_updates,
            warm_up=warm_up,
        )
        warm_up = None  # compiled once, and its time reported once, with the first epoch this process trains
        trial.metrics = _epoch_metrics(trial, epoch, train_metrics)
        logged_at = int(time.time() * 1000)
        last = epoch == cfg.schedule.epochs - 1
        saved, t_saved = _checkpoint_if_due(
            trial, epoch, ckpt_root, due=last or cadence.due(epoch), logged_at=logged_at
        )
        _deliver(trial, trial.metrics, epoch, saved, logged_at)
        if saved is not None:  # its cost: written, handed to the reporter (Tune copies it to storage), recorded
            cadence.took(time.perf_counter() - t_saved)
        if last:
            _keep_scored(trial)
            _keep_final(trial, ckpt_root / CHECKPOINT_FILE)


def _epoch_metrics(trial: _Trial, epoch: int, train_metrics: dict[str, float]) -> dict[str, float]:
    """The epoch's metrics: its training pass's, validation where due, the best epoch so far (trial.best, updated),
    and the geometry measures where due."""
    cfg, timings = trial.cfg, trial.timings
    # train.eval_every: an epoch not evaluated reports no validation metrics at all (never a stale copy).
    evaluated = cfg.train.evaluates(epoch, cfg.schedule.epochs)
    val_metrics = {}
    if evaluated:
        # The last epoch's evaluation, the one a study's tables read, also says which images it got right.
        last = epoch == cfg.schedule.epochs - 1
        positions = eval_positions(len(trial.bundle.val), cfg.data.eval_split) if last else None
        with _timed(timings, "validation"):
            val_metrics, per_image = _evaluate(
                compiled_step.eval_module(trial.net, trial.model),
                trial.val_loader,
                trial.device,
                trial.autocast,
                trial.d,
                prepare=trial.bundle.prepare,
                positions=positions,
            )
        if per_image is not None:
            trial.scored = _scored_text(cfg, positions, per_image)
    metrics = {
        "epoch": epoch,
        **train_metrics,
        compiled_step.COMPILED_METRIC: float(trial.plan.enabled),
        **val_metrics,
        "lr": trial.base.param_groups[0]["lr"],
        "weight_norm": float(weight_norm(trial.model)),
    }
    if evaluated:
        best_key = BEST_EPOCH_METRICS["val_acc"]
        if val_metrics["val_acc"] >= trial.best.get(best_key, -1.0):
            trial.best = {best_key: val_metrics["val_acc"], "best_epoch": epoch}
        metrics.update(trial.best)
    if trial.geometry_batches is not None and cfg.geometry.due(epoch, cfg.schedule.epochs):
        with _timed(timings, "geometry"):
            metrics.update(_measure_geometry(trial.probe, trial.model, trial.geometry_batches, trial.device))
    return metrics


def _scored_text(cfg: TrialConfig, positions: np.ndarray, per_image: np.ndarray) -> str | None:
    """The ScoredImages record of one evaluation (_evaluate's per-image array), or None where some position was
    not scored exactly once (a loader that did not hand back each item's dataset index): no record beats a wrong one."""
    if not np.all(per_image[2] == 1):
        return None
    scored = ScoredImages.of(
        per_image[0] > 0, dataset=cfg.data.name, split=cfg.data.eval_split, positions=positions, labels=per_image[1]
    )
    return scored.to_text()


def _checkpoint_if_due(
    trial: _Trial, epoch: int, ckpt_root: Path, *, due: bool, logged_at: int
) -> tuple[Path | None, float]:
    """The epoch's checkpoint written on rank 0 when due (timed as checkpoint): its directory (None when none was
    written) and the perf_counter at which the write began, from which the checkpoint cadence counts its cost."""
    t_saved = 0.0
    if not (due and trial.d.rank == 0):
        return None, t_saved
    t_saved = time.perf_counter()
    bundle = trial.bundle
    _save(
        ckpt_root / CHECKPOINT_FILE,
        model=trial.net,
        method=trial.method,
        scheduler=trial.scheduler,
        scaler=trial.scaler,
        epoch=epoch,
        num_updates=trial.num_updates,
        cfg=trial.cfg,
        best=trial.best,
        metrics=trial.metrics,
        logged_at=logged_at,
        scored=trial.scored,
        meta={
            "num_classes": bundle.num_classes,
            "in_chans": bundle.in_chans,
            "img_size": bundle.img_size,
        },
    )
    _spent(trial.timings, "checkpoint", t_saved)
    return ckpt_root, t_saved


def _deliver(trial: _Trial, metrics: dict[str, float], epoch: int, saved: Path | None, logged_at: int) -> None:
    """An epoch handed to the reporter (every rank), then to the recorder (rank 0); the reporter's stop raised as
    TrialStopped once the epoch is recorded."""
    # Checkpoint, then report (Ray persists it), then record: a crash anywhere in between re-runs
    # or re-logs this epoch on resume, never leaves it logged twice.
    stopped = False
    if trial.reporter is not None:
        try:
            trial.reporter(metrics, saved)
        except SystemExit:
            # Ray Tune stops a trial by raising SystemExit inside report, once it holds the result and
            # checkpoint: record the epoch and leave as stopped, not as failed.
            stopped = True
    if trial.recorder is not None and trial.d.rank == 0:
        trial.recorder.log_epoch(metrics, epoch, logged_at)
    if stopped:
        raise TrialStopped(epoch, final=epoch == trial.cfg.schedule.epochs - 1)


def _keep_scored(trial: _Trial) -> None:
    """The final evaluation's per-image correctness recorded with the run, where the recorder takes it (rank 0)."""
    log = getattr(trial.recorder, "log_scored", None)
    if trial.scored is not None and log is not None and trial.d.rank == 0:
        log(trial.scored)


def _keep_final(trial: _Trial, path: Path) -> None:
    """The final checkpoint kept as an artifact of the run, where the recorder wants it (rank 0)."""
    if trial.recorder is not None and trial.d.rank == 0 and trial.recorder.wants_checkpoint:
        trial.recorder.log_artifact(path, CHECKPOINT_ARTIFACT)


def _geometry_batches(bundle: DataBundle, cfg: TrialConfig, d: _Dist, device: torch.device):
    """The fixed measurement set of `cfg.geometry` on rank 0 (None elsewhere, and when geometry is off)."""
    from trainables.data.load import fixed_batches

    g = cfg.geometry
    if not g.enabled:
        return None
    samples = g.batches * g.batch_size
    n = len(bundle.train)
    if samples > n:  # checked on every rank, before any training
        raise TrialRefused(
            f"geometry.batches x geometry.batch_size: must not exceed the training-set size ({n} samples at "
            f"data.fraction={cfg.data.fraction}), got {g.batches} x {g.batch_size} = {samples}. Fix: fewer or smaller "
            "measurement batches."
        )
    if d.rank != 0:
        return None
    # Drawn once, unaugmented, from the trial's own training subset (the bundle it trains on, not a second load of
    # the dataset): every measurement sees the same samples.
    return fixed_batches(cfg.data, samples=samples, batch_size=g.batch_size, seed=g.seed, device=device, bundle=bundle)


@contextlib.contextmanager
def _refused_if_invalid(section: str):
    """A ValueError or TypeError while the config's `section` is built (timm's model from model.kwargs, torch's
    optimizer from its settings) comes from the config alone: the trial refuses it rather than fail at random."""
    try:
        yield
    except (ValueError, TypeError) as err:
        raise TrialRefused(
            f"{section}: the trial cannot build it from its config: {type(err).__name__}: {err}"
        ) from err


def _check_probe(probe: Probe, model: nn.Module, batches, d: _Dist, device: torch.device) -> None:
    """The probe's own check (rank 0 holds the batches), its refusal raised as TrialRefused on every rank at once: a
    rank that went on alone would wait forever in its first all-reduce."""
    problem = ""
    if batches is not None and callable(getattr(probe, "check", None)):
        try:
            probe.check(model, batches)
        except ValueError as err:
            problem = str(err)
    if d.world > 1:
        flag = torch.tensor([float(bool(problem))], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and not problem:
            problem = "the geometry probe's check refused this trial on rank 0 (its record says why)"
    if problem:
        raise TrialRefused(problem)


def _measure_geometry(probe: Probe, model: nn.Module, batches, device: torch.device) -> dict[str, float]:
    # Timed on its own, after the epoch's timing ended: geometry never counts in epoch_time_s or images_per_sec.
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    try:
        measured = probe(model, batches)
    except Exception as err:  # a measurement that fails (out of memory, say) must not cost the trained epoch
        if device.type == "cuda":
            torch.cuda.empty_cache()
        warnings.warn(
            f"geometry: the measurement failed ({type(err).__name__}: {err}); the epoch is checkpointed and "
            f"recorded without its measures, with {GEOMETRY_FAILED_METRIC} = 1",
            RuntimeWarning,
            stacklevel=2,
        )
        return {GEOMETRY_FAILED_METRIC: 1.0, GEOMETRY_TIME_METRIC: time.perf_counter() - t0}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    if not isinstance(measured, dict) or not all(isinstance(k, str) for k in measured):
        raise TypeError(
            f"the geometry probe must return a dict of metric name -> number, got {type(measured).__name__}"
        )
    return {**{k: float(v) for k, v in measured.items()}, GEOMETRY_TIME_METRIC: elapsed}


def describe_hardware(device: torch.device | None = None) -> dict[str, str]:
    """Host and accelerator names, recorded with every trial."""
    device = device or (torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    card = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu ({platform.processor() or platform.machine()})"
    )
    return {"host": platform.node(), "card": card, "torch": torch.__version__}
