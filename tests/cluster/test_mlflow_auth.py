"""`sharpscale server --auth` for real: 401 without a login, a client with one records runs, the admin password is
never printed, and a trial on a Ray cluster started without credentials records through the driver's.

The Ray cluster of the last test is one `ray start --head --block` in its own process group and temp dir (ports on
this machine, token authentication with a token in the test's processes only), started from an environment without MLflow credentials: only the driver (`sharpscale run --address` in a
subprocess) has them, so a trial can log in only through the runtime environment the driver forwards. Cleanup stops
exactly what the test started (never `ray stop`: it would kill every Ray cluster on the machine).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from studies import server
from studies.server import Auth, free_ports, group_alive, pids_naming, start_server
from trainables.tracking import trial_runtime_env

RAY = str(Path(sys.executable).with_name("ray"))
CREDENTIALS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")


# Ray's token authentication with a token in these processes' environment only (never ~/.ray/auth_token, which
# the session cluster and other engineers' clusters on this machine read and write).
RAY_TOKEN = secrets.token_hex(32)


def _clean_env() -> dict[str, str]:
    """The environment of the Ray head: no MLflow credentials, no other Ray cluster's address or job."""
    env = {k: v for k, v in os.environ.items() if k not in CREDENTIALS and not k.startswith("MLFLOW_AUTH_")}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_JOB_CONFIG_JSON_ENV_VAR", None)
    env.update(RAY_USAGE_STATS_ENABLED="0", MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1",
               RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=RAY_TOKEN)
    return env


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    """A real `mlflow server --app-name basic-auth` on loopback, its admin password in a file (never in the env)."""
    tmp = tmp_path_factory.mktemp("auth-server")
    password = secrets.token_urlsafe(18)
    (tmp / "admin-password").write_text(password + "\n")
    with start_server(
        backend_store_uri=f"sqlite:///{tmp / 'mlflow.db'}", artifacts_destination=str(tmp / "mlartifacts"),
        auth=Auth(password_file=str(tmp / "admin-password")), log_path=tmp / "server.log", timeout_s=180,
    ) as (_, url):
        yield {"url": url, "admin": ("admin", password), "dir": tmp}


def _status(url: str, auth: tuple[str, str] | None = None) -> int:
    request = urllib.request.Request(f"{url}/api/2.0/mlflow/experiments/search?max_results=1")
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.timeout(240)
def test_no_login_gets_401_and_a_login_creates_runs(auth_server, monkeypatch):
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    url, admin = auth_server["url"], auth_server["admin"]
    assert _status(url) == 401
    assert _status(url, (admin[0], "not-the-password")) == 401
    assert _status(url, admin) == 200

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", admin[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", admin[1])
    client = MlflowClient(url)
    run = client.create_run(client.create_experiment("auth-check"))
    client.log_metric(run.info.run_id, "x", 1.0)
    assert client.get_run(run.info.run_id).data.metrics == {"x": 1.0}

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "not-the-password")
    with pytest.raises(MlflowException, match="401|not authenticated|Unauthorized"):
        MlflowClient(url).get_run(run.info.run_id)

    # Users and permissions live beside the backend store; the password appears in no file or log of ours.
    assert (auth_server["dir"] / "mlflow-auth.db").is_file()
    assert admin[1] not in (auth_server["dir"] / "server.log").read_text(errors="replace")


def test_auth_options_are_checked_before_anything_starts(tmp_path, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(server, "run_in_process_group", lambda cmd, **kw: started.append(cmd) or 0)
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_PASSWORD", raising=False)
    parser = argparse.ArgumentParser()
    server.add_arguments(parser)

    def run(*argv):
        code = server.from_args(parser.parse_args(list(argv)))
        return code, capsys.readouterr().err

    code, err = run("--auth")
    assert code == 2 and "--auth" in err and "--admin-password-file" in err and "MLFLOW_AUTH_ADMIN_PASSWORD" in err
    code, err = run("--auth", "--admin-password-file", str(tmp_path / "missing"))
    assert code == 2 and "--admin-password-file" in err and "missing" in err
    (tmp_path / "empty").write_text("\n")
    code, err = run("--auth", "--admin-password-file", str(tmp_path / "empty"))
    assert code == 2 and "empty" in err
    code, err = run("--admin-password-file", str(tmp_path / "empty"))
    assert code == 2 and "Fix: add --auth" in err
    (tmp_path / "pw").write_text("correct-horse-battery\n")
    monkeypatch.setenv("MLFLOW_AUTH_ADMIN_PASSWORD", "another-password-123")
    code, err = run("--auth", "--admin-password-file", str(tmp_path / "pw"))
    assert code == 2 and "once" in err
    code, err = run("--", "--app-name", "basic-auth")
    assert code == 2 and "Fix: use --auth" in err
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_PASSWORD")
    import importlib.util

    find_spec = importlib.util.find_spec  # an install without the auth extra, as the user who found the bug had
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flask_wtf" else find_spec(name, *a))
    code, err = run("--auth", "--admin-password-file", str(tmp_path / "pw"))
    assert code == 2 and "mlflow[auth]" in err and "Fix: pip install" in err
    assert started == []


def test_auth_passes_the_password_to_mlflow_only_and_never_prints_it(tmp_path, monkeypatch, capsys):
    seen = {}

    def fake_run(cmd, *, env):
        seen.update(cmd=cmd, env=env, ini=Path(env["MLFLOW_AUTH_CONFIG_PATH"]).read_text())
        return 0

    monkeypatch.setattr(server, "run_in_process_group", fake_run)
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("MLFLOW_FLASK_SERVER_SECRET_KEY", raising=False)
    password = "correct-horse-battery-staple"
    (tmp_path / "pw").write_text(password + "\n")
    assert server.serve(
        backend_store_uri=f"sqlite:///{tmp_path / 'runs.db'}", host="0.0.0.0", auth=Auth(password_file=str(tmp_path / "pw")),
    ) == 0
    out = capsys.readouterr()
    assert password not in out.out + out.err
    assert "Login required" in out.out and "runs-auth.db" in out.out and "basic auth over plain HTTP" in out.err
    assert seen["cmd"][seen["cmd"].index("--app-name") + 1] == "basic-auth"
    assert password not in " ".join(seen["cmd"]) and password not in seen["ini"]
    assert f"database_uri = sqlite:///{tmp_path / 'runs-auth.db'}" in seen["ini"]
    assert seen["env"]["MLFLOW_AUTH_ADMIN_PASSWORD"] == password  # read by MLflow itself, in the server's env only
    assert len(seen["env"]["MLFLOW_FLASK_SERVER_SECRET_KEY"]) >= 32
    assert not Path(seen["env"]["MLFLOW_AUTH_CONFIG_PATH"]).exists()  # the config goes with the server


def test_trial_runtime_env_forwards_the_drivers_mlflow_credentials_only():
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR
    from ray.runtime_env.runtime_env import _merge_runtime_env

    env = {"MLFLOW_TRACKING_USERNAME": "u", "MLFLOW_TRACKING_PASSWORD": "p", "AWS_SECRET_ACCESS_KEY": "no", "HOME": "/h"}
    assert trial_runtime_env(env) == {"env_vars": {"MLFLOW_TRACKING_USERNAME": "u", "MLFLOW_TRACKING_PASSWORD": "p"}}
    assert trial_runtime_env({"MLFLOW_TRACKING_TOKEN": "t"}) == {"env_vars": {"MLFLOW_TRACKING_TOKEN": "t"}}
    assert trial_runtime_env({"HOME": "/h", "MLFLOW_TRACKING_PASSWORD": ""}) is None

    # Under `ray job submit --runtime-env-json`, what the job sets already reaches every worker, and ray.init
    # refuses a key set twice: Ray's own merge must accept the rest.
    assert RAY_JOB_CONFIG_JSON_ENV_VAR == "RAY_JOB_CONFIG_JSON_ENV_VAR"  # the name trial_runtime_env reads
    job = {"runtime_env": {"working_dir": "/w", "env_vars": {"MLFLOW_TRACKING_USERNAME": "u"}}, "metadata": {}}
    ours = trial_runtime_env({**env, RAY_JOB_CONFIG_JSON_ENV_VAR: json.dumps(job)})
    assert ours == {"env_vars": {"MLFLOW_TRACKING_PASSWORD": "p"}}
    assert _merge_runtime_env(job["runtime_env"], ours) is not None
    assert _merge_runtime_env(job["runtime_env"], trial_runtime_env(env)) is None  # what the rule avoids



@contextlib.contextmanager
def _ray_head(logs: Path):
    """One `ray start --head --block` node, its services on this machine only, without MLflow credentials."""
    temp_dir = Path(tempfile.mkdtemp(prefix="ssauth-", dir="/tmp"))  # short: Ray's socket paths are limited
    gcs, dashboard, client, agent = free_ports(4)
    log = logs / "ray-head.log"
    with open(log, "wb") as out:
        head = subprocess.Popen(
            [RAY, "start", "--head", "--block", f"--temp-dir={temp_dir}", f"--port={gcs}", "--num-cpus=1", f"--object-store-memory={100 * 1024 * 1024}", "--disable-usage-stats",
             "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
             f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}"],
            env=_clean_env(), cwd=temp_dir, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while "Ray runtime started" not in log.read_text(errors="replace"):
            assert head.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield f"127.0.0.1:{gcs}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while group_alive(head.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=30)
        for pid in pids_naming(str(temp_dir)):  # a Ray process that left the group still names its temp dir
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)



@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_trial_on_a_cluster_without_credentials_logs_in_with_the_drivers(auth_server, tmp_path, tiny_model):
    from mlflow.server import get_app_client
    from mlflow.tracking import MlflowClient

    url, admin = auth_server["url"], auth_server["admin"]
    # A user of its own for the studies, as docs/cluster.md advises (not the admin).
    user, password = "sharpscale-trials", secrets.token_urlsafe(18)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_USERNAME", admin[0])
        mp.setenv("MLFLOW_TRACKING_PASSWORD", admin[1])
        get_app_client("basic-auth", tracking_uri=url).create_user(user, password)

    study = {
        "name": "auth-trial",
        "base": {
            "model": tiny_model("mixer"),
            "data": {"name": "digits", "img_size": 16, "batch_size": 256},
            "optimizer": {"method": "none", "lr": 0.003},
            "schedule": {"epochs": 1, "warmup_epochs": 0},
            "train": {"device": "cpu", "threads": 1},
        },
        "factors": {"method": {"adamw": {"optimizer.method": "none"}}},
        "budget": {"trials_per_cell": 1, "seed": 0},
        "resources": {"cpus_per_trial": 1, "max_concurrent_trials": 1, "max_failures": 0},
        "storage": str(tmp_path / "runs"),
        "tracking": {"artifact_location": str(tmp_path / "client_mlartifacts")},
    }
    path = tmp_path / "auth_trial.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))

    with _ray_head(tmp_path) as address:
        driver_env = {**_clean_env(), "MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password}
        driver = subprocess.run(
            [sys.executable, "-m", "studies.cli", "run", str(path), "--address", address, "--tracking-uri", url],
            env=driver_env, cwd=tmp_path, capture_output=True, text=True, timeout=300, start_new_session=True,
        )
        (tmp_path / "driver.log").write_text(driver.stdout + driver.stderr)
        assert driver.returncode == 0 and "(0 errored)" in driver.stdout, (driver.stdout + driver.stderr)[-4000:]
        assert password not in driver.stdout + driver.stderr

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_USERNAME", user)
        mp.setenv("MLFLOW_TRACKING_PASSWORD", password)
        client = MlflowClient(url)
        exp = client.get_experiment_by_name("auth-trial")
        runs = client.search_runs([exp.experiment_id], filter_string="tags.`sharpscale.kind` = 'trial'")
        assert len(runs) == 1 and runs[0].info.status == "FINISHED", runs
        assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "val_acc")] == [0]
