"""Regenerates the README's quickstart output block from a real run, so the table there is never retyped.

  python docs/update_readme.py          # runs studies/quickstart.yaml into a temporary store (about 2 minutes on 2 cores)

The block between the `<!-- quickstart-output -->` markers in README.md is replaced by what `sharpscale run` printed,
from its summary line on (Ray's and Optuna's start-up lines are left out), with the temporary paths shown as the
defaults a user gets.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- quickstart-output -->", "<!-- /quickstart-output -->"


def quickstart_output() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
        out = subprocess.run(
            [sys.executable, "-m", "studies.cli", "run", str(REPO / "studies" / "quickstart.yaml"),
             "--storage", str(Path(tmp) / "runs")],
            cwd=tmp, env=env, capture_output=True, text=True, check=True, timeout=1800,
        ).stdout
        text = out[out.index("sharpscale: 15 trials") if "sharpscale: 15 trials" in out else out.rindex("sharpscale: "):]
        return text.replace(tmp + "/", "").replace(tmp, ".").rstrip()


def main() -> None:
    readme = REPO / "README.md"
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        sys.exit(f"README.md has no {BEGIN} ... {END} block")
    block = f"{BEGIN}\n```\n{quickstart_output()}\n```\n{END}"
    readme.write_text(re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S))
    print(block)


if __name__ == "__main__":
    main()
