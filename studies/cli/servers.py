"""The commands that serve a browser until Ctrl-C: `server` (MLflow's tracking server for a cluster), `ui` (the
MLflow UI over a store, opened at a study's page) and `dashboard` (optuna-dashboard over a study's searches)."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from studies import server as server_cli
from studies.cli.base import Command, overrides, place, read_uri, study_options, tracking_option
from studies.cli.results import keep_writes_inside
from studies.shell import shell_command
from trainables.errors import UserError
from trainables.naming import DEFAULT_TRACKING_URI, LOG_FILE

_ALLOWED_HOST_HELP = (
    "a host name or address to accept in Host headers besides loopback and this machine's names and "
    "addresses (repeatable; 'NAME:PORT' that port only, '*.DOMAIN' a domain's names); others get 403"
)


class Server(Command):
    name = "server"
    help = (
        "MLflow tracking server for a cluster: artifacts over HTTP, loopback unless --host, the head's names "
        "and --allowed-host accepted, --auth for a login (Ctrl-C/SIGTERM stops it)"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        server_cli.add_arguments(parser)

    def take_action(self, args) -> int:
        return server_cli.from_args(args)


class Dashboard(Command):
    name = "dashboard"
    help = "optuna-dashboard over the study's Optuna storage: each cell's search, trial by trial (Ctrl-C stops it)"
    options = (study_options, tracking_option)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("study", help="the study file that was run")
        parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
        parser.add_argument("--port", type=int, default=8080)
        parser.add_argument("--allowed-host", action="append", default=[], metavar="NAME", help=_ALLOWED_HOST_HELP)
        parser.add_argument(
            "--allow-writes",
            action="store_true",
            help="let the browser change the Optuna studies (notes, deleting a study); without it POST/PUT/DELETE get "
            "405: the dashboard has no login",
        )

    def take_action(self, args) -> int:
        """optuna-dashboard over the Optuna storage the study's newest run recorded (else the one its file names)."""
        from studies.search import open_optuna_storage
        from studies.spec import load_study

        try:
            import optuna_dashboard
        except ImportError as err:
            # A user's fix, said as every other one is (main: one line, EXIT_USAGE), pinned as the project pins it.
            raise UserError(
                f"sharpscale dashboard needs optuna-dashboard, which is not importable here ({err}). Fix: "
                "pip install -c constraints.txt . in the repository (`make install` does), or "
                "pip install 'optuna-dashboard>=0.17'."
            ) from None
        server_cli.check_port_and_workers(args.port, None)
        server_cli.check_bindable(args.host, args.port, "optuna-dashboard")
        study = load_study(args.study, smoke=args.smoke, overrides=overrides(args), require_data=False)
        storage = self._optuna_storage(args, study)
        # The hosts `sharpscale server` admits, --allowed-host too, matched as addresses and exact names.
        hosts = server_cli.allowed_host_entries(args.allowed_host, bound=args.host)
        app = server_cli.guard_wsgi(
            optuna_dashboard.wsgi(open_optuna_storage(storage)), hosts, writes=args.allow_writes
        )
        url = f"http://{args.host}:{args.port}"
        server_cli.warn_if_exposed("optuna-dashboard", args.host, args.port, "every trial", writes=args.allow_writes)
        print(
            f"Starting optuna-dashboard over {storage} (one Optuna study per cell; each trial's user attributes hold "
            f"its MLflow run id and name; {'writes allowed' if args.allow_writes else 'read-only'}) ...",
            flush=True,
        )
        _say_when_answering(url, f"optuna-dashboard: {url} (Ctrl-C stops it)", path="/")
        _serve_until_interrupted(args.host, args.port, app)
        return 0

    def _optuna_storage(self, args, study) -> str:
        """The Optuna storage the study's newest run recorded, as this store has it; no such run is a UserError."""
        from studies.records import find_study_run
        from studies.runner import state_locations
        from trainables.tracking import sqlite_path, tracking_client

        uri = read_uri(args, study.spec)
        name = study.experiment_name
        db = sqlite_path(uri)
        run = None
        if db is None or db.is_file():  # no store file: no study run, and none is created by looking
            client = tracking_client(uri, create=False)
            exp = client.get_experiment_by_name(name)
            run = find_study_run(client, exp.experiment_id, study) if exp is not None else None
        if run is None:
            raise UserError(
                f"study {name!r}: no study run recorded at {uri}, so no Optuna storage to show. Fix: run it first "
                f"(`{shell_command('sharpscale', 'run', *(['--smoke'] if args.smoke else []), args.study)}`), or give "
                "its --tracking-uri."
            )
        return _travelled_optuna(uri, state_locations(study, name, run.data.tags).optuna_storage, args.allow_writes)


class UI(Command):
    name = "ui"
    help = (
        "start the MLflow UI over the tracking store and print the address of the study's runs page (Ctrl-C stops it)"
    )
    description = (
        "Start the MLflow UI over the tracking store and print one address: the runs page of STUDY (or "
        "of the study that ran last in the store), whose description holds the answer table and whose table lists "
        "every trial, best first. The server's own output goes to sharpscale.log beside the store."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "study",
            nargs="?",
            default=None,
            help="the study file or name whose page to open (default: the study that ran last in the store)",
        )
        parser.add_argument("--smoke", action="store_true", help="open the study's --smoke runs")
        parser.add_argument(
            "--tracking-uri",
            type=place("--tracking-uri"),
            default=DEFAULT_TRACKING_URI,
            help=f"the MLflow store to browse: an sqlite:/// file, a path, or an http(s):// server (default: {DEFAULT_TRACKING_URI})",
        )
        parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
        parser.add_argument("--port", type=int, default=5000)
        parser.add_argument(
            "--workers",
            type=int,
            default=1,
            help="server processes (default 1: one person browsing is served by one; MLflow's own default, 4, starts "
            "four, each importing all of MLflow)",
        )
        parser.add_argument("--allowed-host", action="append", default=[], metavar="NAME", help=_ALLOWED_HOST_HELP)

    def take_action(self, args) -> int:
        uri = read_uri(args)
        server_cli.check_port_and_workers(args.port, args.workers)
        # `mlflow ui` has no login and takes writes (rename, tag, delete runs) from whoever reaches it.
        server_cli.warn_if_exposed("the MLflow UI", args.host, args.port, "every run and artifact", writes=True)
        server_cli.check_bindable(args.host, args.port, "the MLflow UI")
        log_path = ui_log_path(uri)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # MLflow's and SQLAlchemy's deprecations: for the log, not the user
            page = _ui_page(uri, args.study, args.smoke)  # a missing store or study is said before any server starts
        keep_writes_inside(uri, refuse=False)  # the UI serves (and takes) artifacts where the store records them
        cmd = [
            sys.executable,
            "-m",
            "studies.ui_app",  # `mlflow ui`, whose page opens each way into a study on its view
            "ui",
            "--backend-store-uri",
            uri,
            "--host",
            args.host,
            "--port",
            str(args.port),
            "--workers",
            str(args.workers),
            # MLflow's own host patterns admit any name that begins like a private address (10.evil.example):
            # the checks of `sharpscale server` instead (studies.server.allowed_hosts).
            "--allowed-hosts",
            ",".join(server_cli.allowed_hosts(args.allowed_host, bound=args.host)),
            "--cors-allowed-origins",
            ",".join(server_cli.allowed_origins(args.port, args.allowed_host)),
            # One line per request (hundreds a page view) is not the user's business, in the terminal or the log.
            "--uvicorn-opts",
            "--no-access-log",
        ]
        url = f"http://{args.host}:{args.port}"
        with open(log_path, "ab") as log:
            for w in caught:
                log.write(f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}\n".encode())
            log.flush()
            # The server's banners, warnings and request lines go to the log; the terminal gets the address only.
            _say_when_answering(url, f"MLflow UI: {url}{page}  (Ctrl-C stops it)")
            status = server_cli.run_in_process_group(cmd, log=log)
        if status != 0:
            lines = log_path.read_text(errors="replace").splitlines()[-20:]
            print(
                f"sharpscale: error: the MLflow UI exited with status {status}; the end of {log_path}:\n"
                + "\n".join(f"  {line}" for line in lines),
                file=sys.stderr,
            )
        return status


def _ui_page(uri: str, study: str | None, smoke: bool) -> str:
    """The address (after the server's root) that `sharpscale ui` opens: the runs page of `study` (a file or a
    name), else of the study that ran last in the store, on its opening view; the experiments list without one."""
    from analysis.runs import _open_experiment
    from studies.records import VIEW_KEY, runs_page_path
    from trainables.naming import kind_filter
    from trainables.tracking import tracking_client

    if study is not None:
        _, exp, _ = _open_experiment(study, uri, smoke=smoke)
    else:
        client = tracking_client(uri, create=False)
        ids = [e.experiment_id for e in client.search_experiments()]
        newest = (
            client.search_runs(ids, kind_filter("study"), order_by=["attributes.start_time DESC"], max_results=1)
            if ids
            else []
        )
        if not newest:
            return "/#/experiments?workflowType=machine_learning"
        exp = client.get_experiment(newest[0].info.experiment_id)
    return runs_page_path(exp.experiment_id, view=f"mlflow.sharedViewState.{VIEW_KEY}" in exp.tags)


def ui_log_path(uri: str) -> Path:
    """Where `sharpscale ui` sends the MLflow server's output: sharpscale.log beside an SQLite store, else here."""
    base = Path(uri[len("sqlite:///") :]).parent if uri.startswith("sqlite:///") else Path.cwd()
    return base / LOG_FILE


def _say_when_answering(url: str, message: str, *, path: str = "/health", timeout_s: float = 600.0) -> None:
    """Print `message` once `url` answers (the UI takes a while to start), from a daemon thread."""
    import threading
    import time
    import urllib.error
    import urllib.request

    def poll() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + path, timeout=2) as resp:
                    if resp.status == 200:
                        print(message, flush=True)
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)

    threading.Thread(target=poll, name="sharpscale-ui-ready", daemon=True).start()


def _travelled_optuna(uri: str, storage: str, writes: bool) -> str:
    """The study run's SQLite Optuna database as this store has it (where recorded, else where `export` put it in
    the store), opened read-only unless writes are allowed; a missing one is one line, never an empty new database."""
    from studies.export import OPTUNA_DIR, travelled_path

    if not storage.startswith("sqlite:///"):
        return storage
    path = travelled_path(uri, storage[len("sqlite:///") :], OPTUNA_DIR)
    if path is None:
        raise UserError(
            f"Optuna storage {storage}: no such database, and the store {uri} holds none in its {OPTUNA_DIR}/ (the "
            f"store points outside itself). Fix: copy that database into {OPTUNA_DIR}/ beside the store, or "
            f"`sharpscale export` the original store, which carries it."
        )
    return f"sqlite:///{path}" if writes else f"sqlite:///{path.as_uri()}?mode=ro&uri=true"


def _serve_until_interrupted(host: str, port: int, app) -> None:
    """Serve the WSGI `app` until Ctrl-C, without a line per request."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    class _Quiet(WSGIRequestHandler):
        def log_message(self, format, *args):  # noqa: A002 - wsgiref's signature
            pass  # one line per request would bury the terminal

    try:
        with make_server(host, port, app, handler_class=_Quiet) as httpd:
            httpd.serve_forever()
    except KeyboardInterrupt:
        pass
