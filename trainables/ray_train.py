"""The thin Ray layer around `trainables.fit`: a Tune function trainable, and Ray Train for data-parallel trials."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trainables.config import ConfigError, TrialConfig
from trainables.errors import TrialRefused, no_space_at
from trainables.metrics import EPOCH_TIME, FIXED_PHASES, FIXED_TIME, TRIAL_TIME, fixed_phase_metric
from trainables.naming import (
    CONFIG_ARTIFACT,
    GPUS_PER_WORKER_PARAM,
    PARAMS_KEY,
    PLACES_KEY,
    RAY_NODE_ID_TAG,
    TRIAL_ID_TAG,
    WORKERS_PARAM,
    tag,
)
from trainables.tracking import (
    LAST_EPOCH_RESULT_KEY,
    NO_SPACE_REASON,
    NO_SPACE_RESULT_KEY,
    REFUSED_RESULT_KEY,
    RUN_ID_RESULT_KEY,
    TrackingTarget,
    TrialRecorder,
    config_tags,
)

__all__ = [
    "KEEP_CHECKPOINTS",
    "DistributedPlan",
    "check_device",
    "fit_distributed",
    "load_probe",
    "run_tune_trial",
    "train_worker_loop",
    "tune_trainable",
]

logger = logging.getLogger(__name__)

# Trial threads of this process inside a report, and, once Tune's stop woke one there (SystemExit), until the trial
# has written what it owes: that epoch's record, its run's end. SharpscaleTrial.cleanup waits for them.
_REPORTING: set[threading.Thread] = set()
# The longest a stop waits for such a thread (seconds): a record, a checkpoint upload, a run's end. Tune's own limit
# applies on top: at the end of a study it kills an actor whose stop took over 10 s.
OWED_RECORD_WAIT_S = 120.0

# Checkpoints kept per trial. Two: Tune's snapshot of its own state may lag one checkpoint behind (it is forced
# only every `num_to_keep` checkpoints), and the one it names must still exist when a killed driver resumes.
KEEP_CHECKPOINTS = 2


@dataclass(frozen=True)
class DistributedPlan:
    """How a trial runs: in the trial's own process (workers=1), or as a Ray Train group of DDP workers."""

    workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    custom: dict[str, float] = field(default_factory=dict)  # custom Ray resources per worker
    max_failures: int = 2  # worker deaths survived per trial, each resumed from the last checkpoint
    storage_path: str | None = None  # Ray Train's checkpoints (shared storage on a cluster)
    keep_checkpoints: int = KEEP_CHECKPOINTS


def _tags(extra: dict[str, str]) -> dict[str, str]:
    from trainables.loop import describe_hardware

    tags = {tag(k): v for k, v in describe_hardware().items()}
    try:
        import ray

        if ray.is_initialized():
            # Several Ray nodes can share one host name; the node id tells them apart.
            tags[RAY_NODE_ID_TAG] = ray.get_runtime_context().get_node_id()
    except ImportError:
        pass
    return {**tags, **extra}


def _recorder(payload: dict[str, Any], trial_id: str, run_name: str, cfg: TrialConfig) -> TrialRecorder | None:
    if not payload.get("tracking"):
        return None
    plan = DistributedPlan(**payload.get("plan", {}))
    resources = {WORKERS_PARAM: plan.workers, GPUS_PER_WORKER_PARAM: plan.gpus_per_worker}
    flat = cfg.flat()
    # Params: what the study varies and what names the trial (the payload's list), so that MLflow's params table
    # and compare page show the knobs, not 60 constants; the whole config goes to tags and an artifact.
    wanted = payload.get(PARAMS_KEY)
    params = flat if wanted is None else {k: v for k, v in flat.items() if k in set(wanted)}
    recorder = TrialRecorder(
        TrackingTarget(**payload["tracking"]),
        trial_key=trial_id,
        run_name=run_name,
        params={**params, **resources},
        wants_checkpoint=bool(payload.get("log_checkpoint")),
    )
    config = config_tags(flat) if wanted is not None else {}
    recorder.set_tags(_tags({TRIAL_ID_TAG: trial_id, **payload.get("tags", {}), **config}))
    if wanted is not None:
        recorder.log_text(json.dumps(flat, indent=1, default=str), CONFIG_ARTIFACT)
    recorder.log_dataset(cfg.data.model_dump(mode="json"))  # MLflow keeps one record of a dataset logged again
    return recorder


class _TimedRecorder:
    """The trial's recorder as fit sees it, its calls' seconds added to the trial's `record` phase."""

    def __init__(self, recorder: TrialRecorder, timings: dict[str, float]):
        self._recorder, self._timings = recorder, timings
        self.wants_checkpoint = recorder.wants_checkpoint

    def _timed(self, call, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            self._timings["record"] = self._timings.get("record", 0.0) + time.perf_counter() - t0

    def log_epoch(self, *args, **kwargs) -> None:
        self._timed(self._recorder.log_epoch, *args, **kwargs)

    def log_artifact(self, *args, **kwargs) -> None:
        self._timed(self._recorder.log_artifact, *args, **kwargs)

    def log_scored(self, text: str) -> None:
        self._timed(self._recorder.log_scored, text)


def _opened_recorder(
    payload: dict[str, Any], trial_id: str, run_name: str, cfg: TrialConfig, started: float, timings: dict[str, float]
) -> TrialRecorder | None:
    """`_recorder`, with the trial's `start` (its function's start to here) and `record_open` phases timed."""
    t0 = time.perf_counter()
    timings["start"] = t0 - started
    recorder = _recorder(payload, trial_id, run_name, cfg)
    timings["record_open"] = time.perf_counter() - t0
    return recorder


def check_device(cfg: TrialConfig) -> None:
    """Refuse `train.device: auto` falling back to CPU when Ray gave this trial GPUs that torch cannot see.

    Ray advertises a node's GPUs even where the container has no access to them (docker run without
    `--gpus all`, a missing NVIDIA container toolkit); `auto` would then train on the CPU without a word.
    """
    try:
        import ray
    except ImportError:
        return
    import torch

    if cfg.train.device != "auto" or not ray.is_initialized():
        return
    given = ray.get_gpu_ids()
    if given and not torch.cuda.is_available():
        raise RuntimeError(
            f"train.device: 'auto' must use the GPU(s) Ray assigned to this trial (ray.get_gpu_ids() = {given}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}), but torch sees none "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}), so it would train on the CPU. Fix: give "
            f"the container the GPUs (docker run --gpus all, the NVIDIA container toolkit on the node; "
            f"ray_cluster.yaml's run_options) and a CUDA build of torch; or, to train on CPU on purpose, set "
            f"train.device: cpu and resources.gpus_per_trial: 0."
        )


def load_probe(payload: dict[str, Any], cfg: TrialConfig):
    """The geometry probe of a trial, built from the plan the layer above put in its payload (key 'probe': an object
    with the ``geometry`` settings it measures with and ``build()``, analysis.geometry.ProbePlan), once those
    settings are found to be the trial config's own geometry section; None when the config asks for no geometry.
    The caller (studies) builds the plan, so that trainables never imports analysis."""
    if not cfg.geometry.enabled:
        return None
    plan = payload.get("probe")
    if plan is None:
        raise ValueError(
            f"geometry.measures: {cfg.geometry.measures} asked for, but the trial's payload holds no probe plan "
            "(key 'probe'). Fix: run it through `sharpscale run`, or set payload['probe'] to "
            "analysis.geometry.probe_plan(config)."
        )
    settings = getattr(plan, "geometry", None)
    if settings != cfg.geometry or not callable(getattr(plan, "build", None)):
        shown = settings.model_dump() if hasattr(settings, "model_dump") else repr(plan)
        raise ValueError(
            f"payload['probe']: must be the probe plan of this trial's geometry section "
            f"{cfg.geometry.model_dump()}, got one of {shown}. Fix: build it from the trial's own config, "
            "analysis.geometry.probe_plan(config)."
        )
    return plan.build()


@dataclass
class _Attempt:
    """One run of a trial function: what it reports to Ray (the epochs' training seconds they carried) and how it
    ends its record, so that none stays RUNNING."""

    cfg: TrialConfig
    sink: Callable
    checkpoint_cls: Any
    recorder: TrialRecorder | None
    started: float
    timings: dict[str, float]
    trained: dict[int, float] = field(default_factory=dict)  # epoch -> its training seconds (a re-report counts once)

    @property
    def run_id(self) -> str | None:
        return self.recorder.run_id if self.recorder is not None else None

    def report(self, metrics: dict[str, float], checkpoint_dir: Path | None) -> None:
        if EPOCH_TIME in metrics and "epoch" in metrics:
            self.trained[int(metrics["epoch"])] = float(metrics[EPOCH_TIME])
        ckpt = self.checkpoint_cls.from_directory(str(checkpoint_dir)) if checkpoint_dir else None
        t0 = time.perf_counter()
        # fit records an epoch after reporting it (trainables.loop, "Checkpoint, then report, then record"), and
        # Tune gives a trial it stops no time to finish that: the last epoch says so, and is never stopped.
        last = float("epoch" in metrics and int(metrics["epoch"]) == self.cfg.schedule.epochs - 1)
        _REPORTING.add(threading.current_thread())
        # Left registered when Tune stops the trial here (SystemExit): it still records this epoch and ends its run.
        try:  # Tune copies the checkpoint to the study's storage inside this call
            self.sink(
                {"diverged": 0, **metrics, LAST_EPOCH_RESULT_KEY: last, RUN_ID_RESULT_KEY: self.run_id}, checkpoint=ckpt
            )
        finally:
            self.timings["report"] = self.timings.get("report", 0.0) + time.perf_counter() - t0
        _REPORTING.discard(threading.current_thread())

    def finish(self, status: str, reason: str | None = None) -> None:
        try:
            if self.recorder is None:
                return
            wall = time.perf_counter() - self.started
            fixed = wall - sum(self.trained.values())
            parts = {p: self.timings.get(p, 0.0) for p in FIXED_PHASES if p != "other"}
            parts["other"] = fixed - sum(parts.values())
            with contextlib.suppress(Exception):  # the times are a note on the record: never what fails the trial
                self.recorder.log_summary(
                    {TRIAL_TIME: wall, FIXED_TIME: fixed, **{fixed_phase_metric(p): v for p, v in parts.items()}}
                )
            self.recorder.finish(status, reason)
        finally:
            _REPORTING.discard(threading.current_thread())  # its run has ended: it owes nothing more

    def fit(self, fit: Callable, checkpoint, *, report_resumed: bool, probe_from: dict[str, Any] | None) -> None:
        """fit() from the checkpoint (None: from the start), with the geometry probe its payload plans."""
        timed = _TimedRecorder(self.recorder, self.timings) if self.recorder is not None else None
        check_device(self.cfg)
        t_probe = time.perf_counter()
        probe = load_probe(probe_from or {}, self.cfg)  # builds analysis' probe (torch), where the trial measures any
        self.timings["imports"] += time.perf_counter() - t_probe
        if checkpoint is None:
            fit(self.cfg, reporter=self.report, recorder=timed, probe=probe, timings=self.timings)
            return
        with checkpoint.as_directory() as ckpt_dir:
            fit(
                self.cfg,
                resume_from=ckpt_dir,
                reporter=self.report,
                recorder=timed,
                report_resumed=report_resumed,
                probe=probe,
                timings=self.timings,
            )

    def failed(self, err: BaseException, metric: str, probe_from: dict[str, Any] | None) -> bool:
        """Record a failure that is not a stop, a divergence or a refusal; whether it is raised again for Ray to
        retry the trial from its checkpoint (False: a full disk, the trial ended here with a result saying so)."""
        # The study's disks (the payload's places) and the temp folder where fit keeps its checkpoint before Tune
        # copies it: full there, the study stops; full elsewhere (/dev/shm), the trial fails as any error.
        places = [*(probe_from or {}).get(PLACES_KEY, []), tempfile.gettempdir()]
        if (full := no_space_at(err, places)) is not None:
            # A full disk (its checkpoint, its record): each of Tune's retries would meet the same disk, and print
            # the same trace. The trial ends here, once; the runner stops the study on this result.
            with contextlib.suppress(Exception):  # the full disk may be the store's: the runner says so
                self.finish("failed", f"{NO_SPACE_REASON} ({full})")
            self.report({metric: math.nan, NO_SPACE_RESULT_KEY: full}, None)
            return False
        # Ray retries the trial from its checkpoint; the retry reopens this same run.
        self.finish("failed", "".join(traceback.format_exception(err))[-4000:])
        return True


def _execute(
    cfg: TrialConfig,
    *,
    checkpoint,
    sink: Callable,
    checkpoint_cls,
    recorder: TrialRecorder | None,
    metric: str,
    report_resumed: bool = False,
    probe_from: dict[str, Any] | None = None,
    started: float | None = None,
    timings: dict[str, float] | None = None,
) -> None:
    """fit() under Tune or Ray Train, with the trial's record kept straight: none stays RUNNING.

    sink/checkpoint_cls: `tune.report`/`tune.Checkpoint` or `ray.train.report`/`ray.train.Checkpoint`;
    checkpoint: the one to resume from, or None; report_resumed: see `fit`; probe_from: the payload that holds
    the geometry probe's plan (`load_probe`; its "compile_cache" key, which launches before issue 36 wrote, is never
    read: the cache is node-local, trainables.compiled.use_cache_dir); started: `time.perf_counter()` when the trial
    function began, from which its TRIAL_TIME and FIXED_TIME are recorded at its end (default: now), FIXED_TIME's
    parts beside it (trainables.metrics.FIXED_PHASES); timings: the parts timed before this call (start,
    record_open).
    """
    timings = {} if timings is None else timings
    t_imports = time.perf_counter()
    from trainables.compiled import release
    from trainables.loop import TrialDiverged, TrialStopped, fit

    timings["imports"] = timings.get("imports", 0.0) + time.perf_counter() - t_imports
    started = time.perf_counter() if started is None else started
    attempt = _Attempt(cfg, sink, checkpoint_cls, recorder, started, timings)
    try:
        attempt.fit(fit, checkpoint, report_resumed=report_resumed, probe_from=probe_from)
    except TrialStopped as stop:
        if stop.final:  # stopped after its last epoch (an interrupt, the time limit): it ran to its end
            attempt.finish("finished")
        else:
            attempt.finish("early_stopped", str(stop))
        # Tune's function runner expects its stop to come back as SystemExit; a plain return breaks actor reuse.
        raise SystemExit(0) from None
    except TrialDiverged as err:
        attempt.finish("diverged", str(err))
        # A last result so the searcher learns of it: the objective is nan, never a number to optimise.
        attempt.report({metric: math.nan, "diverged": 1, "epoch": err.epoch}, None)
        return
    except TrialRefused as err:
        # Raised, it would be retried max_failures times, each attempt refused the same way. Tune has no public
        # per-error retry switch, so the trial ends here, once, with a result that says why (runner and searcher
        # count it as failed).
        attempt.finish("failed", f"refused: {err}")
        attempt.report({metric: math.nan, REFUSED_RESULT_KEY: 1}, None)
        return
    except BaseException as err:
        if attempt.failed(err, metric, probe_from):
            raise
        return
    else:
        attempt.finish("finished")
    finally:
        release()  # on the trial's own thread, after its record, however it ended: trainables.compiled.release


def node_config(
    payload: dict[str, Any], trial_id: str, run_name: str, sink: Callable, *, record: bool = True
) -> TrialConfig | None:
    """The trial's config, loaded again on the node that runs it; None when the node refuses it (a file it names,
    e.g. model.kwargs.checkpoint_path, changed after the study validated it). A refused config is a TrialRefused:
    raised, Tune would retry it max_failures times with no record, so the trial is recorded failed here, once
    (a bare MLflow run: there is no config to log), and ends with a refused result that runner and searcher count.
    record: whether this process keeps the record (rank 0 of a distributed trial)."""
    try:
        return TrialConfig.load(payload["trial"])
    except ConfigError as err:
        refused = TrialRefused(f"the trial's config was refused on the node that runs it:\n{err}")
    run_id = None
    if record and payload.get("tracking"):
        recorder = TrialRecorder(
            TrackingTarget(**payload["tracking"]), trial_key=trial_id, run_name=run_name, params={}
        )
        recorder.set_tags(_tags({TRIAL_ID_TAG: trial_id, **payload.get("tags", {})}))
        recorder.finish("failed", f"refused: {refused}")
        run_id = recorder.run_id
    metric = payload.get("objective", {}).get("metric", "val_acc")
    sink({"diverged": 0, metric: math.nan, REFUSED_RESULT_KEY: 1, RUN_ID_RESULT_KEY: run_id}, checkpoint=None)
    return None


def train_worker_loop(payload: dict[str, Any]) -> None:
    """Ray Train's per-worker function: the same loop, one DDP rank; rank 0 records and checkpoints."""
    started = time.perf_counter()
    dump_every_thread_on_fault()
    import ray.train

    ctx = ray.train.get_context()
    trial_id = payload.get("trial_id") or ctx.get_experiment_name()
    run_name = payload.get("run_name") or trial_id
    cfg = node_config(payload, trial_id, run_name, ray.train.report, record=ctx.get_world_rank() == 0)
    if cfg is None:
        return
    timings: dict[str, float] = {}
    recorder = (
        _opened_recorder(payload, trial_id, run_name, cfg, started, timings) if ctx.get_world_rank() == 0 else None
    )
    _execute(
        cfg,
        checkpoint=ray.train.get_checkpoint(),
        sink=ray.train.report,
        checkpoint_cls=ray.train.Checkpoint,
        recorder=recorder,
        metric=payload.get("objective", {}).get("metric", "val_acc"),
        probe_from=payload,
        started=started,
        timings=timings,
    )


def _trainer(payload: dict[str, Any], plan: DistributedPlan, name: str, callbacks: list):
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    return TorchTrainer(
        train_worker_loop,
        train_loop_config=payload,
        torch_config=TorchConfig(backend="nccl" if plan.gpus_per_worker > 0 else "gloo"),
        scaling_config=ray.train.ScalingConfig(
            num_workers=plan.workers,
            use_gpu=plan.gpus_per_worker > 0,
            resources_per_worker={
                "CPU": plan.cpus_per_worker,
                **({"GPU": plan.gpus_per_worker} if plan.gpus_per_worker else {}),
                **plan.custom,
            },
        ),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=plan.storage_path,
            # Finite on both levels: a trial that keeps dying must end, not hold its workers forever.
            failure_config=ray.train.FailureConfig(
                max_failures=plan.max_failures, controller_failure_limit=plan.max_failures
            ),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=plan.keep_checkpoints),
            callbacks=callbacks,
        ),
    )


def fit_distributed(
    config: TrialConfig | dict[str, Any], *, plan: DistributedPlan, name: str, payload: dict[str, Any] | None = None
):
    """Run one trial as a Ray Train job of `plan.workers` DDP workers (Ray must be initialised); returns its Result.

    A run with the same `name` and `plan.storage_path` resumes from its latest checkpoint.
    """
    cfg = TrialConfig.load(config)
    body = {
        **(payload or {}),
        "trial": cfg.model_dump(mode="json"),
        "trial_id": (payload or {}).get("trial_id") or name,
    }
    return _trainer(body, plan, name, callbacks=[]).fit()


# Checkpoint paths that `_restore_point` rebuilt from a newer checkpoint than Tune's record (this actor process).
_REBUILT: set[str] = set()


def _checkpoint_index(name: str) -> int | None:
    match = re.fullmatch(r"checkpoint_(\d+)", name)
    return int(match.group(1)) if match else None


def _restore_point(result):
    """The checkpoint a resumed trial starts from, when Tune's record may name one that no longer exists.

    Tune deletes a trial's older checkpoint as soon as a newer one arrives (num_to_keep), but snapshots its own
    state a moment later; a driver killed in between leaves a snapshot naming a deleted checkpoint, and Tune
    would fail the trial on resume. The newest complete checkpoint of the trial is copied to the recorded
    path and the trial continues from it; the later directories the killed driver left are removed, since
    Tune will number its next checkpoints after the recorded one. Returns None when the trial has no complete
    checkpoint at all: it starts again from its first epoch.
    """
    import posixpath

    import pyarrow.fs as pafs

    from trainables.loop import CHECKPOINT_FILE, load_checkpoint

    checkpoint = result.checkpoint
    fs, path = checkpoint.filesystem, checkpoint.path

    def complete(where: str) -> bool:
        return fs.get_file_info(posixpath.join(where, CHECKPOINT_FILE)).type == pafs.FileType.File

    if complete(path):
        return result
    parent, name = posixpath.split(path)
    recorded = _checkpoint_index(name)
    found = {
        index: info.path
        for info in fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True))
        if info.type == pafs.FileType.Directory
        and (index := _checkpoint_index(info.base_name)) is not None
        and complete(info.path)
    }
    # The recorded directory must exist: Tune deletes it when the trial's next checkpoint arrives.
    fs.create_dir(path)
    if not found:
        logger.warning("sharpscale: trial checkpoint %s is gone and no other exists; the trial starts again", path)
        return None
    newest = found[max(found)]
    pafs.copy_files(newest, path, source_filesystem=fs, destination_filesystem=fs)
    for index, where in found.items():
        if recorded is not None and index > recorded:
            fs.delete_dir(where)
    logger.warning("sharpscale: trial checkpoint %s is gone; continuing from the newer %s", path, newest)
    with type(checkpoint)(path, filesystem=fs).as_directory() as local:
        epoch = load_checkpoint(local)["epoch"]
    _REBUILT.add(path)
    # Tune counts one result per epoch; the checkpoint's epoch is reported again once the trial runs.
    return type(result)(checkpoint=checkpoint, metrics={**result.metrics, "training_iteration": epoch})


# Module functions, not the class's own code: Ray ships the class by value, with copies of the globals it names.
def _owing() -> list[threading.Thread]:
    """The trial threads of this process that a stop now would wake inside their report."""
    return list(_REPORTING)


def _await(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(timeout=OWED_RECORD_WAIT_S)


def tune_trainable(function: Callable[[dict[str, Any]], None] | None = None):
    """`run_tune_trial` (or `function`, which calls it) as a Tune trainable class whose resume survives a checkpoint
    Tune's snapshot outlived, and whose stop waits for what a trial stopped at its report still owes."""
    # Ray's DeveloperAPI wrap_function, and the private _TrainingResult Tune passes to restore: no public hook runs
    # before a function trainable restores. tests/trainables/test_ray_pins.py fails on a Ray that changed either.
    from ray.tune.trainable import wrap_function

    class SharpscaleTrial(wrap_function(function or run_tune_trial)):
        def cleanup(self):
            # Tune stops a trial by waking it inside its report (SystemExit there) and then ends this actor, without
            # waiting for the trial to record that epoch and end its run, which it does next (trainables.loop:
            # report, then record). A trial stopped there (ASHA) is given the time to write what it owes; one
            # stopped mid-epoch (Ctrl-C) is not waited for.
            owing = _owing()
            super().cleanup()
            _await(owing)

        def reset_config(self, new_config):
            # Reusing this actor for the next trial wakes the stopped one as above, then gives it 2 s
            # (TUNE_FUNCTION_THREAD_TIMEOUT_S) to end, or fails the next trial. Wait for what it owes, then reset.
            owing = _owing()
            if super().reset_config(new_config):
                return True
            _await(owing)
            return super().reset_config(new_config)  # the session's reset starts it afresh

        def restore(self, checkpoint_path):
            if hasattr(checkpoint_path, "checkpoint"):
                checkpoint_path = _restore_point(checkpoint_path)
                if checkpoint_path is None:
                    return None
            return super().restore(checkpoint_path)

    return SharpscaleTrial


def dump_every_thread_on_fault() -> None:
    """A fault (SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL) in this process prints the stack of every thread, not only
    the faulting one's, to stderr (a Ray worker's log file), so that a crash tells what the trial's other threads were
    doing at that moment (Ray enables Python's faulthandler for the current thread only)."""
    import faulthandler

    with contextlib.suppress(AttributeError, OSError, ValueError):  # a stderr without a file descriptor: left as is
        faulthandler.enable(file=sys.__stderr__, all_threads=True)


def run_tune_trial(payload: dict[str, Any]) -> None:
    """Tune function trainable: one trial, resumed from its checkpoint when there is one, recorded in MLflow.

    payload: {"trial": trial config dict, "tracking": TrackingTarget fields, "objective": {"metric", "mode"},
    "tags": extra run tags, "plan": DistributedPlan fields, "probe": the geometry probe factory's import path}.
    """
    started = time.perf_counter()
    dump_every_thread_on_fault()
    from ray import tune

    ctx = tune.get_context()
    trial_id = ctx.get_trial_id()
    plan = DistributedPlan(**payload.get("plan", {}))
    payload = {**payload, "trial_id": trial_id, "run_name": payload.get("run_name") or ctx.get_trial_name()}
    if plan.workers > 1:
        from ray.tune.integration.ray_train import TuneReportCallback

        # Ray Train owns the workers and their checkpoints; a restarted trial finds them under the same name.
        _trainer(
            payload, plan, name=f"{payload.get('study', 'trial')}-{trial_id}", callbacks=[TuneReportCallback()]
        ).fit()
        return

    cfg = node_config(payload, trial_id, payload["run_name"], tune.report)
    if cfg is None:
        return
    checkpoint = tune.get_checkpoint()
    rebuilt = checkpoint is not None and checkpoint.path in _REBUILT
    if rebuilt:
        _REBUILT.discard(checkpoint.path)
    timings: dict[str, float] = {}
    _execute(
        cfg,
        checkpoint=checkpoint,
        sink=tune.report,
        checkpoint_cls=tune.Checkpoint,
        recorder=_opened_recorder(payload, trial_id, payload["run_name"], cfg, started, timings),
        metric=payload.get("objective", {}).get("metric", "val_acc"),
        # Tune's record of a rebuilt trial stops before its checkpoint: give it that epoch's result first.
        report_resumed=rebuilt,
        probe_from=payload,
        started=started,
        timings=timings,
    )
