"""Saturating laws fitted in log space with a Huber loss: E + B n^-beta, a smoothly broken power law, and M4."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

# ------------------------------------------------------------------------------ laws checked by extrapolation
#
# The method of Epoch AI's replication of Chinchilla (Besiroglu et al. 2024) and of Alabdulmohsin et al. 2022:
# fit in log space with a Huber loss from many starts, resample the independent units (seeds, whose curves share
# nested fractions) rather than points, and judge a law by how well it predicts the largest n it was not fitted on.

LawForm = Literal["saturating", "broken", "m4"]
LAW_FORMS: tuple[str, ...] = ("saturating", "broken", "m4")
_LAW_PARAMS = {
    "saturating": ("E", "B", "beta"),
    "broken": ("E", "B", "beta", "beta2", "n_break"),
    "m4": ("E", "B", "beta", "alpha"),
}


def default_form(eps0: float | None, distinct_n: int) -> str:
    """The form fitted where none is asked for: M4 where eps0 (the error of a model that learned nothing) is known
    and the points hold one more distinct n than its 4 parameters (a residual to check it by, and a comparison of
    two laws that does not pass through the means exactly); else the saturating form E + B n^-beta.

    Why M4: on the 72 published few-shot vision curves of Alabdulmohsin et al. 2022 (benchmarks/
    bench_scaling_curves.py, docs/benchmarks.md) it extrapolates with a median log RMSE of 0.027, the saturating
    form 0.071: an error that falls from near chance bends, and E + B n^-beta cannot. Why not always: with eps0
    unknown it cannot be fitted, and with 4 distinct n it passes through them (data_scaling.yaml's 4 held-in
    fractions: the report fits the saturating form there and says so)."""
    return "m4" if eps0 is not None and distinct_n >= len(_LAW_PARAMS["m4"]) + 1 else "saturating"


_LOG_FLOOR = 1e-6  # an observed error of 0 enters the log-space loss as this
_KEEP_STARTS = 4  # starts optimised, out of all those screened


def _huber(r: np.ndarray, delta: float) -> np.ndarray:
    a = np.abs(r)
    if not math.isfinite(delta):  # least squares
        return 0.5 * r * r
    return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def _m4_solve(lx: np.ndarray, E: float, logB: float, beta: float, alpha: float, eps0: float) -> np.ndarray:
    """The error eps of M4 at each log x: (eps - E) / (eps0 - eps)^alpha = B x^-beta, by bisection on (E, eps0)."""
    target = logB - beta * lx
    lo = np.full(lx.shape, E)
    hi = np.full(lx.shape, eps0)
    for _ in range(50):  # the left side grows monotonically in eps: bisection always converges
        mid = 0.5 * (lo + hi)
        with np.errstate(divide="ignore", invalid="ignore"):
            g = np.log(np.maximum(mid - E, 1e-300)) - alpha * np.log(np.maximum(eps0 - mid, 1e-300)) - target
        lo = np.where(g < 0, mid, lo)
        hi = np.where(g < 0, hi, mid)
    return 0.5 * (lo + hi)


def _law_log_pred(form: str, theta: np.ndarray, lx: np.ndarray, eps0: float) -> np.ndarray:
    """log L(x) for the internal parameters theta on the rescaled log n (lx = log(n / n0))."""
    if form == "saturating":
        # E is on its own scale here (not log E): it may go below 0, so that its estimate is not truncated at a
        # bound, the condition of an interval that covers (an estimate piled up on a bound has no spread to measure).
        e, b, beta = theta
        return np.log(np.maximum(e + np.exp(b - beta * lx), 1e-300))
    if form == "broken":
        e, b, beta, beta2, ld = theta
        return np.logaddexp(e, b - beta * lx - beta2 * np.logaddexp(0.0, lx - ld))
    e, b, beta, alpha = theta
    return np.log(np.maximum(_m4_solve(lx, math.exp(e), b, beta, alpha, eps0), 1e-300))


@dataclass(frozen=True)
class LawFit:
    """One functional form fitted in log space with a Huber loss: params in the units of n as given.

    saturating: L = E + B n^-beta. broken (a smoothly broken power law, one break): L = E + B n^-beta
    (1 + n/n_break)^-beta2, i.e. slope beta below the break and beta + beta2 above it. m4 (Alabdulmohsin et al.
    2022): (L - E) / (eps0 - L)^alpha = B n^-beta, with eps0 the error of a model that learned nothing
    (`chance_error`: 1 - 1/classes for an error rate; no default, M4 needs it given). huber_delta: the Huber loss's delta in log units (by
    default `HUBER_SDS` robust sds of the least-squares residuals at the noisiest n: `robust_delta`). at_bound: parameters that ended on
    an edge of their range, whose value is that edge rather than an estimate.
    """

    form: str
    params: dict[str, float]
    objective: float
    n0: float = field(repr=False)
    theta: np.ndarray = field(repr=False)
    eps0: float = 1.0
    huber_delta: float = math.nan
    at_bound: tuple[str, ...] = ()

    def predict(self, n) -> np.ndarray | float:
        lx = np.log(np.asarray(n, dtype="float64") / self.n0)
        values = np.exp(_law_log_pred(self.form, self.theta, np.atleast_1d(lx), self.eps0))
        return float(values[0]) if np.ndim(n) == 0 else values

    def unidentified(self, n) -> tuple[str, ...]:
        """The parameters the points at `n` (the fit's own) do not pin down: any at the edge of its range, and B
        and beta together where the power term is invisible to them (and E with them where beta ~ 0, since then only E + B
        is measured), i.e. beta at its upper bound, the term's
        whole drop across the measured n below a thousandth of the curve's level (a flat curve: B -> 0 and any
        beta fit), or the term falling a hundredfold between the two smallest n (it lives at one point, and any
        steeper beta fits it too). Their estimates are edges or ridge points, not estimates: no interval or test
        of them means anything (a flat true curve fitted beta = 10 with B ~ 1e-13 and gave "significant" beta
        differences of either sign)."""
        loose = list(self.at_bound)
        beta = self.params.get("beta", math.nan)
        x = np.unique(np.asarray(n, dtype="float64"))
        power = self.params.get("B", math.nan) * x**-beta
        level = float(np.atleast_1d(self.predict(x[-1:]))[0])
        flat = len(x) >= 2 and (power[0] - power[-1]) < 1e-3 * level
        steep = len(x) >= 2 and power[1] < 1e-2 * power[0]
        if "beta" in self.at_bound or flat or steep:
            loose += [p for p in ("B", "beta") if p not in loose]
        if flat and beta < 1e-2:  # L = E + B n^-0 = E + B: only their sum is measured
            loose += [] if "E" in loose else ["E"]
        return tuple(p for p in self.params if p in loose)


def _law_params(form: str, theta: np.ndarray, n0: float) -> dict[str, float]:
    if form == "saturating":
        e, b, beta = theta
        return {"E": float(e), "B": math.exp(b) * n0**beta, "beta": float(beta)}
    if form == "broken":
        e, b, beta, beta2, ld = theta
        return {
            "E": math.exp(e),
            "B": math.exp(b) * n0**beta,
            "beta": float(beta),
            "beta2": float(beta2),
            "n_break": math.exp(ld) * n0,
        }
    e, b, beta, alpha = theta
    return {"E": math.exp(e), "B": math.exp(b) * n0**beta, "beta": float(beta), "alpha": float(alpha)}


def _law_starts(form: str, lx: np.ndarray, ly: np.ndarray, eps0: float) -> tuple[list[np.ndarray], list[tuple]]:
    low = float(np.exp(ly.min()))
    top = float(np.exp(ly.max()))
    es = [math.log(low * f) for f in (1e-3, 0.5, 0.9)]
    betas = (0.3, 1.0)
    span = (float(lx.min()) - 2.0, float(lx.max()) + 2.0)
    starts = []
    for e in es:
        for beta in betas:
            # B from the mean residual above the floor: the curve passes near the data at the start.
            gap = np.maximum(np.exp(ly) - math.exp(e), low * 1e-3)
            b = float(np.mean(np.log(gap) + beta * lx))
            if form == "saturating":
                starts.append(np.array([math.exp(e), b, beta]))
            elif form == "broken":
                for ld in np.quantile(lx, [0.25, 0.5, 0.75]):
                    starts.extend(np.array([e, b, beta, beta2, float(ld)]) for beta2 in (0.5, 2.0))
            elif math.exp(e) < eps0:
                # M4's alpha trades off against E and beta: start from several, or a local minimum wins.
                starts.extend(np.array([e, b, beta, alpha]) for alpha in (0.25, 1.0, 2.0))
    # The floor E lies between a ten-thousandth of the smallest error (a floor indistinguishable from 0) and the
    # largest error (never a fixed 1: a loss floor above 1 must not be clipped there), below eps0 for M4.
    e_range = (math.log(1e-4 * low), math.log(top))
    bounds = {
        "saturating": [(-top, top), (-50, 50), (0.0, 10.0)],
        "broken": [e_range, (-50, 50), (0.0, 10.0), (0.0, 10.0), span],
        "m4": [(e_range[0], min(e_range[1], math.log(eps0) - 1e-6)), (-50, 50), (0.0, 10.0), (0.0, 5.0)],
    }[form]
    return starts, bounds


def _saturating_jac(theta: np.ndarray, lx: np.ndarray) -> np.ndarray:
    """d log L / d (e, b, beta) of the saturating form: the shares of the floor and of the power term in L."""
    e, b, beta = theta
    power = np.exp(b - beta * lx)
    level = np.maximum(e + power, 1e-300)
    pb = power / level
    return np.column_stack([1.0 / level, pb, -lx * pb])


def _lm_saturating(
    theta: np.ndarray, lx: np.ndarray, ly: np.ndarray, delta: float, lower: np.ndarray, upper: np.ndarray
) -> np.ndarray:
    """Levenberg-Marquardt on the Huber loss (iteratively reweighted) of the saturating form, steps clipped to the
    bounds: the same optimum scipy's least_squares finds, at a fraction of its per-call cost (the intervals refit
    once per seed, and the simulation harness fits thousands of times)."""

    def evaluate(th):
        level = th[0] + np.exp(th[1] - th[2] * lx)
        if np.any(level <= 0):  # below zero error somewhere: not a curve of errors
            return ly, math.inf
        r = np.log(level) - ly
        return r, float(_huber(r, delta).sum())

    r, value = evaluate(theta)
    lam = 1e-3
    for _ in range(100):
        jac = _saturating_jac(theta, lx)
        a = np.abs(r)
        w = np.where(a <= delta, 1.0, delta / np.maximum(a, 1e-300))
        grad = jac.T @ (w * r)
        hess = jac.T @ (jac * w[:, None])
        # A parameter on a bound that the gradient pushes outwards stays there (active set): clipping its step
        # instead would stall the damping.
        edge = 1e-9 * (upper - lower)
        free = ~(((theta <= lower + edge) & (grad > 0)) | ((theta >= upper - edge) & (grad < 0)))
        if not free.any():
            break
        hf, gf = hess[np.ix_(free, free)], grad[free]
        damp = np.diag(np.diag(hf)) + 1e-12 * np.eye(int(free.sum()))
        moved = False
        while lam < 1e12:
            step = np.zeros_like(theta)
            step[free] = np.linalg.solve(hf + lam * damp, gf)
            cand = np.clip(theta - step, lower, upper)
            rc, vc = evaluate(cand)
            if vc < value:
                done = value - vc <= 1e-10 * (1.0 + value)
                theta, r, value, lam, moved = cand, rc, vc, max(lam / 5.0, 1e-12), True
                break
            lam *= 4.0
        if not moved or done:
            break
    return theta


# Huber's delta in robust sds of the noisiest n's seed scatter. 3, not the textbook 1.345: with 3-5 seeds an
# interval is exact only for a fit that is a smooth function of the seeds' means (least squares, under normal
# noise); at 1.345 a sixth of normal points are downweighted, the fit turns part least-absolute-deviations, and
# the seed jackknife underestimates its spread (the held-in E and held-out prediction covered 87-92% with 5 seeds,
# benchmarks/sim_coverage.py). At 3 sds a normal seed is beyond it 0.3% of the time; a diverged one still is.
HUBER_SDS = 3.0


def robust_delta(residuals: np.ndarray, groups: np.ndarray | None = None) -> float:
    """Huber's delta: HUBER_SDS robust sds (s = 1.4826 MAD) of the residuals, the largest of the groups' own.

    groups (each point's n): s is the largest of the groups' own scales (groups of 3+ points; the pooled scale
    where none has 3), so that the delta is set by the noisiest n. Seeds' log residuals are not equally spread
    across n (noise of a fixed size in accuracy is larger, in log units, where the error is small): one pooled
    scale put 35-39% of the largest held-in n's points beyond a 1.345-sd delta. A point far beyond its own n's
    noise is still downweighted. The floor (1e-6 in log units) keeps a noise-free fit from dividing by zero."""

    def scale(x: np.ndarray) -> float:
        return 1.4826 * float(np.median(np.abs(x - np.median(x)))) if len(x) else 0.0

    r = np.asarray(residuals, dtype="float64")
    s = scale(r)
    if groups is not None:
        groups = np.asarray(groups).ravel()
        own = [scale(r[groups == g]) for g in np.unique(groups) if int((groups == g).sum()) >= 3]
        if own:
            s = max(own)
    return max(HUBER_SDS * s, 1e-6)


def _check_errors(err: np.ndarray, who: str) -> None:
    """err must be finite and >= 0, with hints that name the likely cause."""
    if not np.all(np.isfinite(err)):
        raise ValueError(f"{who}: err must be finite, got {err.tolist()}; drop failed cells (NaN metrics) first")
    if np.any(err < 0):
        hint = (
            "an error below -1 comes from 1 - accuracy with accuracies on a 0-100 scale: divide the metric by 100"
            if err.min() < -1.0
            else "an error rate or a loss cannot be negative: pass 1 - accuracy, or the loss itself"
        )
        raise ValueError(f"{who}: err must be >= 0, got min {err.min():.4g}; {hint}")
    if np.all(err == 0):
        raise ValueError(
            f"{who}: every error is 0 (e.g. every seed at accuracy 1.0): there is no curve to fit, and a law "
            "fitted to it would claim a floor of 0 at every n; use a harder task or a metric that is not saturated"
        )


def _check_law_inputs(n, err, form: str, huber_delta, eps0) -> tuple[np.ndarray, np.ndarray]:
    """fit_law's points as arrays, refused with the fix where the form cannot be fitted to them."""
    if form not in LAW_FORMS:
        raise ValueError(f"form must be one of {', '.join(map(repr, LAW_FORMS))}, got {form!r}")
    n = np.asarray(n, dtype="float64").ravel()
    err = np.asarray(err, dtype="float64").ravel()
    if n.shape != err.shape or len(n) == 0:
        raise ValueError(f"n and err must be non-empty and of the same length, got {len(n)} and {len(err)}")
    if not (np.all(np.isfinite(n)) and np.all(n > 0)):
        raise ValueError(f"n must be finite and > 0 (training-set sizes or fractions), got {n.tolist()}")
    _check_errors(err, "fit_law")
    k = len(_LAW_PARAMS[form])
    distinct = len(np.unique(n))
    if distinct < k:
        raise ValueError(
            f"fit_law: the {form} form has {k} parameters and needs {k}+ distinct n, got {distinct} "
            f"({np.unique(n).tolist()}); through fewer points a whole family of curves fits exactly: measure more n"
        )
    if form == "m4" and eps0 is None:
        raise ValueError(
            "m4 needs eps0, the error of a model that learned nothing (1 - 1/classes for an error rate, 0.9 on "
            "CIFAR-10; log(classes) for a cross-entropy loss): analysis.chance_error gives it for a dataset and metric"
        )
    if form == "m4" and not np.all(err < eps0):
        raise ValueError(
            f"m4 needs every error below eps0={eps0} (the error of a model that learned nothing), got max "
            f"{err.max():.4g}; pass eps0 (analysis.chance_error gives it for a dataset and metric)"
        )
    if huber_delta is not None and not (math.isfinite(huber_delta) and huber_delta > 0):
        raise ValueError(f"huber_delta must be None (scaled to the residuals) or a number > 0, got {huber_delta!r}")
    return n, err


def fit_law(
    n,
    err,
    *,
    form: LawForm | None = None,
    huber_delta: float | None = None,
    eps0: float | None = None,
    start: np.ndarray | None = None,
) -> LawFit:
    """Fit one form to points (n, err) by minimising sum Huber_delta(log L(n) - log err) from many starts.

    Several points may share an n (seeds); the form needs as many distinct n as it has parameters. n is
    rescaled by its geometric mean inside the fit; the params come back in the units of n as given.
    huber_delta: None scales it to the data (`robust_delta` of the least-squares fit's log residuals); a
    number fixes it (the refits of an interval reuse the full fit's). start: internal parameters tried first,
    beside the default starts (a refit is multi-start too: a resample can move the optimum to another basin).
    form None: `default_form` of eps0 and the points' distinct n.
    """
    if form is None:
        form = default_form(eps0, len(np.unique(np.asarray(n, dtype="float64"))))
    n, err = _check_law_inputs(n, err, form, huber_delta, eps0)
    eps0 = 1.0 if eps0 is None else float(eps0)  # unused by the saturating and broken forms
    n0 = float(np.exp(np.log(n).mean()))
    lx = np.log(n / n0)
    ly = np.log(np.maximum(err, _LOG_FLOOR))

    def residuals(theta):
        return _law_log_pred(form, theta, lx, eps0) - ly

    jac = (lambda theta: _saturating_jac(theta, lx)) if form == "saturating" else "2-point"
    starts, bounds = _law_starts(form, lx, ly, eps0)
    lower = np.array([b[0] for b in bounds])
    upper = np.array([b[1] for b in bounds])
    inner = 1e-9 * (upper - lower)

    def clip(theta):  # strictly inside the bounds, as the trust-region solver requires
        return np.clip(theta, lower + inner, upper - inner)

    starts = [clip(s0) for s0 in starts]
    # Many starts cost one evaluation each; only the most promising are optimised (and a given start always).
    screened = [float((residuals(s0) ** 2).sum()) for s0 in starts]
    keep = [starts[i] for i in np.argsort(screened)[: _KEEP_STARTS if start is None else 1]]
    if start is not None:
        keep.insert(0, clip(np.asarray(start, dtype="float64")))

    def solve(s0, loss, delta):
        if form == "saturating":
            theta = _lm_saturating(s0, lx, ly, delta, lower, upper)
            return theta, float(_huber(residuals(theta), delta).sum())
        from scipy.optimize import least_squares

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = least_squares(
                residuals, s0, jac=jac, bounds=(lower, upper), loss=loss, f_scale=delta, method="trf", x_scale="jac"
            )
        return res.x, float(_huber(residuals(res.x), delta).sum())

    if huber_delta is None:
        # Least squares first: its residuals measure the noise, and the Huber delta is scaled to them.
        fits = [solve(s0, "linear", math.inf) for s0 in keep]
        theta_ls = min(fits, key=lambda f: float((residuals(f[0]) ** 2).sum()))[0]
        delta = robust_delta(residuals(theta_ls), groups=n)
        keep = [clip(theta_ls)]
    else:
        delta = float(huber_delta)
    theta, value = min((solve(s0, "huber", delta) for s0 in keep), key=lambda f: f[1])
    theta = np.asarray(theta, dtype="float64")
    edge = 1e-6 * (upper - lower)
    names = _LAW_PARAMS[form]
    at_bound = tuple(
        names[i]
        for i in range(len(theta))
        if (theta[i] - lower[i] < edge[i] and names[i] != "beta") or upper[i] - theta[i] < edge[i]
    )
    return LawFit(
        form=form,
        params=_law_params(form, theta, n0),
        objective=value,
        n0=n0,
        theta=theta,
        eps0=eps0,
        huber_delta=delta,
        at_bound=at_bound,
    )


def chance_error(dataset: str | None, metric: str, *, mode: str = "max") -> float | None:
    """The error of a model that learned nothing (M4's eps0) for a dataset of the registry and a metric.

    1 - 1/classes for an accuracy (an error rate: 0.9 on CIFAR-10), log(classes) for a cross-entropy loss;
    None where the registry does not know the classes (imagefolder, synthetic) or the metric is neither.
    """
    from trainables.data.registry import DATASETS

    spec = DATASETS.get(str(dataset)) if dataset is not None else None
    classes = getattr(spec, "num_classes", None)
    if not classes:
        return None
    if "acc" in metric and mode == "max":
        return 1.0 - 1.0 / classes
    if "loss" in metric and mode == "min":
        return math.log(classes)
    return None
