"""How fast the `sharpscale` command starts: `--help` and `validate` of every shipped study against yaml + pydantic.

Each round runs, as fresh subprocesses one after the other, `python -c "import yaml, pydantic"` (the floor: what
reading and checking a study file cannot avoid), `sharpscale --help` and `sharpscale validate` of every study file
in studies/; a data root that exists is passed with --set so the cifar studies validate on any machine. The table
gives each command's median wall and CPU seconds over the rounds and the median of its per-round ratios to the floor
(on a machine others load, the CPU seconds and the ratios move least). Targets of issue 14 on the 2-core CPU machine: --help < 1 s, validate < 3 s.

  python -m benchmarks.bench_startup [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS = {"--help": 1.0, "validate": 3.0}


def _sharpscale() -> list[str]:
    # The installed console script is what a user types; without it, the same entry point through -m.
    script = Path(sys.executable).with_name("sharpscale")
    return [str(script)] if script.exists() else [sys.executable, "-m", "studies.cli"]


def _commands(data_root: str) -> dict[str, list[str]]:
    cli = _sharpscale()
    commands = {
        "import yaml, pydantic": [sys.executable, "-c", "import yaml, pydantic"],
        "sharpscale --help": [*cli, "--help"],
        # What validate cannot go below while it checks each method's knobs by building the method: torch, and the
        # torch._dynamo import that building a first torch.optim optimizer triggers.
        "import torch": [sys.executable, "-c", "import torch"],
        "import torch + one optimizer": [
            sys.executable,
            "-c",
            "import torch; torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)",
        ],
    }
    for study in sorted((REPO / "studies").glob("*.yaml")):
        rel = study.relative_to(REPO)
        commands[f"sharpscale validate {rel}"] = [*cli, "validate", str(rel), "--set", f"data.root={data_root}"]
    return commands


def _time(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run; the CPU time barely moves when others load the machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument(
        "--record",
        action="store_true",
        help="append the medians to benchmarks/results/startup.csv (docs/benchmarks.md)",
    )
    args = p.parse_args()

    # This checkout's code, whichever copy of the package the environment has installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.update(RAY_USAGE_STATS_ENABLED="0", MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1")
    with tempfile.TemporaryDirectory(prefix="bench_startup_root_") as data_root:
        commands = _commands(data_root)
        rows: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in commands}
        for r in range(args.repeats):
            measured = {name: _time(cmd, env) for name, cmd in commands.items()}
            wall0, cpu0 = measured["import yaml, pydantic"]
            for name, (wall, cpu) in measured.items():
                rows[name].append((wall, wall / wall0, cpu, cpu / cpu0))
            print(
                f"round {r + 1}/{args.repeats} (wall s): " + ", ".join(f"{w:.2f}" for w, _ in measured.values()),
                flush=True,
            )

    print(
        f"\n{args.repeats} rounds, medians; ratios are per-round ratios to `import yaml, pydantic`, then their median\n"
    )
    width = max(len(n) for n in commands)
    print(f"{'command':<{width}}  {'wall s':>7}  {'ratio':>6}  {'CPU s':>6}  {'ratio':>6}  target (wall)")
    record = []
    for name, runs in rows.items():
        med = [statistics.median(col) for col in zip(*runs, strict=True)]
        target = next((f"< {s:g} s" for key, s in TARGETS.items() if key in name), "")
        print(f"{name:<{width}}  {med[0]:7.2f}  {med[1]:6.1f}  {med[2]:6.2f}  {med[3]:6.1f}  {target}")
        note = f"target {target}, idle machine" if target else ""
        record += [
            {"figure": f"`{name}` wall", "value": f"{med[0]:.2f}", "unit": "s", "note": note},
            {"figure": f"`{name}` CPU", "value": f"{med[2]:.2f}", "unit": "s"},
        ]
    if args.record:
        from benchmarks import results

        print(f"appended to {results.append('startup', record)}")


if __name__ == "__main__":
    main()
