"""The best rho with an honest uncertainty: a confidence set calibrated at ties, and the transfer slope's interval."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.sweep import best_level_set, transfer_slope

RHOS = [0.01, 0.03, 0.1, 0.3, 1.0]


def test_under_a_flat_response_every_level_stays_in_the_set_at_least_at_the_nominal_rate():
    rng = np.random.default_rng(0)
    studies = 400
    kept = np.zeros(len(RHOS))
    for _ in range(studies):
        values = [0.9 + 0.005 * rng.standard_normal(3) for _ in RHOS]
        kept += np.isin(RHOS, best_level_set(RHOS, values)["set"])
    # Each level is a best level here: none may be dropped more often than 5% (3 binomial sds of slack).
    assert (kept / studies >= 0.95 - 3 * np.sqrt(0.95 * 0.05 / studies)).all(), kept / studies


def test_a_clearly_better_level_is_the_set_alone_and_min_mode_flips_the_sign():
    rng = np.random.default_rng(1)
    values = [0.9 + 0.002 * rng.standard_normal(5) for _ in RHOS]
    values[2] = values[2] + 0.05
    out = best_level_set(RHOS, values)
    assert out["best"] == 0.1 and out["set"] == [0.1]
    assert best_level_set(RHOS, [-np.asarray(v) for v in values], mode="min")["set"] == [0.1]
    assert best_level_set(RHOS, [[0.9]] * len(RHOS))["set"] is None  # single runs: no spread, no set


def test_transfer_slope_interval_is_the_projection_of_the_sets():
    fractions = [0.1, 1.0]
    out = transfer_slope(fractions, [0.1, 0.1], [[0.03, 0.1], [0.1, 0.3]])
    assert out["slope"] == pytest.approx(0.0)
    # Smallest: the lowest level at 1.0 over the highest at 0.1; largest: the highest at 1.0 over the lowest at 0.1.
    assert out["low"] == pytest.approx(np.log10(0.1) - np.log10(0.1))
    assert out["high"] == pytest.approx(np.log10(0.3) - np.log10(0.03))
    assert out["low"] <= 0 <= out["high"] and "holds 0" in out["note"]
    assert np.isnan(transfer_slope(fractions, [0.1, 0.1], [None, [0.1]])["low"])
