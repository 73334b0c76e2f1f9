"""The published-curve benchmark on a few of its curves: the paper's figures where it prints them, and sharpscale's
M4 form against M4 written from the paper's equations (benchmarks/bench_scaling_curves.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.bench_scaling_curves import PAPER, chance_loss, load_curves, log_rmse, score_curve

# CI keeps a read-only copy of shared/ beside the clone, as every worktree here has one.
DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "scaling-benchmark"
pytestmark = pytest.mark.skipif(not (DATA / "benchmark.vision.csv").exists(), reason=f"no benchmark data at {DATA}")


@pytest.fixture(scope="module")
def curves():
    return load_curves(DATA)


def test_the_curves_load_as_the_data_readme_counts_them(curves):
    domains = [key[0] for key in curves]
    assert {d: domains.count(d) for d in set(domains)} == {"IC": 72, "NMT": 5, "LM": 5, "BB": 10}
    lm = curves[("LM", "val_loss", "1.68e+07")]  # its rows come 4 times: the distinct points are 59 / 60
    assert (lm["training"] == 1).sum() == 59 and (lm["training"] == 0).sum() == 60
    for points in curves.values():  # every held-out x beyond every training x: pure extrapolation
        assert points.loc[points["training"] == 0, "x"].min() > points.loc[points["training"] == 1, "x"].max()


def test_log_rmse_is_the_papers_score():
    assert log_rmse(np.array([np.e, 1.0]), np.array([1.0, 1.0])) == pytest.approx(np.sqrt(0.5))


@pytest.mark.parametrize(("task", "paper_m4"), [("('ling', '2-shot')", 9.2e-3), ("('mult', '2-shot')", 6.2e-3)])
def test_m4_from_the_equations_reproduces_table_3_within_10_percent(curves, task, paper_m4):
    scores = score_curve(curves[("BB", task, "262M")], 1.0, estimators=("M4",))
    assert scores["M4"] == pytest.approx(paper_m4, rel=0.1)


def test_sharpscales_m4_form_extrapolates_a_vision_curve_as_well_as_m4(curves):
    key = ("IC", "inet_10", "ViT/B/16")
    scores = score_curve(curves[key], chance_loss("IC", "inet_10"), estimators=(*PAPER, "saturating", "m4", "default"))
    assert scores["m4"] <= 1.05 * scores["M4"] and scores["M4"] < scores["M1"]
    assert scores["default"] == scores["m4"]  # given eps_0 and its many points, the default form is M4
    # Few-shot error falls from near chance: the saturating form (M2's shape) cannot bend there.
    assert scores["saturating"] > 2 * scores["M4"]
