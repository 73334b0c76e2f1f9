"""The method registry: every method module's ``SPECS`` collected into ``METHODS`` (name -> MethodSpec), ``create`` and ``method_names``."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from . import _esam, _fsam, _gsam, _looksam, _method, _msam, _sam, _trajectory
from ._method import Method, MethodSpec

__all__ = ["METHODS", "MethodSpec", "create", "method_names"]

# Adding a method: its module declares SPECS (optim._method.method_spec) next to the class, and is listed here.
_MODULES = (_method, _sam, _gsam, _looksam, _trajectory, _esam, _fsam, _msam)


def _collect() -> Mapping[str, MethodSpec]:
    specs: dict[str, MethodSpec] = {}
    for module in _MODULES:
        for spec in module.SPECS:
            if spec.name in specs:
                raise RuntimeError(f"two registry entries are named {spec.name!r} (the second in {module.__name__})")
            specs[spec.name] = spec
    return MappingProxyType(specs)


#: Registry: name -> MethodSpec (read-only).
METHODS: Mapping[str, MethodSpec] = _collect()


def method_names() -> tuple[str, ...]:
    """The registry's names, in registry order."""
    return tuple(METHODS)


def create(name: str, base_optimizer: torch.optim.Optimizer, *, model: nn.Module | None = None,
           num_samples: int | None = None, num_classes: int | None = None, grad_clip: float | None = None,
           scaler: torch.amp.GradScaler | None = None, global_perturbation: bool = False, accumulate: int = 1,
           **hparams: Any) -> Method:
    """Build the registered method ``name`` around a ready ``base_optimizer``.

    ``model`` is the (possibly DDP-wrapped) module, ``num_samples``/``num_classes`` the FULL training set's
    size and classes; a method ignores context it does not need. ``accumulate``: micro-batches per step
    (each pass accumulated over them). ``hparams`` are the method's own knobs: one it does not take raises
    ValueError listing the accepted ones.
    """
    spec = METHODS.get(name) if isinstance(name, str) else None
    if spec is None:
        close = difflib.get_close_matches(str(name), METHODS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown method {name!r}: valid names are {', '.join(METHODS)}{hint}")
    unknown = sorted(set(hparams) - set(spec.hparams))
    if unknown:
        accepted = ", ".join(f"{k}={v!r}" for k, v in spec.hparams.items()) or "none"
        raise ValueError(f"method {name!r} does not take hparam(s) {', '.join(unknown)}; "
                         f"it accepts: {accepted}; remove or rename them")
    context = {"model": model, "num_samples": num_samples, "num_classes": num_classes, "grad_clip": grad_clip,
               "scaler": scaler, "global_perturbation": global_perturbation, "accumulate": accumulate}
    missing = sorted(k for k in spec.needs if context[k] is None)
    if missing:
        raise ValueError(f"method {name!r} needs {', '.join(missing)} (got None); pass "
                         + ", ".join(f"{k}=..." for k in missing) + " to create()")
    accepted = spec.accepts()
    return spec.build(base_optimizer, **{**spec.hparams, **hparams},
                      **{k: v for k, v in context.items() if k in accepted})
