"""The commands that read a study's records: `status` (its trials so far), `report` (its tables, plots and page)
and `export` (its store, as one folder that travels)."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from studies.cli.base import Command, overrides, place, prog, read_uri, study_options, tracking_option
from studies.cli.summary import no_result_line, none_finished
from studies.shell import shell_command
from trainables.errors import UserError
from trainables.naming import DEFAULT_TRACKING_URI


class Status(Command):
    name = "status"
    help = "trials per cell and status, and the best so far, from MLflow (creates nothing)"
    options = (study_options, tracking_option)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("study")

    def take_action(self, args) -> int:
        from analysis import headline, load_runs
        from analysis.runs import status_table, table_format
        from studies.spec import load_study

        # Reads the file and MLflow only: the data need not be on this machine.
        study = load_study(args.study, smoke=args.smoke, overrides=overrides(args), require_data=False)
        spec = study.spec
        uri = read_uri(args, spec)
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
        with table_format():
            print(table.to_string())
        return 0


class Report(Command):
    name = "report"
    help = (
        "write the study's tables (Markdown, CSV), plots (PNG) and report.html (all of it on one self-contained "
        "page); log them to the study's MLflow run, whose description links to report.html"
    )
    options = (study_options, tracking_option)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("study", help="the study file")
        parser.add_argument("--out", default=None, help="output directory (default: reports/<study>)")
        parser.add_argument("--no-mlflow", action="store_true", help="write the files only, log nothing")

    def take_action(self, args) -> int:
        from analysis import load_runs
        from analysis.report import write_report
        from studies.spec import load_study

        study = load_study(args.study, smoke=args.smoke, overrides=overrides(args), require_data=False)
        spec = study.spec
        uri = read_uri(args, spec)
        name = study.experiment_name
        if not args.no_mlflow:
            keep_writes_inside(uri)
        runs = load_runs(name, tracking_uri=uri)
        if none_finished(runs, spec.objective.metric):
            # A normal outcome of a study (not yet run, or every trial failed): said plainly, no empty tables written.
            print(f"{name}: {no_result_line(runs)} No report written.")
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


class Export(Command):
    name = "export"
    help = (
        "copy a local MLflow store and its artifacts into one folder that travels (report, ui, notebooks work "
        "on the copy after the original is gone)"
    )
    description = (
        "Copy the SQLite store and every local artifact of its runs into DEST (new or empty): "
        "DEST/mlflow.db and DEST/mlartifacts/, the copy's artifact locations rewritten to point there. A plain copy "
        "of mlflow.db keeps pointing at the original's artifact folders (MLflow records absolute paths)."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("dest", metavar="DEST", help="the folder to write (new or empty)")
        parser.add_argument(
            "--tracking-uri",
            type=place("--tracking-uri"),
            default=DEFAULT_TRACKING_URI,
            help=f"the store to copy: an sqlite:/// file or a path (default: {DEFAULT_TRACKING_URI})",
        )

    def take_action(self, args) -> int:
        from studies.export import export_store

        args.store_read = args.tracking_uri  # what `main` names if another writer holds it locked
        done = export_store(args.tracking_uri, args.dest)
        print(
            f"Exported {done.experiments} experiment(s), {done.runs} run(s) and {done.folders} artifact folder(s) to "
            f"{args.dest}. Use it from anywhere with {shell_command('--tracking-uri', done.tracking_uri)}"
        )
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
        state = f"Study run: {word}; `{shell_command(prog(), 'resume', study.path)}` finishes it.\n{state}"
    return state


def keep_writes_inside(uri: str, *, refuse: bool = True) -> None:
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
