"""Shared fixtures: quiet offline environment, one real local Ray cluster per session, small study files."""

import os

# Before Ray, MLflow or timm are imported anywhere in the session.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray cluster (with its dashboard, which Train-inside-Tune needs), shut down at session end."""
    import ray

    ray.init(num_cpus=2, include_dashboard=True, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def tracking_uri(tmp_path) -> str:
    """A real MLflow SQLite store in the test's own directory."""
    return f"sqlite:///{tmp_path / 'mlflow.db'}"
