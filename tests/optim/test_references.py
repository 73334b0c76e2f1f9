"""Float64 references written from docs/algorithms.md: several tensors in two param groups over several steps with
momentum-SGD and AdamW state and an lr schedule, for every registry method; and the corners (missing gradients,
rho = 0 is the base optimizer, LookSAM's closure schedule)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import optim
from optim import METHODS

D_IN, HID, C, B, STEPS = 4, 5, 3, 6, 4
LR = (0.1, 0.05)  # group 0: weights (with weight decay), group 1: biases (without)
WD = (0.01, 0.0)
DECAY = 0.15  # LambdaLR multiplier 1 - DECAY t
TOL = {"rtol": 1e-9, "atol": 1e-12}


# ----------------------------------------------------------------------------- the model, functionally
def net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D_IN, HID), nn.Tanh(), nn.Linear(HID, C)).double()


def tensors(model) -> list[torch.Tensor]:
    """W1, W2, b1, b2: the order of the two param groups (weights, then biases)."""
    return [model[0].weight, model[2].weight, model[0].bias, model[2].bias]


def groups_of(model) -> list[dict]:
    w = tensors(model)
    return [
        {"params": w[:2], "lr": LR[0], "weight_decay": WD[0]},
        {"params": w[2:], "lr": LR[1], "weight_decay": WD[1]},
    ]


GROUP_OF = (0, 0, 1, 1)  # group of each tensor in tensors()


def logits_of(ws, x):
    w1, w2, b1, b2 = ws
    return torch.tanh(x @ w1.T + b1) @ w2.T + b2


def batch(t: int):
    g = torch.Generator().manual_seed(500 + t)
    x = torch.randn(B, D_IN, generator=g, dtype=torch.float64)
    y = torch.randint(0, C, (B,), generator=g)
    return x, y, torch.randperm(B, generator=g)  # every sample once per step ("epoch")


def kl(target_logits, student_logits, tau):
    """mean over the batch of KL(softmax(target/tau) || softmax(student/tau)), written out."""
    log_t = torch.log_softmax(target_logits / tau, -1)
    log_s = torch.log_softmax(student_logits / tau, -1)
    return (log_t.exp() * (log_t - log_s)).sum(-1).mean()


def per_sample_loss(ws, x, y):
    return F.cross_entropy(logits_of(ws, x), y, reduction="none")


def loss_grad(ws, x, y, target=None, lam=0.0, tau=1.0):
    """Loss, logits and gradient at ``ws`` (cross-entropy + lam tau^2 KL(target || student) when a target is given)."""
    ws = [w.detach().clone().requires_grad_(True) for w in ws]
    z = logits_of(ws, x)
    loss = F.cross_entropy(z, y)
    if target is not None:
        loss = loss + lam * tau**2 * kl(target, z, tau)
    return loss.detach(), z.detach(), [g.detach() for g in torch.autograd.grad(loss, ws)]


def norm(vs) -> torch.Tensor:
    return torch.sqrt(sum((v * v).sum() for v in vs))


def dot(a, b) -> torch.Tensor:
    return sum((u * v).sum() for u, v in zip(a, b))


# ----------------------------------------------------------------------------- the base optimizers, by the book
class RefSGD:
    """torch.optim.SGD's documented rule: d = g + wd w; b = d (first step) or mu b + d; w <- w - lr b."""

    def __init__(self, mu=0.9):
        self.mu, self.buf = mu, {}

    def step(self, ws, us, lrs, wds):
        out = []
        for i, (w, u, lr, wd) in enumerate(zip(ws, us, lrs, wds)):
            if u is None:
                out.append(w)
                continue
            d = u + wd * w
            self.buf[i] = d if i not in self.buf else self.mu * self.buf[i] + d
            out.append(w - lr * self.buf[i])
        return out


class RefAdamW:
    """torch.optim.AdamW's documented rule: w <- w (1 - lr wd); Adam moments with bias correction."""

    def __init__(self, b1=0.9, b2=0.999, eps=1e-8):
        self.b1, self.b2, self.eps, self.m, self.v, self.t = b1, b2, eps, {}, {}, {}

    def step(self, ws, us, lrs, wds):
        out = []
        for i, (w, u, lr, wd) in enumerate(zip(ws, us, lrs, wds)):
            if u is None:
                out.append(w)
                continue
            self.t[i] = self.t.get(i, 0) + 1
            self.m[i] = self.b1 * self.m.get(i, torch.zeros_like(w)) + (1 - self.b1) * u
            self.v[i] = self.b2 * self.v.get(i, torch.zeros_like(w)) + (1 - self.b2) * u * u
            m_hat = self.m[i] / (1 - self.b1 ** self.t[i])
            v_hat = self.v[i] / (1 - self.b2 ** self.t[i])
            out.append(w * (1 - lr * wd) - lr * m_hat / (v_hat.sqrt() + self.eps))
        return out


BASES = {
    "sgd-momentum": (lambda gs: torch.optim.SGD(gs, lr=LR[0], momentum=0.9), RefSGD),
    "sgd-momentum-fused": (lambda gs: torch.optim.SGD(gs, lr=LR[0], momentum=0.9, fused=True), RefSGD),
    "adamw": (lambda gs: torch.optim.AdamW(gs, lr=LR[0]), RefAdamW),
    "adamw-fused": (lambda gs: torch.optim.AdamW(gs, lr=LR[0], fused=True), RefAdamW),
}


# ----------------------------------------------------------------------------- each method, by the book
@dataclass
class Step:
    """What a method's reference sees at step ``t``: the batch, the weights ``ws`` with the loss's logits ``z`` and
    gradient ``g`` there, the schedule's factor ``s``, each tensor's weight decay, the knobs, the base optimizer's
    reference (whose state MSAM reads) and ``state``, the method's own from step to step."""

    t: int
    x: torch.Tensor
    y: torch.Tensor
    idx: torch.Tensor
    ws: list[torch.Tensor]
    z: torch.Tensor
    g: list[torch.Tensor]
    s: float
    wds: list[float]
    hp: dict
    base_ref: RefSGD | RefAdamW
    state: dict


#: Registry name -> its reference: the update ``u`` the base optimizer steps with, written from docs/algorithms.md.
REFERENCES: dict[str, Callable[[Step], list[torch.Tensor]]] = {}


def by_the_book(name: str):
    def register(fn):
        REFERENCES[name] = fn
        return fn

    return register


@by_the_book("none")
def _none(st: Step):
    return st.g


@by_the_book("sam")
def _sam(st: Step):
    eps = [st.hp["rho"] * gi / (norm(st.g) + 1e-12) for gi in st.g]
    return loss_grad([w + e for w, e in zip(st.ws, eps)], st.x, st.y)[2]


@by_the_book("asam")
def _asam(st: Step):
    T = [w.abs() + st.hp["eta"] for w in st.ws]
    tg = [ti * gi for ti, gi in zip(T, st.g)]
    eps = [st.hp["rho"] * ti * ti * gi / (norm(tg) + 1e-12) for ti, gi in zip(T, st.g)]
    return loss_grad([w + e for w, e in zip(st.ws, eps)], st.x, st.y)[2]


@by_the_book("gsam")
def _gsam(st: Step):
    hp, g = st.hp, st.g
    lr0 = LR[0] * st.s  # group 0's lr is in its own base units
    rho = hp["rho_min"] + (hp["rho_max"] - hp["rho_min"]) * (lr0 - hp["lr_min"]) / (hp["lr_max"] - hp["lr_min"])
    rho = min(max(rho, hp["rho_min"]), hp["rho_max"])
    gp = loss_grad([w + rho * gi / (norm(g) + 1e-12) for w, gi in zip(st.ws, g)], st.x, st.y)[2]
    gp_hat = [v / norm(gp) for v in gp]
    c = dot(g, gp_hat)
    return [p - hp["alpha"] * (gi - c * h) for p, gi, h in zip(gp, g, gp_hat)]


@by_the_book("looksam")
def _looksam(st: Step):
    hp, g = st.hp, st.g
    if st.t % hp["k"] == 0:
        gs = loss_grad([w + hp["rho"] * gi / (norm(g) + 1e-12) for w, gi in zip(st.ws, g)], st.x, st.y)[2]
        st.state["g_v"] = [a - dot(gs, g) / dot(g, g) * b for a, b in zip(gs, g)]
        return gs
    g_v = st.state["g_v"]
    return [gi + hp["alpha"] * norm(g) / norm(g_v) * v for gi, v in zip(g, g_v)]


@by_the_book("saf")
def _saf(st: Step):
    hp, past = st.hp, st.state.setdefault("past", {})
    stored = torch.empty(B, C, dtype=torch.float64)
    stored[st.idx] = st.z.to(torch.float16).to(torch.float64)  # the buffer is half precision
    past[st.t] = stored
    if st.t > hp["e_start"]:
        return loss_grad(st.ws, st.x, st.y, target=past[st.t - hp["e_tilde"]][st.idx], lam=hp["lam"], tau=hp["tau"])[2]
    return st.g


@by_the_book("mesa")
def _mesa(st: Step):
    hp = st.hp
    if st.t == 0:
        st.state["teacher"] = [w.clone() for w in st.ws]
    else:
        # The teacher follows each step's weights; its decay warms up: beta_t = min(beta, (1 + t) / (10 + t)) for the
        # t-th update (docs/algorithms.md), here the update after step t - 1, which made st.ws.
        p = st.t - 1
        b = min(hp["beta"], (1 + p) / (10 + p))
        st.state["teacher"] = [b * v + (1 - b) * w for v, w in zip(st.state["teacher"], st.ws)]
    if st.t > hp["e_start"]:
        target = logits_of(st.state["teacher"], st.x)
        return loss_grad(st.ws, st.x, st.y, target=target, lam=hp["lam"], tau=hp["tau"])[2]
    return st.g


@by_the_book("esam")
def _esam(st: Step):
    hp, g, ws, x, y = st.hp, st.g, st.ws, st.x, st.y
    # ESAM's tensor draws: seeded with torch.initial_seed(), 0 after net(seed=0).
    draws = st.state.setdefault("draws", random.Random(0))
    # SWP: each tensor (param order W1, W2, b1, b2) kept with probability beta; eps = rho/beta g_S/||g_S||.
    kept = [draws.random() < hp["beta"] for _ in ws]
    g_s = [gi if k else torch.zeros_like(gi) for gi, k in zip(g, kept)]
    eps = [hp["rho"] / hp["beta"] * gi / (norm(g_s) + 1e-12) for gi in g_s]
    w_p = [w + e for w, e in zip(ws, eps)]
    # SDS: the round(gamma B) samples whose loss rises most from w to w + eps.
    rise = per_sample_loss(w_p, x, y) - per_sample_loss(ws, x, y)
    k = math.floor(hp["gamma"] * B + 0.5)
    sel = sorted(range(B), key=lambda i: -float(rise[i]))[:k]
    return loss_grad(w_p, x[sel], y[sel])[2]


@by_the_book("fsam")
def _fsam(st: Step):
    hp, g = st.hp, st.g
    ema = st.state.get("ema", [torch.zeros_like(w) for w in st.ws])  # F-SAM's m, m_{-1} = 0
    ema = st.state["ema"] = [hp["lmbda"] * m + (1 - hp["lmbda"]) * gi for m, gi in zip(ema, g)]
    d = [gi - hp["sigma"] * m for gi, m in zip(g, ema)]
    return loss_grad([w + hp["rho"] * di / (norm(d) + 1e-12) for w, di in zip(st.ws, d)], st.x, st.y)[2]


@by_the_book("msam")
def _msam(st: Step):
    # v: the base optimizer's momentum as it stands before this step (SGD's buffer, Adam's m).
    base_ref = st.base_ref
    v = base_ref.buf if isinstance(base_ref, RefSGD) else base_ref.m
    if v:
        nv = norm(list(v.values()))
        eps = [-st.hp["rho"] * v[i] / nv for i in range(4)]
    else:
        eps = [torch.zeros_like(w) for w in st.ws]
    u = loss_grad([w + e for w, e in zip(st.ws, eps)], st.x, st.y)[2]
    if isinstance(base_ref, RefSGD):
        # SGD's L2 decay is taken at w + eps, where the gradient is (the authors' SGD code):
        # d = g + wd (w + eps), written as u = g + wd eps for RefSGD's d = u + wd w.
        u = [ui + wd * e for ui, wd, e in zip(u, st.wds, eps)]
    return u


@by_the_book("wsam")
def _wsam(st: Step):
    hp, g = st.hp, st.g
    alpha = hp["gamma"] / (1 - hp["gamma"])
    gp = loss_grad([w + hp["rho"] * gi / (norm(g) + 1e-12) for w, gi in zip(st.ws, g)], st.x, st.y)[2]
    sharp = [a - b for a, b in zip(gp, g)]
    if not hp["decouple"]:
        return [gi + alpha * si for gi, si in zip(g, sharp)]
    st.state["after_step"] = lambda ws, lrs: [w - lr * alpha * si for w, lr, si in zip(ws, lrs, sharp)]
    return g


@by_the_book("sampa")
def _sampa(st: Step):
    # d: grad f(y_t) of the previous step (none on the first: x~ = y = x); y' = x - lr_t d, both on this batch.
    hp, d = st.hp, st.state.get("d")
    lrs = [LR[GROUP_OF[i]] * st.s for i in range(4)]
    if d is None:
        g, gy = st.g, st.g
    else:
        g = loss_grad([w + hp["rho"] * di / (norm(d) + 1e-12) for w, di in zip(st.ws, d)], st.x, st.y)[2]
        gy = loss_grad([w - lr * di for w, lr, di in zip(st.ws, lrs, d)], st.x, st.y)[2]
    st.state["d"] = gy
    return [(1 - hp["lmbda"]) * a + hp["lmbda"] * b for a, b in zip(g, gy)]


@by_the_book("vasso")
def _vasso(st: Step):
    # d_0 = g_0, then d_t = (1 - theta) d_{t-1} + theta g_t; SAM's ascent along d_t.
    hp, g = st.hp, st.g
    d = st.state.get("d")
    d = st.state["d"] = g if d is None else [(1 - hp["theta"]) * a + hp["theta"] * b for a, b in zip(d, g)]
    return loss_grad([w + hp["rho"] * di / (norm(d) + 1e-12) for w, di in zip(st.ws, d)], st.x, st.y)[2]


@by_the_book("rwp")
def _rwp(st: Step):
    # eps: one float64 randn of all 4 tensors' elements, split in param order (W1, W2, b1, b2), from a generator
    # seeded with torch.initial_seed() (0 after net(seed=0)); std sigma ||row|| for a matrix, sigma ||b|| for a vector,
    # each divided by sqrt(1 + eta F) (F summed over the row of a matrix); F <- beta F + g_p^2 after the step.
    hp = st.hp
    gen = st.state.setdefault("gen", torch.Generator().manual_seed(0))
    fisher = st.state.get("F")
    flat = torch.randn(sum(w.numel() for w in st.ws), generator=gen, dtype=torch.float64)
    eps = []
    for i, (w, z) in enumerate(zip(st.ws, flat.split([w.numel() for w in st.ws]))):
        z = z.view(w.shape)
        if w.dim() == 2:
            std = hp["sigma"] * w.norm(dim=1, keepdim=True)
            if fisher is not None:
                std = std / torch.sqrt(1 + hp["eta"] * fisher[i].sum(dim=1, keepdim=True))
        else:
            std = hp["sigma"] * w.norm()
            if fisher is not None:
                std = std / torch.sqrt(1 + hp["eta"] * fisher[i])
        eps.append(z * std)
    gp = loss_grad([w + e for w, e in zip(st.ws, eps)], st.x, st.y)[2]
    st.state["F"] = [q * q if fisher is None else hp["beta"] * f + q * q for f, q in zip(fisher or gp, gp)]
    return [hp["lmbda"] * a + (1 - hp["lmbda"]) * b for a, b in zip(gp, st.g)]


@by_the_book("gam")
def _gam(st: Step):
    # The authors' four passes: g1 at SAM's point of radius rho', w2 along g1 - g0 (radius rho), g3 at SAM's point
    # of w2; h = alpha g1 + (1 - alpha) g3 less gamma times p = g0 + (1 - beta) g2's part orthogonal to h.
    hp, g0, ws = st.hp, st.g, st.ws

    def at(vs):
        return loss_grad(vs, st.x, st.y)[2]

    def along(base, u, r):
        return [w + r * ui / (norm(u) + 1e-12) for w, ui in zip(base, u)]

    g1 = at(along(ws, g0, hp["rho_prime"]))
    w2 = along(ws, [a - b for a, b in zip(g1, g0)], hp["rho"])
    g2 = at(w2)
    g3 = at(along(w2, g2, hp["rho_prime"]))
    h = [hp["alpha"] * a + (1 - hp["alpha"]) * b for a, b in zip(g1, g3)]
    p = [a + (1 - hp["beta"]) * b for a, b in zip(g0, g2)]
    c = dot(p, h) / dot(h, h)
    return [hi - hp["gamma"] * (pi - c * hi) for hi, pi in zip(h, p)]


@by_the_book("lookbehind")
def _lookbehind(st: Step):
    # k base steps of the fast weights, each with the gradient at the next point of the ascent chain from the slow
    # weights; the slow weights then move alpha of the way to the fast ones (after_step), the base reference's own
    # step given no gradient (it leaves every weight and its state alone).
    hp, lrs = st.hp, [LR[GROUP_OF[i]] * st.s for i in range(4)]
    point, fast, g = list(st.ws), list(st.ws), st.g
    for _ in range(hp["k"]):
        point = [u + hp["rho"] * gi / (norm(g) + 1e-12) for u, gi in zip(point, g)]
        g = loss_grad(point, st.x, st.y)[2]
        fast = st.base_ref.step(fast, g, lrs, st.wds)
    slow = st.ws
    st.state["after_step"] = lambda ws, lrs: [hp["alpha"] * f + (1 - hp["alpha"]) * s for f, s in zip(fast, slow)]
    return [None] * 4


@by_the_book("bsam")
def _bsam(st: Step):
    # The paper's Algorithm 1, N = data_factor B: theta = w + z / sqrt(N s) (one float64 randn of all 4 tensors'
    # elements, split in param order, from a generator seeded with torch.initial_seed(): 0 after net(seed=0));
    # g at theta; g_eps at w + rho g / s; m <- b1 m + (1 - b1)(g_eps + delta w); s <- b2 s + (1 - b2)(sqrt(s)|g| +
    # delta + damping); w <- w - lr m / s with the new s (after_step: the base optimizer takes no step, its weight
    # decay unread).
    hp, ws = st.hp, st.ws
    gen = st.state.setdefault("gen", torch.Generator().manual_seed(0))
    n = hp.get("data_factor", 1.0) * B
    m = st.state.get("m") or [torch.zeros_like(w) for w in ws]
    s = st.state.get("s") or [torch.full_like(w, hp["s_init"]) for w in ws]
    flat = torch.randn(sum(w.numel() for w in ws), generator=gen, dtype=torch.float64)
    zs = [z.view(w.shape) for w, z in zip(ws, flat.split([w.numel() for w in ws]))]
    g = loss_grad([w + z / torch.sqrt(n * si) for w, z, si in zip(ws, zs, s)], st.x, st.y)[2]
    g_eps = loss_grad([w + hp["rho"] * gi / si for w, gi, si in zip(ws, g, s)], st.x, st.y)[2]
    b1, b2, delta = hp["beta1"], hp["beta2"], hp["delta"]
    m = [b1 * mi + (1 - b1) * (ge + delta * w) for mi, ge, w in zip(m, g_eps, ws)]
    s = [b2 * si + (1 - b2) * (torch.sqrt(si) * gi.abs() + delta + hp["damping"]) for si, gi in zip(s, g)]
    st.state["m"], st.state["s"] = m, s
    st.state["after_step"] = lambda ws, lrs: [w - lr * mi / si for w, lr, mi, si in zip(ws, lrs, m, s)]
    return [None] * 4


def reference(name: str, base_ref, ws, steps=STEPS, hp=None):
    if name not in REFERENCES:
        pytest.fail(
            f"method {name!r} has no float64 reference: write its update from docs/algorithms.md as a function "
            f"decorated @by_the_book({name!r}) in tests/optim/test_references.py"
        )
    hp = {**METHODS[name].small.hparams, **(hp or {})}
    ws = [w.detach().clone() for w in ws]
    state: dict = {}
    for t in range(steps):
        x, y, idx = batch(t)
        s = 1.0 - DECAY * t
        lrs = [LR[GROUP_OF[i]] * s for i in range(4)]
        wds = [WD[GROUP_OF[i]] for i in range(4)]
        _, z, g = loss_grad(ws, x, y)
        u = REFERENCES[name](Step(t, x, y, idx, ws, z, g, s, wds, hp, base_ref, state))
        ws = base_ref.step(ws, u, lrs, wds)
        if "after_step" in state:  # a step of the method's own after the base optimizer's (WSAM's decoupled one)
            ws = state.pop("after_step")(ws, lrs)
    return ws


def ours(name: str, make_base, steps=STEPS, hp=None, seed=0):
    model = net(seed)
    base = make_base(groups_of(model))
    sched = torch.optim.lr_scheduler.LambdaLR(base, lambda t: 1.0 - DECAY * t)
    method = optim.create(
        name, base, model=model, num_samples=B, num_classes=C, **{**METHODS[name].small.hparams, **(hp or {})}
    )
    for t in range(steps):
        x, y, idx = batch(t)

        def forward(rows=None, reduction="mean", x=x, y=y):
            xs, ys = (x, y) if rows is None else (x[rows], y[rows])
            z = model(xs)
            return F.cross_entropy(z, ys, reduction=reduction), z

        method.train_step(forward, inputs=x, indices=idx, epoch=t)
        sched.step()
    return [w.detach().clone() for w in tensors(model)]


@pytest.mark.parametrize("base", list(BASES))
@pytest.mark.parametrize("name", list(METHODS))
def test_multi_tensor_multi_group_multi_step_reference(name, base):
    make_base, ref_cls = BASES[base]
    got = ours(name, make_base)
    want = reference(name, ref_cls(), tensors(net()))
    moved = [not torch.equal(a, b) for a, b in zip(got, tensors(net()))]
    assert all(moved)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)


# ----------------------------------------------------------------------------- rho = 0 is the base optimizer
# Each entry's small.base_exactly: the knobs under which it is its base optimizer exactly. A method whose update is
# its own (bSAM) steps no base optimizer, so none reduces it to one: its rho = 0 is in tests/optim/test_bsam.py.
ZERO_RHO = {n: s.small.base_exactly for n, s in METHODS.items() if s.small.base_exactly is not None}
PERTURBING = [n for n, s in METHODS.items() if s.steps_base and (s.two_pass or "rho" in s.hparams)]


@pytest.mark.parametrize("base", ["sgd-momentum", "adamw"])
@pytest.mark.parametrize("name", PERTURBING)
def test_rho_zero_is_the_base_optimizer_exactly(name, base):
    # docs/algorithms.md, "Small-norm guards": no +1e-12 may leave a trace where the exact answer is defined.
    # Old LookSAM kept ||g_v|| = 2e-12 and rescaled it to alpha ||g||; old GSAM's c was 1 - 2e-12/||g||.
    assert set(ZERO_RHO) == set(PERTURBING)
    make_base, _ = BASES[base]
    got = ours(name, make_base, steps=5, hp=ZERO_RHO[name])
    want = ours("none", make_base, steps=5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ----------------------------------------------------------------------------- missing gradients
class Branchy(nn.Module):
    """A trunk ``a`` and a branch ``b`` that a forward may leave out (stochastic depth, an MoE expert without tokens)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.a = nn.Parameter(torch.randn(4, generator=g, dtype=torch.float64))
        self.b = nn.Parameter(torch.randn(3, generator=g, dtype=torch.float64))
        self.M = torch.randn(5, 4, generator=g, dtype=torch.float64)
        self.N = torch.randn(3, 3, generator=g, dtype=torch.float64)
        self.t = torch.randn(5, generator=g, dtype=torch.float64)


def branchy_loss(m, a, b, use_b: bool):
    loss = 0.5 * ((m.M @ a - m.t) ** 2).sum() + 0.25 * (a**4).sum()
    if use_b:
        loss = loss + 0.5 * ((m.N @ b) ** 2).sum() + (a[:3] @ b) ** 2
    return loss


def branchy_grad(m, a, b, use_b):
    """(g_a, g_b) with g_b = 0 when b is left out: missing counts as zero (docs/algorithms.md)."""
    a, b = a.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True)
    ga, gb = torch.autograd.grad(branchy_loss(m, a, b, use_b), [a, b], allow_unused=True, materialize_grads=True)
    return [ga, gb]


def branchy_run(name, uses, steps, lr=0.1, **hp):
    """Our method on Branchy; ``uses[i]`` says whether b is in the i-th forward overall."""
    m = Branchy()
    method = optim.create(name, torch.optim.SGD(m.parameters(), lr=lr), model=m, **hp)
    calls = []

    def forward():
        use_b = uses[len(calls)]
        calls.append(1)
        return branchy_loss(m, m.a, m.b, use_b), m.a.detach()[None]

    for _ in range(steps):
        method.train_step(forward)
    assert len(calls) == len(uses)
    return m


@pytest.mark.parametrize("missing_in", [2, 1], ids=["b-in-pass-1-only", "b-in-pass-2-only"])
def test_gsam_counts_a_missing_gradient_as_zero(missing_in):
    lr, alpha, rho = 0.1, 0.4, 0.3
    uses = [missing_in != 1, missing_in != 2]
    m = branchy_run("gsam", uses, 1, lr=lr, alpha=alpha, rho_max=rho, rho_min=rho)
    ref = Branchy()
    w = [ref.a.detach(), ref.b.detach()]
    g = branchy_grad(ref, *w, uses[0])
    eps = [rho * gi / (norm(g) + 1e-12) for gi in g]
    gp = branchy_grad(ref, *[wi + e for wi, e in zip(w, eps)], uses[1])
    gp_hat = [v / norm(gp) for v in gp]
    c = dot(g, gp_hat)
    u = [p - alpha * (gi - c * h) for p, gi, h in zip(gp, g, gp_hat)]
    # b with a pass 1 gradient only moves by -lr * (-alpha g_b); every coordinate of a depends on c.
    torch.testing.assert_close(m.a.detach(), w[0] - lr * u[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(m.b.detach(), w[1] - lr * u[1], rtol=0, atol=1e-12)
    assert not torch.equal(m.b.detach(), w[1])


@pytest.mark.parametrize("b_in_reuse", [True, False], ids=["b-in-reuse-step", "b-not-in-reuse-step"])
@pytest.mark.parametrize("missing_in", [2, 1], ids=["b-in-pass-1-only", "b-in-pass-2-only"])
def test_looksam_counts_a_missing_gradient_as_zero(missing_in, b_in_reuse):
    lr, alpha, rho = 0.1, 0.7, 0.3
    uses = [missing_in != 1, missing_in != 2, b_in_reuse]  # SAM step (two passes), then one reuse step
    m = branchy_run("looksam", uses, 2, lr=lr, alpha=alpha, rho=rho, k=2)
    ref = Branchy()
    w = [ref.a.detach(), ref.b.detach()]
    g = branchy_grad(ref, *w, uses[0])
    gs = branchy_grad(ref, *[wi + rho * gi / (norm(g) + 1e-12) for wi, gi in zip(w, g)], uses[1])
    g_v = [s - dot(gs, g) / dot(g, g) * gi for s, gi in zip(gs, g)]
    # SAM step: the update is g_s; a parameter without a pass 2 gradient gets none (SGD leaves it alone).
    w1 = [w[0] - lr * gs[0], w[1] - lr * gs[1] if uses[1] else w[1]]
    g1 = branchy_grad(ref, *w1, uses[2])
    # Reuse step: g + alpha ||g|| / ||g_v|| g_v, with g_b = 0 when b is left out (it still moves along g_v).
    w2 = [wi - lr * (gi + alpha * norm(g1) / norm(g_v) * v) for wi, gi, v in zip(w1, g1, g_v)]
    torch.testing.assert_close(m.a.detach(), w2[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(m.b.detach(), w2[1], rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- LookSAM's closure schedule
def test_looksam_step_closure_follows_the_train_step_schedule():
    n, k = 6, 3
    results, counts = {}, {}
    for mode in ("train_step", "closure", "sam"):
        model = net()
        base = torch.optim.SGD(groups_of(model), lr=LR[0], momentum=0.9)
        method = (
            optim.create("sam", base, model=model, rho=0.1)
            if mode == "sam"
            else optim.create("looksam", base, model=model, rho=0.1, k=k, alpha=0.7)
        )
        calls = []
        for t in range(n):
            x, y, _ = batch(t)

            def forward(model=model, calls=calls, x=x, y=y):
                calls.append(1)
                z = model(x)
                return F.cross_entropy(z, y), z

            def closure(forward=forward):
                loss = forward()[0]
                loss.backward()
                return loss

            if mode == "closure":
                loss = method.step(closure)
                assert loss.ndim == 0
            else:
                method.train_step(forward)
        results[mode] = [w.detach().clone() for w in tensors(model)]
        counts[mode] = len(calls)
    assert counts == {"train_step": n + math.ceil(n / k), "closure": n + math.ceil(n / k), "sam": 2 * n}
    for a, b in zip(results["closure"], results["train_step"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not all(torch.equal(a, b) for a, b in zip(results["closure"], results["sam"]))


# ----------------------------------------------------------------------------- MSAM against the authors' form
def test_msam_follows_the_authors_trajectory_with_weight_decay():
    """The authors' SGD MSAM keeps the weights at w~ = w - rho v/||v|| between steps, takes the gradient there and
    adds the L2 decay at w~ too: d = g(w~) + wd w~, v <- mu v + d, w <- w~ + rho v_old/||v_old|| - lr v, then
    w~ <- w - rho v/||v||. Written here in that form, ten steps at wd 5e-4 and rho 0.3 (the default): ours,
    which holds w and perturbs inside the step, must land on the same w (old code decayed at w: 8e-5 off)."""
    lr, mu, wd, rho, steps = 0.1, 0.9, 5e-4, 0.3, 10
    model = net()
    start = tensors(model)
    w_tilde = [w.detach().clone() for w in start]  # no momentum yet: no perturbation
    v, shift = None, [torch.zeros_like(w) for w in w_tilde]  # shift = w~ - w
    for t in range(steps):
        x, y, _ = batch(t)
        g = loss_grad(w_tilde, x, y)[2]
        d = [gi + wd * wi for gi, wi in zip(g, w_tilde)]
        v = d if v is None else [mu * vi + di for vi, di in zip(v, d)]
        w = [wi - s - lr * vi for wi, s, vi in zip(w_tilde, shift, v)]
        shift = [-rho * vi / norm(v) for vi in v]
        w_tilde = [wi + s for wi, s in zip(w, shift)]
    want = [wi - s for wi, s in zip(w_tilde, shift)]  # the authors move back to w for evaluation

    base = torch.optim.SGD(start, lr=lr, momentum=mu, weight_decay=wd)
    method = optim.create("msam", base, model=model, rho=rho)
    for t in range(steps):
        x, y, _ = batch(t)

        def forward(x=x, y=y):
            z = model(x)
            return F.cross_entropy(z, y), z

        method.train_step(forward, inputs=x)
    for a, b in zip(tensors(model), want):
        torch.testing.assert_close(a.detach(), b, **TOL)
