"""Where a trial's time goes outside its training passes, phase by phase, without Ray, Optuna or MLflow.

For each model of the shipped CIFAR studies (ResNet-18 with the CIFAR stem, ViT-S/4, Mixer-S/4 at 32 px, batch 256),
`trainables.fit` runs one trial as a study runs it (validation and a checkpoint after every epoch, the
rho_sensitivity measures after the last epoch with --geometry) on a fake CIFAR-10 in the official layout that the
script writes (random pixels), with fit's phases timed by wrapping the loop's own functions: data load, model build,
loaders, the measurement set and the probe's check, each epoch's training pass (epoch_time_s), validation,
checkpoint, geometry. Each trial's fixed cost is its wall time less the sum of its epoch_time_s; validation images/s
(what the cost estimate counts validation from) is the validation split over the validation seconds. Then, once, in
a fresh interpreter: the cold cost of a trial process (imports of torch, timm and trainables, the CUDA context).
What it does not see: Ray's actor start and Tune's checkpoint copy to storage, MLflow's records (about 0.1 s a call on
SQLite; trainables.ray_train logs each trial's fixed_time_s with them included).

  python -m benchmarks.bench_trial_cost                      # on the GPU: the three models, none and SAM
  python -m benchmarks.bench_trial_cost --quick              # tiny model, digits-sized, on CPU: the script only
"""

from __future__ import annotations

import argparse
import collections
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import trainables.loop as loop

MODELS = {
    "ResNet-18": {"name": "resnet18", "cifar_stem": True},
    "ViT-S/4": {"name": "vit_small_patch16_224", "kwargs": {"patch_size": 4}},
    "Mixer-S/4": {"name": "mixer_s16_224", "kwargs": {"patch_size": 4}},
}
QUICK = {"tiny mixer": {"name": "mixer_s16_224", "kwargs": {"patch_size": 4, "num_blocks": 1, "embed_dim": 16}}}
PHASES = {
    "load_dataset": "data load",
    "create_model": "model build",
    "_loaders": "loaders",
    "_geometry_batches": "measurement set",
    "_check_probe": "probe check",
    "evaluate": "validation",
    "_save": "checkpoint",
    "_measure_geometry": "geometry",
}


def _timed(spent: dict[str, float], label: str, fn, device: str):
    def wrapper(*args, **kwargs):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if device == "cuda":
                torch.cuda.synchronize()
            spent[label] += time.perf_counter() - t0

    return wrapper


def trial(cfg: dict, device: str, probe=None) -> tuple[float, float, dict[str, float], list[dict]]:
    """One fit with its phases timed: (wall, sum of epoch_time_s, seconds per phase, the epochs' metrics)."""
    spent: dict[str, float] = collections.defaultdict(float)
    saved = {name: getattr(loop, name) for name in PHASES if hasattr(loop, name)}
    for name, fn in saved.items():
        setattr(loop, name, _timed(spent, PHASES[name], fn, device))
    seen: list[dict] = []
    try:
        t0 = time.perf_counter()
        loop.fit(cfg, reporter=lambda m, c: seen.append(m), probe=probe)
        wall = time.perf_counter() - t0
    finally:
        for name, fn in saved.items():
            setattr(loop, name, fn)
    return wall, sum(m["epoch_time_s"] for m in seen), dict(spent), seen


def cold_start(device: str) -> dict[str, float]:
    """Seconds a fresh trial process pays before its first step, in a new interpreter."""
    code = (
        "import time; t=time.perf_counter(); import torch; a=time.perf_counter(); import timm; b=time.perf_counter(); "
        "import trainables.loop, trainables.config; c=time.perf_counter(); "
        f"torch.zeros(1, device='{device}'); d=time.perf_counter(); "
        "print(a-t, b-a, c-b, d-c)"
    )
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root, env=_env(root)
    )
    keys = ("import torch", "import timm", "import trainables", "CUDA context" if device == "cuda" else "first tensor")
    return dict(zip(keys, map(float, out.stdout.split())))


def _env(root: str) -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-train", type=int, default=25_600, help="training images of the fake CIFAR-10 (default 25,600)")
    p.add_argument("--n-val", type=int, default=10_000, help="validation images (default CIFAR-10's 10,000)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--methods", nargs="+", default=["none", "sam"])
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--geometry", action="store_true", help="also rho_sensitivity's measures after the last epoch")
    p.add_argument("--quick", action="store_true", help="tiny model and data on CPU: checks the script only")
    args = p.parse_args()
    from benchmarks.bench_data import write_fake_cifar10

    device = "cpu" if args.quick else "cuda"
    models = QUICK if args.quick else {k: MODELS[k] for k in args.models}
    n_train, n_val = (512, 256) if args.quick else (args.n_train, args.n_val)
    batch = 64 if args.quick else 256
    card = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(
        f"# a trial's time outside training, {card}, torch {torch.__version__}; fake CIFAR-10 {n_train:,} + {n_val:,}"
    )
    print(f"# cold trial process: {cold_start(device)}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        write_fake_cifar10(Path(tmp), n_train, n_val)
        rows = []
        for key, model in models.items():
            for method in args.methods:
                cfg = {
                    "model": model,
                    "data": {"name": "cifar10", "root": tmp, "batch_size": batch, "augment": "basic"},
                    "optimizer": {"method": method, "lr": 1e-3, "hparams": {"rho": 0.05} if method == "sam" else {}},
                    "schedule": {"epochs": args.epochs, "warmup_epochs": 0},
                    "train": {"device": device},
                }
                probe = None
                if args.geometry:
                    from analysis.geometry.probes import make_probe

                    cfg["geometry"] = {"measures": ["lambda_max", "hessian_trace"]}
                    if args.quick:
                        cfg["geometry"].update(batches=1, batch_size=16, max_iter=2, trace_samples=2)
                    probe = make_probe(cfg)
                wall, train, spent, seen = trial(cfg, device, probe)
                val_s = spent.get("validation", 0.0)
                rows.append((key, method, wall, train, spent, seen))
                phases = ", ".join(f"{k} {v:.2f}" for k, v in spent.items())
                print(
                    f"{key} {method}: wall {wall:.2f} s, epochs {train:.2f} s, fixed {wall - train:.2f} s "
                    f"({phases}); train img/s {statistics.median(m['images_per_sec'] for m in seen):,.0f} (median of "
                    f"{len(seen)} epochs; the first pays for warm-up), val img/s "
                    f"{len(seen) * n_val / val_s if val_s else float('nan'):,.0f}",
                    flush=True,
                )
    print("\n| model | method | train img/s, last epoch | val img/s | trial wall s | epochs s | fixed s | of which |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for key, method, wall, train, spent, seen in rows:
        val_s = spent.get("validation", 0.0)
        top = ", ".join(f"{k} {v:.2f}" for k, v in sorted(spent.items(), key=lambda kv: -kv[1])[:4])
        print(
            f"| {key} | {method} | {seen[-1]['images_per_sec']:,.0f} | {len(seen) * n_val / val_s:,.0f} | {wall:.2f} | "
            f"{train:.2f} | {wall - train:.2f} | {top} |"
        )


if __name__ == "__main__":
    main()
