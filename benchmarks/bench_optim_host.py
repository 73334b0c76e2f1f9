"""The host's share of each method's step, measured on CPU: ResNet-18's and ViT-S/4's parameter lists at tiny widths.

    python -m benchmarks.bench_optim_host                         # every method bench_optim times compiled
    python -m benchmarks.bench_optim_host --methods msam,looksam --record --label after
    python -m benchmarks.bench_optim_host --methods rwp,bsam --against 39955a2   # each also as its module was there

At CIFAR shapes the compiled step on a GPU is bound by the host (docs/benchmarks.md, "Compiled steps at CIFAR
shapes"): the forward and backward are one CUDA graph each, and what is left is the method's eager optimizer-side
code, whose cost is per tensor and per launched op, not per element. This proxy keeps exactly that: the models have
the real ones' parameter lists (the same tensors in the same order, the same BatchNorm / LayerNorm modules, so the BN
guard and ``scope`` act as on the real model) at widths of a few units and a batch of 4, so the arithmetic is free
and what is timed is the Python and dispatch work per step. Per method it reports, against the plain fused-AdamW
step (``none``) run interleaved in the same process:

- ``opt ms``: the step's CPU time on this thread (``time.thread_time``: steady on a shared, loaded host; torch runs
  on one thread here) less the time inside the model's forward and backward (``torch.autograd.backward``
  is timed by a wrapper installed for the run), i.e. the host's optimizer-side time per step;
- ``opt ops``: the aten ops dispatched per step outside the forward and the backward (a ``TorchDispatchMode``; ops
  run by an autograd node are the backward's), what a host-bound GPU pays one launch each for.

``--against REV`` times each method a second time, as ``NAME@REV``, built by its module as it was at git revision
``REV`` (the module alone: the rest of ``optim`` is the working tree's), interleaved with today's in the same rounds:
a before/after of a rewrite of one method's module, side by side in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import timm
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import optim

from .bench_optim import METHOD_HPARAMS, STEP_KINDS

QUESTION = "optim_host"
METHODS = "sam,wsam,sam+gc,vasso,sampa,sam+p0.5,sam+every8,sam+norm,esam,msam,looksam"


def _resnet18_cifar() -> torch.nn.Module:
    # The plain stem is 64 wide whatever stem_width says: layer1 stays 64 wide so that it has no downsample, as in
    # the real model (62 tensors); its four 64x64 convs are small enough at 8x8.
    model = timm.create_model("resnet18", pretrained=False, num_classes=10, channels=(64, 2, 2, 2))
    model.conv1 = torch.nn.Conv2d(3, model.conv1.out_channels, 3, stride=1, padding=1, bias=False)
    model.maxpool = torch.nn.Identity()
    return model


def _vit_s4() -> torch.nn.Module:
    # ViT-S/4's 12 blocks and every tensor of them; 6 heads of width 1.
    return timm.create_model(
        "vit_small_patch16_224", pretrained=False, num_classes=10, img_size=8, patch_size=4, embed_dim=6, num_heads=6
    )


MODELS = {"resnet18_cifar_b256": (_resnet18_cifar, 8), "vit_s4_b256": (_vit_s4, 8)}


class _Clock:
    """Seconds spent inside the model's forward and backward, added up while installed."""

    def __init__(self):
        self.model_s = 0.0
        self._backward = torch.autograd.backward

    @contextlib.contextmanager
    def installed(self):
        original = self._backward

        def timed_backward(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.model_s += time.thread_time() - t0

        torch.autograd.backward = timed_backward
        try:
            yield self
        finally:
            torch.autograd.backward = original


class _OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched outside the model's forward (``in_forward``) and backward (an autograd node)."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.in_forward = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.in_forward and torch._C._current_autograd_node() is None:
            self.ops += 1
        return func(*args, **(kwargs or {}))


def _module_at(rev: str, module: str) -> types.ModuleType:
    """Module ``module`` (``optim._rwp``) as its file was at git revision ``rev``, imported beside today's."""
    path = module.replace(".", "/") + ".py"
    source = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).resolve().parents[1]).stdout  # fmt: skip
    old = types.ModuleType(module)
    old.__package__, old.__file__ = module.rpartition(".")[0], f"{rev}:{path}"
    exec(compile(source, old.__file__, "exec"), old.__dict__)
    return old


@contextlib.contextmanager
def _built_from(rev: str | None, registered: str):
    """While open, ``optim.create(registered, ...)`` builds with the method's module as it was at ``rev``."""
    if rev is None:
        yield
        return
    module = importlib.util.resolve_name(optim.METHODS[registered].builder.partition(":")[0], "optim")
    current = sys.modules[module]
    sys.modules[module] = _module_at(rev, module)
    try:
        yield
    finally:
        sys.modules[module] = current


def _variants(model_name: str, methods: list[str], against: str | None = None):
    build, img = MODELS[model_name]
    torch.manual_seed(0)
    model = build().train()
    x = torch.randn(4, 3, img, img)
    y = torch.randint(0, 10, (4,))
    idx = torch.arange(4)
    clock = _Clock()
    counter: list[_OpCounter | None] = [None]

    def forward(rows=None, reduction="mean"):
        t0 = time.thread_time()
        if counter[0] is not None:
            counter[0].in_forward = True
        try:
            xs, ys = (x, y) if rows is None else (x[rows], y[rows])
            logits = model(xs)
            return F.cross_entropy(logits, ys, reduction=reduction), logits
        finally:
            if counter[0] is not None:
                counter[0].in_forward = False
            clock.model_s += time.thread_time() - t0

    steps = {}
    builds = [(name, None) for name in ["none", *methods]]
    builds += [(name, against) for name in methods] if against else []
    for name, rev in builds:
        base = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, fused=True)
        registered, kinds = STEP_KINDS.get(name, (name, {}))
        with _built_from(rev, registered):
            method = optim.create(registered, base, model=model, num_samples=64, num_classes=10, **kinds,
                                  **METHOD_HPARAMS.get(registered, {}))  # fmt: skip
        steps[name if rev is None else f"{name}@{rev}"] = lambda m=method: m.train_step(
            forward, inputs=x, indices=idx, epoch=0
        )
    return steps, clock, counter


def measure(
    model_name: str, methods: list[str], steps: int, repeats: int, against: str | None = None
) -> dict[str, tuple[float, float, float]]:
    """Per variant: (optimizer-side host ms/step, its spread over rounds as max-min, optimizer-side ops/step)."""
    variants, clock, counter = _variants(model_name, methods, against)
    for step in variants.values():
        for _ in range(3):
            step()
    ops = {}
    for name, step in variants.items():
        # Over 40 steps so LookSAM's k and the schedules' periods are averaged over whole cycles.
        counter[0] = _OpCounter()
        with counter[0]:
            for _ in range(40):
                step()
        ops[name] = counter[0].ops / 40
        counter[0] = None
    rounds: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    with clock.installed():
        for r in range(repeats):
            for name in order[r % len(order) :] + order[: r % len(order)]:
                gc.collect()
                gc.disable()
                try:
                    clock.model_s = 0.0
                    t0 = time.thread_time()
                    for _ in range(steps):
                        variants[name]()
                    rounds[name].append((time.thread_time() - t0 - clock.model_s) / steps * 1e3)
                finally:
                    gc.enable()
    return {n: (statistics.median(v), max(v) - min(v), ops[n]) for n, v in rounds.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--methods", default=METHODS)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: the host's work alone)")
    ap.add_argument("--against", default=None, metavar="REV",
                    help="also time each method as its module was at git revision REV, in the same rounds")  # fmt: skip
    ap.add_argument("--record", action="store_true", help=f"append the figures to benchmarks/results/{QUESTION}.csv")
    ap.add_argument("--label", default="", help="a tag for the recorded figures, e.g. 'before' or 'after'")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    methods = [m for m in args.methods.split(",") if m and m != "none"]
    rows = []
    for model_name in args.models.split(","):
        results = measure(model_name, methods, args.steps, args.repeats, args.against)
        print(f"# {model_name}: optimizer-side host ms/step (spread) and aten ops/step, CPU proxy", flush=True)
        for name, (ms, spread, ops) in results.items():
            print(f"{model_name:22s} {name:12s} {ms:7.3f} ms (±{spread / 2:.3f})  {ops:7.1f} ops", flush=True)
            tag = f" [{args.label}]" if args.label else ""
            rows.append({"figure": f"{model_name} {name} host ms/step{tag}", "value": f"{ms:.3f}", "unit": "ms",
                         "note": f"rounds spread {spread:.3f} ms, {args.steps} steps x {args.repeats}"})  # fmt: skip
            rows.append({"figure": f"{model_name} {name} ops/step{tag}", "value": f"{ops:.1f}", "unit": "ops",
                         "note": "aten ops outside the model's forward and backward"})  # fmt: skip
    if args.record:
        from .results import append

        print(f"# recorded in {append(QUESTION, rows)}", file=sys.stderr)


if __name__ == "__main__":
    main()
