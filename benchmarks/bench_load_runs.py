"""How long `analysis.load_runs` takes to read a study of 1,000 trials from a real `mlflow server`.

Fills an SQLite store with N trial runs shaped like the runner's (tags, the flattened trial config as params, E
epochs of per-epoch metrics, logged in batches), starts `mlflow server` on 127.0.0.1 over it (studies.server,
as `sharpscale server` does), and times, interleaved over R rounds:

  load_runs (server)    one search, one page of up to 50,000 runs (MLflow's maximum); nothing per run
  1,000 a page (server) the reader before: the same search in pages of 1,000 runs (then one more, empty, request
                        when the study has exactly a multiple of 1,000 trials)
  load_runs (SQLite)    the same read straight from the file (one search)
  per-run reads         a search for the ids, then one `get_run` per trial: what a reader without paging costs
                        (timed on --sample trials and scaled to all of them: at ~0.5 s a request on a busy
                        2-core machine, 1,000 of them take minutes a round)

The server runs MLflow's default number of worker processes (4), as `sharpscale server` does, unless --workers
says otherwise. The server's first request after it starts loads its handlers (seconds); one warm-up request
precedes the rounds, and its time is printed apart. Prints the median seconds of each reader and their ratios to load_runs over the
server.

    python -m benchmarks.bench_load_runs [--trials 1000] [--epochs 2] [--rounds 3] [--sample 100] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from analysis import load_runs
from analysis import runs as runs_module
from studies.server import start_server
from trainables.config import TrialConfig
from trainables.naming import CELL_TAG, KIND_TAG, LAUNCH_TAG, STATUS_TAG, TRIAL_ID_TAG, TRIAL_KEY_TAG

EXPERIMENT = "bench_load_runs"
METRICS = (
    "train_loss",
    "train_acc",
    "val_loss",
    "val_acc",
    "val_top5",
    "best_val_acc",
    "best_epoch",
    "lr",
    "weight_norm",
    "images_per_sec",
    "epoch_time_s",
    "diverged",
)


def fill(uri: str, trials: int, epochs: int) -> None:
    client = MlflowClient(uri)
    exp = client.create_experiment(EXPERIMENT)
    params = {k: str(v) for k, v in TrialConfig().flat().items()}
    archs, methods, seeds = ("resnet", "vit", "mixer"), ("vanilla", "sam", "aug", "sam_aug"), (0, 1, 2)
    now = int(time.time() * 1000)
    for i in range(trials):
        arch, method, seed = archs[i % 3], methods[(i // 3) % 4], seeds[(i // 12) % 3]
        cell = f"arch={arch},method={method},train.seed={seed}"
        tags = {
            KIND_TAG: "trial",
            TRIAL_KEY_TAG: f"t{i:05d}",
            STATUS_TAG: "finished",
            LAUNCH_TAG: "1",
            CELL_TAG: cell,
            TRIAL_ID_TAG: f"t{i:05d}",
            "factor.arch": arch,
            "factor.method": method,
            "factor.train.seed": str(seed),
        }
        run = client.create_run(exp, run_name=f"{arch}/{method}/seed={seed} #{i}", tags=tags)
        run_params = {**params, "optimizer.hparams.rho": str(0.01 + (i % 17) * 0.01), "train.seed": str(seed)}
        items = [Param(k, v) for k, v in run_params.items()]
        for j in range(0, len(items), 100):
            client.log_batch(run.info.run_id, params=items[j : j + 100])
        metrics = [Metric(k, float((e + 1) * 0.01 + i * 1e-6), now + e, e) for e in range(epochs) for k in METRICS]
        for j in range(0, len(metrics), 1000):
            client.log_batch(run.info.run_id, metrics=metrics[j : j + 1000])
        client.set_terminated(run.info.run_id)
        if (i + 1) % 100 == 0:
            print(f"  filled {i + 1}/{trials} runs", flush=True)


def per_run(uri: str, sample: int) -> int:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    ids, token = [], None
    while True:
        page = client.search_runs([exp.experiment_id], max_results=1000, page_token=token)
        ids += [r.info.run_id for r in page]
        token = page.token
        if not token:
            break
    return len([client.get_run(i) for i in ids[:sample]])


def pages_of_1000(url: str) -> int:
    """load_runs as it read before: pages of 1,000 runs."""
    page = runs_module._PAGE
    runs_module._PAGE = 1000
    try:
        return len(load_runs(EXPERIMENT, tracking_uri=url))
    finally:
        runs_module._PAGE = page


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    # load_runs reads each run's latest metric values (one row per key), never the histories: their length does not
    # change its cost, and a short one keeps the fill (one SQLite write per call) within minutes.
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sample", type=int, default=100, help="trials the per-run reader reads (scaled to all)")
    ap.add_argument("--workers", type=int, default=None, help="server worker processes (default: MLflow's, 4)")
    ap.add_argument(
        "--store", default=None, help="an SQLite file to fill, or reuse when already filled (default: temp)"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-load-runs-") as tmp:
        db = Path(args.store).resolve() if args.store else Path(tmp) / "mlflow.db"
        sqlite = f"sqlite:///{db}"
        if db.exists() and MlflowClient(sqlite).get_experiment_by_name(EXPERIMENT) is not None:
            print(f"reusing the filled store {db}", flush=True)
        else:
            t0 = time.perf_counter()
            fill(sqlite, args.trials, args.epochs)
            print(
                f"filled {args.trials} runs x {len(METRICS)} metrics x {args.epochs} epochs in "
                f"{time.perf_counter() - t0:.0f} s",
                flush=True,
            )
        # A busy machine can take minutes to start the server's workers.
        with start_server(
            backend_store_uri=sqlite,
            artifacts_destination=str(Path(tmp) / "artifacts"),
            log_path=Path(tmp) / "server.log",
            timeout_s=900,
            workers=args.workers,
        ) as (_, url):
            t = time.perf_counter()
            MlflowClient(url).get_experiment_by_name(EXPERIMENT)
            print(f"server's first request: {time.perf_counter() - t:.2f} s", flush=True)
            sample = min(args.sample, args.trials)
            jobs = {
                "load_runs (server)": lambda: len(load_runs(EXPERIMENT, tracking_uri=url)),
                "1,000 a page (server)": lambda: pages_of_1000(url),
                "load_runs (SQLite)": lambda: len(load_runs(EXPERIMENT, tracking_uri=sqlite)),
                "per-run reads (server)": lambda: per_run(url, sample),
            }
            times: dict[str, list[float]] = {name: [] for name in jobs}
            for r in range(args.rounds):
                for name, job in jobs.items():  # interleaved: each round measures every reader once
                    t = time.perf_counter()
                    rows = job()
                    scale = args.trials / rows if name.startswith("per-run") else 1.0
                    times[name].append((time.perf_counter() - t) * scale)
                    assert rows == (sample if name.startswith("per-run") else args.trials), (name, rows)
                print(
                    f"  round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {v[-1]:.2f} s" for n, v in times.items()),
                    flush=True,
                )
    base = statistics.median(times["load_runs (server)"])
    print(
        f"\n{args.trials} trials, median of {args.rounds} rounds (CPU: {os.cpu_count()} cores; server workers: "
        f"{args.workers or 'MLflow default'}):"
    )
    print("| reader | seconds | ratio to load_runs (server) |\n| --- | --- | --- |")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"| {name} | {med:.2f} | {med / base:.2f} |")


if __name__ == "__main__":
    main()
