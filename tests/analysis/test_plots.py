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
