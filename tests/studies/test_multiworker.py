"""A study whose trials are data-parallel: each trial drives a Ray Train group of 2 DDP workers inside Tune."""

import pytest
import yaml
from mlflow.tracking import MlflowClient

from analysis import load_runs
from studies.runner import run_study


@pytest.mark.timeout(600)
def test_two_worker_trials_are_recorded_once(ray_cluster, tmp_path, tracking_uri, tiny_model):
    study = {
        "name": "ddp",
        "base": {
            "model": tiny_model("mixer"),
            "data": {"name": "digits", "img_size": 16, "batch_size": 128},
            "optimizer": {"method": "sam"},
            "schedule": {"epochs": 2, "warmup_epochs": 0},
            "train": {"device": "cpu", "threads": 1},
        },
        "search": {"rho": {"type": "loguniform", "low": 0.01, "high": 0.1}},
        "budget": {"trials_per_cell": 2},
        # 2 workers x 0.5 CPU leave room on the 2-CPU test cluster for the trial's own driver (0.01 CPU).
        "resources": {"cpus_per_trial": 0.5, "workers_per_trial": 2, "max_concurrent_trials": 1},
        "tracking": {"artifact_location": str(tmp_path / "mlartifacts")},
        "storage": str(tmp_path / "runs"),
    }
    path = tmp_path / "ddp.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    outcome = run_study(path, tracking_uri=tracking_uri)
    assert outcome.trials == 2 and outcome.errored == 0

    runs = load_runs("ddp", tracking_uri=tracking_uri)
    assert len(runs) == 2 and set(runs["status"]) == {"finished"}
    assert runs["trial_id"].is_unique
    client = MlflowClient(tracking_uri)
    for run_id in runs["run_id"]:
        assert sorted(m.step for m in client.get_metric_history(run_id, "val_acc")) == [0, 1]
