"""The compiled training step: which trials compile (resolve_compile), the module every pass runs through
(CompiledModule), its warm-up timed apart from training (warm_up), where the compiled artefacts are cached (a
node-local folder private to the trial's user: use_cache_dir), and what a finished trial's compiles leave in its
process (release)."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from optim import METHODS
from trainables.config import COMPILE_MODES

__all__ = [
    "COMPILE_MODES",
    "COMPILED_METRIC",
    "COMPILE_TIME_METRIC",
    "CACHE_DIR_MODE",
    "CompilePlan",
    "CompiledModule",
    "compile_module",
    "default_cache_dir",
    "resolve_compile",
    "unwrap",
    "CompileFallbackWarning",
    "eval_module",
    "release",
    "use_cache_dir",
    "warm_up",
]

# COMPILE_MODES: trainables.config, its one home (validating a config imports no torch).
_WITHOUT_GRAPHS = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}

# Seconds the compile's warm-up took (logged with the first epoch a process trains); never part of epoch_time_s or
# images_per_sec.
COMPILE_TIME_METRIC = "compile_time_s"
# 1.0 on every epoch whose steps ran compiled, 0.0 on those that ran eager (the trial's log says why).
COMPILED_METRIC = "compiled"


class CompileFallbackWarning(UserWarning):
    """A trial asked to compile (train.compile auto or a mode) runs eager, or compiled with a known difference."""


@dataclass(frozen=True)
class CompilePlan:
    """What a trial's `train.compile` resolved to: the torch.compile mode (or "off") and why."""

    mode: str  # "off" or one of COMPILE_MODES
    reason: str
    #: Said in the trial's log as a CompileFallbackWarning: a setting kept auto from compiling, or an explicit mode
    #: compiles what differs from eager.
    warn: bool = False

    @property
    def enabled(self) -> bool:
        return self.mode != "off"


def _eager_only(cfg) -> list[str]:
    """The trial's settings under which a compiled step would not be the eager step, each with why."""
    out = []
    # A method whose compiled step disagreed with eager beyond float rounding on the GPU check says so in its
    # registry entry (optim/_specs.py compiled_differs); it runs eager under auto.
    spec = METHODS.get(cfg.optimizer.method)
    if spec is not None and spec.compiled_differs:
        out.append(f"optimizer.method={cfg.optimizer.method}: {spec.compiled_differs}")
    # Dropout and drop path are not here: the compiled step draws their masks from torch's generator, as eager does
    # (_INDUCTOR_OPTIONS).
    return out


def _without_graphs(cfg, world: int) -> list[str]:
    """The trial's settings under which the step compiles without CUDA graphs, each with why."""
    out = []
    if cfg.data.accumulate > 1:
        # Measured: a micro-batch's gradients live in the graph's memory and the next micro-batch's replay
        # overwrites them before they are added up (torch raises "accessing tensor output of CUDAGraphs that has
        # been overwritten").
        out.append(
            f"data.accumulate={cfg.data.accumulate}: a CUDA graph's replay would overwrite the previous micro-batch's "
            "gradients"
        )
    if world > 1:
        out.append(f"{world} data-parallel workers: CUDA graphs under DDP are not verified on a GPU here")
    if torch_version() < _GRAPHS_ON_ANY_THREAD and threading.current_thread() is not threading.main_thread():
        # Seen on an H200 with torch 2.11 (docs/benchmarks.md, the CLI run of rho_sensitivity): Ray Tune runs each
        # trial of a reused actor on a new thread, and that torch's CUDA graph trees assert on a thread other than
        # the one that first imported them (their per-thread state); 2.14 sets that state up on any thread, and
        # _graph_trees_here does what 2.14 does for an older torch.
        problem = _graph_trees_here()
        if problem is not None:
            out.append(
                f"torch {torch.__version__} on a thread other than the main one (a trial of a reused Ray actor): its "
                f"CUDA graph trees fail there ({problem}); torch >= {'.'.join(map(str, _GRAPHS_ON_ANY_THREAD))} runs "
                "them"
            )
    return out


# The CUDA graph trees' per-thread state, by its names in torch._inductor.cudagraph_trees' `local` and in torch's C++
# thread-local store: what _graph_trees_here sets up on a thread and _drop_graph_trees_here lets go of.
_GRAPH_TREES_STATE = ("tree_manager_containers", "tree_manager_locks")


def _graph_trees_here() -> str | None:
    """Sets up torch's CUDA graph trees' per-thread state on this thread where it is missing, as torch >= 2.14 does
    itself on any thread (its cudagraph_trees._initialize_tls); None once their `get_obj` finds it here, else why not.

    Privates, since no public call does this: torch._inductor.cudagraph_trees' `local` and `get_obj`, and
    torch._C._is_key_in_tls / _get_obj_in_tls / _stash_obj_in_tls (the copy autograd's threads inherit);
    tests/trainables/test_compiled.py pins them.
    """
    try:
        from collections import defaultdict

        from torch._inductor import cudagraph_trees as trees

        names = _GRAPH_TREES_STATE
        stashed = torch._C._get_obj_in_tls(names[0]) if torch._C._is_key_in_tls(names[0]) else None
        if not hasattr(trees.local, names[0]) and stashed is None:  # None: dropped here (_drop_graph_trees_here)
            trees.local.tree_manager_containers = {}
            trees.local.tree_manager_locks = defaultdict(threading.Lock)
            for name in names:
                torch._C._stash_obj_in_tls(name, getattr(trees.local, name))
        for name in names:
            trees.get_obj(trees.local, name)
    except Exception as err:  # noqa: BLE001 - whatever fails, the trial compiles without CUDA graphs instead
        return f"{type(err).__name__}: {err}"
    return None


# The first torch whose CUDA graph trees set up their per-thread state on any thread (torch 2.14.1 is pinned in
# constraints.txt; 2.11 asserted on the GPU).
_GRAPHS_ON_ANY_THREAD = (2, 14)


def release() -> None:
    """Free what this process's compiles left once its trial has ended, on the trial's own thread, while it lives:
    Dynamo's caches and the thread's CUDA graph trees (torch.compiler.reset), the trees' per-thread state, including
    the copies in torch's C++ thread-local store (_drop_graph_trees_here), then the cycles left behind (gc.collect).

    Why: Tune runs each trial of a reused actor on a new thread, and after a compiled trial the actor's next trial
    died with a segmentation fault in the garbage collector, in its first allocations (docs/benchmarks.md: an H200,
    torch 2.11, 9 deaths in 6 studies). The reset and the collection alone did not stop it (2 deaths in a 9-trial
    study); dropping the thread-local state too, so that nothing of it is freed by that store's destructor at the
    thread's exit, did (0 in the same study). Skipped in a process that never imported the compiler; where it was
    imported (timm's import of torchvision does) but an eager trial compiled nothing, it costs the collection.
    """
    if "torch._dynamo" not in sys.modules:  # the compiler was never imported here: nothing of it to free
        return
    torch.compiler.reset()
    _drop_graph_trees_here()
    gc.collect()


def _drop_graph_trees_here() -> None:
    """Let go of this thread's CUDA graph trees' per-thread state (the reverse of _graph_trees_here) while the thread
    lives: its Python attributes, and the copies stashed in torch's C++ thread-local store, which would otherwise be
    released only by that store's destructor at the thread's exit. Same privates as _graph_trees_here."""
    if "torch._inductor.cudagraph_trees" not in sys.modules:
        return
    from torch._inductor import cudagraph_trees as trees

    for name in _GRAPH_TREES_STATE:
        if hasattr(trees.local, name):
            delattr(trees.local, name)
        if torch._C._is_key_in_tls(name):
            torch._C._stash_obj_in_tls(name, None)


def torch_version() -> tuple[int, int]:
    """torch's (major, minor)."""
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def resolve_compile(cfg, device: torch.device, world: int = 1) -> CompilePlan:
    """`cfg.train.compile` for a trial on `device` with `world` data-parallel workers. auto: CUDA graphs on CUDA (the
    eager step is launch-bound at CIFAR sizes), eager on CPU, eager wherever `_eager_only` finds a setting the
    compiled step would change, and compiled without CUDA graphs where `_without_graphs` says so; an explicit mode
    compiles all the same (the user asked for it) and says what differs. CUDA graphs are left out wherever they
    cannot run, whatever the mode."""
    want = cfg.train.compile
    if want == "off":
        return CompilePlan("off", "train.compile: off")
    if want == "auto" and device.type != "cuda":
        return CompilePlan(
            "off", "train.compile: auto runs eager on CPU (compiling pays where kernel launches dominate)"
        )
    problems = _eager_only(cfg)
    graphs = want == "auto" or want in _WITHOUT_GRAPHS
    no_graphs = _without_graphs(cfg, world) if graphs and device.type == "cuda" else []
    if no_graphs:
        mode = _WITHOUT_GRAPHS.get(want, "default")
        note = f"train.compile: {want} compiles without CUDA graphs: " + "; ".join(no_graphs)
        if problems and want == "auto":
            return CompilePlan("off", "train.compile: auto runs this trial eager: " + "; ".join(problems), warn=True)
        return CompilePlan(mode, note + ("" if not problems else "; though " + "; ".join(problems)), warn=True)
    if want == "auto":
        if problems:
            return CompilePlan("off", "train.compile: auto runs this trial eager: " + "; ".join(problems), warn=True)
        return CompilePlan("reduce-overhead", "train.compile: auto on CUDA")
    if problems:
        return CompilePlan(want, f"train.compile: {want} as asked, though " + "; ".join(problems), warn=True)
    return CompilePlan(want, f"train.compile: {want}")


# The compile caches hold code: Inductor unpickles its FX-graph and AOTAutograd entries and imports the modules it
# compiled, Triton loads its kernels. Whoever can write the cache runs code in every trial that reads it, so it lives
# on the node's own disk, in a folder only the trial's user can write (never the study's shared storage), and a
# folder anyone else could have written to is refused rather than read.
CACHE_DIR_MODE = 0o700


def default_cache_dir() -> Path:
    """The node-local compile cache of this user: `<tempdir>/sharpscale-compile-<uid>` (TMPDIR moves it)."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"sharpscale-compile-{os.getuid()}"


def _cache_dir_problem(where: Path, field: str) -> str | None:
    """Why `where` may not hold this process's compile cache (another user owns or can write it or a folder above
    it), or None."""
    import stat

    uid = os.getuid()
    st = where.stat()
    if not stat.S_ISDIR(st.st_mode):
        return f"{field}: {where} is not a directory. Fix: name a directory of your own, or remove {where}."
    if st.st_uid != uid:
        return (
            f"{field}: {where} is owned by uid {st.st_uid}, not by this trial's user (uid {uid}); the compile cache "
            f"holds code every compiled trial runs, so it must be the trial user's own. Fix: remove {where} (or set "
            f"train.compile_cache to a directory of your own on the node's disk, mode 700)."
        )
    if st.st_mode & 0o077:
        return (
            f"{field}: {where} has mode {stat.S_IMODE(st.st_mode):o}; the compile cache holds code every compiled "
            f"trial runs, so no other user may read or write it (mode 700). Fix: chmod 700 {where} once you know "
            f"nothing in it was planted, or remove it."
        )
    for parent in where.parents:
        pst = parent.stat()
        shared = pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX  # sticky (/tmp): no one renames our folder
        if pst.st_uid not in (0, uid) or shared:
            return (
                f"{field}: {where} lies in {parent} (owner uid {pst.st_uid}, mode {stat.S_IMODE(pst.st_mode):o}), "
                f"where another user could replace the cache folder; the compile cache holds code every compiled "
                f"trial runs. Fix: set train.compile_cache to a directory under folders only you (or root) can "
                f"write, on the node's own disk."
            )
    return None


def use_cache_dir(path: str | os.PathLike | None) -> Path:
    """Point torch's compile caches (Inductor's FX graph cache, AOTAutograd's cache and the Triton kernels) at
    `path`, or with None at this user's node-local default (default_cache_dir), so that the trials of this node
    reuse what an earlier one compiled for the same graph. Must run before this process compiles anything. The
    folder is made mode 700; one owned or writable by another user (or under a folder another user can write) is
    refused (TrialRefused), since what the cache holds runs as code. Returns the directory."""
    from trainables.errors import TrialRefused

    field = "train.compile_cache" if path is not None else "the compile cache"
    where = (default_cache_dir() if path is None else Path(path).expanduser()).resolve()
    where.parent.mkdir(parents=True, exist_ok=True)
    try:
        where.mkdir(mode=CACHE_DIR_MODE)
        os.chmod(where, CACHE_DIR_MODE)  # mkdir's mode passes through the umask
    except FileExistsError:
        pass
    problem = _cache_dir_problem(where, field)
    if problem is not None:
        raise TrialRefused(problem)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(where)
    os.environ["TRITON_CACHE_DIR"] = str(where / "triton")
    return where


class CompiledModule(nn.Module):
    """`torch.compile(module)` whose outputs are copied out of the CUDA graphs' memory.

    Under CUDA graphs (modes reduce-overhead and max-autotune) an output lives in memory that the next replay overwrites, and a
    two-pass method runs the model again before the step returns pass 1's logits; the copy (one small tensor a
    call) keeps them. The eager module stays registered as `_orig_mod`, as torch.compile's own wrapper has it, so
    `optim`'s unwrap, BatchNorm guard and ESAM find the module, its parameters and that it is compiled.
    """

    def __init__(self, module: nn.Module, mode: str, backend: str = "inductor"):
        super().__init__()
        self._orig_mod = module
        options = {"options": _inductor_options(mode)} if backend == "inductor" else {}
        # Shapes stay static: a trial sees a handful (the batch, micro-batches, ESAM's selection), each its own graph.
        compiled = torch.compile(module, backend=backend, dynamic=False, **options)
        object.__setattr__(self, "_compiled", compiled)  # not a submodule: its parameters are _orig_mod's
        self._copy_out = mode in _WITHOUT_GRAPHS  # without CUDA graphs an output is the caller's already

    def forward(self, *args, **kwargs):
        out = self._compiled(*args, **kwargs)
        return out.clone() if self._copy_out and isinstance(out, torch.Tensor) else out


# Inductor's settings beside a mode's own: random ops (dropout, drop path) call torch's own kernels on torch's
# generator, as eager does, instead of Inductor's fused generator, so that a compiled trial with dropout draws the
# masks the eager trial draws at the same seed. Measured on an H200 (docs/benchmarks.md, session 11): 20 fp32 steps
# of a ViT with dropout and drop path, compiled with CUDA graphs, end 1.5e-7 relative from eager with it and 0.31
# without; Mixer-S/4 with drop path 0.1 trains 5.5% slower than with Inductor's generator, 1.76x eager.
_INDUCTOR_OPTIONS = {"fallback_random": True}


def _inductor_options(mode: str) -> dict:
    """torch.compile's `options` for `mode`: the mode's own settings (torch passes either a mode or options, not
    both) and _INDUCTOR_OPTIONS. torch._inductor.list_mode_options is private; tests/trainables/test_compiled.py
    pins it."""
    from torch._inductor import list_mode_options

    return {**list_mode_options(mode, dynamic=False), **_INDUCTOR_OPTIONS}


#: The torch.compile backend of every compiled step. Inductor in use; the tests set "aot_eager" (the same graphs
#: through AOTAutograd, run eagerly: bit-equal to eager, and affordable on a small CPU).
BACKEND = "inductor"


def compile_module(module: nn.Module, plan: CompilePlan) -> nn.Module:
    """`module` compiled as `plan` says (itself when the plan is off)."""
    return CompiledModule(module, plan.mode, BACKEND) if plan.enabled else module


def _micro_batch_sizes(rows: int, parts: int) -> list[int]:
    # optim's split_rows gives `parts` contiguous ranges of `rows`, sizes differing by at most one.
    base, extra = divmod(rows, parts)
    return sorted({base + 1, base} if extra else {base}, reverse=True)


def warm_up(
    net: nn.Module,
    forward: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    *,
    rows: int,
    accumulate: int,
    device: torch.device,
    buffers_of: nn.Module,
    rounds: int = 3,
) -> float:
    """Compile (and record the CUDA graphs of) the step's forward and backward before the first step; returns the
    seconds.

    `forward(rows)` is the loop's forward on the first batch it trains, whose step follows. Three rounds: CUDA graph
    trees run a new graph once to warm up, record it on the second call and replay it from the third. Nothing of the
    trial moves: the gradients are dropped, the buffers of `buffers_of` (BatchNorm's statistics) put back and the
    random generators restored, and under DDP no gradient is all-reduced. A shape first seen later (ESAM's selection,
    MESA's teacher once it starts) compiles then, inside its epoch.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    buffers = list(buffers_of.buffers())  # BatchNorm's running statistics and counters: put back after
    saved = [b.detach().clone() for b in buffers]
    no_sync = net.no_sync if isinstance(net, nn.parallel.DistributedDataParallel) else contextlib.nullcontext
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        for _ in range(rounds):
            for size in _micro_batch_sizes(rows, accumulate):
                with no_sync():
                    loss, _ = forward(None if size == rows else slice(0, size))
                    loss.backward()
                # Dropped at once: under CUDA graphs these gradients live in memory the next replay overwrites.
                for p in net.parameters():
                    p.grad = None
    with torch.no_grad():
        for b, v in zip(buffers, saved):
            b.copy_(v)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def eval_module(net: nn.Module, module: nn.Module) -> nn.Module:
    """What evaluation runs: `net` when it is eager, else the eager `module` (one graph per shape of the evaluation's
    batches would buy little: it is forward-only). Under DDP, rank 0's buffers are broadcast first, as the DDP
    wrapper's own forward would have done."""
    compiled = isinstance(net, CompiledModule) or isinstance(getattr(net, "module", None), CompiledModule)
    if not compiled:
        return net
    if isinstance(net, nn.parallel.DistributedDataParallel) and net.broadcast_buffers:
        import torch.distributed as dist

        with torch.no_grad():
            for b in module.buffers():
                dist.broadcast(b, src=0, group=net.process_group)
    return module


def unwrap(net: nn.Module) -> nn.Module:
    """The eager module inside DDP and/or CompiledModule."""
    if isinstance(net, nn.parallel.DistributedDataParallel):
        net = net.module
    return net._orig_mod if isinstance(net, CompiledModule) else net
