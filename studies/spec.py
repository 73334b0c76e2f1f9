"""Study files: their schema, their complete validation (every error at once), and their expansion into cells."""

from __future__ import annotations

import copy
import hashlib
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trainables.config import ConfigError, TrialConfig, format_validation_error

__all__ = ["Cell", "Study", "StudyError", "load_study", "SEARCH_SHORTHANDS"]


class StudyError(ValueError):
    """A study file is invalid; `problems` holds one line per error: field path, rule, value, fix."""

    def __init__(self, path: str | Path, problems: list[str]):
        self.path, self.problems = str(path), list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{self.path}: {len(self.problems)} problem(s):\n{lines}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LogUniform(_Strict):
    type: Literal["loguniform"]
    low: float = Field(gt=0.0)
    high: float = Field(gt=0.0)


class Uniform(_Strict):
    type: Literal["uniform"]
    low: float
    high: float


class IntRange(_Strict):
    type: Literal["int"]
    low: int
    high: int
    log: bool = False


class Choice(_Strict):
    type: Literal["choice"]
    values: list[Any] = Field(min_length=1)


Domain = Annotated[Union[LogUniform, Uniform, IntRange, Choice], Field(discriminator="type")]


class Objective(_Strict):
    metric: str = "val_acc"
    mode: Literal["max", "min"] = "max"


class Asha(_Strict):
    grace_period: int = Field(1, ge=1, description="Epochs every trial runs before it can be stopped.")
    reduction_factor: float = Field(3.0, gt=1.0)


class Budget(_Strict):
    trials_per_cell: int | None = Field(
        None, ge=1, description="Trials in each cell that searches something; None: 8, or the grid's size."
    )
    repeats_without_search: int = Field(1, ge=1, description="Trials of a cell with nothing to search.")
    sampler: Literal["tpe", "gp", "random", "grid"] = Field(
        "tpe",
        description="tpe: Optuna's TPE (multivariate, constant liar); gp: Optuna's Gaussian-process sampler; "
        "grid: every combination of choice values. tpe and gp start with a few random trials (studies.search).",
    )
    seed: int = Field(0, ge=0, description="Seed of the Optuna samplers.")
    asha: Asha | None = Field(None, description="Early stopping of poor trials (ASHA over epochs); off when absent.")
    time_limit_s: float | None = Field(None, gt=0, description="Stop launching trials after this many seconds.")


DEFAULT_TRIALS_PER_CELL = 8


class Resources(_Strict):
    cpus_per_trial: float = Field(1.0, gt=0, description="CPUs of each trial (of each worker when workers > 1).")
    gpus_per_trial: float = Field(0.0, ge=0, description="GPUs likewise; fractions share one GPU between small trials.")
    workers_per_trial: int = Field(1, ge=1, description="Ray Train DDP workers of each trial (1: in the trial's process).")
    custom: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources each trial (each worker) needs, e.g. {node_a: 1}."
    )
    max_concurrent_trials: int | None = Field(
        None,
        ge=1,
        description="Trials running at once; None: as many as the cluster's resources hold (Tune places trials by "
        "their requests above).",
    )
    max_failures: int = Field(2, ge=0, description="Retries of a trial whose worker died (from its checkpoint).")


class Tracking(_Strict):
    uri: str = Field("sqlite:///mlflow.db", description="MLflow tracking URI; relative sqlite paths are made absolute.")
    artifact_location: str = Field("mlartifacts", description="Artifact root for a new experiment (made absolute).")
    experiment: str | None = Field(None, description="Experiment name; defaults to the study name.")
    log_checkpoint: bool = Field(False, description="Keep each trial's final checkpoint as an artifact of its run.")


class Study(_Strict):
    """A study file, as written."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    objective: Objective = Field(default_factory=Objective)
    base: dict[str, Any] = Field(default_factory=dict, description="Trial config shared by every cell.")
    factors: dict[str, dict[str, dict[str, Any]] | list[Any]] = Field(default_factory=dict)
    search: dict[str, Domain] = Field(default_factory=dict)
    budget: Budget = Field(default_factory=Budget)
    resources: Resources = Field(default_factory=Resources)
    tracking: Tracking = Field(default_factory=Tracking)
    storage: str = Field("sharpscale_runs", description="Directory for Ray's results and Optuna's database.")
    smoke: dict[str, Any] = Field(default_factory=dict, description="Extra overrides applied by --smoke.")

    @model_validator(mode="after")
    def _ranges(self) -> "Study":
        problems = []
        for key, dom in self.search.items():
            if isinstance(dom, (LogUniform, Uniform, IntRange)) and not dom.low < dom.high:
                problems.append(
                    f"search.{key}: low < high must hold, got low={dom.low}, high={dom.high}. Fix: swap or widen them."
                )
        if self.budget.sampler == "grid":
            for key, dom in self.search.items():
                if not isinstance(dom, (Choice, IntRange)):
                    problems.append(
                        f"search.{key}: budget.sampler 'grid' needs choice or int domains, got {dom.type}. "
                        f"Fix: list the values, e.g. {{type: choice, values: [0.01, 0.05, 0.1]}}, or use sampler tpe."
                    )
        if problems:
            raise ValueError("\n".join(problems))
        return self


# Method knobs may be searched by their bare name; each applies only to the cells whose method takes it.
def _method_hparams() -> dict[str, set[str]]:
    from optim import METHODS

    owners: dict[str, set[str]] = {}
    for name, spec in METHODS.items():
        for hp in spec.hparams:
            owners.setdefault(hp, set()).add(name)
    return owners


SEARCH_SHORTHANDS = "bare names of method hparams (rho, alpha, lam, k, ...) mean optimizer.hparams.<name>"


@dataclass(frozen=True)
class Cell:
    """One combination of factor levels: fixed overrides plus the search space that applies to it."""

    key: str                       # e.g. "arch=vit,method=sam"
    levels: dict[str, str]         # factor -> level name
    config: dict[str, Any]         # base + overrides, as a nested dict (validated)
    space: dict[str, Domain]       # dotted config path -> domain
    trials: int


@dataclass(frozen=True)
class LoadedStudy:
    spec: Study
    path: Path
    text: str
    cells: tuple[Cell, ...]

    @property
    def file_hash(self) -> str:
        return hashlib.sha256(self.file_text_with_overrides.encode()).hexdigest()[:16]

    smoke: bool = False
    overrides: dict[str, Any] | None = None

    @property
    def file_text_with_overrides(self) -> str:
        """What was run: the file, and the --set overrides on top of it (also hashed and logged)."""
        if not self.overrides:
            return self.text
        return self.text + "\n# --set overrides:\n" + yaml.safe_dump({"overrides": self.overrides}, sort_keys=True)

    @property
    def total_trials(self) -> int:
        return sum(c.trials for c in self.cells)

    @property
    def resources(self) -> "Resources":
        """The study's resources; a smoke run is one CPU process per trial whatever the file asks for."""
        if not self.smoke:
            return self.spec.resources
        return self.spec.resources.model_copy(update={"cpus_per_trial": 1.0, "gpus_per_trial": 0.0, "workers_per_trial": 1, "custom": {}})


def set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set tree[a][b][c] = value for dotted 'a.b.c', creating levels as needed."""
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"{dotted}: {part!r} is not a section")
    node[parts[-1]] = value


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "kwargs":
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _overrides_to_tree(overrides: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in overrides.items():
        set_path(tree, key, value)
    return tree


def _levels(name: str, spec: dict[str, dict[str, Any]] | list[Any]) -> dict[str, dict[str, Any]]:
    if isinstance(spec, list):  # `data.fraction: [0.1, 0.5]` — the factor is a config path, levels its values
        return {str(v): {name: v} for v in spec}
    return spec


def _resolve_search_key(key: str, owners: dict[str, set[str]]) -> str:
    return f"optimizer.hparams.{key}" if "." not in key and key in owners else key


def _domain_probes(dom: Domain) -> list[Any]:
    if isinstance(dom, Choice):
        return list(dom.values)
    return [dom.low, dom.high]


def _known_path(path: str) -> bool:
    node: Any = TrialConfig
    for part in path.split("."):
        fields = getattr(node, "model_fields", None)
        if fields is None:
            return True  # inside a free-form dict (model.kwargs, optimizer.hparams)
        if part not in fields:
            return False
        node = fields[part].annotation
    return True


def expand(spec: Study, *, smoke: bool = False) -> tuple[list[Cell], list[str]]:
    """Cells of the study, each validated with its search bounds substituted; returns (cells, problems)."""
    owners = _method_hparams()
    problems: list[str] = []
    for key in spec.search:
        if "." in key and not _known_path(key):
            problems.append(f"search.{key}: not a trial config path. Fix: use a path such as optimizer.lr, or {SEARCH_SHORTHANDS}.")
        elif "." not in key and key not in owners:
            problems.append(
                f"search.{key}: not a method hparam ({sorted(owners)}) nor a dotted config path. "
                f"Fix: use e.g. optimizer.lr, or one of those names."
            )
    for fname, fspec in spec.factors.items():
        for level, overrides in _levels(fname, fspec).items():
            if not isinstance(overrides, dict):
                problems.append(
                    f"factors.{fname}.{level}: a level must map config paths to values, got {overrides!r}. "
                    f"Fix: write it as `{level}: {{optimizer.method: sam}}`, or give the factor a list of values."
                )
                continue
            for path in overrides:
                if not _known_path(path):
                    problems.append(f"factors.{fname}.{level}.{path}: not a trial config path. Fix: check its spelling.")
    if problems:
        return [], problems

    factor_levels = [(f, _levels(f, s)) for f, s in spec.factors.items()]
    if smoke:
        # Every named level (each architecture, each method) stays; a list of values (fractions, seeds) keeps its first.
        factor_levels = [
            (f, dict(list(levels.items())[:1]) if isinstance(spec.factors[f], list) else levels)
            for f, levels in factor_levels
        ]
    cells: list[Cell] = []
    missing_roots: dict[str, list[str]] = {}
    combos = itertools.product(*[list(levels.items()) for _, levels in factor_levels]) if factor_levels else [()]
    for combo in combos:
        levels = {factor_levels[i][0]: name for i, (name, _) in enumerate(combo)}
        tree = copy.deepcopy(spec.base)
        for _, overrides in combo:
            tree = deep_merge(tree, _overrides_to_tree(overrides))
        if smoke:
            tree = _smoke_tree(tree, spec.smoke)  # --smoke wins over every level
        elif problem := _missing_root(tree):
            missing_roots.setdefault(problem, []).append(",".join(f"{f}={lv}" for f, lv in levels.items()) or "all")
        key = ",".join(f"{f}={lv}" for f, lv in levels.items())
        label = f"cell {key}" if key else "the study"
        method = tree.get("optimizer", {}).get("method", TrialConfig().optimizer.method)
        space: dict[str, Domain] = {}
        for skey, dom in spec.search.items():
            path = _resolve_search_key(skey, owners)
            if path.startswith("optimizer.hparams.") and method not in owners.get(path.rsplit(".", 1)[1], set()):
                continue  # conditional: rho only where the method has a rho
            space[path] = dom
        try:
            TrialConfig.load(tree)
            for path, dom in space.items():
                for probe in _domain_probes(dom):
                    probe_tree = copy.deepcopy(tree)
                    set_path(probe_tree, path, probe)
                    try:
                        TrialConfig.load(probe_tree)
                    except ConfigError as err:
                        problems.extend(f"search.{path} = {probe!r} in {label}: {p.strip()}" for p in err.problems)
        except ConfigError as err:
            problems.extend(f"{label}: {p}" for p in err.problems)
            continue
        trials, problem = _cell_trials(spec.budget, space, label)
        if problem:
            problems.append(problem)
        if smoke:
            trials = 1
        cells.append(Cell(key=key, levels=levels, config=tree, space=space, trials=trials))
    for problem, where in missing_roots.items():
        listed = "; ".join(where[:4]) + (f"; and {len(where) - 4} more" if len(where) > 4 else "")
        problems.append(f"{problem} (cells: {listed})")
    # A search parameter that applies to no cell is almost always a typo or a forgotten factor.
    used = {p for c in cells for p in c.space}
    for skey in spec.search:
        if cells and _resolve_search_key(skey, owners) not in used:
            problems.append(
                f"search.{skey}: applies to no cell (no cell's method takes it). "
                f"Fix: add a method that takes it to the factors, or remove it."
            )
    return cells, _dedupe(problems)


def grid_size(space: dict[str, Domain]) -> int:
    size = 1
    for dom in space.values():
        size *= len(dom.values) if isinstance(dom, Choice) else dom.high - dom.low + 1
    return size


def _cell_trials(budget: Budget, space: dict[str, Domain], label: str) -> tuple[int, str | None]:
    if not space:
        return budget.repeats_without_search, None
    if budget.sampler != "grid":
        return budget.trials_per_cell or DEFAULT_TRIALS_PER_CELL, None
    size = grid_size(space)
    if budget.trials_per_cell not in (None, size):
        return size, (
            f"budget.trials_per_cell: with sampler 'grid' {label} has {size} grid points, got {budget.trials_per_cell}. "
            f"Fix: leave trials_per_cell unset (it follows the grid) or change the grid."
        )
    return size, None


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def load_study(path: str | Path, *, smoke: bool = False, overrides: dict[str, Any] | None = None) -> LoadedStudy:
    """Read and validate a study file completely; a StudyError lists every problem at once.

    overrides: dotted trial-config paths set in `base` (the CLI's `--set data.root=/data`), before validation.
    """
    path = Path(path)
    if not path.is_file():
        raise StudyError(path, [f"study file: does not exist (looked at {path.resolve()}). Fix: check the path."])
    text = path.read_text()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise StudyError(path, [f"YAML syntax: {err}. Fix: correct the file's YAML."]) from None
    if not isinstance(raw, dict):
        raise StudyError(path, [f"top level: must be a mapping of study fields, got {type(raw).__name__}."])
    bad = [k for k in (overrides or {}) if not _known_path(k)]
    if bad:
        raise StudyError(path, [f"--set {k}: not a trial config path. Fix: use a path such as data.root or optimizer.lr." for k in bad])
    for key, value in (overrides or {}).items():
        base = raw.setdefault("base", {})
        if isinstance(base, dict):
            set_path(base, key, value)
    try:
        spec = Study.model_validate(raw)
    except ValidationError as err:
        raise StudyError(path, _study_errors(err)) from None
    cells, problems = expand(spec, smoke=smoke)
    if problems:
        raise StudyError(path, problems)
    return LoadedStudy(spec=spec, path=path.resolve(), text=text, cells=tuple(cells), smoke=smoke, overrides=dict(overrides or {}))


def _study_errors(err: ValidationError) -> list[str]:
    lines = []
    for line in format_validation_error(err):
        lines.extend(line.split("\n"))  # the cross-field validator joins several problems
    return lines


# --smoke: the same study, tiny, on the embedded digits, on CPU: for CI and for checking a file before a cluster run.
_SMOKE = {
    "data": {"name": "digits", "root": None, "img_size": 16, "batch_size": 64, "num_workers": 0},
    "schedule": {"epochs": 2, "warmup_epochs": 0},
    "train": {"device": "cpu", "threads": 1},
}
# One tiny model per family: the smoke run keeps each cell's architecture family, not its size.
_SMOKE_MODELS = {
    "vit": {"name": "vit_tiny_patch16_224", "kwargs": {"patch_size": 4, "embed_dim": 32, "depth": 1, "num_heads": 2}},
    "mixer": {"name": "mixer_s16_224", "kwargs": {"patch_size": 4, "num_blocks": 1, "embed_dim": 32}},
    "resnet": {"name": "resnet18", "cifar_stem": True, "kwargs": {"layers": [1, 1, 1, 1], "channels": [8, 16, 16, 32]}},
}


def _smoke_tree(tree: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    from trainables.models import model_family

    name = tree.get("model", {}).get("name", TrialConfig().model.name)
    try:
        tiny = _SMOKE_MODELS[model_family(name)]
    except ValueError:
        tiny = {}  # an unknown family is reported by the cell's own validation
    model = {k: v for k, v in tree.get("model", {}).items() if k in ("drop_rate", "drop_path_rate")}
    return deep_merge(deep_merge({**tree, "model": {**model, **tiny}}, _SMOKE), extra)


def _missing_root(tree: dict[str, Any]) -> str | None:
    root = tree.get("data", {}).get("root")
    if root is None or Path(root).expanduser().exists():
        return None
    return (
        f"data.root: the directory must exist, got {root!r}. Fix: point it at the dataset "
        f"(sharpscale run --set data.root=/path/to/data), or check the file with --smoke on the embedded digits."
    )
