"""The --smoke form of a study: which cells it keeps, and each cell made tiny on the embedded digits."""

from __future__ import annotations

import re
from typing import Any

from studies.spec._schema import Study, deep_merge
from trainables.config import TrialConfig
from trainables.errors import shown


def _smoke_levels(
    spec: Study, factor_levels: list[tuple[str, dict[str, dict[str, Any]]]]
) -> tuple[list[tuple[str, dict[str, dict[str, Any]]]], list[str]]:
    """The factor levels `--smoke` keeps: those smoke_form.levels names; else every named level (each architecture,
    each method), and a list of values (fractions, seeds) its first."""
    wanted, problems, kept = spec.smoke_form.levels, [], []
    for name in wanted:
        if name not in spec.factors:
            problems.append(
                f"smoke_form.levels.{name}: not a factor of the study (factors: {', '.join(spec.factors) or 'none'}). "
                f"Fix: name one of them."
            )
    for name, levels in factor_levels:
        if name in wanted:
            chosen = [str(v) for v in wanted[name]]
            unknown = [v for v in chosen if v not in levels]
            if unknown or not chosen:
                problems.append(
                    f"smoke_form.levels.{name}: must list levels of the factor ({', '.join(levels)}), got "
                    f"{wanted[name]}. Fix: pick among those."
                )
                continue
            kept.append((name, {v: levels[v] for v in chosen}))
        elif isinstance(spec.factors[name], list):
            kept.append((name, dict(list(levels.items())[:1])))
        else:
            kept.append((name, levels))
    return kept, problems


# --smoke: the same study, tiny, on the embedded digits, on CPU: for CI and for checking a file before a cluster run.
# Its epochs are those of the study's shortest cell; a cell with more keeps its ratio to it (`smoke_epochs`).
_SMOKE = {
    "data": {"name": "digits", "root": None, "img_size": 16, "batch_size": 64, "num_workers": 0},
    "schedule": {"epochs": 2, "warmup_epochs": 0},
    "train": {"device": "cpu", "threads": 1},
    # A geometry section's measurement set, small enough for the smallest digits fraction (0.1: 143 images) and
    # seconds of CPU; which measures, and how often, stay the study's own.
    "geometry": {"batches": 1, "batch_size": 32, "max_iter": 10, "trace_samples": 8, "flatness_draws": 4},
}
# One tiny model per family: the smoke run keeps each cell's architecture family, not its size.
_SMOKE_MODELS = {
    "vit": {"name": "vit_tiny_patch16_224", "kwargs": {"patch_size": 4, "embed_dim": 32, "depth": 1, "num_heads": 2}},
    "mixer": {"name": "mixer_s16_224", "kwargs": {"patch_size": 4, "num_blocks": 1, "embed_dim": 32}},
    "resnet": {"name": "resnet18", "cifar_stem": True, "kwargs": {"layers": [1, 1, 1, 1], "channels": [8, 16, 16, 32]}},
}


def _epochs(tree: dict[str, Any]) -> Any:
    """A cell's schedule.epochs as its tree sets it, else the trial config's default (not validated yet)."""
    schedule = tree.get("schedule")
    epochs = schedule.get("epochs") if isinstance(schedule, dict) else None
    return epochs if epochs is not None else TrialConfig().schedule.epochs


def smoke_epochs(epochs: Any, shortest: Any, smoke: Any) -> Any:
    """A cell's epochs under --smoke: the study's shortest cell runs `smoke` epochs, and every other cell keeps its
    ratio to it (rounded, at least 1), so a level given 2x the epochs, or equal steps on a smaller fraction, still
    has them in the tiny run. A cell's epochs that are no positive integer stay, for its validation to report."""
    if not _positive_int(epochs):
        return epochs
    if not (_positive_int(shortest) and _positive_int(smoke)):
        return smoke
    return max(1, round(smoke * epochs / shortest))


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _smoke_tree(tree: dict[str, Any], extra: dict[str, Any], shortest: Any = None) -> dict[str, Any]:
    from trainables.models import model_family

    name = tree.get("model", {}).get("name", TrialConfig().model.name)
    try:
        tiny = _SMOKE_MODELS[model_family(name)]
    except ValueError:
        tiny = {}  # an unknown family is reported by the cell's own validation
    model = {k: v for k, v in tree.get("model", {}).items() if k in ("drop_rate", "drop_path_rate")}
    out = deep_merge(deep_merge({**tree, "model": {**model, **tiny}}, _SMOKE), extra)
    if shortest is not None and isinstance(out.get("schedule"), dict):
        out["schedule"]["epochs"] = smoke_epochs(_epochs(tree), shortest, _epochs(out))
    return out


def _leaf_paths(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out += _leaf_paths(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out


def smoke_set_note(problem: str, tree: dict[str, Any], extra: dict[str, Any]) -> str:
    """`problem` of a cell under --smoke, with a word where it names a value the smoke form set (its batch, its
    model) rather than the file: the fix is then the file's `smoke:` section, which --smoke applies last."""
    own = set(_leaf_paths(extra))  # what the file's smoke section sets is the file's own
    family = {leaf for tiny in _SMOKE_MODELS.values() for leaf in _leaf_paths({"model": tiny})}
    named = [
        path
        for path in [*_leaf_paths(_SMOKE), *sorted(family)]
        if path not in own and re.search(rf"(?<![\w.]){re.escape(path)}(?!\w)", problem)
    ]
    if not named:
        return problem
    notes = []
    for path in named:
        node: Any = tree
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        notes.append(f"{path}={shown(node)}")
    first = named[0].split(".")
    example = "".join(f"{{{part}: " for part in first) + "VALUE" + "}" * len(first)
    return (
        f"{problem} (under --smoke: --smoke set {', '.join(notes)}, the smoke form's own value, not the file's. "
        f"Fix for --smoke: set it in the file's smoke section, which --smoke applies over its own: smoke: {example}.)"
    )
