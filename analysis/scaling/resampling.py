"""The seed-level parametric bootstrap-t of the saturating law: its parameters, a held-out prediction, differences."""

from __future__ import annotations

import math

import numpy as np

from analysis.scaling.inference import _check_seeded, t_quantile
from analysis.scaling.laws import _LOG_FLOOR, LawFit, _huber, _law_log_pred, _law_starts

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
            with np.errstate(over="ignore"):  # a bound of log B past ~709 (a flat curve's beta at its edge) is inf
                b, b_lo, b_hi = (float(np.exp(v)) for v in (float(value[0]), lo, hi))
            if not (math.isfinite(b_lo) and math.isfinite(b_hi)):  # not identified: no interval, not [x, inf]
                b_lo = b_hi = math.nan
            out["B"] = (b, b_lo, b_hi, s)
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
