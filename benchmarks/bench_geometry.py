"""Benchmark: milliseconds of one Hessian-vector product against one gradient, per hvp_mode of analysis.geometry.

    python -m benchmarks.bench_geometry --device cuda           # ViT-S/16, Mixer-B/16, ResNet-50, batch 64 fp32
    python -m benchmarks.bench_geometry --quick --device cpu    # tiny models, a smoke run of a few seconds

Needs only torch, timm and analysis.geometry. Random images and labels; the model in eval mode (as the
metrics default). "grad" is loss forward + backward with the model as timm builds it (fused attention on,
as in training). Per mode: "setup" is the first product (for double_backward it builds and keeps the
gradient graph), "hvp" the steady cost of each later product on the same batch, as power iteration and
Lanczos pay it; "double_backward/no-cache" rebuilds the graph every product. finite_difference (one gradient per
product; its setup adds the clean gradient, kept) and finite_difference_central (two) approximate the product:
their "rel diff" against double_backward's product is their error on a random vector. Both are refused for a
model whose loss has kinks in the weights (ReLU, max pooling: the ResNets), and print "refused" with the reason.

Whole measurements, timed end to end in units of one gradient ("x grad"; issue 16's targets on an H100 for
ViT-S/16 at batch 64: within 25 and 350): "lanczos_lambda_max(20)" is top_eigenvalues with 20 Lanczos steps
(hvp_mode auto), "slq(10x30)" eigenvalue_density with 10 probes of 30 steps. --no-solvers skips them.
Each is timed again with hvp_mode finite_difference ("/fd" rows); their "rel diff" is |fd - exact| / |exact| of
lambda_max (for SLQ, of its largest node, with the relative differences of its trace and second-moment estimates,
the bulk of the density, in brackets) on the same batch, same start vector and probes: the accuracy cost. The
"solver only" rows time Lanczos and SLQ with a free operator (a copy): their own reorthogonalisation, tridiagonal
eigensolves and host syncs, which the whole measurements pay on top of the products.

    python -m benchmarks.bench_geometry --device cuda --models vit_small_patch16_224   # the issue's case
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable

import timm
import torch
import torch.nn.functional as F
from timm.models.mlp_mixer import MlpMixer

# name -> (timm factory name, its keyword arguments, image side)
FULL_MODELS = {
    "vit_small_patch16_224": ("vit_small_patch16_224", {}, 224),
    "mixer_b16_224": ("mixer_b16_224", {}, 224),
    "resnet50": ("resnet50", {}, 224),
}
# timm's mixer_* factories fix depth and width, so the tiny Mixer comes from its class.
QUICK_MODELS = {
    "vit_tiny(32px,p4,d2)": ("vit_tiny_patch16_224", {"img_size": 32, "patch_size": 4, "depth": 2}, 32),
    "mixer(32px,p4,d2,w64)": (MlpMixer, {"img_size": 32, "patch_size": 4, "num_blocks": 2, "embed_dim": 64}, 32),
    "resnet18(16-128ch,1111)": (
        "resnet18",
        {"layers": (1, 1, 1, 1), "channels": (16, 32, 64, 128), "stem_width": 16},
        32,
    ),
}
VARIANTS = (
    ("double_backward", True),
    ("double_backward", False),
    ("forward_over_reverse", True),
    ("finite_difference", True),
    ("finite_difference_central", True),
)


def _load_geometry() -> types.ModuleType:
    try:
        from analysis import geometry

        return geometry
    except ImportError as error:
        # analysis/__init__ also imports the run-table helpers (pandas); a GPU box with only torch and
        # timm can still load geometry and its private helper straight from their files.
        folder = Path(__file__).resolve().parent.parent / "analysis"
        if not (folder / "geometry" / "__init__.py").exists():
            raise SystemExit(f"cannot import analysis.geometry ({error}); run from the repository") from error
        # A bare `analysis` package (its __init__ skipped): analysis.geometry then imports as usual.
        package = types.ModuleType("analysis")
        package.__path__ = [str(folder)]
        sys.modules["analysis"] = package
        importlib.import_module("analysis.geometry")
        return sys.modules["analysis.geometry"]


def _cross_entropy(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _ms(fn: Callable[[], Any], device: torch.device, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / reps * 1e3


def _peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def bench_model(geometry: types.ModuleType, name: str, spec: tuple, args: argparse.Namespace) -> list[dict]:
    device = torch.device(args.device)
    factory, kwargs, side = spec
    if isinstance(factory, str):
        model = timm.create_model(factory, pretrained=False, **kwargs)
    else:
        model = factory(**kwargs)
    model = model.to(device).eval()
    generator = torch.Generator(device=device).manual_seed(0)
    images = torch.randn(args.batch, 3, side, side, device=device, generator=generator)
    labels = torch.randint(0, model.num_classes, (args.batch,), device=device, generator=generator)
    batch = (images, labels)
    params = [p for p in model.parameters() if p.requires_grad]
    num_params = sum(p.numel() for p in params)

    _peak_reset(device)
    grad_ms = _ms(lambda: torch.autograd.grad(_cross_entropy(model, batch), params), device, args.warmup, args.reps)
    rows = [{"model": name, "variant": "grad", "params": num_params, "ms": grad_ms, "peak_gib": _peak_gib(device)}]
    vector = torch.randn(num_params, device=device, generator=generator)
    reference = None
    for hvp_mode, cache in VARIANTS:
        _peak_reset(device)
        label = hvp_mode if cache or hvp_mode != "double_backward" else f"{hvp_mode}/no-cache"
        try:
            with geometry.hessian_operator(model, _cross_entropy, [batch], hvp_mode=hvp_mode, cache_graphs=cache) as op:
                _sync(device)
                start = time.perf_counter()
                product = op(vector)
                _sync(device)
                setup_ms = (time.perf_counter() - start) * 1e3
                hvp_ms = _ms(lambda: op(vector), device, args.warmup, args.reps)
        except ValueError as error:  # finite differences refuse a model with kinks (ReLU, max pooling)
            rows.append(_refused(name, label, num_params, error))
            continue
        # The modes must agree on the product itself, or their timings compare nothing.
        reference = product if reference is None else reference
        mismatch = float((product - reference).norm() / reference.norm())
        rows.append(
            {
                "model": name,
                "variant": label,
                "params": num_params,
                "setup_ms": setup_ms,
                "ms": hvp_ms,
                "ratio": hvp_ms / grad_ms,
                "rel_diff": mismatch,
                "peak_gib": _peak_gib(device),
            }
        )
    if args.solvers:
        rows.extend(_bench_solvers(geometry, model, name, batch, num_params, grad_ms, args))
    return rows  # the model, batch and graphs go with this frame; the caller resets the peak after it


def _bench_solvers(geometry, model, name, batch, num_params, grad_ms, args) -> list[dict]:
    """Whole measurements end to end (operator setup included), in units of one gradient."""
    device = torch.device(args.device)
    # tol=1e-12: no early stop, so the Lanczos run always takes its 20 steps.
    measures = {
        f"lanczos_lambda_max({args.lanczos_steps})": lambda hvp_mode: geometry.top_eigenvalues(
            model, _cross_entropy, [batch], max_iter=args.lanczos_steps, tol=1e-12, hvp_mode=hvp_mode
        ),
        f"slq({args.slq_probes}x{args.slq_steps})": lambda hvp_mode: geometry.eigenvalue_density(
            model, _cross_entropy, [batch], probes=args.slq_probes, steps=args.slq_steps, hvp_mode=hvp_mode
        ),
    }
    rows = []
    for label, run in measures.items():
        exact = None
        for hvp_mode, suffix in (("auto", ""), ("finite_difference", "/fd")):
            _peak_reset(device)
            try:
                run(hvp_mode)  # warm-up: kernels, allocator
            except ValueError as error:  # finite differences refuse a model with kinks (ReLU, max pooling)
                rows.append(_refused(name, label + suffix, num_params, error))
                continue
            _sync(device)
            start = time.perf_counter()
            result = run(hvp_mode)
            _sync(device)
            ms = (time.perf_counter() - start) * 1e3
            top = result.eigenvalues[0] if hasattr(result, "eigenvalues") else float(result.nodes.max())
            row = {
                "model": name,
                "variant": label + suffix,
                "params": num_params,
                "ms": ms,
                "ratio": ms / grad_ms,
                "hvps": getattr(result, "hvp_count", None),
                "peak_gib": _peak_gib(device),
                "top": top,
            }
            if hasattr(result, "moment"):
                row["moments"] = [result.moment(1), result.moment(2)]
            if exact is None:
                exact = row
            else:
                row["rel_diff"] = abs(top - exact["top"]) / abs(exact["top"])
                if "moments" in row:
                    # The bulk of the density: the trace and second-moment estimates, same probes.
                    row["moment_diffs"] = [abs(a - b) / abs(b) for a, b in zip(row["moments"], exact["moments"])]
            rows.append(row)
    rows.extend(_bench_solver_overhead(geometry, name, num_params, grad_ms, args))
    return rows


def _refused(name: str, variant: str, num_params: int, error: ValueError) -> dict:
    found = re.search(r"applies (\S+) to", str(error))
    reason = f"its loss applies {found.group(1)} to the weights' tensors (a kink)" if found else str(error)
    return {"model": name, "variant": variant, "params": num_params, "refused": reason}


def _bench_solver_overhead(geometry, name, num_params, grad_ms, args) -> list[dict]:
    """The solvers' own cost (reorthogonalisation, tridiagonal eigensolves, host syncs) with a free operator."""
    from analysis.geometry._hvp import lanczos, slq  # private solvers: pinned by tests/analysis/test_geometry.py

    device = torch.device(args.device)

    def free(vector: torch.Tensor) -> torch.Tensor:
        return vector.clone()  # a product that costs one copy

    def generator() -> torch.Generator:
        return torch.Generator(device=device).manual_seed(0)

    solvers = {
        f"lanczos({args.lanczos_steps}) solver only": lambda: lanczos(
            free,
            num_params,
            k=1,
            sign=1.0,
            max_iter=args.lanczos_steps,
            tol=1e-12,
            generator=generator(),
            dtype=torch.float32,
            device=device,
        ),
        f"slq({args.slq_probes}x{args.slq_steps}) solver only": lambda: slq(
            free,
            num_params,
            probes=args.slq_probes,
            steps=args.slq_steps,
            generator=generator(),
            dtype=torch.float32,
            device=device,
        ),
    }
    rows = []
    for label, run in solvers.items():
        _peak_reset(device)
        run()
        _sync(device)
        start = time.perf_counter()
        run()
        _sync(device)
        ms = (time.perf_counter() - start) * 1e3
        rows.append(
            {
                "model": name,
                "variant": label,
                "params": num_params,
                "ms": ms,
                "ratio": ms / grad_ms,
                "peak_gib": _peak_gib(device),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny models and batch 8: a CPU smoke run")
    parser.add_argument("--batch", type=int, default=None, help="batch size (64, or 8 with --quick)")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (20, or 3 with --quick)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed repetitions first (5, or 1 with --quick)")
    parser.add_argument(
        "--models", nargs="*", default=None, help="timm model names at 224px (default: the three of the issue)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    parser.add_argument(
        "--no-solvers",
        dest="solvers",
        action="store_false",
        help="skip the whole-measurement timings (Lanczos lambda_max, SLQ density)",
    )
    parser.add_argument("--lanczos-steps", type=int, default=20, help="Lanczos steps of the lambda_max timing (20)")
    parser.add_argument("--slq-probes", type=int, default=10, help="SLQ probes (10)")
    parser.add_argument("--slq-steps", type=int, default=30, help="SLQ Lanczos steps per probe (30)")
    args = parser.parse_args()
    args.batch = args.batch or (8 if args.quick else 64)
    args.reps = args.reps or (3 if args.quick else 20)
    args.warmup = args.warmup or (1 if args.quick else 5)
    catalogue = QUICK_MODELS if args.quick else FULL_MODELS
    models = {m: catalogue.get(m, (m, {}, 224)) for m in args.models} if args.models else catalogue

    geometry = _load_geometry()
    device = torch.device(args.device)
    if args.quick and device.type == "cpu":
        torch.set_num_threads(1)  # a smoke run on a shared machine: one thread contends least
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print(
        f"device {card} | torch {torch.__version__} | timm {timm.__version__} | batch {args.batch} fp32 | "
        f"tf32 matmul {torch.backends.cuda.matmul.allow_tf32} cudnn {torch.backends.cudnn.allow_tf32} | "
        f"warmup {args.warmup} reps {args.reps}"
    )
    rows = []
    for name, spec in models.items():
        rows.extend(bench_model(geometry, name, spec, args))
        _peak_reset(device)

    header = f"{'model':<24} {'variant':<32} {'setup ms':>9} {'ms':>9} {'x grad':>7} {'peak GiB':>9} {'rel diff':>9}"
    print(header)
    print("-" * len(header))
    for row in rows:
        if "refused" in row:
            print(f"{row['model']:<24} {row['variant']:<32} refused: {row['refused']}")
            continue
        setup = f"{row['setup_ms']:9.1f}" if "setup_ms" in row else " " * 9
        ratio = f"{row['ratio']:7.2f}" if "ratio" in row else " " * 7
        diff = f"{row['rel_diff']:9.1e}" if "rel_diff" in row else ""
        if "moment_diffs" in row:
            diff += "  (trace {:.1e}, 2nd moment {:.1e})".format(*row["moment_diffs"])
        print(f"{row['model']:<24} {row['variant']:<32} {setup} {row['ms']:9.1f} {ratio} {row['peak_gib']:9.2f} {diff}")
    if args.json:
        args.json.write_text(json.dumps({"device": card, "batch": args.batch, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
