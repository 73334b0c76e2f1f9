"""WSAM (Yue et al., KDD 2023): sharpness as a weighted regulariser, L + gamma/(1 - gamma) (L_SAM - L), its sharpness
step decoupled from the base optimizer by default."""

from __future__ import annotations

from typing import Unpack

import torch

from ._method import StepKeywords, group_by_device_dtype
from ._sam import TwoPass
from ._specs import registered

__all__ = ["WSAM"]


@registered
class WSAM(TwoPass):
    """Weighted SAM (docs/algorithms.md, "WSAM"). With ``alpha = gamma / (1 - gamma)``, pass 1's ``g`` and pass 2's
    ``g_p`` at ``w + rho g / (||g|| + 1e-12)``, the sharpness gradient is ``s = g_p - g``:

    - ``decouple=True`` (the paper's Algorithm 1): the base optimizer steps with ``g``, then ``w <- w - lr_t alpha s``
      (``lr_t`` each param group's current lr), so the regulariser skips the base optimizer's moments and decay;
    - ``decouple=False``: the base optimizer steps with ``g + alpha s``.

    ``gamma = 1/2`` (coupled) is SAM exactly; ``rho = 0`` or ``gamma = 0`` the base optimizer exactly. A missing
    gradient counts as zero in ``s``. Under DDP both passes are per replica and ``g`` and ``s`` (or the coupled
    combination) are averaged in one all-reduce; the sharpness step is skipped with the step on an fp16 overflow.
    """

    _keep_g = True
    _local_pass2 = True

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        rho: float = 0.05,
        gamma: float = 0.9,
        decouple: bool = True,
        **common: Unpack[StepKeywords],
    ):
        super().__init__(base_optimizer, p=2, adaptive=False, **common)
        knobs = self.spec.check_knobs(rho=rho, gamma=gamma, decouple=decouple)
        self.rho, self.gamma, self.decouple = knobs["rho"], knobs["gamma"], knobs["decouple"]
        self.alpha = self.gamma / (1.0 - self.gamma)
        self._sharp: dict[torch.Tensor, torch.Tensor] = {}  # param -> s = g_p - g, in true units
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []

    def _rho(self) -> float:
        return self.rho

    @torch.no_grad()
    def _combine(self) -> None:
        self._pending = []
        g_of = self._g
        params = [p for p in self._params() if p.grad is not None or p in g_of]
        if not params:
            return
        if self.decouple and self.scaler is not None:
            # p.grad becomes g below: pass 2's own overflow must be seen now, with pass 1's.
            found2 = self._nonfinite()
            if found2 is not None:
                self._found1 = found2 if self._found1 is None else self._found1 + found2
        for p in params:
            if p.grad is None:  # missing gradients count as zero (docs/algorithms.md, "Missing gradients")
                p.grad = torch.zeros_like(p)
        gp = [p.grad for p in params]
        g = [g_of[p] if p in g_of else torch.zeros_like(p) for p in params]
        if not self.decouple:
            for gps, gs in group_by_device_dtype(gp, g):
                torch._foreach_sub_(gps, gs)  # s
                torch._foreach_mul_(gps, self.alpha)
                torch._foreach_add_(gps, gs)  # g + alpha s
            if not self.global_perturbation:
                self._all_reduce_mean(gp)
            return
        sharp = [self._buffer(self._sharp, p) for p in params]
        for ss, gps, gs in group_by_device_dtype(sharp, gp, g):
            torch._foreach_copy_(ss, gps)
            torch._foreach_sub_(ss, gs)  # s = g_p - g
            torch._foreach_copy_(gps, gs)  # the base optimizer steps with g
        if self.scaler is not None:  # s carries the loss scale; the base step's gradient is unscaled by _finish
            torch._foreach_div_(sharp, float(self.scaler.get_scale()))
        if not self.global_perturbation:
            self._all_reduce_mean(gp + sharp)
        self._pending = list(zip(params, sharp))

    @torch.no_grad()
    def second_step(self) -> bool:
        skipped = super().second_step()
        pending, self._pending = self._pending, []
        if skipped or not pending:
            return skipped
        lr_of = {p: float(group["lr"]) for group in self.base_optimizer.param_groups for p in group["params"]}
        by_lr: dict[float, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        for p, s in pending:
            ps, ss = by_lr.setdefault(lr_of[p], ([], []))
            ps.append(p)
            ss.append(s)
        for lr, (ps, ss) in by_lr.items():
            for pb, sb in group_by_device_dtype(ps, ss):
                torch._foreach_add_(pb, sb, alpha=-lr * self.alpha)  # w <- w - lr_t alpha s
        return skipped

    def extra_state_bytes(self) -> int:
        # Saved w, pass 1's g, and s (decoupled).
        return (3 if self.decouple else 2) * super().extra_state_bytes()
