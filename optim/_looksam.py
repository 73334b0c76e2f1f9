"""LookSAM (Liu et al. 2022): a SAM step every k-th step, the stored orthogonal direction g_v reused in between; k=1 is SAM."""

from __future__ import annotations

import torch
from torch import nn

from ._method import Forward, StepOutput, check, global_norm, group_by_device_dtype
from ._sam import _EPS, TwoPass, _check_rho

__all__ = ["LookSAM"]


class LookSAM(TwoPass):
    """Every k-th step (steps 0, k, 2k, ...): two passes give g and the SAM gradient g_s, the update uses g_s,
    and ``g_v = g_s - (<g_s, g>/||g||^2) g`` is stored. Other steps: ONE pass, update with
    ``g + alpha (||g|| / ||g_v||) g_v``. Norms and projections are global. Over N steps the model is
    evaluated N + ceil(N/k) times.

    Under DDP with per-replica perturbation, g (pass 1) is local, so g_v is averaged over replicas once
    per k steps; otherwise replicas would apply different updates on the one-pass steps.
    """

    _keep_g = True

    def __init__(self, base_optimizer: torch.optim.Optimizer, rho: float = 0.1, k: int = 5, alpha: float = 0.7,
                 *, model: nn.Module | None = None, grad_clip: float | None = None,
                 scaler: torch.amp.GradScaler | None = None, global_perturbation: bool = False):
        super().__init__(base_optimizer, p=2, adaptive=False, model=model, grad_clip=grad_clip, scaler=scaler,
                         global_perturbation=global_perturbation)
        self.rho = _check_rho("rho", rho)
        check(isinstance(k, int) and not isinstance(k, bool) and k >= 1, "k", "k >= 1 (an integer)", k,
              "pass the SAM-step interval, e.g. k=5 (k=1 is plain SAM)")
        check(isinstance(alpha, (int, float)) and alpha >= 0 and alpha == alpha, "alpha", "alpha >= 0", alpha,
              "pass a non-negative weight for the stored direction, e.g. alpha=0.7")
        self.k = k
        self.alpha = float(alpha)
        self.name = "looksam"
        self._step = 0
        self._gv: dict[torch.Tensor, torch.Tensor] = {}  # param -> stored g_v (views of _gv_buf)
        self._gv_buf: dict[torch.Tensor, torch.Tensor] = {}
        self._gv_norm: torch.Tensor | None = None

    def _rho(self) -> float:
        return self.rho

    @torch.no_grad()
    def _combine(self) -> None:
        """On a SAM step: keep g_s as the update; store ``g_v`` (in persistent buffers, no allocation)."""
        params = self._params_with_grad()
        if not params:
            return
        gs = [p.grad for p in params]
        g = [self._g[p] if p in self._g else torch.zeros_like(p.grad) for p in params]
        gv = [self._buffer(self._gv_buf, p) for p in params]
        for gvs, gss, gg in group_by_device_dtype(gv, gs, g):
            torch._foreach_copy_(gvs, gss)
            torch._foreach_sub_(gvs, gg)  # d = g_s - g
        # <g_s, g> from norms, as in GSAM: (||g_s||^2 + ||g||^2 - ||g_s - g||^2)/2.
        gs_norm = global_norm(gs)
        d_norm = global_norm(gv)
        g_norm = self._g_norm.to(gs_norm)
        dot = 0.5 * (gs_norm.square() + g_norm.square() - d_norm.square())
        one_minus_c = 1.0 - dot / (g_norm + _EPS).square()
        # g_v = g_s - c g = (g_s - g) + (1 - c) g   (g's buffer is free to overwrite now)
        for gvs, gg in group_by_device_dtype(gv, g):
            torch._foreach_mul_(gg, one_minus_c.to(device=gg[0].device, dtype=gg[0].dtype))
            torch._foreach_add_(gvs, gg)
        if not self.global_perturbation:
            self._all_reduce_mean(gv)
        self._gv = dict(zip(params, gv))
        self._gv_norm = global_norm(gv)

    @torch.no_grad()
    def second_step(self) -> bool:
        skipped = super().second_step()
        if skipped:  # fp16 overflow: g_v may hold inf/nan; the next step recomputes it with two passes
            self._gv, self._gv_norm = {}, None
        return skipped

    def train_step(self, forward: Forward, *, inputs: torch.Tensor | None = None,
                   indices: torch.Tensor | None = None, epoch: int = 0) -> StepOutput:
        step = self._step
        self._step += 1
        if step % self.k == 0 or not self._gv:
            return super().train_step(forward, inputs=inputs, indices=indices, epoch=epoch)
        self._zero_grad()
        loss, logits = forward()
        self._backward(loss)
        with torch.no_grad():
            params = self._params_with_grad()
            g_all = [p.grad for p in params]
            pairs = [(p.grad, self._gv[p]) for p in params if p in self._gv]
            if pairs:
                coef = self.alpha * global_norm(g_all) / (self._gv_norm + _EPS)
                for gg, gv in group_by_device_dtype([a for a, _ in pairs], [b for _, b in pairs]):
                    torch._foreach_add_(gg, torch._foreach_mul(gv, coef.to(device=gv[0].device, dtype=gv[0].dtype)))
        skipped = self._finish()
        self._zero_grad()
        return StepOutput(loss=loss.detach(), logits=logits.detach(), perturbed_loss=None, extra_loss=None,
                          rho=None, skipped=skipped)

    @property
    def passes_per_step(self) -> float:
        return 1.0 + 1.0 / self.k

    def extra_state_bytes(self) -> int:
        # Saved w, the stored g_v, and pass 1's g held during a SAM step.
        return 3 * super().extra_state_bytes()

    def _method_state(self) -> dict:
        index = {p: i for i, p in enumerate(self._params())}
        return {"step": self._step,
                "g_v": {index[p]: t.detach().clone() for p, t in self._gv.items()},
                "g_v_norm": None if self._gv_norm is None else self._gv_norm.detach().clone()}

    def _load_method_state(self, state: dict) -> None:
        params = self._params()
        self._step = int(state.get("step", 0))
        self._gv = {}
        for i, t in state.get("g_v", {}).items():
            p = params[int(i)]
            self._gv[p] = self._buffer(self._gv_buf, p)
            self._gv[p].copy_(t)
        norm = state.get("g_v_norm")
        self._gv_norm = None if norm is None else norm.to(params[0].device).clone()

