"""Regenerates the README's generated blocks, so the tables there are never retyped.

  python docs/update_readme.py               # both blocks; runs studies/quickstart.yaml (about 2 minutes on 2 cores)
  python docs/update_readme.py --methods     # only the methods table, from optim.METHODS (seconds)
  python docs/update_readme.py --quickstart  # only the quickstart block

The block between the `<!-- quickstart-output -->` markers in README.md is replaced by what `sharpscale run` printed,
from its summary line on (Ray's and Optuna's start-up lines are left out), with the temporary paths shown as the
defaults a user gets. The block between the `<!-- methods-table -->` markers is the registry, one row per method
(tests/optim/test_registry.py fails while it is stale).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- quickstart-output -->", "<!-- /quickstart-output -->"
METHODS_BEGIN, METHODS_END = "<!-- methods-table -->", "<!-- /methods-table -->"
# The command `make demo` runs (the Makefile's $(BIN)/sharpscale): the next commands it prints start with it.
DEMO_PROG = ".venv/bin/sharpscale"


def methods_table() -> str:
    """The registry as a Markdown table: name, what it computes, its knobs with their defaults, passes, context."""
    import optim

    rows = ["| name | method | knobs (defaults) | passes per step | needs |", "| --- | --- | --- | --- | --- |"]
    for name, spec in optim.METHODS.items():
        knobs = ", ".join(f"`{k}={v!r}`" for k, v in spec.hparams.items()) or "-"
        passes = "2" if spec.two_pass else "1"  # two on some steps only for LookSAM, on a share of the batch for ESAM
        needs = ", ".join(f"`{n}`" for n in sorted(spec.needs)) or "-"
        description = spec.description.replace("|", "\\|")
        rows.append(f"| `{name}` | {description} | {knobs} | {passes} | {needs} |")
    return "\n".join(rows)


def quickstart_output() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "studies.cli",
                "run",
                str(REPO / "studies" / "quickstart.yaml"),
                "--storage",
                str(Path(tmp) / "runs"),
            ],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=1800,
        ).stdout
        text = out[
            out.index("sharpscale: 15 trials") if "sharpscale: 15 trials" in out else out.rindex("sharpscale: ") :
        ]
        # As `make demo` shows it, run from the repository's root: paths relative to it, and the next commands
        # as it prints them (it runs .venv/bin/sharpscale; this script ran `python -m studies.cli`).
        text = text.replace(tmp + "/", "").replace(tmp, ".").replace(str(REPO) + "/", "").rstrip()
        return re.sub(r"^  sharpscale ", f"  {DEMO_PROG} ", text, flags=re.MULTILINE)


def _replace(text: str, begin: str, end: str, body: str) -> str:
    if begin not in text or end not in text:
        sys.exit(f"README.md has no {begin} ... {end} block")
    return re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: f"{begin}\n{body}\n{end}", text, flags=re.DOTALL)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    only = p.add_mutually_exclusive_group()
    only.add_argument("--methods", action="store_true", help="only the methods table (seconds; no study runs)")
    only.add_argument("--quickstart", action="store_true", help="only the quickstart block (runs the quickstart)")
    args = p.parse_args(argv)
    readme = REPO / "README.md"
    text = readme.read_text()
    if not args.quickstart:
        text = _replace(text, METHODS_BEGIN, METHODS_END, methods_table())
    if not args.methods:
        text = _replace(text, BEGIN, END, f"```\n{quickstart_output()}\n```")
    readme.write_text(text)


if __name__ == "__main__":
    main()
