"""Study files: their schema, their complete validation (every error at once), and their expansion into cells."""

from __future__ import annotations

import copy
import difflib
import errno
import hashlib
import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainables.config import ConfigError, TrialConfig, format_validation_error
from trainables.errors import UserError, shown
from trainables.metrics import EPOCH_METRICS
from trainables.naming import DEFAULT_ARTIFACT_ROOT, DEFAULT_TRACKING_URI, experiment_name
from trainables.ray_train import KEEP_CHECKPOINTS
from trainables.secrets import credential_problem
from trainables.staging import is_uri
from trainables.tracking import BEST_EPOCH_METRICS

__all__ = [
    "MAX_STUDY_FILE_BYTES",
    "MAX_TRIALS",
    "MAX_YAML_NODES",
    "SEARCH_SHORTHANDS",
    "Cell",
    "Confirm",
    "Study",
    "StudyError",
    "load_study",
    "optuna_storage_url",
    "parse_yaml",
    "storage_is_shared",
]

# Bounds on what a study file may ask of this process before anything runs: its size, the values its YAML aliases
# expand to (an alias bomb of 1 KB expands to gigabytes), and the trials it plans (a grid over 0..1e9).
MAX_STUDY_FILE_BYTES = 1_000_000
MAX_YAML_NODES = 100_000
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
        relative = [m for m in mounts if not Path(m).expanduser().is_absolute()]
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
    def _ranges(self) -> "Study":
        problems = []
        for field, uri in (
            ("tracking.uri", self.tracking.uri),
            ("storage", self.storage),
            ("optuna_storage", self.optuna_storage),
        ):
            if uri is not None and (problem := credential_problem(field, uri)):
                problems.append(problem)
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
        if self.confirm is not None and self.budget.asha is not None:
            problems.append(
                "confirm: a confirm stage needs every confirm trial trained to its end, and budget.asha would stop "
                "some early (ranked against the search trials). Fix: drop budget.asha, or the confirm section."
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self


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


class _StudyLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses a key given twice in one mapping (the last would win without a word)."""

    def __init__(self, stream):
        super().__init__(stream)
        self.surprises: list[str] = []  # YAML 1.1 readings the writer rarely means, reported together afterwards

    def construct_yaml_bool(self, node):
        value = super().construct_yaml_bool(node)
        if node.style is None and node.value.lower() not in ("true", "false"):
            self.surprises.append(
                f"line {node.start_mark.line + 1}: {node.value} is read as the boolean {str(value).lower()} (YAML 1.1). "
                f"Fix: write {str(value).lower()} for a boolean, or quote it ('{node.value}') for the text."
            )
        return value

    def construct_yaml_str(self, node):
        value = super().construct_yaml_str(node)
        if node.style is None and isinstance(value, str) and _FLOAT_WITHOUT_DOT.fullmatch(value):
            dotted = re.sub(r"^([-+]?[0-9_]+)", r"\1.0", value)
            self.surprises.append(
                f"line {node.start_mark.line + 1}: {value} is read as the text {value!r}: YAML 1.1 reads a number with "
                f"an exponent as a float only with a dot in it. Fix: write {dotted} (or {float(value)!r}), or quote "
                f"it if the text is meant."
            )
        return value

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            merges = [k for k, _ in node.value if k.tag == "tag:yaml.org,2002:merge"]
            if len(merges) > 1:
                self.surprises.append(
                    f"line {merges[1].start_mark.line + 1}: {len(merges)} `<<:` merge keys in one mapping; only one is "
                    f"applied and the others are silently dropped. Fix: one merge key with a list, `<<: [*a, *b]`."
                )
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            "while constructing a mapping",
                            node.start_mark,
                            f"found the key {shown(key)} twice (lines {seen[key].start_mark.line + 1} and "
                            f"{key_node.start_mark.line + 1}): the last would silently win; keep one",
                            key_node.start_mark,
                        )
                    seen[key] = key_node
                except TypeError:
                    pass  # an unhashable key: the base loader reports it
        return super().construct_mapping(node, deep=deep)


_StudyLoader.add_constructor("tag:yaml.org,2002:bool", _StudyLoader.construct_yaml_bool)
_StudyLoader.add_constructor("tag:yaml.org,2002:str", _StudyLoader.construct_yaml_str)
# 1e-2, 5E+3: numbers to a reader, text to YAML 1.1 (which PyYAML follows).
_FLOAT_WITHOUT_DOT = re.compile(r"[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+")


def _expanded_nodes(node, limit: int) -> int:
    """How many nodes `node` stands for once every alias is expanded, counted up to just past `limit`.

    Aliases share their node, so the graph is small while its expansion may not be: the count is memoised per
    node, which keeps it fast on an alias bomb."""
    sizes: dict[int, int] = {}

    def size(n) -> int:
        if id(n) in sizes:
            return sizes[id(n)]
        sizes[id(n)] = limit + 1  # a cycle (a recursive alias) counts as too large
        if isinstance(n, yaml.SequenceNode):
            total = 1 + sum(size(c) for c in n.value)
        elif isinstance(n, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in n.value)
        else:
            total = 1
        sizes[id(n)] = min(total, limit + 1)
        return sizes[id(n)]

    return size(node)


def _reader_problem(where: str, text: str, err: Exception) -> str:
    """A character YAML refuses (NUL, ESC and other control characters): where it is, and the fix."""
    position = getattr(err, "position", None)
    character = getattr(err, "character", None)
    if position is None or character is None:
        return f"{where}: not readable as YAML text ({str(err)[:300]}). Fix: save it as plain UTF-8 text."
    line = text.count("\n", 0, position) + 1
    code = character if isinstance(character, int) else ord(character)
    return (
        f"{where}: line {line} holds the control character U+{code:04X}, which YAML does not allow in a file. "
        f"Fix: delete it (an editor's 'show invisibles' shows it)."
    )


def parse_yaml(text: str, where: str) -> Any:
    """Parse YAML safely: no tags beyond plain data, no key twice in a mapping, aliases expanding to at most
    MAX_YAML_NODES nodes. Raises ValueError with one line: `where`, the rule, the value, the fix."""
    try:
        loader = _StudyLoader(text)
    except yaml.YAMLError as err:
        raise ValueError(_reader_problem(where, text, err)) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_nodes(node, MAX_YAML_NODES) > MAX_YAML_NODES:
            raise ValueError(
                f"{where}: YAML aliases may expand to at most {MAX_YAML_NODES} values, and these expand to more "
                f"(an alias bomb, or a recursive alias). Fix: write the values out, or use fewer nested aliases."
            )
        document = loader.construct_document(node)
        if loader.surprises:
            raise ValueError("\n".join(f"{where}: {s}" for s in loader.surprises))
        return document
    except yaml.reader.ReaderError as err:
        raise ValueError(_reader_problem(where, text, err)) from None
    except yaml.YAMLError as err:
        text = str(err)
        if len(text) > 600:
            text = text[:600] + "..."
        raise ValueError(f"{where}: YAML syntax: {text}. Fix: correct the YAML.") from None
    except RecursionError:
        raise ValueError(
            f"{where}: nested too deeply to read (brackets or indentation hundreds of levels deep). Fix: a study "
            f"file nests a few levels; close the brackets, or flatten the structure."
        ) from None
    finally:
        loader.dispose()


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


def _overrides_to_tree(overrides: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in overrides.items():
        set_path(tree, key, value)
    return tree


def _overlapping(paths: list[str]) -> tuple[str, str] | None:
    """Two dotted paths of which one lies inside the other (`model` and `model.name`), else None."""
    for a in paths:
        for b in paths:
            if b.startswith(a + "."):
                return a, b
    return None


def _levels(name: str, spec: dict[str, dict[str, Any]] | list[Any]) -> dict[str, dict[str, Any]]:
    if isinstance(spec, list):  # `data.fraction: [0.1, 0.5]` — the factor is a config path, levels its values
        return {str(v): {name: v} for v in spec}
    return spec


def _unsafe_name_problem(field: str, what: str, name: str) -> str | None:
    # Factor and level names go into MLflow tags, params, filters and run names, Optuna study names and the
    # terminal: an emoji or other non-ASCII name left a cell run RUNNING forever (issue 24), so only printable ASCII.
    if name.isascii() and name.isprintable():
        return None
    ascii_name = re.sub(r"[^ -~]+", "_", name).strip("_") or what
    return (
        f"{field}: a {what} name must be printable ASCII (it is written into MLflow filters, tags and run names, "
        f"Optuna study names and the terminal), got {shown(name)}. Fix: rename it, e.g. {shown(ascii_name)}."
    )


def _factor_problems(spec: Study) -> list[str]:
    """Factors that would silently run fewer cells than written, or set one path twice."""
    problems = []
    for fname, fspec in spec.factors.items():
        if not fspec:
            problems.append(
                f"factors.{fname}: a factor needs at least one level (with none the study has no cell), got "
                f"{shown(fspec)}. Fix: list its levels, or remove the factor."
            )
        elif isinstance(fspec, list) and (dup := _repeated(fspec)) is not None:
            problems.append(
                f"factors.{fname}: levels must be distinct (one cell each), got {shown(dup)} more than once in "
                f"{shown(fspec)}. Fix: list each level once."
            )
        if problem := _unsafe_name_problem(f"factors.{shown(fname)}", "factor", fname):
            problems.append(problem)
        for level, overrides in _levels(fname, fspec).items():
            if problem := _unsafe_name_problem(f"factors.{fname}.{shown(level)}", "level", level):
                problems.append(problem)
            if "'" in fname + level and '"' in fname + level:
                problems.append(
                    f"factors.{fname}.{shown(level)}: a factor or level name may hold ' or \" but not both (it is "
                    f"searched for in MLflow, whose filters cannot quote both). Fix: rename it."
                )
            if isinstance(overrides, dict) and (pair := _overlapping(list(overrides))):
                problems.append(
                    f"factors.{fname}.{level}: sets both {pair[0]} and {pair[1]}, one inside the other, so one would "
                    f"silently replace the other. Fix: set {pair[1]} alone, or write it inside {pair[0]}."
                )
    problems += _factors_sharing_paths(spec)
    return problems


def _factors_sharing_paths(spec: Study) -> list[str]:
    """Two factors that set one path (or one inside the other): in every cell the later factor's value would
    replace the earlier's, so the earlier factor's cells would run the same thing under different names."""
    owners = _method_hparams()
    paths: dict[str, set[str]] = {}
    for fname, fspec in spec.factors.items():
        for overrides in _levels(fname, fspec).values():
            if isinstance(overrides, dict):
                paths.setdefault(fname, set()).update(_resolve_search_key(str(p), owners) for p in overrides)
    problems = []
    names = list(paths)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            shared = sorted(
                a if a == b or b.startswith(a + ".") else b
                for a in paths[first]
                for b in paths[second]
                if a == b or _overlapping([a, b])
            )
            if shared:
                problems.append(
                    f"factors.{first} and factors.{second}: both set {', '.join(dict.fromkeys(shared))}; in each cell "
                    f"{second}'s value would silently replace {first}'s, so {first}'s levels would run the same "
                    f"configuration under different names. Fix: make them one factor (one level per combination), "
                    f"or let each factor set its own paths."
                )
    return problems


def _number_problems(tree: Any, prefix: str = "") -> list[str]:
    """Non-finite floats and integers beyond 64 bits anywhere in the study (search domains check their own)."""
    problems = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            if not prefix and key == "search":
                continue
            problems += _number_problems(value, f"{prefix}{key}.")
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            problems += _number_problems(value, f"{prefix}{i}.")
    elif isinstance(tree, float) and not math.isfinite(tree):
        problems.append(
            f"{prefix[:-1]}: must be a finite number, got {tree}. Fix: write the finite value meant (YAML reads .inf "
            f"and .nan as infinity and not-a-number)."
        )
    elif isinstance(tree, int) and not isinstance(tree, bool) and not -(2**63) <= tree < 2**63:
        problems.append(
            f"{prefix[:-1]}: at most 64-bit integers are stored and passed on (|value| < 2**63), got {shown(tree)}. "
            f"Fix: a smaller number."
        )
    return problems


def _fixed_by_study(spec: Study, key: str) -> str | None:
    """What of the study sets trial path `key` in every cell, so that a --set of it would be silently replaced."""
    owners = _method_hparams()
    for fname, fspec in spec.factors.items():
        for overrides in _levels(fname, fspec).values():
            paths = [_resolve_search_key(p, owners) for p in overrides] if isinstance(overrides, dict) else []
            if any(_overlapping([key, p]) or p == key for p in paths):
                return f"factor {fname!r} (its levels {shown(list(_levels(fname, fspec)))})"
    for skey in spec.search:
        path = _resolve_search_key(skey, owners)
        if path == key or _overlapping([key, path]):
            return f"search key {skey!r}"
    return None


def _resolve_search_key(key: str, owners: dict[str, set[str]]) -> str:
    return f"optimizer.hparams.{key}" if _is_knob(key, owners) else key


def _is_knob(key: str, owners: dict[str, set[str]]) -> bool:
    """A bare method knob (`rho`): in a search or a level it means optimizer.hparams.<key>, where the method takes it."""
    return "." not in key and key in owners


def _domain_probes(dom: Domain) -> list[Any]:
    if isinstance(dom, Choice):
        return list(dom.values)
    return [dom.low, dom.high]


def _config_paths(model: Any = None, prefix: str = "") -> list[str]:
    """Every dotted field path of the trial config (sections and leaves), for did-you-mean hints."""
    model = TrialConfig if model is None else model
    paths = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        paths.append(path)
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            paths.extend(_config_paths(info.annotation, f"{path}."))
    return paths


def _known_path(path: str) -> bool:
    import typing

    node: Any = TrialConfig
    for part in path.split("."):
        fields = getattr(node, "model_fields", None)
        if fields is None:
            # Inside a free-form dict (model.kwargs, optimizer.hparams) any key goes; below a plain value none does.
            return node is dict or typing.get_origin(node) is dict
        if part not in fields:
            return False
        node = fields[part].annotation
    return True


def expand(spec: Study, *, smoke: bool = False, require_data: bool = True) -> tuple[list[Cell], list[str]]:
    """Cells of the study, each validated with its search bounds substituted; returns (cells, problems)."""
    owners = _method_hparams()
    problems: list[str] = _factor_problems(spec)
    for key in spec.search:
        if "." in key and not _known_path(key):
            problems.append(
                f"search.{key}: not a trial config path. Fix: use a path such as optimizer.lr, or {SEARCH_SHORTHANDS}."
            )
        elif "." not in key and key not in owners:
            problems.append(
                f"search.{key}: not a method hparam ({sorted(owners)}) nor a dotted config path. "
                f"Fix: use e.g. optimizer.lr, or one of those names."
            )
    for fname, fspec in spec.factors.items():
        for level, overrides in _levels(fname, fspec).items():
            if not isinstance(overrides, dict):
                problems.append(
                    f"factors.{fname}.{level}: a level must map config paths to values, got {shown(overrides)}. "
                    f"Fix: write it as `{level}: {{optimizer.method: sam}}`, or give the factor a list of values."
                )
                continue
            for path in overrides:
                if not _known_path(path) and not _is_knob(path, owners):
                    problems.append(
                        f"factors.{fname}.{level}.{path}: not a trial config path nor a method knob ({SEARCH_SHORTHANDS}). "
                        f"Fix: check its spelling."
                    )
    if problems:
        return [], problems

    factor_levels = [(f, _levels(f, s)) for f, s in spec.factors.items()]
    if (cells_planned := math.prod(len(levels) for _, levels in factor_levels)) > MAX_TRIALS:
        return [], [
            (
                f"factors: their levels combine into {cells_planned} cells, more than the {MAX_TRIALS} trials a study may "
                f"plan. Fix: fewer levels, or split the study."
            )
        ]
    if smoke:
        factor_levels, smoke_problems = _smoke_levels(spec, factor_levels)
        if smoke_problems:
            return [], smoke_problems
    cells: list[Cell] = []
    missing_roots: dict[str, list[str]] = {}
    geometry_cells: dict[str, list[str]] = {}  # a problem of base.geometry would otherwise repeat for every cell
    combos = itertools.product(*[list(levels.items()) for _, levels in factor_levels]) if factor_levels else [()]
    merged: list[tuple[dict[str, str], dict[str, Any]]] = []
    for combo in combos:
        levels = {factor_levels[i][0]: name for i, (name, _) in enumerate(combo)}
        tree = copy.deepcopy(spec.base)
        knobs: dict[str, Any] = {}
        try:
            for _, overrides in combo:
                paths = {k: v for k, v in overrides.items() if not _is_knob(k, owners)}
                knobs.update({k: v for k, v in overrides.items() if _is_knob(k, owners)})
                tree = deep_merge(tree, _overrides_to_tree(paths))
            # A bare knob of a level (`rho: 0.1` on an architecture) reaches only the cells whose method takes it.
            method = tree.get("optimizer", {}).get("method", TrialConfig().optimizer.method)
            for knob, value in knobs.items():
                if method in owners[knob]:
                    set_path(tree, f"optimizer.hparams.{knob}", value)
        except ValueError as err:
            problems.append(f"factors: {err}. Fix: set a value there, or set the section as a whole.")
            continue
        merged.append((levels, tree))
    # The smoke form's reference; an epochs value that is no positive integer is the cell's validation's to report.
    shortest = min((e for _, tree in merged if _positive_int(e := _epochs(tree))), default=None)
    for levels, tree in merged:
        if smoke:
            # The file's own cell first: --smoke replaces its data and model, which must still be valid (a smoke
            # run that passed an invalid section would leave the real run to fail on it).
            try:
                TrialConfig.load(tree)
            except ConfigError as err:
                key = ",".join(f"{f}={lv}" for f, lv in levels.items())
                problems.extend(f"{f'cell {key}' if key else 'the study'}: {p}" for p in err.problems)
                continue
            tree = _smoke_tree(tree, spec.smoke, shortest)  # --smoke wins over every level
        elif require_data and (problem := _missing_root(tree)):
            missing_roots.setdefault(problem, []).append(",".join(f"{f}={lv}" for f, lv in levels.items()) or "all")
        key = ",".join(f"{f}={lv}" for f, lv in levels.items())
        label = f"cell {key}" if key else "the study"
        if spec.confirm is not None:
            problems.extend(_confirm_problems(spec.confirm, tree, label))
            # The search scores on the selection half; the confirm runs on the other (studies.confirm).
            tree = deep_merge(tree, {"data": {"eval_split": "selection"}})
        method = tree.get("optimizer", {}).get("method", TrialConfig().optimizer.method)
        space: dict[str, Domain] = {}
        for skey, dom in spec.search.items():
            path = _resolve_search_key(skey, owners)
            if path.startswith("optimizer.hparams.") and method not in owners.get(path.rsplit(".", 1)[1], set()):
                continue  # conditional: rho only where the method has a rho
            space[path] = dom
        try:
            for problem in _geometry_problems(TrialConfig.load(tree)):  # said once, with the cells it is in
                geometry_cells.setdefault(problem, []).append(key or "all")
            for path, dom in space.items():
                for probe in _domain_probes(dom):
                    probe_tree = copy.deepcopy(tree)
                    try:
                        set_path(probe_tree, path, probe)
                        TrialConfig.load(probe_tree)
                    except ConfigError as err:
                        problems.extend(f"search.{path} = {shown(probe)} in {label}: {p.strip()}" for p in err.problems)
                    except ValueError as err:
                        problems.append(f"search.{path} in {label}: {err}. Fix: search a value, not inside one.")
        except ConfigError as err:
            problems.extend(f"{label}: {p}" for p in err.problems)
            continue
        trials, problem = _cell_trials(spec.budget, space, label)
        if problem:
            problems.append(problem)
        if smoke:
            trials = min(trials, spec.smoke_form.trials_per_cell) if space else 1
        confirm = 0
        if spec.confirm is not None:
            confirm = min(spec.confirm.seeds, spec.smoke_form.confirm_seeds) if smoke else spec.confirm.seeds
            trials = trials if space else 0  # nothing to choose: the confirm seeds are the cell's trials
        cells.append(Cell(key=key, levels=levels, config=tree, space=space, trials=trials, confirm=confirm))
    total = sum(c.planned for c in cells)
    if total > MAX_TRIALS:
        sizes = sorted(((c.planned, c.key or "all") for c in cells), reverse=True)[:2]
        problems.append(
            f"budget: the study plans {total} trials, more than {MAX_TRIALS} (largest cells: "
            f"{', '.join(f'{k} with {n}' for n, k in sizes)}; a grid over an int range has one trial per value). "
            f"Fix: narrow the ranges, use a choice of values, or sampler tpe with trials_per_cell."
        )
    for problem, where in [*missing_roots.items(), *geometry_cells.items()]:
        listed = "; ".join(where[:4]) + (f"; and {len(where) - 4} more" if len(where) > 4 else "")
        problems.append(f"{problem} (cells: {listed})")
    # A knob of a level, or a search parameter, that applies to no cell is almost always a typo or a forgotten factor.
    for fname, fspec in spec.factors.items():
        for level, overrides in _levels(fname, fspec).items():
            for knob in (k for k in overrides if _is_knob(k, owners)) if isinstance(overrides, dict) else ():
                reached = any(
                    c.levels.get(fname) == level and knob in c.config.get("optimizer", {}).get("hparams", {})
                    for c in cells
                )
                if cells and not smoke and not reached:
                    problems.append(
                        f"factors.{fname}.{level}.{knob}: applies to no cell (no method of the cells with this level takes "
                        f"it: {sorted(owners[knob])} do). Fix: add such a method to the factors, or remove it."
                    )
    used = {p for c in cells for p in c.space}
    for skey in spec.search:
        if cells and _resolve_search_key(skey, owners) not in used:
            problems.append(
                f"search.{skey}: applies to no cell (no cell's method takes it). "
                f"Fix: add a method that takes it to the factors, or remove it."
            )
    return cells, _dedupe(problems)


def _confirm_problems(confirm: Confirm, tree: dict[str, Any], label: str) -> list[str]:
    """What of a cell's config a confirm stage cannot take: a seed of its own range, an evaluation split set by hand."""
    problems = []
    train = tree.get("train")
    seed = train.get("seed", TrialConfig().train.seed) if isinstance(train, dict) else TrialConfig().train.seed
    if seed in confirm.seed_list:
        problems.append(
            f"confirm.seed_start: the confirm seeds {confirm.seed_start}..{confirm.seed_start + confirm.seeds - 1} must "
            f"be fresh, and {label} searches with train.seed {seed}. Fix: move seed_start past the search seeds."
        )
    data = tree.get("data")
    if isinstance(data, dict) and data.get("eval_split") is not None:
        problems.append(
            f"{label}: data.eval_split is set ({shown(data['eval_split'])}), and a confirm stage sets it itself (the "
            f"search on the 'selection' half, the confirm runs on the 'test' half). Fix: drop data.eval_split."
        )
    return problems


def _geometry_problems(cfg: TrialConfig) -> list[str]:
    """The geometry section's measure names and hvp_mode, checked against analysis' registry (trainables cannot)."""
    if not cfg.geometry.enabled:
        return []
    from analysis.geometry.names import geometry_problems

    return geometry_problems(cfg.geometry)


def _smoke_levels(
    spec: Study, factor_levels: list[tuple[str, dict[str, dict[str, Any]]]]
) -> tuple[list[tuple[str, dict[str, dict[str, Any]]]], list[str]]:
    """The factor levels `--smoke` keeps: those smoke_form.levels names; else every named level (each architecture,
    each method), and a list of values (fractions, seeds) its first."""
    wanted, problems, kept = spec.smoke_form.levels, [], []
    for name in wanted:
        if name not in spec.factors:
            problems.append(
                f"smoke_form.levels.{name}: not a factor of the study (factors: {', '.join(spec.factors) or 'none'}). "
                f"Fix: name one of them."
            )
    for name, levels in factor_levels:
        if name in wanted:
            chosen = [str(v) for v in wanted[name]]
            unknown = [v for v in chosen if v not in levels]
            if unknown or not chosen:
                problems.append(
                    f"smoke_form.levels.{name}: must list levels of the factor ({', '.join(levels)}), got "
                    f"{wanted[name]}. Fix: pick among those."
                )
                continue
            kept.append((name, {v: levels[v] for v in chosen}))
        elif isinstance(spec.factors[name], list):
            kept.append((name, dict(list(levels.items())[:1])))
        else:
            kept.append((name, levels))
    return kept, problems


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


def load_study(
    path: str | Path, *, smoke: bool = False, overrides: dict[str, Any] | None = None, require_data: bool = True
) -> LoadedStudy:
    """Read and validate a study file completely; a StudyError lists every problem at once.

    overrides: dotted trial-config paths set in `base` (the CLI's `--set data.root=/data`), and dotted study
    settings (`storage`, `budget.time_limit_s`, `checkpoints.keep`, ...: `SETTABLE_FIELDS`), before validation.
    """
    path = Path(path)
    text = read_study_text(path)
    try:
        raw = parse_yaml(text, "study file")
    except ValueError as err:
        raise StudyError(path, str(err).split("\n")) from None
    if not isinstance(raw, dict):
        raise StudyError(path, [f"top level: must be a mapping of study fields, got {type(raw).__name__}."])
    bad = []
    for key, value in (overrides or {}).items():
        root = key.split(".", 1)[0]
        if root in SETTABLE_FIELDS:
            try:
                set_path(raw, key, value)
            except ValueError:
                bad.append(f"--set {key}: {root!r} takes a value, not fields. Fix: --set {root}=VALUE.")
        elif root in Study.model_fields:
            bad.append(
                f"--set {key}: `{root}` defines the study and is not set from the command line. Fix: edit the file, "
                f"or set a trial config path (data.root, optimizer.lr) or a setting ({', '.join(SETTABLE_FIELDS)})."
            )
        elif not _known_path(key):
            # The field's own name under another section first (train.epochs -> schedule.epochs), then a typo.
            leaf = key.rsplit(".", 1)[-1]
            close = [p for p in _config_paths() if p.rsplit(".", 1)[-1] == leaf][:1]
            close = close or difflib.get_close_matches(key, _config_paths(), n=1, cutoff=0.6)
            hint = f"Did you mean {close[0]}? " if close else ""
            bad.append(
                f"--set {key}: neither a trial config path nor a study setting. {hint}Fix: use a path such as "
                f"data.root or optimizer.lr, or one of {', '.join(SETTABLE_FIELDS)} (e.g. storage=/mnt/shared/runs)."
            )
        elif isinstance(base := raw.setdefault("base", {}), dict):
            try:
                set_path(base, key, value)
            except ValueError:
                bad.append(f"--set {key}: the file sets a value above it in base, not a section. Fix: set that value.")
    bad += _number_problems(raw)
    try:
        spec = Study.model_validate(raw)
    except ValidationError as err:
        raise StudyError(path, bad + _study_errors(err)) from None
    for key in overrides or {}:
        if key.split(".", 1)[0] not in Study.model_fields and (owner := _fixed_by_study(spec, key)):
            bad.append(
                f"--set {key}: every cell takes this value from the study's {owner}, which would silently replace "
                f"the --set. Fix: change the factor levels or the search space in the file, or drop the --set."
            )
    cells, problems = expand(spec, smoke=smoke, require_data=require_data)
    if bad or problems:
        raise StudyError(path, bad + problems)
    return LoadedStudy(
        spec=spec, path=path.resolve(), text=text, cells=tuple(cells), smoke=smoke, overrides=dict(overrides or {})
    )


def read_study_text(path: Path) -> str:
    """The study file's text: at most MAX_STUDY_FILE_BYTES of UTF-8; a StudyError says what else it is."""
    try:
        resolved = path.resolve(strict=True)
    except RuntimeError:  # Python < 3.13 reports a symlink loop so
        resolved = None
    except OSError as err:
        resolved = None if err.errno == errno.ELOOP else path.absolute()
    if resolved is None:
        raise StudyError(
            path,
            [f"study file: {path} is a symbolic link that leads back to itself (a loop). Fix: give the file itself."],
        )
    if resolved.parts[1:2] in (("proc",), ("sys",), ("dev",)):
        raise StudyError(
            path,
            [
                f"study file: {resolved} is a system file (under /{resolved.parts[1]}), not a study. Fix: check the path."
            ],
        )
    if not path.is_file():
        raise StudyError(path, [f"study file: does not exist (looked at {path.resolve()}). Fix: check the path."])
    try:
        with path.open("rb") as f:
            data = f.read(MAX_STUDY_FILE_BYTES + 1)
    except OSError as err:
        raise StudyError(
            path, [f"study file: cannot be read ({err.strerror}). Fix: check the path and its permissions."]
        )
    if len(data) > MAX_STUDY_FILE_BYTES:
        raise StudyError(
            path,
            [
                (
                    f"study file: at most {MAX_STUDY_FILE_BYTES} bytes (a study names its settings, it holds no data), got "
                    f"{path.stat().st_size} bytes. Fix: keep data and long lists out of it (data.root names the data)."
                )
            ],
        )
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise StudyError(
            path,
            [
                (
                    "study file: must be UTF-8 text, got UTF-16 (it starts with a UTF-16 byte-order mark). "
                    "Fix: save it as UTF-8 (e.g. `iconv -f UTF-16 -t UTF-8`)."
                )
            ],
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise StudyError(
            path,
            [
                (
                    f"study file: must be UTF-8 text, got byte {data[err.start]:#04x} on line {line}, which is not UTF-8. "
                    f"Fix: save the file as UTF-8."
                )
            ],
        ) from None


def parse_overrides(items: list[str], where: str | Path) -> dict[str, Any]:
    """The CLI's `--set KEY=VALUE` items as {dotted key: value}, each value read as YAML (safely, bounded)."""
    out: dict[str, Any] = {}
    problems = []
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(
                f"--set {shown(item)}: must be KEY=VALUE with KEY a dotted config path or study setting. "
                f"Fix: e.g. --set data.root=/data/cifar10 or --set storage=/mnt/shared/sharpscale_runs"
            )
            continue
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", key):
            problems.append(
                f"--set {shown(key)}: KEY must be a dotted path of names (data.root). Fix: check its spelling."
            )
            continue
        if not value.strip():
            problems.append(
                f"--set {key}=: the value is empty, which would silently mean the default (or null). Fix: give a "
                f"value (--set {key}=VALUE), or drop the --set to keep the file's."
            )
            continue
        try:
            out[key] = parse_yaml(value, f"--set {key}")
        except ValueError as err:
            problems.append(f"{err} (the value {shown(value)} is read as YAML; quote a string that is not: 'text')")
    if problems:
        raise StudyError(where, problems)
    return out


def _study_errors(err: ValidationError) -> list[str]:
    lines = []
    for line in format_validation_error(err):
        lines.extend(line.split("\n"))  # the cross-field validator joins several problems
    return lines


# --smoke: the same study, tiny, on the embedded digits, on CPU: for CI and for checking a file before a cluster run.
# Its epochs are those of the study's shortest cell; a cell with more keeps its ratio to it (`smoke_epochs`).
_SMOKE = {
    "data": {"name": "digits", "root": None, "img_size": 16, "batch_size": 64, "num_workers": 0},
    "schedule": {"epochs": 2, "warmup_epochs": 0},
    "train": {"device": "cpu", "threads": 1},
    # A geometry section's measurement set, small enough for the smallest digits fraction (0.1: 143 images) and
    # seconds of CPU; which measures, and how often, stay the study's own.
    "geometry": {"batches": 1, "batch_size": 32, "max_iter": 10, "trace_samples": 8, "flatness_draws": 4},
}
# One tiny model per family: the smoke run keeps each cell's architecture family, not its size.
_SMOKE_MODELS = {
    "vit": {"name": "vit_tiny_patch16_224", "kwargs": {"patch_size": 4, "embed_dim": 32, "depth": 1, "num_heads": 2}},
    "mixer": {"name": "mixer_s16_224", "kwargs": {"patch_size": 4, "num_blocks": 1, "embed_dim": 32}},
    "resnet": {"name": "resnet18", "cifar_stem": True, "kwargs": {"layers": [1, 1, 1, 1], "channels": [8, 16, 16, 32]}},
}


def _epochs(tree: dict[str, Any]) -> Any:
    """A cell's schedule.epochs as its tree sets it, else the trial config's default (not validated yet)."""
    schedule = tree.get("schedule")
    epochs = schedule.get("epochs") if isinstance(schedule, dict) else None
    return epochs if epochs is not None else TrialConfig().schedule.epochs


def smoke_epochs(epochs: Any, shortest: Any, smoke: Any) -> Any:
    """A cell's epochs under --smoke: the study's shortest cell runs `smoke` epochs, and every other cell keeps its
    ratio to it (rounded, at least 1), so a level given 2x the epochs, or equal steps on a smaller fraction, still
    has them in the tiny run. A cell's epochs that are no positive integer stay, for its validation to report."""
    if not _positive_int(epochs):
        return epochs
    if not (_positive_int(shortest) and _positive_int(smoke)):
        return smoke
    return max(1, round(smoke * epochs / shortest))


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _smoke_tree(tree: dict[str, Any], extra: dict[str, Any], shortest: Any = None) -> dict[str, Any]:
    from trainables.models import model_family

    name = tree.get("model", {}).get("name", TrialConfig().model.name)
    try:
        tiny = _SMOKE_MODELS[model_family(name)]
    except ValueError:
        tiny = {}  # an unknown family is reported by the cell's own validation
    model = {k: v for k, v in tree.get("model", {}).items() if k in ("drop_rate", "drop_path_rate")}
    out = deep_merge(deep_merge({**tree, "model": {**model, **tiny}}, _SMOKE), extra)
    if shortest is not None and isinstance(out.get("schedule"), dict):
        out["schedule"]["epochs"] = smoke_epochs(_epochs(tree), shortest, _epochs(out))
    return out


def _missing_root(tree: dict[str, Any]) -> str | None:
    data = tree.get("data")
    root = data.get("root") if isinstance(data, dict) else None
    # A URI is read on the nodes, not here: the runner's preflight checks it on each of them. Not a string: the
    # cell's own validation says so.
    if not isinstance(root, str) or is_uri(root) or Path(root).expanduser().exists():
        return None
    return (
        f"data.root: the directory must exist, got {shown(root)}. Fix: point it at the dataset "
        f"(sharpscale run --set data.root=/path/to/data), give the URI of a copy every node reads "
        f"(sharpscale data fetch cifar10 --to s3://BUCKET/cifar10), or check the file with --smoke on the embedded digits."
    )
