"""Loss landscapes: 1-D lines and 2-D planes through the weights along filter-normalised directions (Li et al. 2018)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from analysis.geometry._common import (
    LossFn,
    Mode,
    _check_int,
    _check_positive,
    _metrics,
    _Scope,
    _set_params,
)
from analysis.geometry.perturbation import _perturbation_setup


@dataclass(frozen=True)
class LandscapeResult:
    """Loss on a 1-D line or 2-D plane through w along filter-normalised random directions.

    losses[i] is at w + alphas[i] d1 (1-D); losses[i][j] at w + alphas[i] d1 + betas[j] d2 (2-D).
    """

    alphas: tuple[float, ...]
    betas: tuple[float, ...]
    losses: tuple[Any, ...] = field(repr=False)
    loss: float
    dims: int
    steps: int
    span: float
    seed: int
    mode: str
    mask_seed: int
    num_batches: int
    num_samples: int

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        grid = np.asarray(self.losses, dtype=np.float64)
        return _metrics(
            prefix,
            {
                f"landscape{self.dims}d_loss": self.loss,
                f"landscape{self.dims}d_max": float(grid.max()),
                f"landscape{self.dims}d_mean_rise": float(grid.mean()) - self.loss,
            },
        )

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "alphas": np.asarray(self.alphas, dtype=np.float64),
            "betas": np.asarray(self.betas, dtype=np.float64),
            "losses": np.asarray(self.losses, dtype=np.float64),
        }


# ------------------------------------------------------------------------------------------ landscapes


def filter_normalized_direction(model: nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    """A Gaussian direction over the trainable parameters, filter-normalised (Li et al. 2018).

    Each filter (slice along dim 0) of a tensor with dim > 1 is rescaled to the norm of the same filter
    of the weights, which makes the direction blind to the scale invariance of layers in front of a
    normalisation; 1-D tensors (biases, norm scales) get zero. Drawn on the CPU, so a seed gives the
    same direction on every device.
    """
    _check_int("seed", seed, 0, "use a non-negative seed")
    generator = torch.Generator().manual_seed(seed)
    direction = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        weight = param.detach()
        if weight.dim() <= 1:
            direction[name] = torch.zeros_like(weight)
            continue
        d = torch.randn(weight.shape, generator=generator, dtype=torch.float64)
        rows = d.reshape(d.shape[0], -1)
        target = weight.reshape(weight.shape[0], -1).double().cpu().norm(dim=1, keepdim=True)
        rows.mul_(target / rows.norm(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny))
        direction[name] = d.to(device=weight.device, dtype=weight.dtype)
    return direction


def _grid(steps: int, span: float) -> list[float]:
    # Symmetric by construction, so an odd number of steps holds exactly 0.0 at its centre.
    half = (steps - 1) / 2
    return [span * (i - half) / half for i in range(steps)]


def _landscape(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Any,
    *,
    dims: int,
    steps: int,
    span: float,
    seed: int,
    mode: Mode,
    mask_seed: int,
) -> LandscapeResult:
    steps = _check_int("steps", steps, 2, "use at least two grid points per axis (odd counts include alpha=0)")
    span = _check_positive("span", span, "the largest |alpha| of the grid, e.g. 1.0")
    _check_int("seed", seed, 0, "use a non-negative seed")
    mode, batches, chosen, oracle = _perturbation_setup(model, loss_fn, batches, mode, None, mask_seed)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    directions = []
    for offset in range(dims):
        drawn = filter_normalized_direction(model, seed + offset)
        directions.append([drawn[n] for n in names])
    alphas = _grid(steps, span)
    betas = alphas if dims == 2 else []
    with _Scope(model, mode, keep_params=True) as scope:
        base = [scope.original(p) for p in chosen]
        loss = oracle.value()
        if dims == 1:
            losses: list[Any] = []
            for a in alphas:
                _set_params(chosen, base, [(a, directions[0])])
                losses.append(loss if a == 0.0 else oracle.value())
        else:
            losses = []
            for a in alphas:
                row = []
                for b in betas:
                    _set_params(chosen, base, [(a, directions[0]), (b, directions[1])])
                    row.append(loss if a == 0.0 and b == 0.0 else oracle.value())
                losses.append(tuple(row))
    return LandscapeResult(
        alphas=tuple(alphas),
        betas=tuple(betas),
        losses=tuple(losses),
        loss=loss,
        dims=dims,
        steps=steps,
        span=span,
        seed=seed,
        mode=mode,
        mask_seed=mask_seed,
        num_batches=len(batches),
        num_samples=oracle.num_samples,
    )


def loss_landscape_1d(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    *,
    steps: int = 21,
    span: float = 1.0,
    seed: int = 0,
    mode: Mode = "eval",
    mask_seed: int = 0,
) -> LandscapeResult:
    """L(w + alpha d) for `steps` alphas evenly in [-span, span], d = filter_normalized_direction(model, seed).

    mask_seed fixes dropout / drop-path masks in train mode (as in hessian_operator)."""
    return _landscape(
        model, loss_fn, batches, dims=1, steps=steps, span=span, seed=seed, mode=mode, mask_seed=mask_seed
    )


def loss_landscape_2d(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    *,
    steps: int = 21,
    span: float = 1.0,
    seed: int = 0,
    mode: Mode = "eval",
    mask_seed: int = 0,
) -> LandscapeResult:
    """L(w + alpha d1 + beta d2) on a steps x steps grid over [-span, span]^2; d1, d2 from seeds seed, seed+1."""
    return _landscape(
        model, loss_fn, batches, dims=2, steps=steps, span=span, seed=seed, mode=mode, mask_seed=mask_seed
    )
