"""bSAM: its rho = 0 reduction, the peer pytorch_optimizer.BSAM where it agrees with the paper and where (by its
documented differences) it does not, and the trial config's refusals of the base knobs bSAM does not read. Its
float64 reference over two param groups and a schedule is test_references.py's ``_bsam``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import optim

B, LR, STEPS = 6, 0.1, 3


def _net(seed=0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()


def _batch(t: int):
    g = torch.Generator().manual_seed(700 + t)
    return torch.randn(B, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (B,), generator=g)


def _grad(model, ws, x, y):
    """The gradient of the mean cross-entropy at weights ``ws`` (in ``model.parameters()`` order), by autograd."""
    ws = [w.detach().clone().requires_grad_(True) for w in ws]
    z = torch.func.functional_call(model, dict(zip([n for n, _ in model.named_parameters()], ws)), (x,))
    return [g.detach() for g in torch.autograd.grad(F.cross_entropy(z, y), ws)]


def reference(hp, n_data, *, steps=STEPS, peer=False, draws=True):
    """The paper's Algorithm 1 in float64, written out (``peer=True``: with pytorch_optimizer 4.1's changes to it:
    the ascent and the update from the point reached, never back at w; m fed delta g_eps; s fed the square of
    sqrt(s)|g_eps| + delta + damping). ``draws``: the noise z / sqrt(N s) from a generator seeded as the method's."""
    model = _net()
    ws = [p.detach().clone() for p in model.parameters()]
    m = [torch.zeros_like(w) for w in ws]
    s = [torch.full_like(w, hp["s_init"]) for w in ws]
    gen = torch.Generator().manual_seed(0)  # the method's: torch.initial_seed() after _net(seed=0)
    b1, b2, delta, damping, rho = hp["beta1"], hp["beta2"], hp["delta"], hp["damping"], hp["rho"]
    for t in range(steps):
        x, y = _batch(t)
        theta = ws
        if draws:
            flat = torch.randn(sum(w.numel() for w in ws), generator=gen, dtype=torch.float64)
            zs = [z.view(w.shape) for w, z in zip(ws, flat.split([w.numel() for w in ws]))]
            theta = [w + z / torch.sqrt(n_data * si) for w, z, si in zip(ws, zs, s)]
        g = _grad(model, theta, x, y)
        point = [(th if peer else w) + rho * gi / si for w, th, gi, si in zip(ws, theta, g, s)]
        g_eps = _grad(model, point, x, y)
        if peer:
            m = [b1 * mi + (1 - b1) * delta * ge for mi, ge in zip(m, g_eps)]
            s = [b2 * si + (1 - b2) * (torch.sqrt(si) * ge.abs() + delta + damping) ** 2 for si, ge in zip(s, g_eps)]
            ws = [p - LR * mi / si for p, mi, si in zip(point, m, s)]
        else:
            m = [b1 * mi + (1 - b1) * (ge + delta * w) for mi, ge, w in zip(m, g_eps, ws)]
            s = [b2 * si + (1 - b2) * (torch.sqrt(si) * gi.abs() + delta + damping) for si, gi in zip(s, g)]
            ws = [w - LR * mi / si for w, mi, si in zip(ws, m, s)]
    return ws


def ours(hp, n_data, *, steps=STEPS, seen=None):
    """bSAM through optim.create (``num_samples=B``, ``data_factor`` giving N); ``seen``: each forward's weights."""
    model = _net()
    base = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=0.5)  # bSAM reads only lr
    method = optim.create("bsam", base, model=model, num_samples=B, **hp, data_factor=n_data / B)
    for t in range(steps):
        x, y = _batch(t)

        def forward(rows=None, reduction="mean", x=x, y=y):
            if seen is not None:
                seen.append([p.detach().clone() for p in model.parameters()])
            z = model(x)
            return F.cross_entropy(z, y, reduction=reduction), z

        out = method.train_step(forward, inputs=x)
        assert out.passes == 2.0 and out.perturbed and not out.skipped
    return [p.detach().clone() for p in model.parameters()], base


HP = {"rho": 0.05, "beta1": 0.8, "beta2": 0.9, "delta": 1e-2, "damping": 0.1, "s_init": 1.0}
TOL = {"rtol": 1e-10, "atol": 1e-12}


def _close(a, b, **tol):
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, **(tol or TOL))


def test_ours_is_the_papers_algorithm():
    got, base = ours(HP, n_data=60.0)
    _close(got, reference(HP, 60.0))
    assert not base.state  # the base optimizer never stepped: its momentum and weight decay are not bSAM's


def test_rho_zero_is_the_noisy_adam_like_step_without_ascent():
    # rho = 0 (docs/algorithms.md, "bSAM"): pass 2 is at w itself, bit for bit, so g_eps is the gradient at w and
    # only s reads the noisy point's; the step is the reference's with the ascent removed. It is not the base
    # optimizer's step (bSAM has none) and still takes two passes.
    seen = []
    got, _ = ours({**HP, "rho": 0.0}, n_data=60.0, seen=seen)
    _close(got, reference({**HP, "rho": 0.0}, 60.0))
    start = [p.detach().clone() for p in _net().parameters()]
    assert all(torch.equal(a, b) for a, b in zip(seen[1], start))  # step 0's pass 2: w exactly
    assert not all(torch.equal(a, b) for a, b in zip(seen[0], start))  # step 0's pass 1: the draw


def test_rho_zero_and_no_noise_is_deterministic_and_uses_the_gradient_at_w():
    # N so large that the draw's standard deviation 1/sqrt(N s) is below float64's rounding of w: both passes at w,
    # so g = g_eps and bSAM is the deterministic Adam-like rule m/s with s from sqrt(s)|g| + delta + damping.
    seen = []
    got, _ = ours({**HP, "rho": 0.0}, n_data=1e300, seen=seen)
    _close(got, reference({**HP, "rho": 0.0}, 1e300, draws=False))
    assert all(torch.equal(a, b) for a, b in zip(seen[0], seen[1]))


po = pytest.importorskip("pytorch_optimizer")


def _peer(hp, n_data):
    model = _net()
    opt = po.BSAM(model.parameters(), num_data=n_data, lr=LR, betas=(hp["beta1"], hp["beta2"]),
                  weight_decay=hp["delta"], rho=hp["rho"], damping=hp["damping"], foreach=False)  # fmt: skip
    points = []
    for t in range(STEPS):
        x, y = _batch(t)
        # The peer makes its state on the first step only for parameters that hold a gradient already.
        F.cross_entropy(model(x), y).backward()
        for k, stage in enumerate((opt.first_step, opt.second_step)):
            stage()
            if k == 1:
                points.append([p.detach().clone() for p in model.parameters()])
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
        opt.third_step()
        opt.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()], points


def test_peer_shares_the_ascent_and_differs_where_documented():
    # pytorch_optimizer.BSAM draws noise of standard deviation 1/(N s) where the paper has (N s)^(-1/2); with N so
    # large that both draws vanish, what the two share is the ascent rho g / s from w at the first step (s = 1):
    # its perturbed point is ours. After that the peer is the paper's algorithm with its documented changes
    # (docs/algorithms.md, "bSAM"), which the reference switches on: so the differences are the ones the docs say.
    n_data = 1e300
    peer_final, peer_points = _peer(HP, n_data)
    seen = []
    ours(HP, n_data, steps=1, seen=seen)
    _close(seen[1], peer_points[0], rtol=1e-12, atol=1e-14)
    _close(peer_final, reference(HP, n_data, peer=True, draws=False))
    got, _ = ours(HP, n_data)
    differs = max(float((a - b).abs().max()) for a, b in zip(got, peer_final))
    assert differs > 1e-3  # by design: the update is not the peer's


# ----------------------------------------------------------------------------- the trial config, torch-free rules
@pytest.mark.parametrize(
    ("optimizer", "says"),
    [
        ({}, r"optimizer\.weight_decay must be 0\.0 for bsam, which steps by its own rule, but got weight_decay=0\.05"),
        ({"weight_decay": 0, "betas": [0.9, 0.99]}, r"optimizer\.betas must stay at its default \(0\.9, 0\.999\)"),
        ({"weight_decay": 0, "momentum": 0.5}, r"optimizer\.momentum must stay at its default 0\.9 .*hparams\.delta"),
        ({"weight_decay": 0, "base": "sgd"}, r"optimizer\.base must stay at its default 'adamw'"),
        (
            {"weight_decay": 0, "schedule": {"every": 2}},
            r"schedule must be unset for bsam, which steps by its own rule",
        ),
        ({"weight_decay": 0, "scope": "norm"}, r"scope must be 'all' for bsam, which steps by its own rule"),
        (
            {"weight_decay": 0, "hparams": {"beta2": 0.0, "damping": 0.0, "delta": 0.0}},
            r"beta2 > 0 or delta \+ damping",
        ),
    ],
)
def test_the_trial_config_refuses_base_knobs_bsam_does_not_read(optimizer, says):
    from trainables.config import OptimizerConfig

    with pytest.raises(ValueError, match=says):
        OptimizerConfig(method="bsam", **optimizer)
    OptimizerConfig(method="bsam", weight_decay=0.0, lr=0.5)  # its own step size


def test_the_rule_lives_in_the_spec_alone():
    own = optim.METHODS["bsam"].own_update
    assert own is not None and dict(own.requires) == {"weight_decay": 0.0} and not optim.METHODS["bsam"].perturbs
    assert all(spec.own_update is None for name, spec in optim.METHODS.items() if name != "bsam")
    optim.check_base("sam", {"weight_decay": 0.05, "base": "sgd"}, {"weight_decay": 0.05, "base": "adamw"})
    with pytest.raises(ValueError, match=r"^weight_decay must be 0\.0 for bsam"):
        optim.check_base("bsam", {"weight_decay": 1e-4}, {})


def test_an_overflow_leaves_no_state_and_the_draw_undone():
    # fp16 on CPU: an inf in pass 2 of the first step skips it; the next step draws what a fresh run's first does.
    model = _net()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    base = torch.optim.SGD(model.parameters(), lr=LR)
    method = optim.create("bsam", base, model=model, num_samples=B, scaler=scaler, **HP)
    x, y = _batch(0)
    calls = []

    def forward(rows=None, reduction="mean"):
        calls.append(1)
        z = model(x)
        loss = F.cross_entropy(z, y, reduction=reduction)
        return (loss * float("inf") if len(calls) == 2 else loss), z

    before = [p.detach().clone() for p in model.parameters()]
    assert method.train_step(forward, inputs=x).skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert method.state_dict()["method"]["m"] == {} and scaler.get_scale() == 2.0**3
    assert method.state_dict()["method"]["generators"] == {}  # made on the skipped step: made afresh when next drawn
    seen, fresh = [], []
    model2 = _net()
    method2 = optim.create("bsam", torch.optim.SGD(model2.parameters(), lr=LR), model=model2, num_samples=B, **HP)
    for m, net, out in ((method, model, seen), (method2, model2, fresh)):

        def forward(rows=None, reduction="mean", net=net, out=out):
            out.append([p.detach().clone() for p in net.parameters()])
            z = net(x)
            return F.cross_entropy(z, y, reduction=reduction), z

        m.train_step(forward, inputs=x)
    _close(seen[0], fresh[0], rtol=0, atol=0)  # the same draw as a run whose first step was this one
