"""Samplers and early stopping on real Ray Tune + Optuna: the grid visits every point once; ASHA stops trials cleanly."""

import pytest
import yaml
from mlflow.tracking import MlflowClient

from analysis import load_runs
from studies.runner import run_study


@pytest.fixture
def write(tmp_path, tiny_model):
    def make(name, **fields):
        base = {
            "model": tiny_model("mixer"),
            "data": {"name": "digits", "img_size": 16, "batch_size": 128},
            "optimizer": {"method": "sam"},
            "train": {"device": "cpu", "threads": 1},
            "schedule": fields.pop("schedule"),
            **fields.pop("base", {}),
        }
        study = {
            "name": name,
            "base": base,
            **fields,
            "tracking": {"artifact_location": str(tmp_path / "mlartifacts"), **fields.pop("tracking", {})},
            "storage": str(tmp_path / "runs"),
        }
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(study, sort_keys=False))
        return path

    return make


@pytest.mark.timeout(600)
def test_grid_sampler_visits_each_point_once(ray_cluster, tmp_path, tracking_uri, write):
    path = write(
        "grid",
        schedule={"epochs": 1, "warmup_epochs": 0},
        search={"rho": {"type": "choice", "values": [0.01, 0.05, 0.2]}},
        budget={"sampler": "grid"},
    )
    outcome = run_study(path, tracking_uri=tracking_uri)
    assert outcome.trials == 3  # trials_per_cell follows the grid
    runs = load_runs("grid", tracking_uri=tracking_uri)
    assert sorted(runs["optimizer.hparams.rho"]) == [0.01, 0.05, 0.2]


@pytest.mark.timeout(600)
def test_asha_stops_poor_trials_and_leaves_nothing_running(ray_cluster, tmp_path, tracking_uri, write):
    epochs = 4
    path = write(
        "asha",
        schedule={"epochs": epochs, "warmup_epochs": 0},
        search={"optimizer.lr": {"type": "loguniform", "low": 1e-5, "high": 1e-2}},
        budget={"trials_per_cell": 6, "asha": {"grace_period": 1, "reduction_factor": 2}, "seed": 3},
        resources={"max_concurrent_trials": 1},  # one at a time: every later trial meets a full rung
    )
    outcome = run_study(path, tracking_uri=tracking_uri)
    assert outcome.trials == 6 and outcome.errored == 0
    runs = load_runs("asha", tracking_uri=tracking_uri)
    assert set(runs["status"]) <= {"finished", "early_stopped"}
    assert set(runs["mlflow_status"]) <= {"FINISHED", "KILLED"}
    stopped = runs[runs["status"] == "early_stopped"]
    assert len(stopped) >= 1, runs[["optimizer.lr", "val_acc", "status"]]
    client = MlflowClient(tracking_uri)
    for run_id in stopped["run_id"]:
        assert len(client.get_metric_history(run_id, "val_acc")) < epochs
    for run_id in runs.loc[runs["status"] == "finished", "run_id"]:
        assert len(client.get_metric_history(run_id, "val_acc")) == epochs


def test_asha_never_stops_a_result_the_trial_marks_as_its_last_epoch():
    from types import SimpleNamespace

    from ray.tune.schedulers import ASHAScheduler, TrialScheduler

    from studies.tuning import FinishingASHA
    from trainables.tracking import LAST_EPOCH_RESULT_KEY

    def decisions(scheduler_cls, epochs: int, marked: bool = True) -> list[str]:
        # max_t 4 (the study's longest cell), rungs at 1, 2 and 4; a poorer second trial of `epochs` epochs
        scheduler = scheduler_cls(
            time_attr="training_iteration", metric="val_acc", mode="max", grace_period=1, reduction_factor=2, max_t=4
        )
        good, poor = SimpleNamespace(trial_id="good"), SimpleNamespace(trial_id="poor")
        scheduler.on_trial_add(None, good)
        scheduler.on_trial_add(None, poor)
        out = []
        for t in range(1, epochs + 1):
            scheduler.on_trial_result(None, good, {"training_iteration": t, "val_acc": 0.9})
            last = {LAST_EPOCH_RESULT_KEY: float(t == epochs)} if marked else {}
            out.append(scheduler.on_trial_result(None, poor, {"training_iteration": t, "val_acc": 0.1, **last}))
        return out

    stop, go = TrialScheduler.STOP, TrialScheduler.CONTINUE
    # Ray's ASHA stops a last epoch at max_t, and at a rung that falls on a shorter cell's last epoch
    assert decisions(ASHAScheduler, epochs=4) == [stop, stop, go, stop]
    assert decisions(ASHAScheduler, epochs=2) == [stop, stop]
    # this one lets only the last epoch through; its rungs are ASHA's
    assert decisions(FinishingASHA, epochs=4) == [stop, stop, go, go]
    assert decisions(FinishingASHA, epochs=2) == [stop, go]
    assert decisions(FinishingASHA, epochs=4, marked=False) == [stop, stop, go, stop]


def _record_slowly(seconds: float, epochs: dict[str, int]):
    """The real trial, the MLflow record of epoch `epochs[cell]` (written after that epoch's report) taking `seconds`
    longer: what a busy tracking server or a large checkpoint upload does. A trial Tune stops at that report lost
    it, and the end of its run, to Tune ending its actor."""
    from trainables.ray_train import tune_trainable

    def trial(payload):
        import time

        from trainables.ray_train import run_tune_trial
        from trainables.tracking import TrialRecorder

        slow_epoch = epochs[payload["cell"]]
        log_epoch = TrialRecorder.log_epoch

        def slow(self, metrics, epoch, *args, **kwargs):
            if epoch == slow_epoch:
                time.sleep(seconds)
            return log_epoch(self, metrics, epoch, *args, **kwargs)

        TrialRecorder.log_epoch = slow  # in this trial's actor process only
        try:
            run_tune_trial(payload)
        finally:
            TrialRecorder.log_epoch = log_epoch

    return tune_trainable(trial)  # the real trainable class (its stop and reuse) around the function above


@pytest.mark.timeout(600)
def test_a_trial_asha_stops_writes_everything_it_owes_first(ray_cluster, tmp_path, tracking_uri, write):
    """Tune stops a trial by ending its actor right after the report it stops it at, while the trial still writes
    that epoch's record (its geometry too), its final checkpoint and its run's end. Ray's ASHA stopped every trial
    at its last epoch (max_t) and a finished trial was closed as early_stopped; one stopped mid-run lost the epoch
    it was stopped at, and its reason."""
    from analysis.geometry.names import METRIC_PREFIX
    from trainables.metrics import TRIAL_TIME
    from trainables.naming import CHECKPOINT_ARTIFACT, REASON_TAG, STATUS_TAG

    path = write(
        "owed",
        schedule={"epochs": 3, "warmup_epochs": 0},
        base={
            "data": {"name": "digits", "img_size": 16, "batch_size": 32},
            "geometry": {"measures": ["lambda_max"], "batches": 1, "batch_size": 32, "max_iter": 3},
        },
        # One at a time, good first: at the rung after epoch 0 the untrained one falls below it and is stopped.
        factors={"lr": {"good": {"optimizer.lr": 0.01}, "untrained": {"optimizer.lr": 1e-12}}},
        budget={"trials_per_cell": 1, "seed": 0, "asha": {"grace_period": 1, "reduction_factor": 2}},
        resources={"max_concurrent_trials": 1},
        tracking={"log_checkpoint": True},
    )
    trainable = _record_slowly(5.0, {"lr=good": 2, "lr=untrained": 0})
    outcome = run_study(path, tracking_uri=tracking_uri, trainable=trainable)
    assert (outcome.trials, outcome.errored) == (2, 0)
    runs = load_runs("owed", tracking_uri=tracking_uri).set_index("factor.lr")
    client = MlflowClient(tracking_uri)

    good = client.get_run(runs.loc["good", "run_id"])
    assert (good.data.tags[STATUS_TAG], good.info.status) == ("finished", "FINISHED")
    assert [m.step for m in client.get_metric_history(good.info.run_id, "train_loss")] == [0, 1, 2]
    assert [m.step for m in client.get_metric_history(good.info.run_id, f"{METRIC_PREFIX}lambda_max")] == [2]
    assert TRIAL_TIME in good.data.metrics  # written by the trial's own end, not by the driver's clean-up
    assert [a.path for a in client.list_artifacts(good.info.run_id)].count(CHECKPOINT_ARTIFACT) == 1

    stopped = client.get_run(runs.loc["untrained", "run_id"])
    assert (stopped.data.tags[STATUS_TAG], stopped.info.status) == ("early_stopped", "KILLED")
    assert [m.step for m in client.get_metric_history(stopped.info.run_id, "train_loss")] == [0]
    assert stopped.data.tags[REASON_TAG].startswith("stopped by Ray Tune after epoch 0")
    assert TRIAL_TIME in stopped.data.metrics
