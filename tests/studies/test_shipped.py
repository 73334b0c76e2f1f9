"""Every shipped study: documented at its head, valid, and run end to end in its --smoke form on real Ray."""

import re
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from analysis import load_runs
from studies.cost import ESTIMATE_METRIC, WALL_METRIC
from studies.runner import run_study
from studies.spec import load_study
from trainables.naming import ESTIMATE_CHECK_TAG, ESTIMATE_TAG, GPUS_PER_WORKER_PARAM, WORKERS_PARAM, kind_filter

REPO_STUDIES = Path(__file__).resolve().parents[2] / "studies"
STUDIES = sorted(REPO_STUDIES.glob("*.yaml"))
EXPECTED = {
    "compute_matched",
    "data_scaling",
    "gsam_alpha",
    "late_phase",
    "optimizer_cost",
    "quickstart",
    "rho_sensitivity",
    "saf_mesa_lambda",
    "sam_on",
}


def test_every_shipped_study_is_checked():
    # A glob that silently matched nothing would make the tests below vacuous.
    assert {p.stem for p in STUDIES} == EXPECTED


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_opens_with_question_table_and_cost(path):
    head = path.read_text().split("\nname:")[0]
    for marker in ("Question:", "Cost", "GPU"):
        assert marker in head, f"{path.name}: its opening comment must state {marker!r}"
    if path.stem != "quickstart":
        assert "Mirrors:" in head and "Table" in head


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_smoke_run(path, ray_cluster, tmp_path, monkeypatch, tracking_uri):
    monkeypatch.chdir(tmp_path)  # the study's relative artifact folder lands here
    study = load_study(path, smoke=True)
    overrides = {
        # Not the study's own storage: beside the repository's study files, or a cluster's shared mount.
        "storage": str(tmp_path / "runs"),
        # One trial at a time, so that every trial of a study reuses its first one's Ray actor (Tune's reuse_actors)
        # instead of a second process importing torch, timm and MLflow beside it on the suite's two cores (339 -> 283
        # CPU-s for the seven studies here). What this test checks is that each shipped file runs in its --smoke
        # form; concurrent trials of a study are tested by test_end_to_end (the quickstart itself, two at a time),
        # test_confirm, test_trial_cost, test_failures' resume and the two-node cluster.
        "resources.max_concurrent_trials": 1,
    }
    outcome = run_study(path, smoke=True, tracking_uri=tracking_uri, overrides=overrides)
    assert outcome.trials == study.total_trials >= len(study.cells)  # the smoke form keeps every cell
    assert outcome.errored == 0
    runs = load_runs(f"{study.spec.name}-smoke", tracking_uri=tracking_uri)
    assert len(runs) == study.total_trials
    assert set(runs["status"]) <= {"finished", "diverged"}
    assert (runs["status"] == "finished").sum() >= len(runs) - 1
    if study.spec.confirm is not None:  # the confirm stage ran in full: fresh seeds, one trial each, in every cell
        confirm = runs[runs["stage"] == "confirm"]
        assert len(confirm) == sum(c.confirm for c in study.cells)
        assert set(confirm["train.seed"]) == set(study.spec.confirm.seed_list[: study.cells[0].confirm])
    # What each trial held, beside its config: its GPU-seconds are counted from it (analysis.compute).
    assert (runs[WORKERS_PARAM] == 1).all() and (runs[GPUS_PER_WORKER_PARAM] == 0).all()
    # The study run holds the dry run's estimate beside the wall it took (studies/cost.py record_estimate): every
    # run checks the estimate, from the CPU rows of the --smoke form's models.
    client = MlflowClient(tracking_uri)
    (study_run,) = client.search_runs(
        [client.get_experiment_by_name(f"{study.spec.name}-smoke").experiment_id], filter_string=kind_filter("study")
    )
    recorded, tags = study_run.data.metrics, study_run.data.tags
    assert recorded[WALL_METRIC] > 0 and recorded[ESTIMATE_METRIC] > 0, recorded
    assert re.fullmatch(r"estimated \S+ (s|min|h), took \S+ (s|min|h) \(took/estimated \S+\)", tags[ESTIMATE_CHECK_TAG])
    assert "start-up" in tags[ESTIMATE_TAG] and "training" in tags[ESTIMATE_TAG]
    measures = study.cells[0].config.get("geometry", {}).get("measures")
    if measures:  # the runner hands each trial its probe; the measures come back as the trial's metrics
        from analysis.geometry import MEASURES

        done = runs[runs["status"] == "finished"]
        for name in measures:
            prefix = "geometry/" + MEASURES[name].prefix
            cols = [c for c in runs.columns if c.startswith(prefix) and (MEASURES[name].prefix or c == prefix + name)]
            assert cols and done[cols].notna().all().all(), (name, cols)
        assert (done["geometry_time_s"] > 0).all()


def _stated(head: str) -> dict[str, int]:
    """The counts a study file's opening comment states: '= N trials' (the full study), '`--smoke` runs N tiny
    trials (C cells)'."""
    import re

    text = " ".join(line.lstrip("# ").strip() for line in head.splitlines())
    full = re.search(r"= (?:\d+ cells, )?(\d+) trials", text)
    smoke = re.search(r"`--smoke` runs (\d+) tiny trials \((\d+) cells?\)", text)
    assert full and smoke, "the opening comment must state '= N trials' and '`--smoke` runs N tiny trials (C cells)'"
    stated = {"trials": int(full.group(1)), "smoke_trials": int(smoke.group(1)), "smoke_cells": int(smoke.group(2))}
    if cells := re.search(r"= (\d+) cells, \d+ trials", text):
        stated["cells"] = int(cells.group(1))
    return stated


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_stated_counts_match_the_expansion(path):
    stated = _stated(path.read_text().split("\nname:")[0])
    full = load_study(path, require_data=False)
    smoke = load_study(path, smoke=True)
    actual = {"trials": full.total_trials, "smoke_trials": smoke.total_trials, "smoke_cells": len(smoke.cells)}
    if "cells" in stated:
        actual["cells"] = len(full.cells)
    assert stated == actual


def _updates(cell) -> float:
    """A cell's number of updates in units of one epoch of the whole training set."""
    return cell.config["schedule"]["epochs"] * cell.config["data"].get("fraction", 1.0)


def test_data_scaling_smoke_keeps_the_scaling_question():
    smoke = load_study(REPO_STUDIES / "data_scaling.yaml", smoke=True)
    fractions = {c.config["data"]["fraction"] for c in smoke.cells}
    # The seeds are the confirm stage's, the same in every cell (they pair the gain).
    assert {c.confirm for c in smoke.cells} == {2} and smoke.spec.confirm is not None
    assert len(fractions) >= 3
    assert {c.levels["method"] for c in smoke.cells} >= {"vanilla", "sam"}
    assert len({_updates(c) for c in smoke.cells}) == 1  # equal steps, tiny


def test_data_scaling_gives_every_fraction_equal_steps_its_own_rho_and_five_confirm_seeds():
    full = load_study(REPO_STUDIES / "data_scaling.yaml", require_data=False)
    assert len({_updates(c) for c in full.cells}) == 1
    # The warm-up is the same share of every schedule.
    assert len({c.config["schedule"]["warmup_epochs"] / c.config["schedule"]["epochs"] for c in full.cells}) == 1
    # 1/20 beside Table 5's fractions: four below the held-out 1.0 for the three-parameter law.
    assert {c.config["data"]["fraction"] for c in full.cells} == {0.05, 0.1, 0.25, 0.5, 1.0}
    sam = [c for c in full.cells if c.config["optimizer"]["method"] == "sam"]
    assert sam and all("optimizer.hparams.rho" in c.space and c.trials >= 4 for c in sam)  # searched in each cell
    assert {c.confirm for c in full.cells} == {5}  # five fresh seeds per cell, at its chosen rho


def test_compute_matched_gives_vanilla_twice_the_epochs_in_both_forms():
    for smoke in (False, True):
        study = load_study(REPO_STUDIES / "compute_matched.yaml", smoke=smoke, require_data=False)
        epochs = {c.levels["method"]: c.config["schedule"]["epochs"] for c in study.cells}
        assert epochs["vanilla_2x"] == 2 * epochs["vanilla"] == 2 * epochs["sam"]
        assert all(not c.space for c in study.cells)  # nothing searched: a search's trials would be compute too
    full = load_study(REPO_STUDIES / "compute_matched.yaml", require_data=False)
    rho = {c.levels["arch"]: c.config["optimizer"]["hparams"]["rho"] for c in full.cells if c.levels["method"] == "sam"}
    assert rho == {"resnet": 0.05, "vit": 0.1, "mixer": 0.15}


@pytest.mark.parametrize(
    "name, knob", [("rho_sensitivity", "rho"), ("saf_mesa_lambda", "lam"), ("gsam_alpha", "alpha")]
)
def test_smoke_of_a_sensitivity_study_tries_several_values(name, knob):
    smoke = load_study(REPO_STUDIES / f"{name}.yaml", smoke=True)
    searched = [c for c in smoke.cells if any(p.endswith(knob) for p in c.space)]
    assert searched and all(c.trials >= 2 for c in searched)
