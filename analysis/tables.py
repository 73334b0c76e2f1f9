"""Paper-shaped tables from a study's trials: data scaling (Chen et al. 2022, Table 5), SAM's paired gain, rho sensitivity (Table 13)."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Literal, Sequence

import numpy as np
import pandas as pd

from analysis import scaling
from analysis.geometry.names import METRIC_PREFIX
from analysis.images import (
    IMAGE_OVER,
    SEED_OVER,
    crossed_detectable,
    crossed_quantile,
    crossed_t,
    interval_conditions,
    scored_matrix,
)
from analysis.runs import RHO, SCORED_COLUMN, best_key, best_trials, cell_key_name

__all__ = [
    "FewSamplesWarning",
    "RhoSensitivity",
    "ScalingTable",
    "FAMILY_ALPHA",
    "best_of_search",
    "gain_family",
    "headline",
    "format_cell",
    "holm",
    "geometry_correlation",
    "method_pairs",
    "sample_note",
    "rho_sensitivity",
    "rho_transfer",
    "sam_gain",
    "scaling_table",
]

Mode = Literal["max", "min"]


class FewSamplesWarning(UserWarning):
    """A statistic rests on too few independent samples (seeds, pairs, trials) to be trusted.

    The tables of this module say so in the table itself (a `note` column, a caption line: `sample_note`)
    rather than on stderr; the class stays for code that filters or raises it."""


# ----------------------------------------------------------------------------------------------- checks


def _require_columns(runs: pd.DataFrame, **named: str | None) -> None:
    """A ValueError naming each argument whose column is absent, and the columns that do exist."""
    if not isinstance(runs, pd.DataFrame):
        raise ValueError(f"runs must be a pandas DataFrame (from analysis.load_runs), got {type(runs).__name__}")
    missing = []
    for arg, col in named.items():
        if col is not None and col not in runs.columns:
            close = difflib.get_close_matches(str(col), [str(c) for c in runs.columns], n=1)
            missing.append(f"{arg}={col!r}" + (f" (closest: {close[0]!r})" if close else ""))
    if missing:
        present = ", ".join(map(repr, runs.columns)) if len(runs.columns) else "none (the DataFrame is empty)"
        raise ValueError(
            f"runs has no column for {', '.join(missing)}. Columns present: {present}. "
            "Fix: pass the name of an existing column (factor levels are 'factor.<name>', config values "
            "their dotted paths such as 'data.fraction'), or None where the argument allows it."
        )


def _check_mode(mode: str) -> None:
    if mode not in ("max", "min"):
        raise ValueError(
            f"mode must be 'max' or 'min', got {mode!r}; 'max' for accuracies, 'min' for losses and errors"
        )


def _check_confidence(confidence: float) -> None:
    if not (isinstance(confidence, (int, float)) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}; e.g. 0.95 for a 95% interval")


def _check_n_boot(n_boot: int) -> None:
    if not (isinstance(n_boot, (int, np.integer)) and n_boot >= 100):
        raise ValueError(
            f"n_boot must be an int >= 100, got {n_boot!r}; percentile intervals need many resamples, e.g. 2000"
        )


def _ok(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Finished trials with a finite value of `metric`: diverged, failed and killed trials never win a search."""
    values = pd.to_numeric(runs[metric], errors="coerce")
    finished = runs["status"] == "finished" if "status" in runs.columns else pd.Series(True, index=runs.index)
    out = runs[finished & np.isfinite(values.astype("float64"))].copy()
    out[metric] = values[out.index].astype("float64")
    return out


def _sort_key(values: Sequence) -> list:
    """Levels in numeric order when they are numbers ('0.1' < '0.25' < '1'), else as text."""

    def key(v):
        try:
            return (0, float(v), "")
        except (TypeError, ValueError):
            return (1, 0.0, str(v))

    return sorted(values, key=key)


def format_cell(mean: float, sd: float, n: int, *, digits: int = 3) -> str:
    """'mean ± sd (n)'; sd reads '–' with a single seed and the whole cell '– (0)' with none."""
    if n == 0 or not math.isfinite(mean):
        return f"– ({n})"
    sd_text = f"{sd:.{digits}f}" if n > 1 and math.isfinite(sd) else "–"
    return f"{mean:.{digits}f} ± {sd_text} ({n})"


#: Below this many independent samples (seeds, pairs) a statistic gets a note in its table.
FEW_SAMPLES = 3


def _singular(unit: str) -> str:
    return unit[:-1] if unit.endswith("s") else unit  # "seed pairs" -> "seed pair"


def sample_note(n: int, unit: str = "seeds") -> str:
    """The small-sample note a table row carries: '' from FEW_SAMPLES on; says why there is no (or a weak) interval."""
    if n <= 0:
        return f"no {unit}"
    if n == 1:
        return f"one {_singular(unit)} only: no interval"
    if n < FEW_SAMPLES:
        return f"{n} {unit}: interval unreliable"
    return ""


# ------------------------------------------------------------------------------------------ data scaling


def best_of_search(
    runs: pd.DataFrame,
    *,
    keys: Sequence[str],
    metric: str = "val_acc",
    mode: Mode = "max",
) -> pd.DataFrame:
    """The best finished trial of each group of `keys` by `analysis.runs.BEST_RULE` (one row per group): keys,
    run_id, metric, trials.

    `trials` counts every trial of the group, finished or not. A group whose trials come from more than one
    cell would compare trials of different settings (another factor the keys leave out): that is an error
    that names the factor, never a silent maximum across it.
    """
    _check_mode(mode)
    keys = list(keys)
    _require_columns(runs, metric=metric, **{f"keys[{i}]": k for i, k in enumerate(keys)})
    if "cell" in runs.columns and len(runs):
        grouped = runs.groupby(keys, dropna=True)
        spread = grouped["cell"].nunique()
        bad = spread[spread > 1]
        if len(bad):
            example = bad.index[0]
            cells = sorted(grouped.get_group(example if isinstance(example, tuple) else (example,))["cell"].unique())
            other = [
                c for c in runs.columns if c.startswith("factor.") and c not in keys and grouped[c].nunique().max() > 1
            ]
            raise ValueError(
                f"the groups of {keys} mix trials of several cells, e.g. {example!r} holds cells {cells[:4]}; "
                f"the factor(s) {other or 'unknown'} vary inside a group. Fix: filter runs to one level of "
                "each such factor first (e.g. runs[runs['factor.aug'] == 'none']) or add it to the keys."
            )
    counts = runs.groupby(keys, dropna=True).size().rename("trials")
    ok = _ok(runs, metric)
    if ok.empty:
        out = counts.reset_index()
        out["run_id"], out[metric] = None, np.nan
        return out[keys + ["run_id", metric, "trials"]]
    best = best_trials(ok, metric=metric, mode=mode, by=keys)[keys + ["run_id", metric]].set_index(keys)
    return best.join(counts, how="outer").reset_index()


@dataclass(frozen=True)
class ScalingTable:
    """Best-of-search `metric` per (arch, method, fraction, seed), then mean, sd (ddof=1) and n over seeds.

    mean, sd, n: rows (arch, method), columns the fractions in ascending order. best: the chosen trial of
    each (arch, method, fraction, seed) with its run_id, value, the number of trials it was chosen from and, where
    the runs carry them, its per-image correctness record (load_runs' SCORED_COLUMN: analysis.scaling.table_scored).
    """

    mean: pd.DataFrame
    sd: pd.DataFrame
    n: pd.DataFrame
    best: pd.DataFrame
    metric: str
    mode: str
    columns: dict[str, str | None] = field(default_factory=dict)

    def formatted(self, *, digits: int = 3, scale: float = 1.0) -> pd.DataFrame:
        """Strings 'mean ± sd (n)', e.g. scale=100 for accuracies in percent as in the paper."""
        out = pd.DataFrame(index=self.mean.index, columns=self.mean.columns, dtype=object)
        for r in self.mean.index:
            for c in self.mean.columns:
                out.loc[r, c] = format_cell(
                    float(self.mean.loc[r, c]) * scale,
                    float(self.sd.loc[r, c]) * scale,
                    int(self.n.loc[r, c]),
                    digits=digits,
                )
        return out

    def to_markdown(self, *, digits: int = 3, scale: float = 1.0, runs: str = "best-of-search") -> str:
        """A Markdown table: one row per (arch, method), one column per fraction, cells 'mean ± sd (n)'.

        runs: what each seed's value is, in words, for the caption: 'best-of-search' (the best search trial of
        the seed) or 'confirm-run' (one confirm run a seed, at the cell's chosen knobs)."""
        frac_name = (self.columns.get("fraction") or "fraction").removeprefix("factor.")
        caption = (
            f"{runs[:1].upper() + runs[1:]} {self.metric} ({self.mode}) by {frac_name}: mean ± sd over seeds (n = "
            "number of seeds); sd is left out ('–') where n = 1."
        )
        counts = self.n.to_numpy().ravel()
        thin = int(((counts > 0) & (counts < FEW_SAMPLES)).sum())
        note = ""
        if thin:
            note = (
                f"\nNote: {thin} of {counts.size} cells rest on fewer than {FEW_SAMPLES} seeds "
                f"(n = {sorted(set(int(c) for c in counts if 0 < c < FEW_SAMPLES))}); their sd is not an interval.\n"
            )
        return caption + "\n\n" + _markdown(self.formatted(digits=digits, scale=scale)) + note

    def to_csv(self, path=None) -> str | None:
        """Long CSV, one line per (arch, method, fraction): mean, sd, n (numbers, not formatted text)."""
        long = self.long()
        return long.to_csv(path, index=False) if path is not None else long.to_csv(index=False)

    def long(self) -> pd.DataFrame:
        """The table as long data: arch, method, fraction, mean, sd, n."""
        rows = [
            {
                "arch": a,
                "method": m,
                "fraction": f,
                "mean": float(self.mean.loc[(a, m), f]),
                "sd": float(self.sd.loc[(a, m), f]),
                "n": int(self.n.loc[(a, m), f]),
            }
            for a, m in self.mean.index
            for f in self.mean.columns
        ]
        return pd.DataFrame(rows, columns=["arch", "method", "fraction", "mean", "sd", "n"])


def _markdown(df: pd.DataFrame) -> str:
    """A pipe table without the `tabulate` dependency that DataFrame.to_markdown needs."""
    index_names = [str(n) if n is not None else "" for n in df.index.names]
    header = index_names + [str(c) for c in df.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    for idx, row in df.iterrows():
        idx = idx if isinstance(idx, tuple) else (idx,)
        lines.append("| " + " | ".join([str(i) for i in idx] + [str(v) for v in row.tolist()]) + " |")
    return "\n".join(lines) + "\n"


def scaling_table(
    runs: pd.DataFrame,
    *,
    arch: str = "factor.arch",
    method: str = "factor.method",
    fraction: str = "data.fraction",
    seed: str | None = "train.seed",
    metric: str = "val_acc",
    mode: Mode = "max",
) -> ScalingTable:
    """Data-scaling table in the shape of Chen et al. 2022, Table 5: architecture x method by training-set fraction.

    For each (arch, method, fraction, seed) the best finished trial of the search is taken ("best of search":
    a trial that diverged or failed never counts), then mean ± sd over seeds. seed=None treats all trials
    as one seed. Combinations whose trials all failed stay in the table with n = 0.
    """
    _check_mode(mode)
    _require_columns(runs, arch=arch, method=method, fraction=fraction, seed=seed, metric=metric)
    data = runs.copy()
    seed_col = seed
    if seed is None:
        seed_col = "__seed"
        data[seed_col] = 0
    keys = [arch, method, fraction, seed_col]
    best = best_of_search(data, keys=keys, metric=metric, mode=mode)
    stats = best.groupby([arch, method, fraction], dropna=True)[metric].agg(["mean", "std", "count"])
    fractions = _sort_key(stats.index.get_level_values(2).unique())
    rows = pd.MultiIndex.from_tuples(
        sorted({(a, m) for a, m, _ in stats.index}, key=lambda t: (str(t[0]), str(t[1]))),
        names=[arch.removeprefix("factor."), method.removeprefix("factor.")],
    )

    def pivot(col: str) -> pd.DataFrame:
        wide = stats[col].unstack(level=2).reindex(columns=fractions)
        wide.index = pd.MultiIndex.from_tuples(list(wide.index), names=rows.names)
        wide = wide.reindex(rows)
        wide.columns.name = fraction.removeprefix("factor.")
        return wide

    n = pivot("count").fillna(0).astype("int64")
    if seed is None:
        best = best.drop(columns=[seed_col])
    if SCORED_COLUMN in data.columns and "run_id" in best.columns:  # each chosen trial's per-image record
        text = data.drop_duplicates("run_id").set_index("run_id")[SCORED_COLUMN]
        best[SCORED_COLUMN] = best["run_id"].map(text)
    return ScalingTable(
        mean=pivot("mean").astype("float64"),
        sd=pivot("std").astype("float64"),
        n=n,
        best=best,
        metric=metric,
        mode=mode,
        columns={"arch": arch, "method": method, "fraction": fraction, "seed": seed},
    )


# -------------------------------------------------------------------------------------------- SAM's gain


def _resolve_level(runs: pd.DataFrame, method: str, level: str, arg: str) -> str:
    """A level of the `method` column, given either the level's name or the optimizer it runs ('none', 'sam')."""
    levels = sorted(runs[method].dropna().astype(str).unique())
    if level in levels:
        return level
    if "optimizer.method" in runs.columns and method != "optimizer.method":
        owners = sorted(runs.loc[runs["optimizer.method"].astype(str) == level, method].dropna().astype(str).unique())
        if len(owners) == 1:
            return owners[0]
        if len(owners) > 1:
            raise ValueError(
                f"{arg}={level!r}: several levels of {method!r} run optimizer.method={level!r}: {owners}. "
                f"Fix: name one of them as {arg}."
            )
    raise ValueError(
        f"{arg}={level!r} is neither a level of {method!r} ({levels}) nor an optimizer.method of one. "
        f"Fix: pass one of {levels}."
    )


_CONFIG_SECTIONS = ("data.", "model.", "schedule.", "train.")  # the trial config's sections, optimizer aside


def method_column(runs: pd.DataFrame) -> str:
    """The column naming each trial's method: `factor.method`; else the one factor whose every level runs a single
    optimizer.method, 'none' for some and a sharpness-aware one for others (late_phase's `start`, sam_on's
    `scope`: their plain level and the variants the study compares with it); else `optimizer.method`."""
    if "factor.method" in runs.columns:
        return "factor.method"
    if "optimizer.method" not in runs.columns:
        return "optimizer.method"
    found = []
    for col in (
        c for c in runs.columns if c.startswith("factor.") and c not in ("factor.arch", "factor.data.fraction")
    ):
        ran = runs[[col, "optimizer.method"]].dropna().astype(str).groupby(col)["optimizer.method"].unique()
        if len(ran) >= 2 and all(len(v) == 1 for v in ran):
            kinds = {v[0] == "none" for v in ran}
            if kinds == {True, False}:
                found.append(col)
    return found[0] if len(found) == 1 else "optimizer.method"


def method_pairs(runs: pd.DataFrame, *, method: str = "factor.method") -> list[tuple[str, str]]:
    """(treatment, baseline) level pairs of `method`: each level that runs a sharpness-aware optimizer with
    the plain-optimizer level (optimizer.method 'none') that shares its other settings.

    "Its other settings" are the config values a level fixes (data.augment: strong for 'sam_aug'), so
    Table 5's SAM pairs with Vanilla and SAM + AUG with AUG. A level with no plain level that agrees on
    every setting both fix, or with several equally good, gets none. Needs the `optimizer.method` column.
    """
    _require_columns(runs, method=method, **{"optimizer.method": "optimizer.method"})
    levels = sorted(runs[method].dropna().astype(str).unique())
    config = [c for c in runs.columns if c.startswith(_CONFIG_SECTIONS) and c != method]

    def fixed(level: str) -> dict:
        part = runs[runs[method].astype(str) == level]
        out = {}
        for c in config:
            values = part[c].dropna().astype(str).unique()
            if len(values) == 1:
                out[c] = values[0]
        return out

    optimizer = {
        lv: set(runs.loc[runs[method].astype(str) == lv, "optimizer.method"].dropna().astype(str)) for lv in levels
    }
    plain = [lv for lv in levels if optimizer[lv] == {"none"}]
    signatures = {lv: fixed(lv) for lv in levels}
    pairs = []
    for lv in levels:
        if lv in plain or not optimizer[lv]:
            continue
        sig = signatures[lv]
        scores = {}
        for base in plain:
            shared = set(sig) & set(signatures[base])
            if all(sig[c] == signatures[base][c] for c in shared):
                scores[base] = len(shared)
        if scores:
            top = max(scores.values())
            best = [b for b, v in scores.items() if v == top]
            if len(best) == 1:
                pairs.append((lv, best[0]))
    return pairs


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control across the family given); NaN stays NaN."""
    p = np.asarray(p_values, dtype="float64")
    out = np.full(p.shape, math.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = len(ok)
    if m == 0:
        return out
    order = ok[np.argsort(p[ok])]
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out[order] = adjusted
    return out


def holm_across(out: pd.DataFrame, groups, *, alpha: float, power: float, what: str) -> None:
    """Add `p_holm` (Holm within each family of `groups`) and `significant` to a table of gains with `p_value`,
    `band_low` / `band_high` (or `ci_low` / `ci_high`) and `note` columns, and say on every null row what its
    interval excludes.

    `significant` is a nullable boolean: NA where the row has no p-value (fewer than 2 pairs: no test)."""
    out["p_holm"] = np.nan
    for _, idx in out.groupby(groups, dropna=False).groups.items():
        out.loc[idx, "p_holm"] = holm(out.loc[idx, "p_value"].to_numpy())
    # NA (not False) where no test could be run (one pair, no spread): "not significant" is a verdict the data
    # cannot give there.
    out["significant"] = pd.array(
        [pd.NA if math.isnan(p) else bool(p < alpha) for p in out["p_holm"].astype("float64")], dtype="boolean"
    )
    # The family-wide band where the table has one (sam_gain), else the row's own interval (compute_matched_gains).
    low, high, which = (
        ("band_low", "band_high", "family-wide") if "band_low" in out.columns else ("ci_low", "ci_high", "")
    )
    quiet = (~out["significant"]).fillna(False).astype(bool) & out[low].notna()
    out.loc[quiet, "note"] = [
        "; ".join(filter(None, [n, _excludes(what, lo, hi, which)]))
        for n, lo, hi in zip(out.loc[quiet, "note"], out.loc[quiet, low], out.loc[quiet, high])
    ]


def _excludes(what: str, low: float, high: float, which: str = "family-wide") -> str:
    """What a null row's interval rules out: the absence of an effect is told by the interval (or a TOST against
    a margin, analysis.scaling.tost), not by a post-hoc power computed from the observed sd."""
    return f"no {what} detected: the {which + ' ' if which else ''}interval excludes gains below {low:.3g} and above {high:.3g}"


_GAIN_COLUMNS = [
    "arch",
    "fraction",
    "baseline",
    "treatment",
    "gain",
    "sd",
    "se",
    "df",
    "image share",
    "interval over",
    "ci_low",
    "ci_high",
    "p_value",
    "p_holm",
    "significant",
    "band_low",
    "band_high",
    "detectable",
    "n_pairs",
    "note",
]


def _gain_row(a, f, pairs, per_image, base_level, treat_level, family, confidence, power) -> dict:
    """One (arch, fraction) row of sam_gain: the paired test over seeds and images where the runs scored the same
    images, else over seed pairs, and the gain it detects with `power` at the family's strictest level."""
    diffs = (pairs[treat_level] - pairs[base_level]).to_numpy(dtype="float64")
    if per_image is not None:
        test, over = crossed_t(per_image, confidence=confidence, family=family), IMAGE_OVER
    else:
        test, over = scaling.paired_t(diffs, confidence=confidence, family=family), SEED_OVER
    k, mean, se, df = test.n, test.mean, test.se, test.df
    share = getattr(test, "image_share", 0.0)
    sd = float(diffs.std(ddof=1)) if k > 1 else math.nan
    lo, hi, band_lo, band_hi, pval = test.low, test.high, test.band_low, test.band_high, test.p_value
    mde = crossed_detectable(se, df, share, confidence=confidence, power=power, family=family) if k > 1 else math.nan
    return {
        "arch": a,
        "fraction": f,
        "baseline": float(pairs[base_level].mean()) if len(pairs) else math.nan,
        "treatment": float(pairs[treat_level].mean()) if len(pairs) else math.nan,
        "gain": mean,
        "sd": sd,
        "se": se,
        "df": float(df) if k > 1 else math.nan,
        "image share": share if k > 1 else math.nan,
        "interval over": over if k > 1 else "",
        "ci_low": lo,
        "ci_high": hi,
        "p_value": pval,
        "band_low": band_lo,
        "band_high": band_hi,
        "detectable": mde,
        "n_pairs": int(k),
        "note": sample_note(k, "seed pairs"),
    }


def sam_gain(
    runs: pd.DataFrame,
    *,
    baseline: str = "none",
    treatment: str = "sam",
    arch: str = "factor.arch",
    method: str = "factor.method",
    fraction: str = "data.fraction",
    seed: str = "train.seed",
    metric: str = "val_acc",
    mode: Mode = "max",
    confidence: float = 0.95,
    power: float = 0.8,
) -> pd.DataFrame:
    """Gain of `treatment` over `baseline` per (arch, fraction): best-of-search metric, paired by seed.

    baseline / treatment: a level of the `method` column, or the optimizer a level runs (`optimizer.method`,
    so "none" finds the level 'adamw' of the quickstart). Each side takes its best finished trial per seed
    (as scaling_table does); a seed counts as a pair only where both sides have one. gain is the mean of
    the paired differences (treatment - baseline, whatever `mode`: positive means the treatment scored
    higher). Its interval is Student's t on the pairs (exact for normal seed noise, where a bootstrap over 3-5
    pairs is too narrow): ci_low / ci_high per fraction, p_value the paired t test's. The fractions of an arch
    are one family: p_holm is Holm-adjusted across them and `significant` is p_holm < 1 - confidence (NA, not
    False, where no test can be run: one pair);
    band_low / band_high a simultaneous band (Bonferroni) that holds for all fractions at once. detectable:
    the gain this fraction's pairs find with `power` at the family's strictest level (from the observed sd):
    what a gain that is not significant rules out. With 1 pair there is no interval (NaN); rows with fewer than
    3 pairs say so in `note`. attrs: baseline, treatment, metric, confidence, power, `chosen_on` (the
    metric the best trial was picked by, the same that measures it: a best-of-search value, see the report), and
    `conditions` (what the intervals condition on, in words).

    Where every run of a row's pairs recorded its per-image correctness (load_runs' SCORED_COLUMN) on the same
    images, the row's se, df, intervals and test are over seeds and test images jointly (analysis.images.crossed_t
    on the per-image differences: the same images for both arms, since both are scored on them), `interval over`
    says so, and they cover the gain on the population of images the test set stands for; elsewhere they are
    over seed pairs alone, given the scored images.
    """

    _check_mode(mode)
    _check_confidence(confidence)
    _require_columns(runs, arch=arch, method=method, fraction=fraction, seed=seed, metric=metric)
    base_level = _resolve_level(runs, method, baseline, "baseline")
    treat_level = _resolve_level(runs, method, treatment, "treatment")
    if base_level == treat_level:
        raise ValueError(
            f"baseline and treatment are the same level {base_level!r} of {method!r}; pick two different levels"
        )
    data = runs[runs[method].astype(str).isin([base_level, treat_level])]
    best = best_of_search(data, keys=[arch, method, fraction, seed], metric=metric, mode=mode)
    wide = best.pivot_table(index=[arch, fraction, seed], columns=method, values=metric, aggfunc="first")
    for level in (base_level, treat_level):
        if level not in wide.columns:
            wide[level] = np.nan
    scored = _scored_of(best, data, [arch, fraction, seed], method)
    alpha = 1.0 - confidence
    rows = []
    groups = sorted(
        {(a, f) for a, f, _ in wide.index}, key=lambda t: (str(t[0]), float(t[1]) if _isnum(t[1]) else str(t[1]))
    )
    family = {a: sum(1 for g in groups if g[0] == a) for a, _ in groups}
    for a, f in groups:
        pairs = wide.xs((a, f), level=[0, 1])[[base_level, treat_level]].dropna()
        per_image = _paired_images(scored, (a, f), pairs, base_level, treat_level)
        rows.append(_gain_row(a, f, pairs, per_image, base_level, treat_level, family[a], confidence, power))
    out = pd.DataFrame(rows)
    if len(out):
        holm_across(out, "arch", alpha=alpha, power=power, what="gain")
    out = out.reindex(columns=_GAIN_COLUMNS).set_index(["arch", "fraction"])
    out.attrs.update(
        baseline=base_level, treatment=treat_level, metric=metric, confidence=confidence, power=power, chosen_on=metric
    )
    out.attrs["conditions"] = interval_conditions(out["interval over"] if len(out) else [])
    return out


def _scored_of(best: pd.DataFrame, data: pd.DataFrame, keys: list[str], method: str) -> dict | None:
    """The per-image record of each best trial, by (keys..., method level); None where the runs carry none."""
    if SCORED_COLUMN not in data.columns or best.empty:
        return None
    text = data.set_index("run_id")[SCORED_COLUMN]
    text = text[~text.index.duplicated()]
    out = {}
    for _, row in best.iterrows():
        if isinstance(row["run_id"], str) and row["run_id"] in text.index:
            out[tuple(row[k] for k in keys) + (str(row[method]),)] = text.loc[row["run_id"]]
    return out


def _paired_images(scored: dict | None, cell: tuple, pairs: pd.DataFrame, base: str, treat: str) -> np.ndarray | None:
    """The (pairs, images) per-image differences treatment - baseline of one row's seed pairs, both arms' records on
    the same images and of the values compared (analysis.images.scored_matrix); None where any is missing."""
    if scored is None or len(pairs) < 2:
        return None
    seeds = list(pairs.index)
    texts = [scored.get(cell + (s, level)) for level in (treat, base) for s in seeds]
    values = pairs[treat].tolist() + pairs[base].tolist()
    matrix, _ = scored_matrix(texts, values)
    if matrix is None:
        return None
    k = len(seeds)
    return matrix[:k].astype("float64") - matrix[k:].astype("float64")


#: The family-wise error rate of a report's findings (Holm across the whole family of gain_family).
FAMILY_ALPHA = 0.05


def gain_family(
    runs: pd.DataFrame,
    pairs: Sequence[tuple[str, str]],
    *,
    arch: str = "factor.arch",
    method: str = "factor.method",
    fraction: str = "data.fraction",
    seed: str = "train.seed",
    metric: str = "val_acc",
    mode: Mode = "max",
    alpha: float = 0.05,
) -> dict[tuple[str, str], pd.DataFrame]:
    """Every paired gain the report prints (each sharpness-aware level over its plain partner, per arch and
    fraction), adjusted as one family: `p_holm` is Holm across all of its tests, `significant` p_holm <
    `alpha`, band_low/band_high the Bonferroni-simultaneous interval over the whole family, `detectable` the
    gain each row's pairs find with sam_gain's power at the family's strictest level. The first entry is the
    study's primary contrast (`_primary_first`). pairs: (treatment, baseline) levels (`method_pairs`)."""

    family = {}
    for level, base in _primary_first(list(pairs)):
        family[(level, base)] = sam_gain(
            runs,
            baseline=base,
            treatment=level,
            arch=arch,
            method=method,
            fraction=fraction,
            seed=seed,
            metric=metric,
            mode=mode,
            confidence=1.0 - alpha,
        )
    if not family:
        return {}
    p = np.concatenate([g["p_value"].to_numpy(dtype="float64") for g in family.values()])
    adjusted = holm(p)
    m = max(int(np.isfinite(p).sum()), 1)
    at = 0
    for gain in family.values():
        k = len(gain)
        gain["p_holm"] = adjusted[at : at + k]
        at += k
        gain["significant"] = pd.array(
            [pd.NA if math.isnan(v) else bool(v < alpha) for v in gain["p_holm"]], dtype="boolean"
        )
        n = gain["n_pairs"].to_numpy(dtype="float64")
        # Each row's own se and df: over seed pairs, or over seeds and test images (sam_gain's `interval over`).
        se = gain["se"].to_numpy(dtype="float64")
        ok = n > 1
        power = gain.attrs.get("power", 0.8)
        q, qp = np.full(len(gain), np.nan), np.full(len(gain), np.nan)
        for i, (df, share) in enumerate(zip(gain["df"], gain["image share"])):
            if ok[i]:
                q[i] = crossed_quantile(1 - alpha / (2 * m), df, share)
                qp[i] = crossed_quantile(power, df, share)
        gain["band_low"] = np.where(ok, gain["gain"] - q * se, np.nan)
        gain["band_high"] = np.where(ok, gain["gain"] + q * se, np.nan)
        gain["detectable"] = np.where(ok, (q + qp) * se, np.nan)
        notes = []
        for note, sig, lo, hi in zip(gain["note"], gain["significant"], gain["band_low"], gain["band_high"]):
            kept = [x for x in str(note).split("; ") if x and not x.startswith("no gain detected")]
            # `sig` is numpy's bool (never `is False`) or NA where no test ran.
            if sig is not pd.NA and not sig and math.isfinite(lo):
                kept.append(_excludes("gain", lo, hi))
            notes.append("; ".join(kept))
        gain["note"] = notes
        gain.attrs.update(family_size=m, family_alpha=alpha)
    return family


def _yes(flag) -> bool:
    """A nullable `significant` entry as a verdict: True only where a test ran and rejected."""
    return not pd.isna(flag) and bool(flag)


def _primary_first(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The study's primary contrast first: the sharpness-aware level paired with the plain level that changes
    nothing else (the shortest level names, e.g. sam over vanilla before sam_aug over aug), then the rest."""
    return sorted(pairs, key=lambda p: (len(p[0]) + len(p[1]), p))


def _isnum(v) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


# ------------------------------------------------------------------------------------------ rho sensitivity


@dataclass(frozen=True)
class RhoSensitivity:
    """Accuracy against rho per group (arch, plus `by`), the best rho of each group and its bootstrap interval.

    levels: one row per (group, rho level): rho, mean, sd, n, p_best (share of bootstrap resamples in which
    this level was the best; NaN where no level of the group has two trials), val_n (the level's validation sample
    count, NaN where the trials logged none). best: one row per group: best_rho,
    best_mean, rho_low, rho_high (the confidence set's lowest and highest level), best_set (its levels), n_trials,
    and baseline (the mean metric of the `baseline` method's trials, the paper's rho = 0 column) when asked for.
    draws: per group (the tuple of its index values in `best`), the best rho of each bootstrap resample (NaN
    where the group's levels hold single trials). samples: per group, (its levels, each level's metric values):
    rho_transfer's sets at the fractions' joint level.
    """

    levels: pd.DataFrame
    best: pd.DataFrame
    param: str
    metric: str
    mode: str
    confidence: float
    draws: dict = field(default_factory=dict, repr=False)
    samples: dict = field(default_factory=dict, repr=False)

    def to_markdown(self, *, digits: int = 3) -> str:
        lv = self.levels.copy()
        lv["rho"] = lv["rho"].map(lambda v: f"{v:.4g}")
        lv["value"] = [format_cell(m, s, int(n), digits=digits) for m, s, n in zip(lv["mean"], lv["sd"], lv["n"])]
        lv["p_best"] = lv["p_best"].map(lambda v: f"{v:.2f}" if math.isfinite(v) else "–")
        groups = [c for c in self.best.index.names]
        a = _markdown(lv.set_index(groups + ["rho"])[["value", "p_best"]])
        best = self.best.copy()
        for col in ("best_rho", "rho_low", "rho_high"):
            best[col] = best[col].map(lambda v: f"{v:.4g}")
        for col in ("best_mean", "baseline"):
            if col in best.columns:
                best[col] = best[col].map(lambda v: f"{v:.{digits}f}" if math.isfinite(v) else "–")
        for col in ("rho_low", "rho_high"):
            best[col] = best[col].replace("nan", "–")
        b = _markdown(best)
        pct = int(round(self.confidence * 100))
        return (
            f"{self.metric} against {self.param}: mean ± sd (n = trials) per level, sd '–' where n = 1; p_best = "
            f"share of bootstrap resamples (of the group's trials) in which the level is best, '–' where no level of "
            f"the group was repeated. Best level: the best mean; a tie goes to the level of the trial that started "
            f"first.\n\n{a}\nBest "
            f"{self.param} per group, with the {pct}% confidence set for the best level (best_set: the levels no "
            f"other beats by more than a Bonferroni one-sided Welch t, so it holds the truly best level with "
            f"probability >= {pct}%, ties included; rho_low/rho_high its ends; '–' where a level has a single trial: "
            f"no spread, no set; see note).\n\n{b}"
        )


def _log_bins(values: np.ndarray, bins: int) -> np.ndarray:
    """Index of each value's bin among `bins` equal-width bins of log(value) over the values' range."""
    logs = np.log(values)
    lo, hi = logs.min(), logs.max()
    if hi == lo:
        return np.zeros(len(values), dtype=int)
    return np.minimum(((logs - lo) / (hi - lo) * bins).astype(int), bins - 1)


def _rho_baseline(runs, ok, method, baseline, arch, by, metric) -> pd.Series | None:
    """The `baseline` method's mean metric per (arch, *by): the rho = 0 reference (None where none is asked)."""
    if baseline is None:
        return None
    if method is None:
        raise ValueError(
            "baseline needs a method column: pass method='factor.method' (or another column naming the method)"
        )
    base_level = _resolve_level(runs, method, baseline, "baseline")
    base_trials = ok[ok[method].astype(str) == base_level]
    return base_trials.groupby([arch] + by, dropna=True)[metric].mean()


def _rho_levels(rho: np.ndarray, bins: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(each level's rho, each trial's level): distinct values, or log bins placed at their trials' geometric mean."""
    if bins is None:
        return np.unique(rho, return_inverse=True)
    raw = _log_bins(rho, bins)
    used, codes = np.unique(raw, return_inverse=True)
    return np.array([math.exp(np.log(rho[codes == i]).mean()) for i in range(len(used))]), codes


def _level_val_n(part: pd.DataFrame, codes: np.ndarray, k: int) -> np.ndarray:
    """Each level's validation sample count (the smallest of its trials'), where the trials logged one: a single
    trial's accuracy still has a known sampling error (plot_rho_sensitivity draws its exact interval)."""
    from trainables.metrics import VALIDATION_SAMPLES

    if VALIDATION_SAMPLES not in part.columns:
        return np.full(k, math.nan)
    logged = pd.to_numeric(part[VALIDATION_SAMPLES], errors="coerce").to_numpy(dtype="float64")
    return np.array(
        [np.nanmin(logged[codes == i]) if np.isfinite(logged[codes == i]).any() else math.nan for i in range(k)]
    )


def _best_level(part: pd.DataFrame, values: np.ndarray, codes: np.ndarray, means: np.ndarray, mode: str) -> int:
    """The level with the best mean; among tied levels BEST_RULE's tie-break: the level of the first-ranked trial
    among the tied levels' trials (one trial a level: the level of the best trial, as every other table names it)."""
    best = int(np.nanargmax(means) if mode == "max" else np.nanargmin(means))
    tied = np.flatnonzero(means == means[best])
    if len(tied) > 1:
        started = part["start_time"] if "start_time" in part.columns else pd.Series(0, index=part.index)
        ids = part["run_id"].astype(str) if "run_id" in part.columns else pd.Series("", index=part.index)
        ranked = min(
            (best_key(float(values[i]), started.iloc[i], ids.iloc[i], mode), i)
            for i in range(len(values))
            if codes[i] in tied
        )
        best = int(codes[ranked[1]])
    return best


def _boot_best(rng, values: np.ndarray, codes: np.ndarray, k: int, n_boot: int, mode: str) -> np.ndarray:
    """The best level of each of `n_boot` resamples of the trials (level means from bincounts of the drawn trials)."""
    draws = rng.integers(0, len(values), size=(n_boot, len(values)))
    drawn_codes = codes[draws]
    offsets = (np.arange(n_boot) * k)[:, None]
    flat = (drawn_codes + offsets).ravel()
    b_sums = np.bincount(flat, weights=values[draws].ravel(), minlength=n_boot * k).reshape(n_boot, k)
    b_counts = np.bincount(flat, minlength=n_boot * k).reshape(n_boot, k)
    with np.errstate(invalid="ignore", divide="ignore"):
        b_means = np.where(b_counts > 0, b_sums / np.maximum(b_counts, 1), np.nan)
    filled = np.where(np.isnan(b_means), -np.inf if mode == "max" else np.inf, b_means)
    return filled.argmax(axis=1) if mode == "max" else filled.argmin(axis=1)


def _rho_group(part: pd.DataFrame, *, metric, mode, bins, rng, n_boot, confidence) -> dict:
    """One group's levels (rows), its best row, its bootstrap's best rhos (draws) and its (levels, values) samples."""
    from analysis.sweep import best_level_set

    rho = part["__rho"].to_numpy()
    values = part[metric].to_numpy(dtype="float64")
    level_rho, codes = _rho_levels(rho, bins)
    k = len(level_rho)
    counts = np.bincount(codes, minlength=k)
    means = np.bincount(codes, weights=values, minlength=k) / counts
    sds = np.array([values[codes == i].std(ddof=1) if counts[i] > 1 else math.nan for i in range(k)])
    val_n = _level_val_n(part, codes, k)
    best = _best_level(part, values, codes, means, mode)
    b_best = _boot_best(rng, values, codes, k, n_boot, mode)
    p_best = np.bincount(b_best, minlength=k) / n_boot
    best_rhos = level_rho[b_best]
    repeated = int(counts.max())
    if repeated < 2:
        # One trial per level: resampling trials only drops levels, it measures no noise; no interval, and no
        # p_best (it would be the levels' rank, the same for four equal values as for four distinct ones).
        best_rhos = np.full(n_boot, math.nan)
        p_best = np.full(k, math.nan)
        note = "1 trial per rho level: no interval"
    elif repeated < FEW_SAMPLES:
        note = f"at most {repeated} trials per rho level: interval unreliable"
    else:
        note = ""
    # The interval printed is the confidence set for the best level (calibrated at ties, where the bootstrap's
    # argmax drops levels exactly as good): rho_low / rho_high are its lowest and highest levels.
    per_level = [values[codes == i] for i in range(k)]
    chosen = best_level_set(level_rho, per_level, mode=mode, confidence=confidence)["set"]
    rho_low, rho_high = (min(chosen), max(chosen)) if chosen else (math.nan, math.nan)
    levels = [
        {
            "rho": float(level_rho[i]),
            "mean": float(means[i]),
            "sd": float(sds[i]),
            "n": int(counts[i]),
            "p_best": float(p_best[i]),
            "val_n": float(val_n[i]),
        }
        for i in range(k)
    ]
    best_row = {
        "best_rho": float(level_rho[best]),
        "best_mean": float(means[best]),
        "rho_low": rho_low,
        "rho_high": rho_high,
        "best_set": ", ".join(f"{v:.4g}" for v in chosen) if chosen else "–",
        "levels": k,
        "n_trials": int(len(values)),
        "note": note,
    }
    return {"levels": levels, "best": best_row, "draws": best_rhos, "samples": (level_rho, per_level)}


def rho_sensitivity(
    runs: pd.DataFrame,
    *,
    param: str = RHO,
    arch: str = "factor.arch",
    method: str | None = "factor.method",
    by: Sequence[str] = (),
    metric: str = "val_acc",
    mode: Mode = "max",
    bins: int | None = None,
    baseline: str | None = None,
    n_boot: int = 2000,
    confidence: float = 0.95,
    boot_seed: int = 0,
) -> RhoSensitivity:
    """Metric against SAM's rho per architecture (Chen et al. 2022, Table 13), with the best rho and its interval.

    Trials: the finished ones with a finite metric and a positive value of `param`; trials without one
    (methods that take no rho) only feed `baseline`. Groups: arch, then `method` when that column exists
    (SAM's and ASAM's rho live on different scales, so they are never pooled), then each column of `by`
    (e.g. 'data.fraction'); every other column is pooled. Levels: bins=None keeps each distinct rho
    value as its own level (a grid search, or one level per trial of a continuous search); bins=k puts
    the group's trials into k equal-width bins of log(rho), each level placed at the geometric mean of
    its trials' rho. Best rho: the level with the best mean metric; among equal means, the level holding the
    trial that `analysis.runs.BEST_RULE` ranks first (one trial a level: the best trial's level). Its interval:
    the confidence set for the best level (`analysis.sweep.best_level_set`: the levels no other beats by more
    than a Bonferroni one-sided Welch t, calibrated at ties), `best_set` its levels, rho_low / rho_high its
    lowest and highest (NaN where a level has a single trial). p_best: each level's share of the best level over
    `n_boot` resamples of the group's trials (seeded): descriptive, not an interval.
    baseline: a level of `method` (or the optimizer it runs, e.g. 'none') whose mean metric is shown as
    the rho = 0 reference.
    """
    _check_mode(mode)
    _check_n_boot(n_boot)
    _check_confidence(confidence)
    if bins is not None and not (isinstance(bins, int) and bins >= 2):
        raise ValueError(f"bins must be None (one level per distinct rho) or an int >= 2, got {bins!r}")
    by = list(by)
    if method is not None and method not in runs.columns:
        method = None  # a study with one method needs no method factor
    _require_columns(runs, param=param, arch=arch, metric=metric, **{f"by[{i}]": c for i, c in enumerate(by)})
    ok = _ok(runs, metric)
    rho_values = pd.to_numeric(ok[param], errors="coerce").astype("float64")
    with_rho = ok[np.isfinite(rho_values) & (rho_values > 0)].copy()
    with_rho["__rho"] = rho_values[with_rho.index]
    if with_rho.empty:
        raise ValueError(
            f"no finished trial has a positive {param!r} and a finite {metric!r}; "
            "rho sensitivity needs trials of a method that takes that parameter (e.g. factor.method = sam)."
        )
    groups = [arch] + ([method] if method else []) + by
    rng = np.random.default_rng(boot_seed)
    level_rows, best_rows = [], []
    draws_by_group: dict[tuple, np.ndarray] = {}
    samples_by_group: dict[tuple, tuple] = {}
    base_means = _rho_baseline(runs, ok, method, baseline, arch, by, metric)
    for key, part in with_rho.groupby(groups, dropna=True, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        g = _rho_group(part, metric=metric, mode=mode, bins=bins, rng=rng, n_boot=n_boot, confidence=confidence)
        draws_by_group[key] = g["draws"]
        samples_by_group[key] = g["samples"]
        level_rows += [{**dict(zip(groups, key)), **row} for row in g["levels"]]
        row = {**dict(zip(groups, key)), **g["best"]}
        if base_means is not None:
            bkey = (key[0], *key[len(groups) - len(by) :]) if by else key[0]
            row["baseline"] = float(base_means.get(bkey, math.nan))
        best_rows.append(row)
    names = [g.removeprefix("factor.") for g in groups]
    levels = pd.DataFrame(level_rows).rename(columns=dict(zip(groups, names)))
    best_df = pd.DataFrame(best_rows).rename(columns=dict(zip(groups, names))).set_index(names)
    return RhoSensitivity(
        levels=levels,
        best=best_df,
        param=param,
        metric=metric,
        mode=mode,
        confidence=confidence,
        draws=draws_by_group,
        samples=samples_by_group,
    )


# ------------------------------------------------------------------------ geometry vs generalisation gap

#: Suffixes of geometry metrics that describe how a measure was computed, not the measure.
_BOOKKEEPING = ("_std_error", "_converged", "_iterations", "_hvp_count", "_residual")
#: Geometry metrics that are values of the loss (or its gradient) at the weights, logged beside a measure for reference,
#: not measures of sharpness: left out of the default measures of the geometry-vs-gap table.
_PLAIN_VALUES = frozenset({"loss", "perturbed_loss", "grad_norm"})


def geometry_correlation(
    runs: pd.DataFrame,
    *,
    measures: Sequence[str] | None = None,
    hyperparameters: Sequence[str] | None = None,
    train: str = "train_acc",
    val: str = "val_acc",
) -> pd.DataFrame:
    """How well each geometry measure ranks trials by their generalisation gap (train - val), by Kendall's tau.

    overall: tau over all finished trials with both values. Within each hyperparameter h (Jiang et al. 2020's
    granulated coefficient): trials that agree on every other hyperparameter form a group; tau within each group
    of 2+ trials, averaged over the groups (tau_<h>, and groups_<h> how many). A measure that only tracks what a
    hyperparameter does to both would score overall and not within. measures: default every `geometry/*` column
    (bookkeeping such as *_std_error left out); hyperparameters: default the factor.* columns and
    optimizer.hparams.* columns that vary. One row per measure: n, tau, p_value, then tau_<h>, groups_<h>;
    n < 3 gets a note (no tau).
    """
    from scipy.stats import kendalltau

    _require_columns(runs, train=train, val=val)
    ok = runs[runs["status"] == "finished"] if "status" in runs.columns else runs
    if measures is None:
        measures = [
            c
            for c in ok.columns
            if c.startswith(METRIC_PREFIX)
            and not c.endswith(_BOOKKEEPING)
            and c.rsplit("/", 1)[-1] not in _PLAIN_VALUES
        ]
    if not measures:
        raise ValueError(
            "runs has no geometry/* column; measure a study's checkpointed trials with analysis.measure_study (or the geometry notebook), or log measures with analysis.log_geometry"
        )
    _require_columns(ok, **{f"measures[{i}]": m for i, m in enumerate(measures)})
    if hyperparameters is None:
        hyperparameters = [
            c
            for c in ok.columns
            if (c.startswith("factor.") or c.startswith("optimizer.hparams.")) and ok[c].astype(str).nunique() > 1
        ]
    gap = pd.to_numeric(ok[train], errors="coerce") - pd.to_numeric(ok[val], errors="coerce")
    rows = []
    for m in measures:
        value = pd.to_numeric(ok[m], errors="coerce")
        keep = np.isfinite(value) & np.isfinite(gap)
        row: dict = {"measure": m, "n": int(keep.sum())}
        if keep.sum() < 3:
            row.update(tau=math.nan, p_value=math.nan, note=f"{int(keep.sum())} trials: no tau")
            rows.append(row)
            continue
        tau, p = kendalltau(value[keep], gap[keep])
        row.update(tau=float(tau), p_value=float(p), note="")
        for h in hyperparameters:
            others = [o for o in hyperparameters if o != h]
            data = pd.DataFrame({"v": value[keep], "g": gap[keep]})
            for o in others:
                data[o] = ok.loc[keep, o].astype(str)
            taus = []
            for _, part in data.groupby(others) if others else [((), data)]:
                if len(part) >= 2 and part["v"].nunique() > 1 and part["g"].nunique() > 1:
                    taus.append(float(kendalltau(part["v"], part["g"])[0]))
            name = h.removeprefix("factor.")
            row[f"tau_{name}"] = float(np.mean(taus)) if taus else math.nan
            row[f"groups_{name}"] = len(taus)
        rows.append(row)
    return pd.DataFrame(rows).set_index("measure")


def _slopes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares slope of each row of y (draws x points) on x."""
    xc = x - x.mean()
    return ((y - y.mean(axis=-1, keepdims=True)) * xc).sum(axis=-1) / (xc**2).sum()


def rho_transfer(result: RhoSensitivity, *, fraction: str = "data.fraction") -> pd.DataFrame:
    """Does the best rho move with the amount of data? From a rho_sensitivity split by fraction (by=(fraction,)).

    One row per (arch, method): the best rho at each fraction with its interval (as columns rho@<f>), the slope
    of log10(best rho) on log10(fraction) by least squares with its interval (slope_low, slope_high:
    `analysis.sweep.transfer_slope`, the slope's range over every choice of a level from each fraction's
    confidence set for its best rho, the sets at 1 - alpha / fractions so that they cover jointly), and `overlap`: whether the best-rho intervals of all fractions share a
    common value. A slope whose interval holds 0 is no evidence that the best rho moves (note says so). Groups
    without intervals (single trials per level) have no slope interval and overlap NaN, and say so in `note`.
    """
    from analysis.sweep import best_level_set, transfer_slope

    name = fraction.removeprefix("factor.")
    names = list(result.best.index.names)
    if name not in names:
        raise ValueError(
            f"result must be split by {fraction!r}: pass by=({fraction!r},) to rho_sensitivity; its groups are {names}"
        )
    best = result.best.reset_index()
    keys = [n for n in names if n != name]
    rows = []
    for key, part in best.groupby(keys, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        part = part.assign(_f=pd.to_numeric(part[name], errors="coerce")).sort_values("_f")
        row = dict(zip(keys, key))
        for _, r in part.iterrows():
            low, high = r["rho_low"], r["rho_high"]
            span = f" [{low:.3g}, {high:.3g}]" if math.isfinite(low) and math.isfinite(high) else ""
            row[f"rho@{r[name]}"] = f"{r['best_rho']:.3g}{span}"
        x, y = np.log10(part["_f"].to_numpy(dtype="float64")), np.log10(part["best_rho"].to_numpy(dtype="float64"))
        fits = len(np.unique(x)) >= 2
        row["slope"] = float(_slopes(x, y[None, :])[0]) if fits else math.nan
        row["slope_low"] = row["slope_high"] = math.nan
        samples = [result.samples.get(tuple(r[n] for n in names)) for _, r in part.iterrows()]
        if fits and all(smp is not None for smp in samples):
            # Each fraction's set at 1 - alpha / F, so that all cover at once and the projected slope interval
            # holds at `confidence` (transfer_slope).
            joint = 1.0 - (1.0 - result.confidence) / len(samples)
            sets = [best_level_set(lv, vals, mode=result.mode, confidence=joint)["set"] for lv, vals in samples]
            slope = transfer_slope(part["_f"].to_numpy(dtype="float64"), part["best_rho"].to_numpy(), sets)
            # The slope from the same weights as its interval, so that rounding cannot put it outside.
            row["slope"], row["slope_low"], row["slope_high"] = slope["slope"], slope["low"], slope["high"]
        lows, highs = part["rho_low"].to_numpy(dtype="float64"), part["rho_high"].to_numpy(dtype="float64")
        notes = []
        if np.isfinite(lows).all() and np.isfinite(highs).all():
            row["overlap"] = bool(lows.max() <= highs.min())
            if row["overlap"]:
                notes.append("intervals overlap: no evidence that the best rho moves")
        else:
            row["overlap"] = math.nan
            notes.append("no interval at some fraction (single trials per level)")
        if math.isfinite(row["slope_low"]) and row["slope_low"] <= 0 <= row["slope_high"]:
            notes.append("the slope's interval holds 0")
        row["note"] = "; ".join(notes)
        row["fractions"] = int(len(part))
        rows.append(row)
    return pd.DataFrame(rows).set_index(keys)


# ------------------------------------------------------------------------------------------------ headline


def _interval_text(p: float, n, scale: float, digits: int) -> str:
    """An accuracy's exact 95% interval on its validation samples, in the headline's units; '' without n."""
    from analysis.runs import accuracy_interval

    if n is None or not math.isfinite(float(n)) or not math.isfinite(p):
        return ""
    low, high = accuracy_interval(p, float(n))
    return f" [{float(low) * scale:.{digits}f}, {float(high) * scale:.{digits}f}]"


def headline(runs: pd.DataFrame, *, metric: str = "val_acc", mode: Mode = "max") -> list[str]:
    """The study's answer in a few lines, for every place that shows it first (the report, the CLI summary):
    per arch (and fraction), the gain of the primary contrast's sharpness-aware level over its plain partner with
    its interval, the rho it chose and the data that chose and measured it; then the best cell, one line below,
    with the exact interval of its accuracy. `runs`: a load_runs frame (search and confirm trials)."""
    from analysis.runs import ACCURACY_METRICS, measured_on, split_stages
    from trainables.metrics import VALIDATION_SAMPLES

    if runs.empty or metric not in runs.columns:
        return []
    search, confirm = split_stages(runs)
    compared = confirm if not confirm.empty else search
    arch = "factor.arch" if "factor.arch" in runs.columns else "model.name"
    method = method_column(runs)
    percent = metric in ACCURACY_METRICS and mode == "max"
    scale, digits, unit = (100.0, 2, " points") if percent else (1.0, 4, "")
    lines = []
    pairs = (
        method_pairs(compared, method=method)
        if {"optimizer.method", method, arch} <= set(compared.columns) and method != "optimizer.method"
        else []
    )
    fractions = sorted(
        pd.to_numeric(compared.get("data.fraction", pd.Series(dtype=float)), errors="coerce").dropna().unique()
    )
    paired = "train.seed" in compared.columns and (len(fractions) >= 2 or not confirm.empty)
    if pairs and paired:
        family = gain_family(compared, pairs, arch=arch, method=method, metric=metric, mode=mode)
        (level, base), gain = next(iter(family.items()))
        for (a, f), row in gain.iterrows():
            where = f"{a}" + (f" at fraction {f}" if len(fractions) >= 2 else "")
            if not math.isfinite(row["gain"]):
                lines.append(f"{where}: {level} - {base}: no seed pair")
                continue
            span = (
                f" [{row['band_low'] * scale:+.{digits}f}, {row['band_high'] * scale:+.{digits}f}]"
                if math.isfinite(row["band_low"])
                else " (no interval: 1 seed pair)"
            )
            rho = _chosen(compared, method, level, arch, a, f if len(fractions) >= 2 else None)
            lines.append(
                f"{where}: {level} - {base} = {row['gain'] * scale:+.{digits}f}{unit}{span} over "
                f"{int(row['n_pairs'])} seed pairs{rho}; {'significant' if _yes(row['significant']) else 'not significant'}"
                f" (95% simultaneous over the {gain.attrs['family_size']} gain tests, Holm)"
            )
        lines.append(f"(knobs chosen on the search trials; gains measured on: {measured_on(compared)})")
    elif pairs:
        level, base = _primary_first(pairs)[0]
        best = best_trials(_ok(compared, metric), metric=metric, mode=mode, by=[arch, method])
        for a in sorted(best[arch].dropna().astype(str).unique()):
            side = {str(r[method]): r for _, r in best[best[arch].astype(str) == a].iterrows()}
            if level not in side or base not in side:
                continue
            t, b = side[level], side[base]
            n_t, n_b = t.get(VALIDATION_SAMPLES), b.get(VALIDATION_SAMPLES)
            rho = f", rho = {float(t[RHO]):.3g}" if RHO in t and pd.notna(t[RHO]) else ""
            lines.append(
                f"{a}: {level} - {base} = {(t[metric] - b[metric]) * scale:+.{digits}f}{unit} (no interval for the "
                f"gain: one run a side; {level} {t[metric] * scale:.{digits}f}{_interval_text(t[metric], n_t, scale, digits)}"
                f"{rho}, {base} {b[metric] * scale:.{digits}f}{_interval_text(b[metric], n_b, scale, digits)})"
            )
        lines.append(f"(each side its cell's best trial, chosen and measured on: {measured_on(compared)})")
    pool = _ok(search if not search.empty else compared, metric).assign(_all=0)
    top = best_trials(pool, metric=metric, mode=mode, by=["_all"])
    if len(top):
        t = top.iloc[0]
        n = t.get(VALIDATION_SAMPLES) if metric in ACCURACY_METRICS else None
        rho = f", rho = {float(t[RHO]):.3g}" if RHO in t and pd.notna(t[RHO]) and float(t[RHO]) > 0 else ""
        lines.append(
            f"Best cell: {cell_key_name(t['cell'])}: {metric} {t[metric] * scale:.{digits}f}"
            f"{_interval_text(t[metric], n, scale, digits) and ' 95% exact' + _interval_text(t[metric], n, scale, digits)}"
            f"{rho} (the best of its search: chosen and scored on the same data)"
        )
    return lines


def _chosen(runs, method, level, arch, a, fraction) -> str:
    """', rho = x' where the `level` cell's compared runs at (arch, fraction) share one rho; else ''."""
    if RHO not in runs.columns:
        return ""
    part = runs[(runs[method].astype(str) == level) & (runs[arch].astype(str) == str(a))]
    if fraction is not None:
        part = part[pd.to_numeric(part["data.fraction"], errors="coerce") == float(fraction)]
    values = pd.to_numeric(part[RHO], errors="coerce").dropna().unique()
    return f", rho = {values[0]:.3g}" if len(values) == 1 else ""
