"""MLflow records to pandas, on a real SQLite store written by the same recorder the trials use."""

import math

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from analysis import load_runs, summarize
from trainables.naming import TRIAL_ID_TAG
from trainables.tracking import TrackingTarget, TrialRecorder


def _record(target, key, arch, method, rho, accs, status="finished"):
    params = {"optimizer.method": method, "model.name": arch}
    if rho is not None:
        params["optimizer.hparams.rho"] = rho
    rec = TrialRecorder(target, trial_key=key, run_name=key, params=params)
    rec.set_tags(
        {
            "factor.arch": arch,
            "factor.method": method,
            "sharpscale.cell": f"arch={arch},method={method}",
            "sharpscale.trial_id": key,
        }
    )
    for epoch, acc in enumerate(accs):
        rec.log_epoch({"epoch": epoch, "val_acc": acc, "train_loss": 1.0 / (epoch + 1), "bad": math.nan}, epoch)
    rec.finish(status, None if status == "finished" else "loss became nan")
    return rec.run_id


@pytest.fixture
def store(tracking_uri, tmp_path):
    client = MlflowClient(tracking_uri)
    exp = client.create_experiment("toy", artifact_location=(tmp_path / "art").as_uri())
    target = TrackingTarget(tracking_uri, exp)
    ids = {
        "a": _record(target, "a", "vit", "none", None, [0.5, 0.7]),
        "b": _record(target, "b", "vit", "sam", 0.05, [0.6, 0.8]),
        "c": _record(target, "c", "vit", "sam", 0.5, [0.6, 0.9]),
        "d": _record(target, "d", "vit", "sam", 2.0, [0.1], status="diverged"),
    }
    return tracking_uri, target, ids


def test_one_row_per_trial_with_params_metrics_status(store):
    uri, _, ids = store
    runs = load_runs("toy", tracking_uri=uri)
    assert len(runs) == 4
    assert set(runs["run_id"]) == set(ids.values())
    row = runs.set_index("trial_id").loc["c"]
    assert row["val_acc"] == 0.9 and row["optimizer.hparams.rho"] == 0.5
    assert row["status"] == "finished" and row["mlflow_status"] == "FINISHED"
    assert row["factor.arch"] == "vit"
    diverged = runs.set_index("trial_id").loc["d"]
    assert diverged["status"] == "diverged" and diverged["mlflow_status"] == "FAILED"
    assert "bad" not in runs.columns  # non-finite values are not logged as numbers


def test_a_study_file_names_its_experiment_and_its_smoke_experiment(store, tmp_path):
    uri, target, _ = store
    study = tmp_path / "toy.yaml"
    study.write_text("name: other\ntracking: {experiment: toy}\n")  # tracking.experiment wins over the name
    assert len(load_runs(study, tracking_uri=uri)) == 4
    smoke = MlflowClient(uri).create_experiment("toy-smoke", artifact_location=(tmp_path / "art").as_uri())
    rec = TrialRecorder(TrackingTarget(uri, smoke), trial_key="s", run_name="s", params={})
    rec.set_tags({TRIAL_ID_TAG: "s"})
    rec.finish("finished")
    assert list(load_runs(study, tracking_uri=uri, smoke=True)["trial_id"]) == ["s"]
    assert list(load_runs("toy", tracking_uri=uri, smoke=True)["trial_id"]) == ["s"]


def test_reopening_a_trial_key_reuses_its_run(store):
    uri, target, ids = store
    again = TrialRecorder(target, trial_key="b", run_name="b", params={})
    assert again.run_id == ids["b"]
    assert MlflowClient(uri).get_run(ids["b"]).info.status == "RUNNING"
    again.finish("finished")
    assert len(load_runs("toy", tracking_uri=uri)) == 4


def test_summary_takes_best_finished_trial_per_cell(store):
    uri, _, _ = store
    table = summarize(load_runs("toy", tracking_uri=uri), metric="val_acc", show=("optimizer.hparams.rho",))
    assert table.loc[("vit", "sam"), "best val_acc"] == 0.9
    assert table.loc[("vit", "sam"), "optimizer.hparams.rho"] == 0.5
    assert table.loc[("vit", "sam"), "trials"] == 3
    assert table.loc[("vit", "none"), "best val_acc"] == 0.7


def test_unknown_study_names_the_known_ones(store):
    uri, _, _ = store
    with pytest.raises(LookupError, match="no MLflow experiment .*Known: .*toy"):
        load_runs("nope", tracking_uri=uri)


def test_a_re_run_epoch_keeps_its_first_record(store):
    uri, target, ids = store
    again = TrialRecorder(target, trial_key="c", run_name="c", params={})
    again.log_epoch({"val_acc": 0.1, "train_loss": 9.0}, 1)  # epoch 1 of trial c was recorded as 0.9 before
    again.log_epoch({"val_acc": 0.95, "train_loss": 0.3}, 2)  # a new epoch is recorded
    again.finish("finished")
    history = MlflowClient(uri).get_metric_history(ids["c"], "val_acc")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.6), (1, 0.9), (2, 0.95)]


def test_params_come_back_with_the_config_s_dtypes(tracking_uri, tmp_path):
    # What TrialConfig.flat() logs: None, booleans, ints, floats, text, a tuple, an empty section.
    client = MlflowClient(tracking_uri)
    exp = client.create_experiment("typed", artifact_location=(tmp_path / "art").as_uri())
    target = TrackingTarget(tracking_uri, exp)
    for key, grad_clip, resident, hparams in (("a", None, None, {}), ("b", 1.0, True, {"optimizer.hparams.rho": 0.05})):
        params = {
            "optimizer.grad_clip": grad_clip,
            "data.device_resident": resident,
            "model.fused_attn": True,
            "schedule.epochs": 10,
            "optimizer.lr": 0.001,
            "model.name": "resnet18",
            "optimizer.betas": [0.9, 0.999],
            "train.channels_last": None,
            **({"optimizer.hparams": {}} if not hparams else hparams),
        }
        rec = TrialRecorder(target, trial_key=key, run_name=key, params=params)
        rec.set_tags({"sharpscale.trial_id": key})
        rec.log_epoch({"val_acc": 0.5}, 0)
        rec.finish("finished")
    runs = load_runs("typed", tracking_uri=tracking_uri).set_index("trial_id")
    assert runs["optimizer.grad_clip"].dtype == "float64" and math.isnan(runs.loc["a", "optimizer.grad_clip"])
    assert runs.loc["b", "optimizer.grad_clip"] == 1.0
    assert runs["model.fused_attn"].dtype == bool and runs["model.fused_attn"].tolist() == [True, True]
    assert runs["data.device_resident"].dtype == "boolean" and runs["data.device_resident"].isna().loc["a"]
    assert runs["schedule.epochs"].dtype == "int64" and runs["optimizer.lr"].dtype == "float64"
    assert runs["model.name"].tolist() == ["resnet18", "resnet18"]
    assert runs["train.channels_last"].isna().all()
    assert "optimizer.hparams" not in runs.columns  # the empty section is no column
    assert "None" not in runs.astype(str).to_numpy().ravel().tolist()


def test_summary_of_a_study_without_factors_or_finished_trials(tracking_uri, tmp_path):
    client = MlflowClient(tracking_uri)
    target = TrackingTarget(
        tracking_uri, client.create_experiment("plain", artifact_location=(tmp_path / "a").as_uri())
    )
    for key, status, accs in (("x", "finished", [0.4, 0.6]), ("y", "diverged", [0.2])):
        rec = TrialRecorder(target, trial_key=key, run_name=key, params={"optimizer.hparams.rho": 0.1})
        rec.set_tags({"sharpscale.trial_id": key})
        for epoch, acc in enumerate(accs):
            rec.log_epoch({"val_acc": acc}, epoch)
        rec.finish(status)
    runs = load_runs("plain", tracking_uri=tracking_uri)
    table = summarize(runs, metric="val_acc")
    assert table.index.names == ["cell"] and table["best val_acc"].tolist() == [0.6] and table["trials"].tolist() == [2]
    failed = runs.assign(status="failed")
    assert summarize(failed, metric="val_acc").empty  # every trial failed: an empty table, no KeyError
    assert summarize(runs.drop(columns=["val_acc"]), metric="val_acc").empty


def test_report_names_the_statistic_and_follows_the_study_files_epoch(tmp_path):
    from analysis.report import _objective, statistic_label

    assert statistic_label("val_acc") == "val_acc (final epoch)"
    assert statistic_label("best_val_acc") == "val_acc (best epoch)"
    study = tmp_path / "s.yaml"
    study.write_text("name: s\nobjective: {metric: val_acc, mode: max, epoch: best}\n")
    assert _objective(study) == ("best_val_acc", "max")
    study.write_text("name: s\nobjective: {metric: val_loss, mode: min}\n")
    assert _objective(study) == ("val_loss", "min")


def test_summary_states_each_accuracy_s_sampling_error_on_its_validation_set():
    import pandas as pd

    from analysis.runs import SE_COLUMN

    runs = pd.DataFrame(
        {
            "factor.method": ["adamw", "sam", "sam"],
            "status": ["finished"] * 3,
            "val_acc": [0.8, 0.5, 0.9],
            "val_samples": [400.0, 100.0, 100.0],
            "val_loss": [0.5, 0.6, 0.4],
        }
    )
    table = summarize(runs, metric="val_acc", show=())
    # sqrt(p (1 - p) / n): 0.8 on 400 samples is +-0.02, 0.9 on 100 is +-0.03.
    assert table.loc["adamw", SE_COLUMN] == pytest.approx(0.02) and table.loc["sam", SE_COLUMN] == pytest.approx(0.03)
    assert table.loc["sam", "val n"] == 100 and table.loc["sam", "trials"] == 2
    # Not an accuracy, or no count logged (older records): no error column is invented.
    assert SE_COLUMN not in summarize(runs, metric="val_loss", mode="min", show=()).columns
    assert SE_COLUMN not in summarize(runs.drop(columns=["val_samples"]), metric="val_acc", show=()).columns


@pytest.mark.parametrize("rows", [[0, 1, 2], [2, 1, 0], [1, 2, 0]])
def test_a_tie_goes_to_the_first_started_whatever_the_row_order_and_a_missing_start_sorts_last(rows):
    from analysis.runs import best_trials

    frame = pd.DataFrame(
        {
            "cell": ["c"] * 3,
            "status": ["finished"] * 3,
            "val_acc": [0.9, 0.9, 0.9],
            "start_time": [pd.NaT, pd.Timestamp("2026-01-02"), pd.Timestamp("2026-01-01")],
            "run_id": ["a", "b", "c"],
        }
    ).iloc[rows]
    assert best_trials(frame, metric="val_acc")["run_id"].tolist() == ["c"]


def test_accuracy_interval_covers_at_the_boundary_where_the_plug_in_se_is_zero():
    """Coverage by simulation: the exact interval holds the true accuracy at least 95% of the time at every p,
    p = 1 and its neighbours included, where the plug-in p +- 1.96 SE collapses to a point."""
    import numpy as np

    from analysis import accuracy_interval
    from analysis.runs import accuracy_se

    rng = np.random.default_rng(0)
    low, high = accuracy_interval(1.0, 359)
    assert low >= 0.989 and high == 1.0 and accuracy_se(1.0, 359) == 0.0
    plug_in_missed = False
    for n in (50, 359, 5000):
        for p in (0.5, 0.9, 0.99, 0.999, 1.0):
            k = rng.binomial(n, p, size=4000)
            lo, hi = accuracy_interval(k / n, n)
            coverage = float(np.mean((lo <= p) & (p <= hi)))
            assert coverage >= 0.95 - 3 * (0.95 * 0.05 / 4000) ** 0.5, (n, p, coverage)
            se = accuracy_se(k / n, n)
            plug_in = float(np.mean(np.abs(k / n - p) <= 1.96 * se))
            plug_in_missed |= plug_in < 0.9
    assert plug_in_missed  # the boundary the exact interval is for: the plug-in SE misses it
