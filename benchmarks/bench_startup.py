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
    p.add_argument("--full", action="store_true", help="with --study: the study as written, not its --smoke form")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="with --study: passed to sharpscale run --set")
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
# The estimate's trial parts (studies/cost.py _cell_cost) and the trial's own records of each (trainables.metrics):
# `training` is the trial's seconds less its fixed seconds, the others fixed_<phase>_s sums.
ACTUAL_PARTS = {
    "validation": ("validation",),
    "geometry": ("geometry",),
    "data load and model build": ("data_load", "model_build"),
    "records": RECORD_PARTS,
    "compile": ("compile",),
    "checkpoints": ("checkpoint",),
}


def _form(args) -> str:
    """How the measured run is named in its rows: the study's stem, its form, and what --set changed."""
    form = "full" if args.full else "--smoke"
    return " ".join([Path(args.study).stem, form, *(f"--set {kv}" for kv in args.set or ())])


def _run_study(args, tmp: str) -> tuple[float, list[str]]:
    """Run the study through the CLI in `tmp`; (command seconds, the printed lines)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.update(RAY_USAGE_STATS_ENABLED="0", MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1")
    uri = f"sqlite:///{tmp}/mlflow.db"
    cmd = [*_sharpscale(), "run", *([] if args.full else ["--smoke"]), str(Path(args.study).resolve())]
    cmd += ["--tracking-uri", uri, "--storage", f"{tmp}/runs", "--set", f"tracking.artifact_location={tmp}/mlartifacts"]
    for kv in args.set or ():
        cmd += ["--set", kv]
    if args.num_cpus:
        cmd += ["--num-cpus", str(args.num_cpus)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return time.perf_counter() - t0, done.stdout.strip().splitlines()


def _read_back(uri: str, experiment: str) -> dict:
    """What the run recorded: its wall, its estimate, the start-up, and each trial's span and parts."""
    from mlflow.tracking import MlflowClient

    from trainables.metrics import FIXED_TIME, TRIAL_TIME, fixed_phase_metric
    from trainables.naming import kind_filter

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    (run,) = client.search_runs([exp.experiment_id], filter_string=kind_filter("study"))
    (wall,) = client.get_metric_history(run.info.run_id, "wall_h")
    launched_ms = wall.timestamp - wall.value * 3600 * 1000
    trials = client.search_runs([exp.experiment_id], filter_string=kind_filter("trial"), max_results=1000)
    parts = []  # each trial's seconds by the estimate's part
    for t in trials:
        m = t.data.metrics
        mine = {"training": m.get(TRIAL_TIME, 0.0) - m.get(FIXED_TIME, 0.0)}
        for name, phases in ACTUAL_PARTS.items():
            mine[name] = sum(m.get(fixed_phase_metric(ph), 0.0) for ph in phases)
        mine["rest of the trial"] = m.get(TRIAL_TIME, 0.0) - sum(mine.values())  # imports, optimizer, other
        parts.append(mine)
    return {
        "run": run,
        "wall_s": wall.value * 3600,
        "startup_s": (min(t.info.start_time for t in trials) - launched_ms) / 1000,
        "records_s": statistics.median(p["records"] for p in parts),
        "spans": [(t.info.end_time - t.info.start_time) / 1000 for t in trials if t.info.end_time],
        "parts": parts,
    }


def _compare(study, got: dict, cpus: int | None) -> list[tuple[str, float, float]]:
    """(part, estimated, actual) seconds: the wall and start-up, then each part summed over the study's trials."""
    import math

    from studies.cost import estimate_study

    estimate = estimate_study(study, cpus=cpus, gpus=None)
    rows = [("wall", got["run"].data.metrics.get("estimate.wall_h", math.nan) * 3600, got["wall_s"])]
    rows.append(("start-up", estimate.startup_s or 0.0, got["startup_s"]))
    summed: dict[str, float] = {}
    for cell in estimate.cells:
        for name, sec in cell.trial_parts:
            summed[name] = summed.get(name, 0.0) + cell.trials * sec
    names = dict.fromkeys([*summed, *got["parts"][0]])
    for name in names:
        actual = sum(p.get(name, 0.0) for p in got["parts"])
        rows.append((f"{name}, all trials", summed.get(name, 0.0), actual))
    estimated_trials = sum(c.trials * c.trial_s for c in estimate.cells)
    rows.append(("trial spans, all trials", estimated_trials, sum(got["spans"])))
    return rows


def study_startup(args) -> None:
    from studies.spec import load_study, parse_overrides
    from trainables.naming import ESTIMATE_CHECK_TAG, ESTIMATE_TAG

    overrides = parse_overrides(args.set or [], args.study)  # as `sharpscale run --set` reads them
    study = load_study(args.study, smoke=not args.full, overrides=overrides, require_data=False)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_startup_study_") as tmp:
        command_s, printed = _run_study(args, tmp)
        got = _read_back(f"sqlite:///{tmp}/mlflow.db", study.experiment_name)
    load = os.getloadavg()[0]
    run, spans = got["run"], got["spans"]
    compared = _compare(study, got, args.num_cpus or os.cpu_count())
    print(printed[-3:])
    print(f"command {command_s:.1f} s; study wall {got['wall_s']:.1f} s from its launch; load average {load_before:.1f}"
          f" at the start, {load:.1f} at the end; trial spans median {statistics.median(spans):.1f} s")  # fmt: skip
    print(f"recorded: {run.data.tags.get(ESTIMATE_CHECK_TAG)}; estimate {run.data.tags.get(ESTIMATE_TAG)}")
    for name, est, act in compared:
        print(f"  {name}: estimated {est:.1f} s, took {act:.1f} s" + (f" ({act / est:.2f}x)" if est else ""))
    if not args.record:
        return
    from benchmarks import results
    from studies.cost import CPU_CARD

    device = None if study.resources.gpus_per_trial > 0 else results.card()
    assert device is None or device.startswith(CPU_CARD)
    form = _form(args)
    note = (
        f"{form}, {len(got['parts'])} trials, the study's own Ray cluster"
        + (f" of {args.num_cpus} CPUs" if args.num_cpus else "")
        + f"; load average {load_before:.1f} at the start, {load:.1f} at the end ({os.cpu_count()} cores shared)"
    )
    if not args.check:
        figures = [
            {"figure": "start-up", "value": f"{got['startup_s']:.3g}", "unit": "s", "note": note},
            {"figure": "trial records", "value": f"{got['records_s']:.3g}", "unit": "s", "note": note + "; median"},
        ]
        print(f"appended to {results.append('trial_cost', figures, device=device)}")
        return
    check = [
        {"figure": f"{form} estimated wall", "value": f"{compared[0][1]:.3g}", "unit": "s",
         "note": f"the estimate the run recorded (estimate.wall_h): {run.data.tags.get(ESTIMATE_TAG)}"},
        {"figure": f"{form} wall", "value": f"{got['wall_s']:.3g}", "unit": "s",
         "note": f"from the launch (wall_h); took/estimated {got['wall_s'] / compared[0][1]:.2f}; median trial span "
                 f"{statistics.median(spans):.1f} s; {note}"},
    ]  # fmt: skip
    check += [
        {"figure": f"{form}: {name}, took/estimated", "value": f"{act / est:.3g}" if est else "-",
         "note": f"estimated {est:.3g} s, took {act:.3g} s; {note}"}
        for name, est, act in compared[1:]
    ]  # fmt: skip
    print(f"appended to {results.append('estimate', check, device=device)}")


if __name__ == "__main__":
    main()
