"""GAM (Zhang et al., CVPR 2023): gradient-norm aware minimisation, first-order flatness, in the authors' released
four-pass form (the Hessian-vector products of the paper's Algorithm 1 replaced by finite differences of gradients)."""

from __future__ import annotations

from typing import Unpack

import torch

from ._knobs import check_m_sharpness
from ._method import Forward, Method, StepKeywords, StepOutput, batch_rows, global_norm, group_by_device_dtype
from ._sam import nonzero
from ._specs import registered

__all__ = ["GAM"]

_EPS = 1e-12  # the ascent directions' guard, as SAM's (docs/algorithms.md, "SAM")


@registered
class GAM(Method):
    """Accelerated GAM (docs/algorithms.md, "GAM"): four forward+backward passes on the step's batch, ``w`` saved and
    copied back exactly, with ``u/||u||`` read as ``u / (||u|| + 1e-12)`` over the parameters in scope:

    - ``g0 = grad L(w)``; ``g1 = grad L(w + rho' g0/||g0||)`` (SAM's point at radius ``rho'``);
    - ``w2 = w + rho (g1 - g0)/||g1 - g0||`` (``(g1 - g0)/rho'`` approximates the gradient of ``||grad L||``);
    - ``g2 = grad L(w2)``; ``g3 = grad L(w2 + rho' g2/||g2||)``;
    - ``h = alpha g1 + (1 - alpha) g3`` and ``p = g0 + (1 - beta) g2``; the base optimizer steps with
      ``h - gamma (p - (<p, h>/||h||^2) h)`` (over every parameter).

    ``rho' = 0``, ``alpha = 1``, ``gamma = 0`` is the base optimizer exactly (``g1`` is then the gradient at ``w``).
    BatchNorm statistics are pass 1's. A missing gradient counts as zero. An fp16 overflow in any pass skips the
    step. Under DDP the four passes are per replica and the update is averaged in one all-reduce (the authors' code),
    unless ``global_perturbation``, where every pass is synced.

    ``m`` (m-sharpness, docs/algorithms.md): the batch (each replica's) is split into groups of ``m`` samples, each
    group's four passes and combination are its own (its norms and ``<p, h>`` over its own gradients), and the base
    optimizer steps with the size-weighted mean of the groups' combinations; ``m=None`` or ``m >= batch`` is GAM.
    """

    perturbs = True
    needs_model = True

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        rho: float = 0.2,
        rho_prime: float = 0.03,
        alpha: float = 0.1,
        beta: float = 0.1,
        gamma: float = 0.05,
        m: int | None = None,
        **common: Unpack[StepKeywords],
    ):
        super().__init__(base_optimizer, **common)
        knobs = self.spec.check_knobs(rho=rho, rho_prime=rho_prime, alpha=alpha, beta=beta, gamma=gamma, m=m)
        check_m_sharpness(m, self.global_perturbation)
        self.rho, self.rho_prime, self.alpha, self.beta, self.gamma, self.m = (
            knobs[k] for k in ("rho", "rho_prime", "alpha", "beta", "gamma", "m")
        )
        self._saved: dict[torch.Tensor, torch.Tensor] = {}  # param -> w

    def _trainable(self) -> list[torch.Tensor]:
        return [p for p in self._params() if p.requires_grad]

    @torch.no_grad()
    def _save(self, params: list[torch.Tensor]) -> None:
        saved = []
        for p in params:
            buf = self._saved.get(p)
            if buf is None or buf.shape != p.shape or buf.dtype != p.dtype or buf.device != p.device:
                buf = self._saved[p] = torch.empty_like(p)
            saved.append(buf)
        for ss, ps in group_by_device_dtype(saved, params):
            torch._foreach_copy_(ss, ps)  # one launch per (device, dtype), not one per tensor

    @torch.no_grad()
    def _restore(self, params: list[torch.Tensor]) -> None:
        for ps, ss in group_by_device_dtype(params, [self._saved[p] for p in params]):
            torch._foreach_copy_(ps, ss)  # exact: the values of w come back

    @torch.no_grad()
    def _ascend(self, params: list[torch.Tensor], direction: list[torch.Tensor], radius: float) -> None:
        """``w <- w + radius u / (||u|| + 1e-12)`` over ``params``; nothing moves at ``radius = 0``."""
        if radius == 0.0 or not params:
            return
        scale = radius / (global_norm(direction) + _EPS)
        for ps, us in group_by_device_dtype(params, direction):
            torch._foreach_add_(ps, torch._foreach_mul(us, scale.to(device=us[0].device, dtype=us[0].dtype)))

    def _grads(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """The gradients of ``params`` (a missing one as zero), handed over without a copy; ``p.grad`` cleared."""
        out = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        self._zero_grad()
        return out

    def train_step(
        self,
        forward: Forward,
        *,
        inputs: torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
        epoch: int = 0,
    ) -> StepOutput:
        n = batch_rows(inputs)
        if self.m is not None and (n is None or self.m < n):
            if n is None:
                raise ValueError(
                    f"gam with m={self.m}: inputs= must be the batch tensor, to split it into groups of m samples; "
                    "pass train_step(forward, inputs=x, ...)"
                )
            return self._m_step(forward, n)
        local = not self.global_perturbation
        params = self._trainable()
        loss, logits, perturbed_loss, final, flags = self._four_passes(forward, params, local=local, n=n)
        with torch.no_grad():
            for p, u in zip(params, final):
                p.grad = u
            if local:
                self._all_reduce_mean(final)
        return self._step_with(loss, logits, perturbed_loss, flags)

    def _m_step(self, forward: Forward, n: int) -> StepOutput:
        """One GAM combination per group of m rows (each group's passes per replica), summed weighted by group size
        into the update gradient; one all-reduce of it under DDP, one base step."""
        params = self._trainable()
        acc: list[torch.Tensor] | None = None
        flags, losses, perturbed, logits_out = [], [], [], []
        for start in range(0, n, self.m):
            rows = slice(start, min(start + self.m, n))
            weight = (rows.stop - rows.start) / n
            loss, logits, ploss, final, found = self._four_passes(forward, params, local=True, rows=rows)
            with torch.no_grad():
                if acc is None:
                    acc = final
                    torch._foreach_mul_(acc, weight)
                else:
                    torch._foreach_add_(acc, final, alpha=weight)
            flags += found
            losses.append(loss * weight)
            perturbed.append(ploss * weight)
            logits_out.append(logits)
        with torch.no_grad():
            for p, u in zip(params, acc):
                p.grad = u
            self._all_reduce_mean(acc)
        return self._step_with(torch.stack(losses).sum(), torch.cat(logits_out), torch.stack(perturbed).sum(), flags)

    def _step_with(self, loss, logits, perturbed_loss, flags) -> StepOutput:
        """The base step with the combination in ``p.grad`` (skipped on an overflow in any pass)."""
        found = [f for f in flags if f is not None]
        skipped = self._finish(torch.stack(found).sum(0) if found else None)
        self._zero_grad()
        return StepOutput(
            loss=loss,
            logits=logits,
            perturbed_loss=perturbed_loss,  # at SAM's point of radius rho'
            extra_loss=None,
            rho=self.rho_prime,
            skipped=skipped,
            perturbed=True,
            passes=4.0,
        )

    def _four_passes(self, forward: Forward, params: list[torch.Tensor], *, local: bool, n=None, rows=None):
        """The four passes on ``rows`` of the batch (all of it when None) and their combination, ``w`` back in place
        and BatchNorm's statistics pass 1's; returns (loss, logits, perturbed loss, combination, overflow flags)."""
        scoped = [i for i, p in enumerate(params) if self._in_scope(p)]
        moved = [params[i] for i in scoped]
        flags = []
        self._zero_grad()
        loss, logits, _, _ = self._pass(forward, local=local, rows=rows, n=n)
        flags.append(self._nonfinite())
        self._bn.snapshot()
        g0 = self._grads(params)
        self._save(moved)
        self._ascend(moved, [g0[i] for i in scoped], self.rho_prime)
        perturbed_loss, _, _, _ = self._pass(forward, local=local, rows=rows, n=n)
        flags.append(self._nonfinite())
        g1 = self._grads(params)
        with torch.no_grad():
            self._restore(moved)
            diff = torch._foreach_sub([g1[i] for i in scoped], [g0[i] for i in scoped]) if moved else []
            self._ascend(moved, diff, self.rho)
            del diff
        self._pass(forward, local=local, rows=rows, n=n)
        flags.append(self._nonfinite())
        g2 = self._grads(params)
        self._ascend(moved, [g2[i] for i in scoped], self.rho_prime)
        self._pass(forward, local=local, rows=rows, n=n)
        flags.append(self._nonfinite())
        g3 = self._grads(params)
        with torch.no_grad():
            self._restore(moved)
            self._bn.restore()
            final = self._combine(g0, g1, g2, g3)
            del g0, g1, g2, g3
        return loss, logits, perturbed_loss, final, flags

    @torch.no_grad()
    def _combine(self, g0, g1, g2, g3) -> list[torch.Tensor]:
        """``h - gamma (p - (<p, h>/||h||^2) h)``, formed in g1's and g3's storage; ``<p, h>`` and ``||h||`` global."""
        h, p = g1, g0
        for hs, ts in group_by_device_dtype(h, g3):
            torch._foreach_mul_(hs, self.alpha)
            torch._foreach_add_(hs, ts, alpha=1.0 - self.alpha)  # h = alpha g1 + (1 - alpha) g3
        if self.gamma == 0.0:
            return h
        for ps, ts in group_by_device_dtype(p, g2):
            torch._foreach_add_(ps, ts, alpha=1.0 - self.beta)  # p = g0 + (1 - beta) g2
        acc = torch.float64 if any(t.dtype == torch.float64 for t in h) else torch.float32
        device = h[0].device if h else None
        if all(t.dtype == acc and t.device == device for t in (*p, *h)):
            # The same per-tensor products, in one foreach launch, then each tensor's sum as before.
            inner = torch.stack([t.sum() for t in torch._foreach_mul(p, h)]).sum()
        else:
            inner = torch.stack([(a.to(acc) * b.to(acc)).sum() for a, b in zip(p, h)]).sum()
        c = inner / nonzero(global_norm(h).to(acc).square())  # h = 0: no projection, p whole
        for ps, hs in group_by_device_dtype(p, h):
            torch._foreach_add_(ps, torch._foreach_mul(hs, (-c).to(device=hs[0].device, dtype=hs[0].dtype)))
            torch._foreach_add_(hs, ps, alpha=-self.gamma)  # h - gamma (p - c h)
        return h

    @property
    def passes_per_step(self) -> float:
        return 4.0

    def extra_state_bytes(self) -> int:
        trainable = sum(p.numel() * p.element_size() for p in self._trainable())
        # Saved w (in scope) and g0, g1, g2 kept across the passes.
        return sum(p.numel() * p.element_size() for p in self._trainable() if self._in_scope(p)) + 3 * trainable
