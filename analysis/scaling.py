"""Data-scaling laws: the fit err(n) = a n^-b + c with bootstrap intervals, and how much more data one method needs to match another."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Literal, Mapping

import numpy as np

__all__ = [
    "DataMultiplier",
    "FloorNotIdentifiedWarning",
    "PowerLawFit",
    "data_multiplier",
    "fit_power_law",
    "fit_scaling_table",
    "fits_frame",
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
        row.update(points=int(len(self.n)), distinct_n=self.n_distinct, rmse=self.rmse,
                   floor_identified=self.floor_identified, note=self.note)
        return row


def _as_points(n, err) -> tuple[np.ndarray, np.ndarray]:
    n = np.asarray(n, dtype="float64").ravel()
    err = np.asarray(err, dtype="float64").ravel()
    if n.shape != err.shape:
        raise ValueError(f"n and err must have the same length, got {len(n)} and {len(err)}; pass one error per n")
    if len(n) < 3:
        raise ValueError(f"fit_power_law needs at least 3 points for its 3 parameters a, b, c, got {len(n)}; add training-set sizes")
    if not (np.all(np.isfinite(n)) and np.all(n > 0)):
        raise ValueError(f"n must be finite and > 0 (training-set sizes or fractions), got {n.tolist()}")
    if not np.all(np.isfinite(err)) or np.any(err < 0):
        raise ValueError(f"err must be finite and >= 0 (an error rate or a loss), got {err.tolist()}; drop failed cells first")
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


def _polish(x: np.ndarray, err: np.ndarray, start: tuple[float, float, float]) -> tuple[tuple[float, float, float], bool]:
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
        a=float(a), b=float(b), c=float(c), intervals=intervals, confidence=float(confidence), n=n, err=err,
        n_distinct=distinct, rmse=rmse, floor_identified=not note, note=note, samples=samples,
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


def data_multiplier(fit_vanilla: PowerLawFit, fit_sam: PowerLawFit, n: float, *, confidence: float = 0.95) -> DataMultiplier:
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
            [
                _needed(*fit_vanilla.samples[i], float(_model(n, *fit_sam.samples[i]))) / n
                for i in range(k)
            ]
        )
        draws = draws[~np.isnan(draws)]
        if len(draws):
            tail = (1.0 - confidence) / 2.0
            # inverted_cdf never interpolates, so an infinite draw cannot turn a bound into NaN.
            interval = (float(np.quantile(draws, tail, method="inverted_cdf")),
                        float(np.quantile(draws, 1.0 - tail, method="inverted_cdf")))
    if math.isnan(multiplier):
        text = (f"undefined: the vanilla fit is flat (a={fit_vanilla.a:.3g}, b={fit_vanilla.b:.3g}), so no n' "
                "changes its error; check the points it was fitted on")
    elif not reachable:
        text = (f"unreachable: vanilla's fitted floor c={fit_vanilla.c:.4g} is at or above SAM's error "
                f"{target:.4g} at n={n:g}; under these fits no amount of data lets vanilla match SAM")
    else:
        text = (f"vanilla needs n'={needed:.4g} ({multiplier:.3g}x n={n:g}) to reach SAM's error {target:.4g} "
                f"(vanilla's own error at n: {vanilla_err:.4g})")
        if multiplier < 1:
            text += "; below 1: vanilla is already better at n"
        if extrapolated:
            text += f"; n' lies outside the measured range [{lo_n:g}, {hi_n:g}], so it is an extrapolation of the fit"
    weak = [name for name, f in (("vanilla", fit_vanilla), ("SAM", fit_sam)) if not f.floor_identified]
    if weak:
        text += f"; the floor of the {' and '.join(weak)} fit is not identified, and the answer depends on it"
    return DataMultiplier(
        n=n, sam_error=target, vanilla_error=vanilla_err, n_needed=needed, multiplier=multiplier, interval=interval,
        reachable=reachable, extrapolated=extrapolated, explanation=text,
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
            fits[(str(arch), str(method))] = fit_power_law(n, err, n_boot=n_boot, seed=seed, confidence=confidence, warn=warn)
        for w in caught:
            if warn:
                warnings.warn(f"{arch}/{method}: {w.message}", w.category, stacklevel=2)
    if skipped and warn:
        warnings.warn(f"fit_scaling_table: too few points to fit {', '.join(skipped)}", FloorNotIdentifiedWarning, stacklevel=2)
    return fits


def fits_frame(fits: Mapping[tuple[str, str], PowerLawFit]):
    """The fits as a table: one row per (arch, method) with estimates, intervals and the floor flag."""
    import pandas as pd

    rows = [{"arch": a, "method": m, **fit.to_dict()} for (a, m), fit in fits.items()]
    return pd.DataFrame(rows).set_index(["arch", "method"]) if rows else pd.DataFrame()
