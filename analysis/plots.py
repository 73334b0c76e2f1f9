"""Figures of a study (matplotlib, no pyplot state): error vs data on log-log axes, SAM's gain, accuracy vs rho, learning curves."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from analysis.scaling import PowerLawFit
from analysis.tables import RhoSensitivity, ScalingTable

__all__ = ["plot_curves", "plot_error_vs_n", "plot_gain", "plot_rho_sensitivity"]


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


def _panels(keys: list, width: float = 4.2, height: float = 3.8) -> tuple[Figure, dict]:
    """One axes per distinct first key (the architecture), side by side, sharing the y axis."""
    firsts = list(dict.fromkeys(k[0] for k in keys))
    fig = _figure(max(width * len(firsts), 5.0), height)
    axes = fig.subplots(1, max(len(firsts), 1), squeeze=False, sharey=True)[0]
    return fig, dict(zip(firsts, axes))


def plot_error_vs_n(
    table: ScalingTable,
    fits: Mapping[tuple[str, str], PowerLawFit] | None = None,
    *,
    as_error: bool | None = None,
    path: str | Path | None = None,
    title: str | None = None,
) -> Figure:
    """Error against training-set size on log-log axes, one panel per arch: mean ± sd over seeds per method, fits dashed.

    as_error: plot 1 - metric (None: when the table maximised its metric, i.e. an accuracy). fits: from
    fit_scaling_table; each curve is drawn over the measured range and its floor c as a dotted line.
    """
    if as_error is None:
        as_error = table.mode == "max"
    keys = [tuple(map(str, k)) for k in table.mean.index]
    fig, panels = _panels(keys)
    methods = list(dict.fromkeys(k[1] for k in keys))
    colors = {m: f"C{i % 10}" for i, m in enumerate(methods)}
    for key, (arch, method) in zip(table.mean.index, keys):
        ax = panels[arch]
        mean = table.mean.loc[key]
        x = np.asarray([float(v) for v in mean.index])
        y = mean.to_numpy(dtype="float64")
        y = 1.0 - y if as_error else y
        sd = table.sd.loc[key].fillna(0.0).to_numpy(dtype="float64")
        keep = np.isfinite(y) & (y > 0)
        ax.errorbar(x[keep], y[keep], yerr=sd[keep], fmt="o-", color=colors[method], label=method, capsize=3)
        fit = (fits or {}).get((arch, method))
        if fit is not None:
            grid = np.geomspace(fit.n.min(), fit.n.max(), 100)
            ax.plot(grid, fit.predict(grid), "--", color=colors[method], alpha=0.8,
                    label=f"{fit.a:.3g} n^-{fit.b:.2f} + {fit.c:.3g}" + ("" if fit.floor_identified else " (floor?)"))
            if fit.c > 0:
                ax.axhline(fit.c, color=colors[method], linestyle=":", linewidth=0.8)
    frac = (table.columns.get("fraction") or "n").removeprefix("factor.")
    for arch, ax in panels.items():
        _log_axis(ax.xaxis, ax.set_xscale)
        _log_axis(ax.yaxis, ax.set_yscale)
        ax.set_title(arch)
        ax.set_xlabel(f"training-set size ({frac})")
        ax.legend(fontsize=6)
    next(iter(panels.values())).set_ylabel(f"1 - {table.metric}" if as_error else table.metric)
    fig.suptitle(title or f"Data scaling: best-of-search {table.metric}, mean ± sd over seeds")
    return _finish(fig, path)


def plot_gain(gain: pd.DataFrame, *, path: str | Path | None = None, title: str | None = None) -> Figure:
    """SAM's gain (treatment - baseline) against training-set fraction per arch, with its bootstrap CI as error bars."""
    missing = [c for c in ("gain", "ci_low", "ci_high") if c not in gain.columns]
    if missing or gain.index.nlevels != 2:
        raise ValueError(f"gain must be the DataFrame of sam_gain (index arch, fraction; columns gain, ci_low, ci_high); missing {missing}")
    fig = _figure()
    ax = fig.add_subplot()
    for i, (arch, part) in enumerate(gain.groupby(level=0, sort=True)):
        x = np.asarray([float(v) for v in part.index.get_level_values(1)])
        order = np.argsort(x)
        y = part["gain"].to_numpy(dtype="float64")[order]
        lo = np.nan_to_num(y - part["ci_low"].to_numpy(dtype="float64")[order])
        hi = np.nan_to_num(part["ci_high"].to_numpy(dtype="float64")[order] - y)
        ax.errorbar(x[order], y, yerr=[lo, hi], fmt="o-", capsize=3, color=f"C{i % 10}", label=str(arch))
    ax.axhline(0.0, color="black", linewidth=0.8)
    _log_axis(ax.xaxis, ax.set_xscale)
    ax.set_xlabel("training-set fraction")
    metric = gain.attrs.get("metric", "metric")
    pair = f"{gain.attrs.get('treatment', 'treatment')} - {gain.attrs.get('baseline', 'baseline')}"
    ax.set_ylabel(f"gain in {metric} ({pair})")
    conf = gain.attrs.get("confidence")
    ax.set_title(title or f"Gain per seed pair, {int(round(conf * 100)) if conf else ''}% bootstrap CI")
    ax.legend(fontsize=8)
    return _finish(fig, path)


def plot_rho_sensitivity(result: RhoSensitivity, *, path: str | Path | None = None, title: str | None = None) -> Figure:
    """Metric against rho (log x), one panel per arch: mean ± sd per level, the best level starred, its interval shaded."""
    groups = list(result.best.index.names)
    keys = [k if isinstance(k, tuple) else (k,) for k in result.best.index]
    fig, panels = _panels([tuple(map(str, k)) for k in keys])
    for i, (key, part) in enumerate(result.levels.groupby(groups, sort=True)):
        key = key if isinstance(key, tuple) else (key,)
        ax = panels[str(key[0])]
        part = part.sort_values("rho")
        color = f"C{i % 10}"
        label = " / ".join(map(str, key[1:])) or str(key[0])
        ax.errorbar(part["rho"], part["mean"], yerr=part["sd"].fillna(0.0), fmt="o-", color=color, capsize=3, label=label)
        best = result.best.loc[key if len(key) > 1 else key[0]]
        ax.plot([best["best_rho"]], [best["best_mean"]], marker="*", markersize=14, color=color, markeredgecolor="black")
        if best["rho_high"] > best["rho_low"]:
            ax.axvspan(best["rho_low"], best["rho_high"], color=color, alpha=0.12)
        if "baseline" in best.index and math.isfinite(best["baseline"]):
            ax.axhline(best["baseline"], color=color, linestyle="--", linewidth=0.9)
    for arch, ax in panels.items():
        _log_axis(ax.xaxis, ax.set_xscale)
        ax.set_title(arch)
        ax.set_xlabel(result.param)
        ax.legend(fontsize=6)
    next(iter(panels.values())).set_ylabel(result.metric)
    name = result.param.rsplit(".", 1)[-1]
    fig.suptitle(title or f"{result.metric} vs {name}: best starred, its {result.confidence:.0%} interval shaded, rho = 0 dashed")
    return _finish(fig, path)


def plot_curves(
    curves: pd.DataFrame,
    *,
    metrics: tuple[str, ...] | None = None,
    hue: str = "cell",
    path: str | Path | None = None,
) -> Figure:
    """Per-epoch curves from load_curves: one panel per metric, one line per run coloured by `hue`."""
    for col in ("run_id", "metric", "step", "value", hue):
        if col not in curves.columns:
            raise ValueError(f"curves has no column {col!r} (columns: {list(curves.columns)}); pass the frame of load_curves")
    metrics = tuple(metrics or sorted(curves["metric"].unique()))
    fig = _figure(4.0 * max(len(metrics), 1), 3.5)
    axes = fig.subplots(1, max(len(metrics), 1), squeeze=False)[0]
    hues = sorted(curves[hue].astype(str).unique())
    colors = {h: f"C{i % 10}" for i, h in enumerate(hues)}
    for ax, metric in zip(axes, metrics):
        seen = set()
        for (run_id, h), part in curves[curves["metric"] == metric].groupby(["run_id", curves[hue].astype(str)]):
            ax.plot(part["step"], part["value"], color=colors[h], alpha=0.7, label=None if h in seen else h)
            seen.add(h)
        ax.set_title(metric)
        ax.set_xlabel("epoch")
    if len(hues) <= 12:
        axes[0].legend(fontsize=6)
    return _finish(fig, path)


def _log_axis(axis, set_scale) -> None:
    # Over less than a decade matplotlib labels the minor ticks too, and the labels run into each other.
    set_scale("log")
    axis.set_minor_formatter(NullFormatter())
