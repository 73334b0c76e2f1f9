"""When a perturbing method perturbs (``schedule``), torch-free: the Schedule record, its checks, and the share of steps
it gives the method; the wrapper that runs it is optim._scheduled."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ADAPTIVE_METHODS", "Schedule", "check_schedule", "start_epoch_of"]

#: The methods whose step begins with the clean gradient at ``w`` and ends with one base step, so that an adaptive
#: schedule can look at that gradient and still take the base optimizer's step with it (docs/algorithms.md,
#: "Schedule"). The others (ESAM's partial pass 1, LookSAM's own schedule, MSAM's perturbed only pass, m-sharpness)
#: take the deterministic and random schedules only.
ADAPTIVE_METHODS = ("sam", "asam", "gsam", "fsam")

_KEYS = ("start_epoch", "start_fraction", "every", "probability", "adaptive")


def _fail(field: str, rule: str, value: Any, fix: str) -> None:
    raise ValueError(f"schedule.{field} must satisfy {rule}, but got {field}={value!r}; {fix}")


def start_epoch_of(fraction: float, epochs: int) -> int:
    """The first epoch (0-based) at or after ``fraction`` of a run of ``epochs`` epochs: late-phase SAM's switch
    (Zhou et al. 2025 switch at epoch 175 of 200, i.e. 0.875)."""
    return min(epochs, math.ceil(fraction * epochs - 1e-9))


@dataclass(frozen=True)
class Schedule:
    """Which steps run the method; the others are the base optimizer's step exactly.

    A step ``t`` (counted from 0 over the steps taken) of epoch ``e`` runs the method when ``e >= start_epoch``,
    ``t % every == 0``, a Bernoulli draw with ``probability`` succeeds (SS-SAM; one draw every step, from a generator
    seeded by the trial's seed), and, with ``adaptive_c`` set, the squared norm of the step's clean gradient is at
    least its running mean plus ``adaptive_c`` running standard deviations (AE-SAM; EMAs with decay
    ``adaptive_decay``)."""

    start_epoch: int = 0
    #: Where the run length was not known when checked: the share of training before the method starts, resolved
    #: into ``start_epoch`` by ``resolved(epochs)`` (``optim.create(..., epochs=)`` does it).
    start_fraction: float | None = None
    every: int = 1
    probability: float = 1.0
    adaptive_c: float | None = None
    adaptive_decay: float | None = None

    def resolved(self, epochs: int | None) -> Schedule:
        """This schedule with a ``start_fraction`` turned into its ``start_epoch`` for a run of ``epochs`` epochs."""
        return check_schedule(self.as_mapping(), epochs=epochs)

    def as_mapping(self) -> dict[str, Any]:
        """The mapping ``check_schedule`` reads back into this schedule."""
        out: dict[str, Any] = {"every": self.every, "probability": self.probability}
        if self.start_fraction is not None:
            out["start_fraction"] = self.start_fraction
        else:
            out["start_epoch"] = self.start_epoch
        if self.adaptive_c is not None:
            out["adaptive"] = {"c": self.adaptive_c, "decay": self.adaptive_decay}
        return out

    @property
    def always(self) -> bool:
        """Every step runs the method: today's behaviour, no wrapper at all."""
        return self == Schedule()

    def share(self, epochs: int) -> float:
        """The expected share of steps that run the method over a run of ``epochs`` epochs. An adaptive gate's share
        depends on the gradients; it is counted as the share of a normal variable above its mean plus ``c``
        deviations, a planning figure only (the trial records the share it had)."""
        if self.start_fraction is not None:
            return self.resolved(epochs).share(epochs)
        start = min(self.start_epoch, epochs) / epochs if epochs else 0.0
        share = (1.0 - start) * self.probability / self.every
        if self.adaptive_c is not None:
            share *= 0.5 * math.erfc(self.adaptive_c / math.sqrt(2.0))
        return share


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_schedule(schedule: Any, *, epochs: int | None = None) -> Schedule:
    """``schedule`` (None, a Schedule, or a mapping with keys among start_epoch, start_fraction, every, probability,
    adaptive: {c, decay}) as a Schedule, or the project's ValueError naming the field, the rule, the value and the fix.
    With the run's ``epochs``, a ``start_fraction`` becomes its ``start_epoch`` and a start at or after the run's end
    (a schedule that never perturbs) is refused; without them the fraction is kept as given."""
    if schedule is None:
        return Schedule()
    if isinstance(schedule, Schedule):
        schedule = schedule.as_mapping()
    if not isinstance(schedule, Mapping):
        raise ValueError(
            f"schedule must be a mapping with keys among {_KEYS}, but got schedule={schedule!r}; pass e.g. "
            "{'start_fraction': 0.875} or {'probability': 0.5}, or leave it unset to perturb at every step"
        )
    unknown = sorted(set(map(str, schedule)) - set(_KEYS))
    if unknown:
        raise ValueError(
            f"schedule takes keys among {_KEYS}, but got {unknown}; remove or rename them "
            f"(adaptive takes {{'c': ..., 'decay': ...}})"
        )
    if "start_epoch" in schedule and "start_fraction" in schedule:
        _fail(
            "start_epoch",
            "start_epoch or start_fraction, not both",
            schedule["start_epoch"],
            "keep one of the two",
        )
    start = schedule.get("start_epoch", 0)
    if not (isinstance(start, int) and not isinstance(start, bool) and start >= 0):
        _fail(
            "start_epoch", "start_epoch >= 0 (an integer epoch)", start, "pass the first epoch to perturb in, e.g. 175"
        )
    if "start_fraction" in schedule:
        fraction = schedule["start_fraction"]
        if not (_number(fraction) and 0 <= fraction < 1):
            _fail(
                "start_fraction",
                "0 <= start_fraction < 1",
                fraction,
                "pass the share of training before the method starts, e.g. 0.875 (late-phase SAM); "
                "a method that never starts is method none",
            )
        if epochs is not None:
            start = start_epoch_of(float(fraction), epochs)
    every = schedule.get("every", 1)
    if not (isinstance(every, int) and not isinstance(every, bool) and every >= 1):
        _fail("every", "every >= 1 (an integer number of steps)", every, "pass e.g. every=2 (every=1: every step)")
    probability = schedule.get("probability", 1.0)
    if not (_number(probability) and 0 < probability <= 1):
        _fail(
            "probability",
            "0 < probability <= 1",
            probability,
            "pass the chance that a step perturbs, e.g. probability=0.5 (SS-SAM); 1 perturbs at every step",
        )
    c = decay = None
    if "adaptive" in schedule:
        adaptive = schedule["adaptive"]
        if not isinstance(adaptive, Mapping) or sorted(adaptive) != ["c", "decay"]:
            _fail(
                "adaptive",
                "a mapping with exactly the keys c (threshold in running deviations) and decay (of the running "
                "mean and variance)",
                adaptive,
                "pass e.g. adaptive={'c': 1.0, 'decay': 0.9}: the threshold needs the EMA it is measured against",
            )
        c, decay = adaptive["c"], adaptive["decay"]
        if not _number(c):
            _fail("adaptive.c", "a finite number", c, "pass e.g. c=1.0 (perturb when ||g||^2 >= mean + 1 std)")
        if not (_number(decay) and 0 <= decay < 1):
            _fail("adaptive.decay", "0 <= decay < 1", decay, "pass e.g. decay=0.9 (AE-SAM's delta)")
        c, decay = float(c), float(decay)
    if epochs is not None and start >= epochs:
        _fail(
            "start_epoch",
            f"start_epoch < the run's epochs ({epochs})",
            start,
            "a schedule that never starts never perturbs: use method none, or start earlier",
        )
    return Schedule(
        start_epoch=start,
        start_fraction=float(schedule["start_fraction"]) if "start_fraction" in schedule and epochs is None else None,
        every=every,
        probability=float(probability),
        adaptive_c=c,
        adaptive_decay=decay,
    )
