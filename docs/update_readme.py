"""Regenerates the generated blocks of README.md and the reference pages, so that nothing there is retyped.

  python docs/update_readme.py               # everything; runs studies/quickstart.yaml (about 2 minutes on 2 cores)
  python docs/update_readme.py --pages       # only the reference pages' blocks (seconds; no study runs)
  python docs/update_readme.py --quickstart  # only README.md's quickstart block

The block between the `<!-- quickstart-output -->` markers in README.md is replaced by what `sharpscale run` printed,
from its estimate check and summary on (Ray's and Optuna's start-up lines are left out), with the temporary paths shown as the
defaults a user gets. The reference pages' blocks (`PAGES`) are generated from their sources' own text: the methods
table from `optim.METHODS`, the trial config from the pydantic fields of `trainables.config.TrialConfig` (their
`description`, type, default and bounds), the CLI from `studies.cli.build_parser()`'s help. tests/test_docs.py fails
while any of them is stale.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import re
import subprocess
import sys
import tempfile
import types
import typing
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- quickstart-output -->", "<!-- /quickstart-output -->"
METHODS_BEGIN, METHODS_END = "<!-- methods-table -->", "<!-- /methods-table -->"
CONFIG_BEGIN, CONFIG_END = "<!-- config-reference -->", "<!-- /config-reference -->"
CLI_BEGIN, CLI_END = "<!-- cli-reference -->", "<!-- /cli-reference -->"
# argparse wraps its help to the terminal's width: one fixed width, so the page does not depend on who ran this.
HELP_COLUMNS = 100
# The command `make demo` runs (the Makefile's $(BIN)/sharpscale): the next commands it prints start with it.
DEMO_PROG = ".venv/bin/sharpscale"


def methods_table() -> str:
    """The registry as a Markdown table: name, what it computes, its knobs with their defaults, passes, context."""
    import optim

    rows = ["| name | method | knobs (defaults) | passes per step | needs |", "| --- | --- | --- | --- | --- |"]
    for name, spec in optim.METHODS.items():
        knobs = ", ".join(f"`{k}={v!r}`" for k, v in spec.hparams.items()) or "-"
        # The most a step takes: two on some steps only for LookSAM, on a share of the batch for ESAM; GAM's four.
        passes = str(max(2, math.ceil(spec.small.passes_per_step))) if spec.two_pass else "1"
        needs = ", ".join(f"`{n}`" for n in sorted(spec.needs)) or "-"
        description = spec.description.replace("|", "\\|")
        rows.append(f"| `{name}` | {description} | {knobs} | {passes} | {needs} |")
    return "\n".join(rows)


def _type_name(annotation: Any) -> str:
    """A field's type as a study file writes it: `int | 'auto'`, `'none' | 'basic' | 'strong'`, `list[str]`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else _type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else _type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return getattr(annotation, "__name__", repr(annotation))


def _rule(field: Any) -> str:
    """The bounds pydantic checks (ge/gt/le/lt), also those inside an Annotated member of a union."""
    bounds = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    found = list(field.metadata)
    for arg in typing.get_args(field.annotation):
        if typing.get_origin(arg) is typing.Annotated:
            for meta in typing.get_args(arg)[1:]:
                found.extend(getattr(meta, "metadata", [meta]))
    parts = [f"{sign} {getattr(m, key)}" for m in found for key, sign in bounds.items() if hasattr(m, key)]
    return ", ".join(parts) or "-"


def _default(field: Any) -> str:
    import json

    value = field.default_factory() if field.default_factory is not None else field.default
    return f"`{json.dumps(value)}`"


def config_reference() -> str:
    """Every section of the trial config, one table each: key, type, default, bounds, description."""
    from trainables.config import TrialConfig

    out = []
    for section, field in TrialConfig.model_fields.items():
        model = field.annotation
        out += [f"### `{section}`", "", inspect.cleandoc(model.__doc__ or "").replace("\n", " "), ""]
        out += ["| key | type | default | bounds | meaning |", "| --- | --- | --- | --- | --- |"]
        for key, sub in model.model_fields.items():
            meaning = " ".join((sub.description or "").split()).replace("|", "\\|")
            kind = _type_name(sub.annotation).replace("|", "\\|")
            out.append(f"| `{section}.{key}` | `{kind}` | {_default(sub)} | {_rule(sub)} | {meaning} |")
        out.append("")
    return "\n".join(out).rstrip()


def _subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser) of every command and subcommand, in the order the parser declares them."""
    yield path, parser
    for action in parser._actions:  # argparse keeps its subparsers nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _subcommands(child, (*path, name))


def cli_reference() -> str:
    """`sharpscale --help` and every command's `--help`, as argparse prints them at HELP_COLUMNS."""
    from studies.cli import build_parser

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_COLUMNS)
    try:
        out = []
        for path, parser in _subcommands(build_parser()):
            out += [f"### `{' '.join(('sharpscale', *path))}`", "", "```text", parser.format_help().rstrip(), "```", ""]
        return "\n".join(out).rstrip()
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved


# page (relative to the repository), its markers, the function that writes the block between them
PAGES = (
    ("docs/methods.md", METHODS_BEGIN, METHODS_END, methods_table),
    ("docs/config.md", CONFIG_BEGIN, CONFIG_END, config_reference),
    ("docs/cli.md", CLI_BEGIN, CLI_END, cli_reference),
)
REGENERATE = "python docs/update_readme.py --pages"


def block(page: str, begin: str, end: str) -> str:
    """What `page` holds now between its `begin` and `end` markers."""
    text = (REPO / page).read_text()
    if begin not in text or end not in text:
        raise ValueError(f"{page} has no {begin} ... {end} block")
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def quickstart_output() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
        # The summary wraps to the terminal: the block shows what a 130-column terminal shows (the README says so).
        env["COLUMNS"] = "130"
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "studies.cli",
                "run",
                str(REPO / "studies" / "quickstart.yaml"),
                "--storage",
                str(Path(tmp) / "runs"),
            ],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=1800,
        ).stdout
        # From the run's estimate check on ("estimated X, took Y": every run prints it before its summary).
        starts = [out.find(m) for m in ("sharpscale: estimated ", "sharpscale: took ", "sharpscale: 15 trials")]
        text = out[min((i for i in starts if i >= 0), default=out.rindex("sharpscale: ")) :]
        # As `make demo` shows it, run from the repository's root: paths relative to it, and the next commands
        # as it prints them (it runs .venv/bin/sharpscale; this script ran `python -m studies.cli`).
        text = text.replace(tmp + "/", "").replace(tmp, ".").replace(str(REPO) + "/", "").rstrip()
        return re.sub(r"^  sharpscale ", f"  {DEMO_PROG} ", text, flags=re.MULTILINE)


def _replace(text: str, begin: str, end: str, body: str, where: str) -> str:
    if begin not in text or end not in text:
        sys.exit(f"{where} has no {begin} ... {end} block")
    return re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: f"{begin}\n{body}\n{end}", text, flags=re.DOTALL)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    only = p.add_mutually_exclusive_group()
    only.add_argument("--pages", action="store_true", help="only the reference pages (seconds; no study runs)")
    only.add_argument("--methods", action="store_true", help="the same as --pages (its name before the pages)")
    only.add_argument("--quickstart", action="store_true", help="only the quickstart block (runs the quickstart)")
    args = p.parse_args(argv)
    if not args.quickstart:
        for page, begin, end, make in PAGES:
            path = REPO / page
            path.write_text(_replace(path.read_text(), begin, end, make(), page))
    if not (args.pages or args.methods):
        readme = REPO / "README.md"
        readme.write_text(_replace(readme.read_text(), BEGIN, END, f"```\n{quickstart_output()}\n```", "README.md"))


if __name__ == "__main__":
    main()
