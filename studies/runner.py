"""Running a study: MLflow parent runs, a Ray cluster (local or given), Tune + Optuna over every cell, a summary."""

from __future__ import annotations

import math
import os
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from studies.preflight import check_data_on_nodes
from studies.spec import Cell, LoadedStudy, StudyError, load_study
from studies.search import CellSearcher, apply_sample
from trainables.ray_train import DistributedPlan
from trainables.tracking import KIND_TAG, STATUS_TAG, TrackingTarget, _retry, resolve_tracking_uri, tracking_client

__all__ = ["StudyOutcome", "resolve_tracking_uri", "run_study"]

STUDY_FILE_HASH_TAG = "sharpscale.study_file_hash"
CELL_TAG = "sharpscale.cell"


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
    errored: int


class _Progress:
    """One line per finished trial: counts and the best objective so far in its cell."""

    def __init__(self, study: LoadedStudy):
        from ray.tune import Callback

        outer = self
        self.total = study.total_trials
        self.metric, self.mode = study.spec.objective.metric, study.spec.objective.mode
        self.best: dict[str, float] = {}
        self.done = self.failed = 0

        class _Cb(Callback):
            def on_trial_complete(self, iteration, trials, trial, **info):
                outer._finished(trial, trials, ok=True)

            def on_trial_error(self, iteration, trials, trial, **info):
                outer._finished(trial, trials, ok=False)

        self.callback = _Cb()

    def _finished(self, trial, trials, ok: bool) -> None:
        cell = trial.config.get("cell", "")
        result = trial.last_result or {}
        value = result.get(self.metric)
        diverged = bool(result.get("diverged"))
        if ok and not diverged and isinstance(value, (int, float)) and math.isfinite(value):
            self.done += 1
            prev = self.best.get(cell)
            better = prev is None or (value > prev if self.mode == "max" else value < prev)
            if better:
                self.best[cell] = value
            status = f"{self.metric}={value:.4f}"
        else:
            self.failed += 1
            status = "diverged" if diverged else "failed"
        running = sum(1 for t in trials if t.status == "RUNNING")
        best = self.best.get(cell)
        best_txt = f"{best:.4f}" if best is not None else "-"
        print(
            f"[{self.done + self.failed}/{self.total}] done {self.done}, failed {self.failed}, running {running} | "
            f"{cell or 'study'}: {status} (best {best_txt})",
            flush=True,  # to sys.stdout as it is then: Tune pickles its callbacks, a stream can't be pickled
        )


def _experiment(client, name: str, artifact_location: Path, tracking_uri: str) -> str:
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


def _is_uri(path: str) -> bool:
    return "://" in path


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


def _find_run(client, experiment_id: str, tags: dict[str, str]):
    clause = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    runs = client.search_runs([experiment_id], filter_string=clause, max_results=1)
    return runs[0] if runs else None


def _parent_runs(client, study: LoadedStudy, experiment_id: str, commit: str, resume: bool) -> tuple[str, dict[str, str]]:
    """The study's run and one run per cell; on resume the existing ones are reopened, never duplicated."""
    study_tags = {KIND_TAG: "study", STUDY_FILE_HASH_TAG: study.file_hash}
    run = _find_run(client, experiment_id, study_tags) if resume else None
    if run is None:
        run = client.create_run(
            experiment_id,
            run_name=study.spec.name,
            tags={**study_tags, "sharpscale.git_commit": commit, "sharpscale.study_file": str(study.path),
                  "mlflow.note.content": study.spec.description},
        )
        client.log_artifact(run.info.run_id, str(study.path))
        if study.overrides:
            client.log_dict(run.info.run_id, {"overrides": study.overrides, "smoke": study.smoke}, "overrides.yaml")
    else:
        client.update_run(run.info.run_id, status="RUNNING")
    study_run_id = run.info.run_id
    cell_runs = {}
    for cell in study.cells:
        tags = {KIND_TAG: "cell", CELL_TAG: cell.key, "mlflow.parentRunId": study_run_id}
        existing = _find_run(client, experiment_id, {KIND_TAG: "cell", CELL_TAG: cell.key, "mlflow.parentRunId": study_run_id}) if resume else None
        if existing is None:
            existing = client.create_run(
                experiment_id,
                run_name=cell.key or "all",
                tags={**tags, STUDY_FILE_HASH_TAG: study.file_hash, **{f"factor.{k}": v for k, v in cell.levels.items()}},
            )
        else:
            client.update_run(existing.info.run_id, status="RUNNING")
        cell_runs[cell.key] = existing.info.run_id
    return study_run_id, cell_runs


def _close_dangling(client, experiment_id: str, cell_runs: dict[str, str], *, interrupted: bool) -> None:
    """No trial run may stay RUNNING: one Ray stopped (ASHA) or killed never reached its own `finish`.

    After a normal end such a trial was stopped early on purpose; after an interruption `resume` reopens it.
    """
    for run in client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=10_000):
        if run.data.tags.get("mlflow.parentRunId") not in cell_runs.values():
            continue
        # A trial whose actor Ray reclaimed right after its last epoch did finish: its record says so.
        epochs = int(run.data.params.get("schedule.epochs", 0))
        logged = {m.step for m in client.get_metric_history(run.info.run_id, "val_loss")}
        if epochs and logged >= set(range(epochs)):
            status, mlflow_status = "finished", "FINISHED"
        else:
            status, mlflow_status = ("killed" if interrupted else "early_stopped"), "KILLED"
        _retry(client.set_tag, run.info.run_id, STATUS_TAG, status)
        _retry(client.set_terminated, run.info.run_id, status=mlflow_status)


def _drop_lost_trials(client, experiment_id: str, known: set[str]) -> None:
    """Soft-delete the runs of trials that the interrupted driver started but never snapshotted.

    Tune cannot resume a trial it has no record of; the searcher issues a new trial in its place. The lost
    one's run is deleted from the active record (restorable with `mlflow runs restore`), so MLflow keeps
    exactly one run per trial of the study.
    """
    for run in client.search_runs([experiment_id], filter_string=f"tags.`{KIND_TAG}` = 'trial'", max_results=10_000):
        if run.data.tags.get("sharpscale.trial_id") not in known:
            _retry(client.set_tag, run.info.run_id, STATUS_TAG, "lost")
            if run.info.status == "RUNNING":
                _retry(client.set_terminated, run.info.run_id, status="KILLED")
            _retry(client.delete_run, run.info.run_id)


def _trial_resources(plan: DistributedPlan):
    if plan.workers > 1:
        # The trial itself only drives a Ray Train group, which books its own workers' resources; Tune
        # refuses an empty request, so the driver holds 1% of a CPU.
        return {"cpu": 0.01}
    return {"cpu": plan.cpus_per_worker, "gpu": plan.gpus_per_worker, **plan.custom}


def _scheduler(study: LoadedStudy):
    asha = study.spec.budget.asha
    if asha is None:
        return None
    from ray.tune.schedulers import ASHAScheduler

    from trainables.config import TrialConfig

    # One result per epoch, so ASHA's rungs are epochs.
    epochs = max(TrialConfig.load(c.config).schedule.epochs for c in study.cells)
    return ASHAScheduler(
        time_attr="training_iteration",
        grace_period=min(asha.grace_period, epochs),
        reduction_factor=asha.reduction_factor,
        max_t=epochs,
    )


def _init_ray(address: str | None, num_cpus: int | None):
    import ray

    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        # The dashboard is not optional: Train inside Tune needs it to free a stopped trial's workers.
        ray.init(num_cpus=num_cpus, include_dashboard=True, log_to_driver=False, configure_logging=False)
    return True


def run_study(
    path: str | Path,
    *,
    address: str | None = None,
    tracking_uri: str | None = None,
    smoke: bool = False,
    resume: bool = False,
    num_cpus: int | None = None,
    overrides: dict[str, Any] | None = None,
    trainable: Any = None,
) -> StudyOutcome:
    """Validate the study file, run all of its trials on Ray Tune, record them in MLflow.

    resume: continue the interrupted run of the same file (and the same overrides) instead of starting anew.
    overrides: dotted trial-config paths set for every cell (the CLI's --set).
    trainable: the Tune trainable each trial runs, given the payload dict built below; None: the real one
    (`trainables.ray_train.tune_trainable()`). benchmarks/sim_scale.py passes a stand-in without torch.
    """
    study = load_study(path, smoke=smoke, overrides=overrides)
    spec = study.spec
    uri = resolve_tracking_uri(tracking_uri or spec.tracking.uri)
    client = tracking_client(uri)
    exp_name = (spec.tracking.experiment or spec.name) + ("-smoke" if smoke else "")
    _warn_split_records(address, uri)
    experiment_id = _experiment(client, exp_name, Path(spec.tracking.artifact_location), uri)
    commit = git_commit(study.path.parent)
    study_run_id, cell_runs = _parent_runs(client, study, experiment_id, commit, resume)

    run_name = exp_name
    # Ray's results may live on shared storage (s3://, gs://, an NFS path); Optuna's SQLite file stays on the
    # driver's own disk, beside the local results or under ./sharpscale_runs when the results are remote.
    if _is_uri(spec.storage):
        storage_path = spec.storage.rstrip("/")
        local_dir = Path("sharpscale_runs").resolve()
    else:
        local_dir = Path(spec.storage).expanduser().resolve()
        storage_path = str(local_dir)
    local_dir.mkdir(parents=True, exist_ok=True)
    optuna_db = local_dir / f"{run_name}.optuna.db"

    res = study.resources
    plan = DistributedPlan(
        workers=res.workers_per_trial,
        cpus_per_worker=res.cpus_per_trial,
        gpus_per_worker=res.gpus_per_trial,
        custom=dict(res.custom),
        max_failures=res.max_failures,
        storage_path=f"{storage_path}/{run_name}/train",
    )

    def payload(cell: Cell, sample: dict[str, Any]) -> dict[str, Any]:
        return {
            "study": run_name,
            "plan": asdict(plan),
            "log_checkpoint": spec.tracking.log_checkpoint,
            "cell": cell.key,
            "trial": apply_sample(cell.config, sample),
            "sample": sample,
            "objective": {"metric": spec.objective.metric, "mode": spec.objective.mode},
            "tracking": TrackingTarget(uri, experiment_id, cell_runs[cell.key]).__dict__,
            "tags": {
                CELL_TAG: cell.key,
                STUDY_FILE_HASH_TAG: study.file_hash,
                "sharpscale.git_commit": commit,
                "sharpscale.study": spec.name,
                **{f"factor.{k}": v for k, v in cell.levels.items()},
            },
        }

    # Every epoch checkpoints, so Tune snapshots its state often; that is intended, not a bottleneck to warn of.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # A trial that starts after Tune's last snapshot is unknown to `resume`: snapshot often to keep that window small.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "2")
    started_ray = _init_ray(address, num_cpus)
    status, errored, trials = "FAILED", 0, 0
    try:
        check_data_on_nodes(study)  # before any trial: a node that cannot read the data fails the study here
        from ray import tune

        from trainables.ray_train import tune_trainable

        searcher = CellSearcher(
            list(study.cells),
            metric=spec.objective.metric,
            mode=spec.objective.mode,
            sampler=spec.budget.sampler,
            seed=spec.budget.seed,
            storage_url=f"sqlite:///{optuna_db}",
            study_name=run_name,
            payload=payload,
        )
        progress = _Progress(study)
        trainable = tune.with_resources(trainable or tune_trainable(), _trial_resources(plan))
        experiment_dir = f"{storage_path}/{run_name}"
        if resume:
            if not tune.Tuner.can_restore(experiment_dir):
                raise StudyError(study.path, [
                    f"resume: no interrupted run of this study under {experiment_dir}. "
                    f"Fix: start it with `sharpscale run`, or check the study's `storage` directory."
                ])
            # Finished trials stay finished; interrupted and errored ones continue from their checkpoints.
            tuner = tune.Tuner.restore(experiment_dir, trainable=trainable, resume_unfinished=True, resume_errored=True)
        else:
            tuner = tune.Tuner(
                trainable,
                tune_config=tune.TuneConfig(
                    metric=spec.objective.metric,
                    mode=spec.objective.mode,
                    search_alg=searcher,
                    scheduler=_scheduler(study),
                    num_samples=study.total_trials,
                    max_concurrent_trials=spec.resources.max_concurrent_trials,
                    time_budget_s=spec.budget.time_limit_s,
                    # A fresh worker per trial would re-import torch, timm and MLflow each time (seconds each).
                    reuse_actors=True,
                    trial_name_creator=lambda t: f"{t.trial_id}",
                    trial_dirname_creator=lambda t: f"{t.trial_id}",
                ),
                run_config=tune.RunConfig(
                    name=run_name,
                    storage_path=storage_path,
                    failure_config=tune.FailureConfig(max_failures=spec.resources.max_failures),
                    checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                    callbacks=[progress.callback],
                    verbose=0,
                ),
            )
        t0 = time.perf_counter()
        print(
            f"sharpscale: study {spec.name!r}: {len(study.cells)} cells, {study.total_trials} trials, "
            f"MLflow experiment {exp_name!r} at {uri}",
            flush=True,
        )
        results = tuner.fit()
        if resume:
            _drop_lost_trials(client, experiment_id, {Path(r.path).name for r in results})
        trials = len(results)
        errored = sum(1 for r in results if r.error is not None)
        print(f"sharpscale: {trials} trials in {time.perf_counter() - t0:.0f} s ({errored} errored)")
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        _close_dangling(client, experiment_id, cell_runs, interrupted=status != "FINISHED")
        for rid in [study_run_id, *cell_runs.values()]:
            _retry(client.set_terminated, rid, status=status)
        if started_ray:
            import ray

            ray.shutdown()
    return StudyOutcome(experiment_id, study_run_id, uri, trials, errored)
