"""The report's exploratory intervals, one at a time, under sim_report_null's null: benchmarks/sim_null_intervals.py."""

from pathlib import Path

import pandas as pd
import pytest

from benchmarks.sim_null_intervals import one_replicate, summarise
from benchmarks.sim_report_null import _design

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def design():
    return _design(ROOT / "studies" / "data_scaling.yaml")


def test_one_replicate_is_the_reports_multiplier_family(design):
    # 3 archs x 2 pairs (sam/vanilla, sam_aug/aug) x 5 fractions: the 30 intervals a data_scaling report prints.
    rows = pd.DataFrame(one_replicate(design, 0, laws=False))
    assert len(rows) == 30
    assert set(rows["pair"]) == {"sam", "sam_aug"}
    assert rows.groupby("quantity").size().tolist() == [6] * 5


def test_multiplier_intervals_exclude_1_about_5_percent_each(design):
    # 12 null reports, 360 intervals: a per-interval 95% interval excludes 1 in about 18 of them (5%); 36+ (10%)
    # would say the interval is miscalibrated, which is not what a report-level 67% means (30 intervals a report).
    rows = [r for s in range(12) for r in one_replicate(design, 100 + s, laws=False)]
    table = summarise("data_scaling.yaml", rows, 0.0)
    assert table["intervals"].sum() == 360 and table["absent"].sum() <= 4
    rate = table["excluding"].sum() / table["intervals"].sum()
    assert 0.01 <= rate <= 0.10, table
    assert (table["reports_with_one_excluding"] >= table["rate"]).all()
