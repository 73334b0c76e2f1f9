"""Plain image folders through NVIDIA DALI (`pip install 'sharpscale[dali]'`): the reader, the decode on the GPU
(its hardware JPEG decoder where the card has one), timm's random-resized crop and flip, RandAugment and the
normalisation in one DALI pipeline an epoch, handing the loop the batches today's device path hands it.

What is DALI's and what is not:
- Order: the loop's sampler (every rank its share of each global batch, a function of (seed, epoch)) stays the one
  home of which files an epoch reads in which order; DALI's file reader reads this rank's share in that order (no
  shuffle of its own), so a DALI run sees the batches a torch-loader run sees, with the same labels and indices.
- Draws: crops, flips and RandAugment draw from the pipeline's seed, drawn when an epoch starts from torch's global
  generator, which the loop seeds per (seed, epoch, rank): every epoch is reproducible on its own, which is all a
  trial's checkpoint (taken at an epoch's end) needs. Within an epoch, `DaliBatches.checkpoint()` is DALI's own
  checkpoint of the reader's position and every random op's state; `resume` continues from it bit-exactly.
- Crops: `decoders.image_random_crop` draws timm's RandomResizedCrop distribution (an area share uniform in
  (0.08, 1), a log-uniform aspect ratio in (3/4, 4/3), 10 attempts, then the whole image clamped to the ratio range),
  decoding only the crop's region where the decoder can. One difference: that fallback box is placed at random
  where timm centres it (tests/trainables/test_dali.py measures both); it matters only for images whose aspect
  ratio lies far outside (3/4, 4/3), most of whose crops fall back.
- RandAugment: DALI's operators on the GPU, set up to follow timm's `rand-mM-nN` as far as DALI's allow (see
  `_rand_augment_plan`). What differs from timm's rand-m9-mstd0.5: the magnitude is the fixed bin of M (DALI draws
  no magnitude noise, timm a normal of std `mstd` per op); enhance ops (colour, contrast, brightness, sharpness)
  scale by 1 +- the magnitude with a random sign (timm's plain variants always by 0.1 + 1.8 M/10); posterize keeps
  8 - 4 M/10 bits (timm's keeps 4 M/10); the fill is one grey level (timm fills with the per-channel mean).
- Mixup stays with the loop (torch, on the device, on whole batches), as for every data path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from trainables.data.bundle import _to_device
from trainables.data.crops import EVAL_CROP_PCT, RRC_ATTEMPTS, RRC_RATIO, RRC_SCALE, eval_resize_size
from trainables.data.folders import FolderBytes

__all__ = ["DaliBatches", "FolderDali", "build_pipeline", "dali_rand_augment_plan"]

# The share of JPEGs the mixed decoder sends to the hardware decoder (the rest decode on the SMs); DALI's own
# default, 0.65, kept until a card measures better (not measured here yet).
HW_DECODER_LOAD = 0.65
# Device and host buffers the decoder reserves up front (DALI's ImageNet examples' sizes), so that a larger image
# later in an epoch does not reallocate mid-run.
_DEVICE_PADDING, _HOST_PADDING = 211_025_920, 140_544_512
_READER = "reader"


# timm's RandAugment op names -> DALI's augmentation (trainables.data.registry.DEVICE_RAND_OPS lists timm's side).
_DALI_OPS = {
    "AutoContrast": "auto_contrast",
    "Equalize": "equalize",
    "Invert": "invert",
    "Rotate": "rotate",
    "Posterize": "posterize",
    "PosterizeIncreasing": "posterize",
    "PosterizeOriginal": "posterize",
    "Solarize": "solarize",
    "SolarizeIncreasing": "solarize",
    "SolarizeAdd": "solarize_add",
    "Color": "color",
    "ColorIncreasing": "color",
    "Contrast": "contrast",
    "ContrastIncreasing": "contrast",
    "Brightness": "brightness",
    "BrightnessIncreasing": "brightness",
    "Sharpness": "sharpness",
    "SharpnessIncreasing": "sharpness",
    "ShearX": "shear_x",
    "ShearY": "shear_y",
    "TranslateX": "translate_x",
    "TranslateY": "translate_y",
    "TranslateXRel": "translate_x",
    "TranslateYRel": "translate_y",
}
_BINS = 31  # DALI's magnitude bins: bin b of 30 is b/30 of each op's range; timm's M of 10 maps to bin 3M


def dali_rand_augment_plan(rand_augment: Any) -> dict[str, Any]:
    """What DALI applies for timm's RandAugment object `rand_augment` (its ops, layers and magnitude): the DALI op
    names (one per timm op, repeats kept), `n` layers, the magnitude bin `m` of `_BINS`, and the share of each
    layer's draws that apply nothing (timm applies each drawn op with its probability, 0.5 by default)."""
    unknown = sorted({op.name for op in rand_augment.ops} - set(_DALI_OPS))
    if unknown:
        raise ValueError(f"RandAugment ops {unknown} have no DALI version (DALI applies {sorted(_DALI_OPS)})")
    magnitude = float(rand_augment.ops[0].magnitude)
    prob = float(np.mean([op.prob for op in rand_augment.ops]))
    return {
        "ops": [_DALI_OPS[op.name] for op in rand_augment.ops],
        "n": int(rand_augment.num_layers),
        "m": int(round(min(max(magnitude, 0.0), 10.0) / 10.0 * (_BINS - 1))),
        "skip": 1.0 - prob,
    }


def _rand_augment(images, plan: dict[str, Any], fill: int):
    """`plan`'s RandAugment on a batch of HWC uint8 images: each of n layers draws one op uniformly, and none with
    probability `skip` (identity ops in the list, as many as make that share)."""
    from nvidia.dali.auto_aug import augmentations as a
    from nvidia.dali.auto_aug import rand_augment as ra

    suite = {}
    for op in ra.get_rand_augment_suite(use_shape=True, max_translate_rel=0.45):
        suite[op.name] = op
    # Not in DALI's RandAugment suite, in timm's: solarize-add (timm adds up to 110 below 128) and invert.
    suite["solarize_add"] = a.solarize_add
    suite["invert"] = a.invert
    ops = [suite[name] for name in plan["ops"]]
    identity = a.identity
    skip = plan["skip"]
    if skip > 0:
        # k identities among len(ops) real ones give a no-op share k / (k + len(ops)) = skip.
        ops += [identity] * max(1, round(skip * len(ops) / (1 - skip))) if skip < 1 else [identity]
    # apply_rand_augment refuses arguments that none of its ops takes.
    kwargs: dict[str, Any] = {}
    if set(plan["ops"]) & {"shear_x", "shear_y", "rotate", "translate_x", "translate_y"}:
        kwargs["fill_value"] = fill
    if set(plan["ops"]) & {"translate_x", "translate_y"}:
        kwargs["shape"] = images.shape()[:-1]  # (H, W) of HWC: timm translates by a share of the image's size
    return ra.apply_rand_augment(ops, images, n=plan["n"], m=plan["m"], num_magnitude_bins=_BINS, **kwargs)


def build_pipeline(
    files: Sequence[str],
    labels: Sequence[int],
    *,
    size: int,
    train: bool,
    batch_size: int,
    seed: int,
    mean: Sequence[float],
    std: Sequence[float],
    rand_augment: dict[str, Any] | None = None,
    device_id: int | None = None,
    num_threads: int | None = None,
    checkpoint: str | None = None,
    hw_decoder_load: float = HW_DECODER_LOAD,
    checkpointing: bool = True,
):
    """The DALI pipeline of one epoch: `files` read in their order, each with its `labels` entry (any int32: the
    loader passes positions), decoded on the GPU `device_id` ('mixed': the hardware decoder where there is one) or,
    with `device_id` None, on the CPU (the same graph, for tests and hosts without a GPU). Train: timm's random-resized
    crop to `size`, RandAugment (`rand_augment`: a `dali_rand_augment_plan`), a flip with probability 0.5; else timm's
    eval resize and central crop. Out: float32 NCHW normalised by `mean`/`std`, and the labels."""
    from nvidia.dali import fn, pipeline_def, types

    on_gpu = device_id is not None
    decode_device = "mixed" if on_gpu else "cpu"
    decoder_args: dict[str, Any] = dict(device=decode_device, output_type=types.RGB)
    if on_gpu:
        decoder_args.update(
            hw_decoder_load=hw_decoder_load, device_memory_padding=_DEVICE_PADDING, host_memory_padding=_HOST_PADDING
        )
    threads = num_threads or max(1, min(8, (os.cpu_count() or 2) - 1))

    @pipeline_def(
        batch_size=batch_size,
        num_threads=threads,
        device_id=device_id,
        seed=seed,
        enable_checkpointing=checkpointing,
        prefetch_queue_depth=2,
        enable_conditionals=rand_augment is not None,  # RandAugment picks each sample's op by a conditional
    )
    def graph():
        jpegs, positions = fn.readers.file(
            files=list(files), labels=list(labels), random_shuffle=False, pad_last_batch=True, name=_READER
        )
        if train:
            images = fn.decoders.image_random_crop(
                jpegs,
                random_area=list(RRC_SCALE),
                random_aspect_ratio=list(RRC_RATIO),
                num_attempts=RRC_ATTEMPTS,
                **decoder_args,
            )
            images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_CUBIC, antialias=True)
            if rand_augment is not None:
                fill = int(round(255 * float(np.mean(mean))))
                images = _rand_augment(images, rand_augment, fill)
            mirror = fn.random.coin_flip(probability=0.5)
        else:
            images = fn.decoders.image(jpegs, **decoder_args)
            images = fn.resize(
                images,
                resize_shorter=eval_resize_size(size, EVAL_CROP_PCT),
                interp_type=types.INTERP_CUBIC,
                antialias=True,
            )
            mirror = 0
        x = fn.crop_mirror_normalize(
            images,
            crop=(size, size),
            crop_pos_x=0.5,
            crop_pos_y=0.5,
            mirror=mirror,
            mean=[255 * m for m in mean],
            std=[255 * s for s in std],
            dtype=types.FLOAT,
            output_layout="CHW",
        )
        return x, positions

    kwargs = {} if checkpoint is None else {"checkpoint": checkpoint}
    pipe = graph(**kwargs)
    pipe.build()
    return pipe


class FolderDali(FolderBytes):
    """A plain image folder (or its prepared JPEG form) whose training batches come from DALI (`build_pipeline`):
    decoded on the GPU (the hardware decoder where the card has one), random-resized-cropped, RandAugmented, flipped
    and normalised there in one pipeline. Items of the dataset itself, `read` and the rest are FolderBytes'.

    `mean`, `std`: the dataset's (its registry entry's), applied by the pipeline; `dali_rand_augment`: a
    `dali_rand_augment_plan` for `strong`."""

    decodes_on_host = False  # DALI's own threads read the files: no DataLoader workers

    def __init__(self, samples, indices, size, *, train, mean, std, rand_augment=None) -> None:
        super().__init__(samples, indices, size, train=train, rand_augment=rand_augment)
        self.mean, self.std = tuple(mean), tuple(std)
        self.dali_rand_augment = None if rand_augment is None else dali_rand_augment_plan(rand_augment)

    def device_loader(self, batch_sampler, device: torch.device, **_unused) -> "DaliBatches":
        """Batches of `batch_sampler` as (float32 normalised images on `device`, labels on `device`, indices on the
        host). DataLoader settings (`num_workers`, pinning, its generator) do not apply: DALI reads in its threads."""
        return DaliBatches(self, batch_sampler, torch.device(device))


class DaliBatches:
    """Iterates `batch_sampler`'s batches through one DALI pipeline an epoch (FolderDali).

    Every batch but the last must have the sampler's batch size (the loop's training sampler drops the last
    incomplete batch; evaluation's keeps it, and DALI pads it, which is cut off here)."""

    def __init__(self, folder: FolderDali, batch_sampler, device: torch.device) -> None:
        self.folder, self.batch_sampler, self.device = folder, batch_sampler, device
        self._pipe = None
        self._resume: dict[str, Any] | None = None
        self._epoch: dict[str, Any] | None = None
        self._key: tuple | None = None
        self._checkpointing = False
        self._passed = False  # the pipeline's last pass went to its end: its next one starts at the first file

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def checkpoint(self) -> dict[str, Any]:
        """Where the current epoch stands: DALI's checkpoint (the reader's position, every random op's state) after the
        batches handed out so far, with the epoch's order and seed. `resume` takes it back."""
        if self._pipe is None or self._epoch is None:
            raise RuntimeError("DaliBatches.checkpoint: no epoch under way")
        if not self._checkpointing:
            raise RuntimeError("DaliBatches.checkpoint: this DALI build refused checkpoints for this pipeline")
        return {**self._epoch, "dali": self._pipe.checkpoint()}

    def resume(self, state: dict[str, Any]) -> None:
        """The next iteration continues the epoch `state` (a `checkpoint`) describes, from its next batch."""
        self._resume = dict(state)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        if self._resume is not None:
            state, self._resume = self._resume, None
            batches, seed, done, dali_state = state["batches"], state["seed"], state["done"], state["dali"]
        else:
            batches = [list(b) for b in self.batch_sampler]
            # Drawn as today's device path draws its generator's seed: from the global generator the loop seeds.
            seed, done, dali_state = int(torch.randint(2**31 - 1, ())), 0, None
        if not batches:
            return
        size = len(batches[0])
        if any(len(b) != size for b in batches[:-1]) or len(batches[-1]) > size:
            raise ValueError("DaliBatches: every batch but the last must have the first one's size")
        order = np.asarray([i for b in batches for i in b], dtype=np.int64)
        folder = self.folder
        on_gpu = self.device.type == "cuda"
        # Unaugmented batches in the same order (evaluation, epoch after epoch) are the same pipeline's next pass:
        # its reader starts over at the first file, and what it prefetched is that pass's first batches.
        key = None if folder.train or dali_state is not None else (order.tobytes(), size)
        if key is not None and key == self._key and self._pipe is not None and self._passed:
            yield from self._batches(batches, order, 0)
            return
        self._key = key
        self._pipe = None  # the last epoch's pipeline frees its device memory before the next one takes its own
        args = dict(
            files=[folder._paths[int(folder.indices[i])] for i in order],
            labels=list(range(len(order))),
            size=folder.size,
            train=folder.train,
            batch_size=size,
            seed=seed,
            mean=folder.mean,
            std=folder.std,
            rand_augment=folder.dali_rand_augment if folder.train else None,
            device_id=(self.device.index if self.device.index is not None else torch.cuda.current_device())
            if on_gpu
            else None,
        )
        try:
            self._pipe = build_pipeline(**args, checkpoint=dali_state)
            self._checkpointing = True
        except RuntimeError as err:
            # An operator without checkpoint support on this build or device: the epoch runs all the same (a trial
            # resumes at an epoch's start, seeded anew), only `checkpoint` within it is refused.
            if dali_state is not None or "checkpoint" not in str(err).lower():
                raise
            self._pipe = build_pipeline(**args, checkpointing=False)
            self._checkpointing = False
        self._epoch = {"batches": batches, "seed": seed, "done": done}
        yield from self._batches(batches, order, done)

    def _batches(self, batches, order, done):
        folder = self.folder
        self._passed = False
        for b in range(done, len(batches)):
            x, positions = self._pipe.run()
            n = len(batches[b])
            x = _to_torch(x, self.device)[:n]
            pos = np.asarray(_to_torch(positions, torch.device("cpu"))).reshape(-1)[:n]
            index = folder.indices[order[pos]]
            y = _to_device(torch.from_numpy(folder._labels[index]), self.device)
            if self._epoch is not None:
                self._epoch["done"] = b + 1
            yield x, y, torch.from_numpy(index)
        self._passed = True


def _to_torch(out, device: torch.device) -> torch.Tensor:
    """A DALI output batch (uniform shapes) as one torch tensor on `device` (float32 on a GPU: the images), copied
    once on the current stream."""
    if hasattr(out, "as_tensor") and device.type == "cuda":
        from nvidia.dali.plugin.pytorch import feed_ndarray

        dense = out.as_tensor()
        t = torch.empty(dense.shape(), dtype=torch.float32, device=device)  # the pipeline's images are float32
        feed_ndarray(dense, t, cuda_stream=torch.cuda.current_stream(device))
        return t
    return torch.from_numpy(np.array(out.as_tensor()))
