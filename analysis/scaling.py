"""Data-scaling laws: err(n) = a n^-b + c with seed-level intervals, laws checked by extrapolation (Huber fits in log space,
seed-level bootstrap-t / jackknife-t intervals, held-out largest n, three forms, paired differences), the data multiplier."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Literal, Mapping

import numpy as np

__all__ = [
    "LAW_FORMS",
    "POWER_LAW_COVERAGE",
    "DataMultiplier",
    "FloorNotIdentifiedWarning",
    "LawFit",
    "PowerLawFit",
    "chance_error",
    "data_multiplier",
    "detectable",
    "fit_law",
    "fit_power_law",
    "fit_scaling_table",
    "fits_frame",
    "jackknife_se",
    "law_extrapolation",
    "law_parameters",
    "paired_law_difference",
    "robust_delta",
    "saturating_bootstrap_t",
    "BOOT_DRAWS",
    "HUBER_SDS",
    "t_quantile",
    "table_points",
]


class FloorNotIdentifiedWarning(UserWarning):
    """The points do not pin down the floor c of err(n) = a n^-b + c: any c in a wide range fits about as well."""


# A floor whose interval is wider than this share of its plausible range [0, min(err)] is not identified.
_FLOOR_SPAN = 0.5
_B_MAX = 20.0


@dataclass(frozen=True)
class PowerLawFit:
    """err(n) = a * n^(-b) + c fitted by least squares on the points (n, err), with intervals.

    intervals: (low, high) of a, b, c. With 2+ seeds (`bootstrap` = "seeds"): the delete-one-seed jackknife
    with Student's t on S - 1 df (a on the log scale; c's low end clipped at 0, where c is bounded), the seed
    being the independent unit; samples: the leave-one-seed-out fits, one row (a, b, c) per seed in
    `sample_seeds`. With one seed (`bootstrap` = "none") no interval: its offset, shared by all its points, is
    invisible to any resampling of them. Without seeds (`bootstrap` = "residuals"): percentile intervals of
    a residual bootstrap (fixed design: the n are chosen by the experimenter, so the residuals are resampled,
    never the points), which treats points as independent and so cannot see a seed's offset shared by its
    points; samples: the bootstrap draws. interval_note says which, what it ignores and its coverage measured
    by simulation (POWER_LAW_COVERAGE); n_seeds: the seeds the points came from (0: not given). floor_identified:
    False when the points cannot pin c (fewer than 4 distinct n, or c's interval wider than half of its
    plausible range [0, min(err)]); note says why.
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
    sample_seeds: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False)
    interval_note: str = ""
    n_seeds: int = 0

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
            seeds=self.n_seeds,
            rmse=self.rmse,
            floor_identified=self.floor_identified,
            note=self.note,
            interval=self.interval_note,
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


# The coverage of fit_power_law's and data_multiplier's 95% intervals as measured by `benchmarks/sim_coverage.py
# --power-laws` (docs/science.md, "Power-law fits and the data multiplier": 150-200 simulated studies a row, the
# reference law at 5 fractions, 0.5 points of noise of which 0, 50% or 90% is a seed's offset shared by its
# fractions). Each interval's note quotes its line, so that no report claims the nominal level for an interval
# that did not reach it.
POWER_LAW_COVERAGE = {
    "seeds": "a 95% interval covered 92.0-97.5% in simulation (3-5 seeds: docs/science.md)",
    "points": (
        "a 95% interval covered 90.5-100% (a, b, c) and 75.3-95.5% (the data multiplier) in simulation over the "
        "points of 3-5 seeds, shorter the more a seed's points share (docs/science.md)"
    ),
    "one seed": (
        "a bootstrap over its points covered 59-85% (a, b, c) and 23-82% (the data multiplier) at nominal 95% in "
        "simulation, the less the more its points share (docs/science.md)"
    ),
}


def fit_power_law(
    n,
    err,
    *,
    seeds=None,
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    warn: bool = True,
) -> PowerLawFit:
    """Fit err(n) = a * n^(-b) + c (a >= 0, b >= 0, c >= 0) to points; several points may share an n (seeds).

    The fit: a profile over c (log-linear least squares for a, b at each c on a grid in [0, min err)), then
    bounded nonlinear least squares (scipy's curve_fit) from the best grid point. n is rescaled by its
    geometric mean inside the fit for conditioning; a is reported for n as given. Intervals (none when n_boot
    is 0): with `seeds` (each point's seed) holding 2+ seeds, the delete-one-seed jackknife with Student's t on
    S - 1 df (every leave-one-seed-out refit; the seed is the independent unit, since a seed's points share
    its nested data and its offset); otherwise a residual bootstrap with `n_boot` draws (numpy Generator seeded
    with `seed`), the residuals inflated by sqrt(N / (N - 3)) for the 3 fitted parameters and centred, which
    treats the points as independent (interval_note says so); with only 3 points there is nothing to resample
    and the intervals are NaN. benchmarks/sim_coverage.py measures both (docs/science.md). When the floor c is
    not identified (see PowerLawFit) a FloorNotIdentifiedWarning is raised (if warn) and floor_identified is
    False: read b and c as a pair then.
    """
    if not (isinstance(n_boot, (int, np.integer)) and n_boot >= 0):
        raise ValueError(f"n_boot must be an int >= 0 (0 skips the bootstrap), got {n_boot!r}")
    if not (isinstance(confidence, (int, float)) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}; e.g. 0.95")
    n, err = _as_points(n, err)
    if seeds is not None:
        seeds = np.asarray(seeds).ravel()
        if len(seeds) != len(n):
            raise ValueError(f"seeds must give one seed per point, got {len(seeds)} for {len(n)} points")
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
    sample_seeds = np.empty(0)
    intervals = {"a": nan_pair, "b": nan_pair, "c": nan_pair}
    n_seeds = 0 if seeds is None else len(np.unique(seeds))
    kind = "seeds" if n_seeds >= 2 else "none" if n_seeds == 1 else "residuals"
    if n_boot == 0:
        interval_note = "no interval (n_boot=0)"
    elif kind == "seeds":
        interval_note = (
            f"delete-one-seed jackknife over {n_seeds} seeds, Student's t on {n_seeds - 1} df; "
            + POWER_LAW_COVERAGE["seeds"]
        )
    elif n_seeds == 1:
        # As the law fits: one seed's offset, shared by all its points, is invisible to any resampling of them.
        interval_note = (
            "no interval: the points come from 1 seed, whose offset (shared by all its points) no resampling of them "
            "can see; " + POWER_LAW_COVERAGE["one seed"] + ". Fix: run 2+ seeds (3-5 for intervals that cover)"
        )
    else:
        interval_note = (
            "residual bootstrap over points: treats every point as independent, though the points of one seed are "
            "correlated; " + POWER_LAW_COVERAGE["points"] + "; pass seeds for a seed-level interval"
        )

    def refit(x_, y_, start):
        # Start from the point estimate: a resample is a small perturbation of it; the grid is the fallback.
        p, converged = _polish(x_, y_, start)
        return p if converged else _fit(x_, y_)

    if n_boot > 0 and kind == "seeds":

        def leave_out(keep):
            xs, ys = _as_points(x[keep], err[keep])
            p = refit(xs, ys, (a_s, b, c))
            return [p[0] * n0 ** p[1], p[1], p[2]]

        jack, why = _leave_one_seed_out(seeds, leave_out)
        if jack:
            samples, sample_seeds = np.asarray(jack, dtype="float64"), np.unique(seeds)
            q = t_quantile(confidence, n_seeds - 1)
            est = (a_s * n0**b, b, c)
            for i, name in enumerate("abc"):
                # a is positive and multiplicative (B of the saturating law, on the log scale there too).
                lo, hi, _ = _t_interval(est[i], samples[:, i], q, name == "a" and est[i] > 0)
                intervals[name] = (max(lo, 0.0) if name == "c" else lo, hi)
        else:
            interval_note = why
    elif n_boot > 0 and N > 3 and kind == "residuals":
        scaled = (resid - resid.mean()) * math.sqrt(N / (N - 3))
        rng = np.random.default_rng(seed)
        rows = []
        for _ in range(n_boot):
            star = np.clip(fitted + rng.choice(scaled, size=N, replace=True), 0.0, None)
            p = refit(x, star, (a_s, b, c))
            rows.append((p[0] * n0 ** p[1], p[1], p[2]))
        samples = np.asarray(rows)
        lo = np.quantile(samples, tail, axis=0)
        hi = np.quantile(samples, 1.0 - tail, axis=0)
        intervals = {name: (float(lo[i]), float(hi[i])) for i, name in enumerate("abc")}
    a = a_s * n0**b
    notes = []
    if np.all(err == 0):
        notes.append(
            "every error is 0 (e.g. every seed at accuracy 1.0): there is no curve, and the flat fit at 0 says nothing "
            "about scaling; use a harder task or a metric that is not saturated"
        )
    elif distinct < 4:
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
        bootstrap=kind,
        sample_seeds=sample_seeds,
        interval_note=interval_note,
        n_seeds=n_seeds,
    )


@dataclass(frozen=True)
class DataMultiplier:
    """How many times more data the vanilla method needs to reach the SAM error at n, under the two fits.

    multiplier = n_needed / n: inf when vanilla's floor is at or above that error (never reached), NaN when
    a fit is degenerate; below 1 when vanilla is already better at n. interval: with two seed-level fits
    (`bootstrap` = "seeds"), the delete-one-seed jackknife of log(multiplier) with Student's t on S - 1 df
    (paired: each left-out seed leaves both fits; fits on different seeds add their jackknife variances);
    with two residual-bootstrap fits, the percentile interval over their paired draws, which treats points as
    independent; NaN when either fit has none, the fits' kinds differ, or a left-out seed makes the
    multiplier infinite or undefined. interval_note says which and, where measured, its coverage.
    explanation says how to read the multiplier and its interval.
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
    interval_note: str = ""


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
    flat = [name for name, f in (("vanilla", fit_vanilla), ("SAM", fit_sam)) if np.all(f.err == 0)]
    if flat:
        return DataMultiplier(
            n=n,
            sam_error=float(fit_sam.predict(n)),
            vanilla_error=float(fit_vanilla.predict(n)),
            n_needed=math.nan,
            multiplier=math.nan,
            interval=(math.nan, math.nan),
            reachable=False,
            extrapolated=False,
            explanation=(
                f"undefined: every error of the {' and '.join(flat)} fit is 0 (accuracy 1.0 throughout): there is "
                "no curve to solve for the data needed"
            ),
        )
    target = float(fit_sam.predict(n))
    vanilla_err = float(fit_vanilla.predict(n))
    needed = _needed(fit_vanilla.a, fit_vanilla.b, fit_vanilla.c, target)
    multiplier = needed / n
    reachable = math.isfinite(needed)
    lo_n, hi_n = float(fit_vanilla.n.min()), float(fit_vanilla.n.max())
    extrapolated = reachable and not (lo_n <= needed <= hi_n)
    interval, interval_note = _multiplier_interval(fit_vanilla, fit_sam, n, multiplier, confidence)
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
    text += f"; interval: {interval_note}"
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
        interval_note=interval_note,
    )


def _multiplier_interval(
    fit_vanilla: PowerLawFit, fit_sam: PowerLawFit, n: float, multiplier: float, confidence: float
) -> tuple[tuple[float, float], str]:
    """(interval, what it is) of the data multiplier at n from the two fits' samples (see DataMultiplier)."""
    nan_pair = (math.nan, math.nan)

    def draws(vanilla_rows, sam_rows) -> np.ndarray:
        return np.array([_needed(*v, float(_model(n, *t))) / n for v, t in zip(vanilla_rows, sam_rows)])

    kinds = {fit_vanilla.bootstrap, fit_sam.bootstrap}
    if "none" in kinds:
        return (
            nan_pair,
            "none: a fit's points come from one seed, which no interval can rest on (see its interval note)",
        )
    if len(fit_vanilla.samples) == 0 or len(fit_sam.samples) == 0:
        return nan_pair, "none (a fit has no interval draws: too few points, or n_boot=0)"
    if kinds != {"seeds"} and kinds != {"residuals"}:
        return nan_pair, (
            "none: one fit has seed-level intervals and the other only a bootstrap over points; fit both with seeds"
        )
    if kinds == {"residuals"}:
        k = min(len(fit_vanilla.samples), len(fit_sam.samples))
        values = draws(fit_vanilla.samples[:k], fit_sam.samples[:k])
        values = values[~np.isnan(values)]
        if not len(values):
            return nan_pair, "none: every bootstrap draw of the multiplier is undefined"
        tail = (1.0 - confidence) / 2.0
        # inverted_cdf never interpolates, so an infinite draw cannot turn a bound into NaN.
        interval = (
            float(np.quantile(values, tail, method="inverted_cdf")),
            float(np.quantile(values, 1.0 - tail, method="inverted_cdf")),
        )
        return interval, (
            f"{confidence:.0%} percentile interval of the fits' residual bootstraps over points, which treat every "
            "point as independent and ignore within-seed correlation; " + POWER_LAW_COVERAGE["points"]
        )
    # Seed level: the jackknife of log(multiplier), each left-out seed refitting what it touches.
    sv, st = fit_vanilla.sample_seeds, fit_sam.sample_seeds
    est_v = (fit_vanilla.a, fit_vanilla.b, fit_vanilla.c)
    est_t = (fit_sam.a, fit_sam.b, fit_sam.c)
    if len(sv) == len(st) and np.array_equal(sv, st):
        parts = [draws(fit_vanilla.samples, fit_sam.samples)]
        how = f"paired over {len(sv)} seeds"
    else:  # different seeds: independent fits, their jackknife variances add
        parts = [draws(fit_vanilla.samples, [est_t] * len(sv)), draws([est_v] * len(st), fit_sam.samples)]
        how = f"the two fits' seeds ({len(sv)} and {len(st)}) not shared: their variances add"
    df = min(len(sv), len(st)) - 1
    if not (math.isfinite(multiplier) and multiplier > 0):
        return nan_pair, f"none: the multiplier itself is {multiplier:g}"
    if not all(np.all(np.isfinite(p) & (p > 0)) for p in parts):
        return nan_pair, (
            "none: leaving one seed out makes the multiplier infinite or undefined (the vanilla floor reaches the "
            "target), so the seeds cannot bound it"
        )
    se = math.sqrt(sum(float(jackknife_se(np.log(p)[:, None])[0]) ** 2 for p in parts))
    q = t_quantile(confidence, df)
    interval = (multiplier * math.exp(-q * se), multiplier * math.exp(q * se))
    return interval, (
        f"{confidence:.0%} delete-one-seed jackknife of log(multiplier), {how}, Student's t on {df} df; "
        + POWER_LAW_COVERAGE["seeds"]
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
    fewer than 2 distinct fractions are left out with a warning. Each point's seed (the table's seed column)
    goes to fit_power_law, so that a series of 2+ seeds gets seed-level intervals; a table without seeds gets
    the bootstrap over points, and its fits' interval_note says what that ignores.
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
        seeds = part[cols["seed"]].astype(str).to_numpy() if cols.get("seed") else None
        if len(n) < 3 or len(np.unique(n)) < 2:
            skipped.append(f"{arch}/{method} ({len(n)} points)")
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FloorNotIdentifiedWarning)
            fits[(str(arch), str(method))] = fit_power_law(
                n, err, seeds=seeds, n_boot=n_boot, seed=seed, confidence=confidence, warn=warn
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
# fit in log space with a Huber loss from many starts, resample the independent units (seeds, whose curves share
# nested fractions) rather than points, and judge a law by how well it predicts the largest n it was not fitted on.

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


def fit_law(
    n,
    err,
    *,
    form: LawForm = "saturating",
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
    """
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


def _check_seeded(n, err, seeds) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = np.asarray(n, dtype="float64").ravel()
    err = np.asarray(err, dtype="float64").ravel()
    seeds = np.asarray(seeds).ravel()
    if not (len(n) == len(err) == len(seeds)):
        raise ValueError(f"n, err and seeds must have one entry per point, got {len(n)}, {len(err)}, {len(seeds)}")
    return n, err, seeds


# ---------------------------------------------------------------------------------- intervals over seeds
#
# The seed is the independent unit (its curve shares nested fractions), and a study has 3-5 of them: a bootstrap
# over 3 seeds has 10 distinct resamples and its percentile interval is too narrow by design. The broken and M4 forms'
# intervals are a delete-one-seed jackknife (exact: every leave-one-out refit, no draws) standard error
# with Student's t on S - 1 degrees of freedom, on the log scale for quantities that are positive (E, B, a
# prediction); the saturating form's are the bootstrap-t below. benchmarks/sim_coverage.py measures the coverage;
# docs/science.md has its table.

_LOG_SCALE = frozenset({"B", "n_break"})


def t_quantile(confidence: float, df: float) -> float:
    """Student's t quantile of a two-sided `confidence` interval on df degrees of freedom (NaN for df < 1)."""
    from scipy.stats import t

    return float(t.ppf(0.5 + confidence / 2.0, df)) if df >= 1 else math.nan


def jackknife_se(values: np.ndarray) -> np.ndarray:
    """Delete-one jackknife standard error of each column of `values` (one row per left-out unit)."""
    values = np.asarray(values, dtype="float64")
    units = len(values)
    centred = values - values.mean(axis=0)
    return np.sqrt((units - 1) / units * (centred**2).sum(axis=0))


def _t_interval(estimate: float, jack: np.ndarray, q: float, log: bool) -> tuple[float, float, float]:
    """(low, high, se) of `estimate` from its leave-one-out values `jack`; se on the scale the interval is built."""
    if not (math.isfinite(estimate) and np.all(np.isfinite(jack))) or (log and (estimate <= 0 or np.any(jack <= 0))):
        return math.nan, math.nan, math.nan
    if log:
        se = float(jackknife_se(np.log(jack)[:, None])[0])
        return estimate * math.exp(-q * se), estimate * math.exp(q * se), se
    se = float(jackknife_se(np.asarray(jack)[:, None])[0])
    return estimate - q * se, estimate + q * se, se


def _leave_one_seed_out(seeds: np.ndarray, refit) -> tuple[list, str]:
    """refit(keep_mask) for each seed left out; ([], reason) when some refit is impossible."""
    out = []
    for s in np.unique(seeds):
        try:
            out.append(refit(seeds != s))
        except ValueError as exc:
            return [], f"leaving seed {s} out leaves too little to refit ({exc}): no interval"
    return out, ""


# ------------------------------------------------------------------ seed-level bootstrap-t of the saturating law
#
# The jackknife-t above is exact only for a fit linear in the seeds' means; the saturating law extrapolated from
# 4 fractions is not (its E-beta ridge bends), and its held-out prediction covered 92-93% (benchmarks/
# sim_coverage.py). The saturating form's intervals are therefore a studentised (bootstrap-t) parametric bootstrap
# over seeds: each draw is a study of the same design (the same n, seeds and missing runs), every point the fitted
# law plus seed noise of its own n's observed sd; the draw is refitted (vectorised Levenberg-Marquardt, the full
# fit's Huber delta) and studentised by its own seed-level standard error (the infinitesimal jackknife over seeds:
# each seed's influence on the fit, exactly the delete-one-seed jackknife for a fit linear in the seeds). The
# interval is estimate - t*_(1-a/2) se ... estimate - t*_(a/2) se with t* the draws' studentised quantiles: it is
# t on S - 1 df where the fit is linear and corrects it for the curvature and bias where it is not. The other forms
# keep the jackknife-t (no vectorised fit for them).

BOOT_DRAWS = 2000  # draws of the bootstrap-t: each 2.5% tail rests on 50 draws


def _huber_weights(r: np.ndarray, delta: float) -> np.ndarray:
    a = np.abs(r)
    return np.where(a <= delta, 1.0, delta / np.maximum(a, 1e-300))


def _sat_level(theta: np.ndarray, lx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(L, power term) of the saturating form for a batch of theta (M, 3) at lx (N,): each (M, N)."""
    power = np.exp(np.clip(theta[:, 1:2] - theta[:, 2:3] * lx[None, :], -700.0, 700.0))
    return theta[:, 0:1] + power, power


def _sat_batch_fit(
    theta: np.ndarray,
    lx: np.ndarray,
    ly: np.ndarray,
    mask: np.ndarray,
    delta: float,
    lower: np.ndarray,
    upper: np.ndarray,
    iters: int = 100,
) -> tuple[np.ndarray, np.ndarray]:
    """Levenberg-Marquardt on the Huber loss of the saturating form for M fits at once (ly, mask: (M, N); mask 0
    drops a point). Returns (theta (M, 3), objective (M,)): the same optimum `_lm_saturating` finds for each row."""
    theta = np.array(theta, dtype="float64")

    def evaluate(th, rows):
        level, _ = _sat_level(th, lx)
        bad = np.any((level <= 0) & (mask[rows] > 0), axis=1)
        r = np.log(np.maximum(level, 1e-300)) - ly[rows]
        value = (mask[rows] * _huber(r, delta)).sum(axis=1)
        value[bad] = math.inf
        return r, value

    r, value = evaluate(theta, slice(None))
    lam = np.full(len(theta), 1e-3)
    active = np.isfinite(value)
    eye = np.eye(3)
    for _ in range(iters):
        if not active.any():
            break
        idx = np.flatnonzero(active)
        th = theta[idx]
        level, power = _sat_level(th, lx)
        level = np.maximum(level, 1e-300)
        jac = np.stack([1.0 / level, power / level, -lx[None, :] * power / level], axis=2)  # (m, N, 3)
        w = mask[idx] * _huber_weights(r[idx], delta)
        wj = jac * w[:, :, None]
        grad = (wj * r[idx][:, :, None]).sum(axis=1)
        hess = np.matmul(wj.transpose(0, 2, 1), jac)
        diag = np.diagonal(hess, axis1=1, axis2=2)
        step = np.linalg.solve(hess + (lam[idx, None] * diag + 1e-12)[:, :, None] * eye[None], grad[:, :, None])[..., 0]
        cand = np.clip(th - step, lower, upper)
        rc, vc = evaluate(cand, idx)
        better = vc < value[idx]
        done = better & (value[idx] - vc <= 1e-7 * (1e-6 + value[idx]))
        acc = idx[better]
        theta[acc], r[acc], value[acc] = cand[better], rc[better], vc[better]
        lam[acc] = np.maximum(lam[acc] / 5.0, 1e-12)
        rej = idx[~better]
        lam[rej] *= 4.0
        active[idx[done]] = False
        active &= lam < 1e12
    return theta, value


def _sat_influence(
    theta: np.ndarray, lx: np.ndarray, ly: np.ndarray, mask: np.ndarray, delta: float, onehot: np.ndarray
) -> np.ndarray:
    """Each seed's influence on theta, (M, S, 3): -H^-1 sum over the seed's points of w J r (r = fit - data), the
    change that including the seed makes to the fit, to first order (the infinitesimal jackknife over seeds)."""
    level, power = _sat_level(theta, lx)
    level = np.maximum(level, 1e-300)
    jac = np.stack([1.0 / level, power / level, -lx[None, :] * power / level], axis=2)
    r = np.log(level) - ly
    w = mask * _huber_weights(r, delta)
    hess = np.matmul((jac * w[:, :, None]).transpose(0, 2, 1), jac)
    per_seed = np.matmul(onehot.T[None], (w * r)[:, :, None] * jac)
    ok = np.isfinite(hess).all(axis=(1, 2)) & np.isfinite(per_seed).all(axis=(1, 2))
    out = np.full(per_seed.shape, math.nan)
    with np.errstate(all="ignore"):
        out[ok] = -np.matmul(per_seed[ok], np.linalg.pinv(hess[ok], hermitian=True))  # H symmetric
    return out


def _seed_se(parts: np.ndarray) -> np.ndarray:
    """Standard error from each seed's influence on a statistic (..., S): the jackknife's S/(S-1) sum of squares."""
    s = parts.shape[-1]
    centred = parts - parts.mean(axis=-1, keepdims=True)
    return np.sqrt(s / (s - 1) * (centred**2).sum(axis=-1))


def _sat_stats(theta: np.ndarray, n0: float, lx_top: float | None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Statistics of the saturating law as (value (M,), gradient in theta (M, 3)): E, log B, beta, B, prediction."""
    e, b, beta = theta[:, 0], theta[:, 1], theta[:, 2]
    ones, zeros = np.ones_like(e), np.zeros_like(e)
    log_b = b + beta * math.log(n0)
    big_b = np.exp(log_b)
    out = {
        "E": (e, np.stack([ones, zeros, zeros], axis=1)),
        "beta": (beta, np.stack([zeros, zeros, ones], axis=1)),
        "logB": (log_b, np.stack([zeros, ones, ones * math.log(n0)], axis=1)),
        "B": (big_b, big_b[:, None] * np.stack([zeros, ones, ones * math.log(n0)], axis=1)),
    }
    if lx_top is not None:
        p = np.exp(b - beta * lx_top)
        out["prediction"] = (e + p, np.stack([ones, p, -lx_top * p], axis=1))
    return out


class _SeedDesign:
    """The points of one seeded series prepared for the batch fit: log n, log err, seed one-hot, noise per point."""

    def __init__(self, n: np.ndarray, err: np.ndarray, seeds: np.ndarray, fit: LawFit, seed_order: np.ndarray):
        self.lx = np.log(n / fit.n0)
        self.ly = np.log(np.maximum(err, _LOG_FLOOR))
        self.onehot = (seeds[:, None] == seed_order[None, :]).astype("float64")
        self.theta = np.asarray(fit.theta, dtype="float64")[None, :]
        self.delta = fit.huber_delta
        starts, bounds = _law_starts("saturating", self.lx, self.ly, 1.0)
        self.lower = np.array([b[0] for b in bounds])
        self.upper = np.array([b[1] for b in bounds])
        self.fitted = _law_log_pred("saturating", fit.theta, self.lx, 1.0)
        # Seed noise of each n (log units, sd over its seeds); an n with one point borrows the others' pooled sd.
        sds = {}
        for x in np.unique(n):
            at = self.ly[n == x]
            if len(at) >= 2:
                sds[x] = float(np.std(at, ddof=1))
        pooled = math.sqrt(np.mean(np.square(list(sds.values())))) if sds else 0.0
        self.noise = np.array([sds.get(x, pooled) for x in n])
        self.mask = np.ones((1, len(n)))

    def influence(self, theta: np.ndarray, ly: np.ndarray) -> np.ndarray:
        return _sat_influence(theta, self.lx, ly, np.broadcast_to(self.mask, ly.shape), self.delta, self.onehot)

    def draw(self, rng: np.random.Generator, draws: int) -> tuple[np.ndarray, np.ndarray]:
        """(theta*, ly*) of `draws` parametric resamples of the series, refitted from the estimate."""
        ly = self.fitted[None, :] + self.noise[None, :] * rng.standard_normal((draws, len(self.lx)))
        start = np.repeat(self.theta, draws, axis=0)
        mask = np.broadcast_to(self.mask, ly.shape)
        theta, value = _sat_batch_fit(start, self.lx, ly, mask, self.delta, self.lower, self.upper)
        theta[~np.isfinite(value)] = np.nan
        return theta, ly


def _t_star_interval(
    estimate: float, se: float, t_star: np.ndarray, confidence: float, df: int
) -> tuple[float, float, float, int]:
    """(low, high, se, draws used) of the bootstrap-t interval, each side at least Student's t on df; NaN where
    too few draws studentised.

    Each side is the wider of the draws' studentised quantile and t on df (exact where the fit is linear in the
    seeds): the bootstrap world is centred on the estimate, and where the estimate sits on the flat part of the
    E-beta ridge that world is more nearly linear than the truth and its quantiles narrower than t; taken alone
    they covered the held-in E 84-88% (benchmarks/sim_coverage.py, 200 studies at 1 point of noise)."""
    t_star = t_star[np.isfinite(t_star)]
    if not (math.isfinite(estimate) and math.isfinite(se) and se > 0) or len(t_star) < 100:
        return math.nan, math.nan, se, len(t_star)
    tail = (1.0 - confidence) / 2.0
    lo_q, hi_q = np.quantile(t_star, [tail, 1.0 - tail])
    q = t_quantile(confidence, df)
    return estimate - max(hi_q, q) * se, estimate - min(lo_q, -q) * se, se, len(t_star)


def saturating_bootstrap_t(
    n,
    err,
    seeds,
    fit: LawFit,
    *,
    heldout: float | None = None,
    observed=None,
    observed_seeds=None,
    baseline: tuple | None = None,
    confidence: float = 0.95,
    draws: int = BOOT_DRAWS,
    seed: int = 0,
) -> dict[str, tuple[float, float, float, float]]:
    """Seed-level bootstrap-t intervals of the saturating law `fit` (fitted on n, err): name -> (estimate, low,
    high, se) for E, B (built on log B), beta and, with `heldout`, the prediction there. With `observed` (the
    errors at the held-out n, one per `observed_seeds`), also `check` = prediction - observed mean, whose
    interval holds 0 when the law predicts the held-out n within its noise (the prediction's own error and the
    observed mean's, paired by seed). With `baseline` = (err_baseline, fit_baseline) on the same n and seeds: the
    differences fit - baseline fit in E, B and beta instead (each draw refits both laws; seeds paired)."""
    n, err, seeds = _check_seeded(n, err, seeds)
    order = np.unique(seeds if observed_seeds is None else np.concatenate([seeds, np.asarray(observed_seeds)]))
    if len(order) < 2:
        raise ValueError("the bootstrap-t needs 2+ seeds (one seed has no seed-level noise to resample)")
    rng = np.random.default_rng(seed)
    lx_top = None if heldout is None else math.log(float(heldout) / fit.n0)
    main = _SeedDesign(n, err, seeds, fit, order)
    names = ["E", "logB", "beta"] + ([] if heldout is None else ["prediction"])

    def parts(design, theta, ly):
        """(value, per-seed influence) of each statistic for a batch of fits."""
        infl = design.influence(theta, ly)
        stats = _sat_stats(theta, fit.n0, lx_top)  # the same n, so the same n0, for a paired baseline
        return {k: (v, np.matmul(infl, g[:, :, None])[..., 0]) for k, (v, g) in stats.items()}

    est = parts(main, main.theta, main.ly[None, :])
    theta_s, ly_s = main.draw(rng, draws)
    boot = parts(main, theta_s, ly_s)
    if baseline is not None:
        err_b, fit_b = baseline
        base = _SeedDesign(n, np.asarray(err_b, dtype="float64").ravel(), seeds, fit_b, order)
        est_b = parts(base, base.theta, base.ly[None, :])
        theta_b, ly_b = base.draw(rng, draws)
        boot_b = parts(base, theta_b, ly_b)
        out = {}
        for k in ("E", "B", "beta"):
            d_hat = est[k][0] - est_b[k][0]
            se = _seed_se(est[k][1] - est_b[k][1])
            d_star = boot[k][0] - boot_b[k][0]
            se_star = _seed_se(boot[k][1] - boot_b[k][1])
            with np.errstate(all="ignore"):
                t_star = (d_star - d_hat) / se_star
            lo, hi, s, _ = _t_star_interval(float(d_hat[0]), float(se[0]), t_star, confidence, len(order) - 1)
            out[k] = (float(d_hat[0]), lo, hi, s)
        return out
    out = {}
    for k in names:
        value, infl = est[k]
        se = float(_seed_se(infl)[0])
        with np.errstate(all="ignore"):
            t_star = (boot[k][0] - value) / _seed_se(boot[k][1])
        lo, hi, s, _ = _t_star_interval(float(value[0]), se, t_star, confidence, len(order) - 1)
        if k == "logB":
            out["B"] = (math.exp(float(value[0])), math.exp(lo), math.exp(hi), s)
        else:
            out[k] = (float(value[0]), lo, hi, s)
    if heldout is not None and observed is not None and len(observed):
        obs = np.asarray(observed, dtype="float64").ravel()
        onehot = (np.asarray(observed_seeds)[:, None] == order[None, :]).astype("float64")
        pred, pred_infl = est["prediction"]
        # A seed's influence on the observed mean: (its error - the mean) / (seeds observed), on the seeds it has.
        obs_infl = ((obs - obs.mean()) / len(obs)) @ onehot
        check = float(pred[0] - obs.mean())
        se = float(_seed_se(pred_infl - obs_infl[None, :])[0])
        sd_obs = float(np.std(obs, ddof=1)) if len(obs) >= 2 else float(np.mean(main.noise)) * float(pred[0])
        obs_s = pred[0] + sd_obs * rng.standard_normal((draws, len(obs)))
        check_s = boot["prediction"][0] - obs_s.mean(axis=1)
        obs_infl_s = ((obs_s - obs_s.mean(axis=1, keepdims=True)) / len(obs)) @ onehot
        with np.errstate(all="ignore"):
            t_star = check_s / _seed_se(boot["prediction"][1] - obs_infl_s)
        lo, hi, s, _ = _t_star_interval(check, se, t_star, confidence, len(order) - 1)
        out["check"] = (check, lo, hi, s)
    return out


def chance_error(dataset: str | None, metric: str, *, mode: str = "max") -> float | None:
    """The error of a model that learned nothing (M4's eps0) for a dataset of the registry and a metric.

    1 - 1/classes for an accuracy (an error rate: 0.9 on CIFAR-10), log(classes) for a cross-entropy loss;
    None where the registry does not know the classes (imagefolder, synthetic) or the metric is neither.
    """
    from trainables.datasets import DATASETS

    spec = DATASETS.get(str(dataset)) if dataset is not None else None
    classes = getattr(spec, "num_classes", None)
    if not classes:
        return None
    if "acc" in metric and mode == "max":
        return 1.0 - 1.0 / classes
    if "loss" in metric and mode == "min":
        return math.log(classes)
    return None


def table_points(table, arch: str, method: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fraction, error, seed) points of one (arch, method) of a ScalingTable: each seed's best-of-search trial.

    The error is 1 - metric where the table maximised it (an accuracy in [0, 1]), else the metric itself (a
    loss or an error). A maximised metric above 1 is refused with the fix (a 0-100 scale)."""
    cols = table.columns
    best = table.best
    part = best[(best[cols["arch"]].astype(str) == str(arch)) & (best[cols["method"]].astype(str) == str(method))]
    part = part.dropna(subset=[table.metric])
    values = part[table.metric].astype("float64").to_numpy()
    if table.mode == "max" and len(values) and values.max() > 1.0:
        raise ValueError(
            f"{table.metric} of {arch}/{method} reaches {values.max():.4g}: a maximised metric becomes an error as "
            "1 - metric, which needs it in [0, 1]; this looks like a 0-100 (percent) scale: divide the metric by 100"
        )
    err = 1.0 - values if table.mode == "max" else values
    seeds = part[cols["seed"]].astype(str).to_numpy() if cols.get("seed") else np.zeros(len(part), dtype=str)
    return part[cols["fraction"]].astype("float64").to_numpy(), err, seeds


def law_extrapolation(
    n,
    err,
    seeds,
    *,
    forms: tuple[str, ...] = LAW_FORMS,
    heldout: float | None = None,
    confidence: float = 0.95,
    huber_delta: float | None = None,
    eps0: float | None = None,
    boot_seed: int = 0,
):
    """Fit each form on every n below the held-out one, predict the held-out n, and judge: a law checked by extrapolation.

    heldout: the n held out (default the largest; pass the design's largest fraction so that every series is
    checked at the same n, even one whose runs there all failed: its row then says so). One row per form, every
    number from the one held-in fit that makes the prediction: its parameters, the prediction, and their
    intervals (the saturating form: the seed-level bootstrap-t, `saturating_bootstrap_t`, seeded by boot_seed; the
    others: delete-one-seed jackknife, t on S - 1 df; see above), the observed mean over seeds at the held-out
    n, and the check: `check` = prediction - observed with `check_se`, the standard error of that difference
    (the prediction's own error and the observed mean's, paired by seed), `consistent` whether 0 is within the
    check's interval, pi_low / pi_high (saturating) the prediction interval of the held-out mean over its seeds
    (consistent = the observed mean inside it), `check_detectable` the misprediction found with 80% power. A form is fitted only where the held-in distinct n can pin it
    (as many as its parameters; M4 also needs eps0, the error of a model that learned nothing). attrs["verdict"]
    names a form that predicts better only where the seeds say so (the difference of the absolute held-out
    errors outside its own interval); with one fittable form, or one seed, none is named.
    """
    import pandas as pd

    _check_confidence(confidence)
    n, err, seeds = _check_seeded(n, err, seeds)
    distinct = np.unique(n)
    top = float(distinct[-1] if heldout is None else heldout)
    held_in = n < top
    inner = np.unique(n[held_in])
    if len(inner) < 3:
        raise ValueError(
            f"law_extrapolation needs at least 3 distinct n below the held-out n={top:g} (fit on 3+, hold out the "
            f"largest), got {inner.tolist()}; measure more training-set sizes"
        )
    at_top = n == top
    observed = err[at_top]
    unique_seeds = np.unique(seeds)
    n_seeds = len(unique_seeds)
    q = t_quantile(confidence, n_seeds - 1)
    rows, checks, reasons = [], {}, {}
    fittable = sum(
        len(inner) >= len(_LAW_PARAMS[f]) and not (f == "m4" and (eps0 is None or np.any(err >= eps0))) for f in forms
    )
    for form in forms:
        k = len(_LAW_PARAMS[form])
        row: dict = {
            "form": form,
            "n_seeds": n_seeds,
            "heldout_n": top,
            "observed": float(observed.mean()) if len(observed) else math.nan,
        }
        why = ""
        if len(inner) < k:
            why = f"{k} parameters need {k}+ distinct n below the held-out one; have {len(inner)}"
        elif form == "m4" and (eps0 is None or np.any(err >= eps0)):
            why = (
                "not fitted: M4 needs the error of a model that learned nothing (eps0), unknown for this metric"
                if eps0 is None
                else f"not fitted: M4 needs every error below eps0={eps0:.4g}, the error of a model that learned nothing"
            )
        if why:
            row["note"] = reasons[form] = why
            rows.append(row)
            continue
        part = fit_law(n[held_in], err[held_in], form=form, huber_delta=huber_delta, eps0=eps0)
        prediction = float(part.predict(top))
        row.update(part.params)
        row.update(prediction=prediction, huber_delta=part.huber_delta)
        if len(observed):
            row.update(check=prediction - row["observed"], abs_error=abs(prediction - row["observed"]))
        notes = [f"{', '.join(part.at_bound)} at the edge of its range"] if part.at_bound else []
        if not len(observed):
            notes.append(f"no finished run at the held-out n={top:g}: nothing to check the prediction against")
        if n_seeds >= 2:

            def refit(keep, part=part, form=form):
                f = fit_law(
                    n[held_in & keep], err[held_in & keep], form=form, huber_delta=part.huber_delta,
                    eps0=eps0, start=part.theta,
                )  # fmt: skip
                obs = err[at_top & keep]
                pred = float(f.predict(top))
                return [*f.params.values(), pred, pred - (obs.mean() if len(obs) else math.nan)]

            # The saturating form's intervals come from the bootstrap-t below; its jackknife is needed only to
            # compare it with another fitted form (_law_verdict), so it is skipped where it is fitted alone.
            alone = form == "saturating" and fittable == 1
            jack, why = ([np.zeros(len(part.params) + 2)], "") if alone else _leave_one_seed_out(seeds, refit)
            if jack and not alone:
                jack = np.asarray(jack, dtype="float64")
                names = [*part.params, "prediction"]
                for i, p in enumerate(names):
                    est = prediction if p == "prediction" else part.params[p]
                    row[f"{p}_low"], row[f"{p}_high"], _ = _t_interval(est, jack[:, i], q, p in _LOG_SCALE)
                if len(observed):
                    se = float(jackknife_se(jack[:, -1:])[0])
                    row["check_se"] = se
                    row["consistent"] = bool(abs(row["check"]) <= q * se) if math.isfinite(se) else math.nan
                    checks[form] = jack[:, -1]
            if len(jack):
                if form == "saturating":
                    # The saturating law's intervals and check: the seed-level bootstrap-t of the same held-in fit
                    # (the jackknife above stays only to compare forms, in _law_verdict).
                    boot = saturating_bootstrap_t(
                        n[held_in], err[held_in], seeds[held_in], part, heldout=top, observed=observed,
                        observed_seeds=seeds[at_top], confidence=confidence, seed=boot_seed,
                    )  # fmt: skip
                    for p in (*part.params, "prediction"):
                        row[f"{p}_low"], row[f"{p}_high"] = boot[p][1], boot[p][2]
                    if "check" in boot:
                        _, c_lo, c_hi, se = boot["check"]
                        row["check_se"] = se
                        row["consistent"] = bool(c_lo <= 0.0 <= c_hi) if math.isfinite(c_lo) else math.nan
                        # The prediction interval of the held-out mean over its seeds: the prediction's own error
                        # and the observed mean's (observed = prediction - check).
                        row["pi_low"], row["pi_high"] = prediction - c_hi, prediction - c_lo
                if "check_se" in row:
                    # What a "consistent" check rules out: the misprediction the seeds find with 80% power.
                    row["check_detectable"] = detectable(row["check_se"], n_seeds - 1, confidence=confidence)
                if n_seeds < 3:
                    notes.append(f"{n_seeds} seeds: t on 1 df, the interval is wide")
            else:
                notes.append(why)
        else:
            notes.append("1 seed: no interval, no check")
        row["note"] = "; ".join(notes)
        rows.append(row)
    frame = pd.DataFrame(rows).set_index("form")
    frame["supported"] = False
    frame.attrs["verdict"] = _law_verdict(frame, checks, reasons, q, confidence)
    winner = frame.attrs.pop("_winner", None)
    if winner is not None:
        frame.loc[winner, "supported"] = True
    return frame


def _law_verdict(frame, checks: dict, reasons: dict, q: float, confidence: float) -> str:
    """Which form predicts the held-out n better, only where the data decide; else why they cannot."""
    fitted = [f for f in frame.index if "abs_error" in frame.columns and math.isfinite(frame.loc[f, "abs_error"])]
    left_out = "; ".join(f"{f} not compared ({r})" for f, r in reasons.items())
    tail = f"; {left_out}" if left_out else ""
    if not fitted:
        return "no form was fitted and checked against the held-out n" + tail
    if len(fitted) == 1:
        f = fitted[0]
        state = {True: "consistent with", False: "misses"}.get(
            frame.loc[f].get("consistent"), "cannot be checked against"
        )
        return (
            f"only {f} could be fitted and checked: no comparison of forms; its prediction {state} the held-out n{tail}"
        )
    if len(checks) < len(fitted):
        return "one seed (or a refit that failed): no noise estimate, so no form is named better" + tail
    order = sorted(fitted, key=lambda f: frame.loc[f, "abs_error"])
    best, second = order[0], order[1]
    gap = float(frame.loc[second, "abs_error"] - frame.loc[best, "abs_error"])
    se = float(jackknife_se((np.abs(checks[second]) - np.abs(checks[best]))[:, None])[0])
    if math.isfinite(se) and gap > q * se:
        frame.attrs["_winner"] = best
        return (
            f"{best} predicts the held-out n better than {second}: its absolute error is smaller by {gap:.3g}, "
            f"outside the {confidence:.0%} interval of that difference (± {q * se:.3g}){tail}"
        )
    return (
        f"the forms' held-out errors differ by {gap:.3g}, within their noise (± {q * se:.3g} at {confidence:.0%}): "
        f"the data do not tell the forms apart{tail}"
    )


def _check_confidence(confidence: float) -> None:
    if not (isinstance(confidence, (int, float)) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}; e.g. 0.95 for a 95% interval")


def detectable(se: float, df: float, *, confidence: float = 0.95, power: float = 0.8) -> float:
    """The smallest true effect a two-sided t test at `confidence` finds with probability `power`, given its se.

    (t_{1 - alpha/2} + t_{power}) x se on df degrees of freedom: the usual closed form."""
    from scipy.stats import t

    if not (df >= 1 and math.isfinite(se)):
        return math.nan
    return float((t.ppf(0.5 + confidence / 2.0, df) + t.ppf(power, df)) * se)


def law_parameters(
    n,
    err,
    seeds,
    *,
    form: LawForm = "saturating",
    confidence: float = 0.95,
    eps0: float | None = None,
    boot_seed: int = 0,
):
    """One form fitted on every point, with each parameter's interval over seeds (the saturating form: seed-level
    bootstrap-t, `saturating_bootstrap_t`; the others: jackknife-t): param, estimate, low, high, se (on the log
    scale for B), n_seeds, note."""
    import pandas as pd

    _check_confidence(confidence)
    n, err, seeds = _check_seeded(n, err, seeds)
    fit = fit_law(n, err, form=form, eps0=eps0)
    n_seeds = len(np.unique(seeds))
    q = t_quantile(confidence, n_seeds - 1)
    sat = form == "saturating" and n_seeds >= 2  # the bootstrap-t gives its intervals: no jackknife refits
    jack, why = (
        ([None], "")
        if sat
        else _leave_one_seed_out(
            seeds,
            lambda keep: list(
                fit_law(
                    n[keep], err[keep], form=form, huber_delta=fit.huber_delta, eps0=eps0, start=fit.theta
                ).params.values()
            ),
        )
        if n_seeds >= 2
        else ([], "1 seed: no interval")
    )
    boot = saturating_bootstrap_t(n, err, seeds, fit, confidence=confidence, seed=boot_seed) if sat else {}
    rows = []
    for i, p in enumerate(fit.params):
        if p in boot:
            lo, hi, se = boot[p][1:]
        elif jack:
            lo, hi, se = _t_interval(fit.params[p], np.asarray(jack)[:, i], q, p in _LOG_SCALE)
        else:
            lo, hi, se = (math.nan,) * 3
        note = why or ("at the edge of its range" if p in fit.at_bound else "")
        rows.append(
            {"param": p, "estimate": fit.params[p], "low": lo, "high": hi, "se": se, "n_seeds": n_seeds, "note": note}
        )
    return pd.DataFrame(rows).set_index("param")


def paired_law_difference(
    n,
    err_treatment,
    err_baseline,
    seeds,
    *,
    form: LawForm = "saturating",
    confidence: float = 0.95,
    power: float = 0.8,
    huber_delta: float | None = None,
    eps0: float | None = None,
    boot_seed: int = 0,
):
    """treatment - baseline in each parameter of `form` (e.g. SAM - vanilla in beta and E), paired over seeds.

    The points are paired: point i of both arrays shares n and seed (nested fractions, seeds shared). The
    interval: for the saturating form the seed-level bootstrap-t of the difference (`saturating_bootstrap_t`
    with a baseline: each draw refits both laws, studentised by the paired seeds' influence on the difference);
    for the others the delete-one-seed jackknife of the difference (each leave-one-out refits both laws without
    the same seed), t on S - 1 df. One row per parameter: treatment, baseline, diff, diff_low, diff_high, se, p_value,
    detectable (the |diff| this design finds with `power`, from the same se: what a null result rules out),
    n_seeds, note. Needs as many distinct n as the form has parameters.
    """
    import pandas as pd

    _check_confidence(confidence)
    n, err_t, seeds = _check_seeded(n, err_treatment, seeds)
    err_b = np.asarray(err_baseline, dtype="float64").ravel()
    if len(err_b) != len(n):
        raise ValueError(f"err_baseline must pair with err_treatment point by point, got {len(err_b)} and {len(err_t)}")
    k = len(_LAW_PARAMS.get(form, ()))
    if len(np.unique(n)) < k + 1:
        raise ValueError(
            f"paired_law_difference: the {form} form has {k} parameters; comparing two laws needs {k + 1}+ distinct n "
            f"(one more than it takes to pass through the means exactly), got {len(np.unique(n))}: measure more n"
        )
    ft = fit_law(n, err_t, form=form, huber_delta=huber_delta, eps0=eps0)
    fb = fit_law(n, err_b, form=form, huber_delta=huber_delta, eps0=eps0)
    n_seeds = len(np.unique(seeds))
    q = t_quantile(confidence, n_seeds - 1)

    def refit(keep):
        t = fit_law(n[keep], err_t[keep], form=form, huber_delta=ft.huber_delta, eps0=eps0, start=ft.theta)
        b = fit_law(n[keep], err_b[keep], form=form, huber_delta=fb.huber_delta, eps0=eps0, start=fb.theta)
        return [t.params[p] - b.params[p] for p in ft.params]

    sat = form == "saturating" and n_seeds >= 2  # the bootstrap-t gives its intervals: no jackknife refits
    if sat:
        jack, why = [None], ""
    else:
        jack, why = _leave_one_seed_out(seeds, refit) if n_seeds >= 2 else ([], "1 seed: no interval")
    boot = (
        saturating_bootstrap_t(n, err_t, seeds, ft, baseline=(err_b, fb), confidence=confidence, seed=boot_seed)
        if sat
        else {}
    )
    from scipy.stats import t as student

    out = []
    for i, p in enumerate(ft.params):
        diff = ft.params[p] - fb.params[p]
        if p in boot:
            lo, hi, se = boot[p][1:]
        elif jack:
            lo, hi, se = _t_interval(diff, np.asarray(jack)[:, i], q, False)
        else:
            lo, hi, se = (math.nan,) * 3
        pval = float(2 * student.sf(abs(diff) / se, n_seeds - 1)) if jack and se > 0 else math.nan
        mde = detectable(se, n_seeds - 1, confidence=confidence, power=power) if jack else math.nan
        note = why
        if jack and lo <= 0 <= hi:
            note = f"no difference detected: a true |diff| of {mde:.3g} or more would be found with {power:.0%} power"
        bounded = [name for name, f in (("treatment", ft), ("baseline", fb)) if p in f.at_bound]
        if bounded:
            note = "; ".join(filter(None, [note, f"{p} at the edge of its range in the {' and '.join(bounded)} fit"]))
        out.append(
            {
                "param": p,
                "treatment": ft.params[p],
                "baseline": fb.params[p],
                "diff": diff,
                "diff_low": lo,
                "diff_high": hi,
                "se": se,
                "p_value": pval,
                "detectable": mde,
                "n_seeds": n_seeds,
                "note": note,
            }
        )
    return pd.DataFrame(out).set_index("param")
