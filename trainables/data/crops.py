"""Images on the training device: crop boxes drawn on the host (timm's random-resized and eval crops), batched
decoding, crops resized in one call, and host tensors copied over asynchronously."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = [
    "Images",
    "ReadBatch",
    "center_crop_boxes",
    "crop_resize",
    "decode_batch",
    "eval_resize_size",
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


def _to_all(tensors: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Host tensors on `device` in one copy, as `bundle._to_device` copies one: their bytes packed back to back, each at a
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
