"""What every `sharpscale` command shares: the Command class the parser is built from, the exit statuses, the
option groups several commands take, and the helpers that read them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from trainables.errors import UserError
from trainables.naming import DEFAULT_TRACKING_URI

# The exit statuses every command keeps: 0 done, EXIT_ERRORS when trials errored, no trial ran an epoch (the study
# is FAILED) or a command failed,
# EXIT_USAGE for a user mistake (listed, no traceback), EXIT_INTERRUPTED after Ctrl-C (128 + SIGINT, as shells do).
EXIT_ERRORS = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class Command:
    """One `sharpscale` command: its name and texts, the shared option groups it takes, its own arguments and its
    action. `studies.cli.build_parser` walks the command classes; a command with `subcommands` is a group whose
    every subcommand is a Command too (`data fetch`)."""

    name: ClassVar[str]
    help: ClassVar[str | None] = None
    description: ClassVar[str | None] = None
    epilog: ClassVar[str | None] = None
    # The option groups it shares with other commands, as argparse parents, in the order --help lists them.
    options: ClassVar[tuple[Callable[[], argparse.ArgumentParser], ...]] = ()
    subcommands: ClassVar[tuple[type[Command], ...]] = ()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The command's own arguments, after those of its option groups."""

    def take_action(self, args: argparse.Namespace) -> int:
        """Do the command; its exit status. A user's mistake raises UserError, which `main` turns into EXIT_USAGE."""
        raise NotImplementedError(f"{type(self).__name__} is a group of commands")

    def add_to(self, sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
        """Its parser under `sub`, with its subcommands' beneath it; a leaf's parse binds it as `args.handler`."""
        # A help of None would still list the command under its group's --help, so only a given one is passed.
        listed = {"help": self.help} if self.help is not None else {}
        parser = sub.add_parser(
            self.name,
            parents=[group() for group in self.options],
            description=self.description,
            epilog=self.epilog,
            **listed,
        )
        self.add_arguments(parser)
        if self.subcommands:
            nested = parser.add_subparsers(dest=f"{self.name}_command", required=True)
            for command in self.subcommands:
                command().add_to(nested)
        else:
            parser.set_defaults(handler=self)
        return parser


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of CPUs, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (the local Ray cluster's CPUs), got {value}")
    return value


def place(flag: str):
    """An argparse type for a flag naming a path or URI: refused when empty or holding a shell variable."""

    def check(text: str) -> str:
        from studies.spec import location_problem

        if problem := location_problem(flag, text):
            raise argparse.ArgumentTypeError(problem.split(": ", 1)[1])
        return text

    return check


def study_options() -> argparse.ArgumentParser:
    """Options shared by every command that reads a study file."""
    from studies.spec import SETTABLE_FIELDS

    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help="override a trial config path for every cell (--set data.root=/data/cifar10) or a study setting "
        f"({', '.join(SETTABLE_FIELDS)}; e.g. --set checkpoints.keep=3); repeatable. A mapping merges key by key "
        "into the file's (--set budget={seed: 1} keeps its other budget keys; model.kwargs is replaced whole), so "
        "a --set changes only what it names; clear a key with KEY=null",
    )
    parent.add_argument(
        "--storage",
        type=place("--storage"),
        default=None,
        metavar="PATH_OR_URI",
        help="Ray's results and checkpoints (and, by default, Optuna's database beside them) for this run, instead of "
        "the study's `storage:`; same as --set storage=...: a directory, or s3:// / gs:// (docs/cluster.md)",
    )
    parent.add_argument(
        "--smoke", action="store_true", help="the study's --smoke form: tiny, on the embedded digits, on CPU"
    )
    return parent


def tracking_option() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--tracking-uri",
        type=place("--tracking-uri"),
        default=None,
        help=f"MLflow tracking URI (default: the study's tracking.uri, {DEFAULT_TRACKING_URI}); sqlite:///, http(s):// "
        "or a database URL",
    )
    return parent


def cluster_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--address", default=None, help="existing Ray cluster ('auto' on a cluster node); default: start a local one"
    )
    parent.add_argument(
        "--num-cpus", type=positive_int, default=None, help="CPUs of the local Ray cluster (default: all)"
    )
    return parent


def overrides(args) -> dict:
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


def read_uri(args, spec=None) -> str:
    """The tracking URI a read-only command reads: checked, absolute, and never created. Kept on `args` as the store
    the command reads, which `main` names when another writer holds it locked."""
    from trainables.tracking import check_tracking_uri, resolve_tracking_uri

    given = args.tracking_uri if spec is None else args.tracking_uri or spec.tracking.uri
    args.store_read = check_tracking_uri(resolve_tracking_uri(given))
    return args.store_read


def prog() -> str:
    """How the user invoked us (`.venv/bin/sharpscale`), so a printed command works when pasted."""
    exe = Path(sys.argv[0])
    if exe.name != "sharpscale":
        return "sharpscale"
    try:
        return str(exe.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(exe)
