"""Adversarial input to the `sharpscale` command: each refused with one clear line and a status, the store left clean.

Most cases are refused before Ray starts and run in-process through the CLI's `main`. A few need real processes
(Ctrl-C, concurrent first use of a store); they hold on observable states, never on a sleep.
"""

import contextlib
import errno
import ipaddress
import json
import multiprocessing
import os
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from studies.cli import EXIT_INTERRUPTED, EXIT_USAGE, main
from studies.spec import MAX_STUDY_FILE_BYTES, MAX_TRIALS
from trainables.errors import MAX_SHOWN_CHARS, UserError, shown
from trainables.tracking import NO_SPACE_REASON

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = (REPO / "studies" / "quickstart.yaml").read_text()
METHOD_FACTOR = "  method:\n    adamw: {optimizer.method: none}\n    sam:   {optimizer.method: sam}\n"
RHO = "rho: {type: loguniform, low: 0.005, high: 0.5}"
# Each line holds nine of the one above: *h stands for 9**7 (4.8 million) values in a file of 300 bytes.
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh")
)


def _edit(*pairs: tuple[str, str]) -> str:
    text = QUICKSTART
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    return text


# (id, study file text or bytes (None: the shipped quickstart), extra arguments, what the message must say)
REFUSED = [
    (
        "int-log-low-0",
        _edit((RHO, RHO + "\n  train.seed: {type: int, low: 0, high: 5, log: true}")),
        [],
        "log: true needs low >= 1",
    ),
    ("uniform-inf", _edit((RHO, "rho: {type: uniform, low: 0.0, high: .inf}")), [], "finite number"),
    ("uniform-nan", _edit((RHO, "rho: {type: uniform, low: .nan, high: 0.5}")), [], "finite number"),
    ("metric-typo", _edit(("metric: val_acc", "metric: val_accc")), [], "did you mean 'val_acc'"),
    ("cpus-too-many", _edit(("cpus_per_trial: 1", "cpus_per_trial: 4096")), [], "resources.cpus_per_trial"),
    (
        "custom-resource-nowhere",
        _edit(("cpus_per_trial: 1", "cpus_per_trial: 1, custom: {node_a: 1}")),
        [],
        "resources.custom.node_a",
    ),
    ("factor-no-levels", _edit((METHOD_FACTOR, "  method: {}\n")), [], "needs at least one level"),
    (
        "grid-huge",
        _edit(
            (RHO, "train.seed: {type: int, low: 0, high: 1000000000}"),
            ("sampler: tpe", "sampler: grid"),
            ("trials_per_cell: 4, ", ""),
        ),
        [],
        f"more than {MAX_TRIALS}",
    ),
    (
        "factors-huge",
        _edit((METHOD_FACTOR, f"  train.seed: {list(range(MAX_TRIALS // 3 + 1))}\n")),
        [],
        "cells, more than",
    ),
    ("set-factor-path", None, ["--set", "optimizer.method=gsam"], "from the study's factor 'method'"),
    ("set-searched-path", None, ["--set", "optimizer.hparams.rho=0.1"], "search key 'rho'"),
    ("duplicate-key", QUICKSTART + "\nbudget: {trials_per_cell: 8}\n", [], "found the key 'budget' twice"),
    ("duplicate-levels", _edit((METHOD_FACTOR, '  data.fraction: [0.5, 0.5, "0.5"]\n')), [], "levels must be distinct"),
    (
        "duplicate-choices",
        _edit((RHO, "rho: {type: choice, values: [0.1, 0.1]}")),
        [],
        "choice values must be distinct",
    ),
    ("bool-as-int", _edit(("trials_per_cell: 4", "trials_per_cell: true")), [], "valid integer"),
    ("string-as-int", _edit(("trials_per_cell: 4", 'trials_per_cell: "4"')), [], "valid integer"),
    ("latin-1-file", ("# caf\xe9\n" + QUICKSTART).encode("latin-1"), [], "must be UTF-8 text, got byte 0xe9 on line 1"),
    ("utf-16-file", QUICKSTART.encode("utf-16"), [], "got UTF-16"),
    ("set-unclosed-bracket", None, ["--set", "optimizer.lr=["], "--set optimizer.lr: YAML syntax"),
    (
        "set-python-tag",
        None,
        ["--set", "data.root=!!python/object/apply:os.system"],
        "could not determine a constructor",
    ),
    ("set-below-a-value", None, ["--set", "data.root.x=1"], "--set data.root.x: neither a trial config path"),
    ("set-no-equals", None, ["--set", "data.root"], "must be KEY=VALUE"),
    ("set-bad-key", None, ["--set", "data..root=1"], "KEY must be a dotted path"),
    (
        "search-below-a-value",
        _edit((RHO, "model.name.x: {type: choice, values: [1]}")),
        [],
        "search.model.name.x: not a trial config path",
    ),
    (
        "level-sets-section-and-field",
        _edit(
            (
                "adamw: {optimizer.method: none}",
                "adamw: {optimizer.method: none, model: {name: resnet18}, model.name: resnet18}",
            )
        ),
        [],
        "sets both model and model.name",
    ),
    (
        "level-name-both-quotes",
        _edit((METHOD_FACTOR, '  method:\n    "a\'b\\"": {optimizer.method: none}\n')),
        [],
        "may hold ' or \" but not both",
    ),
    (
        "experiment-absolute",
        _edit(("tracking: {", "tracking: {experiment: /tmp/x, ")),
        [],
        "tracking.experiment: must be one file-name",
    ),
    (
        "experiment-climbs-out",
        _edit(("tracking: {", "tracking: {experiment: ../../escaped, ")),
        [],
        "tracking.experiment: must be one file-name",
    ),
    ("name-with-dots", _edit(("name: quickstart", "name: a..b")), [], "name: must be one file-name"),
    ("alias-bomb", BOMB + "name: [*h]\n", [], "YAML aliases may expand to at most"),
    (
        "alias-bomb-in-model-kwargs",
        BOMB
        + _edit(
            ("model.kwargs: {patch_size: 4, num_blocks: 2, embed_dim: 64}", "model.kwargs: {patch_size: 4, bomb: *h}")
        ),
        [],
        "YAML aliases may expand",
    ),
    ("recursive-alias", "a: &a [*a]\n" + QUICKSTART, [], "YAML aliases may expand"),
    ("huge-file", QUICKSTART + "#" + "x" * MAX_STUDY_FILE_BYTES + "\n", [], f"at most {MAX_STUDY_FILE_BYTES} bytes"),
    ("huge-name", _edit(("name: quickstart", "name: " + "x/" * 50_000)), [], "name: must be one file-name"),
    ("tracking-uri-unknown-scheme", None, ["--tracking-uri", "foo://bar"], "tracking URI: must be"),
    # Issue 24: each of these was valid, then failed in every trial (with Tune's retries) or ran something else.
    (
        "two-factors-one-path",
        _edit((METHOD_FACTOR, METHOD_FACTOR + "  variant:\n    gsam: {optimizer.method: gsam}\n")),
        [],
        "factors.method and factors.variant: both set optimizer.method",
    ),
    (
        "betas-nan",
        _edit(("lr: 0.004,", "lr: 0.004, betas: [.nan, 0.999],")),
        [],
        "base.optimizer.betas.0: must be a finite",
    ),
    (
        "warmup-lr-inf",
        _edit(("warmup_epochs: 1}", "warmup_epochs: 1, warmup_lr: .inf}")),
        [],
        "warmup_lr: must be a finite",
    ),
    (
        "seed-2-to-70",
        _edit(("seed: 0}\n\nfactors", f"seed: {2**70}}}\n\nfactors")),
        [],
        "base.train.seed: at most 64-bit",
    ),
    ("yaml-dotless-exponent", _edit(("lr: 0.004", "lr: 4e-3")), [], "Fix: write 4.0e-3 (or 0.004)"),
    (
        "yaml-no-is-false",
        _edit(("description: AdamW", "description: no\nnote: AdamW")),
        [],
        "no is read as the boolean false",
    ),
    ("yaml-on-off", _edit((METHOD_FACTOR, METHOD_FACTOR + "  train.amp: [on, off]\n")), [], "quote it ('on')"),
    (
        "yaml-two-merge-keys",
        "x: &a {metric: val_acc}\n" + _edit(("objective: {metric: val_acc,", "objective: {<<: *a, <<: *a,")),
        [],
        "2 `<<:` merge keys in one mapping",
    ),
    ("nested-brackets", "name: q\nbase: " + "[" * 1000 + "]" * 1000 + "\n", [], "nested too deeply to read"),
    ("nul-byte", _edit(("description: AdamW", "description: A\x00damW")), [], "control character U+0000"),
    ("esc-byte", _edit(("description: AdamW", "description: \x1b[31mAdamW")), [], "control character U+001B"),
    ("name-250-chars", _edit(("name: quickstart", "name: " + "a" * 250)), [], "name: at most 100 characters"),
    ("set-empty-value", None, ["--set", "budget.trials_per_cell="], "the value is empty"),
    (
        "model-kwargs-typo",
        _edit(("mlp_ratio: 2,", "mlp_ration: 2,")),
        [],
        "model.kwargs.mlp_ration: timm's vit_tiny_patch16_224 takes no argument 'mlp_ration'. Did you mean mlp_ratio?",
    ),
    (
        "model-kwargs-checkpoint-path",
        _edit(("mlp_ratio: 2,", "mlp_ratio: 2, checkpoint_path: /etc/passwd,")),
        [],
        "model.kwargs.checkpoint_path: models are built untrained",
    ),
    ("storage-twice", None, ["--set", "storage=/tmp/a", "--storage", "/tmp/b"], "name two places"),
    # Session 7's re-check of issue 24: --smoke replaced an invalid data section and passed; a union's members
    # named themselves in the field (factors.x.list[any]), two lines for one mistake.
    (
        "smoke-invalid-data",
        _edit(("data: {name: digits,", "data: {name: digitz,")),
        ["--smoke"],
        "cell vit/adamw: data.name: must be one of",
    ),
    (
        "factor-scalar",
        _edit((METHOD_FACTOR, METHOD_FACTOR + "  x: 3\n")),
        [],
        "factors.x: Input should be a valid dictionary or a valid list, got 3.",
    ),
    (  # a user's key with brackets is a key, not one of pydantic's union member tags: its name stays
        "factor-bracket-name",
        _edit((METHOD_FACTOR, METHOD_FACTOR + '  "x[1]": 3\n')),
        [],
        "factors.x[1]: Input should be a valid dictionary or a valid list, got 3.",
    ),
]


def _write(tmp_path: Path, content) -> Path:
    path = tmp_path / "study.yaml"
    if content is None:
        content = QUICKSTART
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def _left_behind(tmp_path: Path) -> set[str]:
    return {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")} - {"study.yaml"}


@pytest.mark.parametrize("content, extra, expected", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused_before_anything_runs(content, extra, expected, tmp_path, monkeypatch, capsys, no_ray):
    import ray

    monkeypatch.chdir(tmp_path)
    study = _write(tmp_path, content)
    t0 = time.perf_counter()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["run", str(study), "--tracking-uri", uri, *extra]
    if "--tracking-uri" in extra:
        argv = ["run", str(study), *extra]
    assert main(argv) == EXIT_USAGE
    assert time.perf_counter() - t0 < 60  # an alias bomb or a huge grid is refused, not expanded (no timing claim)
    out = capsys.readouterr()
    assert expected in out.err, out.err
    assert "Traceback" not in out.err
    assert out.err.startswith("sharpscale: error: ")
    # Every echoed value is cut: the message stays a few lines, whatever the input's size.
    assert len(out.err) < 4000, len(out.err)
    assert not ray.is_initialized()
    assert _left_behind(tmp_path) == set()  # no MLflow store, no storage folder, no Optuna database


@pytest.mark.parametrize("command", ["status", "report"])
@pytest.mark.parametrize(
    "uri, expected",
    [
        ("foo://bar", "tracking URI: must be"),
        ("sqlite:///{tmp}/typo/mlflow.db", "no MLflow store at"),
    ],
    ids=["unknown-scheme", "missing-store"],
)
def test_read_only_commands_refuse_a_bad_store_and_create_nothing(
    command, uri, expected, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    study = _write(tmp_path, None)
    assert main([command, str(study), "--tracking-uri", uri.format(tmp=tmp_path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert _left_behind(tmp_path) == set()


def test_num_cpus_below_one_blames_the_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "studies/quickstart.yaml", "--num-cpus", "-5"])
    assert exit_.value.code == EXIT_USAGE
    assert "argument --num-cpus: must be at least 1" in capsys.readouterr().err


def test_messages_echo_values_cut():
    assert shown("x" * 10) == repr("x" * 10)
    long = shown("y" * 100_000)
    assert len(long) < MAX_SHOWN_CHARS + 40 and long.endswith("(100002 chars)")


def test_every_user_error_is_one_class():
    from analysis.runs import StudyNotFound
    from studies.server import ServerOptionError
    from studies.spec import StudyError
    from trainables.config import ConfigError
    from trainables.data.fetch import FetchError
    from trainables.data.staging import StagingError

    for cls in (StudyError, ConfigError, FetchError, StagingError, ServerOptionError, StudyNotFound):
        assert issubclass(cls, UserError), cls


def test_version_and_help_state_the_contract(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert re.fullmatch(r"sharpscale \S+\n", capsys.readouterr().out)
    with pytest.raises(SystemExit):
        main(["validate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"Exit status: 0 when the study is valid; {EXIT_USAGE} when it is not" in text
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"{EXIT_INTERRUPTED} when interrupted" in text and "--tracking-uri" in text and "--smoke" in text


def _study_in_store(tmp_path: Path, name: str, statuses: list[str], new_store) -> tuple[Path, str]:
    """A study file, and a real MLflow store holding its experiment with one trial run per status (no metric)."""
    from trainables.tracking import TrackingTarget, TrialRecorder, tracking_client

    study = tmp_path / "study.yaml"
    study.write_text(_edit(("name: quickstart", f"name: {name}")))
    uri = new_store(tmp_path / "mlflow.db")
    client = tracking_client(uri)
    exp = client.create_experiment(name, artifact_location=(tmp_path / "mlartifacts").as_uri())
    for i, status in enumerate(statuses):
        rec = TrialRecorder(TrackingTarget(uri, exp), f"t{i}", f"t{i}", {"optimizer.lr": 0.1})
        rec.finish(status, "RuntimeError: boom")
    return study, uri


@pytest.mark.parametrize("statuses", [[], ["failed", "diverged"]], ids=["no-trials", "all-failed"])
def test_report_and_status_of_a_study_without_results(statuses, tmp_path, monkeypatch, capsys, new_mlflow_store):
    monkeypatch.chdir(tmp_path)
    study, uri = _study_in_store(tmp_path, "noresult", statuses, new_mlflow_store)
    assert main(["report", str(study), "--tracking-uri", uri, "--no-mlflow", "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "No report written" in out.out
    if statuses:
        assert "1 failed, 1 diverged" in out.out
    assert main(["status", str(study), "--tracking-uri", uri]) == 0
    out = capsys.readouterr()
    assert f"{len(statuses)} of 15 trials recorded" in out.out, out


def test_summary_of_an_all_failed_study(tmp_path, capsys, new_mlflow_store):
    from studies.cli.summary import print_summary
    from studies.spec import load_study

    study, uri = _study_in_store(tmp_path, "allfailed", ["failed", "failed"], new_mlflow_store)
    print_summary(load_study(study, require_data=False), uri)
    assert "no trial finished with a result (2 failed)" in capsys.readouterr().out


def test_a_level_name_with_a_quote_is_found_again(tmp_path, new_mlflow_store):
    from studies.records import find_run
    from trainables.tracking import tracking_client

    client = tracking_client(new_mlflow_store(tmp_path / "mlflow.db"))
    exp = client.create_experiment("quotes")
    for key in ("method=o'brien", 'method="quoted"', "plain"):
        client.create_run(exp, tags={"sharpscale.cell": key})
    for key in ("method=o'brien", 'method="quoted"', "plain"):
        assert find_run(client, exp, {"sharpscale.cell": key}).data.tags["sharpscale.cell"] == key


def _open_store(uri: str, start: str, index: int) -> None:
    from trainables.tracking import tracking_client

    deadline = time.time() + 120
    while not Path(start).exists():  # every process is imported and waiting: then all open the store at once
        assert time.time() < deadline
        time.sleep(0.01)
    tracking_client(uri).create_experiment(f"concurrent-{index}")


def test_concurrent_first_use_of_a_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    start = tmp_path / "go"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_open_store, args=(uri, str(start), i)) for i in range(3)]
    for p in procs:
        p.start()
    start.touch()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    from trainables.tracking import tracking_client

    names = {e.name for e in tracking_client(uri).search_experiments()}
    assert {f"concurrent-{i}" for i in range(3)} <= names


def test_closing_failures_never_hide_the_cause():
    from studies.launch import close_all

    closed = []

    def full_disk():
        raise OSError(28, "No space left on device")

    cause = RuntimeError("the real cause")
    close_all([full_disk, lambda: closed.append(1), full_disk, lambda: closed.append(2)], cause)
    assert closed == [1, 2]  # every step ran
    assert any("No space left" in n for n in cause.__notes__)
    with pytest.raises(OSError, match="No space left"):
        close_all([full_disk, lambda: closed.append(3)], None)
    assert closed == [1, 2, 3]


# A real study, Ctrl-C'd: one cell, 3 trials one at a time, on the digits with a tiny Mixer.
CTRL_C_STUDY = {
    "name": "ctrlc",
    "base": {
        "data": {"name": "digits", "img_size": 16, "batch_size": 128},
        "optimizer": {"method": "sam", "lr": 0.003},
        "schedule": {"epochs": 6, "warmup_epochs": 0},
        "train": {"device": "cpu", "threads": 1},
    },
    "search": {"rho": {"type": "loguniform", "low": 0.01, "high": 0.1}},
    "budget": {"trials_per_cell": 3, "seed": 1},
    "resources": {"cpus_per_trial": 1, "max_concurrent_trials": 1},
    "tracking": {"uri": "sqlite:///mlflow.db", "artifact_location": "mlartifacts"},
    "storage": "runs",
}


def _ctrl_c_study(tiny_model) -> dict:
    return {**CTRL_C_STUDY, "base": {**CTRL_C_STUDY["base"], "model": tiny_model("mixer")}}


def _listening(pid: int) -> list[tuple[str, str]]:
    """(address, process name) of every listening socket of process `pid` and its descendants."""
    import psutil

    root = psutil.Process(pid)
    pids = {pid} | {c.pid for c in root.children(recursive=True)}
    return [
        (c.laddr.ip, psutil.Process(c.pid).name())
        for c in psutil.net_connections("inet")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    ]


def _sql(db: Path, query: str) -> list:
    if not db.exists():
        return []
    with sqlite3.connect(db, timeout=30) as con:
        try:
            return con.execute(query).fetchall()
        except sqlite3.OperationalError:
            return []  # the schema is being created


def _training(db: Path) -> bool:
    """Whether a running trial has recorded an epoch's train_loss: the study is mid-training."""
    running = _sql(
        db,
        "select count(*) from runs r join metrics m on m.run_uuid = r.run_uuid and "
        "m.key = 'train_loss' where r.status = 'RUNNING'",
    )
    return bool(running and running[0][0])


def _runs(db: Path) -> list[tuple[str, str, str]]:
    """(kind, MLflow status, sharpscale.status) of every run."""
    return _sql(
        db,
        "select k.value, r.status, s.value from runs r join tags k on k.run_uuid = r.run_uuid and "
        "k.key = 'sharpscale.kind' left join tags s on s.run_uuid = r.run_uuid and s.key = 'sharpscale.status' "
        "where r.lifecycle_stage = 'active'",
    )


def _stopped(driver, stop: signal.Signals, db: Path, finished: int, cli_process) -> str:
    """Send `stop` to the driver alone (as the issue's reproduction did) once `finished` trials have finished and the
    next is mid-training (it has recorded an epoch in this launch); return the driver's output. Checks, beside:
    every listening socket of the driver and its descendants was on loopback, and the exit is an interruption."""
    cli_process.wait_for(
        driver,
        lambda: _runs(db).count(("trial", "FINISHED", "finished")) >= finished and _training(db),
        timeout=600,
        what=f"{finished} trial(s) finished and the next mid-training (the study's interruption point)",
    )
    listening = _listening(driver.pid)
    os.kill(driver.pid, stop)
    out, _ = driver.communicate(timeout=300)
    # A local study's Ray (GCS, raylet, workers, agents, dashboard) and its driver listen on loopback only.
    assert listening and all(ipaddress.ip_address(ip.removeprefix("::ffff:")).is_loopback for ip, _ in listening), (
        listening
    )
    assert driver.returncode == EXIT_INTERRUPTED, out[-3000:]
    assert "INCOMPLETE" in out and "resume study.yaml" in out
    return out


def _incomplete_and_resumable(db: Path, optuna_db: Path, tmp_path: Path, cli_process) -> None:
    """What an interrupted launch must leave: its study and cell runs KILLED, nothing RUNNING, each trial finished or
    interrupted (one at least) with the reason, Optuna's cut trial FAIL, and `status` saying so."""
    from trainables.metrics import EPOCH_METRICS

    runs = _runs(db)
    assert ("study", "KILLED", None) in runs and ("cell", "KILLED", None) in runs, runs
    trial_status = [(st, tag) for kind, st, tag in runs if kind == "trial"]
    assert all(st != "RUNNING" for _, st, _ in runs), runs
    assert set(trial_status) <= {("FINISHED", "finished"), ("KILLED", "interrupted")}, trial_status
    assert ("KILLED", "interrupted") in trial_status
    # The cut trial's reason says what cut it: the study has no scheduler (issue 24).
    reasons = _sql(
        db,
        "select r.value from tags r join tags s on s.run_uuid = r.run_uuid and s.key = 'sharpscale.status' "
        "and s.value = 'interrupted' where r.key = 'sharpscale.reason'",
    )
    assert reasons and all("interrupted" in r and "scheduler" not in r for (r,) in reasons), reasons
    states = [s for (s,) in _sql(optuna_db, "select state from trials")]
    assert "RUNNING" not in states and "FAIL" in states, states
    keys = {
        k
        for (k,) in _sql(
            db,
            "select distinct m.key from metrics m join tags s on s.run_uuid = m.run_uuid "
            "and s.key = 'sharpscale.status' and s.value = 'finished'",
        )
    }
    assert set(EPOCH_METRICS) <= keys, set(EPOCH_METRICS) - keys  # the objective's names are the loop's
    status = cli_process.run("status", "study.yaml", cwd=tmp_path, timeout=300)
    assert "INTERRUPTED" in status.stdout and "interrupted" in status.stdout, status.stdout + status.stderr


@pytest.mark.timeout(1500)
def test_ctrl_c_and_sigterm_leave_an_incomplete_resumable_study(tmp_path, tiny_model, new_mlflow_store, cli_process):
    """Ctrl-C (SIGINT) stops the first launch mid-training, SIGTERM (a scheduler's stop, `kill`) stops its resume
    mid-training; each leaves the study incomplete and resumable, and the second resume ends it. One study carries
    both stops (four trials, one at a time): each stop is checked as it was when each had a study of its own."""
    study = _ctrl_c_study(tiny_model)
    study["budget"] = {**study["budget"], "trials_per_cell": 4}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
    db = tmp_path / "mlflow.db"
    new_mlflow_store(db)  # the study's own ./mlflow.db, its schema already made: the test is about the stops
    optuna_db = tmp_path / "runs" / "ctrlc.optuna.db"
    driver = cli_process.start("run", "study.yaml", "--num-cpus", "2", cwd=tmp_path)
    _stopped(driver, signal.SIGINT, db, 1, cli_process)  # as Ctrl-C in the terminal delivers it, to the driver
    _incomplete_and_resumable(db, optuna_db, tmp_path, cli_process)

    resumed = cli_process.start("resume", "study.yaml", "--num-cpus", "2", cwd=tmp_path)
    _stopped(resumed, signal.SIGTERM, db, 2, cli_process)  # the cut trial finished in this launch, the next cut
    _incomplete_and_resumable(db, optuna_db, tmp_path, cli_process)

    resumed = cli_process.run("resume", "study.yaml", "--num-cpus", "2", cwd=tmp_path, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    runs = _runs(db)
    assert [r for r in runs if r[0] == "trial"] == [("trial", "FINISHED", "finished")] * 4, runs
    assert ("study", "FINISHED", None) in runs
    states = [s for (s,) in _sql(optuna_db, "select state from trials")]
    assert states.count("COMPLETE") == 4 and "RUNNING" not in states, states
    # Nothing outside what the study file names: its MLflow store (and its lock), artifacts and storage.
    assert {p.name for p in tmp_path.iterdir()} <= {"study.yaml", "mlflow.db", "mlflow.db.lock", "mlartifacts", "runs"}


def test_a_failure_after_the_runs_exist_closes_them_and_names_its_cause(
    ray_cluster, tmp_path, tiny_model, tracking_uri
):
    # The Optuna storage is opened after the study and cell runs are created: its failure must close them.
    from mlflow.tracking import MlflowClient

    from studies.runner import run_study

    study = {
        **_ctrl_c_study(tiny_model),
        "name": "closes",
        "optuna_storage": "mysql://user@127.0.0.1:1/optuna",
        "tracking": {"artifact_location": str(tmp_path / "mlartifacts")},
        "storage": str(tmp_path / "runs"),
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    uri = tracking_uri
    with pytest.raises(UserError, match="database driver is not installed") as err:
        run_study(path, tracking_uri=uri)
    assert not getattr(err.value, "__notes__", None)  # closing went fine: nothing added to the one cause
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("closes").experiment_id])
    assert sorted((r.data.tags["sharpscale.kind"], r.info.status) for r in runs) == [
        ("cell", "FAILED"),
        ("study", "FAILED"),
    ]
    assert ray_cluster.is_initialized()  # a cluster the caller started is the caller's to shut down


@pytest.mark.parametrize(
    "raised, status, says",
    [
        (KeyboardInterrupt(), EXIT_INTERRUPTED, "INCOMPLETE"),
        (OSError(28, "No space left on device"), 1, "No space left on device"),
    ],
    ids=["ctrl-c-before-the-trials", "disk-full"],
)
def test_main_turns_an_interruption_or_a_machine_error_into_one_line(
    raised, status, says, tmp_path, monkeypatch, capsys
):
    from studies.cli.study import Run

    def fail(self, args):
        raise raised

    monkeypatch.setattr(Run, "take_action", fail)  # main calls the parsed command's method when it runs
    study = _write(tmp_path, None)
    assert main(["run", str(study), "--storage", str(tmp_path / "runs")]) == status
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and len(err.splitlines()) <= 3
    if status == EXIT_INTERRUPTED:
        assert f"resume {study} --storage {tmp_path / 'runs'}" in err


@pytest.mark.parametrize(
    "node_types, outcome",
    [
        ({"head": {"resources": {"CPU": 0}}, "big": {"resources": {"CPU": 64}}}, "fits"),
        ({"head": {"resources": {"CPU": 0}}, "small": {"resources": {"CPU": 8}}}, "refused"),
        ({"head": {"resources": {"CPU": 0}}, "detected": {"node_config": {"InstanceType": "m6i.16xlarge"}}}, "warned"),
        (None, "warned"),
    ],
    ids=["a-node-type-fits", "no-node-type-fits", "types-unknown", "no-launcher-config"],
)
def test_a_trial_no_node_of_a_cluster_can_host(node_types, outcome, ray_cluster, tmp_path, capsys):
    from studies.preflight import check_cluster_resources
    from studies.spec import StudyError, load_study

    study = load_study(_write(tmp_path, _edit(("cpus_per_trial: 1", "cpus_per_trial: 64"))), require_data=False)
    config = tmp_path / "ray_bootstrap_config.yaml"
    if node_types is not None:
        config.write_text(yaml.safe_dump({"available_node_types": node_types}))
    if outcome == "refused":
        with pytest.raises(StudyError, match=r"resources.cpus_per_trial: each trial \(each worker\) asks CPU=64"):
            check_cluster_resources(study, autoscaler_config=config)
        return
    check_cluster_resources(study, autoscaler_config=config)
    warned = "warning: resources.cpus_per_trial" in capsys.readouterr().out
    assert warned == (outcome == "warned")


@pytest.fixture
def small_disk(tmp_path):
    """A file system of its own (a 64 MiB tmpfs) that the test fills for real: a full disk, without touching /tmp."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs a file system of the test's own: mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode()[:200]}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(disk: Path) -> Path:
    """Write one file until the disk refuses (ENOSPC), down to its last page."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for chunk in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    with pytest.raises(OSError) as full:
        (disk / "probe").write_bytes(b"\0" * 4096)
    assert full.value.errno == errno.ENOSPC
    return filler


def _terminal_line_kind(line: str) -> str | None:
    """Which of the lines a stopped run may print this is, or None for anything else (a traceback, a log line)."""
    for kind, start in (
        ("ray", "sharpscale: running study.yaml: starting Ray"),
        ("header", "sharpscale: study 'fulldisk':"),
        ("live", "["),
        ("interrupted", "sharpscale: interrupted: stopping the trials"),
        ("error", "sharpscale: error: no space left on"),
        ("closing", "  (while closing the study's runs afterwards:"),
    ):
        if line.startswith(start):
            return kind
    return None


@pytest.mark.timeout(900)
@pytest.mark.parametrize("optuna_on_disk", [False, True], ids=["tune-storage-full", "tune-and-optuna-storage-full"])
def test_a_full_disk_stops_the_study_in_one_line_with_every_status_true(
    optuna_on_disk, small_disk, tmp_path, tiny_model, new_mlflow_store, cli_process
):
    """A full disk gave 579 lines of tracebacks, Tune's retries of a trial that could not succeed, and an Optuna
    trial RUNNING (issue 24). Now: the trial that met it fails once, the study stops, every run and (where its store
    can still write) every Optuna trial says so, one line names the disk and the fix, exit 1; freed, `resume` ends
    the study."""
    study = _ctrl_c_study(tiny_model)
    study["name"] = "fulldisk"
    study["storage"] = str(small_disk / "runs")
    optuna_db = small_disk / "runs" / "fulldisk.optuna.db"
    if not optuna_on_disk:
        optuna_db = tmp_path / "optuna.db"
        study["optuna_storage"] = f"sqlite:///{optuna_db}"
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
    db = tmp_path / "mlflow.db"
    new_mlflow_store(db)
    driver = cli_process.start("run", "study.yaml", "--num-cpus", "2", cwd=tmp_path)
    cli_process.wait_for(driver, lambda: _training(db), timeout=600, what="a trial mid-training (when the disk fills)")
    filler = _fill(small_disk)
    out, _ = driver.communicate(timeout=600)
    assert driver.returncode == 1, out[-3000:]
    assert "Traceback" not in out and "Logging error" not in out, out[-3000:]
    (line,) = [line for line in out.splitlines() if line.startswith("sharpscale: error:")]
    assert f"no space left on {small_disk / 'runs'} (the study's storage" in line, line
    assert "Fix: free space on that disk, then `sharpscale resume" in line, line
    # What the terminal shows, line by line: the two header lines (Ray starting, the study), the live view's lines
    # (each a progress line; how many depends on when the disk filled), at most one "interrupted" line, the error and
    # at most one continuation naming what else failed while closing. Nothing else, and no line twice over.
    kinds = [_terminal_line_kind(line) for line in out.splitlines()]
    assert None not in kinds, out
    assert kinds[:2] == ["ray", "header"] and kinds.count("error") == 1, out
    assert kinds.count("live") <= 4 and kinds.count("interrupted") <= 1 and kinds.count("closing") <= 1, out
    runs = _runs(db)
    assert runs and all(st != "RUNNING" for _, st, _ in runs), runs
    assert ("study", "FAILED", None) in runs, runs
    # Each trial's record says what happened to it, one outcome per kind: the trial that met the disk ended itself
    # (Tune holds it ended, resume does not run it again): failed, naming the disk; the ones the stop cut short are
    # interrupted (resume continues them); the rest finished before it.
    trials = _sql(
        db,
        "select r.status, s.value, coalesce(w.value, '') from runs r "
        "join tags k on k.run_uuid = r.run_uuid and k.key = 'sharpscale.kind' and k.value = 'trial' "
        "left join tags s on s.run_uuid = r.run_uuid and s.key = 'sharpscale.status' "
        "left join tags w on w.run_uuid = r.run_uuid and w.key = 'sharpscale.reason' where r.lifecycle_stage = 'active'",
    )
    met = [t for t in trials if t[2].startswith(NO_SPACE_REASON)]
    if met or not optuna_on_disk:
        assert met and all(t[:2] == ("FAILED", "failed") for t in met), trials
        assert "it stays failed (`resume` does not run it again)" in line, line
    else:
        # With the Optuna database on the same disk, the driver's next Optuna write (another trial's report, a new
        # trial's ask) can meet the disk before the running trial's next checkpoint does (seen once in three suite
        # runs): the searcher's refused write stops the study (runner.NoSpaceStopper), no trial failed, and the one
        # that ran is cut short, resumable.
        assert any(t[:2] == ("KILLED", "interrupted") for t in trials), trials
    for status, tag, reason in set(trials) - set(met):
        assert (status, tag) in {("FINISHED", "finished"), ("KILLED", "interrupted")}, trials
        assert tag == "finished" or reason.startswith("the study stopped on a full disk while this trial ran"), trials
    reasons = _sql(db, "select value from tags where key = 'sharpscale.reason'")
    assert not any("Traceback" in r for (r,) in reasons), reasons  # failed once, on the disk: not a retried crash
    states = [s for (s,) in _sql(optuna_db, "select state from trials")]
    if optuna_on_disk:
        # The Optuna database is on the full disk: it cannot record the trial's end, and the line says so.
        assert f"the Optuna storage sqlite:///{optuna_db} could not record" in line, line
    else:
        assert states and "RUNNING" not in states and "FAIL" in states, states
        return

    # What resume must do follows from the state Tune's last snapshot left on the full disk: cut short, resume
    # refuses it (it would start the trials over); whole, resume continues the study to its end. The refusal of a
    # cut state is also pinned without Ray, deterministically (test_hardening's resume test of Tune's state).
    [experiment_dir] = [p for p in (small_disk / "runs").iterdir() if p.is_dir() and p.name.startswith("fulldisk")]
    newest = max(experiment_dir.glob("experiment_state-*.json"))
    try:
        json.loads(newest.read_text())
        cut = False
    except ValueError:
        cut = True
    os.remove(filler)  # space again
    resumed = cli_process.run("resume", "study.yaml", "--num-cpus", "2", cwd=tmp_path, timeout=600)
    states = [s for (s,) in _sql(optuna_db, "select state from trials")]
    if cut:
        assert resumed.returncode == EXIT_USAGE, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        assert "is cut short (written while its disk was full?)" in resumed.stderr, resumed.stderr[-3000:]
        assert "sharpscale run --new-launch" in resumed.stderr
    else:
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        assert "RUNNING" not in states and states.count("COMPLETE") >= 2, states
        trials = [st for kind, st, _ in _runs(db) if kind == "trial"]
        assert len(trials) == 3, trials  # each of the study's trials recorded once
    assert all(st != "RUNNING" for _, st, _ in _runs(db))
