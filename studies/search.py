"""One Tune searcher for a whole study: an Optuna study (through Ray Tune's OptunaSearch) per cell, round-robin."""

from __future__ import annotations

import copy
import math
import pickle
from typing import Any, Callable

from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from studies.spec import Cell, Choice, Domain, IntRange, LogUniform, Uniform, set_path

__all__ = ["CellSearcher", "apply_sample", "optuna_distribution"]


def optuna_distribution(dom: Domain):
    """The Optuna distribution of a study-file domain (what OptunaSearch samples from)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if isinstance(dom, LogUniform):
        return FloatDistribution(dom.low, dom.high, log=True)
    if isinstance(dom, Uniform):
        return FloatDistribution(dom.low, dom.high)
    if isinstance(dom, IntRange):
        return IntDistribution(dom.low, dom.high, log=dom.log)
    if isinstance(dom, Choice):
        return CategoricalDistribution(dom.values)
    raise TypeError(f"unknown domain {dom!r}")


def _sampler(kind: str, seed: int, space: dict[str, Domain]):
    import optuna

    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "grid":
        grid = {
            path: list(dom.values) if isinstance(dom, Choice) else list(range(dom.low, dom.high + 1))
            for path, dom in space.items()
        }
        return optuna.samplers.GridSampler(grid, seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


class CellSearcher(Searcher):
    """Hands out each cell's trials, each cell searched by its own Optuna study in one shared SQLite storage.

    A diverged or failed trial reaches Optuna as FAIL: Ray would pass its nan result on as COMPLETE, which
    Optuna rejects, leaving the Optuna trial RUNNING forever.
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
        payload: Callable[[Cell, dict[str, Any]], dict[str, Any]],
    ):
        super().__init__(metric=metric, mode=mode)
        self._cells = {c.key: c for c in cells}
        self._order = [c.key for c in cells]
        self._payload = payload
        self._issued = {c.key: 0 for c in cells}
        self._trial_cell: dict[str, str] = {}
        self._inner: dict[str, OptunaSearch | None] = {}
        self._storage_url = storage_url
        for i, cell in enumerate(cells):
            if not cell.space:
                self._inner[cell.key] = None
                continue
            self._inner[cell.key] = OptunaSearch(
                space={path: optuna_distribution(dom) for path, dom in cell.space.items()},
                metric=metric,
                mode=mode,
                sampler=_sampler(sampler, seed + i, cell.space),
                study_name=f"{study_name}:{cell.key or 'all'}",
                storage=self._storage(),
            )

    def _storage(self):
        import optuna

        return optuna.storages.RDBStorage(self._storage_url, engine_kwargs={"connect_args": {"timeout": 30}})

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # fixed at construction; Tune's own metric/mode must agree (the runner sets both)

    def suggest(self, trial_id: str):
        pending = [k for k in self._order if self._issued[k] < self._cells[k].trials]
        if not pending:
            return Searcher.FINISHED
        # Fewest-issued first keeps every cell moving, so a time limit cuts all cells evenly.
        key = min(pending, key=lambda k: (self._issued[k] / self._cells[k].trials, self._order.index(k)))
        inner = self._inner[key]
        sample = inner.suggest(trial_id) if inner is not None else {}
        self._issued[key] += 1
        self._trial_cell[trial_id] = key
        return self._payload(self._cells[key], sample)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        inner = self._inner.get(self._trial_cell.get(trial_id, ""))
        value = result.get(self.metric)
        if inner is not None and isinstance(value, (int, float)) and math.isfinite(value):
            inner.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        key = self._trial_cell.get(trial_id)
        inner = self._inner.get(key) if key is not None else None
        if inner is None:
            return
        value = (result or {}).get(self.metric)
        if error or not isinstance(value, (int, float)) or not math.isfinite(value) or (result or {}).get("diverged"):
            inner.on_trial_complete(trial_id, result=None, error=True)
        else:
            inner.on_trial_complete(trial_id, result=result, error=False)

    def save(self, checkpoint_path: str) -> None:
        inner = {}
        for key, s in self._inner.items():
            if s is None:
                continue
            # The Optuna study object holds an engine; the storage URL is enough to reopen it.
            inner[key] = {"ot_trials": {t: tr.number for t, tr in s._ot_trials.items()}, "completed": s._completed_trials}
        with open(checkpoint_path, "wb") as f:
            pickle.dump({"issued": self._issued, "trial_cell": self._trial_cell, "inner": inner}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            state = pickle.load(f)
        self._issued = state["issued"]
        self._trial_cell = state["trial_cell"]
        for key, saved in state["inner"].items():
            s = self._inner.get(key)
            if s is None:
                continue
            s._completed_trials = set(saved["completed"])
            if s._ot_study is None:
                s._setup_study(s._mode)
            trials = {t.number: t for t in s._ot_study.get_trials(deepcopy=False)}
            import optuna

            tracked = set()
            for tune_id, number in saved["ot_trials"].items():
                if number in trials and tune_id not in s._completed_trials:
                    s._ot_trials[tune_id] = optuna.trial.Trial(s._ot_study, trials[number]._trial_id)
                    tracked.add(number)
            # Asked after the last snapshot, so no Tune trial will ever report it: fail it, or it stays RUNNING.
            for number, frozen in trials.items():
                if frozen.state == optuna.trial.TrialState.RUNNING and number not in tracked:
                    s._ot_study.tell(number, state=optuna.trial.TrialState.FAIL)


def apply_sample(config: dict[str, Any], sample: dict[str, Any]) -> dict[str, Any]:
    """The cell's config with the sampled values set at their dotted paths."""
    tree = copy.deepcopy(config)
    for path, value in sample.items():
        set_path(tree, path, value)
    return tree
