"""Tests and intervals over seeds: Student-t quantiles, the paired t, power by quadrature, the delete-one-seed jackknife."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


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

#: What every seed-level interval conditions on: it resamples seeds only, so the test images the runs were scored
#: on and the training subset (`data.fraction_seed`) are held fixed. A report prints it beside such intervals;
#: docs/science.md measures their coverage of the population quantity with the test set's noise added.
CONDITIONS = (
    "over seeds, given the test images the runs were scored on and the training subset (data.fraction_seed): "
    "another test set or subset would move every run of a cell together, which no interval here includes"
)


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
        # Off a flat curve log B's leave-one-out values spread past exp's range: not identified, no interval (an
        # OverflowError here once stopped a whole report).
        if not (math.isfinite(se) and q * se < 700.0):
            return math.nan, math.nan, se
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


def _check_confidence(confidence: float) -> None:
    if not (isinstance(confidence, (int, float)) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}; e.g. 0.95 for a 95% interval")


def power_t(effect: float, se: float, df: float, *, alpha: float = 0.05) -> float:
    """Power of the two-sided t test at level alpha on df degrees of freedom against a true effect, given the
    estimate's standard error: P(|T| > t_crit) for T noncentral t(df, effect / se).

    By quadrature over the normal part: |T| > c exactly when the variance's chi-square V < df (Z + delta)^2 / c^2,
    so the power is the integral of phi(z) F_chi2(df (z + delta)^2 / c^2) over z, split at z = -delta where the
    integrand is smallest (adaptive quadrature on |z| <= 12, exact to ~1e-9 for df 1-50). Not scipy's nct, which returns NaN
    far in its tail (df 2, noncentrality above ~10), a value the old `_mde` read as power 1 and so reported
    effects 10-25% too small at 3 seeds."""
    from scipy.integrate import quad
    from scipy.stats import chi2, norm, t

    if not (df >= 1 and math.isfinite(se) and se > 0 and math.isfinite(effect)):
        return math.nan
    crit = float(t.ppf(1.0 - alpha / 2.0, df))
    delta = abs(effect) / se

    def integrand(z):
        return norm.pdf(z) * chi2.cdf(df * (z + delta) ** 2 / crit**2, df)

    # The normal's mass beyond 12 sds is below 1e-32: a finite range, broken where the integrand is smallest.
    edges = sorted({-12.0, 12.0, *([-delta] if delta < 12.0 else [])})
    total = sum(quad(integrand, lo, hi, epsabs=1e-12, limit=200)[0] for lo, hi in zip(edges, edges[1:]))
    return float(min(max(total, 0.0), 1.0))


def detectable(se: float, df: float, *, confidence: float = 0.95, power: float = 0.8, family: int = 1) -> float:
    """The smallest true effect the two-sided t test at level (1 - confidence) / family finds with `power`, given
    the estimate's standard error: the root of `power_t`. The one home of a "detectable effect" (design.py's
    statements before a run, the report's power notes); NaN where no test exists (df < 1, se not finite)."""
    from scipy.optimize import brentq

    if not (df >= 1 and math.isfinite(se) and se > 0):
        return math.nan
    if not (0.0 < power < 1.0 and family >= 1):
        raise ValueError(f"power must be in (0, 1) and family >= 1, got power={power!r}, family={family!r}")
    alpha = (1.0 - confidence) / family
    hi = 1.0
    while power_t(hi, 1.0, df, alpha=alpha) < power:  # power rises monotonically with the effect
        hi *= 2.0
    return float(brentq(lambda e: power_t(e, 1.0, df, alpha=alpha) - power, 0.0, hi, xtol=1e-10) * se)


@dataclass(frozen=True)
class TTest:
    """A paired (one-sample) t test on differences: mean, se, interval at `confidence` (and at the family's level,
    Bonferroni over `family`), two-sided p-value, df and the number of pairs. NaN where fewer than 2 pairs."""

    mean: float
    se: float
    low: float
    high: float
    band_low: float
    band_high: float
    p_value: float
    df: int
    n: int


def paired_t(diffs, *, confidence: float = 0.95, family: int = 1) -> TTest:
    """The paired t test on the differences `diffs` (treatment - baseline per seed): the one home of the paired
    t in analysis/ (sam_gain, compute_matched_gains). A zero spread with a nonzero mean gives p = 0 (every pair
    agrees), with a zero mean p = 1."""
    from scipy.stats import t as student

    d = np.asarray(diffs, dtype="float64").ravel()
    d = d[np.isfinite(d)]
    k = len(d)
    mean = float(d.mean()) if k else math.nan
    if k < 2:
        return TTest(mean, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, max(k - 1, 0), k)
    se = float(d.std(ddof=1) / math.sqrt(k))
    q = float(student.ppf(0.5 + confidence / 2.0, k - 1))
    qb = float(student.ppf(1.0 - (1.0 - confidence) / (2.0 * family), k - 1))
    pval = float(2 * student.sf(abs(mean) / se, k - 1)) if se > 0 else (0.0 if mean != 0 else 1.0)
    return TTest(mean, se, mean - q * se, mean + q * se, mean - qb * se, mean + qb * se, pval, k - 1, k)


def tost(estimate: float, se: float, df: float, margin: float, *, alpha: float = 0.05) -> float:
    """p-value of the two one-sided tests (TOST) that the true effect lies within +-margin: equivalence is shown
    at level alpha when it is below alpha, i.e. when the (1 - 2 alpha) t interval lies inside (-margin, margin).
    How a report says "no effect as large as margin", instead of a post-hoc power statement."""
    from scipy.stats import t as student

    if not (df >= 1 and math.isfinite(se) and se > 0 and margin > 0 and math.isfinite(estimate)):
        return math.nan
    lower = student.sf((estimate + margin) / se, df)
    upper = student.cdf((estimate - margin) / se, df)
    return float(max(lower, upper))
