"""The methods since 2023, each against a float64 hand formula, its reductions and a peer library where one ships it:
WSAM (Yue et al. 2023), GCSAM (gradient centralisation before the ascent)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import optim

TOL = dict(rtol=0, atol=1e-12)


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3)).double()


def data(step):
    g = torch.Generator().manual_seed(70 + step)
    return torch.randn(8, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (8,), generator=g)


def forward_of(model, x, y):
    def forward(rows=None, reduction="mean"):
        xs, ys = (x, y) if rows is None else (x[rows], y[rows])
        z = model(xs)
        return F.cross_entropy(z, ys, reduction=reduction), z

    return forward


def grads(model, ws, x, y):
    leaves = [w.detach().clone().requires_grad_(True) for w in ws]
    z = torch.func.functional_call(model, dict(zip([n for n, _ in model.named_parameters()], leaves)), (x,))
    return list(torch.autograd.grad(F.cross_entropy(z, y), leaves))


def norm(vs):
    return torch.sqrt(sum((v * v).sum() for v in vs))


def train(name, model, steps, base=None, **hp):
    base = base or torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    method = optim.create(name, base, model=model, **hp)
    for t in range(steps):
        x, y = data(t)
        method.train_step(forward_of(model, x, y), inputs=x)
    return [p.detach().clone() for p in model.parameters()]


# ----------------------------------------------------------------------------- WSAM
@pytest.mark.parametrize("decouple", [True, False])
def test_wsam_first_steps_by_hand(decouple):
    rho, gamma, lr, mu = 0.07, 0.8, 0.1, 0.9
    alpha = gamma / (1 - gamma)
    model = mlp()
    ws = [p.detach().clone() for p in model.parameters()]
    buf = None
    for t in range(2):
        x, y = data(t)
        g = grads(model, ws, x, y)
        gp = grads(model, [w + rho * gi / (norm(g) + 1e-12) for w, gi in zip(ws, g)], x, y)
        s = [a - b for a, b in zip(gp, g)]
        u = g if decouple else [gi + alpha * si for gi, si in zip(g, s)]
        buf = u if buf is None else [mu * b + ui for b, ui in zip(buf, u)]
        ws = [w - lr * b for w, b in zip(ws, buf)]
        if decouple:  # the sharpness step outside the base optimizer's momentum
            ws = [w - lr * alpha * si for w, si in zip(ws, s)]
    got = train("wsam", mlp(), 2, rho=rho, gamma=gamma, decouple=decouple)
    for a, b in zip(got, ws):
        torch.testing.assert_close(a, b, **TOL)


def test_wsam_reductions():
    sam = train("sam", mlp(), 3, rho=0.05)
    for a, b in zip(train("wsam", mlp(), 3, rho=0.05, gamma=0.5, decouple=False), sam):
        torch.testing.assert_close(a, b, **TOL)
    base = train("none", mlp(), 3)
    for decouple in (True, False):
        for hp in ({"rho": 0.0}, {"gamma": 0.0}):
            for a, b in zip(train("wsam", mlp(), 3, decouple=decouple, **hp), base):
                assert torch.equal(a, b), (decouple, hp)


@pytest.mark.parametrize("decouple", [True, False])
def test_wsam_matches_pytorch_optimizer(decouple):
    from pytorch_optimizer import WSAM as PeerWSAM

    ours = train("wsam", mlp(), 3, base=None, rho=0.05, gamma=0.9, decouple=decouple)
    model = mlp()
    peer = PeerWSAM(
        model, model.parameters(), torch.optim.SGD, rho=0.05, gamma=0.9, decouple=decouple, lr=0.1, momentum=0.9
    )
    for t in range(3):
        x, y = data(t)
        F.cross_entropy(model(x), y).backward()
        peer.first_step(zero_grad=True)
        F.cross_entropy(model(x), y).backward()
        peer.second_step(zero_grad=True)
    # The peer's global gradient norm is a float32 number even for float64 gradients (its get_global_gradient_norm),
    # so eps agrees to float32's rounding (2e-8 relative seen), not float64's.
    for a, b in zip(ours, model.parameters()):
        torch.testing.assert_close(a, b.detach(), rtol=1e-6, atol=1e-9)


# ----------------------------------------------------------------------------- GCSAM: SAM's gc knob
def conv_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 3, 3), nn.Tanh(), nn.Flatten(), nn.Linear(3 * 2 * 2, 3)).double()


def image_data(step):
    g = torch.Generator().manual_seed(90 + step)
    return torch.randn(8, 2, 4, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (8,), generator=g)


def centralised(g):
    return g - g.mean(dim=tuple(range(1, g.dim())), keepdim=True) if g.dim() > 1 else g


def gcsam_by_hand(model, steps, rho, p=2.0, lr=0.1):
    ws = [q.detach().clone() for q in model.parameters()]
    for t in range(steps):
        x, y = image_data(t)
        gc = [centralised(gi) for gi in grads(model, ws, x, y)]
        eps = [rho * gi / (norm(gc) + 1e-12) for gi in gc] if p == 2 else [rho * torch.sign(gi) for gi in gc]
        gp = grads(model, [w + e for w, e in zip(ws, eps)], x, y)
        ws = [w - lr * gi for w, gi in zip(ws, gp)]
    return ws


def train_images(model, steps, **hp):
    method = optim.create("sam", torch.optim.SGD(model.parameters(), lr=0.1), model=model, **hp)
    for t in range(steps):
        x, y = image_data(t)
        method.train_step(forward_of(model, x, y), inputs=x)
    return [q.detach().clone() for q in model.parameters()]


@pytest.mark.parametrize("p", [2.0, float("inf")])
def test_gcsam_centralises_each_weight_tensors_gradient_before_the_ascent(p):
    got = train_images(conv_net(), 3, rho=0.05, p=p, gc=True)
    want = gcsam_by_hand(conv_net(), 3, rho=0.05, p=p)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)
    # The case tells GCSAM from SAM: centralising moves the result.
    sam = train_images(conv_net(), 3, rho=0.05, p=p)
    assert max((a - b).abs().max() for a, b in zip(got, sam)) > 1e-6


def test_gcsam_with_rho_zero_is_the_base_optimizer():
    for a, b in zip(train_images(conv_net(), 3, rho=0.0, gc=True), train_images(conv_net(), 3, rho=0.0)):
        assert torch.equal(a, b)


def test_gcsam_matches_pytorch_optimizer_sam_with_use_gc():
    """pytorch_optimizer's SAM(use_gc=True) takes the norm of g before centralising it (its eps is
    rho g_c / ||g||, shorter than rho); ours is rho g_c / ||g_c||, SAM's radius. One step with the peer's rho scaled
    by ||g|| / ||g_c|| is the same step."""
    from pytorch_optimizer import SAM as PeerSAM

    rho = 0.05
    model = conv_net()
    x, y = image_data(0)
    g = grads(model, list(model.parameters()), x, y)
    ratio = float(norm([centralised(gi) for gi in g]) / norm(g))
    assert ratio < 0.99  # the two normalisations differ in this case
    peer = PeerSAM(model.parameters(), torch.optim.SGD, rho=rho / ratio, use_gc=True, lr=0.1)
    F.cross_entropy(model(x), y).backward()
    peer.first_step(zero_grad=True)
    F.cross_entropy(model(x), y).backward()
    peer.second_step(zero_grad=True)
    ours = train_images(conv_net(), 1, rho=rho, gc=True)
    # The peer's global norm is a float32 number (see the WSAM peer test).
    for a, b in zip(ours, model.parameters()):
        torch.testing.assert_close(a, b.detach(), rtol=1e-6, atol=1e-9)
