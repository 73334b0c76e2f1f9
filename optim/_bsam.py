"""bSAM (Möllenhoff & Khan, ICLR 2023), SAM as a relaxation of Bayes: an Adam-like optimizer of its own, with a per-weight precision it learns, weight noise drawn from it and a SAM ascent scaled by it."""

from __future__ import annotations

from typing import Unpack

import torch

from ._knobs import check
from ._method import (
    Forward,
    Method,
    SeededDraws,
    StepKeywords,
    StepOutput,
    _skipped_on_overflow,
    batch_rows,
    group_by_device_dtype,
)
from ._specs import registered

__all__ = ["BSAM"]


@registered
class BSAM(SeededDraws, Method):
    """bSAM, the paper's Algorithm 1 (docs/algorithms.md, "bSAM"), with ``N = data_factor * num_samples``:

    - ``theta = w + z / sqrt(N s)``, ``z ~ N(0, I)``; ``g = grad L(theta; B)`` (pass 1);
    - ``g_eps = grad L(w + rho g / s; B)`` (pass 2, the ascent taken from ``w``, not from ``theta``);
    - ``m <- beta1 m + (1 - beta1)(g_eps + delta w)``; ``s <- beta2 s + (1 - beta2)(sqrt(s) |g| + delta + damping)``;
    - ``w <- w - lr m / s``, with the new ``s``, and ``lr`` each param group's current learning rate.

    ``m`` starts at 0 and ``s`` at ``s_init``. The base optimizer lends its parameter groups and their ``lr`` (which
    the lr schedule sets) alone: its step is never called, its weight decay, momentum and betas are not read (the
    trial config refuses them: the spec's ``own_update``). ``rho = 0`` is the noisy Adam-like step without an ascent
    (pass 2 at ``w``). The draws come from a generator of the method's own per device, seeded with
    ``torch.initial_seed()`` when built: per (device, dtype), one ``randn`` of all its tensors' elements, split into
    them in the base optimizer's order (replicas draw alike; the model's random streams untouched). A missing
    gradient counts as zero. BatchNorm statistics are pass 1's. Under DDP pass 1 is per-replica (each replica ascends
    along its own ``g``, as SAM does) and ``|g|`` is averaged over the replicas before ``s`` reads it (the authors'
    mean over sub-batches), pass 2 is synced. An fp16 overflow in either pass skips the step: ``w``, ``m`` and ``s``
    untouched, the generator put back.
    """

    needs_model = True
    perturbs = False  # a schedule's plain steps would be a base step it does not take: no schedule, no scope

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        rho: float = 0.01,
        beta1: float = 0.9,
        beta2: float = 0.999,
        delta: float = 5e-5,
        damping: float = 0.1,
        s_init: float = 1.0,
        data_factor: float = 1.0,
        *,
        num_samples: int | None = None,
        **common: Unpack[StepKeywords],
    ):
        super().__init__(base_optimizer, **common)
        knobs = self.spec.check_knobs(
            rho=rho, beta1=beta1, beta2=beta2, delta=delta, damping=damping, s_init=s_init, data_factor=data_factor
        )
        self.rho, self.beta1, self.beta2, self.delta, self.damping, self.s_init, self.data_factor = (
            knobs[k] for k in ("rho", "beta1", "beta2", "delta", "damping", "s_init", "data_factor")
        )
        check(
            isinstance(num_samples, int) and not isinstance(num_samples, bool) and num_samples >= 1,
            "num_samples",
            "num_samples >= 1 (the training set's size)",
            num_samples,
            "pass num_samples=len(train_set) to optim.create: the noise's variance is 1/(N s), N its multiple",
        )
        self.num_data = self.data_factor * num_samples
        self._seed = torch.initial_seed()
        self._gens: dict[str, torch.Generator] = {}
        self._m: dict[torch.Tensor, torch.Tensor] = {}
        self._s: dict[torch.Tensor, torch.Tensor] = {}
        self._saved: dict[torch.Tensor, torch.Tensor] = {}  # param -> w over the two passes
        self._abs_g: dict[torch.Tensor, torch.Tensor] = {}  # param -> |g| of pass 1, true units

    # ---------------------------------------------------------------- state
    def _trainable(self) -> list[torch.Tensor]:
        return [p for p in self._params() if p.requires_grad]

    def _state(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if p not in self._s:
            self._m[p] = torch.zeros_like(p, memory_format=torch.preserve_format)
            self._s[p] = torch.full_like(p, self.s_init, memory_format=torch.preserve_format)
        return self._m[p], self._s[p]

    # ---------------------------------------------------------------- the step's parts
    @torch.no_grad()
    def _draw(self, params: list[torch.Tensor]) -> None:
        """Save ``w``, then ``w <- w + z / sqrt(N s)``."""
        for ps, ss, ws in group_by_device_dtype(params, [self._state(p)[1] for p in params],
                                                [self._buffer(self._saved, p) for p in params]):  # fmt: skip
            torch._foreach_copy_(ws, ps)
            zs = self._noise(ps)
            std = torch._foreach_mul(ss, self.num_data)
            torch._foreach_rsqrt_(std)
            torch._foreach_addcmul_(ps, zs, std)

    def _grads(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        return [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def _ascend(self, params: list[torch.Tensor]) -> None:
        """Keep ``|g|`` (true units), then ``w <- w_saved + rho g / s``; the gradients cleared."""
        inv = 1.0 if self.scaler is None else 1.0 / float(self.scaler.get_scale())
        grads = self._grads(params)
        absg = [self._buffer(self._abs_g, p) for p in params]
        for ps, gs, ss, ws, as_ in group_by_device_dtype(params, grads, [self._s[p] for p in params],
                                                         [self._saved[p] for p in params], absg):  # fmt: skip
            torch._foreach_copy_(as_, gs)
            torch._foreach_abs_(as_)
            if inv != 1.0:
                torch._foreach_mul_(as_, inv)
            torch._foreach_copy_(ps, ws)
            if self.rho != 0.0:
                torch._foreach_addcdiv_(ps, gs, ss, value=self.rho * inv)
        if self._ddp() is not None and not self.global_perturbation:
            self._all_reduce_mean(absg)  # the replicas' s must stay one: the mean of their own |g|
        self._zero_grad()

    @torch.no_grad()
    def _restore(self, params: list[torch.Tensor]) -> None:
        for ps, ws in group_by_device_dtype(params, [self._saved[p] for p in params]):
            torch._foreach_copy_(ps, ws)  # exact: the values of w come back

    def _pass1_nonfinite(self) -> torch.Tensor | None:
        found = self._nonfinite()
        if found is not None and self._ddp() is not None and not self.global_perturbation:
            import torch.distributed as dist

            dist.all_reduce(found, group=self._ddp().process_group)  # every rank skips alike
        return found

    def _overflowed(self, found: torch.Tensor | None) -> bool:
        """fp16: unscale pass 2's gradients; whether either pass overflowed (then the scaler backs off once)."""
        return self.scaler is not None and _skipped_on_overflow(self.scaler, self.base_optimizer, found)

    @torch.no_grad()
    def _update(self, found: torch.Tensor | None) -> bool:
        """The update from ``g_eps`` in ``p.grad`` and the kept ``|g|``; returns whether the step was skipped."""
        if self._overflowed(found):
            return True
        if self.grad_clip is not None:
            # The update's gradient g_eps, after the all-reduce (docs/algorithms.md, "Clipping").
            torch.nn.utils.clip_grad_norm_(self._params_with_grad(), self.grad_clip, foreach=True)
        self._before_base_step()  # the hook on the final gradients of a step that is taken (Method's)
        b1, b2 = self.beta1, self.beta2
        for group in self.base_optimizer.param_groups:
            lr = group["lr"]
            lr = float(lr) if isinstance(lr, torch.Tensor) else lr
            params = [p for p in group["params"] if p.requires_grad]
            if not params:
                continue
            grads = self._grads(params)
            buckets = group_by_device_dtype(params, grads, [self._m[p] for p in params],
                                            [self._s[p] for p in params], [self._abs_g[p] for p in params])  # fmt: skip
            for ps, gs, ms, ss, as_ in buckets:
                torch._foreach_mul_(ms, b1)
                torch._foreach_add_(ms, gs, alpha=1.0 - b1)
                if self.delta != 0.0:
                    torch._foreach_add_(ms, ps, alpha=(1.0 - b1) * self.delta)  # m <- b1 m + (1 - b1)(g_eps + delta w)
                target = torch._foreach_sqrt(ss)
                torch._foreach_mul_(target, as_)
                torch._foreach_add_(target, self.delta + self.damping)
                torch._foreach_mul_(ss, b2)
                torch._foreach_add_(ss, target, alpha=1.0 - b2)  # s <- b2 s + (1 - b2)(sqrt(s)|g| + delta + damping)
                torch._foreach_addcdiv_(ps, ms, ss, value=-lr)  # w <- w - lr m / s, the new s
        if self.scaler is not None:
            self.scaler.update()
        return False

    # ---------------------------------------------------------------- the interface
    def train_step(
        self,
        forward: Forward,
        *,
        inputs: torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
        epoch: int = 0,
    ) -> StepOutput:
        n = batch_rows(inputs)
        params = self._trainable()
        drawn_from = self._gen_states()
        fresh = [p for p in params if p not in self._s]
        self._zero_grad()
        self._draw(params)
        loss, logits, _, _ = self._pass(forward, local=not self.global_perturbation, n=n)
        found = self._pass1_nonfinite()
        self._bn.snapshot()
        self._ascend(params)
        self._pass(forward, local=False, n=n)
        self._bn.restore()
        self._restore(params)
        skipped = self._update(found)
        self._zero_grad()
        if skipped:  # the run continues as if the step never happened: no state of its own made, the draw undone
            self._set_gen_states(drawn_from)
            for p in fresh:
                del self._m[p], self._s[p]
        return StepOutput(
            loss=loss,  # at the draw theta: bSAM never evaluates w itself
            logits=logits,
            perturbed_loss=None,  # L(w + eps) - L(theta) is no surrogate gap: theta is not w
            extra_loss=None,
            rho=self.rho,
            skipped=skipped,
            perturbed=True,
            passes=2.0,
        )

    @property
    def passes_per_step(self) -> float:
        return 2.0

    def extra_state_bytes(self) -> int:
        # m, s, the saved w, pass 1's |g| and the kept noise buffer: five copies of the trainable weights.
        return 5 * sum(p.numel() * p.element_size() for p in self._trainable())

    def _method_state(self) -> dict:
        return {"m": self._indexed(self._m), "s": self._indexed(self._s), "generators": self._gen_states()}

    def _load_method_state(self, state: dict) -> None:
        self._m = self._by_param(state.get("m", {}))
        self._s = self._by_param(state.get("s", {}))
        self._set_gen_states(state.get("generators", {}))
