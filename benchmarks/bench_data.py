"""Does the data path feed the GPU? `trainables.fit` on a CIFAR-10 layout against synthetic data already on the GPU.

Writes its own fake CIFAR-10 (random pixels, the official python-pickle layout, full size by default), then
times `trainables.fit` on ViT-S/4 @32, batch 512, for each data path and method, interleaved round by round so
that drift hits every path alike; each figure is the median over rounds of the median epoch after the first.
Needs only torch, timm and pydantic (no Ray, Optuna or MLflow).

  python -m benchmarks.bench_data                 # the issue's table on one GPU
  python -m benchmarks.bench_data --quick         # tiny CPU smoke of the script itself, measures nothing

--record appends each path's img/s and ratio to benchmarks/results/data_path.csv; the strong path's ratios are the
share of a clean epoch that `sharpscale run --dry-run` costs a strong-augmentation trial at (studies/cost.py).
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch

from studies.cost import RATIO_TO_SYNTHETIC, STRONG_AUGMENT_PATH
from trainables import fit

# (label, data overrides, target ratio to synthetic with the same method)
PATHS = [
    ("synthetic, on the GPU", {"name": "synthetic"}, None),
    (
        "cifar10 basic, device-resident (the default on CUDA)",
        {"augment": "basic", "device_resident": True},
        {"none": 0.97, "sam": 0.98},
    ),
    ("cifar10 basic, host workers (auto count)", {"augment": "basic", "device_resident": False}, None),
    (
        "cifar10 basic, host, num_workers 0 (the old default)",
        {"augment": "basic", "device_resident": False, "num_workers": 0},
        None,
    ),
    (STRONG_AUGMENT_PATH, {"augment": "strong"}, {"none": 0.90}),
]


def write_fake_cifar10(root: Path, n_train: int, n_test: int, seed: int = 0) -> None:
    """Random pixels in the official layout: <root>/cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)

    def dump(name: str, n: int) -> None:
        batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"labels": rng.integers(0, 10, n).tolist()}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))

    for i in range(1, 6):
        dump(f"data_batch_{i}", n_train // 5)
    dump("test_batch", n_test)
    (folder / "batches.meta").write_bytes(
        pickle.dumps({b"label_names": [f"c{i}".encode() for i in range(10)]}, protocol=2)
    )


def config(
    root: Path,
    data: dict,
    method: str,
    *,
    model: dict,
    batch: int,
    steps: int,
    n_train: int,
    epochs: int,
    device: str,
    dataset: str = "cifar10",
    size: int | None = None,
    eval_batch: int = 1024,
) -> dict:
    """The trial config of one timed fit: `data`'s overrides on `dataset` at `root` (or on synthetic data of the same
    batches, where `data` names it), `steps` batches of `batch` an epoch. Also bench_imagefolder's.

    size: the images' side (None: the dataset's own; synthetic data 32). `data`'s "prepared" key is
    bench_imagefolder's choice of root, not a data field.
    """
    base = {
        "name": dataset,
        "root": str(root),
        **({"img_size": size} if size is not None else {}),
        "batch_size": batch,
        "eval_batch_size": eval_batch,
        "fraction": min(1.0, batch * steps / n_train),
    }
    if data.get("name") == "synthetic":
        base = {
            "name": "synthetic",
            "img_size": 32 if size is None else size,
            "batch_size": batch,
            "eval_batch_size": eval_batch,
            "synthetic_samples": batch * steps,
            "synthetic_classes": 10,
        }
    return {
        "model": model,
        "data": {**base, **{k: v for k, v in data.items() if k not in ("name", "prepared")}},
        "optimizer": {"method": method, "lr": 1e-3, "hparams": {"rho": 0.05} if method == "sam" else {}},
        "schedule": {"epochs": epochs, "sched": "cosine"},
        "train": {"device": device, "checkpoint_every": 1000},
    }


def images_per_sec(cfg: dict) -> float:
    seen: list[float] = []
    fit(cfg, reporter=lambda m, c: seen.append(m["images_per_sec"]))
    # The first epoch pays for compilation, allocation, cuDNN autotuning and worker start.
    return statistics.median(seen[1:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40, help="steps per epoch")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--methods", nargs="+", default=["none", "sam"])
    p.add_argument("--n-train", type=int, default=50_000)
    p.add_argument("--quick", action="store_true", help="tiny model and data on CPU: checks the script only")
    p.add_argument("--record", action="store_true", help="append the figures to benchmarks/results/data_path.csv")
    args = p.parse_args()

    if args.quick:
        device, batch, n_test = "cpu", 16, 64
        model = {
            "name": "vit_tiny_patch16_224",
            "kwargs": {"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2},
        }
        args.steps, args.epochs, args.rounds, args.n_train = 4, 2, 1, 400
    else:
        device, batch, n_test = "cuda", 512, 10_000
        model = {"name": "vit_small_patch16_224", "kwargs": {"patch_size": 4}}
    card = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(
        f"# trainables.fit data paths, {card}, ViT-S/4 @32, batch {batch}, {args.steps} steps/epoch, "
        f"{args.rounds} rounds, torch {torch.__version__}, {torch.get_num_threads()} torch threads",
        flush=True,
    )

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_fake_cifar10(root, args.n_train, n_test)
        results: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            for method in args.methods:
                for label, data, _ in PATHS:
                    if method != "none" and "num_workers 0" in label:
                        continue  # the slow old default is shown once, for scale
                    cfg = config(
                        root,
                        data,
                        method,
                        model=model,
                        batch=batch,
                        steps=args.steps,
                        n_train=args.n_train,
                        epochs=args.epochs,
                        device=device,
                    )
                    ips = images_per_sec(cfg)
                    results.setdefault((label, method), []).append(ips)
                    print(f"  round {r + 1}: {method:5s} {label}: {ips:,.0f} img/s", flush=True)

    print()
    print("| data path | method | img/s | ratio to synthetic | target |")
    print("| --- | --- | --- | --- | --- |")
    rows = []
    for method in args.methods:
        base = statistics.median(results[(PATHS[0][0], method)])
        for label, _, targets in PATHS:
            if (label, method) not in results:
                continue
            ips = statistics.median(results[(label, method)])
            target = (targets or {}).get(method)
            verdict = "" if target is None else f">= {target} ({'met' if ips / base >= target else 'MISSED'})"
            print(f"| {label} | {method} | {ips:,.0f} | {ips / base:.3f} | {verdict} |")
            note = f"ViT-S/4 @32, batch {batch}, {args.steps} steps x {args.epochs} epochs, {args.rounds} rounds"
            rows += [
                {"figure": f"{label}, {method} :: img/s", "value": f"{ips:.0f}", "unit": "img/s", "note": note},
                {"figure": f"{label}, {method} :: {RATIO_TO_SYNTHETIC}", "value": f"{ips / base:.3f}", "note": note},
            ]
    if args.record and not args.quick:
        from benchmarks import results as recorded

        print(f"appended to {recorded.append('data_path', rows)}")


if __name__ == "__main__":
    main()
