"""The walking skeleton end to end: a reduced quickstart on a real local Ray cluster into a real SQLite MLflow store."""

import math
from pathlib import Path

import pytest
import torch
import yaml

from analysis import load_runs
from studies.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(600)
def test_reduced_quickstart_end_to_end(ray_cluster, tmp_path, tracking_uri, capsys, monkeypatch):
    study = yaml.safe_load((REPO / "studies" / "quickstart.yaml").read_text())
    study["base"]["schedule"] = {"epochs": 2, "sched": "cosine", "warmup_epochs": 0}
    study["budget"]["trials_per_cell"] = 2
    study["storage"] = str(tmp_path / "runs")
    study["tracking"]["artifact_location"] = str(tmp_path / "mlartifacts")
    study["tracking"]["log_checkpoint"] = True
    path = tmp_path / "quickstart_small.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))

    # Through the CLI, as a user runs it; Ray is already up (the session fixture), so the runner reuses it.
    assert main(["run", str(path), "--tracking-uri", tracking_uri]) == 0
    printed = capsys.readouterr().out
    expected = 3 * 1 + 3 * 2  # AdamW cells run once, SAM cells search rho twice
    assert f"{expected} trials in" in printed and "(0 errored)" in printed
    assert "Best trial per cell by val_acc (final epoch)" in printed and "optimizer.hparams.rho" in printed
    for arch in ("vit", "mixer", "resnet"):
        assert arch in printed
    # The next command names the store, as a shell reads it (a command too long for the terminal continues on the
    # next line after a backslash).
    assert "sharpscale ui --tracking-uri" in printed.replace(" \\\n      ", " ")

    runs = load_runs("quickstart", tracking_uri=tracking_uri)
    assert len(runs) == expected
    assert set(runs["mlflow_status"]) == {"FINISHED"}
    assert set(runs["status"]) == {"finished"}
    for col in ("train_loss", "val_loss", "val_acc"):
        assert runs[col].map(math.isfinite).all(), col
    assert set(runs["factor.arch"]) == {"vit", "mixer", "resnet"}
    sam = runs[runs["optimizer.method"] == "sam"]
    assert len(sam) == 6 and sam["optimizer.hparams.rho"].between(0.005, 0.5).all()
    assert len(set(sam["trial_id"])) == 6

    # Per-epoch history: one value per epoch, step = epoch.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    history = client.get_metric_history(runs["run_id"][0], "val_acc")
    assert sorted(m.step for m in history) == [0, 1]

    # Parents: one study run, one run per cell, nothing left RUNNING anywhere in the experiment.
    exp = client.get_experiment_by_name("quickstart")
    everything = client.search_runs([exp.experiment_id], max_results=1000)
    kinds = [r.data.tags.get("sharpscale.kind") for r in everything]
    assert kinds.count("study") == 1 and kinds.count("cell") == 6 and kinds.count("trial") == expected
    assert all(r.info.status != "RUNNING" for r in everything)
    study_run = next(r for r in everything if r.data.tags.get("sharpscale.kind") == "study")
    assert [a.path for a in client.list_artifacts(study_run.info.run_id)] == ["quickstart_small.yaml"]
    assert exp.artifact_location.startswith("file:///")

    # The report and the status, as a user asks for them after the run.
    capsys.readouterr()
    assert main(["report", str(path), "--tracking-uri", tracking_uri, "--out", str(tmp_path / "report")]) == 0
    assert {"summary.md", "summary.csv", "rho_sensitivity.png", "report.md"} <= {
        p.name for p in (tmp_path / "report").iterdir()
    }
    logged = {a.path for a in client.list_artifacts(study_run.info.run_id, "report")}
    assert {"report/summary.md", "report/report.md"} <= logged
    assert main(["status", str(path), "--tracking-uri", tracking_uri]) == 0
    status = capsys.readouterr().out
    assert f"{expected} of {expected} trials recorded" in status and "mixer/sam" in status

    # From a trial's checkpoint artifact to its loss geometry, logged back to the same run and read by load_runs.
    import torch.nn.functional as F

    from analysis import geometry, log_geometry
    from trainables import load_dataset, load_model

    run_id = sam["run_id"].iloc[0]
    assert [a.path for a in client.list_artifacts(run_id, "checkpoint")] == ["checkpoint/checkpoint.pt"]
    local = client.download_artifacts(run_id, "checkpoint/checkpoint.pt", str(tmp_path / "dl"))
    model, cfg = load_model(local)
    assert cfg.optimizer.method == "sam"
    bundle = load_dataset("digits", img_size=cfg.data.img_size, augment="none")
    x, y, _ = next(iter(torch.utils.data.DataLoader(bundle.val, batch_size=64)))
    top = geometry.top_eigenvalues(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]), [(x, y)], k=1, max_iter=30)
    log_geometry(run_id, top, tracking_uri=tracking_uri)
    again = load_runs("quickstart", tracking_uri=tracking_uri).set_index("run_id")
    assert again.loc[run_id, "geometry/lambda_max"] == pytest.approx(top.eigenvalues[0])
    assert {a.path for a in client.list_artifacts(run_id, "geometry")} >= {"geometry/eigen.json", "geometry/eigen.npz"}

    # The shipped notebooks, top to bottom in a real kernel, on these quickstart results and this trial's checkpoint.
    import nbformat
    from nbclient import NotebookClient

    notebooks = REPO / "analysis" / "notebooks"
    env = {
        "SHARPSCALE_TRACKING_URI": tracking_uri,
        "SHARPSCALE_STUDY": "quickstart",
        "SHARPSCALE_N_BOOT": "200",
        "SHARPSCALE_CHECKPOINT": local,
        "SHARPSCALE_GEOMETRY_SAMPLES": "64",
        "SHARPSCALE_THREADS": "1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for name in ("data_scaling", "rho_sensitivity", "geometry"):
        nb = nbformat.read(notebooks / f"{name}.ipynb", as_version=4)
        NotebookClient(
            nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        ).execute()
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
        assert not errors, (name, errors)
