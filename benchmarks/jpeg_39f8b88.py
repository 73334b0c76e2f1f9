"""The device augmentation of trainables/jpeg.py (now trainables/data/) as of commit 39f8b88, kept verbatim as the reference that
bench_device_augment.py times against and tests/trainables/test_jpeg.py pins bit-equality to (not used by training)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from trainables.data.crops import Images, random_resized_crop_boxes
from trainables.data.rand_augment import device_rand_augment_problem


def crop_resize(images: Images, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """The `boxes` (N, 4) = (top, left, height, width) of `images` resized to `size` x `size`, as float
    (N, C, size, size) in 0..255 on their device.

    One roi_align per group of equally sized images: bilinear samples averaged over each output pixel's footprint
    (ceil(box / size) samples a side), so a downscaled crop is low-pass filtered as PIL's resize filters it.
    """
    from torchvision.ops import roi_align

    first = images.groups[0][1]
    device, n = first.device, images.n
    out = torch.empty(n, first.shape[1], size, size, device=device)
    # (x1, y1, x2, y2) in continuous pixel coordinates (pixel i spans [i, i + 1): aligned=True).
    xyxy = torch.stack([boxes[:, 1], boxes[:, 0], boxes[:, 1] + boxes[:, 3], boxes[:, 0] + boxes[:, 2]], 1).float()
    for members, group in images.groups:
        rows = torch.cat([torch.arange(len(members), dtype=torch.float32)[:, None], xyxy[members]], 1)
        # One pass to contiguous float: roi_align reads NCHW, and a pixel batch's groups are channels-last views.
        planes = group.to(torch.float32, memory_format=torch.contiguous_format)
        resized = roi_align(planes, _to(rows, device), (size, size), spatial_scale=1.0, sampling_ratio=-1, aligned=True)
        if len(members) == n and bool((members == torch.arange(n)).all()):
            return resized
        out[_to(members, device)] = resized
    return out


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    # Host draws reach the GPU through pinned memory, asynchronously: a pageable copy would make the host wait.
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


# --------------------------------------------------------------------------- RandAugment, batched

_GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel")


def level_args(name: str, magnitude: torch.Tensor, negate: torch.Tensor, hparams: dict) -> torch.Tensor:
    """timm's LEVEL_TO_ARG for op `name`, for a batch of magnitudes; `negate` is timm's _randomly_negate draw."""
    m = magnitude.double() / 10.0
    sign = torch.where(negate, -1.0, 1.0).double()
    if name == "Rotate":
        return m * 30.0 * sign
    if name in ("ShearX", "ShearY"):
        return m * 0.3 * sign
    if name in ("TranslateX", "TranslateY"):
        return m * float(hparams["translate_const"]) * sign
    if name in ("TranslateXRel", "TranslateYRel"):
        return m * float(hparams.get("translate_pct", 0.45)) * sign
    if name == "Posterize":
        return torch.floor(m * 4)
    if name == "PosterizeIncreasing":
        return 4 - torch.floor(m * 4)
    if name == "PosterizeOriginal":
        return torch.floor(m * 4) + 4
    if name == "Solarize":
        return torch.clamp(torch.floor(m * 256), max=256)
    if name == "SolarizeIncreasing":
        return 256 - torch.clamp(torch.floor(m * 256), max=256)
    if name == "SolarizeAdd":
        return torch.clamp(torch.floor(m * 110), max=128)
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):
        return m * 1.8 + 0.1
    if name.endswith("Increasing"):  # the enhance ops
        return torch.clamp(1.0 + sign * m * 0.9, min=0.1)
    return torch.zeros_like(m)  # AutoContrast, Equalize, Invert take no argument


def _affine(name: str, arg: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """PIL's inverse affine (a, b, c, d, e, f) of op `name` per sample, (N, 2, 3): input = M @ (x, y, 1), in
    continuous pixel coordinates (pixel centres at i + 0.5), as PIL's Image.transform / rotate take it."""
    n = arg.shape[0]
    m = torch.zeros(n, 2, 3, dtype=torch.float64)
    m[:, 0, 0] = 1.0
    m[:, 1, 1] = 1.0
    if name == "Rotate":
        a = -torch.deg2rad(arg)
        c, s = torch.cos(a), torch.sin(a)
        cx, cy = w / 2.0, h / 2.0
        m[:, 0, 0], m[:, 0, 1], m[:, 1, 0], m[:, 1, 1] = c, s, -s, c
        m[:, 0, 2] = cx - (c * cx + s * cy)
        m[:, 1, 2] = cy - (-s * cx + c * cy)
    elif name == "ShearX":
        m[:, 0, 1] = arg
    elif name == "ShearY":
        m[:, 1, 0] = arg
    elif name == "TranslateX":
        m[:, 0, 2] = arg
    elif name == "TranslateY":
        m[:, 1, 2] = arg
    elif name == "TranslateXRel":
        m[:, 0, 2] = arg * w
    elif name == "TranslateYRel":
        m[:, 1, 2] = arg * h
    return m


def _warp(x: torch.Tensor, pixel_affine: torch.Tensor, mode: str, fill: torch.Tensor) -> torch.Tensor:
    """x (N, C, H, W) sampled at PIL's inverse affine (N, 2, 3); outputs whose source lies outside get `fill`."""
    n, _, h, w = x.shape
    a = pixel_affine
    # Pixel coordinates u = (xn + 1) W / 2 (align_corners=False); the input's normalised coordinate is 2 u' / W - 1.
    theta = torch.empty(n, 2, 3, dtype=torch.float64)
    theta[:, 0, 0] = a[:, 0, 0]
    theta[:, 0, 1] = a[:, 0, 1] * h / w
    theta[:, 0, 2] = a[:, 0, 0] + a[:, 0, 1] * h / w + 2 * a[:, 0, 2] / w - 1
    theta[:, 1, 0] = a[:, 1, 0] * w / h
    theta[:, 1, 1] = a[:, 1, 1]
    theta[:, 1, 2] = a[:, 1, 0] * w / h + a[:, 1, 1] + 2 * a[:, 1, 2] / h - 1
    grid = F.affine_grid(_to(theta.to(x.dtype), x.device), [n, 1, h, w], align_corners=False)
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
        out = _warp(x, _affine(name, arg.cpu().double(), h, w), mode, _to(torch.tensor(fill, dtype=x.dtype), x.device))
    else:
        out = _pixel_op(name, x, _to(arg.float(), x.device))
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
    """

    def __init__(self, rand_augment: Any) -> None:
        problem = device_rand_augment_problem(rand_augment)
        if problem:
            raise ValueError(f"RandAugment {rand_augment!r} cannot run on the device: {problem}")
        self.num_layers = int(rand_augment.num_layers)
        weights = rand_augment.choice_weights
        self.weights = None if weights is None else torch.as_tensor(np.asarray(weights), dtype=torch.float64)
        self.ops = [self._op(op) for op in rand_augment.ops]

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

    def draws(self, n: int, generator: torch.Generator) -> list[dict[str, torch.Tensor]]:
        """Each layer's per-sample draws: op index, applied or not, magnitude, sign, interpolation choice."""
        k = len(self.ops)
        if self.weights is None:
            choice = torch.randint(0, k, (n, self.num_layers), generator=generator)
        else:
            choice = torch.multinomial(
                self.weights.expand(n, -1), self.num_layers, replacement=False, generator=generator
            )
        layers = []
        for layer in range(self.num_layers):
            op_idx = choice[:, layer]
            prob = torch.tensor([o.prob for o in self.ops], dtype=torch.float64)[op_idx]
            mag = torch.tensor([o.magnitude for o in self.ops], dtype=torch.float64)[op_idx]
            std = torch.tensor([o.magnitude_std for o in self.ops], dtype=torch.float64)[op_idx]
            mmax = torch.tensor([o.magnitude_max for o in self.ops], dtype=torch.float64)[op_idx]
            u_apply = torch.rand(n, generator=generator, dtype=torch.float64)
            gauss = torch.randn(n, generator=generator, dtype=torch.float64)
            uni = torch.rand(n, generator=generator, dtype=torch.float64)
            magnitude = torch.where(torch.isinf(std), uni * mag, mag + torch.where(std > 0, std, 0.0) * gauss)
            layers.append(
                {
                    "op": op_idx,
                    # timm skips an op when random() > prob.
                    "apply": u_apply <= prob,
                    "magnitude": torch.clamp(magnitude, 0.0, None).minimum(mmax),
                    "negate": torch.rand(n, generator=generator, dtype=torch.float64) > 0.5,
                    "mode": torch.rand(n, generator=generator, dtype=torch.float64),
                }
            )
        return layers

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """x: float (N, 3, H, W) of whole values in 0..255; returns the same, augmented."""
        n, _, h, w = x.shape
        for d in self.draws(n, generator):
            geo_rows, geo_mats, geo_modes, fills = [], [], [], []
            for k, op in enumerate(self.ops):
                rows = torch.nonzero((d["op"] == k) & d["apply"]).flatten()
                if rows.numel() == 0:
                    continue
                arg = level_args(op.name, d["magnitude"][rows], d["negate"][rows], op.hparams)
                if op.name in _GEOMETRIC:
                    geo_rows.append(rows)
                    geo_mats.append(_affine(op.name, arg, h, w))
                    pick = torch.clamp((d["mode"][rows] * len(op.modes)).long(), max=len(op.modes) - 1)
                    geo_modes += [op.modes[i] for i in pick.tolist()]
                    fills.append(torch.tensor(op.fill, dtype=torch.float64).expand(rows.numel(), -1))
                    continue
                on_dev = _to(rows, x.device)
                x[on_dev] = apply_op(op.name, x[on_dev], arg)
            if geo_rows:
                rows = torch.cat(geo_rows)
                mats = torch.cat(geo_mats)
                fill = torch.cat(fills)
                modes = np.asarray(geo_modes)
                for mode in sorted(set(geo_modes)):
                    sel = torch.from_numpy(np.flatnonzero(modes == mode))
                    # One fill per call: timm's ops of one RandAugment share img_mean.
                    on_dev = _to(rows[sel], x.device)
                    warped = _warp(x[on_dev], mats[sel], mode, _to(fill[sel][0].float(), x.device))
                    x[on_dev] = torch.round(warped).clamp_(0, 255)
        return x


def transform(
    images: Images, size: int, rand_augment: DeviceRandAugment | None, device: torch.device, generator: torch.Generator
) -> torch.Tensor:
    """FolderBytes.transform of a training split as of 39f8b88 (random-resized crops, flips, `rand_augment`)."""
    sizes = images.sizes()
    boxes = random_resized_crop_boxes(sizes, generator)
    flips = torch.rand(images.n, generator=generator) < 0.5
    x = crop_resize(images, boxes, size)
    if flips.any():
        rows = _to(torch.nonzero(flips).flatten(), device)
        x[rows] = x[rows].flip(3)
    x = x.round_().clamp_(0, 255)
    if rand_augment is not None:
        x = rand_augment(x, generator)
    return x.byte()
