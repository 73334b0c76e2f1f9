"""The MLflow tracking server of a cluster (`sharpscale server`), and the process-group runner it shares with
`sharpscale ui`: a real `mlflow server` that serves artifacts over HTTP, admits the head's own names, can require a
login (MLflow's basic auth), and leaves no process behind when stopped."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from trainables.errors import UserError
from trainables.naming import DEFAULT_ARTIFACT_ROOT, DEFAULT_TRACKING_URI
from trainables.secrets import credential_problem, redact

__all__ = [
    "DEFAULT_ADMIN_USERNAME",
    "DEFAULT_ARTIFACTS_DESTINATION",
    "DEFAULT_BACKEND_STORE_URI",
    "Auth",
    "ServerError",
    "ServerOptionError",
    "add_arguments",
    "LOOPBACK_HOSTS",
    "allowed_host_entries",
    "allowed_hosts",
    "allowed_origins",
    "auth_database_uri",
    "check_bindable",
    "free_port",
    "guard_wsgi",
    "from_args",
    "group_alive",
    "host_allowed",
    "origin_allowed",
    "is_loopback",
    "warn_if_exposed",
    "mlflow_server_command",
    "own_host_names",
    "run_in_process_group",
    "serve",
    "start_server",
    "stop_process_group",
]

# The server serves the store and artifact root that studies write to when nothing else is given.
DEFAULT_BACKEND_STORE_URI = DEFAULT_TRACKING_URI
DEFAULT_ARTIFACTS_DESTINATION = f"./{DEFAULT_ARTIFACT_ROOT}"
DEFAULT_PORT = 5000
DEFAULT_ADMIN_USERNAME = "admin"
STOP_TIMEOUT_S = 15.0

# MLflow's own environment variables that `--auth` reads or sets (names from mlflow.environment_variables).
_ADMIN_USERNAME_ENV = "MLFLOW_AUTH_ADMIN_USERNAME"
_ADMIN_PASSWORD_ENV = "MLFLOW_AUTH_ADMIN_PASSWORD"
_AUTH_CONFIG_ENV = "MLFLOW_AUTH_CONFIG_PATH"
_SECRET_KEY_ENV = "MLFLOW_FLASK_SERVER_SECRET_KEY"

# `mlflow server` options that sharpscale sets itself, and what to use instead of passing them after `--`.
_OWNED_OPTIONS = {
    "--backend-store-uri": "--backend-store-uri before --",
    "--artifacts-destination": "--artifacts-destination before --",
    "--serve-artifacts": "nothing: artifacts are always served over HTTP",
    "--no-serve-artifacts": "nothing: artifacts are always served over HTTP",
    "--host": "--host before --",
    "-h": "--host before --",
    "--port": "--port before --",
    "-p": "--port before --",
    "--workers": "--workers before --",
    "-w": "--workers before --",
    "--allowed-hosts": "--allowed-host NAME (repeatable) before --",
    "--cors-allowed-origins": "--allowed-origin ORIGIN (repeatable) before --",
    "--disable-security-middleware": "--allowed-host NAME for each name clients use; the host check stays on",
    "--app-name": "--auth for MLflow's basic auth",
    # Served by another server than uvicorn, MLflow's page would open on the GenAI side (studies.ui_app).
    "--gunicorn-opts": "--uvicorn-opts '...' (sharpscale serves MLflow's UI through uvicorn)",
    "--waitress-opts": "--uvicorn-opts '...' (sharpscale serves MLflow's UI through uvicorn)",
}
# Settings of MLflow's host and origin checks that would silently replace or switch off the lists built here.
_OWNED_ENV = {
    "MLFLOW_SERVER_ALLOWED_HOSTS": "--allowed-host NAME",
    "MLFLOW_SERVER_CORS_ALLOWED_ORIGINS": "--allowed-origin ORIGIN",
    "MLFLOW_SERVER_DISABLE_SECURITY_MIDDLEWARE": "--allowed-host NAME for each name clients use",
}


class ServerError(RuntimeError):
    """The MLflow server did not come up; the message carries the end of its log."""


class ServerOptionError(UserError):
    """An option of `sharpscale server` is wrong; the message names it, the rule, the value and the fix."""


class _StopRequested(Exception):
    """SIGTERM or SIGHUP reached the launcher: stop the server as Ctrl-C would."""


@dataclass(frozen=True)
class Auth:
    """`sharpscale server --auth`: MLflow's basic-auth app (every request needs a user name and password).

    The admin user is created on the first start, named by MLFLOW_AUTH_ADMIN_USERNAME (default `admin`), with
    the password from `password_file` or else from MLFLOW_AUTH_ADMIN_PASSWORD. Users and permissions live in
    `database_uri`, by default beside the backend store (see `auth_database_uri`).
    """

    password_file: str | None = None
    database_uri: str | None = None


def is_loopback(host: str) -> bool:
    """True when `host` only accepts connections from this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to any interface


def warn_if_exposed(what: str, host: str, port: int, holds: str, *, writes: bool) -> None:
    """One line on stderr when a login-free server (`ui`, `dashboard`) binds `host`, not loopback: the network reads
    everything it `holds` (and changes it, where it takes `writes`)."""
    if is_loopback(host):
        return
    print(
        f"WARNING: {what} listens on {host}:{port}, not on loopback, with no login: anyone who reaches it reads "
        f"{holds}{' and may change or delete them' if writes else ''}. Prefer the default 127.0.0.1 and an SSH tunnel.",
        file=sys.stderr,
        flush=True,
    )


# Requests that change what a server holds: refused by `guard_wsgi` unless writes are allowed.
WRITE_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})


def _split_host_header(header: str) -> tuple[str, str] | None:
    """(host, port) of a Host header or an origin's netloc (`name`, `name:port`, `[v6]`, `[v6]:port`), lowercased,
    or None when it is none of these."""
    header = header.strip().lower()
    if header.startswith("["):
        host, sep, rest = header[1:].partition("]")
        if not sep or (rest and not re.fullmatch(r":[0-9]{1,5}", rest)):
            return None
        return host, rest[1:]
    host, sep, port = header.partition(":")
    if sep and not re.fullmatch(r"[0-9]{1,5}", port):
        return None
    return host, port


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None


def _entry_split(entry: str) -> tuple[str, str] | None:
    # An IPv6 address may come unbracketed (own_host_names, --allowed-host): no port then.
    return (entry.strip("[]").lower(), "") if _address(entry) is not None else _split_host_header(entry)


def host_allowed(entries: Sequence[str], header: str) -> bool:
    """Whether a request addressed to `header` (its Host header) reaches a server that answers `entries` (as
    `allowed_host_entries` makes them). An IP literal is parsed and compared as an address, never as text (so
    `10.evil.example`, a name an attacker may rebind to this machine, is no address of a private network); a name
    must equal an entry, or end in the suffix of a `*.domain` entry; an entry with a port admits that port only."""
    split = _split_host_header(header)
    if split is None or not split[0]:
        return False
    host, port = split
    address = _address(host)
    if address is None and (":" in host or not re.fullmatch(r"[a-z0-9._-]+", host)):
        return False
    for entry in entries:
        own = _entry_split(entry)
        if own is None or (own[1] and own[1] != port):
            continue
        name = own[0]
        if address is not None:
            if _address(name) == address:
                return True
        elif name == host.rstrip(".") or (name.startswith("*.") and host.endswith(name[1:])):
            return True
    return False


def origin_allowed(header: str | None, host: str) -> bool:
    """Whether a state-changing request with Origin `header` may go to a server reached as `host` (its Host
    header, already admitted): only from the server's own pages (same scheme-less host and port). No Origin: not
    a browser's request (browsers send one with every write), so no page of another site made it."""
    if header is None:
        return True
    match = re.fullmatch(r"https?://([^/\s]+)", header.strip().lower())
    if match is None:  # "null" (a sandboxed page, a file), a path, a malformed value
        return False
    origin, asked = _split_host_header(match.group(1)), _split_host_header(host)
    if origin is None or asked is None:
        return False
    same_host = origin[0] == asked[0] or (_address(origin[0]) is not None and _address(origin[0]) == _address(asked[0]))
    return same_host and (origin[1] or "80") == (asked[1] or "80")


def guard_wsgi(app, hosts: Sequence[str], *, writes: bool):
    """`app` (a WSGI application) answering only requests addressed to `hosts` (entries as `allowed_host_entries`
    makes them, matched by `host_allowed`: a page on another site that rebinds its name to this machine sends its
    own name, and gets 403), and, unless `writes`, refusing every request that would change something (405):
    nothing authenticates them. With `writes`, a change is accepted only from this server's own pages (its Origin:
    `origin_allowed`), so another site's page open in the user's browser cannot make one."""
    allowed = list(hosts)

    def guarded(environ, start_response):
        host = environ.get("HTTP_HOST", "")
        if not host_allowed(allowed, host):
            start_response("403 Forbidden", [("Content-Type", "text/plain")])
            return [f"Host {host!r} is not allowed (possible DNS rebinding); add it with --allowed-host.\n".encode()]
        if environ.get("REQUEST_METHOD", "GET").upper() in WRITE_METHODS:
            if not writes:
                start_response("405 Method Not Allowed", [("Content-Type", "text/plain"), ("Allow", "GET, HEAD")])
                return [b"Read-only: this server was started without --allow-writes.\n"]
            origin = environ.get("HTTP_ORIGIN")
            if not origin_allowed(origin, host):
                start_response("403 Forbidden", [("Content-Type", "text/plain")])
                return [f"Origin {origin!r} may not change this server's data (another site's page).\n".encode()]
        return app(environ, start_response)

    return guarded


def own_host_names() -> list[str]:
    """This machine's names and the address of every interface it has: what a client may write in a Host header
    to reach a server here (host name, FQDN, localhost, IPv4 and IPv6 addresses; IPv6 scope ids dropped)."""
    import psutil  # lazy: keeps `import studies.server` to the standard library

    names = [socket.gethostname(), socket.getfqdn(), "localhost"]
    for addresses in psutil.net_if_addrs().values():
        names += [a.address.split("%", 1)[0] for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6)]
    return list(dict.fromkeys(n.lower() for n in names if n))


def _ipv6(entry: str) -> str | None:
    try:
        address = ipaddress.ip_address(entry.strip("[]"))
    except ValueError:
        return None
    return str(address) if address.version == 6 else None


def _has_port(entry: str) -> bool:
    return re.search(r"(^[^:]+|\])(:[0-9]+)$", entry) is not None


def _host_patterns(entry: str) -> list[str]:
    """One host as MLflow matches Host headers: exactly, or by fnmatch when the pattern holds `*`. A client sends
    the port too unless it is the scheme's default, so a name without a port also admits it with any port (as
    MLflow's own defaults do for localhost); an IPv6 address is bracketed, and `[` escaped for fnmatch."""
    if (v6 := _ipv6(entry)) is not None:
        return [f"[{v6}]", f"[[]{v6}]:*"]
    return [entry] if _has_port(entry) else [entry, f"{entry}:*"]


# An --allowed-host entry: an address (IPv6 bracketed or not), a name, or `*.` and a domain of two labels or more,
# each with an optional port. No other wildcard: `10.*` would admit `10.evil.example`, a name anyone may register
# and rebind to this machine; `*.com` every site.
_NAME = r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*"
_ENTRY = re.compile(rf"(\*\.)?(?P<name>{_NAME})(:[0-9]{{1,5}})?")

# What a client on this machine writes in a Host header (any port): loopback's names and addresses, and 0.0.0.0,
# which browsers send to this machine.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0")


def _check_allowed_host(entry: str) -> str:
    field = "--allowed-host"
    value = entry.strip().lower()
    split = _entry_split(value)
    if split is not None and _address(split[0]) is not None:
        return value
    match = _ENTRY.fullmatch(value)
    if match is None or (value.startswith("*.") and "." not in match.group("name")):
        raise ServerOptionError(
            f"{field}: one host name, one address, or '*.' and a domain of two labels or more, each with an "
            f"optional :PORT, must be given (no other wildcard: a pattern such as '10.*' admits a name like "
            f"'10.evil.example' that anyone can point at this machine; no spaces, commas, slashes or '*' alone), got "
            f"{entry!r}. Fix: e.g. {field} mlflow.internal {field} 10.0.0.5 {field} '*.svc.cluster.local'"
        )
    return value


def allowed_host_entries(extra: Sequence[str] = (), bound: str | None = None) -> list[str]:
    """The hosts a server here answers: loopback (LOOPBACK_HOSTS), this machine's names and addresses
    (`own_host_names`), the name it is bound to (`bound`, when a name), and `extra` (the `--allowed-host` values,
    checked). Private networks are admitted through their addresses, as this machine's own or as named, never by a
    text prefix."""
    bound_name = [bound.lower()] if bound and _address(bound) is None else []
    entries = [*LOOPBACK_HOSTS, *own_host_names(), *bound_name, *(_check_allowed_host(e) for e in extra)]
    return list(dict.fromkeys(entries))


def allowed_hosts(extra: Sequence[str] = (), bound: str | None = None) -> list[str]:
    """`allowed_host_entries` as MLflow's host check matches Host headers (`--allowed-hosts`): each exactly, or by
    fnmatch where it holds `*` (a name's port, a `*.domain` entry). MLflow's own defaults are left out: their
    `10.*`, `192.168.*`, `172.16.*`... admit any name that begins so. Never `*`: any other name gets 403."""
    patterns: list[str] = []
    for entry in allowed_host_entries(extra, bound):
        patterns += _host_patterns(entry)
    return list(dict.fromkeys(patterns))


def allowed_origins(port: int, hosts: Sequence[str] = (), extra: Sequence[str] = ()) -> list[str]:
    """The browser origins that may change state (MLflow's CORS check; localhost origins it admits itself): the
    UI as served under this machine's names and the `--allowed-host` names (`http://NAME:PORT`, or the name's
    own port), plus `extra` (the `--allowed-origin` values, e.g. https://mlflow.example.com behind a proxy)."""
    origins = []
    for entry in [*own_host_names(), *(_check_allowed_host(h) for h in hosts)]:
        if (v6 := _ipv6(entry)) is not None:
            origins.append(f"http://[{v6}]:{port}")
        elif "*" not in entry:
            origins.append(f"http://{entry}" if _has_port(entry) else f"http://{entry}:{port}")
    for origin in extra:
        if not re.fullmatch(r"https?://[^\s,/*]+", origin):
            raise ServerOptionError(
                f"--allowed-origin: scheme://host[:port] with no path, spaces, commas or '*' must be given, got "
                f"{origin!r}. Fix: e.g. --allowed-origin https://mlflow.example.com"
            )
        origins.append(origin.lower())
    return list(dict.fromkeys(origins))


def _check_extra_args(extra_args: Sequence[str], environ: Mapping[str, str]) -> None:
    for arg in extra_args:
        option = arg.split("=", 1)[0]
        if option in _OWNED_OPTIONS:
            raise ServerOptionError(
                f"extra mlflow server options: sharpscale sets {option} itself, got {arg!r} after --. "
                f"Fix: use {_OWNED_OPTIONS[option]}."
            )
    for name, fix in _OWNED_ENV.items():
        if environ.get(name, "").strip().lower() not in ("", "0", "false"):
            raise ServerOptionError(
                f"environment: sharpscale server builds MLflow's host and origin checks itself, but {name} is set "
                f"(to {environ[name]!r}), which would replace or switch them off. Fix: unset {name} and use {fix}."
            )


def auth_database_uri(backend_store_uri: str) -> str:
    """Where `--auth` keeps users and permissions by default: beside the backend store. An SQLite store
    `.../mlflow.db` gets `.../mlflow-auth.db`; any other database (PostgreSQL, MySQL) holds the auth tables
    itself (they do not clash with MLflow's, and have their own migration table)."""
    from trainables.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(backend_store_uri)
    prefix = "sqlite:///"
    if uri.startswith(prefix):
        path = Path(uri[len(prefix) :])
        return prefix + str(path.with_name(f"{path.stem}-auth{path.suffix or '.db'}"))
    return uri


def _auth_env(auth: Auth, backend_store_uri: str, config_dir: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The server's environment for basic auth, after checking the admin password is given once. The config file
    written to `config_dir` holds no secret: the password reaches MLflow through MLFLOW_AUTH_ADMIN_PASSWORD."""
    import importlib.util

    from trainables.tracking import resolve_tracking_uri

    if importlib.util.find_spec("flask_wtf") is None:  # what MLflow's basic-auth app imports first
        raise ServerOptionError(
            "--auth: MLflow's basic-auth app needs the mlflow[auth] extra (Flask-WTF), which is not installed here. "
            "Fix: pip install -c constraints.txt '.[auth]' in the repository (`make install` does), or "
            "pip install 'mlflow[auth]>=3.17,<3.18'."
        )
    password = environ.get(_ADMIN_PASSWORD_ENV) or None
    if auth.password_file is not None:
        if password is not None:
            raise ServerOptionError(
                f"--admin-password-file: give the admin password once, but {_ADMIN_PASSWORD_ENV} is set as well. "
                f"Fix: unset {_ADMIN_PASSWORD_ENV} or drop --admin-password-file."
            )
        try:
            password = Path(auth.password_file).expanduser().read_text().rstrip("\r\n")
        except OSError as err:
            raise ServerOptionError(
                f"--admin-password-file: a readable file holding the admin password must be given, got "
                f"{auth.password_file!r} ({err.strerror}). Fix: create it with mode 600, e.g. "
                f"`(umask 077; python -c 'import secrets; print(secrets.token_urlsafe(24))' > FILE)`."
            ) from None
        if not password:
            raise ServerOptionError(
                f"--admin-password-file: the file must hold the admin password, got an empty file "
                f"{auth.password_file!r}. Fix: write the password (12 characters or more) into it."
            )
    if password is None:
        raise ServerOptionError(
            f"--auth: MLflow needs an admin password to create its admin user, got neither --admin-password-file "
            f"nor {_ADMIN_PASSWORD_ENV}. Fix: --admin-password-file FILE (mode 600, 12 characters or more), or "
            f"export {_ADMIN_PASSWORD_ENV} in the server's environment."
        )
    database = resolve_tracking_uri(auth.database_uri) if auth.database_uri else auth_database_uri(backend_store_uri)
    config = config_dir / "basic_auth.ini"
    config.write_text(
        "[mlflow]\n"
        "default_permission = READ\n"
        f"database_uri = {database}\n"
        f"admin_username = {DEFAULT_ADMIN_USERNAME}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    return {
        _AUTH_CONFIG_ENV: str(config),
        _ADMIN_PASSWORD_ENV: password,
        # CSRF tokens of the login forms; one random key per start is enough for a single server.
        _SECRET_KEY_ENV: environ.get(_SECRET_KEY_ENV) or secrets.token_hex(32),
    }


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
    allowed_host: Sequence[str] = (),
    allowed_origin: Sequence[str] = (),
    auth: bool = False,
    extra_args: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """The `mlflow server` command line (run as `python -m studies.ui_app server`), every option checked: relative SQLite paths and artifact
    directories made absolute, `--serve-artifacts` always on (clients on other nodes upload artifacts over HTTP; no
    shared filesystem), the Host headers and origins of `allowed_hosts` / `allowed_origins` (MLflow's defaults, this
    machine's names, `allowed_host`, `allowed_origin`), and MLflow's basic-auth app when `auth`.

    backend_store_uri: `sqlite:///mlflow.db` or `postgresql://user@host/db`; the password of the latter comes from
    PGPASSFILE (~/.pgpass) or PGPASSWORD, never from this URI or the repository. Any other SQLAlchemy URI passes through.
    extra_args: further `mlflow server` options; those sharpscale sets itself are refused (ServerOptionError).
    """
    from trainables.tracking import resolve_tracking_uri  # lazy: keeps `import studies.server` to the standard library

    check_port_and_workers(port, workers)
    _check_extra_args(extra_args, os.environ if environ is None else environ)
    # The command line is visible to every local user (ps): no credential on it; the clients read their own files.
    for flag, value in (("--backend-store-uri", backend_store_uri), ("--artifacts-destination", artifacts_destination)):
        if problem := credential_problem(flag, value):
            raise ServerOptionError(problem)
    cmd = [
        sys.executable,
        "-m",
        "studies.ui_app",  # `mlflow server`, whose page opens each way into a study on its view, as `sharpscale ui`'s
        "server",
        "--backend-store-uri",
        resolve_tracking_uri(backend_store_uri),
        "--artifacts-destination",
        _resolve_artifacts_destination(artifacts_destination),
        "--serve-artifacts",
        "--host",
        host,
        "--port",
        str(port),
        "--allowed-hosts",
        ",".join(allowed_hosts(allowed_host, bound=host)),
        "--cors-allowed-origins",
        ",".join(allowed_origins(port, allowed_host, allowed_origin)),
    ]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    if auth:
        cmd += ["--app-name", "basic-auth"]
    return cmd + list(extra_args)


def _exposure_warning(host: str, port: int, auth: bool) -> str:
    if auth:
        return (
            f"NOTE: the MLflow server listens on {host}:{port}, not on loopback, with basic auth over plain HTTP:\n"
            "  user names and passwords cross the network unencrypted. Keep the port closed to everything but the\n"
            "  cluster's own nodes, reach the UI through an SSH tunnel, or put a TLS proxy in front. docs/cluster.md."
        )
    return (
        f"WARNING: the MLflow server listens on {host}:{port}, not on loopback, and requires no login:\n"
        f"  anyone who can reach {host}:{port} can read, change and delete every run and artifact.\n"
        "  Keep the port closed to everything but the cluster's own nodes (security group / firewall), reach the\n"
        "  UI through an SSH tunnel, or require a login with --auth. docs/cluster.md, Security."
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
    cmd: Sequence[str], *, env: dict[str, str] | None = None, stop_timeout_s: float = STOP_TIMEOUT_S, log=None
) -> int:
    """Run `cmd` in the foreground in its own process group until it exits, Ctrl-C or SIGTERM/SIGHUP.

    Returns the command's exit status, or 0 when the user stopped it. Either way the whole group (a server and
    every worker it forked) is gone on return. log: an open file that takes the command's output (stdout and
    stderr); None: the terminal. env: the command's environment; None: that of the MLflow servers sharpscale starts
    (`_child_env`). Used by `sharpscale server` and `sharpscale ui`.
    """
    # Its own session: Ctrl-C reaches only this launcher, which then stops the group in order (TERM, then KILL).
    proc = subprocess.Popen(
        list(cmd),
        start_new_session=True,
        env=_child_env() if env is None else env,
        stdout=log,
        stderr=None if log is None else subprocess.STDOUT,
    )
    try:
        with _stop_signals_raise():
            return proc.wait()
    except (KeyboardInterrupt, _StopRequested):
        return 0
    finally:
        with _stop_signals_ignored():  # a second Ctrl-C must not abandon the group half-stopped
            stop_process_group(proc, stop_timeout_s)


# MLflow's server starts a job runner beside itself unless told not to: eight more processes (huey consumers), each
# importing MLflow (about 1.9 GB more resident memory and 9 more CPU-seconds per start on the 2-core CPU machine,
# where the server then answered 6-9 s later). It runs MLflow's GenAI jobs (prompt optimisation, scorers, trace roll-ups), which no sharpscale
# study submits. Off unless the user's environment turns it on.
_JOB_EXECUTION_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"


def _child_env() -> dict[str, str]:
    """The environment of the MLflow servers sharpscale starts (`sharpscale server`, `sharpscale ui`): this one, with
    MLflow's telemetry and its job runner off unless set otherwise."""
    env = dict(os.environ)
    env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    env.setdefault(_JOB_EXECUTION_ENV, "false")
    return env


@contextlib.contextmanager
def _prepared(
    *, backend_store_uri, artifacts_destination, host, port, workers, allowed_host, allowed_origin, auth, extra_args
) -> Iterator[tuple[list[str], dict[str, str]]]:
    """Every option checked (ServerOptionError before anything starts), then the server's command line and
    environment, with the loud warning a non-loopback bind deserves. The auth config file (no secret in it) lives
    in a private temporary directory until the server is gone."""
    cmd = mlflow_server_command(
        backend_store_uri=backend_store_uri,
        artifacts_destination=artifacts_destination,
        host=host,
        port=port,
        workers=workers,
        allowed_host=allowed_host,
        allowed_origin=allowed_origin,
        auth=auth is not None,
        extra_args=extra_args,
    )
    env = _child_env()
    with tempfile.TemporaryDirectory(prefix="sharpscale-mlflow-") as config_dir:
        if auth is not None:
            env.update(_auth_env(auth, backend_store_uri, Path(config_dir), os.environ))
        if not is_loopback(host):
            print(_exposure_warning(host, port, auth is not None), file=sys.stderr, flush=True)
        yield cmd, env


def _describe(cmd: Sequence[str], env: Mapping[str, str], host: str, port: int, allowed_host: Sequence[str]) -> str:
    backend, artifacts = cmd[cmd.index("--backend-store-uri") + 1], cmd[cmd.index("--artifacts-destination") + 1]
    names = ", ".join(dict.fromkeys([*own_host_names(), *(h.lower() for h in allowed_host)]))
    lines = [
        f"MLflow tracking server on {_url(host, port)}: runs in {redact(backend)}, artifacts in "
        f"{redact(artifacts)} (served over HTTP). Ctrl-C stops it.",
        f"Accepts requests addressed to {names}, and to localhost and private addresses (any port); "
        "other Host headers get 403 (add names with --allowed-host).",
    ]
    if _AUTH_CONFIG_ENV in env and "basic-auth" in cmd:
        database = re.search(r"^database_uri = (.*)$", Path(env[_AUTH_CONFIG_ENV]).read_text(), re.M).group(1)
        user = env.get(_ADMIN_USERNAME_ENV) or DEFAULT_ADMIN_USERNAME
        lines.append(
            f"Login required (MLflow basic auth): admin user {user!r}; users and permissions in {redact(database)}."
        )
    return "\n".join(lines)


def serve(
    *,
    backend_store_uri: str = DEFAULT_BACKEND_STORE_URI,
    artifacts_destination: str = DEFAULT_ARTIFACTS_DESTINATION,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    workers: int | None = None,
    allowed_host: Sequence[str] = (),
    allowed_origin: Sequence[str] = (),
    auth: Auth | None = None,
    extra_args: Sequence[str] = (),
) -> int:
    """Run the MLflow tracking server in the foreground until Ctrl-C or SIGTERM; returns its exit status.

    Loopback only unless `host` says otherwise (then a warning, louder without `auth`). Artifacts are proxied
    (`--serve-artifacts`) to `artifacts_destination`: a directory here, or s3://, gs://, ... URIs. Requests must be
    addressed to a name of `allowed_hosts(allowed_host)`. With `auth`, every request needs a login.
    """
    check_port_and_workers(port, workers)
    check_bindable(host, port, "the MLflow server")
    with _prepared(
        backend_store_uri=backend_store_uri,
        artifacts_destination=artifacts_destination,
        host=host,
        port=port,
        workers=workers,
        allowed_host=allowed_host,
        allowed_origin=allowed_origin,
        auth=auth,
        extra_args=extra_args,
    ) as (cmd, env):
        print(_describe(cmd, env, host, port, allowed_host), flush=True)
        return run_in_process_group(cmd, env=env)


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


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct TCP ports free on `host` now (held open together while chosen, so no two are the same)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def check_port_and_workers(port: int, workers: int | None) -> None:
    """The rules on the two numbers of an MLflow server's command line (`sharpscale server` and `sharpscale ui`)."""
    if port < 0 or port > 65535:
        raise ServerOptionError(
            f"port: 0 <= port <= 65535 must hold, got port={port}. Fix: e.g. --port {DEFAULT_PORT}."
        )
    if workers is not None and workers < 1:
        raise ServerOptionError(
            f"workers: workers >= 1 must hold, got workers={workers}. Fix: omit it for the command's default."
        )


def check_bindable(host: str, port: int, what: str) -> None:
    """ServerOptionError, naming the cause and the fix, when `what` (a server of ours) could not listen on
    host:port: a port another process holds, an address that is not this machine's, a name that resolves to none.
    Checked before the server starts: MLflow's and uvicorn's own failure to bind exits 0, saying nothing."""
    import errno

    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as err:
        raise ServerOptionError(
            f"--host {host!r}: {what} cannot listen there, the name resolves to no address ({err}). Fix: give an "
            f"address of this machine, e.g. --host 127.0.0.1 (or 0.0.0.0 for every interface)."
        ) from None
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: a TIME_WAIT port is free
            sock.bind(address)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise ServerOptionError(
                f"--port {port}: {what} cannot listen on {host}:{port}, another process holds that port. Fix: stop "
                f"it, or give another --port (e.g. --port {free_port(host if _address(host) else '127.0.0.1')})."
            ) from None
        if err.errno == errno.EADDRNOTAVAIL:
            raise ServerOptionError(
                f"--host {host!r}: {what} cannot listen there, it is not an address of this machine. Fix: give one "
                f"of its addresses, e.g. --host 127.0.0.1 (or 0.0.0.0 for every interface)."
            ) from None
        raise ServerOptionError(
            f"--host {host!r} --port {port}: {what} cannot listen there ({err.strerror}). Fix: a port of 1024 or "
            f"more, on an address of this machine."
        ) from None


def pids_in_groups(groups: set[int], *, live: bool = False) -> dict[int, str]:
    """{pid: command name} of the processes in the process groups `groups`, from /proc; live: zombies left out."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                # /proc/<pid>/stat: "pid (comm) state ppid pgrp ...": comm may hold spaces, so split at the last ')'.
                head, tail = (entry / "stat").read_text().rsplit(")", 1)
                state, _, pgrp = tail.split()[:3]
                if int(pgrp) in groups and not (live and state == "Z"):
                    found[int(entry.name)] = head.split("(", 1)[1]
    return found


def pids_naming(text: str) -> set[int]:
    """Processes (other than this one) whose command line contains `text`, e.g. a cluster's unique temp dir."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.add(int(entry.name))
    return found - {os.getpid()}


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
    allowed_host: Sequence[str] = (),
    allowed_origin: Sequence[str] = (),
    auth: Auth | None = None,
    extra_args: Sequence[str] = (),
    log_path: str | Path | None = None,
    timeout_s: float = 120.0,
) -> Iterator[tuple[subprocess.Popen, str]]:
    """A real MLflow server in the background for tests and scripts: yields (process, url) once it answers HTTP.

    port=None picks a free one. The server's output goes to `log_path` (a temporary file by default), whose end is
    in the ServerError raised when it does not come up within `timeout_s`. On exit its whole process group stops.
    """
    port = port or free_port(host)
    url = _url(host, port)
    with _prepared(
        backend_store_uri=backend_store_uri,
        artifacts_destination=artifacts_destination,
        host=host,
        port=port,
        workers=workers,
        allowed_host=allowed_host,
        allowed_origin=allowed_origin,
        auth=auth,
        extra_args=extra_args,
    ) as (cmd, env):
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="mlflow-server-", suffix=".log")
            os.close(fd)
            log_path = name
        log_path = Path(log_path)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None:
                    raise ServerError(
                        f"mlflow server exited with status {proc.returncode} before answering on {url}; "
                        f"its log ({log_path}) ends with:\n{_tail(log_path)}"
                    )
                try:  # /health needs neither an allowed Host header nor a login
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
        metavar="URI",
        help=f"where runs are stored: {DEFAULT_BACKEND_STORE_URI} (relative paths made absolute; the default) or "
        "postgresql://user@host:5432/db (needs psycopg2-binary; password from ~/.pgpass, PGPASSFILE or PGPASSWORD, "
        "never in the URI)",
    )
    parser.add_argument(
        "--artifacts-destination",
        default=DEFAULT_ARTIFACTS_DESTINATION,
        metavar="DEST",
        help="where the server stores the artifacts that clients upload over HTTP: a directory, s3://bucket/prefix "
        "(needs boto3; credentials from the head's instance profile or AWS_* variables), gs://bucket/prefix "
        f"(default: {DEFAULT_ARTIFACTS_DESTINATION})",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="bind address (default: 127.0.0.1, loopback only; 0.0.0.0 for every interface, with a warning)",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default: {DEFAULT_PORT})")
    parser.add_argument("--workers", type=int, default=None, help="server worker processes (default: MLflow's, 4)")
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also accept requests addressed to NAME (with any port, unless NAME:PORT), e.g. a KubeRay Service name, "
        "a DNS alias, an address clients reach this machine by (a NAT's, a proxy's), or '*.svc.cluster.local'; "
        "repeatable. Always accepted: this machine's host name, FQDN and interface addresses and loopback; others "
        "(another private address too) get 403",
    )
    parser.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="also let browser pages from ORIGIN change data (MLflow's CORS check), e.g. https://mlflow.example.com "
        "behind a TLS proxy; the UI under every accepted name is allowed already; repeatable",
    )
    parser.add_argument(
        "--auth",
        action="store_true",
        help="require a login: MLflow's basic auth (needs the auth extra: pip install '.[auth]'). The admin user "
        f"(MLFLOW_AUTH_ADMIN_USERNAME, default {DEFAULT_ADMIN_USERNAME}) is created on the first start with the "
        "password from --admin-password-file or MLFLOW_AUTH_ADMIN_PASSWORD; clients log in with "
        "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD",
    )
    parser.add_argument(
        "--admin-password-file",
        default=None,
        metavar="PATH",
        help="with --auth: file holding the admin password (12+ characters, mode 600), instead of "
        "MLFLOW_AUTH_ADMIN_PASSWORD; never printed",
    )
    parser.add_argument(
        "--auth-database-uri",
        default=None,
        metavar="URI",
        help="with --auth: where users and permissions are stored (default: beside the backend store, "
        "mlflow-auth.db next to an SQLite mlflow.db, or the same PostgreSQL database)",
    )
    parser.add_argument(
        "extra_args",
        nargs=argparse.REMAINDER,
        help="after --: further `mlflow server` options passed unchanged, e.g. -- --static-prefix /mlflow "
        "(not those set above: they are refused with the option to use instead)",
    )


def from_args(args: argparse.Namespace) -> int:
    """`sharpscale server` with the options of `add_arguments`; a bad option exits 2 with its message."""
    extra = list(args.extra_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    try:
        for option, value in (
            ("--admin-password-file", args.admin_password_file),
            ("--auth-database-uri", args.auth_database_uri),
        ):
            if value is not None and not args.auth:
                raise ServerOptionError(
                    f"{option}: it only applies with --auth, got {option} {value} alone. Fix: add --auth."
                )
        auth = Auth(password_file=args.admin_password_file, database_uri=args.auth_database_uri) if args.auth else None
        return serve(
            backend_store_uri=args.backend_store_uri,
            artifacts_destination=args.artifacts_destination,
            host=args.host,
            port=args.port,
            workers=args.workers,
            allowed_host=args.allowed_host,
            allowed_origin=args.allowed_origin,
            auth=auth,
            extra_args=extra,
        )
    except ServerOptionError as err:
        print(f"sharpscale server: error: {err}", file=sys.stderr)
        return 2
