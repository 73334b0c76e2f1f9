"""One Tune searcher for a whole study: an Optuna study per cell (ask/tell on one Optuna storage), round-robin."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

from studies.confirm import CellChoice, ConfirmState
from studies.records import trial_run_name
from studies.spec import Cell, Choice, Domain, IntRange, LogUniform, Uniform, set_path
from trainables.errors import UserError, no_space
from trainables.naming import tag
from trainables.secrets import redact
from trainables.tracking import RUN_ID_RESULT_KEY

__all__ = [
    "NO_SPACE",
    "CellSearcher",
    "apply_sample",
    "make_sampler",
    "note_no_space",
    "open_optuna_storage",
    "optuna_distribution",
    "startup_trials",
]

# User attributes of every Optuna trial: what links it to its Tune trial, its cell and its MLflow run.
TUNE_TRIAL_ATTR = "tune_trial_id"
CELL_ATTR = "cell"
MLFLOW_RUN_ATTR = "mlflow_run_id"
RUN_NAME_ATTR = "mlflow_run_name"
# Set on an Optuna trial that Ctrl-C cut short (told FAIL); `resume` records its result under a new trial with
# the same values, which names the cut one in RESUMED_FROM_ATTR.
INTERRUPTED_ATTR = "interrupted"
RESUMED_FROM_ATTR = "resumed_from_trial"
# A user attribute of each cell's Optuna study: the MLflow study run of the launch it belongs to.
OWNER_ATTR = tag("study_run_id")

# Run name -> (time.time() of the first, [what could not be written]) once a full disk kept this process from
# recording a study's trials (the Optuna storage here, a trial's own result in studies.runner): the runner's stopper
# then stops every trial of that study, whose ends could not be recorded either, and names the disk.
NO_SPACE: dict[str, tuple[float, list[str]]] = {}


def note_no_space(run_name: str, what: str) -> None:
    """Record a full disk met by the study `run_name` (see NO_SPACE)."""
    import time

    notes = NO_SPACE.setdefault(run_name, (time.time(), []))[1]
    if what not in notes:
        notes.append(what)


# Many trials finish at once on a large cluster; SQLite then serialises their writes, and a writer waits this long.
SQLITE_BUSY_TIMEOUT_S = 30
RDB_SCHEMES = ("sqlite", "postgresql", "mysql")
STORAGE_FORMS = "an RDB URL (sqlite:///file.db, postgresql://..., mysql://...) or journal:///absolute/path/file.log"


def open_optuna_storage(spec: str):
    """The Optuna storage a spec names: an RDB URL (sqlite, postgresql, mysql) or `journal:///abs/path/file.log`.

    `journal:` is Optuna's JournalStorage over an append-only file, locked with symlinks: safe on NFS, where
    SQLite's file locks are not.
    """
    import optuna

    scheme, sep, rest = spec.partition("://")
    base = scheme.split("+", 1)[0].lower()  # postgresql+psycopg2:// names its driver
    if not sep or base not in (*RDB_SCHEMES, "journal"):
        raise UserError(f"Optuna storage {spec!r}: must be {STORAGE_FORMS}. Fix: write it in one of those forms.")
    if base == "journal":
        if scheme != "journal" or not rest.startswith("/") or rest.endswith("/"):
            raise UserError(
                f"Optuna storage {spec!r}: a journal storage names an absolute file path after journal:// "
                f"(three slashes in all). Fix: write e.g. journal:///shared/optuna/study.log."
            )
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        path = Path("/" + rest.lstrip("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    engine_kwargs: dict[str, Any] = (
        {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}} if base == "sqlite" else {"pool_pre_ping": True}
    )
    try:
        with refuse_locked(spec):
            return optuna.storages.RDBStorage(spec, engine_kwargs=engine_kwargs)
    except ImportError as err:
        raise UserError(
            f"Optuna storage {spec!r}: its database driver is not installed ({err}). "
            f"Fix: install it (e.g. psycopg2-binary for postgresql, PyMySQL with mysql+pymysql://)."
        ) from err


@contextlib.contextmanager
def refuse_locked(spec: str) -> Iterator[None]:
    """Turns SQLite's "database is locked" (another process held the Optuna database past SQLITE_BUSY_TIMEOUT_S)
    into one line that says who may hold it and what to do, instead of SQLAlchemy's traceback."""
    from sqlalchemy.exc import OperationalError

    try:
        yield
    except OperationalError as err:
        if "database is locked" not in str(err.orig):
            raise
        raise UserError(
            f"Optuna storage {redact(spec)}: the database is locked by another process (waited "
            f"{SQLITE_BUSY_TIMEOUT_S} s): another `sharpscale run` or `resume` of this study, an optuna-dashboard, or "
            f"a script holding it open. Fix: wait for that process to end or stop it, then run again; or give this run "
            f"its own state with --storage DIR."
        ) from None


def optuna_distribution(dom: Domain):
    """The Optuna distribution of a study-file domain."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    if isinstance(dom, LogUniform):
        return FloatDistribution(dom.low, dom.high, log=True)
    if isinstance(dom, Uniform):
        return FloatDistribution(dom.low, dom.high)
    if isinstance(dom, IntRange):
        return IntDistribution(dom.low, dom.high, log=dom.log)
    if isinstance(dom, Choice):
        return CategoricalDistribution(dom.values)
    raise TypeError(f"unknown domain {dom!r}")


def startup_trials(trials: int) -> int:
    """Random trials of a cell of `trials` trials before its model (TPE or GP) proposes the rest."""
    # Optuna's default, 10 random trials, exceeds a whole cell here (4-8 trials): every "TPE" search was random
    # search. A quarter of the budget (at least 1, at most Optuna's 10) leaves most of it to the model: 1 of 4,
    # 2 of 8. On a noisy 1-D bump in log(rho) at 4 and 8 trials (the shipped budgets), 1-2 random trials found
    # better values than 3 or 10. Optuna counts only finished trials here, so trials started together at the
    # beginning of a cell are all random whatever this number is.
    return max(1, min(10, trials // 4))


def make_sampler(kind: str, seed: int, space: dict[str, Domain], trials: int):
    """The Optuna sampler of one cell: `kind` is the study's budget.sampler, `trials` the cell's budget."""
    import optuna

    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "grid":
        grid = {
            path: list(dom.values) if isinstance(dom, Choice) else list(range(dom.low, dom.high + 1))
            for path, dom in space.items()
        }
        return optuna.samplers.GridSampler(grid, seed=seed)
    if kind == "gp":
        # Models a cell's few trials far better than TPE: on a 1-D bump in log(rho), 8 trials, the best trial lay
        # about 0.01 decades from the optimum (TPE about 0.1, random search 0.12), at a fraction of a second per
        # proposal. Trials sampled while others of the cell run are spread by its batch acquisition (qLogEI).
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup_trials(trials))
    if kind == "tpe":
        # constant_liar: a running trial counts as a poor result, so trials of a cell sampled while others run
        # move away from them instead of duplicating them.
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=startup_trials(trials), multivariate=True, constant_liar=True
        )
    raise ValueError(f"unknown sampler {kind!r}")


def _cell_seed(seed: int, index: int, existing: int) -> int:
    # A study reopened on resume already holds trials: a sampler seeded as on the first run would replay its
    # first random draws and propose those trials' values again.
    return (seed * 1_000_003 + index * 7_919 + existing) % 2**32


class CellSearcher(Searcher):
    """Hands out each cell's trials, each cell searched by its own Optuna study (ask/tell) in one Optuna storage.

    Every Optuna trial carries its Tune trial id, its cell and (from its first result on) its MLflow run id as
    user attributes. A diverged or failed trial reaches Optuna as FAIL, so no Optuna trial stays RUNNING.
    storage_url: an Optuna storage spec (see `open_optuna_storage`).
    confirm_seeds: cell key -> the seeds of its confirm stage (studies.confirm); once every search trial of a cell
    has ended, one trial per seed at the knobs the search chose, its payload built by
    `payload(cell, sample, confirm=(seed, chosen run name))`. The searcher waits (suggests nothing) while a cell
    with seeds left has not chosen.
    """

    def __init__(
        self,
        cells: list[Cell],
        *,
        metric: str,
        mode: str,
        sampler: str,
        seed: int,
        storage_url: str,
        study_name: str,
        payload: Callable[..., dict[str, Any]],
        confirm_seeds: dict[str, list[int]] | None = None,
        owner: str | None = None,
    ):
        super().__init__(metric=metric, mode=mode)
        self._cells = {c.key: c for c in cells}
        self._order = [c.key for c in cells]
        self._payload = payload
        self._sampler_kind = sampler
        self._seed = seed
        self._storage_url = storage_url
        self._study_name = study_name
        self._owner = owner
        self._issued = {c.key: 0 for c in cells}
        self._trial_cell: dict[str, str] = {}
        self._live: dict[str, int] = {}  # Tune trial id -> its Optuna trial's number, until told
        self._run_ids: set[str] = set()  # Tune trials whose Optuna trial holds their MLflow run id
        self._samples: dict[str, tuple[dict[str, Any], str]] = {}  # Tune trial id -> (its sample, its run name)
        self._confirm = ConfirmState(
            mode=mode, seeds=dict(confirm_seeds or {}), searched={c.key: c.trials for c in cells}
        )
        self._open()
        for key in self._order:
            if self._cells[key].space:
                self._study(key)  # every cell's study exists, and the storage is reachable, before any trial starts

    def _open(self) -> None:
        self._storage = None
        self._studies: dict[str, Any] = {}
        self._study_ids: dict[str, int] = {}

    # Tune pickles the searcher (tuner.pkl); an open storage holds a database engine or a file lock.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_storage", "_studies", "_study_ids"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"_owner": None, **state})  # a searcher pickled before launches had owners
        self._open()

    def optuna_study_name(self, key: str) -> str:
        """The name of a cell's Optuna study in the storage."""
        return f"{self._study_name}:{key or 'all'}"

    def _study(self, key: str):
        study = self._studies.get(key)
        if study is not None:
            return study
        import optuna

        if self._storage is None:
            self._storage = open_optuna_storage(self._storage_url)
        name = self.optuna_study_name(key)
        direction = "maximize" if self.mode == "max" else "minimize"
        with refuse_locked(self._storage_url):  # a cell's first use writes: another process may hold the db
            created = optuna.create_study(
                storage=self._storage, study_name=name, direction=direction, load_if_exists=True
            )
            self._check_owner(created)
            existing = len(created.get_trials(deepcopy=False))
            cell = self._cells[key]
            seed = _cell_seed(self._seed, self._order.index(key), existing)
            sampler = make_sampler(self._sampler_kind, seed, cell.space, cell.trials)
            study = optuna.load_study(study_name=name, storage=self._storage, sampler=sampler)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names([self.metric])  # optuna-dashboard then names the objective, e.g. "val_acc"
            self._studies[key] = study
            self._study_ids[key] = self._storage.get_study_id_from_name(name)
        return study

    def _check_owner(self, study) -> None:
        """Each cell's Optuna study belongs to one launch (its MLflow study run): set on creation, checked after."""
        if self._owner is None:
            return
        owner = study.user_attrs.get(OWNER_ATTR)
        if owner is None:
            study.set_user_attr(OWNER_ATTR, self._owner)
        elif owner != self._owner:
            raise UserError(
                f"optuna_storage: the Optuna study {study.study_name!r} in {redact(self._storage_url)} belongs to "
                f"another launch (MLflow study run {owner}), not to this one ({self._owner}); the two searches would "
                f"mix. Fix: give this launch its own storage (--storage or --set optuna_storage=...), or resume that "
                f"launch from the store it ran with (--tracking-uri)."
            )

    def _update_trial(self, trial_id: str, write: Callable[[Any, int], None]) -> bool:
        """Write to the running Optuna trial of a Tune trial through the storage (the Optuna trial of a restored
        Tune trial has no Trial object); False when it has already finished."""
        import optuna

        key = self._trial_cell[trial_id]
        self._study(key)
        optuna_id = self._storage.get_trial_id_from_study_id_trial_number(self._study_ids[key], self._live[trial_id])
        try:
            write(self._storage, optuna_id)
        except optuna.exceptions.UpdateFinishedTrialError:
            return False  # told after the last snapshot, reported again on resume: it keeps what it has
        return True

    @contextlib.contextmanager
    def _recording(self, what: str) -> Iterator[None]:
        """A write to the Optuna storage that a full disk refuses: noted for the runner (which stops the study and
        says so) instead of raised into Tune, whose trace of it ends the study with hundreds of lines."""
        try:
            yield
        except Exception as err:
            full = no_space(err)
            if full is None:
                raise
            note_no_space(
                self._study_name, f"the Optuna storage {redact(self._storage_url)} could not record {what} ({full})"
            )

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # fixed at construction; Tune's own metric/mode must agree (the runner sets both)

    def suggest(self, trial_id: str):
        # A full disk stopped the study (the runner's stopper ends it): nothing new is started, but not FINISHED,
        # which Tune's SearchGenerator saves in its state, so that a resumed launch would start no new trial.
        if self._study_name in NO_SPACE:
            return None
        with self._recording("a new trial"):
            return self._suggest(trial_id)
        return None

    def _suggest(self, trial_id: str):
        pending = [k for k in self._order if self._issued[k] < self._cells[k].trials]
        if not pending:
            return self._suggest_confirm(trial_id)
        # Fewest-issued first keeps every cell moving, so a time limit cuts all cells evenly.
        key = min(pending, key=lambda k: (self._issued[k] / self._cells[k].trials, self._order.index(k)))
        cell = self._cells[key]
        sample: dict[str, Any] = {}
        if cell.space:
            trial = self._study(key).ask({path: optuna_distribution(dom) for path, dom in cell.space.items()})
            trial.set_user_attr(TUNE_TRIAL_ATTR, trial_id)
            trial.set_user_attr(CELL_ATTR, key)
            sample = {path: trial.params[path] for path in cell.space}
            self._live[trial_id] = trial.number
        # NUMBERING (studies.records): zero-based, a searched trial's number is its Optuna trial number (the
        # dashboard's "Trial N"), a plain cell's the trials issued before it.
        number = trial.number if cell.space else self._issued[key]
        self._issued[key] += 1
        self._trial_cell[trial_id] = key
        name = trial_run_name(cell, sample, number)
        if cell.space:
            trial.set_user_attr(RUN_NAME_ATTR, name)
        self._samples[trial_id] = (sample, name)
        return {**self._payload(cell, sample), "run_name": name}

    def _suggest_confirm(self, trial_id: str):
        """The next confirm trial; None (ask again later) while a cell is still searching; else FINISHED."""
        nxt = self._confirm.next_confirm(self._order)
        if nxt is None:
            return None if self._confirm.waiting() else Searcher.FINISHED
        key, seed, choice = nxt
        cell = self._cells[key]
        self._trial_cell[trial_id] = key
        self._confirm.confirm_trials.add(trial_id)
        # next_confirm counted this one already: its zero-based number (NUMBERING) is one less.
        name = f"{trial_run_name(cell, choice.sample, self._confirm.issued[key] - 1)} confirm seed={seed}"
        return {**self._payload(cell, choice.sample, confirm=(seed, choice.run_name)), "run_name": name}

    def unconfirmed(self) -> list[str]:
        """Keys of the cells whose confirm stage cannot run (every search trial failed)."""
        return self._confirm.unconfirmed()

    def _note_run_id(self, trial_id: str, result: dict) -> None:
        run_id = str(result.get(RUN_ID_RESULT_KEY) or "")
        if not run_id or trial_id in self._run_ids:
            return
        if self._update_trial(trial_id, lambda storage, t: storage.set_trial_user_attr(t, MLFLOW_RUN_ATTR, run_id)):
            self._run_ids.add(trial_id)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        with self._recording(f"a result of trial {trial_id}"):
            self._on_trial_result(trial_id, result)

    def _on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id not in self._live:
            return  # a cell with nothing to search
        self._note_run_id(trial_id, result)
        value, step = result.get(self.metric), result.get("epoch")
        if step is None and isinstance(result.get("training_iteration"), int):
            step = result["training_iteration"] - 1  # Tune counts results from 1
        step = int(step) if isinstance(step, (int, float)) and math.isfinite(step) else None
        if isinstance(value, (int, float)) and math.isfinite(value) and step is not None:
            # The per-epoch curve, for optuna-dashboard, at step = epoch, zero-based as MLflow's (records.NUMBERING);
            # a step reported again after a resume overwrites its value.
            self._update_trial(trial_id, lambda storage, t: storage.set_trial_intermediate_value(t, step, float(value)))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        with self._recording(f"the end of trial {trial_id} (its Optuna trial stays RUNNING until `resume`)"):
            self._on_trial_complete(trial_id, result, error)

    def _on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id in self._confirm.confirm_trials:
            return  # measures a choice, chooses nothing
        result = result or {}
        value = result.get(self.metric)
        failed = error or result.get("diverged") or not isinstance(value, (int, float)) or not math.isfinite(value)
        if trial_id in self._samples:
            sample, name = self._samples[trial_id]
            started = self._live.get(trial_id, 0)  # the Optuna trial number: the cell's start order
            self._confirm.search_ended(self._trial_cell[trial_id], trial_id, value, bool(failed), sample, name, started)
        if trial_id not in self._live:
            return  # a cell with nothing to search
        import optuna

        self._note_run_id(trial_id, result)
        key, number = self._trial_cell[trial_id], self._live.pop(trial_id)
        study = self._study(key)
        frozen = self._storage.get_trial(
            self._storage.get_trial_id_from_study_id_trial_number(self._study_ids[key], number)
        )
        if frozen.state.is_finished() and frozen.user_attrs.get(INTERRUPTED_ATTR):
            # Cut short by Ctrl-C and told FAIL then; resumed, it has ended now: record it under a new trial.
            study.add_trial(
                optuna.trial.create_trial(
                    params=frozen.params,
                    distributions=frozen.distributions,
                    user_attrs={
                        **{k: v for k, v in frozen.user_attrs.items() if k != INTERRUPTED_ATTR},
                        RESUMED_FROM_ATTR: number,
                    },
                    state=optuna.trial.TrialState.FAIL if failed else optuna.trial.TrialState.COMPLETE,
                    value=None if failed else float(value),
                )
            )
        elif failed:
            # Ray would pass a nan result on as COMPLETE, which Optuna rejects, leaving the trial RUNNING forever.
            study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        else:
            study.tell(number, float(value), skip_if_finished=True)

    def fail_unfinished(self, *, interrupted: bool = False) -> int:
        """Tell FAIL to every trial of the cells' studies still RUNNING; returns how many.

        For after Tune has stopped trials (the study's time limit, or Ctrl-C): a stopped trial never reaches
        `on_trial_complete`, and its Optuna trial would stay RUNNING forever. interrupted: Ctrl-C stopped them,
        and `resume` may continue them; each is marked INTERRUPTED_ATTR so that its result is then recorded.
        """
        failed = 0
        with self._recording("the end of the trials Tune stopped (their Optuna trials stay RUNNING until `resume`)"):
            failed = self._fail_unfinished(interrupted)
        return failed

    def _fail_unfinished(self, interrupted: bool) -> int:
        import optuna

        failed = 0
        for key in self._order:
            if not self._cells[key].space:
                continue
            study = self._study(key)
            for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                if interrupted:
                    optuna_id = self._storage.get_trial_id_from_study_id_trial_number(
                        self._study_ids[key], trial.number
                    )
                    self._storage.set_trial_user_attr(optuna_id, INTERRUPTED_ATTR, True)
                study.tell(trial.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
                failed += 1
        return failed

    # Tune names the file searcher-state-*.pkl, but it holds JSON: the storage may be shared, and state read back
    # from it is data, never code (a pickle would run whatever a writer to that folder planted).
    def save(self, checkpoint_path: str) -> None:
        state = {
            "format": SEARCHER_STATE_FORMAT,
            "issued": self._issued,
            "trial_cell": self._trial_cell,
            "live": self._live,
            "run_ids": sorted(self._run_ids),
            "samples": {t: [sample, name] for t, (sample, name) in self._samples.items()},
            "confirm": _confirm_to_json(self._confirm),
        }
        with open(checkpoint_path, "w", encoding="utf-8") as f:
            json.dump(state, f)

    def restore(self, checkpoint_path: str) -> None:
        import optuna

        state = read_searcher_state(checkpoint_path, set(self._order))
        self._issued, self._trial_cell = state["issued"], state["trial_cell"]
        self._live, self._run_ids = state["live"], set(state["run_ids"])
        self._samples = {t: (sample, name) for t, (sample, name) in state["samples"].items()}
        self._confirm = _confirm_from_json(state["confirm"], self._confirm)
        tracked = {(self._trial_cell[t], number) for t, number in self._live.items()}
        for key in self._order:
            if not self._cells[key].space:
                continue
            study = self._study(key)
            for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                # Asked after the last snapshot, so no Tune trial will ever report it: fail it, or it stays RUNNING.
                if (key, trial.number) not in tracked:
                    study.tell(trial.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)


SEARCHER_STATE_FORMAT = "sharpscale.searcher/1"


def _confirm_to_json(state: ConfirmState) -> dict[str, Any]:
    """What of the confirm stage's book changes as trials end (its settings come from the study), as JSON data."""
    return {
        "ended": {k: sorted(v) for k, v in state.ended.items()},
        "results": {k: {t: list(r) for t, r in v.items()} for k, v in state.results.items()},
        "chosen": {k: {"sample": c.sample, "run_name": c.run_name, "value": c.value} for k, c in state.chosen.items()},
        "issued": dict(state.issued),
        "confirm_trials": sorted(state.confirm_trials),
    }


def _confirm_from_json(data: dict[str, Any], current: ConfirmState) -> ConfirmState:
    """`_confirm_to_json`'s data back on the study's own settings (`current`: the searcher's book as built)."""
    return ConfirmState(
        mode=current.mode,
        seeds=current.seeds,
        searched=current.searched,
        ended={str(k): {str(t) for t in v} for k, v in data["ended"].items()},
        results={
            str(k): {str(t): (float(r[0]), dict(r[1]), str(r[2]), int(r[3])) for t, r in v.items()}
            for k, v in data["results"].items()
        },
        chosen={
            str(k): CellChoice(
                sample=None if c["sample"] is None else dict(c["sample"]),
                run_name=None if c["run_name"] is None else str(c["run_name"]),
                value=None if c["value"] is None else float(c["value"]),
            )
            for k, c in data["chosen"].items()
        },
        issued={str(k): int(v) for k, v in data["issued"].items()},
        confirm_trials={str(t) for t in data["confirm_trials"]},
    )


def _confirm_readable(data: dict[str, Any]) -> bool:
    try:
        _confirm_from_json(data, ConfirmState(mode="max", seeds={}, searched={}))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return False
    return True


def read_searcher_state(path: str, cells: set[str]) -> dict[str, Any]:
    """The searcher's saved state at `path`, checked to be the data `CellSearcher.save` writes, else a UserError."""

    def refused(why: str) -> UserError:
        return UserError(
            f"resume: the searcher state {path} is {why}; it is read as JSON data only (never unpickled). Fix: "
            f"restore the file this run wrote there, or start the study anew (`sharpscale run --new-launch`)."
        )

    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (UnicodeDecodeError, ValueError) as err:
        raise refused(f"not sharpscale's JSON state ({type(err).__name__}; a pickle from an older version, or planted)")
    ints = lambda d: isinstance(d, dict) and all(isinstance(k, str) and type(v) is int for k, v in d.items())  # noqa: E731
    if not (
        isinstance(state, dict)
        and state.get("format") == SEARCHER_STATE_FORMAT
        and ints(state.get("issued"))
        and set(state["issued"]) == cells
        and ints(state.get("live"))
        and isinstance(state.get("trial_cell"), dict)
        and all(isinstance(k, str) and v in cells for k, v in state["trial_cell"].items())
        and isinstance(state.get("run_ids"), list)
        and all(isinstance(r, str) for r in state["run_ids"])
        and isinstance(state.get("samples"), dict)
        and all(
            isinstance(v, list) and len(v) == 2 and isinstance(v[0], dict) and isinstance(v[1], str)
            for v in state["samples"].values()
        )
        and isinstance(state.get("confirm"), dict)
        and _confirm_readable(state["confirm"])
    ):
        raise refused(f"not the state of this study's searcher (format {SEARCHER_STATE_FORMAT}, cells {sorted(cells)})")
    return state


def apply_sample(config: dict[str, Any], sample: dict[str, Any]) -> dict[str, Any]:
    """The cell's config with the sampled values set at their dotted paths."""
    tree = copy.deepcopy(config)
    for path, value in sample.items():
        set_path(tree, path, value)
    return tree
