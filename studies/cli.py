"""The `sharpscale` command: run, validate and inspect studies, open the MLflow UI."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from pathlib import Path

from studies import server as server_cli
from trainables.errors import UserError
from trainables.naming import DEFAULT_TRACKING_URI, LOG_FILE, REASON_TAG

__all__ = ["EXIT_ERRORS", "EXIT_INTERRUPTED", "EXIT_USAGE", "main"]

# The exit statuses every command keeps: 0 done, EXIT_ERRORS when trials errored, no trial ran an epoch (the study
# is FAILED) or a command failed,
# EXIT_USAGE for a user mistake (listed, no traceback), EXIT_INTERRUPTED after Ctrl-C (128 + SIGINT, as shells do).
EXIT_ERRORS = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


# Nothing leaves the machine unless the user opts in (a value the user set is kept).
QUIET_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "HF_HUB_OFFLINE": "1",
    # MLflow's INFO lines (creating a store's tables) are not the user's business; its warnings still show.
    "MLFLOW_LOGGING_LEVEL": "WARNING",
}


@contextlib.contextmanager
def _quiet_env():
    """QUIET_ENV for the command's duration: Ray's workers and MLflow's clients started by it inherit it, and a
    caller of main() in its own process (a test, a notebook) gets its environment back unchanged."""
    added = {k: v for k, v in QUIET_ENV.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


# A local study's Ray cluster is this machine alone, so none of its servers (GCS, raylet, workers, agents) need
# another interface. Ray reads this at import, in the driver and in every process it starts: off, Ray takes the
# loopback address as the node's and binds its servers there. Pinned by tests/studies/test_adversarial.py.
LOOPBACK_RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@contextlib.contextmanager
def _loopback_ray(args):
    """For `run`/`resume` without --address, before anything imports Ray: keep its cluster on 127.0.0.1. The
    environment is restored afterwards, so that `main` called in a process that goes on leaves it as it was."""
    local = getattr(args, "func", None) is _cmd_run and not getattr(args, "address", None)
    if not local or getattr(args, "dry_run", False) or "ray" in sys.modules:
        yield
        return
    saved = {key: os.environ.get(key) for key in LOOPBACK_RAY_ENV}
    os.environ.update({k: v for k, v in LOOPBACK_RAY_ENV.items() if saved[k] is None})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)


def _overrides(args) -> dict:
    from studies.spec import parse_overrides

    out = parse_overrides(getattr(args, "set", None) or [], args.study)
    if getattr(args, "storage", None) is not None:
        if "storage" in out and out["storage"] != args.storage:
            raise UserError(
                f"--storage {args.storage} and --set storage={out['storage']} name two places for one run's state. "
                f"Fix: give one of them."
            )
        out["storage"] = args.storage  # a path or URI as typed: YAML would turn some into other types
    return out


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of CPUs, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (the local Ray cluster's CPUs), got {value}")
    return value


def _study_options() -> argparse.ArgumentParser:
    """Options shared by every command that reads a study file."""
    from studies.spec import SETTABLE_FIELDS

    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help="override a trial config path for every cell (--set data.root=/data/cifar10) or a study setting "
        f"({', '.join(SETTABLE_FIELDS)}; e.g. --set checkpoints.keep=3); repeatable",
    )
    parent.add_argument(
        "--storage",
        default=None,
        metavar="PATH_OR_URI",
        help="Ray's results and checkpoints (and, by default, Optuna's database beside them) for this run, instead of "
        "the study's `storage:`; same as --set storage=...: a directory, or s3:// / gs:// (docs/cluster.md)",
    )
    parent.add_argument(
        "--smoke", action="store_true", help="the study's --smoke form: tiny, on the embedded digits, on CPU"
    )
    return parent


def _tracking_option() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--tracking-uri",
        default=None,
        help=f"MLflow tracking URI (default: the study's tracking.uri, {DEFAULT_TRACKING_URI}); sqlite:///, http(s):// "
        "or a database URL",
    )
    return parent


def _cluster_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--address", default=None, help="existing Ray cluster ('auto' on a cluster node); default: start a local one"
    )
    parent.add_argument(
        "--num-cpus", type=_positive_int, default=None, help="CPUs of the local Ray cluster (default: all)"
    )
    return parent


def _read_uri(args, spec) -> str:
    """The tracking URI a read-only command reads: checked, absolute, and never created."""
    from trainables.tracking import check_tracking_uri, resolve_tracking_uri

    return check_tracking_uri(resolve_tracking_uri(args.tracking_uri or spec.tracking.uri))


def _cmd_validate(args) -> int:
    from studies.spec import load_study

    study = load_study(args.study, smoke=args.smoke, overrides=_overrides(args))
    print(f"{args.study}: valid. {len(study.cells)} cells, {study.total_trials} trials.")
    optuna = study.optuna_storage(study.experiment_name)
    print(f"State: Ray storage {study.storage}, Optuna {optuna} (a resumed run keeps its recorded ones).")
    return 0


def _print_cells(study) -> None:
    width = max((len(c.key) for c in study.cells), default=4)
    confirm = study.spec.confirm is not None
    print(f"{'cell':<{width}}  trials  {'confirm  ' if confirm else ''}searched")
    for c in study.cells:
        space = ", ".join(f"{p} ~ {d.type}" for p, d in c.space.items()) or "-"
        print(f"{c.key or 'all':<{width}}  {c.trials:>6}  {f'{c.confirm:>7}  ' if confirm else ''}{space}")
    print(f"{len(study.cells)} cells, {study.total_trials} trials")


def _print_estimate(study, args) -> None:
    """The study's GPU-hours from measured figures, on the card of the cluster it would run on where known here."""
    from studies.cost import estimate_study, local_gpus

    if getattr(args, "address", None):
        gpus, card = None, None  # a cluster elsewhere: its cards are not known without connecting
    else:
        gpus, card = local_gpus()
    for line in estimate_study(study, gpus=gpus, cluster_card=card).lines():
        print(line)


def _cmd_run(args) -> int:
    from studies.spec import load_study

    # Every mistake surfaces here, before Ray starts; a dry run reads only the file, so it needs no data.
    study = load_study(args.study, smoke=args.smoke, overrides=_overrides(args), require_data=not args.dry_run)
    if args.dry_run:
        _print_cells(study)
        from analysis.design import study_detectable

        statement = study_detectable(study)
        if statement:
            print(f"Design: {statement}")
        _print_estimate(study, args)
        return 0
    from studies.runner import run_study
    from trainables.tracking import check_tracking_uri

    if args.tracking_uri:
        check_tracking_uri(args.tracking_uri)
    outcome = run_study(
        args.study,
        address=args.address,
        tracking_uri=args.tracking_uri,
        smoke=args.smoke,
        num_cpus=args.num_cpus,
        resume=args.command == "resume",
        overrides=_overrides(args),
        new_launch=getattr(args, "new_launch", False),
        trust_storage=getattr(args, "trust_storage", False),
        take_over=getattr(args, "take_over", False),
    )
    try:
        _print_summary(study, outcome.tracking_uri, outcome)
    except (Exception, KeyboardInterrupt) as err:  # noqa: BLE001 - the study's records are complete either way
        what = "interrupted" if isinstance(err, KeyboardInterrupt) else f"failed ({type(err).__name__}: {err})"
        print(
            f"\nsharpscale: the study's runs are recorded and closed ({outcome.trials} trials); printing its summary "
            f"{what}. `{_prog()} status {args.study}` shows it.",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED if isinstance(err, KeyboardInterrupt) else EXIT_ERRORS
    if outcome.interrupted:
        print(_incomplete(args, f"after {outcome.trials} of {study.total_trials} trials"), file=sys.stderr)
        return EXIT_INTERRUPTED
    if outcome.nothing_ran:
        print(
            f"sharpscale: no trial ran a single epoch ({outcome.trials} started): the study has no result and its "
            f"MLflow run is marked FAILED. Fix: a longer budget.time_limit_s (or none), then `sharpscale run "
            f"--new-launch {args.study}`.",
            file=sys.stderr,
        )
        return EXIT_ERRORS
    if outcome.errored:
        refused = (
            f" ({outcome.refused} refused by their settings inside the trial, failed once without retries)"
            if outcome.refused
            else ""
        )
        print(
            f"sharpscale: {outcome.errored} trial(s) errored after their retries{refused}; see `sharpscale status` "
            f"and the runs' {REASON_TAG} tags",
            file=sys.stderr,
        )
    return EXIT_ERRORS if outcome.trials == 0 or outcome.errored else 0


def _incomplete(args, when: str) -> str:
    """What an interrupted study tells its user: it is incomplete, and the command that finishes it."""
    resume = [_prog(), "resume", args.study, *(f"--set {s}" for s in getattr(args, "set", None) or [])]
    for flag in ("storage", "tracking_uri", "address"):
        if getattr(args, flag, None):
            resume.append(f"--{flag.replace('_', '-')} {getattr(args, flag)}")
    if getattr(args, "smoke", False):
        resume.append("--smoke")
    return (
        f"sharpscale: study interrupted {when}: it is INCOMPLETE (its MLflow runs are marked KILLED, interrupted "
        f"trials 'interrupted'). Finish it with:\n  {' '.join(resume)}"
    )


def _cmd_status(args) -> int:
    import pandas as pd

    from analysis import headline, load_runs
    from analysis.runs import status_table
    from studies.spec import load_study

    # Reads the file and MLflow only: the data need not be on this machine.
    study = load_study(args.study, smoke=args.smoke, overrides=_overrides(args), require_data=False)
    spec = study.spec
    uri = _read_uri(args, spec)
    name = study.experiment_name
    runs = load_runs(name, tracking_uri=uri)
    table = status_table(
        runs,
        {c.key: c.planned for c in study.cells},
        metric=spec.objective.column,
        mode=spec.objective.mode,
        label=spec.objective.label,
        knobs=[p for c in study.cells for p in c.space],
    )
    launch = f", launch {runs['launch'].iloc[0]}" if not runs.empty else ""
    print(f"{name}{launch}: {len(runs)} of {study.total_trials} trials recorded at {uri}")
    print(_state_line(study, uri, name))
    _say_if_outside(uri)
    for line in headline(runs, metric=spec.objective.column, mode=spec.objective.mode):  # the answer so far
        print(line)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.4g}".format):
        print(table.to_string())
    return 0


def _say_if_outside(uri: str) -> None:
    from studies.export import ARTIFACTS_DIR, locations_outside

    outside = locations_outside(uri)
    if outside:
        print(
            f"Note: the store points outside itself: {len(outside)} artifact location(s) such as {outside[0]} are "
            f"gone and not in its {ARTIFACTS_DIR}/. Fix: copy the original's {ARTIFACTS_DIR}/ beside its mlflow.db."
        )


def _state_line(study, uri: str, name: str) -> str:
    """Where the study's state is: as its latest study run recorded it, else as this file would put it."""
    from studies.records import find_study_run
    from studies.runner import state_locations
    from trainables.tracking import tracking_client

    client = tracking_client(uri, create=False)
    exp = client.get_experiment_by_name(name)
    run = find_study_run(client, exp.experiment_id, study) if exp is not None else None
    where = state_locations(study, name, run.data.tags if run is not None else None)
    origin = "recorded by its study run" if run is not None else "from the study file; no study run recorded yet"
    if run is None and exp is not None:
        from trainables.naming import kind_filter

        # Runs of the study with other --set overrides are its runs too: say where the newest one keeps its state.
        other = client.search_runs(
            [exp.experiment_id], kind_filter("study"), order_by=["attributes.start_time DESC"], max_results=1
        )
        if other:
            run = other[0]
            where = state_locations(study, name, run.data.tags)
            origin = "recorded by its newest study run, which ran with other --set overrides than these"
    state = f"State ({origin}): Ray storage {where.storage}, Optuna {where.optuna_storage}"
    if run is not None and run.info.status != "FINISHED":
        word = {
            "RUNNING": "running (or its driver died: `resume` finishes it)",
            "KILLED": "INTERRUPTED (incomplete)",
            "FAILED": "FAILED (incomplete)",
        }.get(run.info.status, run.info.status)
        state = f"Study run: {word}; `{_prog()} resume {study.path}` finishes it.\n{state}"
    return state


def _print_cost(runs, outcome) -> None:
    """Where the study's device time went: each trial's seconds outside training, the held time spent training."""
    from studies.busy import BUSY_METRIC, SAMPLE_MS
    from trainables.metrics import FIXED_PHASES, FIXED_TIME, fixed_phase_metric

    if FIXED_TIME in runs and runs[FIXED_TIME].notna().any():
        fixed = runs[FIXED_TIME].dropna()
        print(
            f"\nOutside training ({FIXED_TIME}: start, data load, validation, geometry, checkpoints, records): median "
            f"{fixed.median():.1f} s a trial (min {fixed.min():.1f}, max {fixed.max():.1f}; {len(fixed)} trials)."
        )
        parts = {
            p: runs[fixed_phase_metric(p)].median()
            for p in FIXED_PHASES
            if fixed_phase_metric(p) in runs and runs[fixed_phase_metric(p)].notna().any()
        }
        if parts:
            largest = sorted(parts.items(), key=lambda kv: -kv[1])
            print("  Its parts' medians (fixed_<part>_s): " + ", ".join(f"{p} {v:.1f} s" for p, v in largest) + ".")
    if outcome is not None and outcome.training_share is not None:
        name, value = outcome.training_share
        device = "GPU" if "gpu" in name else "CPU"
        print(
            f"{name}: {value:.2f} (the trials' training {device}-seconds over the {device} time the study held: its "
            f"wall time x the cluster's {device}s; not the {device}'s utilisation within a step)."
        )
    if outcome is not None and outcome.gpu_busy is not None:
        print(
            f"{BUSY_METRIC}: {outcome.gpu_busy:.2f} (the share of the study's wall time in which its GPUs ran a kernel, "
            f"NVML's utilisation sampled every {SAMPLE_MS} ms by nvidia-smi on this node; not how much of the GPU each "
            "kernel used)."
        )


def _print_summary(study, tracking_uri: str, outcome=None) -> None:
    import pandas as pd

    from analysis import headline, load_runs, summarize
    from analysis.runs import SE_COLUMN
    from trainables.tracking import resolve_tracking_uri

    spec = study.spec
    name, smoke = study.experiment_name, study.smoke
    runs = load_runs(name, tracking_uri=tracking_uri)
    objective = spec.objective
    print()
    print(f"Best trial per cell by {objective.label}, {objective.mode} ({len(runs)} trials recorded in MLflow):")
    if _none_finished(runs, objective.column):
        print(f"  {_no_result_line(runs)}")
    else:
        for line in headline(runs, metric=objective.column, mode=objective.mode):  # the study's answer first
            print(f"  {line}")
        searched = tuple(sorted({p for c in study.cells for p in c.space}))
        table = summarize(runs, metric=objective.column, mode=objective.mode, show=searched, label=objective.label)
        with pd.option_context(
            "display.width", 200, "display.max_columns", 20, "display.float_format", "{:.4g}".format
        ):
            print(table.to_string() if not table.empty else "  (no finished trial)")
        if SE_COLUMN in table.columns:
            print(
                f"({SE_COLUMN}: the sampling error of each best value on its 'val n' validation samples. Cells "
                f"less than about two of them apart are not told apart by this run; the best of a searched cell "
                f"is also the luckiest of its trials.)"
            )
    _print_cost(runs, outcome)
    default_uri = tracking_uri == resolve_tracking_uri(DEFAULT_TRACKING_URI)
    uri_opt = "" if default_uri else f" --tracking-uri {tracking_uri}"
    study_arg = f"{'--smoke ' if smoke else ''}{_shown_path(study.path)}"
    print(f"\nRecorded in MLflow at {tracking_uri}, experiment {name!r}. Next:")
    print(f"  {_prog()} ui{uri_opt}            the study's page: its answer, then every trial best first")
    print(f"  {_prog()} report {study_arg}{uri_opt}   tables and plots under reports/{name}")
    print(f"  {_prog()} status {study_arg}{uri_opt}   trials per cell and status")


def _shown_path(path: Path) -> str:
    """A path as short as it can be written from here."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _none_finished(runs, metric: str) -> bool:
    """No trial of the records ended with a value of the objective (none yet, or every one failed)."""
    if runs.empty or metric not in runs or "status" not in runs:
        return True
    return runs.loc[runs["status"] == "finished", metric].dropna().empty


def _no_result_line(runs) -> str:
    if runs.empty:
        return "no trial recorded yet."
    counts = runs["status"].value_counts() if "status" in runs else {}
    by_status = ", ".join(f"{n} {s}" for s, n in counts.items())
    return (
        f"no trial finished with a result ({by_status}): nothing to tabulate. Each run's {REASON_TAG} tag "
        f"says why; `sharpscale status` counts them."
    )


def _prog() -> str:
    """How the user invoked us (`.venv/bin/sharpscale`), so a printed command works when pasted."""
    exe = Path(sys.argv[0])
    if exe.name != "sharpscale":
        return "sharpscale"
    try:
        return str(exe.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


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


def _cmd_ui(args) -> int:
    from trainables.tracking import check_tracking_uri, resolve_tracking_uri

    uri = check_tracking_uri(resolve_tracking_uri(args.tracking_uri))
    server_cli.check_port_and_workers(args.port, args.workers)
    # `mlflow ui` has no login and takes writes (rename, tag, delete runs) from whoever reaches it.
    server_cli.warn_if_exposed("the MLflow UI", args.host, args.port, "every run and artifact", writes=True)
    server_cli.check_bindable(args.host, args.port, "the MLflow UI")
    log_path = ui_log_path(uri)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # MLflow's and SQLAlchemy's deprecations: for the log, not the user
        page = _ui_page(uri, args.study, args.smoke)  # a missing store or study is said before any server starts
    _keep_writes_inside(uri, refuse=False)  # the UI serves (and takes) artifacts where the store records them
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
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


def _cmd_dashboard(args) -> int:
    """optuna-dashboard over the Optuna storage the study's newest run recorded (else the one its file names)."""
    from studies.records import find_study_run
    from studies.runner import state_locations
    from studies.search import open_optuna_storage
    from studies.spec import load_study
    from trainables.tracking import sqlite_path, tracking_client

    try:
        import optuna_dashboard
    except ImportError:
        print(
            "sharpscale: error: optuna-dashboard is not installed. Fix: pip install optuna-dashboard", file=sys.stderr
        )
        return 2
    server_cli.check_port_and_workers(args.port, None)
    server_cli.check_bindable(args.host, args.port, "optuna-dashboard")
    study = load_study(args.study, smoke=args.smoke, overrides=_overrides(args), require_data=False)
    spec = study.spec
    uri = _read_uri(args, spec)
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
            f"(`sharpscale run {'--smoke ' if args.smoke else ''}{args.study}`), or give its --tracking-uri."
        )
    storage = _travelled_optuna(uri, state_locations(study, name, run.data.tags).optuna_storage, args.allow_writes)
    # The hosts `sharpscale server` admits, --allowed-host too, matched as addresses and exact names.
    hosts = server_cli.allowed_host_entries(args.allowed_host, bound=args.host)
    app = server_cli.guard_wsgi(optuna_dashboard.wsgi(open_optuna_storage(storage)), hosts, writes=args.allow_writes)
    url = f"http://{args.host}:{args.port}"
    server_cli.warn_if_exposed("optuna-dashboard", args.host, args.port, "every trial", writes=args.allow_writes)
    print(
        f"Starting optuna-dashboard over {storage} (one Optuna study per cell; each trial's user attributes hold "
        f"its MLflow run id and name; {'writes allowed' if args.allow_writes else 'read-only'}) ...",
        flush=True,
    )
    _say_when_answering(url, f"optuna-dashboard: {url} (Ctrl-C stops it)", path="/")
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    class _Quiet(WSGIRequestHandler):
        def log_message(self, format, *args):  # noqa: A002 - wsgiref's signature
            pass  # one line per request would bury the terminal

    try:
        with make_server(args.host, args.port, app, handler_class=_Quiet) as httpd:
            httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def _keep_writes_inside(uri: str, *, refuse: bool = True) -> None:
    """Before a command writes to a copied or moved store through MLflow: its artifact locations where it now is,
    or one line saying it points outside itself (MLflow would recreate the original's folders there)."""
    from studies.export import ARTIFACTS_DIR, adopt_moved_store, locations_outside

    moved = adopt_moved_store(uri)
    if moved:
        print(
            f"sharpscale: note: the store was moved; {moved} artifact location(s) now point into its {ARTIFACTS_DIR}/"
        )
    outside = locations_outside(uri)
    if outside and refuse:  # the UI (refuse=False) still shows every run and metric, and prints only its address
        raise UserError(
            f"tracking URI: the store {uri} points outside itself: {len(outside)} artifact location(s) such as "
            f"{outside[0]} are gone and not in its {ARTIFACTS_DIR}/. Fix: copy the original's {ARTIFACTS_DIR}/ "
            f"beside it (or `sharpscale export` the original), or pass --no-mlflow."
        )


def _cmd_report(args) -> int:
    from analysis import load_runs
    from analysis.report import write_report
    from studies.spec import load_study

    study = load_study(args.study, smoke=args.smoke, overrides=_overrides(args), require_data=False)
    spec = study.spec
    uri = _read_uri(args, spec)
    name = study.experiment_name
    if not args.no_mlflow:
        _keep_writes_inside(uri)
    runs = load_runs(name, tracking_uri=uri)
    if _none_finished(runs, spec.objective.metric):
        # A normal outcome of a study (not yet run, or every trial failed): said plainly, no empty tables written.
        print(f"{name}: {_no_result_line(runs)} No report written.")
        return 0
    out_dir = Path(args.out or f"reports/{name}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        files = write_report(
            name,
            tracking_uri=uri,
            out_dir=out_dir,
            log_to_mlflow=not args.no_mlflow,
            metric=spec.objective.column,
            mode=spec.objective.mode,
        )
    for f in files:
        print(f)
    # What the data cannot support (one seed, few pairs) is a note for the reader, not a traceback line.
    for note in dict.fromkeys(
        f"{type(c.message).__name__}: {c.message}"
        for c in caught
        if not issubclass(c.category, (DeprecationWarning, FutureWarning))
    ):
        print(f"sharpscale: note: {note}")
    where = "" if args.no_mlflow else " and logged under report/ to the study's MLflow run"
    print(f"{len(files)} files written to {out_dir}{where}")
    return 0


def _cmd_calibrate(args) -> int:
    from studies.calibrate import calibrate, probe_config
    from studies.spec import load_study

    study = load_study(args.study, smoke=args.smoke, overrides=_overrides(args), require_data=False)
    cells = [c for c in study.cells if not args.cell or c.key in args.cell]
    if args.cell and len(cells) != len(set(args.cell)):
        known = ", ".join(c.key for c in study.cells)
        raise UserError(
            f"calibrate --cell: {sorted(set(args.cell) - {c.key for c in cells})} not cells of the study "
            f"(its cells: {known}). Fix: name cells as `sharpscale run --dry-run` lists them."
        )
    # One measurement per distinct probe: cells that differ only in seeds or searched knobs train alike.
    probes: dict[str, str] = {}
    for c in cells:
        key = repr(sorted(probe_config(c.config, device=args.device, steps=args.steps).items()))
        probes.setdefault(key, c.key)
    results = []
    for c in cells:
        if c.key not in probes.values():
            continue
        result = calibrate(c.config, cell=c.key, max_shares=args.max_shares, steps=args.steps, device=args.device)
        results.append(result)
        for line in result.lines():
            print(line, flush=True)
    fewest = min(results, key=lambda r: r.shares)
    if len(results) > 1:
        print(
            f"\nFor the study (every trial shares alike, so the cell that gains least from sharing decides): "
            f"resources.gpus_per_trial: {fewest.gpus_per_trial:g} (cell {fewest.cell})."
        )
    return 0


def _cmd_export(args) -> int:
    from studies.export import export_store

    done = export_store(args.tracking_uri, args.dest)
    print(
        f"Exported {done.experiments} experiment(s), {done.runs} run(s) and {done.folders} artifact folder(s) to "
        f"{args.dest}. Use it from anywhere with --tracking-uri {done.tracking_uri}"
    )
    return 0


def _cmd_data_fetch(args) -> int:
    from trainables.fetch import fetch_dataset

    where = fetch_dataset(args.dataset, args.to, url=args.url, md5=args.md5, log=lambda msg: print(msg, flush=True))
    print(f"Use it with: --set data.root={where}   (or data.root: {where} in the study file)")
    return 0


def _cmd_data_prepare(args) -> int:
    from trainables.prepare import MANIFEST, default_short_side, prepare_folder

    short_side = args.short_side if args.short_side is not None else default_short_side(args.img_size)
    done = prepare_folder(
        args.source,
        args.to,
        short_side=short_side,
        quality=args.quality,
        workers=args.workers,
        form=args.form,
        log=lambda msg: print(msg, flush=True),
    )
    copied = f", {done.copied} copied as they were" if done.form == "jpeg" else ""
    print(
        f"Prepared {sum(done.files.values())} images as {done.form} ({done.resized} resized{copied}) in "
        f"{done.seconds:.1f} s: {done.pixels_after / max(done.pixels_before, 1):.2f} of the pixels and "
        f"{done.bytes_after / max(done.bytes_before, 1):.2f} of the bytes. Manifest: {Path(args.to) / MANIFEST}"
    )
    kind = "an image folder like the original" if done.form == "jpeg" else "read as the image folder it came from"
    print(f"Use it with: --set data.root={Path(args.to).expanduser().resolve()}   ({kind})")
    return 0


def _add_data(sub) -> None:
    from trainables.prepare import DEFAULT_QUALITY, FORMS
    from trainables.prepare import MANIFEST as MANIFEST_NAME

    data = sub.add_parser("data", help="put datasets where every node of a cluster reads them")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    fetch = data_sub.add_parser(
        "fetch",
        help="download a dataset's official archive, check its md5, unpack it into DIR or upload it to a URI",
        description="Download the official python-version archive of DATASET, check its md5, unpack it safely and "
        "put its folder (cifar-10-batches-py or cifar-100-python) in DIR, or upload it under a URI that pyarrow.fs "
        "opens (s3://, gs://, file://, ...). DIR_OR_URI is then what data.root names; each node stages a URI "
        "root once into its local cache ($SHARPSCALE_DATA_CACHE, default ~/.cache/sharpscale/data).",
    )
    fetch.add_argument("dataset", metavar="DATASET", help="cifar10 or cifar100")
    fetch.add_argument(
        "--to", required=True, metavar="DIR_OR_URI", help="a directory, or a URI such as s3://BUCKET/cifar10"
    )
    fetch.add_argument("--url", default=None, help="the archive's URL on a mirror (default: the official one)")
    fetch.add_argument("--md5", default=None, help="the md5 of the archive at --url (default: the official archive's)")
    fetch.set_defaults(func=_cmd_data_fetch)
    prep = data_sub.add_parser(
        "prepare",
        help="resize an image folder once so its shorter sides are near the crop's scale (fewer pixels to decode)",
        description="Write the prepared form of the image folder SOURCE (train/ and val/, one sub-folder per class) "
        "to --to: every image resized so its shorter side is --short-side (aspect kept, never upscaled; PIL's "
        "antialiased bicubic) and, in the jpeg form (the default), saved as an RGB baseline JPEG at --quality in the same layout; baseline JPEGs already "
        "small enough are copied as they are (progressive ones are re-encoded). An image that cannot be read stops "
        "it: every unreadable image is listed with the fix and nothing is written. A manifest ("
        + MANIFEST_NAME
        + ") records the source, the settings and "
        "the counts. Point data.root at --to: the jpeg form is an ordinary image folder; the pixels form (--form pixels) "
        "holds each split's decoded pixels in one file, which data.root reads as the folder it came from (same "
        "classes, order and transforms), with nothing to decode while training. The default short side is what "
        "timm's eval transform resizes to before its central crop (256 for --img-size 224), so validation images "
        "match the original's up to the JPEG re-encoding; training crops of the prepared images have fewer source pixels "
        "(a crop under img_size on a side is upsampled), so use a larger --short-side to keep more detail. Measured "
        "gains are in docs/benchmarks.md.",
    )
    prep.add_argument("source", metavar="SOURCE", help="the image folder to prepare (holding train/ and val/)")
    prep.add_argument("--to", required=True, metavar="DIR", help="a new (or empty) directory for the prepared form")
    prep.add_argument(
        "--short-side",
        type=int,
        default=None,
        help="the shorter side in pixels after resizing (default: what timm's eval transform resizes to for "
        "--img-size, 256 for 224)",
    )
    prep.add_argument(
        "--img-size", type=_positive_int, default=224, help="the crop size the data will be trained at (default 224)"
    )
    prep.add_argument(
        "--quality", type=int, default=None, help=f"JPEG quality, 1-95, of --form jpeg (default {DEFAULT_QUALITY})"
    )
    prep.add_argument(
        "--workers", type=_positive_int, default=None, help="processes resizing in parallel (default: every CPU core)"
    )
    prep.add_argument(
        "--form",
        choices=FORMS,
        default="jpeg",
        help="jpeg: baseline JPEGs in the original's layout (default); pixels: each split's decoded pixels in one file "
        "(about 10x the JPEG form's bytes, 2-4x a typical original's; nothing to decode while training: the fastest "
        "device path)",
    )
    prep.set_defaults(func=_cmd_data_prepare)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sharpscale",
        description="Hyperparameter and data-scaling studies of sharpness-aware training on Ray Tune + Optuna, "
        "recorded in MLflow.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    study_file, tracking, cluster = [_study_options()], [_tracking_option()], [_cluster_options()]
    exits = (
        f"Exit status: 0 done; {EXIT_ERRORS} when trials errored or no trial ran an epoch (the study is FAILED); {EXIT_USAGE} for a mistake in the study or the "
        f"options (every problem listed, nothing started); {EXIT_INTERRUPTED} when interrupted (Ctrl-C): the "
        f"study is incomplete and `resume` finishes it."
    )

    run = sub.add_parser(
        "run",
        parents=study_file + tracking + cluster,
        epilog=exits,
        help="run a study file (validates it completely first)",
    )
    run.add_argument("study", help="study file, e.g. studies/quickstart.yaml")
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="print the cells and trial counts, what the design can detect (80%% power) and the estimated GPU-hours "
        "(from measured figures, on this machine's card where it has one); run nothing",
    )
    run.add_argument(
        "--new-launch",
        action="store_true",
        help="the study already ran into this experiment: start another launch, kept apart from the earlier ones "
        "(without it such a run is refused; `resume` continues the newest launch instead)",
    )
    run.set_defaults(func=_cmd_run)

    res = sub.add_parser(
        "resume",
        parents=study_file + tracking + cluster,
        epilog=exits,
        help="finish an interrupted study: finished trials are not re-run, no run is duplicated; its state is where "
        "the interrupted run recorded it",
    )
    res.add_argument("study", help="the study file that was run")
    res.add_argument(
        "--trust-storage",
        action="store_true",
        help="restore Tune's state files (which Tune unpickles) even where they are not the ones this launch recorded "
        "leaving (its driver was killed hard, or its node lost): only where no one else can write to the storage",
    )
    res.add_argument(
        "--take-over",
        action="store_true",
        help="take the launch's driver claim from the driver that holds it, on another host, known to be gone (its "
        "machine lost); a driver that ended on this host is taken over without it",
    )
    res.set_defaults(func=_cmd_run, dry_run=False)

    st = sub.add_parser(
        "status",
        parents=study_file + tracking,
        help="trials per cell and status, and the best so far, from MLflow (creates nothing)",
    )
    st.add_argument("study")
    st.set_defaults(func=_cmd_status)

    val = sub.add_parser(
        "validate",
        parents=study_file,
        help=f"check a study file: exit 0 when valid, {EXIT_USAGE} listing every problem",
        epilog=f"Exit status: 0 when the study is valid; {EXIT_USAGE} when it is not (every problem listed, one a line).",
    )
    val.add_argument("study")
    val.set_defaults(func=_cmd_validate)

    rep = sub.add_parser(
        "report",
        parents=study_file + tracking,
        help="write the study's tables (Markdown, CSV), plots (PNG) and report.html (all of it on one self-contained "
        "page); log them to the study's MLflow run, whose description links to report.html",
    )
    rep.add_argument("study", help="the study file")
    rep.add_argument("--out", default=None, help="output directory (default: reports/<study>)")
    rep.add_argument("--no-mlflow", action="store_true", help="write the files only, log nothing")
    rep.set_defaults(func=_cmd_report)

    srv = sub.add_parser(
        "server",
        help="MLflow tracking server for a cluster: artifacts over HTTP, loopback unless --host, the head's names "
        "and --allowed-host accepted, --auth for a login (Ctrl-C/SIGTERM stops it)",
    )
    server_cli.add_arguments(srv)
    srv.set_defaults(func=server_cli.from_args)

    cal = sub.add_parser(
        "calibrate",
        parents=study_file,
        help="measure how many trials of the study should share one GPU (resources.gpus_per_trial), on this machine's GPU",
        description="Train 1, 2, ... copies of each distinct trial of the study at once on this machine's first GPU "
        "(synthetic data on the device, the cell's model, method, batch and image size, two short epochs) and print "
        "their aggregate images/s; recommends the largest count whose every added trial raised it by at least 10%, "
        "as resources.gpus_per_trial = 1/count. Run it on a node with the card the study will run on.",
    )
    cal.add_argument("study")
    cal.add_argument(
        "--cell", action="append", default=[], help="only this cell (repeatable; default: every distinct one)"
    )
    cal.add_argument("--max-shares", type=int, default=4, help="most trials tried on one GPU (default 4)")
    cal.add_argument("--steps", type=int, default=30, help="steps of each measured epoch (default 30)")
    cal.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)
    cal.set_defaults(func=_cmd_calibrate)

    _add_data(sub)

    exp = sub.add_parser(
        "export",
        help="copy a local MLflow store and its artifacts into one folder that travels (report, ui, notebooks work "
        "on the copy after the original is gone)",
        description="Copy the SQLite store and every local artifact of its runs into DEST (new or empty): "
        "DEST/mlflow.db and DEST/mlartifacts/, the copy's artifact locations rewritten to point there. A plain copy "
        "of mlflow.db keeps pointing at the original's artifact folders (MLflow records absolute paths).",
    )
    exp.add_argument("dest", metavar="DEST", help="the folder to write (new or empty)")
    exp.add_argument(
        "--tracking-uri",
        default=DEFAULT_TRACKING_URI,
        help=f"the store to copy: an sqlite:/// file or a path (default: {DEFAULT_TRACKING_URI})",
    )
    exp.set_defaults(func=_cmd_export)

    dash = sub.add_parser(
        "dashboard",
        parents=study_file + tracking,
        help="optuna-dashboard over the study's Optuna storage: each cell's search, trial by trial (Ctrl-C stops it)",
    )
    dash.add_argument("study", help="the study file that was run")
    dash.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    dash.add_argument("--port", type=int, default=8080)
    dash.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name or address to accept in Host headers besides loopback and this machine's names and "
        "addresses (repeatable; 'NAME:PORT' that port only, '*.DOMAIN' a domain's names); others get 403",
    )
    dash.add_argument(
        "--allow-writes",
        action="store_true",
        help="let the browser change the Optuna studies (notes, deleting a study); without it POST/PUT/DELETE get "
        "405: the dashboard has no login",
    )
    dash.set_defaults(func=_cmd_dashboard)

    ui = sub.add_parser(
        "ui",
        help="start the MLflow UI over the tracking store and print the address of the study's runs page (Ctrl-C "
        "stops it)",
        description="Start the MLflow UI over the tracking store and print one address: the runs page of STUDY (or "
        "of the study that ran last in the store), whose description holds the answer table and whose table lists "
        "every trial, best first. The server's own output goes to sharpscale.log beside the store.",
    )
    ui.add_argument(
        "study",
        nargs="?",
        default=None,
        help="the study file or name whose page to open (default: the study that ran last in the store)",
    )
    ui.add_argument("--smoke", action="store_true", help="open the study's --smoke runs")
    ui.add_argument(
        "--tracking-uri",
        default=DEFAULT_TRACKING_URI,
        help=f"the MLflow store to browse: an sqlite:/// file, a path, or an http(s):// server (default: {DEFAULT_TRACKING_URI})",
    )
    ui.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument(
        "--workers",
        type=int,
        default=1,
        help="server processes (default 1: one person browsing is served by one; MLflow's own default, 4, starts "
        "four, each importing all of MLflow)",
    )
    ui.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name or address to accept in Host headers besides loopback and this machine's names and "
        "addresses (repeatable; 'NAME:PORT' that port only, '*.DOMAIN' a domain's names); others get 403",
    )
    ui.set_defaults(func=_cmd_ui)
    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sharpscale")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with _quiet_env(), _loopback_ray(args):
            return args.func(args)
    except UserError as err:
        # A user mistake: the message says what to fix; a traceback would only hide it.
        print(f"sharpscale: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as err:
        # The machine refused (a full disk, read-only storage): one line with the cause; what the study had
        # opened is closed by then, and the notes say if closing failed too.
        notes = "".join(f"\n  {n}" for n in getattr(err, "__notes__", []))
        print(f"sharpscale: error: {err}{notes}", file=sys.stderr)
        return EXIT_ERRORS
    except KeyboardInterrupt:
        # Ctrl-C outside the trials (while Ray starts, say); the study runner closes what it opened.
        if getattr(args, "func", None) is _cmd_run and not getattr(args, "dry_run", False):
            print(f"\n{_incomplete(args, 'before it ended')}", file=sys.stderr)
        else:
            print("\nsharpscale: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
