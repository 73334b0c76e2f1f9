"""Do JPEG folders feed the GPU? `trainables.fit` on an ImageNet-style folder, host decode against device decode,
against synthetic data already on the GPU.

Writes its own image folder (500x375 JPEGs of smooth noise plus grain, quality 90, in 10 class folders, made in
parallel; `--sizes mixed`: ImageNet-like sizes, many in a batch), then times `trainables.fit` on ViT-S/16 and ResNet-50 at 224, batch 256, bf16, `none` and SAM, for
synthetic data, `data.decode: cpu` (PIL in DataLoader workers, timm's transforms) and `data.decode: device`
(workers read bytes; nvjpeg, crops, flips and RandAugment batched on the GPU), `basic` and `strong`
augmentation, with the default worker count. Paths and methods are interleaved round by round; each figure is
the median over rounds of the median epoch after the first. Before the fits it times the device path alone (no
model) and its GPU kernel time a batch (torch.profiler: the SM work that competes with the step). `--prepared S`
adds the same paths on the folder prepared at short side S (`trainables.data.prepare`, timed as it is written),
`--pixels S` on its pixel form (nothing left to decode). Needs only torch, torchvision, timm and pydantic.

  python -m benchmarks.bench_imagefolder                 # the issue's table on one GPU
  python -m benchmarks.bench_imagefolder --prepared 256  # also the folder after `sharpscale data prepare`
  python -m benchmarks.bench_imagefolder --pixels 256    # also its pixel form (`data prepare --form pixels`)
  python -m benchmarks.bench_imagefolder --quick         # tiny CPU smoke of the script itself, measures nothing
  python -m benchmarks.bench_imagefolder --dali          # synthetic vs torch's device path vs DALI, to the CSV

`--dali` is its own table (`dali_table`): synthetic data, today's device path (`data.loader: torch`) and DALI
(`data.loader: dali`), recipes basic, strong and SAM basic, ViT-S/16 and ResNet-50, on a one-size and a mixed-size
folder, within `--budget-s` (fits that would overrun it are skipped and named); ratios to synthetic data in the
same run go to benchmarks/results/imagefolder_dali.csv. `--page-cache-miss` adds the basic recipe with the folder's
files dropped from the page cache before every epoch (posix_fadvise DONTNEED), so every read comes from the disk,
as for a folder larger than the page cache.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from benchmarks.bench_data import config, images_per_sec
from trainables import fit

# (label, data overrides, {method: target ratio to synthetic with the same method}); issue 21's targets
TARGETS_BASIC, TARGETS_STRONG = {"none": 0.90, "sam": 0.95}, {"none": 0.80}
PATHS = [
    ("synthetic, on the GPU", {"name": "synthetic"}, None),
    ("imagefolder basic, decode cpu", {"augment": "basic", "decode": "cpu"}, None),
    ("imagefolder basic, decode device", {"augment": "basic", "decode": "device", "loader": "torch"}, TARGETS_BASIC),
    ("imagefolder strong, decode cpu", {"augment": "strong", "decode": "cpu"}, None),
    ("imagefolder strong, decode device", {"augment": "strong", "decode": "device", "loader": "torch"}, TARGETS_STRONG),
]


def prepared_paths(short_sides: list[int], form: str = "jpeg") -> list[tuple[str, dict, dict | None]]:
    """The data paths on the folder prepared at each short side in `form` (`sharpscale data prepare --form`)."""
    out = []
    for side in short_sides:
        key, name = f"{form}{side}", ("prepared" if form == "jpeg" else "pixels") + f" {side}"
        out += [
            (f"{name} basic, decode cpu", {"augment": "basic", "decode": "cpu", "prepared": key}, None),
            (f"{name} basic, decode device", {"augment": "basic", "decode": "device", "prepared": key},
             TARGETS_BASIC),
            (f"{name} strong, decode device", {"augment": "strong", "decode": "device", "prepared": key},
             TARGETS_STRONG),
        ]  # fmt: skip
    return out


COPYING = "copying loader"  # a key of a path's data overrides that sets FolderPixels.use_slots = False, not config

MODELS = {
    "ViT-S/16": {"name": "vit_small_patch16_224"},
    "ResNet-50": {"name": "resnet50"},
}


def _jpeg(seed: int, h: int, w: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (h // 24 + 2, w // 24 + 2, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(coarse).resize((w, h), Image.Resampling.BICUBIC), dtype=np.int16)
    grain = rng.normal(0, 7, (h, w, 1)).astype(np.int16)  # sets the file size near ImageNet's ~110 kB / 57 kB
    buf = io.BytesIO()
    Image.fromarray(np.clip(smooth + grain, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _write(job: tuple[Path, int, int, int]) -> int:
    path, seed, h, w = job
    data = _jpeg(seed, h, w)
    path.write_bytes(data)
    return len(data)


# --sizes mixed: shares of ImageNet-like (height, width), the rest a log-uniform aspect in [1/2, 2] with the longer
# side 500: a batch then holds many sizes (one crop call each on the device path), as a real folder's does.
MIXED_SIZES = (((375, 500), 0.40), ((500, 375), 0.12), ((333, 500), 0.12), ((500, 333), 0.04), ((400, 500), 0.04))


def image_size(seed: int, mixed: bool) -> tuple[int, int]:
    """The (height, width) of generated image `seed`: 375 x 500, or drawn from MIXED_SIZES' shares."""
    if not mixed:
        return 375, 500
    rng = np.random.default_rng([seed, 1])
    u = rng.random()
    for hw, share in MIXED_SIZES:
        if u < share:
            return hw
        u -= share
    aspect = float(np.exp(rng.uniform(np.log(0.5), np.log(2.0))))  # width / height
    return (500, max(16, round(500 * aspect))) if aspect < 1 else (max(16, round(500 / aspect)), 500)


def write_jpeg_folder(root: Path, n_train: int, n_val: int, classes: int = 10, mixed: bool = False) -> float:
    """<root>/{train,val}/c<k>/<i>.jpg (sizes by `image_size`); returns the mean file size in bytes."""
    jobs = []
    for split, n in (("train", n_train), ("val", n_val)):
        for k in range(classes):
            (root / split / f"c{k}").mkdir(parents=True, exist_ok=True)
        seeds = [i + (split == "val") * 10**7 for i in range(n)]
        jobs += [(root / split / f"c{i % classes}" / f"{i}.jpg", seed, *image_size(seed, mixed))
                 for i, seed in enumerate(seeds)]  # fmt: skip
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        sizes = list(pool.map(_write, jobs, chunksize=64))
    return float(np.mean(sizes))


def pipeline_rates(root: Path, augment: str, size: int, batch: int, device: str, reps: int = 8) -> tuple[float, float]:
    """Images a second of the device path alone, no model: decoding one batch of bytes, and the whole transform
    (decode, crop, flip, RandAugment)."""
    from trainables.data import load_dataset

    train = load_dataset("imagefolder", root=root, img_size=size, augment=augment, decode="device").train
    read, n = _one_batch(train, batch)
    g, dev = torch.Generator().manual_seed(0), torch.device(device)

    def rate(work) -> float:
        work()  # warm-up: decoder state, kernels
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            work()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return reps * n / (time.perf_counter() - t)

    decode = lambda: train.images(read, dev)  # noqa: E731
    return rate(decode), rate(lambda: train.transform(decode(), dev, g))


def _one_batch(train, batch: int):
    """The first `batch` items of a device-path split as its loader hands them over: (the ReadBatch, its size)."""
    read = train.collate([train.read(i) for i in range(min(batch, len(train)))])
    if train.copies_to_device and torch.cuda.is_available():
        read = read._replace(flat=read.flat.pin_memory())  # as the loader pins it
    return read, len(read.indices)


def kernel_ms(root: Path, augment: str, size: int, batch: int, device: str) -> tuple[float, float]:
    """GPU kernel time (ms of the SMs' work, torch.profiler) of one batch's decode and of its whole transform: what
    competes with the training step for the GPU (nvjpeg's hardware decoder engine is not an SM and shows no kernel)."""
    from torch.profiler import ProfilerActivity, profile

    from trainables.data import load_dataset

    train = load_dataset("imagefolder", root=root, img_size=size, augment=augment, decode="device").train
    read, _ = _one_batch(train, batch)
    g, dev = torch.Generator().manual_seed(0), torch.device(device)
    out = []
    decode = lambda: train.images(read, dev)  # noqa: E731
    for work in (decode, lambda: train.transform(decode(), dev, g)):
        work()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(4):
                work()
            torch.cuda.synchronize()
        kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
        out.append(sum(e.self_device_time_total for e in kernels) / 4 / 1e3)
        top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:4]
        print("    heaviest: " + "; ".join(f"{e.key[:60]} {e.self_device_time_total / 4e3:.2f} ms" for e in top))
    return out[0], out[1]


def sm_busy(cfg: dict) -> tuple[float, float, list[tuple[str, float]]]:
    """One more fit of `cfg` under torch.profiler, its last epoch profiled: (SM busy fraction = the union of kernel
    intervals over the profiled span, that epoch's img/s under the profiler, the heaviest CPU ops by self time in
    ms). A data path that leaves the SMs idle where synthetic data does not starves the step from the host side."""
    from torch.profiler import ProfilerActivity, profile

    epochs = cfg["schedule"]["epochs"]
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    seen: list[float] = []

    def reporter(metrics, _checkpoint) -> None:
        seen.append(metrics["images_per_sec"])
        if len(seen) == epochs - 1:
            prof.start()
        elif len(seen) == epochs:
            prof.stop()

    fit(cfg, reporter=reporter)
    kernels = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type.name == "CUDA" and not e.name.startswith(("Memcpy", "Memset"))
    )
    busy, start, end = 0, None, None
    for a, b in kernels:
        if end is None or a > end:
            busy += 0 if end is None else end - start
            start, end = a, b
        else:
            end = max(end, b)
    busy += 0 if end is None else end - start
    span = kernels[-1][1] - kernels[0][0] if kernels else 1
    cpu = sorted(
        ((e.key, e.self_cpu_time_total / 1e3) for e in prof.key_averages() if e.device_type.name == "CPU"),
        key=lambda kv: -kv[1],
    )
    return busy / span, seen[-1], cpu[:6]


# --dali: (recipe, data overrides of every folder path, method); the targets of issue 38 against synthetic data.
DALI_RECIPES = [("basic", {"augment": "basic"}, "none"), ("strong", {"augment": "strong"}, "none"),
                ("SAM basic", {"augment": "basic"}, "sam")]  # fmt: skip
DALI_TARGETS = {"basic": 0.90, "strong": 0.80, "SAM basic": 0.95}
DALI_LOADERS = {
    "torch device decode": {"decode": "device", "loader": "torch"},
    "DALI": {"decode": "device", "loader": "dali"},
}


def evict(root: Path) -> int:
    """Drop `root`'s files from the page cache (written back first): their next read comes from the disk. The
    number of files."""
    os.sync()
    n = 0
    for f in root.rglob("*.jpg"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        n += 1
    return n


def _timed(cfg: dict, cold: Path | None) -> float:
    """The median img/s of `cfg`'s epochs after the first; `cold`: that folder evicted before every epoch."""
    seen: list[float] = []

    def reporter(metrics, _checkpoint) -> None:
        seen.append(metrics["images_per_sec"])
        if cold is not None:
            evict(cold)  # between epochs, outside the epoch's timing

    if cold is not None:
        evict(cold)
    fit(cfg, reporter=reporter)
    return statistics.median(seen[1:])


def dali_table(args, models: dict, size: int, batch: int, device: str, tmp: Path) -> None:
    """Synthetic data against today's device path and DALI, recipe by recipe, model by model, folder by folder (the
    one-size folder first: within the budget, what is left out is the mixed folder's last fits); the ratios to the
    CSV."""
    from benchmarks import results

    t_start = time.perf_counter()
    roots = {}
    for sizes in args.dali_sizes:
        root = (args.root or tmp / "folder").with_name(f"{(args.root or tmp / 'folder').name}-{sizes}")
        t = time.perf_counter()
        if not (root / "train").is_dir():
            mean_bytes = write_jpeg_folder(root, args.n_train, args.n_val, mixed=sizes == "mixed")
        else:
            mean_bytes = float(np.mean([f.stat().st_size for f in (root / "train").rglob("*.jpg")]))
        roots[sizes] = root
        print(f"  {sizes}-size folder: {args.n_train} train JPEGs, mean {mean_bytes / 1e3:.0f} kB, written in "
              f"{time.perf_counter() - t:.0f} s", flush=True)  # fmt: skip
    # (model, recipe, loader label, sizes, cold, method), in the order of what matters most within the budget:
    # synthetic data (every ratio's base), the one-size folder, the mixed one, then the page-cache misses.
    jobs = []
    for model_label in models:
        for method in ("none", "sam"):  # synthetic data has no recipe: its method is the base of each ratio
            jobs.append((model_label, "basic" if method == "none" else "SAM basic", "synthetic", None, False, method))
    for sizes in args.dali_sizes:
        for model_label in models:
            for recipe, _, method in DALI_RECIPES:
                for loader in ("DALI", "torch device decode"):
                    jobs.append((model_label, recipe, loader, sizes, False, method))
    if args.page_cache_miss:
        for model_label in models:
            for loader in ("DALI", "torch device decode"):
                jobs.append((model_label, "basic", loader, args.dali_sizes[0], True, "none"))
    figures: dict[tuple, float] = {}
    last: dict = {}
    for model_label, recipe, loader, sizes, cold, method in jobs:
        key = (model_label, recipe, loader, sizes, cold)
        elapsed = time.perf_counter() - t_start
        # The estimate: the latest fit of this model and method (the first ones pay the compiles, later ones hit the
        # compile cache).
        if elapsed + last.get((model_label, method), last.get(model_label, 0.0)) > args.budget_s:
            print(f"  SKIPPED (budget {args.budget_s:.0f} s, {elapsed:.0f} s used): {key}", flush=True)
            continue
        data = dict(next(d for r, d, _ in DALI_RECIPES if r == recipe))
        if loader == "synthetic":
            data, root = {"name": "synthetic"}, next(iter(roots.values()))
        else:
            data.update(DALI_LOADERS[loader])
            root = roots[sizes]
        cfg = config(root, data, method, model=models[model_label], batch=batch, steps=args.steps,
                     n_train=args.n_train, epochs=args.epochs, device=device, dataset="imagefolder", size=size,
                     eval_batch=512)  # fmt: skip
        t = time.perf_counter()
        try:
            figures[key] = _timed(cfg, roots[sizes] if cold else None)
        except Exception as err:  # noqa: BLE001 - one failing path must not cost the table
            print(f"  {key}: FAILED {type(err).__name__}: {err}", flush=True)
            continue
        last[model_label] = last[(model_label, method)] = time.perf_counter() - t
        print(f"  {model_label} {recipe} {loader} {sizes or ''}{' page-cache miss' if cold else ''}: "
              f"{figures[key]:,.0f} img/s ({time.perf_counter() - t:.0f} s)", flush=True)  # fmt: skip
    rows = []
    print("\n| model | recipe | folder | loader | img/s | ratio to synthetic | target |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (model_label, recipe, loader, sizes, cold), ips in figures.items():
        if loader == "synthetic":
            continue
        method = next(m for r, _, m in DALI_RECIPES if r == recipe)
        base = figures.get((model_label, "SAM basic" if method == "sam" else "basic", "synthetic", None, False))
        if base is None:
            continue
        folder = f"{sizes}-size" + (", page-cache miss" if cold else "")
        target = DALI_TARGETS[recipe]
        verdict = f">= {target} ({'met' if ips / base >= target else 'MISSED'})"
        print(f"| {model_label} | {recipe} | {folder} | {loader} | {ips:,.0f} | {ips / base:.3f} | {verdict} |")
        rows.append({
            "figure": f"{model_label} {recipe}, {folder} folder, {loader} / synthetic", "value": f"{ips / base:.3f}",
            "unit": "x", "note": f"{ips:,.0f} img/s against {base:,.0f} ({method}); batch {batch} @{size}, "
            f"{args.steps} steps x {args.epochs} epochs, {args.n_train} JPEGs; target >= {target}",
        })  # fmt: skip
    if rows and not args.quick:
        print(f"appended {len(rows)} rows to {results.append('imagefolder_dali', rows)}")
    print(f"total {time.perf_counter() - t_start:.0f} s")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # 150 steps an epoch: at 30 (session 7's tables) an epoch lasted about a second and the pipeline's fill at each
    # epoch's start (about 0.45 s on an H200) was a third of the gap to synthetic data (docs/benchmarks.md).
    p.add_argument("--steps", type=int, default=150, help="steps per epoch")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--methods", nargs="+", default=["none", "sam"])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--n-train", type=int, default=38_400)
    p.add_argument("--n-val", type=int, default=512)
    p.add_argument("--skip", nargs="*", default=[], help="leave out the data paths whose label contains any of these")
    p.add_argument("--skip-sam", nargs="*", default=[], help="as --skip, for SAM only (its runs cost twice)")
    p.add_argument("--no-pipeline", action="store_true", help="leave out the device path's timing without a model")
    p.add_argument("--root", type=Path, default=None, help="write (or reuse) the folder here; default a temp dir")
    p.add_argument(
        "--prepared",
        nargs="*",
        type=int,
        default=[],
        metavar="SHORT_SIDE",
        help="also time the folder prepared by `sharpscale data prepare --short-side SHORT_SIDE` (made here, timed)",
    )
    p.add_argument(
        "--pixels",
        nargs="*",
        type=int,
        default=[],
        metavar="SHORT_SIDE",
        help="also time the pixel form, `sharpscale data prepare --form pixels --short-side SHORT_SIDE` (made here)",
    )
    p.add_argument(
        "--workers",
        nargs="*",
        type=int,
        default=[],
        help="also time each device-decode path at these data.num_workers (default: the path's own default)",
    )
    p.add_argument(
        "--sm-busy",
        nargs="*",
        default=None,
        metavar="LABEL_PART",
        help="after the table, profile one more fit of synthetic data and of each path whose label contains one of "
        "these (first model, first method): the SMs' busy fraction over its last epoch and the heaviest CPU ops",
    )
    p.add_argument(
        "--sizes",
        choices=("one", "mixed"),
        default="one",
        help="one: every image 500x375 (a batch is one size); mixed: ImageNet-like sizes (MIXED_SIZES), many a batch",
    )
    p.add_argument(
        "--copying-loader",
        action="store_true",
        help="also time each pixel path with the loader that copies batches through shared memory and a pinning "
        "thread (FolderPixels.use_slots = False) beside the default slot ring",
    )
    p.add_argument("--dali", action="store_true", help="synthetic vs torch's device path vs DALI (dali_table) only")
    p.add_argument("--dali-sizes", nargs="+", choices=("one", "mixed"), default=["one", "mixed"])
    p.add_argument("--budget-s", type=float, default=400.0, help="--dali: start no fit that would end past this")
    p.add_argument("--page-cache-miss", action="store_true", help="--dali: also basic with the files read from disk")
    p.add_argument("--quick", action="store_true", help="tiny model and data on CPU: checks the script only")
    return p


def _prepared_roots(root: Path, args) -> dict[str | None, Path]:
    """The folder (key None) and each prepared form asked for (key e.g. 'pixels24'), made where missing."""
    roots: dict[str | None, Path] = {None: root}
    for form, sides in (("jpeg", args.prepared), ("pixels", args.pixels)):
        for side in sides:
            from trainables.data.prepare import prepare_folder

            where = roots[f"{form}{side}"] = root.parent / f"{root.name}-{form}-{side}"
            if not (where / "train").is_dir():
                done = prepare_folder(root, where, short_side=side, form=form)
                print(
                    f"  prepared as {form} at short side {side}: {done.seconds:.1f} s on {os.cpu_count()} CPUs, "
                    f"pixels {done.pixels_after / done.pixels_before:.3f} and bytes "
                    f"{done.bytes_after / done.bytes_before:.3f} of the original's",
                    flush=True,
                )
    return roots


def _print_pipelines(roots: dict[str | None, Path], size: int, batch: int, device: str) -> None:
    """The device path's rates without a model, per folder form and augmentation."""
    for side, where in roots.items():
        for augment in ("basic", "strong"):
            decode, whole = pipeline_rates(where, augment, size, batch, device)
            kernels = ""
            if device == "cuda":
                k_decode, k_whole = kernel_ms(where, augment, size, batch, device)
                kernels = f"; GPU kernels a batch: decode {k_decode:.2f} ms, whole {k_whole:.2f} ms"
            print(
                f"  device path alone, {'original' if side is None else side} {augment}: decode "
                f"{decode:,.0f} img/s, whole transform {whole:,.0f} img/s ({batch / decode * 1e3:.1f} / "
                f"{batch / whole * 1e3:.1f} ms a batch){kernels}",
                flush=True,
            )


def _paths(args) -> list:
    """The data paths timed: PATHS, the prepared forms, and the worker-count and copying-loader variants asked for."""
    paths = PATHS + prepared_paths(args.prepared) + prepared_paths(args.pixels, "pixels")
    paths += [(f"{label}, {w} workers", {**data, "num_workers": w}, None)
              for w in args.workers for label, data, _ in list(paths) if data.get("decode") == "device"]  # fmt: skip
    if args.copying_loader:
        paths += [(f"{label}, copying loader", {**data, COPYING: True}, None)
                  for label, data, _ in list(paths)
                  if str(data.get("prepared", "")).startswith("pixels") and data.get("decode") == "device"]  # fmt: skip
    return paths


def _time_rounds(args, models: dict, paths: list, timed_config) -> dict[tuple[str, str, str], list[float]]:
    """Each round's images/s of every model, method and path not skipped; a failing path is said and left out."""
    results: dict[tuple[str, str, str], list[float]] = {}
    for r in range(args.rounds):
        for model_label, model in models.items():
            for method in args.methods:
                for label, data, _ in paths:
                    skip = args.skip + (args.skip_sam if method == "sam" else [])
                    if any(word in label for word in skip):
                        continue
                    cfg = timed_config(data, method, model)
                    t = time.perf_counter()
                    try:
                        ips = images_per_sec(cfg)
                    except Exception as err:  # noqa: BLE001 - one failing path must not cost the table
                        print(f"  {model_label} {method} {label}: FAILED {type(err).__name__}: {err}", flush=True)
                        continue
                    results.setdefault((model_label, label, method), []).append(ips)
                    print(
                        f"  round {r + 1}: {model_label} {method:5s} {label}: {ips:,.0f} img/s "
                        f"({time.perf_counter() - t:.0f} s)",
                        flush=True,
                    )
    return results


def _print_sm_busy(args, models: dict, paths: list, timed_config) -> None:
    """One more profiled fit of synthetic data and of each path --sm-busy names (first model, first method)."""
    model_label, method = next(iter(models)), args.methods[0]
    print(f"\nSM busy over the last epoch, under torch.profiler ({model_label}, {method}):")
    for label, data, _ in paths:
        chosen = label == PATHS[0][0] or any(part in label for part in args.sm_busy)
        if not chosen or any(word in label for word in args.skip):
            continue
        busy, ips, cpu = sm_busy(timed_config(data, method, models[model_label]))
        print(f"  {label}: SMs busy {busy:.3f} of the epoch, {ips:,.0f} img/s under the profiler; heaviest "
              "CPU ops (self ms): " + "; ".join(f"{k[:48]} {v:.0f}" for k, v in cpu), flush=True)  # fmt: skip


def _print_table(models: dict, methods: list[str], paths: list, results: dict) -> None:
    """Each path's median images/s and its ratio to synthetic data, against its target where it has one."""
    print()
    print("| model | data path | method | img/s | ratio to synthetic | target |")
    print("| --- | --- | --- | --- | --- | --- |")
    for model_label in models:
        for method in methods:
            base_runs = results.get((model_label, PATHS[0][0], method))
            for label, _, targets in paths:
                runs = results.get((model_label, label, method))
                if not runs or not base_runs:
                    continue
                ips, base = statistics.median(runs), statistics.median(base_runs)
                target = (targets or {}).get(method)
                verdict = "" if target is None else f">= {target} ({'met' if ips / base >= target else 'MISSED'})"
                print(f"| {model_label} | {label} | {method} | {ips:,.0f} | {ips / base:.3f} | {verdict} |")


def main() -> None:
    args = _parser().parse_args()
    size, batch, device = 224, 256, "cuda"
    models = {m: MODELS[m] for m in args.models}
    if args.quick:
        size, batch, device = 32, 8, "cpu"
        models = {"tiny ViT": {"name": "vit_tiny_patch16_224", "kwargs": {"patch_size": 8, "embed_dim": 32,
                                                                          "depth": 1, "num_heads": 2}}}  # fmt: skip
        args.steps, args.epochs, args.rounds, args.n_train, args.n_val = 3, 2, 1, 48, 16
    card = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    if args.dali:
        if not args.quick:
            # Within the budget: one measured epoch after the compiling one, long enough that an epoch's pipeline
            # fill is a small share of it (set them on the command line to change this).
            args.steps = 60 if args.steps == 150 else args.steps
            args.epochs = 2 if args.epochs == 3 else args.epochs
            args.n_train = args.steps * batch if args.n_train == 38_400 else args.n_train
        print(f"# synthetic vs torch's device path vs DALI, {card}, {os.cpu_count()} CPUs, @{size}, batch {batch}, "
              f"{args.steps} steps x {args.epochs} epochs, torch {torch.__version__}", flush=True)  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            dali_table(args, models, size, batch, device, Path(tmp))
        return

    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or Path(tmp) / "folder"
        t0 = time.perf_counter()
        if not (root / "train").is_dir():
            mean_bytes = write_jpeg_folder(root, args.n_train, args.n_val, mixed=args.sizes == "mixed")
        else:
            mean_bytes = float(np.mean([f.stat().st_size for f in (root / "train").rglob("*.jpg")]))
        print(
            f"# trainables.fit on a JPEG folder, {card}, {os.cpu_count()} CPUs, {args.n_train} train JPEGs "
            f"{'500x375' if args.sizes == 'one' else 'of mixed sizes (MIXED_SIZES)'} "
            f"(mean {mean_bytes / 1e3:.0f} kB, written in {time.perf_counter() - t0:.0f} s), @{size}, batch {batch}, "
            f"{args.steps} steps/epoch, {args.epochs} epochs, {args.rounds} rounds, torch {torch.__version__}, "
            f"{torch.get_num_threads()} torch threads",
            flush=True,
        )
        roots = _prepared_roots(root, args)
        if not args.no_pipeline:
            _print_pipelines(roots, size, batch, device)
        paths = _paths(args)

        def timed_config(data: dict, method: str, model: dict) -> dict:
            from trainables.data.folders import FolderPixels

            data = dict(data)
            FolderPixels.use_slots = not data.pop(COPYING, False)  # read when fit builds its loaders
            return config(roots[data.get("prepared")], data, method, model=model, batch=batch, steps=args.steps,
                          n_train=args.n_train, epochs=args.epochs, device=device, dataset="imagefolder", size=size,
                          eval_batch=512)  # fmt: skip

        results = _time_rounds(args, models, paths, timed_config)
        if args.sm_busy is not None:
            _print_sm_busy(args, models, paths, timed_config)
    _print_table(models, args.methods, paths, results)


if __name__ == "__main__":
    main()
