"""The whole study at once: every trial's factors, searched knobs and objective on one parallel-coordinates plot, and
each knob's share of the objective's variance over all trials (the cross-cell view of W&B sweeps and HParams)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from analysis.runs import best_key
from trainables.config import TrialConfig
from trainables.naming import FACTOR_PREFIX

__all__ = [
    "PLAIN_METHOD",
    "best_level_set",
    "knob_importance",
    "plot_parallel_coordinates",
    "study_knobs",
    "transfer_slope",
]

# optimizer.method of a plain trial (the base optimizer alone, rho = 0): the study's baseline cells.
PLAIN_METHOD = "none"
_METHOD = "optimizer.method"
# Trial-config paths a search can vary (the config's sections); their seeds vary by repeat, not by search.
_CONFIG_SECTIONS = tuple(f"{section}." for section in TrialConfig.model_fields)
# Fewer trials than this in a group (a factor's level, a knob's bin in a cell): the shares are mostly noise.
FEW_PER_GROUP = 3


def _finished(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    if runs.empty or metric not in runs.columns:
        return runs.iloc[0:0]
    values = pd.to_numeric(runs[metric], errors="coerce").astype("float64")
    ok = pd.Series(np.isfinite(values.to_numpy()), index=runs.index)
    if "status" in runs.columns:
        ok &= runs["status"] == "finished"
    return runs[ok].assign(**{metric: values[ok]})


def study_knobs(runs: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(factors, searched knobs) of a load_runs frame: the `factor.*` columns with two or more levels, and the
    numeric trial-config paths that vary within some cell (what a search sampled; seeds aside)."""
    factors = [c for c in runs.columns if c.startswith(FACTOR_PREFIX) and runs[c].dropna().nunique() >= 2]
    searched = []
    for c in runs.columns:
        if not c.startswith(_CONFIG_SECTIONS) or c.endswith("seed") or c in factors:
            continue
        values = pd.to_numeric(runs[c], errors="coerce")
        if values.notna().sum() < 2 or runs[c].dtype == bool:
            continue
        varies = values.groupby(runs["cell"]).nunique() if "cell" in runs.columns else pd.Series([values.nunique()])
        if (varies >= 2).any():
            searched.append(c)
    return factors, searched


def _is_baseline(runs: pd.DataFrame) -> pd.Series:
    if _METHOD not in runs.columns:
        return pd.Series(False, index=runs.index)
    return runs[_METHOD].astype(str) == PLAIN_METHOD


def _bins(values: np.ndarray) -> np.ndarray:
    """Quantile bins of one cell's knob values: 2 bins below 6 trials, else up to 4 of at least 3 trials each."""
    m = len(values)
    b = 2 if m < 6 else min(4, m // FEW_PER_GROUP)
    ranks = pd.Series(values).rank(method="average").to_numpy() - 1
    return np.minimum((ranks * b / m).astype(int), b - 1)


def _permuted(rng: np.random.Generator, y: np.ndarray, strata: np.ndarray) -> np.ndarray:
    """y shuffled within each stratum."""
    out = y.copy()
    for s in np.unique(strata):
        i = np.flatnonzero(strata == s)
        out[i] = rng.permutation(y[i])
    return out


def _between(y: np.ndarray, groups: np.ndarray) -> float:
    """The sum of squares between the groups' means (each group's size times its squared offset)."""
    out = 0.0
    for g in np.unique(groups):
        part = y[groups == g]
        out += len(part) * (part.mean() - y.mean()) ** 2
    return out


def _factor_row(ok, y, total, f, factors, rng, n_perm) -> dict | None:
    """A factor's row of knob_importance: its levels' share of the variance and its permutation chance level."""
    groups = ok[f].astype(str).to_numpy()
    sizes = pd.Series(groups).value_counts()
    if len(sizes) < 2 or total == 0:
        return None
    share = _between(y, groups) / total
    # The null keeps the other factors' effects: y is permuted within each combination of their levels (a
    # permutation over all trials would mix them into this factor's groups, and never call it above chance).
    others = [o for o in factors if o != f and o in ok.columns]
    strata = ok[others].astype(str).agg("|".join, axis=1).to_numpy() if others else np.zeros(len(y), dtype=str)
    null = np.array([_between(_permuted(rng, y, strata), groups) / total for _ in range(n_perm)])
    return {
        "kind": "factor",
        "groups": len(sizes),
        "min_group": int(sizes.min()),
        "n": len(y),
        "share": share,
        "within_share": math.nan,
        "chance": float(np.quantile(null, 0.95)),
        "p": (1 + int((null >= share - 1e-12).sum())) / (1 + n_perm),
    }


def _knob_row(ok, y, total, k, cells, rng, n_perm) -> dict | None:
    """A searched knob's row of knob_importance: what its bins explain within the cells that search it."""
    values = pd.to_numeric(ok[k], errors="coerce").to_numpy(dtype="float64")
    parts = []  # (indices of a cell's trials with the knob, their bins)
    for cell in np.unique(cells):
        idx = np.flatnonzero((cells == cell) & np.isfinite(values))
        if len(idx) >= 2 and len(np.unique(values[idx])) >= 2:
            parts.append((idx, _bins(values[idx])))
    if not parts or total == 0:
        return None
    within = sum(float(((y[i] - y[i].mean()) ** 2).sum()) for i, _ in parts)

    def explained(yy: np.ndarray) -> float:
        return sum(_between(yy[i], b) for i, b in parts)

    base = explained(y)
    null = np.array([explained(_permuted(rng, y, cells)) / total for _ in range(n_perm)])
    sizes = [int(np.bincount(b).min()) for _, b in parts]
    return {
        "kind": "searched",
        "groups": sum(len(np.unique(b)) for _, b in parts),
        "min_group": min(sizes),
        "n": sum(len(i) for i, _ in parts),
        "share": base / total,
        "within_share": base / within if within > 0 else math.nan,
        "chance": float(np.quantile(null, 0.95)),
        "p": (1 + int((null >= base / total - 1e-12).sum())) / (1 + n_perm),
    }


def knob_importance(
    runs: pd.DataFrame,
    *,
    metric: str,
    factors: Sequence[str] | None = None,
    knobs: Sequence[str] | None = None,
    n_perm: int = 999,
    seed: int = 0,
) -> pd.DataFrame:
    """Each factor's and searched knob's share of the variance of `metric` over the study's finished trials.

    A factor's share: the variance between its levels' means over all the variance (eta squared, one-way, over
    every trial). A searched knob's share: what its quantile bins explain of the variance within the cells that
    search it (pooled over those cells: the cell means removed, so the factors do not count for it), over all the
    variance; `within_share` is the same over the within-cell variance alone. Shares are marginal (each knob
    alone): they need not add to 1 (interactions, unbalanced cells).

    Small groups make any share large: `chance` is the 95th percentile of the share over `n_perm` permutations
    of the objective (over all trials for a factor, within cells for a knob), what a knob without any effect
    shows in this design (permuted within each combination of the other factors' levels for a factor, within
    cells for a knob); `p` the permutation p-value; `above_chance` share > chance. Columns: kind, groups (levels
    or bins), min_group (trials in the smallest), n, share, within_share, chance, p, above_chance; `attrs['caveat']`
    says when groups hold fewer than FEW_PER_GROUP trials. Empty when fewer than 3 trials finished.
    """
    ok = _finished(runs, metric)
    if factors is None or knobs is None:
        found = study_knobs(ok)
        factors = found[0] if factors is None else factors
        knobs = found[1] if knobs is None else knobs
    out = pd.DataFrame(
        columns=["kind", "groups", "min_group", "n", "share", "within_share", "chance", "p", "above_chance"]
    )
    out.index.name = "knob"
    if len(ok) < 3:
        out.attrs["caveat"] = f"{len(ok)} finished trial(s): too few for any share."
        return out
    rng = np.random.default_rng(seed)
    y = ok[metric].to_numpy(dtype="float64")
    total = float(((y - y.mean()) ** 2).sum())
    rows = {}
    for f in factors:
        row = _factor_row(ok, y, total, f, factors, rng, n_perm) if f in ok.columns else None
        if row is not None:
            rows[f] = row
    cells = ok["cell"].astype(str).to_numpy() if "cell" in ok.columns else np.zeros(len(ok), dtype=str)
    for k in knobs:
        row = _knob_row(ok, y, total, k, cells, rng, n_perm) if k in ok.columns else None
        if row is not None:
            rows[k] = row
    if rows:
        out = pd.DataFrame.from_dict(rows, orient="index")[out.columns[:-1]]
        out["above_chance"] = out["share"] > out["chance"]
        out.index.name = "knob"
        out = out.sort_values("share", ascending=False)
    few = out[out["min_group"] < FEW_PER_GROUP] if not out.empty else out
    if len(ok) < 20 or not few.empty:
        out.attrs["caveat"] = (
            f"Few trials ({len(ok)} finished"
            + (f"; {', '.join(few.index)} with groups of {int(few['min_group'].min())}" if not few.empty else "")
            + "): a share this design gives a knob with no effect at all is up to its `chance` column; read a share "
            "only against it, and a share below it as no evidence either way."
        )
    return out


# A category's trials spread over this share of its slot (ordered by the objective), so that lines through one
# level fan out instead of meeting in one point; the rest of the slot keeps neighbouring levels apart.
CATEGORY_SPREAD = 0.6
# The colour scale runs between these percentiles of the objective (nearest trial): one outlying trial does not
# spend the whole scale; trials beyond them take the end colours (the colour bar's arrows).
COLOR_PERCENTILES = (5, 95)


def _axis_values(part: pd.Series, *, categorical: bool, spread_by: np.ndarray | None = None):
    """Positions in [0, 1] of one axis' values, with the ticks (position, label) to draw; a missing numeric value
    (a cell that does not search the knob) goes to a slot below the axis. Categories sit evenly spaced, each
    level's trials spread across CATEGORY_SPREAD of its slot in the order of `spread_by` (the objective)."""
    if categorical:
        levels = sorted(part.dropna().astype(str).unique())
        slot = 1.0 / len(levels)
        where = {lv: (i + 0.5) * slot for i, lv in enumerate(levels)}
        text = part.astype(str).to_numpy()
        pos = pd.Series(text).map(where).to_numpy(dtype="float64", copy=True)
        rank = spread_by if spread_by is not None else np.arange(len(text), dtype="float64")
        for lv in levels:
            members = np.flatnonzero(text == lv)
            if len(members) > 1:
                order = members[np.argsort(rank[members], kind="stable")]
                pos[order] += (np.linspace(0.0, 1.0, len(order)) - 0.5) * CATEGORY_SPREAD * slot
        return pos, [(where[lv], lv) for lv in levels], False
    values = pd.to_numeric(part, errors="coerce").to_numpy(dtype="float64")
    known = values[np.isfinite(values)]
    lo, hi = float(known.min()), float(known.max())
    log = lo > 0 and hi / lo >= 10
    f = np.log10 if log else (lambda v: v)
    span = (f(hi) - f(lo)) or 1.0
    pos = (f(np.where(np.isfinite(values), values, lo)) - f(lo)) / span
    ticks = [(0.0, f"{lo:.3g}"), (1.0, f"{hi:.3g}")]
    if log:
        inner = [
            m * 10.0**d for d in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1) for m in (1, 2, 5)
        ]
    else:
        inner = list(MaxNLocator(nbins=5).tick_values(lo, hi)) if hi > lo else []
    for v in inner:
        p = (f(v) - f(lo)) / span
        if 0.08 < p < 0.92:
            ticks.append((p, f"{v:.4g}"))
    missing = not np.isfinite(values).all()
    pos = np.where(np.isfinite(values), pos, -0.15)
    if missing:
        ticks.append((-0.15, "not searched"))
    return pos, ticks, log


def plot_parallel_coordinates(
    runs: pd.DataFrame,
    *,
    metric: str,
    mode: Literal["max", "min"] = "max",
    factors: Sequence[str] | None = None,
    knobs: Sequence[str] | None = None,
    links: Mapping[str, str] | None = None,
    path: str | Path | None = None,
    title: str | None = None,
) -> Figure:
    """Every finished trial of the study as one line across its factors, searched knobs and `metric` (the last
    axis), coloured by `metric` (brighter is better); baseline trials (optimizer.method 'none') dashed black, the
    best trial (BEST_RULE) thick red. A knob a cell does not search sits at 'not searched' below its axis. A factor's
    levels sit evenly spaced and labelled, each level's trials fanned out by the objective; numeric axes carry
    rounded ticks between their ends; the colour scale is clipped at COLOR_PERCENTILES (the colour bar says so).

    links: run id -> URL; each trial's line links there in the SVG (`fig.savefig(..., format='svg')`), e.g. to its
    MLflow run. path: a .png or .svg file to write."""
    ok = _finished(runs, metric)
    if factors is None or knobs is None:
        found = study_knobs(ok)
        factors = found[0] if factors is None else factors
        knobs = found[1] if knobs is None else knobs
    axes = [c for c in (*factors, *knobs) if c in ok.columns]
    if "cell" in ok.columns and not factors:
        axes.insert(0, "cell")
    axes.append(metric)
    fig = Figure(figsize=(max(6.0, 1.9 * len(axes)), 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    if ok.empty:
        ax.text(0.5, 0.5, f"no finished trial with {metric}", ha="center", transform=ax.transAxes)
        ax.set_axis_off()
        return _write(fig, path)
    y = ok[metric].to_numpy(dtype="float64")
    columns = _draw_axes(ax, ok, axes, y, metric=metric, mode=mode)
    low, high = (float(np.percentile(y, q, method="nearest")) for q in COLOR_PERCENTILES)
    if high <= low:
        low, high = float(y.min()), float(y.max())
    clipped = bool(y.min() < low or y.max() > high)
    norm = Normalize(vmin=low, vmax=high if high > low else low + 1e-9, clip=True)
    cmap = colormaps["viridis" if mode == "max" else "viridis_r"]
    baseline = _is_baseline(ok).to_numpy()
    started = ok["start_time"] if "start_time" in ok.columns else pd.Series(0, index=ok.index)
    ids = ok["run_id"].astype(str).to_numpy() if "run_id" in ok.columns else np.array([""] * len(ok))
    best = min(range(len(ok)), key=lambda i: best_key(y[i], started.iloc[i], ids[i], mode))
    xs = np.arange(len(axes))
    order = np.argsort(y if mode == "max" else -y)  # the better trials drawn last, over the others
    for i in order:
        ys = [columns[c][i] for c in axes]
        style = dict(color=cmap(norm(y[i])), linewidth=1.3, alpha=0.85, zorder=3)
        if baseline[i]:
            style.update(color="black", linestyle=(0, (4, 2)), linewidth=1.4, alpha=0.9, zorder=4)
        if i == best:
            style.update(color="red", linewidth=3.0, alpha=1.0, zorder=5)
        (line,) = ax.plot(xs, ys, **style)
        if links and ids[i] in links:
            line.set_url(links[ids[i]])
            line.set_gid(f"trial-{ids[i]}")
    ax.set_xlim(-0.6, len(axes) - 0.6)
    ax.set_ylim(-0.25, 1.15)
    ax.set_axis_off()
    lo_q, hi_q = COLOR_PERCENTILES
    label = f"{metric} (colour clipped to its {lo_q}th-{hi_q}th percentile)" if clipped else metric
    extend = {(True, True): "both", (True, False): "min", (False, True): "max"}.get(
        (bool(y.min() < low), bool(y.max() > high)), "neither"
    )
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label=label, shrink=0.8, extend=extend)
    _legend(ax, baseline, best)
    failed = len(runs) - len(ok)
    fig.suptitle(
        title
        or f"Every trial of the study ({len(ok)} finished{f', {failed} without {metric} left out' if failed else ''}):"
        " one line each, across the factors and searched knobs to the objective",
        fontsize=9,
    )
    return _write(fig, path)


def _draw_axes(ax, ok: pd.DataFrame, axes: list[str], y: np.ndarray, *, metric: str, mode: str) -> dict:
    """Each axis of the parallel-coordinates plot drawn at its index, its ticks beside it and its name on top;
    returns each axis' trial positions (0..1, 'not searched' below)."""
    columns = {}
    for j, col in enumerate(axes):
        categorical = col == "cell" or col.startswith(FACTOR_PREFIX)
        pos, ticks, log = _axis_values(ok[col], categorical=categorical, spread_by=y)
        columns[col] = pos
        ax.axvline(j, color="0.35", linewidth=1.0, zorder=1)
        for p, label in ticks:
            ax.text(
                j - 0.03,
                p,
                label,
                ha="right",
                va="center",
                fontsize=7,
                zorder=6,
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 0.5},
            )
            ax.plot([j - 0.02, j], [p, p], color="0.35", linewidth=1.0, zorder=1)
        name = col.removeprefix(FACTOR_PREFIX).rsplit(".", 1)[-1] if col != metric else f"{metric} ({mode})"
        ax.text(j, 1.06, name + (" (log)" if log else ""), ha="center", va="bottom", fontsize=9, weight="bold")
    return columns


def _legend(ax, baseline: np.ndarray, best: int) -> None:
    """The legend of the parallel-coordinates plot: the best trial's line, and the baselines' where there are any."""
    best_style = (0, (4, 2)) if baseline[best] else "-"
    handles = [
        Line2D(
            [],
            [],
            color="red",
            linewidth=3.0,
            linestyle=best_style,
            label="best trial" + (" (a baseline)" if baseline[best] else ""),
        )
    ]
    if baseline.any():
        handles.append(Line2D([], [], color="black", linestyle=(0, (4, 2)), label="baseline (optimizer alone)"))
    ax.legend(handles=handles, loc="lower right", fontsize=7, bbox_to_anchor=(1.0, -0.02))


def _write(fig: Figure, path: str | Path | None) -> Figure:
    if path is not None:
        path = Path(path)
        if path.suffix.lower() not in (".png", ".svg"):
            raise ValueError(f"path must end in .png or .svg, got {str(path)!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


# ----------------------------------------------------------------------------- the best level, honestly


def best_level_set(
    levels: Sequence[float],
    values: Sequence[Sequence[float]],
    *,
    mode: Literal["max", "min"] = "max",
    confidence: float = 0.95,
) -> dict:
    """The levels (e.g. rho values) not significantly worse than the best: a confidence set for the best level.

    values: per level, its runs' metric (several seeds or repeats each). A level stays in the set unless some
    other level beats it by more than Welch's one-sided t at level (1 - confidence) / (k - 1) (Bonferroni over
    the k - 1 comparisons a level faces), so the truly best level is left out with probability at most
    1 - confidence whatever the others are: calibrated at ties, where the percentile bootstrap of an argmax
    drops levels exactly as good in 41-43% of flat studies (issue 32). Returns best (the level with the best
    mean), set (the levels kept, sorted), confidence, and note; a level with fewer than 2 runs has no spread to
    compare, so no set is given (set None) and the note says why."""
    from scipy.stats import t as student

    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    if not (0.0 < confidence < 1.0):
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    levels = [float(v) for v in levels]
    if len(levels) != len(values) or not levels:
        raise ValueError(f"give one list of values per level, got {len(levels)} levels and {len(values)} lists")
    sign = 1.0 if mode == "max" else -1.0
    runs = [sign * np.asarray(v, dtype="float64")[np.isfinite(np.asarray(v, dtype="float64"))] for v in values]
    means = np.array([r.mean() if len(r) else -math.inf for r in runs])
    best = levels[int(np.argmax(means))]
    if len(levels) == 1:
        return {"best": best, "set": [best], "confidence": confidence, "note": "one level"}
    if min(len(r) for r in runs) < 2:
        return {
            "best": best,
            "set": None,
            "confidence": confidence,
            "note": "a level has fewer than 2 runs: no spread, no confidence set for the best level (repeat levels)",
        }
    alpha = (1.0 - confidence) / (len(levels) - 1)
    keep = []
    for i, ri in enumerate(runs):
        beaten = False
        for j, rj in enumerate(runs):
            if i == j:
                continue
            vi, vj = ri.var(ddof=1) / len(ri), rj.var(ddof=1) / len(rj)
            se = math.sqrt(vi + vj)
            df = (vi + vj) ** 2 / (vi**2 / (len(ri) - 1) + vj**2 / (len(rj) - 1)) if se > 0 else 1.0
            gap = rj.mean() - ri.mean()
            if (gap > 0 and se == 0) or (se > 0 and gap > float(student.ppf(1.0 - alpha, df)) * se):
                beaten = True
                break
        if not beaten:
            keep.append(levels[i])
    note = (
        f"levels not worse than another by more than one-sided Welch t at {1 - confidence:.2g}/{len(levels) - 1} "
        "(Bonferroni): contains the best level with probability >= "
        f"{confidence:.0%}"
    )
    return {"best": best, "set": sorted(keep), "confidence": confidence, "note": note}


def transfer_slope(fractions: Sequence[float], best: Sequence[float], sets: Sequence[Sequence[float] | None]) -> dict:
    """The slope of log10(best level) on log10(fraction), with the interval the best-level sets imply.

    sets: each fraction's confidence set for its best level (`best_level_set` at confidence 1 - alpha / F for a
    joint 1 - alpha over F fractions). The slope is linear in the best levels, so its smallest and largest values
    over every choice of a level from each set are closed-form (each weight takes its set's lowest or highest
    log level): an interval that covers the slope between the true best levels whenever every set covers, a
    projection, conservative rather than a bootstrap of an argmax (whose slope exceeded 0.5 in absolute value in
    57% of null studies, issue 32). Returns slope, low, high, note; no interval where a set is missing."""
    x = np.log10(np.asarray(fractions, dtype="float64"))
    y = np.log10(np.asarray(best, dtype="float64"))
    if len(np.unique(x)) < 2 or len(x) != len(y) or len(sets) != len(x):
        raise ValueError("transfer_slope needs one best level and one set per fraction, at 2+ distinct fractions")
    w = (x - x.mean()) / ((x - x.mean()) ** 2).sum()
    slope = float(w @ y)
    if any(s is None or not len(s) for s in sets):
        return {"slope": slope, "low": math.nan, "high": math.nan, "note": "no interval: a fraction has no set"}
    lo_y = np.array([math.log10(min(s)) for s in sets])
    hi_y = np.array([math.log10(max(s)) for s in sets])
    low = float(np.where(w > 0, w * lo_y, w * hi_y).sum())
    high = float(np.where(w > 0, w * hi_y, w * lo_y).sum())
    # Where each best level lies in its set the slope is inside the projection; summed in another order, rounding
    # could put it a few ulps outside.
    if all(min(s) <= b <= max(s) for s, b in zip(sets, best)):
        low, high = min(low, slope), max(high, slope)
    note = "the interval holds 0: no evidence that the best level moves with the data" if low <= 0 <= high else ""
    return {"slope": slope, "low": low, "high": high, "note": note}
