"""Figures of a study (matplotlib, no pyplot state): error vs data on log-log axes, SAM's gain, accuracy vs rho, learning
curves, accuracy against compute.

One visual grammar in every figure: colour = architecture, line style and marker = method; n is in the legend or
next to each point; an interval is drawn only where there are at least two samples to give one; a point a log axis
cannot show (an error of 0) is marked at the axis edge, never dropped silently."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from analysis.geometry.names import METRIC_PREFIX
from analysis.runs import ACCURACY_METRICS
from analysis.scaling import PowerLawFit
from analysis.tables import RhoSensitivity, ScalingTable

__all__ = [
    "plot_compute_frontier",
    "plot_curves",
    "plot_error_vs_n",
    "plot_gain",
    "plot_rho_sensitivity",
    "plot_sharpness",
]


def _figure(width: float = 6.0, height: float = 4.0) -> Figure:
    # A bare Figure on the Agg canvas: no pyplot, so no global figure registry, no GUI backend, safe in threads.
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _finish(fig: Figure, path: str | Path | None) -> Figure:
    if path is not None:
        path = Path(path)
        if path.suffix.lower() != ".png":
            raise ValueError(f"path must end in .png (the figures are written as PNG), got {str(path)!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


_LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (3, 1, 1, 1, 1, 1)))
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


class _Style:
    """Colour by architecture, line style and marker by method: the same in every figure of a report."""

    def __init__(self, archs, methods) -> None:
        self.archs = list(dict.fromkeys(map(str, archs)))
        self.methods = list(dict.fromkeys(map(str, methods)))

    def color(self, arch) -> str:
        return f"C{self.archs.index(str(arch)) % 10}" if str(arch) in self.archs else "grey"

    def line(self, method):
        i = self.methods.index(str(method)) if str(method) in self.methods else 0
        return _LINESTYLES[i % len(_LINESTYLES)], _MARKERS[i % len(_MARKERS)]

    def legend_handles(self, *, markers: bool = True) -> list:
        """Proxy entries that explain the two encodings once: a colour per arch, a line style per method (with its
        marker where the plot draws markers: a legend shows only what the lines show)."""
        handles = [Line2D([], [], color=self.color(a), linewidth=3, label=f"arch: {a}") for a in self.archs]
        for m in self.methods:
            ls, marker = self.line(m)
            marker = marker if markers else None
            handles.append(Line2D([], [], color="black", linestyle=ls, marker=marker, label=f"method: {m}"))
        return handles


def _panels(keys: list, width: float = 4.2, height: float = 3.8, *, sharey: bool = True) -> tuple[Figure, dict]:
    """One axes per distinct first key (the architecture), side by side, sharing the y axis unless told not to."""
    firsts = list(dict.fromkeys(k[0] for k in keys))
    fig = _figure(max(width * len(firsts), 5.0), height)
    axes = fig.subplots(1, max(len(firsts), 1), squeeze=False, sharey=sharey)[0]
    return fig, dict(zip(firsts, axes))


def _n_text(counts) -> str:
    counts = sorted({int(c) for c in counts if c > 0})
    if not counts:
        return "n=0"
    return f"n={counts[0]}" if len(counts) == 1 else f"n={counts[0]}-{counts[-1]}"


def _per_level(counts) -> str:
    """'1 trial per level', '2-4 trials per level': the legend's count in words, not as n=1 trials."""
    counts = sorted({int(c) for c in counts if c > 0})
    if not counts:
        return "no trials"
    span = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return f"{span} trial{'' if counts == [1] else 's'} per level"


def _bars(ax, x, y, sd, color) -> None:
    """± sd error bars at the points that have one (n > 1); none at all, not zero-length ones, elsewhere."""
    has = np.isfinite(sd) & np.isfinite(y)
    if has.any():
        ax.errorbar(x[has], y[has], yerr=sd[has], fmt="none", ecolor=color, capsize=3)


def _mark_off_axis(ax, x, label_used: list) -> None:
    """Values a log y axis cannot show (<= 0), as open triangles on its bottom edge, with one legend entry."""
    if len(x) == 0:
        return
    transform = ax.get_xaxis_transform()  # x in data units, y in axes units
    label = None if label_used else "error 0 (a log axis cannot show it): on the bottom edge"
    ax.plot(
        x,
        np.full(len(x), 0.0),
        linestyle="none",
        marker="v",
        markersize=8,
        markerfacecolor="none",
        markeredgecolor="black",
        transform=transform,
        clip_on=False,
        label=label,
    )
    label_used.append(True)


def plot_error_vs_n(
    table: ScalingTable,
    fits: Mapping[tuple[str, str], PowerLawFit] | None = None,
    *,
    as_error: bool | None = None,
    path: str | Path | None = None,
    title: str | None = None,
) -> Figure:
    """Error against training-set size on log-log axes: colour = arch, style = method; mean over seeds, ± sd where n > 1.
    A table of one training-set size is drawn on plain axes, its title saying so.

    as_error: plot 1 - metric (None: when the table maximised its metric, i.e. an accuracy). fits: from
    fit_scaling_table, drawn thin over the measured range. A mean error of 0 is marked on the bottom edge.
    """
    if as_error is None:
        as_error = table.mode == "max"
    keys = [tuple(map(str, k)) for k in table.mean.index]
    style = _Style([k[0] for k in keys], [k[1] for k in keys])
    fig = _figure(6.5, 4.5)
    ax = fig.add_subplot()
    off_axis: list = []
    xs = []
    sizes = {float(v) for v in table.mean.columns}
    single = len(sizes) < 2
    for key, (arch, method) in zip(table.mean.index, keys):
        mean = table.mean.loc[key]
        x = np.asarray([float(v) for v in mean.index])
        y = mean.to_numpy(dtype="float64")
        y = 1.0 - y if as_error else y
        n = table.n.loc[key].to_numpy()
        sd = np.where(n > 1, table.sd.loc[key].to_numpy(dtype="float64"), np.nan)
        color, (ls, marker) = style.color(arch), style.line(method)
        xs.extend(x[np.isfinite(y)])
        # Plain axes (one size) show an error of 0 as it is; only a log axis needs it marked on its edge.
        shown = np.isfinite(y) & ((y > 0) | single)
        ax.plot(
            x[shown],
            y[shown],
            color=color,
            linestyle=ls,
            marker=marker,
            label=f"{arch} / {method} ({_n_text(n)} seeds)",
        )
        _bars(ax, x[shown], y[shown], sd[shown], color)
        _mark_off_axis(ax, x[np.isfinite(y) & ~shown], off_axis)
        fit = (fits or {}).get((arch, method))
        if fit is not None:
            grid = np.geomspace(fit.n.min(), fit.n.max(), 100)
            ax.plot(grid, fit.predict(grid), color=color, linestyle=ls, linewidth=0.8, alpha=0.6)
    frac = (table.columns.get("fraction") or "n").removeprefix("factor.")
    single = len(set(xs)) < 2
    if single:
        # One training-set size has no scaling to show: plain axes around it, not a log-log plot of one x.
        if xs:
            ax.set_xlim(xs[0] * 0.8, xs[0] * 1.2)
            ax.set_xticks([xs[0]])
    else:
        _log_axis(ax.xaxis, ax.set_xscale)
        _log_axis(ax.yaxis, ax.set_yscale)
        ax.set_xlim(min(xs) / 1.25, max(xs) * 1.25)  # the measured range, not matplotlib's padding to the next decade
    ax.set_xlabel(f"training-set size ({frac})")
    ax.set_ylabel(f"1 - {table.metric} (error)" if as_error else table.metric)
    extra = "; thin lines: power-law fits" if fits else ""
    ax.legend(fontsize=7, title=f"mean ± sd over seeds (no bar where n = 1){extra}", title_fontsize=7)
    fig.suptitle(
        title
        or (
            f"One training-set size ({frac} = {xs[0]:g}): no scaling to show; best-of-search {table.metric}"
            if single and xs
            else f"Data scaling: best-of-search {table.metric}"
        )
    )
    return _finish(fig, path)


def plot_gain(
    gain: pd.DataFrame,
    *,
    path: str | Path | None = None,
    title: str | None = None,
    interval: tuple[str, str] = ("ci_low", "ci_high"),
    interval_label: str | None = None,
) -> Figure:
    """The gain (treatment - baseline) against training-set fraction, colour = arch; n pairs beside each point.

    interval: the two columns its bars draw (default sam_gain's per-row Student-t over seed pairs; the report draws
    its family's simultaneous band), interval_label what they are, in the title. Drawn only where it exists (2+
    seed pairs); a single pair is an open marker.
    """
    missing = [c for c in ("gain", *interval) if c not in gain.columns]
    if missing or gain.index.nlevels != 2:
        raise ValueError(
            f"gain must be the DataFrame of sam_gain (index arch, fraction; columns gain, ci_low, ci_high); missing {missing}"
        )
    archs = list(dict.fromkeys(map(str, gain.index.get_level_values(0))))
    style = _Style(archs, [gain.attrs.get("treatment", "treatment")])
    fig = _figure()
    ax = fig.add_subplot()
    for arch, part in gain.groupby(level=0, sort=True):
        x = np.asarray([float(v) for v in part.index.get_level_values(1)])
        order = np.argsort(x)
        x = x[order]
        y = part["gain"].to_numpy(dtype="float64")[order]
        lo = part[interval[0]].to_numpy(dtype="float64")[order]
        hi = part[interval[1]].to_numpy(dtype="float64")[order]
        pairs = part["n_pairs"].to_numpy()[order] if "n_pairs" in part.columns else np.full(len(x), 2)
        color = style.color(arch)
        ax.plot(x, y, color=color, linestyle="-", linewidth=1, label=f"{arch} ({_n_text(pairs)} seed pairs)")
        has = np.isfinite(lo) & np.isfinite(hi)
        ax.errorbar(x[has], y[has], yerr=[y[has] - lo[has], hi[has] - y[has]], fmt="o", color=color, capsize=3)
        ax.plot(x[~has], y[~has], "o", markerfacecolor="white", markeredgecolor=color)
        for xi, yi, n in zip(x, y, pairs):
            if np.isfinite(yi):
                ax.annotate(f"n={int(n)}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=6, color=color)
    base = gain.attrs.get("baseline", "baseline")
    treat = gain.attrs.get("treatment", "treatment")
    ax.axhline(0.0, color="black", linewidth=0.8, linestyle="--", label=f"no gain ({treat} = {base})")
    fractions = np.asarray(sorted({float(v) for v in gain.index.get_level_values(1)}))
    fractions = fractions[np.isfinite(fractions) & (fractions > 0)]
    if len(fractions) > 1:
        # The design's fractions, not matplotlib's padding to whole decades.
        _log_axis(ax.xaxis, ax.set_xscale)
        ax.set_xlim(fractions.min() / 1.25, fractions.max() * 1.25)
    elif len(fractions) == 1:
        # One fraction: a log axis around a single value would span 0.1 to 10; plain axes about it instead.
        ax.set_xlim(fractions[0] * 0.8, fractions[0] * 1.2)
        ax.set_xticks([fractions[0]])
    ax.set_xlabel("training-set fraction")
    metric = gain.attrs.get("metric", "metric")
    ax.set_ylabel(f"gain in {metric} ({treat} - {base})")
    conf = gain.attrs.get("confidence")
    what = interval_label or (
        f"{int(round(conf * 100))}% Student-t interval over seed pairs, unadjusted"
        if conf
        else "interval over seed pairs"
    )
    ax.set_title(title or f"Paired gain; bars: {what} (open: one pair, no interval)", fontsize=9)
    ax.legend(fontsize=7)
    return _finish(fig, path)


def plot_rho_sensitivity(result: RhoSensitivity, *, path: str | Path | None = None, title: str | None = None) -> Figure:
    """Metric against rho (log x), one panel per arch, colour = arch, style = method (and `by` levels):
    mean per level with its interval at every level whose sampling error is known (`_level_intervals`: mean ± t·SE
    where n > 1, Clopper-Pearson for a single trial's accuracy), named in the title; the best level starred behind
    the points; its confidence set shaded only where one exists; the baseline (rho = 0) dashed and in the legend."""
    groups = list(result.best.index.names)
    keys = [k if isinstance(k, tuple) else (k,) for k in result.best.index]
    accuracy = result.metric in ACCURACY_METRICS
    # Each architecture on its own y axis: one arch's range (an outlier at a large rho) would flatten the others.
    fig, panels = _panels([tuple(map(str, k)) for k in keys], sharey=False)
    style = _Style([k[0] for k in keys], [" / ".join(map(str, k[1:])) or str(k[0]) for k in keys])
    baselines_drawn: set = set()
    for key, part in result.levels.groupby(groups, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        ax = panels[str(key[0])]
        part = part.sort_values("rho")
        label = " / ".join(map(str, key[1:])) or str(key[0])
        color, (ls, marker) = style.color(key[0]), style.line(label)
        rho, mean = part["rho"].to_numpy(dtype="float64"), part["mean"].to_numpy(dtype="float64")
        ax.plot(
            rho,
            mean,
            color=color,
            linestyle=ls,
            marker=marker,
            markersize=5,
            zorder=3,
            label=f"{label} ({_per_level(part['n'])})",
        )
        low, high = _level_intervals(part, accuracy=accuracy, confidence=result.confidence)
        has = np.isfinite(low) & np.isfinite(high)
        if has.any():
            yerr = np.vstack([mean[has] - low[has], high[has] - mean[has]]).clip(min=0.0)
            ax.errorbar(rho[has], mean[has], yerr=yerr, fmt="none", ecolor=color, capsize=3, zorder=3)
        best = result.best.loc[key if len(key) > 1 else key[0]]
        # A hollow star larger than the points and behind them: the best level's own point and bar stay visible.
        ax.plot(
            [best["best_rho"]],
            [best["best_mean"]],
            marker="*",
            markersize=18,
            markerfacecolor="none",
            markeredgecolor="black",
            markeredgewidth=1.0,
            linestyle="none",
            zorder=1,
        )
        if math.isfinite(best["rho_low"]) and math.isfinite(best["rho_high"]) and best["rho_high"] > best["rho_low"]:
            ax.axvspan(best["rho_low"], best["rho_high"], color=color, alpha=0.12)
        if (
            "baseline" in best.index
            and math.isfinite(best["baseline"])
            and (key[0], best["baseline"]) not in baselines_drawn
        ):
            baselines_drawn.add((key[0], best["baseline"]))
            # Black and drawn over the curves: where SAM's mean equals the baseline it would hide under them.
            ax.axhline(
                best["baseline"],
                color="black",
                linestyle=(0, (2, 2)),
                linewidth=0.9,
                zorder=5,
                label=f"baseline (rho = 0): {best['baseline']:.3g}",
            )
    name = result.param.rsplit(".", 1)[-1]
    _floor_spans(list(panels.values()), ceiling=1.0 if "acc" in result.metric else None)
    # One x range for every panel (all levels of the study), so that the architectures' best rho compare by eye.
    every = result.levels["rho"].to_numpy(dtype="float64")
    every = every[np.isfinite(every) & (every > 0)]
    for arch, ax in panels.items():
        _log_axis(ax.xaxis, ax.set_xscale)
        if len(every) and every.max() > every.min():
            ax.set_xlim(every.min() / 1.25, every.max() * 1.25)
        ax.set_title(f"arch: {arch}")
        ax.set_xlabel(f"{name} (log scale)")
        ax.set_ylabel(result.metric)
        ax.legend(fontsize=6)
    pct = f"{result.confidence:.0%}"
    bars = f"bars: {pct} interval of a level, mean ± t·SE over its trials where n > 1"
    if accuracy:
        bars += ", Clopper-Pearson on the validation samples where n = 1"
    fig.suptitle(
        title
        or f"{result.metric} vs {name}: best level starred, its {pct} confidence set shaded where levels were "
        f"repeated\n{bars}",
        fontsize=9,
    )
    return _finish(fig, path)


def _level_intervals(levels: pd.DataFrame, *, accuracy: bool, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of each rho level's mean: mean ± t·SE (t of n - 1 degrees of freedom, SE = sd / sqrt(n)) where
    a level has n > 1 trials; for a single trial's accuracy, the exact (Clopper-Pearson) interval on its validation
    samples (`val_n`); NaN where neither is known."""
    from scipy.stats import t as student

    from analysis.runs import accuracy_interval

    n = levels["n"].to_numpy(dtype="float64")
    mean, sd = levels["mean"].to_numpy(dtype="float64"), levels["sd"].to_numpy(dtype="float64")
    low, high = np.full(len(n), np.nan), np.full(len(n), np.nan)
    many = n > 1
    if many.any():
        half = student.ppf(0.5 + confidence / 2, n[many] - 1) * sd[many] / np.sqrt(n[many])
        low[many], high[many] = mean[many] - half, mean[many] + half
    val_n = levels["val_n"].to_numpy(dtype="float64") if "val_n" in levels.columns else np.full(len(n), np.nan)
    single = (n == 1) & np.isfinite(val_n) & (val_n > 0)
    if accuracy and single.any():
        low[single], high[single] = accuracy_interval(mean[single], val_n[single], confidence)
    return low, high


def plot_curves(
    curves: pd.DataFrame,
    *,
    metrics: tuple[str, ...] | None = None,
    hue: str = "cell",
    path: str | Path | None = None,
    labels: dict[str, str] | None = None,
) -> Figure:
    """Per-epoch curves from load_curves: one panel per metric (its name on the y axis), one line per run.

    Colour = factor.arch and line style = factor.method when the frame has them (one legend explains both);
    otherwise colour by `hue`. labels: run_id -> text written at the end of that run's curves (e.g. its rho).
    """
    for col in ("run_id", "metric", "step", "value", hue):
        if col not in curves.columns:
            raise ValueError(
                f"curves has no column {col!r} (columns: {list(curves.columns)}); pass the frame of load_curves"
            )
    metrics = tuple(metrics or sorted(curves["metric"].unique()))
    fig = _figure(4.0 * max(len(metrics), 1) + 1.5, 3.5)
    axes = fig.subplots(1, max(len(metrics), 1), squeeze=False)[0]
    grammar = "factor.arch" in curves.columns and "factor.method" in curves.columns
    arch_col = "factor.arch" if grammar else hue
    style = _Style(
        sorted(curves[arch_col].astype(str).unique()),
        sorted(curves["factor.method"].astype(str).unique()) if grammar else [""],
    )
    for ax, metric in zip(axes, metrics):
        part_m = curves[curves["metric"] == metric]
        for run_id, part in part_m.groupby("run_id"):
            first = part.iloc[0]
            ls, _ = style.line(first["factor.method"]) if grammar else ("-", None)
            part = part.sort_values("step")
            color = style.color(first[arch_col])
            ax.plot(part["step"], part["value"], color=color, linestyle=ls, alpha=0.8)
            if labels and labels.get(run_id):
                last = part.iloc[-1]
                ax.annotate(
                    labels[run_id],
                    (last["step"], last["value"]),
                    textcoords="offset points",
                    xytext=(3, 0),
                    fontsize=6,
                    color=color,
                    va="center",
                )
        ax.set_ylabel(metric)
        ax.set_xlabel("epoch")
    runs = curves["run_id"].nunique()
    handles = (
        style.legend_handles(markers=False)
        if grammar
        else [Line2D([], [], color=style.color(h), label=str(h)) for h in style.archs]
    )
    if len(handles) <= 16:
        # A long swatch: a dashed or dotted style needs room to show its pattern.
        fig.legend(
            handles=handles,
            loc="outside right upper",
            fontsize=7,
            title=f"{runs} runs",
            title_fontsize=7,
            handlelength=4,
        )
    return _finish(fig, path)


def plot_compute_frontier(table: pd.DataFrame, *, path: str | Path | None = None, title: str | None = None) -> Figure:
    """The metric against training compute, from analysis.compute.compute_matched: colour = arch, marker = method.

    One point per group (mean over seeds), n beside it; x: the compute of one run of the method (the group's best
    trial, `run_cost`; the whole search's, `cost`, stays in the table); ± SE bars on both axes only where n > 1; per
    arch, a thin line joins the points no cheaper point beats (its compute frontier). The x axis is logarithmic when
    the costs span more than a decade.
    """
    missing = [c for c in ("cost_mean", "cost_se", "metric_mean", "metric_se", "n") if c not in table.columns]
    if missing or table.index.nlevels < 2:
        raise ValueError(
            f"table must be the DataFrame of compute_matched (index arch, method[, ...]; columns "
            f"cost_mean, cost_se, metric_mean, metric_se, n); missing {missing}"
        )
    keys = [tuple(map(str, k)) for k in table.index]
    style = _Style([k[0] for k in keys], [k[1] for k in keys])
    fig = _figure(6.5, 4.5)
    ax = fig.add_subplot()
    maximise = table.attrs.get("mode", "max") == "max"
    # What one run of each method costs (its answer's own trial), not its search: a search's size is the study's
    # choice, and charging it would make a searched method look several times dearer than a run of it is.
    cost = "run_cost" if "run_cost_mean" in table.columns else "cost"
    replicated = bool((table["n"] > 1).any())
    for arch in style.archs:
        part = table[[k[0] == arch for k in keys]]
        x, y = part[f"{cost}_mean"].to_numpy(dtype="float64"), part["metric_mean"].to_numpy(dtype="float64")
        n = part["n"].to_numpy()
        xse = np.where(n > 1, part[f"{cost}_se"].to_numpy(dtype="float64"), np.nan)
        yse = np.where(n > 1, part["metric_se"].to_numpy(dtype="float64"), np.nan)
        color = style.color(arch)
        for i, key in enumerate(part.index):
            key = tuple(map(str, key))
            if not (np.isfinite(x[i]) and np.isfinite(y[i])):
                continue
            ax.plot([x[i]], [y[i]], linestyle="none", marker=style.line(key[1])[1], markersize=8, color=color)
            if np.isfinite(xse[i]) or np.isfinite(yse[i]):
                ax.errorbar(
                    [x[i]],
                    [y[i]],
                    xerr=None if not np.isfinite(xse[i]) else [xse[i]],
                    yerr=None if not np.isfinite(yse[i]) else [yse[i]],
                    fmt="none",
                    ecolor=color,
                    capsize=3,
                )
            extra = " ".join(key[2:])
            ax.annotate(
                f"n={int(n[i])}" + (f" {extra}" if extra else ""),
                (x[i], y[i]),
                textcoords="offset points",
                xytext=(5, 4),
                fontsize=6,
                color=color,
            )
        # The frontier: sorted by cost, the points better than every cheaper one.
        order = [i for i in np.argsort(x) if np.isfinite(x[i]) and np.isfinite(y[i])]
        front, best = [], -np.inf
        for i in order:
            score = y[i] if maximise else -y[i]
            if score > best:
                front.append(i)
                best = score
        if len(front) > 1:
            ax.plot(x[front], y[front], color=color, linewidth=0.9, alpha=0.7)
    xs = table[f"{cost}_mean"].to_numpy(dtype="float64")
    xs = xs[np.isfinite(xs) & (xs > 0)]
    if len(xs) and xs.max() / xs.min() > 10:
        _log_axis(ax.xaxis, ax.set_xscale)
    unit = table.attrs.get("unit", "seconds")
    over = ", mean over seeds" if replicated else ", one seed"
    what = "training compute of one run (the best trial)" if cost == "run_cost" else "training compute per cell"
    ax.set_xlabel(f"{what} ({unit}{over})")
    ax.set_ylabel(f"{table.attrs.get('metric', 'metric')}" + (" (mean over seeds)" if replicated else ""))
    handles = [Line2D([], [], color=style.color(a), linewidth=3, label=f"arch: {a}") for a in style.archs]
    handles += [
        Line2D([], [], color="black", linestyle="none", marker=style.line(m)[1], label=f"method: {m}")
        for m in style.methods
    ]
    handles.append(Line2D([], [], color="grey", linewidth=0.9, label="frontier (no cheaper point is better)"))
    ax.legend(
        handles=handles, fontsize=7, title="± SE over seeds" if replicated else "one seed: no bars", title_fontsize=7
    )
    fig.suptitle(title or "Accuracy against compute: each method at its epochs", fontsize=10)
    return _finish(fig, path)


def plot_sharpness(
    curves: pd.DataFrame,
    runs: pd.DataFrame | None = None,
    *,
    measure: str = METRIC_PREFIX + "lambda_max",
    lr: str = "lr",
    path: str | Path | None = None,
    title: str | None = None,
) -> Figure:
    """A geometry measure logged during training (lambda_max by default) per epoch, one line per trial, against the
    edge-of-stability line of each SGD trial: 2(1 + momentum)/lr at the lr of the same epoch
    (`analysis.geometry.stability_threshold`). One panel per architecture when the frame has factor.arch.

    curves: load_curves with metrics (measure, lr); runs: load_runs of the same trials, for each trial's
    optimizer.base and optimizer.momentum (without it, or for AdamW trials, no line is drawn: for adaptive
    methods the quantity at the edge is the preconditioned sharpness, which the probe does not measure).
    """
    from analysis.geometry.probes import stability_threshold

    for col in ("run_id", "metric", "step", "value"):
        if col not in curves.columns:
            raise ValueError(
                f"curves has no column {col!r} (columns: {list(curves.columns)}); pass the frame of load_curves"
            )
    values = curves[curves["metric"] == measure]
    if values.empty:
        raise ValueError(
            f"curves has no {measure!r} values; load them with load_curves(..., metrics=({measure!r}, {lr!r})) from a "
            "study whose trials measure geometry (a geometry: section with lambda_max, every: k for a curve)"
        )
    rates = curves[curves["metric"] == lr]
    settings: dict[str, tuple[str, float]] = {}
    if runs is not None and "optimizer.base" in runs.columns:
        momentum = pd.to_numeric(runs.get("optimizer.momentum", pd.Series(0.0, index=runs.index)), errors="coerce")
        for run_id, base, beta in zip(runs["run_id"], runs["optimizer.base"].astype(str), momentum.fillna(0.0)):
            settings[run_id] = (base, float(beta))
    grammar = "factor.arch" in values.columns and "factor.method" in values.columns
    archs = sorted(values["factor.arch"].astype(str).unique()) if grammar else ["all"]
    style = _Style(archs, sorted(values["factor.method"].astype(str).unique()) if grammar else [""])
    fig = _figure(max(4.2 * len(archs), 5.0) + 1.5, 3.8)
    axes = dict(zip(archs, fig.subplots(1, len(archs), squeeze=False, sharey=True)[0]))
    drew_line, adaptive = False, 0
    for run_id, part in values.groupby("run_id"):
        part = part.sort_values("step")
        first = part.iloc[0]
        arch = str(first["factor.arch"]) if grammar else "all"
        ls, marker = style.line(first["factor.method"]) if grammar else ("-", "o")
        ax = axes[arch]
        ax.plot(
            part["step"], part["value"], color=style.color(arch), linestyle=ls, marker=marker, markersize=3, alpha=0.85
        )
        base, beta = settings.get(run_id, ("", 0.0))
        if base != "sgd":
            adaptive += base != ""
            continue
        lr_at = rates[rates["run_id"] == run_id].set_index("step")["value"]
        steps = [s for s in part["step"] if s in lr_at.index]
        edge = [stability_threshold(float(lr_at[s]), base, beta) for s in steps]
        if any(math.isfinite(e) for e in edge):
            ax.plot(steps, edge, color=style.color(arch), linestyle=":", linewidth=1.0, alpha=0.7)
            drew_line = True
    for arch, ax in axes.items():
        ax.set_yscale("log")
        ax.set_xlabel("epoch")
        if grammar:
            ax.set_title(f"arch: {arch}", fontsize=9)
    next(iter(axes.values())).set_ylabel(measure)
    handles = style.legend_handles() if grammar else []
    if drew_line:
        handles.append(Line2D([], [], color="black", linestyle=":", label="2(1+momentum)/lr (SGD)"))
    if handles and len(handles) <= 20:
        fig.legend(
            handles=handles,
            loc="outside right upper",
            fontsize=7,
            title=f"{values['run_id'].nunique()} runs",
            title_fontsize=7,
        )
    note = (
        f"; {adaptive} adaptive-base run(s): no line (their edge is the preconditioned sharpness)" if adaptive else ""
    )
    fig.suptitle(title or f"{measure} during training, and the edge of stability{note}", fontsize=9)
    return _finish(fig, path)


# A panel's own y range is at least this share of the widest panel's: per-panel axes keep one arch's outlier from
# flattening the others, but a panel whose levels differ by one validation image must not be stretched to fill it.
MIN_SPAN_SHARE = 0.1


def _floor_spans(axes: list, *, ceiling: float | None = None) -> None:
    """Widen each panel's y range to at least MIN_SPAN_SHARE of the widest one's, about its middle (kept at or below
    `ceiling` plus a margin where the values cannot exceed it, an accuracy's 1)."""
    spans = [ax.get_ylim() for ax in axes]
    widest = max((hi - lo for lo, hi in spans), default=0.0)
    for ax, (lo, hi) in zip(axes, spans):
        if widest <= 0 or hi - lo >= MIN_SPAN_SHARE * widest:
            continue
        half = MIN_SPAN_SHARE * widest / 2
        mid = (lo + hi) / 2
        if ceiling is not None and hi <= ceiling + 0.05 * (hi - lo) + 1e-12:
            mid = min(mid, ceiling + 0.1 * half - half)
        ax.set_ylim(mid - half, mid + half)


def _log_axis(axis, set_scale) -> None:
    # Major ticks at 1, 2 and 5 per decade, labelled as plain numbers: over less than a decade matplotlib's
    # defaults leave a single labelled tick (or label the minor ones into each other).
    set_scale("log")
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())
