"""What a running study shows: a live view of its cells (a Tune callback), and the library noise kept out of it."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from analysis.runs import best_key
from studies.spec import LoadedStudy
from trainables.errors import NO_SPACE_ERRNOS
from trainables.tracking import REFUSED_RESULT_KEY

__all__ = ["LiveView", "format_duration", "quiet_libraries", "stderr_to"]

# On a terminal the view is redrawn at most this often; elsewhere (a log file, CI) a status line is printed
# this often, besides one line per ended trial.
TTY_REFRESH_S = 1.0
PLAIN_EVERY_S = 30.0
# Loggers whose INFO chatter (Ray's start-up notices, Tune's hints, Optuna's "new study created") goes to the
# study's log file instead of the terminal.
AIR_OUTPUT_ENV = "RAY_AIR_NEW_OUTPUT"  # read by ray.tune.experimental.output when a Tuner starts
NOISY_LOGGERS = ("ray", "optuna", "filelock", "mlflow", "alembic", "py.warnings")


def format_duration(seconds: float) -> str:
    """'42s', '3m05s', '1h02m'."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


# Study run name -> time.time() when SIGINT (or SIGTERM, handed to Tune's SIGINT handler) reached this driver while
# that study's Tune ran. Kept here, not on the view: a resumed launch's Tune restores the callbacks pickled in its
# tuner.pkl, so there the view that sees the interrupt is an unpickled copy of the first launch's, not the one the
# runner made and reads (a Ctrl-C of a resumed launch was taken for its end: exit 0, the study run FINISHED).
INTERRUPTED_AT: dict[str | None, float] = {}

# The routing quiet_libraries set up, innermost last: `reroute_libraries` applies it again.
_ACTIVE: list = []


def _route(handler: logging.Handler, saved: list) -> None:
    """Point every noisy library logger at `handler` (no propagation), remembering what each had into `saved`
    (a logger already saved keeps its first state, the one to restore)."""
    known = {id(entry[0]) for entry in saved}
    names = [
        name
        for name in logging.root.manager.loggerDict
        if any(name == n or name.startswith(n + ".") for n in NOISY_LOGGERS)
        and isinstance(logging.root.manager.loggerDict[name], logging.Logger)
        and (name in NOISY_LOGGERS or logging.getLogger(name).handlers)
    ]
    for name in dict.fromkeys([*NOISY_LOGGERS, *names]):
        logger = logging.getLogger(name)
        if id(logger) not in known:
            saved.append((logger, list(logger.handlers), logger.propagate, logger.level))
        logger.handlers = [handler]
        logger.propagate = False
        if logger.level in (logging.NOTSET,) or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)


def reroute_libraries() -> None:
    """Apply quiet_libraries' routing again. `ray.init` replaces the handlers of Ray's loggers even with
    configure_logging=False: without this, Tune's warnings during the run (its "Experiment state snapshotting"
    notice, dozens a study) reach the terminal through logging's last resort, over the live view."""
    if _ACTIVE:
        handler, saved = _ACTIVE[-1]
        _route(handler, saved)


class _LogFile(logging.FileHandler):
    """The study's log file, whose writes a full disk (or quota) refuses are dropped: logging's default prints each
    failed record's trace to stderr, hundreds of lines over the live view, while the study itself says what is full.
    Any other failure (a record that cannot be formatted, a closed file) is logging's to report, as usual."""

    def handleError(self, record: logging.LogRecord) -> None:
        err = sys.exc_info()[1]
        if isinstance(err, OSError) and err.errno in NO_SPACE_ERRNOS:
            return
        super().handleError(record)


@contextlib.contextmanager
def quiet_libraries(log_file: Path | None) -> Iterator[Path | None]:
    """Route Ray's, Tune's, Optuna's and MLflow's log records and Python warnings to `log_file` (None: drop the
    INFO ones), for the duration; the loggers are restored afterwards. Yields the file."""
    import optuna
    import ray.train
    import ray.tune  # noqa: F401  (their loggers get their own handlers on import: import first, then redirect)

    handler: logging.Handler = logging.NullHandler()
    if log_file is not None:
        try:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            handler = _LogFile(log_file, encoding="utf-8")
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        except OSError:
            log_file = None  # storage not writable here: the runner's own checks say so, with the fix
    saved: list = []
    _route(handler, saved)
    _ACTIVE.append((handler, saved))
    optuna_default = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.INFO)  # into the file: which study was created or loaded
    optuna.logging.disable_default_handler()
    logging.captureWarnings(True)
    # Tune's newer console output prints its configuration box and a TensorBoard hint whatever `verbose` says;
    # its classic output at verbose=0 prints nothing, and the live view replaces both.
    air_output = os.environ.get(AIR_OUTPUT_ENV)
    os.environ[AIR_OUTPUT_ENV] = "0"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            yield log_file
    finally:
        if air_output is None:
            os.environ.pop(AIR_OUTPUT_ENV, None)
        else:
            os.environ[AIR_OUTPUT_ENV] = air_output
        _ACTIVE.pop()
        logging.captureWarnings(False)
        optuna.logging.enable_default_handler()
        optuna.logging.set_verbosity(optuna_default)
        for logger, handlers, propagate, level in saved:
            logger.handlers, logger.propagate = handlers, propagate
            logger.setLevel(level)
        handler.close()


@contextlib.contextmanager
def stderr_to(log_file: Path | None) -> Iterator[None]:
    """Point this process's file descriptor 2 at `log_file` for the duration (None: leave it).

    For `ray.init`: the processes it starts (GCS, raylet, dashboard, agents) inherit the descriptor, and their
    start-up notices (token authentication, GCS retries) are not Python log records this process could route.
    """
    if log_file is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(log_file, "ab") as log:
            os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


@dataclass
class _Running:
    cell: str
    name: str
    epoch: int = 0
    value: float | None = None
    order: int = 0  # when it started, in the order trials started (BEST_RULE's tie-break)
    started: float = 0.0  # time.monotonic() at its start


@dataclass
class _CellState:
    label: str
    planned: int
    epochs: int
    done: int = 0
    failed: int = 0
    best: float | None = None
    best_name: str = ""
    best_key: tuple | None = None
    running: dict[str, _Running] = field(default_factory=dict)


class LiveView:
    """Trials done, running and failed per cell, each running trial's epochs run k/N and current metric, the best so far
    per cell, elapsed time and ETA: redrawn in place on a terminal, printed as plain lines otherwise.

    `callback` is the Tune callback that feeds it (Tune's public Callback API).
    """

    def __init__(self, study: LoadedStudy, *, title: str, run_name: str):
        from studies.records import cell_label
        from trainables.config import TrialConfig

        objective = study.spec.objective
        self.column, self.mode, self.label = objective.column, objective.mode, objective.label
        self.title = title
        self.cells = {
            c.key: _CellState(cell_label(c), c.planned, TrialConfig.load(c.config).schedule.epochs) for c in study.cells
        }
        self.t0 = time.monotonic()
        self.run_name = run_name  # the key of INTERRUPTED_AT, the same in a copy unpickled by a resumed launch's Tune
        INTERRUPTED_AT.pop(run_name, None)  # an interrupt of an earlier launch of this name in this process
        self._last_draw = 0.0
        self._drawn_lines = 0
        self._started = 0  # trials started so far
        self._durations: list[tuple[float, int]] = []  # (seconds, epochs) of each trial that ran to its end here
        self._parallel = 1  # the most trials seen running at once
        self.callback = self._make_callback()

    @property
    def interrupted_at(self) -> float | None:
        """When SIGINT reached the driver (time.time()) while this study's Tune ran, else None."""
        return INTERRUPTED_AT.get(self.run_name)

    # ------------------------------------------------------------------ state
    def _state(self, trial) -> _CellState | None:
        config = trial.config if isinstance(trial.config, dict) else {}
        return self.cells.get(config.get("cell", ""))

    def start(self, trial) -> None:
        cell = self._state(trial)
        if cell is not None:
            self._started += 1
            cell.running[trial.trial_id] = _Running(
                trial.config.get("cell", ""),
                trial.config.get("run_name") or trial.trial_id,
                order=self._started,
                started=time.monotonic(),
            )
            self._parallel = max(self._parallel, sum(len(c.running) for c in self.cells.values()))

    def result(self, trial, result: dict) -> None:
        cell = self._state(trial)
        if cell is None:
            return
        run = cell.running.setdefault(
            trial.trial_id, _Running(trial.config.get("cell", ""), trial.config.get("run_name") or trial.trial_id)
        )
        step = result.get("training_iteration")
        run.epoch = int(step) if isinstance(step, int) else run.epoch
        if self.column in result:  # an epoch not evaluated (train.eval_every) keeps the last value shown
            value = result[self.column]
            run.value = float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    def end(self, trial, *, ok: bool) -> str | None:
        """Record an ended trial; returns its one-line summary."""
        cell = self._state(trial)
        if cell is None:
            return None
        run = cell.running.pop(trial.trial_id, None)
        name = run.name if run is not None else (trial.config.get("run_name") or trial.trial_id)
        result = trial.last_result or {}
        value = result.get(self.column)
        diverged = bool(result.get("diverged"))
        if run is not None and run.started and ok:
            self._durations.append((time.monotonic() - run.started, cell.epochs))
        if ok and not diverged and isinstance(value, (int, float)) and math.isfinite(value):
            cell.done += 1
            # BEST_RULE: the value, then the trial that started first (as the summary and the roll-ups rank them).
            key = best_key(float(value), run.order if run is not None else math.inf, name, self.mode)
            if cell.best_key is None or key < cell.best_key:
                cell.best, cell.best_name, cell.best_key = float(value), name, key
            outcome = f"{self.column}={value:.4f}"
        else:
            cell.failed += 1
            outcome = "diverged" if diverged else "refused" if result.get(REFUSED_RESULT_KEY) else "failed"
        best = f"{cell.best:.4f}" if cell.best is not None else "-"
        return f"{self._counts()} | {name}: {outcome} (cell best {best})"

    # ------------------------------------------------------------------ text
    def _totals(self) -> tuple[int, int, int, int]:
        done = sum(c.done for c in self.cells.values())
        failed = sum(c.failed for c in self.cells.values())
        running = sum(len(c.running) for c in self.cells.values())
        planned = sum(c.planned for c in self.cells.values())
        return done, running, failed, planned

    def _counts(self) -> str:
        done, running, failed, planned = self._totals()
        return f"[{done + failed}/{planned}] done {done}, running {running}, failed {failed}"

    def eta_s(self) -> float | None:
        """Seconds left: the epochs still to run, at the seconds per epoch measured on the trials that ended here,
        spread over as many trials as were seen running at once. Before any trial ends: from the epochs run so far
        since the first trial started (Ray's start and the first imports are not a trial's cost)."""
        total = sum(c.planned * c.epochs for c in self.cells.values())
        run = sum(
            (c.done + c.failed) * c.epochs + sum(r.epoch for r in c.running.values()) for c in self.cells.values()
        )
        left = max(0, total - run)
        if self._durations:
            per_epoch = sum(d for d, _ in self._durations) / max(1, sum(e for _, e in self._durations))
            return left * per_epoch / self._parallel
        first = min((r.started for c in self.cells.values() for r in c.running.values() if r.started), default=None)
        if run <= 0 or first is None:
            return None
        return (time.monotonic() - first) * left / run

    def _clock(self) -> str:
        eta = self.eta_s()
        return f"elapsed {format_duration(time.monotonic() - self.t0)}, ETA {format_duration(eta) if eta is not None else '?'}"

    def _running_text(self, run: _Running, epochs: int) -> str:
        value = f" {self.column}={run.value:.4f}" if run.value is not None else ""
        return f"{run.name}: {run.epoch}/{epochs} epochs{value}"  # a count (NUMBERING: epoch k is the (k+1)-th)

    def _header(self, width: int | None) -> str:
        """The first line, fitted to `width` by giving up the least important first: the wording of the counts,
        then the elapsed time, then the title's tail; the ETA stays."""
        done, running, failed, planned = self._totals()
        eta = self.eta_s()
        eta_text = f"ETA {format_duration(eta) if eta is not None else '?'}"
        elapsed = f"elapsed {format_duration(time.monotonic() - self.t0)}"
        long = f"{done + failed}/{planned} trials ended ({done} done, {failed} failed), {running} running"
        short = f"{done + failed}/{planned} ended, {running} run, {failed} fail"
        tails = (f"{long}; {elapsed}, {eta_text}", f"{short}; {elapsed}, {eta_text}", f"{short}; {eta_text}")
        for tail in tails:
            line = f"{self.title}: {tail}"
            if width is None or len(line) <= width:
                return line
        room = width - len(tails[-1]) - 2
        if room < 2:
            return tails[-1][-width:]  # a very narrow terminal: the counts' start goes before the ETA
        return f"{self.title[: room - 1]}…: {tails[-1]}"

    def render(self, max_lines: int | None = None, columns: int | None = None) -> list[str]:
        """The view as lines: a header, a row per cell (active cells first when they do not all fit). columns: the
        terminal's width; the header keeps its ETA within it, a row loses its end (the best trial's name)."""
        lines = [self._header(columns)]
        width = max([len(c.label) for c in self.cells.values()] + [4])
        lines.append(f"  {'cell':<{width}}  done  run  fail  best {self.label}")
        rows: list[tuple[int, list[str]]] = []
        for cell in self.cells.values():
            best = f"{cell.best:.4f}  {cell.best_name}" if cell.best is not None else "-"
            row = [
                f"  {cell.label:<{width}}  {cell.done:>2}/{cell.planned:<2} {len(cell.running):>3}  {cell.failed:>4}  {best}"
            ]
            row += [f"    > {self._running_text(r, cell.epochs)}" for r in cell.running.values()]
            finished = cell.done + cell.failed >= cell.planned
            rows.append((0 if cell.running else (2 if finished else 1), row))
        budget = None if max_lines is None else max(1, max_lines - len(lines) - 1)
        if budget is not None and sum(len(r) for _, r in rows) > budget:
            kept, hidden = [], 0
            for _, row in sorted(rows, key=lambda r: r[0]):
                if len(row) <= budget - sum(len(k) for k in kept):
                    kept.append(row)
                else:
                    hidden += 1
            lines += [line for row in kept for line in row]
            lines.append(f"  ... {hidden} more cell(s)")
        else:
            lines += [line for _, row in rows for line in row]
        return lines if columns is None else [line[:columns] for line in lines]

    def plain_status(self) -> str:
        """One line for a log: counts, clock, and the running trials."""
        active = [(r, c.epochs) for c in self.cells.values() for r in c.running.values()]
        shown = "; ".join(self._running_text(r, n) for r, n in active[:4])
        more = f"; and {len(active) - 4} more" if len(active) > 4 else ""
        return f"{self._counts()}; {self._clock()}" + (f" | running: {shown}{more}" if shown else "")

    # ------------------------------------------------------------------ output
    @staticmethod
    def _tty() -> bool:
        return sys.stdout.isatty()

    def draw(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if self._tty():
            if not force and now - self._last_draw < TTY_REFRESH_S:
                return
            size = shutil.get_terminal_size((100, 30))
            # One column short of the width: a line that fills it wraps on some terminals, and the redraw's count
            # of lines to go back up would be off.
            lines = self.render(max_lines=max(5, size.lines - 2), columns=max(20, size.columns - 1))
            # Back to the first line of the previous drawing, clear to the end of the screen, draw again.
            up = f"\x1b[{self._drawn_lines}F\x1b[J" if self._drawn_lines else ""
            sys.stdout.write(up + "\n".join(lines) + "\n")
            sys.stdout.flush()
            self._drawn_lines = len(lines)
        elif force or now - self._last_draw >= PLAIN_EVERY_S:
            print(self.plain_status(), flush=True)
        else:
            return
        self._last_draw = now

    def say(self, line: str) -> None:
        """A line that stays: above the live view on a terminal, as is elsewhere."""
        if self._tty() and self._drawn_lines:
            sys.stdout.write(f"\x1b[{self._drawn_lines}F\x1b[J")
            self._drawn_lines = 0
        print(line, flush=True)  # to sys.stdout as it is then: Tune pickles its callbacks, a stream can't be pickled
        if self._tty():
            self.draw(force=True)

    def _record_interrupts(self) -> None:
        """Wrap Tune's SIGINT handler (installed by now: Tune sets it before it sets up callbacks) so that the
        interrupt is recorded before Tune handles it. Tune then ends the run and returns normally, so the result
        alone does not say the study was cut short."""
        if threading.current_thread() is not threading.main_thread():
            return  # signals reach the main thread only; Tune installs no handler elsewhere either
        tune_handler = signal.getsignal(signal.SIGINT)
        if not callable(tune_handler):
            return

        # A view pickled by a sharpscale before run_name (a launch it started, resumed now) has none: its interrupt
        # is recorded under None, which no runner reads (as then), rather than failing in the signal handler.
        key = getattr(self, "run_name", None)

        def record_then_delegate(sig, frame):
            if key not in INTERRUPTED_AT:
                INTERRUPTED_AT[key] = time.time()
                self.say("sharpscale: interrupted: stopping the trials; the study will be resumable")
            tune_handler(sig, frame)

        signal.signal(signal.SIGINT, record_then_delegate)

    def _make_callback(self):
        from ray.tune import Callback

        view = self

        class _View(Callback):
            def setup(self, **info):
                view._record_interrupts()

            def on_trial_start(self, iteration, trials, trial, **info):
                view.start(trial)
                view.draw()

            def on_trial_result(self, iteration, trials, trial, result, **info):
                view.result(trial, result)
                view.draw()

            def on_trial_complete(self, iteration, trials, trial, **info):
                line = view.end(trial, ok=True)
                if line and not view._tty():
                    view.say(line)
                view.draw(force=view._tty())

            def on_trial_error(self, iteration, trials, trial, **info):
                line = view.end(trial, ok=False)
                if line:
                    view.say(line)  # a failure stays on screen

            def on_step_end(self, iteration, trials, **info):
                view.draw()

            def on_experiment_end(self, trials, **info):
                view.draw(force=True)

        return _View()
