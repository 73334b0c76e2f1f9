"""The methods since 2023, each against a float64 hand formula, its reductions and a peer library where one ships it:
WSAM (Yue et al. 2023), GCSAM (gradient centralisation before the ascent), SAMPa (Xie et al. 2024), VaSSO (Li &
Giannakis 2023), RWP / m-ARWP (Li et al. 2024), GAM (Zhang et al. 2023),
Lookbehind-SAM (Mordido et al. 2024)."""

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


# ----------------------------------------------------------------------------- SAMPa
class Quadratic(nn.Module):
    """f(u, v) = 1/2 [u; v]^T A [u; v] - b^T [u; v]: gradient A w - b, known in closed form."""

    A = torch.tensor([[3.0, 0.5, 0.0], [0.5, 1.0, -0.2], [0.0, -0.2, 2.0]], dtype=torch.float64)
    b = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)

    def __init__(self):
        super().__init__()
        self.u = nn.Parameter(torch.tensor([0.4, -0.3], dtype=torch.float64))
        self.v = nn.Parameter(torch.tensor([1.2], dtype=torch.float64))

    def forward(self):
        w = torch.cat([self.u, self.v])
        return 0.5 * w @ self.A @ w - self.b @ w


def quadratic_grad(w):
    return Quadratic.A @ w - Quadratic.b


def sampa_on_quadratic(steps, **hp):
    model = Quadratic()
    base = torch.optim.SGD([{"params": [model.u], "lr": 0.1}, {"params": [model.v], "lr": 0.05}], lr=0.1)
    method = optim.create("sampa", base, model=model, **hp)

    def forward(rows=None, reduction="mean"):
        loss = model()
        return loss, loss.reshape(1, 1)

    outs = [method.train_step(forward) for _ in range(steps)]
    return torch.cat([model.u.detach(), model.v.detach()]), outs


def test_sampa_on_a_quadratic_by_hand():
    """Three steps of the paper's equations written out: x~ = x + rho d/||d||, y' = x - lr d, x <- x - lr ((1 - lmbda)
    grad(x~) + lmbda grad(y')), d <- grad(y'); no d on the first step (x~ = y' = x); lr per param group."""
    rho, lmbda = 0.2, 0.3
    lr = torch.tensor([0.1, 0.1, 0.05], dtype=torch.float64)
    x = torch.tensor([0.4, -0.3, 1.2], dtype=torch.float64)
    d = None
    for _ in range(3):
        xt = x if d is None else x + rho * d / (d.norm() + 1e-12)
        y = x if d is None else x - lr * d
        d = quadratic_grad(y)
        x = x - lr * ((1 - lmbda) * quadratic_grad(xt) + lmbda * d)
    got, outs = sampa_on_quadratic(3, rho=rho, lmbda=lmbda)
    torch.testing.assert_close(got, x, **TOL)
    assert [o.perturbed for o in outs] == [False, True, True]
    assert all(o.passes == 2.0 for o in outs)


def test_sampa_reductions():
    """rho = 0 and lmbda = 0 is the base optimizer bit for bit; lmbda = 0 alone is SAM along the last step's
    optimistic gradient, so it is not the base optimizer."""
    base = train("none", mlp(), 3)
    for a, b in zip(train("sampa", mlp(), 3, rho=0.0, lmbda=0.0), base):
        assert torch.equal(a, b)
    assert not all(torch.equal(a, b) for a, b in zip(train("sampa", mlp(), 3, rho=0.0, lmbda=0.5), base))
    assert not all(torch.equal(a, b) for a, b in zip(train("sampa", mlp(), 3, rho=0.05, lmbda=0.0), base))


def test_sampa_resumes_exactly():
    """d, the gradient at y kept between steps, is in the method's state: a run stopped after step 2 and resumed in a
    fresh object continues bit for bit."""
    whole = train("sampa", mlp(), 4, rho=0.05, lmbda=0.2)
    model = mlp()
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    method = optim.create("sampa", base, model=model, rho=0.05, lmbda=0.2)
    for t in range(2):
        x, y = data(t)
        method.train_step(forward_of(model, x, y), inputs=x)
    state = method.state_dict()
    base2 = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    resumed = optim.create("sampa", base2, model=model, rho=0.05, lmbda=0.2)
    resumed.load_state_dict(state)
    for t in range(2, 4):
        x, y = data(t)
        resumed.train_step(forward_of(model, x, y), inputs=x)
    for a, b in zip(model.parameters(), whole):
        assert torch.equal(a.detach(), b)


# ----------------------------------------------------------------------------- VaSSO
def test_vasso_first_steps_by_hand():
    """Three steps written out: d_0 = g_0, d_t = (1 - theta) d_{t-1} + theta g_t, the update gradient at
    w + rho d_t / (||d_t|| + 1e-12), SGD with momentum."""
    rho, theta, lr, mu = 0.07, 0.3, 0.1, 0.9
    model = mlp()
    ws = [p.detach().clone() for p in model.parameters()]
    buf = d = None
    for t in range(3):
        x, y = data(t)
        g = grads(model, ws, x, y)
        d = g if d is None else [(1 - theta) * a + theta * b for a, b in zip(d, g)]
        u = grads(model, [w + rho * di / (norm(d) + 1e-12) for w, di in zip(ws, d)], x, y)
        buf = u if buf is None else [mu * b + ui for b, ui in zip(buf, u)]
        ws = [w - lr * b for w, b in zip(ws, buf)]
    got = train("vasso", mlp(), 3, rho=rho, theta=theta)
    for a, b in zip(got, ws):
        torch.testing.assert_close(a, b, **TOL)


def test_vasso_reductions():
    """theta = 1 is SAM (d_t = g_t); rho = 0 the base optimizer, bit for bit; theta < 1 is neither."""
    sam = train("sam", mlp(), 3, rho=0.05)
    for a, b in zip(train("vasso", mlp(), 3, rho=0.05, theta=1.0), sam):
        assert torch.equal(a, b)
    base = train("none", mlp(), 3)
    for a, b in zip(train("vasso", mlp(), 3, rho=0.0, theta=0.4), base):
        assert torch.equal(a, b)
    assert not all(torch.equal(a, b) for a, b in zip(train("vasso", mlp(), 3, rho=0.05, theta=0.4), sam))


# ----------------------------------------------------------------------------- RWP / m-ARWP and GAM
class LeastSquares(nn.Module):
    """``mean_i 0.5 ||W x_i + c - y_i||^2``: a matrix (filters are its rows) and a vector, gradients in closed form."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(11)
        self.W = nn.Parameter(torch.randn(3, 4, generator=g, dtype=torch.float64))
        self.c = nn.Parameter(torch.randn(3, generator=g, dtype=torch.float64))

    def forward(self, x):
        return x @ self.W.T + self.c


def lsq_data(step, n=8):
    g = torch.Generator().manual_seed(90 + step)
    return torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randn(n, 3, generator=g, dtype=torch.float64)


def lsq_grad(W, c, x, y):
    r = x @ W.T + c - y
    return r.T @ x / x.shape[0], r.mean(0)


def train_lsq(name, steps, counter=None, seed=7, **hp):
    torch.manual_seed(seed)  # the methods' own generators start from torch.initial_seed()
    model = LeastSquares()
    method = optim.create(name, torch.optim.SGD(model.parameters(), lr=0.1), model=model, **hp)
    outs = []
    for t in range(steps):
        x, y = lsq_data(t)

        def forward(rows=None, reduction="mean", x=x, y=y):
            if counter is not None:
                counter.append(1)
            xs, ys = (x, y) if rows is None else (x[rows], y[rows])
            per = 0.5 * ((model(xs) - ys) ** 2).sum(1)
            return (per if reduction == "none" else per.mean()), model(xs)

        outs.append(method.train_step(forward, inputs=x))
    return model.W.detach().clone(), model.c.detach().clone(), outs


@pytest.mark.parametrize("m", [None, 4])
def test_marwp_first_steps_by_hand(m):
    """Three steps of m-ARWP written out: per group of m samples (the whole batch when m is None) a draw
    eps_W = z sigma ||W_i|| / sqrt(1 + eta sum_j F_W,ij) row by row and eps_c = z sigma ||c|| / sqrt(1 + eta F_c),
    z one float64 randn of W's and c's elements, split in that order, from a generator seeded with
    torch.initial_seed(); the update
    lmbda g(w + eps) + (1 - lmbda) g(w), then F <- beta F + g_p^2, with plain SGD."""
    sigma, lmbda, eta, beta, lr = 0.2, 0.3, 0.5, 0.9, 0.1
    torch.manual_seed(7)
    ref = LeastSquares()
    W, c = ref.W.detach().clone(), ref.c.detach().clone()
    gen = torch.Generator().manual_seed(7)
    FW, Fc = torch.zeros_like(W), torch.zeros_like(c)
    for t in range(3):
        x, y = lsq_data(t)
        gW, gc = lsq_grad(W, c, x, y)
        pW, pc = torch.zeros_like(W), torch.zeros_like(c)
        groups = [slice(0, 8)] if m is None else [slice(0, 4), slice(4, 8)]
        for rows in groups:
            zW, zc = torch.randn(15, generator=gen, dtype=torch.float64).split([12, 3])
            zW = zW.view(3, 4)
            eW = zW * sigma * W.norm(dim=1, keepdim=True) / torch.sqrt(1 + eta * FW.sum(dim=1, keepdim=True))
            ec = zc * sigma * c.norm() / torch.sqrt(1 + eta * Fc)
            aW, ac = lsq_grad(W + eW, c + ec, x[rows], y[rows])
            pW, pc = pW + aW / len(groups), pc + ac / len(groups)
        FW, Fc = beta * FW + pW**2, beta * Fc + pc**2
        W = W - lr * (lmbda * pW + (1 - lmbda) * gW)
        c = c - lr * (lmbda * pc + (1 - lmbda) * gc)
    counter = []
    gotW, gotc, outs = train_lsq("rwp", 3, counter, sigma=sigma, lmbda=lmbda, eta=eta, beta=beta, m=m)
    torch.testing.assert_close(gotW, W, **TOL)
    torch.testing.assert_close(gotc, c, **TOL)
    assert len(counter) == 3 * (1 + len(groups)) and all(o.perturbed and o.passes == 2.0 for o in outs)


def test_rwp_reductions_and_its_own_random_stream():
    """lmbda = 0 is the base optimizer bit for bit, in one pass; lmbda = 1 is plain RWP in one pass (the perturbed
    gradient alone); eta changes the draws' scale only once F is non-zero (the first step is m-RWP's); the draws leave
    torch's global stream where the base optimizer leaves it; another seed draws otherwise."""
    counter = []
    base = train_lsq("none", 3)
    zero = train_lsq("rwp", 3, counter, lmbda=0.0)
    assert torch.equal(zero[0], base[0]) and torch.equal(zero[1], base[1]) and len(counter) == 3
    assert all(o.passes == 1.0 for o in zero[2])
    counter.clear()
    plain = train_lsq("rwp", 3, counter, lmbda=1.0, eta=0.0, sigma=0.2)
    assert len(counter) == 3 and not torch.equal(plain[0], base[0])
    one_rwp, one_arwp = train_lsq("rwp", 1, eta=0.0), train_lsq("rwp", 1, eta=5.0)
    assert torch.equal(one_rwp[0], one_arwp[0])
    assert not torch.equal(train_lsq("rwp", 2, eta=0.0)[0], train_lsq("rwp", 2, eta=5.0)[0])
    train_lsq("rwp", 2, seed=3)
    after_rwp = torch.rand(3)
    train_lsq("none", 2, seed=3)
    assert torch.equal(after_rwp, torch.rand(3))
    assert not torch.equal(train_lsq("rwp", 2, seed=3)[0], train_lsq("rwp", 2, seed=4)[0])


def test_gam_first_steps_by_hand():
    """Three steps of the authors' four passes written out on the least-squares model: g1 at w + rho' g0/||g0||,
    w2 = w + rho (g1 - g0)/||g1 - g0||, g2 at w2, g3 at w2 + rho' g2/||g2|| (each ||.|| + 1e-12); h = alpha g1 +
    (1 - alpha) g3, p = g0 + (1 - beta) g2, update h - gamma (p - <p, h>/||h||^2 h), plain SGD."""
    rho, rho_prime, alpha, beta, gamma, lr = 0.3, 0.05, 0.2, 0.4, 0.6, 0.1
    torch.manual_seed(7)
    ref = LeastSquares()
    w = [ref.W.detach().clone(), ref.c.detach().clone()]

    def along(base, u, r):
        return [a + r * b / (norm(u) + 1e-12) for a, b in zip(base, u)]

    for t in range(3):
        x, y = lsq_data(t)
        g0 = list(lsq_grad(*w, x, y))
        g1 = list(lsq_grad(*along(w, g0, rho_prime), x, y))
        w2 = along(w, [a - b for a, b in zip(g1, g0)], rho)
        g2 = list(lsq_grad(*w2, x, y))
        g3 = list(lsq_grad(*along(w2, g2, rho_prime), x, y))
        h = [alpha * a + (1 - alpha) * b for a, b in zip(g1, g3)]
        p = [a + (1 - beta) * b for a, b in zip(g0, g2)]
        c = sum((a * b).sum() for a, b in zip(p, h)) / sum((a * a).sum() for a in h)
        w = [wi - lr * (hi - gamma * (pi - c * hi)) for wi, hi, pi in zip(w, h, p)]
    counter = []
    gotW, gotc, outs = train_lsq("gam", 3, counter, rho=rho, rho_prime=rho_prime, alpha=alpha, beta=beta, gamma=gamma)
    torch.testing.assert_close(gotW, w[0], **TOL)
    torch.testing.assert_close(gotc, w[1], **TOL)
    assert len(counter) == 12 and all(o.passes == 4.0 and o.rho == rho_prime for o in outs)


def test_gam_reductions():
    """alpha = 1 and gamma = 0 is SAM at radius rho' (the update is g1), bit for bit; with rho' = 0 too, the base
    optimizer; gamma > 0 or alpha < 1 is neither."""
    sam = train("sam", mlp(), 3, rho=0.05)
    for a, b in zip(train("gam", mlp(), 3, rho_prime=0.05, alpha=1.0, gamma=0.0), sam):
        assert torch.equal(a, b)
    base = train("none", mlp(), 3)
    for a, b in zip(train("gam", mlp(), 3, rho_prime=0.0, alpha=1.0, gamma=0.0), base):
        assert torch.equal(a, b)
    for hp in ({"rho_prime": 0.05, "alpha": 1.0, "gamma": 0.1}, {"rho_prime": 0.05, "alpha": 0.5, "gamma": 0.0}):
        assert not all(torch.equal(a, b) for a, b in zip(train("gam", mlp(), 3, **hp), sam))


# ----------------------------------------------------------------------------- Lookbehind-SAM
def test_lookbehind_first_steps_by_hand():
    """Three updates of Lookbehind-SAM written out on the least-squares model with plain SGD: from the slow weights
    theta, u_0 = phi_0 = theta; for i = 1..k, u_i = u_{i-1} + rho g(u_{i-1})/(||g(u_{i-1})|| + 1e-12) (the chain goes
    on from the previous perturbed point) and phi_i = phi_{i-1} - lr g(u_i); then theta <- alpha phi_k + (1 - alpha)
    theta. k + 1 forwards per update."""
    rho, k, alpha, lr = 0.3, 3, 0.6, 0.1
    torch.manual_seed(7)
    ref = LeastSquares()
    theta = [ref.W.detach().clone(), ref.c.detach().clone()]
    for t in range(3):
        x, y = lsq_data(t)
        point, fast = list(theta), list(theta)
        g = list(lsq_grad(*point, x, y))
        for _ in range(k):
            point = [u + rho * gi / (norm(g) + 1e-12) for u, gi in zip(point, g)]
            g = list(lsq_grad(*point, x, y))
            fast = [f - lr * gi for f, gi in zip(fast, g)]
        theta = [alpha * f + (1 - alpha) * s for f, s in zip(fast, theta)]
    counter = []
    gotW, gotc, outs = train_lsq("lookbehind", 3, counter, rho=rho, k=k, alpha=alpha)
    torch.testing.assert_close(gotW, theta[0], **TOL)
    torch.testing.assert_close(gotc, theta[1], **TOL)
    assert len(counter) == 3 * (k + 1) and all(o.perturbed and o.passes == k + 1 and o.rho == rho for o in outs)


def test_lookbehind_reductions():
    """k = 1 and alpha = 1 is SAM bit for bit (momentum SGD); with rho = 0 too, the base optimizer; k = 2 or alpha < 1
    is neither. With rho = 0 every gradient is the slow weights' own, so k steps of the base optimizer with it."""
    sam = train("sam", mlp(), 3, rho=0.05)
    for a, b in zip(train("lookbehind", mlp(), 3, rho=0.05, k=1, alpha=1.0), sam):
        assert torch.equal(a, b)
    base = train("none", mlp(), 3)
    for a, b in zip(train("lookbehind", mlp(), 3, rho=0.0, k=1, alpha=1.0), base):
        assert torch.equal(a, b)
    for hp in ({"k": 2, "alpha": 1.0}, {"k": 1, "alpha": 0.5}):
        assert not all(torch.equal(a, b) for a, b in zip(train("lookbehind", mlp(), 3, rho=0.05, **hp), sam))
    model = mlp()
    w = [p.detach().clone() for p in model.parameters()]
    x, y = data(0)
    g = grads(model, w, x, y)
    moved = train("lookbehind", model, 1, base=torch.optim.SGD(model.parameters(), lr=0.1), rho=0.0, k=3, alpha=0.5)
    for a, wi, gi in zip(moved, w, g):
        torch.testing.assert_close(a, wi - 0.5 * 3 * 0.1 * gi, rtol=0, atol=1e-14)
