"""Data-scaling laws: err(n) = a n^-b + c with bootstrap intervals, laws checked by extrapolation (Huber fits in log space,
seed bootstrap, held-out largest n, three functional forms, paired differences), and the data multiplier between methods."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Literal, Mapping

import numpy as np

__all__ = [
    "LAW_FORMS",
    "DataMultiplier",
    "FloorNotIdentifiedWarning",
    "LawFit",
    "PowerLawFit",
    "data_multiplier",
    "fit_law",
    "fit_power_law",
    "fit_scaling_table",
    "fits_frame",
    "law_extrapolation",
    "paired_law_difference",
]


class FloorNotIdentifiedWarning(UserWarning):
    """The points do not pin down the floor c of err(n) = a n^-b + c: any c in a wide range fits about as well."""


# A floor whose interval is wider than this share of its plausible range [0, min(err)] is not identified.
_FLOOR_SPAN = 0.5
_B_MAX = 20.0


@dataclass(frozen=True)
class PowerLawFit:
    """err(n) = a * n^(-b) + c fitted by least squares on the points (n, err), with bootstrap intervals.

    intervals: (low, high) percentile intervals of a, b, c from a residual bootstrap (fixed design: the n
    are chosen by the experimenter, so the residuals are resampled, never the points). samples: the
    bootstrap draws, one row (a, b, c) each. floor_identified: False when the points cannot pin c (fewer
    than 4 distinct n, or c's interval wider than half of its plausible range [0, min(err)]); note says why.
    """

    a: float
    b: float
    c: float
    intervals: dict[str, tuple[float, float]]
    confidence: float
    n: np.ndarray = field(repr=False)
    err: np.ndarray = field(repr=False)
    n_distinct: int
    rmse: float
    floor_identified: bool
    note: str
    samples: np.ndarray = field(repr=False)
    bootstrap: str = "residuals"

    def predict(self, n) -> np.ndarray | float:
        """err at n (a number or an array)."""
        values = self.a * np.power(np.asarray(n, dtype="float64"), -self.b) + self.c
        return float(values) if np.ndim(values) == 0 else values

    __call__ = predict

    def to_dict(self) -> dict[str, float | int | bool | str]:
        """One flat row for a table: estimates, intervals, fit quality and the floor flag."""
        row: dict[str, float | int | bool | str] = {}
        for name in ("a", "b", "c"):
            lo, hi = self.intervals[name]
            row.update({name: getattr(self, name), f"{name}_low": lo, f"{name}_high": hi})
        row.update(
            points=int(len(self.n)),
            distinct_n=self.n_distinct,
            rmse=self.rmse,
            floor_identified=self.floor_identified,
            note=self.note,
        )
        return row


def _as_points(n, err) -> tuple[np.ndarray, np.ndarray]:
    n = np.asarray(n, dtype="float64").ravel()
    err = np.asarray(err, dtype="float64").ravel()
    if n.shape != err.shape:
        raise ValueError(f"n and err must have the same length, got {len(n)} and {len(err)}; pass one error per n")
    if len(n) < 3:
        raise ValueError(
            f"fit_power_law needs at least 3 points for its 3 parameters a, b, c, got {len(n)}; add training-set sizes"
        )
    if not (np.all(np.isfinite(n)) and np.all(n > 0)):
        raise ValueError(f"n must be finite and > 0 (training-set sizes or fractions), got {n.tolist()}")
    if not np.all(np.isfinite(err)) or np.any(err < 0):
        raise ValueError(
            f"err must be finite and >= 0 (an error rate or a loss), got {err.tolist()}; drop failed cells first"
        )
    if len(np.unique(n)) < 2:
        raise ValueError(f"n must hold at least 2 distinct values to fit a slope, got only {np.unique(n).tolist()}")
    return n, err


def _grid_fit(x: np.ndarray, err: np.ndarray) -> tuple[float, float, float]:
    """Profile over the floor c: for each c on a grid in [0, min(err)), log(err - c) = log a - b log x by least squares.

    Dense near min(err), where a curve that has flattened puts its floor. Returns the (a, b, c) whose
    squared error in err-space (not log-space) is the smallest; a robust start for the nonlinear fit.
    """
    top = float(err.min())
    if top <= 0:
        ts = np.zeros(1)
    else:
        ts = np.unique(np.concatenate([np.linspace(0.0, 0.99, 100), 1.0 - np.logspace(-2, -6, 25)]))
    cs = ts * top
    gap = err[None, :] - cs[:, None]
    valid = np.all(gap > 0, axis=1)
    cs, gap = cs[valid], gap[valid]
    if len(cs) == 0:  # every err is 0: a flat zero curve
        return 0.0, 0.0, 0.0
    lx = np.log(x)
    ly = np.log(gap)
    xm = lx.mean()
    sxx = ((lx - xm) ** 2).sum()
    slope = ((lx - xm)[None, :] * (ly - ly.mean(axis=1, keepdims=True))).sum(axis=1) / sxx
    intercept = ly.mean(axis=1) - slope * xm
    b = np.clip(-slope, 0.0, _B_MAX)
    a = np.exp(intercept)
    pred = a[:, None] * np.power(x[None, :], -b[:, None]) + cs[:, None]
    sse = ((pred - err[None, :]) ** 2).sum(axis=1)
    i = int(np.argmin(sse))
    return float(a[i]), float(b[i]), float(cs[i])


def _model(x, a, b, c):
    return a * np.power(x, -b) + c


def _polish(
    x: np.ndarray, err: np.ndarray, start: tuple[float, float, float]
) -> tuple[tuple[float, float, float], bool]:
    """Nonlinear least squares from `start` (bounded: a >= 0, 0 <= b <= 20, 0 <= c <= max(err)).

    Returns (params, converged); keeps `start` when it fits better or the solver fails.
    """
    from scipy.optimize import curve_fit  # scipy comes with scikit-learn, a dependency of the project

    def sse(p):
        return float(((_model(x, *p) - err) ** 2).sum())

    hi_c = max(float(err.max()), 1e-12)
    a0, b0, c0 = start
    p0 = (max(a0, 1e-12), min(max(b0, 1e-9), _B_MAX), min(max(c0, 0.0), hi_c))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            popt, _ = curve_fit(_model, x, err, p0=p0, bounds=([0.0, 0.0, 0.0], [np.inf, _B_MAX, hi_c]), maxfev=2000)
    except (RuntimeError, ValueError):
        return start, False
    popt = tuple(float(v) for v in popt)
    return (popt if sse(popt) <= sse(start) else start), True


def _fit(x: np.ndarray, err: np.ndarray) -> tuple[float, float, float]:
    return _polish(x, err, _grid_fit(x, err))[0]


def fit_power_law(
    n,
    err,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    warn: bool = True,
) -> PowerLawFit:
    """Fit err(n) = a * n^(-b) + c (a >= 0, b >= 0, c >= 0) to points; several points may share an n (seeds).

    The fit: a profile over c (log-linear least squares for a, b at each c on a grid in [0, min err)), then
    bounded nonlinear least squares (scipy's curve_fit) from the best grid point. n is rescaled by its
    geometric mean inside the fit for conditioning; a is reported for n as given. Intervals: residual
    bootstrap with `n_boot` draws (numpy Generator seeded with `seed`), the residuals inflated by
    sqrt(N / (N - 3)) for the 3 fitted parameters and centred; with only 3 points there is nothing to
    resample and the intervals are NaN. When the floor c is not identified (see PowerLawFit) a
    FloorNotIdentifiedWarning is raised (if warn) and floor_identified is False: read b and c as a pair then.
    """
    if not (isinstance(n_boot, (int, np.integer)) and n_boot >= 0):
        raise ValueError(f"n_boot must be an int >= 0 (0 skips the bootstrap), got {n_boot!r}")
    if not (isinstance(confidence, (int, float)) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}; e.g. 0.95")
    n, err = _as_points(n, err)
    n0 = float(np.exp(np.log(n).mean()))
    x = n / n0
    a_s, b, c = _fit(x, err)
    fitted = _model(x, a_s, b, c)
    resid = err - fitted
    N = len(n)
    distinct = int(len(np.unique(n)))
    rmse = float(np.sqrt(np.mean(resid**2)))
    tail = (1.0 - confidence) / 2.0
    nan_pair = (math.nan, math.nan)
    samples = np.empty((0, 3))
    intervals = {"a": nan_pair, "b": nan_pair, "c": nan_pair}
    if n_boot > 0 and N > 3:
        scaled = (resid - resid.mean()) * math.sqrt(N / (N - 3))
        rng = np.random.default_rng(seed)
        rows = []
        for _ in range(n_boot):
            star = np.clip(fitted + rng.choice(scaled, size=N, replace=True), 0.0, None)
            # Start from the point estimate: a resample is a small perturbation of it; the grid is the fallback.
            p, converged = _polish(x, star, (a_s, b, c))
            if not converged:
                p = _fit(x, star)
            rows.append((p[0] * n0 ** p[1], p[1], p[2]))
        samples = np.asarray(rows)
        lo = np.quantile(samples, tail, axis=0)
        hi = np.quantile(samples, 1.0 - tail, axis=0)
        intervals = {name: (float(lo[i]), float(hi[i])) for i, name in enumerate("abc")}
    a = a_s * n0**b
    notes = []
    if distinct < 4:
        notes.append(
            f"only {distinct} distinct n: a, b and c can pass through {distinct} mean errors exactly for a whole "
            "range of floors c; measure at least 4 (better 5+) training-set sizes"
        )
    plausible = float(err.min())
    c_lo, c_hi = intervals["c"]
    if distinct >= 4 and math.isfinite(c_lo) and plausible > 0 and (c_hi - c_lo) > _FLOOR_SPAN * plausible:
        notes.append(
            f"the fit is insensitive to the floor: c's {confidence:.0%} interval [{c_lo:.4g}, {c_hi:.4g}] spans more than "
            f"{_FLOOR_SPAN:.0%} of its plausible range [0, {plausible:.4g}] (the smallest error); the curve has not "
            "flattened within the measured n: add larger n or report b with c fixed"
        )
    note = "; ".join(notes)
    if note and warn:
        warnings.warn(f"fit_power_law: floor c not identified: {note}.", FloorNotIdentifiedWarning, stacklevel=2)
    return PowerLawFit(
        a=float(a),
        b=float(b),
        c=float(c),
        intervals=intervals,
        confidence=float(confidence),
        n=n,
        err=err,
        n_distinct=distinct,
        rmse=rmse,
        floor_identified=not note,
        note=note,
        samples=samples,
    )


@dataclass(frozen=True)
class DataMultiplier:
    """How many times more data the vanilla method needs to reach the SAM error at n, under the two fits.

    multiplier = n_needed / n: inf when vanilla's floor is at or above that error (never reached), NaN when
    a fit is degenerate; below 1 when vanilla is already better at n. interval: percentile interval over
    paired bootstrap draws of the two fits (NaN when either fit has none). explanation says how to read it.
    """

    n: float
    sam_error: float
    vanilla_error: float
    n_needed: float
    multiplier: float
    interval: tuple[float, float]
    reachable: bool
    extrapolated: bool
    explanation: str


def _needed(a: float, b: float, c: float, target: float) -> float:
    if not all(map(math.isfinite, (a, b, c, target))) or a <= 0 or b <= 0:
        return math.nan
    if target <= c:
        return math.inf
    return (a / (target - c)) ** (1.0 / b)


def data_multiplier(
    fit_vanilla: PowerLawFit, fit_sam: PowerLawFit, n: float, *, confidence: float = 0.95
) -> DataMultiplier:
    """Solve a_v n'^(-b_v) + c_v = err_sam(n) for n' and return n' / n with an explanation.

    Unreachable (vanilla's floor c_v >= err_sam(n)): multiplier inf. Degenerate vanilla fit (a_v = 0 or
    b_v = 0: flat): NaN. extrapolated: n' lies outside the n the vanilla fit was made on (its c drives
    the answer then, so read it with fit_vanilla.floor_identified).
    """
    if not (isinstance(n, (int, float, np.integer, np.floating)) and math.isfinite(float(n)) and n > 0):
        raise ValueError(f"n must be a finite number > 0 (a training-set size or fraction), got {n!r}")
    n = float(n)
    target = float(fit_sam.predict(n))
    vanilla_err = float(fit_vanilla.predict(n))
    needed = _needed(fit_vanilla.a, fit_vanilla.b, fit_vanilla.c, target)
    multiplier = needed / n
    reachable = math.isfinite(needed)
    lo_n, hi_n = float(fit_vanilla.n.min()), float(fit_vanilla.n.max())
    extrapolated = reachable and not (lo_n <= needed <= hi_n)
    interval = (math.nan, math.nan)
    k = min(len(fit_vanilla.samples), len(fit_sam.samples))
    if k > 0:
        draws = np.array(
            [_needed(*fit_vanilla.samples[i], float(_model(n, *fit_sam.samples[i]))) / n for i in range(k)]
        )
        draws = draws[~np.isnan(draws)]
        if len(draws):
            tail = (1.0 - confidence) / 2.0
            # inverted_cdf never interpolates, so an infinite draw cannot turn a bound into NaN.
            interval = (
                float(np.quantile(draws, tail, method="inverted_cdf")),
                float(np.quantile(draws, 1.0 - tail, method="inverted_cdf")),
            )
    if math.isnan(multiplier):
        text = (
            f"undefined: the vanilla fit is flat (a={fit_vanilla.a:.3g}, b={fit_vanilla.b:.3g}), so no n' "
            "changes its error; check the points it was fitted on"
        )
    elif not reachable:
        text = (
            f"unreachable: vanilla's fitted floor c={fit_vanilla.c:.4g} is at or above SAM's error "
            f"{target:.4g} at n={n:g}; under these fits no amount of data lets vanilla match SAM"
        )
    else:
        text = (
            f"vanilla needs n'={needed:.4g} ({multiplier:.3g}x n={n:g}) to reach SAM's error {target:.4g} "
            f"(vanilla's own error at n: {vanilla_err:.4g})"
        )
        if multiplier < 1:
            text += "; below 1: vanilla is already better at n"
        if extrapolated:
            text += f"; n' lies outside the measured range [{lo_n:g}, {hi_n:g}], so it is an extrapolation of the fit"
    weak = [name for name, f in (("vanilla", fit_vanilla), ("SAM", fit_sam)) if not f.floor_identified]
    if weak:
        text += f"; the floor of the {' and '.join(weak)} fit is not identified, and the answer depends on it"
    return DataMultiplier(
        n=n,
        sam_error=target,
        vanilla_error=vanilla_err,
        n_needed=needed,
        multiplier=multiplier,
        interval=interval,
        reachable=reachable,
        extrapolated=extrapolated,
        explanation=text,
    )


def fit_scaling_table(
    table,
    *,
    as_error: Literal["auto", "one_minus", "identity"] = "auto",
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    warn: bool = True,
) -> dict[tuple[str, str], PowerLawFit]:
    """A power law per (arch, method) of a ScalingTable, fitted on each seed's best-of-search value at each fraction.

    as_error: how the metric becomes an error: 'one_minus' (1 - accuracy), 'identity' (already an error or
    a loss) or 'auto' (one_minus when the table maximised its metric). Series with fewer than 3 points or
    fewer than 2 distinct fractions are left out with a warning.
    """
    if as_error not in ("auto", "one_minus", "identity"):
        raise ValueError(f"as_error must be 'auto', 'one_minus' or 'identity', got {as_error!r}")
    if as_error == "auto":
        as_error = "one_minus" if table.mode == "max" else "identity"
    cols = table.columns
    best = table.best.dropna(subset=[table.metric])
    fits: dict[tuple[str, str], PowerLawFit] = {}
    skipped = []
    for (arch, method), part in best.groupby([cols["arch"], cols["method"]], sort=True):
        n = part[cols["fraction"]].astype("float64").to_numpy()
        values = part[table.metric].astype("float64").to_numpy()
        err = 1.0 - values if as_error == "one_minus" else values
        if len(n) < 3 or len(np.unique(n)) < 2:
            skipped.append(f"{arch}/{method} ({len(n)} points)")
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FloorNotIdentifiedWarning)
            fits[(str(arch), str(method))] = fit_power_law(
                n, err, n_boot=n_boot, seed=seed, confidence=confidence, warn=warn
            )
        for w in caught:
            if warn:
                warnings.warn(f"{arch}/{method}: {w.message}", w.category, stacklevel=2)
    if skipped and warn:
        warnings.warn(
            f"fit_scaling_table: too few points to fit {', '.join(skipped)}", FloorNotIdentifiedWarning, stacklevel=2
        )
    return fits


def fits_frame(fits: Mapping[tuple[str, str], PowerLawFit]):
    """The fits as a table: one row per (arch, method) with estimates, intervals and the floor flag."""
    import pandas as pd

    rows = [{"arch": a, "method": m, **fit.to_dict()} for (a, m), fit in fits.items()]
    return pd.DataFrame(rows).set_index(["arch", "method"]) if rows else pd.DataFrame()


# ------------------------------------------------------------------------------ laws checked by extrapolation
#
# The method of Epoch AI's replication of Chinchilla (Besiroglu et al. 2024) and of Alabdulmohsin et al. 2022:
# fit in log space with a Huber loss from many starts, bootstrap over the independent units (seeds, whose curves
# share nested fractions) rather than over points, and judge a law by how well it predicts the largest n it was
# not fitted on.

LawForm = Literal["saturating", "broken", "m4"]
LAW_FORMS: tuple[str, ...] = ("saturating", "broken", "m4")
_LAW_PARAMS = {
    "saturating": ("E", "B", "beta"),
    "broken": ("E", "B", "beta", "beta2", "n_break"),
    "m4": ("E", "B", "beta", "alpha"),
}
_LOG_FLOOR = 1e-6  # an observed error of 0 enters the log-space loss as this
_KEEP_STARTS = 4  # starts optimised, out of all those screened


def _huber(r: np.ndarray, delta: float) -> np.ndarray:
    a = np.abs(r)
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
        e, b, beta = theta
        return np.logaddexp(e, b - beta * lx)
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
    2022): (L - E) / (eps0 - L)^alpha = B n^-beta, with eps0 the error of a model that learned nothing (1.0 for
    error rates unless given).
    """

    form: str
    params: dict[str, float]
    objective: float
    n0: float = field(repr=False)
    theta: np.ndarray = field(repr=False)
    eps0: float = 1.0

    def predict(self, n) -> np.ndarray | float:
        lx = np.log(np.asarray(n, dtype="float64") / self.n0)
        values = np.exp(_law_log_pred(self.form, self.theta, np.atleast_1d(lx), self.eps0))
        return float(values[0]) if np.ndim(n) == 0 else values


def _law_params(form: str, theta: np.ndarray, n0: float) -> dict[str, float]:
    if form == "saturating":
        e, b, beta = theta
        return {"E": math.exp(e), "B": math.exp(b) * n0**beta, "beta": float(beta)}
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
    es = [math.log(max(low * f, 1e-8)) for f in (1e-4, 0.5, 0.9)]
    betas = (0.3, 1.0)
    span = (float(lx.min()) - 2.0, float(lx.max()) + 2.0)
    starts = []
    for e in es:
        for beta in betas:
            # B from the mean residual above the floor: the curve passes near the data at the start.
            gap = np.maximum(np.exp(ly) - math.exp(e), low * 1e-3)
            b = float(np.mean(np.log(gap) + beta * lx))
            if form == "saturating":
                starts.append(np.array([e, b, beta]))
            elif form == "broken":
                for ld in np.quantile(lx, [0.25, 0.5, 0.75]):
                    starts.extend(np.array([e, b, beta, beta2, float(ld)]) for beta2 in (0.5, 2.0))
            elif math.exp(e) < eps0:
                # M4's alpha trades off against E and beta: start from several, or a local minimum wins.
                starts.extend(np.array([e, b, beta, alpha]) for alpha in (0.25, 1.0, 2.0))
    bounds = {
        "saturating": [(math.log(1e-8), math.log(max(eps0, 1.0))), (-50, 50), (0.0, 10.0)],
        "broken": [(math.log(1e-8), math.log(max(eps0, 1.0))), (-50, 50), (0.0, 10.0), (0.0, 10.0), span],
        "m4": [(math.log(1e-8), math.log(eps0) - 1e-6), (-50, 50), (0.0, 10.0), (0.0, 5.0)],
    }[form]
    return starts, bounds


def fit_law(
    n,
    err,
    *,
    form: LawForm = "saturating",
    huber_delta: float = 1e-3,
    eps0: float = 1.0,
    start: np.ndarray | None = None,
) -> LawFit:
    """Fit one form to points (n, err) by minimising sum Huber_delta(log L(n) - log err) from many starts.

    Several points may share an n (seeds). n is rescaled by its geometric mean inside the fit; the params come
    back in the units of n as given. start: internal parameters to start from alone (the bootstrap's refits).
    """
    from scipy.optimize import least_squares

    if form not in LAW_FORMS:
        raise ValueError(f"form must be one of {', '.join(map(repr, LAW_FORMS))}, got {form!r}")
    n = np.asarray(n, dtype="float64").ravel()
    err = np.asarray(err, dtype="float64").ravel()
    if n.shape != err.shape or len(n) == 0:
        raise ValueError(f"n and err must be non-empty and of the same length, got {len(n)} and {len(err)}")
    if not (np.all(np.isfinite(n)) and np.all(n > 0) and np.all(np.isfinite(err)) and np.all(err >= 0)):
        raise ValueError("n must be finite and > 0 and err finite and >= 0; drop failed cells first")
    if form == "m4" and not np.all(err < eps0):
        raise ValueError(
            f"m4 needs every error below eps0={eps0} (the error of a model that learned nothing); pass eps0"
        )
    n0 = float(np.exp(np.log(n).mean()))
    lx = np.log(n / n0)
    ly = np.log(np.maximum(err, _LOG_FLOOR))

    def residuals(theta):
        return _law_log_pred(form, theta, lx, eps0) - ly

    starts, bounds = _law_starts(form, lx, ly, eps0)
    if start is not None:
        starts = [np.asarray(start, dtype="float64")]
    lower = np.array([b[0] for b in bounds])
    upper = np.array([b[1] for b in bounds])
    # Strictly inside the bounds, as the trust-region solver requires; then only the most promising starts
    # (by their loss before any step) are optimised: many starts cost one evaluation each.
    starts = [np.clip(s0, lower + 1e-9 * (upper - lower), upper - 1e-9 * (upper - lower)) for s0 in starts]
    if len(starts) > _KEEP_STARTS:
        screened = [float(_huber(residuals(s0), huber_delta).sum()) for s0 in starts]
        starts = [starts[i] for i in np.argsort(screened)[:_KEEP_STARTS]]
    best, best_value = None, math.inf
    for s0 in starts:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # scipy's loss="huber" with f_scale=delta: 0.5 * sum of Huber_delta(r) exactly.
            res = least_squares(
                residuals, s0, bounds=(lower, upper), loss="huber", f_scale=huber_delta, method="dogbox", x_scale="jac"
            )
        value = float(_huber(residuals(res.x), huber_delta).sum())
        if value < best_value:
            best, best_value = res, value
    if start is None:
        # dogbox finds the basin fast but stops early on the linear part of the Huber loss: polish the winner.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = least_squares(
                residuals,
                best.x,
                bounds=(lower, upper),
                loss="huber",
                f_scale=huber_delta,
                method="trf",
                x_scale="jac",
                ftol=1e-12,
                xtol=1e-12,
                gtol=1e-12,
                max_nfev=300,
            )
        value = float(_huber(residuals(res.x), huber_delta).sum())
        if value < best_value:
            best, best_value = res, value
    theta = np.asarray(best.x, dtype="float64")
    return LawFit(form=form, params=_law_params(form, theta, n0), objective=best_value, n0=n0, theta=theta, eps0=eps0)


def _check_seeded(n, err, seeds) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = np.asarray(n, dtype="float64").ravel()
    err = np.asarray(err, dtype="float64").ravel()
    seeds = np.asarray(seeds).ravel()
    if not (len(n) == len(err) == len(seeds)):
        raise ValueError(f"n, err and seeds must have one entry per point, got {len(n)}, {len(err)}, {len(seeds)}")
    return n, err, seeds


def _resample_seeds(rng: np.random.Generator, seeds: np.ndarray) -> np.ndarray:
    """Row indices of a bootstrap draw of whole seeds (with replacement): a seed's points travel together."""
    unique = np.unique(seeds)
    drawn = rng.choice(unique, size=len(unique), replace=True)
    return np.concatenate([np.flatnonzero(seeds == s) for s in drawn])


def law_extrapolation(
    n,
    err,
    seeds,
    *,
    forms: tuple[str, ...] = LAW_FORMS,
    bootstrap_forms: tuple[str, ...] | None = None,
    n_boot: int = 200,
    confidence: float = 0.95,
    seed: int = 0,
    huber_delta: float = 1e-3,
    eps0: float = 1.0,
):
    """Fit each form on all n but the largest, predict the largest, and compare: a scaling law checked by extrapolation.

    One row per form: its parameters fitted on ALL points with percentile intervals from a bootstrap over
    seeds (`n_boot` draws of whole seeds with replacement), then the held-out check: fitted without the largest
    n, the prediction there, its bootstrap interval, the observed mean over seeds and the absolute and relative
    error of the prediction. A form with more parameters than the held-in distinct n is not fitted (its note
    says so). `noise` is the standard error of the observed mean at the held-out n (between seeds): held-out
    errors that differ by less than it do not tell the forms apart. With one seed there is nothing to resample:
    no intervals (note says so). The best form (smallest held-out error) is flagged in `supported`.
    bootstrap_forms: the forms that get intervals (None: all); the others are compared by their point fits.
    """
    import pandas as pd

    n, err, seeds = _check_seeded(n, err, seeds)
    distinct = np.unique(n)
    if len(distinct) < 3:
        raise ValueError(
            f"law_extrapolation needs at least 3 distinct n (fit on 2+, hold out the largest), got {distinct.tolist()}"
        )
    top = distinct[-1]
    held_in = n < top
    observed = err[~held_in]
    n_seeds = len(np.unique(seeds))
    noise = float(observed.std(ddof=1) / math.sqrt(len(observed))) if len(observed) > 1 else math.nan
    tail = (1.0 - confidence) / 2.0
    rows = []
    for form in forms:
        k = len(_LAW_PARAMS[form])
        row: dict = {
            "form": form,
            "n_seeds": n_seeds,
            "heldout_n": float(top),
            "observed": float(observed.mean()),
            "noise": noise,
        }
        if len(np.unique(n[held_in])) < k:
            row["note"] = (
                f"{k} parameters need {k}+ distinct n below the held-out one; have {len(np.unique(n[held_in]))}"
            )
            rows.append(row)
            continue
        full = fit_law(n, err, form=form, huber_delta=huber_delta, eps0=eps0)
        part = fit_law(n[held_in], err[held_in], form=form, huber_delta=huber_delta, eps0=eps0)
        prediction = float(part.predict(top))
        row.update({f"{p}": v for p, v in full.params.items()})
        row.update(
            prediction=prediction,
            abs_error=abs(prediction - row["observed"]),
            rel_error=abs(prediction - row["observed"]) / max(row["observed"], 1e-12),
        )
        notes = []
        if bootstrap_forms is not None and form not in bootstrap_forms:
            notes.append("not bootstrapped: point fit only")
        elif n_seeds >= 2 and n_boot > 0:
            rng = np.random.default_rng(seed)
            draws, preds = [], []
            for _ in range(n_boot):
                idx = _resample_seeds(rng, seeds)
                draws.append(
                    list(
                        fit_law(
                            n[idx], err[idx], form=form, huber_delta=huber_delta, eps0=eps0, start=full.theta
                        ).params.values()
                    )
                )
                inner = idx[n[idx] < top]
                preds.append(
                    float(
                        fit_law(
                            n[inner], err[inner], form=form, huber_delta=huber_delta, eps0=eps0, start=part.theta
                        ).predict(top)
                    )
                )
            draws = np.asarray(draws)
            for i, p in enumerate(full.params):
                row[f"{p}_low"], row[f"{p}_high"] = (float(q) for q in np.quantile(draws[:, i], [tail, 1 - tail]))
            row["prediction_low"], row["prediction_high"] = (float(q) for q in np.quantile(preds, [tail, 1 - tail]))
            if n_seeds < 3:
                notes.append(f"{n_seeds} seeds: intervals unreliable")
        else:
            notes.append("1 seed: no interval" if n_seeds < 2 else "n_boot=0: no interval")
        row["note"] = "; ".join(notes)
        rows.append(row)
    frame = pd.DataFrame(rows).set_index("form")
    if "abs_error" in frame.columns and frame["abs_error"].notna().any():
        best = frame["abs_error"].idxmin()
        frame["supported"] = frame.index == best
        second = frame["abs_error"].drop(best).min() if frame["abs_error"].notna().sum() > 1 else math.nan
        if math.isfinite(noise) and math.isfinite(second) and second - frame.loc[best, "abs_error"] < noise:
            frame.attrs["verdict"] = (
                f"{best} predicts the held-out n best, but by less than the between-seed noise "
                f"({noise:.3g}): the data do not tell the forms apart"
            )
        else:
            frame.attrs["verdict"] = f"{best} predicts the held-out n best"
    return frame


def paired_law_difference(
    n,
    err_treatment,
    err_baseline,
    seeds,
    *,
    form: LawForm = "saturating",
    n_boot: int = 200,
    confidence: float = 0.95,
    seed: int = 0,
    huber_delta: float = 1e-3,
    eps0: float = 1.0,
):
    """treatment - baseline in each parameter of `form` (e.g. SAM - vanilla in beta and E), paired bootstrap over seeds.

    The points are paired: point i of both arrays shares n and seed (nested fractions, seeds shared). Each
    draw resamples whole seeds once and refits both laws on the same seeds. One row per parameter: treatment,
    baseline, diff, diff_low, diff_high, n_seeds, note.
    """
    import pandas as pd

    n, err_t, seeds = _check_seeded(n, err_treatment, seeds)
    err_b = np.asarray(err_baseline, dtype="float64").ravel()
    if len(err_b) != len(n):
        raise ValueError(f"err_baseline must pair with err_treatment point by point, got {len(err_b)} and {len(err_t)}")
    ft = fit_law(n, err_t, form=form, huber_delta=huber_delta, eps0=eps0)
    fb = fit_law(n, err_b, form=form, huber_delta=huber_delta, eps0=eps0)
    n_seeds = len(np.unique(seeds))
    tail = (1.0 - confidence) / 2.0
    diffs = None
    if n_seeds >= 2 and n_boot > 0:
        rng = np.random.default_rng(seed)
        rows = []
        for _ in range(n_boot):
            idx = _resample_seeds(rng, seeds)
            t = fit_law(n[idx], err_t[idx], form=form, huber_delta=huber_delta, eps0=eps0, start=ft.theta).params
            b = fit_law(n[idx], err_b[idx], form=form, huber_delta=huber_delta, eps0=eps0, start=fb.theta).params
            rows.append([t[p] - b[p] for p in ft.params])
        diffs = np.asarray(rows)
    note = "1 seed: no interval" if n_seeds < 2 else (f"{n_seeds} seeds: interval unreliable" if n_seeds < 3 else "")
    out = []
    for i, p in enumerate(ft.params):
        lo, hi = np.quantile(diffs[:, i], [tail, 1 - tail]) if diffs is not None else (math.nan, math.nan)
        out.append(
            {
                "param": p,
                "treatment": ft.params[p],
                "baseline": fb.params[p],
                "diff": ft.params[p] - fb.params[p],
                "diff_low": float(lo),
                "diff_high": float(hi),
                "n_seeds": n_seeds,
                "note": note,
            }
        )
    return pd.DataFrame(out).set_index("param")
