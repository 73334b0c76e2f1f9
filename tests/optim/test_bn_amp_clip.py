"""BatchNorm statistics equal pass 1's alone; fp16 GradScaler logic (one unscale/step/update, inf in either pass skips);
bf16 autocast; clipping acts on the final update gradient; no host sync in the hot path."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from optim import METHODS

TWO_PASS = [n for n, s in METHODS.items() if s.two_pass]


@pytest.mark.parametrize("momentum", [0.1, None], ids=["ema", "cumulative"])
@pytest.mark.parametrize("name", TWO_PASS)
def test_bn_stats_equal_pass_1_alone(name, momentum, helpers):
    model = helpers.make_model(bn_momentum=momentum)
    method = helpers.build(name, model, hparams={"k": 1} if name == "looksam" else {})
    for t in range(2):
        x, y, _ = helpers.make_batch(t)
        # Expected: BN buffers after ONE forward of the batch at the weights pass 1 ran at (the current weights;
        # bSAM's draw from them), in train mode.
        ref = helpers.make_model(bn_momentum=momentum)
        ref.load_state_dict(model.state_dict())
        at_pass_1, forward = [], helpers.make_forward(model, x, y)

        def first_seen(rows=None, reduction="mean", forward=forward, at_pass_1=at_pass_1):
            if not at_pass_1:
                at_pass_1.append({k: v.detach().clone() for k, v in model.named_parameters()})
            return forward(rows, reduction)

        method.train_step(first_seen)
        ref.load_state_dict(at_pass_1[0], strict=False)
        ref(x)
        for buf in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(model.bn, buf), getattr(ref.bn, buf), rtol=0, atol=0)
        assert int(model.bn.num_batches_tracked) == t + 1


# ----------------------------------------------------------------------------- fp16 GradScaler
class CountingScaler(torch.amp.GradScaler):
    def __init__(self):
        super().__init__("cpu", init_scale=2.0**10)
        self.calls = {"unscale_": 0, "step": 0, "update": 0}

    def unscale_(self, optimizer):
        self.calls["unscale_"] += 1
        return super().unscale_(optimizer)

    def step(self, optimizer, *a, **k):
        self.calls["step"] += 1
        return super().step(optimizer, *a, **k)

    def update(self, new_scale=None):
        self.calls["update"] += 1
        return super().update(new_scale)


def _inf_forward(model, x, y, bad_call):
    calls = []

    def forward(rows=None, reduction="mean"):
        calls.append(1)
        xs, ys = (x, y) if rows is None else (x[rows], y[rows])
        logits = model(xs)
        loss = F.cross_entropy(logits, ys, reduction=reduction)
        if len(calls) == bad_call:
            loss = loss * math.inf
        return loss, logits

    return forward


@pytest.mark.parametrize("name", list(METHODS))
def test_fp16_scaler_matches_unscaled_and_steps_once(name, helpers):
    results = []
    for scaler in (None, CountingScaler()):
        model = helpers.make_model()
        method = helpers.build(name, model, scaler=scaler)
        outs = helpers.run(method, model, 3)
        assert not any(o.skipped for o in outs)
        results.append([p.detach().clone() for p in model.parameters()])
    # Powers-of-two scaling is exact: eps and the GSAM/LookSAM combinations do not change under a common scale.
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    n = 3 * METHODS[name].small.base_steps  # Lookbehind-SAM: k base steps per train_step
    steps = n if METHODS[name].steps_base else 0  # bSAM's update is its own: the scaler never steps a base optimizer
    assert scaler.calls == {"unscale_": n, "step": steps, "update": n}  # no double unscale


@pytest.mark.parametrize("bad_call", [1, 2], ids=["inf-in-pass-1", "inf-in-pass-2"])
@pytest.mark.parametrize("name", TWO_PASS + ["none"])
def test_fp16_inf_in_either_pass_skips_and_lowers_scale(name, bad_call, helpers):
    if name == "none" and bad_call == 2:
        pytest.skip("one pass only")
    hp = {"k": 1} if name == "looksam" else {}
    for p in (2, math.inf) if name == "sam" else (2,):
        if name == "sam":
            hp = {"p": p}
        model = helpers.make_model()
        scaler = CountingScaler()
        method = helpers.build(name, model, scaler=scaler, hparams=hp)
        before = [t.detach().clone() for t in model.parameters()]
        x, y, idx = helpers.make_batch(0)
        call = METHODS[name].small.call_of_pass.get(bad_call, bad_call)
        out = method.train_step(_inf_forward(model, x, y, call), inputs=x, indices=idx)
        assert out.skipped
        assert scaler.get_scale() == 2.0**9
        # Skipped: the base optimizer is not called at all, so neither is scaler.step (test_overflow.py says why).
        assert scaler.calls == {"unscale_": 1, "step": 0, "update": 1}
        for a, b in zip(before, model.parameters()):
            torch.testing.assert_close(a, b, rtol=0, atol=0)  # w restored exactly, no step taken
        assert not method.base_optimizer.state  # the base optimizer never stepped
        assert all(p.grad is None for p in model.parameters())
        # and training goes on
        out = method.train_step(helpers.make_forward(model, x, y), inputs=x, indices=idx)
        assert not out.skipped and torch.isfinite(out.loss)


@pytest.mark.parametrize("name", list(METHODS))
def test_bf16_autocast_without_scaler(name, helpers):
    model = helpers.make_model()
    method = helpers.build(name, model)
    outs = helpers.run(method, model, 3, autocast_dtype=torch.bfloat16)
    assert all(torch.isfinite(o.loss) and o.logits.dtype == torch.bfloat16 for o in outs)
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters())


def test_mesa_teacher_runs_in_the_training_autocast_dtype(helpers):
    model = helpers.make_model()
    method = helpers.build("mesa", model)
    seen = []
    method.regulariser.teacher.head.register_forward_hook(
        lambda m, i, o: seen.append((o.dtype, m.training, torch.is_grad_enabled()))
    )
    helpers.run(method, model, 3, autocast_dtype=torch.bfloat16)
    assert seen == [(torch.bfloat16, False, False)]  # only the active epoch (2 > e_start=1) runs the teacher


# ----------------------------------------------------------------------------- clipping
@pytest.mark.parametrize("name", list(METHODS))
def test_grad_clip_acts_on_the_final_update_gradient(name, helpers):
    clip = 0.05
    captured = {}
    finals = []
    for grad_clip in (None, clip):
        model = helpers.make_model()
        base = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)  # msam needs a momentum
        base.register_step_pre_hook(
            lambda opt, a, k, model=model: finals.append([p.grad.clone() for p in model.parameters()])
        )
        method = helpers.build(name, model, base, grad_clip=grad_clip)
        if not METHODS[name].steps_base:  # bSAM: no base step; its own update reads p.grad after the same hook
            before = method._before_base_step
            method._before_base_step = lambda model=model, before=before: (
                finals.append([p.grad.clone() for p in model.parameters()]),
                before(),
            )
        helpers.run(method, model, 1)
        captured[grad_clip] = finals[-1]
    raw = captured[None]
    total = torch.linalg.vector_norm(torch.stack([g.norm() for g in raw]))
    assert total > clip
    for a, b in zip(captured[clip], raw):
        torch.testing.assert_close(a, b * (clip / (total + 1e-6)), rtol=1e-5, atol=1e-8)


# ----------------------------------------------------------------------------- no host sync
@pytest.mark.parametrize("name", list(METHODS))
def test_no_host_sync_in_the_hot_path(name, helpers, monkeypatch):
    model = helpers.make_model()
    method = helpers.build(name, model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), grad_clip=1.0)
    helpers.run(method, model, 2)  # allocations, teacher, buffers

    def forbidden(*a, **k):
        raise AssertionError("host-device sync (.item()/bool()/float()) in the hot path")

    for attr in ("item", "__bool__", "__float__", "__int__", "tolist"):
        monkeypatch.setattr(torch.Tensor, attr, forbidden)
    helpers.run(method, model, 3, start=2)  # SAF/MESA active from epoch 2, LookSAM both kinds of step
