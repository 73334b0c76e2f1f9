"""Laws checked by extrapolation (fit below the held-out n, predict it), parameters over seeds, paired differences."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.scaling.inference import (
    _LOG_SCALE,
    CONDITIONS,
    _check_confidence,
    _check_seeded,
    _leave_one_seed_out,
    _t_interval,
    jackknife_se,
    t_quantile,
)
from analysis.scaling.laws import _LAW_PARAMS, LAW_FORMS, LawForm, default_form, fit_law
from analysis.scaling.resampling import saturating_bootstrap_t


def table_points(table, arch: str, method: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fraction, error, seed) points of one (arch, method) of a ScalingTable: each seed's best-of-search trial.

    The error is 1 - metric where the table maximised it (an accuracy in [0, 1]), else the metric itself (a
    loss or an error). A maximised metric above 1 is refused with the fix (a 0-100 scale)."""
    cols = table.columns
    part = _series_rows(table, arch, method)
    values = part[table.metric].astype("float64").to_numpy()
    if table.mode == "max" and len(values) and values.max() > 1.0:
        raise ValueError(
            f"{table.metric} of {arch}/{method} reaches {values.max():.4g}: a maximised metric becomes an error as "
            "1 - metric, which needs it in [0, 1]; this looks like a 0-100 (percent) scale: divide the metric by 100"
        )
    err = 1.0 - values if table.mode == "max" else values
    seeds = part[cols["seed"]].astype(str).to_numpy() if cols.get("seed") else np.zeros(len(part), dtype=str)
    return part[cols["fraction"]].astype("float64").to_numpy(), err, seeds


def _series_rows(table, arch: str, method: str):
    """The best-trial rows of one (arch, method) of a ScalingTable that have a value: table_points' points."""
    cols, best = table.columns, table.best
    part = best[(best[cols["arch"]].astype(str) == str(arch)) & (best[cols["method"]].astype(str) == str(method))]
    return part.dropna(subset=[table.metric])


def table_scored(table, arch: str, method: str) -> list | None:
    """Each table_points point's per-image correctness record (load_runs' SCORED_COLUMN), in the same order, for
    law_extrapolation's and paired_law_difference's `scored`; None where the table's runs carry none or its metric
    is minimised (a record scores the accuracy, 1 - error)."""
    from analysis.runs import SCORED_COLUMN

    if table.mode != "max" or SCORED_COLUMN not in table.best.columns:
        return None
    return _series_rows(table, arch, method)[SCORED_COLUMN].tolist()


@dataclass(frozen=True)
class _Split:
    """One series split for the extrapolation check: fit on every n below `top`, check at `top`."""

    n: np.ndarray
    err: np.ndarray
    seeds: np.ndarray
    top: float
    inner: np.ndarray
    eps0: float | None
    huber_delta: float | None
    confidence: float
    boot_seed: int
    correct: np.ndarray | None = None  # (points, images) per-image correctness, or None: seeds alone

    @property
    def held_in(self) -> np.ndarray:
        return self.n < self.top

    @property
    def at_top(self) -> np.ndarray:
        return self.n == self.top

    @property
    def observed(self) -> np.ndarray:
        return self.err[self.at_top]

    @property
    def n_seeds(self) -> int:
        return len(np.unique(self.seeds))

    def unfittable(self, form: str) -> str:
        """Why `form` cannot be fitted on the held-in points ("" where it can)."""
        k = len(_LAW_PARAMS[form])
        if len(self.inner) < k:
            return f"{k} parameters need {k}+ distinct n below the held-out one; have {len(self.inner)}"
        if form == "m4" and self.eps0 is None:
            return "not fitted: M4 needs the error of a model that learned nothing (eps0), unknown for this metric"
        if form == "m4" and np.any(self.err >= self.eps0):
            return f"not fitted: M4 needs every error below eps0={self.eps0:.4g}, the error of a model that learned nothing"
        return ""


def unphysical(params: dict) -> list[str]:
    """Notes for estimates no error curve can have: a negative floor E (the saturating form lets E go below 0 so
    that its interval is not cut at a bound; an estimate there says the points do not pin the floor)."""
    E = params.get("E", 0.0)
    if E < 0:
        return [
            f"E = {E:.3g} < 0 is unphysical (an error floor cannot be negative): the points do not pin the floor; "
            "read E's interval, and measure larger n"
        ]
    return []


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
    scored=None,
):
    """Fit each form on every n below the held-out one, predict the held-out n, and judge: a law checked by extrapolation.

    heldout: the n held out (default the largest; pass the design's largest fraction so that every series is
    checked at the same n, even one whose runs there all failed: its row then says so). One row per form, every
    number from the one held-in fit that makes the prediction: its parameters, the prediction, and their
    intervals (the saturating form: the seed-level bootstrap-t, `saturating_bootstrap_t`, seeded by boot_seed; the
    others: delete-one-seed jackknife, t on S - 1 df; see above), the observed mean over seeds at the held-out
    n, and the check: `check` = prediction - observed with `check_se`, the standard error of that difference
    (the prediction's own error and the observed mean's, paired by seed), check_low / check_high its interval
    (the mispredictions the data do not exclude: absence of a misprediction is told by this interval, not by
    post-hoc power), `consistent` whether 0 is within it; pi_low / pi_high (saturating) the prediction interval
    of the held-out mean over its seeds, centred on the prediction (the observed mean lies inside it exactly
    when `consistent`). A form is fitted only where the held-in distinct n can pin it (as many as its
    parameters; M4 also needs eps0, the error of a model that learned nothing). attrs["verdict"] names a form
    that predicts better only where the seeds say so (the difference of the absolute held-out errors outside its
    own interval); with one fittable form, or one seed, none is named.

    scored: each point's per-image correctness record (trainables.scored.ScoredImages.to_text, `table_scored`),
    or None. Where every point has one, of the same images and of the accuracy 1 - err, the intervals of E, B,
    beta, the prediction and the check (and so pi and `consistent`) are over seeds and test images jointly
    (`_image_intervals`); `interval over` says which each row's are, attrs["conditions"] what they condition on.
    """
    import pandas as pd

    from analysis.images import interval_conditions

    _check_confidence(confidence)
    n, err, seeds = _check_seeded(n, err, seeds)
    correct = _scored_points(scored, err)
    top = float(np.unique(n)[-1] if heldout is None else heldout)
    inner = np.unique(n[n < top])
    if len(inner) < 3:
        raise ValueError(
            f"law_extrapolation needs at least 3 distinct n below the held-out n={top:g} (fit on 3+, hold out the "
            f"largest), got {inner.tolist()}; measure more training-set sizes"
        )
    split = _Split(n, err, seeds, top, inner, eps0, huber_delta, confidence, boot_seed, correct)
    fittable = sum(not split.unfittable(f) for f in forms)
    rows, checks, reasons = [], {}, {}
    for form in forms:
        row, jack = _form_row(split, form, alone=fittable == 1)
        if split.unfittable(form):
            reasons[form] = row["note"]
        if jack is not None:
            checks[form] = jack
        rows.append(row)
    frame = pd.DataFrame(rows).set_index("form")
    frame["supported"] = False
    # A caller that passed no records is told the seed-level conditions; one that did, which rows used them.
    over = frame["interval over"] if scored is not None and "interval over" in frame else None
    frame.attrs["conditions"] = CONDITIONS if over is None else interval_conditions(over)
    frame.attrs["verdict"] = _law_verdict(frame, checks, reasons, t_quantile(confidence, split.n_seeds - 1), confidence)
    winner = frame.attrs.pop("_winner", None)
    if winner is not None:
        frame.loc[winner, "supported"] = True
    return frame


def _form_row(split: _Split, form: str, *, alone: bool) -> tuple[dict, np.ndarray | None]:
    """One form's row of law_extrapolation and its jackknifed check (None where there is none)."""
    observed = split.observed
    row: dict = {
        "form": form,
        "n_seeds": split.n_seeds,
        "heldout_n": split.top,
        "observed": float(observed.mean()) if len(observed) else math.nan,
    }
    why = split.unfittable(form)
    if why:
        row["note"] = why
        return row, None
    held_in = split.held_in
    part = fit_law(split.n[held_in], split.err[held_in], form=form, huber_delta=split.huber_delta, eps0=split.eps0)
    prediction = float(part.predict(split.top))
    row.update(part.params)
    row.update(prediction=prediction, huber_delta=part.huber_delta)
    if len(observed):
        row.update(check=prediction - row["observed"], abs_error=abs(prediction - row["observed"]))
    notes = []
    loose = part.unidentified(split.n[held_in])
    if loose:
        notes.append(f"{', '.join(loose)} not identified (at the edge of its range, or the fitted curve is flat)")
    notes += unphysical(part.params)
    if not len(observed):
        notes.append(f"no finished run at the held-out n={split.top:g}: nothing to check the prediction against")
    jack = None
    if split.n_seeds < 2:
        notes.append("1 seed: no interval, no check")
    else:
        # The saturating form's intervals come from the bootstrap-t; its jackknife is needed only to compare it
        # with another fitted form (_law_verdict), so it is skipped where it is fitted alone.
        if not (form == "saturating" and alone):
            jack, why = _jackknife_row(split, form, part, prediction, row)
            if why:
                notes.append(why)
        if form == "saturating":
            _bootstrap_row(split, part, prediction, row)
        _image_intervals(split, part, prediction, row)
        if split.n_seeds < 3:
            notes.append(f"{split.n_seeds} seeds: t on 1 df, the interval is wide")
    row["note"] = "; ".join(notes)
    return row, jack


def _jackknife_row(split: _Split, form: str, part, prediction: float, row: dict) -> tuple[np.ndarray | None, str]:
    """Delete-one-seed jackknife-t intervals of one held-in fit into `row`; (the check's leave-one-out values, why
    not)."""
    held_in, at_top, n, err, seeds = split.held_in, split.at_top, split.n, split.err, split.seeds

    def refit(keep):
        f = fit_law(
            n[held_in & keep], err[held_in & keep], form=form, huber_delta=part.huber_delta,
            eps0=split.eps0, start=part.theta,
        )  # fmt: skip
        obs = err[at_top & keep]
        pred = float(f.predict(split.top))
        return [*f.params.values(), pred, pred - (obs.mean() if len(obs) else math.nan)]

    jack, why = _leave_one_seed_out(seeds, refit)
    if not jack:
        return None, why
    jack = np.asarray(jack, dtype="float64")
    q = t_quantile(split.confidence, split.n_seeds - 1)
    seed_se = row.setdefault("_seed_se", {})
    for i, p in enumerate([*part.params, "prediction"]):
        est = prediction if p == "prediction" else part.params[p]
        row[f"{p}_low"], row[f"{p}_high"], seed_se[p] = _t_interval(est, jack[:, i], q, p in _LOG_SCALE)
    if not len(split.observed):
        return None, ""
    se = float(jackknife_se(jack[:, -1:])[0])
    row.update(check_se=se, check_low=row["check"] - q * se, check_high=row["check"] + q * se)
    row["consistent"] = bool(abs(row["check"]) <= q * se) if math.isfinite(se) else math.nan
    return jack[:, -1], ""


def _bootstrap_row(split: _Split, part, prediction: float, row: dict) -> None:
    """The saturating law's intervals and check into `row`: the seed-level bootstrap-t of the held-in fit."""
    held_in, at_top = split.held_in, split.at_top
    boot = saturating_bootstrap_t(
        split.n[held_in], split.err[held_in], split.seeds[held_in], part, heldout=split.top,
        observed=split.observed, observed_seeds=split.seeds[at_top], confidence=split.confidence,
        seed=split.boot_seed,
    )  # fmt: skip
    seed_se = row.setdefault("_seed_se", {})  # B's on the log scale its interval is built on
    for p in (*part.params, "prediction"):
        row[f"{p}_low"], row[f"{p}_high"], seed_se[p] = boot[p][1], boot[p][2], boot[p][3]
    if "check" not in boot:
        return
    check, c_lo, c_hi, se = boot["check"]
    row.update(check_se=se, check_low=c_lo, check_high=c_hi)
    row["consistent"] = bool(c_lo <= 0.0 <= c_hi) if math.isfinite(c_lo) else math.nan
    # The held-out mean's prediction interval: the pivot (check - 0) / se under a law that predicts right lies
    # between the bootstrap-t's quantiles, so observed = prediction - check lies within the prediction minus
    # those same widths: [prediction - (check - c_lo), prediction + (c_hi - check)], centred on the prediction.
    row["pi_low"], row["pi_high"] = prediction - (check - c_lo), prediction + (c_hi - check)


def _scored_points(scored, err: np.ndarray) -> np.ndarray | None:
    """The points' (points, images) correctness from their records (analysis.images.scored_matrix against the
    accuracy 1 - err); None where there are none, or they cannot stand for these points (seeds alone then)."""
    if scored is None:
        return None
    from analysis.images import scored_matrix

    texts = list(scored)
    if len(texts) != len(err):
        raise ValueError(f"scored must hold one record per point (or None), got {len(texts)} for {len(err)} points")
    matrix, _ = scored_matrix(texts, (1.0 - err).tolist())
    return matrix


def _image_intervals(split: _Split, part, prediction: float, row: dict) -> None:
    """Widen `row`'s seed-level intervals of the held-in fit (E, B, beta, the prediction) and of the check by the
    test images' variance (analysis.images.with_images), where the points carry per-image records; the row's
    `interval over` says which. The check's image part pairs the prediction's held-in runs with the held-out
    runs, all scored on the same images: images hard at every fraction move both and cancel."""
    from analysis.images import IMAGE_OVER, SEED_OVER, linear_image_variance, with_images
    from analysis.scaling.sensitivity import law_statistic, point_gradient

    seed_se = row.pop("_seed_se", {})
    row["interval over"] = SEED_OVER
    if split.correct is None or not seed_se:
        return
    held_in, at_top, df = split.held_in, split.at_top, split.n_seeds - 1
    n_in, err_in = split.n[held_in], split.err[held_in]
    shares = []
    for p in (*part.params, "prediction"):
        log = p in _LOG_SCALE
        stat = law_statistic(part, p, heldout=split.top)
        if log:  # B, n_break: their intervals (and so the image part) are on the log scale
            stat = (lambda f: lambda th: math.log(f(th)))(stat)
        g = point_gradient(part, n_in, err_in, stat)
        v = linear_image_variance(split.correct[held_in], g, split.seeds[held_in])
        est = prediction if p == "prediction" else part.params[p]
        low, high = row.get(f"{p}_low", math.nan), row.get(f"{p}_high", math.nan)
        lo, hi, _, share = with_images(est, low, high, seed_se.get(p, math.nan), v, df, confidence=split.confidence,
                                       log=log)  # fmt: skip
        row[f"{p}_low"], row[f"{p}_high"] = lo, hi
        shares.append(share)
    if math.isfinite(row.get("check_low", math.nan)):
        g = point_gradient(part, n_in, err_in, law_statistic(part, "prediction", heldout=split.top))
        rows = held_in | at_top
        grad = np.where(held_in, 0.0, -1.0 / at_top.sum())
        grad[held_in] = g
        v = linear_image_variance(split.correct[rows], grad[rows], split.seeds[rows])
        check = row["check"]
        c_lo, c_hi, se, share = with_images(check, row["check_low"], row["check_high"], row["check_se"], v, df,
                                            confidence=split.confidence)  # fmt: skip
        row.update(check_se=se, check_low=c_lo, check_high=c_hi, consistent=bool(c_lo <= 0.0 <= c_hi))
        if "pi_low" in row:  # as _bootstrap_row: the check's widths about the prediction
            row["pi_low"], row["pi_high"] = prediction - (check - c_lo), prediction + (c_hi - check)
        shares.append(share)
    if any(s > 0 for s in shares):
        row["interval over"] = IMAGE_OVER
        row["image share"] = shares[-1]


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


def law_parameters(
    n,
    err,
    seeds,
    *,
    form: LawForm | None = None,
    confidence: float = 0.95,
    eps0: float | None = None,
    boot_seed: int = 0,
):
    """One form fitted on every point, with each parameter's interval over seeds (the saturating form: seed-level
    bootstrap-t, `saturating_bootstrap_t`; the others: jackknife-t): param, estimate, low, high, se (on the log
    scale for B), n_seeds, note. A parameter the points do not pin down (`LawFit.unidentified`) has no interval;
    a negative E says it is unphysical (`unphysical`). form None: `default_form` (M4 where eps0 is known and 5+
    distinct n hold it, else saturating); attrs["form"] names the one fitted."""
    import pandas as pd

    _check_confidence(confidence)
    n, err, seeds = _check_seeded(n, err, seeds)
    form = default_form(eps0, len(np.unique(n))) if form is None else form
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
    loose = fit.unidentified(n)
    rows = []
    for i, p in enumerate(fit.params):
        if p in boot:
            lo, hi, se = boot[p][1:]
        elif jack:
            lo, hi, se = _t_interval(fit.params[p], np.asarray(jack)[:, i], q, p in _LOG_SCALE)
        else:
            lo, hi, se = (math.nan,) * 3
        if p in loose:  # an edge or a ridge point: no interval means anything there
            lo = hi = se = math.nan
        note = why or (
            "not identified (at the edge of its range, or off a flat curve): no interval" if p in loose else ""
        )
        note = "; ".join(filter(None, [note, *(unphysical({p: fit.params[p]}) if p == "E" else [])]))
        rows.append(
            {"param": p, "estimate": fit.params[p], "low": lo, "high": hi, "se": se, "n_seeds": n_seeds, "note": note}
        )
    out = pd.DataFrame(rows).set_index("param")
    out.attrs["conditions"] = CONDITIONS
    out.attrs["form"] = form
    return out


def _difference_row(p: str, ft, fb, n: np.ndarray, interval: tuple, n_seeds: int, why: str, share: float = 0.0) -> dict:
    """One parameter's row of paired_law_difference: the difference, its interval and p-value where identified
    (share: the test images' share of its variance, which sets the p-value's reference: analysis.images)."""
    from scipy.stats import t as student

    from analysis.images import crossed_p

    lo, hi, se = interval
    diff = ft.params[p] - fb.params[p]
    loose = [name for name, f in (("treatment", ft), ("baseline", fb)) if p in f.unidentified(n)]
    note = why
    if loose:
        lo = hi = se = math.nan
        note = (
            f"not identified: {p} is at the edge of its range or off a flat curve in the {' and '.join(loose)} fit, "
            "so no interval or test (measure where the curve bends, or compare E alone)"
        )
    pval = float(2 * student.sf(abs(diff) / se, n_seeds - 1)) if math.isfinite(se) and se > 0 else math.nan
    if share > 0 and math.isfinite(pval):
        pval = crossed_p(diff / se, n_seeds - 1, share)
    if not loose and math.isfinite(lo) and lo <= 0 <= hi:
        note = f"no difference detected; the interval excludes differences below {lo:.3g} and above {hi:.3g}"
    return {
        "param": p,
        "treatment": ft.params[p],
        "baseline": fb.params[p],
        "diff": diff,
        "diff_low": lo,
        "diff_high": hi,
        "se": se,
        "p_value": pval,
        "identified": not loose,
        "n_seeds": n_seeds,
        "note": note,
    }


def _difference_images(ft, fb, n, err_t, err_b, seeds, correct, interval: tuple, p: str, df: int, confidence):
    """(low, high, se, share) of one parameter's difference with the test images' variance added (both arms'
    runs scored on the same images, so the images both find hard cancel); `interval` unchanged where no records."""
    from analysis.images import linear_image_variance, with_images
    from analysis.scaling.sensitivity import law_statistic, point_gradient

    lo, hi, se = interval
    if correct is None:
        return lo, hi, se, 0.0
    g = np.concatenate(
        [point_gradient(ft, n, err_t, law_statistic(ft, p)), -point_gradient(fb, n, err_b, law_statistic(fb, p))]
    )
    v = linear_image_variance(correct, g, np.concatenate([seeds, seeds]))
    return with_images(ft.params[p] - fb.params[p], lo, hi, se, v, df, confidence=confidence)


def paired_law_difference(
    n,
    err_treatment,
    err_baseline,
    seeds,
    *,
    form: LawForm | None = None,
    confidence: float = 0.95,
    power: float = 0.8,
    huber_delta: float | None = None,
    eps0: float | None = None,
    boot_seed: int = 0,
    scored_treatment=None,
    scored_baseline=None,
):
    """treatment - baseline in each parameter of `form` (e.g. SAM - vanilla in beta and E), paired over seeds.

    The points are paired: point i of both arrays shares n and seed (nested fractions, seeds shared). The
    interval: for the saturating form the seed-level bootstrap-t of the difference (`saturating_bootstrap_t`
    with a baseline: each draw refits both laws, studentised by the paired seeds' influence on the difference);
    for the others the delete-one-seed jackknife of the difference (each leave-one-out refits both laws without
    the same seed), t on S - 1 df. One row per parameter: treatment, baseline, diff, diff_low, diff_high, se, p_value,
    identified, n_seeds, note. A parameter either fit does not pin down (`LawFit.unidentified`: at a bound, or B
    and beta of a flat or one-point curve) is `identified` False with no interval and no p-value: its "difference"
    is between two edges. Where the interval holds 0 the note says what it excludes (absence told by the
    interval, not by post-hoc power; `power` is accepted for old callers and unused). Needs one more distinct n
    than the form has parameters. form None: `default_form` (M4 where eps0 is known and 5+ distinct n hold it,
    else saturating); attrs["form"] names the one fitted.

    scored_treatment / scored_baseline: each point's per-image correctness record (`table_scored`), or None.
    Where every point of both has one, all of the same images, each interval is over seeds and test images
    jointly (`_difference_images`) and the p-value's reference with it; `interval over` says which.
    """
    import pandas as pd

    from analysis.images import IMAGE_OVER, SEED_OVER, interval_conditions

    _check_confidence(confidence)
    n, err_t, seeds = _check_seeded(n, err_treatment, seeds)
    err_b = np.asarray(err_baseline, dtype="float64").ravel()
    if len(err_b) != len(n):
        raise ValueError(f"err_baseline must pair with err_treatment point by point, got {len(err_b)} and {len(err_t)}")
    form = default_form(eps0, len(np.unique(n))) if form is None else form
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
    both = None
    if scored_treatment is not None and scored_baseline is not None:
        both = _scored_points([*scored_treatment, *scored_baseline], np.concatenate([err_t, err_b]))
    out = []
    for i, p in enumerate(ft.params):
        if p in boot:
            lo, hi, se = boot[p][1:]
        elif jack:
            lo, hi, se = _t_interval(ft.params[p] - fb.params[p], np.asarray(jack)[:, i], q, False)
        else:
            lo, hi, se = (math.nan,) * 3
        lo, hi, se, share = _difference_images(ft, fb, n, err_t, err_b, seeds, both, (lo, hi, se), p, n_seeds - 1,
                                               confidence)  # fmt: skip
        row = _difference_row(p, ft, fb, n, (lo, hi, se), n_seeds, why if not jack else "", share)
        row["interval over"] = IMAGE_OVER if share > 0 else (SEED_OVER if math.isfinite(se) else "")
        out.append(row)
    frame = pd.DataFrame(out).set_index("param")
    given = scored_treatment is not None and scored_baseline is not None
    frame.attrs["conditions"] = interval_conditions(frame["interval over"]) if given else CONDITIONS
    frame.attrs["form"] = form
    return frame
