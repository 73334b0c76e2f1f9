"""timm's RandAugment applied in batches on the device: each op's level table, the affine warps and pixel ops, and
the draws of ops, magnitudes and modes from one generator."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from trainables.data.bundle import _to_device
from trainables.data.crops import _to_all
from trainables.data.registry import DEVICE_RAND_OPS

__all__ = ["DeviceRandAugment", "apply_op", "device_rand_augment_problem", "level_args"]

_GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel")


def device_rand_augment_problem(rand_augment: Any) -> str | None:
    """Why timm's RandAugment object `rand_augment` cannot run on the device, or None when it can."""
    unknown = sorted({op.name for op in rand_augment.ops} - DEVICE_RAND_OPS)
    if unknown:
        return f"its ops {unknown} have no device version (the device applies {sorted(DEVICE_RAND_OPS)})"
    return None


def _level(name: str, hparams: dict) -> tuple[float, ...]:
    """timm's LEVEL_TO_ARG for op `name` as constants of one of two forms (a row of `_level_args`' table):
    linear, max((m * scale) * (sign if signed else 1) (+ offset if offset_on), low), or quantised,
    base + slope * min(floor(m * steps), cap); m the magnitude / 10 and sign timm's _randomly_negate draw. One table
    for every op lets a batch of mixed ops get its arguments in one vectorised computation; each form evaluates
    timm's expression in the same order, so the arguments are the same doubles as the op-by-op formulas'."""
    inf = math.inf
    #       quantised, scale, signed, offset_on, offset, low, steps, cap, base, slope
    linear = lambda scale, signed=1.0, offset=None, low=-inf: (  # noqa: E731
        0.0, scale, signed, float(offset is not None), offset or 0.0, low, 0.0, inf, 0.0, 0.0
    )  # fmt: skip
    quantised = lambda steps, cap, base, slope: (1.0, 0.0, 0.0, 0.0, 0.0, -inf, steps, cap, base, slope)  # noqa: E731
    if name == "Rotate":
        return linear(30.0)
    if name in ("ShearX", "ShearY"):
        return linear(0.3)
    if name in ("TranslateX", "TranslateY"):
        return linear(float(hparams["translate_const"]))
    if name in ("TranslateXRel", "TranslateYRel"):
        return linear(float(hparams.get("translate_pct", 0.45)))
    if name == "Posterize":  # floor(m * 4)
        return quantised(4.0, inf, 0.0, 1.0)
    if name == "PosterizeIncreasing":  # 4 - floor(m * 4)
        return quantised(4.0, inf, 4.0, -1.0)
    if name == "PosterizeOriginal":  # floor(m * 4) + 4
        return quantised(4.0, inf, 4.0, 1.0)
    if name == "Solarize":  # min(floor(m * 256), 256)
        return quantised(256.0, 256.0, 0.0, 1.0)
    if name == "SolarizeIncreasing":  # 256 - min(floor(m * 256), 256)
        return quantised(256.0, 256.0, 256.0, -1.0)
    if name == "SolarizeAdd":  # min(floor(m * 110), 128)
        return quantised(110.0, 128.0, 0.0, 1.0)
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):  # m * 1.8 + 0.1
        return linear(1.8, signed=0.0, offset=0.1)
    if name.endswith("Increasing"):  # the enhance ops: max(1 + sign * m * 0.9, 0.1)
        return linear(0.9, offset=1.0, low=0.1)
    return quantised(0.0, inf, 0.0, 0.0)  # AutoContrast, Equalize, Invert take no argument: 0


def _level_args(magnitude: torch.Tensor, negate: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Arguments for magnitudes and sign draws of any shape, each with its op's `_level` row: `table` (..., 10)."""
    quantised, scale, signed, offset_on, offset, low, steps, cap, base, slope = table.unbind(-1)
    m = magnitude.double() / 10.0
    sign = torch.where(negate, -1.0, 1.0).double()
    # Multiplying by +-1 is exact and rounding symmetric, so (m * s) * sign is timm's sign * m * s to the bit.
    linear = (m * scale) * torch.where(signed > 0, sign, 1.0)
    # The offset only where the op has one: x + 0.0 would turn timm's -0.0 into +0.0.
    linear = torch.where(offset_on > 0, linear + offset, linear).maximum(low)
    steps_taken = base + slope * torch.minimum(torch.floor(m * steps), cap)
    return torch.where(quantised > 0, steps_taken, linear)


def level_args(name: str, magnitude: torch.Tensor, negate: torch.Tensor, hparams: dict) -> torch.Tensor:
    """timm's LEVEL_TO_ARG for op `name`, for a batch of magnitudes; `negate` is timm's _randomly_negate draw."""
    return _level_args(magnitude, negate, torch.tensor(_level(name, hparams), dtype=torch.float64))


def _affine(kind: torch.Tensor, arg: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """PIL's inverse affine (a, b, c, d, e, f) per sample, (N, 2, 3), of the geometric op `_GEOMETRIC[kind]` (other
    kinds: the identity): input = M @ (x, y, 1), in continuous pixel coordinates (pixel centres at i + 0.5), as PIL's
    Image.transform / rotate take it. Samples of different ops in one vectorised computation."""
    rotate, zero = kind == _GEOMETRIC.index("Rotate"), torch.zeros_like(arg)

    def of(name: str, value: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        return torch.where(kind == _GEOMETRIC.index(name), value, other)

    a = -torch.deg2rad(arg)
    c, s = torch.cos(a), torch.sin(a)
    cx, cy = w / 2.0, h / 2.0
    m = [
        torch.where(rotate, c, 1.0),
        torch.where(rotate, s, of("ShearX", arg, zero)),
        torch.where(rotate, cx - (c * cx + s * cy), of("TranslateX", arg, of("TranslateXRel", arg * w, zero))),
        torch.where(rotate, -s, of("ShearY", arg, zero)),
        torch.where(rotate, c, 1.0),
        torch.where(rotate, cy - (-s * cx + c * cy), of("TranslateY", arg, of("TranslateYRel", arg * h, zero))),
    ]
    return torch.stack(m, -1).view(*arg.shape, 2, 3)


def _theta(pixel_affine: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """affine_grid's theta (..., 2, 3) of PIL's inverse affines (..., 2, 3) on H x W images."""
    a = pixel_affine
    # Pixel coordinates u = (xn + 1) W / 2 (align_corners=False); the input's normalised coordinate is 2 u' / W - 1.
    theta = [
        a[..., 0, 0],
        a[..., 0, 1] * h / w,
        a[..., 0, 0] + a[..., 0, 1] * h / w + 2 * a[..., 0, 2] / w - 1,
        a[..., 1, 0] * w / h,
        a[..., 1, 1],
        a[..., 1, 0] * w / h + a[..., 1, 1] + 2 * a[..., 1, 2] / h - 1,
    ]
    return torch.stack(theta, -1).view(a.shape)


def _warp(x: torch.Tensor, theta: torch.Tensor, mode: str, fill: torch.Tensor) -> torch.Tensor:
    """x (N, C, H, W) sampled at affine_grid's `theta` (N, 2, 3) on x's device; outputs whose source lies outside
    get `fill` (C,)."""
    n, _, h, w = x.shape
    grid = F.affine_grid(theta, [n, 1, h, w], align_corners=False)
    sampled = F.grid_sample(x, grid, mode=mode, padding_mode="border", align_corners=False)
    # PIL fills where the source point lies outside [0, W) x [0, H) and filters with clamped edges inside.
    inside = ((grid >= -1) & (grid < 1)).all(-1)[:, None]
    return torch.where(inside, sampled, fill.view(1, -1, 1, 1))


def _gray(x: torch.Tensor) -> torch.Tensor:
    # PIL's convert("L"): ITU-R 601-2 luma, rounded.
    return torch.round(x[:, 0:1] * 0.299 + x[:, 1:2] * 0.587 + x[:, 2:3] * 0.114)


def _blend(degenerate: torch.Tensor, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    # PIL's Image.blend(degenerate, image, factor), as ImageEnhance uses it.
    return degenerate + factor.view(-1, 1, 1, 1) * (x - degenerate)


def _smooth(x: torch.Tensor) -> torch.Tensor:
    # PIL's ImageFilter.SMOOTH (3x3, centre 5, scale 13); PIL keeps the border pixels as they were.
    c = x.shape[1]
    k = torch.ones(3, 3, device=x.device, dtype=x.dtype)
    k[1, 1] = 5.0
    k = (k / 13.0).expand(c, 1, 3, 3)
    inner = torch.round(F.conv2d(x, k, groups=c))
    out = x.clone()
    out[:, :, 1:-1, 1:-1] = inner
    return out


def _equalize(x: torch.Tensor) -> torch.Tensor:
    # PIL's ImageOps.equalize per channel: lut[i] = (step // 2 + #pixels below i) // step, step from the histogram
    # without its last non-empty bin; a channel with step 0 stays as it is.
    n, c, h, w = x.shape
    flat = x.reshape(n * c, h * w).long()
    hist = torch.zeros(n * c, 256, device=x.device, dtype=torch.int64).scatter_add_(1, flat, torch.ones_like(flat))
    last = torch.where(hist > 0, torch.arange(256, device=x.device), -1).amax(1, keepdim=True)
    step = torch.div(h * w - hist.gather(1, last), 255, rounding_mode="floor")
    below = hist.cumsum(1) - hist
    safe = step.clamp(min=1)
    lut = torch.clamp(
        torch.div(torch.div(safe, 2, rounding_mode="floor") + below, safe, rounding_mode="floor"), max=255
    )
    lut = torch.where(step > 0, lut, torch.arange(256, device=x.device))
    return lut.gather(1, flat).view(n, c, h, w).to(x.dtype)


def _auto_contrast(x: torch.Tensor) -> torch.Tensor:
    # PIL's ImageOps.autocontrast (cutoff 0) per channel: lo..hi stretched to 0..255, truncated.
    lo = x.amin((2, 3), keepdim=True)
    hi = x.amax((2, 3), keepdim=True)
    scale = 255.0 / (hi - lo).clamp(min=1)
    out = torch.floor((x - lo) * scale).clamp(0, 255)
    return torch.where(hi > lo, out, x)


def _pixel_op(name: str, x: torch.Tensor, arg: torch.Tensor) -> torch.Tensor:
    base = name.removesuffix("Increasing").removesuffix("Original")
    if base == "AutoContrast":
        return _auto_contrast(x)
    if base == "Equalize":
        return _equalize(x)
    if base == "Invert":
        return 255.0 - x
    a = arg.view(-1, 1, 1, 1).to(x.dtype)
    if base == "Posterize":
        # Keep `bits` high bits (8 or more: unchanged, as timm's posterize).
        q = torch.pow(2.0, (8 - a).clamp(min=0))
        return torch.where(a >= 8, x, torch.floor(x / q) * q)
    if base == "Solarize":
        return torch.where(x < a, x, 255.0 - x)
    if base == "SolarizeAdd":
        return torch.where(x < 128, torch.clamp(x + a, max=255), x)
    if base == "Color":
        return _blend(_gray(x), x, arg)
    if base == "Contrast":
        mean = torch.floor(_gray(x).mean((1, 2, 3), keepdim=True) + 0.5)
        return _blend(mean, x, arg)
    if base == "Brightness":
        return _blend(torch.zeros_like(x), x, arg)
    if base == "Sharpness":
        return _blend(_smooth(x), x, arg)
    raise KeyError(name)


def apply_op(
    name: str, x: torch.Tensor, arg: torch.Tensor, *, mode: str = "bicubic", fill: Sequence[float] = (128, 128, 128)
) -> torch.Tensor:
    """timm's RandAugment op `name` at argument `arg` (per sample, timm's op argument) on x: float (N, C, H, W) in
    0..255; geometric ops resample with `mode` and show `fill` where the source lies outside. Rounded to whole values."""
    if name in _GEOMETRIC:
        _, _, h, w = x.shape
        arg = arg.cpu().double()
        theta = _theta(_affine(torch.full(arg.shape, _GEOMETRIC.index(name)), arg, h, w), h, w).to(x.dtype)
        out = _warp(x, _to_device(theta, x.device), mode, _to_device(torch.tensor(fill, dtype=x.dtype), x.device))
    else:
        out = _pixel_op(name, x, _to_device(arg.float(), x.device))
    return torch.round(out).clamp_(0, 255)


@dataclass(frozen=True)
class _Op:
    name: str
    prob: float
    magnitude: float
    magnitude_std: float
    magnitude_max: float
    hparams: dict
    fill: tuple[float, ...]
    modes: tuple[str, ...]  # grid_sample modes the op draws from (timm: a fixed interpolation or a random one)


class DeviceRandAugment:
    """timm's RandAugment (the very object the host path builds) applied to batches on their device.

    Per sample, as timm draws per image: `num_layers` ops chosen uniformly with replacement (or by timm's weights
    without), each applied with its probability, at a magnitude N(m, mstd) clipped to [0, mmax], with timm's sign
    draws and, for geometric ops, its interpolation. Samples that share an op in a layer are transformed together.
    Images are float 0..255 and are rounded to whole values after each op, as PIL's 8-bit images are.

    The host's share is kept small, since it runs in the training process beside the training thread: all of a
    batch's draws, arguments and affine matrices are computed at once, vectorised over samples and layers, and reach
    the device in one copy; each layer gathers its transformed samples once, sorted by op (and, for geometric ops, by
    interpolation), so every op works on one contiguous slice of them, and scatters them back once.
    """

    def __init__(self, rand_augment: Any) -> None:
        problem = device_rand_augment_problem(rand_augment)
        if problem:
            raise ValueError(f"RandAugment {rand_augment!r} cannot run on the device: {problem}")
        self.num_layers = int(rand_augment.num_layers)
        weights = rand_augment.choice_weights
        self.weights = None if weights is None else torch.as_tensor(np.asarray(weights), dtype=torch.float64)
        self.ops = [self._op(op) for op in rand_augment.ops]
        # Per-op constants as tables indexed by the drawn op, built once.
        ops = self.ops
        self._prob, self._magnitude, self._std, self._max = (
            torch.tensor([getattr(o, f) for o in ops], dtype=torch.float64)
            for f in ("prob", "magnitude", "magnitude_std", "magnitude_max")
        )
        self._level = torch.tensor([_level(o.name, o.hparams) for o in ops], dtype=torch.float64)
        self._fill = torch.tensor([o.fill for o in ops], dtype=torch.float32)
        self._geometric = torch.tensor([o.name in _GEOMETRIC for o in ops])
        self._kind = torch.tensor([_GEOMETRIC.index(o.name) if o.name in _GEOMETRIC else -1 for o in ops])
        # Interpolations: the batch's geometric samples are grouped by mode, in sorted order of the modes' names.
        self._modes = sorted({m for o in ops for m in o.modes})
        self._n_modes = torch.tensor([len(o.modes) for o in ops])
        # Per op, the index in self._modes of each of its modes (padded with its last: the draw never picks those).
        widest = max(len(o.modes) for o in ops)
        padded = [[*o.modes, *[o.modes[-1]] * (widest - len(o.modes))] for o in ops]
        self._mode_of = torch.tensor([[self._modes.index(m) for m in modes] for modes in padded])

    @staticmethod
    def _op(op: Any) -> _Op:
        from PIL import Image

        modes = {Image.Resampling.BILINEAR: "bilinear", Image.Resampling.BICUBIC: "bicubic"}
        resample = op.kwargs.get("resample", Image.Resampling.BICUBIC)
        chosen = tuple(resample) if isinstance(resample, (list, tuple)) else (resample,)
        std = float(op.magnitude_std or 0.0)
        return _Op(
            name=op.name,
            prob=float(op.prob),
            magnitude=float(op.magnitude),
            magnitude_std=std,
            magnitude_max=float(op.magnitude_max or 10.0),
            hparams=dict(op.hparams),
            fill=tuple(float(v) for v in op.kwargs.get("fillcolor", (128, 128, 128))),
            modes=tuple(modes.get(r, "bilinear") for r in chosen),
        )

    def _draw(self, n: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The per-sample draws of every layer, each (num_layers, n): op index, applied or not, magnitude, sign,
        interpolation choice. The generator is read in timm's layer-by-layer order, which seeded epochs rely on."""
        k = len(self.ops)
        if self.weights is None:
            choice = torch.randint(0, k, (n, self.num_layers), generator=generator)
        else:
            choice = torch.multinomial(
                self.weights.expand(n, -1), self.num_layers, replacement=False, generator=generator
            )

        def uniform() -> torch.Tensor:
            return torch.rand(n, generator=generator, dtype=torch.float64)

        # Layer after layer, as the op-by-op code drew them: apply, gauss, uniform (the magnitude), negate, mode.
        drawn = [
            (uniform(), torch.randn(n, generator=generator, dtype=torch.float64), uniform(), uniform(), uniform())
            for _ in range(self.num_layers)
        ]
        u_apply, gauss, uni, u_negate, u_mode = (torch.stack(d) for d in zip(*drawn))
        op = choice.T
        mag, std = self._magnitude[op], self._std[op]
        magnitude = torch.where(torch.isinf(std), uni * mag, mag + torch.where(std > 0, std, 0.0) * gauss)
        return {
            "op": op,
            # timm skips an op when random() > prob.
            "apply": u_apply <= self._prob[op],
            "magnitude": torch.clamp(magnitude, 0.0, None).minimum(self._max[op]),
            "negate": u_negate > 0.5,
            "mode": u_mode,
        }

    def draws(self, n: int, generator: torch.Generator) -> list[dict[str, torch.Tensor]]:
        """Each layer's per-sample draws: op index, applied or not, magnitude, sign, interpolation choice."""
        drawn = self._draw(n, generator)
        return [{key: v[layer] for key, v in drawn.items()} for layer in range(self.num_layers)]

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """x: float (N, 3, H, W) of whole values in 0..255; returns the same, augmented."""
        n, _, h, w = x.shape
        k, layers = len(self.ops), self.num_layers
        d = self._draw(n, generator)
        op = d["op"]
        arg = _level_args(d["magnitude"], d["negate"], self._level[op])
        # timm's interpolation draw: one of the op's modes, uniformly.
        pick = torch.minimum((d["mode"] * self._n_modes[op]).long(), self._n_modes[op] - 1)
        mode = self._mode_of[op, pick]
        # Each layer's samples sorted by a key: with k ops, pixel op i has key i, geometric op i drawn at mode j
        # k (1 + j) + i, so each mode's samples follow one another, op after op; skipped samples come last. A stable
        # sort keeps the batch order within a key: the same samples, in the same order, as the op-by-op selection.
        skip = k * (1 + len(self._modes))
        sort_key = torch.where(d["apply"], torch.where(self._geometric[op], op + k * (1 + mode), op), skip)
        order = torch.sort(sort_key, dim=1, stable=True).indices
        counts = torch.bincount(
            (sort_key + (skip + 1) * torch.arange(layers)[:, None]).flatten(), minlength=layers * (skip + 1)
        )
        counts = counts.view(layers, skip + 1).tolist()
        theta = _theta(_affine(self._kind[op], arg, h, w), h, w)
        # One copy: the sorted rows, then each sorted sample's argument and theta, and the ops' fills, in x's dtype
        # (arguments and fills through float32, as the op-by-op code copied them).
        floats = [
            arg.gather(1, order).float().to(x.dtype),
            theta.gather(1, order[..., None, None].expand(-1, -1, 2, 3)).to(x.dtype),
            self._fill.to(x.dtype),
        ]
        rows, floats = _to_all([order, torch.cat([f.flatten() for f in floats])], x.device)
        args, floats = floats[: layers * n].view(layers, n), floats[layers * n :]
        thetas, fills = floats[: layers * n * 6].view(layers, n, 2, 3), floats[layers * n * 6 :].view(k, -1)
        for layer in range(layers):
            # (key, samples) of each key present, in key order: consecutive runs of the sorted samples.
            runs = [(key, count) for key, count in enumerate(counts[layer][:skip]) if count]
            if not runs:
                continue
            applied = rows[layer, : sum(c for _, c in runs)]
            xs = x.index_select(0, applied)
            start = 0
            for key, count in runs:
                end = start + count
                if key < k:
                    out = _pixel_op(self.ops[key].name, xs[start:end], args[layer, start:end])
                    torch.round(out, out=xs[start:end]).clamp_(0, 255)
                start = end
            # The geometric samples of each mode in one warp.
            start = sum(c for key, c in runs if key < k)
            for j, mode_name in enumerate(self._modes):
                warped_runs = [(key, c) for key, c in runs if k * (1 + j) <= key < k * (2 + j)]
                if not warped_runs:
                    continue
                end = start + sum(c for _, c in warped_runs)
                # One fill per warp, the first op's: timm's ops of one RandAugment share img_mean.
                fill = fills[warped_runs[0][0] - k * (1 + j)]
                warped = _warp(xs[start:end], thetas[layer, start:end], mode_name, fill)
                torch.round(warped, out=xs[start:end]).clamp_(0, 255)
                start = end
            x.index_copy_(0, applied, xs)
        return x
