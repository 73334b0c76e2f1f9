"""The dry run's wall estimate: parts from the rows, two significant figures, waves, and the record of a run."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from studies import cost


def test_two_significant_figures_never_round_a_small_estimate_away():
    assert cost.two_sig(0.184) == "0.18"
    assert cost.two_sig(0.0512) == "0.051"
    assert cost.two_sig(1234.0) == "1200"
    assert cost.two_sig(3.0) == "3"


def test_the_wall_is_the_critical_path_of_the_waves_not_the_total_over_the_slots():
    assert cost.waves([10.0, 10.0, 10.0], 2) == 20.0  # the third trial runs alone: total/2 would say 15
    assert cost.waves([30.0, 10.0, 10.0, 10.0], 2) == 30.0
    assert cost.waves([5.0], 4) == 5.0


def _study(tmp_path, geometry: bool, max_concurrent: int | None = None):
    from studies.spec import load_study

    config = {
        "model": {"name": "resnet18", "cifar_stem": True},
        "data": {"name": "cifar10", "root": str(tmp_path), "batch_size": 256},
    }
    config["schedule"] = {"epochs": 4}
    if geometry:
        config["geometry"] = {"measures": ["lambda_max", "hessian_trace"]}
    study = {
        "name": "costed",
        "objective": {"metric": "val_acc", "mode": "max"},
        "base": config,
        "factors": {"m": {"none": {"optimizer.method": "none"}}},
        "budget": {"repeats_without_search": 3},
        "resources": {"cpus_per_trial": 1, "gpus_per_trial": 1, "max_concurrent_trials": max_concurrent},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return load_study(path, require_data=False)


@pytest.fixture
def row(monkeypatch):
    """The table of one given row, so every figure below is computed from it and from nothing else."""
    given = cost.CardFigures(
        "Card X", "resnet18", 32, 256, 1000.0, 500.0, 2000.0, "given", fixed_s=2.0, checkpoint_s=1.0,
        geometry_s=1e-3, startup_s=60.0,
    )  # fmt: skip
    monkeypatch.setattr(cost, "CARD_FIGURES", (given,))
    monkeypatch.setattr(cost, "REFERENCE_CARD", "Card X")
    monkeypatch.setattr(cost, "_compiles_on_cuda", lambda cfg, workers: False)
    return given


def test_each_part_is_computed_from_the_row_and_the_wall_counts_start_up_and_tail(tmp_path, row):
    from trainables.config import TrialConfig

    study = _study(tmp_path, geometry=True)
    estimate = cost.estimate_study(study, gpus=2, cluster_card="Card X")
    (cell,) = estimate.cells
    cfg = TrialConfig.load(study.cells[0].config)
    parts = dict(cell.trial_parts)
    seen = (50_000 // 256) * 256
    assert parts["training"] == pytest.approx(4 * seen / row.train_none)
    evals = sum(cfg.train.evaluates(e, 4) for e in range(4))
    assert parts["validation"] == pytest.approx(evals * 10_000 / row.val)
    assert parts["geometry"] == pytest.approx((20 + 32) * 2 * 128 * row.geometry_s)
    assert parts["data load and model build"] == row.fixed_s
    assert "checkpoints" in parts and "compile" not in parts
    assert estimate.slots == 2 and cell.trials == 3
    trial = cell.trial_s
    assert estimate.wall_h == pytest.approx((row.startup_s + 2 * trial) / 3600)  # 3 trials on 2 slots: two waves
    wall = estimate.wall_parts()
    assert wall["start-up"] == pytest.approx(60 / 3600)
    assert wall["tail of the last trials"] == pytest.approx((2 * trial - 3 * trial / 2) / 3600)
    assert sum(wall.values()) == pytest.approx(estimate.wall_h)
    text = "\n".join(estimate.lines())
    assert f"wall time {cost.two_sig(estimate.wall_h)} h on 2 trial(s) at once (start-up 0.017" in text
    assert "geometry" in text and "Not counted" not in text


def test_a_row_without_geometry_or_start_up_says_so_and_max_concurrent_trials_caps_the_slots(tmp_path, row):
    monkeypatch_row = dataclasses.replace(row, geometry_s=None, startup_s=None)
    cost.CARD_FIGURES = (monkeypatch_row,)  # restored by the fixture's monkeypatch
    estimate = cost.estimate_study(_study(tmp_path, geometry=True, max_concurrent=1), gpus=4, cluster_card="Card X")
    assert estimate.slots == 1
    assert estimate.missing == ("geometry", "start-up")
    assert "geometry" not in dict(estimate.cells[0].trial_parts)
    assert estimate.wall_h == pytest.approx(3 * estimate.cells[0].trial_s / 3600)
    assert "Not counted, no measured row: geometry, start-up." in "\n".join(estimate.lines())


def test_a_run_records_its_wall_beside_the_estimate_and_prints_their_ratio(tmp_path, row):
    logged: dict[str, float] = {}
    study = _study(tmp_path, geometry=False)
    line = cost.record_estimate(logged.__setitem__, study, 7200.0, {"GPU": 1.0})
    estimate = cost.estimate_study(study, gpus=1, cluster_card=None)
    assert logged == {cost.WALL_METRIC: 2.0, cost.ESTIMATE_METRIC: pytest.approx(estimate.wall_h)}
    assert (
        f"estimated {cost.two_sig(estimate.wall_h)} h (actual/estimate {cost.two_sig(2.0 / estimate.wall_h)})" in line
    )


def test_a_run_without_an_estimate_still_records_its_wall(tmp_path, row):
    logged: dict[str, float] = {}
    line = cost.record_estimate(logged.__setitem__, _study(tmp_path, geometry=False), 36.0, {"CPU": 2.0})
    assert logged == {cost.WALL_METRIC: 0.01} and "no estimate" in line
