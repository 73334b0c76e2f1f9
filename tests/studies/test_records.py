"""How a study reads in the MLflow UI: experiment kind, trial names, datasets, and the roll-up onto cell and study runs."""

import dataclasses
import math
from pathlib import Path

import pytest

from studies.records import (
    BEST_CELL_TAG,
    BEST_RUN_TAG,
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    cell_label,
    cell_params,
    describe_experiment,
    roll_up,
    source_tags,
    trial_run_name,
)
from studies.spec import load_study
from trainables.naming import KIND_TAG, PARENT_RUN_TAG, STATUS_TAG
from trainables.tracking import TrackingTarget, TrialRecorder, dataset_input

REPO = Path(__file__).resolve().parents[2]


def test_experiment_kind_is_the_value_the_installed_ui_knows():
    # The kind is a UI value with no constant in MLflow's Python API: pin it against the installed UI bundle, so an
    # MLflow upgrade that renames it fails here instead of the UI silently opening on its GenAI page again.
    import mlflow

    bundle = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    texts = (p.read_text(errors="ignore") for p in bundle.glob("main.*.js"))
    assert any(f'CUSTOM_MODEL_DEVELOPMENT="{EXPERIMENT_KIND}"' in t for t in texts)


def test_trial_names_say_what_the_trial_is():
    study = load_study(REPO / "studies" / "data_scaling.yaml", require_data=False)
    cell = next(c for c in study.cells if c.levels["method"] == "sam" and c.levels["arch"] == "vit")
    assert cell_label(cell) == f"fraction={cell.levels['data.fraction']}/vit/sam"
    # A seed factor (a study without a confirm stage) reads as seed=N.
    cell = dataclasses.replace(cell, levels={**cell.levels, "train.seed": "3"})
    assert cell_label(cell) == f"fraction={cell.levels['data.fraction']}/vit/sam/seed=3"
    name = trial_run_name(cell, {"optimizer.hparams.rho": 0.03412}, 2)
    assert name == f"{cell_label(cell)} rho=0.0341 #2"
    quick = load_study(REPO / "studies" / "quickstart.yaml")
    plain = next(c for c in quick.cells if not c.space)
    assert trial_run_name(plain, {}, 1) == f"{cell_label(plain)} #1" and "/" in cell_label(plain)


def test_dataset_digest_names_the_training_examples():
    base = {"name": "cifar10", "root": "/data/c", "fraction": 0.25, "fraction_seed": 0, "augment": "basic"}
    name, digest, source_type, _, _ = dataset_input(base)
    assert name == "cifar10 x0.25 seed=0" and source_type == "local"
    assert dataset_input({**base, "augment": "strong", "root": "/elsewhere"})[1] == digest  # same examples
    assert dataset_input({**base, "fraction_seed": 1})[1] != digest
    assert dataset_input({**base, "fraction": 0.5})[1] != digest
    assert dataset_input({"name": "digits", "root": None, "fraction": 1.0})[:1] == ("digits",)


def _trial(client, exp, parent, key, status, value, rho, *, uri):
    recorder = TrialRecorder(
        TrackingTarget(uri, exp, parent), trial_key=key, run_name=key, params={"optimizer.hparams.rho": rho}
    )
    recorder.log_dataset({"name": "digits", "root": None, "fraction": 1.0, "fraction_seed": 0})
    if value is not None:
        recorder.log_epoch({"train_loss": 1.0, "val_acc": value}, 0)
    recorder.finish(status)
    return recorder.run_id


def test_roll_up_puts_each_cells_best_on_its_run_and_the_best_cell_on_the_study_run(tracking_uri):
    from mlflow.tracking import MlflowClient

    study = load_study(REPO / "studies" / "quickstart.yaml")
    client = MlflowClient(tracking_uri)
    exp = client.create_experiment("roll")
    describe_experiment(client, exp, study)
    tags = client.get_experiment(exp).tags
    assert tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND and "Question:" in tags["mlflow.note.content"]

    study_run = client.create_run(exp, tags={KIND_TAG: "study", **source_tags(study, "abc123-dirty")}).info.run_id
    assert client.get_run(study_run).data.tags["mlflow.source.git.commit"] == "abc123"
    cells = {c.key: c for c in study.cells if c.levels["arch"] == "vit"}
    cell_runs = {
        k: client.create_run(exp, tags={KIND_TAG: "cell", "mlflow.parentRunId": study_run}).info.run_id for k in cells
    }
    sam, adamw = (k for k in cells if "sam" in k), (k for k in cells if "adamw" in k)
    sam, adamw = next(sam), next(adamw)
    assert cell_params(cells[sam])["trials.planned"] == "4" and "search.rho" in cell_params(cells[sam])
    _trial(client, exp, cell_runs[sam], "a", "finished", 0.80, 0.01, uri=tracking_uri)
    best = _trial(client, exp, cell_runs[sam], "b", "finished", 0.90, 0.05, uri=tracking_uri)
    _trial(client, exp, cell_runs[sam], "c", "diverged", None, 2.0, uri=tracking_uri)
    _trial(client, exp, cell_runs[adamw], "d", "finished", 0.85, None, uri=tracking_uri)

    bests = roll_up(client, exp, study_run, cell_runs, cells, column="val_acc", mode="max", bests={})
    assert bests[sam].run_id == best
    cell = client.get_run(cell_runs[sam]).data
    assert cell.metrics["best.val_acc"] == 0.90 and cell.metrics["best.rho"] == 0.05
    assert cell.metrics["trials.finished"] == 2 and cell.metrics["trials.failed"] == 1
    assert cell.metrics["trials.running"] == 0  # zeros too: a count back to zero must not keep its old value
    assert cell.tags[BEST_RUN_TAG] == "b"
    top = client.get_run(study_run).data
    assert top.metrics["best.val_acc"] == 0.90 and top.tags[BEST_CELL_TAG] == "vit/sam"
    assert top.metrics["trials.finished"] == 3
    # Updated as trials end: a better trial in the other cell moves the study's best there.
    _trial(client, exp, cell_runs[adamw], "e", "finished", 0.95, None, uri=tracking_uri)
    # A report written in between (analysis.report links its HTML page below REPORT_MARKER): the roll-up rewrites
    # the table and keeps the link.
    from analysis.runs import REPORT_MARKER

    note = client.get_run(study_run).data.tags["mlflow.note.content"]
    client.set_tag(study_run, "mlflow.note.content", f"{note}\n\n{REPORT_MARKER}\n\n**Full report**: [report.html](x)")
    roll_up(client, exp, study_run, cell_runs, cells, column="val_acc", mode="max", bests=bests, only=[adamw])
    note = client.get_run(study_run).data.tags["mlflow.note.content"]
    assert "- vit/adamw (the study's best): val_acc 0.9500;" in note and note.endswith(
        f"{REPORT_MARKER}\n\n**Full report**: [report.html](x)"
    )
    assert note.count(REPORT_MARKER) == 1
    top = client.get_run(study_run).data
    assert top.metrics["best.val_acc"] == 0.95 and top.tags[BEST_CELL_TAG] == "vit/adamw"
    # AdamW searches no rho: the study run's best.rho no longer shows the SAM cell's 0.05 (NaN: not applicable).
    assert math.isnan(top.metrics["best.rho"])
    history = client.get_metric_history(study_run, "best.val_acc")
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == [0.90, 0.95]
    inputs = client.get_run(best).inputs.dataset_inputs
    assert [d.dataset.name for d in inputs] == ["digits"]


@pytest.mark.parametrize("status", ["failed", "killed"])
def test_roll_up_of_a_cell_without_a_finished_trial_only_counts(tracking_uri, status):
    from mlflow.tracking import MlflowClient

    study = load_study(REPO / "studies" / "quickstart.yaml")
    client = MlflowClient(tracking_uri)
    exp = client.create_experiment("none")
    study_run = client.create_run(exp).info.run_id
    cell = study.cells[0]
    cell_run = client.create_run(exp, tags={"mlflow.parentRunId": study_run}).info.run_id
    _trial(client, exp, cell_run, "x", status, None, 0.1, uri=tracking_uri)
    roll_up(client, exp, study_run, {cell.key: cell_run}, {cell.key: cell}, column="val_acc", mode="max", bests={})
    data = client.get_run(cell_run).data
    assert "best.val_acc" not in data.metrics and data.metrics[f"trials.{status}"] == 1
    assert STATUS_TAG not in data.tags


def test_trial_params_are_what_the_study_varies_and_load_runs_still_has_the_whole_config(tracking_uri):
    from mlflow.tracking import MlflowClient

    from analysis import load_runs
    from studies.records import IDENTIFYING_PARAMS, trial_params
    from trainables.config import TrialConfig
    from trainables.naming import CELL_TAG, CONFIG_TAG
    from trainables.tracking import config_from_tags, config_tags

    study = load_study(REPO / "studies" / "quickstart.yaml")
    wanted = trial_params(study)
    assert "optimizer.hparams.rho" in wanted and set(IDENTIFYING_PARAMS) <= set(wanted)
    assert "model.kwargs.depth" in wanted  # differs between the ViT, Mixer and ResNet cells
    assert "geometry.tol" not in wanted and "data.num_workers" not in wanted  # constant over the study
    cell = next(c for c in study.cells if c.space)
    flat = TrialConfig.load(cell.config).flat()
    assert len(wanted) < len(flat) / 2

    # A config longer than one tag goes over several and comes back whole.
    long = {**flat, "model.kwargs.note": "x" * 9000}
    tags = config_tags(long)
    assert len(tags) == 2 and all(len(v) <= 8000 for v in tags.values())
    assert config_from_tags(tags) == {k: str(v) for k, v in long.items()}

    client = MlflowClient(tracking_uri)
    client.create_experiment("quickstart")
    exp = client.get_experiment_by_name("quickstart").experiment_id
    recorder = TrialRecorder(
        TrackingTarget(tracking_uri, exp, None, tags={CELL_TAG: cell.key}),
        trial_key="t",
        run_name="t",
        params={k: v for k, v in flat.items() if k in wanted},
    )
    recorder.set_tags(config_tags(flat))
    recorder.log_epoch({"val_acc": 0.5, "val_samples": 360, "best_epoch": 0}, 0)
    recorder.finish("finished")
    run = client.get_run(recorder.run_id)
    assert set(run.data.params) <= set(wanted) and CONFIG_TAG in run.data.tags
    row = load_runs("quickstart", tracking_uri=tracking_uri).iloc[0]
    assert row["geometry.tol"] == flat["geometry.tol"] and row["model.name"] == flat["model.name"]
    assert (
        row["run_name"] == "t"
        and str(load_runs("quickstart", tracking_uri=tracking_uri)["val_samples"].dtype) == "int64"
    )
    assert row["data.batch_size"] == flat["data.batch_size"] and str(row["data.batch_size"].dtype) == "int64"


def test_a_cell_run_ends_when_its_last_trial_ended_not_when_the_study_did(tracking_uri):
    from mlflow.tracking import MlflowClient

    from studies.records import cell_end_time

    client = MlflowClient(tracking_uri)
    exp = client.create_experiment("ends")
    study_run = client.create_run(exp).info.run_id
    cell_run = client.create_run(exp, tags={PARENT_RUN_TAG: study_run}).info.run_id
    empty = client.create_run(exp, tags={PARENT_RUN_TAG: study_run}).info.run_id
    ends = []
    for key in ("a", "b"):
        trial = _trial(client, exp, cell_run, key, "finished", 0.5, 0.1, uri=tracking_uri)
        ends.append(client.get_run(trial).info.end_time)
    assert cell_end_time(client, exp, cell_run) == max(ends)
    assert cell_end_time(client, exp, empty) is None  # no trial: it ends when it is closed
    open_trial = client.create_run(exp, tags={PARENT_RUN_TAG: cell_run}).info.run_id
    assert cell_end_time(client, exp, cell_run) is None  # a trial still open: not before it
    client.set_terminated(open_trial)
    assert cell_end_time(client, exp, cell_run) == client.get_run(open_trial).info.end_time


def test_a_cell_has_one_name_from_its_levels_or_from_the_key_its_trials_record():
    # Trial runs, the live view (cell_label), `status` and the answer's best cell (from the recorded key) name a cell
    # alike: checked on every cell of every shipped study.
    from analysis.runs import cell_key_name

    files = sorted((REPO / "studies").glob("*.yaml"))
    checked = 0
    for path in files:
        for cell in load_study(path, require_data=False).cells:
            assert cell_key_name(cell.key) == cell_label(cell), (path.name, cell.key)
            assert cell_key_name(f"{cell.key} seed=3") == f"{cell_label(cell)} seed=3"
            checked += 1
    assert len(files) >= 9 and checked > len(files)
    assert cell_key_name("") == "all" and cell_key_name("not a key") == "not a key"
