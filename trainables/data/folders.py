"""Image folders decoded and augmented in batches on the training device: byte-reading workers, nvjpeg, batched crops, flips and RandAugment."""

from __future__ import annotations

import collections
import contextlib
import math
import os
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from trainables.datasets import DEVICE_RAND_OPS

__all__ = [
    "DeviceRandAugment",
    "apply_op",
    "FolderBytes",
    "FolderPixels",
    "Images",
    "ReadBatch",
    "center_crop_boxes",
    "crop_resize",
    "decode_batch",
    "device_rand_augment_problem",
    "random_resized_crop_boxes",
]

# timm's ImageNet defaults for RandomResizedCropAndInterpolation (transforms_imagenet_train) and its eval crop.
RRC_SCALE = (0.08, 1.0)
RRC_RATIO = (3.0 / 4.0, 4.0 / 3.0)
RRC_ATTEMPTS = 10
EVAL_CROP_PCT = 0.875


# --------------------------------------------------------------------------- crop boxes (drawn on the host)


def random_resized_crop_boxes(
    sizes: torch.Tensor,
    generator: torch.Generator,
    scale: tuple[float, float] = RRC_SCALE,
    ratio: tuple[float, float] = RRC_RATIO,
) -> torch.Tensor:
    """Boxes (N, 4) as (top, left, height, width) for images of `sizes` (N, 2) = (height, width).

    The distribution of timm's RandomResizedCropAndInterpolation.get_params (torchvision's RandomResizedCrop): up to
    10 attempts of an area uniform in `scale` times the image's and a log-uniform aspect ratio, rounded, the first
    that fits placed uniformly; else the central crop clamped to the ratio range. All attempts are drawn at once.
    """
    n = sizes.shape[0]
    h_img, w_img = sizes[:, 0].double(), sizes[:, 1].double()
    area = (h_img * w_img)[:, None]
    u_area = torch.rand(n, RRC_ATTEMPTS, generator=generator, dtype=torch.float64)
    u_ratio = torch.rand(n, RRC_ATTEMPTS, generator=generator, dtype=torch.float64)
    target_area = (scale[0] + (scale[1] - scale[0]) * u_area) * area
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(log_lo + (log_hi - log_lo) * u_ratio)
    # Python's round: half to even, as torch.round.
    tw = torch.round(torch.sqrt(target_area * aspect))
    th = torch.round(torch.sqrt(target_area / aspect))
    fits = (tw <= w_img[:, None]) & (th <= h_img[:, None])
    first = torch.where(fits.any(1), fits.float().argmax(1), torch.full((n,), -1))
    ok = first >= 0
    pick = first.clamp(min=0)[:, None]
    h = th.gather(1, pick)[:, 0]
    w = tw.gather(1, pick)[:, 0]
    # Placement: uniform integer offsets (random.randint(0, H - h), both ends included).
    u_top = torch.rand(n, generator=generator, dtype=torch.float64)
    u_left = torch.rand(n, generator=generator, dtype=torch.float64)
    top = torch.floor(u_top * (h_img - h + 1).clamp(min=1))
    left = torch.floor(u_left * (w_img - w + 1).clamp(min=1))
    # The fallback: the whole image, or its central crop at the nearest allowed ratio.
    in_ratio = w_img / h_img
    fw = torch.where(in_ratio > max(ratio), torch.round(h_img * max(ratio)), w_img)
    fh = torch.where(in_ratio < min(ratio), torch.round(w_img / min(ratio)), h_img)
    fh = torch.where(in_ratio > max(ratio), h_img, fh)
    fw = torch.where(in_ratio < min(ratio), w_img, fw)
    ftop, fleft = torch.div(h_img - fh, 2, rounding_mode="floor"), torch.div(w_img - fw, 2, rounding_mode="floor")
    boxes = torch.stack(
        [torch.where(ok, top, ftop), torch.where(ok, left, fleft), torch.where(ok, h, fh), torch.where(ok, w, fw)], 1
    )
    return boxes.to(torch.int64)


def eval_resize_size(size: int, crop_pct: float = EVAL_CROP_PCT) -> int:
    """The shorter side timm's eval transform resizes to before its central `size` crop: floor(size / crop_pct)
    (256 for 224). The one home of that rule: center_crop_boxes and `data prepare`'s default short side use it."""
    return math.floor(size / crop_pct)


def center_crop_boxes(sizes: torch.Tensor, size: int, crop_pct: float = EVAL_CROP_PCT) -> torch.Tensor:
    """Boxes (N, 4) = (top, left, height, width), in original pixels, of timm's eval transform: the shorter side resized
    to floor(size / crop_pct), then the central `size` x `size` crop (torchvision's Resize + CenterCrop arithmetic)."""
    h_img, w_img = sizes[:, 0].double(), sizes[:, 1].double()
    scale_size = eval_resize_size(size, crop_pct)
    # Resize: the shorter side becomes scale_size, the longer int(scale_size * long / short).
    hr = torch.where(h_img <= w_img, torch.full_like(h_img, scale_size), torch.floor(scale_size * h_img / w_img))
    wr = torch.where(w_img <= h_img, torch.full_like(w_img, scale_size), torch.floor(scale_size * w_img / h_img))
    top = torch.round((hr - size) / 2.0)
    left = torch.round((wr - size) / 2.0)
    sy, sx = h_img / hr, w_img / wr
    return torch.stack([top * sy, left * sx, size * sy, size * sx], 1)


# --------------------------------------------------------------------------- decoding and resizing (on any device)


def _is_jpeg(data: torch.Tensor) -> bool:
    return data.numel() > 2 and int(data[0]) == 0xFF and int(data[1]) == 0xD8


def decode_batch(datas: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Encoded images (1-D uint8 tensors on the host) as RGB uint8 CHW tensors on `device`.

    JPEGs decode together (torchvision's batched nvjpeg decode on CUDA, libjpeg on the CPU); anything else an image
    folder may hold (PNG, a JPEG nvjpeg refuses such as CMYK) decodes alone on the host and is copied over.
    """
    from torchvision.io import ImageReadMode, decode_image, decode_jpeg

    out: list[torch.Tensor | None] = [None] * len(datas)
    jpeg = [i for i, d in enumerate(datas) if _is_jpeg(d)]
    if jpeg:
        try:
            decoded = decode_jpeg([datas[i] for i in jpeg], mode=ImageReadMode.RGB, device=device)
        except RuntimeError:
            decoded = None  # one bad file fails the batch: decode these one by one below
        if decoded is not None:
            for i, img in zip(jpeg, decoded):
                out[i] = img
    for i, img in enumerate(out):
        if img is None:
            out[i] = decode_image(datas[i], mode=ImageReadMode.RGB).to(device, non_blocking=True)
    return out  # type: ignore[return-value]


class ReadBatch(NamedTuple):
    """A batch as DataLoader workers hand it over: the items' bytes back to back in `flat` (with their `lengths`),
    in an order of their own, `order[k]` being the batch position of the k-th; `labels` and `indices` (dataset
    indices) in the sampler's order, which the batch keeps."""

    flat: torch.Tensor
    lengths: torch.Tensor
    labels: torch.Tensor
    indices: torch.Tensor
    order: torch.Tensor


@dataclass(frozen=True)
class Images:
    """A batch of images (uint8, one device) as groups of equal size: each group's positions in the batch (`rows`,
    int64 on the host) and its (n, C, H, W) tensor, which may be a view (a pixel batch's groups are views of one
    copy). `n` images in all."""

    groups: list[tuple[torch.Tensor, torch.Tensor]]
    n: int

    @classmethod
    def of(cls, images: Sequence[torch.Tensor]) -> "Images":
        """CHW images of any sizes, grouped by size (each group stacked once)."""
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i, img in enumerate(images):
            by_shape.setdefault(tuple(img.shape), []).append(i)
        groups = [
            (torch.tensor(members), torch.stack([images[i] for i in members]) if len(members) > 1 else images[members[0]][None])
            for members in by_shape.values()
        ]  # fmt: skip
        return cls(groups, len(images))

    def sizes(self) -> torch.Tensor:
        """(n, 2) int64 on the host: each image's (height, width)."""
        # One write for all groups, not one per group: a batch holds dozens of sizes, and this runs per batch.
        shapes = torch.tensor([group.shape[2:] for _, group in self.groups], dtype=torch.int64)
        counts = torch.tensor([len(rows) for rows, _ in self.groups])
        sizes = torch.empty(self.n, 2, dtype=torch.int64)
        sizes[torch.cat([rows for rows, _ in self.groups])] = shapes.repeat_interleave(counts, 0)
        return sizes

    def repeated(self, times: int) -> "Images":
        """The batch `times` over, in order (the same tensors: for tests and timing)."""
        return Images([(rows + k * self.n, g) for k in range(times) for rows, g in self.groups], self.n * times)


def crop_resize(images: Images, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """The `boxes` (N, 4) = (top, left, height, width) of `images` resized to `size` x `size`, as float
    (N, C, size, size) in 0..255 on their device.

    One roi_align per group of equally sized images: bilinear samples averaged over each output pixel's footprint
    (ceil(box / size) samples a side), so a downscaled crop is low-pass filtered as PIL's resize filters it.
    """
    first = images.groups[0][1]
    device, n = first.device, images.n
    # (x1, y1, x2, y2) in continuous pixel coordinates (pixel i spans [i, i + 1): aligned=True).
    xyxy = torch.stack([boxes[:, 1], boxes[:, 0], boxes[:, 1] + boxes[:, 3], boxes[:, 0] + boxes[:, 2]], 1).float()
    # Every group's rois (its own image index first) and batch positions, group after group, in one copy: a batch
    # holds dozens of sizes, and a copy is a pinned allocation and a transfer on the host.
    members = torch.cat([rows for rows, _ in images.groups])
    counts = torch.tensor([len(rows) for rows, _ in images.groups])
    within = torch.arange(n) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
    rois, members_on = _to_all([torch.cat([within.float()[:, None], xyxy[members]], 1), members], device)
    out = torch.empty(n, first.shape[1], size, size, device=device)
    start = 0
    for rows, group in images.groups:
        end = start + len(rows)
        # One pass to contiguous float: roi_align reads NCHW, and a pixel batch's groups are channels-last views.
        planes = group.to(torch.float32, memory_format=torch.contiguous_format)
        resized = _roi_align(planes, rois[start:end], size)
        if len(rows) == n and bool((rows == torch.arange(n)).all()):
            return resized
        out.index_copy_(0, members_on[start:end], resized)
        start = end
    return out


def _roi_align(planes: torch.Tensor, rois: torch.Tensor, size: int) -> torch.Tensor:
    # torchvision.ops.roi_align(planes, rois, (size, size), spatial_scale=1.0, sampling_ratio=-1, aligned=True) is this
    # operator behind checks in Python costing about 16 us a call (40 against 24 on this project's CPU), once per group
    # and batch. (Those checks also swap in a Python version on CUDA under deterministic algorithms, for the sake of
    # the backward, which a batch of crops never runs.) A test pins the operator's arguments to the public function's.
    import torchvision  # noqa: F401  (registers torch.ops.torchvision)

    return torch.ops.torchvision.roi_align(planes, rois, 1.0, size, size, -1, True)


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    # Host draws reach the GPU through pinned memory, asynchronously: a pageable copy would make the host wait.
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _to_all(tensors: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Host tensors on `device` in one copy, as `_to` copies one: their bytes packed back to back, each at a
    multiple of 8 bytes (every dtype's view stays aligned), copied, and viewed out again. Packed on the CPU too (one
    concatenation), so that the CPU tests run the views the GPU gets."""
    parts, spans, at = [], [], 0
    for t in tensors:
        raw = t.contiguous().view(-1).view(torch.uint8)
        pad = -raw.numel() % 8
        parts += [raw, torch.zeros(pad, dtype=torch.uint8)] if pad else [raw]
        spans.append((at, raw.numel()))
        at += raw.numel() + pad
    # Pinned on CUDA (written by the concatenation itself), so the copy is asynchronous as `_to`'s.
    flat = torch.empty(at, dtype=torch.uint8, pin_memory=device.type == "cuda")
    on_device = torch.cat(parts, out=flat).to(device, non_blocking=True)
    return [on_device[a : a + nbytes].view(t.dtype).view(t.shape) for (a, nbytes), t in zip(spans, tensors)]


# --------------------------------------------------------------------------- RandAugment, batched

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
        out = _warp(x, _to(theta, x.device), mode, _to(torch.tensor(fill, dtype=x.dtype), x.device))
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


# --------------------------------------------------------------------------- the dataset and its loader


class FolderBytes(Dataset):
    """The files of an image folder, read as bytes by DataLoader workers; batches are decoded and augmented on the
    training device by `device_loader`.

    Items of the dataset itself are `(image, label, index)` like every DataBundle's, each decoded and transformed
    alone (for code that indexes a bundle directly); training goes through `device_loader`, whose batches are
    (uint8 images on the device, labels on the device, indices).
    `train`: random-resized crops and flips (timm's ImageNet training distribution) plus `rand_augment` when given;
    else timm's eval resize and central crop.
    """

    decodes_on_host = True  # workers only read files here, but reading overlaps the device's work: worth them
    copies_to_device = False  # what workers read is decoded from host memory, not copied to the device

    def __init__(
        self,
        samples: Sequence[tuple[str, int]],
        indices: np.ndarray,
        size: int,
        *,
        train: bool,
        rand_augment: Any = None,
    ) -> None:
        self._paths = [p for p, _ in samples]
        self._setup([t for _, t in samples], indices, size, train, rand_augment)

    def _setup(self, labels, indices: np.ndarray, size: int, train: bool, rand_augment: Any) -> None:
        # What every folder form holds beside its storage: labels, the subset, the crop and the augmentation.
        self._labels = np.asarray(labels, dtype=np.int64)
        self.indices = np.asarray(indices, dtype=np.int64)
        self.targets = self._labels[self.indices]
        self.size, self.train = size, train
        self.rand_augment = None if rand_augment is None else DeviceRandAugment(rand_augment)

    def __len__(self) -> int:
        return len(self.indices)

    def read(self, i: int) -> tuple[torch.Tensor, int, int]:
        index = int(self.indices[i])
        data = torch.from_numpy(np.fromfile(self._paths[index], dtype=np.uint8))
        return data, int(self._labels[index]), index

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        batch = self.collate([self.read(i)])
        cpu = torch.device("cpu")
        x = self.transform(self.images(batch, cpu), cpu, torch.Generator().manual_seed(int(torch.randint(2**62, ()))))
        return x[0], int(batch.labels[0]), int(batch.indices[0])

    @staticmethod
    def collate(items: list[tuple[torch.Tensor, int, int]], order: list[int] | None = None) -> ReadBatch:
        """Items as `read` returns them, as one batch, their bytes back to back in `order` (positions in `items`;
        default theirs). One flat tensor: a worker hands over one shared-memory block per batch, not one per image."""
        order = list(range(len(items))) if order is None else order
        datas = [items[k][0] for k in order]
        return ReadBatch(
            flat=torch.cat([d.reshape(-1) for d in datas]),
            lengths=torch.tensor([d.numel() for d in datas], dtype=torch.int64),
            labels=torch.tensor([item[1] for item in items], dtype=torch.int64),
            indices=torch.tensor([item[2] for item in items], dtype=torch.int64),
            order=torch.tensor(order, dtype=torch.int64),
        )

    def images(self, batch: ReadBatch, device: torch.device) -> Images:
        """A batch as `collate` made it, as RGB uint8 images on `device`, in the batch's (sampler's) order: here each
        file decoded (nvjpeg on CUDA)."""
        decoded = decode_batch(list(torch.split(batch.flat, batch.lengths.tolist())), device)
        positions = batch.order.tolist()
        in_order: list[torch.Tensor] = [None] * len(decoded)  # type: ignore[list-item]
        for k, img in zip(positions, decoded):
            in_order[k] = img
        return Images.of(in_order)

    def transform(self, images: Images, device: torch.device, generator: torch.Generator) -> torch.Tensor:
        """Images (`images`' output) to a uint8 (N, 3, size, size) batch on `device`, augmented by draws from
        `generator`."""
        sizes = images.sizes()
        if not self.train:
            return crop_resize(images, center_crop_boxes(sizes, self.size), self.size).round_().clamp_(0, 255).byte()
        boxes = random_resized_crop_boxes(sizes, generator)
        flips = torch.rand(images.n, generator=generator) < 0.5
        x = crop_resize(images, boxes, self.size)
        if flips.any():
            rows = _to(torch.nonzero(flips).flatten(), device)
            x[rows] = x[rows].flip(3)
        # PIL hands RandAugment an 8-bit image.
        x = x.round_().clamp_(0, 255)
        if self.rand_augment is not None:
            x = self.rand_augment(x, generator)
        return x.byte()

    def device_loader(
        self,
        batch_sampler,
        device: torch.device,
        *,
        num_workers: int,
        pin_memory: bool,
        persistent_workers: bool,
        generator: torch.Generator | None = None,
    ) -> "_DeviceBatches":
        """Batches of `batch_sampler` as (uint8 images on `device`, labels on `device`, indices on the host).
        `generator`: the DataLoader's (None: torch's global one), which its iterations draw their workers' seeds
        from; the workers only read, and draw nothing from them."""
        loader = DataLoader(
            _Reader(self),
            batch_sampler=batch_sampler,
            collate_fn=self.collate,
            num_workers=num_workers,
            # Encoded bytes go to the decoder, which reads host memory; pixels are copied to the device as they are.
            pin_memory=pin_memory and self.copies_to_device,
            persistent_workers=persistent_workers,
            generator=generator,
        )
        return _DeviceBatches(self, loader, device)


class FolderPixels(FolderBytes):
    """A folder prepared in the pixel form (`sharpscale data prepare --form pixels`): workers read each image's
    stored pixels (page cache or disk) straight into a page-locked batch slot shared with the training process
    (`_SlotRing`), which goes to the device in one copy and is cropped, flipped and RandAugmented there as
    FolderBytes' decoded images are. Nothing is decoded while training, and nothing copied in the training process.

    `split` is the split's `trainables.prepare.PixelSplit`; the rest as FolderBytes.
    """

    copies_to_device = True
    # Workers read into the page-locked slots of a shared ring (`_SlotRing`); False: FolderBytes' loader, which copies
    # each batch through a DataLoader's shared memory and pinning thread (kept to compare them: bench_imagefolder.py).
    use_slots = True
    # Measured with the copying loader (a worker copied a 67 MB batch of 256 x 341 x 256 in about 85 ms): on an H200
    # with ViT-S/16 (docs/benchmarks.md) 2 workers fed 5,900 img/s, 4, 6 and 15 the same 7,200-7,600. With the slots
    # 6 workers fed 53,000-67,000 img/s with no model, 6x what ViT-S/16 trains at: the cap stays.
    max_workers = 6

    def __init__(self, split, indices: np.ndarray, size: int, *, train: bool, rand_augment: Any = None) -> None:
        self._split = split
        self._setup(split.labels, indices, size, train, rand_augment)

    def read(self, i: int) -> tuple[torch.Tensor, int, int]:
        index = int(self.indices[i])
        return torch.from_numpy(np.array(self._split.pixels(index))), int(self._labels[index]), index

    @staticmethod
    def collate(items: list[tuple[torch.Tensor, int, int]], order: list[int] | None = None) -> ReadBatch:
        """As FolderBytes.collate, the pixels laid out by image size (a stable sort): each size is then one run of
        the flat batch, which the device views as one tensor. Labels, indices and the images handed on keep the
        sampler's order: m-sharpness groups, micro-batches and mixup pairs are consecutive rows of the batch."""
        if order is None:
            order = sorted(range(len(items)), key=lambda k: tuple(items[k][0].shape))
        return FolderBytes.collate(items, order)

    def images(self, batch: ReadBatch, device: torch.device) -> Images:
        """The batch's pixels on `device` in one copy, each run of equal sizes viewed as one NCHW tensor (no copy per
        image or group), each group's rows its images' positions in the batch."""
        on_device = _to(batch.flat, device)
        shapes = self._split.shapes[batch.indices[batch.order].numpy()]  # in the flat layout's order
        starts = np.concatenate([[0], np.cumsum(batch.lengths.numpy())])
        cuts = [0, *(np.flatnonzero((shapes[1:] != shapes[:-1]).any(1)) + 1).tolist(), len(shapes)]
        groups = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            h, w = (int(v) for v in shapes[a])
            run = on_device[int(starts[a]) : int(starts[b])].view(b - a, h, w, 3).permute(0, 3, 1, 2)
            groups.append((batch.order[a:b], run))
        return Images(groups, len(shapes))

    def device_loader(
        self,
        batch_sampler,
        device: torch.device,
        *,
        num_workers: int,
        pin_memory: bool,
        persistent_workers: bool,
        generator: torch.Generator | None = None,
    ) -> "_DeviceBatches":
        """As FolderBytes.device_loader, with each batch read by a worker straight into a slot of a shared-memory
        ring (`_SlotRing`), page-locked on CUDA: the training process copies nothing on the host, and the GPU takes
        the batch from the slot."""
        if not self.use_slots:
            return super().device_loader(
                batch_sampler, device, num_workers=num_workers, pin_memory=pin_memory,
                persistent_workers=persistent_workers, generator=generator,
            )  # fmt: skip
        # A worker may hold prefetch_factor batches (2, DataLoader's default) and the consumer one being copied; the
        # rest are copies in flight, which free their slot when their event completes.
        slots = 2 * max(num_workers, 1) + 2
        ring = _SlotRing(
            self, _batch_size(batch_sampler), slots, shared=num_workers > 0, pin=pin_memory and device.type == "cuda"
        )
        loader = DataLoader(
            _SlotReader(self, ring.buffer),
            batch_sampler=_SlotSampler(batch_sampler, ring),
            collate_fn=_as_is,
            num_workers=num_workers,
            pin_memory=False,  # the slots are page-locked already
            persistent_workers=persistent_workers,
            generator=generator,
        )
        return _DeviceBatches(self, loader, device, ring)


def _batch_size(batch_sampler) -> int:
    size = getattr(batch_sampler, "batch_size", None)
    if size is None and isinstance(batch_sampler, Sequence):  # a fixed list of batches (tests, tools)
        size = max((len(b) for b in batch_sampler), default=1)
    if size is None:
        raise TypeError(f"{type(batch_sampler).__name__} has no batch_size: the pixel loader sizes its slots by it")
    return int(size)


def _as_is(batch):
    return batch


class _Slotted(list):
    """A batch's dataset positions, as a batch sampler yields them, with the ring slot its worker fills."""

    slot: int


class _Filled(NamedTuple):
    """What a worker hands over for a batch read into ring slot `slot` (or, when the batch outgrew the slots, its
    pixels in `spill`): small arrays, pickled by value rather than passed as shared-memory tensors."""

    slot: int
    lengths: np.ndarray
    labels: np.ndarray
    indices: np.ndarray
    order: np.ndarray
    spill: torch.Tensor | None


class _SlotRing:
    """Batch buffers in shared memory that DataLoader workers fill in place and the device copies from.

    Why: the default path copies a pixel batch four times (out of the file's mapping, into the batch, into shared
    memory on hand-over, into pinned memory in the training process), two of them in the training process, whose
    host work then slows the step (docs/benchmarks.md, the pixel form). Here a worker reads each image from the file
    into its slot (one copy), and on CUDA the slots are page-locked (registered with the driver once), so the GPU
    copies straight from them: nothing is copied in the training process.

    A slot holds a batch somewhat larger than the split's mean (SIZE_MARGIN, SIZE_SPREAD); a rarer batch that does
    not fit travels the default way (`_Filled.spill`). Slots are taken by the batch sampler as it hands out each batch
    (`acquire`) and given back by the consumer once the device's copy has finished (`release` with its event);
    a new pass over the data (an epoch: the DataLoader has drained the workers by then) reclaims the slots batches
    of an unfinished pass still held. Every method runs in the training process's loader thread.
    """

    # A slot fits a batch of the split's mean bytes x SIZE_MARGIN plus SIZE_SPREAD standard deviations of a batch's
    # bytes (or its largest batch, where smaller): a spill is then a tail event, and the slots stay near a mean batch.
    SIZE_MARGIN, SIZE_SPREAD = 1.10, 6.0

    def __init__(self, folder: "FolderPixels", batch_size: int, slots: int, *, shared: bool, pin: bool) -> None:
        sizes = np.asarray(folder._split.nbytes(folder.indices), dtype=np.int64)
        b = min(batch_size, len(sizes))
        largest = int(np.sort(sizes)[::-1][:b].sum())
        usual = int(b * sizes.mean() * self.SIZE_MARGIN + self.SIZE_SPREAD * sizes.std() * math.sqrt(b))
        self.slot_bytes = -(-min(largest, usual) // 512) * 512
        if shared:  # workers fill the slots: shared memory, which a full /dev/shm would fault on (SIGBUS), not refuse
            _check_shared_memory(slots, self.slot_bytes)
            # Made private, then moved into shared memory (torch's public way): empty, as nothing reads what it holds.
            self.buffer = torch.empty(slots, self.slot_bytes, dtype=torch.uint8).share_memory_()
        else:
            self.buffer = torch.empty(slots, self.slot_bytes, dtype=torch.uint8)
        self._free = list(range(slots))[::-1]
        self._held: set[int] = set()
        self._copying: collections.deque[tuple[int, Any]] = collections.deque()  # copies that may still run
        self.pinned = pin and self._register()

    def _register(self) -> bool:
        cudart = torch.cuda.cudart()
        ptr, size = self.buffer.data_ptr(), self.buffer.numel()
        if int(cudart.cudaHostRegister(ptr, size, 0)) != 0:
            return False  # e.g. a locked-memory limit: copies from pageable memory, correct but synchronous
        import weakref

        # Not at the interpreter's exit: the process's memory goes with it, and CUDA may be torn down by then.
        weakref.finalize(self, _unregister, cudart, ptr, self._copying).atexit = False
        return True

    def acquire(self) -> int:
        while not self._free and self._copying and self._copying[0][1].query():
            self._free.append(self._copying.popleft()[0])
        if not self._free and self._copying:
            slot, event = self._copying.popleft()
            event.synchronize()  # a copy already issued: it finishes on its own
            self._free.append(slot)
        if not self._free:
            raise RuntimeError(f"all {len(self.buffer)} pixel batch slots are held by batches in flight")
        slot = self._free.pop()
        self._held.add(slot)
        return slot

    def release(self, slot: int, event: Any = None) -> None:
        self._held.discard(slot)
        if event is None:
            self._free.append(slot)
        else:
            self._copying.append((slot, event))

    def reclaim(self) -> None:
        self._free += sorted(self._held)
        self._held.clear()

    def batch(self, filled: _Filled) -> ReadBatch:
        """The batch a worker filled, its pixels a view of its slot (or its spill)."""
        flat = filled.spill
        if flat is None:
            flat = self.buffer[filled.slot, : int(filled.lengths.sum())]
        return ReadBatch(
            flat,
            *(torch.from_numpy(a) for a in (filled.lengths, filled.labels, filled.indices, filled.order)),
        )


def _unregister(cudart, ptr: int, copying) -> None:
    # The slots stop being page-locked once no copy from them can still be running.
    for _, event in copying:
        event.synchronize()
    cudart.cudaHostUnregister(ptr)


def _check_shared_memory(slots: int, slot_bytes: int, where: str = "/dev/shm") -> None:
    from trainables.errors import FULL_BELOW, TrialRefused, free_bytes

    need, free = slots * slot_bytes, free_bytes(where) if os.path.isdir(where) else None
    if free is not None and need + FULL_BELOW > free:
        raise TrialRefused(
            f"data.num_workers: the pixel form's loader needs {need / 2**30:.2f} GiB of shared memory ({slots} batch "
            f"slots of {slot_bytes / 2**20:.0f} MiB: 2 a worker and 2 more) and {where} has {free / 2**30:.2f} GiB "
            "free. Fix: give the machine or container more shared memory (docker run --shm-size, Ray's shm_size), "
            "or lower data.num_workers or data.batch_size."
        )


class _SlotSampler:
    """A batch sampler's batches, each with the ring slot its worker fills (taken here, in the loader's thread)."""

    def __init__(self, batch_sampler, ring: _SlotRing) -> None:
        self.batch_sampler, self.ring = batch_sampler, ring

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[_Slotted]:
        self.ring.reclaim()
        for positions in self.batch_sampler:
            batch = _Slotted(positions)
            batch.slot = self.ring.acquire()
            yield batch


class _SlotReader(Dataset):
    """Runs in the workers: reads a batch's images (laid out by size, as FolderPixels.collate) into its slot."""

    def __init__(self, folder: "FolderPixels", buffer: torch.Tensor) -> None:
        self.folder, self.buffer = folder, buffer

    def __len__(self) -> int:
        return len(self.folder)

    def __getitems__(self, batch: _Slotted) -> _Filled:
        folder, split = self.folder, self.folder._split
        index = folder.indices[np.asarray(batch, dtype=np.int64)]
        shapes = split.shapes[index]
        order = np.lexsort((shapes[:, 1], shapes[:, 0]))  # by (height, width), stable: FolderPixels.collate's layout
        lengths = np.asarray(split.nbytes(index[order]), dtype=np.int64)
        labels, spill = folder._labels[index], None
        if lengths.sum() > self.buffer.shape[1]:
            spill = folder.collate([folder.read(int(i)) for i in batch], order.tolist()).flat
        else:
            out = self.buffer[batch.slot].numpy()
            at = 0
            for i, n in zip(index[order].tolist(), lengths.tolist()):
                split.read_into(i, out[at : at + n])
                at += n
        return _Filled(batch.slot, lengths, labels, index, order, spill)


class _Reader(Dataset):
    def __init__(self, folder: FolderBytes) -> None:
        self.folder = folder

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        return self.folder.read(i)


class _DeviceBatches:
    """Iterates a byte loader, decoding and augmenting each batch on the device in a thread, up to `AHEAD` batches
    ahead of the consumer.

    The decode (nvjpeg's host-side work and its waits) and the augmentation's launches run in a producer thread,
    which torch and torchvision leave the interpreter to while they work: the training thread keeps the device fed
    meanwhile. On CUDA the producer's kernels run on a side stream; the consumer's stream waits for each batch's
    event. The draws come from one generator seeded, when iteration starts, from torch's global generator (which the
    loop seeds per epoch and rank) and used by the producer alone, batch after batch: an epoch is reproducible.
    """

    AHEAD = 2
    _END = object()

    def __init__(self, folder: FolderBytes, loader: DataLoader, device: torch.device, ring: _SlotRing | None = None):
        self.folder, self.loader, self.device, self.ring = folder, loader, device, ring

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(int(torch.randint(2**62, ())))
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        ready: queue.Queue = queue.Queue(maxsize=self.AHEAD)
        stop = threading.Event()

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False  # the consumer has gone

        def produce() -> None:
            try:
                with torch.cuda.device(self.device) if stream is not None else contextlib.nullcontext():
                    for batch in self.loader:
                        if not put(self._launch(batch, generator, stream)):
                            return
                put(self._END)
            except BaseException as err:  # noqa: BLE001 - handed to the consumer, which raises it
                put(err)

        thread = threading.Thread(target=produce, name="sharpscale-device-batches", daemon=True)
        thread.start()
        try:
            while True:
                item = ready.get()
                if item is self._END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield self._hand_over(*item)
        finally:
            stop.set()
            thread.join()

    def _launch(self, batch, generator, stream):
        slot = None
        if isinstance(batch, _Filled):
            filled, batch = batch, self.ring.batch(batch)
            if filled.spill is None:
                slot = filled.slot
            else:
                self.ring.release(filled.slot)  # the batch outgrew the slots: it came in its spill
        else:
            batch = ReadBatch(*batch)
        if stream is None:
            x = self.folder.transform(self.folder.images(batch, self.device), self.device, generator)
            if slot is not None:
                self.ring.release(slot)  # the transform has read the slot: its result is a new tensor
            return x, batch.labels, batch.indices, None
        with torch.cuda.stream(stream):
            x = self.folder.transform(self.folder.images(batch, self.device), self.device, generator)
            y = _to(batch.labels, self.device)
            event = torch.cuda.Event()
            event.record(stream)
        if slot is not None:
            self.ring.release(slot, event)  # free once the device has copied it
        return x, y, batch.indices, event

    def _hand_over(self, x, y, indices, event):
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            # Made on the side stream, used on this one: the allocator must not reuse them before this one is done.
            x.record_stream(current)
            y.record_stream(current)
        else:
            y = y.to(self.device)
        return x, y, indices
