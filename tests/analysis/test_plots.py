"""Figure rules that hold across plots (analysis.plots): what a panel's axes may and may not exaggerate."""

import warnings

import numpy as np
import pandas as pd

from analysis import plot_rho_sensitivity, rho_sensitivity

RHO = "optimizer.hparams.rho"


def test_a_panel_whose_levels_differ_by_one_image_is_not_stretched_to_fill_its_axis():
    # The quickstart's resnet: every SAM trial at 0.9972 but one at 0.9944 (one of 359 images); the vit's span 0.5.
    rows = []
    for arch, values in (("resnet", (0.9944, 0.9972, 0.9972, 0.9972)), ("vit", (0.82, 0.77, 0.78, 0.29))):
        for i, (rho, v) in enumerate(zip((0.02, 0.16, 0.4, 0.42), values)):
            rows.append(
                {
                    "run_id": f"{arch}{i}",
                    "status": "finished",
                    "start_time": pd.Timestamp("2026-11-26") + pd.Timedelta(seconds=len(rows)),
                    "factor.arch": arch,
                    "factor.method": "sam",
                    RHO: rho,
                    "val_acc": v,
                }
            )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = rho_sensitivity(
            pd.DataFrame(rows), param=RHO, arch="factor.arch", method="factor.method", metric="val_acc", n_boot=100
        )
    fig = plot_rho_sensitivity(result)
    spans = {ax.get_title(): np.diff(ax.get_ylim())[0] for ax in fig.axes}
    vit = spans["arch: vit"]
    assert vit > 0.5  # per-panel axes: the vit's own range
    # resnet's 0.003 drawn on at least a tenth of it, and not above an accuracy's ceiling by more than a margin.
    assert spans["arch: resnet"] >= 0.1 * vit - 1e-9
    resnet = next(ax for ax in fig.axes if ax.get_title() == "arch: resnet")
    low, high = resnet.get_ylim()
    assert low < 0.9944 and 0.9972 < high <= 1.0 + 0.01 * vit
    # The legend counts trials in words ("1 trial per level"), not "n=1 trials per level".
    labels = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert any(label.endswith("(1 trial per level)") for label in labels), labels
    assert not any("n=" in label for label in labels), labels


def _single_trial_levels(val_samples: bool) -> pd.DataFrame:
    rows = []
    for i, (rho, v) in enumerate(zip((0.02, 0.05, 0.1, 0.2), (0.90, 0.95, 1.0, 0.93))):
        row = {
            "run_id": f"r{i}",
            "status": "finished",
            "start_time": pd.Timestamp("2026-11-26") + pd.Timedelta(seconds=i),
            "factor.arch": "resnet",
            "factor.method": "sam",
            RHO: rho,
            "val_acc": v,
        }
        if val_samples:
            row["val_samples"] = 360
        rows.append(row)
    return pd.DataFrame(rows)


def _rho(runs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return rho_sensitivity(
            runs, param=RHO, arch="factor.arch", method="factor.method", metric="val_acc", n_boot=100
        )


def _bars(ax):
    from matplotlib.container import ErrorbarContainer

    return [c for c in ax.containers if isinstance(c, ErrorbarContainer)]


def test_every_single_trial_level_gets_its_exact_interval_named_in_the_title():
    from analysis import accuracy_interval

    fig = plot_rho_sensitivity(_rho(_single_trial_levels(True)))
    (ax,) = fig.axes
    (bars,) = _bars(ax)
    segments = bars.lines[2][0].get_segments()
    assert len(segments) == 4  # one bar per level, though each level holds one trial
    # The bar at 1.0 (360 of 360) is Clopper-Pearson's [0.990, 1], not the plug-in SE's zero length.
    at_one = next(seg for seg in segments if np.isclose(seg[0][0], 0.1))
    low, high = accuracy_interval(1.0, 360)
    assert np.allclose(sorted(at_one[:, 1]), [float(low), float(high)])
    assert "Clopper-Pearson" in fig._suptitle.get_text()
    # The star is hollow, larger than the points and behind them: a point drawn at the best level stays visible.
    star = next(line for line in ax.lines if line.get_marker() == "*")
    curve = next(line for line in ax.lines if line.get_marker() not in ("*", "None", None, ""))
    assert star.get_markerfacecolor() == "none"
    assert star.get_zorder() < curve.get_zorder() and star.get_markersize() > curve.get_markersize()
    assert all(c.lines[2][0].get_zorder() > star.get_zorder() for c in _bars(ax))


def test_repeated_levels_get_t_intervals_of_the_mean_and_unknown_ones_none():
    runs = pd.concat([_single_trial_levels(False)] * 3, ignore_index=True)
    runs["run_id"] = [f"r{i}" for i in range(len(runs))]
    runs["val_acc"] = runs["val_acc"] - 0.01 * (runs.index // 4)
    result = _rho(runs)
    fig = plot_rho_sensitivity(result)
    (bars,) = _bars(fig.axes[0])
    seg = bars.lines[2][0].get_segments()[0]
    level = result.levels.sort_values("rho").iloc[0]
    from scipy.stats import t

    half = t.ppf(0.975, 2) * level["sd"] / np.sqrt(3)
    assert np.isclose(np.ptp(seg[:, 1]), 2 * half)
    assert "mean ± t·SE" in fig._suptitle.get_text()
    # Single trials without a validation count: no interval is known, none is drawn.
    assert _bars(plot_rho_sensitivity(_rho(_single_trial_levels(False))).axes[0]) == []


def _scaling_runs(fractions) -> pd.DataFrame:
    rows = []
    for method, optimizer in (("adamw", "none"), ("sam", "sam")):
        for f in fractions:
            for seed in (0, 1):
                rows.append(
                    {
                        "run_id": f"{method}{f}{seed}",
                        "status": "finished",
                        "start_time": pd.Timestamp("2026-11-26") + pd.Timedelta(seconds=len(rows)),
                        "factor.arch": "resnet",
                        "factor.method": method,
                        "optimizer.method": optimizer,
                        "data.fraction": f,
                        "train.seed": seed,
                        # Every validation image right at the full set: an error of 0.
                        "val_acc": 1.0 if f == 1.0 else 0.8 + 0.1 * f + 0.01 * seed,
                    }
                )
    return pd.DataFrame(rows)


def _scaling(fractions):
    from analysis import sam_gain, scaling_table

    runs = _scaling_runs(fractions)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = scaling_table(runs, arch="factor.arch", method="factor.method", fraction="data.fraction")
        gain = sam_gain(runs, baseline="adamw", treatment="sam", arch="factor.arch", method="factor.method")
    return table, gain


def test_the_fraction_axis_spans_the_designs_fractions():
    from analysis import plot_error_vs_n, plot_gain

    table, gain = _scaling((0.1, 0.25, 0.5))
    low, high = plot_gain(gain).axes[0].get_xlim()
    assert 0.05 < low < 0.1 and 0.5 < high < 1.0  # not matplotlib's whole decades
    # One fraction (the quickstart): plain axes about it, not a log axis from 0.1 to 10.
    table, gain = _scaling((1.0,))
    ax = plot_gain(gain).axes[0]
    assert ax.get_xscale() == "linear" and 0.5 <= ax.get_xlim()[0] < 1.0 < ax.get_xlim()[1] <= 1.5
    # ...where an error of 0 is a point like any other, not a mark "below the log axis" the plot does not have.
    ax = plot_error_vs_n(table).axes[0]
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] <= 0.0
    assert not [line for line in ax.lines if "log axis" in str(line.get_label())]


def test_an_error_of_0_on_a_log_axis_is_marked_and_named_once():
    from analysis import plot_error_vs_n

    table, _ = _scaling((0.1, 0.25, 1.0))
    ax = plot_error_vs_n(table).axes[0]
    low, high = ax.get_xlim()
    assert 0.05 < low < 0.1 and 1.0 < high < 2.0
    marks = [line for line in ax.lines if line.get_marker() == "v"]
    assert len(marks) == 2 and sum("error 0" in str(m.get_label()) for m in marks) == 1
