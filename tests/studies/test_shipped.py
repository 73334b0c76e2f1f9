"""Every shipped study: documented at its head, valid, and run end to end in its --smoke form on real Ray."""

from pathlib import Path

import pytest

from analysis import load_runs
from studies.runner import run_study
from studies.spec import load_study

STUDIES = sorted((Path(__file__).resolve().parents[2] / "studies").glob("*.yaml"))
EXPECTED = {"data_scaling", "gsam_alpha", "optimizer_cost", "quickstart", "rho_sensitivity", "saf_mesa_lambda"}


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
    # Not the study's own storage: beside the repository's study files, or a cluster's shared mount.
    outcome = run_study(path, smoke=True, tracking_uri=tracking_uri, overrides={"storage": str(tmp_path / "runs")})
    assert outcome.trials == study.total_trials == len(study.cells)
    assert outcome.errored == 0
    runs = load_runs(f"{study.spec.name}-smoke", tracking_uri=tracking_uri)
    assert len(runs) == study.total_trials
    assert set(runs["status"]) <= {"finished", "diverged"}
    assert (runs["status"] == "finished").sum() >= len(runs) - 1
