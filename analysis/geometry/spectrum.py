"""Hessian spectra: the operator v -> Hv, extreme eigenvalues (whole and per block), Hutchinson's trace."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

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
    _std_error,
)
from analysis.geometry._hvp import (
    FINITE_DIFFERENCE_MODES,
    EigenOutput,
    FlatOperator,
    GGNCore,
    HessianCore,
    LossOracle,
    lanczos,
    power_iteration,
    slq,
)
from analysis.geometry.names import HVP_MODES, HvpMode

#: The eigen-solver: Lanczos with full reorthogonalisation, or power iteration with deflation.
Method = Literal["lanczos", "power"]
METHODS: tuple[str, ...] = get_args(Method)
#: The matrix measured: the Hessian of the loss, or its generalised Gauss-Newton part J^T H_z J (PSD).
Curvature = Literal["hessian", "ggn"]
CURVATURES: tuple[str, ...] = get_args(Curvature)


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
    mask_seed: int
    converged: bool
    iterations: int
    hvp_count: int
    shift: float
    num_batches: int
    num_samples: int
    num_params: int
    history: tuple[float, ...] = field(repr=False)
    curvature: str = "hessian"

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
    mask_seed: int
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
    mask_seed: int
    num_batches: int
    num_samples: int
    num_params: int
    curvature: str = "hessian"

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        return _metrics(prefix, {"hessian_trace": self.trace, "hessian_trace_std_error": self.std_error})

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"estimates": np.asarray(self.estimates, dtype=np.float64)}


def _resolve_hvp_mode(model: nn.Module, hvp_mode: str) -> str:
    _check_choice("hvp_mode", hvp_mode, HVP_MODES)
    if hvp_mode != "auto":
        return hvp_mode
    for cls in type(model).__mro__:
        if cls.__name__ in _AUTO_HVP_MODE:
            return _AUTO_HVP_MODE[cls.__name__]
    return "double_backward"


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
        # Finite differences need first-order autograd only, so timm's fused attention (the speed the
        # gradient-time unit is measured with) stays on for them.
        fused_ok = core_args["hvp_mode"] in FINITE_DIFFERENCE_MODES
        self.scope = _Scope(model, mode, keep_params=False, keep_fused=fused_ok)
        self.core_args = core_args

    def __enter__(self) -> HessianOperator:
        self.scope.__enter__()
        args = dict(self.core_args)
        if args.pop("curvature") == "ggn":
            args.pop("hvp_mode")
            self.core = GGNCore(**args)
        else:
            self.core = HessianCore(**args)
        return HessianOperator(self.core)

    def __exit__(self, *exc: object) -> None:
        self.core.release()
        self.scope.__exit__(*exc)


def hessian_operator(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    *,
    mode: Mode = "eval",
    params: ParamSpec | None = None,
    hvp_mode: HvpMode = "auto",
    cache_graphs: bool = True,
    mask_seed: int = 0,
    curvature: Curvature = "hessian",
) -> _HessianOperatorScope:
    """Context manager yielding a HessianOperator (v -> H v) of the mean loss over `batches`.

    cache_graphs (double_backward only): keep each batch's gradient graph for all later products;
    memory grows with the number of batches, so pass False for many batches. curvature="ggn" gives products
    with the generalised Gauss-Newton matrix J^T H_z J instead (z: the model's output; loss_fn must call the
    model once per batch; hvp_mode is then unused). mask_seed: in train mode, the seed of the dropout / drop-path masks, drawn once per batch and held fixed, so the loss is one function of the weights; every measure given the same batches, mode and mask_seed measures the same loss and Hessian (one Hessian per measurement set).
    """
    mode = _check_choice("mode", mode, MODES)
    _check_int("mask_seed", mask_seed, 0, "use a non-negative seed")
    batches = _check_batches(batches)
    names, chosen = _resolve_params(model, params)
    resolved = _resolve_hvp_mode(model, hvp_mode)
    oracle = LossOracle(model, loss_fn, batches, train=mode == "train", seed=mask_seed)
    curvature = _check_choice("curvature", curvature, CURVATURES)
    if curvature == "ggn" and resolved in FINITE_DIFFERENCE_MODES:
        raise ValueError(
            f"hvp_mode={resolved!r} with curvature='ggn': finite differences of the gradient give Hessian products, "
            "not Gauss-Newton ones (the GGN products are always exact). Use curvature='hessian' with it, or "
            "hvp_mode='auto' with curvature='ggn'"
        )
    core_args = dict(
        oracle=oracle,
        names=names,
        params=chosen,
        hvp_mode=resolved,
        cache_graphs=bool(cache_graphs),
        curvature=curvature,
    )
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
    mode: Mode,
    params: ParamSpec | None,
    hvp_mode: str,
    cache_graphs: bool,
    mask_seed: int,
    curvature: str = "hessian",
    **solver: Any,
) -> EigenResult:
    solver = _solver_settings(**solver)
    with hessian_operator(
        model,
        loss_fn,
        batches,
        mode=mode,
        params=params,
        hvp_mode=hvp_mode,
        cache_graphs=cache_graphs,
        mask_seed=mask_seed,
        curvature=curvature,
    ) as op:
        if solver["k"] > op.num_params:
            raise ValueError(
                f"k must be <= the number of parameters ({op.num_params}), got {solver['k']}; ask for fewer eigenvalues"
            )
        output = _solve(op._flat, which, **solver)
        return _eigen_result(
            output,
            op._core,
            which=which,
            hvp_count=op.hvp_count,
            num_params=op.num_params,
            mode=mode,
            mask_seed=mask_seed,
            curvature=curvature,
            **solver,
        )


def top_eigenvalues(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    *,
    k: int = 1,
    mode: Mode = "eval",
    method: Method = "lanczos",
    max_iter: int = 100,
    tol: float = 1e-3,
    seed: int = 0,
    params: ParamSpec | None = None,
    hvp_mode: HvpMode = "auto",
    cache_graphs: bool = True,
    mask_seed: int = 0,
    curvature: Curvature = "hessian",
) -> EigenResult:
    """The k algebraically largest eigenvalues of the Hessian of the mean loss over `batches`.

    loss_fn(model, batch) returns the batch's mean loss; batches are weighted by their sample counts.
    method="lanczos" (full reorthogonalisation; memory max_iter vectors) or "power" (with a shift when
    the dominant eigenvalue is negative, deflation for k > 1). max_iter bounds the Krylov steps
    (Lanczos) or the iterations per eigenpair (power). Convergence is judged on the eigenvector (residual
    or 1-|<v_t, v_t-1>|) and on the value (relative change), both < tol. mode is "eval" or "train" (BN,
    dropout); the model's modes and buffers are restored afterwards. params restricts the Hessian to a
    subset (names or nn.Parameters). hvp_mode: "double_backward", "forward_over_reverse" or "auto" (exact), or
    "finite_difference" (1 gradient per product, O(h) error) / "finite_difference_central" (2, O(h^2)), for
    smooth models only (a ReLU or max pool in the weights' path raises ValueError at the first product);
    cache_graphs and mask_seed as in hessian_operator; `seed` draws the start vector only.
    """
    return _extreme_eigenvalues(
        model,
        loss_fn,
        batches,
        "largest",
        mode=mode,
        params=params,
        hvp_mode=hvp_mode,
        cache_graphs=cache_graphs,
        mask_seed=mask_seed,
        curvature=curvature,
        k=k,
        method=method,
        max_iter=max_iter,
        tol=tol,
        seed=seed,
    )


def smallest_eigenvalue(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    *,
    k: int = 1,
    mode: Mode = "eval",
    method: Method = "lanczos",
    max_iter: int = 100,
    tol: float = 1e-3,
    seed: int = 0,
    params: ParamSpec | None = None,
    hvp_mode: HvpMode = "auto",
    cache_graphs: bool = True,
    mask_seed: int = 0,
    curvature: Curvature = "hessian",
) -> EigenResult:
    """The k algebraically smallest Hessian eigenvalues (ascending), as top_eigenvalues does for -H."""
    return _extreme_eigenvalues(
        model,
        loss_fn,
        batches,
        "smallest",
        mode=mode,
        params=params,
        hvp_mode=hvp_mode,
        cache_graphs=cache_graphs,
        mask_seed=mask_seed,
        curvature=curvature,
        k=k,
        method=method,
        max_iter=max_iter,
        tol=tol,
        seed=seed,
    )


def blockwise_top_eigenvalues(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    groups: Mapping[str, ParamSpec],
    *,
    mode: Mode = "eval",
    method: Method = "lanczos",
    max_iter: int = 100,
    tol: float = 1e-3,
    seed: int = 0,
    hvp_mode: HvpMode = "auto",
    cache_graphs: bool = True,
    mask_seed: int = 0,
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
        model,
        loss_fn,
        batches,
        mode=mode,
        params=union,
        hvp_mode=hvp_mode,
        cache_graphs=cache_graphs,
        mask_seed=mask_seed,
    ) as op:
        core = op._core
        position = {name: i for i, name in enumerate(core.names)}
        for names in members.values():
            block = FlatOperator(core, [position[n] for n in names])
            before = core.hvp_count
            output = _solve(block, "largest", **solver)
            results.append(
                _eigen_result(
                    output,
                    core,
                    which="largest",
                    hvp_count=core.hvp_count - before,
                    num_params=block.size,
                    mode=mode,
                    mask_seed=mask_seed,
                    **solver,
                )
            )
        return BlockwiseEigenResult(
            groups=tuple(members),
            results=tuple(results),
            mode=mode,
            mask_seed=mask_seed,
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
    mode: Mode = "eval",
    seed: int = 0,
    params: ParamSpec | None = None,
    hvp_mode: HvpMode = "auto",
    cache_graphs: bool = True,
    mask_seed: int = 0,
    curvature: Curvature = "hessian",
) -> TraceResult:
    """Hutchinson's estimate tr(H) ~ mean_i z_i^T H z_i with Rademacher z_i, and its standard error.

    `seed` draws the probe vectors; mask_seed fixes the Hessian in train mode (see hessian_operator).
    """
    _check_int("samples", samples, 2, "a standard error needs at least two probe vectors")
    _check_int("seed", seed, 0, "use a non-negative seed")
    with hessian_operator(
        model,
        loss_fn,
        batches,
        mode=mode,
        params=params,
        hvp_mode=hvp_mode,
        cache_graphs=cache_graphs,
        mask_seed=mask_seed,
        curvature=curvature,
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
            mask_seed=mask_seed,
            num_batches=op.num_batches,
            num_samples=op.num_samples,
            num_params=op.num_params,
            curvature=curvature,
        )


def default_parameter_groups(model: nn.Module) -> dict[str, list[str]]:
    """Parameter groups of a timm ViT, MLP-Mixer or ResNet for blockwise_top_eigenvalues, by parameter name.

    The groups are `trainables.models.parameter_groups` (the one definition): the columns of Table 4 of
    Chen et al. 2022 (patch embedding / stem, attention or token MLP, channel MLP, each block), plus norms and
    head; ResNets by stage.
    """
    from trainables.models import parameter_groups

    return parameter_groups(model)


@dataclass(frozen=True)
class DensityResult:
    """The Hessian's eigenvalue density by stochastic Lanczos quadrature (Ghorbani et al. 2019; Papyan 2019).

    nodes / weights: (probes, steps) Gauss-quadrature nodes and weights of each probe (weights of a probe sum
    to 1; unused slots after an early stop have weight 0). The density is their weight-averaged mixture:
    `density(grid, sigma)` smooths it with Gaussians of width sigma; `moment(k)` estimates tr(H^k) / num_params.
    """

    nodes: np.ndarray = field(repr=False, compare=False)
    weights: np.ndarray = field(repr=False, compare=False)
    probes: int
    steps: int
    mode: str
    hvp_mode: str
    seed: int
    mask_seed: int
    hvp_count: int
    num_batches: int
    num_samples: int
    num_params: int
    curvature: str = "hessian"

    def moment(self, k: int) -> float:
        """Estimate of tr(H^k) / num_params (the mean over probes of each quadrature of x^k)."""
        return float(np.mean(np.sum(self.weights * self.nodes**k, axis=1)))

    def density(self, grid, sigma: float | None = None) -> np.ndarray:
        """The spectral density on `grid`, each node a Gaussian of width sigma (default: 1% of the node range)."""
        grid = np.asarray(grid, dtype="float64")
        used = self.weights > 0
        span = float(self.nodes[used].max() - self.nodes[used].min()) if used.any() else 1.0
        sigma = float(sigma) if sigma is not None else max(span, 1e-12) / 100.0
        z = (grid[:, None] - self.nodes[used][None, :]) / sigma
        kernel = np.exp(-0.5 * z * z) / (sigma * np.sqrt(2 * np.pi))
        return kernel @ self.weights[used] / self.probes

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        used = self.weights > 0
        return _metrics(
            prefix,
            {
                "slq_lambda_max": float(self.nodes[used].max()),
                "slq_lambda_min": float(self.nodes[used].min()),
                "slq_trace_estimate": self.moment(1) * self.num_params,
                "slq_negative_mass": float(np.sum(self.weights * (self.nodes < 0)) / self.probes),
            },
        )

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"nodes": self.nodes, "weights": self.weights}


def eigenvalue_density(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Any],
    *,
    probes: int = 10,
    steps: int = 30,
    mode: Mode = "eval",
    seed: int = 0,
    params: ParamSpec | None = None,
    hvp_mode: HvpMode = "auto",
    cache_graphs: bool = True,
    mask_seed: int = 0,
    curvature: Curvature = "hessian",
) -> DensityResult:
    """The eigenvalue density of the Hessian of the mean loss over `batches` by stochastic Lanczos quadrature.

    `probes` Rademacher vectors (drawn from `seed`), `steps` Lanczos steps each (probes x steps Hessian-vector
    products). With steps >= num_params the quadrature is exact: each probe's nodes are eigenvalues of H.
    mask_seed, cache_graphs and hvp_mode as in hessian_operator.
    """
    _check_int("probes", probes, 1, "use at least one probe vector (10 is usual)")
    _check_int("steps", steps, 1, "use at least one Lanczos step per probe (30 is usual)")
    _check_int("seed", seed, 0, "use a non-negative seed")
    with hessian_operator(
        model,
        loss_fn,
        batches,
        mode=mode,
        params=params,
        hvp_mode=hvp_mode,
        cache_graphs=cache_graphs,
        mask_seed=mask_seed,
        curvature=curvature,
    ) as op:
        flat = op._flat
        nodes, weights = slq(
            flat,
            flat.size,
            probes=probes,
            steps=steps,
            generator=_generator(flat.device, seed),
            dtype=flat.dtype,
            device=flat.device,
        )
        return DensityResult(
            nodes=nodes.numpy(),
            weights=weights.numpy(),
            probes=probes,
            steps=min(steps, flat.size),
            mode=mode,
            hvp_mode=op.hvp_mode,
            seed=seed,
            mask_seed=mask_seed,
            hvp_count=op.hvp_count,
            num_batches=op.num_batches,
            num_samples=op.num_samples,
            num_params=op.num_params,
            curvature=curvature,
        )
