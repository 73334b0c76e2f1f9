"""GSAM (Zhuang et al. 2022): SAM plus an ascent along g's component orthogonal to g_p, with a radius that follows the lr schedule."""

from __future__ import annotations

from typing import Unpack

import torch

from ._method import StepKeywords, global_norm, group_by_device_dtype
from ._sam import TwoPass, nonzero
from ._specs import registered

__all__ = ["GSAM"]


@registered
class GSAM(TwoPass):
    """Surrogate-gap guided SAM.

    Update direction (Algorithm 1, step 4): ``g_gsam = g_p - alpha (g - <g, g_p_hat> g_p_hat)``,
    ``g_p_hat = g_p / ||g_p||``, with plain norms even when the perturbation is adaptive; a parameter
    without a gradient in a pass counts as zero there, so one with a pass 1 gradient only moves by
    ``-alpha g``. Radius (step 0): ``rho_t`` follows the schedule's multiplier ``s_t`` of the base lr,
    ``rho_min + (rho_max - rho_min)(s_t - s_min)/(s_max - s_min)`` clamped into ``[rho_min, rho_max]``,
    with ``lr_max``/``lr_min`` in units of param group 0's base lr (docs/algorithms.md, "GSAM").
    ``alpha=0`` and ``rho_max == rho_min`` give SAM exactly; ``rho_max = 0`` the base optimizer.

    Under DDP both passes are per-replica, the combination is formed locally, then ONE all-reduce of
    ``g_gsam``; with ``global_perturbation=True`` both passes are synced instead.
    """

    _keep_g = True
    _local_pass2 = True

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        rho_max: float = 0.1,
        rho_min: float = 0.1,
        alpha: float = 0.3,
        lr_max: float | None = None,
        lr_min: float = 0.0,
        adaptive: bool = False,
        eta: float = 0.01,
        **common: Unpack[StepKeywords],
    ):
        super().__init__(
            base_optimizer,
            p=2,
            adaptive=adaptive,
            eta=eta,
            **common,
        )
        knobs = self.spec.check_knobs(rho_max=rho_max, rho_min=rho_min, alpha=alpha, lr_max=lr_max, lr_min=lr_min)
        self.rho_max, self.rho_min, self.alpha = knobs["rho_max"], knobs["rho_min"], knobs["alpha"]
        self._lr_max = None if lr_max is None else float(lr_max)
        self.lr_min = knobs["lr_min"]
        # Each group's lr now: its base lr until a scheduler records one as ``initial_lr``.
        self._lr_at_init = [float(g["lr"]) for g in base_optimizer.param_groups]
        self.rho_t = self._rho()

    @property
    def lr_max(self) -> float:
        """The peak lr in units of param group 0's base lr: as given, else group 0's ``max_lr`` (set by
        OneCycleLR), else its base lr. Read at every step, so a scheduler built after the method counts."""
        if self._lr_max is not None:
            return self._lr_max
        group0 = self.base_optimizer.param_groups[0]
        return float(group0.get("max_lr", self._base_lr(0)))

    def _base_lr(self, i: int) -> float:
        group = self.base_optimizer.param_groups[i]
        if "initial_lr" in group:  # set by torch and timm schedulers: lr = initial_lr * multiplier
            return float(group["initial_lr"])
        return self._lr_at_init[i] if i < len(self._lr_at_init) else float(group["lr"])

    def multiplier(self) -> float:
        """The schedule's multiplier ``s_t`` of the base lr, the same for every group whatever its scaling.

        Read from the first group whose timm ``lr_scale`` is 1 (absent counts as 1): there ``lr = base *
        s_t`` under torch schedulers (which ignore ``lr_scale``) and timm ones (which multiply by it) alike.
        With layer decay, group 0 is usually the most decayed one, and its lr alone gave ``rho_t`` far below
        ``rho_max`` at the peak (docs/algorithms.md, "GSAM"). Without such a group, group 0's lr is divided
        by its ``lr_scale`` (timm's convention).
        """
        groups = self.base_optimizer.param_groups
        ref = next((i for i, g in enumerate(groups) if float(g.get("lr_scale", 1.0)) == 1.0), 0)
        base = self._base_lr(ref) * float(groups[ref].get("lr_scale", 1.0))
        return float(groups[ref]["lr"]) / base if base > 0 else 1.0

    def _rho(self) -> float:
        """rho_t from the schedule's position (a Python float: no device sync), clamped into [rho_min, rho_max]."""
        lr_max, lr_min, base0 = self.lr_max, self.lr_min, self._base_lr(0)
        if self.rho_max == self.rho_min or lr_max <= lr_min or base0 <= 0:
            rho = self.rho_max
        else:
            lr = self.multiplier() * base0  # the current lr in group 0's base units
            rho = self.rho_min + (self.rho_max - self.rho_min) * (lr - lr_min) / (lr_max - lr_min)
            rho = min(max(rho, self.rho_min), self.rho_max)
        self.rho_t = rho
        return rho

    @torch.no_grad()
    def _combine(self) -> None:
        if self.alpha != 0.0:
            # Missing gradients count as zero (docs/algorithms.md): a parameter with a pass 1 gradient only
            # gets g_p = 0, so that every norm below runs over the same set and it moves by -alpha g. Not
            # with alpha = 0, which must stay SAM (such a parameter is then not updated at all).
            for p in self._g:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        params = self._params_with_grad()
        if self.alpha != 0.0 and params:
            gp = [p.grad for p in params]
            # A parameter with a gradient only in pass 2 has g = 0 there.
            g = [self._g[p] if p in self._g else torch.zeros_like(p.grad) for p in params]
            # <g, g_p> from norms (||g||^2 + ||g_p||^2 - ||g - g_p||^2)/2: two foreach norms instead of one
            # small kernel per tensor. The error (~1e-7 (||g||^2+||g_p||^2) in fp32) is of the same order
            # as a direct fp32 dot's, since g and g_p are close. All three norms are over ``params``.
            gp_norm = global_norm(gp)
            for gs, gps in group_by_device_dtype(g, gp):
                torch._foreach_sub_(gs, gps)  # g becomes d = g - g_p (g itself is no longer needed)
            d = g
            d_norm = global_norm(d)
            g_norm = self._g_norm.to(gp_norm)
            dot = 0.5 * (g_norm.square() + gp_norm.square() - d_norm.square())
            # No +1e-12 here: with rho = 0, g_p == g gives c == 1 exactly and the update is g_p (the base
            # optimizer's); with g_p == 0 the projection is zero, and so is dot.
            c = dot / nonzero(gp_norm.square())
            # g_gsam = g_p - alpha (g - c g_p) = (1 - alpha (1 - c)) g_p - alpha d; the coefficient is
            # written so that c == 1 gives exactly 1.
            coef = 1.0 - self.alpha * (1.0 - c)
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
