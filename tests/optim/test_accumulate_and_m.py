"""Micro-batches (``accumulate``) equal the whole-batch step in float64 for every method; BatchNorm sees pass 1's
micro-batches; m-sharpness (``m``) against a float64 reference, ``m = batch`` is SAM."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import optim
from optim import METHODS

N, D_IN, C = 12, 5, 3


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D_IN, 7), nn.Tanh(), nn.Linear(7, C)).double()


def data(t):
    g = torch.Generator().manual_seed(40 + t)
    return (
        torch.randn(N, D_IN, generator=g, dtype=torch.float64),
        torch.randint(0, C, (N,), generator=g),
        torch.randperm(N, generator=g),
    )


def forward_of(model, x, y, seen=None):
    def forward(rows=None, reduction="mean"):
        xs, ys = (x, y) if rows is None else (x[rows], y[rows])
        if seen is not None:
            seen.append(xs.shape[0])
        z = model(xs)
        return F.cross_entropy(z, ys, reduction=reduction), z

    return forward


def trajectory(name, accumulate, steps=4, base="sgd", **hp):
    model = mlp()
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
        if base == "sgd"
        else torch.optim.AdamW(model.parameters(), lr=0.01)
    )
    method = optim.create(
        name,
        opt,
        model=model,
        num_samples=N,
        num_classes=C,
        accumulate=accumulate,
        **{**METHODS[name].small.hparams, **hp},
    )
    seen, losses = [], []
    for t in range(steps):
        x, y, idx = data(t)
        out = method.train_step(forward_of(model, x, y, seen), inputs=x, indices=idx, epoch=t)
        losses.append(out.loss)
    return [p.detach().clone() for p in model.parameters()], torch.stack(losses), seen


@pytest.mark.parametrize("base", ["sgd", "adamw"])
@pytest.mark.parametrize("name", list(METHODS))
def test_micro_batches_equal_the_whole_batch_step(name, base):
    # docs/algorithms.md, "Gradient accumulation": each pass runs over the micro-batches, their gradients
    # weighted by size add up to the batch mean's, one perturbation per accumulated gradient.
    whole, whole_loss, _ = trajectory(name, 1, base=base)
    for accumulate in (3, 5):  # 12 = 4+4+4, and uneven 3+3+2+2+2
        parts, parts_loss, seen = trajectory(name, accumulate, base=base)
        assert max(seen) < N and max(seen) <= -(-N // accumulate)  # never a whole batch at once
        for a, b in zip(parts, whole):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(parts_loss, whole_loss, rtol=1e-12, atol=1e-14)
        assert not any(torch.equal(a, b) for a, b in zip(parts, mlp().parameters()))  # it trained


def test_accumulate_is_validated(helpers):
    with pytest.raises(ValueError, match=r"accumulate must satisfy accumulate >= 1.*accumulate=0"):
        helpers.build("sam", helpers.make_model(), accumulate=0)


def test_micro_batches_need_the_batch_to_split(helpers):
    model = helpers.make_model()
    x, y, _ = helpers.make_batch(0)
    method = helpers.build("sam", model, accumulate=2)
    with pytest.raises(ValueError, match="inputs= must be the batch tensor"):
        method.train_step(helpers.make_forward(model, x, y))


@pytest.mark.parametrize("name", ["sam", "gsam", "esam"])
def test_batchnorm_statistics_come_from_pass_1s_micro_batches(name, helpers):
    model = helpers.make_model()
    method = helpers.build(name, model, accumulate=2, hparams={"gamma": 1.0} if name == "esam" else {})
    for t in range(2):
        x, y, idx = helpers.make_batch(t)
        ref = helpers.make_model()
        ref.load_state_dict(model.state_dict())
        ref(x[:4])
        ref(x[4:])  # the loop's BN: one forward per micro-batch, in train mode
        method.train_step(helpers.make_forward(model, x, y), inputs=x, indices=idx)
        for name_, buf in model.bn.named_buffers():
            torch.testing.assert_close(buf, getattr(ref.bn, name_), rtol=1e-6, atol=1e-7, msg=name_)


# ----------------------------------------------------------------------------- m-sharpness
def m_reference(ws0, m, steps=3, rho=0.05, lr=0.1, mu=0.9):
    """SGD with momentum on the size-weighted mean of each m-group's SAM gradient, written out."""
    ws = [w.detach().clone() for w in ws0]
    buf = None

    def grad(ws_, x, y):
        ws_ = [w.detach().clone().requires_grad_(True) for w in ws_]
        z = torch.tanh(x @ ws_[0].T + ws_[1]) @ ws_[2].T + ws_[3]
        return torch.autograd.grad(F.cross_entropy(z, y), ws_)

    for t in range(steps):
        x, y, _ = data(t)
        u = [torch.zeros_like(w) for w in ws]
        for start in range(0, N, m):
            xs, ys = x[start : start + m], y[start : start + m]
            g = grad(ws, xs, ys)
            norm = torch.sqrt(sum((gi * gi).sum() for gi in g))
            gp = grad([w + rho * gi / (norm + 1e-12) for w, gi in zip(ws, g)], xs, ys)
            u = [ui + xs.shape[0] / N * gi for ui, gi in zip(u, gp)]
        buf = u if buf is None else [mu * b + ui for b, ui in zip(buf, u)]
        ws = [w - lr * b for w, b in zip(ws, buf)]
    return ws


@pytest.mark.parametrize("m", [1, 4, 5])
def test_m_sharpness_reference(m):
    model = mlp()
    start = [p.detach().clone() for p in model.parameters()]
    method = optim.create("sam", torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model=model, rho=0.05, m=m)
    for t in range(3):
        x, y, _ = data(t)
        method.train_step(forward_of(model, x, y), inputs=x)
    for a, b in zip(model.parameters(), m_reference(start, m)):
        torch.testing.assert_close(a.detach(), b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["sam", "asam"])
def test_m_equal_to_the_batch_is_sam(name):
    sam, _, _ = trajectory(name, 1, steps=3)
    for m in (N, 2 * N):
        got, _, _ = trajectory(name, 1, steps=3, m=m)
        for a, b in zip(got, sam):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    split, _, _ = trajectory(name, 1, steps=3, m=N // 2)
    assert not all(torch.equal(a, b) for a, b in zip(split, sam))  # m < batch is another algorithm


def test_m_composes_with_micro_batches():
    one, _, _ = trajectory("sam", 1, steps=3, m=6)
    two, _, _ = trajectory("sam", 3, steps=3, m=6)  # each group of 6 in micro-batches of 2
    for a, b in zip(one, two):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_m_with_a_global_perturbation_is_refused(helpers):
    with pytest.raises(ValueError, match="m must satisfy m unset when global_perturbation=True"):
        helpers.build("sam", helpers.make_model(), global_perturbation=True, hparams={"m": 4})


def gam_m_reference(ws0, m, hp, steps=3, lr=0.1, mu=0.9):
    """SGD with momentum on the size-weighted mean of each m-group's GAM combination (docs/algorithms.md, "GAM"),
    each group's four gradients, norms and projection its own, written out."""
    ws = [w.detach().clone() for w in ws0]
    buf = None

    def grad(ws_, x, y):
        ws_ = [w.detach().clone().requires_grad_(True) for w in ws_]
        z = torch.tanh(x @ ws_[0].T + ws_[1]) @ ws_[2].T + ws_[3]
        return torch.autograd.grad(F.cross_entropy(z, y), ws_)

    def norm(vs):
        return torch.sqrt(sum((v * v).sum() for v in vs))

    def along(base, u, r):
        return [w + r * ui / (norm(u) + 1e-12) for w, ui in zip(base, u)]

    for t in range(steps):
        x, y, _ = data(t)
        u = [torch.zeros_like(w) for w in ws]
        for start in range(0, N, m):
            xs, ys = x[start : start + m], y[start : start + m]
            g0 = grad(ws, xs, ys)
            g1 = grad(along(ws, g0, hp["rho_prime"]), xs, ys)
            w2 = along(ws, [a - b for a, b in zip(g1, g0)], hp["rho"])
            g2 = grad(w2, xs, ys)
            g3 = grad(along(w2, g2, hp["rho_prime"]), xs, ys)
            h = [hp["alpha"] * a + (1 - hp["alpha"]) * b for a, b in zip(g1, g3)]
            p = [a + (1 - hp["beta"]) * b for a, b in zip(g0, g2)]
            c = sum((a * b).sum() for a, b in zip(p, h)) / norm(h) ** 2
            final = [hi - hp["gamma"] * (pi - c * hi) for hi, pi in zip(h, p)]
            u = [ui + xs.shape[0] / N * fi for ui, fi in zip(u, final)]
        buf = u if buf is None else [mu * b + ui for b, ui in zip(buf, u)]
        ws = [w - lr * b for w, b in zip(ws, buf)]
    return ws


@pytest.mark.parametrize("m", [1, 5])
def test_gam_m_sharpness_reference(m):
    hp = {"rho": 0.2, "rho_prime": 0.05, "alpha": 0.3, "beta": 0.4, "gamma": 0.5}
    model = mlp()
    start = [p.detach().clone() for p in model.parameters()]
    method = optim.create("gam", torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model=model, m=m, **hp)
    seen = []
    for t in range(3):
        x, y, _ = data(t)
        method.train_step(forward_of(model, x, y, seen), inputs=x)
    assert seen[:8] == [m] * 8 and len(seen) == 3 * 4 * -(-N // m)  # four passes per group of m rows
    for a, b in zip(model.parameters(), gam_m_reference(start, m, hp)):
        torch.testing.assert_close(a.detach(), b, rtol=1e-10, atol=1e-12)


def test_gam_m_equal_to_the_batch_is_gam_and_composes_with_micro_batches():
    gam, _, _ = trajectory("gam", 1, steps=3)
    for m in (N, 2 * N):
        got, _, _ = trajectory("gam", 1, steps=3, m=m)
        for a, b in zip(got, gam):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    split, _, _ = trajectory("gam", 1, steps=3, m=6)
    assert not all(torch.equal(a, b) for a, b in zip(split, gam))  # m < batch is another algorithm
    parts, _, _ = trajectory("gam", 3, steps=3, m=6)  # each group of 6 in micro-batches of 2
    for a, b in zip(parts, split):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="m must satisfy m unset when global_perturbation=True"):
        optim.check_hparams("gam", base="SGD", base_keeps_momentum=True, global_perturbation=True, m=4)
