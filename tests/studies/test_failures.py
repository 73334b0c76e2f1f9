"""Studies survive failures on real Ray, Optuna and SQLite MLflow: a diverging trial, a driver killed with SIGKILL."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from analysis import load_runs
from studies.runner import run_study
from studies.server import group_alive

REPO = Path(__file__).resolve().parents[2]


def _study(tmp_path, name, factors, search, epochs=2, trials=2, concurrent=2):
    study = {
        "name": name,
        "base": {
            "data": {"name": "digits", "img_size": 16, "batch_size": 128},
            "optimizer": {"method": "sam", "lr": 0.003},
            "schedule": {"epochs": epochs, "warmup_epochs": 0},
            "train": {"device": "cpu", "threads": 1, "divergence_check_every": 1},
        },
        "factors": factors,
        "search": search,
        "budget": {"trials_per_cell": trials, "seed": 1},
        "resources": {"cpus_per_trial": 1, "max_concurrent_trials": concurrent},
        "tracking": {"artifact_location": str(tmp_path / "mlartifacts")},
        "storage": str(tmp_path / "runs"),
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def _optuna_states(tmp_path, name):
    storage = f"sqlite:///{tmp_path / 'runs' / f'{name}.optuna.db'}"
    states = {}
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        states[summary.study_name] = [t.state.name for t in study.trials]
    return states


@pytest.mark.timeout(600)
def test_diverging_trials_are_recorded_and_failed_in_optuna(ray_cluster, tmp_path, tracking_uri, tiny_model):
    path = _study(
        tmp_path,
        "nan",
        factors={"arch": {"mixer": tiny_model("mixer", dotted=True)}, "lr": {"ok": {"optimizer.lr": 0.003}, "explode": {"optimizer.lr": 1e12}}},
        search={"rho": {"type": "loguniform", "low": 0.01, "high": 0.1}},
    )
    outcome = run_study(path, tracking_uri=tracking_uri)
    assert outcome.trials == 4

    runs = load_runs("nan", tracking_uri=tracking_uri).set_index("factor.lr")
    assert list(runs.loc["explode", "status"]) == ["diverged", "diverged"]
    assert list(runs.loc["explode", "mlflow_status"]) == ["FAILED", "FAILED"]
    assert list(runs.loc["ok", "status"]) == ["finished", "finished"]  # the study went on
    client = MlflowClient(tracking_uri)
    reason = client.get_run(runs.loc["explode", "run_id"].iloc[0]).data.tags["sharpscale.reason"]
    assert "training loss became" in reason

    states = _optuna_states(tmp_path, "nan")
    assert states["nan:arch=mixer,lr=explode"] == ["FAIL", "FAIL"]
    assert states["nan:arch=mixer,lr=ok"] == ["COMPLETE", "COMPLETE"]


def _finished_and_running(tracking_uri, name, *, finished):
    """The study's trial runs when at least `finished` of them finished and one is running, else None."""
    try:
        runs = load_runs(name, tracking_uri=tracking_uri)
    except LookupError:
        return None
    if runs.empty or (runs["status"] == "finished").sum() < finished or not (runs["status"] == "running").any():
        return None
    return runs


@pytest.mark.timeout(900)
def test_resume_after_sigkill_of_the_driver(tmp_path, tracking_uri, tiny_model):
    path = _study(
        tmp_path,
        "killme",
        factors={"arch": {"mixer": tiny_model("mixer", dotted=True)}, "method": {"sam": {"optimizer.method": "sam"}, "asam": {"optimizer.method": "asam"}}},
        search={"rho": {"type": "loguniform", "low": 0.01, "high": 1.0}},
        epochs=4,
        trials=3,
    )
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true"}
    cmd = [sys.executable, "-m", "studies.cli"]
    driver = subprocess.Popen(
        [*cmd, "run", str(path), "--tracking-uri", tracking_uri, "--num-cpus", "2"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        # Kill on an observed state, not after a guessed delay: two trials finished and another one mid-run, as
        # the record read just before the kill says (a second read would let trials move on in between).
        deadline = time.time() + 400
        before = None
        while before is None and time.time() < deadline:
            assert driver.poll() is None, "the study ended before it could be killed"
            before = _finished_and_running(tracking_uri, "killme", finished=2)
            time.sleep(0.2)
        assert before is not None, "no state with two trials finished and one running within 400 s"
        os.kill(driver.pid, signal.SIGKILL)
        done_before = before[before["status"] == "finished"]
        driver.wait(timeout=30)
    finally:
        # The driver's own local Ray cluster lives in its process group: take it down as a kill -9 leaves it.
        try:
            os.killpg(driver.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # Resume starts once every process of the killed cluster is gone (a raylet or worker dies a moment later).
    deadline = time.time() + 60
    while group_alive(driver.pid):
        assert time.time() < deadline, "the killed study's processes outlived SIGKILL by a minute"
        time.sleep(0.1)

    resumed = subprocess.run(
        [*cmd, "resume", str(path), "--tracking-uri", tracking_uri, "--num-cpus", "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, start_new_session=True,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]

    after = load_runs("killme", tracking_uri=tracking_uri)
    assert len(after) == 6, after[["trial_id", "status"]]          # exactly one run per trial
    assert after["trial_id"].is_unique
    assert set(after["status"]) == {"finished"}
    assert set(after["mlflow_status"]) == {"FINISHED"}
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("killme")
    assert all(r.info.status != "RUNNING" for r in client.search_runs([exp.experiment_id], max_results=1000))
    kinds = [r.data.tags.get("sharpscale.kind") for r in client.search_runs([exp.experiment_id], max_results=1000)]
    assert kinds.count("study") == 1 and kinds.count("cell") == 2
    # Finished trials were not run again: same runs, one value per epoch.
    for run_id in done_before["run_id"]:
        history = client.get_metric_history(run_id, "val_acc")
        assert sorted(m.step for m in history) == [0, 1, 2, 3]
    for run_id in after["run_id"]:
        assert sorted(m.step for m in client.get_metric_history(run_id, "val_acc")) == [0, 1, 2, 3]
    # Optuna: one COMPLETE trial per Tune trial; one that the killed driver had asked for but never started
    # is FAIL, none is left RUNNING.
    states = [s for trials in _optuna_states(tmp_path, "killme").values() for s in trials]
    assert states.count("COMPLETE") == 6 and "RUNNING" not in states, states
