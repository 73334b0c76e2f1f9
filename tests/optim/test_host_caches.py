"""The per-step plans the methods cache (MSAM's momenta, LookSAM's g_v groups, the BN guard's buffers, TwoPass's
buckets) follow what they were built from: a rebuilt model, a reloaded optimizer, a frozen or unfrozen parameter."""

from __future__ import annotations

import copy

import pytest
import torch

import optim


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("name", ["sam", "looksam", "wsam", "vasso"])
def test_bn_guard_follows_buffers_replaced_between_steps(name, helpers):
    """New BN buffer objects (as ``model.to(device)`` makes): the next step still leaves the statistics of pass 1."""
    model = helpers.make_model(0)
    method = helpers.build(name, model)
    helpers.run(method, model, 2)
    for name_, buf in list(model.bn.named_buffers()):
        setattr(model.bn, name_, buf.clone())
    x, y, idx = helpers.make_batch(2)
    expected = copy.deepcopy(model)
    expected(x)  # pass 1 at w: the statistics a step must leave
    method.train_step(helpers.make_forward(model, x, y), inputs=x, indices=idx, epoch=2)
    for buf, want in zip(model.buffers(), expected.buffers()):
        assert torch.equal(buf, want)


def test_msam_follows_a_reloaded_base_optimizer(helpers):
    """After ``load_state_dict`` the base keeps new momentum tensors: MSAM perturbs along those, as a fresh one does."""
    model = helpers.make_model(0)
    method = helpers.build("msam", model, base=torch.optim.AdamW(model.parameters(), lr=1e-2))
    helpers.run(method, model, 2)
    saved, weights = copy.deepcopy(method.state_dict()), copy.deepcopy(model.state_dict())
    helpers.run(method, model, 2, start=2)
    model.load_state_dict(weights)
    method.load_state_dict(copy.deepcopy(saved))
    helpers.run(method, model, 2, start=2)

    fresh_model = helpers.make_model(0)
    fresh_model.load_state_dict(weights)
    fresh = helpers.build("msam", fresh_model, base=torch.optim.AdamW(fresh_model.parameters(), lr=1e-2))
    fresh.load_state_dict(copy.deepcopy(saved))
    helpers.run(fresh, fresh_model, 2, start=2)
    assert _same(model, fresh_model)


def test_msam_follows_a_parameter_frozen_and_unfrozen(helpers):
    """A parameter frozen for a step and then unfrozen is perturbed again, as by a method built after the thaw."""
    model = helpers.make_model(0)
    method = helpers.build("msam", model)
    helpers.run(method, model, 2)
    model.head.bias.requires_grad_(False)
    helpers.run(method, model, 1, start=2)
    model.head.bias.requires_grad_(True)
    weights, saved = copy.deepcopy(model.state_dict()), copy.deepcopy(method.state_dict())
    helpers.run(method, model, 2, start=3)

    fresh_model = helpers.make_model(0)
    fresh_model.load_state_dict(weights)
    fresh = helpers.build("msam", fresh_model)
    fresh.load_state_dict(saved)
    helpers.run(fresh, fresh_model, 2, start=3)
    assert _same(model, fresh_model)


def test_looksam_reuse_follows_a_reloaded_direction(helpers):
    """One-pass steps after ``load_state_dict`` move along the loaded g_v, not the one grouped before it."""
    model = helpers.make_model(0)
    method = helpers.build("looksam", model, hparams={"k": 3})
    helpers.run(method, model, 4)  # steps 0 and 3 store a g_v; step 4's reuse has grouped it
    saved, weights = copy.deepcopy(method.state_dict()), copy.deepcopy(model.state_dict())
    helpers.run(method, model, 2, start=4)
    model.load_state_dict(weights)
    method.load_state_dict(copy.deepcopy(saved))
    helpers.run(method, model, 2, start=4)

    fresh_model = helpers.make_model(0)
    fresh_model.load_state_dict(weights)
    fresh = helpers.build("looksam", fresh_model, hparams={"k": 3})
    fresh.load_state_dict(copy.deepcopy(saved))
    helpers.run(fresh, fresh_model, 2, start=4)
    assert _same(model, fresh_model)


def _run_double(helpers, method, model):
    for t in range(3, 7):
        x, y, idx = helpers.make_batch(t, dtype=torch.float64)
        method.train_step(helpers.make_forward(model, x, y), inputs=x, indices=idx, epoch=t)


# Every method with state or buffers of its own: VaSSO's d, SAMPa's d, RWP's F, bSAM's m and s, F-SAM's EMA, MESA's
# teacher, the step plans and saved-w buffers of the rest.
@pytest.mark.parametrize("name", [n for n in optim.METHODS if n != "none"])
def test_caches_follow_a_model_cast_after_a_step(name, helpers):
    """``model.double()`` keeps every parameter object and changes its dtype: the steps after it keep w and pass 1's g
    in float64 (as a method whose caches were built after the cast does), not in the float32 buffers of the steps
    before it, which would round w at every restore; and the method's own state (d, F, m and s, MESA's teacher)
    goes on in float64, as a method built after the cast and loaded from a checkpoint has it."""
    model = helpers.make_model(0)
    hparams = {"k": 2} if name == "looksam" else {}  # a one-pass step (g_v reused) among the steps after the cast
    method = helpers.build(name, model, hparams=hparams)
    helpers.run(method, model, 3)
    twin_model, twin = copy.deepcopy((model, method))
    model.double()
    _run_double(helpers, method, model)

    twin_model.double()
    # The same base optimizer (its state as the cast left it) and method state, caches built after the cast.
    fresh = helpers.build(name, twin_model, base=twin.base_optimizer, hparams=hparams)
    fresh._load_method_state(copy.deepcopy(twin._method_state()))
    _run_double(helpers, fresh, twin_model)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    assert _same(model, twin_model)
