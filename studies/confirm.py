"""The confirm stage of a study: each cell's choice from its search, and the fresh-seed trials that measure it."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

from analysis.runs import best_key
from studies.spec import Cell, set_path

__all__ = ["CellChoice", "ConfirmState", "confirm_config"]

# Why the stage exists: a cell's best of several search trials, reported on the data it was chosen on, is biased
# upwards by the choice itself (the winner's curse), and more so the more trials the cell searched and the noisier
# they are. Under "SAM = vanilla" the shipped data-scaling design (best of 4 SAM trials against one vanilla trial)
# showed a "significant" gain in 92% of simulated studies (issue 22; benchmarks/sim_selection.py). The confirm runs
# repeat the chosen knobs with seeds no search trial used, scored on the validation set's other half, so the
# numbers the report compares carry no selection.


def confirm_config(cell: Cell, sample: dict[str, Any], seed: int, subsets: str = "fixed") -> dict[str, Any]:
    """The trial config of one confirm run: the cell's, its chosen `sample`, a fresh `seed`, the held-out half;
    under `subsets` "per_seed" (confirm.subsets) also the seed's own training subset."""
    tree = copy.deepcopy(cell.config)
    for path, value in sample.items():
        set_path(tree, path, value)
    set_path(tree, "train.seed", seed)
    if subsets == "per_seed":
        # The same subset for every cell at one seed, so that cells still pair by seed; smaller fractions nest in
        # larger ones at each seed (trainables.data.load), so a scaling curve stays one draw per seed.
        set_path(tree, "data.fraction_seed", seed)
    set_path(tree, "data.eval_split", "test")
    return tree


@dataclass
class CellChoice:
    """What a cell's search chose: its sampled knobs and the run name of the trial that had them (None: nothing
    was searched, or `sample` is None when every search trial failed and there is nothing to confirm)."""

    sample: dict[str, Any] | None
    run_name: str | None = None
    value: float | None = None


@dataclass
class ConfirmState:
    """The searcher's book of the confirm stage: search trials ended per cell, their results, each cell's choice
    and the confirm trials it has issued. Plain data: Tune pickles it with the searcher, and a resumed study
    restores it from the last snapshot (search trials that ended after it end again, and choose again)."""

    mode: str
    seeds: dict[str, list[int]]  # cell key -> its confirm seeds (none: the cell has no confirm stage)
    searched: dict[str, int]  # cell key -> its planned search trials
    ended: dict[str, set[str]] = field(default_factory=dict)  # cell key -> Tune ids of its ended search trials
    # cell key -> Tune id -> (value, sample, run name, start order: the Optuna trial number, which the searcher
    # hands out in the order the cell's trials start)
    results: dict[str, dict[str, tuple[float, dict[str, Any], str, int]]] = field(default_factory=dict)
    chosen: dict[str, CellChoice] = field(default_factory=dict)
    issued: dict[str, int] = field(default_factory=dict)  # cell key -> confirm trials handed out
    confirm_trials: set[str] = field(default_factory=set)  # Tune ids of confirm trials

    def __post_init__(self) -> None:
        for key, n in self.searched.items():
            if self.seeds.get(key) and n == 0 and key not in self.chosen:
                self.chosen[key] = CellChoice(sample={})  # nothing to search: the cell's config is the choice

    @property
    def enabled(self) -> bool:
        return any(self.seeds.values())

    def search_ended(
        self, key: str, trial_id: str, value: Any, failed: bool, sample: dict[str, Any], run_name: str, started: int
    ) -> None:
        """A search trial of cell `key` ended (`started`: its place in the cell's start order); the cell chooses once
        all its planned search trials have."""
        if not self.seeds.get(key) or key in self.chosen:
            return
        self.ended.setdefault(key, set()).add(trial_id)
        if not failed and isinstance(value, (int, float)) and math.isfinite(value):
            self.results.setdefault(key, {})[trial_id] = (float(value), dict(sample), run_name, int(started))
        if len(self.ended[key]) >= self.searched[key]:
            self.chosen[key] = self._choose(key)

    def _choose(self, key: str) -> CellChoice:
        results = list(self.results.get(key, {}).values())
        if not results:
            return CellChoice(sample=None)
        # The one "best" of the report, the roll-ups and status (analysis.runs.BEST_RULE): a tie goes to the trial
        # that started first, never to the one that happened to end first.
        value, sample, name, _ = min(results, key=lambda r: best_key(r[0], r[3], r[2], self.mode))
        return CellChoice(sample=sample, run_name=name, value=value)

    def next_confirm(self, order: list[str]) -> tuple[str, int, CellChoice] | None:
        """(cell key, seed, choice) of the next confirm trial to issue, or None when none is ready."""
        for key in order:
            choice = self.chosen.get(key)
            done = self.issued.get(key, 0)
            if choice is not None and choice.sample is not None and done < len(self.seeds.get(key, [])):
                self.issued[key] = done + 1
                return key, self.seeds[key][done], choice
        return None

    def waiting(self) -> bool:
        """Whether a cell with a confirm stage has not chosen yet (its search trials still run)."""
        return any(self.seeds.get(k) and k not in self.chosen for k in self.searched)

    def unconfirmed(self) -> list[str]:
        """Cells whose confirm stage cannot run: every search trial failed."""
        return [k for k, c in self.chosen.items() if c.sample is None]
