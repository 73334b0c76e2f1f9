"""RWP and m-ARWP (Li et al., TMLR 2024): the gradient at a random, filter-normalised weight perturbation mixed with the
clean gradient, the perturbation's variance shrunk where past gradients were large; the two gradients independent."""

from __future__ import annotations

from typing import Unpack

import torch

from ._knobs import check_m_sharpness
from ._method import (
    Forward,
    Method,
    SeededDraws,
    StepKeywords,
    StepOutput,
    batch_rows,
    group_by_device_dtype,
)
from ._specs import registered

__all__ = ["RWP"]


@registered
class RWP(SeededDraws, Method):
    """m-ARWP (docs/algorithms.md, "RWP and m-ARWP"). One step on batch B, with ``F`` the running sum of squared
    perturbed gradients (zero at the start):

    - ``g = grad L(w; B)``, the clean gradient (skipped when ``lmbda = 1``: plain RWP, one pass);
    - ``eps ~ N(0, diag(s^2))`` with, for each filter ``i`` (row of dimension 0) of a tensor of two or more
      dimensions, ``s = sigma ||w_i|| / sqrt(1 + eta sum_i F)``, and for a 1-D tensor ``s = sigma ||w|| /
      sqrt(1 + eta F)`` (element-wise), over the trainable parameters in scope;
    - ``g_p = grad L(w + eps; B)``, ``w`` restored exactly, ``F <- beta F + g_p^2``;
    - the base optimizer steps with ``lmbda g_p + (1 - lmbda) g``.

    ``lmbda = 0`` is the base optimizer exactly (no draw, one pass); ``eta = 0`` is m-RWP (no adaptation).
    ``m``: one draw per group of ``m`` samples, each group's ``g_p`` from its own ``eps`` (docs/algorithms.md,
    "m-sharpness"). The draws come from a generator of the method's own per device, seeded with
    ``torch.initial_seed()`` when built (replicas draw alike; the model's random streams untouched): per (device,
    dtype), one ``randn`` of all its tensors' elements, split into them in the base optimizer's order. BatchNorm statistics are the clean pass's (the perturbed
    pass's when ``lmbda = 1``). A missing gradient counts as zero. An fp16 overflow in either pass skips the step,
    keeps ``F`` and puts the generator back. Under DDP both passes are synced by DDP (one draw for all replicas).
    """

    perturbs = True
    needs_model = True

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        sigma: float = 0.015,
        lmbda: float = 0.5,
        eta: float = 0.1,
        beta: float = 0.99,
        m: int | None = None,
        **common: Unpack[StepKeywords],
    ):
        super().__init__(base_optimizer, **common)
        knobs = self.spec.check_knobs(sigma=sigma, lmbda=lmbda, eta=eta, beta=beta, m=m)
        check_m_sharpness(m, self.global_perturbation)
        self.sigma, self.lmbda, self.eta, self.beta, self.m = (knobs[k] for k in ("sigma", "lmbda", "eta", "beta", "m"))
        self._seed = torch.initial_seed()
        self._gens: dict[str, torch.Generator] = {}
        self._fisher: dict[torch.Tensor, torch.Tensor] = {}  # param -> F, true units
        self._shrink: dict[torch.Tensor, torch.Tensor] = {}  # param -> 1 / sqrt(1 + eta F) as the draw reads it
        self._saved: dict[torch.Tensor, torch.Tensor] = {}  # param -> w
        self._restore_pairs: list[tuple[list[torch.Tensor], ...]] = []  # (params, their saved w) of the last draw

    # ---------------------------------------------------------------- the draw
    def _moved(self) -> list[torch.Tensor]:
        return [p for p in self._params() if p.requires_grad and self._in_scope(p)]

    @torch.no_grad()
    def _perturb(self, params: list[torch.Tensor]) -> None:
        """Save ``w``, then ``w <- w + eps``: per (device, dtype), in the base optimizer's order, one ``randn`` of all
        its tensors' elements, split into them; each tensor's scale from its current norms and ``F``'s shrink."""
        saved = []
        for p in params:
            buf = self._saved.get(p)
            if buf is None or buf.shape != p.shape or buf.dtype != p.dtype or buf.device != p.device:
                buf = self._saved[p] = torch.empty_like(p)
            saved.append(buf)
        self._restore_pairs = group_by_device_dtype(params, saved)  # _restore copies back along these
        for ps, ss in self._restore_pairs:
            torch._foreach_copy_(ss, ps)
            acc = torch.float64 if ps[0].dtype == torch.float64 else torch.float32
            vectors = [p for p in ps if p.dim() < 2]
            whole = dict(zip(vectors, torch._foreach_norm(vectors, 2, dtype=acc))) if vectors else {}
            # Filter-wise: each slice along dimension 0 gets the scale of its own norm (the authors' code).
            stds = [
                torch.linalg.vector_norm(p, dim=tuple(range(1, p.dim())), keepdim=True, dtype=acc)
                if p.dim() >= 2
                else whole[p]
                for p in ps
            ]
            # std * 1 / sqrt(1 + eta F), per filter or per element: the matrices' products (std and shrink of one
            # shape) in one launch, the vectors' (a norm times a vector) one by one; the same products either way.
            shrunk = [(i, s, self._shrink[p]) for i, (p, s) in enumerate(zip(ps, stds)) if p in self._shrink]
            for part in ([t for t in shrunk if t[1].dim() >= 2], [t for t in shrunk if t[1].dim() < 2]):
                if part:
                    for (i, _, _), prod in zip(
                        part, torch._foreach_mul([s for _, s, _ in part], [h for _, _, h in part])
                    ):
                        stds[i] = prod
            # Broadcast, not reshaped: a channels-last weight is perturbed in place, in its own layout. The stds'
            # shapes differ from the tensors', so foreach runs each tensor's own addcmul_ (the same op as one by one),
            # dispatched once from Python instead of once per tensor.
            stds = [s if s.dtype == p.dtype else s.to(p.dtype) for p, s in zip(ps, stds)]
            torch._foreach_addcmul_(ps, self._noise(ps), stds, value=self.sigma)

    @torch.no_grad()
    def _shrinks(self, fisher: dict[torch.Tensor, torch.Tensor]) -> dict[torch.Tensor, torch.Tensor]:
        """``1 / sqrt(1 + eta F)`` as the draws read it: ``F`` summed over each row of a matrix, element-wise for a
        vector (shaped to broadcast against the parameter); computed once per step taken, not per draw."""
        if not fisher:
            return {}
        params = list(fisher)
        summed = [f.sum(dim=tuple(range(1, f.dim())), keepdim=True) if f.dim() >= 2 else f for f in fisher.values()]
        out = [None] * len(params)
        # The same three element-wise ops per tensor as rsqrt(summed * eta + 1), one launch each per (device, dtype)
        # instead of one each per tensor: the step is host-bound on small models.
        buckets: dict[tuple, tuple[list[int], list[torch.Tensor]]] = {}
        for i, t in enumerate(summed):
            where, ts = buckets.setdefault((t.device, t.dtype), ([], []))
            where.append(i)
            ts.append(t)
        for where, ts in buckets.values():
            shrunk = torch._foreach_mul(ts, self.eta)
            torch._foreach_add_(shrunk, 1.0)
            torch._foreach_rsqrt_(shrunk)
            for i, t in zip(where, shrunk):
                out[i] = t
        return dict(zip(params, out))

    @torch.no_grad()
    def _restore(self) -> None:
        """``w`` back from the buffers the last ``_perturb`` saved it in, along its buckets (no lookup per tensor)."""
        for ps, ss in self._restore_pairs:
            torch._foreach_copy_(ps, ss)  # exact: the values of w come back

    # ---------------------------------------------------------------- the step
    def _take(self, params: list[torch.Tensor]) -> dict[torch.Tensor, torch.Tensor]:
        """The gradients of ``params`` (a missing one as zero), handed over without a copy; ``p.grad`` cleared."""
        out = {p: p.grad if p.grad is not None else torch.zeros_like(p) for p in params}
        self._zero_grad()
        return out

    def _perturbed_pass(self, forward: Forward, n: int | None, moved: list[torch.Tensor]):
        """``g_p`` into ``p.grad``: one draw and pass over the batch, or (m-sharpness) one per group of ``m`` rows,
        each group's pass per replica and their gradients weighted by size, then one all-reduce of the sum.
        Returns the perturbed pass's (mean loss, logits)."""
        if self.m is None or n is None or self.m >= n:
            self._perturb(moved)
            loss, logits, _, _ = self._pass(forward, local=False, n=n)
            self._restore()
            return loss, logits
        acc: dict[torch.Tensor, torch.Tensor] = {}
        losses, logits_out = [], []
        for start in range(0, n, self.m):
            rows = slice(start, min(start + self.m, n))
            weight = (rows.stop - rows.start) / n
            self._perturb(moved)
            loss, logits, _, _ = self._pass(forward, local=True, rows=rows)
            self._restore()
            with torch.no_grad():
                for p in self._params_with_grad():
                    acc[p] = p.grad.mul_(weight) if p not in acc else acc[p].add_(p.grad, alpha=weight)
            self._zero_grad()
            losses.append(loss * weight)
            logits_out.append(logits)
        for p, g in acc.items():
            p.grad = g
        with torch.no_grad():
            self._all_reduce_mean(list(acc.values()))
        return torch.stack(losses).sum(), torch.cat(logits_out)

    def train_step(
        self,
        forward: Forward,
        *,
        inputs: torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
        epoch: int = 0,
    ) -> StepOutput:
        n = batch_rows(inputs)
        if self.m is not None and n is None:
            raise ValueError(
                f"{self.name} with m={self.m}: inputs= must be the batch tensor, to split it into groups of m "
                "samples; pass train_step(forward, inputs=x, ...)"
            )
        if self.lmbda == 0.0:  # the clean gradient alone: the base optimizer's step
            loss, logits, _, skipped = self._one_pass_step(forward, inputs)
            return StepOutput(loss=loss, logits=logits, perturbed_loss=None, extra_loss=None, rho=None, skipped=skipped)
        params = [p for p in self._params() if p.requires_grad]
        moved = self._moved()
        drawn_from = self._gen_states()
        self._zero_grad()
        clean: dict[torch.Tensor, torch.Tensor] = {}
        found = None
        if self.lmbda < 1.0:
            loss, logits, _, _ = self._pass(forward, local=False, n=n)
            found = self._nonfinite()
            self._bn.snapshot()
            clean = self._take(params)
        perturbed_loss, perturbed_logits = self._perturbed_pass(forward, n, moved)
        if self.lmbda < 1.0:
            self._bn.restore()
        else:  # plain RWP: the perturbed pass is the step's only one
            loss, logits = perturbed_loss, perturbed_logits
        with torch.no_grad():
            found2 = self._nonfinite()
            found = found2 if found is None else (found if found2 is None else found + found2)
            gp = self._take(params)
            fisher = self._next_fisher(gp) if self.eta != 0.0 else None
            if self.lmbda < 1.0:
                for gs, cs in group_by_device_dtype([gp[p] for p in params], [clean[p] for p in params]):
                    torch._foreach_mul_(gs, self.lmbda)
                    torch._foreach_add_(gs, cs, alpha=1.0 - self.lmbda)  # lmbda g_p + (1 - lmbda) g
            for p in params:
                p.grad = gp[p]
            clean = {}
        skipped = self._finish(found)
        self._zero_grad()
        if skipped:  # the run continues as if the step never happened
            self._set_gen_states(drawn_from)
        elif fisher is not None:
            self._fisher, self._shrink = fisher, self._shrinks(fisher)
        return StepOutput(
            loss=loss,
            logits=logits,
            perturbed_loss=None,  # a random draw: no surrogate gap of an ascent step
            extra_loss=None,
            rho=None,
            skipped=skipped,
            perturbed=True,
            passes=self.passes_per_step,
        )

    @torch.no_grad()
    def _next_fisher(self, gp: dict[torch.Tensor, torch.Tensor]) -> dict[torch.Tensor, torch.Tensor]:
        """``beta F + g_p^2`` over the parameters in scope, in true units (the loss scale divided out)."""
        inv = 1.0 if self.scaler is None else 1.0 / float(self.scaler.get_scale())
        moved = self._moved()
        if not moved:
            return {}
        sq = torch._foreach_mul([gp[p] for p in moved], inv)  # unscaled before squaring: no overflow
        torch._foreach_mul_(sq, sq)
        with_f = [(s, self._fisher[p]) for p, s in zip(moved, sq) if p in self._fisher]
        if with_f:
            torch._foreach_add_([s for s, _ in with_f], [f for _, f in with_f], alpha=self.beta)
        return dict(zip(moved, sq))

    @property
    def passes_per_step(self) -> float:
        return 2.0 if 0.0 < self.lmbda < 1.0 else 1.0

    def _method_state(self) -> dict:
        return {"fisher": self._indexed(self._fisher), "generators": self._gen_states()}

    def _load_method_state(self, state: dict) -> None:
        self._fisher = self._by_param(state.get("fisher", {}))
        self._shrink = self._shrinks(self._fisher) if self.eta != 0.0 else {}
        self._set_gen_states(state.get("generators", {}))

    def extra_state_bytes(self) -> int:
        size = sum(p.numel() * p.element_size() for p in self._moved())
        trainable = sum(p.numel() * p.element_size() for p in self._params() if p.requires_grad)
        # Saved w and the kept noise buffer; the clean gradient kept over the perturbed pass; F and the next F.
        return 2 * size + (trainable if 0.0 < self.lmbda < 1.0 else 0) + (2 * size if self.eta != 0.0 else 0)
