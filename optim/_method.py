"""The one step interface (StepOutput, Method, the constructor keywords they share: StepKeywords) and the machinery every method shares: micro-batches, BN protection, DDP no_sync, fp16 scaling, clipping."""

from __future__ import annotations

import abc
import contextlib
import functools
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypedDict

import torch
from torch import nn

from ._knobs import check
from ._scope import check_scope, resolve_scope
from ._specs import registered

__all__ = ["Forward", "Method", "StepKeywords", "StepOutput", "check"]

#: ``forward(rows=None, reduction="mean")`` runs the model on the current batch (under the caller's autocast)
#: and returns ``(loss, logits)``: the mean task loss (``reduction="none"``: one loss per sample) and the
#: logits of the rows asked for. ``rows`` is ``None`` (the whole batch), a ``slice`` or a 1-D index tensor
#: of the batch's rows. A method calls ``forward()`` with no argument unless it works on part of the batch
#: (micro-batches, m-sharpness, ESAM's data selection), so a zero-argument forward serves every other setting.
Forward = Callable[..., "tuple[torch.Tensor, torch.Tensor]"]


def split_rows(n: int, parts: int) -> list[slice]:
    """``parts`` contiguous row ranges covering ``range(n)``, sizes differing by at most one (empty ones dropped)."""
    base, extra = divmod(n, parts)
    out, start = [], 0
    for k in range(parts):
        size = base + (1 if k < extra else 0)
        if size:
            out.append(slice(start, start + size))
        start += size
    return out


def _take(rows: slice | torch.Tensor | None, sub: slice) -> slice | torch.Tensor:
    """Rows ``sub`` of the selection ``rows`` (None: the whole batch)."""
    if rows is None:
        return sub
    if isinstance(rows, slice):
        return slice(rows.start + sub.start, rows.start + sub.stop)
    return rows[sub]


def _count(rows: slice | torch.Tensor) -> int:
    return rows.stop - rows.start if isinstance(rows, slice) else int(rows.numel())


@dataclass
class StepOutput:
    """What one ``Method.train_step`` returns; every tensor is detached and still on the device (no sync)."""

    loss: torch.Tensor
    logits: torch.Tensor
    perturbed_loss: torch.Tensor | None
    extra_loss: torch.Tensor | None
    rho: float | None
    skipped: bool = False
    #: The step moved the weights to a perturbed point (a scheduled method's plain steps, LookSAM's one-pass steps
    #: and the one-pass methods did not), and the forward+backward passes it ran (ESAM: its average).
    perturbed: bool = False
    passes: float = 1.0


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
    first = lists[0] if lists else ()
    if first:
        # The usual case, one device and one dtype: the one bucket without the per-item loop below (a step calls
        # this several times over every parameter, and the step is host-bound on small models).
        device, dtype = first[0].device, first[0].dtype
        same_length = all(len(items) == len(first) for items in lists)  # else zip's truncation, below
        if same_length and all(t.dtype is dtype and t.device == device for t in first):
            return [tuple(list(items) for items in lists)]
    buckets: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], ...]] = {}
    for items in zip(*lists):
        key = (items[0].device, items[0].dtype)
        bucket = buckets.get(key)
        if bucket is None:
            bucket = buckets[key] = tuple([] for _ in lists)
        for out, t in zip(bucket, items):
            out.append(t)
    return list(buckets.values())


def kept_buffer(store: dict, p: torch.Tensor) -> torch.Tensor:
    """``store``'s buffer for ``p``, made (uninitialised, ``p``'s shape, device, dtype and layout) on first use and
    again only when ``p`` changed one of them: the methods' per-step state then allocates nothing."""
    buf = store.get(p)
    if buf is None or buf.shape != p.shape or buf.device != p.device or buf.dtype != p.dtype:
        buf = store[p] = torch.empty_like(p, memory_format=torch.preserve_format)
    return buf


def _following_casts(step: Callable) -> Callable:
    """``step`` (a Method's ``train_step`` or ``first_step``), with its state made to follow a cast of the model
    first (``Method._follow_casts``); a step entered from inside another (SAM's train_step calls first_step, a
    scheduled method its inner one's train_step on itself) checks once."""

    @functools.wraps(step)
    def wrapped(self, *args, **kwargs):
        if self.__dict__.get("_entered", 0) == 0 and "_cast_key" in self.__dict__:
            self._follow_casts()
        self.__dict__["_entered"] = self.__dict__.get("_entered", 0) + 1
        try:
            return step(self, *args, **kwargs)
        finally:
            self._entered -= 1

    return wrapped


class _BNGuard:
    """Snapshot BatchNorm buffers after pass 1 and restore them after pass 2.

    docs/algorithms.md ("BatchNorm"): the running statistics after a step equal those of pass 1 alone. Setting momentum=0
    is not enough (``num_batches_tracked`` still moves, and momentum=None means a cumulative average),
    so the buffers are copied back exactly. ``model.to()`` replaces the buffers: each step checks that the buffers
    are the objects the cached copy plan was built for (one identity test each) and rebuilds it when one is not.
    """

    _NAMES = ("running_mean", "running_var", "num_batches_tracked")

    def __init__(self, model: nn.Module | None):
        self.modules = (
            [] if model is None else [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        )
        self._saved: list[torch.Tensor] = []
        # The buffers the plan was built for, and its per-(device, dtype) (saved, buffers) lists: the step is often
        # bound by the host, so the per-step cost is one identity check per buffer, not a regrouping.
        self._for: list[torch.Tensor | None] = []
        self._pairs: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []

    def _buffers(self) -> list[torch.Tensor]:
        return [b for m in self.modules for name in self._NAMES if (b := getattr(m, name, None)) is not None]

    def _current(self) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
        now = [getattr(m, name, None) for m in self.modules for name in self._NAMES]
        if len(now) == len(self._for) and all(a is b for a, b in zip(now, self._for)):
            return self._pairs
        bufs = [b for b in now if b is not None]
        stale = len(self._saved) != len(bufs) or any(
            s.shape != b.shape or s.device != b.device or s.dtype != b.dtype for s, b in zip(self._saved, bufs)
        )
        if stale:
            self._saved = [torch.empty_like(b) for b in bufs]
        self._for = now
        self._pairs = group_by_device_dtype(self._saved, bufs)
        return self._pairs

    def snapshot(self) -> None:
        if not self.modules:
            return
        for dst, src in self._current():
            torch._foreach_copy_(dst, src)

    def restore(self) -> None:
        if not self.modules:
            return
        now = [getattr(m, name, None) for m in self.modules for name in self._NAMES]
        if len(now) == len(self._for) and all(a is b for a, b in zip(now, self._for)):
            for saved, bufs in self._pairs:
                torch._foreach_copy_(bufs, saved)
            return
        # Buffers replaced between snapshot and restore: the snapshot goes back into the ones there now.
        for dst, src in group_by_device_dtype(self._buffers(), self._saved):
            torch._foreach_copy_(dst, src)

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers())


class StepKeywords(TypedDict, total=False):
    """The keywords every method's constructor takes besides its own knobs: the model being trained (the DDP
    wrapper if any; BN protection and ``no_sync``), ``grad_clip``, the fp16 ``scaler``, ``global_perturbation``,
    ``accumulate`` (micro-batches per step) and ``scope`` (which parameters a perturbing method moves: 'all', 'norm'
    or include/exclude name patterns; docs/algorithms.md, "Scope").

    A subclass takes them as ``**common: Unpack[StepKeywords]`` and hands them on unread to
    ``super().__init__(base_optimizer, **common)``: their defaults and checks live in ``Method.__init__`` alone, and
    ``help()`` shows each subclass's signature with them spelled out (``Method.__init_subclass__``).
    """

    model: nn.Module | None
    grad_clip: float | None
    scaler: torch.amp.GradScaler | None
    global_perturbation: bool
    accumulate: int
    scope: str | dict


def _shared_keywords() -> list[inspect.Parameter]:
    """``Method.__init__``'s keyword-only parameters: the shared keywords with their one set of defaults."""
    return [p for p in inspect.signature(Method.__init__).parameters.values() if p.kind is p.KEYWORD_ONLY]


class Method(abc.ABC):
    """One training step of an optimisation method around a ready base optimizer.

    ``train_step(forward, inputs=, indices=, epoch=)`` does every zero_grad, backward, extra loss,
    perturbation, BN-stat protection, DDP ``no_sync``, fp16 scaling, clipping and the base step itself;
    the training loop never branches on the method. With ``accumulate > 1`` every pass runs over that many
    micro-batches of the batch (``forward(rows)``), their gradients adding up to the whole batch's mean.
    """

    name: str = ""
    #: Two-pass methods need the model (BN protection, DDP no_sync): one rule for the classes and create().
    needs_model: bool = False
    #: Whether the method moves the weights to a perturbed point (and so takes a ``scope`` other than 'all').
    perturbs: bool = False
    #: A per-parameter buffer kept across steps (w saved, momenta, EMAs): one rule for every method's state.
    _buffer = staticmethod(kept_buffer)

    def __init_subclass__(cls, **kwargs):
        """A subclass's ``__init__(..., **common: Unpack[StepKeywords])`` is shown (``help()``, ``inspect.signature``)
        with ``**common`` replaced by ``Method.__init__``'s keyword-only parameters and their defaults, which is
        what it accepts; the call itself still goes through ``**common``, so nothing is checked twice."""
        super().__init_subclass__(**kwargs)
        for entry in ("train_step", "first_step"):
            if entry in cls.__dict__ and not getattr(cls.__dict__[entry], "__isabstractmethod__", False):
                setattr(cls, entry, _following_casts(cls.__dict__[entry]))
        init = cls.__dict__.get("__init__")
        if init is None:
            return
        sig = inspect.signature(init)
        params = list(sig.parameters.values())
        if params and params[-1].kind is inspect.Parameter.VAR_KEYWORD:
            init.__signature__ = sig.replace(parameters=params[:-1] + _shared_keywords())

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        *,
        model: nn.Module | None = None,
        grad_clip: float | None = None,
        scaler: torch.amp.GradScaler | None = None,
        global_perturbation: bool = False,
        accumulate: int = 1,
        scope: str | dict = "all",
    ):
        if not isinstance(base_optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"base_optimizer must be a torch.optim.Optimizer instance, got {type(base_optimizer).__name__}; "
                "build it first, e.g. torch.optim.AdamW(model.parameters(), lr=1e-3)"
            )
        if grad_clip is not None:
            check(
                grad_clip > 0 and math.isfinite(grad_clip),
                "grad_clip",
                "0 < grad_clip < inf (or None)",
                grad_clip,
                "pass a positive max norm such as 1.0, or None for no clipping",
            )
        check(
            isinstance(accumulate, int) and not isinstance(accumulate, bool) and accumulate >= 1,
            "accumulate",
            "accumulate >= 1 (an integer number of micro-batches)",
            accumulate,
            "pass data.accumulate=1 for one pass over the whole batch, or the number of micro-batches per step",
        )
        if self.needs_model and not isinstance(model, nn.Module):
            raise ValueError(
                f"model must be the nn.Module being trained (the DDP wrapper if any), but got model={model!r}; "
                f"{type(self).__name__} needs it to keep BatchNorm statistics to pass 1 alone and to run pass 1 "
                f"under DDP no_sync: pass model=net (optim.create asks for it too)"
            )
        self.base_optimizer = base_optimizer
        self.model = model
        self._cast_key: list | None = None  # the parameters' (dtype, device) when the method's state last matched
        self._entered = 0  # steps under way: the outermost entry alone checks for a cast
        self.grad_clip = grad_clip
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        self.global_perturbation = bool(global_perturbation)
        self.accumulate = accumulate
        self._bn = _BNGuard(model)
        self.scope = check_scope(scope)
        self._scope: frozenset[torch.Tensor] | None = None  # None: every parameter (scope 'all')
        if self.scope != "all":
            if not self.perturbs:
                raise ValueError(
                    f"scope must be 'all' for a method that does not perturb the weights, but got scope={scope!r} "
                    f"for {type(self).__name__}; pass scope='all', or a perturbing method (sam, asam, gsam, ...)"
                )
            if not isinstance(model, nn.Module):
                raise ValueError(
                    f"scope={scope!r} names parameters of the model, but got model={model!r}; pass model=net"
                )
            self._scope = resolve_scope(self.scope, unwrap(model), self._params())

    # ----------------------------------------------------------------- the interface
    @abc.abstractmethod
    def train_step(
        self,
        forward: Forward,
        *,
        inputs: torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
        epoch: int = 0,
    ) -> StepOutput:
        """One optimisation step on the current batch; calls ``forward()`` once or twice."""

    @property
    @abc.abstractmethod
    def passes_per_step(self) -> float:
        """Forward+backward passes per step on average, for cost reporting."""

    def compile_modules(self, compiler: Callable[[nn.Module], nn.Module]) -> None:
        """Run the forwards of the modules the method keeps itself (MESA's teacher) through ``compiler(module)``,
        e.g. a ``torch.compile`` wrapper; the step's own model is the caller's to compile. Weights, buffers and
        state stay those of the eager modules. Nothing to do for most methods."""

    def extra_state_bytes(self) -> int:
        """Memory the method holds beyond the base optimizer (saved w, stored directions, buffers, teacher)."""
        return 0

    def run_warnings(self, *, epochs: int, steps_per_epoch: int) -> list[str]:
        """Why a run of ``epochs`` x ``steps_per_epoch`` steps is too short for the method's settings (the loop
        warns with each message before training); none for most methods."""
        return []

    def state_dict(self) -> dict:
        """The base optimizer's state, the method's own, and the GradScaler's (``None`` without fp16 scaling).

        The scaler is included because the method drives it (which steps it skips and backs off on): a
        resumed run continues the trajectory only with the same loss scale. A caller that also saves the
        scaler itself saves the same state twice, which is harmless.
        """
        return {
            "base_optimizer": self.base_optimizer.state_dict(),
            "method": self._method_state(),
            "scaler": None if self.scaler is None else self.scaler.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``. A checkpoint's scaler state is loaded when this method has a scaler; a
        checkpoint without one (no fp16 then, or older) leaves the scaler as it is."""
        self.base_optimizer.load_state_dict(state["base_optimizer"])
        self._load_method_state(state.get("method", {}))
        scaler_state = state.get("scaler")
        if self.scaler is not None and scaler_state:
            self.scaler.load_state_dict(scaler_state)

    def _follow_casts(self) -> None:
        """Where the parameters' dtypes or devices changed since the last step (``model.double()``, ``model.to(dev)``
        keep the parameter objects and replace their data), put the method's own state on them as a method built
        after the cast and loaded from a checkpoint would have it (``_by_param`` casts each tensor to its
        parameter's dtype and device). The buffers the steps reuse (saved w, g, noise, the step plans) check or key
        on dtype and device themselves. One (dtype, device) read per parameter per step."""
        key = [(p.dtype, p.device) for p in self._params()]
        if key != self._cast_key:
            if self._cast_key is not None:
                self._on_cast()
            self._cast_key = key

    def _on_cast(self) -> None:
        """The method's state re-made on the parameters' current dtypes and devices (see ``_follow_casts``)."""
        self._load_method_state(self._method_state())

    def _method_state(self) -> dict:
        return {}

    def _load_method_state(self, state: dict) -> None:
        pass

    def _indexed(self, buffers: dict) -> dict:
        """Per-parameter tensors keyed by the parameter's index in `_params()`: how a checkpoint stores them."""
        index = {p: i for i, p in enumerate(self._params())}
        return {index[p]: t.detach().clone() for p, t in buffers.items()}

    def _by_param(self, saved: dict) -> dict:
        """`_indexed`'s inverse: each saved tensor back on its parameter's device and dtype."""
        params = self._params()
        return {params[int(i)]: t.to(device=params[int(i)].device, dtype=params[int(i)].dtype).clone()
                for i, t in saved.items()}  # fmt: skip

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, base={type(self.base_optimizer).__name__})"

    # ----------------------------------------------------------------- shared machinery
    def _pass(
        self,
        forward: Forward,
        *,
        local: bool,
        rows: slice | torch.Tensor | None = None,
        n: int | None = None,
        per_sample: bool = False,
        extra: Callable[[torch.Tensor, slice | torch.Tensor | None], torch.Tensor | None] | None = None,
    ):
        """ONE forward+backward of the mean loss over ``rows`` of the batch (all of it when None), in
        ``self.accumulate`` micro-batches: each backward is weighted by its share of the rows, so the summed
        gradient is the mean over all of them (docs/algorithms.md, "Gradient accumulation").

        ``local``: no DDP all-reduce at all (per-replica pass); otherwise DDP syncs on the last micro-batch
        only. ``extra(logits, rows)``: an added loss (SAF, MESA) per micro-batch. ``n``: the batch's rows,
        needed only to split it. Returns ``(mean loss, logits, per-sample losses or None, mean extra or None)``,
        detached: they are for reporting.
        """
        if rows is None and self.accumulate == 1 and not per_sample:
            with self._no_sync() if local else contextlib.nullcontext():
                loss, logits = forward()
                added = extra(logits, None) if extra is not None else None
                self._backward(loss if added is None else loss + added)
            return loss.detach(), logits.detach(), None, None if added is None else added.detach()
        if rows is None and self.accumulate == 1:
            plan: list[tuple[slice | torch.Tensor | None, float]] = [(None, 1.0)]
        else:
            if rows is None and n is None:
                raise ValueError(
                    f"{self.name}: inputs= must be the batch tensor (its first dimension is the number of samples) "
                    f"when a step works on parts of the batch (accumulate={self.accumulate}); pass "
                    "train_step(forward, inputs=x, ...) with a forward(rows=None, reduction='mean')"
                )
            total = n if rows is None else _count(rows)
            plan = [
                (_take(rows, sub), (sub.stop - sub.start) / total)
                for sub in split_rows(total, min(self.accumulate, total))
            ]
        losses, logits_out, samples, extras = [], [], [], []
        for k, (part, weight) in enumerate(plan):
            sync_here = not local and k == len(plan) - 1
            with contextlib.nullcontext() if sync_here else self._no_sync():
                if per_sample:
                    per, logits = forward(part, reduction="none")
                    loss = per.mean()
                    samples.append(per.detach())
                else:
                    loss, logits = forward(part)
                added = extra(logits, part) if extra is not None else None
                total_loss = loss if added is None else loss + added
                self._backward(total_loss if weight == 1.0 else total_loss * weight)
            losses.append(loss.detach() * weight)
            logits_out.append(logits.detach())
            if added is not None:
                extras.append(added.detach() * weight)
        loss = torch.stack(losses).sum() if len(losses) > 1 else losses[0]
        logits = torch.cat(logits_out) if len(logits_out) > 1 else logits_out[0]
        per = (torch.cat(samples) if len(samples) > 1 else samples[0]) if per_sample else None
        added = (torch.stack(extras).sum() if len(extras) > 1 else extras[0]) if extras else None
        return loss, logits, per, added

    def _one_pass_step(self, forward: Forward, inputs: torch.Tensor | None, extra=None, before_finish=None):
        """The whole one-pass step every one-pass method shares: zero_grad, the (accumulated) pass, an
        optional hook on the gradients, one base step, zero_grad. Returns ``(loss, logits, extra, skipped)``."""
        self._zero_grad()
        loss, logits, _, added = self._pass(forward, local=False, n=batch_rows(inputs), extra=extra)
        if before_finish is not None:
            before_finish()
        skipped = self._finish()
        self._zero_grad()
        return loss, logits, added, skipped

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
            torch._foreach_copy_(
                bucket, [c.view_as(t) for c, t in zip(flat.split([t.numel() for t in bucket]), bucket)]
            )

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.base_optimizer.param_groups for p in g["params"]]

    def _params_with_grad(self) -> list[torch.Tensor]:
        return [p for g in self.base_optimizer.param_groups for p in g["params"] if p.grad is not None]

    def _in_scope(self, p: torch.Tensor) -> bool:
        """Whether the perturbation moves ``p`` (docs/algorithms.md, "Scope")."""
        return self._scope is None or p in self._scope

    def _zero_grad(self) -> None:
        self.base_optimizer.zero_grad(set_to_none=True)

    def _backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def _no_sync(self) -> contextlib.AbstractContextManager:
        """DDP ``no_sync`` (wrapping forward AND backward), or nothing on one process."""
        no_sync = getattr(self.model, "no_sync", None)
        return (
            no_sync()
            if isinstance(self.model, nn.parallel.DistributedDataParallel) and no_sync
            else contextlib.nullcontext()
        )

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
            self._before_base_step()
            opt.step()
            return False
        if _skipped_on_overflow(scaler, opt, found_earlier):
            return True
        if self.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self._params_with_grad(), self.grad_clip, foreach=True)
        self._before_base_step()
        scaler.step(opt)
        scaler.update()
        return False

    def _before_base_step(self) -> None:
        """A hook on the final, unscaled and clipped gradients of a step that is taken, just before the base
        optimizer's step (MSAM moves its L2 weight decay to the perturbed point here); nothing by default."""


def batch_rows(inputs: torch.Tensor | None) -> int | None:
    return None if inputs is None else int(inputs.shape[0])


def _skipped_on_overflow(
    scaler: torch.amp.GradScaler, opt: torch.optim.Optimizer, found_earlier: torch.Tensor | None
) -> bool:
    """fp16: unscale ``opt``'s gradients; on an inf/nan there or in ``found_earlier`` (pass 1's flag), record it where
    ``scaler.update`` reads it, back off once and return True: the step is skipped, its optimizer never called."""
    scaler.unscale_(opt)
    flags = _found_inf_per_device(scaler, opt)
    total = torch.zeros((), dtype=torch.float32)
    for f in flags.values():
        total = total + f.to(torch.float32).sum().cpu()
    if found_earlier is not None:
        total = total + found_earlier.to(torch.float32).sum().cpu()
    if not bool(total > 0):
        return False
    # Not scaler.step: a fused AdamW/SGD would be called with found_inf = (sum of both passes' flags) and its kernel
    # skips only when that equals 1.0 (2.0 stepped with NaN gradients and moved Adam's step backwards); a skipped
    # fused SGD first step also leaves an uninitialised momentum buffer. update() backs off once when any recorded
    # flag is non-zero, so pass 1's verdict is written where update() reads it.
    if flags:
        next(iter(flags.values())).fill_(1.0)
    else:
        flags[found_earlier.device] = torch.ones((), dtype=torch.float32, device=found_earlier.device)
    scaler.update()
    return True


class SeededDraws:
    """One seeded generator per device for a method's random draws (RWP's noise, bSAM's weight noise), with the
    states a checkpoint keeps; the class sets ``_seed`` and ``_gens`` (a dict) in its ``__init__``."""

    _seed: int
    _gens: dict[str, torch.Generator]
    # (device, dtype, shapes) -> (one flat buffer, its views shaped as the tensors): made once per parameter list.
    # The key holds what a view's validity rests on, so a cast or a move of the model (``model.double()``) or a
    # resized tensor draws into a fresh buffer instead of a stale one.
    _noise_buffers: dict[tuple, tuple[torch.Tensor, list[torch.Tensor]]]

    def _noise(self, ps: list[torch.Tensor]) -> list[torch.Tensor]:
        """A standard normal draw for the tensors ``ps`` (one device and dtype), shaped as each: one ``randn`` of
        all their elements from the device's generator, split into them in order. Drawn into a kept buffer whose
        views are made once (``randn(out=)`` fills it exactly as a fresh ``randn`` would), not one view per tensor
        per step: a host-bound step pays per op."""
        key = (ps[0].device, ps[0].dtype, tuple(p.shape for p in ps))
        buffers = self.__dict__.setdefault("_noise_buffers", {})
        found = buffers.get(key)
        if found is None:
            flat = torch.empty(sum(p.numel() for p in ps), dtype=ps[0].dtype, device=ps[0].device)
            found = buffers[key] = (flat, [z.view(p.shape) for p, z in zip(ps, flat.split([p.numel() for p in ps]))])
        flat, views = found
        torch.randn(flat.shape, generator=self._gen(ps[0].device), out=flat)
        return views

    def _gen(self, device: torch.device) -> torch.Generator:
        key = str(device)
        gen = self._gens.get(key)
        if gen is None:
            gen = self._gens[key] = torch.Generator(device=device).manual_seed(self._seed)
        return gen

    def _gen_states(self) -> dict[str, torch.Tensor]:
        return {k: g.get_state() for k, g in self._gens.items()}

    def _set_gen_states(self, states: dict[str, torch.Tensor]) -> None:
        """The generators as ``states`` has them; one made since (first drawn on a skipped step) is dropped, to be
        made again, freshly seeded, when next drawn on."""
        for key in set(self._gens) - set(states):
            del self._gens[key]
        for key, state in states.items():
            self._gen(torch.device(key)).set_state(state)


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
            "update optim._method._found_inf_per_device for this torch version"
        )
    return state[id(opt)]["found_inf_per_device"]


@registered
class BaseOnly(Method):
    """``none``: the base optimizer alone, one forward and backward per step."""

    def train_step(
        self,
        forward: Forward,
        *,
        inputs: torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
        epoch: int = 0,
    ) -> StepOutput:
        loss, logits, _, skipped = self._one_pass_step(forward, inputs)
        return StepOutput(loss=loss, logits=logits, perturbed_loss=None, extra_loss=None, rho=None, skipped=skipped)

    @property
    def passes_per_step(self) -> float:
        return 1.0
