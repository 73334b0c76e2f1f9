"""Fixtures of the cluster tests: a real `mlflow server --auth`, started once per test file that needs it."""

from __future__ import annotations

import secrets
import shutil

import pytest

from studies.server import Auth, start_server


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory, _empty_mlflow_db):
    """A real `mlflow server --app-name basic-auth` on loopback, its admin password in a file (never in the env).

    Per file, not per session: `make test` keeps a file on one worker, so it still starts once for the file's tests,
    and is stopped after them instead of idling to the session's end beside the rest of the suite (its two uvicorn
    workers burn about 1 CPU-s a minute idle; it ran 40 minutes idle in a run under load).

    Two workers, not MLflow's four: each imports MLflow whole, and this machine has two cores. The backend store
    starts as a copy of the session's migrated empty store (tests/conftest.py)."""
    tmp = tmp_path_factory.mktemp("auth-server")
    password = secrets.token_urlsafe(18)
    (tmp / "admin-password").write_text(password + "\n")
    shutil.copyfile(_empty_mlflow_db, tmp / "mlflow.db")
    with start_server(
        backend_store_uri=f"sqlite:///{tmp / 'mlflow.db'}",
        artifacts_destination=str(tmp / "mlartifacts"),
        auth=Auth(password_file=str(tmp / "admin-password")),
        log_path=tmp / "server.log",
        timeout_s=240,
        workers=2,
    ) as (_, url):
        yield {"url": url, "admin": ("admin", password), "dir": tmp, "artifacts": tmp / "mlartifacts"}


@pytest.fixture
def trials_user(auth_server) -> tuple[str, str]:
    """A user of its own on the server for a study's trials, as docs/cluster.md advises (not the admin)."""
    from mlflow.server import get_app_client

    user, password = f"trials-{secrets.token_hex(4)}", secrets.token_urlsafe(18)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_USERNAME", auth_server["admin"][0])
        mp.setenv("MLFLOW_TRACKING_PASSWORD", auth_server["admin"][1])
        get_app_client("basic-auth", tracking_uri=auth_server["url"]).create_user(user, password)
    return user, password
