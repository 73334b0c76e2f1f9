"""Running a study: one call of `run` or `resume` in named steps: its checks (studies.preflight), its log and its
Ray cluster, its launch's runs opened (studies.launch), its trials on Tune (studies.tuning), and its close."""

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
from pathlib import Path
from typing import Any

from studies import identity
from studies.launch import INTERRUPTED_REASON, Launch, close_all, store_is_locked, store_locked
from studies.locations import StateLocations, full_disk_error, log_file, state_locations
from studies.preflight import (
    check_before_recording,
    check_cluster,
    check_state_paths,
    check_tune_experiment,
    ray_start_problem,
)
from studies.progress import quiet_libraries, reroute_libraries, stderr_to
from studies.spec import LoadedStudy, StudyError, load_study
from studies.tuning import StudyOutcome, StudyTune
from trainables.naming import launch_name
from trainables.ray_train import DistributedPlan
from trainables.tracking import resolve_tracking_uri

__all__ = [
    "StateLocations",
    "StudyOutcome",
    "interruption_reason",
    "resolve_tracking_uri",
    "run_study",
    "state_locations",
]


def git_commit(where: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10, check=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=where, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


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
    while Tune runs, StudyTune hands SIGTERM to Tune's own stop instead (studies.tuning._term_as_interrupt)."""

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
    check_before_recording(study, address, num_cpus, real_trials=trainable is None)
    uri = resolve_tracking_uri(tracking_uri or study.spec.tracking.uri)
    _warn_split_records(address, uri)
    target = _open_launch(
        study, uri, resume=resume, new_launch=new_launch, explicit=tracking_uri is not None, take_over=take_over
    )
    call = StudyCall(study, target)
    try:
        restore = call.prepare(resume=resume, trust_storage=trust_storage)
        call.start_cluster(address, num_cpus)
        call.open_runs(resume=resume)
        return call.tune(restore, trainable)
    except BaseException as err:
        call.primary = call.full_disk_error(err)
        if call.primary is not None:
            raise call.primary from None
        call.primary = err
        raise
    finally:
        call.close()


def _open_launch(study: LoadedStudy, uri: str, **how: Any) -> Launch:
    """Launch.open, with a store that another writer holds locked said in one line."""
    try:
        return Launch.open(study, uri, **how)
    except Exception as err:
        if not store_is_locked(err):
            raise
        raise StudyError(study.path, [store_locked(uri, err)]) from None


class StudyCall:
    """One call of run_study past its launch's opening, in steps: where its state goes and its log (`prepare`), its
    Ray cluster (`start_cluster`), its runs (`open_runs`), its trials (`tune`), and its close (`close`), which ends
    what the others began whatever ended the call. The launch's MLflow life is its Launch's."""

    def __init__(self, study: LoadedStudy, target: Launch):
        self.study, self.target = study, target
        self.outcome: StudyOutcome | None = None
        self.primary: BaseException | None = None  # what ended the call, None while it runs or when it ended well
        self.quiet = contextlib.ExitStack()
        self.started_ray = False
        self.created: Path | None = None  # the first folder of the run's that this call created
        self.locations: StateLocations | None = None

    def prepare(self, *, resume: bool, trust_storage: bool) -> bool:
        """Where the study's state goes, checked; the library log opened; the Tune experiment checked. Returns
        whether Tune restores its state (preflight.check_tune_experiment)."""
        study, target = self.study, self.target
        target.describe()
        self.run_name = launch_name(target.experiment_name, target.number)
        previous_tags = target.previous.data.tags if target.previous is not None else None
        self.locations = state_locations(study, self.run_name, previous_tags)
        check_state_paths(study, self.locations.storage, self.locations.optuna_storage)
        self.plan = _distributed_plan(study, self.locations, self.run_name)
        log_path = log_file(study, self.locations, self.run_name)
        # The first of the run's folder that this call creates: a study refused by the checks below leaves none behind.
        self.created = next((p for p in reversed(log_path.parents) if not p.exists()), None)
        # Ray's, Tune's and Optuna's chatter goes to a file; the terminal shows the live view of the cells.
        self.log = self.quiet.enter_context(quiet_libraries(log_path))
        self.experiment_dir = f"{self.locations.storage}/{self.run_name}"
        # Before Ray starts: what the driver reads from the storage needs no cluster, and a refused resume (a killed
        # driver's unrecorded Tune state, a launch record of another store) should not cost one.
        return check_tune_experiment(study, target, self.experiment_dir, resume=resume, trust_storage=trust_storage)

    def start_cluster(self, address: str | None, num_cpus: int | None) -> None:
        """Ray started or joined, its start-up noise in the log, and the cluster checked (preflight.check_cluster)."""
        study = self.study
        with stderr_to(self.log):
            self.started_ray = _start_ray(study, address, num_cpus)
        reroute_libraries()  # ray.init dropped the handlers quiet_libraries gave Ray's loggers
        check_cluster(study, self.locations, self.plan, address)

    def open_runs(self, *, resume: bool) -> None:
        self.commit = git_commit(self.study.path.parent)
        self.target.note_commit(self.commit)
        _open_runs(self.study, self.target, self.commit, self.locations, self.experiment_dir, resume=resume)

    def tune(self, restore: bool, trainable: Any) -> StudyOutcome:
        trials = StudyTune(
            self.study, self.target, self.locations, self.plan, self.run_name, self.commit, restore=restore
        )
        self.outcome = trials.run(trainable)
        return self.outcome

    def full_disk_error(self, err: BaseException):
        """The one line for a full disk met outside the trials (locations.full_disk_error); None for any other error,
        and before the state's places are known."""
        if self.locations is None:
            return None
        return full_disk_error(self.study, self.locations, self.target.uri, err)

    def close(self) -> None:
        """Every closing step (Ray, the launch's runs and claims, the log, a refused call's folder), a stop meanwhile
        deferred until they ran."""
        target, primary = self.target, self.primary
        with _stops_deferred() as stops:
            steps = _closing_steps(target, self.outcome, primary, started_ray=self.started_ray)
            steps.append(self.quiet.close)
            if isinstance(primary, StudyError) and not target.opened and self.created is not None:
                # Refused before any record or trial: nothing of this call stays on disk (its log neither).
                created = self.created
                steps.append(lambda: shutil.rmtree(created, ignore_errors=True))
            close_all(steps, primary)
        if stops and primary is None:
            print(
                "sharpscale: the stop came while the study was closing: its runs were closed as they ended first.",
                file=sys.stderr,
                flush=True,
            )


@contextlib.contextmanager
def _stops_deferred():
    """While a study closes: the first Ctrl-C (or SIGTERM) is noted and closing goes on, so that its runs are closed
    as what ended them says; another one interrupts only the step under way (`close_all` runs the next ones), for a
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


def _closing_steps(
    target: Launch, outcome: StudyOutcome | None, primary: BaseException | None, *, started_ray: bool
) -> list:
    """What ends a call of run_study, in order, whatever ended it (each step run by close_all even when another
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


def _run_status(outcome: StudyOutcome | None, primary: BaseException | None, *, resumed: bool = False) -> str:
    """The MLflow status the runs this call opened end with. A resume that failed before its trials ended (its
    store, its searcher's database) leaves the launch as it found it: interrupted (KILLED), still resumable."""
    if outcome is not None:
        return "KILLED" if outcome.interrupted else ("FAILED" if outcome.nothing_ran else "FINISHED")
    return "KILLED" if isinstance(primary, KeyboardInterrupt) or resumed else "FAILED"
