"""Expansion of a study into cells: every combination of factor levels, its config and its search space."""

from __future__ import annotations

import copy
import itertools
import json
import math
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import optim
from studies.spec._schema import (
    DEFAULT_TRIALS_PER_CELL,
    MAX_TRIALS,
    Budget,
    Cell,
    Choice,
    Confirm,
    Domain,
    Study,
    _repeated,
    deep_merge,
    location_problem,
    set_path,
)
from studies.spec._smoke import _epochs, _positive_int, _smoke_levels, _smoke_tree, smoke_set_note
from trainables.config import FILE_LOADING_KWARGS, ConfigError, TrialConfig
from trainables.data.staging import is_uri
from trainables.errors import shown
from trainables.families import kwargs_problem
from trainables.naming import cell_name


# Method knobs may be searched by their bare name; each applies only to the cells whose method takes it.
def _method_hparams() -> dict[str, set[str]]:
    from optim import METHODS

    owners: dict[str, set[str]] = {}
    for name, spec in METHODS.items():
        for hp in spec.hparams:
            owners.setdefault(hp, set()).add(name)
    return owners


SEARCH_SHORTHANDS = "bare names of method hparams (rho, alpha, lam, k, ...) mean optimizer.hparams.<name>"


def _overrides_to_tree(overrides: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in overrides.items():
        set_path(tree, key, value)
    return tree


def _overlapping(paths: list[str]) -> tuple[str, str] | None:
    """Two dotted paths of which one lies inside the other (`model` and `model.name`), else None."""
    for a in paths:
        for b in paths:
            if b.startswith(a + "."):
                return a, b
    return None


def _levels(name: str, spec: dict[str, dict[str, Any]] | list[Any]) -> dict[str, dict[str, Any]]:
    if isinstance(spec, list):  # `data.fraction: [0.1, 0.5]` — the factor is a config path, levels its values
        return {str(v): {name: v} for v in spec}
    return spec


def _unsafe_name_problem(field: str, what: str, name: str) -> str | None:
    # Factor and level names go into MLflow tags, params, filters and run names, Optuna study names and the
    # terminal: an emoji or other non-ASCII name left a cell run RUNNING forever (issue 24), so only printable ASCII.
    if name.isascii() and name.isprintable():
        return None
    ascii_name = re.sub(r"[^ -~]+", "_", name).strip("_") or what
    return (
        f"{field}: a {what} name must be printable ASCII (it is written into MLflow filters, tags and run names, "
        f"Optuna study names and the terminal), got {shown(name)}. Fix: rename it, e.g. {shown(ascii_name)}."
    )


def _factor_problems(spec: Study) -> list[str]:
    """Factors that would silently run fewer cells than written, or set one path twice."""
    problems = []
    for fname, fspec in spec.factors.items():
        if not fspec:
            problems.append(
                f"factors.{fname}: a factor needs at least one level (with none the study has no cell), got "
                f"{shown(fspec)}. Fix: list its levels, or remove the factor."
            )
        elif isinstance(fspec, list) and (dup := _repeated(fspec)) is not None:
            problems.append(
                f"factors.{fname}: levels must be distinct (one cell each), got {shown(dup)} more than once in "
                f"{shown(fspec)}. Fix: list each level once."
            )
        if problem := _unsafe_name_problem(f"factors.{shown(fname)}", "factor", fname):
            problems.append(problem)
        for level, overrides in _levels(fname, fspec).items():
            if problem := _unsafe_name_problem(f"factors.{fname}.{shown(level)}", "level", level):
                problems.append(problem)
            if "'" in fname + level and '"' in fname + level:
                problems.append(
                    f"factors.{fname}.{shown(level)}: a factor or level name may hold ' or \" but not both (it is "
                    f"searched for in MLflow, whose filters cannot quote both). Fix: rename it."
                )
            if isinstance(overrides, dict) and (pair := _overlapping(list(overrides))):
                problems.append(
                    f"factors.{fname}.{level}: sets both {pair[0]} and {pair[1]}, one inside the other, so one would "
                    f"silently replace the other. Fix: set {pair[1]} alone, or write it inside {pair[0]}."
                )
    problems += _factors_sharing_paths(spec)
    return problems


def _factors_sharing_paths(spec: Study) -> list[str]:
    """Two factors that set one path (or one inside the other): in every cell the later factor's value would
    replace the earlier's, so the earlier factor's cells would run the same thing under different names."""
    owners = _method_hparams()
    paths: dict[str, set[str]] = {}
    for fname, fspec in spec.factors.items():
        for overrides in _levels(fname, fspec).values():
            if isinstance(overrides, dict):
                paths.setdefault(fname, set()).update(_resolve_search_key(str(p), owners) for p in overrides)
    problems = []
    names = list(paths)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            shared = sorted(
                a if a == b or b.startswith(a + ".") else b
                for a in paths[first]
                for b in paths[second]
                if a == b or _overlapping([a, b])
            )
            if shared:
                problems.append(
                    f"factors.{first} and factors.{second}: both set {', '.join(dict.fromkeys(shared))}; in each cell "
                    f"{second}'s value would silently replace {first}'s, so {first}'s levels would run the same "
                    f"configuration under different names. Fix: make them one factor (one level per combination), "
                    f"or let each factor set its own paths."
                )
    return problems


def _resolve_search_key(key: str, owners: dict[str, set[str]]) -> str:
    return f"optimizer.hparams.{key}" if _is_knob(key, owners) else key


def _is_knob(key: str, owners: dict[str, set[str]]) -> bool:
    """A bare method knob (`rho`): in a search or a level it means optimizer.hparams.<key>, where the method takes it."""
    return "." not in key and key in owners


def _domain_probes(dom: Domain) -> list[Any]:
    if isinstance(dom, Choice):
        return list(dom.values)
    return [dom.low, dom.high]


def _config_paths(model: Any = None, prefix: str = "") -> list[str]:
    """Every dotted field path of the trial config (sections and leaves), for did-you-mean hints."""
    model = TrialConfig if model is None else model
    paths = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        paths.append(path)
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            paths.extend(_config_paths(info.annotation, f"{path}."))
    return paths


def _known_path(path: str) -> bool:
    import typing

    node: Any = TrialConfig
    for part in path.split("."):
        fields = getattr(node, "model_fields", None)
        if fields is None:
            # Inside a free-form dict (model.kwargs, optimizer.hparams) any key goes; below a plain value none does.
            return node is dict or typing.get_origin(node) is dict
        if part not in fields:
            return False
        node = fields[part].annotation
    return True


def expand(spec: Study, *, smoke: bool = False, require_data: bool = True) -> tuple[list[Cell], list[str]]:
    """Cells of the study, each validated with its search bounds substituted; returns (cells, problems)."""
    owners = _method_hparams()
    problems = _factor_problems(spec) + _path_problems(spec, owners) + _method_settings_problems(spec, owners)
    if problems:
        return [], problems
    factor_levels, problems = _planned_levels(spec, smoke)
    if problems:
        return [], problems
    merged = _merged_trees(spec, factor_levels, owners, problems)
    problems += _shared_keys(merged)  # said with the cells' own problems, all at once
    cells: list[Cell] = []
    missing_roots: dict[str, list[str]] = {}
    geometry_cells: dict[str, list[str]] = {}  # a problem of base.geometry (or model.kwargs) said once, not per cell
    # The smoke form's reference; an epochs value that is no positive integer is the cell's validation's to report.
    shortest = min((e for _, tree in merged if _positive_int(e := _epochs(tree))), default=None)
    for levels, tree in merged:
        key = _cell_key(levels)
        for problem in _trial_location_problems(tree):  # the file's own paths, which --smoke replaces
            missing_roots.setdefault(problem, []).append(cell_name(levels))
        if smoke:
            # The file's own cell first: --smoke replaces its data and model, which must still be valid (a smoke
            # run that passed an invalid section would leave the real run to fail on it).
            try:
                TrialConfig.load(tree)
            except ConfigError as err:
                problems.extend(f"{f'cell {cell_name(levels)}' if key else 'the study'}: {p}" for p in err.problems)
                continue
            tree = _smoke_tree(tree, spec.smoke, shortest)  # --smoke wins over every level
        elif require_data and (problem := _missing_root(tree)):
            missing_roots.setdefault(problem, []).append(cell_name(levels))
        before = len(problems)
        cell = _cell(spec, key, levels, tree, owners, smoke, problems, geometry_cells)
        if smoke:
            problems[before:] = [smoke_set_note(p, tree, spec.smoke) for p in problems[before:]]
        if cell is not None:
            cells.append(cell)
    if not smoke:  # the smoke form replaces data and model, so cells apart only there are one under it
        problems += _identical_cells(cells)
    for problem, where in [*missing_roots.items(), *geometry_cells.items()]:
        listed = "; ".join(where[:4]) + (f"; and {len(where) - 4} more" if len(where) > 4 else "")
        problems.append(f"{problem} (cells: {listed})")
    problems += _study_wide_problems(spec, cells, owners, smoke)
    return cells, _dedupe(problems)


def _cell_key(levels: dict[str, str]) -> str:
    return ",".join(f"{f}={lv}" for f, lv in levels.items())


def _shared_keys(merged: list[tuple[dict[str, str], dict[str, Any]]]) -> list[str]:
    """Combinations of levels whose names join into one cell key (names holding `,` or `=`): the runner keys
    cells, MLflow runs and Optuna studies by it, so one cell would silently stand for both."""
    first: dict[str, dict[str, str]] = {}
    problems = []
    for levels, _ in merged:
        key = _cell_key(levels)
        if key in first:
            problems.append(
                f"factors: cell keys must be distinct (they name each cell's runs and Optuna study), and the levels "
                f"{shown(first[key])} and {shown(levels)} both give the key {shown(key)}. Fix: rename the factors "
                f"or levels so that none holds ',' or '='."
            )
        else:
            first[key] = levels
    return problems


def _identical_cells(cells: list[Cell]) -> list[str]:
    """Cells whose validated configs and search spaces are equal (`data.fraction: [1, 1.0]`): they would run the
    same thing twice, and the analysis would compare them as if they differed."""
    seen: dict[str, Cell] = {}
    problems = []
    for cell in cells:
        config = TrialConfig.load(cell.config).model_dump(mode="json")
        space = {path: dom.model_dump(mode="json") for path, dom in cell.space.items()}
        resolved = json.dumps([config, space], sort_keys=True, default=str)
        if (other := seen.get(resolved)) is not None:
            problems.append(
                f"factors: cells must differ in their resolved config, and cells {other.key} and {cell.key} resolve to "
                f"the same config and search (e.g. levels 1 and 1.0 of one number). Fix: drop one of the levels."
            )
        else:
            seen[resolved] = cell
    return problems


def _path_problems(spec: Study, owners: dict[str, set[str]]) -> list[str]:
    """Search keys and level paths that name no trial config path nor method knob."""
    problems: list[str] = []
    for key in spec.search:
        if "." in key and not _known_path(key):
            problems.append(
                f"search.{key}: not a trial config path. Fix: use a path such as optimizer.lr, or {SEARCH_SHORTHANDS}."
            )
        elif "." not in key and key not in owners:
            problems.append(
                f"search.{key}: not a method hparam ({sorted(owners)}) nor a dotted config path. "
                f"Fix: use e.g. optimizer.lr, or one of those names."
            )
    for fname, fspec in spec.factors.items():
        for level, overrides in _levels(fname, fspec).items():
            if not isinstance(overrides, dict):
                problems.append(
                    f"factors.{fname}.{level}: a level must map config paths to values, got {shown(overrides)}. "
                    f"Fix: write it as `{level}: {{optimizer.method: sam}}`, or give the factor a list of values."
                )
                continue
            for path in overrides:
                if not _known_path(path) and not _is_knob(path, owners):
                    problems.append(
                        f"factors.{fname}.{level}.{path}: not a trial config path nor a method knob ({SEARCH_SHORTHANDS}). "
                        f"Fix: check its spelling."
                    )
            problems += _searched_by_level(spec, f"factors.{fname}.{level}", overrides, owners)
    return problems


def _own_update_hint(problem: str, method: Any) -> str:
    """A problem of a method whose update is its own (optim.check_base's: a base-optimizer setting it refuses),
    with where a study sets that for its cells alone: levels shared with the other methods cannot."""
    from optim import METHODS

    spec = METHODS.get(method) if isinstance(method, str) else None
    knobs = () if spec is None or spec.own_update is None else (*spec.own_update.requires, *spec.own_update.ignores)
    if not any(f"{knob} must" in problem for knob in knobs):  # check_base's alone, not a schedule's or a scope's
        return problem
    # What it requires, and the base optimizer it ignores at the trial config's default (optim's own_update).
    wanted = {f"optimizer.{knob}": value for knob, value in spec.own_update.requires.items()}
    if "base" in spec.own_update.ignores:
        wanted = {"optimizer.base": TrialConfig().optimizer.base, **wanted}
    written = ", ".join(f"{k}: {v}" for k, v in wanted.items())
    return (
        f"{problem}. In a study whose levels set the base optimizer for the other methods: method_settings: "
        f"{{{method}: {{{written}}}}} sets it in {method}'s cells alone"
    )


def _method_settings_problems(spec: Study, owners: dict[str, set[str]]) -> list[str]:
    """``method_settings``: each key a registered method, each path a trial config path that does not choose the
    method itself nor what the search samples."""
    from optim import METHODS

    problems: list[str] = []
    for method, settings in spec.method_settings.items():
        where = f"method_settings.{method if method in METHODS else shown(method)}"
        if method not in METHODS:
            problems.append(
                f"{where}: not a registered method. Fix: use one of {sorted(METHODS)} (optim.METHODS), or remove it."
            )
            continue
        for path in settings:
            if str(path) == "optimizer" or str(path).startswith("optimizer.method"):
                problems.append(
                    f"{where}.{path}: method_settings apply to the cells whose method is {method}, so they may not "
                    f"choose the method. Fix: name the method in a factor's level, and drop {path} here."
                )
            elif _is_knob(str(path), owners):
                problems.append(
                    f"{where}.{path}: a bare knob name is not taken here. Fix: write optimizer.hparams.{path}."
                )
            elif not _known_path(str(path)):
                problems.append(f"{where}.{path}: not a trial config path. Fix: check its spelling (docs/config.md).")
        problems += _searched_by_level(spec, where, settings, owners)
    return problems


def _leaves(prefix: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(f"{prefix}.{k}", v)]
    return [(prefix, value)]


def _searched_by_level(spec: Study, where: str, overrides: dict[str, Any], owners: dict[str, set[str]]) -> list[str]:
    """Paths a level sets that the search also sets: in every trial the sampled value replaces the level's, so
    the level's value is never run (a bare knob of each means optimizer.hparams.<knob>)."""
    searched = {_resolve_search_key(k, owners): k for k in spec.search}
    problems = []
    for path, value in overrides.items():
        for leaf, leaf_value in _leaves(_resolve_search_key(str(path), owners), value):
            for target, skey in searched.items():
                if leaf == target or target.startswith(leaf + ".") or leaf.startswith(target + "."):
                    problems.append(
                        f"{where}.{path}: a level may not set what the search samples, and it sets {leaf} "
                        f"({shown(leaf_value)}) while search.{skey} samples {target}, so the search would silently "
                        f"replace the level's value. Fix: drop it from the level, or drop search.{skey}."
                    )
    return problems


def _planned_levels(spec: Study, smoke: bool) -> tuple[list[tuple[str, dict[str, dict[str, Any]]]], list[str]]:
    """The factors' levels the cells combine (those --smoke keeps, under it), or the problems that stop it."""
    factor_levels = [(f, _levels(f, s)) for f, s in spec.factors.items()]
    if (cells_planned := math.prod(len(levels) for _, levels in factor_levels)) > MAX_TRIALS:
        return [], [
            (
                f"factors: their levels combine into {cells_planned} cells, more than the {MAX_TRIALS} trials a study may "
                f"plan. Fix: fewer levels, or split the study."
            )
        ]
    if smoke:
        factor_levels, smoke_problems = _smoke_levels(spec, factor_levels)
        if smoke_problems:
            return [], smoke_problems
    return factor_levels, []


def _merged_trees(
    spec: Study,
    factor_levels: list[tuple[str, dict[str, dict[str, Any]]]],
    owners: dict[str, set[str]],
    problems: list[str],
) -> list[tuple[dict[str, str], dict[str, Any]]]:
    """Each combination of levels as (levels, the base with its levels' overrides merged in)."""
    combos = itertools.product(*[list(levels.items()) for _, levels in factor_levels]) if factor_levels else [()]
    merged: list[tuple[dict[str, str], dict[str, Any]]] = []
    for combo in combos:
        levels = {factor_levels[i][0]: name for i, (name, _) in enumerate(combo)}
        tree = copy.deepcopy(spec.base)
        knobs: dict[str, Any] = {}
        try:
            for _, overrides in combo:
                paths = {k: v for k, v in overrides.items() if not _is_knob(k, owners)}
                knobs.update({k: v for k, v in overrides.items() if _is_knob(k, owners)})
                tree = deep_merge(tree, _overrides_to_tree(paths))
            # A bare knob of a level (`rho: 0.1` on an architecture) reaches only the cells whose method takes it.
            method = _method_of(tree)
            for knob, value in knobs.items():
                if method in owners[knob]:
                    set_path(tree, f"optimizer.hparams.{knob}", value)
            # The method's own settings over every level's (method_settings; none of them names the method).
            if isinstance(method, str) and method in spec.method_settings:
                tree = deep_merge(tree, _overrides_to_tree(spec.method_settings[method]))
        except ValueError as err:
            problems.append(f"factors: {err}. Fix: set a value there, or set the section as a whole.")
            continue
        merged.append((levels, tree))
    return merged


def _method_of(tree: dict[str, Any]) -> Any:
    """The method a cell's tree names; a section that is no mapping is the cell's validation's to report."""
    section = tree.get("optimizer")
    return section.get("method", TrialConfig().optimizer.method) if isinstance(section, dict) else None


def _cell(
    spec: Study,
    key: str,
    levels: dict[str, str],
    tree: dict[str, Any],
    owners: dict[str, set[str]],
    smoke: bool,
    problems: list[str],
    geometry_cells: dict[str, list[str]],
) -> Cell | None:
    """One cell: its config validated at every search bound, and its trials; None when its config is invalid."""
    label = f"cell {cell_name(levels)}" if key else "the study"  # the one name status and the trial runs use
    if spec.confirm is not None:
        problems.extend(_confirm_problems(spec.confirm, tree, label))
        # The search scores on the selection half; the confirm runs on the other (studies.confirm).
        tree = deep_merge(tree, {"data": {"eval_split": "selection"}})
    method = _method_of(tree)
    space: dict[str, Domain] = {}
    for skey, dom in spec.search.items():
        path = _resolve_search_key(skey, owners)
        if path.startswith("optimizer.hparams.") and method not in owners.get(path.rsplit(".", 1)[1], set()):
            continue  # conditional: rho only where the method has a rho
        space[path] = dom
    try:
        config = TrialConfig.load(tree)
        if problem := _shared_batch_problem(config, spec.resources.workers_per_trial):
            problems.append(f"{label}: {problem}")
        for problem in _geometry_problems(config):  # said once, with the cells it is in
            geometry_cells.setdefault(problem, []).append(key or "all")
        # A key timm would refuse at the build (studies.preflight, with torch), caught here without it.
        ours = {k: v for k, v in config.model.kwargs.items() if k not in FILE_LOADING_KWARGS}  # their own rule's
        if problem := kwargs_problem(config.model.name, ours):
            geometry_cells.setdefault(problem, []).append(key or "all")
        for path, dom in space.items():
            for probe in _domain_probes(dom):
                probe_tree = copy.deepcopy(tree)
                try:
                    set_path(probe_tree, path, probe)
                    TrialConfig.load(probe_tree)
                except ConfigError as err:
                    problems.extend(f"search.{path} = {shown(probe)} in {label}: {p.strip()}" for p in err.problems)
                except ValueError as err:
                    problems.append(f"search.{path} in {label}: {err}. Fix: search a value, not inside one.")
    except ConfigError as err:
        problems.extend(f"{label}: {_own_update_hint(p, method)}" for p in err.problems)
        return None
    trials, problem = _cell_trials(spec.budget, space, label)
    if problem:
        problems.append(problem)
    if smoke:
        trials = min(trials, spec.smoke_form.trials_per_cell) if space else 1
    confirm = 0
    if spec.confirm is not None:
        confirm = min(spec.confirm.seeds, spec.smoke_form.confirm_seeds) if smoke else spec.confirm.seeds
        trials = trials if space else 0  # nothing to choose: the confirm seeds are the cell's trials
    return Cell(key=key, levels=levels, config=tree, space=space, trials=trials, confirm=confirm)


def _study_wide_problems(spec: Study, cells: list[Cell], owners: dict[str, set[str]], smoke: bool) -> list[str]:
    """The trials planned in all, and level knobs or search keys that reach no cell."""
    problems: list[str] = []
    total = sum(c.planned for c in cells)
    if total > MAX_TRIALS:
        sizes = sorted(((c.planned, c.key or "all") for c in cells), reverse=True)[:2]
        problems.append(
            f"budget: the study plans {total} trials, more than {MAX_TRIALS} (largest cells: "
            f"{', '.join(f'{k} with {n}' for n, k in sizes)}; a grid over an int range has one trial per value). "
            f"Fix: narrow the ranges, use a choice of values, or sampler tpe with trials_per_cell."
        )
    # A knob of a level, or a search parameter, that applies to no cell is almost always a typo or a forgotten factor.
    for fname, fspec in spec.factors.items():
        for level, overrides in _levels(fname, fspec).items():
            for knob in (k for k in overrides if _is_knob(k, owners)) if isinstance(overrides, dict) else ():
                reached = any(
                    c.levels.get(fname) == level and knob in c.config.get("optimizer", {}).get("hparams", {})
                    for c in cells
                )
                if cells and not smoke and not reached:
                    problems.append(
                        f"factors.{fname}.{level}.{knob}: applies to no cell (no method of the cells with this level takes "
                        f"it: {sorted(owners[knob])} do). Fix: add such a method to the factors, or remove it."
                    )
    ran = {_method_of(c.config) for c in cells}
    for method in spec.method_settings:
        if cells and not smoke and method not in ran:
            problems.append(
                f"method_settings.{method}: applies to no cell (no cell's method is {method}). "
                f"Fix: add a level with optimizer.method: {method} to the factors, or remove it."
            )
    used = {p for c in cells for p in c.space}
    for skey in spec.search:
        if cells and _resolve_search_key(skey, owners) not in used:
            problems.append(
                f"search.{skey}: applies to no cell (no cell's method takes it). "
                f"Fix: add a method that takes it to the factors, or remove it."
            )
    return problems


def _shared_batch_problem(cfg: TrialConfig, workers: int) -> str | None:
    """A method form whose ranks each compute one part of a step (optim.SharedBatch: SAMPa's parallel=True) on a
    worker count it cannot run on: said before Ray starts, where the trial would fail at its first step."""
    spec = optim.METHODS[cfg.optimizer.method]
    if not spec.shares_batch(cfg.optimizer.hparams) or workers == spec.shared_batch.ranks:
        return None
    ranks, knob = spec.shared_batch.ranks, spec.shared_batch.knob
    return (
        f"optimizer.hparams.{knob}: {spec.name}'s {knob}=True form takes its step's parts on {ranks} data-parallel "
        f"workers, one part each, so it needs resources.workers_per_trial = {ranks}, got {workers}. "
        f"Fix: set resources.workers_per_trial: {ranks}, or {knob}: false."
    )


def _confirm_problems(confirm: Confirm, tree: dict[str, Any], label: str) -> list[str]:
    """What of a cell's config a confirm stage cannot take: a seed of its own range, an evaluation split set by hand."""
    problems = []
    train = tree.get("train")
    seed = train.get("seed", TrialConfig().train.seed) if isinstance(train, dict) else TrialConfig().train.seed
    if seed in confirm.seed_list:
        problems.append(
            f"confirm.seed_start: the confirm seeds {confirm.seed_start}..{confirm.seed_start + confirm.seeds - 1} must "
            f"be fresh, and {label} searches with train.seed {seed}. Fix: move seed_start past the search seeds."
        )
    data = tree.get("data")
    if isinstance(data, dict) and data.get("eval_split") is not None:
        problems.append(
            f"{label}: data.eval_split is set ({shown(data['eval_split'])}), and a confirm stage sets it itself (the "
            f"search on the 'selection' half, the confirm runs on the 'test' half). Fix: drop data.eval_split."
        )
    return problems


def _geometry_problems(cfg: TrialConfig) -> list[str]:
    """The geometry section's measure names and hvp_mode, checked against analysis' registry (trainables cannot)."""
    if not cfg.geometry.enabled:
        return []
    from analysis.geometry.names import geometry_problems

    return geometry_problems(cfg.geometry)


def grid_size(space: dict[str, Domain]) -> int:
    size = 1
    for dom in space.values():
        size *= len(dom.values) if isinstance(dom, Choice) else dom.high - dom.low + 1
    return size


def _cell_trials(budget: Budget, space: dict[str, Domain], label: str) -> tuple[int, str | None]:
    if not space:
        return budget.repeats_without_search, None
    if budget.sampler != "grid":
        return budget.trials_per_cell or DEFAULT_TRIALS_PER_CELL, None
    size = grid_size(space)
    if budget.trials_per_cell not in (None, size):
        return size, (
            f"budget.trials_per_cell: with sampler 'grid' {label} has {size} grid points, got {budget.trials_per_cell}. "
            f"Fix: leave trials_per_cell unset (it follows the grid) or change the grid."
        )
    return size, None


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


# The trial config's paths, checked as the study's own are (schema.location_problem).
_TRIAL_LOCATIONS = ("data.root", "train.compile_cache")


def _trial_location_problems(tree: dict[str, Any]) -> list[str]:
    problems = []
    for path in _TRIAL_LOCATIONS:
        section, field = path.split(".")
        value = tree.get(section, {}).get(field) if isinstance(tree.get(section), dict) else None
        if isinstance(value, str) and (problem := location_problem(path, value)):
            problems.append(problem)
    return problems


def _missing_root(tree: dict[str, Any]) -> str | None:
    data = tree.get("data")
    root = data.get("root") if isinstance(data, dict) else None
    # A URI is read on the nodes, not here: the runner's preflight checks it on each of them. Not a string: the
    # cell's own validation says so.
    if not isinstance(root, str) or is_uri(root) or location_problem("", root) or Path(root).expanduser().exists():
        return None
    return (
        f"data.root: the directory must exist, got {shown(root)}. Fix: point it at the dataset "
        f"(sharpscale run --set data.root=/path/to/data), give the URI of a copy every node reads "
        f"(sharpscale data fetch cifar10 --to s3://BUCKET/cifar10), or check the file with --smoke on the embedded digits."
    )
