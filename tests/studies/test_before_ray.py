"""What a study's file, its machine and its state locations already say is refused before Ray starts, in one line
with the fix, leaving the store as it was: no new record, an interrupted launch still interrupted and resumable."""

import os
import sqlite3
import threading

import pytest

from studies import identity
from studies.launch import Launch, choose_launch, experiment, parent_runs
from studies.runner import run_study, state_locations
from studies.spec import StudyError, load_study
from trainables.naming import GIT_COMMIT_TAG, RESUMED_COMMIT_TAG, launch_name
from trainables.tracking import tracking_client


def _interrupted_launch(path, uri, commit: str = "abc") -> None:
    """What an interrupted `run` leaves in the store: launch 1 claimed, its study and cell runs KILLED, no driver."""
    study = load_study(path, require_data=False)
    client = tracking_client(uri)
    exp_id = experiment(client, study.experiment_name, path.parent / "mlartifacts", uri)
    launch = choose_launch(client, exp_id, study, study.experiment_name, uri, new_launch=False)
    locations = state_locations(study, launch_name(study.experiment_name, launch))
    opened: list[str] = []
    parent_runs(client, study, exp_id, commit, None, locations.tags(), launch, opened, {})
    for rid in opened:
        client.set_terminated(rid, status="KILLED")


def _statuses(uri: str, name: str) -> list[tuple[str, str]]:
    client = tracking_client(uri)
    exp = client.get_experiment_by_name(name)
    if exp is None or exp.lifecycle_stage != "active":
        return []
    return sorted((r.data.tags["sharpscale.kind"], r.info.status) for r in client.search_runs([exp.experiment_id]))


@pytest.mark.parametrize(
    "base, expected",
    [
        (
            {"model": "NUM_CLASSES_3"},
            "model.kwargs.num_classes: 3, and digits has 10 classes (cell all). Fix: drop model.kwargs.num_classes",
        ),
        ({"train": {"device": "cuda", "threads": 1}}, "train.device: cuda, and this machine has no CUDA device"),
    ],
    ids=["num-classes", "cuda-without-gpu"],
)
def test_a_trial_that_cannot_run_here_is_refused_before_any_record(
    base, expected, tmp_path, tracking_uri, tiny_study, tiny_model, no_ray
):
    import torch

    if "train" in base and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    if base.get("model") == "NUM_CLASSES_3":
        base = {"model": tiny_model("mixer", num_classes=3)}
    path = tiny_study(tmp_path, "early", base=base)
    with pytest.raises(StudyError) as err:
        run_study(path, tracking_uri=tracking_uri)
    assert expected in str(err.value), str(err.value)
    assert tracking_client(tracking_uri).get_experiment_by_name("early") is None  # nothing recorded


def test_a_storage_path_with_braces_is_refused_and_its_claims_given_back(tmp_path, tracking_uri, tiny_study, no_ray):
    path = tiny_study(tmp_path, "braces", storage=str(tmp_path / "runs{x}"))
    with pytest.raises(StudyError) as err:
        run_study(path, tracking_uri=tracking_uri)
    assert "storage: " in str(err.value) and "holds '{' or '}'" in str(err.value), str(err.value)
    client = tracking_client(tracking_uri)
    made = client.get_experiment_by_name("braces")
    assert made is None or made.lifecycle_stage == "deleted"  # the experiment it made, and launch 1, given back
    assert identity.claim_name("braces", 1) not in {e.name for e in client.search_experiments(view_type=3)}
    assert identity.driver_holder(client, "braces", 1) is None
    assert not (tmp_path / "runs{x}").exists()


def test_a_damaged_optuna_database_at_resume_leaves_the_launch_interrupted(tmp_path, tracking_uri, tiny_study, no_ray):
    path = tiny_study(tmp_path, "damaged")
    _interrupted_launch(path, tracking_uri)
    db = tmp_path / "runs" / "damaged.optuna.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    db.write_bytes(b"not a database, " * 512)
    with pytest.raises(StudyError) as err:
        run_study(path, tracking_uri=tracking_uri, resume=True)
    text = str(err.value)
    assert f"optuna_storage: {db} is damaged" in text and "Fix: restore it from a backup" in text, text
    assert _statuses(tracking_uri, "damaged") == [("cell", "KILLED"), ("study", "KILLED")]
    assert identity.driver_holder(tracking_client(tracking_uri), "damaged", 1) is None  # resumable again


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a file whatever its mode")
def test_a_read_only_optuna_database_at_resume_is_refused(tmp_path, tracking_uri, tiny_study, no_ray):
    import optuna

    path = tiny_study(tmp_path, "frozen")
    _interrupted_launch(path, tracking_uri)
    db = tmp_path / "runs" / "frozen.optuna.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    optuna.create_study(storage=f"sqlite:///{db}", study_name="x")
    db.chmod(0o444)
    with pytest.raises(StudyError, match="is read-only"):
        run_study(path, tracking_uri=tracking_uri, resume=True)
    assert _statuses(tracking_uri, "frozen") == [("cell", "KILLED"), ("study", "KILLED")]


def test_an_mlflow_store_locked_by_another_writer_is_one_line(tmp_path, tracking_uri, tiny_study, no_ray):
    path = tiny_study(tmp_path, "locked")
    db = tracking_uri.removeprefix("sqlite:///")
    held, release = threading.Event(), threading.Event()

    def writer() -> None:
        con = sqlite3.connect(db, timeout=1, isolation_level=None)
        con.execute("begin exclusive")
        held.set()
        release.wait(timeout=600)
        con.execute("rollback")
        con.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert held.wait(timeout=60)
        with pytest.raises(StudyError) as err:
            run_study(path, tracking_uri=tracking_uri)
    finally:
        release.set()
        thread.join(timeout=60)
    text = str(err.value)
    assert "is locked by another writer" in text and "nothing was recorded" in text and "Fix: " in text, text
    assert "Traceback" not in text and len(text.splitlines()) <= 2
    assert tracking_client(tracking_uri).get_experiment_by_name("locked") is None


def test_a_resume_at_another_commit_says_so_and_records_it(tmp_path, tracking_uri, tiny_study, capsys):
    path = tiny_study(tmp_path, "moved")
    _interrupted_launch(path, tracking_uri, commit="1111111")
    study = load_study(path, require_data=False)
    launch = Launch.open(study, tracking_uri, resume=True, new_launch=False, explicit=True)
    try:
        launch.note_commit("2222222")
        said = capsys.readouterr().out
        assert "the code changed since launch 1 began: it ran at commit 1111111, this resume runs 2222222" in said
        run = launch.client.get_run(launch.previous.info.run_id)
        assert run.data.tags[GIT_COMMIT_TAG] == "1111111" and run.data.tags[RESUMED_COMMIT_TAG] == "2222222"
        launch.note_commit("1111111")  # the same code: nothing said
        assert "code changed" not in capsys.readouterr().out
    finally:
        launch.release_driver()


def test_a_planted_searcher_state_is_refused_before_ray_not_inside_tunes_restore(
    tmp_path, tracking_uri, tiny_study, no_ray
):
    from trainables.errors import UserError

    path = tiny_study(tmp_path, "planted")
    _interrupted_launch(path, tracking_uri)
    study = load_study(path, require_data=False)
    client = tracking_client(tracking_uri)
    exp_id = client.get_experiment_by_name("planted").experiment_id
    (study_run,) = client.search_runs([exp_id], filter_string="tags.`sharpscale.kind` = 'study'")
    folder = tmp_path / "runs" / "planted"
    identity.write_launch_record(
        str(folder), identity.launch_record(study, tracking_uri, exp_id, study_run.info.run_id, 1)
    )
    (folder / "tuner.pkl").write_bytes(b"settings")  # what Tuner.can_restore looks for; never read: refused first
    (folder / "experiment_state-2026-01-01_00-00-00.json").write_text('{"trials": []}')
    identity.record_tune_state(client, study_run.info.run_id, str(folder))
    (folder / "searcher-state-2026-01-01_00-00-00.pkl").write_text('{"format": "sharpscale.searcher/1"}')
    with pytest.raises(UserError) as err:
        run_study(path, tracking_uri=tracking_uri, resume=True)
    text = str(err.value)
    assert "searcher-state-2026-01-01_00-00-00.pkl is not the state of this study's searcher" in text, text
    assert "Fix: restore the file" in text
    assert _statuses(tracking_uri, "planted") == [("cell", "KILLED"), ("study", "KILLED")]
    assert identity.driver_holder(client, "planted", 1) is None
