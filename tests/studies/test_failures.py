"""Studies survive failures on real Ray, Optuna and SQLite MLflow: a diverging trial, a driver killed with SIGKILL."""

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from analysis import load_runs
from studies.cli import EXIT_USAGE
from studies.runner import run_study
from studies.server import pids_in_groups

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
        factors={
            "arch": {"mixer": tiny_model("mixer", dotted=True)},
            "lr": {"ok": {"optimizer.lr": 0.003}, "explode": {"optimizer.lr": 1e12}},
        },
        search={"rho": {"type": "loguniform", "low": 0.01, "high": 0.1}},
        # One at a time: a diverged trial ends normally (its result says so), so every trial reuses the first one's
        # Ray actor instead of a second process importing torch and timm beside it.
        concurrent=1,
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


def _finished_and_running(tracking_uri, *, finished):
    """The ids of the finished trial runs when at least `finished` of them finished and one is running, else None.

    Read straight from the store's SQLite file in one query: the test polls it while the study trains on the same
    two cores, and `load_runs` there would take a core away from the trials it waits for.
    """
    db = tracking_uri.removeprefix("sqlite:///")
    query = (
        "select r.run_uuid, r.status, s.value from runs r join tags k on k.run_uuid = r.run_uuid and "
        "k.key = 'sharpscale.kind' and k.value = 'trial' left join tags s on s.run_uuid = r.run_uuid and "
        "s.key = 'sharpscale.status' where r.lifecycle_stage = 'active'"
    )
    try:
        with contextlib.closing(sqlite3.connect(db, timeout=30)) as con:
            rows = con.execute(query).fetchall()
    except sqlite3.OperationalError:
        return None  # the schema or a table is being written
    done = [run_id for run_id, _, status in rows if status == "finished"]
    if len(done) < finished or not any(mlflow_status == "RUNNING" for _, mlflow_status, _ in rows):
        return None
    return done


@pytest.mark.timeout(1200)
def test_resume_after_sigkill_of_the_driver(tmp_path, tracking_uri, tiny_model, cli_process):
    path = _study(
        tmp_path,
        "killme",
        factors={
            "arch": {"mixer": tiny_model("mixer", dotted=True)},
            "method": {"sam": {"optimizer.method": "sam"}, "asam": {"optimizer.method": "asam"}},
        },
        search={"rho": {"type": "loguniform", "low": 0.01, "high": 1.0}},
        epochs=4,
        trials=3,
    )
    common = ("--tracking-uri", tracking_uri, "--num-cpus", "2")
    driver = cli_process.start("run", path, *common, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Kill on an observed state, not after a guessed delay: two trials finished and another one mid-run, as the record
    # read just before the kill says (a second read would let trials move on in between).
    done_before = cli_process.wait_for(
        driver,
        lambda: _finished_and_running(tracking_uri, finished=2),
        timeout=400,
        what="a state with two trials finished and one running",
    )
    os.kill(driver.pid, signal.SIGKILL)  # the driver alone, as `kill -9 PID` does
    driver.wait(timeout=30)
    # What the driver's death leaves of its local Ray cluster (its agents outlive it by a minute or more, issue
    # 13.11): the resume starts beside them at once, and must be neither confused nor stopped by them. They live in
    # the driver's process group, which cli_process takes down at the test's end.
    survivors = pids_in_groups({driver.pid}, live=True)
    assert survivors, "nothing of the killed driver's Ray outlived it: this test no longer checks the resume beside it"
    # Killed hard, the driver never recorded the digests of Tune's last state (studies.identity): a plain
    # resume refuses to unpickle it and names the choice; nothing is started or recorded, Ray neither (its temp
    # dir, given to that resume alone, stays empty). Short: Ray's socket paths below it may not exceed 107 bytes.
    ray_tmp = Path(tempfile.mkdtemp(prefix="ssk-", dir="/tmp"))
    try:
        refused = cli_process.run("resume", path, *common, cwd=tmp_path, timeout=300, env={"RAY_TMPDIR": str(ray_tmp)})
        assert refused.returncode == EXIT_USAGE, refused.stdout[-2000:] + refused.stderr[-2000:]
        assert "is not what this launch left there" in refused.stderr and "--trust-storage" in refused.stderr
        assert not list(ray_tmp.iterdir()), "the refused resume started Ray"
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    resume = cli_process.run("resume", path, "--trust-storage", *common, cwd=tmp_path, timeout=480)
    assert resume.returncode == 0, resume.stdout[-3000:] + resume.stderr[-3000:]
    print(f"resumed beside {len(survivors)} processes of the killed driver's Ray: {sorted(survivors.values())}")

    after = load_runs("killme", tracking_uri=tracking_uri)
    assert len(after) == 6, after[["trial_id", "status"]]  # exactly one run per trial
    assert after["trial_id"].is_unique
    assert set(after["status"]) == {"finished"}
    assert set(after["mlflow_status"]) == {"FINISHED"}
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("killme")
    assert all(r.info.status != "RUNNING" for r in client.search_runs([exp.experiment_id], max_results=1000))
    kinds = [r.data.tags.get("sharpscale.kind") for r in client.search_runs([exp.experiment_id], max_results=1000)]
    assert kinds.count("study") == 1 and kinds.count("cell") == 2
    # Finished trials were not run again: same runs, one value per epoch.
    for run_id in done_before:
        history = client.get_metric_history(run_id, "val_acc")
        assert sorted(m.step for m in history) == [0, 1, 2, 3]
    for run_id in after["run_id"]:
        assert sorted(m.step for m in client.get_metric_history(run_id, "val_acc")) == [0, 1, 2, 3]
    # Optuna: one COMPLETE trial per Tune trial; one that the killed driver had asked for but never started
    # is FAIL, none is left RUNNING.
    states = [s for trials in _optuna_states(tmp_path, "killme").values() for s in trials]
    assert states.count("COMPLETE") == 6 and "RUNNING" not in states, states
