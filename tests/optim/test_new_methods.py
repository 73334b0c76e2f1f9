"""ESAM, F-SAM and MSAM beyond the float64 references: the settings that reduce them to SAM or the base
optimizer, ESAM's weight and data selection as they happen, MSAM's need for a momentum."""

from __future__ import annotations

import math

import pytest
import torch


def _trajectory(helpers, name, steps=3, **hp):
    model = helpers.make_model()
    method = helpers.build(name, model, hparams=hp)
    helpers.run(method, model, steps)
    return [p.detach().clone() for p in model.parameters()]


def test_esam_with_beta_1_and_gamma_1_is_sam(helpers):
    sam = _trajectory(helpers, "sam", rho=0.05)
    esam = _trajectory(helpers, "esam", rho=0.05, beta=1.0, gamma=1.0)
    for a, b in zip(esam, sam):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_fsam_with_sigma_0_is_sam(helpers):
    sam = _trajectory(helpers, "sam", rho=0.05)
    fsam = _trajectory(helpers, "fsam", rho=0.05, sigma=0.0)
    for a, b in zip(fsam, sam):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not all(torch.equal(a, b) for a, b in zip(_trajectory(helpers, "fsam", rho=0.05), sam))


def test_esam_perturbs_and_differentiates_only_the_drawn_tensors(helpers):
    model = helpers.make_model()
    beta, rho = 0.5, 0.05
    method = helpers.build("esam", model, hparams={"rho": rho, "beta": beta, "gamma": 0.5})
    x, y, idx = helpers.make_batch(0)
    calls = []
    inner = helpers.make_forward(model, x, y)

    def forward(rows=None, reduction="mean"):
        calls.append(
            (
                [p.requires_grad for p in model.parameters()],
                [p.detach().clone() for p in model.parameters()],
                None if rows is None else rows.clone(),
            )
        )
        return inner(rows, reduction)

    w0 = [p.detach().clone() for p in model.parameters()]
    method.train_step(forward, inputs=x, indices=idx)
    assert len(calls) == 3  # pass 1, the selection forward at w + eps, pass 2 on the selected rows
    kept = calls[0][0]
    assert 0 < sum(kept) < len(kept)  # this seed draws some tensors and leaves others out
    assert all(p.requires_grad for p in model.parameters())  # switched back on
    eps = [w - v for w, v in zip(calls[2][1], w0)]
    for k, e in zip(kept, eps):
        assert bool(e.abs().sum() > 0) == k  # only the drawn tensors are perturbed
    total = math.sqrt(sum(float((e * e).sum()) for e in eps))
    assert total == pytest.approx(rho / beta, rel=1e-5)  # ||eps|| = rho / beta over the drawn tensors
    rows = calls[2][2]
    assert rows is not None and rows.numel() == 4 and calls[1][2] is None  # gamma * 8 samples in pass 2


def test_esam_selects_the_samples_whose_loss_rises_most(helpers):
    model = helpers.make_model()
    method = helpers.build("esam", model, hparams={"rho": 0.5, "beta": 1.0, "gamma": 0.25})
    x, y, idx = helpers.make_batch(1)
    losses = []
    inner = helpers.make_forward(model, x, y)

    def forward(rows=None, reduction="mean"):
        out = inner(rows, reduction)
        losses.append((rows, out[0].detach()))
        return out

    method.train_step(forward, inputs=x, indices=idx)
    (_, before), (_, after), (rows, _) = losses
    rise = after - before
    assert sorted(rows.tolist()) == sorted(torch.topk(rise, 2).indices.tolist())


def test_esam_draws_from_its_own_generator(helpers):
    method = helpers.build("esam", helpers.make_model(), hparams={"beta": 0.5})
    x, y, idx = helpers.make_batch(0)
    torch.manual_seed(123)
    method.train_step(helpers.make_forward(method.model, x, y), inputs=x, indices=idx)
    after_step = torch.rand(3)
    torch.manual_seed(123)
    torch.testing.assert_close(after_step, torch.rand(3))  # the model's random streams are left alone


class _WithUnused(torch.nn.Module):
    """A linear classifier beside a layer its forward never uses (a head kept for later, a branch switched off)."""

    def __init__(self):
        super().__init__()
        self.used = torch.nn.Linear(6, 3)
        self.unused = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.used(x)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_esam_step_whose_draw_holds_only_unused_tensors_is_the_base_step(accumulate):
    """Old code raised "element 0 of tensors does not require grad": the used tensors were frozen for pass 1 and
    the loss had no graph. By ESAM's rule g_S = 0 there, so eps = 0: with gamma = 1 the step is the base step."""
    import random

    import torch.nn.functional as F

    import optim

    seed, beta = 0, 0.5
    # The method draws one number per tensor (used.weight, used.bias, unused.weight, unused.bias) from a
    # random.Random seeded with torch.initial_seed(): this seed keeps the unused tensors only.
    draws = random.Random(seed)
    assert [draws.random() < beta for _ in range(4)] == [False, False, True, True]
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = torch.arange(8) % 3

    def trained(name, **hp):
        torch.manual_seed(seed)
        model = _WithUnused().double()
        base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        method = optim.create(name, base, model=model, accumulate=accumulate, **hp)

        def forward(rows=None, reduction="mean"):
            xs, ys = (x, y) if rows is None else (x[rows], y[rows])
            z = model(xs)
            return F.cross_entropy(z, ys, reduction=reduction), z

        out = method.train_step(forward, inputs=x)
        assert all(p.requires_grad for p in model.parameters())
        return out, [p.detach().clone() for p in model.parameters()]

    out, esam = trained("esam", rho=0.05, beta=beta, gamma=1.0)
    _, base = trained("none")
    for a, b in zip(esam, base):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(out.perturbed_loss, out.loss, rtol=0, atol=0)  # the loss at w + 0


def test_msam_first_step_is_the_base_optimizer(helpers):
    # No momentum before the first step: no perturbation, the gradient at w.
    base_model, msam_model = helpers.make_model(), helpers.make_model()
    base = helpers.build("none", base_model)
    msam = helpers.build("msam", msam_model, hparams={"rho": 0.3})
    helpers.run(base, base_model, 1)
    helpers.run(msam, msam_model, 1)
    for a, b in zip(msam_model.parameters(), base_model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    helpers.run(base, base_model, 1, start=1)
    helpers.run(msam, msam_model, 1, start=1)
    assert not all(torch.equal(a, b) for a, b in zip(msam_model.parameters(), base_model.parameters()))


def test_msam_needs_a_momentum(helpers):
    model = helpers.make_model()
    with pytest.raises(
        ValueError, match=r"must keep a momentum for msam.*param group\(s\) \[0\].*SGD with momentum=0.9"
    ):
        helpers.build("msam", model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_msam_moves_only_an_l2_decay_to_the_perturbed_point():
    # docs/algorithms.md, MSAM "Weight decay": a decay the base adds to the gradient is taken at w + eps; a
    # decoupled one (AdamW, Adam with decoupled_weight_decay=True) acts on w, where the base applies it.
    from optim._msam import l2_decay

    w = [torch.nn.Parameter(torch.zeros(2))]
    cases = {
        torch.optim.SGD(w, lr=0.1, momentum=0.9, weight_decay=5e-4): 5e-4,
        torch.optim.Adam(w, lr=0.1, weight_decay=5e-4): 5e-4,
        torch.optim.Adam(w, lr=0.1, weight_decay=5e-4, decoupled_weight_decay=True): 0.0,
        torch.optim.AdamW(w, lr=0.1, weight_decay=5e-4): 0.0,
        torch.optim.SGD(w, lr=0.1, momentum=0.9): 0.0,
    }
    assert [l2_decay(opt, opt.param_groups[0]) for opt in cases] == list(cases.values())
