"""ESAM (Du et al., ICLR 2022): SAM with Stochastic Weight Perturbation (beta) and Sharpness-sensitive Data Selection (gamma)."""

from __future__ import annotations

import math
import random
from typing import Unpack

import torch

from ._method import Forward, StepKeywords, StepOutput, batch_rows, split_rows
from ._sam import TwoPass
from ._specs import registered

__all__ = ["ESAM"]


@registered
class ESAM(TwoPass):
    """Efficient SAM, the paper's Algorithm 1 (docs/algorithms.md, "ESAM"):

    - SWP: each trainable parameter tensor is drawn into the perturbed set ``S`` with probability ``beta``
      (one ``random.Random`` draw per tensor, in the base optimizer's parameter order, from a generator of the
      method's own seeded with ``torch.initial_seed()`` when built: replicas draw alike, the model's random
      streams are untouched, no device sync; a skipped step puts the generator back); pass 1 computes gradients for ``S`` only, and
      ``eps = (rho / beta) g_S / (||g_S|| + 1e-12)`` on ``S``, zero elsewhere (zero everywhere when no tensor of
      ``S`` reaches the loss).
    - SDS: pass 1 also gives each sample's loss ``l_i(w)``; a no-grad forward at ``w + eps`` gives
      ``l_i(w + eps)``; pass 2 (forward+backward at ``w + eps``) runs on the ``round(gamma * B)`` samples
      with the largest ``l_i(w + eps) - l_i(w)`` only, and its gradient updates every parameter.

    ``beta = 1, gamma = 1`` is SAM exactly (no draw, no selection forward). Needs a
    ``forward(rows, reduction="none")`` when ``gamma < 1``.
    """

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        rho: float = 0.05,
        beta: float = 0.6,
        gamma: float = 0.5,
        **common: Unpack[StepKeywords],
    ):
        super().__init__(
            base_optimizer,
            p=2,
            adaptive=False,
            **common,
        )
        knobs = self.spec.check_knobs(rho=rho, beta=beta, gamma=gamma)
        self.rho, self.beta, self.gamma = knobs["rho"], knobs["beta"], knobs["gamma"]
        self._random = random.Random(torch.initial_seed())
        self._frozen_pass = False  # pass 1 is running with the left-out tensors' requires_grad off

    def _rho(self) -> float:
        return self.rho / self.beta

    def _draw(self) -> list[torch.Tensor]:
        """The trainable tensors left out of this step's perturbation: those outside the scope, and those of the
        scope the draw leaves out (none when beta = 1). One draw per tensor in scope (docs/algorithms.md, "Scope")."""
        params, scope = self._params(), self._scope
        if scope is None:  # scope 'all': nothing outside it (the common case, without a membership test per tensor)
            if self.beta >= 1.0:
                return []
            draw, beta = self._random.random, self.beta
            return [p for p in params if p.requires_grad and not draw() < beta]
        outside = [p for p in params if p.requires_grad and p not in scope]
        if self.beta >= 1.0:
            return outside
        return outside + [p for p in params if p.requires_grad and p in scope and not self._random.random() < self.beta]

    def _backward(self, loss: torch.Tensor) -> None:
        # Pass 1 with the left-out tensors frozen: when no drawn tensor reaches the loss (all left out, or only
        # tensors the forward never uses drawn), g_S = 0, so eps = 0 (docs/algorithms.md, "ESAM") and there is
        # nothing to differentiate; backward() would raise on a loss without a graph.
        if self._frozen_pass and not loss.requires_grad:
            return
        super()._backward(loss)

    def _can_skip_gradients(self) -> bool:
        # Switching requires_grad off saves the backward work for the left-out tensors, the point of SWP. Not
        # when pass 1 is synced by DDP (its reducer expects every gradient) or the model is compiled (a
        # requires_grad change recompiles it): then all gradients are computed and the left-out ones dropped.
        ddp = self._ddp()
        compiled = hasattr(ddp.module if ddp is not None else self.model, "_orig_mod")
        return not (ddp is not None and self.global_perturbation) and not compiled

    def train_step(
        self,
        forward: Forward,
        *,
        inputs: torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
        epoch: int = 0,
    ) -> StepOutput:
        n = batch_rows(inputs)
        select = self.gamma < 1.0
        # Only an fp16 overflow skips a step (no scaler: never), and a skipped step puts the draws back.
        drawn_from = self._random.getstate() if self.scaler is not None else None
        left_out = self._draw()
        frozen = left_out if self._can_skip_gradients() else []
        self._zero_grad()
        for p in frozen:
            p.requires_grad_(False)
        self._frozen_pass = bool(frozen)
        try:
            loss, logits, before, _ = self._pass(forward, local=not self.global_perturbation, n=n, per_sample=select)
        finally:
            self._frozen_pass = False
            for p in frozen:
                p.requires_grad_(True)
        for p in left_out:
            p.grad = None  # not perturbed: eps is zero there ("Missing gradients")
        self.first_step()
        local2 = self._local_pass2 and not self.global_perturbation
        if select:
            n = before.numel()
            after = self._losses_at_perturbed(forward, n)
            k = min(n, max(1, math.floor(self.gamma * n + 0.5)))
            rows = torch.topk(after - before.to(after), k, sorted=False).indices.sort().values
            perturbed_loss = after.mean()
            self._pass(forward, local=local2, rows=rows)
        else:
            perturbed_loss, _, _, _ = self._pass(forward, local=local2, n=n)
        skipped = self.second_step()
        if skipped and drawn_from is not None:  # method state moves only on a step taken ("Mixed precision and
            self._random.setstate(drawn_from)  # skipped steps")
        return StepOutput(
            loss=loss,
            logits=logits,
            perturbed_loss=perturbed_loss,
            extra_loss=None,
            rho=self._last_rho,
            skipped=skipped,
            perturbed=True,
            passes=self.passes_per_step,
        )

    @torch.no_grad()
    def _losses_at_perturbed(self, forward: Forward, n: int) -> torch.Tensor:
        """Every sample's loss at ``w + eps`` (no graph), in the step's micro-batches."""
        out = []
        for rows in split_rows(n, min(self.accumulate, n)):
            per, _ = forward(rows if self.accumulate > 1 else None, reduction="none")
            out.append(per.detach().float() if per.dtype in (torch.float16, torch.bfloat16) else per.detach())
        return torch.cat(out) if len(out) > 1 else out[0]

    @property
    def passes_per_step(self) -> float:
        # Pass 1, plus (gamma < 1) a no-grad forward (about a third of a pass) and pass 2 on a gamma share;
        # SWP's saving in pass 1's backward depends on the model and is left to the benchmark.
        return 2.0 if self.gamma >= 1.0 else 1.0 + 1.0 / 3.0 + self.gamma

    def _method_state(self) -> dict:
        return {"random": self._random.getstate()}

    def _load_method_state(self, state: dict) -> None:
        if "random" in state:
            version, internal, gauss = state["random"]
            self._random.setstate((version, tuple(internal), gauss))
