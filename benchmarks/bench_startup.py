"""How fast the `sharpscale` command starts: `--help` and `validate` of every shipped study against yaml + pydantic.

Each round runs, as fresh subprocesses one after the other, `python -c "import yaml, pydantic"` (the floor: what
reading and checking a study file cannot avoid), `sharpscale --help` and `sharpscale validate` of every study file
in studies/; a data root that exists is passed with --set so the cifar studies validate on any machine. The table
gives each command's median seconds over the rounds and the median of its per-round ratio to the floor (the ratio
is what survives a loaded machine). Targets of issue 14 on the 2-core CPU machine: --help < 1 s, validate < 3 s.

  python benchmarks/bench_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
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
    }
    for study in sorted((REPO / "studies").glob("*.yaml")):
        rel = study.relative_to(REPO)
        commands[f"sharpscale validate {rel}"] = [*cli, "validate", str(rel), "--set", f"data.root={data_root}"]
    return commands


def _time(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default 5)")
    args = p.parse_args()

    # This checkout's code, whichever copy of the package the environment has installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.update(RAY_USAGE_STATS_ENABLED="0", MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1")
    with tempfile.TemporaryDirectory(prefix="bench_startup_root_") as data_root:
        commands = _commands(data_root)
        times: dict[str, list[float]] = {name: [] for name in commands}
        ratios: dict[str, list[float]] = {name: [] for name in commands}
        for r in range(args.repeats):
            round_times = {name: _time(cmd, env) for name, cmd in commands.items()}
            floor = round_times["import yaml, pydantic"]
            for name, t in round_times.items():
                times[name].append(t)
                ratios[name].append(t / floor)
            print(f"round {r + 1}/{args.repeats}: " + ", ".join(f"{t:.2f}" for t in round_times.values()), flush=True)

    print(f"\n{args.repeats} rounds, median; ratio = median of per-round ratios to `import yaml, pydantic`\n")
    width = max(len(n) for n in commands)
    print(f"{'command':<{width}}  {'seconds':>8}  {'ratio':>6}  target")
    for name in commands:
        target = next((f"< {s:g} s" for key, s in TARGETS.items() if key in name), "")
        print(f"{name:<{width}}  {statistics.median(times[name]):8.2f}  {statistics.median(ratios[name]):6.1f}  {target}")


if __name__ == "__main__":
    main()
