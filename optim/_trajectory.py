"""SAF and MESA (Du et al. 2022): the trajectory loss, SAF's ring buffer of past logits, MESA's EMA teacher, and their one-pass Method."""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Unpack, cast

import torch
import torch.nn.functional as F
from torch import nn

from ._method import (
    Forward,
    Method,
    StepKeywords,
    StepOutput,
    check,
    group_by_device_dtype,
    unwrap,
)
from ._specs import registered

__all__ = ["MESA", "SAF", "Regularised", "trajectory_kl"]


def trajectory_kl(student_logits: torch.Tensor, target_logits: torch.Tensor, tau: float) -> torch.Tensor:
    """``tau**2 * batch mean of KL(softmax(target/tau) || softmax(student/tau))`` (Eq. 9/13 without lambda).

    ``log_softmax`` on both sides in float32 (float64 stays float64; never ``softmax().log()``, which
    underflows to -inf); the target is detached. tau**2 keeps the gradient's size independent of tau.
    """
    return _weighted_kl(student_logits, target_logits, tau, 1.0)


def _weighted_kl(student_logits: torch.Tensor, target_logits: torch.Tensor, tau: float, weight: float) -> torch.Tensor:
    """``weight * trajectory_kl``, with the two constants folded into one multiply (fewer kernels per step)."""
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    log_s = F.log_softmax(student_logits.to(dtype) / tau, dim=-1)
    log_t = F.log_softmax(target_logits.detach().to(dtype) / tau, dim=-1)
    return (weight * tau * tau) * F.kl_div(log_s, log_t, reduction="batchmean", log_target=True)


def _recorded_kl(student_logits: torch.Tensor, past: torch.Tensor, tau: float, weight: float) -> torch.Tensor:
    """``_weighted_kl`` averaged over the samples that have a record (rows of ``past`` without NaN).

    A sample with no logits from ``e_tilde`` epochs ago (first seen, or skipped by the sampler that
    epoch) has no trajectory target: it is left out of the loss and of the mean, instead of being
    pulled towards the uniform distribution that a zero-filled buffer would give. Its target is
    replaced by its own detached logits, whose KL and gradient are exactly zero (no NaN leaks into the
    sum), and the mean divides by the number recorded: no host sync.
    """
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    z = student_logits.reshape(past.shape[0], -1)
    recorded = ~torch.isnan(past).any(dim=-1)
    target = torch.where(recorded[:, None], past.to(dtype), z.detach().to(dtype))
    log_s = F.log_softmax(z.to(dtype) / tau, dim=-1)
    log_t = F.log_softmax(target / tau, dim=-1)
    per_sample = F.kl_div(log_s, log_t, reduction="none", log_target=True).sum(dim=-1)
    return (weight * tau * tau) * per_sample.sum() / recorded.sum().clamp(min=1).to(dtype)


def _world() -> tuple[int, object]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist
    return 1, None


class SAF:
    """Sharpness-Aware training for Free: ``lam * trajectory_kl(z, z_past, tau)`` with ``z_past`` the SAME
    sample's logits recorded ``e_tilde`` epochs ago.

    Ring buffer of ``e_tilde + 1`` epoch slots x ``num_samples`` (index in the FULL training set) x
    ``num_classes``, float16: epoch ``e`` writes slot ``e % (e_tilde+1)`` and reads slot
    ``(e - e_tilde) % (e_tilde+1)``. Active when ``epoch > e_start`` (0-indexed); ``e_start >= e_tilde``.
    A slot is emptied (NaN) when a new epoch starts writing it, so a sample not seen in epoch
    ``e - e_tilde`` has no record and is left out of the loss (never a zero or an older epoch's logits).
    Reading an epoch that recorded nothing at all (a resume without this state, an epoch number that
    jumped) raises.
    Under data parallelism every step all-gathers (index, logits) so that each rank's buffer holds every
    sample, whichever rank saw it (the official per-rank buffer reads wrong logits under DDP).
    """

    def __init__(
        self,
        num_samples: int,
        num_classes: int,
        lam: float = 0.3,
        tau: float = 5.0,
        e_tilde: int = 3,
        e_start: int = 5,
        *,
        device: torch.device | str | None = None,
    ):
        check(
            isinstance(num_samples, int) and num_samples >= 1,
            "num_samples",
            "num_samples >= 1",
            num_samples,
            "pass the size of the FULL training set (indices go up to num_samples - 1)",
        )
        check(
            isinstance(num_classes, int) and num_classes >= 1,
            "num_classes",
            "num_classes >= 1",
            num_classes,
            "pass the number of classes (the logits' last dimension)",
        )
        knobs = build_saf.spec.check_knobs(lam=lam, tau=tau, e_tilde=e_tilde, e_start=e_start)
        self.num_samples, self.num_classes = num_samples, num_classes
        self.lam, self.tau, self.e_tilde, self.e_start = knobs["lam"], knobs["tau"], e_tilde, e_start
        self.slots = e_tilde + 1
        self.buffer_dtype = torch.float16
        #: Size of the ring buffer in bytes (say it in the logs).
        self.buffer_bytes = self.slots * num_samples * num_classes * torch.finfo(self.buffer_dtype).bits // 8
        self.buffer: torch.Tensor | None = None
        #: The epoch each slot holds (-1: none yet; None: unknown, from a checkpoint made before this was kept).
        self.slot_epochs: list[int | None] = [-1] * self.slots
        if device is not None:
            self._ensure(torch.device(device))

    def _ensure(self, device: torch.device) -> torch.Tensor:
        if self.buffer is None or self.buffer.device != device:
            old = self.buffer
            self.buffer = torch.full(
                (self.slots, self.num_samples, self.num_classes), math.nan, dtype=self.buffer_dtype, device=device
            )
            if old is not None:
                self.buffer.copy_(old)
        return self.buffer

    def active(self, epoch: int) -> bool:
        return epoch > self.e_start

    def record(self, logits: torch.Tensor, indices: torch.Tensor, epoch: int) -> torch.Tensor:
        """Write this step's logits into epoch's slot (all ranks' samples); returns ``indices`` on the device."""
        buf = self._ensure(logits.device)
        slot = epoch % self.slots
        if self.slot_epochs[slot] != epoch:
            # The slot held epoch - slots: empty it, or a sample unseen this epoch would later read logits
            # from 2 e_tilde + 1 epochs back.
            buf[slot].fill_(math.nan)
            self.slot_epochs[slot] = epoch
        idx = indices.to(device=logits.device, dtype=torch.long, non_blocking=True).reshape(-1)
        rec = logits.detach().reshape(idx.numel(), -1).to(self.buffer_dtype)
        world, dist = _world()
        if world > 1:
            # B x C numbers per rank: cheap next to a gradient all-reduce. Needs the same B on every rank
            # (DistributedSampler gives every rank the same number of samples).
            all_idx = [torch.empty_like(idx) for _ in range(world)]
            all_rec = [torch.empty_like(rec) for _ in range(world)]
            dist.all_gather(all_idx, idx)
            dist.all_gather(all_rec, rec)
            gidx, grec = torch.cat(all_idx), torch.cat(all_rec)
        else:
            gidx, grec = idx, rec
        buf[slot].index_copy_(0, gidx, grec)
        return idx

    def loss(self, logits: torch.Tensor, sample_indices: torch.Tensor, epoch: int) -> torch.Tensor:
        """Record ``logits`` and return ``lam * trajectory_kl(logits, past, tau)`` (zero before ``e_start``)."""
        value = self.past_loss(logits, sample_indices, epoch)
        self.record(logits, sample_indices, epoch)
        return value

    def past_loss(self, logits: torch.Tensor, sample_indices: torch.Tensor, epoch: int) -> torch.Tensor:
        """``lam * trajectory_kl(logits, past, tau)`` over the samples recorded ``e_tilde`` epochs ago (zero before
        ``e_start``), without recording: epoch ``e`` reads another slot than it writes, so the write can wait
        until the step is known not to be skipped."""
        if not self.active(epoch):
            return logits.new_zeros((), dtype=torch.float32)
        past_epoch = epoch - self.e_tilde
        read = past_epoch % self.slots
        held = self.slot_epochs[read]
        if held is not None and held != past_epoch:
            raise ValueError(
                f"epoch must follow on from the recorded epochs: SAF at epoch={epoch} reads the logits of epoch "
                f"{past_epoch} (e_tilde={self.e_tilde}), but that slot holds "
                f"{'nothing' if held < 0 else f'epoch {held}'}; call train_step in every epoch from 0 on "
                "(recording starts before e_start), and on resume load the method's state_dict()"
            )
        buf = self._ensure(logits.device)
        idx = sample_indices.to(device=logits.device, dtype=torch.long, non_blocking=True).reshape(-1)
        return _recorded_kl(logits, buf[read].index_select(0, idx), self.tau, self.lam)

    # ------------------------------------------------------------ the regulariser protocol (Regularised)
    #: Forward+backward passes a step adds (none: the lookup is an index_select).
    extra_passes = 0.0

    def check_batch(self, inputs: torch.Tensor | None, indices: torch.Tensor | None) -> None:
        if indices is None:
            raise ValueError(
                "saf needs indices=: each sample's index in the FULL training set, "
                "to record and look up its logits; pass train_step(..., indices=idx)"
            )

    def extra_loss(self, logits: torch.Tensor, inputs: torch.Tensor | None, indices: torch.Tensor, epoch: int):
        return self.past_loss(logits, indices, epoch) if self.active(epoch) else None

    def after_step(self, logits: torch.Tensor, indices: torch.Tensor, epoch: int) -> None:
        self.record(logits, indices, epoch)

    def run_warnings(self, *, epochs: int, steps_per_epoch: int) -> list[str]:
        if epochs - 1 <= self.e_start:
            return [
                (
                    f"saf: the trajectory loss is never on: it is active when epoch > e_start={self.e_start}, and "
                    f"this run's epochs are 0..{epochs - 1}. Fix: lower optimizer.hparams.e_start or train longer."
                )
            ]
        return []

    def nbytes(self) -> int:
        return self.buffer_bytes

    def state_dict(self) -> dict:
        return {"buffer": self.buffer, "slot_epochs": list(self.slot_epochs)}

    def load_state_dict(self, state: dict) -> None:
        buf = state.get("buffer")
        self.slot_epochs = list(state.get("slot_epochs", [None] * self.slots))
        if buf is None:
            self.buffer = None
            return
        check(
            tuple(buf.shape) == (self.slots, self.num_samples, self.num_classes),
            "buffer shape",
            f"== {(self.slots, self.num_samples, self.num_classes)}",
            tuple(buf.shape),
            "load a checkpoint made with the same num_samples, num_classes and e_tilde",
        )
        device = self.buffer.device if self.buffer is not None else buf.device
        self.buffer = buf.to(device=device, dtype=self.buffer_dtype).clone()


class MESA:
    """Memory-Efficient Sharpness-Aware training: the trajectory loss against an EMA teacher's logits.

    The teacher is an exponential moving average of the model's weights AND buffers, created here (a copy of
    the initial model) and updated by ``update()`` after every optimizer step from step 0. The decay of the
    t-th update (t = 0, 1, ...) is warmed up: ``beta_t = min(beta, (1 + t) / (10 + t))`` (the num_updates rule
    of TensorFlow's ExponentialMovingAverage). Without it the teacher stays the random initial model for
    about 1 / (1 - beta) steps (5,000 at beta = 0.9998; after 1,320 steps 77% of it is still the
    initialisation), and MESA pulls the student towards near-uniform outputs instead of its own recent past.
    ``beta`` itself is reached after ``warmup_steps`` updates (44,990 at 0.9998): in the paper's regime
    (hundreds of thousands of steps) the teacher is the paper's EMA for all but the first tenth of training.
    Its forward runs in eval mode under ``no_grad``, in the training autocast dtype. Active when
    ``epoch > e_start``.
    """

    def __init__(self, model: nn.Module, beta: float = 0.9998, lam: float = 0.8, tau: float = 5.0, e_start: int = 5):
        knobs = build_mesa.spec.check_knobs(beta=beta, lam=lam, tau=tau, e_start=e_start)
        self.beta, self.lam, self.tau, self.e_start = knobs["beta"], knobs["lam"], knobs["tau"], e_start
        self.student = unwrap(model)
        self.teacher = copy.deepcopy(self.student)
        self.teacher.requires_grad_(False)
        self.teacher.eval()
        #: EMA updates taken so far (the t of beta_t); saved with the teacher.
        self.updates = 0
        self._pairs()
        self._teacher_forward: nn.Module | None = None  # the compiled teacher, when the caller compiles it

    def compile_modules(self, compiler) -> None:
        """The teacher's forward runs through ``compiler(teacher)``; its weights stay ``self.teacher``'s."""
        self._teacher_forward = compiler(self.teacher)

    def decay(self, t: int) -> float:
        """The decay of the t-th EMA update: ``min(beta, (1 + t) / (10 + t))``."""
        return min(self.beta, (1.0 + t) / (10.0 + t))

    @property
    def warmup_steps(self) -> int:
        """Updates after which the decay is ``beta`` itself: the least t with (1 + t) / (10 + t) >= beta."""
        t = max(0, math.ceil((10.0 * self.beta - 1.0) / (1.0 - self.beta)))
        # The closed form may be one off in floating point: settle it on the rule itself.
        while (1.0 + t) / (10.0 + t) < self.beta:
            t += 1
        while t > 0 and t / (9.0 + t) >= self.beta:
            t -= 1
        return t

    def run_warnings(self, *, epochs: int, steps_per_epoch: int) -> list[str]:
        """Why a run of `epochs` x `steps_per_epoch` steps is too short for these settings (empty when it is not)."""
        notes = []
        if epochs - 1 <= self.e_start:
            notes.append(
                f"mesa: the trajectory loss is never on: it is active when epoch > e_start={self.e_start}, and this run's "
                f"epochs are 0..{epochs - 1}. Fix: lower optimizer.hparams.e_start below {epochs - 1} or train longer."
            )
        total = epochs * steps_per_epoch
        if total < self.warmup_steps:
            end = self.decay(total)
            notes.append(
                f"mesa: beta={self.beta:g} is reached after {self.warmup_steps:,} EMA updates, and this run takes "
                f"{total:,}; the warmed-up decay ends at {end:.4f}, so the teacher averages about the last "
                f"{1.0 / (1.0 - end):.0f} steps instead of the paper's {1.0 / (1.0 - self.beta):.0f}. The teacher is still "
                "a recent average of the model (not its initialisation), but this is not the paper's regime."
            )
        return notes

    def _pairs(self) -> None:
        s_named = dict(self.student.named_parameters())
        s_named.update(self.student.named_buffers())
        t_named = dict(self.teacher.named_parameters())
        t_named.update(self.teacher.named_buffers())
        self._float_t, self._float_s, self._other_t, self._other_s = [], [], [], []
        for name, t in t_named.items():
            s = s_named[name]
            if t.is_floating_point():
                self._float_t.append(t)
                self._float_s.append(s)
            else:  # e.g. num_batches_tracked: copied, an average of counters means nothing
                self._other_t.append(t)
                self._other_s.append(s)

    @torch.no_grad()
    def follow_student(self) -> None:
        """After a cast or a move of the model (``model.double()``, ``model.to(device)``): each teacher tensor on
        its student counterpart's dtype and device (as a teacher copied from the cast model and loaded from a
        checkpoint is), and the pairs the EMA reads made again (the cast replaced the student's buffers)."""
        s_named = dict(self.student.named_parameters())
        s_named.update(self.student.named_buffers())
        for name, t in self.teacher.named_parameters():
            s = s_named[name]
            if (t.dtype, t.device) != (s.dtype, s.device):
                t.data = t.data.to(device=s.device, dtype=s.dtype)
        for prefix, module in self.teacher.named_modules():
            for key, b in list(module._buffers.items()):
                s = s_named.get(f"{prefix}.{key}" if prefix else key)
                if b is not None and s is not None and (b.dtype, b.device) != (s.dtype, s.device):
                    module._buffers[key] = b.to(device=s.device, dtype=s.dtype)
        self._pairs()

    def active(self, epoch: int) -> bool:
        return epoch > self.e_start

    @torch.no_grad()
    def teacher_logits(self, inputs: torch.Tensor, like: torch.Tensor | None = None) -> torch.Tensor:
        """The teacher's logits, eval mode, no_grad, in the training autocast dtype.

        When the caller's autocast is no longer active here (``forward()`` entered and left it), it is
        re-entered with the dtype the student's logits came out in.
        """
        device_type = inputs.device.type
        ctx: contextlib.AbstractContextManager = contextlib.nullcontext()
        if (
            like is not None
            and like.dtype in (torch.float16, torch.bfloat16)
            and not torch.is_autocast_enabled(device_type)
            and self._float_t
            and self._float_t[0].dtype != like.dtype
        ):
            ctx = torch.autocast(device_type, dtype=like.dtype)
        with ctx:
            return (self.teacher if self._teacher_forward is None else self._teacher_forward)(inputs)

    # ------------------------------------------------------------ the regulariser protocol (Regularised)
    #: The teacher's no-grad forward: about a third of a forward+backward.
    extra_passes = 1.0 / 3.0

    def check_batch(self, inputs: torch.Tensor | None, indices: torch.Tensor | None) -> None:
        if inputs is None:  # at every step, not only once the loss is active: fail in the first minute
            raise ValueError("mesa needs inputs=: the batch the teacher is run on; pass train_step(..., inputs=x)")

    def extra_loss(self, logits: torch.Tensor, inputs: torch.Tensor, indices: torch.Tensor | None, epoch: int):
        return self.loss(inputs, logits, epoch) if self.active(epoch) else None

    def after_step(self, logits: torch.Tensor, indices: torch.Tensor | None, epoch: int) -> None:
        self.update()

    def loss(self, inputs: torch.Tensor, logits: torch.Tensor, epoch: int) -> torch.Tensor:
        """``lam * trajectory_kl(logits, teacher(inputs), tau)`` (zero, and no teacher forward, before ``e_start``)."""
        if not self.active(epoch):
            return logits.new_zeros((), dtype=torch.float32)
        return _weighted_kl(logits, self.teacher_logits(inputs, like=logits), self.tau, self.lam)

    @torch.no_grad()
    def update(self) -> None:
        """``v <- beta_t v + (1 - beta_t) theta`` for weights and float buffers (t = updates so far); other buffers copied."""
        weight = 1.0 - self.decay(self.updates)
        self.updates += 1
        for ts, ss in group_by_device_dtype(self._float_t, self._float_s):
            torch._foreach_lerp_(ts, ss, weight)
        if self._other_t:
            for ts, ss in group_by_device_dtype(self._other_t, self._other_s):
                torch._foreach_copy_(ts, ss)

    def state_dict(self) -> dict:
        return {"teacher": self.teacher.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.teacher.load_state_dict(state["teacher"])
        self.teacher.eval()
        # A checkpoint from before the warm-up existed ran at beta throughout: it goes on at beta.
        self.updates = int(state.get("updates", self.warmup_steps))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._float_t + self._other_t)


def _rows(t: torch.Tensor | None, rows):
    return t if t is None or rows is None else t[rows]


class Regularised(Method):
    """``saf`` / ``mesa``: one forward and backward of ``loss + extra_loss``, then the base step (and the
    regulariser's own update: SAF records the logits, MESA moves its teacher). The regulariser supplies
    ``check_batch``, ``extra_loss``, ``after_step``, ``extra_passes``, ``nbytes`` and its state."""

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        regulariser: SAF | MESA,
        *,
        name: str,
        **common: Unpack[StepKeywords],
    ):
        super().__init__(base_optimizer, **common)
        self.regulariser = regulariser
        self.name = name

    def train_step(
        self,
        forward: Forward,
        *,
        inputs: torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
        epoch: int = 0,
    ) -> StepOutput:
        reg = self.regulariser
        reg.check_batch(inputs, indices)

        def extra(logits, rows):  # per micro-batch: the rows' own inputs and sample indices
            return reg.extra_loss(logits, _rows(inputs, rows), _rows(indices, rows), epoch)

        loss, logits, added, skipped = self._one_pass_step(forward, inputs, extra=extra)
        # Method state moves only on a step taken (docs/algorithms.md, "Mixed precision"): SAF records every
        # epoch, even before e_start; MESA's EMA follows every step from step 0.
        if not skipped:
            reg.after_step(logits, indices, epoch)
        return StepOutput(loss=loss, logits=logits, perturbed_loss=None, extra_loss=added, rho=None, skipped=skipped)

    def run_warnings(self, *, epochs: int, steps_per_epoch: int) -> list[str]:
        return self.regulariser.run_warnings(epochs=epochs, steps_per_epoch=steps_per_epoch)

    @property
    def passes_per_step(self) -> float:
        return 1.0 + self.regulariser.extra_passes

    def extra_state_bytes(self) -> int:
        return self.regulariser.nbytes()

    def compile_modules(self, compiler) -> None:
        hook = getattr(self.regulariser, "compile_modules", None)  # MESA's teacher; SAF holds no module
        if hook is not None:
            hook(compiler)

    def _on_cast(self) -> None:
        hook = getattr(self.regulariser, "follow_student", None)  # MESA's teacher; SAF holds no module
        if hook is not None:
            hook()
        super()._on_cast()

    def _method_state(self) -> dict:
        return self.regulariser.state_dict()

    def _load_method_state(self, state: dict) -> None:
        self.regulariser.load_state_dict(state)


# The knobs' defaults live in the registry entries (optim._specs), equal to SAF's and MESA's signatures
# (tests/optim/test_knobs.py); create() always passes every knob, so the builders declare none.
@registered
def build_saf(
    base_optimizer: torch.optim.Optimizer,
    *,
    num_samples: int,
    num_classes: int,
    lam: float,
    tau: float,
    e_tilde: int,
    e_start: int,
    **common: Unpack[StepKeywords],
) -> Regularised:
    return Regularised(
        base_optimizer,
        SAF(num_samples, num_classes, lam=lam, tau=tau, e_tilde=e_tilde, e_start=e_start),
        name=build_saf.spec.name,
        **common,
    )


@registered
def build_mesa(
    base_optimizer: torch.optim.Optimizer,
    *,
    beta: float,
    lam: float,
    tau: float,
    e_start: int,
    **common: Unpack[StepKeywords],
) -> Regularised:
    # The teacher starts as a copy of the model, which create() has refused to go without (the entry needs it).
    teacher = MESA(cast("nn.Module", common["model"]), beta=beta, lam=lam, tau=tau, e_start=e_start)
    return Regularised(base_optimizer, teacher, name=build_mesa.spec.name, **common)
