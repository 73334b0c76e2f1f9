"""Laws checked by extrapolation (fit below the held-out n, predict it), parameters over seeds, paired differences."""

from __future__ import annotations

import math

import numpy as np

from analysis.scaling.inference import (
    _LOG_SCALE,
    _check_confidence,
    _check_seeded,
    _leave_one_seed_out,
    _t_interval,
    detectable,
    jackknife_se,
    t_quantile,
)
from analysis.scaling.laws import _LAW_PARAMS, LAW_FORMS, LawForm, fit_law
from analysis.scaling.resampling import saturating_bootstrap_t


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
