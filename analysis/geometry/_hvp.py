"""Hessian-vector products of a model's mean loss over fixed batches, and the eigen-solvers on them (private)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

#: The modes that difference gradients instead of differentiating them twice (first-order autograd only).
FINITE_DIFFERENCE_MODES = ("finite_difference", "finite_difference_central")

# The finite-difference step is the textbook one divided by this (see HessianCore._step).
_FD_STEP_DIVISOR = 64.0
# The Ritz/Rayleigh values may be ~0; relative tests are floored at this share of the spectral scale.
_SCALE_FLOOR = 1e-6


def batch_size(batch: Any) -> int:
    """Samples in a batch: dim 0 of the first tensor found in a tensor, tuple/list or dict."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0:
            raise ValueError("a batch tensor must have a batch dimension (dim 0), got a 0-d tensor")
        return int(batch.shape[0])
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        if isinstance(item, (torch.Tensor, list, tuple, dict)):
            try:
                return batch_size(item)
            except ValueError:
                continue
    raise ValueError(
        f"cannot infer the batch size of a batch of type {type(batch).__name__}: a batch must be a tensor, "
        "or a tuple/list/dict holding one whose dim 0 is the batch dimension (used to weight the mean loss)"
    )


def split_batch(batch: Any, size: int, m: int) -> list[Any]:
    """Disjoint sub-batches of m samples (the remainder is left out): every tensor with dim 0 == size is sliced."""

    def take(item: Any, start: int) -> Any:
        if isinstance(item, torch.Tensor):
            return item[start : start + m] if item.dim() > 0 and item.shape[0] == size else item
        if isinstance(item, dict):
            return {key: take(value, start) for key, value in item.items()}
        if isinstance(item, (list, tuple)):
            values = [take(value, start) for value in item]
            return type(item)(*values) if hasattr(item, "_fields") else type(item)(values)
        return item

    return [take(batch, start) for start in range(0, size - m + 1, m)]


# The fp32 precision switches of PyTorch's backends (torch >= 2.9); each may say "tf32" (or "bf16" on CPU).
_FP32_BACKENDS = (
    ("cuda", "matmul"),
    ("cudnn", "conv"),
    ("cudnn", "rnn"),
    ("mkldnn", "matmul"),
    ("mkldnn", "conv"),
    ("mkldnn", "rnn"),
)


@contextlib.contextmanager
def ieee_fp32() -> Iterator[None]:
    """float32 matrix products and convolutions in IEEE float32 inside, the caller's settings back on exit.

    A finite difference of gradients is only as good as the gradients' rounding: its step is chosen for the
    weights' dtype (eps 2^-23 in float32), and TF32 (on by default for cuDNN convolutions) rounds the products'
    inputs to 2^-10, which swamps the difference (ResNet-50's forward-difference products were off by 10^3).
    """
    saved = []
    for path in _FP32_BACKENDS:
        backend: Any = torch.backends
        for name in path:
            backend = getattr(backend, name, None)
        if backend is not None and hasattr(backend, "fp32_precision"):
            saved.append((backend, backend.fp32_precision))
    legacy = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) if not saved else None
    try:
        if saved:
            for backend, _ in saved:
                backend.fp32_precision = "ieee"
        else:  # torch < 2.9: the TF32 flags
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        yield
    finally:
        for backend, value in saved:
            backend.fp32_precision = value
        if legacy is not None:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = legacy


# Functions (by __name__, as a TorchFunctionMode sees them) whose derivative jumps: a unit switching on or off, a
# max changing its argument. A loss built from them has a discontinuous gradient, so a difference of gradients
# over a step h picks up every switch the step crosses: their number grows like h, each adds a jump of O(1) / h,
# and the sum does not vanish as h shrinks. (ResNet-50, ReLU and max pooling: lambda_max off by 33x.)
_KINKED = frozenset(
    {
        "relu",
        "relu_",
        "relu6",
        "leaky_relu",
        "leaky_relu_",
        "hardtanh",
        "hardtanh_",
        "hardswish",
        "hardsigmoid",
        "prelu",
        "rrelu",
        "rrelu_",
        "selu",
        "selu_",
        "threshold",
        "threshold_",
        "_threshold",
        "hardshrink",
        "softshrink",
        "max_pool1d",
        "max_pool2d",
        "max_pool3d",
        "max_pool1d_with_indices",
        "max_pool2d_with_indices",
        "max_pool3d_with_indices",
        "adaptive_max_pool1d",
        "adaptive_max_pool2d",
        "adaptive_max_pool3d",
        "fractional_max_pool2d",
        "fractional_max_pool3d",
    }
)


class _RefuseKinks(torch.overrides.TorchFunctionMode):
    """Raises at the first kinked function (see _KINKED) applied to a tensor that depends on the weights."""

    def __init__(self, hvp_mode: str) -> None:
        super().__init__()
        self.hvp_mode = hvp_mode

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _KINKED and torch.is_grad_enabled():
            tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
            if any(t.requires_grad for t in tensors):
                raise ValueError(
                    f"hvp_mode={self.hvp_mode!r} cannot measure this model: its loss applies {name} to tensors "
                    "that depend on the weights, whose gradient jumps where a unit switches, so a difference of "
                    "gradients does not converge to the Hessian-vector product (on ResNet-50, ReLU and max "
                    "pooling put lambda_max off by 33x). Use hvp_mode='auto' (exact products) for this model; "
                    "finite differences suit smooth models (GELU, SiLU, tanh: ViT, MLP-Mixer)"
                )
        return func(*args, **kwargs)


class LossOracle:
    """The mean loss over a fixed list of batches, each weighted by its number of samples.

    In train mode every batch is evaluated under its own fixed seed, so dropout and drop-path draw the same
    masks at every evaluation: the loss stays ONE function of the weights, which a Hessian needs.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[nn.Module, Any], torch.Tensor],
        batches: Sequence[Any],
        *,
        train: bool,
        seed: int,
    ) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.batches = list(batches)
        sizes = [batch_size(batch) for batch in self.batches]
        self.num_samples = sum(sizes)
        self.weights = [size / self.num_samples for size in sizes]
        self.train = train
        self.seed = seed

    def rng(self, index: int) -> _Seeded | _NoOp:
        return fixed_rng(self.train, self.seed * 1_000_003 + index, _model_device(self.model))

    def batch_loss(self, index: int) -> torch.Tensor:
        with self.rng(index):
            loss = self.loss_fn(self.model, self.batches[index])
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError(
                f"loss_fn(model, batch) must return a scalar tensor (the mean loss of the batch), got "
                f"{type(loss).__name__}{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''}"
            )
        return loss.reshape(())

    def _selection(self, indices: Sequence[int] | None) -> list[tuple[int, float]]:
        if indices is None:
            return list(enumerate(self.weights))
        total = sum(self.weights[i] for i in indices)
        return [(i, self.weights[i] / total) for i in indices]

    def value(self, indices: Sequence[int] | None = None) -> float:
        """The weighted mean loss over all batches, or over the batches `indices` (re-weighted among them)."""
        total = None
        with torch.no_grad():
            for index, weight in self._selection(indices):
                term = self.batch_loss(index).double() * weight
                total = term if total is None else total + term
        return float(total)

    def value_and_grad(
        self, params: Sequence[torch.Tensor], indices: Sequence[int] | None = None
    ) -> tuple[float, torch.Tensor]:
        """The mean loss and its flat gradient with respect to params."""
        total = None
        grad = None
        for index, weight in self._selection(indices):
            loss = self.batch_loss(index)
            parts = torch.autograd.grad(loss * weight, list(params), allow_unused=True)
            flat = flatten([torch.zeros_like(p) if g is None else g for p, g in zip(params, parts)])
            grad = flat if grad is None else grad.add_(flat)
            term = loss.detach().double() * weight
            total = term if total is None else total + term
        return float(total), grad


class _NoOp:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_OP = _NoOp()


def fixed_rng(train: bool, seed: int, device: torch.device) -> _Seeded | _NoOp:
    """In train mode, a context that runs from `seed` and gives the caller's RNG state back; else a no-op."""
    return _Seeded(seed, device) if train else _NO_OP


class _Seeded:
    """Runs its body from a fixed RNG seed and gives the caller's RNG state back afterwards."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.seed = seed
        self.device = device

    def __enter__(self) -> None:
        cuda = self.device.type == "cuda"
        self._fork = torch.random.fork_rng(devices=[self.device] if cuda else [], device_type="cuda")
        self._fork.__enter__()
        torch.random.default_generator.manual_seed(self.seed)
        if cuda:
            with torch.cuda.device(self.device):
                torch.cuda.manual_seed(self.seed)

    def __exit__(self, *exc: object) -> Any:
        return self._fork.__exit__(*exc)


def _model_device(model: nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten(vector: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [part.view_as(t) for part, t in zip(torch.split(vector, [t.numel() for t in like]), like)]


class _LossModule(nn.Module):
    """Makes loss_fn(model, batch) a module call, so torch.func.functional_call can swap the model's tensors."""

    def __init__(self, model: nn.Module, loss_fn: Callable[[nn.Module, Any], torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, batch: Any) -> torch.Tensor:
        return self.loss_fn(self.model, batch)


def _conv_config(args: tuple, kwargs: dict) -> tuple | None:
    """(input, weight, bias, stride, padding, dilation, groups) of a conv call as lists, or None for
    string padding ("same"/"valid"), which keeps the stock path."""
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    defaults = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}
    values = dict(zip(names, args))
    values.update(kwargs)
    for name, default in defaults.items():
        values.setdefault(name, default)
    if isinstance(values["padding"], str):
        return None
    dims = values["weight"].dim() - 2

    def as_list(value: Any) -> list[int]:
        return [int(value)] * dims if isinstance(value, int) else [int(v) for v in value]

    return (
        values["input"],
        values["weight"],
        values["bias"],
        as_list(values["stride"]),
        as_list(values["padding"]),
        as_list(values["dilation"]),
        int(values["groups"]),
    )


class _Conv(torch.autograd.Function):
    """A convolution whose backward is _ConvGrad, so that the second backward is cheap."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conf: tuple
    ) -> torch.Tensor:
        stride, padding, dilation, groups = conf
        ctx.save_for_backward(x, weight)
        ctx.conf = conf
        ctx.has_bias = bias is not None
        return torch.ops.aten.convolution(x, weight, bias, stride, padding, dilation, False, [0] * len(stride), groups)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_x, grad_w = _ConvGrad.apply(grad_out, x, weight, ctx.conf, need_x, need_w)
        grad_b = None
        if need_b and ctx.has_bias:
            grad_b = grad_out.sum(dim=[0] + list(range(2, grad_out.dim())))
        return grad_x, grad_w, grad_b, None


class _ConvGrad(torch.autograd.Function):
    """(grad_out, x, w) -> (dgrad, wgrad) of a convolution, differentiated with the fast kernels.

    PyTorch's own double backward of a convolution computes the weight term as a convolution whose
    kernel is the whole grad_out map (dilated by the stride): cuDNN runs that with slow generic
    kernels, which made one HVP of ResNet-50 cost 5.3 gradients. Both outputs are bilinear, so their
    adjoints are again a forward convolution, a dgrad and a wgrad:
    <ggi, dgrad(go, w)> = <conv(ggi, w), go>,  <ggw, wgrad(x, go)> = <conv(x, ggw), go>.
    """

    @staticmethod
    def forward(
        ctx: Any, grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, conf: tuple, need_x: bool, need_w: bool
    ) -> tuple:
        stride, padding, dilation, groups = conf
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(grad_out, x, weight)
        ctx.conf = conf
        zeros = [0] * len(stride)
        grad_x, grad_w, _ = torch.ops.aten.convolution_backward(
            grad_out, x, weight, None, stride, padding, dilation, False, zeros, groups, [need_x, need_w, False]
        )
        return grad_x, grad_w

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, gg_x: torch.Tensor | None, gg_w: torch.Tensor | None) -> tuple:
        grad_out, x, weight = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conf
        zeros = [0] * len(stride)
        need_go, need_x, need_w = ctx.needs_input_grad[:3]
        g_go = g_x = g_w = None
        if need_go:
            if gg_x is not None:
                g_go = torch.ops.aten.convolution(gg_x, weight, None, stride, padding, dilation, False, zeros, groups)
            if gg_w is not None:
                term = torch.ops.aten.convolution(x, gg_w, None, stride, padding, dilation, False, zeros, groups)
                g_go = term if g_go is None else g_go + term
        if need_x and gg_w is not None:
            g_x = torch.ops.aten.convolution_backward(
                grad_out, x, gg_w, None, stride, padding, dilation, False, zeros, groups, [True, False, False]
            )[0]
        if need_w and gg_x is not None:
            g_w = torch.ops.aten.convolution_backward(
                grad_out, gg_x, weight, None, stride, padding, dilation, False, zeros, groups, [False, True, False]
            )[1]
        return g_go, g_x, g_w, None, None, None


class _CheapSecondOrder(torch.overrides.TorchFunctionMode):
    """While a loss is built for double backward: convolutions go through _Conv, and eval-mode batch
    norm becomes the per-channel affine map it is (x * scale + shift), whose double backward is a few
    elementwise ops instead of the generic batch-norm double backward. Values are unchanged (up to
    rounding in the batch-norm rewrite)."""

    _CONVS = (torch.conv1d, torch.conv2d, torch.conv3d)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in self._CONVS:
            conf = _conv_config(args, kwargs)
            if conf is not None:
                x, weight, bias = conf[:3]
                return _Conv.apply(x, weight, bias, conf[3:])
        elif func is nn.functional.batch_norm:
            names = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
            values = dict(zip(names, args))
            values.update(kwargs)
            mean, var = values.get("running_mean"), values.get("running_var")
            if not values.get("training", False) and mean is not None and var is not None:
                x = values["input"]
                scale = torch.rsqrt(var + values.get("eps", 1e-5))
                if values.get("weight") is not None:
                    scale = scale * values["weight"]
                shift = -mean * scale
                if values.get("bias") is not None:
                    shift = shift + values["bias"]
                shape = [1, -1] + [1] * (x.dim() - 2)
                return x * scale.view(shape) + shift.view(shape)
        return func(*args, **kwargs)


class HessianCore:
    """Hessian-vector products of the oracle's mean loss with respect to any subset of `params`.

    double_backward: one forward and one create_graph backward per batch, then each product is one
    backward through the gradient graph (convolutions and eval-mode batch norm rerouted by
    _CheapSecondOrder unless cheap_layers=False). With cache_graphs those graphs are built once and kept for
    every later product (memory: one double-backward graph per batch); without, rebuilt each time.
    forward_over_reverse: torch.func jvp of the gradient; nothing is kept between products.
    finite_difference: Hv ~= (g(w + h v) - g(w)) / h, one gradient per product (g(w) computed once and
    kept), error O(h); finite_difference_central: (g(w + h v) - g(w - h v)) / 2h, two gradients per
    product, error O(h^2). Both are approximations (see _step for h), computed in IEEE fp32 (ieee_fp32), and
    refused for losses with kinks in the weights (_KINKED: ReLU, max pooling), where they do not converge.
    """

    def __init__(
        self,
        oracle: LossOracle,
        names: Sequence[str],
        params: Sequence[nn.Parameter],
        *,
        hvp_mode: str,
        cache_graphs: bool,
        cheap_layers: bool = True,
    ) -> None:
        self.oracle = oracle
        self.cheap_layers = cheap_layers
        self.names = list(names)
        self.params = list(params)
        self.hvp_mode = hvp_mode
        self.cache_graphs = cache_graphs
        self.hvp_count = 0
        self._graphs: list[tuple[torch.Tensor | None, ...]] | None = None
        # finite differences: the saved weights (copied back after every product) and the clean gradient.
        self._base: list[torch.Tensor] | None = None
        self._clean: list[torch.Tensor] | None = None
        self._w_norms: dict[tuple[int, ...], float] = {}
        self._smooth_checked = False
        if hvp_mode == "forward_over_reverse":
            self._wrapper = _LossModule(oracle.model, oracle.loss_fn)

    def release(self) -> None:
        self._graphs = None
        self._base = None
        self._clean = None
        self._w_norms = {}

    def hvp(self, index: Sequence[int], vectors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """H[index, index] @ vectors: the Hessian block of params[index] (vectors aligned with index)."""
        self.hvp_count += 1
        if self.hvp_mode == "forward_over_reverse":
            return self._hvp_forward_over_reverse(index, vectors)
        if self.hvp_mode in FINITE_DIFFERENCE_MODES:
            return self._hvp_finite_difference(index, vectors)
        return self._hvp_double_backward(index, vectors)

    def _gradient_graphs(self, params: Sequence[nn.Parameter]) -> Iterator[tuple[torch.Tensor | None, ...]]:
        for batch, weight in enumerate(self.oracle.weights):
            with _CheapSecondOrder() if self.cheap_layers else _NO_OP:
                loss = self.oracle.batch_loss(batch) * weight
            yield torch.autograd.grad(loss, list(params), create_graph=True, allow_unused=True)

    def _hvp_double_backward(self, index: Sequence[int], vectors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        params = [self.params[i] for i in index]
        if self.cache_graphs:
            if self._graphs is None:
                self._graphs = list(self._gradient_graphs(self.params))
            graphs: Any = ([grads[i] for i in index] for grads in self._graphs)
        else:
            graphs = self._gradient_graphs(params)
        result = [torch.zeros_like(p) for p in params]
        for grads in graphs:
            # A gradient that does not depend on the weights (a linear part) has a zero Hessian row.
            live = [j for j, g in enumerate(grads) if g is not None and g.requires_grad]
            if not live:
                continue
            parts = torch.autograd.grad(
                [grads[j] for j in live],
                params,
                grad_outputs=[vectors[j] for j in live],
                retain_graph=self.cache_graphs,
                allow_unused=True,
            )
            for out, part in zip(result, parts):
                if part is not None:
                    out.add_(part)
        return result

    def _hvp_forward_over_reverse(self, index: Sequence[int], vectors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        names = ["model." + self.names[i] for i in index]
        primals = tuple(self.params[i].detach() for i in index)
        tangents = tuple(vectors)
        # Train-mode BatchNorm updates its running statistics in place, which torch.func refuses on
        # captured tensors: give it fresh copies (thrown away) created inside the transform.
        buffers = list(self.oracle.model.named_buffers()) if self.oracle.train else []
        result = [torch.zeros_like(p) for p in primals]
        for batch, weight in enumerate(self.oracle.weights):

            def loss_of(values: tuple[torch.Tensor, ...], batch: int = batch, weight: float = weight) -> torch.Tensor:
                state = {"model." + name: b.clone() for name, b in buffers}
                state.update(zip(names, values))
                with self.oracle.rng(batch):
                    loss = torch.func.functional_call(self._wrapper, state, (self.oracle.batches[batch],))
                return loss.reshape(()) * weight

            with torch.no_grad():
                _, parts = torch.func.jvp(torch.func.grad(loss_of), (primals,), (tangents,))
            for out, part in zip(result, parts):
                out.add_(part)
        return result

    def _gradient(self, params: Sequence[nn.Parameter]) -> list[torch.Tensor]:
        """The mean loss's gradient with respect to params, one tensor per parameter, with no host sync.

        The oracle runs every batch under its own fixed seed (train mode), so the clean and the shifted
        gradients see the same dropout / drop-path masks: both are gradients of ONE function of the weights.
        """
        total: list[torch.Tensor] | None = None
        # The first gradient of the operator checks the model is smooth (see _KINKED), before any product is out.
        watch = _RefuseKinks(self.hvp_mode) if not self._smooth_checked else _NO_OP
        with ieee_fp32(), watch:
            for index, weight in enumerate(self.oracle.weights):
                loss = self.oracle.batch_loss(index) * weight
                parts = torch.autograd.grad(loss, list(params), allow_unused=True)
                parts = [torch.zeros_like(p) if g is None else g for p, g in zip(params, parts)]
                if total is None:
                    total = list(parts)
                else:
                    torch._foreach_add_(total, parts)
        self._smooth_checked = True
        return total

    def _step(self, index: Sequence[int], v_norm: float, central: bool) -> float:
        # Step rule: h = eps^(1/2) (1 + ||w||) / (64 ||v||) forward, eps^(1/3) (1 + ||w||) / (64 ||v||) central; eps of
        # the weights' dtype, ||w|| over the differentiated parameters. The weight-space step h||v|| is then a fixed
        # share of the weights' size, so it does not depend on how v is scaled, and each weight moves by ~eps^(1/2)
        # of itself, far above its own rounding (eps |w_i|) whatever the number of parameters. eps^(1/2) (eps^(1/3))
        # is the textbook balance of the truncation error O(h) (O(h^2)) against the gradients' rounding O(eps / h)
        # (Nocedal & Wright, sec. 8.1). The 1/64 is because the truncation error along the sharp directions that
        # lambda_max lives in is large. Measured on ViT-S/16 (float32, batch 64, H100; benchmarks/bench_geometry.py),
        # divisors 8 / 16 / 32 / 64 / 128: error of H v_max 8.0 / 3.9 / 1.9 / 0.95 / 0.48%, of Lanczos(20) lambda_max
        # +4.9 / +2.9 / +1.5 / +0.7 / +0.3%, of H v for a random v (rounding) 1.1 / 2.2 / 4.2 / 8.6 / 17%, of the SLQ
        # second moment (the bulk of the density, same probes) -0.05 / -0.04 / +0.1 / -0.2 / +1.8%: 64 keeps lambda_max
        # and the density both within 1%. The rounding term assumes the gradients are computed at the dtype's precision: see ieee_fp32.
        key = tuple(index)
        if key not in self._w_norms:  # the weights are fixed for the operator's life: one norm per block
            norms = torch._foreach_norm([self._base[i] for i in index])
            self._w_norms[key] = float(torch.linalg.vector_norm(torch.stack(norms).double()))
        eps = torch.finfo(self._base[index[0]].dtype).eps
        return (
            (eps ** (1 / 3) if central else math.sqrt(eps)) * (1.0 + self._w_norms[key]) / (_FD_STEP_DIVISOR * v_norm)
        )

    def _hvp_finite_difference(self, index: Sequence[int], vectors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        # About one gradient per product (forward): the weights are shifted in place with one fused add, the gradient
        # comes back per parameter, and the saved weights are copied back with one fused copy (never w + hv - hv,
        # which leaves rounding behind), so the weights are bit-for-bit the originals between products. The one host
        # sync is ||v|| (the step needs it as a number).
        params = [self.params[i] for i in index]
        if self._base is None:
            with torch.no_grad():
                self._base = [p.detach().clone() for p in self.params]
        base = [self._base[i] for i in index]
        vectors = list(vectors)
        v_norm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(vectors)).double()))
        if v_norm == 0.0:
            return [torch.zeros_like(p) for p in params]
        central = self.hvp_mode == "finite_difference_central"
        h = self._step(index, v_norm, central)
        if not central and self._clean is None:
            # The clean gradient over ALL parameters once per operator, so every block and product reuses it.
            self._clean = self._gradient(self.params)
        try:
            with torch.no_grad():
                torch._foreach_add_(params, vectors, alpha=h)
            plus = self._gradient(params)
            if central:
                with torch.no_grad():
                    torch._foreach_copy_(params, base)
                    torch._foreach_add_(params, vectors, alpha=-h)
                minus = self._gradient(params)
                scale = 2.0 * h
            else:
                minus = [self._clean[i] for i in index]
                scale = h
        finally:
            with torch.no_grad():
                torch._foreach_copy_(params, base)
        torch._foreach_sub_(plus, minus)
        torch._foreach_div_(plus, scale)
        return plus


class FlatOperator:
    """A square block of the Hessian acting on flat vectors (the solvers' view)."""

    def __init__(self, core: HessianCore, index: Sequence[int]) -> None:
        self.core = core
        self.index = list(index)
        self.like = [core.params[i] for i in self.index]
        self.size = sum(p.numel() for p in self.like)
        self.dtype = self.like[0].dtype
        self.device = self.like[0].device

    def __call__(self, vector: torch.Tensor) -> torch.Tensor:
        return flatten(self.core.hvp(self.index, unflatten(vector, self.like)))


@dataclass(frozen=True)
class EigenOutput:
    """What a solver found, ordered from the algebraic extreme inwards, before it is dressed as a result."""

    values: tuple[float, ...]
    vectors: tuple[torch.Tensor, ...]
    residuals: tuple[float, ...]
    converged: bool
    iterations: int
    shift: float
    history: tuple[float, ...]


def _unit(vector: torch.Tensor) -> torch.Tensor:
    return vector / vector.norm()


def _orthogonalize(vector: torch.Tensor, basis: Sequence[torch.Tensor]) -> torch.Tensor:
    # Two passes of modified Gram-Schmidt: one pass loses orthogonality in float32 (Kahan's "twice is enough").
    # The coefficients stay on the device: a host sync per basis vector would stall a GPU.
    for _ in range(2):
        for b in basis:
            vector.addcmul_(b, torch.dot(b, vector), value=-1)
    return vector


class _Basis:
    """Orthonormal Krylov vectors as the rows of one matrix (grown by doubling up to `capacity`), so that a pass of
    full reorthogonalisation is two matrix-vector products instead of a dot and an update per vector."""

    def __init__(self, size: int, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        self.capacity = capacity
        self.rows = torch.empty(min(capacity, 32), size, dtype=dtype, device=device)
        self.count = 0

    def append(self, vector: torch.Tensor) -> None:
        if self.count == self.rows.shape[0]:
            grown = torch.empty(
                min(2 * self.count, self.capacity), self.rows.shape[1], dtype=self.rows.dtype, device=self.rows.device
            )
            grown[: self.count] = self.rows
            self.rows = grown
        self.rows[self.count] = vector
        self.count += 1

    def orthogonalize(self, vector: torch.Tensor) -> torch.Tensor:
        # Classical Gram-Schmidt twice ("twice is enough", Giraud et al. 2005): as orthogonal as two passes of the
        # modified one, in four matrix-vector products, with the coefficients kept on the device (no host sync).
        used = self.rows[: self.count]
        for _ in range(2):
            vector.addmv_(used.t(), used @ vector, alpha=-1)
        return vector

    def combine(self, coefficients: Sequence[float]) -> torch.Tensor:
        weights = torch.tensor(list(coefficients), dtype=self.rows.dtype, device=self.rows.device)
        return self.rows[: len(weights)].t() @ weights


def power_iteration(
    op: Callable[[torch.Tensor], torch.Tensor],
    size: int,
    *,
    k: int,
    sign: float,
    max_iter: int,
    tol: float,
    generator: torch.Generator,
    dtype: torch.dtype,
    device: torch.device,
) -> EigenOutput:
    """The k algebraically largest eigenpairs of sign*H by power iteration with deflation.

    Power iteration finds the eigenvalue of largest magnitude mu. If mu < 0 (or more pairs are wanted),
    iterate on sign*H + |mu|I, which is positive semi-definite, so its dominant eigenvalues are the
    algebraically largest. Each pair is converged when 1-|<v_t, v_t-1>| < tol AND the relative change
    of the Rayleigh quotient < tol.
    """
    found_values: list[float] = []
    found_vectors: list[torch.Tensor] = []
    residuals: list[float] = []
    history: list[float] = []
    all_converged = True
    iterations = 0

    def run(shift: float) -> tuple[float, torch.Tensor, float, bool, float]:
        nonlocal iterations
        v = _unit(_orthogonalize(torch.randn(size, generator=generator, dtype=dtype, device=device), found_vectors))
        previous = math.nan
        norm_seen = 0.0
        value, residual, converged = math.nan, math.nan, False
        for step in range(max_iter):
            iterations += 1
            w = op(v).mul_(sign)
            if shift:
                w.add_(v, alpha=shift)
            w = _orthogonalize(w, found_vectors)
            shifted = float(torch.dot(v, w))
            value = shifted - shift
            residual = float((w - shifted * v).norm())
            history.append(sign * value)
            norm = float(w.norm())
            norm_seen = max(norm_seen, norm)
            if norm == 0.0:  # v lies in the null space of the (shifted) operator: exact
                return value, v, 0.0, True, norm_seen
            v_next = w / norm
            scale = max(abs(value), abs(shift), norm_seen) * _SCALE_FLOOR
            vector_change = 1.0 - abs(float(torch.dot(v_next, v)))
            value_change = abs(value - previous) / max(abs(value), scale)
            v = v_next
            previous = value
            if step > 0 and vector_change < tol and value_change < tol:
                converged = True
                break
        return value, v, residual, converged, norm_seen

    value, vector, residual, converged, norm_seen = run(0.0)
    shift = 0.0
    if value >= 0:
        found_values.append(value)
        found_vectors.append(vector)
        residuals.append(residual)
        all_converged &= converged
    if len(found_values) < k:
        # ||H v|| over the run bounds |mu| from below even when the run did not converge.
        shift = max(abs(value), norm_seen)
        while len(found_values) < k:
            value, vector, residual, converged = run(shift)[:4]
            found_values.append(value)
            found_vectors.append(vector)
            residuals.append(residual)
            all_converged &= converged
    return EigenOutput(
        values=tuple(sign * v for v in found_values),
        vectors=tuple(found_vectors),
        residuals=tuple(residuals),
        converged=all_converged,
        iterations=iterations,
        shift=shift,
        history=tuple(history),
    )


def lanczos(
    op: Callable[[torch.Tensor], torch.Tensor],
    size: int,
    *,
    k: int,
    sign: float,
    max_iter: int,
    tol: float,
    generator: torch.Generator,
    dtype: torch.dtype,
    device: torch.device,
) -> EigenOutput:
    """The k algebraically largest Ritz pairs of sign*H by Lanczos with full reorthogonalisation.

    Ritz values come out of the tridiagonal matrix sorted algebraically, so no shift is needed. A pair
    is converged when its residual bound |beta_j s_ji| = ||H y - theta y|| < tol * |theta| (the
    eigenvector) AND theta moved by less than tol * |theta| in the last step (the value). On breakdown
    (an invariant subspace) the process restarts with a fresh vector orthogonal to the basis, so repeated
    eigenvalues are found too. Memory: one vector of `size` per step.
    """
    steps = min(max_iter, size)
    basis = _Basis(size, steps, dtype, device)
    alphas: list[float] = []
    betas: list[float] = []  # betas[j] couples basis[j] and basis[j + 1]
    history: list[float] = []
    previous: torch.Tensor | None = None
    converged = False
    v = _unit(torch.randn(size, generator=generator, dtype=dtype, device=device))
    evals = evecs = residual = None
    for j in range(steps):
        basis.append(v)
        w = op(v).mul_(sign)
        alpha_t = torch.dot(v, w)
        w = basis.orthogonalize(w)
        alpha, beta = torch.stack([alpha_t, w.norm()]).tolist()  # the step's one host sync
        alphas.append(alpha)
        tri = torch.diag(torch.tensor(alphas, dtype=torch.float64))
        if j > 0:
            off = torch.tensor(betas, dtype=torch.float64)
            tri += torch.diag(off, 1) + torch.diag(off, -1)
        evals, evecs = torch.linalg.eigh(tri)
        residual = (beta * evecs[-1, :]).abs()
        history.append(sign * float(evals[-1]))
        scale = float(evals.abs().max())
        top = evals[-k:] if j + 1 >= k else None
        if top is not None:
            floor = torch.clamp(top.abs(), min=scale * _SCALE_FLOOR + torch.finfo(torch.float64).tiny)
            vector_ok = bool((residual[-k:] <= tol * floor).all())
            value_ok = previous is not None and bool(((top - previous).abs() <= tol * floor).all())
            if vector_ok and (value_ok or j + 1 == size):
                converged = True
                break
            previous = top
        if j + 1 == steps:
            break
        if beta <= scale * 100 * torch.finfo(dtype).eps:
            # Invariant subspace: its Ritz pairs are exact; go on in its orthogonal complement.
            fresh = basis.orthogonalize(torch.randn(size, generator=generator, dtype=dtype, device=device))
            betas.append(0.0)
            v = _unit(fresh)
        else:
            betas.append(beta)
            v = w.div_(beta)
    count = min(k, len(alphas))
    order = torch.arange(len(alphas) - 1, len(alphas) - 1 - count, -1)
    vectors = [_unit(basis.combine(evecs[:, i].tolist())) for i in order.tolist()]
    return EigenOutput(
        values=tuple(sign * float(evals[i]) for i in order),
        vectors=tuple(vectors),
        residuals=tuple(float(residual[i]) for i in order),
        converged=converged and count == k,
        iterations=len(alphas),
        shift=0.0,
        history=tuple(history),
    )


def slq(
    op: Callable[[torch.Tensor], torch.Tensor],
    size: int,
    *,
    probes: int,
    steps: int,
    generator: torch.Generator,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stochastic Lanczos quadrature: per Rademacher probe v, the nodes (Ritz values) and weights (squared first
    components of the tridiagonal's eigenvectors) of the Gauss quadrature of v^T f(H) v / v^T v.

    Lanczos with full reorthogonalisation for min(steps, size) steps from each probe; it stops early at an
    invariant subspace (the quadrature is then exact), whose missing nodes get weight 0. Returns float64 CPU
    tensors (probes, steps): the mean over probes of sum_j w_j f(theta_j) estimates tr f(H) / size.
    """
    steps = min(steps, size)
    nodes = torch.zeros(probes, steps, dtype=torch.float64)
    weights = torch.zeros(probes, steps, dtype=torch.float64)
    basis = _Basis(size, steps, dtype, device)  # one matrix for every probe
    for p in range(probes):
        v = torch.randint(0, 2, (size,), generator=generator, device=device).to(dtype).mul_(2).sub_(1)
        v = _unit(v)
        basis.count = 0
        alphas, betas = [], []
        for j in range(steps):
            basis.append(v)
            w = op(v)
            alpha_t = torch.dot(v, w)
            w = basis.orthogonalize(w)
            alpha, beta = torch.stack([alpha_t, w.norm()]).tolist()  # the step's one host sync
            alphas.append(alpha)
            scale = max(abs(a) for a in alphas) + (max(betas) if betas else 0.0)
            if j + 1 == steps or beta <= scale * 100 * torch.finfo(dtype).eps:
                break
            betas.append(beta)
            v = w.div_(beta)
        tri = torch.diag(torch.tensor(alphas, dtype=torch.float64))
        if betas:
            off = torch.tensor(betas, dtype=torch.float64)
            tri += torch.diag(off, 1) + torch.diag(off, -1)
        values, vectors = torch.linalg.eigh(tri)
        m = len(alphas)
        nodes[p, :m] = values
        weights[p, :m] = vectors[0, :] ** 2
    return nodes, weights


class GGNCore:
    """Products with the generalised Gauss-Newton matrix G = J^T H_z J of the oracle's mean loss, where z is the
    model's output (captured by a forward hook on the model: loss_fn must call the model once per batch), J = dz/dw
    and H_z the Hessian of the loss with respect to z. G v = J^T (H_z (J v)): J v by the double-backward trick
    (J v = d/du <J^T u, v>), H_z by a backward through the loss's gradient in z, J^T by a plain backward.
    Positive semi-definite for a loss convex in z (cross-entropy, squared error). With cache_graphs the
    forward graphs are kept for every later product.
    """

    hvp_mode = "ggn"

    def __init__(
        self, oracle: LossOracle, names: Sequence[str], params: Sequence[nn.Parameter], *, cache_graphs: bool
    ) -> None:
        self.oracle = oracle
        self.names = list(names)
        self.params = list(params)
        self.cache_graphs = cache_graphs
        self.hvp_count = 0
        self._graphs: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def release(self) -> None:
        self._graphs = None

    def _forward(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        outputs: list[torch.Tensor] = []
        handle = self.oracle.model.register_forward_hook(lambda module, args, out: outputs.append(out))
        try:
            loss = self.oracle.batch_loss(batch) * self.oracle.weights[batch]
        finally:
            handle.remove()
        if len(outputs) != 1 or not isinstance(outputs[0], torch.Tensor):
            raise ValueError(
                f"curvature='ggn' needs loss_fn to call the model exactly once per batch and get one tensor back "
                f"(the outputs z of G = J^T H_z J); it called it {len(outputs)} times. Use curvature='hessian'"
            )
        z = outputs[0]
        (grad_z,) = torch.autograd.grad(loss, z, create_graph=True)
        return z, grad_z

    def hvp(self, index: Sequence[int], vectors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        self.hvp_count += 1
        params = [self.params[i] for i in index]
        if self.cache_graphs and self._graphs is None:
            self._graphs = [self._forward(b) for b in range(len(self.oracle.batches))]
        result = [torch.zeros_like(p) for p in params]
        for batch in range(len(self.oracle.batches)):
            z, grad_z = self._graphs[batch] if self.cache_graphs else self._forward(batch)
            u = torch.zeros_like(z, requires_grad=True)
            parts = torch.autograd.grad(z, params, grad_outputs=u, create_graph=True, allow_unused=True)
            live = [(p, v) for p, v in zip(parts, vectors) if p is not None]
            if not live:
                continue
            (jv,) = torch.autograd.grad([p for p, _ in live], u, grad_outputs=[v for _, v in live])
            (hjv,) = torch.autograd.grad(grad_z, z, grad_outputs=jv, retain_graph=True)
            back = torch.autograd.grad(z, params, grad_outputs=hjv, retain_graph=True, allow_unused=True)
            for out, part in zip(result, back):
                if part is not None:
                    out.add_(part)
        return result
