"""fit_power_law and data_multiplier: seed-level intervals where the points carry seeds, the point bootstrap (said so) where not."""

import math
import warnings

import numpy as np
import pytest

from analysis import FloorNotIdentifiedWarning, data_multiplier, fit_power_law, fit_scaling_table, scaling_table
from analysis.scaling import POWER_LAW_COVERAGE, t_quantile

FRACTIONS = np.geomspace(0.05, 1.0, 5)


def seeded_points(seeds: int, *, shared: float, own: float, rng_seed: int = 0, law=(0.02, 0.7, 0.03)):
    """(n, err, seed) of one curve a n^-b + c measured with `seeds` seeds: each seed's offset (sd `shared`) is the
    same at every fraction, each point adds its own noise (sd `own`)."""
    rng = np.random.default_rng(rng_seed)
    a, b, c = law
    n = np.repeat(FRACTIONS, seeds)
    who = np.tile(np.arange(seeds), len(FRACTIONS))
    offsets = rng.normal(0.0, shared, seeds)
    err = a * n**-b + c + offsets[who] + rng.normal(0.0, own, len(n))
    return n, err, who


def test_seed_intervals_are_the_leave_one_seed_out_jackknife_with_t():
    n, err, who = seeded_points(4, shared=0.004, own=0.002)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FloorNotIdentifiedWarning)
        fit = fit_power_law(n, err, seeds=who)
        left_out = [fit_power_law(n[who != s], err[who != s], n_boot=0, warn=False) for s in range(4)]
    assert fit.bootstrap == "seeds" and list(fit.sample_seeds) == [0, 1, 2, 3]
    assert "jackknife over 4 seeds" in fit.interval_note and fit.to_dict()["interval"] == fit.interval_note
    # Each sample row is the fit without that seed (started from the full fit: the same optimum).
    for row, f in zip(fit.samples, left_out):
        assert row == pytest.approx([f.a, f.b, f.c], rel=1e-4, abs=1e-6)
    q = t_quantile(0.95, 3)
    b_jack = fit.samples[:, 1]
    se = math.sqrt(3 / 4 * ((b_jack - b_jack.mean()) ** 2).sum())
    assert fit.intervals["b"] == pytest.approx((fit.b - q * se, fit.b + q * se))
    lo, hi = fit.intervals["a"]  # a on the log scale: symmetric in log a
    assert math.log(hi / fit.a) == pytest.approx(math.log(fit.a / lo))
    assert fit.intervals["c"][0] >= 0.0  # c is bounded at 0, and so is its interval


def test_a_seed_offset_shared_by_its_points_moves_only_the_floor_and_the_seed_interval_says_so():
    # Each seed's curve is the law plus its own offset at every fraction (nested subsets, one initialisation),
    # nothing else: leaving a seed out moves c by exactly the change in the mean offset, so c's interval is the
    # t interval of the seeds' mean offset and b's has no width. The bootstrap over points takes the offsets for
    # independent noise at each point and spreads them over the slope.
    n = np.repeat(FRACTIONS, 3)
    who = np.tile(np.arange(3), len(FRACTIONS))
    offsets = np.array([-0.006, 0.001, 0.008])
    err = 0.02 * n**-0.7 + 0.03 + offsets[who]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FloorNotIdentifiedWarning)
        seeds = fit_power_law(n, err, seeds=who)
        points = fit_power_law(n, err, n_boot=300, seed=0)
    assert (seeds.a, seeds.b, seeds.c) == (points.a, points.b, points.c)  # the same fit: only the intervals differ
    half = t_quantile(0.95, 2) * offsets.std(ddof=1) / math.sqrt(3)
    mean = 0.03 + offsets.mean()
    assert seeds.intervals["c"] == pytest.approx((mean - half, mean + half), abs=1e-6)
    assert seeds.intervals["b"] == pytest.approx((0.7, 0.7), abs=1e-5)
    assert points.intervals["b"][1] - points.intervals["b"][0] > 0.1


def test_one_seed_gets_no_interval_and_no_seeds_the_point_bootstrap_each_saying_why():
    n, err, who = seeded_points(3, shared=0.0, own=0.003)
    one = fit_power_law(n, err, seeds=np.zeros(len(n)), n_boot=100, warn=False)
    assert one.bootstrap == "none" and one.samples.shape == (0, 3) and one.n_seeds == 1
    assert all(math.isnan(v) for pair in one.intervals.values() for v in pair)
    # Why, with what a bootstrap over its points was measured to cover, and the fix.
    assert "no interval: the points come from 1 seed" in one.interval_note and "run 2+ seeds" in one.interval_note
    assert POWER_LAW_COVERAGE["one seed"] in one.interval_note
    none = fit_power_law(n, err, n_boot=100, warn=False)
    assert none.bootstrap == "residuals" and "treats every point as independent" in none.interval_note
    assert POWER_LAW_COVERAGE["points"] in none.interval_note and none.n_seeds == 0
    assert none.samples.shape == (100, 3) and all(lo < hi for lo, hi in none.intervals.values())
    m = data_multiplier(one, one, 1.0)
    assert all(math.isnan(v) for v in m.interval) and "come from one seed" in m.explanation
    assert POWER_LAW_COVERAGE["points"] in data_multiplier(none, none, 1.0).explanation
    with pytest.raises(ValueError, match="one seed per point"):
        fit_power_law(n, err, seeds=[0, 1])


def test_data_multiplier_pairs_the_seed_jackknife_of_both_fits():
    n, err_v, who = seeded_points(4, shared=0.003, own=0.002, rng_seed=2)
    _, err_t, _ = seeded_points(4, shared=0.003, own=0.002, rng_seed=3, law=(0.02, 0.7, 0.025))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FloorNotIdentifiedWarning)
        vanilla, sam = fit_power_law(n, err_v, seeds=who), fit_power_law(n, err_t, seeds=who)
        m = data_multiplier(vanilla, sam, 0.1)
        # By hand: the multiplier of each left-out seed's two fits, its jackknife se on the log scale, t on 3 df.
        jack = [
            data_multiplier(
                fit_power_law(n[who != s], err_v[who != s], n_boot=0, warn=False),
                fit_power_law(n[who != s], err_t[who != s], n_boot=0, warn=False),
                0.1,
            ).multiplier
            for s in range(4)
        ]
    logs = np.log(jack)
    se = math.sqrt(3 / 4 * ((logs - logs.mean()) ** 2).sum())
    q = t_quantile(0.95, 3)
    assert m.interval == pytest.approx((m.multiplier * math.exp(-q * se), m.multiplier * math.exp(q * se)), rel=1e-3)
    assert "paired over 4 seeds" in m.interval_note and m.interval_note in m.explanation
    assert POWER_LAW_COVERAGE["seeds"] in m.interval_note
    # Fits on different seeds: their variances add, and the note says the seeds are not shared.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FloorNotIdentifiedWarning)
        other = fit_power_law(n, err_t, seeds=who + 10)
    unpaired = data_multiplier(vanilla, other, 0.1)
    assert "not shared" in unpaired.interval_note and unpaired.interval[0] < unpaired.multiplier < unpaired.interval[1]


def test_data_multiplier_refuses_to_mix_a_seed_interval_with_a_point_bootstrap():
    n, err, who = seeded_points(3, shared=0.002, own=0.002)
    seeds = fit_power_law(n, err, seeds=who, warn=False)
    points = fit_power_law(n, err, n_boot=100, warn=False)
    m = data_multiplier(points, seeds, 1.0)
    assert math.isnan(m.interval[0]) and "fit both with seeds" in m.explanation
    old = data_multiplier(points, points, 1.0)  # both over points: the percentile interval, said to be over points
    assert old.interval[0] <= 1.0 <= old.interval[1] and "ignore within-seed correlation" in old.explanation
    assert POWER_LAW_COVERAGE["points"] in old.explanation


def test_fit_scaling_table_passes_each_points_seed():
    from benchmarks.sim_coverage import synthetic_runs

    runs = synthetic_runs(np.random.default_rng(0), seeds=3, noise=0.005, seed_share=0.5)
    table = scaling_table(runs, fraction="data.fraction")
    fits = fit_scaling_table(table, n_boot=100, warn=False)
    assert {f.bootstrap for f in fits.values()} == {"seeds"}
    assert all(sorted(f.sample_seeds) == ["0", "1", "2"] for f in fits.values())
    # Without a seed column the same table's points are fitted as independent, and the fits say so.
    unseeded = scaling_table(runs[runs["train.seed"] == 0], fraction="data.fraction", seed=None)
    fits = fit_scaling_table(unseeded, n_boot=100, warn=False)
    assert all("independent" in f.interval_note for f in fits.values())


def test_the_coverage_harness_runs_the_report_path_with_and_without_seeds():
    # benchmarks/sim_coverage.py --power-laws, one study: its rates exist for both intervals (docs/science.md's table).
    from benchmarks.sim_coverage import POWER_LAW_COLUMNS, power_law_intervals

    out = power_law_intervals(0, 3, 0.005, 0.5, n_boot=50)
    for q in POWER_LAW_COLUMNS:
        assert out[q] in (0.0, 1.0) and out[f"{q}_old"] in (0.0, 1.0)
    with pytest.raises(ValueError, match="seed_share must be in"):
        power_law_intervals(0, 3, 0.005, 1.5)
