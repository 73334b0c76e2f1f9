"""Throughput of the one training loop: `trainables.fit` against a bare step, and SAM's data-parallel scaling.

Needs only torch, timm and pydantic (no Ray, Optuna or MLflow). Every ratio is taken side by side in one run.

  python -m benchmarks.bench_trainables single            # fit vs bare forward/backward/step, 1 GPU
  python -m benchmarks.bench_trainables ddp --gpus 2      # SAM per-replica vs global eps on 2 GPUs vs 1 GPU
  python -m benchmarks.bench_trainables single --quick    # tiny CPU smoke of the script itself
  python -m benchmarks.bench_trainables geometry          # a trial's in-trial geometry against its epoch, 1 GPU
  python -m benchmarks.bench_trainables compile           # fit eager vs compiled (CUDA graphs); compile cache reuse
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import timm
import torch
import torch.nn.functional as F

from trainables.config import COMPILE_MODES, TRAIN_COMPILE_MODES

MODELS = {
    "vit_s16": ("vit_small_patch16_224", {}, 224, 128),
    "mixer_b16": ("mixer_b16_224", {}, 224, 128),
    "resnet50": ("resnet50", {}, 224, 128),
    "vit_s_p4_32": ("vit_small_patch16_224", {"img_size": 32, "patch_size": 4}, 32, 512),
}
QUICK = {"vit_tiny": ("vit_tiny_patch16_224", {"img_size": 32, "patch_size": 8, "depth": 2}, 32, 32)}
# Issue 21's CIFAR shapes (32x32, batch 256): (timm name, timm kwargs, img, batch, cifar_stem).
CIFAR = {
    "vit_s4": ("vit_small_patch16_224", {"patch_size": 4}, 32, 256, False),
    "mixer_s4": ("mixer_s16_224", {"patch_size": 4}, 32, 256, False),
    # As studies/rho_sensitivity.yaml builds it: drop path 0.1, so the compiled step draws its masks (random ops).
    "mixer_s4_dp": ("mixer_s16_224", {"patch_size": 4, "drop_path_rate": 0.1}, 32, 256, False),
    "resnet18_cifar": ("resnet18", {}, 32, 256, True),
}


def _config(
    name,
    kwargs,
    img,
    batch,
    *,
    method="none",
    steps=30,
    device="cuda",
    epochs=2,
    hparams=None,
    global_eps=False,
    compile="off",
    cifar_stem=False,
    compile_cache=None,
):
    drop_path = kwargs.get("drop_path_rate", 0.0)  # a field of the trial's model config, not a timm kwarg
    kwargs = {k: v for k, v in kwargs.items() if k not in ("img_size", "drop_path_rate")}
    return {
        "model": {"name": name, "kwargs": kwargs, "cifar_stem": cifar_stem, "drop_path_rate": drop_path},
        "data": {
            "name": "synthetic",
            "img_size": img,
            "batch_size": batch,
            "synthetic_samples": batch * steps,
            "synthetic_classes": 1000 if img >= 64 else 10,
            "eval_batch_size": batch,
        },
        "optimizer": {"method": method, "lr": 1e-3, "hparams": hparams or {}, "global_perturbation": global_eps},
        "schedule": {"epochs": epochs, "sched": "cosine", "warmup_epochs": 0},
        "train": {
            "device": device,
            "precision": "bf16" if device == "cuda" else "fp32",
            "checkpoint_every": 1000,
            "compile": compile,
            "compile_cache": compile_cache,
        },
    }


def bare(name, kwargs, img, batch, steps, device) -> float:
    """images/s of the plainest correct step: same model, fused AdamW, bf16 autocast, channels_last, no weight decay on 1-D."""
    from timm.optim import param_groups_weight_decay

    torch.manual_seed(0)
    num_classes = 1000 if img >= 64 else 10
    model = timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs).to(device)
    cuda = device == "cuda"
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(param_groups_weight_decay(model, 0.05), lr=1e-3, fused=cuda)
    x = torch.randn(batch, 3, img, img, device=device)
    if cuda:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, num_classes, (batch,), device=device)
    ctx = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else torch.enable_grad

    def step():
        with ctx():
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    return batch * steps / (time.perf_counter() - t0)


def loop(name, kwargs, img, batch, steps, device, **kw) -> float:
    """images/s of `trainables.fit`'s second epoch (the first pays for warm-up), eval excluded."""
    from trainables import fit

    seen = []
    fit(
        _config(name, kwargs, img, batch, steps=steps, device=device, **kw),
        reporter=lambda m, c: seen.append(m["images_per_sec"]),
    )
    return seen[-1]


def cmd_single(args) -> None:
    device = "cpu" if args.quick else "cuda"
    models = QUICK if args.quick else {k: MODELS[k] for k in args.models}
    card = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"# trainables.fit vs bare step, {card}, bf16 autocast, method none (fused AdamW)")
    print("| model | batch | bare img/s | fit img/s | fit / bare |")
    print("| --- | --- | --- | --- | --- |")
    for key, (name, kwargs, img, batch) in models.items():
        bares, fits = [], []
        for _ in range(args.repeats):  # interleaved, so clock and thermal drift hit both alike
            bares.append(bare(name, kwargs, img, batch, args.steps, device))
            fits.append(loop(name, kwargs, img, batch, args.steps, device))
        b, f = statistics.median(bares), statistics.median(fits)
        print(f"| {key} | {batch} | {b:.0f} | {f:.0f} | {f / b:.3f} |", flush=True)


# A mode train.compile does not offer, run through the same fit as the train.compile mode with (or without) CUDA
# graphs whose plan it replaces: its fall-backs are that mode's (trainables.compiled.resolve_compile).
_AS_TRAIN_MODE = {"max-autotune": "reduce-overhead", "max-autotune-no-cudagraphs": "default"}


def _fit_compiled(cfg: dict, mode: str, reporter) -> None:
    from trainables import compiled, fit

    if mode not in _AS_TRAIN_MODE:
        cfg["train"]["compile"] = mode
        fit(cfg, reporter=reporter)
        return
    cfg["train"]["compile"] = _AS_TRAIN_MODE[mode]
    resolve = compiled.resolve_compile
    swap = {"reduce-overhead": "max-autotune", "default": "max-autotune-no-cudagraphs"}

    def as_mode(*a, **kw):
        plan = resolve(*a, **kw)
        return compiled.CompilePlan(swap.get(plan.mode, plan.mode), f"bench_trainables --modes {mode}", plan.warn)

    compiled.resolve_compile = as_mode
    try:
        fit(cfg, reporter=reporter)
    finally:
        compiled.resolve_compile = resolve


def cmd_compile(args) -> None:
    """`trainables.fit` with train.compile off against reduce-overhead (CUDA graphs), interleaved, at issue 21's
    CIFAR shapes; then the compile cache: two fresh processes compiling one trial into a new cache directory."""
    device = "cpu" if args.quick else "cuda"
    modes = ["default"] if args.quick else args.modes
    mode = next((m for m in modes if m in TRAIN_COMPILE_MODES), "reduce-overhead")  # the cache run's (a fresh fit)
    if args.cache_device == "cpu":
        _compile_cache(args, "cpu", "default", batch=32)  # CUDA graphs do not run on CPU
        return
    card = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    models = {k: (*v, False) for k, v in QUICK.items()} if args.quick else {k: CIFAR[k] for k in args.models}
    print(
        f"# trainables.fit, train.compile off vs {', '.join(modes)}, {card}, bf16, synthetic data on the device, img/s "
        "of epoch 2"
    )
    print("| model | batch | method | mode | eager img/s | compiled img/s | compiled / eager | compile s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for key, (name, kwargs, img, batch, stem) in models.items():
        for method, hp in (("none", {}), ("sam", {"rho": 0.05})):
            rates = {"off": [], **{m: [] for m in modes}}
            compile_s = {m: [] for m in modes}
            for _ in range(args.repeats):
                for m in rates:
                    seen = []
                    cfg = _config(name, kwargs, img, batch, steps=args.steps, device=device, method=method, hparams=hp)
                    cfg["model"]["cifar_stem"] = stem
                    _fit_compiled(cfg, m, lambda r, c, seen=seen: seen.append(r))
                    rates[m].append(seen[-1]["images_per_sec"])
                    if m != "off":
                        compile_s[m].append(seen[0]["compile_time_s"])
            e = statistics.median(rates["off"])
            for m in modes:
                c = statistics.median(rates[m])
                print(
                    f"| {key} | {batch} | {method} | {m} | {e:.0f} | {c:.0f} | {c / e:.2f}x | {max(compile_s[m]):.1f} |",
                    flush=True,
                )
    if args.cache_model and not args.quick:
        _compile_cache(args, device, mode)


def _compile_cache(args, device: str, mode: str, batch: int | None = None) -> None:
    """The compile cache: two fresh processes, one trial each, compiling into a new (cold) cache directory; the
    first one's compile is what every node's first trial of an architecture pays (the cache is node-local)."""
    import subprocess

    if args.cache_model:
        name, kwargs, img, cifar_batch, stem = CIFAR[args.cache_model]
        batch = batch or cifar_batch
        cache = Path(tempfile.mkdtemp(prefix="sharpscale-compile-cache-"))
        cfg = _config(name, kwargs, img, batch, steps=4, device=device, epochs=1, method="sam", hparams={"rho": 0.05})
        cfg["model"]["cifar_stem"] = stem
        cfg["train"].update(compile=mode, compile_cache=str(cache))
        code = (
            "import json, sys; from trainables import fit; seen = []; "
            "fit(json.loads(sys.argv[1]), reporter=lambda r, c: seen.append(r)); print(seen[0]['compile_time_s'])"
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1])] + sys.path)}
        times = []
        for trial in ("first", "second"):  # each a fresh process: only the cache directory carries over
            out = subprocess.run(
                [sys.executable, "-c", code, json.dumps(cfg)], env=env, capture_output=True, text=True, check=True
            )
            times.append(float(out.stdout.strip().splitlines()[-1]))
        print(
            f"\n# compile cache, {args.cache_model} SAM, batch {batch}, {device}, two fresh processes sharing "
            f"train.compile_cache: first trial "
            f"{times[0]:.1f} s, second {times[1]:.1f} s, second / first {times[1] / times[0]:.2f}"
        )


def cmd_geometry(args) -> None:
    """What a trial's `geometry:` section costs beside its epoch: SAM on a CIFAR-10-sized epoch (synthetic data on
    the device), lambda_max and tr(H) after the last epoch as studies/rho_sensitivity.yaml measures them."""
    from analysis.geometry.probes import make_probe
    from trainables import fit

    device = "cpu" if args.quick else "cuda"
    models = QUICK if args.quick else {k: MODELS[k] for k in args.models}
    card = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(
        f"# in-trial geometry vs one training epoch, {card}, SAM (rho 0.05), bf16 training; measures "
        f"{', '.join(args.measures)} on {args.geometry_batches} x {args.geometry_batch_size} fixed samples, fp32"
    )
    print("| model | train batch | steps/epoch | epoch s | hvp_mode | geometry s | geometry / epoch |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for key, (name, kwargs, img, batch) in models.items():
        for hvp_mode in args.hvp_modes:
            cfg = _config(
                name, kwargs, img, batch, steps=args.steps, device=device, method="sam", hparams={"rho": 0.05}
            )
            cfg["geometry"] = {
                "measures": list(args.measures),
                "batches": args.geometry_batches,
                "batch_size": args.geometry_batch_size,
                "hvp_mode": hvp_mode,
            }
            seen = []
            try:
                fit(cfg, reporter=lambda m, c: seen.append(m), probe=make_probe(cfg))
            except ValueError as err:  # finite differences refuse a non-smooth model (analysis.geometry)
                print(f"| {key} | {batch} | {args.steps} | - | {hvp_mode} | refused: {str(err)[:80]} | - |", flush=True)
                continue
            epoch, geo = seen[-1]["epoch_time_s"], seen[-1]["geometry_time_s"]
            print(
                f"| {key} | {batch} | {args.steps} | {epoch:.2f} | {hvp_mode} | {geo:.2f} | {geo / epoch:.3f} |",
                flush=True,
            )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank, world, port, cfg, out_path):
    import torch.distributed as dist

    from trainables import fit

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        seen = []
        fit(cfg, reporter=lambda m, c: seen.append(m["images_per_sec"]))
        if rank == 0:
            Path(out_path).write_text(json.dumps(seen[-1]))
    finally:
        dist.destroy_process_group()


def _run_ddp(world, cfg) -> float:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ips.json"
        mp.spawn(_ddp_worker, args=(world, _free_port(), cfg, str(out)), nprocs=world, join=True)
        return json.loads(out.read_text())


def cmd_ddp(args) -> None:
    world = args.gpus
    card = torch.cuda.get_device_name()
    print(f"# SAM data-parallel scaling, {world} x {card}, bf16, per-GPU batch fixed")
    print(
        "| model | per-GPU batch | 1 GPU SAM img/s | per-replica eps img/s | scaling | global eps img/s | per-replica / global |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for key in args.models:
        name, kwargs, img, batch = MODELS[key]
        one, local, glob = [], [], []
        for _ in range(args.repeats):
            one.append(loop(name, kwargs, img, batch, args.steps, "cuda", method="sam", hparams={"rho": 0.05}))
            cfg = _config(name, kwargs, img, batch * world, steps=args.steps, method="sam", hparams={"rho": 0.05})
            local.append(_run_ddp(world, cfg))
            cfg_g = _config(
                name, kwargs, img, batch * world, steps=args.steps, method="sam", hparams={"rho": 0.05}, global_eps=True
            )
            glob.append(_run_ddp(world, cfg_g))
        o, loc, g = statistics.median(one), statistics.median(local), statistics.median(glob)
        print(f"| {key} | {batch} | {o:.0f} | {loc:.0f} | {loc / o:.2f}x | {g:.0f} | {loc / g:.3f} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="part", required=True)
    s = sub.add_parser("single")
    s.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    s.add_argument("--steps", type=int, default=40)
    s.add_argument("--repeats", type=int, default=3)
    s.add_argument("--quick", action="store_true", help="tiny model on CPU: checks the script, measures nothing")
    s.set_defaults(func=cmd_single)
    d = sub.add_parser("ddp")
    d.add_argument("--gpus", type=int, default=2)
    d.add_argument("--models", nargs="+", default=["vit_s16", "resnet50"], choices=list(MODELS))
    d.add_argument("--steps", type=int, default=30)
    d.add_argument("--repeats", type=int, default=2)
    d.set_defaults(func=cmd_ddp)
    c = sub.add_parser("compile")
    c.add_argument("--models", nargs="+", default=list(CIFAR), choices=list(CIFAR))
    c.add_argument("--steps", type=int, default=40, help="steps per epoch")
    c.add_argument("--repeats", type=int, default=1)
    c.add_argument("--cache-model", default="resnet18_cifar", help="model of the cache measurement ('' skips it)")
    c.add_argument(
        "--modes",
        nargs="+",
        default=["reduce-overhead"],
        choices=list(COMPILE_MODES),
        help="torch.compile modes timed against off, side by side (the first that train.compile offers, else "
        "reduce-overhead, also for the cache measurement; the max-autotune ones replace the plan of reduce-overhead "
        "or default)",
    )
    c.add_argument(
        "--cache-device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="cpu: only the cache measurement, on CPU (mode default, batch 32)",
    )
    c.add_argument("--quick", action="store_true", help="tiny run on CPU: checks the script, measures nothing")
    c.set_defaults(func=cmd_compile)
    g = sub.add_parser("geometry")
    g.add_argument("--models", nargs="+", default=["vit_s_p4_32"], choices=list(MODELS))
    g.add_argument("--steps", type=int, default=98, help="steps per epoch (98 x 512 = one CIFAR-10 epoch)")
    g.add_argument("--measures", nargs="+", default=["lambda_max", "hessian_trace"])
    g.add_argument("--geometry-batches", type=int, default=2)
    g.add_argument("--geometry-batch-size", type=int, default=128)
    g.add_argument("--hvp-modes", nargs="+", default=["auto", "finite_difference"])
    g.add_argument("--quick", action="store_true", help="tiny model on CPU: checks the script, measures nothing")
    g.set_defaults(func=cmd_geometry)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
