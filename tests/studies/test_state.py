"""Where a study keeps its state: resolved against the study file (never the working directory), overridable from
the command line, recorded on the study run so `resume` finds it, and Tune's checkpoint settings."""

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from studies.spec import StudyError, load_study

REPO = Path(__file__).resolve().parents[2]

STUDY = {
    "name": "state",
    "base": {
        "data": {"name": "digits", "img_size": 16, "batch_size": 256, "augment": "none"},
        "optimizer": {"method": "sam", "lr": 0.003},
        "schedule": {"epochs": 3, "warmup_epochs": 0},
        "train": {"device": "cpu", "threads": 1},
    },
    "search": {"rho": {"type": "loguniform", "low": 0.01, "high": 0.1}},
    "budget": {"trials_per_cell": 2, "sampler": "random"},
    # One trial at a time: the second reuses the first one's Ray actor, not a second process importing torch and timm.
    "resources": {"cpus_per_trial": 1, "max_concurrent_trials": 1, "max_failures": 0},
}


@pytest.fixture
def write(tiny_model):
    """Write the study (with `changes`) into `where`; the model is the shared tiny Mixer."""

    def make(where: Path, **changes) -> Path:
        where.mkdir(parents=True, exist_ok=True)
        path = where / "study.yaml"
        study = {**STUDY, "base": {"model": tiny_model("mixer"), **STUDY["base"]}}
        path.write_text(yaml.safe_dump({**study, **changes}, sort_keys=False))
        return path

    return make


def test_default_locations_follow_the_study_file_not_the_working_directory(tmp_path, monkeypatch, write):
    path = write(tmp_path / "studies")
    seen = set()
    for cwd in (tmp_path, tmp_path / "studies", Path("/")):
        monkeypatch.chdir(cwd)
        study = load_study(path)
        seen.add((study.storage, study.optuna_storage("state")))
    assert seen == {
        (
            str(tmp_path / "studies" / "sharpscale_runs"),
            f"sqlite:///{tmp_path / 'studies' / 'sharpscale_runs' / 'state.optuna.db'}",
        )
    }


@pytest.mark.parametrize(
    "changes, storage, optuna",
    [
        ({"storage": "runs"}, "{d}/runs", "sqlite:///{d}/runs/state.optuna.db"),
        ({"storage": "/abs/runs/"}, "/abs/runs", "sqlite:////abs/runs/state.optuna.db"),
        ({"storage": "runs", "optuna_storage": "db/o.db"}, "{d}/runs", "sqlite:///{d}/db/o.db"),
        ({"optuna_storage": "sqlite:///o.db"}, "{d}/sharpscale_runs", "sqlite:///{d}/o.db"),
        (
            {"optuna_storage": "journal:///mnt/shared/o.journal"},
            "{d}/sharpscale_runs",
            "journal:///mnt/shared/o.journal",
        ),
        ({"optuna_storage": "postgresql://me@db:5432/optuna"}, "{d}/sharpscale_runs", "postgresql://me@db:5432/optuna"),
        # A bucket has no local "beside": Optuna's file goes under the study file's own sharpscale_runs/.
        ({"storage": "s3://bucket/runs/"}, "s3://bucket/runs", "sqlite:///{d}/sharpscale_runs/state.optuna.db"),
    ],
)
def test_locations_resolved(tmp_path, monkeypatch, changes, storage, optuna, write):
    path = write(tmp_path / "s", **changes)
    monkeypatch.chdir(tmp_path)
    study = load_study(path)
    d = tmp_path / "s"
    assert study.storage == storage.format(d=d)
    assert study.optuna_storage("state") == optuna.format(d=d)


def test_set_overrides_study_settings_and_locations_leave_the_hash_alone(tmp_path, write):
    path = write(tmp_path)
    plain = load_study(path)
    moved = load_study(
        path, overrides={"storage": "s3://b/x", "shared_mounts": ["/mnt/shared"], "optuna_storage": "o.db"}
    )
    assert moved.storage == "s3://b/x" and moved.spec.shared_mounts == ["/mnt/shared"]
    # Where the state lives is not what the study computes: `resume --storage` still finds its study run.
    assert moved.file_hash == plain.file_hash
    tuned = load_study(path, overrides={"checkpoints.keep": 5, "budget.time_limit_s": 60, "optimizer.lr": 0.01})
    assert tuned.spec.checkpoints.keep == 5 and tuned.spec.budget.time_limit_s == 60
    assert all(c.config["optimizer"]["lr"] == 0.01 for c in tuned.cells)
    assert tuned.file_hash != plain.file_hash
    assert plain.spec.checkpoints.keep == 2


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"nosuch": 1}, "--set nosuch: neither a trial config path nor a study setting"),
        ({"name": "other"}, "--set name: `name` defines the study"),
        ({"storage": "x", "storage.deeper": 1}, "--set storage.deeper: 'storage' takes a value"),
        ({"checkpoints.keep": 0}, "checkpoints.keep: Input should be greater than or equal to 1, got 0"),
        ({"checkpoints.kept": 3}, "checkpoints.kept: unknown key"),
        ({"shared_mounts": ["mnt/shared"]}, "shared_mounts: every entry must be an absolute directory"),
        ({"optuna_storage": "journal://rel.journal"}, "optuna_storage: a journal file needs an absolute path"),
        ({"optuna_storage": "s3://bucket/o.db"}, "optuna_storage: Optuna stores in a file or a database, not in s3://"),
    ],
)
def test_bad_settings_name_field_rule_value_and_fix(tmp_path, overrides, expected, write):
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path), overrides=overrides)
    assert expected in str(err.value), str(err.value)
    if not expected.startswith("checkpoints."):  # pydantic's own rules state the bound; ours also say the fix
        assert "Fix:" in str(err.value), str(err.value)


def test_every_bad_setting_reported_at_once(tmp_path, write):
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path), overrides={"nosuch": 1, "shared_mounts": ["rel"], "optuna_storage": "s3://b/o"})
    assert len(err.value.problems) == 3, err.value.problems


def _cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "studies.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=180
    )


def test_cli_storage_option_and_set_on_study_settings(tmp_path, write):
    path = write(tmp_path / "s")
    out = _cli(
        "validate", str(path), "--storage", str(tmp_path / "elsewhere"), "--set", "checkpoints.keep=3", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert (
        f"Ray storage {tmp_path / 'elsewhere'}, Optuna sqlite:///{tmp_path / 'elsewhere' / 'state.optuna.db'}"
        in out.stdout
    )
    bad = _cli("validate", str(path), "--set", "nosuch=1", cwd=tmp_path)
    assert bad.returncode == 2 and "--set nosuch: neither a trial config path nor a study setting" in bad.stderr
    assert "Traceback" not in bad.stderr
    from studies.cli import build_parser

    parser = build_parser()
    for command in ("run", "resume", "status", "report", "validate"):
        args = parser.parse_args([command, "x.yaml", "--storage", "s3://b/r", "--set", "storage_x=1"])
        assert args.storage == "s3://b/r" and args.set == ["storage_x=1"], command


def _optuna_trials(url: str) -> list[str]:
    return [
        t.state.name
        for s in optuna.get_all_study_summaries(url)
        for t in optuna.load_study(study_name=s.study_name, storage=url).trials
    ]


@pytest.mark.timeout(600)
def test_resume_finds_the_recorded_state_after_a_cwd_change(
    ray_cluster, tmp_path, monkeypatch, tracking_uri, capsys, write
):
    from studies.runner import run_study
    from trainables.naming import OPTUNA_STORAGE_TAG, STORAGE_TAG

    path = write(tmp_path / "studies", tracking={"artifact_location": str(tmp_path / "mlartifacts")})
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    storage = tmp_path / "moved_runs"
    environ = dict(os.environ)

    monkeypatch.chdir(first)
    outcome = run_study(path, tracking_uri=tracking_uri, overrides={"storage": str(storage)})
    assert outcome.trials == 2 and outcome.errored == 0
    # Tune's settings come through its config objects; (imported libraries may set their own variables).
    changed = {k for k in set(environ) ^ set(os.environ) | {k for k in environ if environ[k] != os.environ.get(k)}}
    assert not {k for k in changed if k.startswith(("TUNE_", "RAY_"))}, f"run_study changed the environment: {changed}"
    optuna_url = f"sqlite:///{storage / 'state.optuna.db'}"
    assert _optuna_trials(optuna_url) == ["COMPLETE", "COMPLETE"]
    tags = MlflowClient(tracking_uri).get_run(outcome.study_run_id).data.tags
    assert tags[STORAGE_TAG] == str(storage) and tags[OPTUNA_STORAGE_TAG] == optuna_url
    # num_to_keep: a 3-epoch trial keeps its last two checkpoints.
    trial_dirs = [p for p in (storage / "state").iterdir() if p.is_dir() and list(p.glob("checkpoint_*"))]
    assert len(trial_dirs) == 2
    for trial in trial_dirs:
        assert sorted(p.name for p in trial.glob("checkpoint_*")) == ["checkpoint_000001", "checkpoint_000002"]

    # Elsewhere, without --storage: the study file alone would point at studies/sharpscale_runs, where nothing is.
    monkeypatch.chdir(second)
    resumed = run_study(path, tracking_uri=tracking_uri, resume=True)
    assert resumed.study_run_id == outcome.study_run_id and resumed.trials == 2 and resumed.errored == 0
    assert _optuna_trials(optuna_url) == ["COMPLETE", "COMPLETE"]  # the same database, nothing asked again
    for where in (first, second, tmp_path / "studies"):
        assert not (where / "sharpscale_runs").exists(), where

    from studies.cli import main

    assert main(["status", str(path), "--tracking-uri", tracking_uri]) == 0
    assert f"State (recorded by its study run): Ray storage {storage}, Optuna {optuna_url}" in capsys.readouterr().out

    # A resumed run cannot switch Optuna databases: Tune restores its searcher with the one it started with.
    with pytest.raises(StudyError, match="optuna_storage: a resumed run reopens the Optuna storage it started with"):
        run_study(
            path, tracking_uri=tracking_uri, resume=True, overrides={"optuna_storage": str(tmp_path / "other.db")}
        )
