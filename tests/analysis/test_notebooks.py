"""The shipped notebooks run top to bottom (nbclient, a real kernel) against a quickstart-like MLflow store made here."""

import math
import re
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

from analysis import load_runs, measure_study
from trainables import TrialConfig
from trainables.naming import CHECKPOINT_ARTIFACT
from trainables.tracking import TrialRecorder

NOTEBOOKS = Path(__file__).resolve().parents[2] / "analysis" / "notebooks"
NAMES = ("data_scaling", "rho_sensitivity", "geometry")
# The quickstart's tiny ViT, for a checkpoint the geometry notebook loads as it would load a trial's.


@pytest.fixture(scope="module")
def store(tmp_path_factory, study_store):
    """A quickstart-shaped study (arch x method, rho searched for SAM) over three training-set fractions, 3 epochs each."""
    root = tmp_path_factory.mktemp("nbstore")
    uri, target, _ = study_store(root, "nbstudy")
    for arch, skill in (("vit", 0.80), ("mixer", 0.85)):
        for method, rhos in (("adamw", (None,)), ("sam", (0.02, 0.2))):
            for fraction in (0.25, 0.5, 1.0):
                factors = {"arch": arch, "method": method, "data.fraction": str(fraction)}
                cell = ",".join(f"{k}={v}" for k, v in factors.items())
                for i, rho in enumerate(rhos):
                    params = {
                        "model.name": arch,
                        "optimizer.method": "none" if rho is None else "sam",
                        "data.fraction": fraction,
                        "train.seed": 0,
                    }
                    if rho is not None:
                        params["optimizer.hparams.rho"] = rho
                    key = f"{cell}-{i}"
                    final = skill - 0.1 * (1 - fraction) + (0.03 if method == "sam" else 0.0) - 0.01 * i
                    rec = TrialRecorder(target, trial_key=key, run_name=key, params=params)
                    rec.set_tags(
                        {
                            **{f"factor.{k}": v for k, v in factors.items()},
                            "sharpscale.cell": cell,
                            "sharpscale.trial_id": key,
                        }
                    )
                    for epoch in range(3):
                        progress = (epoch + 1) / 3
                        rec.log_epoch(
                            {
                                "val_acc": final * progress,
                                "train_loss": 2.0 / (epoch + 1),
                                "val_loss": 2.2 / (epoch + 1),
                            },
                            epoch,
                        )
                    rec.finish("finished")
    return uri


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_model):
    """A checkpoint in the trials' format (config, model meta, model state) of an untrained tiny ViT."""
    from trainables import create_model

    cfg = TrialConfig.load(
        {
            "data": {"name": "digits", "img_size": 16},
            "model": tiny_model("vit", embed_dim=32, depth=2, mlp_ratio=2, global_pool="avg", class_token=False),
        }
    )
    model = create_model(cfg.model, num_classes=10, in_chans=1, img_size=16)
    path = tmp_path_factory.mktemp("ckpt") / "checkpoint.pt"
    meta = {"num_classes": 10, "in_chans": 1, "img_size": 16}
    torch.save(
        {"format": 1, "config": cfg.model_dump(mode="json"), "model_meta": meta, "model": model.state_dict()}, path
    )
    return path


def _run(name: str, cwd: Path):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    # The kernel inherits this process's environment: the SHARPSCALE_* variables set by the test.
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    return nb


def test_notebooks_are_committed_without_outputs():
    found = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
    assert found == sorted(NAMES)
    for name in NAMES:
        nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code and all(not c.outputs and c.execution_count is None for c in code), name


@pytest.mark.parametrize("name", ["data_scaling", "rho_sensitivity"])
def test_study_notebook_runs_against_a_store(name, store, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARPSCALE_TRACKING_URI", store)
    monkeypatch.setenv("SHARPSCALE_STUDY", "nbstudy")
    monkeypatch.setenv("SHARPSCALE_N_BOOT", "200")
    nb = _run(name, tmp_path)
    # Tables show numbers as the CLI prints them (analysis.runs.TABLE_FLOAT_FORMAT, 4 significant digits), not in
    # pandas' default 6 decimals.
    tables = [
        o["data"]["text/html"]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type in ("execute_result", "display_data") and "text/html" in o.get("data", {})
    ]
    assert tables, "no table shown"
    for html in tables:
        for number in re.findall(r">\s*(-?[0-9]+\.[0-9]+)\s*<", html):
            assert len(number.lstrip("-").replace(".", "").lstrip("0")) <= 4, (number, html[:2000])


def test_geometry_notebook_runs_on_a_trial_checkpoint(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARPSCALE_CHECKPOINT", str(checkpoint))
    monkeypatch.setenv("SHARPSCALE_GEOMETRY_SAMPLES", "64")
    monkeypatch.setenv("SHARPSCALE_THREADS", "1")  # tiny model: spinning threads only slow a shared CI machine
    _run("geometry", tmp_path)


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory, study_store, checkpoint):
    """One store, two identical studies (one per test, so neither sees the other's measures) whose trials kept
    their final checkpoint as the recorder keeps it (wants_checkpoint), all but one.

    Returns (uri, {study: {trial key: run id}}). Cell adamw: a0 (val_acc 0.8), a1 (0.7), both with checkpoints;
    cell sam: s0 (0.9) with one, s1 (0.95) without (log_checkpoint was off for it), f0 failed with one."""
    root = tmp_path_factory.mktemp("geostore")
    trials = (
        ("adamw", "a0", 0.8, True, "finished"),
        ("adamw", "a1", 0.7, True, "finished"),
        ("sam", "s0", 0.9, True, "finished"),
        ("sam", "s1", 0.95, False, "finished"),
        ("sam", "f0", 0.99, True, "failed"),
    )
    ids: dict[str, dict[str, str]] = {}
    for study in ("geo_fn", "geo_nb"):
        uri, target, _ = study_store(root, study)
        ids[study] = {}
        for method, key, val_acc, keep, status in trials:
            rec = TrialRecorder(
                target, trial_key=key, run_name=key, params={"optimizer.method": method}, wants_checkpoint=keep
            )
            rec.set_tags({"factor.method": method, "sharpscale.cell": f"method={method}"})
            rec.log_epoch({"train_loss": 1.0, "train_acc": 1.0, "val_acc": val_acc}, 0)
            if rec.wants_checkpoint:  # as trainables.loop's keep_final does at a trial's end
                rec.log_artifact(checkpoint, CHECKPOINT_ARTIFACT)
            rec.finish(status)
            ids[study][key] = rec.run_id
    return uri, ids


def _geometry(uri: str, study: str) -> dict[str, dict[str, float]]:
    runs = load_runs(study, tracking_uri=uri).set_index("run_id")
    cols = [c for c in runs.columns if c.startswith("geometry/")]
    return {rid: {c: runs.loc[rid, c] for c in cols if not math.isnan(runs.loc[rid, c])} for rid in runs.index}


def test_measure_study_logs_geometry_onto_the_best_checkpointed_trial_of_each_cell(checkpointed):
    uri, ids = checkpointed[0], checkpointed[1]["geo_fn"]
    table = measure_study("geo_fn", tracking_uri=uri, best_per_cell=1, samples=32, max_iter=8, trace_samples=4)
    # Best per cell among finished trials that kept a checkpoint: not s1 (none kept), not f0 (failed).
    assert sorted(table["run_id"]) == sorted([ids["a0"], ids["s0"]])
    logged = _geometry(uri, "geo_fn")
    for key in ("a0", "s0"):
        metrics = logged[ids[key]]
        # The names analysis.tables.geometry_correlation and the report's geometry table read.
        assert {"geometry/lambda_max", "geometry/hessian_trace"} <= set(metrics), metrics
        assert all(math.isfinite(v) for v in metrics.values())
        assert metrics["geometry/lambda_max"] > 0  # a trained-or-not classifier's cross-entropy has positive curvature
    assert not logged[ids["a1"]] and not logged[ids["s1"]] and not logged[ids["f0"]]


def test_geometry_notebook_measures_a_studys_checkpoints(checkpointed, tmp_path, monkeypatch):
    uri, ids = checkpointed[0], checkpointed[1]["geo_nb"]
    monkeypatch.setenv("SHARPSCALE_TRACKING_URI", uri)
    monkeypatch.setenv("SHARPSCALE_STUDY", "geo_nb")
    monkeypatch.setenv("SHARPSCALE_GEOMETRY_BEST", "0")  # every checkpointed trial (the default: each cell's best)
    monkeypatch.setenv("SHARPSCALE_GEOMETRY_SAMPLES", "32")
    monkeypatch.setenv("SHARPSCALE_THREADS", "1")
    nb = _run("geometry", tmp_path)
    # Before it writes, the notebook says what it will write, where, and about how long it takes.
    streams = [o for c in nb.cells if "measure_study(" in c.source for o in c.outputs if o.get("name") == "stdout"]
    first = "".join(o.text for o in streams).splitlines()[0]
    assert first.startswith(f"Writing to {uri}: 3 checkpointed trial(s) of 'geo_nb'"), first
    assert "geometry/lambda_max" in first and " min on a CPU" in first and "SHARPSCALE_CHECKPOINT" in first
    logged = _geometry(uri, "geo_nb")
    for key in ("a0", "a1", "s0"):  # every finished trial that kept a checkpoint
        assert math.isfinite(logged[ids[key]]["geometry/lambda_max"]), key
        assert math.isfinite(logged[ids[key]]["geometry/hessian_trace"]), key
    assert not logged[ids["s1"]] and not logged[ids["f0"]]


def test_geometry_notebook_opened_as_is_measures_the_quickstarts_own_checkpoints(
    study_store, checkpoint, tmp_path, monkeypatch
):
    # No variable set, opened from a folder below the store (as Jupyter opens analysis/notebooks): the notebook
    # finds the store, takes the quickstart study and measures the final weights its trials kept, not a model of its
    # own (the quickstart keeps them: studies/quickstart.yaml, tracking.log_checkpoint).
    import yaml

    quickstart = yaml.safe_load((NOTEBOOKS.parents[1] / "studies" / "quickstart.yaml").read_text())
    assert quickstart["tracking"]["log_checkpoint"] is True
    uri, target, _ = study_store(tmp_path, "quickstart")
    ids = {}
    for key, val_acc in (("best", 0.9), ("worse", 0.8)):
        rec = TrialRecorder(target, trial_key=key, run_name=key, params={}, wants_checkpoint=True)
        rec.set_tags({"sharpscale.cell": "arch=vit"})
        rec.log_epoch({"train_loss": 1.0, "train_acc": 1.0, "val_acc": val_acc}, 0)
        rec.log_artifact(checkpoint, CHECKPOINT_ARTIFACT)
        rec.finish("finished")
        ids[key] = rec.run_id
    for name in ("SHARPSCALE_TRACKING_URI", "SHARPSCALE_STUDY", "SHARPSCALE_CHECKPOINT", "SHARPSCALE_GEOMETRY_BEST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SHARPSCALE_GEOMETRY_SAMPLES", "32")
    monkeypatch.setenv("SHARPSCALE_THREADS", "1")
    folder = tmp_path / "analysis" / "notebooks"
    folder.mkdir(parents=True)
    nb = nbformat.read(NOTEBOOKS / "geometry.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    # By default the best trial of each cell (here one cell): measured, logged back, looked at closer.
    assert "1 checkpointed trial(s) of 'quickstart' measured" in text
    assert f"closer look below: run {ids['best']}" in text
    logged = _geometry(uri, "quickstart")
    assert math.isfinite(logged[ids["best"]]["geometry/lambda_max"]) and not logged[ids["worse"]]
