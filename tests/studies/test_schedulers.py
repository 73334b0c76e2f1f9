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
        }
        study = {
            "name": name,
            "base": base,
            **fields,
            "tracking": {"artifact_location": str(tmp_path / "mlartifacts")},
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
