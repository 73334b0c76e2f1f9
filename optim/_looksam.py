"""LookSAM (Liu et al. 2022): a SAM step every k-th step, the stored orthogonal direction g_v reused in between; k=1 is SAM."""

from __future__ import annotations

from collections.abc import Callable
from typing import Unpack

import torch

from ._method import (
    Forward,
    StepKeywords,
    StepOutput,
    global_norm,
    group_by_device_dtype,
)
from ._sam import TwoPass, nonzero
from ._specs import registered

__all__ = ["LookSAM"]


@registered
class LookSAM(TwoPass):
    """Every k-th step (steps 0, k, 2k, ...): two passes give g and the SAM gradient g_s, the update uses g_s,
    and ``g_v = g_s - (<g_s, g>/||g||^2) g`` is stored. Other steps: ONE pass, update with
    ``g + alpha (||g|| / ||g_v||) g_v``. Norms and projections are global, a missing gradient counts as
    zero in them, and a zero ``g_v`` stays zero (so ``rho = 0`` is the base optimizer exactly). Over N steps
    the model is evaluated N + ceil(N/k) times, through ``train_step`` and ``step(closure)`` alike.

    A step skipped for an fp16 overflow does not count: the stored g_v and the step counter are left as
    they were, so the next step is the same kind of step again.

    Under DDP with per-replica perturbation, g (pass 1) is local, so g_v is averaged over replicas once
    per k steps; otherwise replicas would apply different updates on the one-pass steps.
    """

    _keep_g = True

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        rho: float = 0.1,
        k: int = 5,
        alpha: float = 0.7,
        **common: Unpack[StepKeywords],
    ):
        super().__init__(
            base_optimizer,
            p=2,
            adaptive=False,
            **common,
        )
        knobs = self.spec.check_knobs(rho=rho, k=k, alpha=alpha)
        self.rho, self.k, self.alpha = knobs["rho"], knobs["k"], knobs["alpha"]
        self._step = 0
        self._gv: dict[torch.Tensor, torch.Tensor] = {}  # param -> stored g_v (in _gv_buf)
        self._gv_buf: dict[torch.Tensor, torch.Tensor] = {}
        self._gv_norm: torch.Tensor | None = None
        self._pending: tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor] | None = None
        # _reuse's (the g_v dict they were built from, its (params, g_v) lists per device and dtype).
        self._gv_groups: tuple[dict, list] | None = None

    def _rho(self) -> float:
        return self.rho

    def _sam_step_due(self) -> bool:
        return self._step % self.k == 0 or not self._gv

    @torch.no_grad()
    def _combine(self) -> None:
        """On a SAM step: ``p.grad`` (g_s) stays the update; g_v is formed in pass 1's g buffers and becomes
        the stored one in ``second_step`` only if the step was not skipped."""
        g_of = self._g
        # Missing gradients count as zero (docs/algorithms.md): g_v covers every parameter with a gradient
        # in either pass, and all norms run over that one set.
        params = [p for p in self._params() if p.grad is not None or p in g_of]
        if not params:
            self._pending = None
            return
        gs = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        g = [g_of[p] if p in g_of else self._buffer(self._gbuf, p).zero_() for p in params]
        gs_norm = global_norm(gs)
        g_norm = self._g_norm.to(gs_norm)
        for gg, gss in group_by_device_dtype(g, gs):
            torch._foreach_sub_(gg, gss)  # g - g_s
        d_norm = global_norm(g)
        # <g_s, g> from norms, as in GSAM: (||g_s||^2 + ||g||^2 - ||g_s - g||^2)/2, over one parameter set.
        dot = 0.5 * (gs_norm.square() + g_norm.square() - d_norm.square())
        # No +1e-12: with rho = 0, g_s == g gives c == 1 and g_v == 0 exactly; with g == 0, c = 0, g_v = g_s.
        c = dot / nonzero(g_norm.square())
        # g_v = g_s - c g = c (g_s - g) + (1 - c) g_s = lerp(g_s - g, g_s, 1 - c), in place in g's buffers.
        for gg, gss in group_by_device_dtype(g, gs):
            torch._foreach_neg_(gg)
            torch._foreach_lerp_(gg, gss, (1.0 - c).to(device=gg[0].device, dtype=gg[0].dtype))
        if not self.global_perturbation:
            self._all_reduce_mean(g)
        self._pending = (params, g, global_norm(g))

    @torch.no_grad()
    def second_step(self) -> bool:
        skipped = super().second_step()
        pending, self._pending = self._pending, None
        if not skipped and pending is not None:  # on a skipped step the stored g_v stays as it was
            params, gv_new, norm = pending
            gv = [self._buffer(self._gv_buf, p) for p in params]
            for dst, src in group_by_device_dtype(gv, gv_new):
                torch._foreach_copy_(dst, src)
            self._gv = dict(zip(params, gv))
            self._gv_norm = norm
        return skipped

    @torch.no_grad()
    def _reuse(self) -> None:
        """One-pass step: ``p.grad <- g + alpha (||g|| / ||g_v||) g_v``.

        A parameter with a stored g_v but no gradient now has g = 0 there, so it moves along g_v alone
        (frozen parameters, ``requires_grad=False``, are left alone). A zero g_v adds nothing.
        """
        if not self._gv:
            return
        coef = self.alpha * global_norm([p.grad for p in self._params_with_grad()]) / nonzero(self._gv_norm)
        if any(v.dtype != p.dtype or v.device != p.device for p, v in self._gv.items()):
            self._cast_gv()
        if self._gv_groups is None or self._gv_groups[0] is not self._gv:
            # Grouped once per stored g_v (it changes every k steps at most), not on every one-pass step.
            self._gv_groups = (self._gv, group_by_device_dtype(list(self._gv), list(self._gv.values())))
        for ps, dirs in self._gv_groups[1]:
            grads = [p.grad for p in ps]
            if any(g is None for g in grads):
                kept = [(p, v) for p, v in zip(ps, dirs) if p.grad is not None or p.requires_grad]
                for p, _ in kept:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                grads, dirs = [p.grad for p, _ in kept], [v for _, v in kept]
                if not grads:
                    continue
            torch._foreach_add_(grads, torch._foreach_mul(dirs, coef.to(device=dirs[0].device, dtype=dirs[0].dtype)))

    @torch.no_grad()
    def _cast_gv(self) -> None:
        """The stored g_v (and its norm) in the dtype and on the device of its parameters, after a cast of the model
        (``model.double()``, ``.to(device)`` keep the parameter objects): as a method loaded after the cast has it."""
        gv = {}
        for p, v in self._gv.items():
            if v.dtype != p.dtype or v.device != p.device:
                v = self._gv_buf[p] = v.to(device=p.device, dtype=p.dtype)
            gv[p] = v
        self._gv = gv  # a new dict: _gv_groups regroups
        if self._gv_norm is not None and self._gv:
            self._gv_norm = self._gv_norm.to(next(iter(gv)).device)

    def train_step(
        self,
        forward: Forward,
        *,
        inputs: torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
        epoch: int = 0,
    ) -> StepOutput:
        if self._sam_step_due():
            out = super().train_step(forward, inputs=inputs, indices=indices, epoch=epoch)
        else:
            loss, logits, _, skipped = self._one_pass_step(forward, inputs, before_finish=self._reuse)
            out = StepOutput(loss=loss, logits=logits, perturbed_loss=None, extra_loss=None, rho=None, skipped=skipped)
        if not out.skipped:
            self._step += 1
        return out

    def step(self, closure: Callable[[], torch.Tensor]) -> torch.Tensor:
        """One step on the same schedule as ``train_step``: ``closure()`` (loss and backward) runs twice on
        a SAM step and once on the others; returns the clean loss."""
        self._check_closure(closure)
        if self._sam_step_due():
            loss, skipped = self._closure_two_pass(closure)
        else:
            self._zero_grad()
            with torch.enable_grad():
                loss = closure()
            self._reuse()
            skipped = self._finish()
            self._zero_grad()
        if not skipped:
            self._step += 1
        return loss

    @property
    def passes_per_step(self) -> float:
        return 1.0 + 1.0 / self.k

    def extra_state_bytes(self) -> int:
        # Saved w, the stored g_v, and pass 1's g held during a SAM step.
        return 3 * super().extra_state_bytes()

    def _method_state(self) -> dict:
        index = {p: i for i, p in enumerate(self._params())}
        return {
            "step": self._step,
            "g_v": {index[p]: t.detach().clone() for p, t in self._gv.items()},
            "g_v_norm": None if self._gv_norm is None else self._gv_norm.detach().clone(),
        }

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
