"""Power laws err(n) = a n^-b + c with seed-level intervals, and the data multiplier read off two of them."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Literal, Mapping

import numpy as np

from analysis.scaling.inference import _leave_one_seed_out, _t_interval, jackknife_se, t_quantile


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
# --power-laws` on the shipped data_scaling design (docs/science.md, "Power-law fits and the data multiplier": 150
# simulated studies a row, the reference law at the study's 5 fractions 0.05-1.0, 0.5 points of seed noise of which
# 0 or 50% is a seed's offset shared by its fractions; the one-seed line from the earlier five-fraction design).
# Each interval's note quotes its line, so that no report claims the nominal level for an interval that did not
# reach it; all of them hold the scored test images fixed (`analysis.scaling.CONDITIONS`).
POWER_LAW_COVERAGE = {
    "seeds": (
        "a 95% interval covered 92.7-98.0% in simulation of the shipped design (3-5 seeds, given the scored test "
        "images: docs/science.md)"
    ),
    "points": (
        "a 95% interval covered 88.0-96.7% (a, b, c) and 79.3-94.7% (the data multiplier) in simulation over the "
        "points of 3-5 seeds, shorter the more a seed's points share (docs/science.md)"
    ),
    "one seed": (
        "a bootstrap over its points covered 59-85% (a, b, c) and 23-82% (the data multiplier) at nominal 95% in "
        "simulation, the less the more its points share (docs/science.md)"
    ),
}


def _interval_note(kind: str, n_seeds: int, n_boot: int) -> str:
    """What fit_power_law's intervals are, what they ignore and their coverage in simulation."""
    if n_boot == 0:
        return "no interval (n_boot=0)"
    if kind == "seeds":
        return (
            f"delete-one-seed jackknife over {n_seeds} seeds, Student's t on {n_seeds - 1} df; "
            + POWER_LAW_COVERAGE["seeds"]
        )
    if kind == "none":
        # As the law fits: one seed's offset, shared by all its points, is invisible to any resampling of them.
        return (
            "no interval: the points come from 1 seed, whose offset (shared by all its points) no resampling of them "
            "can see; " + POWER_LAW_COVERAGE["one seed"] + ". Fix: run 2+ seeds (3-5 for intervals that cover)"
        )
    return (
        "residual bootstrap over points: treats every point as independent, though the points of one seed are "
        "correlated; " + POWER_LAW_COVERAGE["points"] + "; pass seeds for a seed-level interval"
    )


def _refit(x: np.ndarray, y: np.ndarray, start: tuple[float, float, float]) -> tuple[float, float, float]:
    # Start from the point estimate: a resample is a small perturbation of it; the grid is the fallback.
    p, converged = _polish(x, y, start)
    return p if converged else _fit(x, y)


def _seed_intervals(x, err, seeds, n0: float, est: tuple, confidence: float):
    """(samples, sample_seeds, intervals, why not) of the delete-one-seed jackknife-t of (a, b, c)."""
    nan_pair = (math.nan, math.nan)
    intervals = {"a": nan_pair, "b": nan_pair, "c": nan_pair}

    def leave_out(keep):
        xs, ys = _as_points(x[keep], err[keep])
        p = _refit(xs, ys, est)
        return [p[0] * n0 ** p[1], p[1], p[2]]

    jack, why = _leave_one_seed_out(seeds, leave_out)
    if not jack:
        return np.empty((0, 3)), np.empty(0), intervals, why
    samples = np.asarray(jack, dtype="float64")
    q = t_quantile(confidence, len(np.unique(seeds)) - 1)
    scaled = (est[0] * n0 ** est[1], est[1], est[2])
    for i, name in enumerate("abc"):
        # a is positive and multiplicative (B of the saturating law, on the log scale there too).
        lo, hi, _ = _t_interval(scaled[i], samples[:, i], q, name == "a" and scaled[i] > 0)
        intervals[name] = (max(lo, 0.0) if name == "c" else lo, hi)
    return samples, np.unique(seeds), intervals, ""


def _residual_intervals(x, err, resid, n0: float, est: tuple, n_boot: int, seed: int, confidence: float):
    """(samples, intervals) of the residual bootstrap over points, the residuals inflated for 3 parameters."""
    N = len(x)
    fitted = err - resid
    scaled = (resid - resid.mean()) * math.sqrt(N / (N - 3))
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_boot):
        star = np.clip(fitted + rng.choice(scaled, size=N, replace=True), 0.0, None)
        p = _refit(x, star, est)
        rows.append((p[0] * n0 ** p[1], p[1], p[2]))
    samples = np.asarray(rows)
    tail = (1.0 - confidence) / 2.0
    lo = np.quantile(samples, tail, axis=0)
    hi = np.quantile(samples, 1.0 - tail, axis=0)
    return samples, {name: (float(lo[i]), float(hi[i])) for i, name in enumerate("abc")}


def _floor_note(err: np.ndarray, distinct: int, c_interval: tuple[float, float], confidence: float) -> str:
    """Why the floor c is not identified ("" where it is)."""
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
    c_lo, c_hi = c_interval
    if distinct >= 4 and math.isfinite(c_lo) and plausible > 0 and (c_hi - c_lo) > _FLOOR_SPAN * plausible:
        notes.append(
            f"the fit is insensitive to the floor: c's {confidence:.0%} interval [{c_lo:.4g}, {c_hi:.4g}] spans more than "
            f"{_FLOOR_SPAN:.0%} of its plausible range [0, {plausible:.4g}] (the smallest error); the curve has not "
            "flattened within the measured n: add larger n or report b with c fixed"
        )
    return "; ".join(notes)


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
    resid = err - _model(x, a_s, b, c)
    n_seeds = 0 if seeds is None else len(np.unique(seeds))
    kind = "seeds" if n_seeds >= 2 else "none" if n_seeds == 1 else "residuals"
    interval_note = _interval_note(kind, n_seeds, n_boot)
    nan_pair = (math.nan, math.nan)
    intervals = {"a": nan_pair, "b": nan_pair, "c": nan_pair}
    samples, sample_seeds = np.empty((0, 3)), np.empty(0)
    if n_boot > 0 and kind == "seeds":
        samples, sample_seeds, intervals, why = _seed_intervals(x, err, seeds, n0, (a_s, b, c), confidence)
        interval_note = why or interval_note
    elif n_boot > 0 and len(n) > 3 and kind == "residuals":
        samples, intervals = _residual_intervals(x, err, resid, n0, (a_s, b, c), n_boot, seed, confidence)
    a = a_s * n0**b
    distinct = int(len(np.unique(n)))
    note = _floor_note(err, distinct, intervals["c"], confidence)
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
        rmse=float(np.sqrt(np.mean(resid**2))),
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
