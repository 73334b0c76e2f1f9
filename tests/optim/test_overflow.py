"""fp16 overflow in either pass skips the whole step for fused and non-fused bases alike: weights, base-optimizer
state and method state untouched, the scale backed off once, and training continues as if the step never ran;
Lookbehind-SAM's overflow late in its chain, which keeps the inner steps before it."""

from __future__ import annotations

import io
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import optim
from optim import METHODS

TWO_PASS = {n for n, s in METHODS.items() if s.two_pass}
BASES = {
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=5e-4),
    "sgd-momentum-fused": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=5e-4, fused=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.05),
    "adamw-fused": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.05, fused=True),
}
INIT_SCALE = 2.0**10
N_SAMPLES, N_CLASSES = 16, 4


def mlp():
    # No BatchNorm: a skipped step's forward still moves running statistics (as in plain fp16 training), which
    # would make "as if the step never ran" untrue for reasons that are not the optimizer's.
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, N_CLASSES))


def data(t):
    g = torch.Generator().manual_seed(77 + t)
    return (
        torch.randn(N_SAMPLES, 6, generator=g),
        torch.randint(0, N_CLASSES, (N_SAMPLES,), generator=g),
        torch.randperm(N_SAMPLES, generator=g),
    )


def build(name, base):
    model = mlp()
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE)
    method = optim.create(
        name,
        BASES[base](model.parameters()),
        model=model,
        scaler=scaler,
        num_samples=N_SAMPLES,
        num_classes=N_CLASSES,
        **METHODS[name].small.hparams,
    )
    return model, method, scaler


def step(method, model, t, bad_call=None):
    x, y, idx = data(t)
    calls = []

    def forward(rows=None, reduction="mean"):
        calls.append(1)
        xs, ys = (x, y) if rows is None else (x[rows], y[rows])
        z = model(xs)
        loss = F.cross_entropy(z, ys, reduction=reduction)
        return (loss * math.inf if len(calls) == bad_call else loss), z

    return method.train_step(forward, inputs=x, indices=idx, epoch=t)


def tensors_of(obj):
    """Every tensor in a (nested) state dict, with its path, cloned."""
    out = {}

    def walk(path, v):
        if isinstance(v, torch.Tensor):
            out[path] = v.detach().clone()
        elif isinstance(v, dict):
            for k, w in v.items():
                walk(f"{path}/{k}", w)
        elif isinstance(v, (list, tuple)):
            for i, w in enumerate(v):
                walk(f"{path}/{i}", w)
        else:
            out[path] = v

    walk("", obj)
    return out


def without_scaler(state: dict) -> dict:
    return tensors_of({k: v for k, v in state.items() if k != "scaler"})


def assert_same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k, v in a.items():
        if isinstance(v, torch.Tensor):
            torch.testing.assert_close(v, b[k], rtol=0, atol=0, equal_nan=False, msg=k)
        else:
            assert v == b[k], k


CASES = [
    (n, b, bad, at) for n in METHODS for b in BASES for bad in ((1, 2) if n in TWO_PASS else (1,)) for at in (0, 2)
]


@pytest.mark.parametrize(
    "name,base,bad_call,at", CASES, ids=[f"{n}-{b}-inf-in-pass-{bad}-at-step-{at}" for n, b, bad, at in CASES]
)
def test_overflow_skips_the_step_cleanly(name, base, bad_call, at):
    """Old code: with a fused base an overflow in pass 1 made the scaler's found_inf 2.0, which the fused
    kernels do not treat as a skip (weights NaN, AdamW's step going backwards); MESA's teacher moved and
    LookSAM dropped its g_v and advanced its schedule on a skipped step."""
    model, method, scaler = build(name, base)
    for t in range(at):
        assert not step(method, model, t).skipped
    before = {"model": tensors_of(model.state_dict()), "method": without_scaler(method.state_dict())}
    out = step(method, model, at, bad_call=METHODS[name].small.call_of_pass.get(bad_call, bad_call))
    assert out.skipped
    assert scaler.get_scale() == INIT_SCALE / 2  # backed off once
    after = {"model": tensors_of(model.state_dict()), "method": without_scaler(method.state_dict())}
    assert_same(before["model"], after["model"])  # weights restored exactly, no step taken
    assert_same(before["method"], after["method"])  # base state (Adam's step, momentum) and method state
    assert all(p.grad is None for p in model.parameters())

    # The rest of the run equals a run in which the overflow never happened (scales are powers of two, so
    # the unscaled gradients are the same bits).
    for t in range(at, at + 3):
        assert not step(method, model, t).skipped
    model2, method2, _ = build(name, base)
    for t in range(at + 3):
        step(method2, model2, t)
    assert_same(tensors_of(model.state_dict()), tensors_of(model2.state_dict()))


@pytest.mark.parametrize("base", list(BASES))
def test_overflow_on_a_looksam_reuse_step(base):
    model, method, _ = build("looksam", base)
    step(method, model, 0)  # SAM step, stores g_v
    before = without_scaler(method.state_dict())
    assert step(method, model, 1, bad_call=1).skipped  # a one-pass step
    assert_same(before, without_scaler(method.state_dict()))
    assert [step(method, model, t).perturbed_loss is None for t in (1, 2, 3)] == [True, False, True]


def test_scaler_private_layout_is_what_optim_relies_on():
    """optim reads GradScaler._per_optimizer_states[id(opt)]['found_inf_per_device'] (no public API says whether
    unscale_ found an inf); if torch changes that layout, this test fails before training silently breaks."""
    p = nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    scaler.scale(p.sum() * math.inf).backward()
    scaler.unscale_(opt)
    flags = scaler._per_optimizer_states[id(opt)]["found_inf_per_device"]
    assert isinstance(flags, dict) and list(flags) == [p.device]
    assert float(flags[p.device]) == 1.0
    scaler.update()
    assert scaler.get_scale() == 2.0


def test_state_dict_carries_the_scaler():
    """Old code left the GradScaler out of Method.state_dict(): a resume restarted at the initial scale."""
    model, method, scaler = build("sam", "adamw")
    step(method, model, 0, bad_call=1)
    step(method, model, 1)
    buf = io.BytesIO()
    torch.save(method.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=False)
    assert state["scaler"]["scale"] == INIT_SCALE / 2
    _, method2, scaler2 = build("sam", "adamw")
    method2.load_state_dict(state)
    assert scaler2.get_scale() == INIT_SCALE / 2 and scaler2.state_dict() == scaler.state_dict()


@pytest.mark.parametrize("base", list(BASES))
def test_overflow_late_in_the_lookbehind_chain_keeps_the_steps_before_it(base):
    """docs/algorithms.md, "Lookbehind-SAM": an overflow in pass 3 of k = 2 (the gradient of inner step 2) skips
    that inner step and ends the chain; inner step 1 stands, so the update is k = 1's (the same bits, base state
    included), the step is not reported skipped and the scale backs off once."""
    model, method, scaler = build("lookbehind", base)
    out = step(method, model, 0, bad_call=3)
    assert not out.skipped and scaler.get_scale() == INIT_SCALE / 2
    model1, method1, _ = build("lookbehind", base)
    method1.k = 1  # the same knobs otherwise (SmallRun's k = 2)
    step(method1, model1, 0)
    assert_same(tensors_of(model.state_dict()), tensors_of(model1.state_dict()))
    assert_same(without_scaler(method.state_dict()), without_scaler(method1.state_dict()))
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), mlp().parameters()))
