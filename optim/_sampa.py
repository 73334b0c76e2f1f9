"""SAMPa (Xie, Pethick & Cevher, NeurIPS 2024): SAM whose perturbation comes from the gradient at an auxiliary point
taken one step earlier, so that a step's two gradients do not depend on each other."""

from __future__ import annotations

from typing import Unpack

import torch

from ._method import Forward, Method, StepKeywords, StepOutput, batch_rows, global_norm, group_by_device_dtype
from ._specs import registered

__all__ = ["SAMPa"]


@registered
class SAMPa(Method):
    """SAMPa-lambda (docs/algorithms.md, "SAMPa"). With ``d = grad f(y_t)`` kept from the previous step (none on the
    first step, so ``x~ = y = x`` there), one step on batch B is

    - ``x~ = x + rho d / (||d|| + 1e-12)`` (the perturbation, over the parameters in scope);
    - ``y' = x - lr_t d`` (the optimistic point, ``lr_t`` each param group's current lr);
    - ``g = grad f(x~; B)`` and ``d' = grad f(y'; B)``, independent of each other (here computed one after the other);
    - the base optimizer steps from ``x`` with ``(1 - lmbda) g + lmbda d'``, and ``d <- d'``.

    ``rho = 0`` with ``lmbda = 0`` is the base optimizer exactly. BatchNorm statistics are those of the ``x~`` pass.
    A missing gradient counts as zero. An fp16 overflow in either pass skips the step and keeps the previous ``d``.
    """

    perturbs = True

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        rho: float = 0.1,
        lmbda: float = 0.2,
        parallel: bool = False,
        **common: Unpack[StepKeywords],
    ):
        super().__init__(base_optimizer, **common)
        knobs = self.spec.check_knobs(rho=rho, lmbda=lmbda, parallel=parallel)
        self.rho, self.lmbda, self.parallel = knobs["rho"], knobs["lmbda"], knobs["parallel"]
        if self.parallel:
            self._check_no_scaler_nor_micro_batches()
        self._ranks_checked = False
        self._d: dict[torch.Tensor, torch.Tensor] = {}  # param -> grad f(y_t), true units
        self._next: dict[torch.Tensor, torch.Tensor] = {}  # param -> grad f(y_{t+1}) of this step, until committed
        self._g: dict[torch.Tensor, torch.Tensor] = {}  # param -> grad f(x~) of this step
        self._saved: dict[torch.Tensor, torch.Tensor] = {}  # param -> x

    def _check_two_ranks(self) -> None:
        """At the first step, before its passes: the world size is the run's, which the torch-free check of the
        knobs cannot see, and a model may be wrapped in DDP after the method is built."""
        import torch.distributed as dist

        ddp = self._ddp()
        world = dist.get_world_size(ddp.process_group) if ddp is not None else 1
        ranks = self.spec.shared_batch.ranks
        if world != ranks:
            raise ValueError(
                f"sampa: parallel=True computes the step's two gradients on two data-parallel ranks, one each, so it "
                f"needs a DistributedDataParallel model on exactly {ranks} ranks, but got {world} rank(s); run it on "
                f"{ranks} data-parallel workers or pass parallel=False"
            )
        self._ranks_checked = True

    def _check_no_scaler_nor_micro_batches(self) -> None:
        if self.scaler is not None or self.accumulate != 1:
            raise ValueError(
                f"sampa: parallel=True takes neither an fp16 GradScaler nor micro-batches yet, but got "
                f"scaler={'set' if self.scaler is not None else None}, accumulate={self.accumulate}; use bf16 and "
                "accumulate=1, or parallel=False"
            )

    def _trainable(self) -> list[torch.Tensor]:
        return [p for p in self._params() if p.requires_grad]

    @torch.no_grad()
    def _save(self, params: list[torch.Tensor]) -> None:
        saved = [self._buffer(self._saved, p) for p in params]
        for ss, ps in group_by_device_dtype(saved, params):
            torch._foreach_copy_(ss, ps)

    @torch.no_grad()
    def _restore(self, params: list[torch.Tensor]) -> None:
        saved = [self._saved[p] for p in params]
        for ps, ss in group_by_device_dtype(params, saved):
            torch._foreach_copy_(ps, ss)  # exact: the values of x come back

    @torch.no_grad()
    def _to_perturbed(self) -> bool:
        """``x <- x~``; False (x unmoved) when there is no ``d`` yet or ``rho = 0``."""
        moved = [p for p in self._trainable() if p in self._d and self._in_scope(p)]
        if self.rho == 0.0 or not moved:
            return False
        ds = [self._d[p] for p in moved]
        scale = self.rho / (global_norm(ds) + 1e-12)
        for ps, dd in group_by_device_dtype(moved, ds):
            torch._foreach_add_(ps, torch._foreach_mul(dd, scale.to(device=dd[0].device, dtype=dd[0].dtype)))
        return True

    @torch.no_grad()
    def _to_optimistic(self) -> None:
        """``x <- y' = x - lr_t d`` for every parameter with a ``d`` (not only those in scope: y is no perturbation)."""
        by_lr: dict[float, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        for group in self.base_optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p in self._d:
                    ps, ds = by_lr.setdefault(float(group["lr"]), ([], []))
                    ps.append(p)
                    ds.append(self._d[p])
        for lr, (ps, ds) in by_lr.items():
            for pb, db in group_by_device_dtype(ps, ds):
                torch._foreach_add_(pb, db, alpha=-lr)

    @torch.no_grad()
    def _take_grads(self, store: dict, params: list[torch.Tensor]) -> None:
        """Copy ``p.grad`` of ``params`` (every one has a gradient by now) into ``store``; clear the gradients."""
        kept = [self._buffer(store, p) for p in params]
        for ks, gs in group_by_device_dtype(kept, [p.grad for p in params]):
            torch._foreach_copy_(ks, gs)
        self._zero_grad()

    def train_step(
        self,
        forward: Forward,
        *,
        inputs: torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
        epoch: int = 0,
    ) -> StepOutput:
        n = batch_rows(inputs)
        if self.parallel:
            if not self._ranks_checked:
                self._check_two_ranks()
            return self._two_rank_step(forward, n)
        params = self._trainable()
        self._zero_grad()
        self._save(params)
        perturbed = self._to_perturbed()
        loss, logits, _, _ = self._pass(forward, local=False, n=n)
        found1 = self._nonfinite()
        self._bn.snapshot()
        with torch.no_grad():
            for p in params:
                if p.grad is None:  # missing gradients count as zero (docs/algorithms.md, "Missing gradients")
                    p.grad = torch.zeros_like(p)
            self._take_grads(self._g, params)
            self._restore(params)
            self._to_optimistic()
        self._pass(forward, local=False, n=n)
        self._bn.restore()
        with torch.no_grad():
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            found2 = self._nonfinite()
            self._take_grads(self._next, params)
            self._restore(params)
            g = [self._g[p] for p in params]
            nxt = [self._next[p] for p in params]
            if self.lmbda != 0.0:
                for gs, ns in group_by_device_dtype(g, nxt):
                    torch._foreach_mul_(gs, 1.0 - self.lmbda)
                    torch._foreach_add_(gs, ns, alpha=self.lmbda)
            for p, gi in zip(params, g):
                p.grad = gi
            # The step's gradients now live in p.grad, in _g's buffers: kept for the next step to copy into (the base
            # step has read them and zero_grad drops p.grad), so no step allocates them again.
            if self.scaler is not None:
                torch._foreach_div_(nxt, float(self.scaler.get_scale()))  # d is kept in true units
        found = found1 if found2 is None else (found2 if found1 is None else found1 + found2)
        skipped = self._finish(found)
        self._zero_grad()
        if not skipped:
            self._d, self._next = {p: self._next[p] for p in params}, self._d
        return StepOutput(
            loss=loss,
            logits=logits,
            perturbed_loss=None,
            extra_loss=None,
            rho=self.rho if perturbed else None,
            skipped=skipped,
            perturbed=perturbed,
            passes=2.0,
        )

    def _two_rank_step(self, forward: Forward, n: int | None) -> StepOutput:
        """Rank 0 takes grad f(x~) on its batch, rank 1 grad f(y') on its own, at once; one all-reduce of a buffer
        with a row per rank (the other row zero, so the sum is each gradient exactly) gives both ranks both, and
        each takes the same step from them."""
        import torch.distributed as dist

        group = self._ddp().process_group
        rank = dist.get_rank(group)
        params = self._trainable()
        self._zero_grad()
        self._save(params)
        perturbed = self.rho != 0.0 and any(p in self._d and self._in_scope(p) for p in params)
        if rank == 0:
            self._to_perturbed()
        else:
            self._to_optimistic()
        loss, logits, _, _ = self._pass(forward, local=True, n=n)
        with torch.no_grad():
            self._restore(params)
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            g = [self._buffer(self._g, p) for p in params]
            nxt = [self._buffer(self._next, p) for p in params]
            for gs, ns, mine in group_by_device_dtype(g, nxt, grads):
                sizes = [t.numel() for t in mine]
                rows = torch.zeros(2, sum(sizes), dtype=mine[0].dtype, device=mine[0].device)
                rows[rank] = torch.cat([t.reshape(-1) for t in mine])
                dist.all_reduce(rows, group=group)
                torch._foreach_copy_(gs, [c.view_as(t) for c, t in zip(rows[0].split(sizes), mine)])
                torch._foreach_copy_(ns, [c.view_as(t) for c, t in zip(rows[1].split(sizes), mine)])
            if self.lmbda != 0.0:
                for gs, ns in group_by_device_dtype(g, nxt):
                    torch._foreach_mul_(gs, 1.0 - self.lmbda)
                    torch._foreach_add_(gs, ns, alpha=self.lmbda)
            for p, gi in zip(params, g):
                p.grad = gi
        skipped = self._finish()
        self._zero_grad()
        self._d, self._next = {p: self._next[p] for p in params}, self._d
        return StepOutput(
            loss=loss,
            logits=logits,
            perturbed_loss=None,
            extra_loss=None,
            rho=self.rho if perturbed else None,
            skipped=skipped,
            perturbed=perturbed,
            passes=1.0,
        )

    @property
    def passes_per_step(self) -> float:
        return 1.0 if self.parallel else 2.0  # per rank: the two-rank form's ranks take one pass each

    def _method_state(self) -> dict:
        return {"d": self._indexed(self._d)}

    def _load_method_state(self, state: dict) -> None:
        self._d = self._by_param(state.get("d", {}))

    def extra_state_bytes(self) -> int:
        # Saved x, d, this step's d' and g (g then becomes p.grad).
        return 4 * sum(p.numel() * p.element_size() for p in self._trainable())
