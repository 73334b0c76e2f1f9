"""Corners: GSAM's radius under cosine, one-cycle and layer-decay schedules; one model rule for the classes and
create(); SAF samples without a record; MESA asks for inputs= from the first step."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import optim
from optim import METHODS

RHO_MAX, RHO_MIN = 0.2, 0.05


def expected_rho(lr, lr_max, lr_min):
    """docs/algorithms.md, GSAM: linear in the lr (group 0's base units), clamped into [rho_min, rho_max]."""
    rho = RHO_MIN + (RHO_MAX - RHO_MIN) * (lr - lr_min) / (lr_max - lr_min)
    return min(max(rho, RHO_MIN), RHO_MAX)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))


def one_step(method, model, x=None):
    x = torch.randn(4, 4) if x is None else x
    y = torch.tensor([0, 1, 2, 0])

    def forward():
        z = model(x)
        return F.cross_entropy(z, y), z

    return method.train_step(forward, inputs=x)


# ----------------------------------------------------------------------------- GSAM's rho_t
def test_gsam_rho_under_timm_layer_decay_and_cosine():
    """Old code read group 0's lr, which timm's layer decay scales by 0.65^depth: rho_t at the peak was far below
    rho_max. The multiplier is the same for every group; here it is timm's cosine with a warm-up."""
    import timm.optim
    import timm.scheduler
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(img_size=8, patch_size=4, in_chans=3, num_classes=3, embed_dim=8, depth=2, num_heads=2)
    base_lr, lr_min, warm_init, t_initial, warmup_t = 0.1, 0.002, 0.01, 8, 2
    opt = timm.optim.create_optimizer_v2(vit, "sgd", lr=base_lr, weight_decay=0.0, layer_decay=0.65)
    scales = [g["lr_scale"] for g in opt.param_groups]
    assert scales[0] < 0.5 and max(scales) == 1.0  # group 0 is a decayed group
    method = optim.create("gsam", opt, model=vit, rho_max=RHO_MAX, rho_min=RHO_MIN, lr_min=lr_min)
    sched = timm.scheduler.CosineLRScheduler(
        opt, t_initial=t_initial, lr_min=lr_min, warmup_t=warmup_t, warmup_lr_init=warm_init
    )
    x, y = torch.randn(2, 3, 8, 8), torch.tensor([0, 2])
    rhos, want = [], []
    for t in range(t_initial):
        sched.step(t)
        out = vit_step(method, vit, x, y)
        rhos.append(out.rho)
        if t < warmup_t:
            lr = warm_init + t * (base_lr - warm_init) / warmup_t
        else:
            lr = lr_min + 0.5 * (base_lr - lr_min) * (1 + math.cos(math.pi * t / t_initial))
        want.append(expected_rho(lr, base_lr, lr_min))
    assert rhos == pytest.approx(want, rel=1e-12, abs=1e-15)


def vit_step(method, vit, x, y):
    def forward():
        z = vit(x)
        return F.cross_entropy(z, y), z

    return method.train_step(forward)


@pytest.mark.parametrize("built", ["before", "after"], ids=["gsam-built-before-scheduler", "gsam-built-after"])
def test_gsam_rho_under_one_cycle(built):
    """OneCycleLR's initial_lr is max_lr / div_factor: old code took that as lr_max, so rho_t reached 2.26 against
    rho_max = 0.1. lr_max=None now means the group's max_lr, and rho_t stays in [rho_min, rho_max]."""
    model = mlp()
    base = torch.optim.SGD(model.parameters(), lr=0.1)

    def make():
        return optim.create("gsam", base, model=model, rho_max=RHO_MAX, rho_min=RHO_MIN, lr_min=0.0)

    method = make() if built == "before" else None
    sched = torch.optim.lr_scheduler.OneCycleLR(base, max_lr=0.1, total_steps=10)
    method = method or make()
    assert method.lr_max == 0.1
    rhos, want = [], []
    for _ in range(10):
        lr = base.param_groups[0]["lr"]  # the schedule's current lr, read before the step uses it
        rhos.append(one_step(method, model).rho)
        want.append(expected_rho(lr, 0.1, 0.0))
        sched.step()
    assert rhos == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert all(RHO_MIN <= r <= RHO_MAX for r in rhos) and max(rhos) == pytest.approx(RHO_MAX, rel=1e-12)


def test_gsam_rho_with_per_group_lrs_under_torch_cosine():
    """Layer decay as per-group lrs (no lr_scale), torch's cosine: group 0's own ratio lr / initial_lr is the multiplier;
    a user lr_max is in group 0's units."""
    model = mlp()
    decay = 0.65
    groups = [
        {"params": [model[0].weight, model[0].bias], "lr": 0.1 * decay**2},
        {"params": [model[2].weight, model[2].bias], "lr": 0.1},
    ]
    base = torch.optim.SGD(groups, lr=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(base, T_max=6)
    method = optim.create("gsam", base, model=model, rho_max=RHO_MAX, rho_min=RHO_MIN, lr_min=0.0)
    for t in range(7):
        out = one_step(method, model)
        assert out.rho == pytest.approx(
            expected_rho(0.5 * (1 + math.cos(math.pi * t / 6)), 1.0, 0.0), rel=1e-12, abs=1e-15
        )
        sched.step()


def test_gsam_rho_is_clamped_below_lr_min_and_above_lr_max():
    """Old code extrapolated: below lr_min rho_t went negative."""
    model = mlp()
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    factors = [1.5, 1.0, 0.5, 0.1, 0.0]
    sched = torch.optim.lr_scheduler.LambdaLR(base, lambda t: factors[min(t, len(factors) - 1)])
    method = optim.create("gsam", base, model=model, rho_max=RHO_MAX, rho_min=RHO_MIN, lr_max=0.1, lr_min=0.02)
    rhos = []
    for _ in factors:
        rhos.append(one_step(method, model).rho)
        sched.step()
    want = [RHO_MAX, RHO_MAX, expected_rho(0.05, 0.1, 0.02), RHO_MIN, RHO_MIN]
    assert rhos == pytest.approx(want, rel=1e-12, abs=1e-15)


# ----------------------------------------------------------------------------- one model rule
CLASSES = {
    "sam": lambda base, **kw: optim.SAM(base, **kw),
    "asam": lambda base, **kw: optim.SAM(base, adaptive=True, **kw),
    "gsam": lambda base, **kw: optim.GSAM(base, **kw),
    "looksam": lambda base, **kw: optim.LookSAM(base, **kw),
}


@pytest.mark.parametrize("name", list(METHODS))
def test_the_classes_and_create_ask_for_the_model_alike(name):
    """Old code: optim.SAM(opt) without model= silently gave up BN protection (num_batches_tracked +2 per step)."""
    model = mlp()
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    needs = "model" in METHODS[name].needs
    if name in CLASSES:
        assert needs
        with pytest.raises(
            ValueError, match=r"^model must be the nn.Module being trained.*got model=None; .*pass model=net"
        ):
            CLASSES[name](base)
        CLASSES[name](base, model=model)
    if needs:
        with pytest.raises(ValueError, match=f"'{name}' needs model"):
            optim.create(name, base, num_samples=4, num_classes=3)
    else:
        assert name not in CLASSES


# ----------------------------------------------------------------------------- SAF without a record
def _kl(target, student, tau):
    log_t, log_s = torch.log_softmax(target / tau, -1), torch.log_softmax(student / tau, -1)
    return (log_t.exp() * (log_t - log_s)).sum(-1)


def _logits(n, seed):
    return torch.randn(n, 3, generator=torch.Generator().manual_seed(seed))


def test_saf_leaves_out_a_sample_without_logits_from_e_tilde_epochs_ago():
    """Old code read zeros (a uniform target) for a sample the sampler left out of epoch e - e_tilde."""
    saf = optim.SAF(6, 3, lam=1.0, tau=1.0, e_tilde=1, e_start=1)
    saf.loss(_logits(6, 0), torch.arange(6), 0)
    seen = torch.tensor([0, 1, 2])
    z1 = _logits(3, 1)
    saf.loss(z1, seen, 1)  # epoch 1 sees samples 0-2 only
    z2 = _logits(4, 2)
    got = saf.loss(z2, torch.tensor([0, 1, 3, 4]), 2)
    want = _kl(z1[:2].half().float(), z2[:2], 1.0).mean()  # samples 3, 4 have no record: left out
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    # A batch with no recorded sample gives zero, a finite number, and no gradient.
    z = _logits(2, 3).requires_grad_(True)
    none = saf.loss(z, torch.tensor([3, 5]), 2)
    none.backward()
    assert none.item() == 0.0 and torch.equal(z.grad, torch.zeros_like(z))


def test_saf_empties_a_slot_when_a_new_epoch_starts_writing_it():
    """Old code: a sample unseen in epoch 2 read, at epoch 3, the logits of epoch 0 left in the reused slot."""
    saf = optim.SAF(6, 3, lam=1.0, tau=1.0, e_tilde=1, e_start=1)
    for e in (0, 1):
        saf.loss(_logits(6, e), torch.arange(6), e)
    z2 = _logits(3, 2)
    saf.loss(z2, torch.arange(3), 2)  # samples 3-5 unseen in epoch 2; slot 0 held epoch 0
    z3 = _logits(6, 3)
    got = saf.loss(z3, torch.arange(6), 3)
    torch.testing.assert_close(got, _kl(z2.half().float(), z3[:3], 1.0).mean(), rtol=1e-6, atol=1e-7)


def test_saf_refuses_to_read_an_epoch_that_recorded_nothing():
    saf = optim.SAF(4, 3, e_tilde=1, e_start=1)
    saf.loss(_logits(4, 0), torch.arange(4), 0)
    with pytest.raises(ValueError, match=r"^epoch must follow on.*epoch=3 reads the logits of epoch 2.*holds epoch 0"):
        saf.loss(_logits(4, 1), torch.arange(4), 3)  # epochs 1 and 2 never ran
    # A checkpoint from before slot epochs were kept loads, and its slots are trusted.
    legacy = optim.SAF(4, 3, e_tilde=1, e_start=1)
    legacy.load_state_dict({"buffer": saf.state_dict()["buffer"]})
    assert torch.isfinite(legacy.loss(_logits(4, 1), torch.arange(4), 2))


def test_mesa_asks_for_inputs_from_the_first_step():
    """Old code failed only at epoch e_start + 1, after e_start epochs of training."""
    model = mlp()
    method = optim.create("mesa", torch.optim.SGD(model.parameters(), lr=0.1), model=model, e_start=5)
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 2, 0])

    def forward():
        z = model(x)
        return F.cross_entropy(z, y), z

    with pytest.raises(ValueError, match="mesa needs inputs="):
        method.train_step(forward, epoch=0)
