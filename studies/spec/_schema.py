"""A study file's schema: its fields and their rules, the cells it expands to, and where its state lives."""

from __future__ import annotations

import copy
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from trainables.errors import UserError, shown
from trainables.metrics import EPOCH_METRICS
from trainables.naming import DEFAULT_ARTIFACT_ROOT, DEFAULT_TRACKING_URI, experiment_name
from trainables.ray_train import KEEP_CHECKPOINTS
from trainables.secrets import credential_problem
from trainables.tracking import BEST_EPOCH_METRICS

# The trials a study may plan (a grid over 0..1e9 would plan a billion).
MAX_TRIALS = 100_000


class StudyError(UserError):
    """A study file is invalid; `problems` holds one line per error: field path, rule, value, fix."""

    def __init__(self, path: str | Path, problems: list[str]):
        self.path, self.problems = str(path), list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{self.path}: {len(self.problems)} problem(s):\n{lines}")


class _Strict(BaseModel):
    # strict: `trials_per_cell: true` is not 1, nor "4" a number; finite: `.inf` is no bound.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


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

    @model_validator(mode="after")
    def _log_positive(self) -> IntRange:
        if self.log and self.low < 1:
            raise ValueError(
                f"an int domain with log: true needs low >= 1 (log of {self.low} is undefined), got low={self.low}. "
                f"Fix: set low: 1, or drop log: true."
            )
        return self


class Choice(_Strict):
    type: Literal["choice"]
    values: list[Any] = Field(min_length=1)

    @field_validator("values")
    @classmethod
    def _distinct(cls, values: list[Any]) -> list[Any]:
        if dup := _repeated(values):
            raise ValueError(
                f"choice values must be distinct (each is one option), got {shown(dup)} more than once in "
                f"{shown(values)}. Fix: list each value once."
            )
        return values


Domain = Annotated[Union[LogUniform, Uniform, IntRange, Choice], Field(discriminator="type")]


class Objective(_Strict):
    """What ranks a cell's trials, for the searcher, the roll-up onto the cell runs, `status` and `report`."""

    metric: str = Field("val_acc", description="A metric every trial logs each epoch (val_acc, val_loss, ...).")
    mode: Literal["max", "min"] = "max"
    epoch: Literal["final", "best"] = Field(
        "final",
        description="final: the metric at the trial's last epoch (what a run that stops on schedule delivers); "
        f"best: its best epoch, for the metrics the loop keeps the best of ({', '.join(BEST_EPOCH_METRICS)}).",
    )

    @model_validator(mode="after")
    def _best_is_kept(self) -> Objective:
        if self.epoch == "best" and self.metric not in BEST_EPOCH_METRICS:
            raise ValueError(
                f"objective.epoch: 'best' needs a metric whose best epoch each trial records "
                f"({', '.join(BEST_EPOCH_METRICS)}), got metric {self.metric!r}. Fix: objective.epoch: final, or "
                f"metric: {next(iter(BEST_EPOCH_METRICS))}."
            )
        return self

    @property
    def column(self) -> str:
        """The metric key holding the objective: a trial's result key, its MLflow metric, load_runs' column."""
        return BEST_EPOCH_METRICS[self.metric] if self.epoch == "best" else self.metric

    @property
    def label(self) -> str:
        """The statistic in words, for table headers: e.g. 'val_acc (final epoch)'."""
        return f"{self.metric} ({self.epoch} epoch)"

    @field_validator("metric")
    @classmethod
    def _reported(cls, metric: str) -> str:
        if metric not in EPOCH_METRICS:
            import difflib

            close = difflib.get_close_matches(metric, EPOCH_METRICS, n=1)
            raise ValueError(
                f"objective.metric: must be a metric every trial reports ({', '.join(EPOCH_METRICS)}), got "
                f"{shown(metric)}. Fix: {'did you mean ' + repr(close[0]) + '?' if close else 'use e.g. val_acc.'}"
            )
        return metric


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
    time_limit_s: float | None = Field(
        None, gt=0, description="End the study after this many seconds: no new trial starts, running ones are stopped."
    )


DEFAULT_TRIALS_PER_CELL = 8


class Resources(_Strict):
    cpus_per_trial: float = Field(1.0, gt=0, description="CPUs of each trial (of each worker when workers > 1).")
    gpus_per_trial: float = Field(0.0, ge=0, description="GPUs likewise; fractions share one GPU between small trials.")
    workers_per_trial: int = Field(
        1, ge=1, description="Ray Train DDP workers of each trial (1: in the trial's process)."
    )
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

    @field_validator("cpus_per_trial", "gpus_per_trial")
    @classmethod
    def _ray_unit(cls, value: float, info) -> float:
        if (problem := _ray_quantity_problem(f"resources.{info.field_name}", value)) is not None:
            raise ValueError(problem)
        return value

    @field_validator("custom")
    @classmethod
    def _ray_units(cls, value: dict[str, float]) -> dict[str, float]:
        problems = [p for k, q in value.items() if (p := _ray_quantity_problem(f"resources.custom.{k}", q))]
        if problems:
            raise ValueError("\n".join(problems))
        return value


# Ray counts resources in units of 1/10000 and refuses a request finer than one unit, but only once the trials are
# placed, after Ray started (a traceback per trial, an Optuna trial left RUNNING): checked here instead.
RAY_RESOURCE_UNIT = 0.0001


def _ray_quantity_problem(field: str, value: float) -> str | None:
    if value == 0 or value >= RAY_RESOURCE_UNIT:
        return None
    return (
        f"{field}: a resource Ray can place is 0 or at least {RAY_RESOURCE_UNIT} (Ray counts in units of "
        f"{RAY_RESOURCE_UNIT}), got {shown(value)}. Fix: ask for e.g. 0.01, or 1 (a whole CPU or GPU)."
    )


# A study's name and its experiment's name become file and directory names under `storage` (Ray's results, the
# Optuna database, the report folder): one path component, nothing that climbs out or starts elsewhere.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


# A name becomes a file name with a suffix (<name>-launch<N>.optuna.db): file systems allow 255 bytes.
MAX_NAME_CHARS = 100


def _name_problem(field: str, value: str) -> str | None:
    if re.fullmatch(NAME_PATTERN, value) and ".." not in value:
        if len(value) <= MAX_NAME_CHARS:
            return None
        return (
            f"{field}: at most {MAX_NAME_CHARS} characters (it names files and directories under `storage`), got "
            f"{len(value)}: {shown(value)}. Fix: a shorter name, e.g. {shown(value[:40])}."
        )
    return (
        f"{field}: must be one file-name component (letters, digits, '_', '.', '-', starting with a letter or digit, "
        f"no '..'), because it names directories under `storage`; got {shown(value)}. Fix: e.g. "
        f"{shown(re.sub(r'[^A-Za-z0-9_.-]+', '-', value).strip('-.')[:64] or 'my-study')}."
    )


class Tracking(_Strict):
    uri: str = Field(DEFAULT_TRACKING_URI, description="MLflow tracking URI; relative sqlite paths are made absolute.")
    artifact_location: str = Field(
        DEFAULT_ARTIFACT_ROOT, description="Artifact root for a new experiment (made absolute)."
    )
    experiment: str | None = Field(None, description="Experiment name; defaults to the study name.")
    log_checkpoint: bool = Field(False, description="Keep each trial's final checkpoint as an artifact of its run.")

    @field_validator("experiment")
    @classmethod
    def _one_component(cls, value: str | None) -> str | None:
        if value is not None and (problem := _name_problem("tracking.experiment", value)):
            raise ValueError(problem)
        return value


class Confirm(_Strict):
    """The confirm stage (studies.confirm): once a cell's search has ended, `seeds` fresh trials at the knobs it chose,
    scored on the validation set's held-out half, so that what the report compares was never used to choose."""

    seeds: int = Field(ge=1, description="Confirm trials of each cell, one per seed: seed_start, seed_start + 1, ...")
    seed_start: int = Field(
        1000,
        ge=0,
        description="The first confirm seed. Fresh: no search trial may use one (its train.seed), so that no confirm "
        "run repeats a trial the choice saw; the same seeds in every cell, so that cells pair by seed.",
    )

    subsets: Literal["fixed", "per_seed"] = Field(
        "fixed",
        description="The training subset of each confirm run. fixed: every run trains on the cell's own subset "
        "(its data.fraction_seed), so the confirm intervals are given that subset. per_seed: confirm seed s trains on "
        "subset s (data.fraction_seed = s), one subset per seed shared by every cell, so cells still pair by seed and "
        "the intervals include the variation from one drawn subset to another (fraction_seed replicates).",
    )

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.seed_start, self.seed_start + self.seeds))


class SmokeForm(_Strict):
    """Which part of the study `--smoke` runs, so that the tiny run still asks the study's question."""

    levels: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="Levels each named factor keeps under --smoke (level names, or values of a list factor); a "
        "factor not named keeps every named level, or the first value of a list.",
    )
    trials_per_cell: int = Field(
        1, ge=1, description="Trials of each cell that searches something under --smoke (at most its budget)."
    )
    confirm_seeds: int = Field(
        2, ge=1, description="Confirm trials of each cell under --smoke (at most confirm.seeds): two, so gains pair."
    )


class Checkpoints(_Strict):
    """Tune's checkpoints of each trial; their cadence is the trial config's train.checkpoint_every."""

    keep: int = Field(
        KEEP_CHECKPOINTS,
        ge=1,
        description="Checkpoints kept per trial (Tune's num_to_keep). Tune snapshots its own state after a trial "
        "writes this many, so 2 or more keeps the one a killed driver's snapshot names, and halves the snapshots.",
    )


# Where a study keeps its state: not part of what it computes, so neither in the file hash nor needed to find
# the run again (`resume` reads the resolved values back from the study run's tags).
LOCATION_FIELDS = ("storage", "shared_mounts", "optuna_storage")
# Study fields `--set` may change; the rest define the study itself (edit the file) or are trial paths (`base`).
SETTABLE_FIELDS = ("budget", "resources", "tracking", "checkpoints", *LOCATION_FIELDS)
DEFAULT_STORAGE = "sharpscale_runs"
_RDB_SCHEMES = ("sqlite", "postgresql", "mysql", "oracle", "mssql")


class Study(_Strict):
    """A study file, as written."""

    name: str

    @field_validator("name")
    @classmethod
    def _name_is_one_component(cls, value: str) -> str:
        if problem := _name_problem("name", value):
            raise ValueError(problem)
        return value

    description: str = ""
    objective: Objective = Field(default_factory=Objective)
    base: dict[str, Any] = Field(default_factory=dict, description="Trial config shared by every cell.")
    factors: dict[str, dict[str, dict[str, Any]] | list[Any]] = Field(default_factory=dict)
    search: dict[str, Domain] = Field(default_factory=dict)
    method_settings: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Method name -> dotted config paths and values set in every cell whose method it is, over the "
        "factors' levels: what a method whose update is its own (bSAM: no weight decay, the base optimizer lending "
        "only its lr) needs where the other cells' levels set the base optimizer.",
    )
    budget: Budget = Field(default_factory=Budget)
    resources: Resources = Field(default_factory=Resources)
    tracking: Tracking = Field(default_factory=Tracking)
    storage: str = Field(
        DEFAULT_STORAGE,
        description="Ray's results and checkpoints: a directory (relative: to the study file's directory) or a URI "
        "(s3://, gs://). On a multi-node cluster a URI, or a path under one of shared_mounts.",
    )
    shared_mounts: list[str] = Field(
        default_factory=list,
        description="Absolute directories mounted at the same path on every node (NFS, EFS); a storage path under "
        "one of them is accepted on a multi-node cluster.",
    )
    optuna_storage: str | None = Field(
        None,
        description="Optuna's database: a path or sqlite:/// URL (relative: to the study file's directory), an RDB "
        "URL (postgresql://...), or journal:///abs/path. None: <storage>/<experiment>.optuna.db beside a path "
        "storage; for a URI storage, under sharpscale_runs/ beside the study file (multi-node: set it).",
    )
    checkpoints: Checkpoints = Field(default_factory=Checkpoints)
    confirm: Confirm | None = Field(
        None,
        description="The confirm stage: fresh seeds at each cell's chosen knobs, scored on held-out data (what the "
        "report compares). None: the study's numbers are its search trials', chosen and measured on the same data.",
    )
    smoke: dict[str, Any] = Field(default_factory=dict, description="Extra overrides applied by --smoke.")
    smoke_form: SmokeForm = Field(default_factory=SmokeForm)

    @field_validator("shared_mounts")
    @classmethod
    def _mounts_absolute(cls, mounts: list[str]) -> list[str]:
        # An empty entry or one holding a variable is said by location_problem, with its own fix.
        relative = [m for m in mounts if not location_problem("", m) and not Path(m).expanduser().is_absolute()]
        if relative:
            raise ValueError(
                f"shared_mounts: every entry must be an absolute directory that all nodes mount, got {relative}. "
                f"Fix: write the mount point, e.g. /mnt/shared."
            )
        return mounts

    @field_validator("optuna_storage")
    @classmethod
    def _optuna_storage_form(cls, spec: str | None) -> str | None:
        if spec is None or not _is_uri(spec):
            return spec
        scheme = spec.split("://", 1)[0].split("+", 1)[0].lower()
        if scheme == "journal" and not spec[len("journal://") :].startswith("/"):
            raise ValueError(
                f"optuna_storage: a journal file needs an absolute path, journal:///abs/path, got {shown(spec)}. "
                f"Fix: e.g. journal:///mnt/shared/sharpscale_runs/STUDY.optuna.journal."
            )
        if scheme not in ("journal", *_RDB_SCHEMES):
            raise ValueError(
                f"optuna_storage: Optuna stores in a file or a database, not in {scheme}://, got {shown(spec)}. Fix: a path "
                f"or sqlite:///path, journal:///abs/path on shared storage, or an RDB URL such as postgresql://user@host/db."
            )
        return spec

    @model_validator(mode="after")
    def _ranges(self, info: ValidationInfo) -> "Study":
        problems = []
        locations = (
            ("tracking.uri", self.tracking.uri),
            ("storage", self.storage),
            ("optuna_storage", self.optuna_storage),
        )
        for field, uri in locations:
            if uri is not None and (problem := credential_problem(field, uri)):
                problems.append(problem)
        places = [*locations, ("tracking.artifact_location", self.tracking.artifact_location)]
        places += [(f"shared_mounts.{i}", mount) for i, mount in enumerate(self.shared_mounts)]
        problems += [p for field, value in places if value is not None and (p := location_problem(field, value))]
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
        if self.confirm is not None and "train.seed" in {*self.factors, *self.search}:
            where = "factors" if "train.seed" in self.factors else "search"
            problems.append(
                f"{where}.train.seed: with a confirm stage the seeds that measure each cell are the confirm's (confirm.seeds "
                f"fresh ones at the chosen knobs); seeds as a factor or a knob would search each seed apart and repeat "
                f"the confirm runs. Fix: drop {where}.train.seed and set confirm.seeds to the seeds wanted."
            )
        if self.confirm is not None and self.confirm.subsets == "per_seed":
            for where in ("factors", "search"):
                if "data.fraction_seed" in getattr(self, where):
                    problems.append(
                        f"{where}.data.fraction_seed: confirm.subsets 'per_seed' sets each confirm run's subset to its "
                        f"seed, so the values {where} gives it would not reach the runs the report compares. "
                        f"Fix: drop {where}.data.fraction_seed, or set confirm.subsets: fixed."
                    )
        if self.confirm is not None and self.budget.asha is not None:
            problems.append(
                "confirm: a confirm stage needs every confirm trial trained to its end, and budget.asha would stop "
                "some early (ranked against the search trials). Fix: drop budget.asha, or the confirm section."
            )
        collect = info.context.get("problems") if isinstance(info.context, dict) else None
        if problems and collect is not None:
            collect.extend(problems)  # load_study goes on to the cells, to list their problems with these
        elif problems:
            raise ValueError("\n".join(problems))
        return self


# `$HOME`, `${SCRATCH}`: a shell's variables, which nothing here expands (the file is no shell script) and which
# differ from node to node on a cluster, so a path holding one would name another place on each.
_VARIABLE = re.compile(r"\$(\{[^}]*\}?|[A-Za-z_][A-Za-z0-9_]*)")
# Written out in the fix only for these: another variable's value may be a secret.
_SHOWN_VARIABLES = ("HOME", "USER")


def location_problem(field: str, value: str) -> str | None:
    """A path or URI of where state or data lives that is empty or holds a shell variable, said in one line."""
    if not value.strip():
        examples = {"tracking": "sqlite:////abs/path/mlflow.db", "data": "/data/cifar10"}
        example = next((e for k, e in examples.items() if k in field), "/mnt/shared/sharpscale_runs")
        return (
            f"{field}: must name a directory or URI, got the empty text {shown(value)}, which would mean the current "
            f"directory (or the default) without a word. Fix: give the place, e.g. {example}, or leave the setting "
            f"out for its default."
        )
    if (found := _VARIABLE.search(value)) is None:
        return None
    written = value
    for name in _SHOWN_VARIABLES:
        if name in os.environ:
            written = re.sub(rf"\$(\{{{name}\}}|{name}(?![A-Za-z0-9_]))", lambda _m: os.environ[name], written)
    example = f" (here: {shown(written)})" if not _VARIABLE.search(written) else ""
    return (
        f"{field}: a path is used as written, and {found.group(0)} in {shown(value)} is a shell variable that is not "
        f"expanded (on a cluster it may differ from node to node). Fix: write the path out{example}."
    )


def _is_uri(value: str) -> bool:
    return "://" in value


def _repeated(values: list[Any]) -> Any:
    """The first value whose text repeats an earlier one's (0.5 and "0.5" name the same level), else None."""
    seen: set[str] = set()
    for v in values:
        if str(v) in seen:
            return v
        seen.add(str(v))
    return None


@dataclass(frozen=True)
class Cell:
    """One combination of factor levels: fixed overrides plus the search space that applies to it."""

    key: str  # e.g. "arch=vit,method=sam"
    levels: dict[str, str]  # factor -> level name
    config: dict[str, Any]  # base + overrides, as a nested dict (validated)
    space: dict[str, Domain]  # dotted config path -> domain
    trials: int  # search trials (none for a cell with nothing to search when the study has a confirm stage)
    confirm: int = 0  # confirm trials, one per confirm seed (studies.confirm)

    @property
    def planned(self) -> int:
        """Every trial the cell runs: its search's and its confirm stage's."""
        return self.trials + self.confirm


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
        """What was run: the file, and the --set overrides on top of it (hashed); where its state lives is not."""
        computed = {k: v for k, v in (self.overrides or {}).items() if k.split(".", 1)[0] not in LOCATION_FIELDS}
        if not computed:
            return self.text
        return self.text + "\n# --set overrides:\n" + yaml.safe_dump({"overrides": computed}, sort_keys=True)

    @property
    def location_overrides(self) -> dict[str, Any]:
        """The --set/--storage overrides of where the study keeps its state."""
        return {k: v for k, v in (self.overrides or {}).items() if k.split(".", 1)[0] in LOCATION_FIELDS}

    @property
    def storage(self) -> str:
        """Ray's storage, resolved: a URI as written, a path made absolute against the study file's directory."""
        return resolve_storage(self.spec.storage, self.path.parent)

    def optuna_storage(self, run_name: str) -> str:
        """Optuna's storage URL, resolved (see `Study.optuna_storage`); never relative to the working directory."""
        spec = self.spec.optuna_storage
        if spec is None:
            beside = self.storage if not _is_uri(self.storage) else str(self.path.parent / DEFAULT_STORAGE)
            return f"sqlite:///{Path(beside) / f'{run_name}.optuna.db'}"
        return optuna_storage_url(spec, self.path.parent)

    @property
    def experiment_name(self) -> str:
        """The MLflow experiment this study (in this form: --smoke or not) records into."""
        return experiment_name(self.spec.name, self.spec.tracking.experiment, smoke=self.smoke)

    @property
    def total_trials(self) -> int:
        return sum(c.planned for c in self.cells)

    @property
    def resources(self) -> "Resources":
        """The study's resources; a smoke run is one CPU process per trial whatever the file asks for."""
        if not self.smoke:
            return self.spec.resources
        return self.spec.resources.model_copy(
            update={"cpus_per_trial": 1.0, "gpus_per_trial": 0.0, "workers_per_trial": 1, "custom": {}}
        )


def resolve_storage(storage: str, base: Path) -> str:
    if _is_uri(storage):
        return storage.rstrip("/")
    return str((base / Path(storage).expanduser()).resolve())


def optuna_storage_url(spec: str, base: Path) -> str:
    """A study file's `optuna_storage` as the URL Optuna opens: paths and relative sqlite:/// made absolute."""
    if spec.startswith("sqlite:///"):
        return f"sqlite:///{(base / Path(spec[len('sqlite:///') :]).expanduser()).resolve()}"
    if _is_uri(spec):
        return spec
    return f"sqlite:///{(base / Path(spec).expanduser()).resolve()}"


def storage_is_shared(storage: str, shared_mounts: list[str]) -> bool:
    """Whether every node reaches `storage`: a URI, or a path under one of the declared shared mounts."""
    if _is_uri(storage):
        return True
    path = Path(storage).resolve()
    return any(path.is_relative_to(Path(m).expanduser().resolve()) for m in shared_mounts)


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
