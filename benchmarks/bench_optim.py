"""Throughput and memory of every optim method's train_step relative to a fused-AdamW step (needs only torch, timm, optim).

    python -m benchmarks.bench_optim                       # H100 targets, all models, bf16 autocast
    python -m benchmarks.bench_optim --quick               # tiny models on CPU, < 1 min smoke check
    python -m benchmarks.bench_optim --models resnet50 --methods esam,msam,fsam --markdown out.md
    python -m benchmarks.bench_optim --models vit_s4_b256,mixer_s4_b256,resnet18_cifar_b256 --methods none,sam \
        --compile                                          # eager vs compiled (CUDA graphs) steps, side by side
    python benchmarks/bench_optim.py --methods sam,wsam,sam+p0.5,sam+every8,sam+norm   # issue 34's step kinds
    python benchmarks/bench_optim.py --methods sam,sampa,vasso                        # SAMPa (its two passes in turn), VaSSO
    python -m benchmarks.bench_optim --models vit_s4_b256,resnet18_cifar_b256 --methods none,sam,rwp,gam --compile
    python -m benchmarks.bench_optim --models vit_s4_b256,resnet18_cifar_b256 --methods sam,bsam --compile \
        --compiled-only                                    # bSAM (its own update; the fused AdamW it is given unused)

Every variant of one model shares the model's weights and is timed in the same process, interleaved
round by round (the order rotates each round); each round's ratio to the fused-AdamW ``none`` step is
taken, and the median over rounds is reported beside the spread (min-max) of the rounds, so clock and
thermal drift cancel and a noisy host shows. Blocks are 40 steps by default: 10-step blocks gave ViT-S/16
SAM 0.523 (above the two-pass limit) and ASAM 0.461 in one H100 run, 40-step blocks 0.499 and 0.496, so
the default resolves a ratio to about 0.005. MESA is also compared with its floor: a plain step plus one
extra no-grad eval-mode forward of a model copy.

``--compile`` adds, for every method, the same step with the model run through ``trainables.compiled``'s
``CompiledModule`` (``torch.compile(mode="reduce-overhead")``: CUDA graphs), shown as ``<method>@compiled`` with
its ratio to the eager step of the same method (issue 21's target: >= 2.5x at CIFAR sizes, batch 256).
``--compile-modes reduce-overhead,max-autotune`` times each listed mode side by side (``<method>@max-autotune``:
Inductor's autotuned GEMM templates, their fused epilogues, and CUDA graphs); each mode's compile seconds are printed.

``--profile`` adds, after the timed rounds, where each variant's step time goes (one block of steps each): the wall
time per step, the host's time to issue a step (the loop without waiting for the GPU), the GPU's kernel time per
step (torch.profiler, CUDA graphs' kernels included), the host syncs inside one step (``set_sync_debug_mode``), and
the compiled variants' heaviest kernels. A step whose GPU time is close to its wall time is bound by the GPU: host
work outside the graphs is hidden behind it, and cutting that work cannot raise its throughput.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import math
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import timm
import torch
import torch.nn.functional as F

import optim

# The compiled step over the eager step of the same method, at CIFAR sizes (issue 21).
COMPILED_TARGET = 2.5
# Targets on the H100 (ratio of images/s to the fused-AdamW step; MESA to its floor).
TARGETS = {
    "sam": 0.495,
    "asam": 0.495,
    "gsam": 0.49,
    "looksam": 0.80,
    "saf": 0.98,
    "mesa": 0.97,
    # ESAM: the paper's cost (about 1.4x an SGD step, Du et al. 2022 Table 1); F-SAM costs as SAM; MSAM one pass.
    "esam": 0.68,
    "fsam": 0.49,
    "msam": 0.95,
    "wsam": 0.49,
    # SAMPa on one GPU: its two gradients one after the other, so SAM's two-pass target; its two-GPU speed is the
    # two-rank form's (not provided yet).
    "sampa": 0.49,
    "vasso": 0.49,
    # Issue 34: m-ARWP's two gradients one after the other (SAM's two-pass target); GAM's four passes.
    "rwp": 0.49,
    "gam": 0.245,
    # Lookbehind-SAM at the registry defaults (k = 5): k + 1 = 6 passes and 5 base steps per step, so SAM's
    # per-pass efficiency (0.495 for two) gives 0.99 / 6 = 0.165; 0.16 leaves room for the five AdamW steps.
    "lookbehind": 0.16,
    # bSAM: two passes like SAM, its own Adam-like update (the draw, the ascent, m and s) in place of AdamW's.
    "bsam": 0.49,
    # Issue 34: SS-SAM at p = 0.5; late-phase SAM's 12.5% of SAM steps over a whole trial (every 8th step costs the
    # same per step on average); SAM-ON's scope at least as fast as SAM over every parameter.
    "sam+p0.5": 0.66,
    "sam+every8": 0.88,
    "sam+norm": 0.495,
    "sam+gc": 0.49,
}
#: Variants of a registry method timed beside it: name -> (method, create()'s scope/schedule keywords).
STEP_KINDS = {
    "sam+p0.5": ("sam", {"schedule": {"probability": 0.5}}),
    "sam+every8": ("sam", {"schedule": {"every": 8}}),
    "sam+norm": ("sam", {"scope": "norm"}),
    "sam+gc": ("sam", {"gc": True}),
}
METHOD_HPARAMS = {
    "none": {},
    "sam": {"rho": 0.05},
    "asam": {"rho": 0.5},
    "gsam": {"rho_max": 0.1, "rho_min": 0.01, "alpha": 0.3},
    "looksam": {"k": 5},
    "saf": {},
    "mesa": {},
    "esam": {"rho": 0.05, "beta": 0.6, "gamma": 0.5},
    "fsam": {"rho": 0.05, "sigma": 1.0, "lmbda": 0.6},
    "msam": {"rho": 0.3},
    "wsam": {"rho": 0.05, "gamma": 0.9},
    "sampa": {"rho": 0.1, "lmbda": 0.2},
    "vasso": {"rho": 0.1, "theta": 0.4},
}
DEFAULT_STEPS = 40  # steps per timed block: see the module docstring
ACTIVE_EPOCH = 6  # > e_start=5: SAF/MESA compute their loss (and MESA runs its teacher)
SAF_SAMPLES = 50_000


@dataclass
class ModelSpec:
    name: str
    timm_name: str
    kwargs: dict
    img: int
    batch: int
    num_classes: int = 1000
    channels_last: bool = False
    cifar_stem: bool = False  # ResNet: 3x3 stride-1 stem, no max-pool (as trainables.models builds it)


FULL = {
    "vit_s16": ModelSpec("vit_s16", "vit_small_patch16_224", {}, 224, 128),
    "mixer_b16": ModelSpec("mixer_b16", "mixer_b16_224", {}, 224, 128),
    "resnet50": ModelSpec("resnet50", "resnet50", {}, 224, 128, channels_last=True),
    "vit_s4_32": ModelSpec("vit_s4_32", "vit_small_patch16_224", {"img_size": 32, "patch_size": 4}, 32, 512, 10),
    # Issue 21's CIFAR shapes: batch 256 at 32x32, where the eager step is launch-bound.
    "vit_s4_b256": ModelSpec("vit_s4_b256", "vit_small_patch16_224", {"img_size": 32, "patch_size": 4}, 32, 256, 10),
    "mixer_s4_b256": ModelSpec(
        "mixer_s4_b256", "MlpMixer", {"img_size": 32, "patch_size": 4, "num_blocks": 8, "embed_dim": 512}, 32, 256, 10
    ),
    "resnet18_cifar_b256": ModelSpec(
        "resnet18_cifar_b256", "resnet18", {}, 32, 256, 10, channels_last=True, cifar_stem=True
    ),
}
QUICK = {
    "vit_tiny": ModelSpec(
        "vit_tiny",
        "vit_small_patch16_224",
        {"img_size": 16, "patch_size": 8, "depth": 1, "embed_dim": 32, "num_heads": 2},
        16,
        8,
        10,
    ),
    # timm's mixer_* entry points fix num_blocks/embed_dim, so the tiny one is built from the class.
    "mixer_tiny": ModelSpec(
        "mixer_tiny", "MlpMixer", {"img_size": 32, "patch_size": 16, "num_blocks": 1, "embed_dim": 32}, 32, 8, 10
    ),
    "resnet_tiny": ModelSpec("resnet_tiny", "resnet18", {"channels": (16, 32, 64, 128), "stem_width": 16}, 32, 8, 10),
}


@dataclass
class Variant:
    label: str
    step: callable
    base_ratio_to: str = "none"
    extra_bytes: int = 0
    measured_bytes: int | None = None
    rates: list = field(default_factory=list)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _allocated(device):
    if device.type != "cuda":
        return None
    _sync(device)
    return torch.cuda.memory_allocated(device)


def _fused_adamw(params, device):
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.05, fused=True)


def _suffix(mode):
    # reduce-overhead keeps the name earlier tables used.
    return "@compiled" if mode == "reduce-overhead" else f"@{mode}"


def build_variants(spec, model, device, methods, autocast, compiled=(), probes=None, compiled_only=False):
    """The timed variants of one model, plus each method compiled in each torch.compile mode of ``compiled``; with
    ``probes`` (a dict) and ``compiled``, also fills it with the first mode's compiled step's parts, untimed, for --profile: the compiled forward+backward alone, and it plus a bare fused-AdamW step
    (what optim's ``none`` adds beyond that is the method's own host work)."""
    x = torch.randn(spec.batch, 3, spec.img, spec.img, device=device)
    if spec.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, spec.num_classes, (spec.batch,), device=device)
    idx = torch.randint(0, SAF_SAMPLES, (spec.batch,), device=device)

    def forward_of(net):
        def forward(rows=None, reduction="mean"):
            xs, ys = (x, y) if rows is None else (x[rows], y[rows])
            with autocast():
                logits = net(xs)
            return F.cross_entropy(logits.float(), ys, reduction=reduction), logits

        return forward

    forward = forward_of(model)

    # Library workspaces (cuBLAS, cuDNN) are allocated on the first passes and counted by
    # memory_allocated: create them before measuring, so the first variant is not charged for them.
    for _ in range(2):
        forward()[0].backward()
        model.zero_grad(set_to_none=True)
    variants = {}
    # --compiled-only: the methods are timed compiled alone, each against the compiled fused-AdamW step (the
    # issue-34 targets are compiled against compiled); the eager plain step stays to show what compiling buys.
    runs = [(name, model, forward, name) for name in (["none"] if compiled_only else methods)]
    plans = {}
    for mode in compiled or ():
        from trainables.compiled import CompilePlan, compile_module

        plan = CompilePlan(mode, f"bench_optim --compile-modes {mode}")
        net = compile_module(model, plan)
        suffix = _suffix(mode)
        plans[suffix] = plan
        runs += [(name, net, forward_of(net), f"{name}{suffix}") for name in methods]
        if probes is not None and mode == compiled[0]:
            fwd_c, bare = forward_of(net), _fused_adamw(model.parameters(), device)

            def fwd_bwd():
                bare.zero_grad(set_to_none=True)
                fwd_c()[0].backward()
                bare.zero_grad(set_to_none=True)

            def fwd_bwd_adamw():
                bare.zero_grad(set_to_none=True)
                fwd_c()[0].backward()
                bare.step()
                bare.zero_grad(set_to_none=True)

            probes["fwd+bwd@compiled"] = Variant("fwd+bwd@compiled", fwd_bwd)
            probes["fwd+bwd+adamw@compiled"] = Variant("fwd+bwd+adamw@compiled", fwd_bwd_adamw)
    for name, net, forward, key in runs:
        before = _allocated(device)
        base = _fused_adamw(model.parameters(), device)
        registered, kinds = STEP_KINDS.get(name, (name, {}))
        method = optim.create(
            registered,
            base,
            model=net,
            num_samples=SAF_SAMPLES,
            num_classes=spec.num_classes,
            **kinds,
            **METHOD_HPARAMS.get(registered, {}),  # a method not listed runs at its registry defaults
        )
        if key != name:
            method.compile_modules(lambda module, p=plans[key[len(name) :]]: compile_module(module, p))
        epoch = ACTIVE_EPOCH if name in ("saf", "mesa") else 0
        if name == "saf":
            # The active step reads the logits of epoch ACTIVE_EPOCH - e_tilde, which must have been recorded
            # (SAF refuses to read an epoch that recorded nothing): record them once, outside the timing.
            reg = method.regulariser
            with torch.no_grad():
                reg.record(forward()[1], idx, ACTIVE_EPOCH - reg.e_tilde)
        v = Variant(
            key,
            lambda m=method, e=epoch, f=forward: m.train_step(f, inputs=x, indices=idx, epoch=e),
            base_ratio_to=(
                f"none{key[len(name) :]}"
                if compiled_only and key != name and name != "none"
                else name
                if key != name
                else "mesa_floor"
                if name == "mesa"
                else "none"
            ),
        )
        t0 = time.perf_counter()
        v.step()  # allocate optimizer state, saved w, buffers; a compiled variant's first step compiles
        if key != name:
            _sync(device)
            print(f"# {spec.name}/{key}: first step (compiling) {time.perf_counter() - t0:.1f} s", flush=True)
        after = _allocated(device)
        v.extra_bytes = method.extra_state_bytes()
        v.measured_bytes = (
            None if before is None else after - before
        )  # base state + method state; 'none' subtracted later
        variants[key] = v

    forward = forward_of(model)
    if "mesa" in methods:
        teacher = copy.deepcopy(model).eval().requires_grad_(False)
        base = _fused_adamw(model.parameters(), device)

        def floor_step():
            base.zero_grad(set_to_none=True)
            loss, _ = forward()
            with torch.no_grad(), autocast():
                teacher(x)
            loss.backward()
            base.step()

        variants["mesa_floor"] = Variant("mesa_floor", floor_step, base_ratio_to="none")

    try:
        from pytorch_optimizer import SAM as PeerSAM
        from pytorch_optimizer import disable_running_stats, enable_running_stats
    except Exception:  # noqa: BLE001 - not installed, or incompatible with this torch: skip the peer row
        PeerSAM = None
    if PeerSAM is not None and "sam" in methods:
        peer = PeerSAM(model.parameters(), torch.optim.AdamW, rho=0.05, lr=1e-4, weight_decay=0.05, fused=True)

        def peer_step():
            enable_running_stats(model)
            loss, _ = forward()
            loss.backward()
            peer.first_step(zero_grad=True)
            disable_running_stats(model)
            forward()[0].backward()
            peer.second_step(zero_grad=True)
            enable_running_stats(model)

        variants["peer_sam"] = Variant("peer_sam (pytorch_optimizer)", peer_step)
    return variants


def probe(key, v, device, steps, top=6):
    """Where one variant's step time goes: wall, host issue and GPU kernel ms per step, syncs per step, and (compiled
    variants) the heaviest kernels. Printed, not tabled: a diagnosis, not a claim of speed."""
    gc.collect()
    gc.disable()
    try:
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            v.step()
        t1 = time.perf_counter()  # the host has issued every step; the GPU may still be working
        _sync(device)
        t2 = time.perf_counter()
    finally:
        gc.enable()
    wall, host = (t2 - t0) / steps * 1e3, (t1 - t0) / steps * 1e3
    if device.type != "cuda":  # the CPU waits for every kernel: only the wall and host times mean anything
        print(f"# profile {key}: wall {wall:.3f} ms/step, host issue {host:.3f} ms/step (CPU)", flush=True)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            v.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]
    from torch.profiler import ProfilerActivity, profile

    n = 3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            v.step()
        _sync(device)
    avgs = [a for a in prof.key_averages() if getattr(a, "self_device_time_total", 0) > 0]
    gpu = sum(a.self_device_time_total for a in avgs) / n / 1e3
    print(
        f"# profile {key}: wall {wall:.3f} ms/step, host issue {host:.3f} ms/step ({host / wall:.2f} of wall), "
        f"GPU kernels {gpu:.3f} ms/step ({gpu / wall:.2f} of wall), syncs in one step: {len(syncs)}"
        + (f" at {', '.join(sorted(set(syncs)))}" if syncs else ""),
        flush=True,
    )
    if "@" in key:
        for a in sorted(avgs, key=lambda a: -a.self_device_time_total)[:top]:
            print(
                f"#   {a.self_device_time_total / n / 1e3:7.3f} ms/step  x{a.count // n:<4d} {a.key[:110]}", flush=True
            )


def bench_model(
    spec, device, methods, steps, repeats, warmup, autocast, compiled=(), profiled=False, compiled_only=False
):
    torch.manual_seed(0)
    if spec.timm_name == "MlpMixer":
        model = timm.models.MlpMixer(num_classes=spec.num_classes, **spec.kwargs).to(device)
    else:
        model = timm.create_model(spec.timm_name, pretrained=False, num_classes=spec.num_classes, **spec.kwargs).to(
            device
        )
    if spec.cifar_stem:
        model.conv1 = torch.nn.Conv2d(3, model.conv1.out_channels, 3, stride=1, padding=1, bias=False).to(device)
        model.maxpool = torch.nn.Identity()
    if spec.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    numel = sum(p.numel() for p in model.parameters())
    probes = {} if profiled else None
    variants = build_variants(spec, model, device, methods, autocast, compiled, probes, compiled_only)
    for v in variants.values():
        for _ in range(warmup):
            v.step()
    _sync(device)

    def timed(v):
        # The collector's pauses land on whichever variant is running: collect before, not during.
        gc.collect()
        gc.disable()
        try:
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                v.step()
            _sync(device)
            return time.perf_counter() - t0
        finally:
            gc.enable()

    # Each variant is timed between two blocks of its reference (the fused-AdamW step, or MESA's
    # floor) and its ratio is taken against their mean: drift within a round cancels. The variant
    # order rotates from round to round.
    others = [k for k in variants if k != "none"]
    ratios = {k: [] for k in variants}
    for r in range(repeats):
        rot = others[r % len(others) :] + others[: r % len(others)] if others else []
        ref_time = timed(variants["none"])
        variants["none"].rates.append(steps * spec.batch / ref_time)
        ratios["none"].append(1.0)
        for k in rot:
            v = variants[k]
            ref = variants[v.base_ratio_to] if v.base_ratio_to in variants else variants["none"]
            before = ref_time if ref is variants["none"] else timed(ref)
            t = timed(v)
            after = timed(ref)
            if ref is variants["none"]:
                ref_time = after
            v.rates.append(steps * spec.batch / t)
            ratios[k].append(0.5 * (before + after) / t)
    if profiled:
        for k, v in {**variants, **probes}.items():
            for _ in range(warmup):  # a probe's first calls record its CUDA graphs
                v.step()
            probe(f"{spec.name}/{k}", v, device, steps)
    # Peak memory of one step per variant (after the timed rounds).
    peaks = {}
    if device.type == "cuda":
        for k, v in variants.items():
            _sync(device)
            torch.cuda.reset_peak_memory_stats(device)
            start = torch.cuda.memory_allocated(device)
            v.step()
            _sync(device)
            peaks[k] = torch.cuda.max_memory_allocated(device) - start
    none_bytes = variants["none"].measured_bytes if "none" in variants else None
    rows = []
    for k, v in variants.items():
        measured = None
        if v.measured_bytes is not None and none_bytes is not None and k in methods:
            measured = (v.measured_bytes - none_bytes) / numel
        target = _target(k, compiled_only)
        ratio = statistics.median(ratios[k])
        rows.append(
            {
                "model": spec.name,
                "variant": v.label,
                "img_s": statistics.median(v.rates),
                "ratio": ratio,
                "spread": (min(ratios[k]), max(ratios[k])),
                "ratio_to": v.base_ratio_to if k != "none" else "-",
                "target": target,
                # The targets are for the H100; on the CPU (--quick) the table is a smoke check only.
                "ok": None if target is None or device.type != "cuda" else ratio >= target,
                "pred_bpp": v.extra_bytes / numel if k in methods else None,
                "meas_bpp": measured,
                "peak_step_mib": peaks.get(k, 0) / 2**20 if peaks else None,
            }
        )
    del variants, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows, numel


def _fmt(v, spec):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    return format(v, spec)


def _target(key, compiled_only):
    """A variant's target: a method's own, or, for a compiled one against its eager self, COMPILED_TARGET."""
    name = key.split("@", 1)[0]
    if "@" not in key:
        return TARGETS.get(key)
    return TARGETS.get(name) if compiled_only and name != "none" else COMPILED_TARGET


def record(rows, steps, repeats):
    """Each variant's ratio as a row of the `optim` question (benchmarks/results/optim.csv)."""
    from benchmarks import results

    out = []
    for r in rows:
        if r["ratio_to"] == "-":
            continue
        lo, hi = r["spread"]
        target = "" if r["target"] is None else f"; target >= {r['target']}"
        out.append(
            {
                "figure": f"{r['model']} {r['variant']} / {r['ratio_to']}",
                "value": f"{r['ratio']:.3f}",
                "unit": "x",
                "note": f"rounds {lo:.3f}-{hi:.3f}, {steps} steps x {repeats}, {r['img_s']:.0f} img/s{target}",
            }
        )
    return results.append("optim", out)


def table(rows, numels):
    head = [
        "model",
        "params",
        "variant",
        "img/s",
        "ratio",
        "rounds min-max",
        "vs",
        "target",
        "met",
        "extra B/param (pred)",
        "extra B/param (meas)",
        "step peak MiB",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(
            "| "
            + " | ".join(
                [
                    r["model"],
                    f"{numels[r['model']] / 1e6:.1f}M",
                    r["variant"],
                    _fmt(r["img_s"], ".1f"),
                    _fmt(r["ratio"], ".3f"),
                    f"{_fmt(r['spread'][0], '.3f')}-{_fmt(r['spread'][1], '.3f')}",
                    r["ratio_to"],
                    _fmt(r["target"], ".3f"),
                    _fmt(r["ok"], ""),
                    _fmt(r["pred_bpp"], ".2f"),
                    _fmt(r["meas_bpp"], ".2f"),
                    _fmt(r["peak_step_mib"], ".0f"),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny models on CPU, a smoke check in < 1 min")
    ap.add_argument(
        "--models", default=None, help="comma list of " + ", ".join(FULL) + " (quick: " + ", ".join(QUICK) + ")"
    )
    ap.add_argument(
        "--methods",
        default=",".join(optim.method_names()),
        help="comma list of registry names, or the scope/schedule variants of STEP_KINDS",
    )
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"steps per timed block (default {DEFAULT_STEPS}, which resolves a ratio to ~0.005; quick 2)",
    )
    ap.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 7; quick 2)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps per variant (default 3; quick 1)")
    ap.add_argument("--markdown", default=None, help="also write the table to this Markdown file")
    ap.add_argument(
        "--compile",
        action="store_true",
        help="also time each method with the model compiled (CUDA graphs on CUDA): <method>@compiled, ratio to eager",
    )
    ap.add_argument(
        "--compile-modes",
        default="reduce-overhead",
        help="with --compile, comma list of torch.compile modes timed side by side (reduce-overhead is "
        "<method>@compiled, another mode <method>@<mode>), e.g. reduce-overhead,max-autotune",
    )
    ap.add_argument(
        "--compiled-only",
        action="store_true",
        help="with --compile, time each method compiled only, its ratio to the compiled fused-AdamW step (the "
        "eager plain step stays, to show what compiling buys); targets as for eager",
    )
    ap.add_argument(
        "--record",
        action="store_true",
        help="also append every ratio as a row of benchmarks/results/optim.csv (docs/update_benchmarks.py)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also print where each variant's step time goes (wall, host issue and GPU kernel ms per step, host syncs, "
        "the compiled variants' heaviest kernels; on CPU the wall and host times only)",
    )
    args = ap.parse_args(argv)

    specs = QUICK if args.quick else FULL
    device = torch.device("cpu" if args.quick else args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but CUDA is not available (use --quick for a CPU smoke check)")
    steps = args.steps or (2 if args.quick else DEFAULT_STEPS)
    repeats = args.repeats or (2 if args.quick else 7)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    names = list(specs) if args.models is None else args.models.split(",")
    unknown = [m for m in names if m not in specs]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {list(specs)}")
    methods = args.methods.split(",")
    bad = [m for m in methods if m not in optim.METHODS and m not in STEP_KINDS]
    if bad:
        ap.error(f"unknown method(s) {bad}; choose from {list(optim.METHODS) + list(STEP_KINDS)}")
    if "none" not in methods:
        methods = ["none"] + methods  # the reference
    from trainables.compiled import COMPILE_MODES

    modes = args.compile_modes.split(",") if args.compile else []
    if args.compiled_only and not modes:
        ap.error("--compiled-only needs --compile (it times the compiled steps alone)")
    if any(m not in COMPILE_MODES for m in modes):
        ap.error(f"unknown --compile-modes {[m for m in modes if m not in COMPILE_MODES]}; choose from {COMPILE_MODES}")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    torch.set_float32_matmul_precision("high")
    if args.quick:
        torch.set_num_threads(1)  # a smoke check on shared cores: avoid oversubscription

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16)

    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"# bench_optim: torch {torch.__version__}, timm {timm.__version__}, device {dev_name}, bf16 autocast, "
        f"steps {steps} x repeats {repeats} (warmup {warmup}), SAF buffer for {SAF_SAMPLES} samples",
        flush=True,
    )
    rows, numels = [], {}
    for name in names:
        t0 = time.perf_counter()
        r, numel = bench_model(
            specs[name], device, methods, steps, repeats, warmup, autocast, modes, args.profile, args.compiled_only
        )
        rows += r
        numels[name] = numel
        print(f"# {name}: {time.perf_counter() - t0:.1f}s", flush=True)
        print(table(r, numels), flush=True)
    out = table(rows, numels)
    print("\n" + out)
    if args.markdown:
        header = (
            f"# optim benchmark\n\ntorch {torch.__version__}, timm {timm.__version__}, device {dev_name}, "
            f"bf16 autocast, steps {steps} x repeats {repeats}. Ratio: images/s over the fused-AdamW step "
            "(MESA: over its floor, a plain step plus one no-grad forward), median of per-round ratios. "
            "Extra B/param: method state beyond the base optimizer, predicted (extra_state_bytes) and "
            "measured (torch.cuda.memory_allocated after the first step, minus the plain step's).\n\n"
        )
        Path(args.markdown).write_text(header + out + "\n")
    if args.record:
        print(f"# appended to {record(rows, steps, repeats)}")
    missed = [r for r in rows if r["ok"] is False]
    if missed and device.type == "cuda":
        print(
            "# targets missed: "
            + ", ".join(f"{r['model']}/{r['variant']} {r['ratio']:.3f} < {r['target']}" for r in missed)
        )
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
