"""optimizer.scope: 'all' is today's step bit for bit; 'norm' and name patterns perturb (direction and norm) only the
parameters they name, against float64 references; bad scopes fail at build naming the model's parameter groups."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

import optim
from optim._scope import model_groups
from tests.optim.conftest import build, make_batch, make_forward, make_model

PERTURBING = [name for name, spec in optim.METHODS.items() if spec.perturbs]
TOL = dict(rtol=0, atol=1e-12)


class LNNet(nn.Module):
    """Linear -> LayerNorm -> tanh -> Linear, float64: two of its six tensors are a normalisation layer's."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.fc1 = nn.Linear(4, 5)
        self.ln = nn.LayerNorm(5)
        self.fc2 = nn.Linear(5, 3)
        with torch.no_grad():  # LayerNorm starts at (1, 0): move it so that its gradient is not special
            self.ln.weight.add_(0.3 * torch.randn(5))
            self.ln.bias.add_(0.2 * torch.randn(5))
        self.double()

    def forward(self, x):
        return self.fc2(torch.tanh(self.ln(self.fc1(x))))


def data(step):
    g = torch.Generator().manual_seed(50 + step)
    return torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (6,), generator=g)


def grads_at(model, w, x, y):
    """Gradient of the mean cross-entropy at the weights ``w`` (name -> tensor), by autograd on a functional call."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in w.items()}
    loss = F.cross_entropy(functional_call(model, leaves, (x,)), y)
    return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))


def norm(d, names):
    return torch.sqrt(sum((d[n] ** 2).sum() for n in names))


def forward_of(model, x, y):
    """optim's Forward in float64 throughout (conftest's casts the logits to float32)."""

    def forward(rows=None, reduction="mean"):
        xs, ys = (x, y) if rows is None else (x[rows], y[rows])
        logits = model(xs)
        return F.cross_entropy(logits, ys, reduction=reduction), logits

    return forward


def run(model, method, steps):
    for t in range(steps):
        x, y = data(t)
        method.train_step(forward_of(model, x, y), inputs=x)


def sgd_reference(model, eps_of, steps, lr=0.1, momentum=0.9, wd=1e-3):
    """SGD with momentum and L2 decay stepping with the gradient at ``w + eps_of(w, g)``; returns the weights."""
    w = {k: v.detach().clone() for k, v in model.named_parameters()}
    buf = {}
    for t in range(steps):
        x, y = data(t)
        g = grads_at(model, w, x, y)
        eps = eps_of(w, g)
        gp = grads_at(model, {k: w[k] + eps.get(k, 0.0) for k in w}, x, y)
        for k in w:
            d = gp[k] + wd * w[k]
            buf[k] = d if k not in buf else momentum * buf[k] + d
            w[k] = w[k] - lr * buf[k]
    return w


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)


NORM = ["ln.weight", "ln.bias"]


@pytest.mark.parametrize("name", PERTURBING)
def test_scope_all_and_a_pattern_matching_everything_are_todays_step_bit_for_bit(name):
    def trained(**kw):
        model = make_model(1)
        method = build(name, model, **kw)
        for t in range(3):
            x, y, idx = make_batch(t)
            method.train_step(make_forward(model, x, y), inputs=x, indices=idx, epoch=t)
        return [p.detach().clone() for p in model.parameters()]

    today = trained()
    for scope in ("all", {"include": ["*"]}):
        for a, b in zip(today, trained(scope=scope)):
            assert torch.equal(a, b), scope


def test_sam_scope_norm_is_sam_over_the_normalisation_parameters_alone():
    model = LNNet()
    ref = sgd_reference(model, lambda w, g: {k: 0.2 * g[k] / norm(g, NORM) for k in NORM}, steps=3)
    run(model, optim.create("sam", sgd(model), model=model, rho=0.2, scope="norm"), 3)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), ref[k], **TOL)


def test_sam_p_inf_and_asam_with_include_and_exclude_patterns():
    chosen = ["fc1.weight", "ln.weight"]  # include fc1.* and ln.*, exclude the biases
    scope = {"include": ["fc1.*", "ln.*"], "exclude": ["*.bias"]}
    model = LNNet()
    ref = sgd_reference(model, lambda w, g: {k: 0.01 * torch.sign(g[k]) for k in chosen}, steps=2)
    run(model, optim.create("sam", sgd(model), model=model, rho=0.01, p=float("inf"), scope=scope), 2)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), ref[k], **TOL)

    def asam(w, g):
        t = {k: w[k].abs() + 0.01 for k in chosen}
        tg = {k: t[k] * g[k] for k in chosen}
        return {k: 0.5 * t[k] * tg[k] / norm(tg, chosen) for k in chosen}

    model = LNNet()
    ref = sgd_reference(model, asam, steps=2)
    run(model, optim.create("asam", sgd(model), model=model, rho=0.5, scope=scope), 2)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), ref[k], **TOL)


def test_gsam_scope_norm_perturbs_the_scope_and_combines_every_gradient():
    model = LNNet()
    x, y = data(0)
    w = {k: v.detach().clone() for k, v in model.named_parameters()}
    g = grads_at(model, w, x, y)
    eps = {k: 0.1 * g[k] / norm(g, NORM) for k in NORM}
    gp = grads_at(model, {k: w[k] + eps.get(k, 0.0) for k in w}, x, y)
    names = list(w)
    dot = sum((g[k] * gp[k]).sum() for k in names)
    gp_sq = sum((gp[k] ** 2).sum() for k in names)
    upd = {k: gp[k] - 0.3 * (g[k] - dot / gp_sq * gp[k]) for k in names}  # over every parameter
    ref = {k: w[k] - 0.1 * upd[k] for k in names}
    method = optim.create(
        "gsam",
        torch.optim.SGD(model.parameters(), lr=0.1),
        model=model,
        rho_max=0.1,
        rho_min=0.1,
        alpha=0.3,
        scope="norm",
    )
    method.train_step(forward_of(model, x, y), inputs=x)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), ref[k], **TOL)


def test_looksam_scope_norm_perturbs_the_scope_and_projects_over_every_parameter():
    model = LNNet()
    w = {k: v.detach().clone() for k, v in model.named_parameters()}
    names = list(w)
    x, y = data(0)
    g = grads_at(model, w, x, y)
    eps = {k: 0.1 * g[k] / norm(g, NORM) for k in NORM}
    gs = grads_at(model, {k: w[k] + eps.get(k, 0.0) for k in w}, x, y)
    c = sum((gs[k] * g[k]).sum() for k in names) / sum((g[k] ** 2).sum() for k in names)
    gv = {k: gs[k] - c * g[k] for k in names}
    w = {k: w[k] - 0.1 * gs[k] for k in names}  # the SAM step
    x, y = data(1)
    g = grads_at(model, w, x, y)
    coef = 0.7 * norm(g, names) / norm(gv, names)
    ref = {k: w[k] - 0.1 * (g[k] + coef * gv[k]) for k in names}  # the one-pass step
    method = optim.create(
        "looksam", torch.optim.SGD(model.parameters(), lr=0.1), model=model, rho=0.1, k=2, alpha=0.7, scope="norm"
    )
    run(model, method, 2)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), ref[k], **TOL)


def test_fsam_and_msam_direction_over_the_scope_alone():
    model = LNNet()
    # F-SAM's first step: m_{-1} = 0, so d = (1 - sigma (1 - lmbda)) g, whose direction is g's: SAM's on the scope.
    ref = sgd_reference(model, lambda w, g: {k: 0.05 * g[k] / norm(g, NORM) for k in NORM}, steps=1)
    run(model, optim.create("fsam", sgd(model), model=model, rho=0.05, scope="norm"), 1)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), ref[k], **TOL)

    # MSAM's second step: w - rho v/||v|| over the scope, v the SGD buffer after step 1 (g + wd w at w_0).
    model = LNNet()
    w = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = data(0)
    g = grads_at(model, w, x, y)
    buf = {k: g[k] + 1e-3 * w[k] for k in w}
    w = {k: w[k] - 0.1 * buf[k] for k in w}
    x, y = data(1)
    eps = {k: -0.3 * buf[k] / norm(buf, NORM) for k in NORM}
    wt = {k: w[k] + eps.get(k, 0.0) for k in w}
    g = grads_at(model, wt, x, y)
    ref = {k: w[k] - 0.1 * (0.9 * buf[k] + g[k] + 1e-3 * wt[k]) for k in w}  # the L2 decay at the perturbed point
    run(model, optim.create("msam", sgd(model), model=model, rho=0.3, scope="norm"), 2)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), ref[k], **TOL)


def test_esam_with_beta_1_gamma_1_and_a_scope_is_sam_with_that_scope():
    def trained(name, **hp):
        model = LNNet()
        run(model, optim.create(name, sgd(model), model=model, scope="norm", **hp), 3)
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(trained("sam", rho=0.1), trained("esam", rho=0.1, beta=1.0, gamma=1.0)):
        torch.testing.assert_close(a, b, **TOL)


def test_esam_draws_only_from_the_scope():
    model = LNNet()
    method = optim.create("esam", sgd(model), model=model, beta=0.5, gamma=1.0, scope="norm")
    in_scope = {model.ln.weight, model.ln.bias}
    for _ in range(20):
        left_out = method._draw()
        assert {p for p in model.parameters() if p not in in_scope} <= set(left_out)


def test_scope_composes_with_m_sharpness_and_micro_batches():
    def m_ref(w_model):
        # m = 3 of 6: two groups, each its own eps over the scope; the update is the mean of their g_p.
        def eps_free_step():
            w = {k: v.detach().clone() for k, v in w_model.named_parameters()}
            x, y = data(0)
            gp_mean = {k: 0.0 for k in w}
            for rows in (slice(0, 3), slice(3, 6)):
                g = grads_at(w_model, w, x[rows], y[rows])
                eps = {k: 0.1 * g[k] / norm(g, NORM) for k in NORM}
                gp = grads_at(w_model, {k: w[k] + eps.get(k, 0.0) for k in w}, x[rows], y[rows])
                gp_mean = {k: gp_mean[k] + 0.5 * gp[k] for k in w}
            return {k: w[k] - 0.1 * gp_mean[k] for k in w}

        return eps_free_step()

    model = LNNet()
    ref = m_ref(model)
    method = optim.create("sam", torch.optim.SGD(model.parameters(), lr=0.1), model=model, rho=0.1, m=3, scope="norm")
    run(model, method, 1)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), ref[k], **TOL)

    whole, split = LNNet(), LNNet()
    run(whole, optim.create("gsam", sgd(whole), model=whole, scope="norm"), 2)
    run(split, optim.create("gsam", sgd(split), model=split, scope="norm", accumulate=3), 2)
    for a, b in zip(whole.parameters(), split.parameters()):
        torch.testing.assert_close(a, b, **TOL)


def test_scope_under_fp16_scaling_matches_the_unscaled_step():
    def trained(scaler):
        model = LNNet()
        method = optim.create("sam", sgd(model), model=model, rho=0.1, scope="norm", scaler=scaler)
        run(model, method, 2)
        return [p.detach().clone() for p in model.parameters()]

    scaled = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    for a, b in zip(trained(None), trained(scaled)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_scope_under_the_compiled_step_equals_eager():
    from trainables import compiled

    def trained(compile_it):
        model = LNNet()
        net = compiled.CompiledModule(model, "default", backend="aot_eager") if compile_it else model
        method = optim.create("sam", sgd(model), model=net, rho=0.1, scope="norm")
        run(net, method, 2)
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(trained(False), trained(True)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_scope_norm_finds_batchnorm_layernorm_and_groupnorm():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.GroupNorm(2, 4), nn.Flatten(), nn.LayerNorm(4))
    method = optim.create("sam", sgd(net), model=net, scope="norm")
    assert method._scope == {net[1].weight, net[1].bias, net[2].weight, net[2].bias, net[4].weight, net[4].bias}


def test_a_pattern_that_matches_nothing_names_the_models_parameter_groups():
    model = make_model(0)
    with pytest.raises(ValueError, match=r"include 'blocks\.\*' matches none") as err:
        build("sam", model, scope={"include": ["blocks.*"]})
    assert "conv.weight, conv.bias, bn.weight, bn.bias, head.weight, head.bias" in str(err.value)
    assert model_groups(["layer1.0.conv1.weight", "layer1.1.conv1.weight", "fc.bias"]) == [
        "layer*.*.conv*.weight",
        "fc.bias",
    ]


def test_bad_scopes_fail_with_the_rule_and_the_fix():
    model = nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(ValueError, match="has no trainable ones"):
        optim.create("sam", sgd(model), model=model, scope="norm")
    with pytest.raises(ValueError, match="leaves no trainable parameter"):
        optim.create("sam", sgd(model), model=model, scope={"exclude": ["*"]})
    with pytest.raises(ValueError, match="one of"):
        optim.check_scope("bn")
    with pytest.raises(ValueError, match="keys among"):
        optim.check_scope({"includes": ["a"]})
    for name in ("none", "saf", "mesa"):
        assert not optim.METHODS[name].perturbs
        with pytest.raises(ValueError, match="does not perturb"):
            optim.check_hparams(name, base="SGD", base_keeps_momentum=True, scope="norm")
    with pytest.raises(ValueError, match="does not perturb"):
        build("none", make_model(0), scope="norm")


def test_every_registry_class_says_whether_it_perturbs_as_its_spec_does():
    for name, spec in optim.METHODS.items():
        model = make_model(0)
        assert build(name, model).perturbs is spec.perturbs, name
        # The tests' rho = 0 settings exist exactly for the methods that perturb.
        assert (spec.small.base_exactly is not None) is spec.perturbs, name
