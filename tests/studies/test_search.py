"""The per-cell Optuna search on real Optuna storage (SQLite file, journal file): sampling, records, save/restore.

The sampling tests run hundreds of seeded trials through the searcher on a journal file: the samplers read the
same trials from either storage, and SQLite's per-write commits would make them take minutes instead of seconds.
"""

import itertools
import math
import pickle
import typing
from pathlib import Path

import numpy as np
import optuna
import pytest

from studies.search import (
    CELL_ATTR,
    MLFLOW_RUN_ATTR,
    RUN_NAME_ATTR,
    TUNE_TRIAL_ATTR,
    CellSearcher,
    make_sampler,
    open_optuna_storage,
    optuna_distribution,
    startup_trials,
)
from studies.spec import Budget, Cell, Choice, LogUniform, load_study
from studies.tuning import _max_concurrent_trials
from trainables.ray_train import DistributedPlan

STUDIES = sorted((Path(__file__).resolve().parents[2] / "studies").glob("*.yaml"))
RHO = "optimizer.hparams.rho"
SPACE = {RHO: LogUniform(type="loguniform", low=0.01, high=1.0)}
FAIL, RUNNING, COMPLETE = (
    optuna.trial.TrialState.FAIL,
    optuna.trial.TrialState.RUNNING,
    optuna.trial.TrialState.COMPLETE,
)


def _payload(cell, sample):  # module level: the searcher must pickle as Tune pickles it
    return {"cell": cell.key, **sample}


def _searcher(storage, trials, *, sampler="tpe", seed=0, cells=None, name="s"):
    cells = cells or [Cell(key="method=sam", levels={"method": "sam"}, config={}, space=SPACE, trials=trials)]
    return CellSearcher(
        cells,
        metric="val_acc",
        mode="max",
        sampler=sampler,
        seed=seed,
        storage_url=storage,
        study_name=name,
        payload=_payload,
    )


def _study(storage, key="method=sam"):
    return optuna.load_study(study_name=f"s:{key}", storage=storage)


def _shipped_budgets(data_root):
    budgets = set()
    for path in STUDIES:
        study = load_study(path, overrides={"data.root": str(data_root)})
        if study.spec.budget.sampler in ("tpe", "gp"):
            budgets |= {c.trials for c in study.cells if c.space}
    return sorted(budgets)


def test_shipped_budgets_leave_most_trials_to_the_model(tmp_path):
    budgets = _shipped_budgets(tmp_path)
    assert budgets == [4, 6, 8]  # a change here means the budgets below no longer match the shipped studies
    for trials in budgets:
        assert 1 <= startup_trials(trials) < trials / 2, trials
    assert startup_trials(200) == 10  # large budgets: Optuna's own default


def _journal(tmp_path):
    return f"journal://{tmp_path / 'optuna.log'}"


def _best_found(storage, sampler, trials, seed):
    """Log-distance to the optimum (rho = 0.1) of the best trial one cell's search finds on a bump in log(rho)."""
    searcher = _searcher(storage, trials, sampler=sampler, seed=seed, name=f"{sampler}{trials}-{seed}")
    best = math.inf
    for i in range(trials):
        dist = abs(math.log10(searcher.suggest(f"t{i}")[RHO]) + 1.0)
        searcher.on_trial_complete(f"t{i}", {"val_acc": 1.0 - dist})
        best = min(best, dist)
    return best


@pytest.mark.parametrize(
    "sampler, trials, seeds, ratio",
    # Measured over the first 40 seeds: tpe 0.68 of random search's distance at 4 trials, 0.45 at 8; gp ~0.1 at 8.
    [("tpe", 4, 40, 0.85), ("tpe", 8, 20, 0.7), ("gp", 8, 4, 0.5)],
)
def test_the_model_finds_better_values_than_random_search_at_the_shipped_budgets(
    tmp_path, sampler, trials, seeds, ratio
):
    # The same seeds and objective for both: only the sampler differs. With Optuna's default startup (10 random
    # trials) neither model runs at all in a 4- or 8-trial cell: both would be random search (ratio 1).
    storage = _journal(tmp_path)
    found = {k: np.mean([_best_found(storage, k, trials, s) for s in range(seeds)]) for k in (sampler, "random")}
    assert found[sampler] < ratio * found["random"], found


def _pending_spread(ask, done):
    """Min pairwise log10-distance of 4 proposals made while all 4 are pending, after `done` finished trials."""
    for i in range(done):
        rho = ask.suggest(f"d{i}")[RHO]
        ask.on_trial_complete(f"d{i}", {"val_acc": -abs(math.log10(rho) + 1.0)})
    xs = [math.log10(ask.suggest(f"p{i}")[RHO]) for i in range(4)]
    return min(abs(a - b) for a, b in itertools.combinations(xs, 2))


class _NoLiar:
    """The same TPE and startup rule on plain Optuna, without the constant liar: what the test must reject."""

    def __init__(self, storage, trials, seed):
        sampler = optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=startup_trials(trials), multivariate=True, constant_liar=False
        )
        self.study = optuna.create_study(storage=open_optuna_storage(storage), direction="maximize", sampler=sampler)
        self.trials = {}

    def suggest(self, trial_id):
        trial = self.study.ask({RHO: optuna_distribution(SPACE[RHO])})
        self.trials[trial_id] = trial
        return dict(trial.params)

    def on_trial_complete(self, trial_id, result):
        self.study.tell(self.trials[trial_id], result["val_acc"])


# An 8-trial cell: its random trials finished, then 4 trials sampled while all 4 run (4 GPUs free at once).
PENDING_TRIALS, NEAR = 8, 0.05  # 0.05 decades: rho values within 12% of each other


@pytest.mark.parametrize("sampler, seeds", [("tpe", 12), ("gp", 3)])
def test_concurrent_trials_of_a_cell_are_not_near_duplicates(tmp_path, sampler, seeds):
    storage, done = _journal(tmp_path), startup_trials(PENDING_TRIALS)
    spread = [
        _pending_spread(_searcher(storage, PENDING_TRIALS, sampler=sampler, seed=s, name=f"{sampler}{s}"), done)
        for s in range(seeds)
    ]
    assert np.median(spread) > NEAR, spread


def test_without_the_constant_liar_tpe_piles_concurrent_trials_up(tmp_path):
    # What the test above rejects: the same TPE and startup, no liar, proposes 4 near-copies of the best so far.
    storage, done = _journal(tmp_path), startup_trials(PENDING_TRIALS)
    no_liar = [_pending_spread(_NoLiar(storage, PENDING_TRIALS, s), done) for s in range(12)]
    assert np.median(no_liar) < NEAR, no_liar


def test_records_link_each_optuna_trial_to_its_tune_trial_cell_and_mlflow_run(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    cells = [
        Cell(key="method=sam", levels={"method": "sam"}, config={}, space=SPACE, trials=3),
        Cell(key="method=none", levels={"method": "none"}, config={}, space={}, trials=1),
    ]
    searcher = _searcher(storage, 3, cells=cells)
    issued = [searcher.suggest(f"t{i}") for i in range(4)]
    assert searcher.suggest("t4") == "FINISHED"
    assert [p["cell"] for p in issued].count("method=none") == 1
    sam = [f"t{i}" for i, p in enumerate(issued) if p["cell"] == "method=sam"]
    result = {"mlflow_run_id": "run-a"}
    searcher.on_trial_result(sam[0], {"val_acc": 0.5, "training_iteration": 1, "epoch": 0, **result})
    searcher.on_trial_result(sam[0], {"val_acc": 0.7, "training_iteration": 2, "epoch": 1, **result})
    searcher.on_trial_complete(sam[0], {"val_acc": 0.7, "mlflow_run_id": "run-a"})
    searcher.on_trial_complete(sam[1], {"val_acc": float("nan"), "diverged": 1, "mlflow_run_id": "run-b"})
    searcher.on_trial_complete(sam[2], None, error=True)  # died before its first result

    study = _study(storage)
    assert study.metric_names == ["val_acc"]
    assert optuna.get_all_study_names(storage) == ["s:method=sam"]  # a cell with nothing to search has no study
    first, diverged, errored = study.trials
    # Its MLflow run by id and by name: the run name the trial's payload carries, e.g. 'sam rho=0.125 #0', numbered
    # as optuna-dashboard shows it (Trial 0: NUMBERING, zero-based), as is every later trial of the cell.
    name = issued[int(sam[0][1:])]["run_name"]
    assert name.startswith("sam rho=") and name.endswith(" #0") and first.number == 0
    assert [issued[int(t[1:])]["run_name"].rsplit("#", 1)[1] for t in sam] == ["0", "1", "2"]
    assert issued[[p["cell"] for p in issued].index("method=none")]["run_name"].endswith("#0")
    assert first.user_attrs == {
        TUNE_TRIAL_ATTR: sam[0],
        CELL_ATTR: "method=sam",
        MLFLOW_RUN_ATTR: "run-a",
        RUN_NAME_ATTR: name,
    }
    assert (
        first.state == COMPLETE and first.value == 0.7 and first.intermediate_values == {0: 0.5, 1: 0.7}
    )  # epoch k at step k, as in MLflow
    assert diverged.state == FAIL and diverged.user_attrs[MLFLOW_RUN_ATTR] == "run-b"
    assert errored.state == FAIL and MLFLOW_RUN_ATTR not in errored.user_attrs
    assert errored.user_attrs[TUNE_TRIAL_ATTR] == sam[2]


def test_save_restore_fails_the_trial_asked_after_the_snapshot(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    searcher = _searcher(storage, 4)
    pickled = pickle.dumps(searcher)  # what Tune keeps of the searcher from the start (tuner.pkl)
    searcher.suggest("t0")
    searcher.suggest("t1")
    searcher.on_trial_complete("t0", {"val_acc": 0.6, "mlflow_run_id": "run-0"})
    searcher.save(str(tmp_path / "snapshot.pkl"))
    searcher.suggest("t2")  # asked after the snapshot; then the driver dies
    assert [t.state for t in _study(storage).trials] == [COMPLETE, RUNNING, RUNNING]

    resumed = pickle.loads(pickled)
    resumed.restore(str(tmp_path / "snapshot.pkl"))
    assert [t.state for t in _study(storage).trials] == [COMPLETE, RUNNING, FAIL]
    # t1 goes on (Tune resumes it) and is recorded on its own Optuna trial; t2's place is issued again.
    resumed.on_trial_result("t1", {"val_acc": 0.4, "training_iteration": 1, "mlflow_run_id": "run-1"})
    resumed.on_trial_complete("t1", {"val_acc": 0.4, "mlflow_run_id": "run-1"})
    replacement = [resumed.suggest("t3"), resumed.suggest("t4")]
    assert all(RHO in p for p in replacement)
    assert resumed.suggest("t5") == "FINISHED"
    for tid in ("t3", "t4"):
        resumed.on_trial_complete(tid, {"val_acc": 0.5})
    trials = _study(storage).trials
    assert [t.state for t in trials] == [COMPLETE, COMPLETE, FAIL, COMPLETE, COMPLETE]
    assert trials[1].user_attrs[MLFLOW_RUN_ATTR] == "run-1" and trials[1].intermediate_values == {
        0: 0.4
    }  # no epoch key: Tune's iteration 1 is epoch 0
    assert [t.user_attrs[TUNE_TRIAL_ATTR] for t in trials] == ["t0", "t1", "t2", "t3", "t4"]
    # A reopened study's sampler is not the first run's again: the replacement is not a replay of t0's draw.
    assert trials[3].params[RHO] != trials[0].params[RHO]


def test_a_full_disk_asks_later_and_leaves_the_search_unfinished_for_resume(tmp_path, monkeypatch):
    # Tune's SearchGenerator saves `finished` in its state: had the searcher said FINISHED on a full disk, a
    # resumed launch would start no new trial. No Ray cluster: the generator only asks the searcher.
    from ray.tune.search.search_generator import SearchGenerator

    from studies import search

    generator = SearchGenerator(_searcher(f"sqlite:///{tmp_path / 'o.db'}", 4))
    monkeypatch.setitem(search.NO_SPACE, "s", (0.0, ["the Optuna storage could not record a new trial"]))
    assert generator.searcher.suggest("t0") is None  # ask again later; the runner's stopper ends the run
    assert generator.create_trial_if_possible({}) is None
    assert generator.get_state()["finished"] is False  # what a resumed launch restores


def test_journal_storage(tmp_path):
    spec = f"journal://{tmp_path / 'nfs' / 'optuna.log'}"  # journal:///abs/path
    searcher = _searcher(spec, 2)
    for i in range(2):
        searcher.suggest(f"t{i}")
        searcher.on_trial_complete(f"t{i}", {"val_acc": 0.1 * i, "mlflow_run_id": f"run-{i}"})
    # Another process reads the same file.
    study = optuna.load_study(study_name="s:method=sam", storage=open_optuna_storage(spec))
    assert [t.state for t in study.trials] == [COMPLETE, COMPLETE]
    assert [t.user_attrs[MLFLOW_RUN_ATTR] for t in study.trials] == ["run-0", "run-1"]
    assert study.metric_names == ["val_acc"]
    assert (tmp_path / "nfs" / "optuna.log").stat().st_size > 0


@pytest.mark.parametrize(
    "spec, words",
    [
        ("journal://relative/optuna.log", "absolute file path"),
        ("journal:///shared/optuna/", "absolute file path"),
        ("redis://localhost:6379", "must be an RDB URL"),
        ("optuna.db", "must be an RDB URL"),
    ],
)
def test_bad_storage_spec_is_named_with_its_fix(spec, words):
    with pytest.raises(ValueError) as err:
        open_optuna_storage(spec)
    assert repr(spec) in str(err.value) and words in str(err.value) and "Fix:" in str(err.value)


@pytest.mark.parametrize("kind", typing.get_args(Budget.model_fields["sampler"].annotation))
def test_every_sampler_a_study_file_may_name_builds(kind):
    space = {RHO: Choice(type="choice", values=[0.05, 0.1])} if kind == "grid" else SPACE
    assert isinstance(make_sampler(kind, 0, space, 8), optuna.samplers.BaseSampler)


def test_concurrency_is_left_to_tune_unless_trials_are_worker_groups():
    cluster = {"CPU": 64.0, "GPU": 16.0, "node_a": 2.0}
    one = DistributedPlan(workers=1, cpus_per_worker=4, gpus_per_worker=1)
    assert _max_concurrent_trials(None, one, cluster) is None  # Tune places them: 16 at once, one per GPU
    assert _max_concurrent_trials(3, one, cluster) == 3
    # A 4-worker DDP trial books only its workers through Ray Train: 16 GPUs hold 4 such trials, 64 CPUs 8.
    ddp = DistributedPlan(workers=4, cpus_per_worker=2, gpus_per_worker=1)
    assert _max_concurrent_trials(None, ddp, cluster) == 4
    pinned = DistributedPlan(workers=2, cpus_per_worker=1, custom={"node_a": 1})
    assert _max_concurrent_trials(None, pinned, cluster) == 1
    assert _max_concurrent_trials(None, DistributedPlan(workers=2, cpus_per_worker=64), cluster) == 1  # never 0


def test_trials_stopped_for_good_are_failed_not_left_running(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    searcher = _searcher(storage, 4)
    for tid in ("t0", "t1", "t2"):
        searcher.suggest(tid)
    searcher.on_trial_complete("t0", {"val_acc": 0.6})
    assert searcher.fail_unfinished() == 2  # t1 and t2: stopped at the study's time limit
    assert [t.state for t in _study(storage).trials] == [COMPLETE, FAIL, FAIL]
    assert searcher.fail_unfinished() == 0


def test_a_trial_interrupted_then_resumed_is_recorded_once_more(tmp_path):
    from studies.search import INTERRUPTED_ATTR, RESUMED_FROM_ATTR

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    searcher = _searcher(storage, 2)
    searcher.suggest("t0")
    searcher.suggest("t1")
    searcher.on_trial_complete("t0", {"val_acc": 0.6})
    assert searcher.fail_unfinished(interrupted=True) == 1  # Ctrl-C: t1 is cut short, none stays RUNNING
    cut = _study(storage).trials[1]
    assert cut.state == FAIL and cut.user_attrs[INTERRUPTED_ATTR] is True
    # `resume`: Tune restores the searcher and continues t1, which now ends.
    restored = pickle.loads(pickle.dumps(searcher))
    restored.on_trial_complete("t1", {"val_acc": 0.7})
    trials = _study(storage).trials
    assert [t.state for t in trials] == [COMPLETE, FAIL, COMPLETE]
    assert trials[2].value == 0.7 and trials[2].params == cut.params
    assert trials[2].user_attrs[RESUMED_FROM_ATTR] == 1 and INTERRUPTED_ATTR not in trials[2].user_attrs
