"""Perturbation measures of flatness: average flatness under Gaussian weight noise, SAM's surrogate gap, m-sharpness."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from analysis.geometry._common import (
    MODES,
    LossFn,
    Mode,
    ParamSpec,
    _check_batches,
    _check_choice,
    _check_int,
    _check_positive,
    _generator,
    _metrics,
    _resolve_params,
    _Scope,
    _set_params,
    _std_error,
)
from analysis.geometry._hvp import LossOracle, batch_size, split_batch


@dataclass(frozen=True)
class FlatnessResult:
    """Average flatness E_{e ~ N(0, sigma^2 I)} L(w + e) over `draws` draws, beside L(w)."""

    loss: float
    perturbed_loss: float
    std_error: float
    losses: tuple[float, ...] = field(repr=False)
    sigma: float
    draws: int
    mode: str
    seed: int
    mask_seed: int
    num_batches: int
    num_samples: int
    num_params: int

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        return _metrics(
            prefix,
            {
                "loss": self.loss,
                "average_flatness": self.perturbed_loss,
                "average_flatness_std_error": self.std_error,
                "average_flatness_gap": self.perturbed_loss - self.loss,
            },
        )

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"losses": np.asarray(self.losses, dtype=np.float64)}


@dataclass(frozen=True)
class SurrogateGapResult:
    """h = L(w + rho g/||g||) - L(w) and sigma_max ~ 2h/rho^2 (a curvature only near a minimum: see grad_norm)."""

    gap: float
    sigma_max_estimate: float
    grad_norm: float
    loss: float
    perturbed_loss: float
    rho: float
    mode: str
    mask_seed: int
    num_batches: int
    num_samples: int
    num_params: int

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        return _metrics(
            prefix,
            {
                "surrogate_gap": self.gap,
                "sigma_max_estimate": self.sigma_max_estimate,
                "grad_norm": self.grad_norm,
                "loss": self.loss,
                "perturbed_loss": self.perturbed_loss,
            },
        )


@dataclass(frozen=True)
class MSharpnessResult:
    """SAM's m-sharpness: mean over disjoint m-sample sub-batches of L_S(w + rho g_S/||g_S||) - L_S(w)."""

    sharpness: float
    std_error: float
    values: tuple[float, ...] = field(repr=False)
    m: int
    rho: float
    num_subbatches: int
    dropped_samples: int
    mode: str
    mask_seed: int
    num_batches: int
    num_samples: int
    num_params: int

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        return _metrics(prefix, {"m_sharpness": self.sharpness, "m_sharpness_std_error": self.std_error})

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"values": np.asarray(self.values, dtype=np.float64)}


# ------------------------------------------------------------------------------ zeroth/first order


def _perturbation_setup(
    model: nn.Module, loss_fn: LossFn, batches: Any, mode: str, params: ParamSpec | None, mask_seed: int
) -> tuple[str, list[Any], list[nn.Parameter], LossOracle]:
    _check_int("mask_seed", mask_seed, 0, "use a non-negative seed")
    mode = _check_choice("mode", mode, MODES)
    batches = _check_batches(batches)
    _, chosen = _resolve_params(model, params)
    oracle = LossOracle(model, loss_fn, batches, train=mode == "train", seed=mask_seed)
    return mode, batches, chosen, oracle


def average_flatness(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    *,
    sigma: float = 0.01,
    draws: int = 10,
    mode: Mode = "eval",
    seed: int = 0,
    params: ParamSpec | None = None,
    mask_seed: int = 0,
) -> FlatnessResult:
    """L_N = E_{e ~ N(0, sigma^2 I)} L(w + e) over `draws` Gaussian draws (Chen et al. 2022, Table 1), and L(w).

    `seed` draws the weight noise; mask_seed fixes dropout / drop-path masks in train mode (as in hessian_operator).
    """
    sigma = _check_positive("sigma", sigma, "the standard deviation of the weight noise, e.g. 0.01")
    _check_int("draws", draws, 2, "a standard error needs at least two draws")
    _check_int("seed", seed, 0, "use a non-negative seed")
    mode, batches, chosen, oracle = _perturbation_setup(model, loss_fn, batches, mode, params, mask_seed)
    with _Scope(model, mode, keep_params=True) as scope:
        base = [scope.original(p) for p in chosen]
        loss = oracle.value()
        generator = _generator(chosen[0].device, seed)
        losses = []
        for _ in range(draws):
            noise = [torch.randn(p.shape, generator=generator, device=p.device, dtype=p.dtype) for p in chosen]
            _set_params(chosen, base, [(sigma, noise)])
            losses.append(oracle.value())
    return FlatnessResult(
        loss=loss,
        perturbed_loss=float(np.mean(losses)),
        std_error=_std_error(losses),
        losses=tuple(losses),
        sigma=sigma,
        draws=draws,
        mode=mode,
        seed=seed,
        mask_seed=mask_seed,
        num_batches=len(batches),
        num_samples=oracle.num_samples,
        num_params=sum(p.numel() for p in chosen),
    )


def _ascent_gap(
    oracle: LossOracle,
    chosen: Sequence[nn.Parameter],
    base: Sequence[torch.Tensor],
    rho: float,
    indices: Sequence[int] | None,
) -> tuple[float, float, float]:
    """(L(w), L(w + rho g/||g||), ||g||) on the selected batches; parameters are left at base."""
    loss, grad = oracle.value_and_grad(chosen, indices)
    norm = float(grad.float().norm() if grad.dtype in (torch.float16, torch.bfloat16) else grad.norm())
    # docs/algorithms.md (SAM): eps = rho g / (||g|| + 1e-12), one global norm.
    eps = grad.mul_(rho / (norm + 1e-12))
    sizes = [p.numel() for p in chosen]
    _set_params(chosen, base, [(1.0, [e.view_as(p) for e, p in zip(torch.split(eps, sizes), chosen)])])
    perturbed = oracle.value(indices)
    _set_params(chosen, base, [])
    return loss, perturbed, norm


def surrogate_gap(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    rho: float,
    *,
    mode: Mode = "eval",
    params: ParamSpec | None = None,
    mask_seed: int = 0,
) -> SurrogateGapResult:
    """GSAM's surrogate gap h = L(w + rho g/||g||) - L(w) with g the gradient of the mean loss over batches.

    sigma_max_estimate = 2h/rho^2 equals the top curvature only near a minimum (||g|| ~ 0): far from one,
    h ~ rho ||g|| dominates, so grad_norm is reported beside it. mask_seed as in hessian_operator.
    """
    rho = _check_positive("rho", rho, "the perturbation radius, e.g. 0.05")
    mode, batches, chosen, oracle = _perturbation_setup(model, loss_fn, batches, mode, params, mask_seed)
    with _Scope(model, mode, keep_params=True) as scope:
        loss, perturbed, norm = _ascent_gap(oracle, chosen, [scope.original(p) for p in chosen], rho, None)
    gap = perturbed - loss
    return SurrogateGapResult(
        gap=gap,
        sigma_max_estimate=2.0 * gap / rho**2,
        grad_norm=norm,
        loss=loss,
        perturbed_loss=perturbed,
        rho=rho,
        mode=mode,
        mask_seed=mask_seed,
        num_batches=len(batches),
        num_samples=oracle.num_samples,
        num_params=sum(p.numel() for p in chosen),
    )


def m_sharpness(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    rho: float,
    m: int,
    *,
    mode: Mode = "eval",
    params: ParamSpec | None = None,
    mask_seed: int = 0,
) -> MSharpnessResult:
    """m-sharpness (Foret et al. 2021, section 4.1): each batch is cut into disjoint sub-batches S of m
    samples (a remainder < m is left out and counted); each S gets its own one-step ascent
    eps_S = rho g_S/||g_S||, and the result is the mean of L_S(w + eps_S) - L_S(w) over all S."""
    rho = _check_positive("rho", rho, "the perturbation radius, e.g. 0.05")
    m = _check_int("m", m, 1, "the number of samples per sub-batch")
    batches = _check_batches(batches)
    subbatches, dropped = [], 0
    for batch in batches:
        size = batch_size(batch)
        subbatches.extend(split_batch(batch, size, m))
        dropped += size % m
    if not subbatches:
        largest = max(batch_size(b) for b in batches)
        raise ValueError(f"m must be <= the largest batch size ({largest}), got {m}; use a smaller m")
    mode, _, chosen, oracle = _perturbation_setup(model, loss_fn, subbatches, mode, params, mask_seed)
    values = []
    with _Scope(model, mode, keep_params=True) as scope:
        base = [scope.original(p) for p in chosen]
        for index in range(len(subbatches)):
            loss, perturbed, _ = _ascent_gap(oracle, chosen, base, rho, [index])
            values.append(perturbed - loss)
    return MSharpnessResult(
        sharpness=float(np.mean(values)),
        std_error=_std_error(values),
        values=tuple(values),
        m=m,
        rho=rho,
        num_subbatches=len(subbatches),
        dropped_samples=dropped,
        mode=mode,
        mask_seed=mask_seed,
        num_batches=len(batches),
        num_samples=oracle.num_samples,
        num_params=sum(p.numel() for p in chosen),
    )
