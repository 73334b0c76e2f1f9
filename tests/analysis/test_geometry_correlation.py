"""Kendall's tau between geometry measures and the generalisation gap: known rankings on hand-made trial tables."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from analysis.tables import geometry_correlation


def trials() -> pd.DataFrame:
    rows = []
    for rho, lr in itertools.product([0.01, 0.05, 0.1, 0.5], [0.1, 0.01, 0.001]):
        gap = 0.1 * rho + 10 * lr  # rho and lr both widen the gap
        rows.append(
            {
                "status": "finished",
                "factor.lr": lr,
                "optimizer.hparams.rho": rho,
                "train_acc": 0.9 + gap,
                "val_acc": 0.9,
                "geometry/lambda_max": gap * 3 + 1,  # ranks every pair exactly as the gap
                "geometry/lambda_max_converged": 1.0,  # bookkeeping: left out
                "geometry/loss": 0.1 - gap,  # the loss at the weights, logged beside a measure: not a measure
                "geometry/blockwise/head/perturbed_loss": 0.2,  # likewise, under a measure's own prefix
                "geometry/lr_only": lr,  # tracks lr alone: right overall, blind within lr's groups
                "geometry/anti": -gap,
            }
        )
    return pd.DataFrame(rows)


def test_tau_overall_and_within_each_hyperparameter():
    table = geometry_correlation(trials())
    assert set(table.index) == {"geometry/lambda_max", "geometry/lr_only", "geometry/anti"}
    assert table.loc["geometry/lambda_max", "tau"] == pytest.approx(1.0) and table.loc["geometry/lambda_max", "n"] == 12
    assert table.loc["geometry/anti", "tau"] == pytest.approx(-1.0)
    # Within rho (lr held fixed) the measure that only follows lr is constant: no group has a tau.
    assert table.loc["geometry/lr_only", "groups_optimizer.hparams.rho"] == 0
    assert table.loc["geometry/lr_only", "tau_lr"] == pytest.approx(1.0)  # within lr (rho fixed): it ranks
    assert table.loc["geometry/lambda_max", "tau_optimizer.hparams.rho"] == pytest.approx(1.0)
    assert table.loc["geometry/lambda_max", "groups_lr"] == 4


def test_too_few_trials_and_no_measure_are_said():
    few = geometry_correlation(trials().head(2))
    assert (
        np.isnan(few.loc["geometry/lambda_max", "tau"]) and few.loc["geometry/lambda_max", "note"] == "2 trials: no tau"
    )
    with pytest.raises(ValueError, match="no geometry"):
        geometry_correlation(trials().drop(columns=[c for c in trials().columns if c.startswith("geometry/")]))
