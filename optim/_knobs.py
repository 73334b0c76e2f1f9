"""What the registry knows about a method without importing torch: MethodSpec, its knobs (name, default, rule) and the rules' checks, shared by the classes and the study validator."""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = [
    "CONTEXT",
    "Knob",
    "MethodSpec",
    "OwnUpdate",
    "Relation",
    "Rule",
    "SmallRun",
    "check",
    "check_m_sharpness",
    "method_spec",
]

#: Context ``optim.create`` can hand to a method; a spec's ``needs`` is a subset of the first three. The rest, and
#: ``model``, are ``Method.__init__``'s shared keywords (``optim.StepKeywords``; tests/optim/test_registry.py
#: holds the two lists equal), named here without importing torch.
CONTEXT = (
    "model",
    "num_samples",
    "num_classes",
    "grad_clip",
    "scaler",
    "global_perturbation",
    "accumulate",
    "scope",
)
#: The shared keywords among them, read here rather than from ``Method.__init__`` so that this module never imports
#: the classes' (test_registry.py holds CONTEXT to be these and the context only create() takes).
SHARED = tuple(k for k in CONTEXT if k not in ("num_samples", "num_classes"))


def check(ok: bool, name: str, rule: str, value: Any, fix: str) -> None:
    """Raise the project's ValueError for a bad hyperparameter: the name, the rule, the value and the fix."""
    if not ok:
        raise ValueError(f"{name} must satisfy {rule}, but got {name}={value!r}; {fix}")


def check_m_sharpness(m: Any, global_perturbation: bool) -> None:
    """m-sharpness and a global perturbation exclude each other: the one home of that rule, which SAM's constructor
    and `check_hparams` (a study's validation, without torch) both apply."""
    check(
        m is None or not global_perturbation,
        "m",
        "m unset when global_perturbation=True",
        m,
        "m-sharpness perturbs each group of m samples on its own replica; drop global_perturbation or m",
    )


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Rule:
    """What one knob's value must satisfy. ``text`` and ``fix`` may name ``{name}`` and ``{default}``; ``convert``
    turns an accepted value into the form the method keeps (``float``); ``parse`` runs first (SAM's ``p='inf'``)."""

    text: str
    ok: Callable[[Any], bool]
    fix: str
    convert: Callable[[Any], Any] = _same
    parse: Callable[[Any], Any] = _same

    def check(self, name: str, value: Any, default: Any = None) -> Any:
        parsed = self.parse(value)
        check(
            self.ok(parsed),
            name,
            self.text.format(name=name, default=default),
            value,
            self.fix.format(name=name, default=default),
        )
        return self.convert(parsed)


def number(x: Any) -> bool:
    """A real number, bools included (``True`` is 1, as Python has it): the older rules' type test."""
    return isinstance(x, (int, float))


def strict_number(x: Any) -> bool:
    """A real number that is not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def integer(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


#: Any value, kept as given (a knob with no rule of its own, or one a Relation checks).
ANY = Rule("any value", lambda x: True, "")
#: A flag, kept as a bool.
FLAG = Rule("a bool", lambda x: True, "", convert=bool)
#: A perturbation radius: rho, rho_max, rho_min.
RADIUS = Rule(
    "0 <= {name} < inf",
    lambda x: strict_number(x) and math.isfinite(x) and x >= 0,
    "pass a non-negative radius such as {name}=0.05",
    convert=float,
)


@dataclass(frozen=True)
class Knob:
    """One knob of a method: its name, its default (what ``create`` passes when a study leaves it unset) and its rule."""

    name: str
    default: Any
    rule: Rule = ANY

    def check(self, value: Any) -> Any:
        """``value`` as the method keeps it, or the project's ValueError naming the knob, the rule, the value and the fix."""
        return self.rule.check(self.name, value, self.default)


@dataclass(frozen=True)
class Relation:
    """A rule between knobs (``rho_min <= rho_max``): ``names`` it reads, ``check(values)`` raising the project's
    ValueError. Checked once every knob it reads has passed its own rule."""

    names: tuple[str, ...]
    check: Callable[[Mapping[str, Any]], None]


@dataclass(frozen=True)
class SmallRun:
    """How the registry-parametrised tests (tests/optim/) run a method small on CPU, kept with its entry so that a
    new method is exercised by every one of them the day it is added.

    ``hparams``: small, distinguishable knobs (every rule passes; SAF/MESA active from epoch 2) that the fast tests
    and the float64 references run at. ``base_exactly``: knobs under which the method is its base optimizer exactly
    (rho = 0), for a method that perturbs; None for one that does not. ``call_of_pass``: which forward call is pass
    N, where the method makes forwards of its own between them (ESAM's no-grad selection forward is call 2).
    ``passes_per_step`` and ``forwards``: what tests/optim/test_registry.py's three steps of batch 8 at ``hparams``
    give (``Method.passes_per_step``; the calls of ``forward``). ``defaults_in``: ``"module:attribute"`` whose
    signature holds the knobs' defaults, where the builder is a factory that takes them without defaults.
    ``base_steps``: the base optimizer's steps per ``train_step`` (Lookbehind-SAM's k; 1 for every other method).
    """

    hparams: Mapping[str, Any] = field(default_factory=dict)
    base_exactly: Mapping[str, Any] | None = None
    call_of_pass: Mapping[int, int] = field(default_factory=dict)
    passes_per_step: float = 1.0
    forwards: int = 3
    defaults_in: str = ""
    base_steps: int = 1


@dataclass(frozen=True)
class OwnUpdate:
    """What a method that steps the weights by a rule of its own (bSAM), not a base optimizer's step with a changed
    gradient, takes from its base optimizer: only the parameter groups and each group's current ``lr`` (which the
    lr schedule sets); the base's step is never called and its state stays empty. ``requires``: the trial config's
    base-optimizer knobs that must have one value (bSAM's prior is a knob of its own, so ``weight_decay`` must be 0,
    or a decay would seem to apply); ``ignores``: the knobs it does not read, which must stay at the config's
    defaults, so that no setting is silently dropped; ``fix``: where the method's own counterparts are. One rule for
    the trial config (``optim.check_base``, torch-free) and the docs; ``perturbs`` is False for such a method (its
    schedule's plain steps would be a base step it does not take, so it takes neither a schedule nor a scope)."""

    requires: Mapping[str, Any]
    ignores: tuple[str, ...]
    fix: str


@dataclass(frozen=True)
class SharedBatch:
    """A method form whose data-parallel ranks do not split the global batch but each take all of it, and compute
    different things on it (SAMPa's two-rank form: rank 0 the perturbation's gradient, rank 1 the update's): turned
    on by the flag knob ``knob``, on exactly ``ranks`` ranks. The trial loop feeds every rank the whole batch and
    records rank 0's training loss; the study validator refuses another worker count before Ray starts."""

    knob: str
    ranks: int


@dataclass(frozen=True)
class MethodSpec:
    """One registry entry: what the study validator needs to know about a method without building it (its knobs
    with their defaults and rules, the base optimizers it takes), and how to build it.

    ``builder`` is ``"module:attribute"`` of the class or factory inside ``optim``, imported (with torch) only when
    a method is built; ``build(base_optimizer, **hparams, **context)`` takes keyword arguments only.

    ``step_cost``: its training throughput as a share of the base step's (``none``), measured (None: not measured,
    so `sharpscale run --dry-run` gives its cells no estimate; SAM's own is each card's measured SAM figure,
    studies/cost.py CARD_FIGURES). ``compiled_differs``: why its compiled step is not the eager step, as measured
    on the GPU check (benchmarks/check_compiled.py), so that ``train.compile: auto`` runs it eager; empty where the
    compiled step agrees with eager to float rounding. ``small``: how the tests run it (SmallRun).
    """

    name: str
    description: str
    knobs: tuple[Knob, ...] = ()
    relations: tuple[Relation, ...] = ()
    two_pass: bool = False  # two forward+backward passes on (some) steps
    needs: frozenset[str] = frozenset()  # context create() must receive (not None)
    needs_momentum: bool = False  # the base optimizer must keep a momentum (Adam's betas, or SGD's momentum > 0)
    perturbs: bool = False  # moves the weights to a perturbed point: takes a scope and a schedule
    builder: str = field(default="", repr=False)
    build_kwargs: Mapping[str, Any] = field(default_factory=dict, repr=False)
    step_cost: float | None = None
    compiled_differs: str = ""
    small: SmallRun = field(default_factory=SmallRun, repr=False)
    own_update: OwnUpdate | None = None  # steps by its own rule; the base optimizer only lends groups and lr
    shared_batch: SharedBatch | None = None  # a form whose ranks each take the whole global batch

    @property
    def steps_base(self) -> bool:
        """Whether the update is the base optimizer's step (every method but those with an ``own_update``)."""
        return self.own_update is None

    @property
    def hparams(self) -> Mapping[str, Any]:
        """The method's own knobs and their defaults, in declaration order."""
        return MappingProxyType({k.name: k.default for k in self.knobs})

    def knob(self, name: str) -> Knob:
        return next(k for k in self.knobs if k.name == name)

    def shares_batch(self, hparams: Mapping[str, Any]) -> bool:
        """Whether a trial with these knobs runs the form whose ranks each take the whole batch (``shared_batch``)."""
        form = self.shared_batch
        return form is not None and bool(hparams.get(form.knob, self.knob(form.knob).default))

    def check_knobs(self, **values: Any) -> dict[str, Any]:
        """Check the given knobs (any subset of this method's) by their rules, in declaration order, then every
        relation whose knobs are all given; returns them as the method keeps them. The first broken rule raises."""
        out = {k.name: k.check(values[k.name]) for k in self.knobs if k.name in values}
        for relation in self.relations:
            if all(n in out for n in relation.names):
                relation.check(out)
        return out

    @property
    def build(self) -> Callable[..., Any]:
        """The class or factory that builds the method (importing its module, and torch, on first use)."""
        module, _, attr = self.builder.partition(":")
        target = getattr(importlib.import_module(module, __package__), attr)
        if self.build_kwargs:
            import functools

            return functools.partial(target, **self.build_kwargs)
        return target

    def accepts(self) -> frozenset[str]:
        """The context keywords ``build`` takes (a method ignores context it has no use for): those it names,
        and all of ``Method.__init__``'s shared keywords (``optim.StepKeywords``) if it passes ``**common``
        on. A Method subclass's signature names them already (``Method.__init_subclass__``); a factory's does not."""
        params = inspect.signature(self.build).parameters
        named = {k for k in CONTEXT if k in params}
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            named |= set(SHARED)
        return frozenset(named)


def method_spec(
    name: str,
    *,
    description: str,
    builder: str,
    knobs: Sequence[Knob] = (),
    relations: Sequence[Relation] = (),
    two_pass: bool = False,
    needs: Sequence[str] = (),
    needs_momentum: bool = False,
    perturbs: bool | None = None,
    build_kwargs: Mapping[str, Any] | None = None,
    step_cost: float | None = None,
    compiled_differs: str = "",
    small: SmallRun | None = None,
    own_update: OwnUpdate | None = None,
    shared_batch: SharedBatch | None = None,
) -> MethodSpec:
    """A registry entry, its declarations checked: knob names unique, relations reading declared knobs, ``needs``
    context that create() can pass, the small run's knobs among its own; ``perturbs`` defaults to ``two_pass``.
    tests/optim/test_knobs.py holds each knob's default equal to the builder's."""
    names = [k.name for k in knobs]
    if len(set(names)) != len(names):
        raise TypeError(f"method {name!r}: knob names repeat: {names}")
    stray = sorted({n for r in relations for n in r.names} - set(names))
    if stray:
        raise TypeError(f"method {name!r}: relations read {stray}, which are not among its knobs {names}")
    bad = set(needs) - set(CONTEXT[:3])
    if bad:
        raise TypeError(f"method {name!r}: needs {sorted(bad)} is not context create() can pass ({CONTEXT[:3]})")
    small = small if small is not None else SmallRun()
    if own_update is not None and (perturbs or needs_momentum or small.base_exactly is not None):
        raise TypeError(
            f"method {name!r}: an own_update method steps no base optimizer, so it takes no schedule or scope "
            "(perturbs=False), needs no base momentum and has no small.base_exactly"
        )
    if shared_batch is not None and shared_batch.knob not in names:
        raise TypeError(f"method {name!r}: shared_batch.knob {shared_batch.knob!r} is not among its knobs {names}")
    for label, knobs_set in (("small.hparams", small.hparams), ("small.base_exactly", small.base_exactly or {})):
        unknown = sorted(set(knobs_set) - set(names))
        if unknown:
            raise TypeError(f"method {name!r}: {label} sets {unknown}, which are not among its knobs {names}")
    return MethodSpec(
        name=name,
        description=description,
        knobs=tuple(knobs),
        relations=tuple(relations),
        two_pass=two_pass,
        needs=frozenset(needs),
        needs_momentum=needs_momentum,
        perturbs=(two_pass and own_update is None) if perturbs is None else perturbs,
        builder=builder,
        build_kwargs=MappingProxyType(dict(build_kwargs or {})),
        step_cost=step_cost,
        compiled_differs=compiled_differs,
        small=small,
        own_update=own_update,
        shared_batch=shared_batch,
    )


def momentum_problem(method: str, groups: Sequence[int], optimizer: str) -> str:
    """Why a base optimizer without momentum cannot serve ``method`` (param ``groups`` of ``optimizer`` lack one)."""
    return (
        f"base_optimizer must keep a momentum for {method} (Adam's first moment or SGD's momentum > 0), but "
        f"param group(s) {list(groups)} of {optimizer} have none; use AdamW, or SGD with momentum=0.9"
    )
