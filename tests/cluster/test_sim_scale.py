"""The scale simulation (benchmarks/sim_scale.py) at a tiny size: 2 real Ray nodes, a real MLflow server, 8 trials.

Keeps the harness behind docs/scale.md from rotting: it must still run through `run_study` and find every metric in
MLflow, every trial run FINISHED and every Optuna trial COMPLETE. The harness runs in a subprocess, so the driver
never shares this process's Ray state; it stops its own nodes and server (never `ray stop`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
TRIALS, EPOCHS = 8, 2


def test_tiny_simulation_loses_nothing(tmp_path):
    out = tmp_path / "sim.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("RAY_ADDRESS", None)
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = (
        "1"  # its driver joins a multi-node cluster (tests/conftest.py turns it off)
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "sim_scale.py"),
            "--trials",
            str(TRIALS),
            "--concurrency",
            "4",
            "--epochs",
            str(EPOCHS),
            "--epoch-s",
            "0.2",
            "--server-workers",
            "2",
            "--workdir",
            str(tmp_path / "work"),
            "--json",
            str(out),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=840,
        start_new_session=True,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    print(proc.stdout.strip().splitlines()[-1])  # the measurements as a row of docs/scale.md's table (pytest -s)
    r = json.loads(out.read_text())
    assert r["trials_done"] == TRIALS and r["trials_errored"] == 0, r
    assert r["metrics_lost"] == 0 and r["metric_values_stored"] == TRIALS * EPOCHS * 3, r
    assert r["metric_values_duplicated"] == 0, r
    assert r["mlflow_trial_runs"] == TRIALS and r["mlflow_status"] == {"FINISHED": TRIALS}, r
    assert r["optuna_states"] == {"COMPLETE": TRIALS}, r  # none RUNNING, none FAIL
    assert r["tune_results"] == TRIALS * EPOCHS and r["tune_trials_short"] == 0, r
    assert r["mlflow_errors"] == 0 and r["mlflow_requests"] > 0, r
    assert r["optuna_suggest"]["n"] == TRIALS and r["optuna_on_trial_complete"]["n"] == TRIALS, r
    assert r["leftover_processes"] == 0, r
