"""A real two-node Ray cluster on this machine, a real MLflow server with a login, one small study across both nodes.

The server is `sharpscale server --auth`'s (tests/cluster/conftest.py), shared by both tests of this file (make test
distributes by file, so it starts once): 401 without a login, runs with one.

Two `ray start --block` nodes, each with its own temp dir, ports and marker resource (node_a on the head, node_b on
the worker) and one CPU, so two concurrent one-CPU trials can only run one per node. Token authentication is on,
with a token that exists only in these processes' environment. The driver is `sharpscale run` in a subprocess: it
never shares the pytest process's Ray state (tests/conftest.py's session cluster may live there).

The MLflow server is this file's `mlflow server --auth` (tests/cluster/conftest.py). The nodes start without MLflow
credentials and only the driver has a (non-admin) login, so trials can record only with the credentials the driver
forwards to them.

Cleanup stops exactly what the test started: each node is its own process group (start_new_session), stopped with
SIGTERM (to its `ray start` process, then to the rest of its group) then SIGKILL, and any process still naming the
cluster's temp dir is killed. Never `ray stop`: it kills every
Ray process on the machine, other engineers' test clusters and the session fixture included.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from studies.server import free_ports, pids_in_groups, pids_naming

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RAY = str(Path(sys.executable).with_name("ray"))
MLFLOW_CREDENTIALS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
OBJECT_STORE_BYTES = 200 * 1024 * 1024  # per node; Ray's default would claim a third of this shared machine's RAM
TRIALS = 4  # 2 cells x 2 trials: two waves of two concurrent trials
# Each trial must outlast the start of the other node's trial actor (seconds, on a loaded machine): Tune reuses a
# finished trial's actor for a pending trial and drops the actor still starting for it, so trials much shorter
# than an actor's start would all run on whichever node started first.
EPOCHS = 6


class TwoNodeCluster:
    """A head (node_a) and a worker (node_b), each started with `ray start --block` in its own process group."""

    def __init__(self, logs: Path):
        # Short: Ray's Unix sockets live below it and a socket path may not exceed 107 bytes.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="ss2n-", dir="/tmp"))
        self.logs = logs
        gcs, dashboard, client, agent_a, agent_b = free_ports(5)
        self.address = f"127.0.0.1:{gcs}"
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in MLFLOW_CREDENTIALS},
            "RAY_USAGE_STATS_ENABLED": "0",
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            # Worker nodes need Ray's multi-node mode, which tests/conftest.py turns off for the local clusters.
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
            # Token auth, the token in these processes' environment only (never ~/.ray/auth_token, which the
            # session cluster and other engineers' clusters on this machine read).
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32),
        }
        self.env.pop("RAY_ADDRESS", None)
        common = ["--num-cpus=1", f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats"]
        self._head_args = [
            "--head",
            f"--port={gcs}",
            '--resources={"node_a": 1}',
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard}",
            f"--ray-client-server-port={client}",
            f"--dashboard-agent-listen-port={agent_a}",
            *common,
        ]
        self._worker_args = [
            f"--address={self.address}",
            '--resources={"node_b": 1}',
            f"--dashboard-agent-listen-port={agent_b}",
            *common,
        ]
        self.nodes: dict[str, subprocess.Popen] = {}

    def _start(self, name: str, args: list[str]) -> None:
        log = open(self.logs / f"ray-{name}.log", "wb")
        with log:
            self.nodes[name] = subprocess.Popen(
                [RAY, "start", "--block", f"--temp-dir={self.temp_dir / name}", *args],
                env=self.env,
                cwd=self.temp_dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_started(self, name: str, timeout_s: float = 180.0) -> None:
        log, proc = self.logs / f"ray-{name}.log", self.nodes[name]
        deadline = time.monotonic() + timeout_s
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Ray {name} node did not start; {log} ends with:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)

    def start_head(self) -> None:
        self._start("head", self._head_args)

    def start_worker(self) -> None:
        self._wait_started("head")
        self._start("worker", self._worker_args)
        self._wait_started("worker")

    def stop(self, timeout_s: float = 60.0) -> list[str]:
        """Stop both nodes; returns the command lines of processes that had to be SIGKILLed or that survived.

        As a container runtime stops a node: SIGTERM to its `ray start --block` process, which drains the node through
        the head's GCS and then stops the node's processes; the worker first, while that GCS still answers. (SIGTERM
        to both whole groups at once also reached the GCS, and each node then waited 30 s for it before shutting
        down.) Then SIGTERM to anything left in the groups, and SIGKILL to what outlives the deadline."""
        groups = {proc.pid for proc in self.nodes.values()}
        members = set(pids_in_groups(groups)) | pids_naming(str(self.temp_dir))
        deadline = time.monotonic() + timeout_s
        for proc in reversed(list(self.nodes.values())):  # the worker first: it drains into a live head
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self.nodes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        alive = lambda: {p for p in members if Path(f"/proc/{p}").exists() and _state(p) != "Z"}  # noqa: E731
        while alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        killed = []
        for pid in alive():
            killed.append(_cmdline(pid))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.nodes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        # Anything that left the groups but still names this cluster's temp dir (there should be nothing).
        for pid in pids_naming(str(self.temp_dir)):
            killed.append(_cmdline(pid))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.nodes.clear()
        return killed


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return f"pid {pid}"


@pytest.fixture
def cluster(tmp_path):
    c = TwoNodeCluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()
        shutil.rmtree(c.temp_dir, ignore_errors=True)


# Which Ray node carries which marker resource, asked from a separate process holding the cluster's token.
_NODES_QUERY = r"""
import json, sys
from ray.util.state import list_nodes
nodes = {n.node_id: sorted(n.resources_total) for n in list_nodes(address=sys.argv[1], detail=True)}
print("NODES " + json.dumps(nodes))
"""


def _study(tmp_path: Path, tiny_model) -> Path:
    study = {
        "name": "two-node",
        "description": "AdamW vs SAM on digits, a tiny Mixer, spread over two Ray nodes.",
        "objective": {"metric": "val_acc", "mode": "max"},
        "base": {
            "model": tiny_model("mixer", num_blocks=2, embed_dim=64),
            "data": {"name": "digits", "img_size": 32, "augment": "none", "batch_size": 64},
            "optimizer": {"base": "adamw", "lr": 0.004},
            "schedule": {"epochs": EPOCHS, "sched": "constant", "warmup_epochs": 0},
            "train": {"device": "cpu", "threads": 1, "seed": 0},
        },
        "factors": {"method": {"adamw": {"optimizer.method": "none"}, "sam": {"optimizer.method": "sam"}}},
        "search": {"rho": {"type": "loguniform", "low": 0.01, "high": 0.1}},
        "budget": {"trials_per_cell": 2, "repeats_without_search": 2, "sampler": "random", "seed": 0},
        "resources": {"cpus_per_trial": 1, "max_concurrent_trials": 2, "max_failures": 0},
        # What a study sets on a cluster: Ray's storage on a path every node sees (here both nodes share a disk),
        # under a directory declared mounted on every node.
        "storage": str(tmp_path / "shared_storage"),
        "shared_mounts": [str(tmp_path)],
        "tracking": {"artifact_location": str(tmp_path / "client_side_mlartifacts")},
    }
    path = tmp_path / "two_node.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def _status(url: str, auth: tuple[str, str] | None = None) -> int:
    request = urllib.request.Request(f"{url}/api/2.0/mlflow/experiments/search?max_results=1")
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.timeout(420)
def test_no_login_gets_401_and_a_login_creates_runs(auth_server, monkeypatch):
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    url, admin = auth_server["url"], auth_server["admin"]
    assert _status(url) == 401
    assert _status(url, (admin[0], "not-the-password")) == 401
    assert _status(url, admin) == 200

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", admin[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", admin[1])
    client = MlflowClient(url)
    run = client.create_run(client.create_experiment("auth-check"))
    client.log_metric(run.info.run_id, "x", 1.0)
    assert client.get_run(run.info.run_id).data.metrics == {"x": 1.0}

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "not-the-password")
    with pytest.raises(MlflowException, match="401|not authenticated|Unauthorized"):
        MlflowClient(url).get_run(run.info.run_id)

    # Users and permissions live beside the backend store; the password appears in no file or log of ours.
    assert (auth_server["dir"] / "mlflow-auth.db").is_file()
    assert admin[1] not in (auth_server["dir"] / "server.log").read_text(errors="replace")


def test_study_runs_on_both_nodes_and_records_through_the_server_with_the_drivers_login(
    cluster,
    tmp_path,
    auth_server,
    trials_user,
    monkeypatch,
    tiny_model,
):
    from mlflow.tracking import MlflowClient

    study = _study(tmp_path, tiny_model)
    url, (user, password) = auth_server["url"], trials_user
    t0 = time.monotonic()
    cluster.start_head()
    cluster.start_worker()
    t_up = time.monotonic() - t0

    driver_env = {**cluster.env, "MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password}
    driver = subprocess.run(
        [sys.executable, "-m", "studies.cli", "run", str(study), "--address", cluster.address, "--tracking-uri", url],
        env=driver_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=420,
        start_new_session=True,
    )
    (tmp_path / "driver.log").write_text(driver.stdout + driver.stderr)
    errors = "".join(f"\n{e}:\n{e.read_text()[-3000:]}" for e in sorted(cluster.temp_dir.rglob("error.txt")))
    assert driver.returncode == 0 and "(0 errored)" in driver.stdout, driver.stdout[-3000:] + errors
    assert f"{TRIALS} trials in" in driver.stdout, driver.stdout[-3000:]
    assert password not in driver.stdout + driver.stderr

    query = subprocess.run(
        [sys.executable, "-c", _NODES_QUERY, cluster.address],
        env=cluster.env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert query.returncode == 0, query.stderr[-3000:]
    nodes = json.loads(query.stdout.split("NODES ", 1)[1])

    leftovers = cluster.stop()
    assert leftovers == [], f"Ray processes outlived SIGTERM to their node's process group: {leftovers}"
    assert not pids_naming(str(cluster.temp_dir)), "a process of the test cluster is still running"

    marker = {node_id: [r for r in res if r in ("node_a", "node_b")] for node_id, res in nodes.items()}
    assert sorted(m for ms in marker.values() for m in ms) == ["node_a", "node_b"], nodes

    # Every trial's run, params and per-epoch metrics arrived through the server, under the driver's login.
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    client = MlflowClient(url)
    exp = client.get_experiment_by_name("two-node")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    kinds = [r.data.tags.get("sharpscale.kind") for r in runs]
    assert kinds.count("study") == 1 and kinds.count("cell") == 2 and kinds.count("trial") == TRIALS, kinds
    assert all(r.info.status == "FINISHED" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
    trials = [r for r in runs if r.data.tags.get("sharpscale.kind") == "trial"]
    assert {r.data.tags["sharpscale.status"] for r in trials} == {"finished"}
    assert sorted(r.data.params["optimizer.method"] for r in trials) == ["none", "none", "sam", "sam"]
    for run in trials:
        for metric in ("train_loss", "val_loss", "val_acc"):
            history = client.get_metric_history(run.info.run_id, metric)
            assert sorted(m.step for m in history) == list(range(EPOCHS)), (run.info.run_name, metric, history)
    # Both nodes ran trials: each trial's run names the Ray node it ran on (one host name for both here).
    ran_on = sorted(m for r in trials for m in marker.get(r.data.tags.get("sharpscale.ray_node_id"), []))
    assert len(ran_on) == TRIALS and set(ran_on) == {"node_a", "node_b"}, ran_on

    # The study file is the study run's artifact, and it reads back through the server.
    study_run = next(r for r in runs if r.data.tags.get("sharpscale.kind") == "study")
    assert [a.path for a in client.list_artifacts(study_run.info.run_id)] == [study.name]
    fetched = client.download_artifacts(study_run.info.run_id, study.name, str(tmp_path / "fetched"))
    assert Path(fetched).read_text() == study.read_text()

    t_all = time.monotonic() - t0
    print(f"two-node cluster and MLflow server up in {t_up:.0f} s; study and checks done in {t_all:.0f} s")

    # Uploaded over HTTP into the server's own store, not written to a path on the client's disk.
    assert exp.artifact_location.startswith("mlflow-artifacts:"), exp.artifact_location
    assert (auth_server["artifacts"] / exp.experiment_id / study_run.info.run_id / "artifacts" / study.name).is_file()
    assert not any((tmp_path / "client_side_mlartifacts").rglob("*.yaml"))
