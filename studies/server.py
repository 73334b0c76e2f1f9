"""The MLflow tracking server of a cluster (`sharpscale server`), and the process-group runner it shares with
`sharpscale ui`: a real `mlflow server` that serves artifacts over HTTP and leaves no process behind when stopped."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, Sequence

__all__ = [
    "DEFAULT_ARTIFACTS_DESTINATION",
    "DEFAULT_BACKEND_STORE_URI",
    "ServerError",
    "add_arguments",
    "free_port",
    "from_args",
    "group_alive",
    "is_loopback",
    "mlflow_server_command",
    "redact_uri",
    "run_in_process_group",
    "serve",
    "start_server",
    "stop_process_group",
]

DEFAULT_BACKEND_STORE_URI = "sqlite:///mlflow.db"
DEFAULT_ARTIFACTS_DESTINATION = "./mlartifacts"
DEFAULT_PORT = 5000
STOP_TIMEOUT_S = 15.0


class ServerError(RuntimeError):
    """The MLflow server did not come up; the message carries the end of its log."""


class _StopRequested(Exception):
    """SIGTERM or SIGHUP reached the launcher: stop the server as Ctrl-C would."""


def is_loopback(host: str) -> bool:
    """True when `host` only accepts connections from this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to any interface


def redact_uri(uri: str) -> str:
    """`postgresql://user:secret@host/db` -> `postgresql://user:***@host/db`: URIs get printed and logged."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:/@]+):[^@/]*@", r"\1:***@", uri)


def _resolve_artifacts_destination(destination: str, base: Path | None = None) -> str:
    # A relative directory is taken from where the command runs, once: the server's workers must agree on it.
    if "://" in destination or destination.startswith("mlflow-artifacts:"):
        return destination  # s3://, gs://, wasbs://, file:///...: the server resolves those itself
    return str(((base or Path.cwd()) / destination).resolve())


def mlflow_server_command(
    *,
    backend_store_uri: str = DEFAULT_BACKEND_STORE_URI,
    artifacts_destination: str = DEFAULT_ARTIFACTS_DESTINATION,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    workers: int | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The `python -m mlflow server` command line: relative SQLite paths and artifact directories made absolute,
    `--serve-artifacts` always on (clients on other nodes upload artifacts over HTTP; no shared filesystem).

    backend_store_uri: `sqlite:///mlflow.db` or `postgresql://user@host/db`; the password of the latter comes from
    PGPASSFILE (~/.pgpass) or PGPASSWORD, never from this URI or the repository. Any other SQLAlchemy URI passes through.
    """
    from trainables.tracking import resolve_tracking_uri  # lazy: keeps `import studies.server` to the standard library

    if port < 0 or port > 65535:
        raise ValueError(f"port: 0 <= port <= 65535 must hold, got port={port}.")
    if workers is not None and workers < 1:
        raise ValueError(f"workers: workers >= 1 must hold, got workers={workers}. Fix: omit it for MLflow's default.")
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", resolve_tracking_uri(backend_store_uri),
        "--artifacts-destination", _resolve_artifacts_destination(artifacts_destination),
        "--serve-artifacts",
        "--host", host,
        "--port", str(port),
    ]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    return cmd + list(extra_args)


def _no_auth_warning(host: str, port: int) -> str:
    return (
        f"WARNING: the MLflow server listens on {host}:{port}, not on loopback, and MLflow has no authentication:\n"
        f"  anyone who can reach {host}:{port} can read, change and delete every run and artifact.\n"
        "  Keep the port closed to everything but the cluster's own nodes (security group / firewall), reach the\n"
        "  UI through an SSH tunnel, or add MLflow's basic auth (`-- --app-name basic-auth`). docs/cluster.md, Security."
    )


def stop_process_group(proc: subprocess.Popen, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM the process group that `proc` leads (the server and all of its workers), SIGKILL what outlives it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)  # also reaches workers left behind by a leader that already exited
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            continue
        deadline = time.monotonic() + timeout_s
        while group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not group_alive(proc.pid):
            return


def group_alive(pgid: int) -> bool:
    """True while any process of the process group `pgid` is alive."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@contextlib.contextmanager
def _stop_signals_raise() -> Iterator[None]:
    """Inside: SIGTERM (and SIGHUP, unless ignored as under nohup) raise, so `finally` blocks still run."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread; the caller's own handling applies
        return

    def _raise(signum, frame):
        raise _StopRequested(signal.Signals(signum).name)

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue  # `nohup sharpscale server &` must survive the end of the SSH session
        previous[sig] = signal.signal(sig, _raise)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def _stop_signals_ignored() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def run_in_process_group(
    cmd: Sequence[str], *, env: dict[str, str] | None = None, stop_timeout_s: float = STOP_TIMEOUT_S
) -> int:
    """Run `cmd` in the foreground in its own process group until it exits, Ctrl-C or SIGTERM/SIGHUP.

    Returns the command's exit status, or 0 when the user stopped it. Either way the whole group (a server and
    every worker it forked) is gone on return. Used by `sharpscale server` and `sharpscale ui`.
    """
    # Its own session: Ctrl-C reaches only this launcher, which then stops the group in order (TERM, then KILL).
    proc = subprocess.Popen(list(cmd), start_new_session=True, env=env)
    try:
        with _stop_signals_raise():
            return proc.wait()
    except (KeyboardInterrupt, _StopRequested):
        return 0
    finally:
        with _stop_signals_ignored():  # a second Ctrl-C must not abandon the group half-stopped
            stop_process_group(proc, stop_timeout_s)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    return env


def _checked_command(backend_store_uri, artifacts_destination, host, port, workers, extra_args) -> list[str]:
    """The `mlflow server` command line, with the loud warning a non-loopback bind deserves."""
    cmd = mlflow_server_command(
        backend_store_uri=backend_store_uri,
        artifacts_destination=artifacts_destination,
        host=host,
        port=port,
        workers=workers,
        extra_args=extra_args,
    )
    if not is_loopback(host):
        print(_no_auth_warning(host, port), file=sys.stderr, flush=True)
    return cmd


def serve(
    *,
    backend_store_uri: str = DEFAULT_BACKEND_STORE_URI,
    artifacts_destination: str = DEFAULT_ARTIFACTS_DESTINATION,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    workers: int | None = None,
    extra_args: Sequence[str] = (),
) -> int:
    """Run the MLflow tracking server in the foreground until Ctrl-C or SIGTERM; returns its exit status.

    Loopback only unless `host` says otherwise (then a warning: MLflow has no authentication). Artifacts are
    proxied (`--serve-artifacts`) to `artifacts_destination`: a directory here, or s3://, gs://, ... URIs.
    """
    cmd = _checked_command(backend_store_uri, artifacts_destination, host, port, workers, extra_args)
    backend, artifacts = cmd[cmd.index("--backend-store-uri") + 1], cmd[cmd.index("--artifacts-destination") + 1]
    print(
        f"MLflow tracking server on {_url(host, port)}: runs in {redact_uri(backend)}, artifacts in "
        f"{redact_uri(artifacts)} (served over HTTP). Ctrl-C stops it.",
        flush=True,
    )
    return run_in_process_group(cmd, env=_child_env())


def _url(host: str, port: int) -> str:
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"  # bound to every interface: loopback is one of them
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def start_server(
    *,
    backend_store_uri: str = DEFAULT_BACKEND_STORE_URI,
    artifacts_destination: str = DEFAULT_ARTIFACTS_DESTINATION,
    host: str = "127.0.0.1",
    port: int | None = None,
    workers: int | None = 1,
    extra_args: Sequence[str] = (),
    log_path: str | Path | None = None,
    timeout_s: float = 120.0,
) -> Iterator[tuple[subprocess.Popen, str]]:
    """A real MLflow server in the background for tests and scripts: yields (process, url) once it answers HTTP.

    port=None picks a free one. The server's output goes to `log_path` (a temporary file by default), whose end is
    in the ServerError raised when it does not come up within `timeout_s`. On exit its whole process group stops.
    """
    port = port or free_port(host)
    cmd = _checked_command(backend_store_uri, artifacts_destination, host, port, workers, extra_args)
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="mlflow-server-", suffix=".log")
        os.close(fd)
        log_path = name
    log_path = Path(log_path)
    url = _url(host, port)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=_child_env())
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise ServerError(
                    f"mlflow server exited with status {proc.returncode} before answering on {url}; "
                    f"its log ({log_path}) ends with:\n{_tail(log_path)}"
                )
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ServerError(
                    f"mlflow server did not answer on {url}/health within {timeout_s:.0f} s; "
                    f"its log ({log_path}) ends with:\n{_tail(log_path)}"
                )
            time.sleep(0.25)
        yield proc, url
    finally:
        stop_process_group(proc)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `sharpscale server`, for the CLI."""
    parser.add_argument(
        "--backend-store-uri",
        default=DEFAULT_BACKEND_STORE_URI,
        help="where runs are stored: sqlite:///mlflow.db (relative paths made absolute) or "
        "postgresql://user@host/db (password from PGPASSFILE or PGPASSWORD, never in the URI)",
    )
    parser.add_argument(
        "--artifacts-destination",
        default=DEFAULT_ARTIFACTS_DESTINATION,
        help="where the server stores the artifacts that clients upload over HTTP: a directory, s3://bucket/prefix, "
        "gs://bucket/prefix (default: ./mlartifacts)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1",
        help="bind address (default: loopback only; MLflow has no authentication, see docs/cluster.md)",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--workers", type=int, default=None, help="server worker processes (default: MLflow's, 4)")
    parser.add_argument(
        "extra_args", nargs=argparse.REMAINDER,
        help="after --: options passed to `mlflow server` unchanged, e.g. -- --app-name basic-auth",
    )


def from_args(args: argparse.Namespace) -> int:
    """`sharpscale server` with the options of `add_arguments`."""
    extra = list(args.extra_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    return serve(
        backend_store_uri=args.backend_store_uri,
        artifacts_destination=args.artifacts_destination,
        host=args.host,
        port=args.port,
        workers=args.workers,
        extra_args=extra,
    )
