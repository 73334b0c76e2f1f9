"""The one step interface (StepOutput, Method) and the machinery every method shares: BN protection, DDP no_sync, fp16 scaling, clipping."""

from __future__ import annotations

import abc
import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["Forward", "Method", "StepOutput"]

#: ``forward()`` runs the model on the current batch (under the caller's autocast) and returns
#: ``(mean task loss, logits)``.
Forward = Callable[[], "tuple[torch.Tensor, torch.Tensor]"]


@dataclass
class StepOutput:
    """What one ``Method.train_step`` returns; every tensor is detached and still on the device (no sync)."""

    loss: torch.Tensor
    logits: torch.Tensor
    perturbed_loss: torch.Tensor | None
    extra_loss: torch.Tensor | None
    rho: float | None
    skipped: bool = False


def check(ok: bool, name: str, rule: str, value: Any, fix: str) -> None:
    """Raise the project's ValueError for a bad hyperparameter: the name, the rule, the value and the fix."""
    if not ok:
        raise ValueError(f"{name} must satisfy {rule}, but got {name}={value!r}; {fix}")


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside DDP (``.module``) and/or ``torch.compile`` (``._orig_mod``) wrappers."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


def global_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """ONE L2 norm over all ``tensors``: float32 accumulation for half/bf16/fp32, float64 if any tensor is float64.

    One ``_foreach_norm`` per dtype, then a norm of the stacked per-tensor norms: no host sync.
    """
    if not tensors:
        return torch.zeros((), dtype=torch.float32)
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    norms: list[torch.Tensor] = []
    for (_, dtype), group in groups.items():
        # _foreach_norm(dtype=...) accumulates in the wider type without materialising casts.
        norms.extend(torch._foreach_norm(group, 2, dtype=torch.float64 if dtype == torch.float64 else torch.float32))
    if len(groups) > 1:  # rare: mixed dtypes or devices
        acc = torch.float64 if any(dt == torch.float64 for _, dt in groups) else torch.float32
        norms = [n.to(device=tensors[0].device, dtype=acc) for n in norms]
    return torch.linalg.vector_norm(torch.stack(norms))


def group_by_device_dtype(*lists: Sequence[torch.Tensor]) -> list[tuple[list[torch.Tensor], ...]]:
    """Split aligned tensor lists into buckets of one (device, dtype) so every foreach call takes its fast path."""
    buckets: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], ...]] = {}
    for items in zip(*lists):
        key = (items[0].device, items[0].dtype)
        bucket = buckets.get(key)
        if bucket is None:
            bucket = buckets[key] = tuple([] for _ in lists)
        for out, t in zip(bucket, items):
            out.append(t)
    return list(buckets.values())


class _BNGuard:
    """Snapshot BatchNorm buffers after pass 1 and restore them after pass 2.

    docs/algorithms.md ("BatchNorm"): the running statistics after a step equal those of pass 1 alone. Setting momentum=0
    is not enough (``num_batches_tracked`` still moves, and momentum=None means a cumulative average),
    so the buffers are copied back exactly. Buffers are re-read every step: ``model.to()`` replaces them.
    """

    def __init__(self, model: nn.Module | None):
        self.modules = [] if model is None else [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        self._saved: list[torch.Tensor] = []

    def _buffers(self) -> list[torch.Tensor]:
        out = []
        for m in self.modules:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                b = getattr(m, name, None)
                if b is not None:
                    out.append(b)
        return out

    def snapshot(self) -> None:
        if not self.modules:
            return
        bufs = self._buffers()
        stale = len(self._saved) != len(bufs) or any(
            s.shape != b.shape or s.device != b.device or s.dtype != b.dtype for s, b in zip(self._saved, bufs))
        if stale:
            self._saved = [torch.empty_like(b) for b in bufs]
        for dst, src in group_by_device_dtype(self._saved, bufs):
            torch._foreach_copy_(dst, src)

    def restore(self) -> None:
        if not self.modules:
            return
        for dst, src in group_by_device_dtype(self._buffers(), self._saved):
            torch._foreach_copy_(dst, src)

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers())


class Method(abc.ABC):
    """One training step of an optimisation method around a ready base optimizer.

    ``train_step(forward, inputs=, indices=, epoch=)`` does every zero_grad, backward, extra loss,
    perturbation, BN-stat protection, DDP ``no_sync``, fp16 scaling, clipping and the base step itself;
    the training loop never branches on the method.
    """

    name: str = ""
    #: Two-pass methods need the model (BN protection, DDP no_sync): one rule for the classes and create().
    needs_model: bool = False

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        *,
        model: nn.Module | None = None,
        grad_clip: float | None = None,
        scaler: torch.amp.GradScaler | None = None,
        global_perturbation: bool = False,
    ):
        if not isinstance(base_optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"base_optimizer must be a torch.optim.Optimizer instance, got {type(base_optimizer).__name__}; "
                "build it first, e.g. torch.optim.AdamW(model.parameters(), lr=1e-3)"
            )
        if grad_clip is not None:
            check(grad_clip > 0 and math.isfinite(grad_clip), "grad_clip", "0 < grad_clip < inf (or None)", grad_clip,
                  "pass a positive max norm such as 1.0, or None for no clipping")
        if self.needs_model and not isinstance(model, nn.Module):
            raise ValueError(
                f"model must be the nn.Module being trained (the DDP wrapper if any), but got model={model!r}; "
                f"{type(self).__name__} needs it to keep BatchNorm statistics to pass 1 alone and to run pass 1 "
                f"under DDP no_sync: pass model=net (optim.create asks for it too)")
        self.base_optimizer = base_optimizer
        self.model = model
        self.grad_clip = grad_clip
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        self.global_perturbation = bool(global_perturbation)
        self._bn = _BNGuard(model)

    # ----------------------------------------------------------------- the interface
    @abc.abstractmethod
    def train_step(self, forward: Forward, *, inputs: torch.Tensor | None = None,
                   indices: torch.Tensor | None = None, epoch: int = 0) -> StepOutput:
        """One optimisation step on the current batch; calls ``forward()`` once or twice."""

    @property
    @abc.abstractmethod
    def passes_per_step(self) -> float:
        """Forward+backward passes per step on average, for cost reporting."""

    def extra_state_bytes(self) -> int:
        """Memory the method holds beyond the base optimizer (saved w, stored directions, buffers, teacher)."""
        return 0

    def state_dict(self) -> dict:
        """The base optimizer's state, the method's own, and the GradScaler's (``None`` without fp16 scaling).

        The scaler is included because the method drives it (which steps it skips and backs off on): a
        resumed run continues the trajectory only with the same loss scale. A caller that also saves the
        scaler itself saves the same state twice, which is harmless.
        """
        return {"base_optimizer": self.base_optimizer.state_dict(), "method": self._method_state(),
                "scaler": None if self.scaler is None else self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``. A checkpoint's scaler state is loaded when this method has a scaler; a
        checkpoint without one (no fp16 then, or older) leaves the scaler as it is."""
        self.base_optimizer.load_state_dict(state["base_optimizer"])
        self._load_method_state(state.get("method", {}))
        scaler_state = state.get("scaler")
        if self.scaler is not None and scaler_state:
            self.scaler.load_state_dict(scaler_state)

    def _method_state(self) -> dict:
        return {}

    def _load_method_state(self, state: dict) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, base={type(self.base_optimizer).__name__})"

    # ----------------------------------------------------------------- shared machinery
    def _ddp(self) -> nn.parallel.DistributedDataParallel | None:
        return self.model if isinstance(self.model, nn.parallel.DistributedDataParallel) else None

    def _all_reduce_mean(self, tensors: Sequence[torch.Tensor]) -> None:
        """Average ``tensors`` over the DDP replicas in place: one flat all-reduce per (device, dtype)."""
        ddp = self._ddp()
        if ddp is None or not tensors:
            return
        import torch.distributed as dist

        group = ddp.process_group
        world = dist.get_world_size(group)
        for (bucket,) in group_by_device_dtype(tensors):
            flat = torch.cat([t.reshape(-1) for t in bucket])
            dist.all_reduce(flat, group=group)
            flat.div_(world)
            torch._foreach_copy_(bucket, [c.view_as(t) for c, t in zip(flat.split([t.numel() for t in bucket]), bucket)])

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.base_optimizer.param_groups for p in g["params"]]

    def _params_with_grad(self) -> list[torch.Tensor]:
        return [p for g in self.base_optimizer.param_groups for p in g["params"] if p.grad is not None]

    def _zero_grad(self) -> None:
        self.base_optimizer.zero_grad(set_to_none=True)

    def _backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def _no_sync(self) -> contextlib.AbstractContextManager:
        """DDP ``no_sync`` (wrapping forward AND backward), or nothing on one process."""
        no_sync = getattr(self.model, "no_sync", None)
        return no_sync() if isinstance(self.model, nn.parallel.DistributedDataParallel) and no_sync else contextlib.nullcontext()

    def _local_pass(self) -> contextlib.AbstractContextManager:
        """Pass 1 of a two-pass method: per-replica (no all-reduce) unless a global perturbation is asked for."""
        return contextlib.nullcontext() if self.global_perturbation else self._no_sync()

    def _nonfinite(self) -> torch.Tensor | None:
        """fp16 only: a device flag (>0) if the current (scaled) grads hold an inf/nan. No host sync."""
        if self.scaler is None:
            return None
        grads = [p.grad for p in self._params_with_grad()]
        if not grads:
            return None
        found = torch.zeros(1, dtype=torch.float32, device=grads[0].device)
        for (bucket,) in group_by_device_dtype(grads):
            one = torch.ones(1, dtype=torch.float32, device=bucket[0].device)
            f = torch.zeros(1, dtype=torch.float32, device=bucket[0].device)
            # Multiplies by 1.0 (no change) and flags non-finite values: the scaler's own check.
            torch._amp_foreach_non_finite_check_and_unscale_(bucket, f, one)
            found += f.to(found.device)
        return found

    def _finish(self, found_earlier: torch.Tensor | None = None) -> bool:
        """Final gradients are in ``p.grad``: unscale once, clip, one base step, one ``scaler.update``.

        ``found_earlier``: an inf/nan flag from pass 1. An overflow in either pass skips the step: the base
        optimizer is not called at all, so its state (Adam's ``step``, SGD's momentum) is untouched for
        fused and non-fused bases alike, and ``scaler.update`` backs off once. Returns ``skipped`` (fp16
        only; one host read, which ``GradScaler.step`` does anyway for non-fused optimizers).
        """
        opt = self.base_optimizer
        scaler = self.scaler
        if scaler is None:
            if self.grad_clip is not None:
                # After any all-reduce: clips the final update gradient (docs/algorithms.md, "Clipping").
                torch.nn.utils.clip_grad_norm_(self._params_with_grad(), self.grad_clip, foreach=True)
            opt.step()
            return False
        scaler.unscale_(opt)
        flags = _found_inf_per_device(scaler, opt)
        total = torch.zeros((), dtype=torch.float32)
        for f in flags.values():
            total = total + f.to(torch.float32).sum().cpu()
        if found_earlier is not None:
            total = total + found_earlier.to(torch.float32).sum().cpu()
        if bool(total > 0):
            # Not scaler.step: a fused AdamW/SGD would be called with found_inf = (sum of both passes' flags)
            # and its kernel skips only when that equals 1.0 (2.0 stepped with NaN gradients and moved
            # Adam's step backwards); a skipped fused SGD first step also leaves an uninitialised momentum
            # buffer. update() backs off once when any recorded flag is non-zero, so pass 1's verdict is
            # written where update() reads it.
            if flags:
                next(iter(flags.values())).fill_(1.0)
            else:
                flags[found_earlier.device] = torch.ones((), dtype=torch.float32, device=found_earlier.device)
            scaler.update()
            return True
        if self.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self._params_with_grad(), self.grad_clip, foreach=True)
        scaler.step(opt)
        scaler.update()
        return False


def _found_inf_per_device(scaler: torch.amp.GradScaler, opt: torch.optim.Optimizer) -> dict:
    """The scaler's per-device inf/nan verdict for ``opt`` after ``unscale_`` (a private of GradScaler).

    ``GradScaler`` has no public way to read or add to its verdict; ``update()`` reads this dict, so a
    pass 1 overflow must be recorded here. tests/optim/test_overflow.py pins the layout.
    """
    state = getattr(scaler, "_per_optimizer_states", None)
    if state is None or "found_inf_per_device" not in state[id(opt)]:
        raise RuntimeError(
            "torch.amp.GradScaler no longer keeps _per_optimizer_states[id(optimizer)]['found_inf_per_device']; "
            f"optim needs it to skip a step on an overflow in pass 1 (torch {torch.__version__}); "
            "update optim._method._found_inf_per_device for this torch version")
    return state[id(opt)]["found_inf_per_device"]


class BaseOnly(Method):
    """``none``: the base optimizer alone, one forward and backward per step."""

    name = "none"

    def train_step(self, forward: Forward, *, inputs: torch.Tensor | None = None,
                   indices: torch.Tensor | None = None, epoch: int = 0) -> StepOutput:
        self._zero_grad()
        loss, logits = forward()
        self._backward(loss)
        skipped = self._finish()
        self._zero_grad()
        return StepOutput(loss=loss.detach(), logits=logits.detach(), perturbed_loss=None, extra_loss=None,
                          rho=None, skipped=skipped)

    @property
    def passes_per_step(self) -> float:
        return 1.0
