"""The law intervals and the compute-matched gains over seeds and test images (issue 32, item 5)."""

import math

import numpy as np
import pandas as pd
import pytest

from analysis.images import (
    IMAGE_OVER,
    SEED_OVER,
    crossed_t,
    image_covariance,
    linear_image_variance,
    scored_matrix,
    with_images,
)
from analysis.runs import SCORED_COLUMN
from analysis.scaling import CONDITIONS, fit_law, law_extrapolation, paired_law_difference
from analysis.scaling.sensitivity import law_statistic, point_gradient
from benchmarks.sim_images import _series, study_runs

FRACS = (0.0625, 0.125, 0.25, 0.5, 1.0)


def test_a_linear_statistic_s_image_part_is_crossed_t_s_for_a_mean_and_a_paired_difference():
    rng = np.random.default_rng(0)
    shared = rng.random(300) < 0.6
    cell = np.vstack([shared ^ (rng.random(300) < 0.1) for _ in range(4)]).astype(float)
    other = np.vstack([shared ^ (rng.random(300) < 0.2) for _ in range(4)]).astype(float)
    seeds = np.arange(4)
    mean = linear_image_variance(cell, np.full(4, 0.25), seeds)
    assert mean == pytest.approx(image_covariance(cell) / 300, rel=1e-12)
    both = np.vstack([other, cell])
    diff = linear_image_variance(both, np.r_[np.full(4, 0.25), np.full(4, -0.25)], np.r_[seeds, seeds])
    assert diff == pytest.approx(image_covariance(other - cell) / 300, rel=1e-12)
    with pytest.raises(ValueError, match="one gradient and one seed per row"):
        linear_image_variance(cell, np.ones(3), seeds)


def test_with_images_widens_a_seed_interval_keeps_its_asymmetry_and_never_narrows_it():
    from scipy.stats import t

    q = t.ppf(0.975, 4)
    assert with_images(1.0, 1.0 - q, 1.0 + 2 * q, 1.0, 0.0, 4) == (1.0 - q, 1.0 + 2 * q, 1.0, 0.0)
    lo, hi, se, share = with_images(1.0, 1.0 - q, 1.0 + 2 * q, 1.0, 3.0, 4)  # the images 3/4 of the variance
    assert share == pytest.approx(0.75) and se == pytest.approx(2.0)
    assert (1.0 - lo) > q and (hi - 1.0) == pytest.approx(2 * (1.0 - lo))
    for v in (1e-4, 0.05, 0.3, 1.0, 10.0):
        lo, hi, _, _ = with_images(0.0, -q, q, 1.0, v, 4)
        assert hi >= q - 1e-12 and lo <= -q + 1e-12
    # A log-scale interval (B's) widens on the log scale: the ratios grow, the estimate stays inside.
    lo, hi, _, _ = with_images(2.0, 1.0, 4.0, math.log(2.0) / q, 1.0, 4, log=True)
    assert lo < 1.0 and hi > 4.0 and lo * hi == pytest.approx(4.0)


def test_the_law_s_point_gradient_is_the_refit_s():
    rng = np.random.default_rng(3)
    n = np.repeat(FRACS[:4], 3)
    err = (0.03 + 0.02 * n**-0.7) * (1 + 0.03 * rng.standard_normal(len(n)))
    fit = fit_law(n, err, form="saturating")
    for name in ("prediction", "E", "beta"):
        stat = law_statistic(fit, name, heldout=1.0)
        g = point_gradient(fit, n, err, stat)
        for j in (0, 5, 11):
            up, down = err.copy(), err.copy()
            up[j] += 1e-5
            down[j] -= 1e-5
            refit = [fit_law(n, e, form="saturating", huber_delta=fit.huber_delta, start=fit.theta) for e in (up, down)]
            numeric = (stat(refit[0].theta) - stat(refit[1].theta)) / 2e-5
            assert g[j] == pytest.approx(numeric, rel=0.08, abs=1e-3 * np.abs(g).max()), (name, j)


def _study(seed=0, *, common=0.9, arm_corr=0.0, seeds=4):
    """A confirm stage whose test set's luck is most of each run's binomial noise (common 0.9) and small seed
    noise: the image part of every interval is large, so intervals over seeds alone are visibly too narrow."""
    return study_runs(
        np.random.default_rng(seed), seeds=seeds, images=2000, noise=0.001, common=common, arm_corr=arm_corr,
        fracs=FRACS,
    )  # fmt: skip


def test_the_held_out_prediction_and_its_check_widen_by_the_test_images_where_runs_have_records():
    runs, correct, _ = _study()
    n, err, seeds, records = _series(runs, "vanilla")
    with_rec = law_extrapolation(n, err, seeds, forms=("saturating",), heldout=1.0, scored=records)
    plain = law_extrapolation(n, err, seeds, forms=("saturating",), heldout=1.0)
    row, old = with_rec.loc["saturating"], plain.loc["saturating"]
    assert row["interval over"] == IMAGE_OVER and old["interval over"] == SEED_OVER
    assert row["prediction"] == old["prediction"] and row["check"] == old["check"]
    # The images move every fraction's runs: the prediction's interval must hold their variance too.
    assert row["prediction_high"] - row["prediction_low"] > 1.2 * (old["prediction_high"] - old["prediction_low"])
    assert row["E_high"] - row["E_low"] >= old["E_high"] - old["E_low"]
    assert row["check_high"] - row["check_low"] >= old["check_high"] - old["check_low"] - 1e-12
    assert row["pi_low"] < row["prediction"] < row["pi_high"]
    assert bool(row["consistent"]) == bool(row["pi_low"] <= row["observed"] <= row["pi_high"])
    assert "test images jointly" in with_rec.attrs["conditions"] and plain.attrs["conditions"] == CONDITIONS
    # The jackknife forms too (M4 fits the 4 held-in fractions here): B's interval widens on its log scale.
    every = law_extrapolation(n, err, seeds, heldout=1.0, eps0=0.9, scored=records).loc["m4"]
    jack = law_extrapolation(n, err, seeds, heldout=1.0, eps0=0.9).loc["m4"]
    assert every["interval over"] == IMAGE_OVER and every["B_low"] < every["B"] < every["B_high"]
    assert every["B_high"] / every["B_low"] >= jack["B_high"] / jack["B_low"]
    assert every["prediction_high"] - every["prediction_low"] > jack["prediction_high"] - jack["prediction_low"]
    # Records of other values (another metric than the one fitted) are not used: the fallback, said.
    off = law_extrapolation(n, err + 0.01, seeds, forms=("saturating",), heldout=1.0, scored=records)
    assert off.loc["saturating", "interval over"] == SEED_OVER and "no per-image" in off.attrs["conditions"]
    with pytest.raises(ValueError, match="one record per point"):
        law_extrapolation(n, err, seeds, forms=("saturating",), heldout=1.0, scored=records[:-1])


def test_the_paired_law_difference_adds_the_images_the_arms_do_not_share():
    runs, correct, _ = _study(arm_corr=0.0)  # each arm's images hard for it alone: nothing cancels
    n, err_b, seeds, rec_b = _series(runs, "vanilla")
    _, err_t, _, rec_t = _series(runs, "sam")
    both = paired_law_difference(n, err_t, err_b, seeds, scored_treatment=rec_t, scored_baseline=rec_b)
    plain = paired_law_difference(n, err_t, err_b, seeds)
    assert set(both["interval over"]) == {IMAGE_OVER} and set(plain["interval over"]) == {SEED_OVER}
    for p in ("E", "beta"):
        assert both.loc[p, "diff_high"] - both.loc[p, "diff_low"] > plain.loc[p, "diff_high"] - plain.loc[p, "diff_low"]
        assert both.loc[p, "p_value"] >= plain.loc[p, "p_value"] and both.loc[p, "se"] > plain.loc[p, "se"]
    assert "test images jointly" in both.attrs["conditions"] and plain.attrs["conditions"] == CONDITIONS


def test_compute_matched_gains_are_over_seeds_and_images_where_both_trials_have_records():
    from analysis.compute import compute_matched_gains

    runs, correct, _ = _study(arm_corr=0.0)
    times = pd.DataFrame({"run_id": runs["run_id"], "metric": "epoch_time_s", "value": 10.0})
    gains = compute_matched_gains(runs, times, baseline="vanilla", seed="train.seed")
    plain = compute_matched_gains(runs.drop(columns=[SCORED_COLUMN]), times, baseline="vanilla", seed="train.seed")
    assert set(gains["interval over"]) == {IMAGE_OVER} and set(plain["interval over"]) == {SEED_OVER}
    assert "test images jointly" in gains.attrs["conditions"]
    assert "given the test images" in plain.attrs["conditions"]
    # Each row's interval is crossed_t's on the pair's per-image differences.
    row = gains.loc[("resnet", "1", "sam")]
    expected = crossed_t(correct[("sam", 1.0)].astype(float) - correct[("vanilla", 1.0)])
    assert (row["ci_low"], row["ci_high"], row["p_value"]) == pytest.approx(
        (expected.low, expected.high, expected.p_value)
    )
    assert (gains["ci_high"] - gains["ci_low"] >= plain["ci_high"] - plain["ci_low"] - 1e-12).all()


def test_the_scaling_table_hands_each_point_its_own_record():
    from analysis.scaling import table_points, table_scored
    from analysis.tables import scaling_table

    runs, correct, _ = _study(seeds=3)
    table = scaling_table(runs, fraction="data.fraction", seed="train.seed")
    n, err, seeds = table_points(table, "resnet", "sam")
    records = table_scored(table, "resnet", "sam")
    matrix, why = scored_matrix(records, (1.0 - err).tolist())
    assert why == "" and len(records) == len(n)
    for row, f, s in zip(matrix, n, seeds):
        assert np.array_equal(row, correct[("sam", f)][int(s)])
    assert (
        table_scored(scaling_table(runs.drop(columns=[SCORED_COLUMN]), fraction="data.fraction"), "resnet", "sam")
        is None
    )


def test_the_report_s_law_tables_pass_the_records_and_say_which_rows_use_them():
    import types

    from analysis import report
    from analysis.tables import scaling_table

    runs, _, _ = _study(seeds=3)
    table = scaling_table(runs, fraction="data.fraction", seed="train.seed")
    laws = report._law_checks(table, 1.0, None)
    assert set(laws.xs("saturating", level="form")["interval over"]) == {IMAGE_OVER}
    assert "test images jointly" in laws.attrs["conditions"]
    written = {}
    writer = types.SimpleNamespace(table=lambda slug, title, md, frame: written.update(md=md, frame=frame))
    report._law_difference_table(
        types.SimpleNamespace(w=writer, source="sim"), table, "sam", "vanilla", form="saturating", form_note="",
        eps0=None,
    )  # fmt: skip
    assert set(written["frame"]["interval over"]) == {IMAGE_OVER} and "test images jointly" in written["md"]
    plain = scaling_table(runs.drop(columns=[SCORED_COLUMN]), fraction="data.fraction", seed="train.seed")
    assert "no per-image correctness" in report._law_checks(plain, 1.0, None).attrs["conditions"]
