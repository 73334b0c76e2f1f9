"""Running a study: checks, its Ray cluster, Tune + Optuna over every cell, its close (its record: studies.records)."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ray.tune.schedulers import ASHAScheduler, TrialScheduler
from ray.tune.stopper import Stopper

from studies import identity
from studies.busy import BUSY_METRIC, GpuBusySampler
from studies.confirm import confirm_config
from studies.cost import local_gpus, record_estimate
from studies.launch import INTERRUPTED_REASON, Launch, store_is_locked, store_locked
from studies.preflight import (
    check_data_on_nodes,
    check_local_devices,
    check_model_kwargs,
    check_state_paths,
    check_trials_fit_the_data,
    ray_start_problem,
)
from studies.progress import LiveView, quiet_libraries, reroute_libraries, stderr_to
from studies.records import rollup_callback, source_tags, trial_params
from studies.search import NO_SPACE, CellSearcher, apply_sample, note_no_space
from studies.shell import shell_command
from studies.spec import DEFAULT_STORAGE, Cell, LoadedStudy, StudyError, load_study, storage_is_shared
from trainables.errors import NoSpaceLeft, free_bytes, nearest_existing, no_space_at, shown
from trainables.metrics import EPOCH_TIME, VALIDATION_METRICS
from trainables.naming import (
    CELL_TAG,
    CHOSEN_FROM_TAG,
    CONFIRM_STAGE,
    GIT_COMMIT_TAG,
    LAUNCH_TAG,
    LOG_FILE,
    OPTUNA_STORAGE_TAG,
    PARAMS_KEY,
    PLACES_KEY,
    SEARCH_STAGE,
    STAGE_TAG,
    STORAGE_TAG,
    STUDY_FILE_HASH_TAG,
    STUDY_TAG,
    TUNE_STATE_TAG,
    factor_tag,
    launch_name,
)
from trainables.ray_train import DistributedPlan
from trainables.tracking import (
    BEST_EPOCH_METRICS,
    LAST_EPOCH_RESULT_KEY,
    NO_SPACE_RESULT_KEY,
    REFUSED_RESULT_KEY,
    TrackingTarget,
    resolve_tracking_uri,
    retry_locked,
)

__all__ = [
    "StateLocations",
    "StudyOutcome",
    "check_cluster_storage",
    "resolve_tracking_uri",
    "run_study",
    "state_locations",
]


@dataclass(frozen=True)
class StateLocations:
    """Where a study run keeps its state: Ray's results and checkpoints, Optuna's database."""

    storage: str
    optuna_storage: str
    shared: bool  # every node reaches `storage`
    optuna_default: bool  # optuna_storage was not set, only derived

    def tags(self) -> dict[str, str]:
        return {STORAGE_TAG: self.storage, OPTUNA_STORAGE_TAG: self.optuna_storage}


def state_locations(study: LoadedStudy, run_name: str, recorded: dict[str, str] | None = None) -> StateLocations:
    """Where the study's state goes; `recorded`: the tags of the study run being resumed.

    A resumed run keeps its recorded Ray storage unless `storage` is overridden (the results were moved), and
    always its Optuna storage: Tune restores the searcher, with the storage it was built with.
    """
    overridden = study.location_overrides
    storage, optuna = study.storage, study.optuna_storage(run_name)
    if recorded and STORAGE_TAG in recorded:
        if "storage" not in overridden:
            storage = recorded[STORAGE_TAG]
        kept = recorded.get(OPTUNA_STORAGE_TAG, optuna)
        if "optuna_storage" in overridden and optuna != kept:
            raise StudyError(
                study.path,
                [
                    f"optuna_storage: a resumed run reopens the Optuna storage it started with, {kept}; got {optuna}. "
                    f"Fix: drop the optuna_storage override (and keep the database at {kept}), or start a new run."
                ],
            )
        optuna = kept
    return StateLocations(
        storage=storage,
        optuna_storage=optuna,
        shared=storage_is_shared(storage, study.spec.shared_mounts),
        optuna_default=study.spec.optuna_storage is None,
    )


def git_commit(where: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10, check=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=where, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@dataclass
class StudyOutcome:
    experiment_id: str
    study_run_id: str
    tracking_uri: str
    trials: int
    errored: int  # failed after Tune's retries, or refused (below)
    interrupted: bool = False  # Ctrl-C (SIGINT) or SIGTERM ended it early: incomplete, `resume` finishes it
    reported: int | None = None  # trials that reported at least one epoch (None: not counted)
    interrupted_at: float | None = None  # when the interrupt reached the driver (time.time())
    refused: int = 0  # of `errored`: trials that refused their settings (trainables.errors.TrialRefused), not retried
    # `training_share`'s (metric name, value): how much of the GPU (else CPU) time the study held its trials trained
    training_share: tuple[str, float] | None = None
    # studies.busy.BUSY_METRIC: the share of the study's wall time its GPUs ran kernels (None: not sampled)
    gpu_busy: float | None = None

    @property
    def nothing_ran(self) -> bool:
        """No trial reported a single epoch (a time limit too short to start one): the study has no result."""
        return self.reported == 0


def _warn_split_records(address: str | None, uri: str) -> None:
    # On a cluster every node must reach one store: a local file or a loopback server splits the records.
    if address in (None, "local"):
        return
    local = uri.startswith("sqlite:") or "://127." in uri or "://localhost" in uri
    if local:
        print(
            f"sharpscale: warning: --address {address} with tracking URI {uri}: trials on other nodes cannot reach it "
            f"and their records will be missing. Fix: start `sharpscale server --host <head's private IP>` and pass "
            f"--tracking-uri http://<head's private IP>:5000 (docs/cluster.md).",
            flush=True,
        )


def interruption_reason(outcome: StudyOutcome | None, primary: BaseException | None) -> str | None:
    """Why a study stopped with trials still open, in the words their runs' reason tag carries (None: it ended
    normally). Only a Ctrl-C or SIGTERM is called an interruption; an error or a time limit says what it was."""
    if (outcome is not None and outcome.interrupted) or isinstance(primary, KeyboardInterrupt):
        return INTERRUPTED_REASON
    if outcome is not None and outcome.nothing_ran:
        return (
            "the study ended before any trial reported an epoch (budget.time_limit_s too short?); "
            "`sharpscale resume` continues it"
        )
    if primary is not None:
        return (
            f"the study stopped on an error ({type(primary).__name__}: {primary}) while this trial ran; "
            "`sharpscale resume` continues it once the cause is fixed"
        )
    return None


class NoSpaceStopper(Stopper):
    """Tune's stopper of a study that met a full disk: a trial's result saying so (NO_SPACE_RESULT_KEY) or the
    searcher's refused write (studies.search.NO_SPACE) ends the study as Ctrl-C does (Tune's own interrupt), since
    no later trial could record its end either: the trials still running stay resumable, where Tune's stop-all would
    end them for good. A module-level class: Tune pickles it with the run's settings."""

    def __init__(self, run_name: str):
        self.run_name = run_name
        self._interrupted = False

    def __call__(self, trial_id: str, result: dict) -> bool:
        full = result.get(NO_SPACE_RESULT_KEY)
        if full:
            note_no_space(
                self.run_name,
                f"trial {trial_id} could not write its checkpoint or record ({full}); it stays failed (`resume` does "
                f"not run it again)",
            )
        self.stop_all()
        return False  # that trial has ended itself

    def stop_all(self) -> bool:
        if self.run_name not in NO_SPACE:
            return False
        if not self._interrupted:
            self._interrupted = True
            handler = signal.getsignal(signal.SIGINT)  # Tune's, behind the live view's (as for SIGTERM)
            if not callable(handler):
                return True  # off the main thread Tune has no interrupt: stop every trial instead
            handler(signal.SIGINT, None)
        return False


def _device_of(path: str):
    """The file system holding `path` (its nearest existing folder)."""
    try:
        return nearest_existing(path).stat().st_dev
    except OSError:
        return path


def _study_places(study: LoadedStudy, locations: StateLocations, uri: str) -> list[tuple[str, str]]:
    """The local places a study writes to, each with what lives there: where a full disk is the study's."""
    places = []
    if "://" not in locations.storage:
        places.append((locations.storage, "the study's storage (Tune's checkpoints and state)"))
    if locations.optuna_storage.startswith(("sqlite:///", "journal:///")):
        places.append((locations.optuna_storage.partition(":///")[2], "the Optuna database"))
    if uri.startswith("sqlite:///"):
        places.append((uri[len("sqlite:///") :], "the MLflow store"))
    artifacts = study.spec.tracking.artifact_location
    if artifacts and "://" not in str(artifacts):
        places.append((str(Path(artifacts).resolve()), "the MLflow artifacts"))
    return places


def _no_space_error(study: LoadedStudy, locations: StateLocations, uri: str, what: list[str]) -> NoSpaceLeft:
    """The one line for a study a full disk stopped: of the places it writes to, the one with the least room,
    what lives there, what could not be written, and the fix."""
    places = _study_places(study, locations, uri)
    disks: dict[Any, tuple[int, str, list[str]]] = {}  # one entry per file system, in the order above
    for path, label in places:
        room = free_bytes(path)
        if room is not None:
            disks.setdefault(_device_of(path), (room, path, []))[2].append(label)
    if disks:
        room, path, labels = min(disks.values(), key=lambda d: d[0])  # the first of the fullest
        where = f"{path} ({', '.join(labels)}; {room} bytes free)"
    else:
        where = "a disk the study writes to"
    return NoSpaceLeft(
        f"no space left on {where}: {'; '.join(what)}. The study stopped; its runs and trials are closed as interrupted where "
        f"their store could still record it. Fix: free space on that disk, then `{shell_command('sharpscale', 'resume', study.path)}` "
        f"continues the study."
    )


def _close_all(steps: list, primary: BaseException | None) -> None:
    """Run every cleanup step even when some fail or a stop interrupts one (`_stops_deferred`); a failure is a note
    on the error that ended the study (which stays the one cause reported), or raised itself when the study had ended
    without error. A step a stop cut short is skipped, not a failure of the study's records."""
    failures = []
    for step in steps:
        try:
            step()
        except KeyboardInterrupt:
            continue  # the next steps still close what this call opened
        except Exception as err:  # noqa: BLE001 - each step runs whatever the others did
            failures.append(err)
    if not failures:
        return
    if primary is None:
        raise failures[0]
    for err in failures:
        primary.add_note(f"(while closing the study's runs afterwards: {type(err).__name__}: {str(err)[:300]})")


def _trial_resources(plan: DistributedPlan):
    if plan.workers > 1:
        # The trial itself only drives a Ray Train group, which books its own workers' resources; Tune
        # refuses an empty request, so the driver holds 1% of a CPU.
        return {"cpu": 0.01}
    return {"cpu": plan.cpus_per_worker, "gpu": plan.gpus_per_worker, **plan.custom}


def _max_concurrent_trials(limit: int | None, plan: DistributedPlan, total: dict[str, float]) -> int | None:
    """Tune's cap on trials running at once: the study's, else none where Tune places trials by their requests.

    total: the cluster's resources (`ray.cluster_resources()`).
    """
    if limit is not None or plan.workers == 1:
        return limit
    # A multi-worker trial itself books a sliver of one CPU (its workers are Ray Train's): uncapped, Tune would
    # start every trial at once, all sampled before any result, their worker groups queued. Cap it at the worker
    # groups the cluster holds.
    per_trial = {"CPU": plan.cpus_per_worker, "GPU": plan.gpus_per_worker, **plan.custom}
    fits = [int(total.get(name, 0.0) // (amount * plan.workers)) for name, amount in per_trial.items() if amount > 0]
    return max(1, min(fits)) if fits else None


# Ray Tune's documented switch for results that lack the objective (ray.tune.constants, "Environment variables").
_STRICT_METRIC_ENV = "TUNE_DISABLE_STRICT_METRIC_CHECKING"


def objective_has_gaps(study: LoadedStudy) -> bool:
    """Whether some trial reports epochs without the objective: a validation metric under train.eval_every > 1."""
    from trainables.config import TrialConfig

    column = study.spec.objective.column
    gapped = (*VALIDATION_METRICS, *BEST_EPOCH_METRICS.values())
    return column in gapped and any(TrialConfig.load(c.config).train.eval_every > 1 for c in study.cells)


@contextlib.contextmanager
def _objective_gaps_allowed(study: LoadedStudy):
    """Let Tune take results without the objective while the study runs, where eval_every leaves such epochs.

    Tune refuses by default every result lacking its metric. An epoch not evaluated has none, by design: ASHA then
    skips the result (a rung is decided at the trial's first evaluated epoch at or past it), the searcher takes the
    last result, which the last epoch (always evaluated) gives, and the live view keeps the last value. The
    objective's name is checked at load (studies.spec.Objective), so Tune's check adds nothing here.
    """
    if not objective_has_gaps(study) or os.environ.get(_STRICT_METRIC_ENV) is not None:
        yield
        return
    os.environ[_STRICT_METRIC_ENV] = "1"
    try:
        yield
    finally:
        os.environ.pop(_STRICT_METRIC_ENV, None)


# What share of the device time a study held went into its trials' training passes, by the device its trials held.
TRAINING_SHARE_METRICS = {"gpu": "training_share_of_held_gpu_time", "cpu": "training_share_of_held_cpu_time"}


def training_share(
    epoch_seconds: list[float], plan: DistributedPlan, wall_s: float, cluster: dict[str, float]
) -> tuple[str, float] | None:
    """(metric name, value): the trials' training device-seconds over the device-seconds the study held.

    epoch_seconds: every trial's summed epoch_time_s; each trial held `plan.workers` x the GPUs (else the CPUs) of a
    worker; the study held the cluster's GPUs (CPUs) for `wall_s`. 1.0 would mean every held device trained all the
    time: what is missing went to trial start-up, data loads, validation, geometry, checkpoints, records, idle
    devices, and trials too few to fill the cluster. A device's own utilisation while training (a launch-bound step
    leaves the GPU partly idle) is not in it. None without a held device or time.
    """
    kind = "gpu" if plan.gpus_per_worker > 0 else "cpu"
    per_trial = plan.workers * (plan.gpus_per_worker if kind == "gpu" else plan.cpus_per_worker)
    held = float(cluster.get(kind.upper(), 0.0)) * wall_s
    if held <= 0 or per_trial <= 0:
        return None
    return TRAINING_SHARE_METRICS[kind], sum(epoch_seconds) * per_trial / held


def _epoch_seconds(result) -> float:
    """A Tune trial's summed epoch_time_s, an epoch reported again after a restore counted once."""
    frame = result.metrics_dataframe
    if frame is None or EPOCH_TIME not in frame or "epoch" not in frame:
        return 0.0
    frame = frame.dropna(subset=[EPOCH_TIME, "epoch"])
    return float(frame.drop_duplicates("epoch", keep="last")[EPOCH_TIME].sum())


class FinishingASHA(ASHAScheduler):
    """ASHA that never stops a trial at its last epoch: there it has nothing left to stop, and everything to lose.

    A trial records each epoch after reporting it (trainables.loop: checkpoint, then report, then record, which
    keeps resume from logging an epoch twice), and at its last epoch it then keeps its final checkpoint and ends its
    run. Tune stops a trial by ending its actor without waiting for that, so ASHA's STOP there (at max_t, which is
    the last epoch, or at a rung that falls on it) lost the last epoch's record (its geometry too) and left the run
    for `close_dangling`, which, missing that epoch, called a finished trial early_stopped. Such a result, marked by
    the trial (LAST_EPOCH_RESULT_KEY), continues instead: the trial writes what it owes and ends by itself. Its
    rungs and cutoffs are ASHA's, untouched.
    """

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        action = super().on_trial_result(tune_controller, trial, result)
        if action == TrialScheduler.STOP and result.get(LAST_EPOCH_RESULT_KEY):
            return TrialScheduler.CONTINUE
        return action


def _scheduler(study: LoadedStudy):
    asha = study.spec.budget.asha
    if asha is None:
        return None
    from trainables.config import TrialConfig

    # One result per epoch, so ASHA's rungs are epochs.
    epochs = max(TrialConfig.load(c.config).schedule.epochs for c in study.cells)
    return FinishingASHA(
        time_attr="training_iteration",
        grace_period=min(asha.grace_period, epochs),
        reduction_factor=asha.reduction_factor,
        max_t=epochs,
    )


def _trials_leave_this_node(plan: DistributedPlan) -> bool:
    """Whether the connected cluster runs trials on nodes other than this driver's: it has several (alive)
    nodes, or this node cannot host one trial (a head that offers no CPU/GPU; the autoscaler adds the workers)."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    if len(alive) > 1:
        return True
    here = ray.get_runtime_context().get_node_id()
    offers = next((n.get("Resources", {}) for n in alive if n.get("NodeID") == here), {})
    needs = {"CPU": plan.cpus_per_worker, "GPU": plan.gpus_per_worker, **plan.custom}
    return any(offers.get(name, 0.0) < amount for name, amount in needs.items() if amount > 0)


def check_cluster_storage(
    study: LoadedStudy, locations: StateLocations, plan: DistributedPlan, *, connected: bool
) -> None:
    """Refuse, before any trial, state that the cluster's other nodes cannot reach or that dies with this node.

    connected: the driver joined an existing cluster (--address); a cluster it started itself is this node alone.
    """
    import ray

    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    if not (nodes > 1 or (connected and _trials_leave_this_node(plan))):
        return
    where = f"the Ray cluster runs trials on other nodes than this driver's ({nodes} node(s) alive now)"
    problems = []
    if not locations.shared:
        mounts = study.spec.shared_mounts
        problems.append(
            f"storage: a path on this node, got {shown(locations.storage)}, and {where}: the first checkpoint written on "
            f'another node would fail ("Unable to set up cluster storage"). Fix: use storage that every node '
            f"reaches: a path on an NFS/EFS mount seen at the same place on every node, listed in shared_mounts "
            f"(e.g. --storage /mnt/shared/sharpscale_runs with `shared_mounts: [/mnt/shared]` in the study file"
            f"{'; listed now: ' + ', '.join(mounts) if mounts else ''}), or a bucket: --storage s3://BUCKET/sharpscale_runs "
            f"or gs://BUCKET/sharpscale_runs (docs/cluster.md)."
        )
    elif locations.optuna_default and "://" in locations.storage:
        problems.append(
            f"optuna_storage: required when storage is a URI ({locations.storage}) and {where}: its default, "
            f"{locations.optuna_storage}, is a file on this node only, lost with its container. Fix: set "
            f"optuna_storage in the study file or with --set optuna_storage=..., e.g. "
            f"journal:///mnt/shared/sharpscale_runs/{study.spec.name}.optuna.journal on an NFS mount, or an RDB URL "
            f"such as postgresql://USER@HOST:5432/optuna."
        )
    if problems:
        raise StudyError(study.path, problems)


def _ensure_local_dirs(study: LoadedStudy, locations: StateLocations) -> None:
    """Create the local directories the study writes to, or say why not (before any trial starts)."""
    paths = [] if "://" in locations.storage else [("storage", Path(locations.storage))]
    if locations.optuna_storage.startswith("sqlite:///"):
        paths.append(("optuna_storage", Path(locations.optuna_storage[len("sqlite:///") :]).parent))
    elif locations.optuna_storage.startswith("journal:///"):
        paths.append(("optuna_storage", Path(locations.optuna_storage[len("journal://") :]).parent))
    problems = []
    for field, path in paths:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            problems.append(
                f"{field}: cannot create the directory {path} ({err.strerror}). Fix: mount the storage it names on this "
                f"node, or choose another one for this run, e.g. --storage ~/sharpscale_runs."
            )
    if problems:
        raise StudyError(study.path, problems)


def _init_ray(address: str | None, num_cpus: int | None):
    import ray

    from trainables.tracking import trial_runtime_env

    if ray.is_initialized():
        return False
    runtime_env = trial_runtime_env()  # the driver's MLflow credentials, for trials on any node
    if address:
        ray.init(address=address, log_to_driver=False, configure_logging=False, runtime_env=runtime_env)
    else:
        # The dashboard is not optional: Train inside Tune needs it to free a stopped trial's workers.
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=True,
            log_to_driver=False,
            configure_logging=False,
            runtime_env=runtime_env,
        )
    return True


# How long `run --address` waits for the cluster's port to accept a connection before saying nothing listens there:
# Ray itself retries a dead address for minutes, silently.
ADDRESS_PROBE_S = 5.0


def check_address(study: LoadedStudy, address: str) -> None:
    """Refuse at once an --address HOST:PORT (or ray://HOST:PORT) where nothing accepts a connection, before any
    record is made; 'auto' and other forms are left to Ray."""
    import socket

    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host or "/" in target:
        return
    host = host.strip("[]")  # [::1]:6379
    try:
        with socket.create_connection((host, int(port)), timeout=ADDRESS_PROBE_S):
            return
    except OSError as err:
        why = "timed out" if isinstance(err, TimeoutError) else (err.strerror or type(err).__name__)
    raise StudyError(
        study.path,
        [
            f"--address {address}: nothing answers at {host}:{port} ({why} within {ADDRESS_PROBE_S:g} s). Fix: start "
            f"the cluster (`ray start --head` on {host}) or give its head's address (`ray status` there prints it), "
            f"or drop --address to run on this machine."
        ],
    )


def _start_ray(study: LoadedStudy, address: str | None, num_cpus: int | None) -> bool:
    """_init_ray, with a failure to start or reach Ray said in one line instead of Ray's trace."""
    main_thread = threading.current_thread() is threading.main_thread()
    before_term = signal.getsignal(signal.SIGTERM) if main_thread else None
    try:
        return _init_ray(address, num_cpus)
    except Exception as err:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError, ...
        raise StudyError(study.path, [ray_start_problem(err, address)]) from None
    finally:
        if main_thread and before_term is not None:
            # ray.init installs its own SIGTERM handler (sys.exit), which would end the driver mid-way, its runs left
            # RUNNING; the study's own (a stop as Ctrl-C) stays.
            signal.signal(signal.SIGTERM, before_term)


def _sigterm_interrupts(run):
    """`run` with SIGTERM raised as KeyboardInterrupt from its first line to its last (on the main thread), so a
    `kill` during set-up or the closing roll-ups closes what is open as Ctrl-C would, never leaving runs RUNNING;
    while Tune runs, `_tune` hands SIGTERM to Tune's own stop instead (`_term_as_interrupt`)."""

    def _raise(signum, frame) -> None:
        raise KeyboardInterrupt

    @functools.wraps(run)
    def wrapper(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            return run(*args, **kwargs)
        before = signal.signal(signal.SIGTERM, _raise)
        try:
            return run(*args, **kwargs)
        finally:
            signal.signal(signal.SIGTERM, before)

    return wrapper


@_sigterm_interrupts
def run_study(
    path: str | Path,
    *,
    address: str | None = None,
    tracking_uri: str | None = None,
    smoke: bool = False,
    resume: bool = False,
    num_cpus: int | None = None,
    overrides: dict[str, Any] | None = None,
    new_launch: bool = False,
    trainable: Any = None,
    trust_storage: bool = False,
    take_over: bool = False,
) -> StudyOutcome:
    """Validate the study file, run all of its trials on Ray Tune, record them in MLflow.

    resume: continue the interrupted run of the same file (and the same overrides) instead of starting anew; its
    state is where that run recorded it (the study run's tags) unless `storage`/`optuna_storage` are overridden.
    overrides: dotted trial-config paths and study settings (`storage`, ...) set for this run (the CLI's --set).
    new_launch: the experiment already holds runs of the study and this starts another launch, with its own Tune
    experiment and Optuna studies, kept apart by analysis; without it such a run is refused (never mixed in).
    trust_storage: resume from Tune's state files even where they differ from what this launch recorded leaving
    (identity.check_tune_state): its driver was killed hard. Tune unpickles them.
    take_over: take the launch's driver claim from whoever holds it (a driver on another host known to be gone).
    trainable: the Tune trainable each trial runs, given the payload dict built below; None: the real one
    (`trainables.ray_train.tune_trainable()`). benchmarks/sim_scale.py passes a stand-in without torch.
    """
    study = load_study(path, smoke=smoke, overrides=overrides)
    _check_before_recording(study, address, num_cpus, real_trials=trainable is None)
    uri = resolve_tracking_uri(tracking_uri or study.spec.tracking.uri)
    _warn_split_records(address, uri)
    try:
        target = Launch.open(
            study, uri, resume=resume, new_launch=new_launch, explicit=tracking_uri is not None, take_over=take_over
        )
    except Exception as err:
        if not store_is_locked(err):
            raise
        raise StudyError(study.path, [store_locked(uri, err)]) from None
    outcome: StudyOutcome | None = None
    primary: BaseException | None = None
    quiet, started_ray, created = contextlib.ExitStack(), False, None
    locations: StateLocations | None = None
    try:
        target.describe()
        run_name = launch_name(target.experiment_name, target.number)
        previous_tags = target.previous.data.tags if target.previous is not None else None
        locations = state_locations(study, run_name, previous_tags)
        check_state_paths(study, locations.storage, locations.optuna_storage)
        plan = _distributed_plan(study, locations, run_name)
        log_path = log_file(study, locations, run_name)
        # The first of the run's folder that this call creates: a study refused by the checks below leaves none behind.
        created = next((p for p in reversed(log_path.parents) if not p.exists()), None)
        # Ray's, Tune's and Optuna's chatter goes to a file; the terminal shows the live view of the cells.
        log = quiet.enter_context(quiet_libraries(log_path))
        experiment_dir = f"{locations.storage}/{run_name}"
        # Before Ray starts: what the driver reads from the storage needs no cluster, and a refused resume (a killed
        # driver's unrecorded Tune state, a launch record of another store) should not cost one.
        restore = _check_tune_experiment(study, target, experiment_dir, resume=resume, trust_storage=trust_storage)
        with stderr_to(log):
            started_ray = _start_ray(study, address, num_cpus)
        reroute_libraries()  # ray.init dropped the handlers quiet_libraries gave Ray's loggers
        _check_cluster(study, locations, plan, address)
        commit = git_commit(study.path.parent)
        target.note_commit(commit)
        _open_runs(study, target, commit, locations, experiment_dir, resume=resume)
        outcome = _tune(study, target, locations, plan, run_name, commit, restore, trainable)
        return outcome
    except BaseException as err:
        primary = _full_disk_error(study, locations, target.uri, err) if locations is not None else None
        if primary is not None:
            raise primary from None
        primary = err
        raise
    finally:
        with _stops_deferred() as stops:
            steps = _closing_steps(target, outcome, primary, started_ray=started_ray)
            steps.append(quiet.close)
            if isinstance(primary, StudyError) and not target.opened and created is not None:
                # Refused before any record or trial: nothing of this call stays on disk (its log neither).
                steps.append(lambda: shutil.rmtree(created, ignore_errors=True))
            _close_all(steps, primary)
        if stops and primary is None:
            print(
                "sharpscale: the stop came while the study was closing: its runs were closed as they ended first.",
                file=sys.stderr,
                flush=True,
            )


@contextlib.contextmanager
def _stops_deferred():
    """While a study closes: the first Ctrl-C (or SIGTERM) is noted and closing goes on, so that its runs are closed
    as what ended them says; another one interrupts only the step under way (`_close_all` runs the next ones), for a
    step that hangs (Ray's shutdown). Yields the signals seen."""
    seen: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def note(signum, frame) -> None:
        seen.append(signum)
        if len(seen) == 1:
            print(
                "\nsharpscale: closing the study's runs first (stop again to skip the step under way)",
                file=sys.stderr,
                flush=True,
            )
            return
        raise KeyboardInterrupt

    before = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield seen
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _check_before_recording(
    study: LoadedStudy, address: str | None, num_cpus: int | None, *, real_trials: bool
) -> None:
    """Refuse, before anything is recorded or Ray starts, a study whose trials could never run here. The cheap
    checks first: building the models imports torch and timm (seconds), which a refusal of the address or the
    resources need not wait for."""
    ray_mod = sys.modules.get("ray")
    if ray_mod is not None and ray_mod.is_initialized():
        check_cluster_resources(study)  # the caller's Ray connection, which the study will use
    elif not address:
        check_local_resources(study, num_cpus)  # before Ray starts: a trial this machine cannot host waits forever
        if real_trials:
            check_local_devices(study)  # cuda asked of a local cluster on a machine without it
    else:
        check_address(study, address)  # before anything is recorded: a dead address would claim a launch, then wait
    if real_trials:  # the real trials build timm models: a kwargs typo would fail each, each retried
        check_trials_fit_the_data(study)
        check_model_kwargs(study)


def _distributed_plan(study: LoadedStudy, locations: StateLocations, run_name: str) -> DistributedPlan:
    """How each trial runs: its workers, what each holds, its retries, where Ray Train keeps its checkpoints."""
    res = study.resources
    return DistributedPlan(
        workers=res.workers_per_trial,
        cpus_per_worker=res.cpus_per_trial,
        gpus_per_worker=res.gpus_per_trial,
        custom=dict(res.custom),
        max_failures=res.max_failures,
        storage_path=f"{locations.storage}/{run_name}/train",
        keep_checkpoints=study.spec.checkpoints.keep,
    )


def _check_cluster(study: LoadedStudy, locations: StateLocations, plan: DistributedPlan, address: str | None) -> None:
    """Once Ray is up: every problem with the cluster, where the state goes and the data surfaces here, before any
    MLflow run or trial exists."""
    if address:
        check_cluster_resources(study)
    check_cluster_storage(study, locations, plan, connected=bool(address))
    _ensure_local_dirs(study, locations)
    check_data_on_nodes(study)  # a node that cannot read the data fails the study here


def _check_tune_experiment(
    study: LoadedStudy, target: Launch, experiment_dir: str, *, resume: bool, trust_storage: bool
) -> bool:
    """The Tune experiment folder: on resume, the one this launch left (its launch record, its state files, unless
    trust_storage); on a fresh launch, none there yet (identity.check_fresh_experiment_dir). Returns whether Tune
    restores its state (False: a new Tune experiment, also for a launch stopped before its Tune experiment began)."""
    if not resume:
        identity.check_fresh_experiment_dir(study, experiment_dir, target.uri)
        return False
    from ray import tune

    previous = target.previous
    identity.check_launch_record(
        study,
        experiment_dir,
        identity.launch_record(study, target.uri, target.experiment_id, previous.info.run_id, target.number),
    )

    if not tune.Tuner.can_restore(experiment_dir):
        if identity.read_launch_record(experiment_dir) is not None and not target.trial_runs():
            # Stopped after its runs were made and before Tune wrote its state: no trial ran, none is lost.
            print(
                f"sharpscale: resume: launch {target.number} was stopped before its first trial began; its trials "
                f"start now.",
                flush=True,
            )
            return False
        raise StudyError(
            study.path,
            [
                f"resume: no interrupted run of this study under {experiment_dir}. "
                f"Fix: start it with `sharpscale run`, or give the storage it ran with (--storage)."
            ],
        )
    # Tuner.restore unpickles Tune's files from the storage: only the ones this launch left there.
    recorded = previous.data.tags.get(TUNE_STATE_TAG)
    if trust_storage:
        print(f"sharpscale: warning: --trust-storage: Tune's state under {experiment_dir} is restored unchecked")
    elif unchecked := identity.check_tune_state(study, experiment_dir, recorded):
        print(f"sharpscale: warning: {unchecked}", flush=True)
    _check_searcher_state(study, experiment_dir)
    return True


def _check_searcher_state(study: LoadedStudy, experiment_dir: str) -> None:
    """The searcher's state Tune would hand to CellSearcher.restore (the newest searcher-state-*.pkl by name, as
    Tune's Searcher.restore_from_dir picks it), read here first: refused inside Tune's restore, it would leave the
    resume waiting for a second Ctrl-C instead of saying why in one line."""
    if "://" in experiment_dir:
        return
    from studies.search import read_searcher_state

    states = sorted(Path(experiment_dir).glob("searcher-state-*.pkl"))
    if states:
        read_searcher_state(str(states[-1]), {c.key for c in study.cells})


def _open_runs(
    study: LoadedStudy, target: Launch, commit: str, locations: StateLocations, experiment_dir: str, *, resume: bool
) -> None:
    """The study run and the cell runs (Launch.open_runs), then, on a fresh launch, its identity into the Tune
    experiment folder."""
    study_run_id = target.open_runs(commit, locations.tags())
    if not resume:
        identity.write_launch_record(
            experiment_dir,
            identity.launch_record(study, target.uri, target.experiment_id, study_run_id, target.number),
        )


def _full_disk_error(study: LoadedStudy, locations: StateLocations, uri: str, err: BaseException) -> NoSpaceLeft | None:
    """A full disk met outside the trials (a record of the runner's, the store itself): the one line that names it,
    not the trace of whichever library met it first; None for any other error."""
    places = [path for path, _ in _study_places(study, locations, uri)]
    full = None if isinstance(err, (NoSpaceLeft, KeyboardInterrupt)) else no_space_at(err, places)
    return None if full is None else _no_space_error(study, locations, uri, [f"the study could not write ({full})"])


def _closing_steps(
    target: Launch, outcome: StudyOutcome | None, primary: BaseException | None, *, started_ray: bool
) -> list:
    """What ends a call of run_study, in order, whatever ended it (each step run by _close_all even when another
    fails): Ray stopped (when this call started it), then the launch's own (Launch.closing_steps: the runs this call
    opened closed, or, stopped before any run, the launch it claimed released; its driver claim given back)."""
    steps = []
    if started_ray:
        import ray

        # First: once the local cluster is down no trial can still write its own end (a trial Tune stopped at
        # the interrupt records `early_stopped` from its actor, possibly after fit() returned), so what the
        # steps below record is the last word.
        steps.append(_gated(ray.shutdown))
    steps += target.closing_steps(
        status=_run_status(outcome, primary, resumed=target.previous is not None),
        interrupted=interruption_reason(outcome, primary),
        interrupted_at=outcome.interrupted_at if outcome is not None else None,
        failed=primary is not None,
    )
    return steps


# Tests only: a folder where a closing run, about to stop Ray, writes `closing` and then waits for a file `go`, so that a
# test stops it at that step, as at a Ray shutdown that hangs, without racing it (tests/studies/test_stops.py).
CLOSING_GATE_ENV = "SHARPSCALE_TEST_CLOSING_GATE"


def _gated(step):
    """`step`, preceded by the wait at CLOSING_GATE_ENV's folder where that is set (a test's); else `step` itself."""
    gate = os.environ.get(CLOSING_GATE_ENV)
    if not gate:
        return step

    def gated() -> None:
        Path(gate, "closing").touch()
        while not Path(gate, "go").exists():
            time.sleep(0.05)  # a stop interrupts it as it would the step
        step()

    return gated


def _run_status(outcome: StudyOutcome | None, primary: BaseException | None, *, resumed: bool = False) -> str:
    """The MLflow status the runs this call opened end with. A resume that failed before its trials ended (its
    store, its searcher's database) leaves the launch as it found it: interrupted (KILLED), still resumable."""
    if outcome is not None:
        return "KILLED" if outcome.interrupted else ("FAILED" if outcome.nothing_ran else "FINISHED")
    return "KILLED" if isinstance(primary, KeyboardInterrupt) or resumed else "FAILED"


def log_file(study: LoadedStudy, locations: StateLocations, run_name: str) -> Path:
    """Where a run's library log goes: beside its Ray results, or beside the study file when those are remote."""
    base = Path(locations.storage) if "://" not in locations.storage else study.path.parent / DEFAULT_STORAGE
    return base / run_name / LOG_FILE


def _node_problem(request: dict[str, float], offers: list[tuple[str, dict[str, float]]], where: str) -> str | None:
    """Why no node of `offers` ([(name, resources)]) can host one trial worker asking `request`, or None."""
    wanted = {k: v for k, v in request.items() if v > 0}
    if not offers or any(all(res.get(k, 0.0) >= v for k, v in wanted.items()) for _, res in offers):
        return None
    short = sorted({k for k, v in wanted.items() if all(res.get(k, 0.0) < v for _, res in offers)})
    largest = {k: max(res.get(k, 0.0) for _, res in offers) for k in wanted}
    asked = ", ".join(f"{k}={v:g}" for k, v in wanted.items())
    has = ", ".join(f"{k}={largest[k]:g}" for k in wanted)
    names = {"CPU": "resources.cpus_per_trial", "GPU": "resources.gpus_per_trial"}
    fields = ", ".join(names.get(k, f"resources.custom.{k}") for k in short) or "resources"
    return (
        f"{fields}: each trial (each worker) asks {asked}, and no node of {where} can ever give it (the most any "
        f"node has: {has}); Tune would wait forever. Fix: ask for at most that, or run on a cluster with such nodes "
        f"(--address)."
    )


def check_local_resources(study: LoadedStudy, num_cpus: int | None) -> None:
    """Refuse, before Ray starts, a trial that the local cluster this machine would start cannot host."""
    res = study.resources
    # Ray counts the CPUs this process may run on (a container's or a taskset's share), not the machine's.
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cpus = float(num_cpus if num_cpus is not None else usable)
    offers = {"CPU": cpus, "GPU": float(_local_gpus()) if res.gpus_per_trial > 0 else 0.0}
    request = {"CPU": res.cpus_per_trial, "GPU": res.gpus_per_trial, **res.custom}
    if problem := _node_problem(request, [("this machine", offers)], "the local Ray cluster (this machine)"):
        raise StudyError(study.path, [problem])


def _local_gpus() -> int:
    # Only asked when a trial wants a GPU; torch is what the trials use to see them.
    import torch

    return torch.cuda.device_count()


# Where the Ray cluster launcher (`ray up`) leaves the cluster's config on the head, for its autoscaler to read.
AUTOSCALER_CONFIG = "~/ray_bootstrap_config.yaml"


def check_cluster_resources(study: LoadedStudy, autoscaler_config: str | Path = AUTOSCALER_CONFIG) -> None:
    """Refuse a trial (worker) that no node of the connected cluster, and no node type its autoscaler may add
    (the launcher's config on this head), can host. Without that config (KubeRay, a hand-started cluster) the
    autoscaler's node types are unknown here: then only a warning, since it may add a node that fits."""
    import ray

    res = study.resources
    request = {"CPU": res.cpus_per_trial, "GPU": res.gpus_per_trial, **res.custom}
    offers = [(n.get("NodeManagerAddress", "?"), n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]
    types = _autoscaler_node_types(Path(autoscaler_config).expanduser())
    if types is not None:
        if problem := _node_problem(request, offers + types, "the cluster (its nodes and its autoscaler's node types)"):
            raise StudyError(study.path, [problem])
    elif problem := _node_problem(request, offers, "the cluster now"):
        print(
            f"sharpscale: warning: {problem.replace('Tune would wait forever', 'unless its autoscaler adds a node type that fits, Tune waits forever')}",
            flush=True,
        )


def _autoscaler_node_types(config: Path) -> list[tuple[str, dict[str, float]]] | None:
    """(type name, resources) of each node type the launcher's config declares, or None without a readable one."""
    import yaml

    try:
        types = (yaml.safe_load(config.read_text()) or {}).get("available_node_types") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    out = []
    for name, spec in types.items():
        resources = spec.get("resources") if isinstance(spec, dict) else None
        if not isinstance(resources, dict):
            return None  # the launcher detects this type's resources itself: they are not known here
        out.append((f"node type {name}", {k: float(v) for k, v in resources.items() if isinstance(v, (int, float))}))
    return out or None


def _tune(
    study: LoadedStudy,
    target: Launch,
    locations: StateLocations,
    plan: DistributedPlan,
    run_name: str,
    commit: str,
    resume: bool,
    trainable: Any,
) -> StudyOutcome:
    spec = study.spec
    client, uri, experiment_id = target.client, target.uri, target.experiment_id
    exp_name, launch = target.experiment_name, target.number
    study_run_id, cell_runs = target.study_run_id, target.cell_runs
    from analysis.geometry.names import probe_plan

    logged_params = trial_params(study)

    def payload(cell: Cell, sample: dict[str, Any], confirm: tuple[int, str | None] | None = None) -> dict[str, Any]:
        # confirm: (seed, chosen run name) of a confirm trial (studies.confirm), None for a search trial.
        stage = {STAGE_TAG: SEARCH_STAGE}
        if confirm is not None:
            stage = {STAGE_TAG: CONFIRM_STAGE, **({CHOSEN_FROM_TAG: confirm[1]} if confirm[1] else {})}
        trial = apply_sample(cell.config, sample) if confirm is None else confirm_config(cell, sample, confirm[0])
        return {
            "study": run_name,
            # The in-trial probe, as a plan of this trial's own geometry section (None where it names no measures).
            "probe": probe_plan(trial),
            "plan": asdict(plan),
            "log_checkpoint": spec.tracking.log_checkpoint,
            "cell": cell.key,
            "trial": trial,
            "sample": sample,
            PARAMS_KEY: logged_params,
            "objective": {"metric": spec.objective.column, "mode": spec.objective.mode},
            "tracking": TrackingTarget(uri, experiment_id, cell_runs[cell.key]).__dict__,
            # Where a full disk is the study's (trainables.errors.no_space_at): it stops the study, not just the trial.
            PLACES_KEY: [path for path, _ in _study_places(study, locations, uri)],
            "tags": {
                CELL_TAG: cell.key,
                STUDY_FILE_HASH_TAG: study.file_hash,
                LAUNCH_TAG: str(launch),
                GIT_COMMIT_TAG: commit,
                STUDY_TAG: spec.name,
                **source_tags(study, commit),
                **{factor_tag(k): v for k, v in cell.levels.items()},
                **stage,
            },
        }

    import ray
    from ray import tune

    # The runs it writes to are closed by run_study, whatever happens here.
    from trainables.ray_train import tune_trainable

    searcher = CellSearcher(
        list(study.cells),
        metric=spec.objective.column,
        mode=spec.objective.mode,
        sampler=spec.budget.sampler,
        seed=spec.budget.seed,
        storage_url=locations.optuna_storage,
        study_name=run_name,
        payload=payload,
        confirm_seeds={c.key: spec.confirm.seed_list[: c.confirm] for c in study.cells} if spec.confirm else None,
        owner=study_run_id,
    )
    progress = LiveView(study, title=f"{spec.name} ({exp_name})", run_name=run_name)
    rollup = rollup_callback(
        uri,
        experiment_id,
        study_run_id,
        cell_runs,
        list(study.cells),
        column=spec.objective.column,
        mode=spec.objective.mode,
    )
    trainable = tune.with_resources(trainable or tune_trainable(), _trial_resources(plan))
    experiment_dir = f"{locations.storage}/{run_name}"
    if resume:
        # Finished trials stay finished; interrupted and errored ones continue from their checkpoints.
        tuner = tune.Tuner.restore(experiment_dir, trainable=trainable, resume_unfinished=True, resume_errored=True)
    else:
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                metric=spec.objective.column,
                mode=spec.objective.mode,
                search_alg=searcher,
                scheduler=_scheduler(study),
                num_samples=study.total_trials,
                max_concurrent_trials=_max_concurrent_trials(
                    spec.resources.max_concurrent_trials, plan, ray.cluster_resources()
                ),
                time_budget_s=spec.budget.time_limit_s,
                # A fresh worker per trial would re-import torch, timm and MLflow each time (seconds each).
                reuse_actors=True,
                trial_name_creator=lambda t: f"{t.trial_id}",
                trial_dirname_creator=lambda t: f"{t.trial_id}",
            ),
            run_config=tune.RunConfig(
                name=run_name,
                storage_path=locations.storage,
                failure_config=tune.FailureConfig(max_failures=spec.resources.max_failures),
                # Tune snapshots its state (blocking on the upload) after any trial writes `keep` checkpoints,
                # and otherwise on its own adaptive period: `keep` and train.checkpoint_every set the rate.
                checkpoint_config=tune.CheckpointConfig(num_to_keep=spec.checkpoints.keep),
                stop=NoSpaceStopper(run_name),
                callbacks=[progress.callback, rollup],
                verbose=0,
            ),
        )
    # tuner.pkl is written now: recorded at once, so that only a launch killed hard between here and the end of
    # `fit` leaves Tune state that `resume` will not read (identity.check_tune_state).
    identity.record_tune_state(client, study_run_id, experiment_dir)
    cluster = ray.cluster_resources()
    busy = _busy_sampler(plan, cluster)
    t0 = time.perf_counter()
    print(
        f"sharpscale: study {spec.name!r}: {len(study.cells)} cells, {study.total_trials} trials, "
        f"MLflow experiment {exp_name!r} at {uri}; Ray storage {locations.storage}, Optuna {locations.optuna_storage}; "
        f"Ray's, Tune's and Optuna's logs in {log_file(study, locations, run_name)}",
        flush=True,
    )
    NO_SPACE.pop(run_name, None)  # a full disk met by an earlier run of this name in this process
    before = signal.getsignal(signal.SIGINT)
    main_thread = threading.current_thread() is threading.main_thread()
    before_term = signal.getsignal(signal.SIGTERM) if main_thread else None
    if main_thread:
        # SIGTERM (a scheduler's stop, `kill`) ends the study as Ctrl-C does: trials stopped and recorded as
        # interrupted, resumable, instead of Ray's own abort that leaves runs and Optuna trials RUNNING.
        signal.signal(signal.SIGTERM, _term_as_interrupt)
    try:
        if busy is not None:
            busy.start()
        with _objective_gaps_allowed(study):
            results = tuner.fit()
    except KeyboardInterrupt as err:
        # A second Ctrl-C: Tune gives up waiting for its trials. What the first one stopped is still recorded so.
        if progress.interrupted_at is not None:
            _close_all([lambda: target.close_interrupted(searcher, progress.interrupted_at)], err)
        raise
    finally:
        gpu_busy = busy.stop() if busy is not None else None
        if main_thread:
            signal.signal(signal.SIGINT, before)  # Tune leaves its handler (and ours) installed
            signal.signal(signal.SIGTERM, before_term)
        # Tune's state as fit left it (its last snapshot is taken before fit returns): what `resume` may read back.
        with contextlib.suppress(Exception):  # a store that cannot record it (a full disk): resume then refuses
            identity.record_tune_state(client, study_run_id, experiment_dir)
    if run_name in NO_SPACE:
        # The stopper stopped every trial: each is resumable, as after Ctrl-C, and its run says what stopped it.
        since = NO_SPACE[run_name][0]
        reason = (
            "the study stopped on a full disk while this trial ran; `sharpscale resume` continues it once there is "
            "space again"
        )
        closing = RuntimeError("closing after a full disk")  # holds the notes of closing steps that failed
        _close_all(
            [
                lambda: searcher.fail_unfinished(interrupted=True),  # notes in NO_SPACE what it could not record
                lambda: target.mark_interrupted(since, reason),
            ],
            closing,
        )
        err = _no_space_error(study, locations, uri, NO_SPACE.pop(run_name)[1])
        for note in getattr(closing, "__notes__", []):
            err.add_note(note)
        raise err
    interrupted = progress.interrupted_at is not None
    if interrupted:
        target.close_interrupted(searcher, progress.interrupted_at)
    else:
        # Every trial has ended: an Optuna trial still RUNNING will never be told (Tune stopped it at the time
        # limit, or, resumed, its Tune trial had ended before a full disk let its end be recorded).
        searcher.fail_unfinished(interrupted=False)
    if resume:
        target.drop_lost_trials({Path(r.path).name for r in results})
    trials = len(results)
    wall = time.perf_counter() - t0
    refused = sum(1 for r in results if r.error is None and (r.metrics or {}).get(REFUSED_RESULT_KEY))
    errored = sum(1 for r in results if r.error is not None) + refused
    reported = sum(1 for r in results if (r.metrics or {}).get("training_iteration"))
    if unconfirmed := searcher.unconfirmed():
        print(
            f"sharpscale: no confirm runs for {len(unconfirmed)} cell(s) whose every search trial failed: {unconfirmed}"
        )
    share = training_share([_epoch_seconds(r) for r in results], plan, wall, cluster)
    if share is not None:
        retry_locked(client.log_metric, study_run_id, share[0], share[1])
    if gpu_busy is not None:
        retry_locked(client.log_metric, study_run_id, BUSY_METRIC, gpu_busy)
    print(record_estimate(lambda k, v: retry_locked(client.log_metric, study_run_id, k, v), study, wall, cluster))
    print(
        f"sharpscale: {trials} trials in {wall:.0f} s ({errored} errored"
        + (f", {refused} of them refused by their settings, not retried" if refused else "")
        + ")"
        + (", INTERRUPTED" if interrupted else "")
    )
    return StudyOutcome(
        experiment_id,
        study_run_id,
        uri,
        trials,
        errored,
        interrupted=interrupted,
        reported=reported,
        interrupted_at=progress.interrupted_at,
        refused=refused,
        training_share=share,
        gpu_busy=gpu_busy,
    )


def _busy_sampler(plan: DistributedPlan, cluster: dict[str, float]) -> GpuBusySampler | None:
    """A sampler of this node's GPUs where the study's trials hold GPUs and every GPU of the cluster is on this node
    (the driver samples its own node only: a cluster's other nodes would go uncounted); else None."""
    if plan.gpus_per_worker <= 0:
        return None
    sampler = GpuBusySampler()
    if sampler.command is None:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    here = len(visible.split(",")) if visible else local_gpus()[0]
    if float(cluster.get("GPU", 0.0)) > here:
        print(
            f"sharpscale: {BUSY_METRIC} is not measured: the cluster has {cluster.get('GPU', 0):g} GPUs and this node "
            f"{here}, and only this node's are sampled."
        )
        return None
    return sampler


def _term_as_interrupt(signum, frame) -> None:
    handler = signal.getsignal(signal.SIGINT)  # Tune's (behind the live view's), which stops the trials
    if not callable(handler):
        raise KeyboardInterrupt
    handler(signal.SIGINT, frame)
