"""The benchmark figures' one home: CSV rows under benchmarks/results/, one file per question, appended by the scripts.

docs/update_benchmarks.py turns each file into the table of its question in docs/benchmarks.md, keeping the newest
row of each figure on each card: a rerun supersedes the figure it measures again, and the older rows stay in git.
"""

from __future__ import annotations

import csv
import datetime
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
COLUMNS = ("card", "versions", "commit", "date", "command", "figure", "value", "unit", "note")
# The packages whose versions a figure depends on, recorded with it.
VERSIONED = ("torch", "timm", "ray", "mlflow", "optuna", "nvidia-dali-cuda130")


def versions() -> str:
    """Python and the installed versions of VERSIONED, e.g. `python 3.11.7; torch 2.14.1; ...`."""
    found = [f"python {platform.python_version()}"]
    for name in VERSIONED:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return "; ".join(found)


def commit() -> str:
    """The checkout's commit (with `+dirty` when it has changes), or `unknown` outside git.

    A copy of the tree without its git folder (a lent GPU machine) names it in SHARPSCALE_BENCH_COMMIT.
    """
    import os

    if os.environ.get("SHARPSCALE_BENCH_COMMIT"):
        return os.environ["SHARPSCALE_BENCH_COMMIT"]
    repo = RESULTS.parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True)
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def card() -> str:
    """The device the figures were measured on: the GPU's name, else the CPU's with its core count."""
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    except ImportError:
        pass
    import os

    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def append(question: str, rows: list[dict], *, command: str | None = None, device: str | None = None) -> Path:
    """Append `rows` (each with `figure`, `value`, and optionally `unit`, `note`) to the question's CSV file."""
    path = RESULTS / f"{question}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    shared = {
        "card": device or card(),
        "versions": versions(),
        "commit": commit(),
        "date": datetime.date.today().isoformat(),
        "command": command or " ".join([f"python -m benchmarks.{Path(sys.argv[0]).stem}", *sys.argv[1:]]),
    }
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        for row in rows:
            writer.writerow({**shared, "unit": "", "note": "", **row})
    return path


def read(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))
