"""SAM and ASAM (Foret et al. 2021; Kwon et al. 2021) and the two-pass engine (perturb, exact restore, BN guard) they share with GSAM and LookSAM."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Unpack

import torch

from ._knobs import check_m_sharpness
from ._method import (
    Forward,
    Method,
    StepKeywords,
    StepOutput,
    batch_rows,
    global_norm,
)
from ._specs import BY_NAME

__all__ = ["SAM"]

# eps = rho g / (||g|| + 1e-12) (docs/algorithms.md, SAM). Where it would divide a result that is defined
# exactly (rho = 0, a zero direction), the methods use nonzero() instead, so the guard changes nothing there.
_EPS = 1e-12


def nonzero(x: torch.Tensor) -> torch.Tensor:
    """``x`` where it is non-zero, else 1: a divisor for ``a / x`` whose numerator is zero when ``x`` is (no sync)."""
    return torch.where(x != 0, x, 1.0)  # a scalar 1: one op fewer than ones_like, the same values and dtype


_SAM, _ASAM = BY_NAME["sam"], BY_NAME["asam"]


class TwoPass(Method):
    """The SAM-family engine: pass 1 gives g, ``w <- w + eps`` (w saved), pass 2 gives g_p at ``w + eps``,
    ``w`` is copied back exactly, the final gradient (``g_p`` or a combination) goes to the base optimizer.

    Subclasses set ``_keep_g`` (keep pass 1's g for ``_combine``) and ``_local_pass2`` (GSAM: pass 2 is
    per-replica too, then one all-reduce of the combination).
    """

    _keep_g = False
    _local_pass2 = False
    needs_model = True
    perturbs = True
    #: Set by a Scheduled wrapper for an adaptive schedule: ``gate(||g||^2)`` after pass 1 says whether to perturb;
    #: when it says no, the step is the base optimizer's with pass 1's gradient.
    _gate: Callable[[float], bool] | None = None

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        *,
        p: float = 2,
        adaptive: bool = False,
        eta: float = 0.01,
        **common: Unpack[StepKeywords],
    ):
        super().__init__(base_optimizer, **common)
        self.p = _SAM.knob("p").check(p)
        self.adaptive = bool(adaptive)
        self.eta = _ASAM.knob("eta").check(eta)
        self._saved: dict[torch.Tensor, torch.Tensor] = {}  # param -> w buffer, allocated once
        self._gbuf: dict[torch.Tensor, torch.Tensor] = {}  # param -> pass 1 g buffer (GSAM, LookSAM)
        self._plan_key: list | None = None
        self._plan_cache: list = []
        self._plan_where: list[list[int]] = []  # each bucket's params' positions among all the plan's
        self._plan_members: list[torch.Tensor] = []
        self._g_full: dict[torch.Tensor, torch.Tensor] = {}
        self._restore_pairs: list[tuple[list[torch.Tensor], list[torch.Tensor]]] | None = None
        self._g: dict[torch.Tensor, torch.Tensor] = {}  # param -> its pass 1 gradient (in _gbuf)
        self._g_norm: torch.Tensor | None = None  # plain ||g||
        self._found1: torch.Tensor | None = None
        self._last_rho: float | None = None

    # ---------------------------------------------------------------- hooks
    def _rho(self) -> float:
        raise NotImplementedError

    def _combine(self) -> None:
        """Turn the pass 2 gradient in ``p.grad`` into the final update gradient (SAM: leave g_p)."""

    def _direction(self) -> None:
        """Turn pass 1's gradient in ``p.grad`` into the direction eps is formed from (SAM: leave g)."""

    # ---------------------------------------------------------------- perturbation
    def _plan(self) -> list[tuple[bool, bool, list[torch.Tensor], list[torch.Tensor], list[torch.Tensor] | None]]:
        """Buckets of (adaptive, in scope, params, saved-w buffers, g buffers) for the params that have a gradient.

        Only the buckets in scope are perturbed (and hold saved-w buffers); the others are there for the g that
        GSAM and LookSAM keep, whose combinations use every parameter's gradient (docs/algorithms.md, "Scope").
        The buckets of every trainable parameter are built once and kept while the parameters, their dtypes and
        devices and which of them are trainable are unchanged (``model.double()`` and ``.to(device)`` keep the
        parameter objects, so the key holds dtype and device: a cast rebuilds the buffers). A step whose gradients
        cover only some of them (ESAM's draw) takes each bucket's members that have one, in the order a plan of
        those alone would have. The step is often host-bound on small models: the per-step cost is a loop over the
        params, with no allocation.
        """
        keep, scope = self._keep_g, self._scope
        key: list = []
        for group in self.base_optimizer.param_groups:
            key.append(bool(group.get("adaptive", self.adaptive)))
            key.extend([(id(p), p.dtype, p.device) for p in group["params"]
                        if p.requires_grad and (keep or scope is None or p in scope)])  # fmt: skip
        if key != self._plan_key:
            self._build_plan(key)
        full, members = self._plan_cache, self._plan_members
        if all(p.grad is not None for p in members):
            self._g = self._g_full
            return full
        # Some params lack a gradient (no gradient in pass 1: eps is zero there, docs/algorithms.md, "Missing
        # gradients"): each bucket's members with one, the buckets ordered by their first such member.
        taken = []
        for (adaptive, scoped, ps, saved, gs), where in zip(full, self._plan_where):
            idx = [i for i, p in enumerate(ps) if p.grad is not None]
            if not idx:
                continue
            taken.append((
                where[idx[0]],
                (adaptive, scoped, [ps[i] for i in idx], [saved[i] for i in idx] if scoped else saved,
                 None if gs is None else [gs[i] for i in idx]),
            ))  # fmt: skip
        taken.sort(key=lambda t: t[0])
        plan = [b for _, b in taken]
        self._g = {p: g for _, _, ps, _, gs in plan if gs is not None for p, g in zip(ps, gs)}
        return plan

    def _build_plan(self, key: list) -> None:
        entries = []
        for group in self.base_optimizer.param_groups:
            adaptive = bool(group.get("adaptive", self.adaptive))
            for p in group["params"]:
                # A frozen parameter gets no gradient from backward() (zero_grad cleared the last one): no buffers.
                if p.requires_grad and (self._keep_g or self._in_scope(p)):
                    entries.append((p, adaptive, self._in_scope(p)))
        buckets: dict[tuple, tuple[list, ...]] = {}
        for where, (p, adaptive, scoped) in enumerate(entries):
            b = buckets.setdefault((p.device, p.dtype, adaptive, scoped), ([], [], [], []))
            b[0].append(p)
            if scoped:
                b[1].append(self._buffer(self._saved, p))
            if self._keep_g:
                b[2].append(self._buffer(self._gbuf, p))
            b[3].append(where)
        self._plan_key = key
        self._plan_cache = [
            (k[2], k[3], ps, saved, g if self._keep_g else None) for k, (ps, saved, g, _) in buckets.items()
        ]
        self._plan_where = [where for _, _, _, where in buckets.values()]
        self._plan_members = [p for p, _, _ in entries]
        self._g_full = {p: g for _, _, ps, _, gs in self._plan_cache if gs is not None for p, g in zip(ps, gs)}

    @torch.no_grad()
    def _perturb(self, rho: float) -> None:
        """``w <- w + eps`` from the gradients in ``p.grad``; saves ``w``; with ``_keep_g`` copies g (and ||g||).

        eps (its direction and its norm) runs over the parameters in scope alone; g and ||g|| over every parameter
        with a gradient. eps is formed in place in the gradients (cleared right after) or, for ASAM, in the
        parameters once w is saved: no allocation per step, only persistent buffers.
        """
        plan = self._plan()
        if self._keep_g:
            for _, _, ps, _, gbuf in plan:
                torch._foreach_copy_(gbuf, [p.grad for p in ps])
            self._g_norm = global_norm([p.grad for _, _, ps, _, _ in plan for p in ps])
        plan = [b for b in plan if b[1]]
        grads = [[p.grad for p in ps] for _, _, ps, _, _ in plan]
        # w is saved first; an adaptive bucket then holds T = |w| + eta in the parameters themselves
        # (w is safe in the buffer), so eps = s T (T g) and w + eps take no extra buffer and fewer passes.
        for (adaptive, _, ps, saved, _), gs in zip(plan, grads):
            torch._foreach_copy_(saved, ps)
            if adaptive:
                torch._foreach_abs_(ps)
                torch._foreach_add_(ps, self.eta)
                if self.p == 2:
                    torch._foreach_mul_(gs, ps)  # T g, whose norm normalises eps
        if self.p == 2:
            if self._keep_g and self._scope is None and not any(a for a, _, _, _, _ in plan):
                norm = self._g_norm
            else:
                norm = global_norm([g for gs in grads for g in gs])
            scale = rho / (norm + _EPS)
        for (adaptive, _, ps, saved, _), gs in zip(plan, grads):
            if self.p == 2:
                s = scale if gs[0].dtype == scale.dtype and gs[0].device == scale.device else scale.to(gs[0])
                if adaptive:
                    torch._foreach_mul_(ps, s)
                    torch._foreach_mul_(ps, gs)  # eps = rho T^2 g / ||T g||
                else:
                    torch._foreach_mul_(gs, s)  # eps = rho g / ||g||
            else:
                torch._foreach_sign_(gs)
                if adaptive:
                    torch._foreach_mul_(ps, gs)
                    torch._foreach_mul_(ps, rho)  # eps = rho T sign(T g) = rho T sign(g)
                else:
                    torch._foreach_mul_(gs, rho)  # eps = rho sign(g)
            if adaptive:
                torch._foreach_add_(ps, saved)  # eps + w
            else:
                torch._foreach_add_(ps, gs)  # w + eps
        self._restore_pairs = [(ps, saved) for _, _, ps, saved, _ in plan]

    @torch.no_grad()
    def _restore(self) -> None:
        for ps, saved in self._restore_pairs:
            torch._foreach_copy_(ps, saved)  # exact: values copied back, storage never swapped
        self._restore_pairs = None

    def _pass1_nonfinite(self) -> torch.Tensor | None:
        found = self._nonfinite()
        if found is not None and self._ddp() is not None and not self.global_perturbation:
            # A per-replica pass 1 overflow must skip the step on every rank, or replicas drift apart.
            import torch.distributed as dist

            dist.all_reduce(found, group=self._ddp().process_group)
        return found

    # ---------------------------------------------------------------- the protocol
    @torch.no_grad()
    def first_step(self) -> None:
        """Perturb ``w`` with the current gradients (pass 1), then clear the gradients."""
        if self._restore_pairs is not None:
            raise RuntimeError(f"{type(self).__name__}.first_step() called twice without second_step() in between")
        self._found1 = self._pass1_nonfinite()
        self._bn.snapshot()
        self._direction()
        rho = self._rho()
        self._last_rho = rho
        self._perturb(rho)
        self._zero_grad()

    @torch.no_grad()
    def second_step(self) -> bool:
        """Restore ``w``, step the base optimizer with the pass 2 gradients, clear the gradients.

        Returns whether the step was skipped (fp16 overflow in either pass).
        """
        if self._restore_pairs is None:
            raise RuntimeError(
                f"{type(self).__name__}.second_step() called without first_step(); "
                "call loss.backward(); first_step(); loss_fn(model(x), y).backward(); second_step()"
            )
        self._bn.restore()
        self._restore()
        self._combine()
        skipped = self._finish(self._found1)
        self._found1 = None
        self._zero_grad()
        return skipped

    def step(self, closure: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Both passes: ``closure()`` computes the loss and calls backward; returns the clean loss."""
        self._check_closure(closure)
        loss, _ = self._closure_two_pass(closure)
        return loss

    def _check_closure(self, closure) -> None:
        if self.accumulate != 1 or getattr(self, "m", None) is not None:
            raise ValueError(
                f"{type(self).__name__}.step(closure) runs the closure on the whole batch, so it cannot "
                f"split it (accumulate={self.accumulate}, m={getattr(self, 'm', None)}); use "
                "train_step(forward, inputs=x) with a forward(rows=None, reduction='mean')"
            )
        if closure is None:
            raise ValueError(
                f"closure must be a callable that computes the loss and calls backward(), but got "
                f"closure=None; pass {type(self).__name__}.step(closure) with e.g. "
                "closure = lambda: (loss := loss_fn(model(x), y)).backward() or loss"
            )

    def _closure_two_pass(self, closure: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, bool]:
        self._zero_grad()
        with torch.enable_grad(), self._local_pass():
            loss = closure()
        self.first_step()
        with torch.enable_grad(), self._pass2():
            closure()
        return loss, self.second_step()

    def _pass2(self) -> contextlib.AbstractContextManager:
        return self._local_pass() if self._local_pass2 else contextlib.nullcontext()

    def train_step(
        self,
        forward: Forward,
        *,
        inputs: torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
        epoch: int = 0,
    ) -> StepOutput:
        n = batch_rows(inputs)
        self._zero_grad()
        # Pass 1 is per-replica (DDP no_sync around forward AND backward) unless one global eps is asked for.
        loss, logits, _, _ = self._pass(forward, local=not self.global_perturbation, n=n)
        if self._gate is not None and not self._gate(self._clean_sq_norm()):
            return self._base_step_with_g(loss, logits)
        self.first_step()
        perturbed_loss, _, _, _ = self._pass(forward, local=self._local_pass2 and not self.global_perturbation, n=n)
        skipped = self.second_step()
        return StepOutput(
            loss=loss,
            logits=logits,
            perturbed_loss=perturbed_loss,
            extra_loss=None,
            rho=self._last_rho,
            skipped=skipped,
            perturbed=True,
            passes=2.0,
        )

    @torch.no_grad()
    def _clean_sq_norm(self) -> float:
        """``||g||^2`` of pass 1's gradient over every parameter, in the true gradient's units, averaged over the
        replicas of a per-replica pass 1 (so that every replica's gate decides alike); one host read."""
        sq = global_norm([p.grad for p in self._params_with_grad()]).square()
        if self.scaler is not None:
            sq = sq / float(self.scaler.get_scale()) ** 2
        if self._ddp() is not None and not self.global_perturbation:
            sq = sq.reshape(1)
            self._all_reduce_mean([sq])
        return float(sq)

    @torch.no_grad()
    def _base_step_with_g(self, loss: torch.Tensor, logits: torch.Tensor) -> StepOutput:
        """The base optimizer's step with pass 1's gradient (its all-reduce done here when pass 1 was per-replica):
        on one process the step ``none`` takes, bit for bit."""
        if not self.global_perturbation:
            self._all_reduce_mean([p.grad for p in self._params_with_grad()])
        skipped = self._finish()
        self._zero_grad()
        return StepOutput(loss=loss, logits=logits, perturbed_loss=None, extra_loss=None, rho=None, skipped=skipped)

    @property
    def passes_per_step(self) -> float:
        return 2.0

    def extra_state_bytes(self) -> int:
        # The saved copy of w (the trainable params in scope once the first step ran).
        return sum(p.numel() * p.element_size() for p in self._params() if p.requires_grad and self._in_scope(p))


class SAM(TwoPass):
    """Sharpness-aware minimisation; ``adaptive=True`` is ASAM (``T = |w| + eta``), ``p=inf`` the sign variant.

    ``eps = rho g / (||g|| + 1e-12)`` with ONE global norm (p=2), ``rho sign(g)`` (p=inf),
    ``rho T^2 g / (||T g|| + 1e-12)`` (ASAM). Weight decay stays in the base optimizer.

    ``m`` (m-sharpness, Foret et al. 2021 Sec. 4.1; Andriushchenko & Flammarion 2022): the batch (each
    replica's, under DDP) is split into groups of ``m`` samples, each group perturbed with its own
    gradient, and the update is the size-weighted mean of the groups' perturbed gradients; ``m=None`` or
    ``m >= batch`` is SAM (docs/algorithms.md, "m-sharpness").

    ``gc=True`` is GCSAM (arXiv 2501.11584): pass 1's gradient of every tensor of two or more dimensions is
    centralised (its mean over all but the first dimension subtracted) before ``eps`` is formed from it, so ``eps``
    has norm ``rho`` along the centralised gradient (docs/algorithms.md, "GCSAM").
    """

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        rho: float = 0.05,
        p: float = 2,
        adaptive: bool = False,
        eta: float = 0.01,
        m: int | None = None,
        gc: bool = False,
        **common: Unpack[StepKeywords],
    ):
        super().__init__(
            base_optimizer,
            p=p,
            adaptive=adaptive,
            eta=eta,
            **common,
        )
        knobs = _SAM.check_knobs(rho=rho, m=m, gc=gc)
        check_m_sharpness(m, self.global_perturbation)
        self.rho, self.m, self.gc = knobs["rho"], knobs["m"], knobs["gc"]
        self.name = (_ASAM if self.adaptive else _SAM).name

    def _rho(self) -> float:
        return self.rho

    @torch.no_grad()
    def _direction(self) -> None:
        if not self.gc:
            return
        # GCSAM: each weight tensor's gradient less its mean per output unit (dimension 0); biases and norms' 1-D
        # tensors as they are. Only what eps is formed from: the update stays pass 2's gradient.
        for p in self._params_with_grad():
            g = p.grad
            if g.dim() > 1 and self._in_scope(p):
                g.sub_(g.mean(dim=tuple(range(1, g.dim())), keepdim=True))

    def train_step(
        self,
        forward: Forward,
        *,
        inputs: torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
        epoch: int = 0,
    ) -> StepOutput:
        n = batch_rows(inputs)
        if self.m is None or (n is not None and self.m >= n):
            return super().train_step(forward, inputs=inputs, indices=indices, epoch=epoch)
        if n is None:
            raise ValueError(
                f"{self.name} with m={self.m}: inputs= must be the batch tensor, to split it into groups "
                "of m samples; pass train_step(forward, inputs=x, ...)"
            )
        return self._m_step(forward, n)

    def _m_step(self, forward: Forward, n: int) -> StepOutput:
        """One eps per group of m rows; the groups' pass 2 gradients are summed, weighted by group size, into
        the update gradient; one all-reduce of it under DDP, one base step."""
        acc: dict[torch.Tensor, torch.Tensor] = {}
        found: torch.Tensor | None = None
        losses, perturbed, logits_out = [], [], []
        for start in range(0, n, self.m):
            rows = slice(start, min(start + self.m, n))
            weight = (rows.stop - rows.start) / n
            self._zero_grad()
            loss, logits, _, _ = self._pass(forward, local=True, rows=rows)
            self.first_step()
            if self._found1 is not None:
                found = self._found1 if found is None else found + self._found1
            self._found1 = None
            ploss, _, _, _ = self._pass(forward, local=True, rows=rows)
            with torch.no_grad():
                self._bn.restore()
                self._restore()
                for prm in self._params_with_grad():
                    g = prm.grad
                    if prm in acc:
                        acc[prm].add_(g, alpha=weight)
                    else:
                        acc[prm] = g.mul_(weight)
            losses.append(loss * weight)
            perturbed.append(ploss * weight)
            logits_out.append(logits)
        self._zero_grad()
        for prm, g in acc.items():
            prm.grad = g
        with torch.no_grad():
            self._all_reduce_mean(list(acc.values()))
            skipped = self._finish(found)
        self._zero_grad()
        return StepOutput(
            loss=torch.stack(losses).sum(),
            logits=torch.cat(logits_out),
            perturbed_loss=torch.stack(perturbed).sum(),
            extra_loss=None,
            rho=self._last_rho,
            skipped=skipped,
            perturbed=True,
            passes=2.0,
        )
