"""What a design can detect: the closed form, the shipped study headers that state it, and the dry run that prints it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from analysis.design import detectable_effects, header_statement, study_detectable

REPO = Path(__file__).resolve().parents[2]
FRACTIONS = np.geomspace(0.05, 1.0, 5)


def test_detectable_gain_is_the_noncentral_t_answer_and_shrinks_with_seeds():
    from scipy.stats import nct, t

    d = detectable_effects(5, FRACTIONS, 0.005, images=None)  # seed noise alone: the closed form's own check
    se = math.sqrt(2) * 0.005 / math.sqrt(5)
    crit = t.ppf(1 - 0.05 / 10, 4)  # Holm's first step over 5 fractions
    assert nct.sf(crit, 4, d.gain / se) + nct.cdf(-crit, 4, d.gain / se) == pytest.approx(0.8, abs=1e-6)
    more = detectable_effects(10, FRACTIONS, 0.005, images=None)
    assert more.gain < d.gain and more.beta_up < d.beta_up
    assert detectable_effects(5, FRACTIONS, 0.01, images=None).gain == pytest.approx(2 * d.gain)  # linear in the noise
    assert math.isnan(detectable_effects(5, FRACTIONS[:3], 0.005).beta_diff)  # 3 fractions: no law to compare
    with pytest.raises(ValueError, match="seeds must be an int >= 2"):
        detectable_effects(1, FRACTIONS, 0.005)


def test_three_seed_power_is_quadrature_not_scipys_nan_read_as_one():
    # Issue 32: data_scaling at 3 seeds and 4 fractions, 0.5 points of noise. scipy's noncentral t is NaN there
    # (df 2, noncentrality above ~10), which _mde scored as power 1, so it called 4.17 points detectable.
    from analysis.scaling import power_t

    se = math.sqrt(2) * 0.005 / math.sqrt(3)
    assert power_t(0.0417, se, 2, alpha=0.05 / 4) == pytest.approx(0.729, abs=0.002)
    d = detectable_effects(3, [0.1, 0.25, 0.5, 1.0], 0.005, images=None)
    assert d.gain == pytest.approx(0.0463, abs=0.0002)


def test_the_noise_per_run_is_never_below_the_test_sets_binomial_floor():
    from analysis.design import binomial_floor

    floor = binomial_floor(5000)
    assert floor == pytest.approx(0.00707, abs=1e-5)  # 0.71 points: above the 0.5-point reference seed noise
    d = detectable_effects(5, FRACTIONS, 0.005)
    assert d.noise == pytest.approx(floor) and d.seed_noise == 0.005
    assert d.gain == pytest.approx(detectable_effects(5, FRACTIONS, floor, images=None).gain)
    assert detectable_effects(5, FRACTIONS, 0.01).noise == 0.01  # a larger seed noise is used as given


def test_beta_power_is_stated_in_both_directions():
    # A larger beta is measured better than a smaller one: the same design detects a rise sooner than a fall.
    d = detectable_effects(5, FRACTIONS, 0.005, images=None)
    assert d.beta_up < d.beta_down or math.isnan(d.beta_down)
    assert "+" in d.describe() and "/" in d.describe()


@pytest.mark.parametrize("df", [1, 2, 4, 9])
def test_power_by_quadrature_matches_a_monte_carlo_t_test(df):
    from scipy.stats import t

    from analysis.scaling import detectable, power_t

    rng = np.random.default_rng(df)
    alpha = 0.05 / 4
    crit = t.ppf(1 - alpha / 2, df)
    for effect in (0.5, 2.0, 6.0, 15.0):
        z = rng.standard_normal(400_000) + effect
        s = np.sqrt(rng.chisquare(df, 400_000) / df)
        found = float(np.mean(np.abs(z / s) > crit))
        assert power_t(effect, 1.0, df, alpha=alpha) == pytest.approx(found, abs=0.004)
    mde = detectable(1.0, df, power=0.8, family=4)
    assert power_t(mde, 1.0, df, alpha=alpha) == pytest.approx(0.8, abs=1e-6)
    assert power_t(1e4, 1.0, df, alpha=alpha) <= 1.0 and power_t(0.0, 1.0, df, alpha=alpha) < 0.05


def test_every_shipped_study_header_states_what_its_design_detects():
    from studies.spec import load_study

    for path in sorted((REPO / "studies").glob("*.yaml")):
        study = load_study(path, require_data=False)
        comments = [line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#")]
        assert header_statement(study) in " ".join(comments), path.name


def test_dry_run_prints_what_the_design_detects(capsys):
    from studies.cli import main
    from studies.spec import load_study

    study = REPO / "studies" / "data_scaling.yaml"
    assert main(["run", "--dry-run", str(study), "--set", "data.root=/nonexistent"]) == 0
    out = capsys.readouterr().out
    statement = study_detectable(load_study(study, require_data=False))
    assert f"Design: {statement}" in out and "beta difference" in statement


def test_scored_images_come_from_the_registry_as_the_evaluation_split_draws_them():
    from analysis.design import binomial_floor, scored_images
    from trainables.data import eval_positions
    from trainables.data.registry import DATASETS

    for name, spec in DATASETS.items():
        if spec.val_size is None:
            assert scored_images(name) is None
            continue
        for split in ("all", "selection", "test"):
            assert scored_images(name, split) == len(eval_positions(spec.val_size, split)), (name, split)
    assert scored_images("cifar10") == 5000 and binomial_floor() == pytest.approx(binomial_floor(5000))
