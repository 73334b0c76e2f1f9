"""Momentum-SAM (Becker et al. 2024): one gradient per step, taken at w perturbed along the base optimizer's negative momentum."""

from __future__ import annotations

from typing import Unpack

import torch

from ._knobs import momentum_problem
from ._method import (
    Forward,
    Method,
    StepKeywords,
    StepOutput,
    batch_rows,
    global_norm,
    group_by_device_dtype,
)
from ._sam import nonzero
from ._specs import registered

__all__ = ["MSAM"]

#: Where the base optimizers keep the momentum MSAM follows: Adam/AdamW's first moment, SGD's buffer.
MOMENTUM_KEYS = ("exp_avg", "momentum_buffer")

#: torch optimizers whose ``weight_decay`` is an L2 term added to the gradient (``d = g + wd w``), unless the
#: param group says ``decoupled_weight_decay`` (AdamW; Adam, NAdam, RAdam with decoupled_weight_decay=True).
L2_DECAY = (
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.Adamax,
    torch.optim.RMSprop,
)


def l2_decay(optimizer: torch.optim.Optimizer, group: dict) -> float:
    """The L2 weight decay ``optimizer`` adds to the gradients of ``group``; 0 for a decoupled (or unknown) decay."""
    if not isinstance(optimizer, L2_DECAY) or group.get("decoupled_weight_decay", False):
        return 0.0
    return float(group.get("weight_decay", 0.0) or 0.0)


@registered
class MSAM(Method):
    """MSAM (the paper's Algorithm 1; docs/algorithms.md, "MSAM"): with ``v`` the base optimizer's momentum
    (SGD's ``momentum_buffer``, Adam/AdamW's ``exp_avg``, as the base keeps it), one forward+backward at
    ``w - rho v / ||v||`` gives ``g``; ``w`` is copied back exactly and the base optimizer steps from ``w`` with
    ``g``, which also moves ``v``. One global ``||v||``; no momentum yet (the first step) or ``v = 0`` gives
    no perturbation, and so does ``rho = 0`` (the base optimizer exactly).

    An L2 weight decay that the base adds to the gradient (SGD's, Adam's without decoupling) is taken at the
    perturbed point, where the gradient is, as in the authors' SGD code: ``wd * eps`` is added to the final
    gradient, so the base's ``g + wd w`` becomes ``g + wd (w + eps)``. A decoupled decay (AdamW) acts on ``w``,
    as in their AdamW code. The authors keep the weights at the perturbed point between steps; holding ``w`` and
    perturbing inside the step gives their trajectory (tests/optim/test_references.py), and evaluation and
    checkpoints see ``w``. BatchNorm statistics come from the one (perturbed) pass, as in the paper. Under DDP
    ``v`` is the same on every replica, so the one pass is synced like a plain step.
    """

    perturbs = True

    def __init__(
        self,
        base_optimizer: torch.optim.Optimizer,
        rho: float = 0.3,
        **common: Unpack[StepKeywords],
    ):
        super().__init__(base_optimizer, **common)
        self.rho = self.spec.knob("rho").check(rho)
        lacking = [
            i
            for i, g in enumerate(base_optimizer.param_groups)
            if "betas" not in g and not float(g.get("momentum", 0.0)) > 0
        ]
        if lacking:
            raise ValueError(momentum_problem(self.name, lacking, type(base_optimizer).__name__))
        self._saved: dict[torch.Tensor, torch.Tensor] = {}
        self._pairs: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
        # This step's eps = scale v, for moving the L2 decay to w + eps: (L2 decay, params, their v) and scale.
        self._decayed: list[tuple[float, list[torch.Tensor], list[torch.Tensor]]] = []
        self._scale: torch.Tensor | None = None
        # _plan's: (its key, params, momenta, their state keys, their dtypes and devices, the plan).
        self._cache: tuple | None = None

    def _momenta(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[float]]:
        """The params that have a momentum, their momentum, and their group's L2 weight decay."""
        params, moms, decays = [], [], []
        state = self.base_optimizer.state
        for group in self.base_optimizer.param_groups:
            wd = l2_decay(self.base_optimizer, group)
            for p in group["params"]:
                if not p.requires_grad or p not in state or not self._in_scope(p):
                    continue
                v = next((state[p][k] for k in MOMENTUM_KEYS if state[p].get(k) is not None), None)
                if v is not None:
                    params.append(p)
                    moms.append(v)
                    decays.append(wd)
        return params, moms, decays

    def _plan(self) -> tuple[list[torch.Tensor], list, list]:
        """The momenta, their (params, v, saved-w buffers) per (device, dtype), and the L2-decayed (wd, params, v).

        Built once and reused while the base optimizer's state holds the same momentum tensors for the same
        params (a ``load_state_dict`` or a new param group rebuilds it): the step is often bound by the host, and
        regrouping 60-odd tensors every step costs more than the arithmetic does on the GPU.
        """
        opt = self.base_optimizer
        key = (
            id(opt.state),
            len(opt.state),
            tuple((id(g), len(g["params"]), l2_decay(opt, g)) for g in opt.param_groups),  # a decay schedule too
            tuple(p.requires_grad for g in opt.param_groups for p in g["params"]),
        )
        cached = self._cache
        if cached is not None and cached[0] == key:
            _, params, moms, keys, metas, plan = cached
            state = opt.state
            # A cast (model.double(), .to(device)) keeps the parameter objects: their saved-w buffers and buckets
            # must follow the new dtype and device.
            if all(state[p].get(k) is v for p, v, k in zip(params, moms, keys)) and metas == [
                (p.dtype, p.device) for p in params
            ]:
                return plan
        params, moms, decays = self._momenta()
        keys = [next(k for k in MOMENTUM_KEYS if opt.state[p].get(k) is v) for p, v in zip(params, moms)]
        metas = [(p.dtype, p.device) for p in params]
        buckets = [
            (ps, vs, [self._buffer(self._saved, p) for p in ps]) for ps, vs in group_by_device_dtype(params, moms)
        ]
        by_decay: dict[float, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        for p, v, wd in zip(params, moms, decays):
            if wd != 0.0:
                ps, vs = by_decay.setdefault(wd, ([], []))
                ps.append(p)
                vs.append(v)
        plan = (moms, buckets, [(wd, ps, vs) for wd, (ps, vs) in by_decay.items()])
        self._cache = (key, params, moms, keys, metas, plan)
        return plan

    @torch.no_grad()
    def _perturb(self) -> None:
        """``w <- w - rho v / ||v||`` (w saved); the division by the exact norm, 1 where it is 0 (then v = 0)."""
        self._pairs, self._decayed, self._scale = [], [], None
        if self.rho == 0.0:
            return
        moms, buckets, decayed = self._plan()
        if not moms:
            return
        scale = -self.rho / nonzero(global_norm(moms))
        for ps, vs, saved in buckets:
            torch._foreach_copy_(saved, ps)
            torch._foreach_add_(ps, torch._foreach_mul(vs, scale.to(device=vs[0].device, dtype=vs[0].dtype)))
        self._pairs = [(ps, saved) for ps, _, saved in buckets]
        self._decayed = decayed
        self._scale = scale

    @torch.no_grad()
    def _before_base_step(self) -> None:
        """The L2 decay at the perturbed point: ``g + wd eps`` here, to which the base adds ``wd w``. ``v`` has not
        moved since ``_perturb`` (the base has not stepped), so ``eps = scale v`` is this step's perturbation."""
        for wd, ps, vs in self._decayed:
            pairs = [(p.grad, v) for p, v in zip(ps, vs) if p.grad is not None]  # no gradient: the base skips p
            for gs, ms in group_by_device_dtype([g for g, _ in pairs], [v for _, v in pairs]):
                factor = (self._scale * wd).to(device=ms[0].device, dtype=ms[0].dtype)
                torch._foreach_add_(gs, torch._foreach_mul(ms, factor))

    @torch.no_grad()
    def _restore(self) -> None:
        for ps, saved in self._pairs:
            torch._foreach_copy_(ps, saved)  # exact: the values of w come back
        self._pairs = []

    def train_step(
        self,
        forward: Forward,
        *,
        inputs: torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
        epoch: int = 0,
    ) -> StepOutput:
        self._zero_grad()
        self._perturb()
        perturbed = bool(self._pairs)
        loss, logits, _, _ = self._pass(forward, local=False, n=batch_rows(inputs))
        self._restore()
        skipped = self._finish()
        self._decayed, self._scale = [], None
        self._zero_grad()
        # The one loss is taken at the perturbed point: it is the step's loss (there is no clean pass).
        return StepOutput(
            loss=loss,
            logits=logits,
            perturbed_loss=None,
            extra_loss=None,
            rho=None,
            skipped=skipped,
            perturbed=perturbed,
        )

    @property
    def passes_per_step(self) -> float:
        return 1.0

    def extra_state_bytes(self) -> int:
        # The saved copy of w (the params in scope).
        return sum(p.numel() * p.element_size() for p in self._params() if p.requires_grad and self._in_scope(p))
