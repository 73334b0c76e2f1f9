"""The `sharpscale` command: run, validate and inspect studies, open the MLflow UI."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

from studies import server as server_cli

__all__ = ["main"]

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def _quiet_env() -> None:
    # Nothing leaves the machine unless the user opts in.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # MLflow's INFO lines (creating a store's tables) are not the user's business; its warnings still show.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")


def _overrides(args) -> dict:
    import yaml

    from studies.spec import StudyError

    out = {}
    for item in getattr(args, "set", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise StudyError(args.study, [
                f"--set {item!r}: must be KEY=VALUE with KEY a dotted config path or study setting. "
                f"Fix: e.g. --set data.root=/data/cifar10 or --set storage=/mnt/shared/sharpscale_runs"
            ])
        out[key.strip()] = yaml.safe_load(value)
    if getattr(args, "storage", None) is not None:
        out["storage"] = args.storage  # a path or URI as typed: YAML would turn some into other types
    return out


def _study_options() -> argparse.ArgumentParser:
    """Options shared by every command that reads a study file."""
    from studies.spec import SETTABLE_FIELDS

    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--set", action="append", metavar="KEY=VALUE", default=[],
        help="override a trial config path for every cell (--set data.root=/data/cifar10) or a study setting "
        f"({', '.join(SETTABLE_FIELDS)}; e.g. --set checkpoints.keep=3); repeatable",
    )
    parent.add_argument(
        "--storage", default=None, metavar="PATH_OR_URI",
        help="Ray's results and checkpoints (and, by default, Optuna's database beside them) for this run, instead of "
        "the study's `storage:`; same as --set storage=...: a directory, or s3:// / gs:// (docs/cluster.md)",
    )
    return parent


def _cmd_validate(args) -> int:
    from studies.spec import load_study

    study = load_study(args.study, smoke=args.smoke, overrides=_overrides(args))
    print(f"{args.study}: valid. {len(study.cells)} cells, {study.total_trials} trials.")
    name = (study.spec.tracking.experiment or study.spec.name) + ("-smoke" if args.smoke else "")
    print(f"State: Ray storage {study.storage}, Optuna {study.optuna_storage(name)} (a resumed run keeps its recorded ones).")
    return 0


def _print_cells(study) -> None:
    width = max((len(c.key) for c in study.cells), default=4)
    print(f"{'cell':<{width}}  trials  searched")
    for c in study.cells:
        space = ", ".join(f"{p} ~ {d.type}" for p, d in c.space.items()) or "-"
        print(f"{c.key or 'all':<{width}}  {c.trials:>6}  {space}")
    print(f"{len(study.cells)} cells, {study.total_trials} trials")


def _cmd_run(args) -> int:
    from studies.spec import load_study

    # Every mistake surfaces here, before Ray starts; a dry run reads only the file, so it needs no data.
    study = load_study(args.study, smoke=args.smoke, overrides=_overrides(args), require_data=not args.dry_run)
    if args.dry_run:
        _print_cells(study)
        return 0
    from studies.runner import run_study

    outcome = run_study(
        args.study,
        address=args.address,
        tracking_uri=args.tracking_uri,
        smoke=args.smoke,
        num_cpus=args.num_cpus,
        resume=args.command == "resume",
        overrides=_overrides(args),
        new_launch=getattr(args, "new_launch", False),
    )
    _print_summary(study, outcome.tracking_uri, smoke=args.smoke)
    if outcome.errored:
        print(f"sharpscale: {outcome.errored} trial(s) errored after their retries; see `sharpscale status` and the "
              f"runs' sharpscale.reason tags", file=sys.stderr)
    return 1 if outcome.trials == 0 or outcome.errored else 0


def _cmd_status(args) -> int:
    import pandas as pd

    from analysis import load_runs
    from trainables.tracking import resolve_tracking_uri
    from studies.spec import load_study

    # Reads the file and MLflow only: the data need not be on this machine.
    study = load_study(args.study, smoke=args.smoke, overrides=_overrides(args), require_data=False)
    spec = study.spec
    uri = resolve_tracking_uri(args.tracking_uri or spec.tracking.uri)
    name = (spec.tracking.experiment or spec.name) + ("-smoke" if args.smoke else "")
    runs = load_runs(name, tracking_uri=uri)
    planned = pd.Series({c.key: c.trials for c in study.cells}, name="planned")
    if runs.empty:
        counts = pd.DataFrame(index=planned.index)
    else:
        counts = runs.pivot_table(index="cell", columns="status", values="run_id", aggfunc="count", fill_value=0)
        column = spec.objective.column
        if column in runs:
            finished = runs[runs["status"] == "finished"]
            best = finished.groupby("cell")[column].max() if spec.objective.mode == "max" else finished.groupby("cell")[column].min()
            counts[f"best {spec.objective.label}"] = best
    table = counts.join(planned, how="right").fillna(0)
    launch = f", launch {runs['launch'].iloc[0]}" if not runs.empty else ""
    print(f"{name}{launch}: {len(runs)} of {study.total_trials} trials recorded at {uri}")
    print(_state_line(study, uri, name))
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.4g}".format):
        print(table.to_string())
    return 0


def _state_line(study, uri: str, name: str) -> str:
    """Where the study's state is: as its latest study run recorded it, else as this file would put it."""
    from studies.runner import find_study_run, state_locations
    from trainables.tracking import tracking_client

    client = tracking_client(uri)
    exp = client.get_experiment_by_name(name)
    run = find_study_run(client, exp.experiment_id, study) if exp is not None else None
    where = state_locations(study, name, run.data.tags if run is not None else None)
    origin = "recorded by its study run" if run is not None else "from the study file; no study run recorded yet"
    return f"State ({origin}): Ray storage {where.storage}, Optuna {where.optuna_storage}"


def _print_summary(study, tracking_uri: str, *, smoke: bool) -> None:
    import pandas as pd

    from analysis import load_runs, summarize
    from trainables.tracking import resolve_tracking_uri

    spec = study.spec
    name = (spec.tracking.experiment or spec.name) + ("-smoke" if smoke else "")
    runs = load_runs(name, tracking_uri=tracking_uri)
    searched = tuple(sorted({p for c in study.cells for p in c.space}))
    objective = spec.objective
    table = summarize(runs, metric=objective.column, mode=objective.mode, show=searched, label=objective.label)
    print()
    print(f"Best trial per cell by {objective.label}, {objective.mode} ({len(runs)} trials recorded in MLflow):")
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.4g}".format):
        print(table.to_string() if not table.empty else "  (no finished trial)")
    default_uri = tracking_uri == resolve_tracking_uri(DEFAULT_TRACKING_URI)
    uri_opt = "" if default_uri else f" --tracking-uri {tracking_uri}"
    study_arg = f"{'--smoke ' if smoke else ''}{_shown_path(study.path)}"
    print(f"\nRecorded in MLflow at {tracking_uri}, experiment {name!r}. Next:")
    print(f"  {_prog()} ui{uri_opt}            browse every trial (the cell runs carry each cell's best)")
    print(f"  {_prog()} report {study_arg}{uri_opt}   tables and plots under reports/{name}")
    print(f"  {_prog()} status {study_arg}{uri_opt}   trials per cell and status")


def _shown_path(path: Path) -> str:
    """A path as short as it can be written from here."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _prog() -> str:
    """How the user invoked us (`.venv/bin/sharpscale`), so a printed command works when pasted."""
    exe = Path(sys.argv[0])
    if exe.name != "sharpscale":
        return "sharpscale"
    try:
        return str(exe.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


def _cmd_ui(args) -> int:
    from trainables.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(args.tracking_uri)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", args.host, "--port", str(args.port)]
    url = f"http://{args.host}:{args.port}"
    print(f"Starting the MLflow UI over {uri} ...", flush=True)
    # MLflow 3.17 opens on its GenAI side bar until the browser has chosen "Model training" once; this link does.
    _say_when_answering(url, f"MLflow UI: {url}/#/experiments?workflowType=machine_learning (Ctrl-C stops it)")
    return server_cli.run_in_process_group(cmd)


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


def _cmd_dashboard(args) -> int:
    """optuna-dashboard over the Optuna storage the study's newest run recorded (else the one its file names)."""
    from studies.runner import find_study_run, state_locations
    from studies.search import open_optuna_storage
    from studies.spec import load_study
    from trainables.tracking import resolve_tracking_uri, tracking_client

    try:
        import optuna_dashboard
    except ImportError:
        print("sharpscale: error: optuna-dashboard is not installed. Fix: pip install optuna-dashboard", file=sys.stderr)
        return 2
    study = load_study(args.study, smoke=args.smoke, overrides=_overrides(args), require_data=False)
    spec = study.spec
    uri = resolve_tracking_uri(args.tracking_uri or spec.tracking.uri)
    name = (spec.tracking.experiment or spec.name) + ("-smoke" if args.smoke else "")
    client = tracking_client(uri)
    exp = client.get_experiment_by_name(name)
    run = find_study_run(client, exp.experiment_id, study) if exp is not None else None
    if run is None:
        raise LookupError(
            f"study {name!r}: no study run recorded at {uri}, so no Optuna storage to show. Fix: run it first "
            f"(`sharpscale run {'--smoke ' if args.smoke else ''}{args.study}`), or give its --tracking-uri."
        )
    storage = state_locations(study, name, run.data.tags).optuna_storage
    url = f"http://{args.host}:{args.port}"
    print(f"Starting optuna-dashboard over {storage} (one Optuna study per cell; each trial's user attributes hold "
          f"its MLflow run id and name) ...", flush=True)
    _say_when_answering(url, f"optuna-dashboard: {url} (Ctrl-C stops it)", path="/")
    try:
        optuna_dashboard.run_server(open_optuna_storage(storage), host=args.host, port=args.port)
    except KeyboardInterrupt:
        pass
    return 0


def _cmd_report(args) -> int:
    from analysis.report import write_report
    from trainables.tracking import resolve_tracking_uri
    from studies.spec import load_study

    study = load_study(args.study, smoke=args.smoke, overrides=_overrides(args), require_data=False)
    spec = study.spec
    uri = resolve_tracking_uri(args.tracking_uri or spec.tracking.uri)
    name = (spec.tracking.experiment or spec.name) + ("-smoke" if args.smoke else "")
    out_dir = Path(args.out or f"reports/{name}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        files = write_report(name, tracking_uri=uri, out_dir=out_dir, log_to_mlflow=not args.no_mlflow,
                             metric=spec.objective.column, mode=spec.objective.mode)
    for f in files:
        print(f)
    # What the data cannot support (one seed, few pairs) is a note for the reader, not a traceback line.
    for note in dict.fromkeys(f"{type(c.message).__name__}: {c.message}" for c in caught
                              if not issubclass(c.category, (DeprecationWarning, FutureWarning))):
        print(f"sharpscale: note: {note}")
    where = "" if args.no_mlflow else " and logged under report/ to the study's MLflow run"
    print(f"{len(files)} files written to {out_dir}{where}")
    return 0


def _cmd_data_fetch(args) -> int:
    from trainables.fetch import FetchError, fetch_dataset

    try:
        where = fetch_dataset(args.dataset, args.to, url=args.url, md5=args.md5, log=lambda msg: print(msg, flush=True))
    except FetchError as err:
        print(f"sharpscale: error: {err}", file=sys.stderr)
        return 2
    print(f"Use it with: --set data.root={where}   (or data.root: {where} in the study file)")
    return 0


def _add_data(sub) -> None:
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
    fetch.add_argument("--to", required=True, metavar="DIR_OR_URI", help="a directory, or a URI such as s3://BUCKET/cifar10")
    fetch.add_argument("--url", default=None, help="the archive's URL on a mirror (default: the official one)")
    fetch.add_argument("--md5", default=None, help="the md5 of the archive at --url (default: the official archive's)")
    fetch.set_defaults(func=_cmd_data_fetch)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sharpscale",
        description="Hyperparameter and data-scaling studies of sharpness-aware training on Ray Tune + Optuna, "
        "recorded in MLflow.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    study_options = [_study_options()]

    run = sub.add_parser("run", parents=study_options, help="run a study file (validates it completely first)")
    run.add_argument("study", help="study file, e.g. studies/quickstart.yaml")
    run.add_argument("--address", default=None, help="existing Ray cluster ('auto' on a cluster node); default: start a local one")
    run.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: the study's, sqlite:///mlflow.db)")
    run.add_argument("--smoke", action="store_true", help="run the study tiny, on the embedded digits, on CPU")
    run.add_argument("--dry-run", action="store_true", help="print the cells and trial counts, run nothing")
    run.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray cluster (default: all)")
    run.add_argument(
        "--new-launch", action="store_true",
        help="the study already ran into this experiment: start another launch, kept apart from the earlier ones "
        "(without it such a run is refused; `resume` continues the newest launch instead)",
    )
    run.set_defaults(func=_cmd_run)

    res = sub.add_parser(
        "resume", parents=study_options,
        help="finish an interrupted study: finished trials are not re-run, no run is duplicated; its state is where "
        "the interrupted run recorded it",
    )
    res.add_argument("study", help="the study file that was run")
    res.add_argument("--address", default=None, help="existing Ray cluster; default: start a local one")
    res.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: the study's)")
    res.add_argument("--smoke", action="store_true", help="resume the --smoke run of the study")
    res.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray cluster (default: all)")
    res.set_defaults(func=_cmd_run, dry_run=False)

    st = sub.add_parser("status", parents=study_options, help="trials per cell and status, and the best so far, from MLflow")
    st.add_argument("study")
    st.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: the study's, sqlite:///mlflow.db)")
    st.add_argument("--smoke", action="store_true", help="the --smoke run of the study")
    st.set_defaults(func=_cmd_status)

    val = sub.add_parser("validate", parents=study_options, help="check a study file; exit 2 listing every problem")
    val.add_argument("study")
    val.add_argument("--smoke", action="store_true", help="validate the --smoke form too")
    val.set_defaults(func=_cmd_validate)

    rep = sub.add_parser(
        "report", parents=study_options,
        help="write the study's tables (Markdown, CSV) and plots (PNG); log them to MLflow",
    )
    rep.add_argument("study", help="the study file")
    rep.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: the study's)")
    rep.add_argument("--out", default=None, help="output directory (default: reports/<study>)")
    rep.add_argument("--smoke", action="store_true", help="report on the --smoke run of the study")
    rep.add_argument("--no-mlflow", action="store_true", help="write the files only, log nothing")
    rep.set_defaults(func=_cmd_report)

    srv = sub.add_parser(
        "server",
        help="MLflow tracking server for a cluster: artifacts over HTTP, loopback unless --host, the head's names "
        "and --allowed-host accepted, --auth for a login (Ctrl-C/SIGTERM stops it)",
    )
    server_cli.add_arguments(srv)
    srv.set_defaults(func=server_cli.from_args)

    _add_data(sub)

    dash = sub.add_parser(
        "dashboard", parents=study_options,
        help="optuna-dashboard over the study's Optuna storage: each cell's search, trial by trial (Ctrl-C stops it)",
    )
    dash.add_argument("study", help="the study file that was run")
    dash.add_argument("--tracking-uri", default=None, help="MLflow tracking URI where its study run is (default: the study's)")
    dash.add_argument("--smoke", action="store_true", help="the --smoke run of the study")
    dash.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    dash.add_argument("--port", type=int, default=8080)
    dash.set_defaults(func=_cmd_dashboard)

    ui = sub.add_parser("ui", help="start the MLflow UI over the tracking store (Ctrl-C stops it)")
    ui.add_argument(
        "--tracking-uri", default=DEFAULT_TRACKING_URI,
        help=f"the MLflow store to browse: an sqlite:/// file, a path, or an http(s):// server (default: {DEFAULT_TRACKING_URI})",
    )
    ui.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    ui.add_argument("--port", type=int, default=5000)
    ui.set_defaults(func=_cmd_ui)
    return p


def main(argv: list[str] | None = None) -> int:
    _quiet_env()
    args = build_parser().parse_args(argv)
    from studies.spec import StudyError
    from trainables.config import ConfigError

    try:
        return args.func(args)
    except (StudyError, ConfigError, LookupError) as err:
        # A user mistake: the message says what to fix; a traceback would only hide it.
        print(f"sharpscale: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
