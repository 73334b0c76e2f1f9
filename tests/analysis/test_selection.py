"""The selection simulation (benchmarks/sim_selection.py) at a small size: the confirm design carries no selection.

Under SAM = vanilla, today's best-of-search design (the best of 4 SAM trials against one vanilla trial, on the data
that chose them) shows a gain at the smallest fraction that is selection alone; the confirm design
(studies/confirm.py: fresh seeds at the chosen knob, on held-out data) shows none, and claims a significant gain,
or one that grows as data shrinks, in few studies. docs/science.md has the full table (400 studies a design).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _load():
    from benchmarks import sim_selection

    return sim_selection


sim = _load()
# sam_gain's per-fraction verdict: a `significant` column once its intervals are calibrated and Holm-adjusted across
# fractions (issue 22 part 2); before that its 95% percentile-bootstrap intervals over 5 seed pairs are too narrow,
# and the claim rates stay above the target whatever the design (the bias test below holds either way).
_CALIBRATED = "significant" in sim.compared_gain(sim.simulate_runs("confirm", np.random.default_rng(0))).columns


def test_simulated_runs_have_the_columns_the_report_reads():
    runs = sim.simulate_runs("confirm", np.random.default_rng(0), seeds=3)
    for col in ("run_id", "cell", "status", "stage", "factor.arch", "factor.method", "data.fraction", "train.seed"):
        assert col in runs.columns
    search, confirm = sim.split_stages(runs)
    assert set(confirm["train.seed"]) == {1000, 1001, 1002}
    assert set(confirm["data.eval_split"]) == {"test"} and set(search["data.eval_split"]) == {"selection"}
    # One chosen rho per SAM cell, repeated by every confirm seed.
    sam = confirm[confirm["factor.method"] == "sam"]
    assert (sam.groupby("data.fraction")["optimizer.hparams.rho"].nunique() == 1).all()


def test_confirm_design_removes_the_selection_bias():
    old = sim.run("best_of_search", 8, seed=1)
    new = sim.run("confirm", 24, seed=1)
    # Best of 4 N(0, 1 point) against one: about +1 point at the smallest fraction, from selection alone.
    assert old["gain_smallest"] > 0.006
    # Fresh seeds at the choice: the mean gain over 24 studies is 0 within its error (sd of one study's mean gain
    # over 5 pairs: 1 point * sqrt(2 / 5) = 0.63 points; over 24 studies 0.13 points; 3 of those).
    assert abs(new["gain_smallest"]) < 0.004
    assert abs(new["gain_largest"]) < 0.001


@pytest.mark.xfail(not _CALIBRATED, strict=True, reason="needs sam_gain's calibrated, Holm-adjusted intervals")
def test_confirm_design_meets_the_claim_targets():
    new = sim.run("confirm", 40, seed=2)
    # Target: at most 5% of studies (docs/science.md, 400 studies); 40 studies allow 2 (MC error about 3.4%).
    assert new["significant"] <= 0.05
    assert new["grows"] <= 0.05
