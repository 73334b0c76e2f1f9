"""Each method's first update on a quadratic with a chosen Hessian equals the hand formula (fp64, 1e-10); the reductions hold."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import optim

D, B, C = 6, 4, 3
TOL = dict(rtol=0, atol=1e-10)


class Quadratic(nn.Module):
    """L(w) = 1/2 (w - c)^T H (w - c); logits z_b = A_b w (so SAF/MESA have something to pull on)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        q, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))
        self.register_buffer("H", q @ torch.diag(torch.linspace(0.5, 8.0, D, dtype=torch.float64)) @ q.T)
        self.register_buffer("c", torch.randn(D, generator=g, dtype=torch.float64))
        self.register_buffer("A", torch.randn(B, C, D, generator=g, dtype=torch.float64))
        self.w = nn.Parameter(torch.randn(D, generator=g, dtype=torch.float64))

    def forward(self, x=None):
        return torch.einsum("bcd,d->bc", self.A, self.w)

    def loss(self):
        r = self.w - self.c
        return 0.5 * r @ self.H @ r

    def grad(self, w):
        return self.H @ (w - self.c)

    def logits(self, w):
        return torch.einsum("bcd,d->bc", self.A, w)


def forward_of(model):
    def forward():
        return model.loss(), model()

    return forward


def make(name, lr=0.1, wd=0.0, **hp):
    model = Quadratic()
    base = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=wd)
    method = optim.create(name, base, model=model, num_samples=B, num_classes=C, **hp)
    return model, method, model.w.detach().clone()


def step(method, model, epoch=0):
    return method.train_step(forward_of(model), inputs=torch.zeros(B), indices=torch.arange(B), epoch=epoch)


def test_none_is_gradient_descent():
    model, method, w0 = make("none", lr=0.1, wd=0.01)
    step(method, model)
    torch.testing.assert_close(model.w.detach(), w0 - 0.1 * (model.grad(w0) + 0.01 * w0), **TOL)


def test_sam_p2():
    rho, lr, wd = 0.05, 0.1, 0.01
    model, method, w0 = make("sam", lr=lr, wd=wd, rho=rho)
    out = step(method, model)
    g = model.grad(w0)
    eps = rho * g / (g.norm() + 1e-12)
    # Weight decay at the restored w, applied once (docs/algorithms.md, "SAM").
    torch.testing.assert_close(model.w.detach(), w0 - lr * (model.grad(w0 + eps) + wd * w0), **TOL)
    r = w0 + eps - model.c
    torch.testing.assert_close(out.perturbed_loss, 0.5 * r @ model.H @ r, **TOL)
    assert out.rho == rho


def test_sam_p_inf():
    rho, lr = 0.05, 0.1
    model, method, w0 = make("sam", lr=lr, rho=rho, p=float("inf"))
    step(method, model)
    eps = rho * torch.sign(model.grad(w0))
    torch.testing.assert_close(model.w.detach(), w0 - lr * model.grad(w0 + eps), **TOL)


@pytest.mark.parametrize("eta", [0.01, 0.0])
def test_asam(eta):
    rho, lr = 0.5, 0.1
    model, method, w0 = make("asam", lr=lr, rho=rho, eta=eta)
    step(method, model)
    g = model.grad(w0)
    T = w0.abs() + eta
    eps = rho * T**2 * g / ((T * g).norm() + 1e-12)
    torch.testing.assert_close(model.w.detach(), w0 - lr * model.grad(w0 + eps), **TOL)


def test_gsam_with_rho_schedule():
    lr, alpha, rho_max, rho_min, lr_max = 0.1, 0.3, 0.2, 0.02, 0.4
    model, method, w0 = make("gsam", lr=lr, alpha=alpha, rho_max=rho_max, rho_min=rho_min, lr_max=lr_max, lr_min=0.0)
    out = step(method, model)
    rho_t = rho_min + (rho_max - rho_min) * (lr - 0.0) / (lr_max - 0.0)
    assert out.rho == pytest.approx(rho_t, rel=1e-15) and method.rho_t == out.rho
    g = model.grad(w0)
    gp = model.grad(w0 + rho_t * g / (g.norm() + 1e-12))
    gp_hat = gp / gp.norm()
    g_gsam = gp - alpha * (g - (g @ gp_hat) * gp_hat)
    torch.testing.assert_close(model.w.detach(), w0 - lr * g_gsam, **TOL)


def test_gsam_adaptive_decomposes_with_plain_norms():
    lr, alpha, rho, eta = 0.1, 0.4, 0.3, 0.01
    model, method, w0 = make("gsam", lr=lr, alpha=alpha, rho_max=rho, rho_min=rho, adaptive=True, eta=eta)
    step(method, model)
    g = model.grad(w0)
    T = w0.abs() + eta
    gp = model.grad(w0 + rho * T**2 * g / ((T * g).norm() + 1e-12))
    gp_hat = gp / gp.norm()
    torch.testing.assert_close(model.w.detach(), w0 - lr * (gp - alpha * (g - (g @ gp_hat) * gp_hat)), **TOL)


def test_looksam_first_two_updates():
    lr, rho, alpha = 0.1, 0.1, 0.7
    model, method, w0 = make("looksam", lr=lr, rho=rho, k=2, alpha=alpha)
    out0 = step(method, model)
    g = model.grad(w0)
    gs = model.grad(w0 + rho * g / (g.norm() + 1e-12))
    w1 = w0 - lr * gs
    torch.testing.assert_close(model.w.detach(), w1, **TOL)
    gv = gs - (gs @ g) / (g @ g) * g
    out1 = step(method, model)  # one pass, reuses g_v
    g1 = model.grad(w1)
    torch.testing.assert_close(model.w.detach(), w1 - lr * (g1 + alpha * g1.norm() / gv.norm() * gv), **TOL)
    assert out0.perturbed_loss is not None and out1.perturbed_loss is None and out1.rho is None


def _kl_grad_logits(z, t, tau, lam):
    # d/dz [lam tau^2 mean_b KL(softmax(t/tau) || softmax(z/tau))] = lam tau (softmax(z/tau) - softmax(t/tau)) / B
    return lam * tau * (torch.softmax(z / tau, -1) - torch.softmax(t / tau, -1)) / z.shape[0]


def test_saf_first_active_update():
    lr, lam, tau = 0.1, 0.3, 2.0
    model, method, w = make("saf", lr=lr, lam=lam, tau=tau, e_tilde=1, e_start=1)
    recorded = {}
    for epoch in range(3):
        if epoch < 2:
            recorded[epoch] = model.logits(w).to(torch.float16).to(torch.float64)
            out = step(method, model, epoch)
            assert out.extra_loss is None
            w = w - lr * model.grad(w)
            torch.testing.assert_close(model.w.detach(), w, **TOL)
        else:
            out = step(method, model, epoch)  # active: epoch 2 > e_start=1, reads epoch 1's slot
            z, past = model.logits(w), recorded[1]
            gz = _kl_grad_logits(z, past, tau, lam)
            expected = w - lr * (model.grad(w) + torch.einsum("bcd,bc->d", model.A, gz))
            torch.testing.assert_close(model.w.detach(), expected, **TOL)
            kl = (
                lam
                * tau**2
                * F.kl_div(
                    F.log_softmax(z / tau, -1), F.log_softmax(past / tau, -1), reduction="batchmean", log_target=True
                )
            )
            torch.testing.assert_close(out.extra_loss, kl, **TOL)


def test_mesa_first_active_updates():
    lr, lam, tau, beta = 0.1, 0.8, 2.0, 0.9
    model, method, w0 = make("mesa", lr=lr, lam=lam, tau=tau, beta=beta, e_start=0)
    step(method, model, epoch=1)  # teacher == student at init: the KL gradient is zero
    w1 = w0 - lr * model.grad(w0)
    torch.testing.assert_close(model.w.detach(), w1, **TOL)
    b0, b1 = min(beta, 1 / 10), min(beta, 2 / 11)  # the warmed-up decay (1 + t) / (10 + t) of updates t = 0, 1
    v1 = b0 * w0 + (1 - b0) * w1  # EMA from step 0
    torch.testing.assert_close(method.regulariser.teacher.w.detach(), v1, **TOL)
    step(method, model, epoch=1)
    gz = _kl_grad_logits(model.logits(w1), model.logits(v1), tau, lam)
    w2 = w1 - lr * (model.grad(w1) + torch.einsum("bcd,bc->d", model.A, gz))
    torch.testing.assert_close(model.w.detach(), w2, **TOL)
    torch.testing.assert_close(method.regulariser.teacher.w.detach(), b1 * v1 + (1 - b1) * w2, **TOL)


def test_mesa_teacher_after_the_warm_up_is_the_papers_ema():
    # Past warmup_steps the decay is beta itself: v <- beta v + (1 - beta) w, as in Du et al. 2022, Alg. 2.
    lr, beta = 0.1, 0.5  # (1 + t) / (10 + t) >= 0.5 from t = 8
    model, method, w0 = make("mesa", lr=lr, beta=beta, e_start=100)
    mesa = method.regulariser
    assert mesa.warmup_steps == 8
    v = w0.clone()
    for t in range(12):
        w = model.w.detach().clone()
        step(method, model, epoch=0)
        w_next = w - lr * model.grad(w)
        b = min(beta, (1 + t) / (10 + t))
        assert (b == beta) == (t >= 8)
        v = b * v + (1 - b) * w_next
        torch.testing.assert_close(mesa.teacher.w.detach(), v, **TOL)


def test_trajectory_kl_matches_definition():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    tau = 3.0
    pt = torch.softmax(t.double() / tau, -1)
    expected = tau**2 * (pt * (pt.log() - torch.log_softmax(s.double() / tau, -1))).sum(-1).mean()
    torch.testing.assert_close(optim.trajectory_kl(s, t, tau).double(), expected, rtol=1e-6, atol=1e-7)
    # half inputs are computed in float32; huge logits do not give inf/nan (log_softmax, never softmax().log())
    big = optim.trajectory_kl((s * 1e4).half(), (t * 1e4).half(), tau)
    assert big.dtype == torch.float32 and torch.isfinite(big)


# ----------------------------------------------------------------------------- reductions on a BN model
def _trajectory(helpers, name, steps=3, **hp):
    model = helpers.make_model()
    method = helpers.build(name, model, hparams=hp)
    helpers.run(method, model, steps)
    return [t.detach().clone() for t in list(model.parameters()) + list(model.buffers())]


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_sam_with_rho_zero_is_the_base_optimizer(helpers):
    _assert_same(_trajectory(helpers, "sam", rho=0.0), _trajectory(helpers, "none"))


def test_gsam_alpha_zero_constant_rho_is_sam(helpers):
    sam = _trajectory(helpers, "sam", rho=0.07)
    gsam = _trajectory(helpers, "gsam", alpha=0.0, rho_max=0.07, rho_min=0.07)
    _assert_same(gsam, sam)


def test_looksam_k1_is_sam(helpers):
    _assert_same(_trajectory(helpers, "looksam", k=1, rho=0.07), _trajectory(helpers, "sam", rho=0.07))


def test_gsam_rho_schedule_follows_the_actual_lr(helpers):
    model = helpers.make_model()
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(base, lambda t: 1.0 - 0.25 * t)
    method = optim.create("gsam", base, model=model, rho_max=0.2, rho_min=0.04, lr_min=0.0)
    assert method.lr_max == 0.1  # None -> the base optimizer's initial lr
    rhos = []
    for t in range(3):
        rhos.append(helpers.run(method, model, 1, start=t)[0].rho)
        sched.step()
    assert rhos == pytest.approx([0.04 + 0.16 * f for f in (1.0, 0.75, 0.5)], rel=1e-12)
    # lr_max == lr_min: rho_t = rho_max
    assert optim.GSAM(base, rho_max=0.3, rho_min=0.1, lr_max=0.0, lr_min=0.0, model=model).rho_t == 0.3


def test_params_without_gradient_in_pass_1_are_not_perturbed_and_still_updated():
    torch.manual_seed(0)
    a, b = nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(3))
    holder = nn.Module()
    holder.a, holder.b = a, b
    base = torch.optim.SGD([a, b], lr=0.1)
    sam = optim.SAM(base, rho=0.1, model=holder)
    calls = []
    seen_b = []

    def forward():
        calls.append(1)
        seen_b.append(b.detach().clone())
        loss = (a**2).sum() if len(calls) == 1 else (a**2).sum() + (b**2).sum()  # b only in pass 2
        return loss, a.detach()[None]

    b0 = b.detach().clone()
    sam.train_step(forward)
    torch.testing.assert_close(seen_b[1], b0, rtol=0, atol=0)  # not perturbed
    torch.testing.assert_close(b.detach(), b0 - 0.1 * 2 * b0)  # but updated, no KeyError


def test_first_and_second_step_standalone_and_step_closure(helpers):
    # The same update three ways: train_step, first_step/second_step by hand, step(closure).
    results = []
    for mode in ("train_step", "manual", "closure"):
        model = helpers.make_model()
        base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        sam = optim.SAM(base, rho=0.05, model=model)
        for t in range(2):
            x, y, idx = helpers.make_batch(t)
            if mode == "train_step":
                sam.train_step(helpers.make_forward(model, x, y))
            elif mode == "manual":
                F.cross_entropy(model(x), y).backward()
                sam.first_step()
                assert all(p.grad is None for p in model.parameters())
                F.cross_entropy(model(x), y).backward()
                sam.second_step()
            else:

                def closure():
                    loss = F.cross_entropy(model(x), y)
                    loss.backward()
                    return loss

                loss = sam.step(closure)
                assert loss.ndim == 0
        results.append([t.detach().clone() for t in list(model.parameters()) + list(model.buffers())])
    _assert_same(results[0], results[1])
    _assert_same(results[0], results[2])
    with pytest.raises(RuntimeError, match="without first_step"):
        sam.second_step()
