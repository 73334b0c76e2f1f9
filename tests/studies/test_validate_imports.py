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
