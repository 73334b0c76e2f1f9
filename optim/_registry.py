"""The method registry: one frozen MethodSpec per name (defaults read from the class signatures), ``create`` and ``method_names``."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from ._gsam import GSAM
from ._looksam import LookSAM
from ._method import BaseOnly, Method
from ._sam import SAM
from ._trajectory import MESA, SAF, Regularised

__all__ = ["METHODS", "MethodSpec", "create", "method_names"]

#: Context ``create`` can pass on; a spec's ``needs`` is a subset.
CONTEXT = ("model", "num_samples", "num_classes")


@dataclass(frozen=True)
class MethodSpec:
    """One registry entry: what the study validator needs to know about a method without building it."""

    name: str
    description: str
    hparams: Mapping[str, Any] = field(default_factory=dict)  # the method's own knobs and their defaults
    two_pass: bool = False  # two forward+backward passes on (some) steps
    needs: frozenset[str] = frozenset()  # context create() must receive (not None)


def _defaults(fn: Callable, names: tuple[str, ...], **override: Any) -> Mapping[str, Any]:
    """Defaults straight from a signature, so each default lives in one place (the class)."""
    params = inspect.signature(fn).parameters
    out = {n: params[n].default for n in names}
    out.update(override)
    return MappingProxyType(out)


def _build_none(base, ctx, hp):
    return BaseOnly(base, **ctx)


def _build_sam(base, ctx, hp):
    return SAM(base, adaptive=False, **hp, **ctx)


def _build_asam(base, ctx, hp):
    return SAM(base, adaptive=True, **hp, **ctx)


def _build_gsam(base, ctx, hp):
    return GSAM(base, **hp, **ctx)


def _build_looksam(base, ctx, hp):
    return LookSAM(base, **hp, **ctx)


def _build_saf(base, ctx, hp, *, num_samples, num_classes):
    return Regularised(base, SAF(num_samples, num_classes, **hp), name="saf", **ctx)


def _build_mesa(base, ctx, hp):
    return Regularised(base, MESA(ctx["model"], **hp), name="mesa", **ctx)


_SPECS_AND_BUILDERS: tuple[tuple[MethodSpec, Callable], ...] = (
    (MethodSpec("none", "The base optimizer alone (one pass).", MappingProxyType({}), False, frozenset()),
     _build_none),
    (MethodSpec("sam", "SAM (Foret et al. 2021): update with the gradient at w + rho g/||g|| (p=2) or rho sign(g) (p=inf).",
                _defaults(SAM.__init__, ("rho", "p")), True, frozenset({"model"})),
     _build_sam),
    (MethodSpec("asam", "Adaptive SAM (Kwon et al. 2021): eps = rho T^2 g/||T g||, T = |w| + eta.",
                _defaults(SAM.__init__, ("rho", "eta"), rho=0.5), True, frozenset({"model"})),
     _build_asam),
    (MethodSpec("gsam", "GSAM (Zhuang et al. 2022): g_p - alpha g_perp, radius following the lr.",
                _defaults(GSAM.__init__, ("rho_max", "rho_min", "alpha", "lr_max", "lr_min", "adaptive", "eta")),
                True, frozenset({"model"})),
     _build_gsam),
    (MethodSpec("looksam", "LookSAM (Liu et al. 2022): SAM every k-th step, the stored orthogonal direction in between.",
                _defaults(LookSAM.__init__, ("rho", "k", "alpha")), True, frozenset({"model"})),
     _build_looksam),
    (MethodSpec("saf", "SAF (Du et al. 2022): trajectory loss against each sample's logits from e_tilde epochs ago.",
                _defaults(SAF.__init__, ("lam", "tau", "e_tilde", "e_start")), False,
                frozenset({"num_samples", "num_classes"})),
     _build_saf),
    (MethodSpec("mesa", "MESA (Du et al. 2022): trajectory loss against an EMA teacher's logits.",
                _defaults(MESA.__init__, ("beta", "lam", "tau", "e_start")), False, frozenset({"model"})),
     _build_mesa),
)

#: Registry: name -> MethodSpec (read-only).
METHODS: Mapping[str, MethodSpec] = MappingProxyType({s.name: s for s, _ in _SPECS_AND_BUILDERS})
_BUILDERS: Mapping[str, Callable] = MappingProxyType({s.name: b for s, b in _SPECS_AND_BUILDERS})


def method_names() -> tuple[str, ...]:
    """The registry's names, in registry order."""
    return tuple(METHODS)


def create(name: str, base_optimizer: torch.optim.Optimizer, *, model: nn.Module | None = None,
           num_samples: int | None = None, num_classes: int | None = None, grad_clip: float | None = None,
           scaler: torch.amp.GradScaler | None = None, global_perturbation: bool = False, **hparams: Any) -> Method:
    """Build the registered method ``name`` around a ready ``base_optimizer``.

    ``model`` is the (possibly DDP-wrapped) module, ``num_samples``/``num_classes`` the FULL training set's
    size and classes; a method ignores context it does not need. ``hparams`` are the method's own knobs:
    one it does not take raises ValueError listing the accepted ones.
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
    context = {"model": model, "num_samples": num_samples, "num_classes": num_classes}
    missing = sorted(k for k in spec.needs if context[k] is None)
    if missing:
        raise ValueError(f"method {name!r} needs {', '.join(missing)} (got None); pass "
                         + ", ".join(f"{k}=..." for k in missing) + " to create()")
    ctx = {"model": model, "grad_clip": grad_clip, "scaler": scaler, "global_perturbation": global_perturbation}
    hp = {**spec.hparams, **hparams}
    if name == "saf":
        return _build_saf(base_optimizer, ctx, hp, num_samples=num_samples, num_classes=num_classes)
    return _BUILDERS[name](base_optimizer, ctx, hp)
