"""Loading a study: its file read, the --set overrides applied, validated completely and expanded."""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from studies.spec._cells import (
    _config_paths,
    _known_path,
    _levels,
    _method_hparams,
    _overlapping,
    _resolve_search_key,
    expand,
)
from studies.spec._schema import SETTABLE_FIELDS, LoadedStudy, Study, StudyError, deep_merge, set_path
from studies.spec._yaml import parse_yaml, read_study_text
from trainables.config import format_validation_error
from trainables.errors import shown


def _number_problems(tree: Any, prefix: str = "") -> list[str]:
    """Non-finite floats and integers beyond 64 bits anywhere in the study (search domains check their own)."""
    problems = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            if not prefix and key == "search":
                continue
            problems += _number_problems(value, f"{prefix}{key}.")
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            problems += _number_problems(value, f"{prefix}{i}.")
    elif isinstance(tree, float) and not math.isfinite(tree):
        problems.append(
            f"{prefix[:-1]}: must be a finite number, got {tree}. Fix: write the finite value meant (YAML reads .inf "
            f"and .nan as infinity and not-a-number)."
        )
    elif isinstance(tree, int) and not isinstance(tree, bool) and not -(2**63) <= tree < 2**63:
        problems.append(
            f"{prefix[:-1]}: at most 64-bit integers are stored and passed on (|value| < 2**63), got {shown(tree)}. "
            f"Fix: a smaller number."
        )
    return problems


def _set_merged(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """A --set of `dotted`: a mapping merges key by key into the one the file gives there (`--set budget={seed: 1}`
    keeps the file's trials_per_cell), as a factor's levels merge into base: a --set names what it changes, and a
    whole map replaced by a partial one would reset its other keys to their defaults without a word. A key is
    cleared by setting it (`budget.asha=null`); model.kwargs is replaced whole, as everywhere (deep_merge)."""
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    current = node.get(parts[-1]) if isinstance(node, dict) else None
    if isinstance(value, dict) and isinstance(current, dict):
        value = deep_merge({parts[-1]: current}, {parts[-1]: value})[parts[-1]]
    set_path(tree, dotted, value)


def _fixed_by_study(spec: Study, key: str) -> str | None:
    """What of the study sets trial path `key` in every cell, so that a --set of it would be silently replaced."""
    owners = _method_hparams()
    for fname, fspec in spec.factors.items():
        for overrides in _levels(fname, fspec).values():
            paths = [_resolve_search_key(p, owners) for p in overrides] if isinstance(overrides, dict) else []
            if any(_overlapping([key, p]) or p == key for p in paths):
                return f"factor {fname!r} (its levels {shown(list(_levels(fname, fspec)))})"
    for skey in spec.search:
        path = _resolve_search_key(skey, owners)
        if path == key or _overlapping([key, path]):
            return f"search key {skey!r}"
    for method, settings in spec.method_settings.items():
        if any(_overlapping([key, str(p)]) or str(p) == key for p in settings):
            return f"method_settings.{method} (in the cells of {method})"
    return None


def load_study(
    path: str | Path, *, smoke: bool = False, overrides: dict[str, Any] | None = None, require_data: bool = True
) -> LoadedStudy:
    """Read and validate a study file completely; a StudyError lists every problem at once.

    overrides: dotted trial-config paths set in `base` (the CLI's `--set data.root=/data`), and dotted study
    settings (`storage`, `budget.time_limit_s`, `checkpoints.keep`, ...: `SETTABLE_FIELDS`), before validation.
    """
    path = Path(path)
    text = read_study_text(path)
    try:
        raw = parse_yaml(text, "study file")
    except ValueError as err:
        raise StudyError(path, str(err).split("\n")) from None
    if not isinstance(raw, dict):
        raise StudyError(path, [_not_a_mapping(raw)])
    bad = []
    for key, value in (overrides or {}).items():
        root = key.split(".", 1)[0]
        if root in SETTABLE_FIELDS:
            try:
                _set_merged(raw, key, value)
            except ValueError:
                bad.append(f"--set {key}: {root!r} takes a value, not fields. Fix: --set {root}=VALUE.")
        elif root in Study.model_fields:
            bad.append(
                f"--set {key}: `{root}` defines the study and is not set from the command line. Fix: edit the file, "
                f"or set a trial config path (data.root, optimizer.lr) or a setting ({', '.join(SETTABLE_FIELDS)})."
            )
        elif not _known_path(key):
            # The field's own name under another section first (train.epochs -> schedule.epochs), then a typo.
            leaf = key.rsplit(".", 1)[-1]
            close = [p for p in _config_paths() if p.rsplit(".", 1)[-1] == leaf][:1]
            close = close or difflib.get_close_matches(key, _config_paths(), n=1, cutoff=0.6)
            hint = f"Did you mean {close[0]}? " if close else ""
            bad.append(
                f"--set {key}: neither a trial config path nor a study setting. {hint}Fix: use a path such as "
                f"data.root or optimizer.lr, or one of {', '.join(SETTABLE_FIELDS)} (e.g. storage=/mnt/shared/runs)."
            )
        elif isinstance(base := raw.setdefault("base", {}), dict):
            try:
                _set_merged(base, key, value)
            except ValueError:
                bad.append(f"--set {key}: the file sets a value above it in base, not a section. Fix: set that value.")
    bad += _number_problems(raw)
    spec, schema_problems = _validated(raw)
    bad += schema_problems
    if spec is None:
        raise StudyError(path, bad)
    for key in overrides or {}:
        if key.split(".", 1)[0] not in Study.model_fields and (owner := _fixed_by_study(spec, key)):
            bad.append(
                f"--set {key}: every cell takes this value from the study's {owner}, which would silently replace "
                f"the --set. Fix: change the factor levels or the search space in the file, or drop the --set."
            )
    cells, problems = expand(spec, smoke=smoke, require_data=require_data)
    if bad or problems:
        raise StudyError(path, bad + problems)
    return LoadedStudy(
        spec=spec, path=path.resolve(), text=text, cells=tuple(cells), smoke=smoke, overrides=dict(overrides or {})
    )


def _not_a_mapping(raw: Any) -> str:
    """The top level of a file that holds no study fields: empty, or one value or list instead of a mapping."""
    examples = Path(__file__).resolve().parents[1]  # the shipped studies live beside studies/spec
    minimal = "`name: my-study` and `base: {data: {name: digits}}` on two lines"
    where = (
        f"Fix: write at least {minimal}; complete examples: {examples}/*.yaml (e.g. {examples / 'quickstart.yaml'})."
    )
    if raw is None:
        return f"study file: is empty (nothing but blanks or comments), and a study needs at least a name. {where}"
    kind = {list: "a list", str: "a line of text"}.get(type(raw), f"the single value {shown(raw)}")
    return f"top level: must be a mapping of study fields (name:, base:, factors:, ...), got {kind}. {where}"


def parse_overrides(items: list[str], where: str | Path) -> dict[str, Any]:
    """The CLI's `--set KEY=VALUE` items as {dotted key: value}, each value read as YAML (safely, bounded)."""
    out: dict[str, Any] = {}
    problems = []
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(
                f"--set {shown(item)}: must be KEY=VALUE with KEY a dotted config path or study setting. "
                f"Fix: e.g. --set data.root=/data/cifar10 or --set storage=/mnt/shared/sharpscale_runs"
            )
            continue
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", key):
            problems.append(
                f"--set {shown(key)}: KEY must be a dotted path of names (data.root). Fix: check its spelling."
            )
            continue
        if not value.strip():
            problems.append(
                f"--set {key}=: the value is empty, which would silently mean the default (or null). Fix: give a "
                f"value (--set {key}=VALUE), or drop the --set to keep the file's."
            )
            continue
        try:
            out[key] = parse_yaml(value, f"--set {key}")
        except ValueError as err:
            problems.append(f"{err} (the value {shown(value)} is read as YAML; quote a string that is not: 'text')")
    if problems:
        raise StudyError(where, problems)
    return out


# Study fields the cells do not depend on: one of them refused, the cells are still expanded (with its default) so
# that their problems are listed with its own, not one fix at a time. The rest (base, factors, search, smoke) shape
# the cells, which could then report what is no problem of the file.
_BESIDE_CELLS = {
    "name",
    "description",
    "objective",
    "budget",
    "resources",
    "tracking",
    "storage",
    "shared_mounts",
    "optuna_storage",
    "checkpoints",
    "confirm",
    "smoke_form",
}


def _validated(raw: dict[str, Any]) -> tuple[Study | None, list[str]]:
    """The study as validated, and its problems; the study is None when the cells cannot be expanded reliably."""
    collected: list[str] = []
    try:
        return Study.model_validate(raw, context={"problems": collected}), collected
    except ValidationError as err:
        problems = _study_errors(err)
        failed = {e["loc"][0] for e in err.errors() if e["loc"]}
    if not failed or not failed <= _BESIDE_CELLS:
        return None, problems
    rest = {k: v for k, v in raw.items() if k not in failed} | ({"name": "study"} if "name" in failed else {})
    try:
        spec = Study.model_validate(rest, context={"problems": collected})
    except ValidationError:
        return None, problems
    return spec, problems + collected


def _study_errors(err: ValidationError) -> list[str]:
    lines = []
    for line in format_validation_error(err):
        lines.extend(line.split("\n"))  # the cross-field validator joins several problems
    return lines
