"""Loss-geometry metrics of a model: Hessian spectrum and trace, flatness, sharpness, landscapes, activations."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from analysis._hvp import (
    HVP_MODES,
    EigenOutput,
    FlatOperator,
    HessianCore,
    LossOracle,
    batch_size,
    fixed_rng,
    lanczos,
    power_iteration,
    split_batch,
)

__all__ = [
    "ActiveNeuronResult",
    "BlockwiseEigenResult",
    "EigenResult",
    "FlatnessResult",
    "HessianOperator",
    "LandscapeResult",
    "LinearityResult",
    "MSharpnessResult",
    "SurrogateGapResult",
    "TraceResult",
    "active_neuron_fraction",
    "average_flatness",
    "blockwise_top_eigenvalues",
    "default_parameter_groups",
    "filter_normalized_direction",
    "hessian_operator",
    "hessian_trace",
    "linearity_missing_rate",
    "loss_landscape_1d",
    "loss_landscape_2d",
    "m_sharpness",
    "no_fused_attention",
    "smallest_eigenvalue",
    "surrogate_gap",
    "top_eigenvalues",
]

LossFn = Callable[[nn.Module, Any], torch.Tensor]
ParamSpec = Sequence["str | nn.Parameter"]

MODES = ("eval", "train")
METHODS = ("lanczos", "power")

# hvp_mode="auto", by timm model class. Measured with benchmarks/bench_geometry.py (batch 64 fp32, eval,
# NVIDIA H200, torch 2.11): ms per HVP / ms per gradient (the gradient with timm's fused attention on)
#               double_backward, graph cached   (rebuilt each HVP)   forward_over_reverse
#   ViT-S/16    138.8 / 54.1  = 2.57x            3.57x                200.8 / 54.1  = 3.71x
#   Mixer-B/16  295.1 / 122.7 = 2.41x            3.40x                429.0 / 122.7 = 3.50x
#   ResNet-50    70.5 / 31.9  = 2.21x            3.84x                216.3 / 31.9  = 6.79x
# (ResNet-50 with PyTorch's stock convolution double backward: 5.32x; see _hvp._CheapSecondOrder.)
# double_backward is faster and leaner in memory on all three, so it is the choice for each; any other
# model gets it too. forward_over_reverse stays as an independent computation of the same products.
_AUTO_HVP_MODE = {
    "VisionTransformer": "double_backward",
    "MlpMixer": "double_backward",
    "ResNet": "double_backward",
}


# --------------------------------------------------------------------------------------------- results


def _metrics(prefix: str, values: Mapping[str, float]) -> dict[str, float]:
    # NaN (a standard error from one draw) is left out: a metric store would plot it as a gap anyway.
    return {prefix + key: float(value) for key, value in values.items() if not math.isnan(float(value))}


@dataclass(frozen=True)
class EigenResult:
    """Extreme Hessian eigenvalues of the mean loss over `num_samples` samples in `num_batches` batches.

    `eigenvalues` are ordered from the algebraic extreme inwards (descending for which="largest",
    ascending for "smallest"); `eigenvectors` are flat unit vectors over the `num_params` parameters.
    `shift` is the s of power iteration on H + sI (0 when none was needed).
    """

    eigenvalues: tuple[float, ...]
    residuals: tuple[float, ...]
    eigenvectors: tuple[torch.Tensor, ...] = field(repr=False, compare=False)
    which: str
    method: str
    mode: str
    hvp_mode: str
    k: int
    max_iter: int
    tol: float
    seed: int
    converged: bool
    iterations: int
    hvp_count: int
    shift: float
    num_batches: int
    num_samples: int
    num_params: int
    history: tuple[float, ...] = field(repr=False)

    @property
    def _stem(self) -> str:
        return "lambda_max" if self.which == "largest" else "lambda_min"

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        stem = self._stem
        values = {stem if i == 0 else f"{stem}_{i + 1}": v for i, v in enumerate(self.eigenvalues)}
        values.update(
            {
                f"{stem}_residual": self.residuals[0],
                f"{stem}_converged": float(self.converged),
                f"{stem}_iterations": self.iterations,
                f"{stem}_hvp_count": self.hvp_count,
            }
        )
        return _metrics(prefix, values)

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "eigenvalues": np.asarray(self.eigenvalues, dtype=np.float64),
            "residuals": np.asarray(self.residuals, dtype=np.float64),
            "history": np.asarray(self.history, dtype=np.float64),
        }


@dataclass(frozen=True)
class BlockwiseEigenResult:
    """Dominant eigenvalue of each diagonal block of the Hessian, one block per named parameter group."""

    groups: tuple[str, ...]
    results: tuple[EigenResult, ...]
    mode: str
    hvp_mode: str
    num_batches: int
    num_samples: int

    def __getitem__(self, group: str) -> EigenResult:
        if group not in self.groups:
            raise KeyError(f"no parameter group {group!r}; the groups are {list(self.groups)}")
        return self.results[self.groups.index(group)]

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        metrics: dict[str, float] = {}
        for group, result in zip(self.groups, self.results):
            metrics.update(result.to_metrics(f"{prefix}{group}/"))
        return metrics

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "groups": np.asarray(self.groups),
            "lambda_max": np.asarray([r.eigenvalues[0] for r in self.results], dtype=np.float64),
            "converged": np.asarray([r.converged for r in self.results]),
            "num_params": np.asarray([r.num_params for r in self.results], dtype=np.int64),
        }


@dataclass(frozen=True)
class TraceResult:
    """Hutchinson estimate of tr(H) from `samples` Rademacher vectors, with its standard error."""

    trace: float
    std_error: float
    estimates: tuple[float, ...] = field(repr=False)
    samples: int
    mode: str
    hvp_mode: str
    seed: int
    num_batches: int
    num_samples: int
    num_params: int

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        return _metrics(prefix, {"hessian_trace": self.trace, "hessian_trace_std_error": self.std_error})

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"estimates": np.asarray(self.estimates, dtype=np.float64)}


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
    seed: int
    num_batches: int
    num_samples: int
    num_params: int

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        return _metrics(prefix, {"m_sharpness": self.sharpness, "m_sharpness_std_error": self.std_error})

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"values": np.asarray(self.values, dtype=np.float64)}


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


@dataclass(frozen=True)
class ActiveNeuronResult:
    """Share of MLP hidden activations > 0, per block, over `num_samples` inputs."""

    blocks: tuple[str, ...]
    fractions: tuple[float, ...]
    active: tuple[int, ...]
    total: tuple[int, ...]
    num_samples: int
    mode: str

    def as_dict(self) -> dict[str, float]:
        return dict(zip(self.blocks, self.fractions))

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        return _metrics(prefix, {f"active_fraction/{b}": f for b, f in zip(self.blocks, self.fractions)})

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "blocks": np.asarray(self.blocks),
            "fractions": np.asarray(self.fractions, dtype=np.float64),
            "active": np.asarray(self.active, dtype=np.int64),
            "total": np.asarray(self.total, dtype=np.int64),
        }


@dataclass(frozen=True)
class LinearityResult:
    """Share of different-label pairs whose midpoint is predicted as neither label (Zhang et al. 2018)."""

    missing_rate: float
    std_error: float
    misses: int
    pairs: int
    exhaustive: bool
    seed: int
    mode: str
    num_inputs: int

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        return _metrics(prefix, {"missing_rate": self.missing_rate, "missing_rate_std_error": self.std_error})


# ------------------------------------------------------------------------------------------ validation


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


def _resolve_hvp_mode(model: nn.Module, hvp_mode: str) -> str:
    _check_choice("hvp_mode", hvp_mode, ("auto",) + HVP_MODES)
    if hvp_mode != "auto":
        return hvp_mode
    for cls in type(model).__mro__:
        if cls.__name__ in _AUTO_HVP_MODE:
            return _AUTO_HVP_MODE[cls.__name__]
    return "double_backward"


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _std_error(values: Sequence[float]) -> float:
    if len(values) < 2:
        return math.nan
    return float(np.std(np.asarray(values, dtype=np.float64), ddof=1) / math.sqrt(len(values)))


# --------------------------------------------------------------------------------------- model state


class _FusedAttentionOff:
    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.saved: list[tuple[nn.Module, Any]] = []

    def __enter__(self) -> nn.Module:
        self.saved = [(m, m.fused_attn) for m in self.model.modules() if hasattr(m, "fused_attn")]
        for module, _ in self.saved:
            module.fused_attn = False
        return self.model

    def __exit__(self, *exc: Any) -> None:
        for module, flag in self.saved:
            module.fused_attn = flag
        self.saved = []


def no_fused_attention(model: nn.Module) -> _FusedAttentionOff:
    """Context manager: every module's `fused_attn` is False inside, restored on exit.

    timm's fused attention (scaled_dot_product_attention kernels) has no double backward, and
    forward-mode AD through it is not guaranteed either; its explicit softmax path has both.
    """
    return _FusedAttentionOff(model)


class _Scope:
    """Puts the model in the asked BN/dropout mode with fused attention off; restores modes, buffers
    and (when asked) parameters exactly on exit. `originals` holds the parameter copies for reuse."""

    def __init__(self, model: nn.Module, mode: str, *, keep_params: bool) -> None:
        self.model = model
        self.mode = mode
        self.keep_params = keep_params
        self.originals: dict[int, torch.Tensor] = {}

    def __enter__(self) -> _Scope:
        self.training = [(m, m.training) for m in self.model.modules()]
        self.buffers = [(b, b.detach().clone()) for b in self.model.buffers()]
        if self.keep_params:
            self.originals = {id(p): p.detach().clone() for p in self.model.parameters()}
        self.fused = _FusedAttentionOff(self.model)
        self.fused.__enter__()
        self.model.train(self.mode == "train")
        return self

    def original(self, param: nn.Parameter) -> torch.Tensor:
        return self.originals[id(param)]

    def __exit__(self, *exc: Any) -> None:
        self.fused.__exit__()
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


# ------------------------------------------------------------------------------------ Hessian spectrum


class HessianOperator:
    """v -> H v for the mean loss over fixed batches, on flat vectors over the selected parameters.

    Made by `hessian_operator(...)`, valid only inside its `with` block (the model is in the asked
    mode there). `hvp_count` counts products; `num_params` is the length of the vectors.
    """

    def __init__(self, core: HessianCore) -> None:
        self._core = core
        self._flat = FlatOperator(core, range(len(core.params)))
        self.hvp_mode = core.hvp_mode
        self.num_params = self._flat.size
        self.num_samples = core.oracle.num_samples
        self.num_batches = len(core.oracle.batches)

    @property
    def hvp_count(self) -> int:
        return self._core.hvp_count

    def __call__(self, vector: torch.Tensor) -> torch.Tensor:
        if vector.shape != (self.num_params,):
            raise ValueError(f"vector must have shape ({self.num_params},), got {tuple(vector.shape)}")
        return self._flat(vector.to(device=self._flat.device, dtype=self._flat.dtype))


class _HessianOperatorScope:
    def __init__(self, model: nn.Module, core_args: dict[str, Any], mode: str) -> None:
        self.scope = _Scope(model, mode, keep_params=False)
        self.core_args = core_args

    def __enter__(self) -> HessianOperator:
        self.scope.__enter__()
        self.core = HessianCore(**self.core_args)
        return HessianOperator(self.core)

    def __exit__(self, *exc: Any) -> None:
        self.core.release()
        self.scope.__exit__(*exc)


def hessian_operator(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    *,
    mode: str = "eval",
    params: ParamSpec | None = None,
    hvp_mode: str = "auto",
    cache_graphs: bool = True,
    seed: int = 0,
) -> _HessianOperatorScope:
    """Context manager yielding a HessianOperator (v -> H v) of the mean loss over `batches`.

    cache_graphs (double_backward only): keep each batch's gradient graph for all later products;
    memory grows with the number of batches, so pass False for many batches. `seed` fixes the dropout
    masks in train mode.
    """
    mode = _check_choice("mode", mode, MODES)
    _check_int("seed", seed, 0, "use a non-negative seed")
    batches = _check_batches(batches)
    names, chosen = _resolve_params(model, params)
    resolved = _resolve_hvp_mode(model, hvp_mode)
    oracle = LossOracle(model, loss_fn, batches, train=mode == "train", seed=seed)
    core_args = dict(oracle=oracle, names=names, params=chosen, hvp_mode=resolved, cache_graphs=bool(cache_graphs))
    return _HessianOperatorScope(model, core_args, mode)


def _solve(op: FlatOperator, which: str, k: int, method: str, max_iter: int, tol: float, seed: int) -> EigenOutput:
    solver = lanczos if method == "lanczos" else power_iteration
    return solver(
        op,
        op.size,
        k=k,
        sign=1.0 if which == "largest" else -1.0,
        max_iter=max_iter,
        tol=tol,
        generator=_generator(op.device, seed),
        dtype=op.dtype,
        device=op.device,
    )


def _eigen_result(
    output: EigenOutput, core: HessianCore, *, which: str, hvp_count: int, num_params: int, mode: str, **solver: Any
) -> EigenResult:
    return EigenResult(
        eigenvalues=output.values,
        residuals=output.residuals,
        eigenvectors=tuple(v.detach() for v in output.vectors),
        which=which,
        mode=mode,
        hvp_mode=core.hvp_mode,
        converged=output.converged,
        iterations=output.iterations,
        hvp_count=hvp_count,
        shift=output.shift,
        num_batches=len(core.oracle.batches),
        num_samples=core.oracle.num_samples,
        num_params=num_params,
        history=output.history,
        **solver,
    )


def _solver_settings(k: int, method: str, max_iter: int, tol: float, seed: int) -> dict[str, Any]:
    return {
        "k": _check_int("k", k, 1, "ask for at least one eigenvalue"),
        "method": _check_choice("method", method, METHODS),
        "max_iter": _check_int("max_iter", max_iter, 1, "allow at least one iteration"),
        "tol": _check_positive("tol", tol, "a relative tolerance such as 1e-3"),
        "seed": _check_int("seed", seed, 0, "use a non-negative seed"),
    }


def _extreme_eigenvalues(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    which: str,
    *,
    mode: str,
    params: ParamSpec | None,
    hvp_mode: str,
    cache_graphs: bool,
    **solver: Any,
) -> EigenResult:
    solver = _solver_settings(**solver)
    seed = solver["seed"]
    with hessian_operator(
        model, loss_fn, batches, mode=mode, params=params, hvp_mode=hvp_mode, cache_graphs=cache_graphs, seed=seed
    ) as op:
        if solver["k"] > op.num_params:
            raise ValueError(
                f"k must be <= the number of parameters ({op.num_params}), got {solver['k']}; ask for fewer eigenvalues"
            )
        output = _solve(op._flat, which, **solver)
        return _eigen_result(
            output, op._core, which=which, hvp_count=op.hvp_count, num_params=op.num_params, mode=mode, **solver
        )


def top_eigenvalues(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    *,
    k: int = 1,
    mode: str = "eval",
    method: str = "lanczos",
    max_iter: int = 100,
    tol: float = 1e-3,
    seed: int = 0,
    params: ParamSpec | None = None,
    hvp_mode: str = "auto",
    cache_graphs: bool = True,
) -> EigenResult:
    """The k algebraically largest eigenvalues of the Hessian of the mean loss over `batches`.

    loss_fn(model, batch) returns the batch's mean loss; batches are weighted by their sample counts.
    method="lanczos" (full reorthogonalisation; memory max_iter vectors) or "power" (with a shift when
    the dominant eigenvalue is negative, deflation for k > 1). max_iter bounds the Krylov steps
    (Lanczos) or the iterations per eigenpair (power). Convergence is judged on the eigenvector (residual
    or 1-|<v_t, v_t-1>|) and on the value (relative change), both < tol. mode is "eval" or "train" (BN,
    dropout); the model's modes and buffers are restored afterwards. params restricts the Hessian to a
    subset (names or nn.Parameters). hvp_mode: "double_backward", "forward_over_reverse" or "auto";
    cache_graphs as in hessian_operator.
    """
    return _extreme_eigenvalues(
        model, loss_fn, batches, "largest", mode=mode, params=params, hvp_mode=hvp_mode, cache_graphs=cache_graphs,
        k=k, method=method, max_iter=max_iter, tol=tol, seed=seed,
    )


def smallest_eigenvalue(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    *,
    k: int = 1,
    mode: str = "eval",
    method: str = "lanczos",
    max_iter: int = 100,
    tol: float = 1e-3,
    seed: int = 0,
    params: ParamSpec | None = None,
    hvp_mode: str = "auto",
    cache_graphs: bool = True,
) -> EigenResult:
    """The k algebraically smallest Hessian eigenvalues (ascending), as top_eigenvalues does for -H."""
    return _extreme_eigenvalues(
        model, loss_fn, batches, "smallest", mode=mode, params=params, hvp_mode=hvp_mode, cache_graphs=cache_graphs,
        k=k, method=method, max_iter=max_iter, tol=tol, seed=seed,
    )


def blockwise_top_eigenvalues(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    groups: Mapping[str, ParamSpec],
    *,
    mode: str = "eval",
    method: str = "lanczos",
    max_iter: int = 100,
    tol: float = 1e-3,
    seed: int = 0,
    hvp_mode: str = "auto",
    cache_graphs: bool = True,
) -> BlockwiseEigenResult:
    """Dominant eigenvalue of the diagonal Hessian block of each named parameter group (Chen et al. 2022, Table 4).

    groups maps a name to parameter names or nn.Parameters (see default_parameter_groups). With
    double_backward and cache_graphs, one gradient graph over the union of the groups serves every block.
    """
    solver = _solver_settings(1, method, max_iter, tol, seed)
    if not isinstance(groups, Mapping) or not groups:
        raise ValueError(
            f"groups must be a non-empty dict of name -> parameters, got {groups!r}; "
            "see default_parameter_groups(model)"
        )
    members = {}
    for name, spec in groups.items():
        if isinstance(spec, (list, tuple)) and not spec:
            raise ValueError(f"groups[{name!r}] is empty; give each group at least one parameter or drop it")
        members[name] = _resolve_params(model, spec, what=f"groups[{name!r}]")[0]
    union = list(dict.fromkeys(n for names in members.values() for n in names))
    results = []
    with hessian_operator(
        model, loss_fn, batches, mode=mode, params=union, hvp_mode=hvp_mode, cache_graphs=cache_graphs, seed=seed
    ) as op:
        core = op._core
        position = {name: i for i, name in enumerate(core.names)}
        for names in members.values():
            block = FlatOperator(core, [position[n] for n in names])
            before = core.hvp_count
            output = _solve(block, "largest", **solver)
            results.append(
                _eigen_result(
                    output, core, which="largest", hvp_count=core.hvp_count - before, num_params=block.size, mode=mode,
                    **solver,
                )
            )
        return BlockwiseEigenResult(
            groups=tuple(members),
            results=tuple(results),
            mode=mode,
            hvp_mode=core.hvp_mode,
            num_batches=op.num_batches,
            num_samples=op.num_samples,
        )


def hessian_trace(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    *,
    samples: int = 100,
    mode: str = "eval",
    seed: int = 0,
    params: ParamSpec | None = None,
    hvp_mode: str = "auto",
    cache_graphs: bool = True,
) -> TraceResult:
    """Hutchinson's estimate tr(H) ~ mean_i z_i^T H z_i with Rademacher z_i, and its standard error."""
    _check_int("samples", samples, 2, "a standard error needs at least two probe vectors")
    _check_int("seed", seed, 0, "use a non-negative seed")
    with hessian_operator(
        model, loss_fn, batches, mode=mode, params=params, hvp_mode=hvp_mode, cache_graphs=cache_graphs, seed=seed
    ) as op:
        flat = op._flat
        generator = _generator(flat.device, seed)
        estimates = []
        for _ in range(samples):
            z = torch.randint(0, 2, (flat.size,), generator=generator, device=flat.device).to(flat.dtype)
            z.mul_(2).sub_(1)
            estimates.append(float(torch.dot(z, flat(z))))
        return TraceResult(
            trace=float(np.mean(estimates)),
            std_error=_std_error(estimates),
            estimates=tuple(estimates),
            samples=samples,
            mode=mode,
            hvp_mode=op.hvp_mode,
            seed=seed,
            num_batches=op.num_batches,
            num_samples=op.num_samples,
            num_params=op.num_params,
        )


# ------------------------------------------------------------------------------ zeroth/first order


def _perturbation_setup(
    model: nn.Module, loss_fn: LossFn, batches: Any, mode: str, params: ParamSpec | None, seed: int
) -> tuple[str, list[Any], list[nn.Parameter], LossOracle]:
    mode = _check_choice("mode", mode, MODES)
    batches = _check_batches(batches)
    names, chosen = _resolve_params(model, params)
    oracle = LossOracle(model, loss_fn, batches, train=mode == "train", seed=seed)
    return mode, batches, chosen, oracle


def average_flatness(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    *,
    sigma: float = 0.01,
    draws: int = 10,
    mode: str = "eval",
    seed: int = 0,
    params: ParamSpec | None = None,
) -> FlatnessResult:
    """L_N = E_{e ~ N(0, sigma^2 I)} L(w + e) over `draws` Gaussian draws (Chen et al. 2022, Table 1), and L(w)."""
    sigma = _check_positive("sigma", sigma, "the standard deviation of the weight noise, e.g. 0.01")
    _check_int("draws", draws, 2, "a standard error needs at least two draws")
    _check_int("seed", seed, 0, "use a non-negative seed")
    mode, batches, chosen, oracle = _perturbation_setup(model, loss_fn, batches, mode, params, seed)
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
    mode: str = "eval",
    seed: int = 0,
    params: ParamSpec | None = None,
) -> SurrogateGapResult:
    """GSAM's surrogate gap h = L(w + rho g/||g||) - L(w) with g the gradient of the mean loss over batches.

    sigma_max_estimate = 2h/rho^2 equals the top curvature only near a minimum (||g|| ~ 0): far from one,
    h ~ rho ||g|| dominates, so grad_norm is reported beside it.
    """
    rho = _check_positive("rho", rho, "the perturbation radius, e.g. 0.05")
    _check_int("seed", seed, 0, "use a non-negative seed")
    mode, batches, chosen, oracle = _perturbation_setup(model, loss_fn, batches, mode, params, seed)
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
    mode: str = "eval",
    seed: int = 0,
    params: ParamSpec | None = None,
) -> MSharpnessResult:
    """m-sharpness (Foret et al. 2021, section 4.1): each batch is cut into disjoint sub-batches S of m
    samples (a remainder < m is left out and counted); each S gets its own one-step ascent
    eps_S = rho g_S/||g_S||, and the result is the mean of L_S(w + eps_S) - L_S(w) over all S."""
    rho = _check_positive("rho", rho, "the perturbation radius, e.g. 0.05")
    m = _check_int("m", m, 1, "the number of samples per sub-batch")
    _check_int("seed", seed, 0, "use a non-negative seed")
    batches = _check_batches(batches)
    subbatches, dropped = [], 0
    for batch in batches:
        size = batch_size(batch)
        subbatches.extend(split_batch(batch, size, m))
        dropped += size % m
    if not subbatches:
        largest = max(batch_size(b) for b in batches)
        raise ValueError(f"m must be <= the largest batch size ({largest}), got {m}; use a smaller m")
    mode, _, chosen, oracle = _perturbation_setup(model, loss_fn, subbatches, mode, params, seed)
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
        seed=seed,
        num_batches=len(batches),
        num_samples=oracle.num_samples,
        num_params=sum(p.numel() for p in chosen),
    )


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
    model: nn.Module, loss_fn: LossFn, batches: Any, *, dims: int, steps: int, span: float, seed: int, mode: str
) -> LandscapeResult:
    steps = _check_int("steps", steps, 2, "use at least two grid points per axis (odd counts include alpha=0)")
    span = _check_positive("span", span, "the largest |alpha| of the grid, e.g. 1.0")
    _check_int("seed", seed, 0, "use a non-negative seed")
    mode, batches, chosen, oracle = _perturbation_setup(model, loss_fn, batches, mode, None, seed)
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
    mode: str = "eval",
) -> LandscapeResult:
    """L(w + alpha d) for `steps` alphas evenly in [-span, span], d = filter_normalized_direction(model, seed)."""
    return _landscape(model, loss_fn, batches, dims=1, steps=steps, span=span, seed=seed, mode=mode)


def loss_landscape_2d(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    *,
    steps: int = 21,
    span: float = 1.0,
    seed: int = 0,
    mode: str = "eval",
) -> LandscapeResult:
    """L(w + alpha d1 + beta d2) on a steps x steps grid over [-span, span]^2; d1, d2 from seeds seed, seed+1."""
    return _landscape(model, loss_fn, batches, dims=2, steps=steps, span=span, seed=seed, mode=mode)


# ------------------------------------------------------------------------------- groups, activations


def default_parameter_groups(model: nn.Module) -> dict[str, list[str]]:
    """Parameter groups of a timm ViT, MLP-Mixer or ResNet for blockwise_top_eigenvalues, by parameter name.

    The groups are `trainables.models.parameter_groups` (the one definition): the columns of Table 4 of
    Chen et al. 2022 (patch embedding / stem, attention or token MLP, channel MLP, each block), plus norms and
    head; ResNets by stage.
    """
    from trainables.models import parameter_groups

    return parameter_groups(model)


def _activation_groups(model: nn.Module) -> dict[str, list[nn.Module]]:
    """Hidden activation modules per block: the `act` of every mlp / mlp_tokens / mlp_channels (ViT, Mixer),
    or every act* inside a residual block layerL.B (ResNet)."""
    groups: dict[str, list[nn.Module]] = {}
    for name, module in model.named_modules():
        parent, _, leaf = name.rpartition(".")
        owner = parent.rpartition(".")[2]
        if leaf == "act" and owner in ("mlp", "mlp_tokens", "mlp_channels"):
            groups.setdefault(parent, []).append(module)
        elif leaf.startswith("act") and leaf[3:].isdigit():
            stage, _, index = parent.partition(".")
            if stage.startswith("layer") and stage[5:].isdigit() and index.isdigit():
                groups.setdefault(parent, []).append(module)
    return groups


def _input_chunks(inputs: Any, batch_size_: int) -> list[torch.Tensor]:
    if isinstance(inputs, torch.Tensor):
        if inputs.dim() == 0:
            raise ValueError("inputs must be a batch of samples (dim 0 = samples), got a 0-d tensor")
        return list(torch.split(inputs, batch_size_))
    chunks = list(inputs)
    if not chunks or not all(isinstance(c, torch.Tensor) for c in chunks):
        raise ValueError("inputs must be a tensor of samples or a non-empty list of input tensors")
    return chunks


def active_neuron_fraction(
    model: nn.Module,
    inputs: Any,
    *,
    mode: str = "eval",
    batch_size: int = 256,
    activations: Mapping[str, Sequence[nn.Module]] | None = None,
    seed: int = 0,
) -> ActiveNeuronResult:
    """Per block, the share of hidden activations > 0 over the given inputs (Chen et al. 2022, Figure 2).

    Counted at the output of the activation module inside each block's mlp / mlp_channels /
    mlp_tokens (for GELU, > 0 exactly where its input is > 0); for a timm ResNet, over every act* of each
    residual block. `activations` maps block names to modules to count instead. inputs: a tensor of
    samples (fed in chunks of batch_size) or a list of input batches. In train mode, dropout draws from
    `seed` (the caller's RNG state is left alone).
    """
    mode = _check_choice("mode", mode, MODES)
    _check_int("batch_size", batch_size, 1, "feed at least one sample at a time")
    _check_int("seed", seed, 0, "use a non-negative seed")
    groups = dict(activations) if activations is not None else _activation_groups(model)
    if not groups:
        raise ValueError(
            f"found no MLP activation module in a {type(model).__name__} (looked for *.mlp.act, *.mlp_tokens.act, "
            "*.mlp_channels.act, layerL.B.act*); pass activations={block name: [modules]}"
        )
    counts = {name: [0, 0] for name in groups}
    handles = []

    def counter(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: torch.Tensor) -> None:
            counts[name][0] += int((output > 0).sum())
            counts[name][1] += output.numel()

        return hook

    samples = 0
    try:
        for name, modules in groups.items():
            for module in modules:
                handles.append(module.register_forward_hook(counter(name)))
        with _Scope(model, mode, keep_params=False), torch.no_grad():
            for index, chunk in enumerate(_input_chunks(inputs, batch_size)):
                with fixed_rng(mode == "train", seed + index, chunk.device):
                    model(chunk)
                samples += chunk.shape[0]
    finally:
        for handle in handles:
            handle.remove()
    names = tuple(groups)
    return ActiveNeuronResult(
        blocks=names,
        fractions=tuple(counts[n][0] / counts[n][1] if counts[n][1] else math.nan for n in names),
        active=tuple(counts[n][0] for n in names),
        total=tuple(counts[n][1] for n in names),
        num_samples=samples,
        mode=mode,
    )


def _sample_pairs(labels: torch.Tensor, pairs: int | None, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = labels.shape[0]
    if pairs is None:
        i, j = torch.triu_indices(n, n, offset=1)
        keep = labels[i] != labels[j]
        return i[keep], j[keep]
    generator = torch.Generator().manual_seed(seed)
    found_i, found_j, total = [], [], 0
    for _ in range(100):
        i = torch.randint(0, n, (4 * pairs,), generator=generator)
        j = torch.randint(0, n, (4 * pairs,), generator=generator)
        keep = labels[i] != labels[j]
        found_i.append(i[keep])
        found_j.append(j[keep])
        total += int(keep.sum())
        if total >= pairs:
            break
    if total < pairs:
        raise ValueError(
            f"pairs={pairs}: found only {total} pairs with different labels in {n} inputs after many draws; "
            "pass more varied labels or fewer pairs"
        )
    return torch.cat(found_i)[:pairs], torch.cat(found_j)[:pairs]


def linearity_missing_rate(
    model: nn.Module,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    *,
    pairs: int | None = 1000,
    seed: int = 0,
    mode: str = "eval",
    batch_size: int = 256,
) -> LinearityResult:
    """Share of pairs (x_i, x_j) with y_i != y_j whose midpoint (x_i + x_j)/2 is predicted (argmax of
    the model's output) as neither y_i nor y_j (Chen et al. 2022, Table 6; Zhang et al. 2018).

    pairs: how many different-label pairs to draw at random (with replacement), or None for every
    such pair i < j (exact; O(N^2) memory, for small samples). `seed` draws the pairs (and, in train
    mode, the dropout masks; the caller's RNG state is left alone).
    """
    mode = _check_choice("mode", mode, MODES)
    _check_int("seed", seed, 0, "use a non-negative seed")
    _check_int("batch_size", batch_size, 1, "feed at least one midpoint at a time")
    if pairs is not None:
        _check_int("pairs", pairs, 1, "draw at least one pair, or pass None for all pairs")
    if not isinstance(inputs, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise ValueError("inputs and labels must be tensors (samples along dim 0)")
    if labels.dim() != 1 or inputs.dim() == 0 or inputs.shape[0] != labels.shape[0]:
        raise ValueError(
            f"labels must be 1-D with one label per input, got inputs {tuple(inputs.shape)} and labels "
            f"{tuple(labels.shape)}"
        )
    cpu_labels = labels.detach().cpu()
    if cpu_labels.unique().numel() < 2:
        raise ValueError("labels must hold at least two different classes to form pairs with different labels")
    first, second = _sample_pairs(cpu_labels, pairs, seed)
    misses = 0
    with _Scope(model, mode, keep_params=False), torch.no_grad():
        for start in range(0, first.numel(), batch_size):
            i = first[start : start + batch_size]
            j = second[start : start + batch_size]
            mid = (inputs[i.to(inputs.device)] + inputs[j.to(inputs.device)]) / 2
            with fixed_rng(mode == "train", seed + start, mid.device):
                predicted = model(mid).argmax(dim=-1).cpu()
            misses += int(((predicted != cpu_labels[i]) & (predicted != cpu_labels[j])).sum())
    count = first.numel()
    rate = misses / count
    return LinearityResult(
        missing_rate=rate,
        std_error=math.sqrt(rate * (1 - rate) / count),
        misses=misses,
        pairs=count,
        exhaustive=pairs is None,
        seed=seed,
        mode=mode,
        num_inputs=labels.shape[0],
    )
