"""A study's trials on Ray Tune: its searcher, scheduler, stopper and trial resources, one `fit` under the study's
signals, and what the trials' results add up to (StudyOutcome); the runs it writes to are its Launch's."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.tune.schedulers import ASHAScheduler, TrialScheduler
from ray.tune.stopper import Stopper

from analysis.geometry.names import probe_plan
from studies.busy import BUSY_METRIC, GpuBusySampler
from studies.confirm import confirm_config
from studies.cost import local_gpus, record_estimate
from studies.launch import close_all
from studies.locations import log_file, no_space_error, study_places
from studies.progress import LiveView
from studies.records import source_tags, trial_params
from studies.search import NO_SPACE, CellSearcher, apply_sample, note_no_space
from studies.spec import Cell, LoadedStudy
from trainables.metrics import EPOCH_TIME, VALIDATION_METRICS
from trainables.naming import (
    CELL_TAG,
    CHOSEN_FROM_TAG,
    CONFIRM_STAGE,
    GIT_COMMIT_TAG,
    LAUNCH_TAG,
    PARAMS_KEY,
    PLACES_KEY,
    SEARCH_STAGE,
    STAGE_TAG,
    STUDY_FILE_HASH_TAG,
    STUDY_TAG,
    factor_tag,
)
from trainables.ray_train import DistributedPlan
from trainables.tracking import (
    BEST_EPOCH_METRICS,
    LAST_EPOCH_RESULT_KEY,
    NO_SPACE_RESULT_KEY,
    REFUSED_RESULT_KEY,
    TrackingTarget,
)

if TYPE_CHECKING:
    from studies.launch import Launch
    from studies.locations import StateLocations

__all__ = [
    "TRAINING_SHARE_METRICS",
    "FinishingASHA",
    "NoSpaceStopper",
    "StudyOutcome",
    "StudyTune",
    "objective_has_gaps",
    "training_share",
]


class StudyTune:
    """The trials of one call of run_study on Tune, in named steps: the searcher, live view and roll-ups (`__init__`),
    the Tuner, new or restored (`_tuner`), its `fit` under the study's signals (`_fit`), a full disk's stop
    (`_stop_on_full_disk`), the Optuna trials left open closed (`_close_open_trials`), the outcome counted and
    recorded (`_outcome`). The runs it writes to are closed by run_study, whatever happens here."""

    def __init__(
        self,
        study: LoadedStudy,
        target: Launch,
        locations: StateLocations,
        plan: DistributedPlan,
        run_name: str,
        commit: str,
        *,
        restore: bool,
    ):
        self.study, self.target, self.locations, self.plan = study, target, locations, plan
        self.run_name, self.commit, self.restore = run_name, commit, restore
        self.experiment_dir = f"{locations.storage}/{run_name}"
        self._logged_params = trial_params(study)
        spec = study.spec
        self.searcher = CellSearcher(
            list(study.cells),
            metric=spec.objective.column,
            mode=spec.objective.mode,
            sampler=spec.budget.sampler,
            seed=spec.budget.seed,
            storage_url=locations.optuna_storage,
            study_name=run_name,
            payload=self.payload,
            confirm_seeds={c.key: spec.confirm.seed_list[: c.confirm] for c in study.cells} if spec.confirm else None,
            owner=target.study_run_id,
        )
        self.progress = LiveView(study, title=f"{spec.name} ({target.experiment_name})", run_name=run_name)
        self.rollup = target.rollup()

    def payload(self, cell: Cell, sample: dict[str, Any], confirm: tuple[int, str | None] | None = None) -> dict:
        """What one trial is handed (CellSearcher asks it of each trial it starts). confirm: (seed, chosen run name)
        of a confirm trial (studies.confirm), None for a search trial."""
        study, spec, target = self.study, self.study.spec, self.target
        stage = {STAGE_TAG: SEARCH_STAGE}
        if confirm is not None:
            stage = {STAGE_TAG: CONFIRM_STAGE, **({CHOSEN_FROM_TAG: confirm[1]} if confirm[1] else {})}
        trial = (
            apply_sample(cell.config, sample)
            if confirm is None
            else confirm_config(cell, sample, confirm[0], spec.confirm.subsets)
        )
        return {
            "study": self.run_name,
            # The in-trial probe, as a plan of this trial's own geometry section (None where it names no measures).
            "probe": probe_plan(trial),
            "plan": asdict(self.plan),
            "log_checkpoint": spec.tracking.log_checkpoint,
            "cell": cell.key,
            "trial": trial,
            "sample": sample,
            PARAMS_KEY: self._logged_params,
            "objective": {"metric": spec.objective.column, "mode": spec.objective.mode},
            "tracking": TrackingTarget(target.uri, target.experiment_id, target.cell_runs[cell.key]).__dict__,
            # Where a full disk is the study's (trainables.errors.no_space_at): it stops the study, not just the trial.
            PLACES_KEY: [path for path, _ in study_places(study, self.locations, target.uri)],
            "tags": {
                CELL_TAG: cell.key,
                STUDY_FILE_HASH_TAG: study.file_hash,
                LAUNCH_TAG: str(target.number),
                GIT_COMMIT_TAG: self.commit,
                STUDY_TAG: spec.name,
                **source_tags(study, self.commit),
                **{factor_tag(k): v for k, v in cell.levels.items()},
                **stage,
            },
        }

    def run(self, trainable: Any = None) -> StudyOutcome:
        """Every trial of the study through one Tuner; trainable: as run_study's (None: the real one)."""
        import ray

        tuner = self._tuner(trainable)
        # tuner.pkl is written now: recorded at once, so that only a launch killed hard between here and the end of
        # `fit` leaves Tune state that `resume` will not read (identity.check_tune_state).
        self.target.record_tune_state(self.experiment_dir)
        cluster = ray.cluster_resources()
        busy = _busy_sampler(self.plan, cluster)
        t0 = time.perf_counter()
        self._say_where()
        NO_SPACE.pop(self.run_name, None)  # a full disk met by an earlier run of this name in this process
        results, gpu_busy = self._fit(tuner, busy)
        if self.run_name in NO_SPACE:
            raise self._stop_on_full_disk()
        interrupted = self._close_open_trials(results)
        return self._outcome(results, time.perf_counter() - t0, cluster, gpu_busy, interrupted=interrupted)

    def _tuner(self, trainable: Any):
        import ray
        from ray import tune

        from trainables.ray_train import tune_trainable

        study, spec, plan = self.study, self.study.spec, self.plan
        trainable = tune.with_resources(trainable or tune_trainable(), _trial_resources(plan))
        if self.restore:
            # Finished trials stay finished; interrupted and errored ones continue from their checkpoints.
            return tune.Tuner.restore(
                self.experiment_dir, trainable=trainable, resume_unfinished=True, resume_errored=True
            )
        return tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                metric=spec.objective.column,
                mode=spec.objective.mode,
                search_alg=self.searcher,
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
                name=self.run_name,
                storage_path=self.locations.storage,
                failure_config=tune.FailureConfig(max_failures=spec.resources.max_failures),
                # Tune snapshots its state (blocking on the upload) after any trial writes `keep` checkpoints,
                # and otherwise on its own adaptive period: `keep` and train.checkpoint_every set the rate.
                checkpoint_config=tune.CheckpointConfig(num_to_keep=spec.checkpoints.keep),
                stop=NoSpaceStopper(self.run_name),
                callbacks=[self.progress.callback, self.rollup],
                verbose=0,
            ),
        )

    def _say_where(self) -> None:
        study, spec, target, locations = self.study, self.study.spec, self.target, self.locations
        print(
            f"sharpscale: study {spec.name!r}: {len(study.cells)} cells, {study.total_trials} trials, "
            f"MLflow experiment {target.experiment_name!r} at {target.uri}; Ray storage {locations.storage}, Optuna "
            f"{locations.optuna_storage}; Ray's, Tune's and Optuna's logs in {log_file(study, locations, self.run_name)}",
            flush=True,
        )

    def _fit(self, tuner, busy: GpuBusySampler | None):
        """tuner.fit() with SIGTERM taken as Ctrl-C; returns its results and the GPUs' busy share (None: not
        sampled). A second Ctrl-C still closes as interrupted what the first one stopped."""
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
            with _objective_gaps_allowed(self.study):
                results = tuner.fit()
        except KeyboardInterrupt as err:
            # A second Ctrl-C: Tune gives up waiting for its trials. What the first one stopped is still recorded so.
            if self.progress.interrupted_at is not None:
                close_all([lambda: self.target.close_interrupted(self.searcher, self.progress.interrupted_at)], err)
            raise
        finally:
            gpu_busy = busy.stop() if busy is not None else None
            if main_thread:
                signal.signal(signal.SIGINT, before)  # Tune leaves its handler (and ours) installed
                signal.signal(signal.SIGTERM, before_term)
            # Tune's state as fit left it (its last snapshot is taken before fit returns): what `resume` may read back.
            with contextlib.suppress(Exception):  # a store that cannot record it (a full disk): resume then refuses
                self.target.record_tune_state(self.experiment_dir)
        return results, gpu_busy

    def _stop_on_full_disk(self) -> BaseException:
        """The stopper stopped every trial: each is resumable, as after Ctrl-C, and its run says what stopped it.
        Returns the error that names the full disk."""
        since = NO_SPACE[self.run_name][0]
        reason = (
            "the study stopped on a full disk while this trial ran; `sharpscale resume` continues it once there is "
            "space again"
        )
        closing = RuntimeError("closing after a full disk")  # holds the notes of closing steps that failed
        close_all(
            [
                lambda: self.searcher.fail_unfinished(interrupted=True),  # notes in NO_SPACE what it could not record
                lambda: self.target.mark_interrupted(since, reason),
            ],
            closing,
        )
        err = no_space_error(self.study, self.locations, self.target.uri, NO_SPACE.pop(self.run_name)[1])
        for note in getattr(closing, "__notes__", []):
            err.add_note(note)
        return err

    def _close_open_trials(self, results) -> bool:
        """The Optuna trials fit left open, closed as what ended them says; returns whether a stop interrupted it."""
        interrupted = self.progress.interrupted_at is not None
        if interrupted:
            self.target.close_interrupted(self.searcher, self.progress.interrupted_at)
        else:
            # Every trial has ended: an Optuna trial still RUNNING will never be told (Tune stopped it at the time
            # limit, or, resumed, its Tune trial had ended before a full disk let its end be recorded).
            self.searcher.fail_unfinished(interrupted=False)
        if self.restore:
            self.target.drop_lost_trials({Path(r.path).name for r in results})
        return interrupted

    def _outcome(
        self, results, wall: float, cluster: dict[str, float], gpu_busy: float | None, *, interrupted: bool
    ) -> StudyOutcome:
        """The trials counted, the study run's cost metrics recorded, and both said."""
        target = self.target
        trials = len(results)
        refused = sum(1 for r in results if r.error is None and (r.metrics or {}).get(REFUSED_RESULT_KEY))
        errored = sum(1 for r in results if r.error is not None) + refused
        reported = sum(1 for r in results if (r.metrics or {}).get("training_iteration"))
        if unconfirmed := self.searcher.unconfirmed():
            print(
                f"sharpscale: no confirm runs for {len(unconfirmed)} cell(s) whose every search trial failed: "
                f"{unconfirmed}"
            )
        share = training_share([_epoch_seconds(r) for r in results], self.plan, wall, cluster)
        if share is not None:
            target.log_study_metric(share[0], share[1])
        if gpu_busy is not None:
            target.log_study_metric(BUSY_METRIC, gpu_busy)
        since_launch = time.time() - target.started_at
        print(record_estimate(target, self.study, since_launch, cluster, partial=interrupted or self.restore))
        print(
            f"sharpscale: {trials} trials in {wall:.0f} s ({errored} errored"
            + (f", {refused} of them refused by their settings, not retried" if refused else "")
            + ")"
            + (", INTERRUPTED" if interrupted else "")
        )
        return StudyOutcome(
            target.experiment_id,
            target.study_run_id,
            target.uri,
            trials,
            errored,
            interrupted=interrupted,
            reported=reported,
            interrupted_at=self.progress.interrupted_at,
            refused=refused,
            training_share=share,
            gpu_busy=gpu_busy,
        )


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
