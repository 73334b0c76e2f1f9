"""`sharpscale server`: the mlflow server command it builds, its warnings, its host and origin checks against a real
server (Host headers sent to 127.0.0.1), and a real server stopped by SIGTERM."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request

import pytest

from studies import server
from studies.server import (
    ServerError,
    ServerOptionError,
    allowed_hosts,
    free_port,
    group_alive,
    is_loopback,
    mlflow_server_command,
    own_host_names,
    pids_in_groups,
    pids_naming,
    start_server,
)
from trainables.secrets import redact as redact_uri


def _opt(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_command_makes_local_paths_absolute_and_serves_artifacts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = mlflow_server_command()
    assert cmd[:4] == [sys.executable, "-m", "studies.ui_app", "server"]  # mlflow server, with the study pages
    assert _opt(cmd, "--backend-store-uri") == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert _opt(cmd, "--artifacts-destination") == str(tmp_path / "mlartifacts")
    assert "--serve-artifacts" in cmd  # clients on other nodes upload over HTTP, no shared filesystem
    assert _opt(cmd, "--host") == "127.0.0.1" and _opt(cmd, "--port") == "5000"
    assert "--workers" not in cmd


def test_command_passes_remote_stores_through():
    cmd = mlflow_server_command(
        backend_store_uri="postgresql://sharpscale@db.internal/mlflow",
        artifacts_destination="s3://bucket/mlartifacts",
        workers=2,
        extra_args=["--x-frame-options", "DENY"],
    )
    assert _opt(cmd, "--backend-store-uri") == "postgresql://sharpscale@db.internal/mlflow"
    assert _opt(cmd, "--artifacts-destination") == "s3://bucket/mlartifacts"
    assert _opt(cmd, "--workers") == "2" and cmd[-2:] == ["--x-frame-options", "DENY"]
    assert "--app-name" not in cmd


@pytest.mark.parametrize("bad", [{"port": 70000}, {"workers": 0}])
def test_command_rejects_bad_numbers_naming_the_rule(bad):
    with pytest.raises(ValueError, match="must hold, got"):
        mlflow_server_command(**bad)


def test_redact_uri_hides_passwords_only():
    assert redact_uri("postgresql://u:hunter2@db/mlflow") == "postgresql://u:***@db/mlflow"
    assert redact_uri("postgresql://u@db/mlflow") == "postgresql://u@db/mlflow"
    assert redact_uri("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.0.1.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.5", False),
        ("::", False),
        ("head.internal", False),
    ],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_serve_warns_loudly_off_loopback_and_never_prints_a_password(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(server, "run_in_process_group", lambda cmd, **kw: seen.append(cmd) or 0)
    monkeypatch.setattr(server, "check_bindable", lambda *args: None)  # port 5000 may be another's on this machine
    # A password in the URI is refused before anything starts (issue 36: on the command line, `ps` showed it).
    with pytest.raises(ServerOptionError, match="PGPASSWORD") as err:
        server.serve(host="0.0.0.0", backend_store_uri="postgresql://u:hunter2@db/mlflow")
    out = capsys.readouterr()
    assert "hunter2" not in str(err.value) + out.out + out.err and not seen
    assert server.serve(host="0.0.0.0", backend_store_uri="postgresql://u@db/mlflow") == 0
    out = capsys.readouterr()
    assert "WARNING" in out.err and "requires no login" in out.err and "--auth" in out.err and "0.0.0.0:5000" in out.err
    assert _opt(seen[0], "--host") == "0.0.0.0"

    assert server.serve(host="127.0.0.1") == 0
    assert "WARNING" not in capsys.readouterr().err


def test_cli_options_and_passthrough(monkeypatch):
    parser = argparse.ArgumentParser()
    server.add_arguments(parser)
    calls = []
    monkeypatch.setattr(server, "serve", lambda **kw: calls.append(kw) or 0)
    args = parser.parse_args(
        [
            "--port",
            "5001",
            "--workers",
            "2",
            "--allowed-host",
            "head-svc",
            "--allowed-host",
            "mlflow.internal",
            "--allowed-origin",
            "https://mlflow.example.com",
            "--",
            "--static-prefix",
            "/mlflow",
        ]
    )
    assert server.from_args(args) == 0
    assert calls == [
        {
            "backend_store_uri": "sqlite:///mlflow.db",
            "artifacts_destination": "./mlartifacts",
            "host": "127.0.0.1",
            "port": 5001,
            "workers": 2,
            "allowed_host": ["head-svc", "mlflow.internal"],
            "allowed_origin": ["https://mlflow.example.com"],
            "auth": None,
            "extra_args": ["--static-prefix", "/mlflow"],
        }
    ]


def test_allowed_hosts_are_loopback_and_this_machines_names_never_a_prefix():
    # MLflow's defaults (issue 36): their `10.*`, `192.168.*`, `172.16.*`... admit `10.evil.example`.
    hosts = allowed_hosts(["head-svc", "mlflow.internal:8443", "*.svc.cluster.local"])
    assert "*" not in hosts and not {"10.*", "192.168.*", "172.16.*", "fc00:*", "fd00:*"} & set(hosts)
    assert all(h.endswith(":*") or "*" not in h or h.startswith("*.") for h in hosts), hosts
    names = own_host_names()
    assert {socket.gethostname().lower(), socket.getfqdn().lower(), "localhost", "127.0.0.1"} <= set(names)
    for name in names:
        assert name in hosts or f"[{name}]" in hosts  # every address of every interface, IPv6 bracketed
    assert {"localhost", "localhost:*", "127.0.0.1:*", "[::1]", "head-svc", "head-svc:*"} <= set(hosts)
    assert {"mlflow.internal:8443", "*.svc.cluster.local:*"} <= set(hosts)
    assert "mlflow.internal" not in hosts  # a name given with its port admits that port only


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"allowed_host": ["*"]}, "--allowed-host"),
        ({"allowed_host": ["*:*"]}, "--allowed-host"),
        ({"allowed_host": ["a,b"]}, "--allowed-host"),
        ({"allowed_host": ["http://head:5000"]}, "--allowed-host"),
        ({"allowed_host": ["10.*"]}, "--allowed-host"),
        ({"allowed_host": ["192.168.*"]}, "--allowed-host"),
        ({"allowed_host": ["*.com"]}, "--allowed-host"),
        ({"allowed_host": ["head*"]}, "--allowed-host"),
        ({"allowed_origin": ["*"]}, "--allowed-origin"),
        ({"allowed_origin": ["https://x.example/path"]}, "--allowed-origin"),
        ({"extra_args": ["--allowed-hosts", "*"]}, "--allowed-host NAME"),
        ({"extra_args": ["--cors-allowed-origins=*"]}, "--allowed-origin ORIGIN"),
        ({"extra_args": ["--disable-security-middleware"]}, "the host check stays on"),
        ({"extra_args": ["--host", "0.0.0.0"]}, "--host before --"),
        ({"environ": {"MLFLOW_SERVER_ALLOWED_HOSTS": "*"}}, "unset MLFLOW_SERVER_ALLOWED_HOSTS"),
        ({"environ": {"MLFLOW_SERVER_DISABLE_SECURITY_MIDDLEWARE": "true"}}, "unset MLFLOW_SERVER_DISABLE"),
    ],
)
def test_bad_host_options_are_refused_naming_the_fix(kwargs, field):
    with pytest.raises(ServerOptionError, match="Fix:") as err:
        mlflow_server_command(**kwargs)
    assert field in str(err.value)


def _request(
    port: int,
    host_header: str,
    method: str = "GET",
    path: str = "/api/2.0/mlflow/experiments/search?max_results=1",
    body: dict | None = None,
    origin: str | None = None,
) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)  # loopback only; the Host header says the rest
    try:
        headers = {"Host": host_header, "Content-Type": "application/json"}
        if origin:
            headers["Origin"] = origin
        conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


@pytest.mark.timeout(240)
def test_server_admits_the_heads_names_and_added_hosts_and_refuses_others(tmp_path, tracking_uri):
    svc = "raycluster-sharpscale-head-svc"
    with start_server(
        backend_store_uri=tracking_uri,
        artifacts_destination=str(tmp_path / "art"),
        allowed_host=[svc, "*.svc.cluster.local"],
        log_path=tmp_path / "server.log",
        timeout_s=180,
        workers=1,
    ) as (_, url):
        port = int(url.rsplit(":", 1)[1])
        admitted = [f"{svc}:{port}", svc, f"{svc}.default.svc.cluster.local:{port}", "localhost", f"127.0.0.1:{port}"]
        for name in own_host_names():  # host name, FQDN, every interface address (here also a non-private one)
            bracketed = f"[{name}]" if ":" in name else name
            admitted += [bracketed, f"{bracketed}:{port}"]
        refused = ["evil.example.com", f"evil.example.com:{port}", f"203.0.113.7:{port}", f"{svc}.evil.example:{port}"]
        got = {h: _request(port, h) for h in admitted + refused}
        assert got == {**{h: 200 for h in admitted}, **{h: 403 for h in refused}}, got

        # The UI as served under the head's own name may change data (MLflow's CORS check); another site may not.
        head = socket.gethostname().lower()
        create = {"method": "POST", "path": "/api/2.0/mlflow/experiments/create"}
        assert (
            _request(port, f"{head}:{port}", **create, body={"name": "from-ui"}, origin=f"http://{head}:{port}") == 200
        )
        assert _request(port, f"{head}:{port}", **create, body={"name": "x"}, origin="http://evil.example.com") == 403


@pytest.mark.timeout(120)
def test_start_server_reports_the_servers_own_error(tmp_path):
    with pytest.raises(ServerError, match="no-such-option"):
        with start_server(
            backend_store_uri=f"sqlite:///{tmp_path / 'm.db'}",
            extra_args=["--no-such-option"],
            timeout_s=90,
            log_path=tmp_path / "server.log",
        ):
            pass


@pytest.mark.timeout(300)
def test_sigterm_stops_the_server_and_all_its_processes(tmp_path, tracking_uri):
    port = free_port()
    code = (
        "import sys; from studies.server import serve; "
        f"sys.exit(serve(backend_store_uri='{tracking_uri}', "
        f"artifacts_destination='{tmp_path / 'art'}', port={port}, workers=2))"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    server_pgid = None
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                    assert resp.status == 200
                    break
            except OSError:
                assert launcher.poll() is None, launcher.stdout.read()
                assert time.monotonic() < deadline, "server never answered"
                time.sleep(0.5)
        children = subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split()
        server_pgid = os.getpgid(int(children[0]))
        assert server_pgid != os.getpgid(launcher.pid)  # the server has its own group, below the launcher
        workers = subprocess.run(["pgrep", "-g", str(server_pgid)], capture_output=True, text=True).stdout.split()
        assert len(workers) >= 2, workers  # uvicorn's supervisor and its workers
        # No MLflow job runner beside them (studies.server: sharpscale submits no MLflow jobs).
        assert not set(pids_in_groups({server_pgid})) & pids_naming("mlflow.server.jobs")

        launcher.send_signal(signal.SIGTERM)  # what `kill`, systemd or a container runtime sends
        assert launcher.wait(timeout=60) == 0
        deadline = time.monotonic() + 30
        while group_alive(server_pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not group_alive(server_pgid), "MLflow server processes survived SIGTERM"
        assert f"MLflow tracking server on http://127.0.0.1:{port}" in launcher.stdout.read()
    finally:
        for pgid in (launcher.pid, server_pgid):
            if pgid is not None and group_alive(pgid):
                os.killpg(pgid, signal.SIGKILL)
        launcher.wait()


@pytest.mark.parametrize("option", ["--gunicorn-opts", "--waitress-opts"])
def test_another_server_than_uvicorn_is_refused_naming_the_fix(option):
    # Served by gunicorn or waitress, MLflow's page would not open the studies on the model-training side.
    with pytest.raises(ServerOptionError, match=f"sets {option} itself.*Fix: use --uvicorn-opts"):
        mlflow_server_command(extra_args=[option, "--timeout 60"])


@pytest.mark.timeout(600)
def test_the_login_servers_page_opens_studies_as_sharpscale_ui_does(auth_server):
    """`sharpscale server --auth` serves the page of studies.ui_app (a new browser on the model-training side, a
    study's address on its view) and answers an old store's bare view tag as MLflow's saved view, writing nothing."""
    import base64

    from mlflow.tracking import MlflowClient

    from studies.records import VIEW_NAME, VIEW_TAG
    from studies.ui_app import WORKFLOW_STORAGE_KEY

    user, password = auth_server["admin"]
    login = {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    with urllib.request.urlopen(urllib.request.Request(auth_server["url"] + "/", headers=login), timeout=60) as resp:
        page = resp.read().decode()
    assert json.dumps(WORKFLOW_STORAGE_KEY) in page and "viewStateShareKey=" in page

    bare = json.dumps({"searchFilter": "tags.`sharpscale.kind` = 'trial'", "orderByKey": "metrics.`val_acc`"})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_USERNAME", user)
        mp.setenv("MLFLOW_TRACKING_PASSWORD", password)
        client = MlflowClient(auth_server["url"])
        exp = client.create_experiment(f"old-store-{os.getpid()}-{time.monotonic_ns()}", tags={VIEW_TAG: bare})
        served = client.get_experiment(exp).tags[VIEW_TAG]  # through the server's REST answer
    saved = json.loads(served)
    assert saved["name"] == VIEW_NAME and saved["state"] == bare and isinstance(saved["createdAt"], int)
    stored = sqlite3.connect(auth_server["dir"] / "mlflow.db").execute(
        "SELECT value FROM experiment_tags WHERE experiment_id = ? AND key = ?", (exp, VIEW_TAG)
    )
    assert stored.fetchone()[0] == bare  # the store keeps what it holds: reading it wrote nothing
