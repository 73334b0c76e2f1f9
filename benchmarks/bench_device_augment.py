"""Host cost of one batch of the device augmentation (`FolderBytes.transform`: crops, flips, RandAugment) as the
code stands; the figures of commit 39f8b88's code, which it replaced, are in docs/benchmarks.md (its bytes are pinned
as digests by tests/trainables/test_jpeg.py).

The device path's strong recipe was bound by the host work of its producer thread (docs/benchmarks.md, session 8):
Python dispatch of many small ops and a pinned copy per op. Per recipe (basic: crop and flip; strong: plus timm's
rand-m9-mstd0.5, bicubic, as the ImageNet transform builds it) and batch shape (a pixel-form batch: short side
size * 8 / 7, dozens of sizes in 256 images (`pixel_batch`), random pixels), it prints:

- device ops (kernels): aten ops on the device's tensors that are not views (a kernel launch each on a GPU);
  device views: views of device tensors (no kernel); host ops: aten ops on host tensors (the draws, index and
  matrix arithmetic of the producer thread); host-to-device copies (each a pinned allocation, a host copy and an
  asynchronous transfer on CUDA). Counted with a TorchDispatchMode on the meta device (every op dispatched as on
  the GPU, no kernel run); the same draws give the same counts every round;
- ms (cpu): a batch's wall time on the CPU, kernels included (they dominate at 224; at 32 x 32 less so);
  on CUDA instead host ms (cuda), the time to return from the call with no sync (the producer thread's share:
  dispatch, Python and launches), and synced ms (cuda), the batch with its kernels.

Medians and minima over `--repeats` rounds, after a first pass over the same seeds (whose bytes each seed's second
pass must repeat). On the CPU torch gets one thread (`--threads`): this project's CPU machine is
shared, and more threads made the times swing several-fold.

  python -m benchmarks.bench_device_augment                  # CPU: 256 at 224, 256 at 32, 32 at 32
  python -m benchmarks.bench_device_augment --device cuda    # on a GPU
  python -m benchmarks.bench_device_augment --quick          # a smoke run, measures nothing
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainables.data.crops import Images
from trainables.data.folders import FolderBytes
from trainables.data.registry import rand_augment_hparams

REPO = Path(__file__).resolve().parents[1]

IMAGENET_MEAN = (0.485, 0.456, 0.406)


def timm_rand_augment(size: int, config: str = "rand-m9-mstd0.5", interpolation: str = "bicubic"):
    """timm's RandAugment as the ImageNet training transform builds it (fill the ImageNet mean, one interpolation);
    interpolation "random": timm's own default of bilinear or bicubic drawn per op."""
    from PIL import Image
    from timm.data.auto_augment import rand_augment_transform

    hparams = rand_augment_hparams(size, IMAGENET_MEAN)
    if interpolation != "random":
        hparams["interpolation"] = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR}[
            interpolation
        ]
    return rand_augment_transform(config, hparams)


def pixel_batch(n: int, size: int, device: torch.device, seed: int = 0) -> Images:
    """`n` uint8 images as the pixel form holds them (short side `size` * 8/7; the long side 1 to 1.6 times it, one
    of 40 ratios, a third of them portrait: dozens of size groups in a batch of 256, as an ImageNet batch has),
    random content, on `device`."""
    rng = np.random.default_rng(seed)
    short = int(size * 8 / 7)
    ratios = rng.choice(np.linspace(1.0, 1.6, 40), n)
    shapes = [(short, round(short * r)) if k % 3 else (round(short * r), short) for k, r in enumerate(ratios)]
    images = [torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8)) for h, w in shapes]
    cpu = Images.of(images)
    return Images([(rows, g.to(device)) for rows, g in cpu.groups], cpu.n)


LABELS = {
    "device": "device ops (kernels)",
    "device views": "device views",
    "host": "host ops",
    "h2d": "host-to-device copies",
}


class CountOps(TorchDispatchMode):
    """Counts aten ops: on the device's tensors, on host tensors, and copies from host to device."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device_type = device.type
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = [t.device.type for t in _tensors((args, kwargs, out))]
        on_device = self.device_type in seen
        # A view of a device tensor launches no kernel: counted apart.
        self.counts["host" if not on_device else "device views" if func.is_view else "device"] += 1
        if on_device and "cpu" in seen and func.overloadpacket in (torch.ops.aten._to_copy, torch.ops.aten.copy_):
            self.counts["h2d"] += 1
        return out


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--shapes", nargs="+", default=["256x224", "256x32", "32x32"], help="batches as IMAGESxSIZE (square crops)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="rounds; medians")
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads (0: torch's default)")
    parser.add_argument("--quick", action="store_true", help="a batch of 8 at 24, 1 round: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.shapes, args.repeats = ["8x24"], 1
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"# torch {torch.__version__}, device {torch.cuda.get_device_name(device) if device.type == 'cuda' else args.device}, "
          f"{torch.get_num_threads()} CPU threads, {args.repeats} rounds")  # fmt: skip
    differ: list[str] = []
    print("| recipe | batch | measure | value |")
    print("| --- | --- | --- | --- |")
    for shape in args.shapes:
        batch, size = (int(v) for v in shape.split("x"))
        for recipe in ("basic", "strong"):
            ra = timm_rand_augment(size) if recipe == "strong" else None
            folder = FolderBytes([], np.arange(0), size, train=True, rand_augment=ra)
            rows = _measure(folder, batch, size, device, args.repeats, differ=differ, name=f"{recipe} {shape}")
            for key, value in rows.items():
                fmt = "{:.0f}" if "ms" not in key else "{:.2f}"
                print(f"| {recipe} | {batch} x {size}^2 | {key} | {fmt.format(value)} |")
    if differ:
        print(f"# a seed gave DIFFERENT bytes on its two passes on {len(differ)} batches: " + "; ".join(differ))
        return 1
    print("# each seed gave the same bytes on both its passes on every batch")
    return 0


def _measure(
    folder: FolderBytes, batch: int, size: int, device: torch.device, repeats: int, *, differ: list[str], name: str
) -> dict[str, float]:
    """One recipe and batch shape: its op counts (on the meta device) and its times (on `device`), each measure's
    value. A seed whose two passes give different bytes is added to `differ`."""
    cuda = device.type == "cuda"

    def run(images, dev, seed):
        return folder.transform(images, dev, torch.Generator().manual_seed(seed))

    # Counted on the meta device: every op dispatched, no kernel run; a host-to-device copy is a copy to it.
    meta = torch.device("meta")
    on_meta, on_device = pixel_batch(batch, size, meta), pixel_batch(batch, size, device)
    rows: dict[str, float] = {}
    run(on_meta, meta, 0)  # first calls dispatch a few more (lazy set-up)
    with CountOps(meta) as counter:  # the same draws, so the same counts every round
        run(on_meta, meta, 0)
    for key, label in LABELS.items():
        rows[label] = counter.counts[key]
    times: collections.defaultdict = collections.defaultdict(list)
    # Each round's draws are seeded by its index; a first pass over the seeds warms up (and gives the bytes the
    # second must repeat): kernels may prepare themselves per shape (oneDNN's convolution on the CPU), and the draws
    # set the shapes.
    first: dict[int, torch.Tensor] = {}
    for i, r in enumerate([*range(repeats), *range(repeats)]):
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = run(on_device, device, r)
        t1 = time.perf_counter()  # CUDA: the host's part (the launches); the kernels may still run
        if cuda:
            torch.cuda.synchronize(device)
        t2 = time.perf_counter()
        if i < repeats:
            first[r] = out
            continue
        times[f"{'host ms' if cuda else 'ms'} ({device.type})"].append(1e3 * (t1 - t0))
        if cuda:
            times["synced ms (cuda)"].append(1e3 * (t2 - t0))
        if not torch.equal(first[r], out):  # reported at the end: the timings still print
            differ.append(f"{name} seed {r}: {int((first[r] != out).sum())} bytes")
    for key, values in times.items():
        rows[f"{key}, median"] = statistics.median(values)
        # Other processes on a shared CPU stretch some rounds: the fastest is the code's own time.
        rows[f"{key}, fastest"] = min(values)
    return rows


if __name__ == "__main__":
    sys.exit(main())
