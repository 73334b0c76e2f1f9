"""The `sharpscale` command: run, validate and inspect studies, open the MLflow UI. Each command is one class in
this package (studies.cli.base.Command); `build_parser` walks them and `main` runs the one parsed."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from studies.cli.base import EXIT_ERRORS, EXIT_INTERRUPTED, EXIT_USAGE, Command
from studies.cli.data import Data
from studies.cli.results import Export, Report, Status
from studies.cli.servers import UI, Dashboard, Server
from studies.cli.study import Calibrate, Resume, Run, Validate, incomplete
from trainables.errors import UserError

__all__ = ["COMMANDS", "EXIT_ERRORS", "EXIT_INTERRUPTED", "EXIT_USAGE", "Command", "build_parser", "main"]

# In the order `sharpscale --help` lists them (and docs/cli.md, generated from the parser, documents them).
COMMANDS: tuple[type[Command], ...] = (
    Run,
    Resume,
    Status,
    Validate,
    Report,
    Server,
    Calibrate,
    Data,
    Export,
    Dashboard,
    UI,
)


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
    if not _runs_a_study(args) or getattr(args, "address", None) or "ray" in sys.modules:
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


def _runs_a_study(args) -> bool:
    """`run` or `resume` that runs trials (not a dry run)."""
    return isinstance(getattr(args, "handler", None), Run) and not getattr(args, "dry_run", False)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sharpscale",
        description="Hyperparameter and data-scaling studies of sharpness-aware training on Ray Tune + Optuna, "
        "recorded in MLflow.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command().add_to(sub)
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
            return args.handler.take_action(args)
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
        if _runs_a_study(args):
            print(f"\n{incomplete(args, 'before it ended')}", file=sys.stderr)
        else:
            print("\nsharpscale: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:
        from studies.launch import store_is_locked, store_locked

        store = getattr(args, "store_read", None)  # set by read_uri: the store a read-only command reads
        if store is None or not store_is_locked(err):
            raise
        # Another writer holds it past SQLite's and MLflow's waits: the one line `run` gives, not a traceback.
        print(
            f"sharpscale: error: {store_locked(store, err, outcome=f'`{args.command}` stopped there')}", file=sys.stderr
        )
        return EXIT_ERRORS
