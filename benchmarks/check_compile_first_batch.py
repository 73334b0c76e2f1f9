"""The compile on the first batch a trial trains, on a GPU: no batch read for it alone, no graph compiled after it.

    python -m benchmarks.check_compile_first_batch           # CUDA, train.compile reduce-overhead (CUDA graphs)
    python -m benchmarks.check_compile_first_batch --quick   # CPU, aot_eager backend: checks the script itself

`trainables.loop` compiles (and records the CUDA graphs of) a compiled trial's step on the first batch of its first
epoch, just before that batch's step, while the loader keeps reading: a persistent DataLoader's workers, and for the
pixel form the slot ring's workers and the device loader's producer thread, which decodes and augments on a side
stream while the graphs are captured. The CPU tests (tests/trainables/test_compiled.py) check the batches read and
the trained weights bit for bit with aot_eager; this checks what only a GPU shows. For each loader it trains one
trial eager and one compiled, 3 epochs, and prints: the batches the sampler handed out (each epoch's and no more),
the graphs Dynamo had compiled after each epoch (none after the first), compile_time_s, each epoch's images/s, and
how far the compiled weights ended from eager's (Inductor's float rounding, not bit for bit: printed, not judged).
Exits 1 when a batch count or a graph count is off, or a trial records no compile.

Needs the project's runtime packages (pydantic for trainables.config, timm, torchvision, Pillow); no network.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from trainables import compiled, fit, load_checkpoint, loop

RESNET = {"name": "resnet18", "cifar_stem": True, "kwargs": {"layers": [1, 1, 1, 1], "channels": [16, 32, 32, 64]}}
VIT = {"name": "vit_tiny_patch16_224", "kwargs": {"patch_size": 4, "embed_dim": 64, "depth": 2, "num_heads": 2}}


def _pixel_folder(root: Path, per_class: int) -> Path:
    from PIL import Image

    from trainables.data.prepare import prepare_folder

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in ("a", "b"):
            (root / "src" / split / c).mkdir(parents=True)
            for i in range(per_class):
                h, w = ((40, 50), (50, 36), (30, 30))[i % 3]
                Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(
                    root / "src" / split / c / f"{i}.jpg"
                )
    prepare_folder(root / "src", root / "px", short_side=20, workers=2, form="pixels")
    return root / "px"


def _cases(root: Path, quick: bool) -> dict[str, tuple[dict, dict, int]]:
    """name -> (model, data, batches an epoch)."""
    per_class = 24 if quick else 256
    px = str(_pixel_folder(root, per_class))
    digits = {"name": "digits", "img_size": 16, "batch_size": 64, "fraction": 1.0}
    steps = 1438 // 64  # digits' training split, the last partial batch dropped
    return {
        "digits, host loader, 2 persistent workers": (RESNET, {**digits, "device_resident": False, "num_workers": 2}, steps),
        "digits, on the device": (RESNET, {**digits, "device_resident": True}, steps),
        "pixel form, slot ring, 2 workers, device decode": (
            VIT,
            {"name": "imagefolder", "root": px, "img_size": 16, "decode": "device", "batch_size": 16,
             "eval_batch_size": 32, "num_workers": 2},
            2 * per_class // 16,
        ),
    }  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CPU, aot_eager: a smoke check of the script")
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args(argv)
    device = "cpu" if args.quick else "cuda"
    mode = "default" if args.quick else "reduce-overhead"
    if args.quick:
        compiled.BACKEND = "aot_eager"
    else:
        print(f"card: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    handed = []
    batches_of = loop._GlobalBatchSampler.__iter__
    loop._GlobalBatchSampler.__iter__ = lambda self: (handed.append(b) or b for b in batches_of(self))
    graphs = torch._dynamo.utils.counters["stats"]
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for k, (name, (model, data, steps)) in enumerate(_cases(Path(tmp), args.quick).items()):
            out = {}
            for compile_mode in ("off", mode):
                torch._dynamo.reset()
                handed.clear()
                seen, after, before = [], [], graphs["unique_graphs"]  # Dynamo's counters outlive its reset

                def report(metrics, ckpt, seen=seen, after=after, before=before):
                    seen.append(metrics)
                    after.append(graphs["unique_graphs"] - before)

                cfg = {
                    "model": model,
                    "data": data,
                    "optimizer": {"method": "sam", "base": "sgd", "lr": 0.05, "hparams": {"rho": 0.05}},
                    "schedule": {"epochs": args.epochs, "warmup_epochs": 0},
                    "train": {"device": device, "seed": 0, "compile": compile_mode, "precision": "fp32"},
                }
                if args.quick:
                    cfg["train"]["threads"] = 1  # a small shared CPU
                ckpt = Path(tmp) / f"{k}-{compile_mode}"
                t0 = time.perf_counter()
                fit(cfg, checkpoint_dir=ckpt, reporter=report)
                wall = time.perf_counter() - t0
                out[compile_mode] = load_checkpoint(ckpt)["model"]
                compile_s = seen[0].get(compiled.COMPILE_TIME_METRIC)
                row = {
                    "case": name,
                    "compile": compile_mode,
                    "batches": len(handed),
                    "expected": args.epochs * steps,
                    "graphs after each epoch": after,
                    "compile_time_s": compile_s,
                    "images_per_sec": [round(m["images_per_sec"]) for m in seen],
                    "wall_s": round(wall, 1),
                }
                bad = len(handed) != args.epochs * steps
                if compile_mode != "off":
                    bad |= compile_s is None or len(set(after)) != 1 or after[0] == 0
                row["ok"] = not bad
                failed |= bad
                print(json.dumps(row), flush=True)
            diff = max(
                float((out[mode][k].float() - v.float()).abs().max() / v.float().abs().max().clamp_min(1e-12))
                for k, v in out["off"].items()
                if v.is_floating_point()
            )
            print(json.dumps({"case": name, "max relative weight difference, compiled vs eager": diff}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
