"""Lookbehind-SAM (Mordido et al., ICML 2024): k SAM ascent steps chained from the slow weights, each perturbed
gradient a base-optimizer step of the fast weights, then the slow weights interpolated toward the fast ones."""

from __future__ import annotations

from typing import Unpack

import torch

from ._method import Forward, Method, StepKeywords, StepOutput, batch_rows, global_norm, group_by_device_dtype
from ._specs import registered

__all__ = ["LookbehindSAM"]

_EPS = 1e-12  # the ascent directions' guard, as SAM's (docs/algorithms.md, "SAM")


@registered
class LookbehindSAM(Method):
    """Lookbehind-SAM (docs/algorithms.md, "Lookbehind-SAM"): from the slow weights ``theta`` (the model's weights
    between steps), ``u_0 = phi_0 = theta`` and for ``i = 1..k``:

    - ``u_i = u_{i-1} + rho g(u_{i-1}) / (||g(u_{i-1})|| + 1e-12)`` over the parameters in scope (the ascent chains:
      each direction is taken at the previous perturbed point);
    - ``phi_i`` = the base optimizer's step from ``phi_{i-1}`` with ``g(u_i)`` (every parameter);

    then ``theta <- alpha phi_k + (1 - alpha) theta``. ``k + 1`` forward+backward passes, ``k`` base steps (Adam's
    step count moves by ``k``, the lr is the step's for all of them). ``k = 1``, ``alpha = 1`` is SAM; with
    ``rho = 0`` as well it is the base optimizer exactly.

    The authors' code runs two passes per inner step (``2k``), the first of each at the point the previous one
    ended on, so it recomputes ``g(u_{i-1})``; here each point's gradient is computed once. BatchNorm statistics are
    pass 1's. Under DDP every pass is per replica (the ascent directions too) and each descent gradient is averaged
    in one all-reduce before its base step, unless ``global_perturbation``, where every pass is synced. An fp16
    overflow in a pass skips that inner step and ends the chain (the points after it would be built on it); the
    slow weights then move toward the fast weights reached so far, and not at all when no inner step was taken.
    """

    perturbs = True
    needs_model = True

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        rho: float = 0.05,
        k: int = 5,
        alpha: float = 0.5,
        **common: Unpack[StepKeywords],
    ):
        super().__init__(base_optimizer, **common)
        knobs = self.spec.check_knobs(rho=rho, k=k, alpha=alpha)
        self.rho, self.k, self.alpha = knobs["rho"], knobs["k"], knobs["alpha"]
        # param -> buffer; refilled every step, so none of them is state a resume needs.
        self._slow: dict[torch.Tensor, torch.Tensor] = {}
        self._fast: dict[torch.Tensor, torch.Tensor] = {}
        self._point: dict[torch.Tensor, torch.Tensor] = {}

    def _trainable(self) -> list[torch.Tensor]:
        return [p for p in self._params() if p.requires_grad]

    def _buffers(self, store: dict, params: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self._buffer(store, p) for p in params]

    @staticmethod
    def _copy(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
        for ds, ss in group_by_device_dtype(dst, src):
            torch._foreach_copy_(ds, ss)

    @torch.no_grad()
    def _ascend(self, point: list[torch.Tensor], direction: list[torch.Tensor]) -> None:
        """``point <- point + rho u / (||u|| + 1e-12)``; nothing moves at ``rho = 0``."""
        if self.rho == 0.0 or not point:
            return
        scale = self.rho / (global_norm(direction) + _EPS)
        for ps, us in group_by_device_dtype(point, direction):
            torch._foreach_add_(ps, torch._foreach_mul(us, scale.to(device=us[0].device, dtype=us[0].dtype)))

    @staticmethod
    def _local_grads(params: list[torch.Tensor]) -> list[torch.Tensor]:
        """The gradients of ``params`` as they stand (a missing one as zero), without a copy."""
        return [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]

    def train_step(
        self,
        forward: Forward,
        *,
        inputs: torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
        epoch: int = 0,
    ) -> StepOutput:
        n = batch_rows(inputs)
        local = not self.global_perturbation
        params = self._trainable()
        moved = [p for p in params if self._in_scope(p)]
        others = [p for p in params if not self._in_scope(p)]
        with torch.no_grad():
            slow, fast = self._buffers(self._slow, params), self._buffers(self._fast, params)
            self._copy(slow, params)
            self._copy(fast, params)
            point = self._buffers(self._point, moved)
            self._copy(point, moved)
        slow_others = [self._slow[p] for p in others]
        self._zero_grad()
        loss, logits, _, _ = self._pass(forward, local=local, n=n)
        earlier = self._nonfinite()  # an overflow in g(theta) poisons u_1 and so step 1
        self._bn.snapshot()
        self._ascend(point, self._local_grads(moved))
        perturbed_loss, taken = loss, 0
        for i in range(1, self.k + 1):
            with torch.no_grad():
                self._copy(moved, point)
                self._copy(others, slow_others)
            self._zero_grad()
            perturbed_loss, _, _, _ = self._pass(forward, local=local, n=n)
            here = self._nonfinite()
            with torch.no_grad():
                if i < self.k:  # u_{i+1} from this pass's own (per-replica) gradient, before the all-reduce
                    self._ascend(point, self._local_grads(moved))
                if local:
                    self._all_reduce_mean([p.grad for p in params if p.grad is not None])
                self._copy(params, fast)  # the base step moves phi_{i-1}
            found = [f for f in (earlier, here) if f is not None]
            if self._finish(torch.stack(found).sum(0) if found else None):
                break
            earlier = None
            taken += 1
            with torch.no_grad():
                self._copy(fast, params)
        with torch.no_grad():
            self._bn.restore()
            if taken == 0:
                self._copy(params, slow)
            else:
                for fs, ss in group_by_device_dtype(fast, slow):
                    torch._foreach_mul_(fs, self.alpha)
                    torch._foreach_add_(fs, ss, alpha=1.0 - self.alpha)  # the authors' form: exact at alpha = 1
                self._copy(params, fast)
        self._zero_grad()
        return StepOutput(
            loss=loss,
            logits=logits,
            perturbed_loss=perturbed_loss,  # at u_k, the end of the ascent chain
            extra_loss=None,
            rho=self.rho,
            skipped=taken == 0,
            perturbed=True,
            passes=float(self.k + 1),
        )

    @property
    def passes_per_step(self) -> float:
        return float(self.k + 1)

    def extra_state_bytes(self) -> int:
        trainable = sum(p.numel() * p.element_size() for p in self._trainable())
        # theta and phi for every parameter, the chain's point for those in scope.
        return 2 * trainable + sum(p.numel() * p.element_size() for p in self._trainable() if self._in_scope(p))
