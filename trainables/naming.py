"""MLflow names: the default tracking URI, experiment and run names, and every tag key sharpscale writes or reads.

The one home of these strings: the trial's record (trainables.tracking), the study runner and CLI (studies) and
the readers (analysis) import them from here, so a renamed tag cannot leave a reader looking for the old one.
Plain strings only: no MLflow import.
"""

from __future__ import annotations

from typing import Literal, Mapping

__all__ = [
    "BEST_CELL_TAG",
    "BEST_RUN_ID_TAG",
    "BEST_RUN_TAG",
    "CELL_TAG",
    "CHECKPOINT_ARTIFACT",
    "CHOSEN_FROM_TAG",
    "CONFIG_ARTIFACT",
    "CONFIG_TAG",
    "CONFIRM_STAGE",
    "PARAMS_KEY",
    "PLACES_KEY",
    "DEFAULT_ARTIFACT_ROOT",
    "DEFAULT_TRACKING_URI",
    "LOG_FILE",
    "FACTOR_PREFIX",
    "GIT_COMMIT_TAG",
    "RESUMED_COMMIT_TAG",
    "GPUS_PER_WORKER_PARAM",
    "KIND_TAG",
    "LAUNCH_TAG",
    "NOTE_TAG",
    "OPTUNA_STORAGE_TAG",
    "PARENT_RUN_TAG",
    "RAY_NODE_ID_TAG",
    "SCORED_TAG",
    "SEARCH_STAGE",
    "STAGE_TAG",
    "REASON_TAG",
    "STATUS_TAG",
    "STORE_FILE",
    "STORAGE_TAG",
    "STUDY_FILE_HASH_TAG",
    "STUDY_FILE_TAG",
    "STUDY_TAG",
    "TAG_PREFIX",
    "TRIAL_ID_TAG",
    "TRIAL_KEY_TAG",
    "WORKERS_PARAM",
    "Kind",
    "Stage",
    "experiment_name",
    "factor_tag",
    "kind_filter",
    "launch_name",
    "study_run_name",
    "tag",
]

# The default store's file name, and its URI: relative sqlite paths are made absolute against the working directory
# (trainables.tracking.resolve_tracking_uri).
STORE_FILE = "mlflow.db"
DEFAULT_TRACKING_URI = f"sqlite:///{STORE_FILE}"
# The file third-party libraries' messages go to (a study's beside its Ray results, `sharpscale ui`'s beside its store).
LOG_FILE = "sharpscale.log"
# Where a new experiment keeps its artifacts when the study does not say (relative: to the working directory).
DEFAULT_ARTIFACT_ROOT = "mlartifacts"
_SMOKE_SUFFIX = "-smoke"

TAG_PREFIX = "sharpscale."


def tag(key: str) -> str:
    """The tag key of a sharpscale-owned name (`card` -> `sharpscale.card`), e.g. for the hardware description."""
    return TAG_PREFIX + key


# Which kind of run this is: a study's parent run, one cell's run under it, or one trial's run under that.
Kind = Literal["study", "cell", "trial"]
KIND_TAG = tag("kind")
# Which stage of its study a trial belongs to: the search, whose trials choose each cell's knobs on the validation
# set's selection half, or the confirm stage, fresh seeds at the chosen knobs scored on its held-out test half
# (studies.confirm). A trial without the tag was recorded before stages existed: a search trial.
Stage = Literal["search", "confirm"]
SEARCH_STAGE: Stage = "search"
CONFIRM_STAGE: Stage = "confirm"
STAGE_TAG = tag("stage")
# On a confirm trial: the run name of the search trial whose knobs it repeats (none for a cell with nothing to search).
CHOSEN_FROM_TAG = tag("chosen_from")
# What became of a trial: running, finished, diverged, failed, early_stopped, killed, lost (trainables.tracking).
STATUS_TAG = tag("status")
# Why a trial failed or diverged, when it did (the message, truncated).
REASON_TAG = tag("reason")
# The tag that makes a trial's run findable again: a restored or retried trial reuses its run instead of
# creating a duplicate (Ray's MLflowLoggerCallback creates a new run on every restore).
TRIAL_KEY_TAG = tag("trial_key")
# Tune's id of the trial (the searcher's and the resume logic's handle on it).
TRIAL_ID_TAG = tag("trial_id")
# The Ray node a trial ran on: several nodes can share one host name. The trial's hardware is described by
# tag(key) for each key of trainables.loop.describe_hardware (`sharpscale.card`, ...).
RAY_NODE_ID_TAG = tag("ray_node_id")
# Which launch of its study a run belongs to (1, 2, ...): `sharpscale run --new-launch` starts another one, and
# analysis keeps launches apart so that a second launch never passes for more replicates of the first.
LAUNCH_TAG = tag("launch")
CELL_TAG = tag("cell")
STUDY_TAG = tag("study")
STUDY_FILE_TAG = tag("study_file")
# The hash of the study file and its --set overrides: finds the study run of the same study again on resume.
STUDY_FILE_HASH_TAG = tag("study_file_hash")
GIT_COMMIT_TAG = tag("git_commit")
# The commit a resume ran at, where it is not the launch's own (GIT_COMMIT_TAG): on its study run and on each trial
# run it resumed or started.
RESUMED_COMMIT_TAG = tag("resumed_commit")
# Where the study run keeps its state, resolved: `resume` and `status` read them back from the study run.
STORAGE_TAG = tag("storage")
OPTUNA_STORAGE_TAG = tag("optuna_storage")
# On the study run: the sha256 of each of Tune's state files of the launch as it last left them (studies.identity).
# On a study's parent run: the dry run's estimate of its wall time with its parts, and that beside the wall it took
# (studies/cost.py record_estimate).
ESTIMATE_TAG = tag("estimate")
ESTIMATE_CHECK_TAG = tag("estimate_check")
TUNE_STATE_TAG = tag("tune_state_sha256")
# The roll-up on cell and study runs (studies.records): the best trial's run name and id, the study's best cell.
BEST_RUN_TAG = tag("best_run")
BEST_RUN_ID_TAG = tag("best_run_id")
BEST_CELL_TAG = tag("best_cell")
# A trial's full resolved config (dotted paths to values as MLflow writes params): an artifact of its run, and the
# same JSON in tags (`CONFIG_TAG`, then `CONFIG_TAG.2`, ... past MLflow's tag length) that `load_runs` reads back,
# while its params hold only what the study varies and a few identifying paths (the payload's PARAMS_KEY).
CONFIG_ARTIFACT = "config.json"
CONFIG_TAG = tag("config")
# Which scored images a trial's final evaluation classified correctly (trainables.scored.ScoredImages.to_text), over
# SCORED_TAG, SCORED_TAG.2, ... like CONFIG_TAG: what lets analysis resample the test images as well as the seeds.
SCORED_TAG = tag("scored")
PARAMS_KEY = "params"
# The payload's list of local places the study writes to (its storage, Optuna and MLflow files): a full disk there
# stops the study; one elsewhere (a DataLoader's /dev/shm) fails the trial as any error (trainables.errors.no_space_at).
PLACES_KEY = "places"
# The artifact folder of a trial's run holding its final checkpoint (`tracking.log_checkpoint: true`); the file in
# it is trainables.loop.CHECKPOINT_FILE. analysis.record finds a study's checkpointed trials by it.
CHECKPOINT_ARTIFACT = "checkpoint"
# The resources a trial held, logged as params beside its config (trainables.ray_train): DDP workers and the GPUs of
# each (a fraction where trials share a GPU). With the per-epoch epoch_time_s they give its GPU-seconds
# (analysis.compute). Not config paths: a trial config never holds them.
WORKERS_PARAM = "resources.workers"
GPUS_PER_WORKER_PARAM = "resources.gpus_per_worker"
# One tag per factor of the study, `factor.<name>` = the cell's level (analysis turns them into columns).
FACTOR_PREFIX = "factor."
# MLflow's own system tags (its UI nests runs by the first and shows the second as the run's description).
PARENT_RUN_TAG = "mlflow.parentRunId"
NOTE_TAG = "mlflow.note.content"


def factor_tag(factor: str) -> str:
    return FACTOR_PREFIX + factor


def kind_filter(kind: Kind) -> str:
    """The MLflow search filter that selects the runs of one kind."""
    return f"tags.`{KIND_TAG}` = '{kind}'"


def experiment_name(study: str, experiment: str | None = None, *, smoke: bool = False) -> str:
    """The MLflow experiment of a study: its `tracking.experiment`, else its name; `--smoke` runs go to `<that>-smoke`."""
    return (experiment or study) + (_SMOKE_SUFFIX if smoke else "")


def launch_name(experiment: str, launch: int) -> str:
    """The name of a launch's Tune experiment and Optuna studies: the first keeps the experiment's, later ones are numbered."""
    return experiment if launch == 1 else f"{experiment}-launch{launch}"


def study_run_name(study: str, launch: int) -> str:
    """The MLflow run name of a study's parent run."""
    return study if launch == 1 else f"{study} (launch {launch})"


def cell_name(levels: Mapping[str, str]) -> str:
    """A cell's one name wherever a cell is named (trial runs, the live view, `status`, the answer's best cell): its
    levels joined by '/', 'vit/sam'; a config-path factor's level with its name, 'fraction=0.1/resnet/sam'; 'all'
    without factors."""
    # A named level (resnet, sam) says what it is; a config-path factor's value needs its name.
    return "/".join(f"{f.rsplit('.', 1)[-1]}={lv}" if "." in f else str(lv) for f, lv in levels.items()) or "all"


def cell_key_name(key: str) -> str:
    """`cell_name` of a cell key as trials record it (the `cell` column, 'arch=vit,method=sam', a confirm
    replicate's ' seed=N' kept); a key that is not factor=level pairs, unchanged."""
    base, sep, seed = str(key).partition(" seed=")
    if not base:
        return cell_name({}) + (f" seed={seed}" if sep else "")
    pairs = [part.partition("=") for part in base.split(",")]
    if any(not eq or not factor for factor, eq, _ in pairs):
        return str(key)
    return cell_name({factor: level for factor, _, level in pairs}) + (f" seed={seed}" if sep else "")
