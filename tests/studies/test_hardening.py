"""Issue 24's hostile cases: a launch claimed once, `resume` of the one launch a file ran, no secret shown or stored,
no code read back from storage, a dashboard that answers only this machine's names and changes nothing.

Each runs on a real MLflow SQLite store and real Optuna storage; what `run` records before Ray starts is made by
the runner's own functions, so these need no Ray cluster.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import os
import pickle
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from studies import identity
from studies.cli import EXIT_USAGE, main
from studies.launch import INTERRUPTED_REASON, Launch, choose_launch, experiment, parent_runs, resume_target
from studies.runner import run_study, state_locations
from studies.search import CellSearcher
from studies.spec import StudyError, load_study
from trainables.errors import UserError, shown
from trainables.naming import OPTUNA_STORAGE_TAG, REASON_TAG, launch_name
from trainables.secrets import redact
from trainables.tracking import tracking_client

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = (REPO / "studies" / "quickstart.yaml").read_text()
RHO = "rho: {type: loguniform, low: 0.005, high: 0.5}"
SECRET = "hunter2"


def _study_file(where: Path, text: str = QUICKSTART) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    path = where / "study.yaml"
    path.write_text(text)
    return path


def _record_launch(path: Path, uri: str, *, new_launch: bool = False) -> tuple[str, int]:
    """What `sharpscale run` records before any trial: the claimed launch, the study and cell runs (left KILLED, as
    after Ctrl-C), the launch record in its Tune experiment folder. Returns (study run id, launch)."""
    study = load_study(path, require_data=False)
    client = tracking_client(uri)
    exp_id = experiment(client, study.experiment_name, path.parent / "mlartifacts", uri)
    launch = choose_launch(client, exp_id, study, study.experiment_name, uri, new_launch=new_launch)
    run_name = launch_name(study.experiment_name, launch)
    locations = state_locations(study, run_name)
    opened: list[str] = []
    run_id = parent_runs(client, study, exp_id, "abc", None, locations.tags(), launch, opened, {})
    identity.write_launch_record(
        f"{locations.storage}/{run_name}", identity.launch_record(study, uri, exp_id, run_id, launch)
    )
    for rid in opened:
        client.set_terminated(rid, status="KILLED")
    return run_id, launch


# --- 1. Launches are claimed atomically -------------------------------------------------------------------------


def _claim(path: str, uri: str, new_launch: bool, barrier, out) -> None:
    study = load_study(path, require_data=False)
    client = tracking_client(uri)
    exp_id = experiment(client, study.experiment_name, Path(path).parent / "mlartifacts", uri)
    barrier.wait(timeout=120)  # both processes are imported and connected: now both choose at once
    try:
        out.put(choose_launch(client, exp_id, study, study.experiment_name, uri, new_launch=new_launch))
    except StudyError as err:
        out.put(str(err))


@pytest.mark.parametrize("new_launch", [False, True], ids=["run", "run-new-launch"])
def test_two_runs_started_together_never_share_a_launch(new_launch, tmp_path, tracking_uri):
    path = _study_file(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(str(path), tracking_uri, new_launch, barrier, out)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    if new_launch:
        assert sorted(got) == [1, 2]
    else:
        assert 1 in got, got
        (refusal,) = [g for g in got if g != 1]
        assert "was claimed by another `sharpscale run`" in refusal and "--new-launch" in refusal


# --- 2. `resume` continues only the launch this file ran, in the store it ran into -------------------------------


def test_resume_refuses_an_edited_study_file_and_says_what_changed(tmp_path, tracking_uri):
    path = _study_file(tmp_path / "study")
    _record_launch(path, tracking_uri)
    path.write_text(QUICKSTART.replace(RHO, "rho: {type: loguniform, low: 0.2, high: 0.5}"))
    with pytest.raises(StudyError) as err:
        run_study(path, tracking_uri=tracking_uri, resume=True)
    text = str(err.value)
    assert "not the one launch 1 ran" in text and "low: 0.005" in text and "low: 0.2" in text
    assert "restore the file" in text and f"sharpscale run --new-launch {path}" in text
    runs = tracking_client(tracking_uri).search_runs(
        [tracking_client(tracking_uri).get_experiment_by_name("quickstart").experiment_id],
        filter_string="tags.`sharpscale.kind` = 'study'",
    )
    assert len(runs) == 1  # no second "launch 1" study run holding the edited file


def test_resume_from_another_directory_finds_the_recorded_store(tmp_path, new_mlflow_store, monkeypatch, capsys):
    path = _study_file(tmp_path / "study")
    started_in = tmp_path / "a"
    uri = new_mlflow_store(started_in / "mlflow.db")  # the study file's relative sqlite:///mlflow.db, from a/
    run_id, _ = _record_launch(path, uri)
    elsewhere = tmp_path / "b"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    study = load_study(path, require_data=False)
    found_uri, _, _, previous = resume_target(study, f"sqlite:///{elsewhere / 'mlflow.db'}", explicit=False)
    assert found_uri == uri and previous.info.run_id == run_id
    assert "was recorded at" in capsys.readouterr().out
    assert not (elsewhere / "mlflow.db").exists()  # no new, empty store

    # Named explicitly, a store holding none of it is refused, pointing at the recorded one; nothing is created.
    other = f"sqlite:///{tmp_path / 'c' / 'mlflow.db'}"
    with pytest.raises(StudyError, match=rf"holds no launch.*recorded at {uri}.*--tracking-uri {uri}"):
        resume_target(study, other, explicit=True)
    assert not (tmp_path / "c").exists()


def test_resume_refuses_a_tune_experiment_of_another_launch(tmp_path, new_mlflow_store):
    path = _study_file(tmp_path / "study")
    first = new_mlflow_store(tmp_path / "a" / "mlflow.db")
    _record_launch(path, first)
    # A second store, the same file and Ray storage: its launch 1 would share the first one's Tune experiment.
    second = new_mlflow_store(tmp_path / "b" / "mlflow.db")
    study = load_study(path, require_data=False)
    with pytest.raises(
        StudyError, match=rf"already holds launch 1 of this study, recorded in the MLflow store {first}"
    ):
        identity.check_fresh_experiment_dir(study, f"{study.storage}/quickstart", second)
    record = identity.launch_record(study, second, "9", "another-run", 1)
    with pytest.raises(StudyError, match=r"belongs to another launch.*study_run_id"):
        identity.check_launch_record(study, f"{study.storage}/quickstart", record)


def test_an_optuna_study_of_another_launch_is_not_searched_on(tmp_path):
    storage = f"sqlite:///{tmp_path / 'o.db'}"
    study = load_study(_study_file(tmp_path), require_data=False)
    kwargs = dict(metric="val_acc", mode="max", sampler="random", seed=0, storage_url=storage, study_name="s")
    CellSearcher(list(study.cells), payload=_payload, owner="run-a", **kwargs)
    CellSearcher(list(study.cells), payload=_payload, owner="run-a", **kwargs)  # its own launch: reopened
    with pytest.raises(UserError, match="belongs to another launch"):
        CellSearcher(list(study.cells), payload=_payload, owner="run-b", **kwargs)


def _payload(cell, sample):
    return {"cell": cell.key, **sample}


# --- 3. Secrets are refused at the door and never echoed ---------------------------------------------------------

SECRET_CASES = [
    ("optuna-storage", ["--set", f"optuna_storage=postgresql://bob:{SECRET}@db:5432/optuna"], "PGPASSWORD"),
    ("tracking-uri-flag", ["--tracking-uri", f"http://bob:{SECRET}@127.0.0.1:5000"], "MLFLOW_TRACKING_PASSWORD"),
    ("tracking-uri-set", ["--set", f"tracking.uri=http://bob:{SECRET}@127.0.0.1:5000"], "MLFLOW_TRACKING_PASSWORD"),
    ("storage", ["--storage", f"s3://key:{SECRET}@bucket/runs"], "credentials file"),
]


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("extra, fix", [c[1:] for c in SECRET_CASES], ids=[c[0] for c in SECRET_CASES])
def test_a_uri_with_a_password_is_refused_without_showing_it(command, extra, fix, tmp_path, monkeypatch, capsys):
    if command == "validate" and extra[0] == "--tracking-uri":
        pytest.skip("validate takes no --tracking-uri")
    monkeypatch.chdir(tmp_path)
    path = _study_file(tmp_path)
    assert main([command, str(path), *extra]) == EXIT_USAGE
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err
    assert "carries a password" in out.err and fix in out.err and "***" in out.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]  # nothing created, nothing recorded


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "--tracking-uri", f"http://bob:{SECRET}@127.0.0.1:5000", "DEST"],
        ["ui", "--tracking-uri", f"http://bob:{SECRET}@127.0.0.1:5000"],
        ["dashboard", "STUDY", "--tracking-uri", f"http://bob:{SECRET}@127.0.0.1:5000"],
    ],
    ids=["export", "ui", "dashboard"],
)
def test_the_store_commands_refuse_a_password_uri_without_showing_it(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = _study_file(tmp_path)
    argv = [str(tmp_path / "copy") if a == "DEST" else str(path) if a == "STUDY" else a for a in argv]
    assert main(argv) == EXIT_USAGE
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err
    assert "carries a password" in out.err and "MLFLOW_TRACKING_PASSWORD" in out.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]


def test_one_redaction_hides_every_password_and_only_passwords():
    text = f"postgresql://u:{SECRET}@db/x http://a:b@c@h:5000/p s3://bucket/k sqlite:////tmp/m.db http://h:5000"
    assert (
        redact(text) == "postgresql://u:***@db/x http://a:***@h:5000/p s3://bucket/k sqlite:////tmp/m.db http://h:5000"
    )
    assert SECRET not in shown({"optuna_storage": f"mysql://u:{SECRET}@h/db"})


# --- 4. Nothing read back from storage runs code -----------------------------------------------------------------


class _Planted:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['PLANTED_MARKER']}",))


def test_a_planted_searcher_state_is_refused_not_unpickled(tmp_path, monkeypatch):
    marker = tmp_path / "code-ran"
    monkeypatch.setenv("PLANTED_MARKER", str(marker))
    study = load_study(_study_file(tmp_path), require_data=False)
    kwargs = dict(metric="val_acc", mode="max", sampler="random", seed=0, study_name="s", payload=_payload)
    searcher = CellSearcher(list(study.cells), storage_url=f"sqlite:///{tmp_path / 'o.db'}", **kwargs)
    for n in range(len(study.cells)):
        searcher.suggest(f"t{n}")
    saved = tmp_path / "searcher-state-2026.pkl"
    searcher.save(str(saved))
    state = json.loads(saved.read_text())  # data, readable by anyone
    assert state["live"] == searcher._live != {} and sum(state["issued"].values()) == len(study.cells)
    restored = pickle.loads(pickle.dumps(searcher))
    restored.restore(str(saved))
    assert (restored._live, restored._issued, restored._trial_cell) == (
        searcher._live,
        searcher._issued,
        searcher._trial_cell,
    )

    saved.write_bytes(pickle.dumps({"issued": _Planted()}))
    with pytest.raises(UserError, match="never unpickled"):
        pickle.loads(pickle.dumps(searcher)).restore(str(saved))
    assert not marker.exists()
    saved.write_text(json.dumps({**state, "issued": {"no such cell": 1}}))
    with pytest.raises(UserError, match="not the state of this study's searcher"):
        pickle.loads(pickle.dumps(searcher)).restore(str(saved))


# --- 5. The dashboard answers only this machine's names and changes nothing by default ---------------------------


def _request(port: int, method: str, target: str, host: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, target, headers={"Host": host})
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.timeout(300)
def test_dashboard_refuses_foreign_hosts_and_writes(tmp_path, tracking_uri, cli_process):
    from studies.server import free_port

    path = _study_file(tmp_path / "study")
    _record_launch(path, tracking_uri)
    client = tracking_client(tracking_uri)
    (run,) = client.search_runs(
        [client.get_experiment_by_name("quickstart").experiment_id], "tags.`sharpscale.kind` = 'study'"
    )
    storage = run.data.tags[OPTUNA_STORAGE_TAG]
    Path(storage[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    optuna.create_study(storage=storage, study_name="quickstart:sam")
    port = free_port()
    proc = cli_process.start("dashboard", path, "--tracking-uri", tracking_uri, "--port", port, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 240
        while True:  # until it answers: it imports optuna-dashboard first
            assert proc.poll() is None, proc.stdout.read()
            try:
                status = _request(port, "GET", "/api/studies", f"127.0.0.1:{port}")
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert status == 200
        assert _request(port, "GET", "/api/studies", "evil.example.com") == 403  # a DNS-rebinding page's request
        assert _request(port, "DELETE", "/api/studies/1", f"localhost:{port}") == 405
        assert optuna.get_all_study_names(storage) == ["quickstart:sam"]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


# --- 6. A store that cannot be used is named in one line, at once -------------------------------------------------


def test_status_over_a_store_nothing_can_use(tmp_path, tracking_uri, monkeypatch, capsys):
    from trainables import tracking

    path = _study_file(tmp_path / "study")
    db = Path(tracking_uri[len("sqlite:///") :])

    # An http store where nothing listens: refused at once, not after minutes of silent retries.
    from studies.server import free_port

    assert main(["status", str(path), "--tracking-uri", f"http://127.0.0.1:{free_port()}"]) == EXIT_USAGE
    assert "nothing answers at http://127.0.0.1:" in capsys.readouterr().err

    # A store whose creation lock another process holds: a read-only command says so instead of hanging.
    monkeypatch.setattr(tracking, "STORE_LOCK_WAIT_S", 1.0)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sys; from filelock import FileLock; lock = FileLock({str(db) + '.lock'!r}); lock.acquire(); "
            f"print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["status", str(path), "--tracking-uri", tracking_uri]) == EXIT_USAGE
        assert f"the MLflow store {db} is locked" in capsys.readouterr().err
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)

    # A truncated store: named, with the fix, no traceback.
    db.write_bytes(db.read_bytes()[:8192])
    assert main(["status", str(path), "--tracking-uri", tracking_uri]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{db} is not a readable SQLite database" in err and "Traceback" not in err


@pytest.mark.parametrize("failure", [KeyboardInterrupt, RuntimeError], ids=["ctrl-c", "exception"])
def test_a_failure_while_printing_the_summary_is_one_line_and_not_zero(failure, tmp_path, monkeypatch, capsys):
    from studies import runner
    from studies.cli import EXIT_ERRORS, EXIT_INTERRUPTED
    from studies.cli import summary as printed

    # The study itself ended and closed its runs (run_study returned); only the summary after it fails.
    monkeypatch.setattr(runner, "run_study", lambda *a, **k: runner.StudyOutcome("1", "r", "sqlite:///x", 3, 0))

    def summary(*args):
        raise failure("boom")

    monkeypatch.setattr(printed, "print_summary", summary)
    rc = main(["run", str(_study_file(tmp_path))])
    assert rc == (EXIT_INTERRUPTED if failure is KeyboardInterrupt else EXIT_ERRORS)
    err = capsys.readouterr().err
    assert "runs are recorded and closed (3 trials); printing its summary" in err and "Traceback" not in err
    assert "INCOMPLETE" not in err  # the study is complete: only its printout was cut


def test_a_study_path_that_is_a_symlink_loop_or_a_proc_file(tmp_path, capsys):
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    assert main(["validate", str(tmp_path / "a.yaml")]) == EXIT_USAGE
    assert "a symbolic link that leads back to itself" in capsys.readouterr().err
    assert main(["validate", "/proc/self/status"]) == EXIT_USAGE
    assert "is a system file (under /proc)" in capsys.readouterr().err


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_study_where_no_trial_ran_is_failed_not_finished(ray_cluster, tmp_path, tracking_uri, tiny_study):
    path = tiny_study(
        tmp_path, "notime", budget={"trials_per_cell": 2, "sampler": "random", "seed": 0, "time_limit_s": 1e-9}
    )
    outcome = run_study(path, tracking_uri=tracking_uri)
    assert outcome.nothing_ran
    client = tracking_client(tracking_uri)
    assert client.get_run(outcome.study_run_id).info.status == "FAILED"
    exp = client.get_experiment_by_name("notime").experiment_id
    assert not client.search_runs([exp], "attributes.status = 'RUNNING'")
    # No trial cut here was interrupted by Ctrl-C: none may carry that reason (it would send the user to look for
    # a signal that never came).
    assert all(r.data.tags.get(REASON_TAG) != INTERRUPTED_REASON for r in client.search_runs([exp], max_results=1000))
    states = [
        t.state.name
        for s in optuna.get_all_study_names(f"sqlite:///{tmp_path / 'runs' / 'notime.optuna.db'}")
        for t in optuna.load_study(study_name=s, storage=f"sqlite:///{tmp_path / 'runs' / 'notime.optuna.db'}").trials
    ]
    assert "RUNNING" not in states, states


def test_sigterm_anywhere_in_a_study_is_an_interrupt_and_the_handler_is_put_back():
    # Outside Tune's fit (set-up, the closing roll-ups) a SIGTERM used to kill the process with runs open.
    from studies.runner import _sigterm_interrupts

    before = signal.getsignal(signal.SIGTERM)

    @_sigterm_interrupts
    def study():
        signal.raise_signal(signal.SIGTERM)
        return "finished"

    with pytest.raises(KeyboardInterrupt):
        study()
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("host, warned", [("0.0.0.0", True), ("192.168.1.7", True), ("127.0.0.1", False)])
def test_ui_off_loopback_warns_that_the_network_reaches_it_without_a_login(host, warned, tmp_path, capsys):
    """`ui --host 0.0.0.0` said nothing (issue 24): one line now, as `dashboard` says; said before the store is read,
    so a store that is missing still shows it (and no server starts)."""
    from studies.server import free_port

    missing = f"sqlite:///{tmp_path / 'none' / 'mlflow.db'}"
    code = main(["ui", "--host", host, "--port", str(free_port()), "--tracking-uri", missing])
    assert code != 0  # the missing store, after the warning
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("WARNING")]
    if warned:
        assert len(lines) == 1, err
        assert f"listens on {host}:" in lines[0] and "no login" in lines[0] and "127.0.0.1" in lines[0]
    else:
        assert not lines, err


@pytest.mark.parametrize(
    "edit, where",
    [
        (
            ("  method:\n", "  frac:\n    tiny: {data.fraction: 1.0e-9}\n    half: {data.fraction: 0.5}\n  method:\n"),
            "cell vit/tiny/adamw",  # the cell's one name (trainables.naming.cell_name)
        ),
        (
            ("search:\n", "search:\n  data.fraction: {type: loguniform, low: 1.0e-9, high: 0.5}\n"),
            "search.data.fraction",
        ),
    ],
)
def test_a_fraction_under_one_sample_in_a_factor_or_a_search_range_is_refused_at_load(edit, where, tmp_path):
    """`fraction: 1e-9` validated, then failed in every trial with Tune's 3 retries (issue 24)."""
    assert edit[0] in QUICKSTART
    path = _study_file(tmp_path, QUICKSTART.replace(edit[0], edit[1], 1))
    with pytest.raises(StudyError) as err:
        load_study(path, require_data=False)
    text = str(err.value)
    assert where in text and "data.fraction: must keep at least one" in text and "Fix:" in text, text


@pytest.mark.parametrize(
    "old, new, field, name",
    [
        ("  method:\n", "  méthode🔥:\n", "factors.'méthode🔥'", "méthode🔥"),
        (
            "    sam:   {optimizer.method: sam}",
            '    "sam🚀": {optimizer.method: sam}',
            "factors.method.'sam🚀'",
            "sam🚀",
        ),
        ("    vit:    {", "    vït:    {", "factors.arch.'vït'", "vït"),
    ],
    ids=["emoji-factor", "emoji-level", "accented-level"],
)
def test_a_non_ascii_factor_or_level_name_is_refused_at_load(old, new, field, name, tmp_path):
    """An emoji factor name validated, then left a cell run RUNNING forever (issue 24)."""
    assert old in QUICKSTART
    path = _study_file(tmp_path, QUICKSTART.replace(old, new, 1))
    with pytest.raises(StudyError) as err:
        load_study(path, require_data=False)
    text = str(err.value)
    assert f"{field}: a " in text and "must be printable ASCII" in text and shown(name) in text, text
    assert "Fix: rename it, e.g. '" in text
    fixed = text.split("Fix: rename it, e.g. ")[1].split("'")[1]
    load_study(
        _study_file(tmp_path / "fixed", QUICKSTART.replace(old, new.replace(name, fixed), 1)), require_data=False
    )


@pytest.mark.parametrize("fresh", [True, False], ids=["new-db", "db-with-studies"])
def test_a_locked_optuna_database_is_one_line_with_the_fix(fresh, tmp_path, monkeypatch):
    """Another process holding the Optuna SQLite database gave SQLAlchemy's traceback (issue 24)."""
    import sqlite3

    from studies import search

    db = tmp_path / "o.db"
    storage = f"sqlite:///{db}"
    study = load_study(_study_file(tmp_path), require_data=False)
    kwargs = dict(metric="val_acc", mode="max", sampler="random", seed=0, storage_url=storage, study_name="s")
    if not fresh:
        CellSearcher(list(study.cells), payload=_payload, owner="run-a", **kwargs)
    holder = sqlite3.connect(db, isolation_level=None)  # what another process's open write transaction does
    holder.execute("BEGIN EXCLUSIVE")
    monkeypatch.setattr(search, "SQLITE_BUSY_TIMEOUT_S", 0.2)  # the wait before SQLite gives up, not a race
    try:
        with pytest.raises(UserError) as err:
            CellSearcher(list(study.cells), payload=_payload, owner="run-a", **kwargs)
        text = str(err.value)
        assert text.startswith(f"Optuna storage {storage}: the database is locked by another process"), text
        assert "Fix: wait for that process to end" in text and "--storage" in text and "\n" not in text
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    CellSearcher(list(study.cells), payload=_payload, owner="run-a", **kwargs)  # free again: it opens


@pytest.mark.timeout(300)
def test_ray_failing_to_start_leaves_no_experiment_and_no_claimed_launch(tmp_path, tracking_uri, monkeypatch):
    """Ray unable to start left an empty experiment and launch 1 claimed, so the next `run` was refused as a
    concurrent one (issue 24). A real Ray failure: an address whose port Ray cannot parse (fails at once)."""
    path = _study_file(tmp_path / "study")
    monkeypatch.chdir(path.parent)  # the study's relative artifact_location
    client = tracking_client(tracking_uri)
    # In a process of its own: this one may hold the session's Ray connection, which a study would use instead.
    failed = subprocess.run(
        [sys.executable, "-m", "studies.cli", "run", str(path), "--address", "127.0.0.1:notaport"]
        + ["--tracking-uri", tracking_uri],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=path.parent,
    )
    assert failed.returncode == EXIT_USAGE, failed.stderr[-2000:]
    assert "ray: could not reach the Ray cluster at 127.0.0.1:notaport" in failed.stderr, failed.stderr[-2000:]
    exp = client.get_experiment_by_name("quickstart")
    assert exp is None or exp.lifecycle_stage == "deleted"
    assert [e.name for e in client.search_experiments()] == ["Default"]  # active ones: no claim, no quickstart
    _, launch = _record_launch(path, tracking_uri)  # the next run takes launch 1, as if nothing had happened
    assert launch == 1
    assert client.get_experiment_by_name("quickstart").lifecycle_stage == "active"


# `sharpscale ARGS` as its entry point runs it, then the heavy modules it imported by its end.
_MAIN_THEN_IMPORTED = (
    "import sys\nfrom studies.cli import main\nstatus = main(sys.argv[1:])\n"
    "print('IMPORTED', sorted(m for m in ('torch', 'timm') if m in sys.modules))\nsys.exit(status)\n"
)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("form", ["{}", "ray://{}"], ids=["gcs", "ray-client"])
def test_a_dead_address_is_refused_at_once_and_leaves_nothing(form, tmp_path, tracking_uri):
    """`run --address` where nothing listens waited minutes on Ray's own retries (issue 24): one line now, before
    any experiment, launch claim or storage folder is made, and before the models are built (which imports torch
    and timm, seconds)."""
    from studies.server import free_port

    path = _study_file(tmp_path / "study")
    address = form.format(f"127.0.0.1:{free_port()}")
    failed = subprocess.run(
        [sys.executable, "-c", _MAIN_THEN_IMPORTED, "run", str(path), "--address", address]
        + ["--tracking-uri", tracking_uri],
        capture_output=True,
        text=True,
        timeout=120,  # Ray's own retries take longer: the old code fails here
        cwd=path.parent,
    )
    assert failed.returncode == EXIT_USAGE, failed.stderr[-2000:]
    (line,) = [line for line in failed.stderr.splitlines() if "--address" in line]
    assert f"--address {address}: nothing answers at 127.0.0.1:" in line and "Fix: start the cluster" in line, line
    assert "Traceback" not in failed.stderr
    assert "IMPORTED []" in failed.stdout, failed.stdout[-2000:]
    assert [e.name for e in tracking_client(tracking_uri).search_experiments()] == ["Default"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["study.yaml"]


# --- model.kwargs.checkpoint_path: only inside model.checkpoint_roots, read as weights only -----------------------


def _model(tiny_model, **extra) -> dict:
    model = tiny_model("mixer")
    kwargs = {**model["kwargs"], **extra.pop("kwargs", {})}
    return {**model, "kwargs": kwargs, **extra}


def _build(model: dict):
    from trainables.config import TrialConfig
    from trainables.models import create_model

    cfg = TrialConfig.load({"model": model})
    return create_model(cfg.model, num_classes=10, in_chans=3, img_size=16)


def test_a_checkpoint_inside_the_allowed_roots_loads_as_weights(tmp_path, tiny_model):
    import torch

    roots = tmp_path / "weights"
    roots.mkdir()
    source = _build(_model(tiny_model))
    torch.save({"state_dict": source.state_dict()}, roots / "w.pt")
    (roots / "link.pt").symlink_to(roots / "w.pt")  # a link that stays inside is followed
    for name in ("w.pt", "link.pt"):
        loaded = _build(
            _model(tiny_model, kwargs={"checkpoint_path": str(roots / name)}, checkpoint_roots=[str(roots)])
        )
        assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), loaded.state_dict().values()))


@pytest.mark.parametrize("case", ["no-roots", "outside", "link-out", "dotdot", "relative", "relative-root"])
def test_a_checkpoint_outside_the_allowed_roots_is_refused_at_load(case, tmp_path, tiny_model):
    from trainables.config import ConfigError

    roots = tmp_path / "weights"
    roots.mkdir()
    outside = tmp_path / "secret.pt"
    outside.write_bytes(b"x")
    (roots / "link.pt").symlink_to(outside)
    path, allowed = {
        "no-roots": (str(roots / "link.pt"), []),
        "outside": (str(outside), [str(roots)]),
        "link-out": (str(roots / "link.pt"), [str(roots)]),
        "dotdot": (f"{roots}/../secret.pt", [str(roots)]),
        "relative": ("weights/link.pt", [str(roots)]),
        "relative-root": (str(roots / "link.pt"), ["weights"]),
    }[case]
    with pytest.raises(ConfigError) as err:
        _build(_model(tiny_model, kwargs={"checkpoint_path": path}, checkpoint_roots=allowed))
    text = str(err.value)
    field = "model.checkpoint_roots" if case == "relative-root" else "model.kwargs.checkpoint_path"
    assert f"{field}: " in text and "Fix: " in text, text
    if case in ("outside", "link-out", "dotdot"):
        assert f"resolves to {str(outside)!r} (symbolic links followed), outside every folder" in text, text


def test_a_checkpoint_is_checked_again_where_it_loads_and_never_unpickles_code(tmp_path, tiny_model, monkeypatch):
    """A link changed after validation, or a pickle holding code inside the roots: each refused where the trial
    loads it (TrialRefused: failed once), and the planted code never runs."""
    import torch

    from trainables.config import TrialConfig
    from trainables.errors import TrialRefused
    from trainables.models import create_model

    roots = tmp_path / "weights"
    roots.mkdir()
    good = roots / "w.pt"
    torch.save(_build(_model(tiny_model)).state_dict(), good)
    link = roots / "link.pt"
    link.symlink_to(good)
    cfg = TrialConfig.load(
        {"model": _model(tiny_model, kwargs={"checkpoint_path": str(link)}, checkpoint_roots=[str(roots)])}
    )

    outside = tmp_path / "elsewhere.pt"
    torch.save(_build(_model(tiny_model)).state_dict(), outside)
    link.unlink()
    link.symlink_to(outside)  # swapped after the study validated
    with pytest.raises(TrialRefused, match="outside every folder of model.checkpoint_roots"):
        create_model(cfg.model, num_classes=10, in_chans=3, img_size=16)

    marker = tmp_path / "code-ran"
    monkeypatch.setenv("PLANTED_MARKER", str(marker))
    link.unlink()
    link.write_bytes(pickle.dumps(_Planted()))
    with pytest.raises(TrialRefused, match=r"not a plain weights file \(torch.load weights_only=True refused it"):
        create_model(cfg.model, num_classes=10, in_chans=3, img_size=16)
    assert not marker.exists()


def test_a_trained_checkpoint_loads_without_rereading_its_starting_weights(tmp_path, tiny_model):
    """load_model and a resumed trial take their weights from the trained checkpoint: the starting weights file
    (model.kwargs.checkpoint_path) is not read again, so a file overwritten since does not refuse them."""
    import torch

    from trainables.config import TrialConfig
    from trainables.errors import TrialRefused
    from trainables.loop import fit, load_checkpoint, load_model
    from trainables.models import create_model

    roots = tmp_path / "weights"
    roots.mkdir()
    start = roots / "start.pt"
    model = _model(tiny_model, checkpoint_roots=[str(roots)])
    built = create_model(TrialConfig.load({"model": model}).model, num_classes=10, in_chans=1, img_size=16)
    torch.save(built.state_dict(), start)
    link = roots / "link.pt"
    link.symlink_to(start)
    trial = {
        "model": {**model, "kwargs": {**model["kwargs"], "checkpoint_path": str(link)}},
        "data": {"name": "digits", "img_size": 16, "batch_size": 128},
        "optimizer": {"method": "none", "lr": 0.01},
        "schedule": {"epochs": 1, "warmup_epochs": 0},
        "train": {"device": "cpu", "seed": 0},
    }
    fit(trial, checkpoint_dir=tmp_path / "ckpt")
    start.write_bytes(b"overwritten since")  # inside the roots still (the config validates), but no weights now
    cfg = TrialConfig.load({"model": trial["model"]})
    with pytest.raises(TrialRefused, match="not a plain weights file"):
        create_model(cfg.model, num_classes=10, in_chans=1, img_size=16)  # a new trial still checks it
    trained, _ = load_model(tmp_path / "ckpt")  # old code: refused, reading the starting weights it then replaced
    saved = load_checkpoint(tmp_path / "ckpt")["model"]
    assert all(torch.equal(value, saved[name]) for name, value in trained.state_dict().items())


def test_a_config_refused_on_the_node_fails_the_trial_once_with_a_record(tmp_path, tiny_model, tracking_uri):
    """The checkpoint link swapped between the study's validation and the node's load of the trial's config: the
    trial function records it failed (refused) and reports a refused result, never raising into Tune's retries."""
    from trainables.ray_train import node_config
    from trainables.tracking import REFUSED_RESULT_KEY, RUN_ID_RESULT_KEY, TrackingTarget

    roots = tmp_path / "weights"
    roots.mkdir()
    outside = tmp_path / "elsewhere.pt"
    outside.write_bytes(b"x")
    link = roots / "link.pt"
    link.symlink_to(outside)  # swapped after the study validated
    client = tracking_client(tracking_uri)
    payload = {
        "trial": {"model": _model(tiny_model, kwargs={"checkpoint_path": str(link)}, checkpoint_roots=[str(roots)])},
        "tracking": TrackingTarget(tracking_uri, client.create_experiment("node")).__dict__,
        "objective": {"metric": "val_acc"},
    }
    reported = []
    sink = lambda metrics, checkpoint: reported.append(metrics)  # noqa: E731 - Tune's report, outside Ray
    assert node_config(payload, "t1", "trial-1", sink) is None
    [result] = reported
    assert result[REFUSED_RESULT_KEY] == 1 and result["val_acc"] != result["val_acc"]  # nan: never optimised
    run = client.get_run(result[RUN_ID_RESULT_KEY])
    assert run.info.status == "FAILED" and run.info.run_name == "trial-1"
    assert "refused on the node" in run.data.tags[REASON_TAG] and "outside every folder" in run.data.tags[REASON_TAG]


def test_the_trial_that_met_the_full_disk_stays_failed_and_the_ones_the_stop_cut_become_interrupted(tracking_uri):
    """The trial that met the full disk ended itself (Tune: TERMINATED, never run again by `resume`): its record
    stays failed. The trials the study's stop cut short are resumed, so theirs say interrupted."""
    from studies.launch import mark_interrupted
    from trainables.naming import KIND_TAG, PARENT_RUN_TAG, STATUS_TAG
    from trainables.tracking import NO_SPACE_REASON

    client = tracking_client(tracking_uri)
    exp = client.create_experiment("disk")
    cell = client.create_run(exp).info.run_id
    runs = {}
    for name, status, reason in (
        ("met-it", "failed", f"{NO_SPACE_REASON} ([Errno 28] No space left on device)"),
        ("cut", "early_stopped", "stopped by Tune"),
    ):
        run = client.create_run(exp, tags={KIND_TAG: "trial", PARENT_RUN_TAG: cell, STATUS_TAG: status}).info
        client.set_tag(run.run_id, REASON_TAG, reason)
        client.set_terminated(run.run_id, "FAILED" if status == "failed" else "KILLED")
        runs[name] = run.run_id
    mark_interrupted(client, exp, {"c": cell}, 0.0, "the study stopped on a full disk; resume continues it")
    met, cut = (client.get_run(runs[n]).data.tags for n in ("met-it", "cut"))
    assert met[STATUS_TAG] == "failed" and met[REASON_TAG].startswith(NO_SPACE_REASON)
    assert cut[STATUS_TAG] == "interrupted" and "resume continues it" in cut[REASON_TAG]


# --- Tune's own state: resume reads back only what this launch recorded leaving -------------------------------


def test_resume_reads_back_only_the_tune_state_this_launch_recorded(tmp_path, tracking_uri):
    path = _study_file(tmp_path / "study")
    study = load_study(path, require_data=False)
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "tuner.pkl").write_bytes(b"settings")
    (folder / "experiment_state-2026-01-01_00-00-00.json").write_text('{"trials": []}')
    (folder / "searcher-state-x.pkl").write_text("{}")  # the searcher's JSON: checked by the searcher itself
    client = tracking_client(tracking_uri)
    exp = client.create_experiment("s")
    run_id = client.create_run(exp).info.run_id
    identity.record_tune_state(client, run_id, str(folder))
    recorded = client.get_run(run_id).data.tags[identity.TUNE_STATE_TAG]
    assert set(json.loads(recorded)) == {"tuner.pkl", "experiment_state-2026-01-01_00-00-00.json"}
    assert identity.check_tune_state(study, str(folder), recorded) is None  # as left: resumed

    (folder / "tuner.pkl").write_bytes(b"settings, then code")  # a writer to the storage replaced it
    with pytest.raises(StudyError, match=r"Tune's state tuner.pkl under .* is not what this launch left") as err:
        identity.check_tune_state(study, str(folder), recorded)
    assert "--trust-storage" in str(err.value) and "--new-launch" in str(err.value)
    (folder / "tuner.pkl").write_bytes(b"settings")

    newer = folder / "experiment_state-2026-01-02_00-00-00.json"  # the newest, which Tune would restore
    newer.write_text('{"trials": []}')
    with pytest.raises(StudyError, match="experiment_state-2026-01-02_00-00-00.json under"):
        identity.check_tune_state(study, str(folder), recorded)
    newer.unlink()

    # Tune also unpickles the newest search_gen_state-* and callback-states-*.pkl by name: a newer one planted beside
    # the recorded ones is refused, and only the newest of each pattern is recorded (the tag does not grow).
    (folder / "search_gen_state-2026-01-01_00-00-00.json").write_bytes(b"searcher wrappers")
    (folder / "callback-states-2026-01-01_00-00-00.pkl").write_bytes(b"callbacks")
    identity.record_tune_state(client, run_id, str(folder))
    (folder / "experiment_state-2026-01-02_00-00-00.json").write_text('{"trials": []}')  # a later session's
    (folder / "search_gen_state-2026-01-02_00-00-00.json").write_bytes(b"searcher wrappers, later")
    identity.record_tune_state(client, run_id, str(folder))
    recorded = client.get_run(run_id).data.tags[identity.TUNE_STATE_TAG]
    assert set(json.loads(recorded)) == {
        "tuner.pkl",
        "experiment_state-2026-01-02_00-00-00.json",
        "search_gen_state-2026-01-02_00-00-00.json",
        "callback-states-2026-01-01_00-00-00.pkl",
    }
    assert identity.check_tune_state(study, str(folder), recorded) is None
    for planted in ("search_gen_state-2099-01-01_00-00-00.json", "callback-states-2099-01-01_00-00-00.pkl"):
        (folder / planted).write_bytes(b"code")
        with pytest.raises(StudyError, match=f"Tune's state {planted} under"):
            identity.check_tune_state(study, str(folder), recorded)
        (folder / planted).unlink()
    later = folder / "experiment_state-2026-01-02_00-00-00.json"
    later.unlink()  # the recorded newest removed: Tune would read the older one, which is no longer recorded
    with pytest.raises(StudyError, match="experiment_state-2026-01-01_00-00-00.json under"):
        identity.check_tune_state(study, str(folder), recorded)
    later.write_text('{"trials": []}')

    cut = later
    cut.write_text('{"trials": [')  # written while the disk was full, and recorded so
    identity.record_tune_state(client, run_id, str(folder))
    recorded = client.get_run(run_id).data.tags[identity.TUNE_STATE_TAG]
    with pytest.raises(StudyError, match=r"is cut short \(written while its disk was full\?\)"):
        identity.check_tune_state(study, str(folder), recorded)

    assert "restored unchecked" in identity.check_tune_state(study, str(folder), None)  # a launch from before
    assert "not checked" in identity.check_tune_state(study, "s3://bucket/exp", recorded)


# --- issue 36, item 11: a refusal changes nothing; commands printed to be pasted ---------------------------------


def test_a_refused_run_leaves_a_deleted_experiment_deleted(tmp_path, tracking_uri, monkeypatch):
    """`run` restored the deleted experiment, then refused the run (launch 1 exists): the refusal changed the store.
    The folder's name holds a quote and a space: every command the refusal prints pastes as one word."""
    path = _study_file(tmp_path / "it's a study")
    monkeypatch.chdir(path.parent)
    _record_launch(path, tracking_uri)
    client = tracking_client(tracking_uri)
    exp_id = client.get_experiment_by_name("quickstart").experiment_id
    client.delete_experiment(exp_id)
    with pytest.raises(StudyError) as err:
        run_study(path, tracking_uri=tracking_uri)
    assert "already holds launch 1" in str(err.value)
    assert client.get_experiment(exp_id).lifecycle_stage == "deleted"
    quoted = shlex.quote(str(path))
    assert f"`sharpscale resume {quoted}`" in str(err.value) and f"`sharpscale run --new-launch {quoted}`" in str(
        err.value
    )
    assert shlex.split(f"sharpscale resume {quoted}") == ["sharpscale", "resume", str(path)]


def test_a_new_launch_given_back_deletes_the_restored_experiment_again(tmp_path, tracking_uri, monkeypatch):
    path = _study_file(tmp_path / "study")
    monkeypatch.chdir(path.parent)
    run_id, _ = _record_launch(path, tracking_uri)
    client = tracking_client(tracking_uri)
    exp_id = client.get_experiment_by_name("quickstart").experiment_id
    client.delete_experiment(exp_id)
    deleted_with_it = client.get_run(run_id).info.lifecycle_stage  # MLflow deletes an experiment's runs with it
    target = Launch.open(
        load_study(path, require_data=False), tracking_uri, resume=False, new_launch=True, explicit=True
    )
    assert target.number == 2 and client.get_experiment(exp_id).lifecycle_stage == "active"
    target.release()  # what a run refused before its first run does (Launch.closing_steps)
    target.release_driver()
    assert client.get_experiment(exp_id).lifecycle_stage == "deleted"
    assert client.get_run(run_id).info.lifecycle_stage == deleted_with_it  # its launch 1 as it was


def test_the_resume_line_quotes_what_a_shell_would_split(monkeypatch):
    import argparse

    from studies.cli.study import incomplete

    monkeypatch.setattr(sys, "argv", ["sharpscale"])
    args = argparse.Namespace(
        study="my 'study'.yaml",
        set=["data.root=/data/my cifar", "budget={seed: 1}"],
        storage="/runs/it's here",
        tracking_uri="sqlite:////tmp/a b/mlflow.db",
        address=None,
        smoke=True,
    )
    line = incomplete(args, "after 1 of 2 trials").rsplit("\n  ", 1)[1]
    assert shlex.split(line)[2:] == [
        "my 'study'.yaml",
        "--set",
        "data.root=/data/my cifar",
        "--set",
        "budget={seed: 1}",
        "--storage",
        "/runs/it's here",
        "--tracking-uri",
        "sqlite:////tmp/a b/mlflow.db",
        "--smoke",
    ]


@pytest.mark.timeout(300)
def test_ray_failing_to_start_says_its_cause_and_the_fix_for_it(tmp_path, tracking_uri):
    """A real Ray failure: a temporary directory whose path is too long for Ray's sockets. Before: its fix was
    "check free memory and /tmp space", which cannot help."""
    path = _study_file(tmp_path / "study")
    long_tmp = tmp_path / ("t" * 120)
    long_tmp.mkdir()
    failed = subprocess.run(
        [sys.executable, "-m", "studies.cli", "run", str(path), "--tracking-uri", tracking_uri, "--num-cpus", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=path.parent,
        env={**os.environ, "RAY_TMPDIR": str(long_tmp)},
    )
    assert failed.returncode == EXIT_USAGE, failed.stderr[-2000:]
    line = next(x for x in failed.stderr.splitlines() if "ray: could not start a local Ray cluster" in x)
    assert "AF_UNIX path length cannot exceed 107 bytes" in line
    assert "Fix: the path of Ray's temporary directory is too long" in line and "RAY_TMPDIR=/tmp" in line
    assert "free memory" not in line


def _raised(message: str, cause: BaseException | None = None) -> BaseException:
    try:
        try:
            if cause is not None:
                raise cause
        except BaseException as inner:
            raise RuntimeError(message) from inner
        raise RuntimeError(message)
    except RuntimeError as err:
        return err


def test_a_ray_start_failure_names_the_last_meaningful_line_of_its_cause():
    from studies.preflight import ray_start_problem

    # Ray's failure text opens with where it failed and ends with why; the cause raised under it says why too.
    err = _raised(
        'Failed to start the raylet.\n\nTraceback (most recent call last):\n  File "node.py", line 3\n'
        "OSError: [Errno 28] No space left on device\n-----\n"
    )
    line = ray_start_problem(err, None)
    assert "RuntimeError: OSError: [Errno 28] No space left on device." in line, line
    assert "Fix: free space on the disk of Ray's temporary directory" in line and "RAY_TMPDIR" in line
    chained = _raised("Failed to connect to the cluster.", ConnectionError("Ray version mismatch: 2.9 vs 2.40"))
    line = ray_start_problem(chained, "10.0.0.1:6379")
    assert line.startswith(
        "ray: could not reach the Ray cluster at 10.0.0.1:6379: ConnectionError: Ray version mismatch"
    )
    assert "Fix: install on this machine the Ray and Python versions the cluster runs" in line
    assert "drop --address" in ray_start_problem(_raised("Timed out."), "10.0.0.1:6379")


# --- Issue 36: a store another writer holds, read by the commands that only read it -----------------------------


def _files(*folders: Path) -> set[str]:
    return {str(p) for f in folders for p in f.rglob("*")}


def _read_commands(path: Path, uri: str, tmp_path: Path) -> dict[str, list[str]]:
    from studies.server import free_port

    return {
        "status": ["status", str(path), "--tracking-uri", uri],
        "report": ["report", str(path), "--tracking-uri", uri, "--out", str(tmp_path / "report")],
        "dashboard": ["dashboard", str(path), "--tracking-uri", uri, "--port", str(free_port())],
        "ui": ["ui", "--tracking-uri", uri, "--port", str(free_port())],
        "export": ["export", "--tracking-uri", uri, str(tmp_path / "exported")],
    }


@pytest.mark.timeout(600)
@pytest.mark.parametrize("command", ["status", "report", "dashboard", "ui", "export"])
def test_a_store_locked_by_another_writer_is_one_line_for_the_reading_commands(
    command, tmp_path, tracking_uri, monkeypatch, capsys
):
    """A connection in BEGIN EXCLUSIVE on mlflow.db: each command that reads it ends in the one line `run` gives
    (studies.launch.store_locked), non-zero, and leaves no file behind (no lock file, no half export)."""
    import sqlite3
    import threading

    from studies.cli import EXIT_ERRORS

    path = _study_file(tmp_path / "study")
    monkeypatch.chdir(tmp_path / "study")
    db = tracking_uri.removeprefix("sqlite:///")
    argv = _read_commands(path, tracking_uri, tmp_path)[command]
    held, release = threading.Event(), threading.Event()

    def writer() -> None:
        con = sqlite3.connect(db, timeout=1, isolation_level=None)
        con.execute("begin exclusive")
        held.set()
        release.wait(timeout=600)
        con.execute("rollback")
        con.close()

    before = _files(tmp_path)
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert held.wait(timeout=60)
        code = main(argv)
    finally:
        release.set()
        thread.join(timeout=60)
    err = capsys.readouterr().err
    assert code == EXIT_ERRORS, err
    assert f"the MLflow store {tracking_uri} is locked by another writer" in err, err
    assert f"`{command}` stopped there. Fix: let that writer finish" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert _files(tmp_path) == before


def test_status_over_a_free_store_creates_no_file(tmp_path, tracking_uri, monkeypatch, capsys):
    """A read-only command takes the store's creation lock only where a creator made it: no mlflow.db.lock left."""
    path = _study_file(tmp_path / "study")
    _record_launch(path, tracking_uri)
    Path(tracking_uri.removeprefix("sqlite:///") + ".lock").unlink()  # as in a copied or exported store
    monkeypatch.chdir(tmp_path / "study")
    before = _files(tmp_path)
    assert main(["status", str(path), "--tracking-uri", tracking_uri]) == 0, capsys.readouterr().err
    assert _files(tmp_path) == before


def test_a_misspelt_model_kwarg_is_refused_by_validate(tmp_path, tiny_study, tiny_model, capsys):
    """Caught by `validate` (torch-free: the keys each family takes are pinned in trainables.families), not at `run`."""
    path = tiny_study(tmp_path, "typo", base={"model": tiny_model("vit", drop_path_rat=0.1)})
    assert main(["validate", str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "model.kwargs.drop_path_rat: timm's vit_tiny_patch16_224 takes no argument 'drop_path_rat'." in err, err
    assert "Did you mean drop_path_rate?" in err and "Got drop_path_rat: 0.1;" in err and "Traceback" not in err, err


def test_a_stop_while_a_cell_run_is_written_leaves_it_for_the_caller_to_close(tmp_path, tracking_uri, monkeypatch):
    """Ctrl-C between a cell run's creation (RUNNING) and its params: the run is in `opened` already, so the closing
    steps end it (it stayed RUNNING, found by test_stops' Ctrl-C test as the cell left open)."""
    from studies import launch as launch_module

    path = _study_file(tmp_path / "study")
    study = load_study(path, require_data=False)
    client = tracking_client(tracking_uri)
    exp_id = experiment(client, study.experiment_name, path.parent / "mlartifacts", tracking_uri)
    number = choose_launch(client, exp_id, study, study.experiment_name, tracking_uri, new_launch=False)
    locations = state_locations(study, launch_name(study.experiment_name, number))

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(launch_module, "_log_params", stopped)
    opened, cell_runs = [], {}
    with pytest.raises(KeyboardInterrupt):
        parent_runs(client, study, exp_id, "abc", None, locations.tags(), number, opened, cell_runs)
    running = client.search_runs([exp_id], "attributes.status = 'RUNNING'")
    assert {r.info.run_id for r in running} == set(opened) and len(opened) == 2
    assert list(cell_runs.values()) == opened[1:]


@pytest.mark.parametrize("uri", ["http://127.0.0.1:1/#access_token=hunter2", "https://h/p?a=1#token=hunter2"])
def test_a_token_in_a_uri_fragment_is_refused_and_hidden(uri, tmp_path, monkeypatch, capsys):
    path = _study_file(tmp_path / "study")
    assert redact(uri).endswith("token=***")
    assert main(["status", str(path), "--tracking-uri", uri]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "carries a secret" in err and SECRET not in err, err
