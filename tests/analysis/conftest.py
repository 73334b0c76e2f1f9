"""Shared set-up for the analysis tests: a real SQLite MLflow store laid out as the runner lays out a study."""

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from trainables.naming import KIND_TAG
from trainables.tracking import TrackingTarget


def _study_store(root: Path, name: str) -> tuple[str, TrackingTarget, str]:
    """The store under root (made if new) with experiment `name` and its study run: (uri, target for trials, study run id)."""
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment(name, artifact_location=(root / "art").as_uri())
    study_run = client.create_run(exp, run_name=name, tags={KIND_TAG: "study"}).info.run_id
    return uri, TrackingTarget(uri, exp, parent_run_id=study_run), study_run


@pytest.fixture(scope="session")
def study_store(new_mlflow_store):
    """`_study_store`, as a fixture (the tests run under --import-mode=importlib, where conftest is no module), on a
    copy of the session's migrated empty store (tests/conftest.py) rather than a store migrated again."""

    def make(root: Path, name: str) -> tuple[str, TrackingTarget, str]:
        if not (root / "mlflow.db").exists():  # a second study in the same store joins it
            new_mlflow_store(root / "mlflow.db")
        return _study_store(root, name)

    return make
