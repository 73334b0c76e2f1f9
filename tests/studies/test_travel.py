"""A store that travels: a plain copy of mlflow.db + mlartifacts, or a `sharpscale export` folder moved on, with the
original moved away; `report`, `status`, `dashboard`, `ui` and `load_runs` work on it and write only inside it."""

import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from studies.server import free_port
from trainables.naming import OPTUNA_STORAGE_TAG, STORAGE_TAG, STUDY_FILE_HASH_TAG, STUDY_FILE_TAG

REPO = Path(__file__).resolve().parents[2]


def _files(root: Path, *, outside: Path) -> set[Path]:
    """Every file and folder under root, except those inside `outside` (the copy, where writes belong)."""
    return {p for p in root.rglob("*") if not p.is_relative_to(outside)}


def _original_store(root: Path, new_mlflow_store):
    """A quickstart-shaped store at root (mlflow.db, mlartifacts/, the study file, an Optuna database), its study run
    tagged as `sharpscale run` tags it; a trial holds one artifact."""
    import optuna
    from mlflow.tracking import MlflowClient

    from studies.spec import load_study
    from tests.studies.test_study_page import _recorded_study

    uri = new_mlflow_store(root / "mlflow.db")
    shutil.copyfile(REPO / "studies" / "quickstart.yaml", root / "quickstart.yaml")
    study, exp, study_run, first = _recorded_study(uri, artifacts=root / "mlartifacts")
    study = load_study(root / "quickstart.yaml")
    optuna_uri = f"sqlite:///{root / 'optuna.db'}"
    optuna.create_study(study_name="a cell", storage=optuna_uri).optimize(lambda t: t.suggest_float("x", 0, 1), 1)
    client = MlflowClient(uri)
    for key, value in {
        STUDY_FILE_TAG: str(root / "quickstart.yaml"),
        STUDY_FILE_HASH_TAG: study.file_hash,
        OPTUNA_STORAGE_TAG: optuna_uri,
        STORAGE_TAG: str(root / "ray_results"),
    }.items():
        client.set_tag(study_run, key, value)
    client.log_text(first, "kept with the trial", "note.txt")
    return exp, study_run, first


def _report_and_status_work_inside(store: Path, study_file: Path, tmp_path: Path, capsys):
    from mlflow.tracking import MlflowClient

    from analysis import load_runs
    from studies.cli import main

    uri = f"sqlite:///{store / 'mlflow.db'}"
    before = _files(tmp_path, outside=store)
    assert main(["status", str(study_file), "--tracking-uri", uri]) == 0
    assert "vit/sam " in capsys.readouterr().out  # the cell by its one name (analysis.runs.cell_name)
    assert len(load_runs("quickstart", tracking_uri=uri)) == 4
    out = store / "reports"
    assert main(["report", str(study_file), "--tracking-uri", uri, "--out", str(out)]) == 0
    assert (out / "summary.md").is_file()
    assert _files(tmp_path, outside=store) == before  # nothing recreated at the original's place
    exp = MlflowClient(uri).get_experiment_by_name("quickstart")
    study_run = MlflowClient(uri).search_runs([exp.experiment_id], "tags.`sharpscale.kind` = 'study'")[0]
    assert (Path(study_run.info.artifact_uri.removeprefix("file://")) / "report" / "summary.md").is_file()
    assert study_run.info.artifact_uri.startswith(store.as_uri())
    return uri


@pytest.mark.timeout(300)
def test_a_plain_copy_of_the_store_reports_into_itself_not_the_gone_original(
    tmp_path, new_mlflow_store, cli_process, capsys
):
    original = tmp_path / "original"
    _original_store(original, new_mlflow_store)
    copy = tmp_path / "elsewhere" / "store"
    shutil.copytree(original, copy)
    original.rename(tmp_path / "moved-away")
    _report_and_status_work_inside(copy, copy / "quickstart.yaml", tmp_path, capsys)
    _dashboard_reads_inside(copy, copy / "quickstart.yaml", tmp_path, cli_process)
    assert not original.exists()


def test_a_copy_without_its_artifacts_is_said_to_point_outside_itself_in_one_line(tmp_path, new_mlflow_store, capsys):
    from studies.cli import main

    original = tmp_path / "original"
    _original_store(original, new_mlflow_store)
    copy = tmp_path / "store"
    copy.mkdir()
    shutil.copyfile(original / "mlflow.db", copy / "mlflow.db")
    original.rename(tmp_path / "moved-away")
    uri = f"sqlite:///{copy / 'mlflow.db'}"
    capsys.readouterr()
    study_file = copy.parent / "moved-away" / "quickstart.yaml"
    assert main(["report", str(study_file), "--tracking-uri", uri, "--out", str(copy / "reports")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "points outside itself" in err and "Fix:" in err, err
    assert not original.exists()


def _dashboard_reads_inside(store: Path, study_file: Path, tmp_path: Path, cli_process) -> None:
    """optuna-dashboard over the store's own Optuna database, read-only: no file appears anywhere."""
    uri = f"sqlite:///{store / 'mlflow.db'}"
    before, inside = _files(tmp_path, outside=store), set(store.rglob("*"))
    port = free_port()
    dash = cli_process.start("dashboard", study_file, "--tracking-uri", uri, "--port", port)
    lines = [dash.stdout.readline(), dash.stdout.readline()]
    assert "read-only" in lines[0] and f"127.0.0.1:{port}" in lines[1], lines
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=60) as resp:
        assert "a cell" in resp.read().decode()
    dash.kill()
    dash.wait()
    assert _files(tmp_path, outside=store) == before
    assert set(store.rglob("*")) == inside  # read-only: not even a journal beside the Optuna database


@pytest.mark.timeout(300)
def test_a_moved_export_carries_its_optuna_database_and_study_file(tmp_path, new_mlflow_store, cli_process, capsys):
    from studies.cli import main

    original = tmp_path / "original"
    exp, _, first = _original_store(original, new_mlflow_store)
    first_place = tmp_path / "exported"
    assert main(["export", str(first_place), "--tracking-uri", f"sqlite:///{original / 'mlflow.db'}"]) == 0
    original.rename(tmp_path / "moved-away")
    store = tmp_path / "elsewhere" / "store"
    store.parent.mkdir()
    first_place.rename(store)
    assert (store / "studies" / "quickstart.yaml").is_file() and (store / "optuna" / "optuna.db").is_file()
    uri = _report_and_status_work_inside(store, store / "studies" / "quickstart.yaml", tmp_path, capsys)

    _dashboard_reads_inside(store, store / "studies" / "quickstart.yaml", tmp_path, cli_process)
    before = _files(tmp_path, outside=store)
    port = free_port()
    ui = cli_process.start("ui", "--tracking-uri", uri, "--port", port, stderr=subprocess.PIPE)
    assert f"/#/experiments/{exp}/runs?" in ui.stdout.readline()
    with urllib.request.urlopen(
        f"http://127.0.0.1:{port}/get-artifact?path=note.txt&run_uuid={first}", timeout=60
    ) as r:
        assert r.read().decode() == "kept with the trial"
    assert _files(tmp_path, outside=store) == before


def test_every_trial_link_in_the_study_description_lands_on_the_model_training_side(tracking_uri):
    import re

    from mlflow.tracking import MlflowClient

    from analysis.runs import UI_WORKFLOW
    from tests.studies.test_study_page import _recorded_study

    _, exp, _, _ = _recorded_study(tracking_uri)
    description = MlflowClient(tracking_uri).get_experiment(exp).tags["mlflow.note.content"]
    links = re.findall(r"\]\((#/experiments/[^)]*)\)", description)
    assert links and all(link.endswith(f"?{UI_WORKFLOW}") for link in links), links


@pytest.mark.timeout(300)
def test_ui_by_study_name_on_a_moved_plain_copy_serves_it_and_writes_only_inside(
    tmp_path, new_mlflow_store, cli_process
):
    original = tmp_path / "original"
    exp, _, first = _original_store(original, new_mlflow_store)
    copy = tmp_path / "elsewhere" / "store"
    shutil.copytree(original, copy)
    original.rename(tmp_path / "moved-away")
    elsewhere = tmp_path / "somewhere-else"  # run from a folder that is neither the store nor the original's
    elsewhere.mkdir()
    before = _files(tmp_path, outside=copy)
    port = free_port()
    uri = f"sqlite:///{copy / 'mlflow.db'}"
    ui = cli_process.start(
        "ui", "quickstart", "--tracking-uri", uri, "--port", port, cwd=elsewhere, stderr=subprocess.PIPE
    )
    lines = [ui.stdout.readline(), ui.stdout.readline()]
    assert "the store was moved" in lines[0] and "artifact location(s) now point into its" in lines[0], lines
    assert f"127.0.0.1:{port}/#/experiments/{exp}/runs?" in lines[1], lines
    with urllib.request.urlopen(
        f"http://127.0.0.1:{port}/get-artifact?path=note.txt&run_uuid={first}", timeout=60
    ) as r:
        assert r.read().decode() == "kept with the trial"  # served from the copy: the original is gone
    assert _files(tmp_path, outside=copy) == before  # nothing at the original's place, nothing where it ran
    assert (copy / "sharpscale.log").stat().st_size > 0  # the server's output, inside the store
