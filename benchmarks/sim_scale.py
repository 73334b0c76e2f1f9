"""Scale simulation: many short stand-in trials through the real runner, a real 2-node Ray cluster, MLflow server and Optuna storage.

What is real: `ray start` nodes on loopback with declared GPUs (none are used), `studies.runner.run_study` with
Tune and the Optuna searcher on its SQLite file, a `mlflow server` (uvicorn) over SQLite, the trial's MLflow
record (`trainables.tracking.TrialRecorder`), Tune checkpoints written every epoch. What is not: the training.
`sim_trial` keeps the real trainable's contract (run_study's payload; per epoch a checkpoint directory and
`tune.report`, the epoch recorded in MLflow; the run finished) but sleeps instead of training and never imports
torch, so 64+ trial processes fit on a small machine (~150 MB each instead of ~500 MB).

Measured: trials/minute, driver CPU and memory, MLflow requests/s and HTTP errors (the server's access log),
Optuna latency (the searcher's calls, timed in the driver), metrics lost (reported by trials vs stored in MLflow),
MLflow runs not FINISHED, Optuna trials not COMPLETE. docs/scale.md has the results.

  python -m benchmarks.sim_scale --trials 500 --concurrency 64 --epochs 3 --epoch-s 0.5 [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
EPOCH_S_ENV = "SHARPSCALE_SIM_EPOCH_S"  # set on the Ray nodes: every trial process inherits it
CKPT_BYTES_ENV = "SHARPSCALE_SIM_CKPT_BYTES"
METRICS = ("train_loss", "val_loss", "val_acc")
STUDY_NAME = "sim-scale"
CELLS = 4  # method {sam, asam} x lr {lo, hi}, rho searched in each
OBJECT_STORE_BYTES = 200 * 1024 * 1024  # per node; Ray's default would claim a third of this shared machine's RAM
WORKER_MB = 200  # memory of one trial process (Ray worker + Tune + MLflow client), with headroom


def sim_trial(payload: dict) -> None:
    """Stand-in Tune function trainable: the contract of `trainables.ray_train.run_tune_trial`, sleep for training.

    Imports stay inside: Ray workers import this module, and nothing here may pull in torch.
    """
    import ray
    from ray import tune

    from trainables.naming import RAY_NODE_ID_TAG, TRIAL_ID_TAG
    from trainables.tracking import LAST_EPOCH_RESULT_KEY, RUN_ID_RESULT_KEY, TrackingTarget, TrialRecorder

    ctx = tune.get_context()
    trial_id = ctx.get_trial_id()
    # The config as run_study built it, not TrialConfig: validating a method's knobs imports optim, hence torch.
    params = _flat(payload["trial"])
    epochs = int(params["schedule.epochs"])
    epoch_s = float(os.environ.get(EPOCH_S_ENV, "0.5"))
    ckpt_bytes = int(os.environ.get(CKPT_BYTES_ENV, "4096"))
    recorder = TrialRecorder(
        TrackingTarget(**payload["tracking"]),
        trial_key=trial_id,
        run_name=ctx.get_trial_name(),
        params=params,
        wants_checkpoint=bool(payload.get("log_checkpoint")),
    )
    recorder.set_tags(
        {
            TRIAL_ID_TAG: trial_id,
            RAY_NODE_ID_TAG: ray.get_runtime_context().get_node_id(),
            **payload.get("tags", {}),
        }
    )
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as where:
            start = json.loads((Path(where) / "state.json").read_text())["epoch"] + 1
    # A smooth objective of the searched knob, so Optuna's sampler has something to model.
    rho = next((float(v) for k, v in payload.get("sample", {}).items() if k.endswith("rho")), 0.05)
    quality = math.exp(-abs(math.log(rho / 0.05)))
    try:
        for epoch in range(start, epochs):
            time.sleep(epoch_s)
            metrics = {
                "epoch": epoch,
                "train_loss": 2.0 / (epoch + 1) - quality * 0.1,
                "val_loss": 2.2 / (epoch + 1) - quality * 0.1,
                "val_acc": 0.5 + 0.3 * quality + 0.01 * epoch,
            }
            stopped = False
            with tempfile.TemporaryDirectory(prefix="simckpt-") as where:
                (Path(where) / "state.json").write_text(json.dumps({"epoch": epoch}))
                (Path(where) / "weights.bin").write_bytes(os.urandom(ckpt_bytes))
                try:
                    tune.report(
                        {
                            "diverged": 0,
                            **metrics,
                            LAST_EPOCH_RESULT_KEY: float(epoch == epochs - 1),
                            RUN_ID_RESULT_KEY: recorder.run_id,
                        },
                        checkpoint=tune.Checkpoint.from_directory(where),
                    )
                except SystemExit:  # Tune stopped the trial once it held this result (as in trainables.fit)
                    stopped = True
            recorder.log_epoch(metrics, epoch)
            if stopped:
                recorder.finish("finished" if epoch == epochs - 1 else "early_stopped")
                raise SystemExit(0)
    except SystemExit:
        raise
    except BaseException as err:
        recorder.finish("failed", repr(err))
        raise
    recorder.finish("finished")


def _flat(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}: the trial's params, as TrialConfig.flat names them."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# ---------------------------------------------------------------- the cluster: real `ray start` nodes on loopback


class LocalCluster:
    """A Ray head and worker nodes on this machine, each `ray start --block` in its own process group.

    Each node declares `gpus` GPUs (none exist: Tune only books them) and `cpus` CPUs; trials book 0.01 CPU.
    Stopped by SIGTERM to each node's `ray start`, then to its group, then SIGKILL of whatever is left in them or
    names the temp dir: never `ray stop`, which would end every Ray cluster on the machine, other engineers' included.
    """

    def __init__(self, workdir: Path, *, nodes: int, gpus: int, cpus: int, epoch_s: float, ckpt_bytes: int):
        from studies.server import free_ports

        # Short: Ray's Unix sockets live below it and a socket path may not exceed 107 bytes.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="sss-", dir="/tmp"))
        self.logs = workdir
        ports = free_ports(3 + nodes)
        gcs, client, dashboard, agents = ports[0], ports[1], ports[2], ports[3:]
        self.address = f"127.0.0.1:{gcs}"
        self.env = {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            # Several nodes need Ray's multi-node mode (a caller's environment may have turned it off for loopback).
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
            # Trial processes import this checkout (sim_trial, trainables), whatever the virtualenv points at.
            "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
            EPOCH_S_ENV: str(epoch_s),
            CKPT_BYTES_ENV: str(ckpt_bytes),
        }
        self.env.pop("RAY_ADDRESS", None)
        common = [
            f"--num-cpus={cpus}",
            f"--num-gpus={gpus}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats",
        ]
        # As tests/cluster/test_two_node.py: Ray registers each node under the host's own interface address
        # (it will not keep a joining node on 127.0.0.1), so traffic stays on this machine.
        self.args = [
            [
                "--head",
                f"--port={gcs}",
                "--include-dashboard=false",
                f"--dashboard-port={dashboard}",
                f"--ray-client-server-port={client}",
                f"--dashboard-agent-listen-port={agents[0]}",
                *common,
            ]
        ] + [[f"--address={self.address}", f"--dashboard-agent-listen-port={a}", *common] for a in agents[1:]]
        self.nodes: list[subprocess.Popen] = []

    def _log(self, i: int) -> Path:
        return self.logs / f"ray-node{i}.log"

    def _launch(self, i: int) -> None:
        with open(self._log(i), "wb") as log:
            self.nodes.append(
                subprocess.Popen(
                    [
                        str(Path(sys.executable).with_name("ray")),
                        "start",
                        "--block",
                        f"--temp-dir={self.temp_dir / f'n{i}'}",
                        *self.args[i],
                    ],
                    env=self.env,
                    cwd=self.temp_dir,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def launch_head(self) -> None:
        """Start the head without waiting for it (it boots while the MLflow server does)."""
        self._launch(0)

    def start(self, timeout_s: float = 180.0) -> None:
        """Wait for the head, then start each other node in turn and wait for it."""
        for i in range(len(self.args)):
            if i >= len(self.nodes):
                self._launch(i)
            deadline = time.monotonic() + timeout_s
            while "Ray runtime started" not in self._log(i).read_text(errors="replace"):
                if self.nodes[i].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Ray node {i} did not start; {self._log(i)} ends with:\n"
                        f"{self._log(i).read_text(errors='replace')[-3000:]}"
                    )
                time.sleep(0.5)

    def processes(self) -> set[int]:
        from studies.server import pids_in_groups, pids_naming

        return set(pids_in_groups({p.pid for p in self.nodes})) | pids_naming(str(self.temp_dir))

    def stop(self, timeout_s: float = 60.0) -> list[int]:
        """Stop every node; returns the pids that needed SIGKILL.

        SIGTERM to each node's `ray start --block` process, workers first, each awaited: it drains its node through
        the head's GCS, then stops the node's processes. (SIGTERM to every group at once also reached the GCS, and
        each node then waited 30 s for it before shutting down.) Then SIGTERM to anything left in the groups."""
        members = self.processes()
        deadline = time.monotonic() + timeout_s
        for proc in reversed(self.nodes):  # workers first: they drain into a live head
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self.nodes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)

        def alive() -> set[int]:
            return {p for p in members | self.processes() if _running(p)}

        while alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        killed = sorted(alive())
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.nodes.clear()
        return killed


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# ---------------------------------------------------------------- measurements


class Sampler:
    """Once a second: this process's CPU and RSS, the machine's free memory, and the CPU of the given processes."""

    def __init__(self, groups: dict[str, Callable[[], set[int]]], period_s: float = 1.0):
        import psutil

        self._psutil = psutil
        self._me = psutil.Process()
        self._groups = groups
        self._period = period_s
        self._stop = threading.Event()
        self.samples: list[dict] = []
        self._procs: dict[int, object] = {}
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _group_cpu(self, pids: set[int]) -> float:
        total = 0.0
        for pid in pids:
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = self._procs[pid] = self._psutil.Process(pid)
                t = proc.cpu_times()
                total += t.user + t.system
            except (self._psutil.Error, OSError):
                self._procs.pop(pid, None)
        return total

    def _sample(self) -> dict:
        t = self._me.cpu_times()
        return {
            "t": time.monotonic(),
            "driver_cpu_s": t.user + t.system,
            "driver_rss": self._me.memory_info().rss,
            "available": self._psutil.virtual_memory().available,
            "load1": os.getloadavg()[0],
            **{f"{name}_cpu_s": self._group_cpu(pids()) for name, pids in self._groups.items()},
        }

    def _loop(self) -> None:
        while not self._stop.wait(self._period):
            self.samples.append(self._sample())

    def __enter__(self) -> "Sampler":
        self.samples.append(self._sample())
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self._sample())

    def summary(self) -> dict:
        s = self.samples
        wall = s[-1]["t"] - s[0]["t"]
        out = {
            "driver_cpu_pct_mean": 100 * (s[-1]["driver_cpu_s"] - s[0]["driver_cpu_s"]) / wall,
            "driver_cpu_pct_peak_5s": 100
            * max(
                ((b["driver_cpu_s"] - a["driver_cpu_s"]) / (b["t"] - a["t"]) for a, b in zip(s, s[5:], strict=False)),
                default=0.0,
            ),
            "driver_rss_peak_mb": max(x["driver_rss"] for x in s) / 2**20,
            "machine_available_min_gb": min(x["available"] for x in s) / 2**30,
            "load1_max": max(x["load1"] for x in s),
        }
        for name in self._groups:
            # Processes that end between samples take their last seconds with them: a lower bound.
            out[f"{name}_cpu_pct_mean"] = 100 * max(0.0, s[-1][f"{name}_cpu_s"] - s[0][f"{name}_cpu_s"]) / wall
        return out


def _timed_searcher(base: type, times: dict[str, list[float]]) -> type:
    """The runner's searcher with its Optuna calls timed (ask in suggest, report per result, tell at the end)."""

    class TimedCellSearcher(base):
        def _timed(self, name, fn, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                times.setdefault(name, []).append(time.perf_counter() - t0)

        def suggest(self, trial_id):
            return self._timed("suggest", super().suggest, trial_id)

        def on_trial_result(self, trial_id, result):
            return self._timed("on_trial_result", super().on_trial_result, trial_id, result)

        def on_trial_complete(self, trial_id, result=None, error=False):
            return self._timed("on_trial_complete", super().on_trial_complete, trial_id, result=result, error=error)

    return TimedCellSearcher


def _quantiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "n": len(values),
        "mean_ms": 1e3 * statistics.fmean(values),
        "p50_ms": 1e3 * pick(0.5),
        "p95_ms": 1e3 * pick(0.95),
        "max_ms": 1e3 * ordered[-1],
    }


_ACCESS = re.compile(r'^(\d{4}/\d\d/\d\d \d\d:\d\d:\d\d) .*"(\w+) (\S+) HTTP/[\d.]+" (\d{3})')


def _read_access_log(path: Path, start: int) -> dict:
    """Requests the MLflow server logged from byte `start` on: per status, per endpoint, per second."""
    statuses, endpoints, seconds = Counter(), Counter(), Counter()
    problems = Counter()
    with open(path, "rb") as f:
        f.seek(start)
        for raw in f:
            line = raw.decode(errors="replace")
            m = _ACCESS.match(line)
            if m:
                stamp, method, target, status = m.groups()
                statuses[int(status)] += 1
                endpoints[f"{method} {target.split('?')[0]}"] += 1
                seconds[stamp] += 1
            elif "locked" in line.lower():
                problems["database is locked"] += 1
            elif "Traceback" in line:
                problems["traceback"] += 1
    return {"statuses": statuses, "endpoints": endpoints, "seconds": seconds, "problems": problems}


def _check_records(url: str, experiment: str, expected_trials: int, epochs: int) -> dict:
    """What MLflow holds: trial runs, their status, and each metric's values per epoch."""
    from concurrent.futures import ThreadPoolExecutor

    from mlflow.tracking import MlflowClient

    from trainables.naming import TRIAL_ID_TAG, kind_filter

    client = MlflowClient(url)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], filter_string=kind_filter("trial"), max_results=50_000)

    def history(run):
        return {m: [h.step for h in client.get_metric_history(run.info.run_id, m)] for m in METRICS}

    with ThreadPoolExecutor(8) as pool:
        histories = list(pool.map(history, runs))
    steps = {r.data.tags.get(TRIAL_ID_TAG): h for r, h in zip(runs, histories, strict=True)}
    stored = sum(len(set(steps) & set(range(epochs))) for h in histories for steps in h.values())
    values = sum(len(steps) for h in histories for steps in h.values())
    expected = expected_trials * epochs * len(METRICS)
    spans = [(r.info.start_time, r.info.end_time) for r in runs if r.info.end_time]
    return {
        "mlflow_trial_runs": len(runs),
        "mlflow_status": dict(Counter(r.info.status for r in runs)),
        "metric_values_expected": expected,
        "metric_values_stored": stored,
        "metric_values_duplicated": values - stored,
        "metrics_missing_of_full_run": expected - stored,  # > 0 also when a time limit cut the study short
        "_steps": steps,
        "trial_run_s_median": statistics.median((b - a) / 1e3 for a, b in spans) if spans else None,
        "first_start_ms": min(a for a, _ in spans) if spans else None,
        "first_start_to_last_end_s": (max(b for _, b in spans) - min(a for a, _ in spans)) / 1e3 if spans else None,
    }


def _tune_results(experiment_dir: Path, epochs: int) -> dict:
    """What the Tune driver received: one result.json line per report, per trial."""
    received = {}
    for result in experiment_dir.glob("*/result.json"):
        lines = [json.loads(x) for x in result.read_text().splitlines() if x.strip()]
        received[result.parent.name] = {r["training_iteration"] - 1 for r in lines}  # iteration 1 is epoch 0
    per_trial = [len(v) for v in received.values()]
    return {
        "tune_trials": len(per_trial),
        "tune_results": sum(per_trial),
        "tune_trials_short": sum(1 for n in per_trial if n < epochs),
        "_received": received,
    }


def _lost(received: dict[str, set[int]], steps: dict[str, dict[str, list[int]]]) -> int:
    """Metric values a trial reported to Tune (per epoch, each metric) that MLflow does not hold."""
    return sum(
        len(epochs - set(steps.get(trial, {}).get(m, []))) for trial, epochs in received.items() for m in METRICS
    )


def _optuna_states(db: Path) -> dict:
    import optuna

    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    states = Counter()
    for summary in optuna.study.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        states.update(t.state.name for t in study.get_trials(deepcopy=False))
    return dict(states)


def _write_study(path: Path, *, trials: int, concurrency: int, epochs: int, storage: Path, time_limit_s: float) -> int:
    per_cell = math.ceil(trials / CELLS)
    study = {
        "name": STUDY_NAME,
        "description": "Scale simulation (benchmarks/sim_scale.py): stand-in trials that sleep instead of training.",
        "objective": {"metric": "val_acc", "mode": "max"},
        "base": {
            "model": {"name": "mixer_s16_224", "kwargs": {"patch_size": 4, "num_blocks": 2, "embed_dim": 64}},
            "data": {"name": "digits", "img_size": 32, "augment": "none", "batch_size": 64},
            "optimizer": {"base": "adamw", "lr": 0.004},
            "schedule": {"epochs": epochs, "sched": "constant", "warmup_epochs": 0},
            "train": {"device": "cpu", "threads": 1, "seed": 0},
        },
        "factors": {
            "method": {"sam": {"optimizer.method": "sam"}, "asam": {"optimizer.method": "asam"}},
            "lr": {"lo": {"optimizer.lr": 0.001}, "hi": {"optimizer.lr": 0.004}},
        },
        "search": {"rho": {"type": "loguniform", "low": 0.01, "high": 1.0}},
        "budget": {"trials_per_cell": per_cell, "sampler": "tpe", "seed": 0, "time_limit_s": time_limit_s},
        # One declared GPU per trial, as a real study on GPU nodes asks; a sliver of CPU, since the trial sleeps.
        "resources": {
            "cpus_per_trial": 0.01,
            "gpus_per_trial": 1,
            "max_concurrent_trials": concurrency,
            "max_failures": 0,
        },
        "storage": str(storage),
        # Both Ray nodes run on this one machine, so the working directory is a mount every node shares.
        "shared_mounts": [str(storage.parent)],
    }
    import yaml

    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return per_cell * CELLS


def simulate(args: argparse.Namespace, workdir: Path) -> dict:
    """Start the cluster and the server, run the study through `run_study`, measure, stop everything."""
    import psutil

    from studies import runner, tuning
    from studies.server import pids_in_groups, pids_naming, start_server

    need = args.concurrency * WORKER_MB / 1024 + 3
    available = psutil.virtual_memory().available / 2**30
    if available < need and not args.ignore_memory:
        raise SystemExit(
            f"sim_scale: {args.concurrency} trial processes need ~{need:.0f} GB free, this machine has "
            f"{available:.1f} GB (shared with others). Fix: lower --concurrency or pass --ignore-memory."
        )

    # By reference, so each trial process imports it from this checkout instead of unpickling a copy.
    from benchmarks.sim_scale import sim_trial as trainable

    gpus = max(32, math.ceil(args.concurrency / args.nodes))
    study_path = workdir / "sim_scale.yaml"
    trials = _write_study(
        study_path,
        trials=args.trials,
        concurrency=args.concurrency,
        epochs=args.epochs,
        storage=workdir / "ray_results",
        time_limit_s=args.time_limit_s,
    )
    server_log = workdir / "mlflow-server.log"
    cluster = LocalCluster(
        workdir, nodes=args.nodes, gpus=gpus, cpus=args.node_cpus, epoch_s=args.epoch_s, ckpt_bytes=args.ckpt_bytes
    )
    times: dict[str, list[float]] = {}
    out = {
        "trials": trials,
        "concurrency": args.concurrency,
        "epochs": args.epochs,
        "epoch_s": args.epoch_s,
        "nodes": args.nodes,
        "gpus_declared": gpus * args.nodes,
        "server_workers": args.server_workers,
    }
    killed: list[int] = []
    try:
        t0 = time.monotonic()
        cluster.launch_head()
        with start_server(
            backend_store_uri=f"sqlite:///{workdir / 'mlflow.db'}",
            artifacts_destination=str(workdir / "mlartifacts"),
            workers=args.server_workers,
            log_path=server_log,
            timeout_s=240,
            # uvicorn restarts a worker that misses its health check (5 s by default); a CPU-starved
            # machine misses it while the workers still import MLflow, and they restart for ever.
            extra_args=["--uvicorn-opts", f"--timeout-worker-healthcheck {args.server_healthcheck_s}"],
        ) as (server, url):
            cluster.start()
            out["startup_s"] = time.monotonic() - t0
            log_start = server_log.stat().st_size
            groups = {
                "mlflow_server": lambda: set(pids_in_groups({server.pid})),
                "ray_nodes": cluster.processes,
            }
            timed = _timed_searcher(tuning.CellSearcher, times)
            from unittest import mock

            with Sampler(groups) as sampler, mock.patch.object(tuning, "CellSearcher", timed):
                t1, t1_epoch_ms = time.monotonic(), time.time() * 1e3
                outcome = runner.run_study(study_path, address=cluster.address, tracking_uri=url, trainable=trainable)
                wall = time.monotonic() - t1
            log = _read_access_log(server_log, log_start)
            out.update(sampler.summary())
            out.update(
                {
                    "wall_s": wall,
                    "trials_done": outcome.trials,
                    "trials_errored": outcome.errored,
                    "trials_per_min": 60 * outcome.trials / wall,
                    "ideal_trials_per_min": 60 * args.concurrency / (args.epochs * args.epoch_s),
                }
            )
            requests = sum(log["statuses"].values())
            out.update(
                {
                    "mlflow_requests": requests,
                    "mlflow_req_per_s_mean": requests / wall,
                    "mlflow_req_per_s_peak": max(log["seconds"].values(), default=0),
                    # 5xx and 429: the server failed or shed a request (the client retries those). A 4xx else is a
                    # client's question with a "no" for answer (the runner asks for its experiment before creating it).
                    "mlflow_errors": sum(n for code, n in log["statuses"].items() if code >= 500 or code == 429),
                    "mlflow_statuses": {str(k): v for k, v in sorted(log["statuses"].items())},
                    "mlflow_log_problems": dict(log["problems"]),
                    "mlflow_top_endpoints": dict(log["endpoints"].most_common(8)),
                }
            )
            out.update({f"optuna_{name}": _quantiles(v) for name, v in times.items()})
            out.update(_check_records(url, STUDY_NAME, trials, args.epochs))
            if out["first_start_ms"] is not None:
                # From the study's start to the first trial's run: Ray starting trial processes, Tune, Optuna.
                out["to_first_trial_s"] = (out["first_start_ms"] - t1_epoch_ms) / 1e3
                out["trials_per_min_steady"] = 60 * out["mlflow_trial_runs"] / out["first_start_to_last_end_s"]
            out.update(_tune_results(workdir / "ray_results" / STUDY_NAME, args.epochs))
            out["metrics_lost"] = _lost(out.pop("_received"), out.pop("_steps"))
            out["optuna_states"] = _optuna_states(workdir / "ray_results" / f"{STUDY_NAME}.optuna.db")
            killed = cluster.stop()
    finally:
        killed += cluster.stop() if cluster.nodes else []
        import shutil

        shutil.rmtree(cluster.temp_dir, ignore_errors=True)
    out["ray_pids_killed_at_stop"] = len(killed)
    out["leftover_processes"] = len(pids_naming(str(cluster.temp_dir)))
    return out


def _row(r: dict) -> str:
    opt = r.get("optuna_suggest", {}), r.get("optuna_on_trial_result", {}), r.get("optuna_on_trial_complete", {})
    return (
        f"| {r['concurrency']} | {r['trials_done']}/{r['trials']} | {r['wall_s']:.0f} | {r['trials_per_min']:.0f} "
        f"(ideal {r['ideal_trials_per_min']:.0f}) | {r['driver_cpu_pct_mean']:.0f} / {r['driver_cpu_pct_peak_5s']:.0f} "
        f"| {r['driver_rss_peak_mb']:.0f} | {r['mlflow_req_per_s_mean']:.1f} / {r['mlflow_req_per_s_peak']} "
        f"| {r['mlflow_errors']} | {opt[0].get('p50_ms', 0):.0f} / {opt[0].get('p95_ms', 0):.0f} "
        f"| {opt[1].get('p50_ms', 0):.0f} / {opt[1].get('p95_ms', 0):.0f} "
        f"| {opt[2].get('p50_ms', 0):.0f} / {opt[2].get('p95_ms', 0):.0f} | {r['metrics_lost']} "
        f"| {r['mlflow_status']} | {r['optuna_states']} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=500, help=f"trials in all, over {CELLS} cells (rounded up)")
    parser.add_argument("--concurrency", type=int, default=64, help="the study's max_concurrent_trials")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--epoch-s", type=float, default=0.5, help="seconds each stand-in epoch sleeps")
    parser.add_argument("--ckpt-bytes", type=int, default=4096, help="size of each per-epoch checkpoint")
    parser.add_argument("--nodes", type=int, default=2, help="Ray nodes (1 head + workers), GPUs split over them")
    parser.add_argument("--node-cpus", type=int, default=2, help="CPUs each node declares (trials book 0.01)")
    parser.add_argument("--server-workers", type=int, default=4, help="mlflow server workers (MLflow's default: 4)")
    parser.add_argument("--server-healthcheck-s", type=int, default=60, help="uvicorn's worker health-check timeout")
    parser.add_argument("--time-limit-s", type=float, default=1200, help="the study stops launching trials after it")
    parser.add_argument("--workdir", type=Path, default=None, help="kept for inspection; default: a temporary one")
    parser.add_argument("--json", type=Path, default=None, help="write the measurements here")
    parser.add_argument("--ignore-memory", action="store_true", help="start even when free memory looks too small")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(REPO))
    # Token auth with a token of this run only (never ~/.ray/auth_token, which other clusters here read). Set
    # before Ray is imported: the driver (this process) and the nodes (its children) must agree on it.
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sim-scale-")))
        workdir.mkdir(parents=True, exist_ok=True)
        result = simulate(args, workdir.resolve())
    text = json.dumps(result, indent=2, default=str)
    print("SIM_SCALE " + json.dumps(result, default=str), flush=True)
    print(text)
    print(_row(result))
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
