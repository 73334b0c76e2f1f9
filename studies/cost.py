"""What a study costs: the measured figures by card and model (read from their one file, trial_cost.csv), the
estimate `sharpscale run --dry-run` prints from them, and its record beside the wall each study run took."""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import subprocess
from dataclasses import dataclass, fields
from pathlib import Path

from optim import METHODS, check_schedule
from studies.spec import Cell, LoadedStudy
from trainables.naming import ESTIMATE_CHECK_TAG, ESTIMATE_TAG

__all__ = [
    "CARD_FIGURES",
    "REFERENCE_CARD",
    "CardFigures",
    "compiled_speedup",
    "Estimate",
    "estimate_study",
    "local_gpus",
    "two_sig",
    "waves",
]


@dataclass(frozen=True)
class CardFigures:
    """Measured figures of one model (at one image size and batch) on one card, in images per second.

    train_none / train_sam: `images_per_sec` of a training epoch with the fused base step / SAM, eager;
    compiled_none / compiled_sam: the same with the step compiled as `train.compile: auto` compiles it on CUDA (CUDA
    graphs), and compile_s the seconds of that compile, cold (no cache); val: images per second of the validation
    pass (eval_batch_size 512); fixed_s: a trial's seconds for its data load, model build and loaders; checkpoint_s:
    one checkpoint's (Ray's and MLflow's share in neither). Each None where not measured.
    """

    card: str  # the name torch.cuda.get_device_name gives
    model: str  # "<timm name>/p<patch>" or the timm name
    img_size: int
    batch_size: int
    train_none: float
    train_sam: float
    val: float | None
    source: str  # the command that measured the row (benchmarks/results/trial_cost.csv)
    fixed_s: float | None = None
    checkpoint_s: float | None = None
    compiled_none: float | None = None
    compiled_sam: float | None = None
    compile_s: float | None = None
    geometry_s: float | None = None  # seconds of one Hessian-vector product per measurement image (see GEOMETRY)
    startup_s: float | None = None  # the study's seconds from launch to its first trial's first kernel
    records_s: float | None = None  # a trial's seconds in Tune's reports and MLflow's records (outside fit's phases)


# Every figure an estimate reads lives in one file, benchmarks/results/trial_cost.csv (a row a figure, with the card,
# versions, commit, date and command that measured it; `python -m benchmarks.bench_trial_cost --record` appends, and
# docs/benchmarks.md's table of it is generated). A figure's name is "<model key> <img>px b<batch> <field>" (fields:
# CardFigures' own), or one of CARD_WIDE for the card's studies; the newest row of each figure on each card counts.
# studies/figures/ holds links to the results files the estimate reads, so that they ship as the package's data
# (pyproject's package-data copies what a link points to) and an installed sharpscale, with no checkout's benchmarks/
# on disk, estimates as the checkout does; in a checkout the link reads the file the benchmark appends to.
FIGURES = Path(__file__).resolve().parent / "figures"
FIGURES_CSV = FIGURES / "trial_cost.csv"
CARD_WIDE = {"start-up": "startup_s", "trial records": "records_s"}  # figure name -> CardFigures field
_FIELDS = {f.name for f in fields(CardFigures)} - {"card", "model", "img_size", "batch_size", "source"}
_FIELDS -= set(CARD_WIDE.values())
CPU_CARD = "CPU"  # the prefix of every CPU card name benchmarks.results.card() writes


def card_of(recorded: str) -> str:
    """A row's card as the estimate matches it: torch's device name, without the results file's ` xN` GPU count."""
    return re.sub(r" x\d+$", "", recorded)


def load_figures(path: Path = FIGURES_CSV) -> tuple[CardFigures, ...]:
    """The rows of `path` as one CardFigures per (card, model, image size, batch); empty where the file is absent
    (an installed copy without the checkout's benchmarks/: the dry run then says it has no measured figure)."""
    if not path.exists():
        return ()
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    newest: dict[tuple[str, str], dict] = {}
    for row in rows:
        newest[(card_of(row["card"]), row["figure"])] = row
    grouped: dict[tuple[str, str, int, int], dict] = {}
    per_card: dict[str, dict[str, float]] = {}  # the figures of a card's studies, not of one model
    for (card, figure), row in newest.items():
        if figure in CARD_WIDE:
            per_card.setdefault(card, {})[CARD_WIDE[figure]] = float(row["value"])
            continue
        found = re.fullmatch(r"(\S+) (\d+)px b(\d+) (\w+)", figure)
        if found is None or found.group(4) not in _FIELDS:
            raise ValueError(
                f"{path}: figure {figure!r} is not '<model key> <img>px b<batch> <field>' with a field of "
                f"{sorted(_FIELDS)}, nor one of {sorted(CARD_WIDE)}. Fix: rename it in the file."
            )
        key, size, batch, name = found.groups()
        entry = grouped.setdefault((card, key, int(size), int(batch)), {"source": row["command"]})
        entry[name] = float(row["value"])
    out = []
    for (card, key, size, batch), values in grouped.items():
        if "train_none" not in values or "train_sam" not in values:
            continue  # a model measured in part: no training speed to cost it from
        values.setdefault("val", None)
        out.append(CardFigures(card, key, size, batch, **per_card.get(card, {}), **values))
    return tuple(out)


CARD_FIGURES: tuple[CardFigures, ...] = load_figures()
# The card an estimate assumes where the cluster's card has no row (or is not known here).
REFERENCE_CARD = "NVIDIA H100 80GB HBM3"

# A strong-augmentation epoch's throughput as a share of a clean one's (RandAugment in host workers, mixup): the data
# path's measured ratio to synthetic data with the same method, from the rows benchmarks/bench_data.py writes to
# data_path.csv ("<STRONG_AUGMENT_PATH>, <method> :: ratio to synthetic", the newest of each method).
DATA_PATH_CSV = FIGURES / "data_path.csv"
STRONG_AUGMENT_PATH = "cifar10 strong (RandAugment + mixup), host workers"
RATIO_TO_SYNTHETIC = "ratio to synthetic"


def load_strong_augment_shares(path: Path = DATA_PATH_CSV) -> dict[str, tuple[float, str]]:
    """method -> (the newest measured share, its card) of STRONG_AUGMENT_PATH's rows in `path`; empty without any.
    A transcribed row's figure carries its table's name in brackets before the path's label."""
    if not path.exists():
        return {}
    pattern = re.compile(r"(?:\[[^\]]*\] )?" + re.escape(STRONG_AUGMENT_PATH) + rf", (\w+) :: {RATIO_TO_SYNTHETIC}")
    out = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            found = pattern.fullmatch(row["figure"])
            if found is not None:
                out[found.group(1)] = (float(row["value"]), card_of(row["card"]))
    return out


STRONG_AUGMENT_SHARES = load_strong_augment_shares()


def strong_augment_share(method: str) -> float | None:
    """The method's own measured share, else `none`'s (the lowest-cost step, the most host-bound: an upper bound on
    the epoch's time); None where data_path.csv has neither."""
    found = STRONG_AUGMENT_SHARES.get(method) or STRONG_AUGMENT_SHARES.get("none")
    return found[0] if found else None


@dataclass(frozen=True)
class CellCost:
    cell: str
    trials: int
    gpu_hours: float  # of all its trials, training (+ validation where measured) x the GPUs each holds
    compiles: bool = False  # its trials' step compiles on a GPU (train.compile)
    compiled: bool = False  # costed at the compiled step's speed, its compile included (the card's row has them)
    geometry: bool = False  # its trials take geometry measures
    # One trial's seconds by part (training, validation, geometry, compile, fixed, checkpoints), each from a row;
    # a part the row has no figure for is absent (and named in Estimate.missing).
    trial_parts: tuple[tuple[str, float], ...] = ()
    missing: tuple[str, ...] = ()

    @property
    def trial_s(self) -> float:
        return sum(s for _, s in self.trial_parts)


@dataclass(frozen=True)
class Estimate:
    """GPU-hours of a study on one card, from CARD_FIGURES; `problems` says what could not be estimated, and why."""

    card: str  # whose figures were used
    cluster_card: str | None  # the card the cluster has, when known here
    gpus: int | None  # GPUs the cluster has, when known here
    cells: tuple[CellCost, ...]
    problems: tuple[str, ...]
    validation_counted: bool
    slots: int | None = None  # trials at once (max_concurrent_trials, else the cluster's GPUs over a trial's)
    startup_s: float | None = None  # the card's measured start-up before the first kernel
    cpu: bool = False  # a study whose trials hold no GPU, costed from the CPU rows in trial-hours
    cpus: int | None = None  # the cluster's CPUs, when known here (a CPU study's slots)

    @property
    def gpu_hours(self) -> float:
        return sum(c.gpu_hours for c in self.cells)

    def _trials(self) -> list[float]:
        return [c.trial_s for c in self.cells for _ in range(c.trials)]

    @property
    def wall_h(self) -> float | None:
        """Hours from launch to the last trial's end: the start-up, then the trials in waves of `slots` (the
        critical path); None without a known slot count."""
        if not self.slots or not self.cells:
            return None
        return ((self.startup_s or 0.0) + waves(self._trials(), self.slots)) / 3600

    def wall_parts(self) -> dict[str, float]:
        """The wall hours by part: each trial part summed over the trials and spread over the slots, the start-up,
        and the tail (the last wave's trials running on fewer slots than the cluster has)."""
        if not self.slots or not self.cells:
            return {}
        parts: dict[str, float] = {}
        if self.startup_s:
            parts["start-up"] = self.startup_s / 3600
        for c in self.cells:
            for name, sec in c.trial_parts:
                parts[name] = parts.get(name, 0.0) + c.trials * sec / self.slots / 3600
        trials = self._trials()
        parts["tail of the last trials"] = (waves(trials, self.slots) - sum(trials) / self.slots) / 3600
        return parts

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(sorted({m for c in self.cells for m in c.missing} | ({"start-up"} - self._has_startup())))

    def _has_startup(self) -> set[str]:
        return {"start-up"} if self.startup_s else set()

    def lines(self) -> list[str]:
        """What the dry run prints."""
        out = []
        if self.cells:
            compiled = any(c.compiled for c in self.cells)
            step = " (at the compiled step's speed where trials compile)" if compiled else ""
            counted = (
                f"training epochs{step}, validation passes, each trial's {'compile (cold), ' if compiled else ''}data "
                "load, model build and checkpoints"
                if self.validation_counted
                else f"training epochs only{step}"
            )
            unit = "trial-hours (one trial's CPUs each)" if self.cpu else "GPU-hours"
            out.append(
                f"Estimated cost: {two_sig(self.gpu_hours)} {unit} on {self.card} ({counted}; each trial at its full "
                f"epochs, so an upper bound where ASHA stops trials early; figures: {FIGURES_CSV.name})."
            )
            if not self.validation_counted:
                out.append(
                    "  Validation passes, trial start-up, checkpoints and records are not in it: no measured figure "
                    f"of them on this card in {FIGURES_CSV.name} ({_cards_with('val')} have them)."
                )
            eager_costed = sum(c.compiles and not c.compiled for c in self.cells)
            if eager_costed:
                low, high = compiled_speedup()
                out.append(
                    f"  The {self.card}'s figures are of the eager step, and the trials of {eager_costed} of the "
                    f"{len(self.cells)} cells compile theirs (train.compile): on the cards measured both ways the "
                    f"compiled step trained {low:.1f}-{high:.1f}x as fast, so their training part is an upper bound."
                )
            if any("geometry" in c.missing for c in self.cells):
                out.append(
                    f"  Geometry measures are not in it: no geometry_s figure of this card in {FIGURES_CSV.name} "
                    f"({_cards_with('geometry_s')} have one)."
                )
            if self.cluster_card is not None and self.cluster_card != self.card:
                out.append(
                    f"  This cluster's card, {self.cluster_card}, has no measured row: the estimate assumes the "
                    f"{self.card}'s speed."
                )
            wall = self.wall_h
            if wall is not None:
                unit, per_h = readable_unit(wall)
                parts = ", ".join(f"{name} {two_sig(h * per_h)}" for name, h in self.wall_parts().items())
                held = f"{self.cpus} CPU(s)" if self.cpu and self.cpus else f"{self.gpus} GPU(s)" if self.gpus else ""
                out.append(
                    (f"  On this cluster's {held}: " if held else "  ")
                    + f"wall time {two_sig(wall * per_h)} {unit} on {self.slots} trial(s) at once, from the launch "
                    f"to the last trial's end ({parts}; {unit})."
                    + (f" Not counted, no measured row: {', '.join(self.missing)}." if self.missing else "")
                )
            elif self.gpus and not self.cpu:
                out.append(
                    f"  On this cluster's {self.gpus} GPU(s): at least {two_sig(self.gpu_hours / self.gpus)} hours of "
                    f"wall time, if trials keep every GPU busy."
                )
            elif self.gpus == 0 and not self.cpu:
                out.append("  This machine has no GPU: run it on a GPU cluster (--address; docs/cluster.md).")
        out.extend(f"  No estimate for {p}" for p in self.problems)
        return out


def _cards_with(field: str) -> str:
    cards = sorted({row.card for row in CARD_FIGURES if getattr(row, field)})
    return ", ".join(cards) if cards else "no card's rows"


def model_key(model: dict) -> str:
    """A model section's key in the figures: the timm name, `/p<patch>` where it sets one, and its other kwargs as
    `[k=v;...]` (compact JSON values, no spaces), so a model made small (the --smoke form's) is not a full one."""
    kwargs = dict(model.get("kwargs") or {})
    patch = kwargs.pop("patch_size", None)
    key = f"{model.get('name')}/p{patch}" if patch is not None else str(model.get("name"))
    if kwargs:
        key += "[" + ";".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in sorted(kwargs.items())) + "]"
    return key


def _row(card: str, key: str, img_size: int, batch: int) -> CardFigures | None:
    for row in CARD_FIGURES:
        if (row.card, row.model, row.img_size, row.batch_size) == (card, key, img_size, batch):
            return row
    return None


def _shared_batch_unmeasured(spec, cfg, label: str) -> str | None:
    """Why a method form whose ranks each take one of the step's passes at once (optim.SharedBatch) has no estimate:
    neither the one-device step cost nor the workers' split batches describe its wall, and no row measures it yet."""
    if spec is None or not spec.shares_batch(cfg.optimizer.hparams):
        return None
    return (
        f"cell {label}: {spec.name}'s {spec.shared_batch.knob}=True form has no measured step cost on "
        f"{spec.shared_batch.ranks} workers (optim/_specs.py step_cost is the one-device form's)."
    )


def _cell_cost(
    cell: Cell, card: str, workers: int, workers_gpus: float, cpu: bool = False
) -> tuple[CellCost | None, str | None, bool]:
    from trainables.config import TrialConfig
    from trainables.data.registry import DATASETS
    from trainables.naming import cell_name

    cfg = TrialConfig.load(cell.config)
    data, method = cfg.data, cfg.optimizer.method
    label = cell_name(cell.levels) if cell.levels else "the study"
    # (training images, validation images) of the dataset's full splits, from its registry entry; a dataset whose
    # sizes are known only once it is read (an image folder) gets no estimate.
    spec = DATASETS[data.name]
    if spec.split_sizes is None:
        return (
            None,
            f"cell {label}: dataset {data.name!r} has no known split sizes (trainables/data/registry.py DATASETS).",
            False,
        )
    n_train, n_val = spec.split_sizes
    img_size = data.img_size or spec.default_size
    key = model_key(cell.config.get("model", {}))
    row = _row(card, key, img_size, data.batch_size)
    if row is None:
        return (
            None,
            f"cell {label}: no measured figure of {key} at {img_size} px, batch {data.batch_size} on {card} "
            "(benchmarks/results/trial_cost.csv; measure it: python -m benchmarks.bench_trial_cost --record).",
            False,
        )
    # The step as the trial will run it: compiled where `train.compile` resolves to a compile on CUDA and the card's
    # row measured one (the other methods' step costs, measured eager, are applied to the compiled `none` alike).
    compiles = cpu is False and _compiles_on_cuda(cfg, workers)
    compiled = compiles and row.compiled_none is not None
    none, sam = (row.compiled_none, row.compiled_sam) if compiled else (row.train_none, row.train_sam)
    # Each method's step cost is its registry entry's (optim/_specs.py step_cost), a share of `none`'s; SAM's own is
    # the card's measured SAM column.
    spec = METHODS.get(method)
    if problem := _shared_batch_unmeasured(spec, cfg, label):
        return None, problem, False
    share = spec.step_cost if spec is not None and spec.step_cost is not None else math.nan
    speed = sam if method == "sam" else none * share
    if not math.isfinite(speed):
        return (
            None,
            f"cell {label}: method {method!r} has no measured step cost (optim/_specs.py step_cost).",
            False,
        )
    epochs = cfg.schedule.epochs
    # optimizer.schedule: the share of steps the method runs (optim.Schedule.share); the others are `none`'s step.
    on = check_schedule(cfg.optimizer.schedule, epochs=epochs).share(epochs)
    if on < 1.0:
        speed = 1.0 / (on / speed + (1.0 - on) / none)
    missing = []
    if data.augment == "strong":
        share = strong_augment_share(method)
        if share is None:
            missing.append("strong augmentation")
        else:
            speed *= share
    seen = (round(n_train * data.fraction) // data.batch_size) * data.batch_size  # the loop drops the last batch
    parts = {"training": epochs * seen / speed}
    if row.val:
        parts["validation"] = sum(cfg.train.evaluates(e, epochs) for e in range(epochs)) * n_val / row.val
    else:
        missing.append("validation")
    if cfg.geometry.enabled:
        if row.geometry_s:
            parts["geometry"] = geometry_image_hvps(cfg.geometry, epochs) * row.geometry_s
        else:
            missing.append("geometry")
    if row.fixed_s:
        parts["data load and model build"] = row.fixed_s
    if row.records_s:
        parts["records"] = row.records_s
    if compiled and row.compile_s:  # cold; a trial that finds the study's compile cache warm pays 4-6 s
        parts["compile"] = row.compile_s
    elif compiles and not compiled:
        missing.append("compile")
    seconds = sum(parts.values())
    if row.checkpoint_s:
        every = cfg.train.checkpoint_every
        if every == "auto":  # the first and the last epoch, and one each CHECKPOINT_AUTO_RATIO checkpoints' time
            from trainables.config import CHECKPOINT_AUTO_RATIO

            count = min(epochs, 2 + math.floor(seconds / (CHECKPOINT_AUTO_RATIO * row.checkpoint_s)))
        else:
            count = sum(e == epochs - 1 or (e + 1) % every == 0 for e in range(epochs))
        parts["checkpoints"] = count * row.checkpoint_s
    # Geometry enters the GPU-hours only where the row measured it (the shipped Cost comments are of the reference
    # card, which has no geometry figure).
    seconds = sum(parts.values())
    # Every trial the cell runs: its search and its confirm stage (Cell.planned), all alike in cost.
    hours = cell.planned * seconds * workers_gpus / 3600
    cost = CellCost(
        label, cell.planned, hours, compiles, compiled, cfg.geometry.enabled, tuple(parts.items()), tuple(missing)
    )
    return cost, None, bool(row.val)


def geometry_image_hvps(geometry, epochs: int) -> int:
    """Hessian-vector products x measurement images of one trial's geometry: each measurement takes max_iter HVPs
    for lambda_max (an upper bound: Lanczos may stop at tol) and trace_samples for hessian_trace, over batches x
    batch_size images; measured after the last epoch and after every `every`-th one."""
    hvps = {"lambda_max": geometry.max_iter, "hessian_trace": geometry.trace_samples, "blockwise": geometry.max_iter}
    per = sum(hvps.get(m, 1) for m in geometry.measures) * geometry.batches * geometry.batch_size
    times = 1 + (sum((e + 1) % geometry.every == 0 for e in range(epochs - 1)) if geometry.every else 0)
    return per * times


def waves(trial_seconds: list[float], slots: int) -> float:
    """Seconds until the last trial ends when trials start in order, each on the first slot that frees (Tune fills
    `slots` concurrent trials so): the critical path, not the total over the slots."""
    import heapq

    free = [0.0] * max(1, slots)
    for s in trial_seconds:
        heapq.heappush(free, heapq.heappop(free) + s)
    return max(free)


def readable_unit(hours: float) -> tuple[str, float]:
    """The unit a duration of `hours` reads best in, and its count per hour: s below 2 min, min below 2 h, else h."""
    if hours < 2 / 60:
        return "s", 3600.0
    if hours < 2:
        return "min", 60.0
    return "h", 1.0


def two_sig(x: float) -> str:
    """x in two significant figures, trailing zeros kept (0.184 -> 0.18, 0.2004 -> 0.20, 1234 -> 1200), never
    rounded to zero."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    digits = 1 - math.floor(math.log10(abs(float(f"{x:.2g}"))))
    return f"{round(x, digits):.{max(digits, 0)}f}"


def compiled_speedup() -> tuple[float, float]:
    """The least and the most the compiled step's images/s were of the eager step's, over the CARD_FIGURES rows that
    measured both (both methods)."""
    ratios = [
        compiled / eager
        for row in CARD_FIGURES
        if row.compiled_none is not None and row.compiled_sam is not None
        for compiled, eager in ((row.compiled_none, row.train_none), (row.compiled_sam, row.train_sam))
    ]
    return min(ratios), max(ratios)


def _compiles_on_cuda(cfg, workers: int) -> bool:
    """Whether the trial's step compiles on a GPU (trainables.compiled.resolve_compile, the trial's own rule)."""
    import torch

    from trainables.compiled import resolve_compile

    return resolve_compile(cfg, torch.device("cuda"), workers).enabled


def local_gpus() -> tuple[int, str | None]:
    """(count, name) of this machine's GPUs as nvidia-smi lists them, without importing torch; (0, None) without."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0, None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return 0, None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return len(names), (names[0] if names else None)


def estimate_study(
    study: LoadedStudy, *, gpus: int | None = None, cluster_card: str | None = None, cpus: int | None = None
) -> Estimate:
    """The study's trial-hours on `cluster_card` (its CARD_FIGURES rows; the reference card's where it has none), or
    on the CPU rows for a study whose trials hold no GPU.

    gpus/cluster_card/cpus: the cluster's, where known (the dry run passes this machine's for a local run); a CPU
    study's slots come from `cpus` over its cpus_per_trial, a GPU study's from `gpus`."""
    res = study.resources
    cpu = res.gpus_per_trial <= 0
    if cpu:
        card = next((row.card for row in CARD_FIGURES if row.card.startswith(CPU_CARD)), None)
        if card is None:
            return Estimate(
                CPU_CARD, cluster_card, gpus, (), (f"this study: its trials hold no GPU, and {FIGURES_CSV.name} has "
                "no CPU row (python -m benchmarks.bench_trial_cost --smoke --record).",), False, cpu=True,
            )  # fmt: skip
    else:
        known = {row.card for row in CARD_FIGURES}
        card = cluster_card if cluster_card in known else REFERENCE_CARD
    cells, problems, validation = [], [], True
    held = res.workers_per_trial * (1.0 if cpu else res.gpus_per_trial)
    for cell in study.cells:
        cost, problem, counted = _cell_cost(cell, card, res.workers_per_trial, held, cpu)
        if cost is not None:
            cells.append(cost)
            validation = validation and counted
        if problem is not None:
            problems.append(problem)
    slots = res.max_concurrent_trials
    have, per = (cpus, res.cpus_per_trial * res.workers_per_trial) if cpu else (gpus, held)
    if have:
        fit = max(1, math.floor(have / per + 1e-9))
        slots = min(slots, fit) if slots else fit
    startup = next((r.startup_s for r in CARD_FIGURES if r.card == card and r.startup_s), None)
    return Estimate(
        card, cluster_card, gpus, tuple(cells), tuple(problems), validation and bool(cells), slots, startup, cpu, cpus
    )


ESTIMATE_METRIC = "estimate.wall_h"  # on the study's parent run, beside the actual WALL_METRIC
WALL_METRIC = "wall_h"  # from the launch (before Ray's start) to the tuner's end, as the estimate counts it


def record_estimate(target, study: LoadedStudy, wall_s: float, cluster: dict[str, float], *, partial: bool) -> str:
    """Record on the study's parent run, through the launch's record object `target` (log_study_metric,
    set_study_tag), the wall hours since the launch beside the dry run's estimate of them for this cluster, so every
    run checks the estimate; returns the closing line that says both. partial: an interrupted or resumed launch,
    whose wall covers part of the study that the estimate covers whole."""
    actual = wall_s / 3600
    target.log_study_metric(WALL_METRIC, actual)
    try:
        gpus = int(cluster.get("GPU", 0)) or None
        cpus = int(cluster.get("CPU", 0)) or None
        estimate = estimate_study(study, gpus=gpus, cluster_card=local_gpus()[1] if gpus else None, cpus=cpus)
    except Exception as err:  # an estimate that cannot be made must not cost the study its close
        estimate, why = None, f"{type(err).__name__}: {str(err)[:200]}"
    else:
        why = None if estimate.wall_h is not None else (estimate.problems or ("no slot count known",))[0]
    if why is not None:
        unit, per_h = readable_unit(actual)
        line = f"took {two_sig(actual * per_h)} {unit}; no estimate ({why})"
        target.set_study_tag(ESTIMATE_CHECK_TAG, line)
        return f"sharpscale: {line}"
    target.log_study_metric(ESTIMATE_METRIC, estimate.wall_h)
    unit, per_h = readable_unit(estimate.wall_h)
    parts = ", ".join(f"{name} {two_sig(h * per_h)}" for name, h in estimate.wall_parts().items())
    target.set_study_tag(
        ESTIMATE_TAG,
        f"{two_sig(estimate.wall_h * per_h)} {unit} on {estimate.card}, {estimate.slots} at once ({parts}; {unit})",
    )
    line = f"estimated {two_sig(estimate.wall_h * per_h)} {unit}, took {two_sig(actual * per_h)} {unit}"
    line += (
        " (this launch ran part of the study: not comparable)"
        if partial
        else f" (took/estimated {two_sig(actual / estimate.wall_h)})"
    )
    if estimate.problems:  # cells without figures are not in the estimate
        line += f"; {len(estimate.problems)} cell(s) not estimated"
    target.set_study_tag(ESTIMATE_CHECK_TAG, line)
    return f"sharpscale: {line}; the estimate's parts: {parts} ({unit})"
