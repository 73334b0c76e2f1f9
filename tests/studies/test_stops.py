"""Every stop of a study leaves its runs closed (KILLED or FINISHED, nothing RUNNING in MLflow or Optuna), its launch
resumable, and one line: at start-up, before the first trial reports, and while it closes."""

import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

from studies.cli import EXIT_INTERRUPTED, EXIT_USAGE
from studies.launch import close_all
from studies.runner import CLOSING_GATE_ENV, _stops_deferred


def test_a_stop_while_closing_skips_only_the_step_under_way():
    closed = []

    def shutdown_cut_by_ctrl_c():
        raise KeyboardInterrupt

    close_all([shutdown_cut_by_ctrl_c, lambda: closed.append("runs"), lambda: closed.append("claim")], None)
    assert closed == ["runs", "claim"]
    cause = KeyboardInterrupt()
    close_all([shutdown_cut_by_ctrl_c, lambda: closed.append("again")], cause)
    assert closed[-1] == "again" and not getattr(cause, "__notes__", None)


def test_the_first_stop_while_closing_is_noted_and_the_second_cuts_the_step(capsys):
    reached = []
    with _stops_deferred() as seen:
        os.kill(os.getpid(), signal.SIGINT)  # handled before the next line runs (main thread)
        reached.append("closing went on")
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append("not reached")
    assert reached == ["closing went on"] and seen == [signal.SIGINT, signal.SIGTERM]
    assert "closing the study's runs first" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is not None  # the handlers from before are back


def _sql(db: Path, query: str) -> list:
    if not db.exists():
        return []
    with sqlite3.connect(db, timeout=30) as con:
        try:
            return con.execute(query).fetchall()
        except sqlite3.OperationalError:
            return []


def _runs(db: Path) -> list[tuple[str, str, str | None]]:
    """(kind, MLflow status, sharpscale.status) of every active run."""
    return sorted(
        _sql(
            db,
            "select k.value, r.status, s.value from runs r join tags k on k.run_uuid = r.run_uuid and "
            "k.key = 'sharpscale.kind' left join tags s on s.run_uuid = r.run_uuid and s.key = 'sharpscale.status' "
            "where r.lifecycle_stage = 'active'",
        ),
        key=repr,
    )


def _study_run_open_before_any_epoch(db: Path) -> bool:
    running = _sql(
        db,
        "select count(*) from runs r join tags k on k.run_uuid = r.run_uuid and k.key = 'sharpscale.kind' "
        "and k.value = 'cell' where r.status = 'RUNNING'",
    )
    return bool(running and running[0][0])


def _no_process_left(pid_group: int) -> bool:
    done = subprocess.run(["pgrep", "-g", str(pid_group)], capture_output=True, text=True)
    return not done.stdout.split()


@pytest.mark.timeout(1200)
def test_sigterm_before_the_first_trial_then_two_resumes_at_once(tmp_path, tiny_study, new_mlflow_store, cli_process):
    """SIGTERM once the cell run exists and before a trial reports: exit 130 in a line or two, nothing RUNNING, no
    process left; then two resumes started together: one drives the launch to its end, the other is refused at once
    naming it."""
    path = tiny_study(
        tmp_path,
        "stops",
        base={"schedule": {"epochs": 1, "warmup_epochs": 0}},
        budget={"trials_per_cell": 1, "sampler": "random", "seed": 1},
        resources={"cpus_per_trial": 1, "max_concurrent_trials": 1, "max_failures": 0},
    )
    db = tmp_path / "mlflow.db"
    uri = new_mlflow_store(db)
    optuna_db = tmp_path / "runs" / "stops.optuna.db"
    flags = ("--tracking-uri", uri, "--num-cpus", "1")
    driver = cli_process.start("run", path.name, *flags, cwd=tmp_path)
    cli_process.wait_for(driver, lambda: _study_run_open_before_any_epoch(db), timeout=600, what="the cell run open")
    driver.send_signal(signal.SIGTERM)
    out, _ = driver.communicate(timeout=300)
    assert driver.returncode == EXIT_INTERRUPTED, out[-3000:]
    assert "Traceback" not in out and "INCOMPLETE" in out and f"resume {path.name}" in out, out[-3000:]
    assert _no_process_left(driver.pid), "the stopped driver left processes in its group"
    runs = _runs(db)
    assert runs and all(status in ("KILLED", "FINISHED") for _, status, _ in runs), runs
    assert ("study", "KILLED", None) in runs and ("cell", "KILLED", None) in runs, runs
    assert "RUNNING" not in [s for (s,) in _sql(optuna_db, "select state from trials")]
    assert not _sql(
        db,
        "select name from experiments where name like '.sharpscale-driver/%' and "
        "lifecycle_stage = 'deleted' and name not like '%-released-%'",
    )  # its driver claim given back

    first = cli_process.start("resume", path.name, *flags, cwd=tmp_path, stderr=subprocess.PIPE)
    second = cli_process.start("resume", path.name, *flags, cwd=tmp_path, stderr=subprocess.PIPE)
    ends = {p.pid: p.communicate(timeout=900) for p in (first, second)}
    codes = sorted((p.returncode, p.pid) for p in (first, second))
    assert [c for c, _ in codes] == [0, EXIT_USAGE], {p.pid: (p.returncode, ends[p.pid]) for p in (first, second)}
    (_, winner), (_, loser) = codes
    refusal = ends[loser][1]
    assert f"is being driven by `sharpscale resume` (pid {winner} on host" in refusal, refusal
    assert "Traceback" not in refusal and len(refusal.strip().splitlines()) <= 2, refusal
    runs = _runs(db)
    assert [r for r in runs if r[0] == "trial"] == [("trial", "FINISHED", "finished")], runs
    assert ("study", "FINISHED", None) in runs and ("cell", "FINISHED", None) in runs, runs
    states = [s for (s,) in _sql(optuna_db, "select state from trials")]
    assert states == ["COMPLETE"], states


@pytest.mark.timeout(1200)
def test_ctrl_c_while_ray_shuts_down_closes_the_runs_and_the_launch_resumes(
    tmp_path, tiny_study, new_mlflow_store, cli_process
):
    """Ctrl-C during a trial, then twice more while the closing steps stop Ray (held at CLOSING_GATE_ENV, as a hanging
    shutdown): the first is noted, the second cuts that step alone; the study and cell runs end KILLED, nothing
    RUNNING, and `resume` then finishes the launch."""
    path = tiny_study(
        tmp_path,
        "closing",
        base={"schedule": {"epochs": 1, "warmup_epochs": 0}},
        budget={"trials_per_cell": 1, "sampler": "random", "seed": 1},
        resources={"cpus_per_trial": 1, "max_concurrent_trials": 1, "max_failures": 0},
    )
    db = tmp_path / "mlflow.db"
    uri = new_mlflow_store(db)
    gate = tmp_path / "gate"
    gate.mkdir()
    flags = ("--tracking-uri", uri, "--num-cpus", "1")
    driver = cli_process.start("run", path.name, *flags, cwd=tmp_path, env={CLOSING_GATE_ENV: str(gate)})
    cli_process.wait_for(driver, lambda: _study_run_open_before_any_epoch(db), timeout=600, what="the cell run open")
    driver.send_signal(signal.SIGINT)
    cli_process.wait_for(driver, (gate / "closing").exists, timeout=300, what="the closing steps stopping Ray")
    driver.send_signal(signal.SIGINT)
    said = []
    while "closing the study's runs first" not in (line := driver.stdout.readline()):  # the stop noted
        assert line, "".join(said)[-3000:]
        said.append(line)
    driver.send_signal(signal.SIGINT)
    out, _ = driver.communicate(timeout=300)
    out = "".join(said) + out
    assert driver.returncode == EXIT_INTERRUPTED, out[-3000:]
    assert "Traceback" not in out and "INCOMPLETE" in out, out[-3000:]
    runs = _runs(db)
    assert ("study", "KILLED", None) in runs and ("cell", "KILLED", None) in runs, (runs, out[-3000:])
    assert all(status in ("KILLED", "FINISHED") for _, status, _ in runs), runs
    assert "RUNNING" not in [s for (s,) in _sql(tmp_path / "runs" / "closing.optuna.db", "select state from trials")]

    again = cli_process.run("resume", path.name, *flags, cwd=tmp_path, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    runs = _runs(db)
    assert ("study", "FINISHED", None) in runs and ("cell", "FINISHED", None) in runs, runs


def _image_folder(root: Path, per_class: int) -> Path:
    """train/ and val/ of two classes of distinct large JPEGs, slow enough to resize that a stop finds work left."""
    import numpy as np
    from PIL import Image

    ramp = np.linspace(0, 255, 1200, dtype=np.uint8)
    for split in ("train", "val"):
        for c, name in enumerate(("cat", "dog")):
            (root / split / name).mkdir(parents=True)
            for i in range(per_class):
                pixels = np.stack(
                    [np.add.outer(ramp, ramp) + i, np.tile(ramp, (1200, 1)), np.full((1200, 1200), c)], -1
                )
                Image.fromarray(pixels.astype(np.uint8)).save(root / split / name / f"{i}.jpg", quality=90)
    return root


@pytest.mark.timeout(600)
def test_sigterm_of_data_prepare_ends_its_workers_and_removes_its_staging(tmp_path, cli_process):
    """SIGTERM while the workers write: as Ctrl-C, one line, exit 130, no process left, no staging folder; the same
    prepare then works."""
    src = _image_folder(tmp_path / "src", per_class=24)
    out = tmp_path / "out"
    argv = ("data", "prepare", src, "--to", out, "--short-side", "32", "--workers", "2")
    driver = cli_process.start(*argv, cwd=tmp_path)

    def writing() -> list[Path]:
        return [p for p in tmp_path.glob(".out.preparing-*") if any(p.rglob("*.jpg"))]

    (staging,) = cli_process.wait_for(driver, writing, timeout=300, what="the first prepared image")
    workers = subprocess.run(["pgrep", "-P", str(driver.pid)], capture_output=True, text=True).stdout.split()
    assert workers, "prepare --workers 2 started no worker process"
    driver.send_signal(signal.SIGTERM)
    said, _ = driver.communicate(timeout=120)
    assert driver.returncode == EXIT_INTERRUPTED, said[-3000:]
    assert said.strip().splitlines()[-1] == "sharpscale: interrupted" and "Traceback" not in said, said[-3000:]
    assert _no_process_left(driver.pid), "the stopped prepare left worker processes"
    assert not staging.exists() and not out.exists()
    again = cli_process.run(*argv, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert (out / "sharpscale-prepared.json").is_file() and not list(tmp_path.glob(".out.preparing-*"))
