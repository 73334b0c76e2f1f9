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
    assert cost.two_sig(3.0) == "3.0"  # two figures, the trailing zero kept
    assert cost.two_sig(0.2004) == "0.20" and cost.two_sig(99.6) == "100"


def test_the_wall_is_the_critical_path_of_the_waves_not_the_total_over_the_slots():
    assert cost.waves([10.0, 10.0, 10.0], 2) == 20.0  # the third trial runs alone: total/2 would say 15
    assert cost.waves([30.0, 10.0, 10.0, 10.0], 2) == 30.0
    assert cost.waves([5.0], 4) == 5.0


def _study(tmp_path, geometry: bool, max_concurrent: int | None = None, gpus: float = 1):
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
        "resources": {"cpus_per_trial": 1, "gpus_per_trial": gpus, "max_concurrent_trials": max_concurrent},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return load_study(path, require_data=False)


@pytest.fixture
def row(monkeypatch):
    """The table of one given row, so every figure below is computed from it and from nothing else."""
    given = cost.CardFigures(
        "Card X", "resnet18", 32, 256, 1000.0, 500.0, 2000.0, "given", fixed_s=2.0, checkpoint_s=1.0,
        geometry_s=1e-3, startup_s=60.0, records_s=0.5,
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
    assert parts["data load and model build"] == row.fixed_s and parts["records"] == row.records_s
    assert "checkpoints" in parts and "compile" not in parts
    assert estimate.slots == 2 and cell.trials == 3
    trial = cell.trial_s
    assert estimate.wall_h == pytest.approx((row.startup_s + 2 * trial) / 3600)  # 3 trials on 2 slots: two waves
    wall = estimate.wall_parts()
    assert wall["start-up"] == pytest.approx(60 / 3600)
    assert wall["tail of the last trials"] == pytest.approx((2 * trial - 3 * trial / 2) / 3600)
    assert sum(wall.values()) == pytest.approx(estimate.wall_h)
    text = "\n".join(estimate.lines())
    unit, per_h = cost.readable_unit(estimate.wall_h)
    assert unit == "min"  # about 10 minutes
    assert f"wall time {cost.two_sig(estimate.wall_h * per_h)} min on 2 trial(s) at once" in text
    assert "(start-up 1.0, training " in text and "tail of the last trials" in text
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


class _Record:
    """The launch's record object as record_estimate uses it: the study run's metrics and tags."""

    def __init__(self):
        self.metrics: dict[str, float] = {}
        self.tags: dict[str, str] = {}

    def log_study_metric(self, key, value):
        self.metrics[key] = value

    def set_study_tag(self, key, value):
        self.tags[key] = value


def test_a_run_records_its_wall_beside_the_estimate_and_says_both(tmp_path, row):
    from trainables.naming import ESTIMATE_CHECK_TAG, ESTIMATE_TAG

    record = _Record()
    study = _study(tmp_path, geometry=False)
    line = cost.record_estimate(record, study, 7200.0, {"GPU": 1.0}, partial=False)
    estimate = cost.estimate_study(study, gpus=1, cluster_card=None)
    assert record.metrics == {cost.WALL_METRIC: 2.0, cost.ESTIMATE_METRIC: pytest.approx(estimate.wall_h)}
    unit, per_h = cost.readable_unit(estimate.wall_h)
    said = (
        f"estimated {cost.two_sig(estimate.wall_h * per_h)} {unit}, took {cost.two_sig(2.0 * per_h)} {unit} "
        f"(took/estimated {cost.two_sig(2.0 / estimate.wall_h)})"
    )
    assert said in line and record.tags[ESTIMATE_CHECK_TAG] == said
    assert record.tags[ESTIMATE_TAG].startswith(f"{cost.two_sig(estimate.wall_h * per_h)} {unit} on Card X, 1 at once")
    assert "start-up" in record.tags[ESTIMATE_TAG] and "records" in record.tags[ESTIMATE_TAG]
    # A resumed or interrupted launch ran part of the study: both are recorded, and no ratio is claimed.
    partial = cost.record_estimate(_Record(), study, 7200.0, {"GPU": 1.0}, partial=True)
    assert "not comparable" in partial and "took/estimated" not in partial


def test_a_run_without_an_estimate_still_records_its_wall(tmp_path, row):
    from trainables.naming import ESTIMATE_CHECK_TAG

    record = _Record()
    line = cost.record_estimate(record, _study(tmp_path, geometry=False), 36.0, {"CPU": 2.0}, partial=False)
    assert record.metrics == {cost.WALL_METRIC: 0.01} and "no estimate" in line
    assert record.tags[ESTIMATE_CHECK_TAG].startswith("took 36 s; no estimate")


def test_the_figures_file_keeps_the_newest_row_of_each_figure_and_names_a_bad_one(tmp_path):
    from benchmarks.results import COLUMNS

    def write(rows):
        path = tmp_path / "trial_cost.csv"
        with path.open("w") as f:
            f.write(",".join(COLUMNS) + "\n")
            for card, figure, value in rows:
                f.write(f"{card},v,c,2026-01-01,cmd,{figure},{value},s,\n")
        return path

    rows = [
        ("Card Y x2", "m/p4 32px b256 train_none", 100),
        ("Card Y x1", "m/p4 32px b256 train_sam", 50),
        ("Card Y x1", "m/p4 32px b256 train_none", 200),  # a rerun: supersedes the first row
        ("Card Y x1", "start-up", 30),
        ("Card Y x1", "trial records", 0.4),
        ("Card Y x1", "other[depth=1] 16px b64 train_none", 9),  # no train_sam: not a row to cost from
    ]
    (fig,) = cost.load_figures(write(rows))
    assert (fig.card, fig.model, fig.img_size, fig.batch_size) == ("Card Y", "m/p4", 32, 256)
    assert (fig.train_none, fig.train_sam, fig.val, fig.startup_s, fig.records_s) == (200, 50, None, 30, 0.4)
    with pytest.raises(ValueError, match=r"figure 'm/p4 32px b256 speed' is not .* Fix: rename it"):
        cost.load_figures(write([("Card Y", "m/p4 32px b256 speed", 1)]))
    assert cost.load_figures(tmp_path / "absent.csv") == ()


def test_a_model_made_small_has_its_own_key():
    assert cost.model_key({"name": "vit", "kwargs": {"patch_size": 4}}) == "vit/p4"
    small = {"name": "vit", "kwargs": {"patch_size": 4, "depth": 1, "embed_dim": 32}}
    assert cost.model_key(small) == "vit/p4[depth=1;embed_dim=32]"
    assert cost.model_key({"name": "resnet18", "kwargs": {"layers": [1, 1]}}) == "resnet18[layers=[1,1]]"


def test_a_cpu_study_is_costed_from_the_cpu_rows_on_the_cpus_it_has(tmp_path, monkeypatch):
    from trainables.config import TrialConfig

    cpu = cost.CardFigures(
        "CPU (x, 2 cores)", "resnet18", 32, 256, 100.0, 50.0, 400.0, "given", fixed_s=1.0, startup_s=20.0
    )
    monkeypatch.setattr(cost, "CARD_FIGURES", (cpu,))
    study = _study(tmp_path, geometry=False, gpus=0)
    estimate = cost.estimate_study(study, cpus=2)
    assert estimate.cpu and estimate.card == cpu.card and estimate.slots == 2  # 2 CPUs, 1 a trial
    (cell,) = estimate.cells
    cfg = TrialConfig.load(study.cells[0].config)
    assert dict(cell.trial_parts)["training"] == pytest.approx(4 * (50_000 // 256) * 256 / cpu.train_none)
    assert cfg.train.compile == "auto" and not cell.compiles  # a CPU trial does not compile (resolve_compile)
    assert estimate.wall_h == pytest.approx((20.0 + 2 * cell.trial_s) / 3600)
    assert "trial-hours" in estimate.lines()[0] and "On this cluster's 2 CPU(s)" in "\n".join(estimate.lines())
    monkeypatch.setattr(cost, "CARD_FIGURES", ())
    assert "has no CPU row" in cost.estimate_study(study, cpus=2).problems[0]


def test_sampas_two_rank_form_gets_no_estimate_from_the_one_device_step_cost(tmp_path, row):
    """Its two workers each take one of the step's passes at once: the one-device step cost (about half the base
    step's) would put its wall near twice the truth, so the cell says it has no measured figure instead."""
    _study(tmp_path, geometry=False)
    raw = yaml.safe_load((tmp_path / "s.yaml").read_text())
    raw["factors"]["m"] = {
        "sampa": {"optimizer.method": "sampa"},
        "two": {"optimizer.method": "sampa", "optimizer.hparams.parallel": True},
    }
    raw["resources"]["workers_per_trial"] = 2
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    from studies.spec import load_study

    estimate = cost.estimate_study(load_study(tmp_path / "s.yaml", require_data=False), gpus=2, cluster_card="Card X")
    assert [c.cell for c in estimate.cells] == ["sampa"]
    (problem,) = estimate.problems
    assert "cell two: sampa's parallel=True form has no measured step cost on 2 workers" in problem, problem
