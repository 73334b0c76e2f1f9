"""The method registry: the entries' ``SPECS`` collected into ``METHODS`` (name -> MethodSpec), ``create``, ``method_names`` and ``check_hparams``; importing it does not import torch."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from . import _specs
from ._knobs import MethodSpec, check_m_sharpness, momentum_problem
from ._schedule import ADAPTIVE_METHODS, Schedule, check_schedule
from ._scope import check_scope

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ._method import Method

__all__ = ["METHODS", "MethodSpec", "check_base", "check_hparams", "create", "method_names"]

# Adding a method: its module holds the class, and one entry in optim._specs.SPECS declares its knobs and names the
# class; the entries live apart from the classes so that reading them (a study's validation) needs no torch.
_MODULES = (_specs,)


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


def _one_edit(a: str, b: str) -> bool:
    """Whether ``b`` is ``a`` with one letter left out, added, changed, or two neighbours swapped."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]]
                                  and a[diff[1]] == b[diff[0]])  # fmt: skip
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def _closest(name: str) -> list[str]:
    """The names one typo away (a swap counts as one: 'gasm' is 'gsam' as much as 'gam'), in registry order; else
    difflib's closest."""
    near = [n for n in METHODS if _one_edit(name, n)]
    return near or difflib.get_close_matches(name, METHODS, n=1)


def _entry(name: str, hparams: dict[str, Any]) -> MethodSpec:
    """The registry entry ``name``, once ``hparams`` are all its knobs; else the ValueError saying what to fix."""
    spec = METHODS.get(name) if isinstance(name, str) else None
    if spec is None:
        close = _closest(str(name))
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"unknown method {name!r}: valid names are {', '.join(METHODS)}{hint}")
    unknown = sorted(set(hparams) - set(spec.hparams))
    if unknown:
        accepted = ", ".join(f"{k}={v!r}" for k, v in spec.hparams.items()) or "none"
        raise ValueError(
            f"method {name!r} does not take hparam(s) {', '.join(unknown)}; "
            f"it accepts: {accepted}; remove or rename them"
        )
    return spec


def check_hparams(
    name: str,
    *,
    base: str,
    base_keeps_momentum: bool,
    global_perturbation: bool = False,
    scope: Any = "all",
    schedule: Any = None,
    epochs: int | None = None,
    base_settings: Mapping[str, Any] | None = None,
    base_defaults: Mapping[str, Any] | None = None,
    **hparams: Any,
) -> None:
    """Raise what ``create(name, <base optimizer>, **hparams)`` would raise about the method's knobs, without torch:
    the name, unknown knobs, each knob's rule and the rules between knobs (the unset ones at their defaults), and
    a base optimizer without the momentum the method needs. ``base``: the base optimizer's class name (AdamW, SGD);
    ``base_keeps_momentum``: whether it keeps one (Adam's betas, SGD's momentum > 0); ``global_perturbation``: the
    trial's setting, which excludes m-sharpness. ``scope`` and ``schedule`` are checked in their form and against
    the method (a method that does not perturb takes neither); the scope's patterns are checked against the model
    when it is built. ``base_settings``/``base_defaults``: the trial's base-optimizer knobs and their defaults, for
    a method with an update of its own (``check_base``)."""
    spec = _entry(name, hparams)
    knobs = {**spec.hparams, **hparams}
    spec.check_knobs(**knobs)
    if "m" in knobs:
        check_m_sharpness(knobs["m"], global_perturbation)
    if spec.needs_momentum and not base_keeps_momentum:
        raise ValueError(momentum_problem(name, [0], base))
    check_base(name, base_settings or {}, base_defaults or {})
    check_step_kinds(name, knobs, scope=scope, schedule=schedule, epochs=epochs)


def check_base(name: str, settings: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
    """Raise, without torch, where a trial's base-optimizer ``settings`` (knob -> value: ``weight_decay``, ``betas``,
    ...) do not suit method ``name``: for a method with an ``own_update`` (bSAM), a knob it requires at one value and
    is not, or a knob it does not read set away from its ``defaults`` (the trial config's), which would otherwise be
    dropped without a word. Nothing for a method whose update is the base optimizer's step."""
    spec = METHODS[name]
    own = spec.own_update
    if own is None:
        return
    for knob, want in own.requires.items():
        if knob in settings and settings[knob] != want:
            raise ValueError(
                f"{knob} must be {want!r} for {name}, which steps by its own rule, but got {knob}={settings[knob]!r}; "
                f"set it to {want!r} ({own.fix})"
            )
    for knob in own.ignores:
        if knob in settings and knob in defaults and settings[knob] != defaults[knob]:
            raise ValueError(
                f"{knob} must stay at its default {defaults[knob]!r} for {name}, whose update does not read it, but got "
                f"{knob}={settings[knob]!r}; drop it ({own.fix})"
            )


def check_step_kinds(name: str, knobs: Mapping[str, Any], *, scope: Any, schedule: Any, epochs: int | None) -> Schedule:
    """The scope and the schedule of method ``name`` with its resolved ``knobs``, checked without torch: their form,
    that the method perturbs if either is other than the default, and that an adaptive schedule's method computes the
    clean gradient whole (``ADAPTIVE_METHODS``, no ``m``). Returns the schedule."""
    spec = METHODS[name]
    checked = check_scope(scope)
    # A method with an update of its own perturbs, but takes neither: a schedule's plain steps are a base step it
    # does not take, and its noise and ascent are per weight over every parameter.
    why = (
        "which steps by its own rule, not a base optimizer's,"
        if spec.own_update
        else "which does not perturb the weights,"
    )
    if checked != "all" and not spec.perturbs:
        raise ValueError(
            f"scope must be 'all' for {name}, {why} but got scope={scope!r}; "
            "pass scope='all', or a perturbing method ("
            + ", ".join(s.name for s in METHODS.values() if s.perturbs)
            + ")"
        )
    plan = check_schedule(schedule, epochs=epochs)
    if not plan.always and not spec.perturbs:
        raise ValueError(
            f"schedule must be unset for {name}, {why} but got schedule={schedule!r}; drop it "
            + (
                "(it perturbs at every step)"
                if spec.own_update
                else "(SAF and MESA switch their loss on after e_start)"
            )
        )
    if plan.adaptive_c is not None and (name not in ADAPTIVE_METHODS or knobs.get("m") is not None):
        raise ValueError(
            f"schedule.adaptive must be unset for {name}{' with m=' + str(knobs['m']) if knobs.get('m') else ''}, "
            f"but got adaptive={schedule['adaptive']!r}: the gate looks at the step's clean gradient, which only "
            f"{', '.join(ADAPTIVE_METHODS)} (without m) compute whole before perturbing; use start_epoch, every or "
            "probability, or one of those methods"
        )
    return plan


def create(
    name: str,
    base_optimizer: torch.optim.Optimizer,
    *,
    model: nn.Module | None = None,
    num_samples: int | None = None,
    num_classes: int | None = None,
    grad_clip: float | None = None,
    scaler: torch.amp.GradScaler | None = None,
    global_perturbation: bool = False,
    accumulate: int = 1,
    scope: Any = "all",
    schedule: Any = None,
    epochs: int | None = None,
    **hparams: Any,
) -> Method:
    """Build the registered method ``name`` around a ready ``base_optimizer``.

    ``model`` is the (possibly DDP-wrapped) module, ``num_samples``/``num_classes`` the FULL training set's
    size and classes; a method ignores context it does not need. ``accumulate``: micro-batches per step
    (each pass accumulated over them). ``model``, ``grad_clip``, ``scaler``, ``global_perturbation`` and
    ``accumulate`` go on to ``Method.__init__`` (``optim.StepKeywords``), which checks them; the defaults here
    are its own (tests/optim/test_registry.py). ``hparams`` are the method's own knobs: one it does not take
    raises ValueError listing the accepted ones. ``scope``: which parameters the perturbation moves ('all', 'norm',
    or ``{'include': [...], 'exclude': [...]}`` name patterns, checked against the model). ``schedule``: which steps
    perturb (``optim.Schedule`` or its mapping; ``epochs`` resolves a ``start_fraction``); the others are the base
    optimizer's step, and the method comes back wrapped (``optim.Scheduled``) unless it perturbs at every step.
    """
    spec = _entry(name, hparams)
    plan = check_step_kinds(name, {**spec.hparams, **hparams}, scope=scope, schedule=schedule, epochs=epochs)
    context = {
        "model": model,
        "num_samples": num_samples,
        "num_classes": num_classes,
        "grad_clip": grad_clip,
        "scaler": scaler,
        "global_perturbation": global_perturbation,
        "accumulate": accumulate,
        "scope": scope,
    }
    missing = sorted(k for k in spec.needs if context[k] is None)
    if missing:
        raise ValueError(
            f"method {name!r} needs {', '.join(missing)} (got None); pass "
            + ", ".join(f"{k}=..." for k in missing)
            + " to create()"
        )
    accepted = spec.accepts()
    method = spec.build(
        base_optimizer, **{**spec.hparams, **hparams}, **{k: v for k, v in context.items() if k in accepted}
    )
    if plan.always:
        return method
    from ._scheduled import Scheduled

    return Scheduled(method, plan)
