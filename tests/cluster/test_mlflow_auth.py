"""`sharpscale server --auth`: its options checked before anything starts, the admin password passed to MLflow only
and never printed, and the driver's MLflow credentials (only those) forwarded to trials.

The real server (401 without a login, runs with one, trials on a cluster without credentials logging in with the
driver's) is tested in tests/cluster/test_two_node.py, beside the two-node study that records through it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studies import server
from studies.server import Auth
from trainables.tracking import trial_runtime_env


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
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "flask_wtf" else find_spec(name, *a)
    )
    code, err = run("--auth", "--admin-password-file", str(tmp_path / "pw"))
    assert code == 2 and "mlflow[auth]" in err and "Fix: pip install" in err
    assert started == []


def test_auth_passes_the_password_to_mlflow_only_and_never_prints_it(tmp_path, monkeypatch, capsys):
    seen = {}

    def fake_run(cmd, *, env):
        seen.update(cmd=cmd, env=env, ini=Path(env["MLFLOW_AUTH_CONFIG_PATH"]).read_text())
        return 0

    monkeypatch.setattr(server, "run_in_process_group", fake_run)
    monkeypatch.setattr(server, "check_bindable", lambda *args: None)  # port 5000 may be another's on this machine
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("MLFLOW_FLASK_SERVER_SECRET_KEY", raising=False)
    password = "correct-horse-battery-staple"
    (tmp_path / "pw").write_text(password + "\n")
    assert (
        server.serve(
            backend_store_uri=f"sqlite:///{tmp_path / 'runs.db'}",
            host="0.0.0.0",
            auth=Auth(password_file=str(tmp_path / "pw")),
        )
        == 0
    )
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

    env = {
        "MLFLOW_TRACKING_USERNAME": "u",
        "MLFLOW_TRACKING_PASSWORD": "p",
        "AWS_SECRET_ACCESS_KEY": "no",
        "HOME": "/h",
    }
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
