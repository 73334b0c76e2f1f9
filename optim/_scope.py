"""Which parameters a perturbing method moves (``scope``): the torch-free check of a scope's form, and its resolution
against a model into the set of parameters the perturbation (its direction and its norm) runs over."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["SCOPES", "check_scope", "model_groups", "resolve_scope"]

#: The named scopes: every parameter (SAM as published), or the affine parameters of the normalisation layers only
#: (SAM-ON, Mueller et al. 2023). A mapping ``{include: [...], exclude: [...]}`` of name patterns is the third form.
SCOPES = ("all", "norm")
_PATTERN_KEYS = ("include", "exclude")


def _fail(rule: str, value: Any, fix: str) -> None:
    raise ValueError(f"scope must satisfy {rule}, but got scope={value!r}; {fix}")


def check_scope(scope: Any) -> Any:
    """``scope`` in its checked form ('all', 'norm', or ``{'include': (..), 'exclude': (..)}`` with tuples of
    non-empty strings), or the project's ValueError. Needs no model (nor torch): a study validates it at load, and
    ``resolve_scope`` checks the patterns against the model when the method is built."""
    if isinstance(scope, str):
        if scope not in SCOPES:
            _fail(
                f"one of {SCOPES} or a mapping with include/exclude name patterns",
                scope,
                "pass scope='all' (every parameter), 'norm' (normalisation layers' affine parameters) or e.g. "
                "{'include': ['*.norm*.weight'], 'exclude': ['head.*']}",
            )
        return scope
    if not isinstance(scope, Mapping):
        _fail("a string or a mapping", scope, "pass scope='all', 'norm' or {'include': [...], 'exclude': [...]}")
    unknown = sorted(set(map(str, scope)) - set(_PATTERN_KEYS))
    if unknown:
        _fail(
            f"a mapping with keys among {_PATTERN_KEYS}",
            dict(scope),
            f"remove {unknown}; patterns go under include (parameters to perturb) or exclude (to leave out)",
        )
    out: dict[str, tuple[str, ...]] = {}
    for key in _PATTERN_KEYS:
        patterns = scope.get(key, ())
        if isinstance(patterns, str):
            patterns = (patterns,)
        if not isinstance(patterns, (list, tuple)) or not all(isinstance(p, str) and p for p in patterns):
            _fail(
                f"{key} a list of non-empty name patterns (fnmatch: *, ?, [..])",
                dict(scope),
                f"pass e.g. {key}: ['blocks.*.norm1.weight']",
            )
        out[key] = tuple(patterns)
    if not out["include"] and not out["exclude"]:
        _fail("at least one include or exclude pattern", dict(scope), "name some patterns, or pass scope='all'")
    return out


def model_groups(names: list[str]) -> list[str]:
    """The model's parameter names with their block indices folded into ``*`` (``layer1.0.conv1.weight`` ->
    ``layer*.*.conv*.weight``), each once, in order: what an error names so that a pattern can be written."""
    seen: dict[str, None] = {}
    for name in names:
        seen.setdefault(re.sub(r"\d+", "*", name), None)
    return list(seen)


def _norm_modules() -> tuple[type, ...]:
    from torch import nn

    # timm's BatchNormAct2d, LayerNorm2d, GroupNorm1 and the like subclass these.
    return (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm)


def resolve_scope(scope: Any, model: nn.Module, params: list[torch.Tensor]) -> frozenset[torch.Tensor] | None:
    """The parameters among ``params`` (the base optimizer's) that ``scope`` perturbs; None for 'all' (every one).

    ``model`` is the plain module (unwrapped). A pattern matches a parameter's name in ``model.named_parameters()``;
    one that matches none, or a scope that leaves nothing to perturb, raises the project's ValueError naming the
    model's parameter groups."""
    scope = check_scope(scope)
    if scope == "all":
        return None
    named = list(model.named_parameters())
    names = [n for n, _ in named]
    trainable = {p for p in params if p.requires_grad}
    if scope == "norm":
        chosen = {
            p
            for module in model.modules()
            if isinstance(module, _norm_modules())
            for p in module.parameters(recurse=False)
            if p in trainable
        }
        if not chosen:
            raise ValueError(
                "scope='norm' perturbs the affine parameters of BatchNorm, LayerNorm and GroupNorm layers, but "
                f"{type(model).__name__} has no trainable ones (its parameter groups: {', '.join(model_groups(names))}); "
                "pass scope='all' or name the parameters with {'include': [...]}"
            )
        return frozenset(chosen)
    dead = [
        (key, pattern)
        for key in _PATTERN_KEYS
        for pattern in scope[key]
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names)
    ]
    if dead:
        shown = ", ".join(f"{key} {pattern!r}" for key, pattern in dead)
        raise ValueError(
            f"scope: every pattern must match a parameter name of the model, but {shown} matches none of "
            f"{type(model).__name__}'s parameters; its parameter groups (digits shown as *): "
            f"{', '.join(model_groups(names))}. Fix the pattern (fnmatch syntax: *, ?, [..])"
        )

    def wanted(name: str) -> bool:
        included = not scope["include"] or any(fnmatch.fnmatchcase(name, p) for p in scope["include"])
        return included and not any(fnmatch.fnmatchcase(name, p) for p in scope["exclude"])

    chosen = {p for n, p in named if p in trainable and wanted(n)}
    if not chosen:
        raise ValueError(
            f"scope={dict(scope)!r} leaves no trainable parameter to perturb in {type(model).__name__} (its "
            f"parameter groups: {', '.join(model_groups(names))}); widen include or narrow exclude"
        )
    return frozenset(chosen)
