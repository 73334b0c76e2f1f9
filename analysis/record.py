"""Geometry results into a trial's MLflow run: scalars as metrics, arrays and settings as artifacts."""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["log_geometry"]


def _settings(result: Any) -> dict[str, Any]:
    # Everything a result records about how it was measured, without its (large) arrays.
    out = {}
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if isinstance(value, (str, int, float, bool)) or value is None:
            out[f.name] = value
        elif isinstance(value, (tuple, list)) and len(value) <= 64 and all(isinstance(v, (str, int, float, bool)) for v in value):
            out[f.name] = list(value)
    return out


def log_geometry(run_id: str, *results: Any, tracking_uri: str, prefix: str = "geometry/", step: int = 0) -> dict[str, float]:
    """Log `analysis.geometry` results to the run `run_id`; they then come back as columns of `load_runs`.

    Each result's `to_metrics(prefix)` becomes MLflow metrics; its `to_arrays()` an `.npz` and its settings
    (mode, samples, seeds, iterations, ...) a `.json` under the artifact folder `geometry/`. Returns the metrics.
    """
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    if not results:
        raise ValueError("log_geometry needs at least one result, got none. Fix: pass e.g. top_eigenvalues(...)'s result.")
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
        client.log_dict(run_id, _settings(result), f"geometry/{name}.json")
        arrays = result.to_arrays() if hasattr(result, "to_arrays") else {}
        if arrays:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / f"{name}.npz"
                np.savez(path, **arrays)
                client.log_artifact(run_id, str(path), "geometry")
    return metrics
