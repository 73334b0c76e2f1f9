"""A launch's MLflow life, owned by one object per call of `run` or `resume` (Launch): opened (its experiment made or
found, its launch number claimed) or found for `resume`, its driver claim taken, its study and cell runs opened or
reopened, its interrupted trials marked, its runs closed and its claims released, whatever ends the call.

Below the class, the store's primitives it uses (experiment, choose_launch, parent_runs, close_dangling,
mark_interrupted, resume_target), each one MLflow operation on the runs of one launch.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from studies import identity
from studies.records import (
    cell_end_time,
    cell_label,
    cell_params,
    describe_experiment,
    find_run,
    launch_of,
    rollup_callback,
    source_tags,
    study_tags,
)
from studies.shell import shell_command
from studies.spec import LoadedStudy, StudyError
from trainables.metrics import EVERY_EPOCH_METRIC
from trainables.naming import (
    CELL_TAG,
    GIT_COMMIT_TAG,
    KIND_TAG,
    LAUNCH_TAG,
    NOTE_TAG,
    PARENT_RUN_TAG,
    REASON_TAG,
    RESUMED_COMMIT_TAG,
    STATUS_TAG,
    STUDY_FILE_HASH_TAG,
    STUDY_FILE_TAG,
    TRIAL_ID_TAG,
    factor_tag,
    kind_filter,
    study_run_name,
)
from trainables.secrets import redact
from trainables.tracking import NO_SPACE_REASON, retry_locked, tracking_client

__all__ = [
    "INTERRUPTED_REASON",
    "Launch",
    "store_is_locked",
    "close_all",
    "store_locked",
    "choose_launch",
    "close_dangling",
    "experiment",
    "mark_interrupted",
    "parent_runs",
    "resume_target",
]


def store_is_locked(err: BaseException) -> bool:
    """`err` says an SQLite store was locked by another writer past the waits of SQLite and MLflow (retry_locked
    retries on any "locked"; this names the case where retrying stopped helping)."""
    return "database is locked" in str(err).lower()


def store_locked(uri: str, err: BaseException, *, outcome: str = "nothing was recorded") -> str:
    """The one line for an MLflow store that another writer holds locked past MLflow's own retries; outcome: what the
    command that met it left undone (a `run` recorded nothing, a `status` read nothing)."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    return (
        f"tracking: the MLflow store {redact(uri)} is locked by another writer ({first}); {outcome}. "
        f"Fix: let that writer finish (or stop it: `fuser` on the database file names it), then run the command again."
    )


class Launch:
    """The launch one call of `run` or `resume` drives: its store, experiment and number, the study run it resumes
    (None: a new launch), whether this call made the experiment, and, once opened, the runs this call set RUNNING
    (`opened`, the study run first) and the cell runs by cell key. While it holds the driver claim no other `run` or
    `resume` drives the launch; `closing_steps` ends with giving it back.
    """

    def __init__(
        self,
        study: LoadedStudy,
        uri: str,
        client,
        experiment_id: str,
        number: int,
        *,
        previous=None,
        new_experiment: bool = False,
    ):
        self.study, self.uri, self.client, self.experiment_id = study, uri, client, experiment_id
        self.experiment_name = study.experiment_name
        self.number = number
        self.previous = previous
        self.new_experiment = new_experiment
        self.restored = False  # the experiment was deleted, and restored by this call (release deletes it again)
        self.opened: list[str] = []
        self.cell_runs: dict[str, str] = {}
        self.driving = False  # this call holds the launch's driver claim
        self._token = uuid.uuid4().hex  # its claim's, so that only this call gives it back
        self.changed_commit: str | None = None  # a resume's commit, where it is not the launch's (note_commit)
        self._since_ms = int(time.time() * 1000)

    @property
    def study_run_id(self) -> str | None:
        return self.opened[0] if self.opened else None

    @classmethod
    def open(
        cls, study: LoadedStudy, uri: str, *, resume: bool, new_launch: bool, explicit: bool, take_over: bool = False
    ) -> Launch:
        """On resume, the launch this file ran, in the store it ran into (resume_target; the URI may differ from
        `uri`), never a new store, experiment or launch; else the study's experiment at `uri` (made, or restored, here)
        and a launch claimed for this call (choose_launch). Either way its driver claim is taken (`claim`), or the
        call refused. explicit: `uri` was given for this call, not by the study file."""
        if resume:
            uri, client, experiment_id, previous = resume_target(study, uri, explicit=explicit)
            launch = cls(study, uri, client, experiment_id, launch_of(previous), previous=previous)
            launch.claim("resume", take_over=take_over)
            return launch
        client = tracking_client(uri)
        name = study.experiment_name
        before = client.get_experiment_by_name(name)
        new_experiment = before is None or before.lifecycle_stage != "active"
        experiment_id = experiment(client, name, Path(study.spec.tracking.artifact_location), uri)
        try:
            number = choose_launch(client, experiment_id, study, name, uri, new_launch=new_launch)
        except BaseException:
            if before is not None and before.lifecycle_stage == "deleted":
                client.delete_experiment(experiment_id)  # a refused run changes nothing in the store: deleted again
            raise
        launch = cls(study, uri, client, experiment_id, number, new_experiment=new_experiment)
        launch.restored = before is not None and before.lifecycle_stage == "deleted"
        try:
            launch.claim("run", take_over=take_over)
        except BaseException:
            launch.release()
            raise
        return launch

    def claim(self, command: str, *, take_over: bool = False) -> None:
        """Take the launch's driver claim, or refuse the call (StudyError) naming the driver that holds it. A claim
        whose holder ended on this host without giving it back (killed hard) is taken over, and said so; one held
        from another host only with take_over (that host's driver is known gone)."""
        artifacts = None if self.uri.startswith(("http://", "https://")) else _artifact_uri(self.study)
        if take_over:
            holder = identity.driver_holder(self.client, self.experiment_name, self.number)
            if holder is not None:
                identity.release_driver(self.client, self.experiment_name, self.number, None)
                print(f"sharpscale: {command}: --take-over: took the claim of launch {self.number} from {holder}")
        held, gone = identity.claim_driver(
            self.client, self.experiment_name, self.number, command, self._token, artifacts
        )
        if held is not None:
            raise StudyError(self.study.path, [self._held_message(command, held)])
        self.driving = True
        if gone is not None:
            print(
                f"sharpscale: {command}: launch {self.number}'s driver {gone} ended without closing it (killed hard?); "
                f"this {command} takes its claim over.",
                flush=True,
            )

    def _held_message(self, command: str, holder: identity.DriverHolder) -> str:
        path = self.study.path
        where = (
            f"Ctrl-C in its terminal, or `kill -INT {holder.pid}`"
            if holder.here
            else f"Ctrl-C in its terminal, or `kill -INT {holder.pid}` on {holder.host}"
        )
        lost = (
            ""
            if holder.here
            else f" If that process is gone (its machine lost), `{shell_command('sharpscale', 'resume', '--take-over', path)}` takes the claim."
        )
        return (
            f"{command}: launch {self.number} of study {self.experiment_name!r} at {redact(self.uri)} is being driven by "
            f"{holder}; two drivers of one launch would run its trials twice and mix their records. Fix: let it run "
            f"(`{shell_command('sharpscale', 'status', path)}` shows its progress), or stop it first ({where}) and then "
            f"`{shell_command('sharpscale', 'resume', path)}`.{lost}"
        )

    def trial_runs(self) -> int:
        """How many trial runs this launch holds in the store."""
        clause = f"{kind_filter('trial')} and tags.`{LAUNCH_TAG}` = '{self.number}'"
        return len(self.client.search_runs([self.experiment_id], filter_string=clause, max_results=10_000))

    def note_commit(self, commit: str) -> None:
        """A resume at another commit than the launch's: said, and recorded on the study run (RESUMED_COMMIT_TAG),
        and, when this call closes, on every trial run it resumed or started (`closing_steps`)."""
        before = self.previous.data.tags.get(GIT_COMMIT_TAG) if self.previous is not None else None
        if not before or before == commit:
            return
        self.changed_commit = commit
        print(
            f"sharpscale: resume: the code changed since launch {self.number} began: it ran at commit {before}, this "
            f"resume runs {commit}; the trials it runs record it ({RESUMED_COMMIT_TAG}).",
            flush=True,
        )
        retry_locked(self.client.set_tag, self.previous.info.run_id, RESUMED_COMMIT_TAG, commit)

    def _tag_resumed_trials(self) -> None:
        """RESUMED_COMMIT_TAG on the trial runs of this launch that ran during this call (ended after it began)."""
        for run in self.client.search_runs(
            [self.experiment_id], filter_string=kind_filter("trial"), max_results=10_000
        ):
            ran_now = run.info.end_time is None or run.info.end_time >= self._since_ms
            if launch_of(run) == self.number and ran_now and run.data.tags.get(GIT_COMMIT_TAG) != self.changed_commit:
                retry_locked(self.client.set_tag, run.info.run_id, RESUMED_COMMIT_TAG, self.changed_commit)

    def describe(self) -> None:
        describe_experiment(self.client, self.experiment_id, self.study)

    def open_runs(self, commit: str, state_tags: dict[str, str]) -> str:
        """The study run and its cell runs, made or (resumed) reopened (parent_runs); returns the study run's id."""
        return parent_runs(
            self.client,
            self.study,
            self.experiment_id,
            commit,
            self.previous,
            state_tags,
            self.number,
            self.opened,
            self.cell_runs,
        )

    def rollup(self):
        """The Tune callback that rolls this launch's cells up into their cell runs and the study run
        (records.rollup_callback); `.update()` rolls every cell up at once."""
        objective = self.study.spec.objective
        return rollup_callback(
            self.uri,
            self.experiment_id,
            self.study_run_id,
            self.cell_runs,
            list(self.study.cells),
            column=objective.column,
            mode=objective.mode,
        )

    def record_tune_state(self, experiment_dir: str) -> None:
        """The digests of Tune's state under `experiment_dir` on the study run, for `resume` to check."""
        identity.record_tune_state(self.client, self.study_run_id, experiment_dir)

    def log_study_metric(self, key: str, value: float) -> None:
        retry_locked(self.client.log_metric, self.study_run_id, key, value)

    def set_study_tag(self, key: str, value: str) -> None:
        retry_locked(self.client.set_tag, self.study_run_id, key, value)

    @property
    def started_at(self) -> float:
        """When this call made the launch (time.time()): before Ray's start, which a study's wall includes."""
        return self._since_ms / 1000

    def mark_interrupted(self, since: float, reason: str = None) -> None:
        mark_interrupted(self.client, self.experiment_id, self.cell_runs, since, reason or INTERRUPTED_REASON)

    def close_interrupted(self, searcher, since: float) -> None:
        """After Ctrl-C (or SIGTERM): the Optuna trials cut short are failed and marked for `resume` to continue them
        under new trials with the same values; their MLflow runs say `interrupted`."""
        searcher.fail_unfinished(interrupted=True)
        self.mark_interrupted(since)

    def drop_lost_trials(self, known: set[str]) -> None:
        """Soft-delete the runs of trials that the interrupted driver started but never snapshotted.

        Tune cannot resume a trial it has no record of; the searcher issues a new trial in its place. The lost
        one's run is deleted from the active record (restorable with `mlflow runs restore`), so MLflow keeps
        exactly one run per trial of the study.
        """
        client = self.client
        for run in client.search_runs([self.experiment_id], filter_string=kind_filter("trial"), max_results=10_000):
            if launch_of(run) == self.number and run.data.tags.get(TRIAL_ID_TAG) not in known:
                retry_locked(client.set_tag, run.info.run_id, STATUS_TAG, "lost")
                if run.info.status == "RUNNING":
                    retry_locked(client.set_terminated, run.info.run_id, status="KILLED")
                retry_locked(client.delete_run, run.info.run_id)

    def closing_steps(
        self, *, status: str, interrupted: str | None, interrupted_at: float | None, failed: bool
    ) -> list[Callable[[], Any]]:
        """The steps, in order, that end this call's part of the launch (each to be run whatever the others do): no
        trial run left RUNNING (close_dangling, `interrupted` its reason), those the interrupt cut at `interrupted_at`
        marked so, every cell rolled up once more, each run this call opened ended with `status`; then, when the call
        failed before opening any run of a new launch, the launch claim given back (`release`); last, the driver
        claim given back."""
        steps: list[Callable[[], Any]] = []
        if self.opened:
            client, experiment_id, cell_runs = self.client, self.experiment_id, self.cell_runs
            steps.append(lambda: close_dangling(client, experiment_id, cell_runs, interrupted=interrupted))
            if self.changed_commit is not None:
                steps.append(self._tag_resumed_trials)
            if interrupted_at is not None:
                steps.append(lambda: self.mark_interrupted(interrupted_at))
            # Every cell once more: the trials closed just above, and a resumed run's earlier ones.
            steps.append(lambda: self.rollup().update())
            # A cell run ends when its last trial did (its duration its own); the study run ends now.
            cell_ids = set(cell_runs.values())
            steps += [
                lambda rid=rid: retry_locked(
                    client.set_terminated,
                    rid,
                    status=status,
                    end_time=cell_end_time(client, experiment_id, rid) if rid in cell_ids else None,
                )
                for rid in self.opened
            ]
        elif failed and self.previous is None:
            # Stopped before any run (Ray could not start, say): the launch this call claimed, and the experiment
            # it made, hold nothing; left behind, the claim would refuse the next `run` as a concurrent one.
            steps.append(self.release)
        if self.driving:
            steps.append(self.release_driver)
        return steps

    def release(self) -> None:
        """Undo what `run` recorded before its first run: its launch claim, and the experiment when this call made it
        and nothing else came to use it (no run, no later launch claimed by a run started beside it)."""
        client, name = self.client, self.experiment_name
        identity.release_launch(client, name, self.number)
        # A restored experiment had runs of its own before it was deleted: deleted again whatever it holds.
        if (
            self.new_experiment
            and (self.restored or not client.search_runs([self.experiment_id], max_results=1))
            and client.get_experiment_by_name(identity.claim_name(name, self.number + 1)) is None
        ):
            client.delete_experiment(self.experiment_id)

    def release_driver(self) -> None:
        if self.driving:
            retry_locked(identity.release_driver, self.client, self.experiment_name, self.number, self._token)
            self.driving = False


def close_all(steps: list, primary: BaseException | None) -> None:
    """Run every closing step even when some fail or a stop interrupts one (studies.runner's `_stops_deferred`); a
    failure is a note on the error that ended the study (which stays the one cause reported), or raised itself when
    the study had ended without error. A step a stop cut short is skipped, not a failure of the study's records."""
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


INTERRUPTED_REASON = (
    "the study was interrupted (Ctrl-C or SIGTERM) while this trial ran; `sharpscale resume` continues it"
)


def experiment(client, name: str, artifact_location: Path, tracking_uri: str) -> str:
    """The id of the experiment `name`: found (restored if deleted), or made, its artifacts in the server's own store
    over HTTP, else under `artifact_location`."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    if tracking_uri.startswith(("http://", "https://")):
        # The server's own artifact store (mlflow-artifacts:/): every node uploads over HTTP, none needs a shared disk.
        return client.create_experiment(name)
    artifact_location.mkdir(parents=True, exist_ok=True)
    return client.create_experiment(name, artifact_location=artifact_location.resolve().as_uri())


def choose_launch(client, experiment_id: str, study: LoadedStudy, exp_name: str, uri: str, *, new_launch: bool) -> int:
    """The launch a new run of the study starts, claimed in the store (studies.identity.claim_launch): 1, or the next
    one when asked for; refused when that would mix runs, or when a run started at the same moment claimed it."""
    earlier = client.search_runs([experiment_id], filter_string=kind_filter("study"), max_results=10_000)
    newest = max((launch_of(r) for r in earlier), default=0)
    if earlier and not new_launch:
        trials = len(client.search_runs([experiment_id], filter_string=kind_filter("trial"), max_results=10_000))
        holder = identity.driver_holder(client, exp_name, newest)
        driven = f" Its driver, {holder}, runs it now." if holder is not None and not holder.gone() else ""
        raise StudyError(
            study.path,
            [
                f"run: MLflow experiment {exp_name!r} at {uri} already holds launch {newest} of this study ({trials} trial "
                f"run(s)); a second run would mix its trials with those.{driven} Fix: `{shell_command('sharpscale', 'resume', study.path)}` to continue "
                f"it, `{shell_command('sharpscale', 'run', '--new-launch', study.path)}` to start launch {newest + 1} (status, report and "
                f"load_runs show the newest launch; load_runs(..., launch='all') shows every one), or set "
                f"tracking.experiment to a new name."
            ],
        )
    artifacts = None if uri.startswith(("http://", "https://")) else _artifact_uri(study)
    for launch in range(newest + 1, newest + 1 + (100 if new_launch else 1)):
        try:
            identity.claim_launch(client, exp_name, launch, artifacts)
            return launch
        except identity.LaunchTaken:
            continue
    raise StudyError(
        study.path,
        [
            f"run: launch {newest + 1} of MLflow experiment {exp_name!r} at {uri} was claimed by another `sharpscale "
            f"run` of this study started at the same moment (or its runs were deleted since); two runs never share "
            f"a launch. Fix: let that run go on (`{shell_command('sharpscale', 'status', study.path)}`; `sharpscale resume` if it was "
            f"interrupted), or start one of your own with `{shell_command('sharpscale', 'run', '--new-launch', study.path)}`."
        ],
    )


def _artifact_uri(study: LoadedStudy) -> str:
    return Path(study.spec.tracking.artifact_location).resolve().as_uri()


def parent_runs(
    client,
    study: LoadedStudy,
    experiment_id: str,
    commit: str,
    run,
    state_tags: dict[str, str],
    launch: int,
    opened: list[str],
    cell_runs: dict[str, str],
) -> str:
    """The study's run and one run per cell (into `cell_runs`); on resume (`run`: the study run found) they are
    reopened, never duplicated. state_tags: where the study keeps its state (studies.runner.StateLocations.tags).
    Each run id goes into `opened` as soon as it is RUNNING, for the caller to close."""
    resume = run is not None
    if run is None:
        run = client.create_run(
            experiment_id,
            run_name=study_run_name(study.spec.name, launch),
            tags={
                **study_tags(study),
                LAUNCH_TAG: str(launch),
                GIT_COMMIT_TAG: commit,
                STUDY_FILE_TAG: str(study.path),
                NOTE_TAG: study.spec.description,
                **source_tags(study, commit),
                **state_tags,
            },
        )
        opened.append(run.info.run_id)
        client.log_artifact(run.info.run_id, str(study.path))
        if study.overrides:
            client.log_dict(run.info.run_id, {"overrides": study.overrides, "smoke": study.smoke}, "overrides.yaml")
    else:
        for key, value in state_tags.items():
            client.set_tag(run.info.run_id, key, value)
        client.update_run(run.info.run_id, status="RUNNING")
        opened.append(run.info.run_id)
    study_run_id = run.info.run_id
    for cell in study.cells:
        tags = {KIND_TAG: "cell", CELL_TAG: cell.key, PARENT_RUN_TAG: study_run_id}
        existing = find_run(client, experiment_id, tags) if resume else None
        if existing is None:
            existing = client.create_run(
                experiment_id,
                run_name=cell_label(cell),
                tags={
                    **tags,
                    STUDY_FILE_HASH_TAG: study.file_hash,
                    LAUNCH_TAG: str(launch),
                    **source_tags(study, commit),
                    **{factor_tag(k): v for k, v in cell.levels.items()},
                },
            )
            # Closed by the caller from here on: a stop while its params are written must not leave it RUNNING.
            opened.append(existing.info.run_id)
            cell_runs[cell.key] = existing.info.run_id
            _log_params(client, existing.info.run_id, cell_params(cell))
        else:
            client.update_run(existing.info.run_id, status="RUNNING")
            opened.append(existing.info.run_id)
            cell_runs[cell.key] = existing.info.run_id
    return study_run_id


def _log_params(client, run_id: str, params: dict[str, str]) -> None:
    from mlflow.entities import Param

    retry_locked(client.log_batch, run_id, params=[Param(k, v) for k, v in params.items()])


def close_dangling(client, experiment_id: str, cell_runs: dict[str, str], *, interrupted: str | None) -> None:
    """No trial run may stay RUNNING: one Ray stopped (ASHA) or killed never reached its own `finish`.

    After a normal end (`interrupted` None) such a trial was stopped early on purpose; otherwise `interrupted` is
    the reason the study stopped (studies.runner.interruption_reason), and `resume` reopens the trial.
    """
    for run in client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=10_000):
        if run.data.tags.get(PARENT_RUN_TAG) not in cell_runs.values():
            continue
        # A trial whose actor Ray reclaimed right after its last epoch did finish: its record says so.
        epochs = int(run.data.params.get("schedule.epochs", 0))
        # Validation may skip epochs (train.eval_every): the metric of every epoch says which ran.
        logged = {m.step for m in client.get_metric_history(run.info.run_id, EVERY_EPOCH_METRIC)}
        if epochs and logged >= set(range(epochs)):
            status, mlflow_status = "finished", "FINISHED"
        else:
            status, mlflow_status = ("interrupted" if interrupted else "early_stopped"), "KILLED"
        retry_locked(client.set_tag, run.info.run_id, STATUS_TAG, status)
        if status == "interrupted":
            retry_locked(client.set_tag, run.info.run_id, REASON_TAG, interrupted)
        retry_locked(client.set_terminated, run.info.run_id, status=mlflow_status)


def mark_interrupted(
    client, experiment_id: str, cell_runs: dict[str, str], since: float, reason: str = INTERRUPTED_REASON
) -> None:
    """Trials that Tune stopped because of the interrupt end as `early_stopped` or `failed` in their own record:
    say `interrupted` instead, so that nothing cut short by Ctrl-C looks stopped on purpose."""
    since_ms = int(since * 1000)
    for run in client.search_runs([experiment_id], filter_string=kind_filter("trial"), max_results=10_000):
        if run.data.tags.get(PARENT_RUN_TAG) not in cell_runs.values():
            continue
        ended = run.info.end_time
        if run.data.tags.get(REASON_TAG, "").startswith(NO_SPACE_REASON):
            continue  # it ended itself on the full disk: Tune holds it ended, and `resume` does not run it again
        if run.data.tags.get(STATUS_TAG) in ("early_stopped", "failed", "killed") and (
            ended is None or ended >= since_ms
        ):
            retry_locked(client.set_tag, run.info.run_id, STATUS_TAG, "interrupted")
            # Its own reason named what stopped it as seen from the trial (Tune's stop): say why Tune stopped it.
            retry_locked(client.set_tag, run.info.run_id, REASON_TAG, reason)
            if run.info.status == "RUNNING":
                retry_locked(client.set_terminated, run.info.run_id, status="KILLED")


def resume_target(study: LoadedStudy, uri: str, *, explicit: bool):
    """(uri, client, experiment id, study run) of the launch `resume` continues (studies.identity.resume_target).

    A relative sqlite:/// tracking URI taken from the study file means a different store in each directory; when
    the store here holds no launch of the study and the launch record in its Ray storage names an existing SQLite
    store, that is the one the study ran into: resume uses it, and says so.
    """
    from trainables.tracking import sqlite_path

    recorded = identity.find_recorded_store(study, study.storage)
    other = recorded.get("tracking_uri") if recorded else None
    if not explicit and other and other != uri and not _holds_study(uri, study):
        db = sqlite_path(other)
        if db is not None and db.is_file():
            print(
                f"sharpscale: resume: the study's tracking.uri {study.spec.tracking.uri} is relative to the directory "
                f"a command runs in; launch {recorded.get('launch')} was recorded at {other}: resuming it there.",
                flush=True,
            )
            uri = other
    hint = (
        f" Its launch {recorded.get('launch')} was recorded at {other}. Fix: "
        f"`{shell_command('sharpscale', 'resume', study.path, '--tracking-uri', other)}`, or run the command from the directory the study was started in."
        if other and other != uri
        else ""
    )
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        identity.resume_target(None, None, study, uri, hint)  # refuses: nothing to resume in a store never made
    client = tracking_client(uri)
    exp = client.get_experiment_by_name(study.experiment_name)
    experiment_id = exp.experiment_id if exp is not None and exp.lifecycle_stage == "active" else None
    previous = identity.resume_target(client, experiment_id, study, uri, hint)
    return uri, client, experiment_id, previous


def _holds_study(uri: str, study: LoadedStudy) -> bool:
    """Whether the MLflow store at `uri` exists and holds a study run of the study's experiment."""
    from trainables.tracking import sqlite_path

    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        return False
    client = tracking_client(uri)
    exp = client.get_experiment_by_name(study.experiment_name)
    return exp is not None and bool(
        client.search_runs([exp.experiment_id], filter_string=kind_filter("study"), max_results=1)
    )
