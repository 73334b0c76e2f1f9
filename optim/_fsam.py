"""Friendly SAM (Li et al., CVPR 2024): SAM whose perturbation drops the full-gradient component, estimated by an EMA of past gradients."""

from __future__ import annotations

from typing import Unpack

import torch

from ._method import StepKeywords, group_by_device_dtype
from ._sam import TwoPass
from ._specs import registered

__all__ = ["FriendlySAM"]


@registered
class FriendlySAM(TwoPass):
    """F-SAM, the paper's Algorithm 1 (docs/algorithms.md, "F-SAM"):

    ``m_t = lmbda m_{t-1} + (1 - lmbda) g_t`` (``m_{-1} = 0``, no bias correction), ``d_t = g_t - sigma m_t``,
    ``eps = rho d_t / (||d_t|| + 1e-12)``; pass 2 at ``w + eps`` gives the update gradient, as in SAM.

    ``d_t`` is formed as ``(1 - sigma (1 - lmbda)) g_t - sigma lmbda m_{t-1}``, so ``m`` is written only once the
    step is known to be taken (an fp16 overflow leaves it as it was); pass 1's ``g`` is kept until then.
    ``sigma (1 - lmbda) < 1`` is required (the registry's relation; otherwise the batch gradient's share of
    ``d_t`` is not positive). ``sigma = 0`` is SAM exactly; ``rho = 0`` the base optimizer. Under DDP with per-replica perturbation each
    replica keeps the EMA of its own pass 1 gradients (its own stochastic-noise estimate).
    """

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        rho: float = 0.05,
        sigma: float = 1.0,
        lmbda: float = 0.6,
        **common: Unpack[StepKeywords],
    ):
        super().__init__(
            base_optimizer,
            p=2,
            adaptive=False,
            **common,
        )
        knobs = self.spec.check_knobs(rho=rho, sigma=sigma, lmbda=lmbda)
        self.rho, self.sigma, self.lmbda = knobs["rho"], knobs["sigma"], knobs["lmbda"]
        self._m: dict[torch.Tensor, torch.Tensor] = {}  # param -> EMA of its pass 1 gradients
        self._g_now: dict[torch.Tensor, torch.Tensor] = {}  # param -> this step's g, until the step is taken
        # The params whose EMA this step moves once it is taken, and the loss scale their g carries.
        self._pending: tuple[list[torch.Tensor], float] = ([], 1.0)

    def _rho(self) -> float:
        return self.rho

    @torch.no_grad()
    def _direction(self) -> None:
        params = [p for p in self._params_with_grad() if self._in_scope(p)]  # eps and m over the scope alone
        grads = [p.grad for p in params]
        keep = [self._buffer(self._g_now, p) for p in params]
        # m is kept in the units of the true gradient: under fp16 the gradients carry the loss scale, which
        # changes between steps (one host read of it, fp16 only).
        scale = 1.0 if self.scaler is None else float(self.scaler.get_scale())
        for ks, gs in group_by_device_dtype(keep, grads):
            torch._foreach_copy_(ks, gs)
            torch._foreach_mul_(gs, 1.0 - self.sigma * (1.0 - self.lmbda))
        with_m = [p for p in params if p in self._m]
        if with_m:  # m_{-1} = 0 elsewhere
            for gs, mm in group_by_device_dtype([p.grad for p in with_m], [self._m[p] for p in with_m]):
                torch._foreach_add_(gs, mm, alpha=-self.sigma * self.lmbda * scale)  # d_t = g_t - sigma m_t
        self._pending = (params, scale)

    @torch.no_grad()
    def second_step(self) -> bool:
        skipped = super().second_step()
        (params, scale), self._pending = self._pending, ([], 1.0)
        if not skipped and params:
            for p in params:
                if p not in self._m:
                    self._m[p] = torch.zeros_like(p, memory_format=torch.preserve_format)
            ms = [self._m[p] for p in params]
            gs = [self._g_now[p] for p in params]
            for mm, gg in group_by_device_dtype(ms, gs):
                if scale != 1.0:
                    torch._foreach_div_(gg, scale)
                torch._foreach_lerp_(mm, gg, 1.0 - self.lmbda)  # m_t = lmbda m_{t-1} + (1 - lmbda) g_t
        return skipped

    def extra_state_bytes(self) -> int:
        # Saved w, the EMA m, and pass 1's g held until the step is taken.
        return 3 * super().extra_state_bytes()

    def _method_state(self) -> dict:
        return {"m": self._indexed(self._m)}

    def _load_method_state(self, state: dict) -> None:
        self._m = self._by_param(state.get("m", {}))
