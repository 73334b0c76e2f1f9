"""The compiled step (trainables.compiled): every registered method's step through torch.compile equals the eager
step (aot_eager on CPU: the same graphs run eagerly, bit for bit; one Inductor case to float rounding), the warm-up
moves nothing, fit records it, and train.compile resolves as documented. CUDA graphs themselves are checked on a GPU
by benchmarks/check_compiled.py (docs/benchmarks.md)."""

from __future__ import annotations

import copy
import tempfile
import warnings

import pytest
import timm
import torch
import torch.nn.functional as F
from torch import nn

import optim
from trainables import compiled, fit, load_checkpoint
from trainables.config import ConfigError, TrialConfig

BATCH = 12
# Knobs that make every method do its whole work within a few steps (SAF/MESA active from epoch 1, LookSAM's
# skipped passes at k=2, ESAM's selection of half the batch).
HPARAMS = {
    "sam": {"rho": 0.05},
    "looksam": {"k": 2},
    "saf": {"e_start": 1, "e_tilde": 1},
    "mesa": {"e_start": 0, "beta": 0.9},
    "esam": {"beta": 0.5, "gamma": 0.5},
}


@pytest.fixture(autouse=True)
def _aot_eager(monkeypatch):
    # AOTAutograd's graphs run eagerly: the compiled structure (graphs, guards, recompiles, the step's passes
    # through them) without Inductor's code generation, which costs minutes on a small CPU.
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    torch._dynamo.reset()


def _model():
    # BatchNorm included: pass 1's statistics rule and the warm-up's restore both act on its buffers.
    torch.manual_seed(0)
    return timm.create_model(
        "resnet18", pretrained=False, num_classes=5, layers=[1, 1, 1, 1], channels=(4, 8, 8, 8), stem_width=4
    ).train()


def _train(name, mode, *, steps=6, accumulate=1, hp=None, model=None):
    model = _model() if model is None else model
    plan = compiled.CompilePlan(mode, "test")
    net = compiled.compile_module(model, plan)
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    method = optim.create(
        name,
        base,
        model=net,
        num_samples=BATCH * 3,
        num_classes=5,
        accumulate=accumulate,
        **(HPARAMS.get(name, {}) if hp is None else hp),
    )
    if plan.enabled:
        method.compile_modules(lambda m: compiled.compile_module(m, plan))
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step % 3)  # 3 batches an epoch
        x, y = torch.randn(BATCH, 3, 8, 8, generator=g), torch.randint(0, 5, (BATCH,), generator=g)
        idx = torch.arange(BATCH) + BATCH * (step % 3)

        def forward(rows=None, reduction="mean", x=x, y=y):
            xs, ys = (x, y) if rows is None else (x[rows], y[rows])
            logits = net(xs)
            return F.cross_entropy(logits, ys, reduction=reduction), logits

        out = method.train_step(forward, inputs=x, indices=idx, epoch=step // 3)
        losses.append(out.loss.clone())
        losses.append(out.logits.clone())
    return model, method, losses


def _same(a: nn.Module, b: nn.Module):
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(v, w), k


@pytest.mark.parametrize("name", list(optim.METHODS))
def test_every_method_compiled_equals_eager(name):
    eager, _, le = _train(name, "off")
    comp, method, lc = _train(name, "default")
    _same(eager, comp)
    for a, b in zip(le, lc):
        assert torch.equal(a, b)
    if name == "mesa":  # the teacher ran through the compiled wrapper, and its weights are still the EMA's own
        reg = method.regulariser
        assert isinstance(reg._teacher_forward, compiled.CompiledModule)
        assert reg._teacher_forward._orig_mod is reg.teacher


# 12 rows in 5 micro-batches: sizes 3 and 2, each its own graph; ESAM's 6 selected rows in 3 (BatchNorm needs 2).
@pytest.mark.parametrize(("name", "accumulate"), [("sam", 5), ("saf", 5), ("esam", 3)])
def test_micro_batches_compiled_equal_eager(name, accumulate):
    eager, _, le = _train(name, "off", accumulate=accumulate)
    comp, _, lc = _train(name, "default", accumulate=accumulate)
    _same(eager, comp)
    for a, b in zip(le, lc):
        assert torch.equal(a, b)


def test_rho_zero_compiled_is_the_base_step():
    base, _, _ = _train("none", "default")
    zero, _, _ = _train("sam", "default", hp={"rho": 0.0})
    _same(base, zero)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_inductor_step_agrees_with_eager_to_rounding(monkeypatch, dropout):
    # With dropout, both of SAM's passes draw masks: the compiled step draws them from torch's generator in eager's
    # order (compiled._INDUCTOR_OPTIONS); Inductor's own generator drew others (this case fails without the setting;
    # a ViT with dropout ended 0.31 relative from eager after 20 steps on an H200).
    monkeypatch.setattr(compiled, "BACKEND", "inductor")

    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 5))

    eager, _, _ = _train("sam", "off", steps=3, model=mlp())
    comp, _, _ = _train("sam", "default", steps=3, model=mlp())
    for (k, v), w in zip(eager.state_dict().items(), comp.state_dict().values()):
        torch.testing.assert_close(v, w, rtol=1e-5, atol=1e-6, msg=k)


def test_warm_up_moves_nothing():
    model = _model()
    net = compiled.compile_module(model, compiled.CompilePlan("default", "test"))
    before = copy.deepcopy(model.state_dict())
    x, y = torch.randn(BATCH, 3, 8, 8), torch.randint(0, 5, (BATCH,))
    rng = torch.get_rng_state()

    def forward(rows=None, reduction="mean"):
        xs, ys = (x, y) if rows is None else (x[rows], y[rows])
        return F.cross_entropy(net(xs), ys, reduction=reduction), None

    seconds = compiled.warm_up(net, forward, rows=BATCH, accumulate=5, device=torch.device("cpu"), buffers_of=model)
    assert seconds > 0
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k  # weights, BatchNorm statistics and num_batches_tracked
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


def _trial(tiny_model, compile_mode, **train):
    return {
        "model": tiny_model("resnet"),
        "data": {"name": "digits", "img_size": 16, "batch_size": 32, "fraction": 0.2},
        "optimizer": {"method": "sam", "base": "sgd", "lr": 0.05, "hparams": {"rho": 0.05}},
        "schedule": {"epochs": 2, "warmup_epochs": 0},
        "train": {"device": "cpu", "seed": 3, "threads": 1, "compile": compile_mode, **train},
    }


def test_fit_compiled_equals_eager_and_records_the_compile(tiny_model, tmp_path):
    runs = {}
    for mode in ("off", "default"):
        seen = []
        ckpt = tmp_path / mode
        fit(_trial(tiny_model, mode), checkpoint_dir=ckpt, reporter=lambda m, c, seen=seen: seen.append(m))
        runs[mode] = seen, load_checkpoint(ckpt)
    (eager, eager_ckpt), (comp, comp_ckpt) = runs["off"], runs["default"]
    for key in ("train_loss", "val_loss", "val_acc", "weight_norm"):
        assert [m[key] for m in eager] == [m[key] for m in comp], key
    # The checkpoint holds the eager module's weights under its own names (no compile wrapper's prefix).
    assert comp_ckpt["model"].keys() == eager_ckpt["model"].keys()
    for k, v in eager_ckpt["model"].items():
        assert torch.equal(v, comp_ckpt["model"][k]), k
    assert [m[compiled.COMPILED_METRIC] for m in comp] == [1.0, 1.0]
    assert [m[compiled.COMPILED_METRIC] for m in eager] == [0.0, 0.0]
    # Timed once, on the first epoch's first batch, and never inside the epochs' timing.
    assert comp[0][compiled.COMPILE_TIME_METRIC] > 0 and compiled.COMPILE_TIME_METRIC not in comp[1]
    assert all(compiled.COMPILE_TIME_METRIC not in m for m in eager)


def test_fit_points_the_compile_cache_at_train_compile_cache(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "elsewhere"))
    cfg = _trial(tiny_model, "default", compile_cache=str(tmp_path / "cache"))
    cfg["schedule"]["epochs"] = 1
    fit(cfg)
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str((tmp_path / "cache").resolve())
    assert (tmp_path / "cache").is_dir()


def test_a_failed_warm_up_leaves_no_temporary_checkpoint_folder(tiny_model, tmp_path, monkeypatch):
    # Given no checkpoint_dir, fit keeps the checkpoints in a temporary folder of its own: a compile that fails
    # before the first epoch (out of memory while compiling, say) removes it as a failure inside the epochs does.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def fails(*args, **kwargs):
        raise RuntimeError("out of memory while compiling")

    monkeypatch.setattr(compiled, "warm_up", fails)
    with pytest.raises(RuntimeError, match="out of memory while compiling"):
        fit(_trial(tiny_model, "default"))
    assert not list(tmp_path.glob("sharpscale-ckpt-*"))


def _pixel_folder(root):
    """A tiny image folder prepared in the pixel form: the trial reads it through the slot ring (trainables.data.slots)."""
    import numpy as np
    from PIL import Image

    from trainables.data.prepare import prepare_folder

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in ("a", "b"):
            (root / "src" / split / c).mkdir(parents=True)
            for i in range(6):
                h, w = ((40, 50), (50, 36), (30, 30))[i % 3]
                img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                Image.fromarray(img).save(root / "src" / split / c / f"{i}.jpg")
    prepare_folder(root / "src", root / "px", short_side=20, workers=1, form="pixels")
    return root / "px"


@pytest.mark.parametrize(
    "loader, workers",
    [("host", 0), ("host", 1), ("pixels", 0), ("pixels", 2)],
)
def test_the_compile_reads_no_batch_of_its_own_and_the_trial_trains_as_the_eager_one(
    tiny_model, tmp_path, monkeypatch, loader, workers
):
    """The warm-up compiles on the first epoch's first batch: the loader hands out each epoch's batches and no more
    (a batch drawn for the compile alone started a pass whose prefetched batches were read for nothing, which a
    persistent loader's workers also drew augmentations for, and whose slots the pixel loader held until the next
    pass), and the compiled trial trains on what the eager one does, bit for bit (aot_eager), workers or not."""
    from trainables import loop
    from trainables.data.slots import _SlotRing

    handed, held = [], []
    batches_of = loop._GlobalBatchSampler.__iter__
    monkeypatch.setattr(
        loop._GlobalBatchSampler, "__iter__", lambda self: (handed.append(b) or b for b in batches_of(self))
    )
    reclaim = _SlotRing.reclaim
    monkeypatch.setattr(_SlotRing, "reclaim", lambda ring: held.append(len(ring._held)) or reclaim(ring))
    if loader == "host":
        data = {"name": "digits", "img_size": 16, "batch_size": 32, "fraction": 0.2}
    else:
        data = {"name": "imagefolder", "root": str(_pixel_folder(tmp_path)), "img_size": 16, "decode": "device",
                "batch_size": 4, "eval_batch_size": 5}  # fmt: skip
    runs = {}
    for mode in ("off", "default"):
        handed.clear()
        cfg = _trial(tiny_model, mode)
        cfg["data"] = {**data, "num_workers": workers}
        fit(cfg, checkpoint_dir=tmp_path / mode)
        runs[mode] = len(handed), load_checkpoint(tmp_path / mode)
    (eager_batches, eager), (comp_batches, comp) = runs["off"], runs["default"]
    per_epoch = {"host": 8, "pixels": 3}[loader]  # 287 digits (0.2 of 1,438) in 32s, the last 31 dropped; 12 in 4s
    assert eager_batches == comp_batches == 2 * per_epoch
    assert not any(held)  # every pass the slot ring started was read to its end
    for k, v in eager["model"].items():
        assert torch.equal(v, comp["model"][k]), k
    assert comp["metrics"][compiled.COMPILED_METRIC] == 1.0


def test_the_compile_inside_the_first_epoch_is_left_out_of_its_time(tiny_model, monkeypatch):
    """The compile runs inside the first epoch's pass, on its first batch; epoch_time_s and images_per_sec leave its
    seconds out, and compile_time_s and the compile phase of fit's timings hold them. A clock that jumps 1,000 s
    while the warm-up runs shows where they went."""
    import time
    import types

    from trainables import loop

    jump = [0.0]
    monkeypatch.setattr(
        loop, "time", types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + jump[0], time=time.time)
    )
    warm_up = compiled.warm_up

    def slow_warm_up(*args, **kwargs):
        seconds = warm_up(*args, **kwargs)
        jump[0] += 1000.0
        return seconds + 1000.0

    monkeypatch.setattr(compiled, "warm_up", slow_warm_up)
    seen, timings = [], {}
    fit(_trial(tiny_model, "default"), reporter=lambda m, c: seen.append(m), timings=timings)
    first, second = seen
    assert first[compiled.COMPILE_TIME_METRIC] >= 1000.0 and timings["compile"] >= 1000.0
    assert first["epoch_time_s"] < 1000.0 and compiled.COMPILE_TIME_METRIC not in second
    assert first["images_per_sec"] * first["epoch_time_s"] == pytest.approx(
        second["images_per_sec"] * second["epoch_time_s"]
    )


def _cfg(**sections) -> TrialConfig:
    base = {"model": {"name": "resnet18"}}
    for k, v in sections.items():
        base.setdefault(k, {}).update(v)
    return TrialConfig.load(base)


CUDA, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.mark.parametrize(
    ("sections", "device", "world", "mode", "warns"),
    [
        ({}, CPU, 1, "off", False),
        ({}, CUDA, 1, "reduce-overhead", False),
        ({"train": {"compile": "off"}}, CUDA, 1, "off", False),
        ({"train": {"compile": "default"}}, CPU, 1, "default", False),
        ({"data": {"accumulate": 2}}, CUDA, 1, "default", True),
        ({}, CUDA, 2, "default", True),
        ({"train": {"compile": "reduce-overhead"}, "data": {"accumulate": 2}}, CUDA, 1, "default", True),
        # Dropout compiles: its masks come from torch's generator, as eager's do (compiled._INDUCTOR_OPTIONS).
        ({"model": {"drop_path_rate": 0.1}}, CUDA, 1, "reduce-overhead", False),
        ({"train": {"compile": "reduce-overhead"}, "model": {"drop_rate": 0.1}}, CUDA, 1, "reduce-overhead", False),
        ({"train": {"compile": "reduce-overhead"}, "optimizer": {"method": "msam"}}, CUDA, 1, "reduce-overhead", True),
        ({"optimizer": {"method": "msam"}}, CUDA, 1, "off", True),
    ],
)
def test_resolve_compile(sections, device, world, mode, warns):
    plan = compiled.resolve_compile(_cfg(**sections), device, world)
    assert (plan.mode, plan.warn) == (mode, warns), plan.reason


@pytest.mark.parametrize(
    ("version", "trees_here", "mode"),
    [((2, 11), False, "default"), ((2, 11), True, "reduce-overhead"), ((2, 14), False, "reduce-overhead")],
)
def test_cuda_graphs_stay_off_a_reused_actors_thread_where_torch_cannot_run_them_there(
    monkeypatch, version, trees_here, mode
):
    # Ray Tune runs each trial of a reused actor on a new thread; torch 2.11's CUDA graph trees asserted there (an
    # H200 run through the CLI). On the main thread, on torch 2.14 on any thread, and on an older torch where the
    # graph trees' per-thread state could be set up on the trial's thread, auto keeps the graphs.
    import threading

    monkeypatch.setattr(compiled, "torch_version", lambda: version)
    monkeypatch.setattr(compiled, "_graph_trees_here", lambda: None if trees_here else "AssertionError: get_obj")
    plans = []
    worker = threading.Thread(target=lambda: plans.append(compiled.resolve_compile(_cfg(), CUDA, 1)))
    worker.start()
    worker.join()
    assert plans[0].mode == mode and plans[0].warn == (mode == "default"), plans[0].reason
    assert compiled.resolve_compile(_cfg(), CUDA, 1).mode == "reduce-overhead"  # the main thread


def test_the_graph_trees_per_thread_state_is_set_up_on_a_new_thread():
    # Pins the privates _graph_trees_here uses: on a fresh thread, torch's CUDA graph trees find their per-thread
    # containers (the state whose absence made torch 2.11's get_obj assert), in the thread-local store autograd's
    # threads copy, and what was set up there is that thread's own.
    import threading

    from torch._inductor import cudagraph_trees as trees

    seen = []

    def trial():
        seen.append(compiled._graph_trees_here())
        containers = trees.get_obj(trees.local, "tree_manager_containers")
        seen.append((isinstance(containers, dict), torch._C._is_key_in_tls("tree_manager_containers")))
        seen.append(trees.get_obj(trees.local, "tree_manager_locks")[0])

    worker = threading.Thread(target=trial)
    worker.start()
    worker.join()
    assert seen[:2] == [None, (True, True)], seen
    assert isinstance(seen[2], type(threading.Lock()))
    main_locks = trees.get_obj(trees.local, "tree_manager_locks")
    assert main_locks[0] is not seen[2]  # each thread its own, as torch keeps them


def test_a_threads_graph_trees_state_is_dropped_while_it_lives_and_set_up_again_on_demand():
    # release() lets go of the state _graph_trees_here set up, on the trial's thread: nothing of it is left for torch's
    # C++ thread-local store to free at the thread's exit (after which a reused Ray actor's next trial died in the
    # garbage collector on the GPU). Pins the privates it uses; a thread that compiles again gets fresh state.
    import threading

    from torch._inductor import cudagraph_trees as trees

    seen = {}

    def trial():
        assert compiled._graph_trees_here() is None
        mine = trees.get_obj(trees.local, "tree_manager_containers")
        compiled._drop_graph_trees_here()
        seen["attrs"] = [hasattr(trees.local, n) for n in ("tree_manager_containers", "tree_manager_locks")]
        seen["stashed"] = [torch._C._get_obj_in_tls(n) for n in ("tree_manager_containers", "tree_manager_locks")]
        seen["again"] = compiled._graph_trees_here()
        fresh = trees.get_obj(trees.local, "tree_manager_containers")
        seen["fresh"] = isinstance(fresh, dict) and fresh is not mine

    worker = threading.Thread(target=trial)
    worker.start()
    worker.join()
    assert seen == {"attrs": [False, False], "stashed": [None, None], "again": None, "fresh": True}, seen


@pytest.mark.parametrize("ending", ["finished", "failed", "refused"])
def test_a_trial_releases_its_compiles_on_its_own_thread_however_it_ends(tiny_model, monkeypatch, ending):
    # Tune runs each trial of a reused actor on a new thread; what a compiled trial leaves (Dynamo's caches, the
    # thread's CUDA graph trees, their cycles) is freed there, after its record, before the thread ends.
    import threading

    from trainables.ray_train import _execute

    released = []
    real_release = compiled.release

    def release():
        released.append(threading.current_thread())
        real_release()

    monkeypatch.setattr(compiled, "release", release)
    cfg = _trial(tiny_model, "default")
    if ending == "refused":
        cfg["model"]["kwargs"] = {**cfg["model"].get("kwargs", {}), "no_such_argument": 1}  # TrialRefused by timm
    reported, errors = [], []

    class Checkpoint:
        from_directory = staticmethod(lambda path: path)

    def sink(metrics, checkpoint):
        if ending == "failed":
            raise RuntimeError("the sink failed")
        reported.append(metrics)

    def trial():
        try:
            _execute(
                TrialConfig.load(cfg), checkpoint=None, sink=sink, checkpoint_cls=Checkpoint, recorder=None,
                metric="val_acc",
            )  # fmt: skip
        except BaseException as err:  # noqa: BLE001 - the thread hands it to the test
            errors.append(err)

    thread = threading.Thread(target=trial)
    thread.start()
    thread.join()
    assert released == [thread]
    if ending == "finished":
        assert not errors and [m["epoch"] for m in reported] == [0, 1] and reported[-1]["compiled"] == 1.0
    elif ending == "failed":
        assert len(errors) == 1 and "the sink failed" in str(errors[0])
    else:
        assert not errors and reported[-1]["refused"] == 1


def test_release_is_a_no_op_in_a_process_that_never_compiled():
    # An eager-only process (a CPU trial with `train.compile: off`) must not import the compiler to reset it.
    import subprocess
    import sys

    code = "import sys, trainables.compiled as c; c.release(); print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_fallback_is_said_in_the_trials_log(tiny_model):
    cfg = _trial(tiny_model, "auto")
    cfg["schedule"]["epochs"] = 1
    cfg["optimizer"]["method"] = "msam"
    cfg["train"]["compile"] = "default"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = fit(cfg)
    assert any(issubclass(w.category, compiled.CompileFallbackWarning) and "msam" in str(w.message) for w in caught)
    assert metrics[compiled.COMPILED_METRIC] == 1.0


def test_train_compile_names_the_field_and_its_options():
    with pytest.raises(ConfigError) as err:
        TrialConfig.load({"train": {"compile": "max-autotune"}})
    text = str(err.value)
    assert "train.compile" in text and "reduce-overhead" in text and "max-autotune" in text


def _ddp_worker(rank, out):
    import torch.distributed as dist

    compiled.BACKEND = "aot_eager"  # a spawned process: the fixture's patch does not reach it
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=2)
    try:
        res = {}
        for name, glob in (("sam", False), ("sam", True), ("esam", False), ("mesa", False)):
            for mode in ("off", "default"):
                model = _model()
                net = nn.parallel.DistributedDataParallel(
                    compiled.compile_module(model, compiled.CompilePlan(mode, "t"))
                )
                base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
                method = optim.create(
                    name,
                    base,
                    model=net,
                    num_samples=BATCH * 3,
                    num_classes=5,
                    global_perturbation=glob,
                    **HPARAMS.get(name, {}),
                )
                if mode != "off":
                    method.compile_modules(lambda m: compiled.compile_module(m, compiled.CompilePlan(mode, "t")))
                for step in range(3):
                    g = torch.Generator().manual_seed(10 * rank + step)  # each replica its own batch
                    x, y = torch.randn(BATCH, 3, 8, 8, generator=g), torch.randint(0, 5, (BATCH,), generator=g)

                    def forward(rows=None, reduction="mean", x=x, y=y, net=net):
                        xs, ys = (x, y) if rows is None else (x[rows], y[rows])
                        logits = net(xs)
                        return F.cross_entropy(logits, ys, reduction=reduction), logits

                    method.train_step(forward, inputs=x, epoch=step)
                res[(name, glob, mode)] = {k: v.clone() for k, v in model.state_dict().items()}
        torch.save(res, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_ddp_compiled_equals_ddp_eager(tmp_path):
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    mp.spawn(_ddp_worker, args=(str(tmp_path),), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for res in ranks:
        for (name, glob, mode), state in res.items():
            if mode == "off":
                continue
            for k, v in res[(name, glob, "off")].items():
                assert torch.equal(v, state[k]), (name, glob, k)
    for key, state in ranks[0].items():  # the replicas stay identical, compiled or not
        for k, v in state.items():
            if "running" not in k and "num_batches" not in k:  # BatchNorm statistics are per replica
                assert torch.equal(v, ranks[1][key][k]), (key, k)


def test_train_compile_offers_only_modes_the_compiled_module_runs():
    from typing import get_args

    offered = set(get_args(TrialConfig.model_fields["train"].annotation.model_fields["compile"].annotation))
    assert offered - {"auto", "off"} <= set(compiled.COMPILE_MODES)


@pytest.mark.parametrize(
    "mode, copies",
    [("default", False), ("reduce-overhead", True), ("max-autotune", True), ("max-autotune-no-cudagraphs", False)],
)
def test_outputs_are_copied_out_of_cuda_graphs_in_every_mode_that_records_them(mode, copies):
    # A two-pass method runs the model again before it reads pass 1's logits: under CUDA graphs those live in memory
    # the next replay overwrites.
    assert compiled.CompiledModule(nn.Linear(2, 2), mode, backend="aot_eager")._copy_out is copies


def test_the_compile_modes_have_one_list_and_the_benchmark_accepts_each():
    # trainables.config.COMPILE_MODES is the one list: train.compile offers its first two, bench_trainables'
    # --modes every one (the documented `compile --modes reduce-overhead max-autotune` was refused by argparse).
    import subprocess
    import sys
    from pathlib import Path

    from trainables.config import COMPILE_MODES, TRAIN_COMPILE_MODES

    assert compiled.COMPILE_MODES is COMPILE_MODES and set(TRAIN_COMPILE_MODES) < set(COMPILE_MODES)
    for mode in ("auto", "off", *TRAIN_COMPILE_MODES):
        assert TrialConfig.load({"train": {"compile": mode}}).train.compile == mode
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_trainables", "compile", "--modes", *COMPILE_MODES, "-h"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_inductor_options_are_the_modes_own_and_torchs_generator_for_random_ops():
    # torch._inductor.list_mode_options is private (torch.compile takes a mode or options, not both): pinned here.
    assert compiled._inductor_options("default") == {"fallback_random": True}
    assert compiled._inductor_options("reduce-overhead") == {"triton.cudagraphs": True, "fallback_random": True}
    assert compiled._inductor_options("max-autotune-no-cudagraphs")["max_autotune"] is True


def test_the_warm_up_puts_back_its_random_draws_so_a_drop_path_trial_trains_on_eagers_masks(tiny_model):
    # Through fit, the compile's warm-up draws masks of its own and puts the generators back, so the compiled trial's
    # every mask is the eager trial's (aot_eager: bit for bit). That Inductor draws them as eager does is
    # test_inductor_step_agrees_with_eager_to_rounding's; that auto compiles dropout models, test_resolve_compile's.
    # Drop path, as rho_sensitivity's Mixer has it: the Mixer's MLP dropout (proj_drop_rate) trips aot_eager's eager
    # run of the backward graph (a `view` of a strided gradient), which Inductor compiles and trains to rounding.
    metrics = {}
    for mode in ("off", "default"):
        cfg = _trial(tiny_model, mode)
        cfg["model"] = {**tiny_model("mixer"), "drop_path_rate": 0.3}
        seen = []
        fit(cfg, reporter=lambda m, c, seen=seen: seen.append(m))
        metrics[mode] = seen
    for key in ("train_loss", "val_loss", "weight_norm"):
        assert [m[key] for m in metrics["off"]] == [m[key] for m in metrics["default"]], key
    assert [m[compiled.COMPILED_METRIC] for m in metrics["default"]] == [1.0, 1.0]
