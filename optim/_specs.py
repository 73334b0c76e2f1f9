"""The registry's entries, torch-free: each method's name, description, knobs (default and rule), relations and builder; the classes check their knobs with these same rules."""

from __future__ import annotations

import importlib.util
import math
from typing import Any, TypeVar

from ._knobs import (
    FLAG,
    RADIUS,
    Knob,
    MethodSpec,
    OwnUpdate,
    Relation,
    Rule,
    SharedBatch,
    SmallRun,
    check,
    integer,
    method_spec,
    number,
    strict_number,
)

__all__ = ["SPECS", "registered"]

# Adding a method: its module holds the class (torch), decorated with ``@registered``, and one entry below names it
# in ``builder``, declares its knobs, its measured step cost, whether its compiled step is exact, and how the tests
# run it small (``small``); the class reads its name and checks its arguments with the entry's knobs
# (``self.spec.check_knobs(...)``), so each rule and default is written once. tests/optim/test_knobs.py holds each
# declared default equal to the builder's signature; the registry-parametrised tests in tests/optim/ run every entry.
# The step costs: each method's training throughput as a share of `none`'s, measured by benchmarks/bench_optim.py
# on an NVIDIA H100 80GB HBM3, ViT-S/4 @32, batch 512 (docs/benchmarks.md, "optim: cost of each method per step"
# and "ESAM, F-SAM and MSAM"); those of issue 34's methods (wsam, sampa, vasso, rwp, gam, lookbehind) are their
# compiled steps over the compiled `none` on an NVIDIA H200, ViT-S/4 @32, batch 256, bf16 (benchmarks/results/optim.csv,
# the commit in each comment); bsam's too; GCSAM is SAM's (its `gc` knob). compiled_differs: what the GPU check
# (benchmarks/check_compiled.py, docs/benchmarks.md) saw where the compiled step disagreed with eager beyond float rounding.


def _parse_p(p: Any) -> Any:
    if isinstance(p, str):
        return float(p.strip().lower().replace("infinity", "inf"))
    return float(p) if number(p) else p


P_NORM = Rule(
    "p == 2 or p == float('inf')",
    lambda p: p == 2.0 or p == math.inf,
    "use p=2 (Euclidean ball, the default) or p=float('inf') (sign of the gradient)",
    parse=_parse_p,
)
ETA = Rule(
    "0 <= eta < inf",
    lambda x: number(x) and math.isfinite(x) and x >= 0,
    "pass eta=0.01 (the ASAM authors' choice) or eta=0 for the w^2 g / || |w| g || variant",
    convert=float,
)
M_SHARPNESS = Rule(
    "m >= 1 (an integer number of samples per perturbation) or None",
    lambda m: m is None or (integer(m) and m >= 1),
    "pass e.g. m=32, or leave m unset for one perturbation per batch",
)
LAM = Rule(
    "0 <= lam < inf",
    lambda x: number(x) and math.isfinite(x) and x >= 0,
    "pass a non-negative weight for the trajectory loss, e.g. lam=0.3 (SAF) or lam=0.8 (MESA)",
    convert=float,
)
TAU = Rule(
    "tau > 0",
    lambda x: number(x) and math.isfinite(x) and x > 0,
    "pass a positive temperature, e.g. tau=5.0",
    convert=float,
)
E_START = Rule(
    "e_start >= 0 (an integer epoch)",
    lambda x: integer(x) and x >= 0,
    "pass the last epoch without the loss, e.g. e_start=5",
)
FRACTION = Rule(
    "0 < {name} <= 1",
    lambda x: strict_number(x) and math.isfinite(x) and 0 < x <= 1,
    "pass a fraction such as {name}={default} ({name}=1 switches it off)",
    convert=float,
)


def _rho_order(v: dict[str, Any]) -> None:
    check(
        v["rho_min"] <= v["rho_max"],
        "rho_min",
        "rho_min <= rho_max",
        v["rho_min"],
        f"pass rho_min <= rho_max={v['rho_max']} (equal values give a constant radius)",
    )


def _lr_order(v: dict[str, Any]) -> None:
    lr_max, lr_min = v["lr_max"], v["lr_min"]
    check(
        lr_max is None or (number(lr_max) and math.isfinite(lr_max) and lr_max >= lr_min),
        "lr_max",
        "lr_max >= lr_min",
        lr_max,
        f"pass the schedule's peak lr (>= lr_min={lr_min}) in units of param group 0's base lr, or None "
        "for group 0's max_lr (OneCycleLR) or base lr",
    )


def _e_start_after_e_tilde(v: dict[str, Any]) -> None:
    e_tilde, e_start = v["e_tilde"], v["e_start"]
    check(
        e_start >= e_tilde,
        "e_start",
        f"e_start >= e_tilde (={e_tilde})",
        e_start,
        f"the loss reads logits from e_tilde epochs back, which exist only after epoch e_tilde; pass e_start >= {e_tilde}",
    )


def _bsam_precision_positive(v: dict[str, Any]) -> None:
    beta2, floor = v["beta2"], v["delta"] + v["damping"]
    check(
        beta2 > 0 or floor > 0,
        "beta2",
        f"beta2 > 0 or delta + damping > 0 (delta + damping = {floor})",
        beta2,
        "s <- beta2 s + (1 - beta2)(sqrt(s) |g| + delta + damping) is otherwise zero wherever g is, and w <- w - lr m/s "
        "divides by it; pass beta2=0.999 (the paper's) or damping=0.1",
    )


def _unit_decay(what: str, example: float) -> Rule:
    return Rule(
        "0 <= {name} < 1",
        lambda x: strict_number(x) and 0 <= x < 1,
        f"pass the decay of {what}, e.g. {{name}}={example}",
        convert=float,
    )


def _non_negative(fix: str) -> Rule:
    return Rule("0 <= {name} < inf", lambda x: strict_number(x) and math.isfinite(x) and x >= 0, fix, convert=float)


def _positive(fix: str) -> Rule:
    return Rule("0 < {name} < inf", lambda x: strict_number(x) and math.isfinite(x) and x > 0, fix, convert=float)


def _fsam_first_step_uphill(v: dict[str, Any]) -> None:
    sigma, lmbda = v["sigma"], v["lmbda"]
    check(
        sigma * (1.0 - lmbda) < 1.0,
        "sigma",
        f"sigma * (1 - lmbda) < 1 (lmbda={lmbda})",
        sigma,
        f"d_t = (1 - sigma (1 - lmbda)) g_t - sigma lmbda m_(t-1), so otherwise the batch gradient's share is zero or "
        f"negative and the first step's perturbation (m_(-1) = 0) vanishes or points downhill; pass sigma < "
        f"{1.0 / (1.0 - lmbda):.6g} (= 1 / (1 - lmbda)) or a larger lmbda, e.g. sigma=1.0 with lmbda=0.6",
    )


SPECS = (
    method_spec(
        "none",
        description="The base optimizer alone (one pass).",
        builder="._method:BaseOnly",
        step_cost=1.0,
        small=SmallRun(),
    ),
    method_spec(
        "sam",
        description="SAM (Foret et al. 2021): update with the gradient at w + rho g/||g|| (p=2) or "
        "rho sign(g) (p=inf); m samples per perturbation (m-sharpness); gc=True centralises g first (GCSAM).",
        builder="._sam:SAM",
        knobs=(
            Knob("rho", 0.05, RADIUS),
            Knob("p", 2, P_NORM),
            Knob("m", None, M_SHARPNESS),
            Knob("gc", False, FLAG),  # GCSAM: the gradient centralised before the ascent
        ),
        two_pass=True,
        needs=("model",),
        step_cost=None,  # each card's own measured SAM figure (studies/cost.py CARD_FIGURES)
        small=SmallRun({"rho": 0.05}, base_exactly={"rho": 0.0}, passes_per_step=2, forwards=6),
    ),
    # The class SAM with adaptive=True; its larger default radius is the ASAM authors'.
    method_spec(
        "asam",
        description="Adaptive SAM (Kwon et al. 2021): eps = rho T^2 g/||T g||, T = |w| + eta.",
        builder="._sam:SAM",
        build_kwargs={"adaptive": True},
        knobs=(Knob("rho", 0.5, RADIUS), Knob("eta", 0.01, ETA), Knob("m", None, M_SHARPNESS)),
        two_pass=True,
        needs=("model",),
        step_cost=0.497,
        small=SmallRun({"rho": 0.5, "eta": 0.01}, base_exactly={"rho": 0.0}, passes_per_step=2, forwards=6),
    ),
    method_spec(
        "gsam",
        description="GSAM (Zhuang et al. 2022): g_p - alpha g_perp, radius following the lr.",
        builder="._gsam:GSAM",
        knobs=(
            Knob("rho_max", 0.1, RADIUS),
            Knob("rho_min", 0.1, RADIUS),
            Knob(
                "alpha",
                0.3,
                Rule(
                    "0 <= alpha < inf",
                    lambda x: number(x) and math.isfinite(x) and x >= 0,
                    "pass a non-negative ascent weight such as alpha=0.3 (alpha=0 is SAM)",
                    convert=float,
                ),
            ),
            Knob("lr_max", None),  # its rule reads lr_min: _lr_order
            Knob(
                "lr_min",
                0.0,
                Rule(
                    "0 <= lr_min < inf",
                    lambda x: number(x) and math.isfinite(x) and x >= 0,
                    "pass the schedule's final lr, e.g. lr_min=0.0",
                    convert=float,
                ),
            ),
            Knob("adaptive", False, FLAG),
            Knob("eta", 0.01, ETA),
        ),
        relations=(Relation(("rho_max", "rho_min"), _rho_order), Relation(("lr_max", "lr_min"), _lr_order)),
        two_pass=True,
        needs=("model",),
        step_cost=0.496,
        small=SmallRun(
            {"rho_max": 0.08, "rho_min": 0.02, "alpha": 0.3, "lr_max": 0.1, "lr_min": 0.0},
            base_exactly={"rho_max": 0.0, "rho_min": 0.0},
            passes_per_step=2,
            forwards=6,
        ),
    ),
    method_spec(
        "looksam",
        description="LookSAM (Liu et al. 2022): SAM every k-th step, the stored orthogonal direction in between.",
        builder="._looksam:LookSAM",
        knobs=(
            Knob("rho", 0.1, RADIUS),
            Knob(
                "k",
                5,
                Rule(
                    "k >= 1 (an integer)",
                    lambda x: integer(x) and x >= 1,
                    "pass the SAM-step interval, e.g. k=5 (k=1 is plain SAM)",
                ),
            ),
            Knob(
                "alpha",
                0.7,
                Rule(
                    "alpha >= 0",
                    lambda x: number(x) and not math.isnan(x) and x >= 0,
                    "pass a non-negative weight for the stored direction, e.g. alpha=0.7",
                    convert=float,
                ),
            ),
        ),
        two_pass=True,
        needs=("model",),
        step_cost=0.826,
        small=SmallRun({"rho": 0.1, "k": 2, "alpha": 0.7}, base_exactly={"rho": 0.0}, passes_per_step=1.5, forwards=5),
    ),
    method_spec(
        "saf",
        description="SAF (Du et al. 2022): trajectory loss against each sample's logits from e_tilde epochs ago.",
        builder="._trajectory:build_saf",
        knobs=(
            Knob("lam", 0.3, LAM),
            Knob("tau", 5.0, TAU),
            Knob(
                "e_tilde",
                3,
                Rule(
                    "e_tilde >= 1 (an integer number of epochs)",
                    lambda x: integer(x) and x >= 1,
                    "pass how many epochs back to look, e.g. e_tilde=3",
                ),
            ),
            Knob("e_start", 5, E_START),
        ),
        relations=(Relation(("e_tilde", "e_start"), _e_start_after_e_tilde),),
        needs=("num_samples", "num_classes"),
        step_cost=0.998,
        small=SmallRun({"lam": 0.3, "tau": 2.0, "e_tilde": 1, "e_start": 1}, defaults_in="._trajectory:SAF"),
    ),
    method_spec(
        "mesa",
        description="MESA (Du et al. 2022): trajectory loss against an EMA teacher's logits.",
        builder="._trajectory:build_mesa",
        knobs=(
            Knob(
                "beta",
                0.9998,
                Rule(
                    "0 <= beta < 1",
                    lambda x: number(x) and 0 <= x < 1,
                    "pass an EMA decay such as beta=0.9998",
                    convert=float,
                ),
            ),
            Knob("lam", 0.8, LAM),
            Knob("tau", 5.0, TAU),
            Knob("e_start", 5, E_START),
        ),
        needs=("model",),
        step_cost=0.995,
        # The teacher's forward makes a third of the passes once the loss is on (steps 2 and 3 of three).
        small=SmallRun(
            {"beta": 0.9, "lam": 0.8, "tau": 2.0, "e_start": 1},
            passes_per_step=4 / 3,
            defaults_in="._trajectory:MESA",
        ),
    ),
    method_spec(
        "esam",
        description="ESAM (Du et al. 2022): eps on a random beta share of the weight tensors "
        "(scaled 1/beta), pass 2 on the gamma share of the batch whose loss rises most.",
        builder="._esam:ESAM",
        knobs=(Knob("rho", 0.05, RADIUS), Knob("beta", 0.6, FRACTION), Knob("gamma", 0.5, FRACTION)),
        two_pass=True,
        needs=("model",),
        step_cost=0.575,
        # gamma < 1 is the base optimizer on the selected samples only, so rho = 0 needs gamma = 1 too; pass 1,
        # the no-grad selection forward (call 2), pass 2 on the selected half.
        small=SmallRun(
            {"rho": 0.05, "beta": 0.6, "gamma": 0.5},
            base_exactly={"rho": 0.0, "gamma": 1.0},
            call_of_pass={1: 1, 2: 3},
            passes_per_step=1 + 1 / 3 + 0.5,
            forwards=9,
        ),
    ),
    method_spec(
        "fsam",
        description="Friendly SAM (Li et al. 2024): eps along g - sigma m, m an EMA (decay lmbda) "
        "of past gradients estimating the full gradient.",
        builder="._fsam:FriendlySAM",
        knobs=(
            Knob("rho", 0.05, RADIUS),
            Knob(
                "sigma",
                1.0,
                Rule(
                    "0 <= sigma < inf",
                    lambda x: strict_number(x) and math.isfinite(x) and x >= 0,
                    "pass the share of the EMA removed, e.g. sigma=1.0 (sigma=0 is SAM)",
                    convert=float,
                ),
            ),
            Knob(
                "lmbda",
                0.6,
                Rule(
                    "0 <= lmbda < 1",
                    lambda x: strict_number(x) and 0 <= x < 1,
                    "pass an EMA decay such as lmbda=0.6 (CIFAR) or 0.95 (ImageNet)",
                    convert=float,
                ),
            ),
        ),
        relations=(Relation(("sigma", "lmbda"), _fsam_first_step_uphill),),
        two_pass=True,
        needs=("model",),
        step_cost=0.496,
        small=SmallRun(
            {"rho": 0.05, "sigma": 0.9, "lmbda": 0.6}, base_exactly={"rho": 0.0}, passes_per_step=2, forwards=6
        ),
    ),
    method_spec(
        "msam",
        description="Momentum-SAM (Becker et al. 2024): one gradient per step, at w - rho v/||v|| "
        "with v the base optimizer's momentum.",
        builder="._msam:MSAM",
        knobs=(Knob("rho", 0.3, RADIUS),),
        needs_momentum=True,
        perturbs=True,
        step_cost=0.986,
        compiled_differs="its compiled step (CUDA graphs) ended 0.26 relative from eager after 50 fp32 steps on an "
        "H200, where a one-rounding nudge of the start moved eager by 2e-6 (not yet explained)",
        small=SmallRun({"rho": 0.1}, base_exactly={"rho": 0.0}),
    ),
    method_spec(
        "wsam",
        description="WSAM (Yue et al. 2023): L + gamma/(1-gamma) (L_SAM - L); the sharpness step g_p - g "
        "decoupled from the base optimizer (decouple=True) or added to its gradient.",
        builder="._wsam:WSAM",
        knobs=(
            Knob("rho", 0.05, RADIUS),
            Knob(
                "gamma",
                0.9,
                Rule(
                    "0 <= gamma < 1",
                    lambda x: strict_number(x) and 0 <= x < 1,
                    "pass the sharpness weight, e.g. gamma=0.9 (gamma=0.5 without decoupling is SAM, 0 the base "
                    "optimizer)",
                    convert=float,
                ),
            ),
            Knob("decouple", True, FLAG),
        ),
        two_pass=True,
        needs=("model",),
        step_cost=0.488,  # optim.csv b3fe3eb
        small=SmallRun(
            {"rho": 0.05, "gamma": 0.8, "decouple": True}, base_exactly={"rho": 0.0}, passes_per_step=2.0, forwards=6
        ),
    ),
    method_spec(
        "sampa",
        description="SAMPa (Xie et al. 2024): SAM perturbed along the gradient at y = x - lr d of the previous step, "
        "so the step's two gradients are independent; (1-lmbda) g(x~) + lmbda g(y).",
        builder="._sampa:SAMPa",
        knobs=(
            Knob("rho", 0.1, RADIUS),
            Knob(
                "lmbda",
                0.2,
                Rule(
                    "0 <= lmbda <= 1",
                    lambda x: strict_number(x) and 0 <= x <= 1,
                    "pass the weight of the optimistic gradient, e.g. lmbda=0.2 (the paper's SAMPa-0.2; 0 is SAMPa-0)",
                    convert=float,
                ),
            ),
            Knob("parallel", False, FLAG),
        ),
        perturbs=True,
        needs=("model",),
        shared_batch=SharedBatch("parallel", ranks=2),  # parallel=True: rank 0 takes g(x~), rank 1 g(y), one batch
        step_cost=0.484,  # optim.csv b3fe3eb
        small=SmallRun(
            {"rho": 0.05, "lmbda": 0.3}, base_exactly={"rho": 0.0, "lmbda": 0.0}, passes_per_step=2.0, forwards=6
        ),
    ),
    method_spec(
        "vasso",
        description="VaSSO (Li & Giannakis 2023): SAM perturbed along d_t = (1-theta) d_{t-1} + theta g_t, an EMA "
        "of the stochastic gradients.",
        builder="._vasso:VaSSO",
        knobs=(
            Knob("rho", 0.1, RADIUS),
            Knob(
                "theta",
                0.4,
                Rule(
                    "0 <= theta <= 1",
                    lambda x: strict_number(x) and 0 <= x <= 1,
                    "pass the EMA weight of the new gradient, e.g. theta=0.4 (1 is SAM)",
                    convert=float,
                ),
            ),
        ),
        two_pass=True,
        needs=("model",),
        step_cost=0.483,  # optim.csv b3fe3eb
        small=SmallRun({"rho": 0.05, "theta": 0.4}, base_exactly={"rho": 0.0}, passes_per_step=2.0, forwards=6),
    ),
    method_spec(
        "rwp",
        description="RWP / m-ARWP (Li et al. 2024): lmbda g(w + eps) + (1-lmbda) g(w), eps a random filter-normalised "
        "draw whose variance shrinks by 1/(1 + eta F), F a running sum of squared gradients; eta=0 is m-RWP, "
        "lmbda=1 RWP (one pass).",
        builder="._rwp:RWP",
        knobs=(
            Knob(
                "sigma",
                0.015,
                Rule(
                    "0 <= sigma < inf",
                    lambda x: strict_number(x) and math.isfinite(x) and x >= 0,
                    "pass the noise's standard deviation relative to each filter's norm, e.g. sigma=0.015",
                    convert=float,
                ),
            ),
            Knob(
                "lmbda",
                0.5,
                Rule(
                    "0 <= lmbda <= 1",
                    lambda x: strict_number(x) and 0 <= x <= 1,
                    "pass the weight of the perturbed gradient, e.g. lmbda=0.5 (1 is RWP, 0 the base optimizer)",
                    convert=float,
                ),
            ),
            Knob(
                "eta",
                0.1,
                Rule(
                    "0 <= eta < inf",
                    lambda x: strict_number(x) and math.isfinite(x) and x >= 0,
                    "pass the adaptation's strength, e.g. eta=0.1 (eta=0 is m-RWP, no adaptation)",
                    convert=float,
                ),
            ),
            Knob(
                "beta",
                0.99,
                Rule(
                    "0 <= beta < 1",
                    lambda x: strict_number(x) and 0 <= x < 1,
                    "pass the decay of the running sum of squared gradients, e.g. beta=0.99",
                    convert=float,
                ),
            ),
            Knob("m", None, M_SHARPNESS),
        ),
        two_pass=True,
        needs=("model",),
        step_cost=0.341,  # optim.csv 41e904b
        small=SmallRun(
            {"sigma": 0.05, "lmbda": 0.5, "eta": 0.1, "beta": 0.9},
            base_exactly={"lmbda": 0.0},
            passes_per_step=2.0,
            forwards=6,
        ),
    ),
    method_spec(
        "gam",
        description="GAM (Zhang et al. 2023), first-order flatness, the authors' four-pass form: "
        "alpha g1 + (1-alpha) g3 less gamma times the part of g0 + (1-beta) g2 orthogonal to it.",
        builder="._gam:GAM",
        knobs=(
            Knob("rho", 0.2, RADIUS),
            Knob("rho_prime", 0.03, RADIUS),
            Knob(
                "alpha",
                0.1,
                Rule(
                    "0 <= alpha <= 1",
                    lambda x: strict_number(x) and 0 <= x <= 1,
                    "pass the weight of g1 (the gradient at the SAM point) in the update, e.g. alpha=0.1",
                    convert=float,
                ),
            ),
            Knob(
                "beta",
                0.1,
                Rule(
                    "0 <= beta <= 1",
                    lambda x: strict_number(x) and 0 <= x <= 1,
                    "pass beta with g0 + (1 - beta) g2 the direction whose orthogonal part is removed, e.g. beta=0.1",
                    convert=float,
                ),
            ),
            Knob(
                "gamma",
                0.05,
                Rule(
                    "0 <= gamma < inf",
                    lambda x: strict_number(x) and math.isfinite(x) and x >= 0,
                    "pass the weight of the orthogonal part removed, e.g. gamma=0.05 (0 removes none)",
                    convert=float,
                ),
            ),
            Knob("m", None, M_SHARPNESS),
        ),
        two_pass=True,
        needs=("model",),
        step_cost=0.231,  # optim.csv 41e904b
        small=SmallRun(
            {"rho": 0.2, "rho_prime": 0.05, "alpha": 0.3, "beta": 0.4, "gamma": 0.5},
            base_exactly={"rho_prime": 0.0, "alpha": 1.0, "gamma": 0.0},
            passes_per_step=4.0,
            forwards=12,
        ),
    ),
    method_spec(
        "lookbehind",
        description="Lookbehind-SAM (Mordido et al. 2024): k SAM ascent steps chained from the slow weights, each "
        "perturbed gradient a base step of the fast weights, then slow <- alpha fast + (1-alpha) slow; k+1 passes.",
        builder="._lookbehind:LookbehindSAM",
        knobs=(
            Knob("rho", 0.05, RADIUS),
            Knob(
                "k",
                5,
                Rule(
                    "k >= 1 (an integer)",
                    lambda x: integer(x) and x >= 1,
                    "pass the number of ascent steps per update, e.g. k=5 (k=1 with alpha=1 is SAM)",
                ),
            ),
            Knob(
                "alpha",
                0.5,
                Rule(
                    "0 < alpha <= 1",
                    lambda x: strict_number(x) and 0 < x <= 1,
                    "pass the slow weights' step toward the fast ones, e.g. alpha=0.5 (1 keeps the fast weights)",
                    convert=float,
                ),
            ),
        ),
        two_pass=True,
        needs=("model",),
        step_cost=0.161,  # optim.csv de4633a
        small=SmallRun(
            {"rho": 0.1, "k": 2, "alpha": 0.6},
            base_exactly={"rho": 0.0, "k": 1, "alpha": 1.0},
            passes_per_step=3.0,
            forwards=9,
            base_steps=2,
        ),
    ),
    method_spec(
        "bsam",
        description="bSAM (Moellenhoff & Khan 2023), an Adam-like optimizer of its own: g at a draw w + N(0, 1/(N s)), "
        "g_eps at w + rho g/s, m <- beta1 m + (1-beta1)(g_eps + delta w), s <- beta2 s + (1-beta2)(sqrt(s)|g| + delta "
        "+ damping), w <- w - lr m/s; the base optimizer lends only its groups and lr.",
        builder="._bsam:BSAM",
        knobs=(
            Knob("rho", 0.01, RADIUS),
            Knob("beta1", 0.9, _unit_decay("the momentum m", 0.9)),
            Knob("beta2", 0.999, _unit_decay("the precision s", 0.999)),
            Knob("delta", 5e-5, _non_negative("pass the L2 prior precision, e.g. delta=5e-5 (the authors' CIFAR-10)")),
            Knob("damping", 0.1, _non_negative("pass the precision's damping, e.g. damping=0.1 (the paper's)")),
            Knob("s_init", 1.0, _positive("pass the initial precision, e.g. s_init=1.0 (the authors' default)")),
            Knob(
                "data_factor",
                1.0,
                _positive("pass the multiple of the training set's size taken as N, e.g. data_factor=4 (the authors')"),
            ),
        ),
        relations=(Relation(("beta2", "delta", "damping"), _bsam_precision_positive),),
        two_pass=True,
        needs=("model", "num_samples"),
        own_update=OwnUpdate(
            requires={"weight_decay": 0.0},
            ignores=("base", "momentum", "betas"),
            fix="bSAM's own counterparts are hparams.delta (its L2 prior precision, on every weight), beta1 and beta2; "
            "optimizer.lr is its step size alpha",
        ),
        small=SmallRun(
            {"rho": 0.05, "beta1": 0.8, "beta2": 0.9, "delta": 1e-3, "damping": 0.1, "s_init": 2.0},
            passes_per_step=2.0,
            forwards=6,
        ),
        step_cost=0.473,  # optim.csv 41e904b
    ),
)

#: name -> entry, for the classes' own checks.
BY_NAME = {spec.name: spec for spec in SPECS}

_Built = TypeVar("_Built")


def registered(obj: _Built) -> _Built:
    """Decorate the class or factory that one entry's ``builder`` names: ``obj.spec`` becomes that entry, and a
    class's ``name`` its name, so that the module reads its method's name and knobs from the entry instead of
    retyping them. (SAM, which two entries build, picks its entry by ``adaptive`` itself.)"""
    where = (obj.__module__, obj.__qualname__)
    found = [
        spec
        for spec in SPECS
        if (importlib.util.resolve_name(spec.builder.partition(":")[0], __package__), spec.builder.partition(":")[2])
        == where
    ]
    if len(found) != 1:
        named = ", ".join(repr(s.name) for s in found) or "no entry"
        raise TypeError(
            f"@registered {where[0]}.{where[1]}: {named} in optim._specs.SPECS names it as builder, where exactly one "
            f"must; give it one entry whose builder is '.{where[0].rpartition('.')[2]}:{where[1]}'"
        )
    spec: MethodSpec = found[0]
    obj.spec = spec  # type: ignore[attr-defined]
    if isinstance(obj, type):
        obj.name = spec.name  # type: ignore[attr-defined]
    return obj
