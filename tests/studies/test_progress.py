"""The live view of a running study: per-cell counts, running trials' epochs, ETA; and the noise kept in a file."""

import argparse
import io
import logging
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from studies.progress import LiveView, format_duration, quiet_libraries
from studies.spec import load_study

REPO = Path(__file__).resolve().parents[2]


@dataclass
class _Trial:
    """What Tune's callbacks read of a trial: its id, its config (the searcher's payload) and its last result."""

    trial_id: str
    config: dict
    last_result: dict = field(default_factory=dict)


@pytest.fixture
def view(monkeypatch):
    study = load_study(REPO / "studies" / "quickstart.yaml")
    monkeypatch.setattr("sys.stdout", io.StringIO())  # not a terminal: plain lines
    return LiveView(study, title="quickstart", run_name="quickstart"), study


def _trial(study, cell_index, tid, name):
    return _Trial(tid, {"cell": study.cells[cell_index].key, "run_name": name})


def test_counts_running_epochs_and_best_per_cell(view):
    live, study = view
    sam = next(i for i, c in enumerate(study.cells) if c.space)
    a, b = _trial(study, sam, "a", "vit/sam rho=0.1 #1"), _trial(study, sam, "b", "vit/sam rho=0.3 #2")
    live.start(a)
    live.start(b)
    live.result(a, {"training_iteration": 3, "val_acc": 0.5})
    text = "\n".join(live.render())
    assert "0/15 trials ended" in text and "2 running" in text
    # Epochs run are a count (NUMBERING keeps numbers zero-based; "epoch 3/10" would read as MLflow's step 3).
    assert "vit/sam rho=0.1 #1: 3/10 epochs val_acc=0.5000" in text and "rho=0.3 #2: 0/10 epochs" in text
    a.last_result = {"val_acc": 0.7, "diverged": 0}
    line = live.end(a, ok=True)
    assert line.startswith("[1/15] done 1, running 1, failed 0") and "val_acc=0.7000" in line
    b.last_result = {"val_acc": float("nan"), "diverged": 1}
    assert "diverged" in live.end(b, ok=True)
    cell = live.cells[study.cells[sam].key]
    assert (cell.done, cell.failed, cell.best, cell.best_name) == (1, 1, 0.7, "vit/sam rho=0.1 #1")
    assert "best val_acc (final epoch)" in "\n".join(live.render())


def test_an_interrupt_seen_by_a_resumed_launchs_copy_of_the_view_is_the_runners(view):
    # A resumed launch's Tune restores the callbacks pickled in tuner.pkl: the view that wraps Tune's SIGINT handler
    # there is an unpickled copy, and the runner reads its own view (Ctrl-C of a resumed launch was taken for its end).
    import signal

    from ray import cloudpickle

    live, _ = view
    copy = cloudpickle.loads(cloudpickle.dumps(live.callback))
    handled = []
    before = signal.signal(signal.SIGINT, lambda sig, frame: handled.append(sig))  # Tune's handler, in fit()
    try:
        copy.setup()  # Tune calls each callback's setup once its handler is installed
        assert live.interrupted_at is None
        signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)
    assert handled == [signal.SIGINT]  # Tune's handler still stops the trials
    assert live.interrupted_at is not None
    # A new launch of the same name in this process starts uninterrupted.
    assert LiveView(view[1], title="quickstart", run_name="quickstart").interrupted_at is None


def test_a_view_pickled_before_run_name_existed_still_hands_the_interrupt_to_tune(view):
    import signal

    live, _ = view
    del live.run_name  # as a view unpickled from an older sharpscale's tuner.pkl
    handled = []
    before = signal.signal(signal.SIGINT, lambda sig, frame: handled.append(sig))
    try:
        live._record_interrupts()
        signal.raise_signal(signal.SIGINT)  # would raise AttributeError in the handler, before Tune's
    finally:
        signal.signal(signal.SIGINT, before)
    assert handled == [signal.SIGINT]


def test_eta_from_epochs_run(view, monkeypatch):
    live, study = view
    now = [100.0]
    monkeypatch.setattr("studies.progress.time.monotonic", lambda: now[0])
    live.t0 = 100.0
    assert live.eta_s() is None  # nothing run yet: no estimate rather than a made-up one
    t = _trial(study, 0, "a", "x")
    live.start(t)
    live.result(t, {"training_iteration": 5, "val_acc": 0.1})
    now[0] = 110.0  # 5 of 150 planned epochs in 10 s
    assert live.eta_s() == pytest.approx(10.0 * 145 / 5)
    assert "ETA 4m50s" in live.plain_status() and "running: x: 5/10 epochs" in live.plain_status()


def test_a_tie_goes_to_the_trial_that_started_first_whichever_ends_first(view):
    # BEST_RULE, as the summary and the roll-ups apply it (the old view kept whichever tied trial ended first).
    live, study = view
    sam = next(i for i, c in enumerate(study.cells) if c.space)
    first, second = _trial(study, sam, "a", "started first"), _trial(study, sam, "b", "started second")
    live.start(first)
    live.start(second)
    for t in (second, first):  # the later one ends first
        t.last_result = {"val_acc": 0.9, "diverged": 0}
        live.end(t, ok=True)
    assert live.cells[study.cells[sam].key].best_name == "started first"


def test_eta_from_measured_trial_times_once_trials_end(view, monkeypatch):
    live, study = view
    now = [0.0]
    monkeypatch.setattr("studies.progress.time.monotonic", lambda: now[0])
    now[0] = 500.0  # Ray's start and the imports took long: not a trial's cost
    a, b = _trial(study, 0, "a", "a"), _trial(study, 1, "b", "b")
    live.start(a)
    live.start(b)  # two at once
    now[0] = 530.0
    a.last_result = {"val_acc": 0.5, "diverged": 0}
    live.end(a, ok=True)  # 10 epochs in 30 s: 3 s an epoch
    # 150 planned epochs, 10 ended, b at epoch 0: 140 left at 3 s each, two at a time.
    assert live.eta_s() == pytest.approx(140 * 3.0 / 2)


def test_render_fits_a_small_terminal(view):
    live, study = view
    for i in range(len(study.cells)):
        live.start(_trial(study, i, f"t{i}", f"trial {i}"))
    lines = live.render(max_lines=8)
    assert len(lines) <= 8 and lines[-1].strip().startswith("...")


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (59.4, "59s"), (61, "1m01s"), (3725, "1h02m")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_library_noise_goes_to_the_log_file_and_loggers_come_back(tmp_path, capsys):
    import warnings

    tune_logger = logging.getLogger("ray.tune.execution.tune_controller")
    before = (list(logging.getLogger("ray").handlers), logging.getLogger("ray").propagate)
    log = tmp_path / "run" / "sharpscale.log"
    with quiet_libraries(log):
        tune_logger.warning("Processing trial results took 1.1 s")
        logging.getLogger("optuna.storages").info("A new study created in RDB")
        warnings.warn("a library's warning", UserWarning, stacklevel=1)
    text = log.read_text()
    assert "Processing trial results" in text and "A new study created" in text and "a library's warning" in text
    captured = capsys.readouterr()
    assert "Processing" not in captured.out + captured.err and "new study" not in captured.out + captured.err
    assert (list(logging.getLogger("ray").handlers), logging.getLogger("ray").propagate) == before


def test_processes_started_meanwhile_write_their_stderr_to_the_log(tmp_path, capfd):
    import subprocess

    from studies.progress import stderr_to

    log = tmp_path / "sharpscale.log"
    with stderr_to(log):
        subprocess.run(["sh", "-c", "echo child-notice >&2"], check=True)  # as Ray's GCS and agents would
    subprocess.run(["sh", "-c", "echo after >&2"], check=True)
    assert "child-notice" in log.read_text() and "after" not in log.read_text()
    assert "child-notice" not in capfd.readouterr().err


def test_library_logs_stay_in_the_log_after_ray_init_drops_their_handlers(tmp_path, capfd):
    # ray.init (even with configure_logging=False) leaves Ray's logger without the handler quiet_libraries gave
    # it; Tune's warnings then went to the terminal through logging's last resort. The runner reroutes after it.
    from studies.progress import reroute_libraries

    log = tmp_path / "sharpscale.log"
    snapshot = logging.getLogger("ray.tune.execution.experiment_state")
    with quiet_libraries(log):
        logging.getLogger("ray").handlers = []  # what ray.init leaves
        reroute_libraries()
        snapshot.warning("Experiment state snapshotting has been triggered multiple times")
    assert "snapshotting" in log.read_text()
    assert "snapshotting" not in capfd.readouterr().err


def test_the_runner_reroutes_the_library_logs_after_starting_ray():
    import inspect

    from studies import runner

    source = inspect.getsource(runner.StudyCall.start_cluster)
    assert source.index("reroute_libraries()") > source.index("_start_ray(study, address, num_cpus)")


def test_the_log_file_drops_only_a_full_disks_errors(tmp_path, capsys):
    import errno
    import logging

    from studies.progress import _LogFile

    handler = _LogFile(tmp_path / "study.log")
    try:
        record = logging.LogRecord("ray.tune", logging.WARNING, __file__, 1, "%d trials", ("x",), None)
        handler.emit(record)  # a record that cannot be formatted: logging's own report, as for any handler
        assert "--- Logging error ---" in capsys.readouterr().err

        class FullDisk:
            def write(self, text):
                raise OSError(errno.ENOSPC, "No space left on device")

            def flush(self):
                pass

        handler.stream = FullDisk()
        handler.emit(logging.LogRecord("ray.tune", logging.WARNING, __file__, 1, "fine", (), None))
        assert capsys.readouterr().err == ""  # the study says what is full, once
    finally:
        handler.stream = None
        handler.close()


def test_at_80_columns_the_view_keeps_its_eta(view):
    live, study = view
    live.title = "a_study_with_a_long_descriptive_name_as_users_write_them"
    for i in range(len(study.cells)):
        live.start(_trial(study, i, f"t{i}", f"arch=vit,method=sam trial {i} with a long name"))
    lines = live.render(columns=79)
    assert all(len(line) <= 79 for line in lines)
    assert "ETA " in lines[0] and "/" in lines[0]
    # A wide terminal keeps every word.
    assert live.render(columns=200)[0].startswith(live.title + ": ") and "elapsed" in live.render(columns=200)[0]


def test_run_says_what_it_does_before_ray_starts(capsys):
    import argparse

    from studies.cli.study import Run, starting_line

    args = argparse.Namespace(study="studies/quickstart.yaml", address=None)
    line = starting_line(args, resumes=False)
    assert len(line) <= 80 and "40-50 s" in line and "quickstart" in line
    assert "on the Ray cluster at auto: connecting" in starting_line(
        argparse.Namespace(study="q.yaml", address="auto"), resumes=True
    )

    class Told(Exception):
        pass

    def run_study(*_, **__):
        # What the terminal showed when the slow part began.
        raise Told(capsys.readouterr().out)

    import studies.runner

    saved, studies.runner.run_study = studies.runner.run_study, run_study
    try:
        full = argparse.Namespace(**vars(args), tracking_uri=None, smoke=True, num_cpus=None, set=[])
        with pytest.raises(Told) as told:
            Run()._run(full)
    finally:
        studies.runner.run_study = saved
    assert str(told.value).strip() == line


def test_the_end_summary_does_not_wrap_at_80_columns(monkeypatch, capsys):
    import pandas as pd

    from studies.cli import summary
    from trainables.metrics import FIXED_TIME

    monkeypatch.setenv("COLUMNS", "80")
    runs = pd.DataFrame({FIXED_TIME: [3.2, 4.1, 5.0]})
    outcome = argparse.Namespace(training_share=("gpu_training_share", 0.41), gpu_busy=None)
    summary._print_cost(runs, outcome)
    summary._print_next(
        "sharpscale", " --tracking-uri sqlite:////home/user/work/mlflow.db", "studies/quickstart.yaml", "quickstart"
    )
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert all(len(line) < 80 for line in lines), [line for line in lines if len(line) >= 80]
    # Nothing is lost: a long command continues with a shell's backslash, every word of the prose is still there.
    report = lines.index("  sharpscale report studies/quickstart.yaml \\")
    assert lines[report + 1] == "      --tracking-uri sqlite:////home/user/work/mlflow.db"
    assert "median 4.1 s a trial (min 3.2, max 5.0; 3 trials)." in " ".join(w.strip() for w in lines)
