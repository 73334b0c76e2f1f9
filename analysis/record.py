"""Geometry into trials' MLflow runs: a study's checkpointed trials found, measured, and logged back (metrics, arrays, settings)."""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from analysis.geometry.names import METRIC_PREFIX
from trainables.naming import CHECKPOINT_ARTIFACT

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from analysis.geometry import EigenResult, TraceResult
    from trainables import TrialConfig

__all__ = [
    "checkpointed_trials",
    "download_checkpoint",
    "log_geometry",
    "measure_checkpoint",
    "measure_study",
    "trial_batches",
]


def _settings(result: Any) -> dict[str, Any]:
    # Everything a result records about how it was measured, without its (large) arrays.
    out = {}
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if isinstance(value, (str, int, float, bool)) or value is None:
            out[f.name] = value
        elif (
            isinstance(value, (tuple, list))
            and len(value) <= 64
            and all(isinstance(v, (str, int, float, bool)) for v in value)
        ):
            out[f.name] = list(value)
    return out


def log_geometry(
    run_id: str, *results: Any, tracking_uri: str, prefix: str = METRIC_PREFIX, step: int = 0
) -> dict[str, float]:
    """Log `analysis.geometry` results to the run `run_id`; they then come back as columns of `load_runs`.

    Each result's `to_metrics(prefix)` becomes MLflow metrics; its `to_arrays()` an `.npz` and its settings
    (mode, samples, seeds, iterations, ...) a `.json` under the artifact folder `geometry/`. Returns the metrics.
    """
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    if not results:
        raise ValueError(
            "log_geometry needs at least one result, got none. Fix: pass e.g. top_eigenvalues(...)'s result."
        )
    client = MlflowClient(tracking_uri=tracking_uri)
    now = int(time.time() * 1000)
    metrics: dict[str, float] = {}
    for result in results:
        metrics.update({k: float(v) for k, v in result.to_metrics(prefix).items()})
    finite = [Metric(k, v, now, step) for k, v in metrics.items() if math.isfinite(v)]
    for i in range(0, len(finite), 1000):  # MLflow's batch limit for metrics
        client.log_batch(run_id, metrics=finite[i : i + 1000])
    for result in results:
        name = type(result).__name__.removesuffix("Result").lower()
        client.log_dict(run_id, _settings(result), f"{METRIC_PREFIX}{name}.json")
        arrays = result.to_arrays() if hasattr(result, "to_arrays") else {}
        if arrays:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / f"{name}.npz"
                np.savez(path, **arrays)
                client.log_artifact(run_id, str(path), "geometry")
    return metrics


# ------------------------------------------------------------------ a study's recorded checkpoints, measured


def checkpointed_trials(
    study: str | Path,
    *,
    tracking_uri: str | None = None,
    best_per_cell: int | None = None,
    metric: str = "val_acc",
    mode: Literal["max", "min"] = "max",
    launch: int | Literal["latest", "all"] = "latest",
    smoke: bool = False,
) -> pd.DataFrame:
    """The study's finished trials whose run keeps a checkpoint artifact (`tracking.log_checkpoint: true`).

    The rows of `load_runs` (same arguments), best first by `metric` within each cell; best_per_cell: keep that
    many per cell (None: all). Trials without the metric come last. Empty when no trial kept a checkpoint.
    """
    from analysis.runs import _open_experiment, load_runs
    from trainables.loop import CHECKPOINT_FILE

    if best_per_cell is not None and (
        isinstance(best_per_cell, bool) or not isinstance(best_per_cell, int) or best_per_cell < 1
    ):
        raise ValueError(
            f"best_per_cell must be None (all) or an integer >= 1, got {best_per_cell!r}. Fix: e.g. best_per_cell=2."
        )
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    runs = load_runs(study, tracking_uri=tracking_uri, launch=launch, smoke=smoke)
    if runs.empty:
        return runs
    client, _, _ = _open_experiment(study, tracking_uri, smoke=smoke)
    wanted = f"{CHECKPOINT_ARTIFACT}/{CHECKPOINT_FILE}"
    finished = runs[runs["status"] == "finished"]
    has = [any(a.path == wanted for a in client.list_artifacts(r, CHECKPOINT_ARTIFACT)) for r in finished["run_id"]]
    kept = finished[has]
    if metric in kept.columns:
        kept = kept.sort_values(["cell", metric], ascending=[True, mode == "min"], na_position="last", kind="stable")
    else:
        kept = kept.sort_values("cell", kind="stable")
    if best_per_cell is not None:
        kept = kept.groupby("cell", sort=False).head(best_per_cell)
    return kept.reset_index(drop=True)


def download_checkpoint(run_id: str, dst: str | Path, *, tracking_uri: str) -> Path:
    """The checkpoint file kept with the trial run `run_id`, downloaded into the folder `dst`."""
    from trainables.loop import CHECKPOINT_FILE
    from trainables.tracking import resolve_tracking_uri, tracking_client

    client = tracking_client(resolve_tracking_uri(tracking_uri), create=False)
    Path(dst).mkdir(parents=True, exist_ok=True)
    return Path(client.download_artifacts(run_id, f"{CHECKPOINT_ARTIFACT}/{CHECKPOINT_FILE}", str(dst)))


def trial_batches(
    config: TrialConfig, *, samples: int = 128, batch_size: int = 64, seed: int = 0, data_root: str | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed batches of a trial's own training set (its data config: dataset, fraction, fraction seed), unaugmented.

    `samples` examples drawn once by `seed` from the trial's training subset, in batches of `batch_size`, as the
    model takes them (normalised). data_root: where the dataset lives here, when not at the trial's `data.root`.
    """
    from trainables import fixed_batches

    return fixed_batches(config.data, samples=samples, batch_size=batch_size, seed=seed, data_root=data_root)


def _cross_entropy(model, batch):
    import torch.nn.functional as F

    x, y = batch
    return F.cross_entropy(model(x), y)


def measure_checkpoint(
    path: str | Path,
    *,
    samples: int = 128,
    batch_size: int = 64,
    k: int = 1,
    max_iter: int = 50,
    tol: float = 1e-3,
    trace_samples: int = 32,
    seed: int = 0,
    mask_seed: int = 0,
    data_root: str | None = None,
) -> tuple[EigenResult, TraceResult]:
    """lambda_max (`top_eigenvalues`, Lanczos) and tr(H) (`hessian_trace`) of a trial checkpoint's model.

    The Hessian is that of the plain cross-entropy (eval mode) over `trial_batches` of the trial's own training
    set; `seed` draws the examples and the probe vectors, `mask_seed` is fixed so every measure sees one Hessian.
    """
    from analysis.geometry import hessian_trace, top_eigenvalues
    from trainables import load_model, set_fused_attention

    model, cfg = load_model(path)
    set_fused_attention(model, False)  # fused attention has no double backward, which Hessian-vector products need
    batches = trial_batches(cfg, samples=samples, batch_size=batch_size, seed=seed, data_root=data_root)
    eig = top_eigenvalues(
        model, _cross_entropy, batches, k=k, max_iter=max_iter, tol=tol, seed=seed, mask_seed=mask_seed
    )
    trace = hessian_trace(model, _cross_entropy, batches, samples=trace_samples, seed=seed, mask_seed=mask_seed)
    return eig, trace


def measure_study(
    study: str | Path,
    *,
    tracking_uri: str | None = None,
    best_per_cell: int | None = None,
    metric: str = "val_acc",
    mode: Literal["max", "min"] = "max",
    launch: int | Literal["latest", "all"] = "latest",
    smoke: bool = False,
    **measure: Any,
) -> pd.DataFrame:
    """Measure every checkpointed trial of a study (`checkpointed_trials`) and log the results onto its run.

    Each trial's checkpoint is downloaded, measured by `measure_checkpoint(**measure)` and logged back by
    `log_geometry` (`geometry/lambda_max`, `geometry/hessian_trace`, ...), so `load_runs` and the report's
    geometry-vs-gap table (`geometry_correlation`) see them. A trial is logged as soon as it is measured: an
    interruption keeps those done. One row per measured trial: run_id, cell, `metric`, the logged metrics.
    """
    import pandas as pd

    from trainables.naming import DEFAULT_TRACKING_URI
    from trainables.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri or DEFAULT_TRACKING_URI)
    trials = checkpointed_trials(
        study, tracking_uri=uri, best_per_cell=best_per_cell, metric=metric, mode=mode, launch=launch, smoke=smoke
    )
    rows = []
    for trial in trials.to_dict("records"):
        with tempfile.TemporaryDirectory(prefix="sharpscale-geometry-") as tmp:
            results = measure_checkpoint(download_checkpoint(trial["run_id"], tmp, tracking_uri=uri), **measure)
        logged = log_geometry(trial["run_id"], *results, tracking_uri=uri)
        rows.append({"run_id": trial["run_id"], "cell": trial["cell"], metric: trial.get(metric, math.nan), **logged})
    return pd.DataFrame(rows, columns=None if rows else ["run_id", "cell", metric])
