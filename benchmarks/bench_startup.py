"""How fast the `sharpscale` command starts: `--help` and `validate` of every shipped study against yaml + pydantic.

Each round runs, as fresh subprocesses one after the other, `python -c "import yaml, pydantic"` (the floor: what
reading and checking a study file cannot avoid), `sharpscale --help` and `sharpscale validate` of every study file
in studies/; a data root that exists is passed with --set so the cifar studies validate on any machine. The table
gives each command's median wall and CPU seconds over the rounds and the median of its per-round ratios to the floor
(on a machine others load, the CPU seconds and the ratios move least). Targets of issue 14 on the 2-core CPU machine: --help < 1 s, validate < 3 s.

  python -m benchmarks.bench_startup [--repeats 5]

--study STUDY instead runs `sharpscale run --smoke STUDY` through the CLI (a local Ray cluster of its own, a SQLite
MLflow store in a temporary folder) and reads back from its store what the dry run's estimate counts outside the
trials: the start-up (from the launch, as the study run's `wall_h` dates it, to its first trial's run) and each
trial's records (Tune's report, MLflow's opening and per-epoch records, the trial's start: the fixed_<part>_s it
logs), and beside them the estimate the run recorded and the wall it took. --record appends the first two to
benchmarks/results/trial_cost.csv (the rows studies/cost.py costs from); with --check instead the run's estimate and
wall to estimate.csv: a second run, so that the check does not grade the figures its own run measured.

  python -m benchmarks.bench_startup --study studies/quickstart.yaml --record          # the start-up figures
  python -m benchmarks.bench_startup --study studies/quickstart.yaml --record --check  # estimate against actual
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
    p.add_argument("--study", help="run this study's --smoke form through the CLI and measure its start-up")
    p.add_argument("--num-cpus", type=int, help="the study's local Ray cluster's CPUs (default: this machine's)")
    p.add_argument(
        "--check",
        action="store_true",
        help="with --study --record: append the run's estimate and wall to estimate.csv, not its start-up figures",
    )
    args = p.parse_args()
    if args.study:
        return study_startup(args)

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


# What a trial spends on Ray's and MLflow's side, beside what bench_trial_cost measures in trainables.fit alone.
RECORD_PARTS = ("start", "record_open", "imports", "report", "record")


def study_startup(args) -> None:
    import math

    from mlflow.tracking import MlflowClient

    from studies.spec import load_study
    from trainables.metrics import fixed_phase_metric
    from trainables.naming import ESTIMATE_CHECK_TAG, ESTIMATE_TAG, kind_filter

    study = load_study(args.study, smoke=True, require_data=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.update(RAY_USAGE_STATS_ENABLED="0", MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1")
    with tempfile.TemporaryDirectory(prefix="bench_startup_study_") as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        cmd = [*_sharpscale(), "run", "--smoke", str(Path(args.study).resolve()), "--tracking-uri", uri]
        cmd += ["--storage", f"{tmp}/runs", "--set", f"tracking.artifact_location={tmp}/mlartifacts"]
        if args.num_cpus:
            cmd += ["--num-cpus", str(args.num_cpus)]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, check=False)
        command_s = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(study.experiment_name)
        (run,) = client.search_runs([exp.experiment_id], filter_string=kind_filter("study"))
        (wall,) = client.get_metric_history(run.info.run_id, "wall_h")
        launched_ms = wall.timestamp - wall.value * 3600 * 1000
        trials = client.search_runs([exp.experiment_id], filter_string=kind_filter("trial"), max_results=1000)
        startup = (min(t.info.start_time for t in trials) - launched_ms) / 1000
        records = statistics.median(
            sum(t.data.metrics.get(fixed_phase_metric(part), 0.0) for part in RECORD_PARTS) for t in trials
        )
        estimate = run.data.metrics.get("estimate.wall_h", math.nan) * 3600
        # Each trial's own seconds (its run's span) and its epochs', against what the estimate gave a trial.
        spans = [(t.info.end_time - t.info.start_time) / 1000 for t in trials if t.info.end_time]
        epochs = [t.data.metrics.get("epoch_time_s", math.nan) for t in trials]
    load = os.getloadavg()[0]
    print(
        f"trial spans median {statistics.median(spans):.1f} s (min {min(spans):.1f}, max {max(spans):.1f}); "
        f"last epoch_time_s median {statistics.median(epochs):.2f} s; load average {load:.1f} at the end"
    )
    print(done.stdout.strip().splitlines()[-3:])
    print(f"command {command_s:.1f} s; study wall {wall.value * 3600:.1f} s from its launch; start-up {startup:.1f} s;")
    print(f"a trial's records (median of {len(trials)}: {', '.join(RECORD_PARTS)}) {records:.2f} s;")
    print(f"recorded: {run.data.tags.get(ESTIMATE_CHECK_TAG)}; estimate {run.data.tags.get(ESTIMATE_TAG)}")
    if args.record:
        from benchmarks import results
        from studies.cost import CPU_CARD

        device = None if study.resources.gpus_per_trial > 0 else results.card()
        assert device is None or device.startswith(CPU_CARD)
        note = (
            f"{Path(args.study).name} --smoke, {len(trials)} trials, the study's own Ray cluster; load average "
            f"{load:.1f} (2 cores shared)"
        )
        if not args.check:
            figures = [
                {"figure": "start-up", "value": f"{startup:.3g}", "unit": "s", "note": note},
                {"figure": "trial records", "value": f"{records:.3g}", "unit": "s", "note": note + "; median"},
            ]
            print(f"appended to {results.append('trial_cost', figures, device=device)}")
            return
        check = [
            {"figure": f"{Path(args.study).stem} --smoke estimated wall", "value": f"{estimate:.3g}", "unit": "s",
             "note": f"the estimate the run recorded (estimate.wall_h): {run.data.tags.get(ESTIMATE_TAG)}"},
            {"figure": f"{Path(args.study).stem} --smoke wall", "value": f"{wall.value * 3600:.3g}", "unit": "s",
             "note": f"from the launch (wall_h); took/estimated {wall.value * 3600 / estimate:.2f}; median trial "
                     f"span {statistics.median(spans):.1f} s; {note}"},
        ]  # fmt: skip
        print(f"appended to {results.append('estimate', check, device=device)}")


if __name__ == "__main__":
    main()
