"""A study whose trials are data-parallel: each trial drives a Ray Train group of 2 DDP workers inside Tune."""

import pytest
from mlflow.tracking import MlflowClient

from analysis import load_runs
from studies.runner import run_study


@pytest.mark.timeout(600)
def test_two_worker_trials_are_recorded_once(ray_cluster, tmp_path, tracking_uri, tiny_study):
    path = tiny_study(
        tmp_path,
        "ddp",
        # 2 workers x 0.5 CPU leave room on the 2-CPU test cluster for the trial's own driver (0.01 CPU).
        resources={"cpus_per_trial": 0.5, "workers_per_trial": 2, "max_concurrent_trials": 1},
    )
    outcome = run_study(path, tracking_uri=tracking_uri)
    assert outcome.trials == 2 and outcome.errored == 0

    runs = load_runs("ddp", tracking_uri=tracking_uri)
    assert len(runs) == 2 and set(runs["status"]) == {"finished"}
    assert runs["trial_id"].is_unique
    client = MlflowClient(tracking_uri)
    for run_id in runs["run_id"]:
        assert sorted(m.step for m in client.get_metric_history(run_id, "val_acc")) == [0, 1]
