"""benchmarks/bench_imagefolder.py --quick on CPU: the script writes a mixed-size folder, prepares its pixel form, and
prints a row for every path it was asked for, the worker-count variants and the profiled SM lines (figures meaningless
on a CPU; the script's own code paths are what is checked)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

# The whole benchmark script, end to end: a minute or more on 2 cores, so not in make test-fast.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_quick_run_prints_every_asked_path(tmp_path):
    root = tmp_path / "folder"
    argv = ["--quick", "--root", str(root), "--sizes", "mixed", "--pixels", "24", "--workers", "1", "--methods",
            "none", "--skip", "decode cpu", "strong", "--no-pipeline", "--sm-busy", "pixels"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_imagefolder", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [ln for ln in done.stdout.splitlines() if ln.startswith("| tiny ViT |")]
    paths = [ln.split(" | ")[1] for ln in rows]
    assert paths == [
        "synthetic, on the GPU",
        "imagefolder basic, decode device",
        "pixels 24 basic, decode device",
        "imagefolder basic, decode device, 1 workers",
        "pixels 24 basic, decode device, 1 workers",
    ], done.stdout[-3000:]
    profiled = [ln for ln in done.stdout.splitlines() if "SMs busy" in ln]
    assert [ln.split(":")[0].strip() for ln in profiled] == [
        "synthetic, on the GPU",
        "pixels 24 basic, decode device",
        "pixels 24 basic, decode device, 1 workers",
    ]
    sizes = {Image.open(p).size for p in (root / "train").rglob("*.jpg")}
    assert len(sizes) > 3  # --sizes mixed: many sizes, so a batch's pixels fall in several size runs
