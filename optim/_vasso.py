"""VaSSO (Li & Giannakis, NeurIPS 2023): SAM whose adversary is an EMA of the stochastic gradients, a variance-suppressed
ascent direction."""

from __future__ import annotations

from typing import Unpack

import torch

from ._method import StepKeywords, group_by_device_dtype
from ._sam import TwoPass
from ._specs import registered

__all__ = ["VaSSO"]


@registered
class VaSSO(TwoPass):
    """VaSSO (docs/algorithms.md, "VaSSO"): ``d_t = (1 - theta) d_{t-1} + theta g_t`` with ``d_0 = g_0`` (the
    official code's start), ``eps = rho d_t / (||d_t|| + 1e-12)``; pass 2 at ``w + eps`` gives the update gradient,
    as in SAM. ``theta = 1`` is SAM exactly; ``rho = 0`` the base optimizer. ``d`` is written only once the step is
    known to be taken (an fp16 overflow leaves it as it was), in true units; over the parameters in scope. Under DDP
    with per-replica perturbation each replica keeps the EMA of its own pass 1 gradients.
    """

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        rho: float = 0.1,
        theta: float = 0.4,
        **common: Unpack[StepKeywords],
    ):
        super().__init__(base_optimizer, p=2, adaptive=False, **common)
        knobs = self.spec.check_knobs(rho=rho, theta=theta)
        self.rho, self.theta = knobs["rho"], knobs["theta"]
        self._d: dict[torch.Tensor, torch.Tensor] = {}  # param -> d_{t-1}, true units
        self._d_now: dict[torch.Tensor, torch.Tensor] = {}  # param -> this step's d_t (scaled), until taken
        self._pending: tuple[list[torch.Tensor], float] = ([], 1.0)

    def _rho(self) -> float:
        return self.rho

    @torch.no_grad()
    def _direction(self) -> None:
        params = [p for p in self._params_with_grad() if self._in_scope(p)]
        scale = 1.0 if self.scaler is None else float(self.scaler.get_scale())
        with_d = [p for p in params if p in self._d]
        for gs, dd in group_by_device_dtype([p.grad for p in with_d], [self._d[p] for p in with_d]):
            torch._foreach_mul_(gs, self.theta)
            torch._foreach_add_(gs, dd, alpha=(1.0 - self.theta) * scale)  # d_t = (1 - theta) d_{t-1} + theta g_t
        keep = [self._buffer(self._d_now, p) for p in params]
        for ks, gs in group_by_device_dtype(keep, [p.grad for p in params]):
            torch._foreach_copy_(ks, gs)
        self._pending = (params, scale)

    @torch.no_grad()
    def second_step(self) -> bool:
        skipped = super().second_step()
        (params, scale), self._pending = self._pending, ([], 1.0)
        if not skipped and params:
            if scale == 1.0:
                # Into d's own buffers, kept from step to step: one copy per (device, dtype), no allocation.
                for dst, src in group_by_device_dtype([self._buffer(self._d, p) for p in params],
                                                      [self._d_now[p] for p in params]):  # fmt: skip
                    torch._foreach_copy_(dst, src)
            else:
                for p in params:
                    self._d[p] = self._d_now[p] / scale
        return skipped

    def _method_state(self) -> dict:
        return {"d": self._indexed(self._d)}

    def _load_method_state(self, state: dict) -> None:
        self._d = self._by_param(state.get("d", {}))

    def extra_state_bytes(self) -> int:
        # Saved w, d, and this step's d held until the step is taken.
        return 3 * super().extra_state_bytes()
