"""What every geometry measure shares: argument checks, parameter selection, the model-state scope, string modes."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import nn

LossFn = Callable[[nn.Module, Any], torch.Tensor]
ParamSpec = Sequence["str | nn.Parameter"]
#: BatchNorm and dropout as in evaluation ("eval") or in training with fixed masks ("train").
Mode = Literal["eval", "train"]
MODES: tuple[str, ...] = get_args(Mode)


def _metrics(prefix: str, values: Mapping[str, float]) -> dict[str, float]:
    # NaN (a standard error from one draw) is left out: a metric store would plot it as a gap anyway.
    return {prefix + key: float(value) for key, value in values.items() if not math.isnan(float(value))}


def _check_int(name: str, value: Any, minimum: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r} ({type(value).__name__}); {fix}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}; {fix}")
    return int(value)


def _check_positive(name: str, value: Any, fix: str, *, allow_zero: bool = False) -> float:
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        rule = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {rule}, got {value!r}; {fix}")
    return float(value)


def _check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        valid = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {valid}, got {value!r}; pass one of those names")
    return value


def _check_batches(batches: Any) -> list[Any]:
    if isinstance(batches, torch.Tensor) or isinstance(batches, (dict, str)):
        raise ValueError(
            f"batches must be a list of batches, got a single {type(batches).__name__}; wrap one batch as [batch]"
        )
    try:
        one_shot = iter(batches) is batches
    except TypeError:
        raise ValueError(f"batches must be a list of batches, got {type(batches).__name__}") from None
    if one_shot:
        raise ValueError(
            f"batches must be re-iterable (the metric passes over them many times), got a one-shot "
            f"{type(batches).__name__}; pass list(...) of a fixed set of batches"
        )
    batches = list(batches)
    if not batches:
        raise ValueError("batches must hold at least one batch, got an empty collection; pass a fixed set of batches")
    return batches


def _resolve_params(
    model: nn.Module, params: ParamSpec | None, what: str = "params"
) -> tuple[list[str], list[nn.Parameter]]:
    named = list(model.named_parameters())
    if params is None:
        chosen = [(n, p) for n, p in named if p.requires_grad]
    else:
        if isinstance(params, (str, nn.Parameter, torch.Tensor)):
            raise ValueError(
                f"{what} must be a list of parameter names or nn.Parameters, got one {type(params).__name__}"
            )
        by_name = dict(named)
        by_id = {id(p): n for n, p in named}
        chosen, seen = [], set()
        for item in params:
            if isinstance(item, str):
                if item not in by_name:
                    shown = ", ".join(n for n, _ in named[:8])
                    raise ValueError(
                        f"{what} names a parameter {item!r} that the model does not have; its parameters "
                        f"are named like {shown}{', ...' if len(named) > 8 else ''} (see model.named_parameters())"
                    )
                name = item
            elif isinstance(item, torch.Tensor):
                if id(item) not in by_id:
                    raise ValueError(
                        f"{what} holds a tensor of shape {tuple(item.shape)} that is not a parameter of the model"
                    )
                name = by_id[id(item)]
            else:
                raise ValueError(f"{what} entries must be parameter names or nn.Parameters, got {type(item).__name__}")
            if name not in seen:
                seen.add(name)
                chosen.append((name, by_name[name]))
        frozen = [n for n, p in chosen if not p.requires_grad]
        if frozen:
            raise ValueError(
                f"{what} must have requires_grad=True to be differentiated, but {frozen[:5]} do not; "
                "set requires_grad_(True) on them or leave them out"
            )
    if not chosen:
        raise ValueError(f"{what} selects no trainable parameter; pass names or parameters with requires_grad=True")
    kinds = {(p.dtype, p.device) for _, p in chosen}
    if len(kinds) > 1:
        raise ValueError(
            f"{what} must share one dtype and device, got {sorted(str(k) for k in kinds)}; "
            "move the model with model.to(device, dtype) first"
        )
    return [n for n, _ in chosen], [p for _, p in chosen]


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _std_error(values: Sequence[float]) -> float:
    if len(values) < 2:
        return math.nan
    return float(np.std(np.asarray(values, dtype=np.float64), ddof=1) / math.sqrt(len(values)))


# --------------------------------------------------------------------------------------- model state


def no_fused_attention(model: nn.Module):
    """Context manager: every module's `fused_attn` is False inside, restored on exit.

    timm's fused attention (scaled_dot_product_attention kernels) has no double backward, and
    forward-mode AD through it is not guaranteed either; its explicit softmax path has both.
    The switch itself is trainables.models.fused_attention (one home).
    """
    from trainables.models import fused_attention  # on use: importing timm costs seconds

    return fused_attention(model, False)


class _Scope:
    """Puts the model in the asked BN/dropout mode with fused attention off; restores modes, buffers
    and (when asked) parameters exactly on exit. `originals` holds the parameter copies for reuse.
    keep_fused: leave fused attention as it is (first-order work only: it has no double backward)."""

    def __init__(self, model: nn.Module, mode: str, *, keep_params: bool, keep_fused: bool = False) -> None:
        self.model = model
        self.keep_fused = keep_fused
        self.mode = mode
        self.keep_params = keep_params
        self.originals: dict[int, torch.Tensor] = {}

    def __enter__(self) -> _Scope:
        self.training = [(m, m.training) for m in self.model.modules()]
        self.buffers = [(b, b.detach().clone()) for b in self.model.buffers()]
        if self.keep_params:
            self.originals = {id(p): p.detach().clone() for p in self.model.parameters()}
        self.fused = contextlib.nullcontext() if self.keep_fused else no_fused_attention(self.model)
        self.fused.__enter__()
        self.model.train(self.mode == "train")
        return self

    def original(self, param: nn.Parameter) -> torch.Tensor:
        return self.originals[id(param)]

    def __exit__(self, *exc: object) -> None:
        self.fused.__exit__(None, None, None)
        with torch.no_grad():
            for buffer, saved in self.buffers:
                buffer.copy_(saved)
            for param in self.model.parameters():
                if id(param) in self.originals:
                    param.copy_(self.originals[id(param)])
        for module, flag in self.training:
            module.training = flag


def _set_params(
    params: Sequence[nn.Parameter],
    base: Sequence[torch.Tensor],
    steps: Sequence[tuple[float, Sequence[torch.Tensor]]],
) -> None:
    """params <- base + sum_i c_i d_i, written from the saved base so no rounding accumulates."""
    with torch.no_grad():
        for index, (param, start) in enumerate(zip(params, base)):
            param.copy_(start)
            for coefficient, direction in steps:
                if coefficient != 0.0:
                    param.add_(direction[index], alpha=coefficient)
