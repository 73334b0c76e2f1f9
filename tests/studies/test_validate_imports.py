"""`sharpscale validate` of every shipped study (its full form and its --smoke form) imports no torch, timm or torchvision: what keeps it within its 3 s (benchmarks/bench_startup.py times it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_validating_every_shipped_study_imports_no_torch(tmp_path):
    studies = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "studies").glob("*.yaml"))
    assert len(studies) >= 6
    code = (
        "import sys\n"
        "from studies.cli import main\n"
        f"for study in {studies!r}:\n"
        f"    assert main(['validate', study, '--set', 'data.root={tmp_path}']) == 0, study\n"
        "    assert main(['validate', study, '--smoke']) == 0, study\n"
        "heavy = sorted(m for m in ('torch', 'timm', 'torchvision', 'ray', 'mlflow') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PYTHONPATH": str(ROOT),
            "PATH": "/usr/bin:/bin",
            "HF_HUB_OFFLINE": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
            "MLFLOW_DISABLE_TELEMETRY": "true",
        },
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_building_the_clis_parser_imports_no_archive_or_network_code():
    # Every command builds the whole parser: `data prepare`'s help reads trainables.prepare's constants, which must
    # not bring tarfile or multiprocessing (trainables.fetch, the worker pool) into each command's start.
    code = (
        "import sys\n"
        "from studies.cli import build_parser\n"
        "build_parser()\n"
        "heavy = sorted(m for m in ('tarfile', 'multiprocessing', 'trainables.fetch') "
        "if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
