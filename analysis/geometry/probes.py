"""Geometry inside a trial: the registry of measures a `geometry:` section may name, and the probe that takes them.

`trainables.fit(config, probe=make_probe(config))` calls the probe after the epochs `config.geometry` asks for;
under a study, the runner hands each trial a `ProbePlan` of its geometry section (analysis.geometry.names), which
the trial builds into this probe (trainables never imports analysis). Adding a measure is a function here, an entry in `MEASURES`, and its
name in `analysis.geometry.names.MEASURE_NAMES` (what a study's validation checks without torch).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from analysis.geometry._hvp import FINITE_DIFFERENCE_MODES, _RefuseKinks
from analysis.geometry.names import METRIC_PREFIX, geometry_problems
from analysis.geometry.perturbation import average_flatness, surrogate_gap
from analysis.geometry.spectrum import (
    blockwise_top_eigenvalues,
    default_parameter_groups,
    hessian_trace,
    top_eigenvalues,
)

if TYPE_CHECKING:
    from trainables.config import GeometryConfig, TrialConfig

__all__ = [
    "MEASURES",
    "METRIC_PREFIX",
    "GeometryProbe",
    "Measure",
    "geometry_problems",
    "make_probe",
    "stability_threshold",
]


def _cross_entropy(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    # The plain loss whose geometry is measured: no label smoothing, no mixup, fp32 (no autocast).
    x, y = batch
    return F.cross_entropy(model(x).float(), y)


@dataclass(frozen=True)
class Measure:
    """One measure a `geometry:` section may name: what it is, what it costs, how it is taken."""

    name: str
    description: str
    cost: str
    take: Callable[[nn.Module, list, "GeometryConfig"], Any]  # returns a result with to_metrics(prefix)
    prefix: str = ""  # under METRIC_PREFIX: keeps a measure's many metrics apart (blockwise/<group>/...)
    uses_hvp: bool = True  # takes Hessian-vector products, so geometry.hvp_mode applies to it


def _lambda_max(model, batches, g):
    return top_eigenvalues(
        model,
        _cross_entropy,
        batches,
        k=1,
        mode=g.mode,
        max_iter=g.max_iter,
        tol=g.tol,
        seed=g.seed,
        hvp_mode=g.hvp_mode,
        mask_seed=g.seed,
    )


def _trace(model, batches, g):
    return hessian_trace(
        model,
        _cross_entropy,
        batches,
        samples=g.trace_samples,
        mode=g.mode,
        seed=g.seed,
        hvp_mode=g.hvp_mode,
        mask_seed=g.seed,
    )


def _blockwise(model, batches, g):
    return blockwise_top_eigenvalues(
        model,
        _cross_entropy,
        batches,
        default_parameter_groups(model),
        mode=g.mode,
        max_iter=g.max_iter,
        tol=g.tol,
        seed=g.seed,
        hvp_mode=g.hvp_mode,
        mask_seed=g.seed,
    )


def _flatness(model, batches, g):
    return average_flatness(
        model,
        _cross_entropy,
        batches,
        sigma=g.flatness_sigma,
        draws=g.flatness_draws,
        mode=g.mode,
        seed=g.seed,
        mask_seed=g.seed,
    )


def _surrogate_gap(model, batches, g):
    return surrogate_gap(model, _cross_entropy, batches, g.surrogate_rho, mode=g.mode, mask_seed=g.seed)


MEASURES: dict[str, Measure] = {
    m.name: m
    for m in (
        Measure(
            "lambda_max",
            "largest Hessian eigenvalue (Lanczos): the sharpness of the minimum",
            "up to geometry.max_iter Hessian-vector products (HVP ~ 2-4 gradients each)",
            _lambda_max,
        ),
        Measure(
            "hessian_trace",
            "tr(H) by Hutchinson's estimator: the summed curvature of every direction",
            "geometry.trace_samples HVPs",
            _trace,
        ),
        Measure(
            "blockwise_lambda_max",
            "lambda_max of each diagonal block of the Hessian (Chen et al. 2022, Table 4):"
            " patch embedding, attention/token MLP, channel MLP, per block, norms, head",
            "up to geometry.max_iter HVPs per block (blocks: trainables.models.parameter_groups)",
            _blockwise,
            prefix="blockwise/",
        ),
        Measure(
            "average_flatness",
            "E L(w + e), e ~ N(0, sigma^2 I), and its excess over L(w) (Chen et al. 2022, Table 1)",
            "geometry.flatness_draws + 1 forward passes",
            _flatness,
            uses_hvp=False,
        ),
        Measure(
            "surrogate_gap",
            "L(w + rho g/||g||) - L(w), GSAM's surrogate gap, and 2h/rho^2",
            "one gradient and two forward passes",
            _surrogate_gap,
            uses_hvp=False,
        ),
    )
}


class GeometryProbe:
    """The measures of one trial's geometry section, taken in registry order on the same batches (trainables' Probe)."""

    def __init__(self, geometry: "GeometryConfig"):
        self.geometry = geometry
        self.measures = [MEASURES[name] for name in MEASURES if name in geometry.measures]

    def check(self, model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Before the trial trains (fit calls it): refuse finite-difference products on a model whose loss has kinks,
        which the first product would find only after all the epochs. One forward pass of two samples, in eval mode
        (no dropout mask drawn, no batch-norm statistic moved: training is left exactly as it was)."""
        if self.geometry.hvp_mode not in FINITE_DIFFERENCE_MODES or not any(m.uses_hvp for m in self.measures):
            return  # perturbation measures take no products: a kinked model is fine for them
        x, y = batches[0]
        was_training = model.training
        model.eval()
        try:
            with torch.enable_grad(), _RefuseKinks(self.geometry.hvp_mode):
                _cross_entropy(model, (x[:2], y[:2]))
        finally:
            model.train(was_training)

    def __call__(self, model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for measure in self.measures:
            result = measure.take(model, batches, self.geometry)
            metrics.update(result.to_metrics(METRIC_PREFIX + measure.prefix))
        return metrics


def make_probe(config: "TrialConfig | dict[str, Any]") -> GeometryProbe:
    """The probe of a trial config's `geometry` section, for `trainables.fit(..., probe=)`; a ConfigError names
    every problem of the section at once."""
    from trainables.config import ConfigError, TrialConfig

    cfg = TrialConfig.load(config)
    problems = geometry_problems(cfg.geometry)
    if problems:
        raise ConfigError(problems)
    return GeometryProbe(cfg.geometry)


def stability_threshold(lr: float, base: str, momentum: float = 0.0) -> float:
    """The edge-of-stability sharpness of full-batch gradient descent at learning rate `lr`: 2/lr, and with heavy-ball
    momentum beta (torch's SGD) 2(1 + beta)/lr (Cohen et al. 2021, section 2 and appendix). NaN for adaptive bases
    (AdamW): there the quantity that hovers at a threshold is the preconditioned sharpness lambda_max(P^-1 H)
    (Cohen et al. 2022), not the lambda_max of H that the probe measures."""
    if base != "sgd" or not lr > 0:
        return math.nan
    return 2.0 * (1.0 + momentum) / lr
