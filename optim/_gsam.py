"""GSAM (Zhuang et al. 2022): SAM plus an ascent along g's component orthogonal to g_p; alpha=0 with rho_max == rho_min reduces it to SAM exactly."""

from __future__ import annotations

import math

import torch
from torch import nn

from ._method import check, global_norm, group_by_device_dtype
from ._sam import _EPS, TwoPass, _check_rho

__all__ = ["GSAM"]


class GSAM(TwoPass):
    """Surrogate-gap guided SAM.

    Update direction (Algorithm 1, step 4): ``g_gsam = g_p - alpha (g - <g, g_p_hat> g_p_hat)``,
    ``g_p_hat = g_p / ||g_p||``, with plain norms even when the perturbation is adaptive. Radius
    (step 0): ``rho_t = rho_min + (rho_max - rho_min)(lr_t - lr_min)/(lr_max - lr_min)`` from the base
    optimizer's actual current lr (param group 0); ``lr_max=None`` is that group's initial lr.
    ``alpha=0`` and ``rho_max == rho_min`` give SAM exactly.

    Under DDP both passes are per-replica, the combination is formed locally, then ONE all-reduce of
    ``g_gsam`` (ALGORITHMS.md); with ``global_perturbation=True`` both passes are synced instead.
    """

    _keep_g = True
    _local_pass2 = True

    def __init__(self, base_optimizer: torch.optim.Optimizer, rho_max: float = 0.1, rho_min: float = 0.1,
                 alpha: float = 0.3, lr_max: float | None = None, lr_min: float = 0.0, adaptive: bool = False,
                 eta: float = 0.01, *, model: nn.Module | None = None, grad_clip: float | None = None,
                 scaler: torch.amp.GradScaler | None = None, global_perturbation: bool = False):
        super().__init__(base_optimizer, p=2, adaptive=adaptive, eta=eta, model=model, grad_clip=grad_clip,
                         scaler=scaler, global_perturbation=global_perturbation)
        self.rho_max = _check_rho("rho_max", rho_max)
        self.rho_min = _check_rho("rho_min", rho_min)
        check(self.rho_min <= self.rho_max, "rho_min", "rho_min <= rho_max", rho_min,
              f"pass rho_min <= rho_max={rho_max} (equal values give a constant radius)")
        check(isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha >= 0, "alpha", "0 <= alpha < inf",
              alpha, "pass a non-negative ascent weight such as alpha=0.3 (alpha=0 is SAM)")
        self.alpha = float(alpha)
        group0 = base_optimizer.param_groups[0]
        if lr_max is None:
            lr_max = float(group0.get("initial_lr", group0["lr"]))
        check(isinstance(lr_min, (int, float)) and math.isfinite(lr_min) and lr_min >= 0, "lr_min",
              "0 <= lr_min < inf", lr_min, "pass the schedule's final lr, e.g. lr_min=0.0")
        check(isinstance(lr_max, (int, float)) and math.isfinite(lr_max) and lr_max >= lr_min, "lr_max",
              "lr_max >= lr_min", lr_max, f"pass the schedule's peak lr (>= lr_min={lr_min}), or None for the base optimizer's lr")
        self.lr_max = float(lr_max)
        self.lr_min = float(lr_min)
        self.rho_t = self._rho()
        self.name = "gsam"

    def _rho(self) -> float:
        """rho_t from the actual current lr (a Python float: no device sync)."""
        if self.rho_max == self.rho_min or self.lr_max == self.lr_min:
            rho = self.rho_max
        else:
            lr = float(self.base_optimizer.param_groups[0]["lr"])
            rho = self.rho_min + (self.rho_max - self.rho_min) * (lr - self.lr_min) / (self.lr_max - self.lr_min)
        self.rho_t = rho
        return rho

    @torch.no_grad()
    def _combine(self) -> None:
        params = self._params_with_grad()
        if self.alpha != 0.0 and params:
            gp = [p.grad for p in params]
            # A parameter with a gradient only in pass 2 has g = 0 there.
            g = [self._g[p] if p in self._g else torch.zeros_like(p.grad) for p in params]
            # <g, g_p> from norms (||g||^2 + ||g_p||^2 - ||g - g_p||^2)/2: two foreach norms instead of one
            # small kernel per tensor. The error (~1e-7 (||g||^2+||g_p||^2) in fp32) is of the same order
            # as a direct fp32 dot's, since g and g_p are close.
            gp_norm = global_norm(gp)
            for gs, gps in group_by_device_dtype(g, gp):
                torch._foreach_sub_(gs, gps)  # g becomes d = g - g_p (g itself is no longer needed)
            d = g
            d_norm = global_norm(d)
            g_norm = self._g_norm.to(gp_norm)
            dot = 0.5 * (g_norm.square() + gp_norm.square() - d_norm.square())
            c = dot / (gp_norm + _EPS).square()
            # g_gsam = g_p - alpha (g - c g_p) = (1 - alpha + alpha c) g_p - alpha d
            coef = 1.0 - self.alpha + self.alpha * c
            for gps, ds in group_by_device_dtype(gp, d):
                torch._foreach_mul_(gps, coef.to(device=gps[0].device, dtype=gps[0].dtype))
                torch._foreach_add_(gps, ds, alpha=-self.alpha)
        if not self.global_perturbation:
            self._all_reduce_mean([p.grad for p in params])

    def _method_state(self) -> dict:
        return {"rho_t": self.rho_t}

    def _load_method_state(self, state: dict) -> None:
        self.rho_t = state.get("rho_t", self.rho_t)

    def extra_state_bytes(self) -> int:
        # Saved w plus pass 1's g held until the combination.
        return 2 * super().extra_state_bytes()
