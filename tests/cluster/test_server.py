"""`sharpscale server`: the mlflow server command it builds, its warnings, and a real server stopped by SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from studies import server
from studies.server import (
    ServerError,
    free_port,
    group_alive,
    is_loopback,
    mlflow_server_command,
    redact_uri,
    start_server,
)


def _opt(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_command_makes_local_paths_absolute_and_serves_artifacts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = mlflow_server_command()
    assert cmd[:4] == [sys.executable, "-m", "mlflow", "server"]
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
        extra_args=["--app-name", "basic-auth"],
    )
    assert _opt(cmd, "--backend-store-uri") == "postgresql://sharpscale@db.internal/mlflow"
    assert _opt(cmd, "--artifacts-destination") == "s3://bucket/mlartifacts"
    assert _opt(cmd, "--workers") == "2" and cmd[-2:] == ["--app-name", "basic-auth"]


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
    [("127.0.0.1", True), ("127.0.1.1", True), ("::1", True), ("localhost", True),
     ("0.0.0.0", False), ("10.0.0.5", False), ("::", False), ("head.internal", False)],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_serve_warns_loudly_off_loopback_and_never_prints_a_password(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(server, "run_in_process_group", lambda cmd, **kw: seen.append(cmd) or 0)
    assert server.serve(host="0.0.0.0", backend_store_uri="postgresql://u:hunter2@db/mlflow") == 0
    out = capsys.readouterr()
    assert "WARNING" in out.err and "no authentication" in out.err and "0.0.0.0:5000" in out.err
    assert "hunter2" not in out.out + out.err
    assert _opt(seen[0], "--host") == "0.0.0.0"

    assert server.serve(host="127.0.0.1") == 0
    assert "WARNING" not in capsys.readouterr().err


def test_cli_options_and_passthrough(monkeypatch):
    parser = argparse.ArgumentParser()
    server.add_arguments(parser)
    calls = []
    monkeypatch.setattr(server, "serve", lambda **kw: calls.append(kw) or 0)
    args = parser.parse_args(["--port", "5001", "--workers", "2", "--", "--app-name", "basic-auth"])
    assert server.from_args(args) == 0
    assert calls == [{
        "backend_store_uri": "sqlite:///mlflow.db", "artifacts_destination": "./mlartifacts", "host": "127.0.0.1",
        "port": 5001, "workers": 2, "extra_args": ["--app-name", "basic-auth"],
    }]


@pytest.mark.timeout(120)
def test_start_server_reports_the_servers_own_error(tmp_path):
    with pytest.raises(ServerError, match="no-such-option"):
        with start_server(
            backend_store_uri=f"sqlite:///{tmp_path / 'm.db'}", extra_args=["--no-such-option"], timeout_s=90,
            log_path=tmp_path / "server.log",
        ):
            pass




@pytest.mark.timeout(300)
def test_sigterm_stops_the_server_and_all_its_processes(tmp_path):
    port = free_port()
    code = (
        "import sys; from studies.server import serve; "
        f"sys.exit(serve(backend_store_uri='sqlite:///{tmp_path / 'mlflow.db'}', "
        f"artifacts_destination='{tmp_path / 'art'}', port={port}, workers=2))"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
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
