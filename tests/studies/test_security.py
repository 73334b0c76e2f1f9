"""Issue 36's security cases: no code read from the study's storage (the compile caches live on the node's own disk,
private to the trial's user), host checks that parse addresses (no DNS rebinding through a name that begins like a
private address), one credential rule for every URI, and servers that say why they could not start.
"""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# --- 1. Nothing executable read from shared storage --------------------------------------------------------------


class _Planted:
    """A cache entry as an attacker who can write the study's storage would plant it: unpickling it runs code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def _trial(tiny_model, **train) -> dict:
    return {
        "model": tiny_model("mixer"),
        "data": {"name": "digits", "img_size": 16, "batch_size": 64, "fraction": 0.2},
        "optimizer": {"method": "none", "base": "sgd", "lr": 0.05},
        "schedule": {"epochs": 1, "warmup_epochs": 0},
        "train": {"device": "cpu", "seed": 3, "threads": 1, "compile": "default", **train},
    }


# The trial as a study's trial runs it (trainables.ray_train._execute, Tune's report replaced by a list), with the
# payload a study's driver handed it before issue 36: the study storage's compile_cache named in it.
_STUDY_TRIAL = """
import json, sys
from trainables.config import TrialConfig
from trainables.ray_train import _execute
cfg, payload = TrialConfig.load(json.loads(sys.argv[1])), json.loads(sys.argv[2])
class Checkpoint:
    from_directory = staticmethod(lambda path: path)
_execute(cfg, checkpoint=None, sink=lambda metrics, checkpoint: None, checkpoint_cls=Checkpoint, recorder=None, metric="val_acc",
         probe_from=payload)
"""
_FIT = "import json, sys; from trainables import fit; fit(json.loads(sys.argv[1]))"


def _python(code: str, *args: str, tmpdir: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
    env.update(PYTHONPATH=str(REPO), TMPDIR=str(tmpdir))
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # two CPU compiles of a model (a minute or two), out of `make test-fast`
@pytest.mark.timeout(900)
def test_a_planted_compile_cache_entry_in_the_study_storage_is_never_loaded(tiny_model, tmp_path):
    storage = tmp_path / "storage"
    shared_cache = storage / "compile_cache"
    node = tmp_path / "node"
    node.mkdir(mode=0o700)
    # An earlier trial compiled the same graphs into the storage's cache (a study's trials all did, before issue 36).
    done = _python(_FIT, json.dumps(_trial(tiny_model, compile_cache=str(shared_cache))), tmpdir=node)
    assert done.returncode == 0, done.stderr[-3000:]
    entries = [p for p in shared_cache.rglob("*") if p.is_file()]
    assert entries, "the first trial compiled nothing into the cache"
    # Someone who can write the storage replaces every entry: pickles by a pickle that runs code, modules by code.
    marker = tmp_path / "planted-code-ran"
    payload = pickle.dumps(_Planted(marker))
    for entry in entries:
        if entry.suffix == ".py":
            entry.write_text(f"open({str(marker)!r}, 'w').write('ran')\n" + entry.read_text())
        elif entry.suffix not in (".so", ".cpp", ".h", ".lock"):
            entry.write_bytes(payload)
    ran = _python(
        _STUDY_TRIAL, json.dumps(_trial(tiny_model)), json.dumps({"compile_cache": str(shared_cache)}), tmpdir=node
    )
    assert not marker.exists(), "a trial ran code planted in the study storage's compile cache"
    assert ran.returncode == 0, ran.stderr[-3000:]
    # It compiled into its own node-local cache, private to its user.
    own = node / f"sharpscale-compile-{os.getuid()}"
    assert own.is_dir() and stat.S_IMODE(own.stat().st_mode) == 0o700
    assert any(p.is_file() for p in own.rglob("*"))


def test_the_study_payload_names_no_compile_cache():
    # The driver hands its trials no cache on the study's storage (studies/runner.py built one until issue 36; the
    # payload is studies/tuning.py's now).
    text = (REPO / "studies" / "tuning.py").read_text()
    assert '"compile_cache"' not in text


@pytest.fixture
def node_tmp(tmp_path, monkeypatch):
    """A private temporary directory standing for the node's TMPDIR, and the TORCH* variables put back after."""
    import tempfile

    node = tmp_path / "node"
    node.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(node))
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.setenv(var, "unset-by-the-test")
    return node


def test_the_default_compile_cache_is_node_local_and_private(node_tmp):
    from trainables.compiled import use_cache_dir

    where = use_cache_dir(None)
    assert where == node_tmp / f"sharpscale-compile-{os.getuid()}"
    assert stat.S_IMODE(where.stat().st_mode) == 0o700
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(where)
    assert os.environ["TRITON_CACHE_DIR"] == str(where / "triton")


@pytest.mark.parametrize(
    "case, rule",
    [
        ("default-open", "mode 777"),  # someone made the default folder first, writable by all
        ("explicit-readable", "mode 755"),
        ("parent-writable", "another user could replace"),
        ("link-to-open", "another user could replace"),
        ("a-file", "not a directory"),
    ],
)
def test_a_compile_cache_another_user_could_write_is_refused(case, rule, node_tmp):
    from trainables.compiled import use_cache_dir
    from trainables.errors import TrialRefused

    default = node_tmp / f"sharpscale-compile-{os.getuid()}"
    path = None
    if case == "default-open":
        default.mkdir()
        default.chmod(0o777)
    elif case == "explicit-readable":
        path = node_tmp / "mine"
        path.mkdir()
        path.chmod(0o755)
    elif case == "parent-writable":
        shared = node_tmp / "shared"
        shared.mkdir()
        shared.chmod(0o777)  # writable by all, not sticky: anyone may rename the cache folder away and plant another
        path = shared / "cache"
    elif case == "link-to-open":
        shared = node_tmp / "shared"
        shared.mkdir()
        shared.chmod(0o777)
        (shared / "cache").mkdir(mode=0o700)
        default.symlink_to(shared / "cache")
    else:
        default.write_text("")
    with pytest.raises(TrialRefused, match=rule) as err:
        use_cache_dir(path)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "unset-by-the-test"
    assert "Fix:" in str(err.value)


# --- 2. DNS rebinding: names that begin like private addresses ---------------------------------------------------

# Names an attacker may register and rebind to 127.0.0.1; MLflow's default patterns (10.*, 192.168.*, 172.16.*-
# 172.31.*, fc00:*, fd00:*) admitted each of them by its text.
REBINDING = [
    "10.evil.example",
    "192.168.evil.example",
    "172.16.evil.example",
    "172.31.1.evil.example",
    "10.0.0.1.nip.io",
]


def _rebinding(port: int) -> list[str]:
    return [*REBINDING, *(f"{name}:{port}" for name in REBINDING), "evil.example", f"localhost.evil.example:{port}"]


def _status(port: int, host: str, method: str = "GET", path: str = "/", origin: str | None = None) -> int:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)  # loopback; the Host header says the rest
    try:
        headers = {"Host": host, **({"Origin": origin} if origin else {})}
        if method != "GET":
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=b"{}" if method != "GET" else None, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_host_rule_parses_addresses_and_names_exactly():
    from studies.server import allowed_host_entries, host_allowed

    entries = allowed_host_entries(["10.0.0.5", "head-svc:8443", "*.svc.cluster.local", "fd00::7"])
    for host in ["localhost", "localhost:5000", "127.0.0.1:5000", "[::1]:5000", "[0:0::1]", "10.0.0.5:80"]:
        assert host_allowed(entries, host), host
    for host in ["head-svc:8443", "a.svc.cluster.local:5000", "[fd00::7]:5000", "LOCALHOST"]:
        assert host_allowed(entries, host), host
    refused = [*_rebinding(5000), "10.0.0.6", "10.0.0.5.evil.example", "head-svc", "head-svc:80", "svc.cluster.local"]
    refused += ["[fd00::8]", "127.0.0.1.evil.example", "2130706433", "", "local host", "localhost:80:80", "[::1"]
    for host in refused:
        assert not host_allowed(entries, host), host


@pytest.mark.parametrize(
    "origin, host, ok",
    [
        (None, "localhost:8080", True),  # no browser's request: no page made it
        ("http://localhost:8080", "localhost:8080", True),
        ("http://127.0.0.1:8080", "127.0.0.1:8080", True),
        ("http://evil.example", "localhost:8080", False),
        ("http://localhost:3000", "localhost:8080", False),  # another local server's page
        ("null", "localhost:8080", False),
        ("http://10.evil.example:8080", "localhost:8080", False),
    ],
)
def test_a_write_is_accepted_only_from_the_servers_own_pages(origin, host, ok):
    from studies.server import origin_allowed

    assert origin_allowed(origin, host) is ok


@pytest.mark.parametrize("entry", ["10.*", "192.168.*", "172.16.*", "fd00:*", "*.com", "*", "head*", "1?.0.0.1"])
def test_an_allowed_host_pattern_that_admits_by_prefix_is_refused(entry):
    from studies.server import ServerOptionError, allowed_host_entries

    with pytest.raises(ServerOptionError, match="Fix:"):
        allowed_host_entries([entry])


def _recorded_study(where: Path, uri: str) -> tuple[Path, str]:
    """The quickstart study as `sharpscale run` leaves it before any trial (its study run, Optuna storage and
    one cell's Optuna study); returns (study file, Optuna storage)."""
    import optuna

    from studies import identity
    from studies.launch import choose_launch, experiment, parent_runs
    from studies.runner import state_locations
    from studies.spec import load_study
    from trainables.naming import launch_name
    from trainables.tracking import tracking_client

    where.mkdir(parents=True, exist_ok=True)
    path = where / "study.yaml"
    path.write_text((REPO / "studies" / "quickstart.yaml").read_text())
    study = load_study(path, require_data=False)
    client = tracking_client(uri)
    exp_id = experiment(client, study.experiment_name, where / "mlartifacts", uri)
    launch = choose_launch(client, exp_id, study, study.experiment_name, uri, new_launch=False)
    run_name = launch_name(study.experiment_name, launch)
    locations = state_locations(study, run_name)
    opened: list[str] = []
    run_id = parent_runs(client, study, exp_id, "abc", None, locations.tags(), launch, opened, {})
    identity.write_launch_record(
        f"{locations.storage}/{run_name}", identity.launch_record(study, uri, exp_id, run_id, launch)
    )
    for rid in opened:
        client.set_terminated(rid, status="KILLED")
    storage = locations.optuna_storage
    Path(storage[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    optuna.create_study(storage=storage, study_name="quickstart:sam")
    return path, storage


def _answering(port: int, host: str) -> int | None:
    try:
        return _status(port, host)
    except OSError:
        return None


@pytest.mark.timeout(300)
def test_dashboard_refuses_rebinding_names_and_writes_from_other_origins(tmp_path, tracking_uri, cli_process):
    import optuna

    from studies.server import free_port

    path, storage = _recorded_study(tmp_path / "study", tracking_uri)
    port = free_port()
    proc = cli_process.start(
        "dashboard", path, "--tracking-uri", tracking_uri, "--port", port, "--allow-writes", cwd=tmp_path
    )
    own = f"127.0.0.1:{port}"
    cli_process.wait_for(proc, lambda: _answering(port, own), timeout=240, what="the dashboard answering")
    assert _status(port, own, path="/api/studies") == 200
    got = {host: _status(port, host, path="/api/studies") for host in _rebinding(port)}
    assert got == dict.fromkeys(got, 403), got
    for host in _rebinding(port):  # DELETE through a rebound name: refused, whatever its Origin
        assert _status(port, host, "DELETE", "/api/studies/1", origin=f"http://{host}") == 403
    # Addressed to this machine, but sent by another site's page (or a sandboxed one): no change either.
    for origin in ["http://evil.example", "http://10.evil.example", f"http://localhost:{port + 1}", "null"]:
        assert _status(port, own, "DELETE", "/api/studies/1", origin=origin) == 403, origin
    assert optuna.get_all_study_names(storage) == ["quickstart:sam"]
    # The dashboard's own page may (the write goes through, as --allow-writes says).
    assert _status(port, own, "DELETE", "/api/studies/1", origin=f"http://{own}") in (200, 204)
    assert optuna.get_all_study_names(storage) == []


@pytest.mark.timeout(240)
def test_ui_refuses_rebinding_names(tmp_path, tracking_uri, cli_process):
    from studies.server import free_port

    port = free_port()
    proc = cli_process.start("ui", "--tracking-uri", tracking_uri, "--port", port)
    own = f"127.0.0.1:{port}"
    cli_process.wait_for(proc, lambda: _answering(port, own), timeout=180, what="the UI answering", every=1)
    api = "/api/2.0/mlflow/experiments/search?max_results=1"
    assert _status(port, own, path=api) == 200
    assert _status(port, f"localhost:{port}", path=api) == 200
    got = {host: _status(port, host, path=api) for host in _rebinding(port)}
    assert got == dict.fromkeys(got, 403), got


@pytest.mark.timeout(240)
def test_server_refuses_rebinding_names(tmp_path, tracking_uri):
    from studies.server import start_server

    with start_server(
        backend_store_uri=tracking_uri,
        artifacts_destination=str(tmp_path / "art"),
        log_path=tmp_path / "server.log",
        timeout_s=180,
        workers=1,
    ) as (_, url):
        port = int(url.rsplit(":", 1)[1])
        api = "/api/2.0/mlflow/experiments/search?max_results=1"
        assert _status(port, f"127.0.0.1:{port}", path=api) == 200
        got = {host: _status(port, host, path=api) for host in _rebinding(port)}
        assert got == dict.fromkeys(got, 403), got


# --- 3. Credentials in every form: refused at the door, never echoed ---------------------------------------------

SECRET = "hunter2xyz"
CREDENTIAL_CASES = [
    ("query-password", ["--set", f"optuna_storage=postgresql://admin@db/optuna?password={SECRET}"], "PGPASSWORD"),
    ("data-root-userinfo", ["--set", f"data.root=s3://AKIAKEY:{SECRET}@bucket/cifar10"], "credentials file"),
    ("storage-query", ["--storage", f"s3://bucket/runs?secret_key={SECRET}"], "credentials file"),
    ("storage-sig", ["--storage", f"gs://bucket/runs?X-Goog-Signature={SECRET}"], "credentials file"),
    ("tracking-token", ["--set", f"tracking.uri=http://{SECRET}@127.0.0.1:5000"], "MLFLOW_TRACKING_TOKEN"),
]


@pytest.mark.parametrize("extra, fix", [c[1:] for c in CREDENTIAL_CASES], ids=[c[0] for c in CREDENTIAL_CASES])
def test_validate_refuses_a_credential_in_any_form_without_showing_it(extra, fix, tmp_path, monkeypatch, capsys):
    from studies.cli import EXIT_USAGE, main

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "study.yaml"
    path.write_text((REPO / "studies" / "quickstart.yaml").read_text())
    assert main(["validate", str(path), *extra]) == EXIT_USAGE
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err
    assert "carries" in out.err and fix in out.err and "***" in out.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]


@pytest.mark.parametrize(
    "argv, fix",
    [
        (["export", "--tracking-uri", f"http://{SECRET}@127.0.0.1:9", "DEST"], "MLFLOW_TRACKING_TOKEN"),
        (["ui", "--tracking-uri", f"http://{SECRET}@127.0.0.1:9"], "MLFLOW_TRACKING_TOKEN"),
        (["data", "fetch", "cifar10", "--to", "DEST", "--url", f"http://u:{SECRET}@127.0.0.1:9/c.tar.gz"], "drop it"),
        (["data", "fetch", "cifar10", "--to", f"s3://bucket/data?access_key={SECRET}"], "drop it"),
        (["server", "--backend-store-uri", f"postgresql://u:{SECRET}@db/mlflow"], "PGPASSWORD"),
        (["server", "--backend-store-uri", f"postgresql://u@db/mlflow?password={SECRET}"], "PGPASSWORD"),
    ],
    ids=["export-token", "ui-token", "fetch-url", "fetch-to", "server-userinfo", "server-query"],
)
def test_the_commands_refuse_a_credential_without_showing_or_passing_it(argv, fix, tmp_path, monkeypatch, capsys):
    from studies import server
    from studies.cli import main

    monkeypatch.chdir(tmp_path)
    started = []
    monkeypatch.setattr(server, "run_in_process_group", lambda cmd, **kw: started.append(cmd) or 0)
    argv = [str(tmp_path / "dest") if a == "DEST" else a for a in argv]
    assert main(argv) == 2
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err
    assert "carries" in out.err and fix in out.err
    assert started == [] and not (tmp_path / "dest").exists()  # no child given it, nothing fetched


def test_one_redaction_hides_every_form():
    from trainables.secrets import redact

    cases = {
        f"postgresql://admin@db/x?password={SECRET}&sslmode=require": "postgresql://admin@db/x?password=***&sslmode=require",
        f"http://{SECRET}@host:5000/api": "http://***@host:5000/api",
        f"s3://KEY:{SECRET}@bucket/k": "s3://KEY:***@bucket/k",
        f"https://acct.blob/c?sv=2024&sig={SECRET}": "https://acct.blob/c?sv=2024&sig=***",
        f"s3://b/r?X-Amz-Credential={SECRET}&X-Amz-Security-Token={SECRET}": "s3://b/r?X-Amz-Credential=***&X-Amz-Security-Token=***",
        f"gs://b/r?token={SECRET} and db://u@h/x?sslkey=/k": "gs://b/r?token=*** and db://u@h/x?sslkey=/k",
        "postgresql://bob@db/x sqlite:////tmp/m.db http://h:5000": "postgresql://bob@db/x sqlite:////tmp/m.db http://h:5000",
    }
    for text, hidden in cases.items():
        assert redact(text) == hidden, text


def test_a_user_at_host_uri_reaches_its_server(tmp_path):
    # The reachability check connects without the user info (urllib took it for part of the host): any HTTP answer.
    import http.server
    import threading

    from trainables.tracking import _check_server_answers

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler) as httpd:
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            _check_server_answers(f"http://bob@127.0.0.1:{httpd.server_address[1]}")
            _check_server_answers(f"http://bob:pw@127.0.0.1:{httpd.server_address[1]}")
        finally:
            httpd.shutdown()
    from trainables.secrets import without_userinfo

    assert without_userinfo("http://bob:pw@h:5000/p?q=1") == "http://h:5000/p?q=1"
    assert without_userinfo("postgresql://bob@db/x") == "postgresql://db/x"


# --- 9. Servers that cannot listen say why and exit non-zero -----------------------------------------------------


@pytest.fixture
def busy_port():
    """A port held by a listening socket for the test's length."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "argv, cause",
    [
        (["ui", "--port", "BUSY"], "another process holds that port"),
        (["ui", "--host", "192.0.2.7"], "not an address of this machine"),  # TEST-NET-1: never this machine's
        (["server", "--port", "BUSY"], "another process holds that port"),
        (["server", "--host", "192.0.2.7"], "not an address of this machine"),
        (["dashboard", "STUDY", "--port", "70000"], "port <= 65535"),
        (["dashboard", "STUDY", "--port", "BUSY"], "another process holds that port"),
    ],
    ids=["ui-busy", "ui-foreign", "server-busy", "server-foreign", "dashboard-70000", "dashboard-busy"],
)
def test_a_server_that_cannot_listen_exits_non_zero_with_the_cause(argv, cause, busy_port, tmp_path, cli_process):
    path = tmp_path / "study.yaml"
    path.write_text((REPO / "studies" / "quickstart.yaml").read_text())
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = [str(busy_port) if a == "BUSY" else str(path) if a == "STUDY" else a for a in argv]
    store = ["--backend-store-uri", uri] if argv[0] == "server" else ["--tracking-uri", uri]
    done = cli_process.run(*argv, *store, cwd=tmp_path, timeout=200)
    assert done.returncode != 0, done.stdout + done.stderr
    assert cause in done.stderr and "Fix:" in done.stderr and "Traceback" not in done.stderr, done.stderr
