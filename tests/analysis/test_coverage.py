"""The report's intervals cover, by simulation: benchmarks/sim_coverage.py at a size the suite can afford (docs/science.md
has the full table, 400 studies a row). The scaling law's intervals: 30 studies straight from arrays (3 seeds, 0.5 points
of noise), where a known-bad interval (the normal quantile on 2 df) must be caught, and an exact check that the
bootstrap-t is Student's t where the fit is linear. The gain: 150 studies through sam_gain, Holm across fractions."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import t as student

from analysis.scaling import fit_law, jackknife_se, saturating_bootstrap_t
from benchmarks.sim_coverage import FRACTIONS, held_in_intervals, law, simulate

STUDIES = 150
SD = math.sqrt(0.95 * 0.05 / STUDIES)
QUANTITIES = ["E", "beta", "prediction", "check"]


@pytest.fixture(scope="module")
def held_in():
    return pd.DataFrame([held_in_intervals(20_000 + i, 3, 0.005) for i in range(30)])


def test_the_law_intervals_cover_and_a_too_narrow_interval_is_caught(held_in):
    shipped = held_in[QUANTITIES].mean()
    bad = held_in[[f"{q}_z" for q in QUANTITIES]].mean()
    # 30 studies resolve a coverage to about ± 4 points (one binomial sd): the shipped intervals average at least
    # 85%, where estimate ± 1.96 se on 2 df (about 80% in theory) must fall below it; every quantity's shipped
    # interval covers at least as often as the bad one (it is never narrower).
    assert shipped.mean() >= 0.85 and bad.mean() < 0.85, (shipped, bad)
    assert (shipped.to_numpy() >= bad.to_numpy()).all(), (shipped, bad)


def test_the_bootstrap_t_is_students_t_where_the_fit_is_linear():
    # Noise of 1e-3 accuracy points: the fit is linear in the seeds over the noise's range, so the studentised draws
    # follow t on S - 1 df, the seed-level se equals the delete-one-seed jackknife's, and the interval is t's.
    seeds = 4
    rng = np.random.default_rng(0)
    n = np.repeat(np.asarray(FRACTIONS), seeds)
    who = np.tile(np.arange(seeds), len(FRACTIONS))
    err = law(n) + 1e-5 * rng.standard_normal(len(n))
    fit = fit_law(n, err)
    boot = saturating_bootstrap_t(n, err, who, fit)
    jack = np.array(
        [fit_law(n[who != s], err[who != s], huber_delta=fit.huber_delta, start=fit.theta).theta for s in range(seeds)]
    )
    q = student.ppf(0.975, seeds - 1)
    for i, p in ((0, "E"), (2, "beta")):
        est, lo, hi, se = boot[p]
        assert se == pytest.approx(float(jackknife_se(jack[:, i : i + 1])[0]), rel=0.02)
        assert q * se <= est - lo <= 1.15 * q * se and q * se <= hi - est <= 1.15 * q * se, (p, boot[p])


@pytest.fixture(scope="module")
def rates():
    return simulate(3, 0.005, STUDIES, full=False, power=False, first=10_000, laws=False)


def test_gain_intervals_cover_at_their_nominal_rate_with_three_seeds(rates):
    assert 0.95 - 3 * SD <= rates["gain_covers"] <= 1.0, rates


def test_under_no_difference_few_studies_call_any_fraction_significant(rates):
    # Holm over the 5 fractions: the family-wise error rate is at most 5%.
    assert rates["any_significant"] <= 0.05 + 3 * SD, rates


def test_the_harness_test_set_noise_is_half_common_to_a_cells_runs():
    from benchmarks.sim_coverage import synthetic_runs

    # Seed noise off: what is left is the binomial noise of 5,000 test images, half of its variance one draw per
    # (method, fraction) cell. Over 40 seeds the cell means then scatter by sqrt(0.5) of one run's binomial sd,
    # not by 1/sqrt(40) of it as independent noise would.
    rng = np.random.default_rng(0)
    cells = []
    for _ in range(60):
        runs = synthetic_runs(rng, seeds=40, noise=1e-12, images=5000)
        runs["err"] = 1.0 - runs["val_acc"] - law(runs["data.fraction"])
        cells.append(runs.groupby(["factor.method", "data.fraction"])["err"].agg(["mean", "std"]))
    frame = pd.concat(cells)
    sd = np.sqrt(law(frame.index.get_level_values(1)) * (1 - law(frame.index.get_level_values(1))) / 5000)
    assert np.std(frame["mean"] / sd) == pytest.approx(np.sqrt(0.5), rel=0.1)
    assert np.mean(frame["std"] / sd) == pytest.approx(np.sqrt(0.5), rel=0.05)
