"""Agreement with the peer implementation pytorch_optimizer 4.1 (SAM, ASAM with eta=0, GSAM): three steps of a
BN model under SGD with momentum and weight decay, parameters equal within rtol 1e-5 in fp32.

Configured so that only the shared algorithm is compared:
- BatchNorm: the peer leaves it to the caller (SAM) or sets momentum=0 in pass 2 (GSAM), which keeps
  running_mean/var but still bumps num_batches_tracked; we restore all three (docs/algorithms.md, "BatchNorm"). So the
  peer's pass 2 runs with momentum=0 and we compare parameters and running_mean/var, not the counter.
- ASAM: the peer's T is |w| (no eta): compare with eta=0.
- GSAM: the peer's g_p_hat has its 1e-12 inside a product of norms and it un-perturbs by subtracting eps
  (we copy w back); both differ by rounding only.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import optim

po = pytest.importorskip("pytorch_optimizer")
from pytorch_optimizer.lr_scheduler.proportion import ProportionScheduler  # noqa: E402
from pytorch_optimizer.optimizer.sam import GSAM as PeerGSAM  # noqa: E402
from pytorch_optimizer.optimizer.sam import SAM as PeerSAM  # noqa: E402
from pytorch_optimizer.optimizer.utils.model import disable_running_stats, enable_running_stats  # noqa: E402

SGD_KW = dict(lr=0.05, momentum=0.9, weight_decay=5e-4)
STEPS = 3


def _state(model):
    return [p.detach().clone() for p in model.parameters()] + [
        model.bn.running_mean.clone(),
        model.bn.running_var.clone(),
    ]


def _ours(helpers, name, **hp):
    model = helpers.make_model()
    base = torch.optim.SGD(model.parameters(), **SGD_KW)
    sched = torch.optim.lr_scheduler.LambdaLR(base, lambda t: 1.0 - 0.2 * t)
    method = optim.create(name, base, model=model, **hp)
    for t in range(STEPS):
        x, y, _ = helpers.make_batch(t)
        method.train_step(helpers.make_forward(model, x, y))
        sched.step()
    return _state(model)


def _peer_sam(helpers, adaptive, rho):
    model = helpers.make_model()
    opt = PeerSAM(model.parameters(), torch.optim.SGD, rho=rho, adaptive=adaptive, **SGD_KW)
    sched = torch.optim.lr_scheduler.LambdaLR(opt.base_optimizer, lambda t: 1.0 - 0.2 * t)
    for t in range(STEPS):
        x, y, _ = helpers.make_batch(t)
        enable_running_stats(model)
        F.cross_entropy(model(x), y).backward()
        opt.first_step(zero_grad=True)
        disable_running_stats(model)
        F.cross_entropy(model(x), y).backward()
        opt.second_step(zero_grad=True)
        sched.step()
    enable_running_stats(model)
    return _state(model)


def _assert_close(ours, peer):
    for a, b in zip(ours, peer):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_sam_matches_peer(helpers):
    _assert_close(_ours(helpers, "sam", rho=0.05), _peer_sam(helpers, adaptive=False, rho=0.05))


def test_asam_eta0_matches_peer(helpers):
    _assert_close(_ours(helpers, "asam", rho=0.5, eta=0.0), _peer_sam(helpers, adaptive=True, rho=0.5))


def test_gsam_matches_peer(helpers):
    rho_max, rho_min, alpha = 0.1, 0.02, 0.3
    ours = _ours(helpers, "gsam", rho_max=rho_max, rho_min=rho_min, alpha=alpha, lr_min=0.0)

    model = helpers.make_model()
    base = torch.optim.SGD(model.parameters(), **SGD_KW)
    sched = torch.optim.lr_scheduler.LambdaLR(base, lambda t: 1.0 - 0.2 * t)
    rho_sched = ProportionScheduler(sched, max_lr=SGD_KW["lr"], min_lr=0.0, max_value=rho_max, min_value=rho_min)
    opt = PeerGSAM(model.parameters(), base, model, rho_sched, alpha=alpha)
    for t in range(STEPS):
        x, y, _ = helpers.make_batch(t)
        opt.set_closure(F.cross_entropy, x, y)
        opt.step()
        sched.step()
        opt.update_rho_t()
    _assert_close(ours, _state(model))
    assert abs(opt.rho_t - (rho_min + (rho_max - rho_min) * (1 - 0.2 * STEPS))) < 1e-12
