"""The shipped notebooks run top to bottom (nbclient, a real kernel) against a quickstart-like MLflow store made here."""

from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

from trainables import TrialConfig
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
                    params = {"model.name": arch, "optimizer.method": "none" if rho is None else "sam",
                              "data.fraction": fraction, "train.seed": 0}
                    if rho is not None:
                        params["optimizer.hparams.rho"] = rho
                    key = f"{cell}-{i}"
                    final = skill - 0.1 * (1 - fraction) + (0.03 if method == "sam" else 0.0) - 0.01 * i
                    rec = TrialRecorder(target, trial_key=key, run_name=key, params=params)
                    rec.set_tags({**{f"factor.{k}": v for k, v in factors.items()}, "sharpscale.cell": cell,
                                  "sharpscale.trial_id": key})
                    for epoch in range(3):
                        progress = (epoch + 1) / 3
                        rec.log_epoch({"val_acc": final * progress, "train_loss": 2.0 / (epoch + 1),
                                       "val_loss": 2.2 / (epoch + 1)}, epoch)
                    rec.finish("finished")
    return uri


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_model):
    """A checkpoint in the trials' format (config + model state) of an untrained tiny ViT."""
    from trainables import create_model

    cfg = TrialConfig.load({"data": {"name": "digits", "img_size": 16},
                            "model": tiny_model("vit", embed_dim=32, depth=2, mlp_ratio=2, global_pool="avg", class_token=False)})
    model = create_model(cfg.model, num_classes=10, in_chans=1, img_size=16)
    path = tmp_path_factory.mktemp("ckpt") / "checkpoint.pt"
    torch.save({"format": 1, "config": cfg.model_dump(mode="json"), "model": model.state_dict()}, path)
    return path


def _run(name: str, cwd: Path) -> None:
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    # The kernel inherits this process's environment: the SHARPSCALE_* variables set by the test.
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors


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
    _run(name, tmp_path)


def test_geometry_notebook_runs_on_a_trial_checkpoint(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARPSCALE_CHECKPOINT", str(checkpoint))
    monkeypatch.setenv("SHARPSCALE_GEOMETRY_SAMPLES", "64")
    monkeypatch.setenv("SHARPSCALE_THREADS", "1")  # tiny model: spinning threads only slow a shared CI machine
    _run("geometry", tmp_path)
