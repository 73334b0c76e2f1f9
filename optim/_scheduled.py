"""The scheduled method: a perturbing method run on the steps its Schedule names, the base optimizer's plain step on
the others (docs/algorithms.md, "Schedule")."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import torch
from torch import nn

from ._method import BaseOnly, Forward, Method, StepOutput
from ._schedule import ADAPTIVE_METHODS, Schedule

__all__ = ["Scheduled"]


class Scheduled:
    """``method`` on the steps ``schedule`` names; on the others ``BaseOnly``'s step (one pass, the base optimizer's
    step exactly) on the same base optimizer, scaler and model, and the method's own state does not move.

    The step count, the Bernoulli generator (``random.Random(torch.initial_seed())`` when built: every replica
    draws alike, the model's streams are untouched) and the adaptive gate's running mean and variance are in
    ``state_dict()``, so a resumed run takes the same steps; a step skipped for an fp16 overflow puts them back.

    It has Method's interface (and is registered as one) but none of its machinery: the steps are the method's or
    BaseOnly's, each with the keywords the method was built with.
    """

    perturbs = True

    def __init__(self, method: Method, schedule: Schedule):
        if schedule.start_fraction is not None:
            raise ValueError(
                f"schedule.start_fraction={schedule.start_fraction} needs the run's length to be turned into an epoch; "
                "pass create(..., epochs=) or schedule.start_epoch"
            )
        if not method.perturbs:
            raise ValueError(
                f"schedule must be unset for a method that does not perturb the weights, but got {schedule} for "
                f"{method.name}; drop optimizer.schedule (SAF and MESA start with e_start)"
            )
        if schedule.adaptive_c is not None and (
            method.name not in ADAPTIVE_METHODS or getattr(method, "m", None) is not None
        ):
            raise ValueError(
                f"schedule.adaptive must be unset for {method.name}"
                f"{' with m=' + str(method.m) if getattr(method, 'm', None) is not None else ''}: the gate looks at the "
                f"step's clean gradient, which only {', '.join(ADAPTIVE_METHODS)} (without m) compute whole before "
                "perturbing; use start_epoch, every or probability, or one of those methods"
            )
        self.method = method
        self.schedule = schedule
        self.name = method.name
        self.base_optimizer = method.base_optimizer
        self.model = method.model
        self._plain = BaseOnly(
            method.base_optimizer,
            model=method.model,
            grad_clip=method.grad_clip,
            scaler=method.scaler,
            accumulate=method.accumulate,
        )
        self._random = random.Random(torch.initial_seed())
        self._count = 0  # steps taken (not skipped)
        self._mean: float | None = None  # adaptive: running mean of ||g||^2
        self._var = 0.0  # adaptive: running variance of ||g||^2
        self._pending: tuple[float, float] | None = None  # adaptive: this step's (mean, var), kept if taken

    def _gate(self, sq_norm: float) -> bool:
        """AE-SAM's rule (Jiang et al. 2023): the running mean and variance move with this step's ``||g||^2`` first,
        then the step perturbs when ``||g||^2 >= mean + c * std``. The first step (no statistics) perturbs."""
        if not math.isfinite(sq_norm):  # an fp16 overflow: the plain step skips it; the statistics stay
            self._pending = None
            return False
        d = self.schedule.adaptive_decay
        if self._mean is None:
            mean, var = sq_norm, 0.0
        else:
            mean = d * self._mean + (1.0 - d) * sq_norm
            var = d * self._var + (1.0 - d) * (sq_norm - mean) ** 2
        self._pending = (mean, var)
        return sq_norm >= mean + self.schedule.adaptive_c * math.sqrt(var)

    def train_step(
        self,
        forward: Forward,
        *,
        inputs: torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
        epoch: int = 0,
    ) -> StepOutput:
        s = self.schedule
        state = self._random.getstate() if s.probability < 1.0 else None
        draw = self._random.random() if s.probability < 1.0 else 0.0  # one draw every step, due or not
        due = epoch >= s.start_epoch and self._count % s.every == 0 and draw < s.probability
        if due and s.adaptive_c is not None:
            self.method._gate = self._gate
            try:
                out = self.method.train_step(forward, inputs=inputs, indices=indices, epoch=epoch)
            finally:
                self.method._gate = None
            pending, self._pending = self._pending, None
            if not out.skipped and pending is not None:
                self._mean, self._var = pending
        elif due:
            out = self.method.train_step(forward, inputs=inputs, indices=indices, epoch=epoch)
        else:
            out = self._plain.train_step(forward, inputs=inputs, indices=indices, epoch=epoch)
        if out.skipped:  # the run continues as if the step never happened ("Mixed precision and skipped steps")
            if state is not None:
                self._random.setstate(state)
        else:
            self._count += 1
        return out

    @property
    def passes_per_step(self) -> float:
        """The method's passes on the steps it runs, one on the others, at the schedule's nominal share (no start
        epoch: the run length is the loop's); the loop records the share a trial had."""
        share = self.schedule.probability / self.schedule.every
        return share * self.method.passes_per_step + (1.0 - share)

    def compile_modules(self, compiler: Callable[[nn.Module], nn.Module]) -> None:
        self.method.compile_modules(compiler)

    def extra_state_bytes(self) -> int:
        return self.method.extra_state_bytes()

    def run_warnings(self, *, epochs: int, steps_per_epoch: int) -> list[str]:
        return self.method.run_warnings(epochs=epochs, steps_per_epoch=steps_per_epoch)

    def state_dict(self) -> dict:
        return {
            **self.method.state_dict(),
            "schedule": {
                "count": self._count,
                "random": self._random.getstate(),
                "mean": self._mean,
                "var": self._var,
            },
        }

    def load_state_dict(self, state: dict) -> None:
        self.method.load_state_dict(state)
        own = state.get("schedule")
        if own is None:
            raise ValueError(
                f"the checkpoint holds no schedule state, but {self.name} runs on a schedule ({self.schedule}); "
                "resume with the schedule the run was trained with"
            )
        self._count = int(own["count"])
        version, internal, gauss = own["random"]
        self._random.setstate((version, tuple(internal), gauss))
        self._mean = own["mean"]
        self._var = float(own["var"])

    def __repr__(self) -> str:
        return f"Scheduled({self.method!r}, {self.schedule})"


Method.register(Scheduled)
