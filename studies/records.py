"""The study's MLflow record: its experiment, launch, study and cell runs, how they close, and how they read in the UI.

Opened by `run` (experiment, choose_launch, parent_runs) or found by `resume` (resume_target), closed whatever ends the
study (close_dangling, mark_interrupted, drop_lost_trials, release); read in the UI through the experiment's kind, note
and opening view, trial names, source tags, and the roll-up of each cell's best trial onto its cell run, of the study's
best onto the study run, and of the answer table into the descriptions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.runs import ACCURACY_METRICS, BEST_RULE, REPORT_MARKER, UI_WORKFLOW, accuracy_se, best_key
from studies import identity
from studies.spec import Cell, LoadedStudy, StudyError
from trainables.metrics import EVERY_EPOCH_METRIC, VALIDATION_SAMPLES
from trainables.naming import (
    BEST_CELL_TAG,
    BEST_RUN_ID_TAG,
    BEST_RUN_TAG,
    CELL_TAG,
    CONFIRM_STAGE,
    GIT_COMMIT_TAG,
    KIND_TAG,
    LAUNCH_TAG,
    NOTE_TAG,
    PARENT_RUN_TAG,
    REASON_TAG,
    STAGE_TAG,
    STATUS_TAG,
    STUDY_FILE_HASH_TAG,
    STUDY_FILE_TAG,
    TRIAL_ID_TAG,
    factor_tag,
    kind_filter,
    study_run_name,
)
from trainables.tracking import NO_SPACE_REASON, _retry, filter_value, tracking_client

__all__ = [
    "EXPERIMENT_KIND",
    "EXPERIMENT_KIND_TAG",
    "INTERRUPTED_REASON",
    "NUMBERING",
    "RESULTS_MARKER",
    "VIEW_KEY",
    "CellBest",
    "Launch",
    "cell_end_time",
    "cell_params",
    "choose_launch",
    "close_dangling",
    "close_interrupted",
    "closing_steps",
    "describe_experiment",
    "drop_lost_trials",
    "experiment",
    "find_run",
    "find_study_run",
    "launch_of",
    "mark_interrupted",
    "open_launch",
    "parent_runs",
    "release",
    "resume_target",
    "results_table",
    "roll_up",
    "rollup_callback",
    "runs_page_path",
    "source_tags",
    "trial_params",
    "trial_run_name",
    "view_state",
]

# MLflow 3's UI opens an experiment on the page its kind names; without the tag it guesses, and guesses GenAI
# (traces, token usage). The value is the UI's, not the Python API's: tests/studies/test_records.py pins it
# against the installed UI bundle.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# The experiment's description is the study's note, this marker, then the answer table that every roll-up rewrites:
# the runs page renders it (markdown) above the runs, so the answer shows on the first screen without a click.
RESULTS_MARKER = "<!-- sharpscale: results -->"
# The runs page opens on a view saved as an experiment tag (MLflow's own "share view": the tag
# `mlflow.sharedViewState.<key>`, opened by `?viewStateShareKey=<key>`), the UI's names pinned by tests/studies/
# test_records.py against the installed bundle: every trial in one flat list, best first, with the objective and
# the knobs as columns.
VIEW_KEY = "sharpscale"
_VIEW_TAG_PREFIX = "mlflow.sharedViewState."
_WORKFLOW = UI_WORKFLOW  # MLflow 3's UI on its model-training side (analysis.runs)
# The roll-up's keys on cell and study runs: metrics (numbers) and tags (names).
BEST_PREFIX = "best."
_FAILED = ("failed", "diverged")
# Every count is logged each time, zeros included: MLflow shows a metric's latest value, and a count that fell
# back to zero (the last running trial ended) must not keep its old value.
COUNTED = ("finished", "failed", "early_stopped", "killed", "running")


def describe_experiment(client, experiment_id: str, study: LoadedStudy) -> None:
    """The experiment's kind (so the UI opens on its runs), its description (a place for the answer, above what the
    study asks), its primary metric, and the runs page's opening view (`view_state`)."""
    import json

    from mlflow.utils.mlflow_tags import (
        MLFLOW_EXPERIMENT_PRIMARY_METRIC_GREATER_IS_BETTER,
        MLFLOW_EXPERIMENT_PRIMARY_METRIC_NAME,
        MLFLOW_RUN_NOTE,
    )

    objective = study.spec.objective
    note = _retry(client.get_experiment, experiment_id).tags.get(MLFLOW_RUN_NOTE, "")
    # A resumed (or relaunched) study keeps the answer it has until its roll-up writes the new one.
    previous = note.split(RESULTS_MARKER, 1)[0].strip() if RESULTS_MARKER in note else _NOT_YET
    tags = {
        EXPERIMENT_KIND_TAG: EXPERIMENT_KIND,
        MLFLOW_RUN_NOTE: _with_results(experiment_note(study), previous),
        MLFLOW_EXPERIMENT_PRIMARY_METRIC_NAME: objective.column,
        MLFLOW_EXPERIMENT_PRIMARY_METRIC_GREATER_IS_BETTER: str(objective.mode == "max").lower(),
        f"{_VIEW_TAG_PREFIX}{VIEW_KEY}": json.dumps(view_state(study)),
    }
    for key, value in tags.items():
        _retry(client.set_experiment_tag, experiment_id, key, value)


def _column(kind: str, key: str) -> str:
    # How the runs table names a column: "metrics.`val_acc`" (the UI's makeCanonicalSortKey).
    return f"{kind}.`{key}`"


def view_state(study: LoadedStudy) -> dict[str, Any]:
    """The runs page's opening view: only the trials (no collapsed parents to click open), all of them, best first
    by the objective, the objective, the searched knobs and the cell as columns."""
    objective = study.spec.objective
    knobs = list(dict.fromkeys(p for c in study.cells for p in c.space))
    return {
        # search facets
        "searchFilter": kind_filter("trial"),
        "orderByKey": _column("metrics", objective.column),
        "orderByAsc": objective.mode == "min",
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        # what the table shows
        "selectedColumns": [
            _column("metrics", objective.column),
            *(_column("params", k) for k in knobs),
            _column("tags", CELL_TAG),
            _column("attributes", "Dataset"),
        ],
        "runsHiddenMode": "SHOW_ALL",
        "columnWidths": {_column("tags", "mlflow.runName"): 320},
    }


def runs_page_path(experiment_id: str, *, view: bool = True) -> str:
    """The address (after the server's root) of an experiment's runs page on the model-training side, opening on
    `view_state` when the experiment has it."""
    shared = f"&viewStateShareKey={VIEW_KEY}" if view else ""
    return f"/#/experiments/{experiment_id}/runs?{_WORKFLOW}{shared}"


def experiment_note(study: LoadedStudy) -> str:
    """The experiment's description: the study's own, the question its file's header states, how to read it."""
    header = []
    for line in study.text.splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lstrip("#").strip())
    objective = study.spec.objective
    parts = [study.spec.description, " ".join(header)] if header else [study.spec.description]
    parts.append(
        f"Objective: {objective.label}, {objective.mode}imised. Runs nest study > cell > trial; each cell run "
        f"carries its best trial's {BEST_PREFIX}{objective.column}, its best knobs ({BEST_PREFIX}<knob>) and its "
        f"trial counts, the study run the best cell's. Study file: {study.path}."
    )
    return "\n\n".join(p for p in parts if p)


def source_tags(study: LoadedStudy, commit: str) -> dict[str, str]:
    """MLflow's own source tags, which fill the UI's Source and Version columns."""
    from mlflow.utils.mlflow_tags import (
        MLFLOW_GIT_COMMIT,
        MLFLOW_SOURCE_NAME,
        MLFLOW_SOURCE_TYPE,
    )

    tags = {MLFLOW_SOURCE_NAME: str(study.path), MLFLOW_SOURCE_TYPE: "LOCAL"}
    if commit and commit != "unknown":
        tags[MLFLOW_GIT_COMMIT] = commit.removesuffix("-dirty")
    return tags


def _level_label(factor: str, level: str) -> str:
    # A named level (resnet, sam) says what it is; a list factor is a config path whose value needs its name.
    return f"{factor.rsplit('.', 1)[-1]}={level}" if "." in factor else level


def cell_label(cell: Cell) -> str:
    """A cell in a few characters: 'vit/sam', 'fraction=0.1/resnet/sam/seed=0'; 'all' without factors."""
    return "/".join(_level_label(f, lv) for f, lv in cell.levels.items()) or "all"


def _value_text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


# Every number that names a trial or an epoch is zero-based, as the tools it is read beside number them: MLflow logs
# epoch k at step k (its charts' x axis, `best_epoch`), and optuna-dashboard shows a cell's searched trial as
# "Trial k", k its Optuna number, which a trial run's name carries as "#k". Counts stay counts ("3/10 epochs",
# "1/4 trials"). docs/ui.md states the rule.
NUMBERING = "zero-based: trial #k is Optuna's Trial k in its cell, epoch k is MLflow's step k"


def trial_run_name(cell: Cell, sample: dict[str, Any], number: int) -> str:
    """A trial's run name: its cell, its sampled knobs and its zero-based number in the cell (NUMBERING), e.g.
    'vit/sam rho=0.034 #2' (Optuna's Trial 2 of the cell vit/sam)."""
    knobs = " ".join(f"{path.rsplit('.', 1)[-1]}={_value_text(v)}" for path, v in sample.items())
    return " ".join(p for p in (cell_label(cell), knobs, f"#{number}") if p)


# Config paths that name a trial whatever the study varies (a trial's row in MLflow reads as what it ran).
IDENTIFYING_PARAMS = ("model.name", "data.name", "data.fraction", "optimizer.method", "schedule.epochs", "train.seed")


def trial_params(study: LoadedStudy) -> list[str]:
    """The config paths a trial logs as MLflow params: those whose value differs between the study's cells, the
    searched knobs, and IDENTIFYING_PARAMS. Everything else is constant across the study: the whole config is in
    the trial run's tags and artifact (trainables.tracking.config_tags), and `load_runs` returns it."""
    from trainables.config import TrialConfig

    flats = [TrialConfig.load(c.config).flat() for c in study.cells]
    keys = dict.fromkeys(k for f in flats for k in f)
    varying = [k for k in keys if len({repr(f.get(k)) for f in flats}) > 1]
    searched = [p for c in study.cells for p in c.space]
    return list(dict.fromkeys([*IDENTIFYING_PARAMS, *varying, *searched]))


def cell_params(cell: Cell) -> dict[str, str]:
    """The params of a cell's run: its factor levels, its planned trials and what it searches."""
    params = {f"factor.{k}": v for k, v in cell.levels.items()}
    params["trials.planned"] = str(cell.planned)  # its search's and its confirm stage's
    for path, dom in cell.space.items():
        params[f"search.{path.rsplit('.', 1)[-1]}"] = ", ".join(f"{k}={v}" for k, v in dom.model_dump().items())
    return params


@dataclass
class CellBest:
    """A cell's trials as its run's roll-up states them."""

    value: float | None = None
    run_id: str | None = None
    run_name: str | None = None
    knobs: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    samples: float | None = None  # the best trial's validation samples (the SE of an accuracy needs them)
    key: tuple | None = None  # its rank by BEST_RULE (analysis.runs.best_key)


def _number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _cell_best(client, experiment_id: str, cell_run_id: str, cell: Cell, column: str, mode: str) -> CellBest:
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

    runs = _retry(
        client.search_runs,
        [experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{cell_run_id}'",
        max_results=10_000,
    )
    best = CellBest()
    for run in runs:
        status = run.data.tags.get(STATUS_TAG, "unknown")
        status = "failed" if status in _FAILED else status
        best.counts[status] = best.counts.get(status, 0) + 1
        value = run.data.metrics.get(column)
        if run.data.tags.get(STAGE_TAG) == CONFIRM_STAGE:
            continue  # scored on the held-out half: the cell's best is its search's (studies.confirm)
        if status != "finished" or value is None or not math.isfinite(value):
            continue
        key = best_key(value, run.info.start_time, run.info.run_id, mode)
        if best.key is not None and key >= best.key:
            continue
        best.value, best.run_id, best.key = value, run.info.run_id, key
        best.run_name = run.data.tags.get(MLFLOW_RUN_NAME, run.info.run_name)
        best.knobs = {path.rsplit(".", 1)[-1]: run.data.params.get(path) for path in cell.space}
        best.samples = run.data.metrics.get(VALIDATION_SAMPLES)
    return best


def _log(client, run_id: str, values: dict[str, float], tags: dict[str, str], step: int) -> None:
    import time

    from mlflow.entities import Metric, RunTag

    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, step) for k, v in values.items()]
    _retry(client.log_batch, run_id, metrics=metrics, tags=[RunTag(k, v) for k, v in tags.items()])


def _count_metrics(counts: dict[str, int]) -> dict[str, float]:
    return {f"trials.{status}": float(counts.get(status, 0)) for status in dict.fromkeys([*COUNTED, *counts])}


def _knob_records(knobs: dict[str, Any]) -> tuple[dict[str, float], dict[str, str]]:
    metrics, tags = {}, {}
    for name, text in knobs.items():
        number = _number(text)
        if number is not None:
            metrics[f"{BEST_PREFIX}{name}"] = number  # a column the runs table sorts and the chart view plots
        elif text is not None:
            tags[f"{BEST_PREFIX}{name}"] = str(text)
    return metrics, tags


def roll_up(
    client,
    experiment_id: str,
    study_run_id: str,
    cell_runs: dict[str, str],
    cells: dict[str, Cell],
    *,
    column: str,
    mode: str,
    bests: dict[str, CellBest],
    only: list[str] | None = None,
) -> dict[str, CellBest]:
    """Write each cell's best trial (value, knobs, name) and trial counts onto its run, the best cell's onto the
    study run. only: the cells to read again (the others keep what `bests` holds); returns the updated bests.

    Metrics are logged at step = trials ended so far, so each run's chart shows its best value over the study.
    """
    for key in list(cell_runs) if only is None else only:
        best = _cell_best(client, experiment_id, cell_runs[key], cells[key], column, mode)
        bests[key] = best
        ended = sum(best.counts.values())
        metrics = _count_metrics(best.counts)
        tags: dict[str, str] = {}
        if best.value is not None:
            metrics[f"{BEST_PREFIX}{column}"] = best.value
            knob_metrics, knob_tags = _knob_records(best.knobs)
            metrics.update(knob_metrics)
            tags.update({**knob_tags, BEST_RUN_TAG: best.run_name or "", BEST_RUN_ID_TAG: best.run_id or ""})
        _log(client, cell_runs[key], metrics, tags, step=ended)

    top_key, top = None, None
    for key, best in bests.items():
        if best.key is not None and (top is None or best.key < top.key):
            top_key, top = key, best
    totals: dict[str, int] = {}
    for best in bests.values():
        for status, n in best.counts.items():
            totals[status] = totals.get(status, 0) + n
    metrics = _count_metrics(totals)
    tags = {}
    if top is not None:
        metrics[f"{BEST_PREFIX}{column}"] = top.value
        knob_metrics, knob_tags = _knob_records(top.knobs)
        # A metric cannot be deleted: a knob the best cell does not search (rho where AdamW leads) is logged NaN,
        # or the study run would keep the knob of a cell that led before.
        for best in bests.values():
            for name in _knob_records(best.knobs)[0]:
                knob_metrics.setdefault(name, float("nan"))
        metrics.update(knob_metrics)
        tags = {
            **knob_tags,
            BEST_CELL_TAG: cell_label(cells[top_key]),
            BEST_RUN_TAG: top.run_name or "",
            BEST_RUN_ID_TAG: top.run_id or "",
        }
    _log(client, study_run_id, metrics, tags, step=sum(totals.values()))
    _describe_results(client, experiment_id, study_run_id, cells, bests, column=column, mode=mode, top=top_key)
    return bests


def cell_end_time(client, experiment_id: str, cell_run_id: str) -> int | None:
    """When a cell run ends: when its last trial run ended (ms since the epoch), so the UI's duration of a cell is
    its own, not the study's; None (end now) while it has no trial or one is still open."""
    trials = _retry(
        client.search_runs,
        [experiment_id],
        filter_string=f"tags.`{PARENT_RUN_TAG}` = '{cell_run_id}'",
        max_results=10_000,
    )
    ends = [t.info.end_time for t in trials]
    return max(ends) if ends and None not in ends else None


def _fmt(value: float) -> str:
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:.4g}"


def _knobs_text(best: CellBest) -> str:
    return ", ".join(f"{k}={_value_text(_number(v) if _number(v) is not None else v)}" for k, v in best.knobs.items())


def _se_text(best: CellBest, column: str) -> str:
    if column in ACCURACY_METRICS and best.samples and best.value is not None and 0 <= best.value <= 1:
        return f"{accuracy_se(best.value, best.samples):.3f}"
    return "–"


def _link(experiment_id: str, best: CellBest) -> str:
    name = (best.run_name or best.run_id or "").replace("|", "/").replace("[", "(").replace("]", ")")
    return f"[{name}](#/experiments/{experiment_id}/runs/{best.run_id}?{_WORKFLOW})"  # lands on the model-training side


def results_table(
    experiment_id: str, cells: dict[str, Cell], bests: dict[str, CellBest], *, column: str, mode: str, top: str | None
) -> str:
    """The answer as markdown. First a one-line headline (the UI shows a description's first line without a click):
    the study's best cell, value ± SE, knob and trial. Then per cell its best value (± its SE for an accuracy), its
    knob(s), its trials and a link to its best trial's run; the study's best cell in bold; cells in study order."""
    import datetime as dt

    ended = sum(n for b in bests.values() for status, n in b.counts.items() if status != "running")
    planned = sum(c.planned for c in cells.values())
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    has_se = column in ACCURACY_METRICS
    if top is None:
        headline = f"**No trial has finished with a {column} yet** ({ended} of {planned} trials ended)."
    else:
        best = bests[top]
        se = _se_text(best, column)
        knobs = _knobs_text(best)
        headline = (
            f"**Best {column}: {_fmt(best.value)}{f' ± {se}' if se != '–' else ''}, {cell_label(cells[top])}"
            f"{f' {knobs}' if knobs else ''}** (trial {_link(experiment_id, best)}); {ended} of {planned} trials "
            f"ended. Every cell: expand this description."
        )
    head = ["cell", f"best {column}"] + (["± SE"] if has_se else []) + ["knob", "trials", "best trial"]
    lines = [
        headline,
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] + ["--:"] * (1 + has_se) + ["---", "--:", "---"]) + "|",
    ]
    for key, cell in cells.items():
        best = bests.get(key) or CellBest()
        label = cell_label(cell)
        label = f"**{label}**" if key == top else label
        finished, failed = best.counts.get("finished", 0), best.counts.get("failed", 0)
        trials = f"{finished}/{cell.planned}" + (f" ({failed} failed)" if failed > 0 else "")
        if best.value is None:
            row = [label, "–"] + (["–"] if has_se else []) + ["–", trials, "–"]
        else:
            value = f"**{_fmt(best.value)}**" if key == top else _fmt(best.value)
            se = [_se_text(best, column)] if has_se else []
            row = [label, value, *se, _knobs_text(best) or "–", trials, _link(experiment_id, best)]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        f"As of {when}, {mode}imising {column}. Best: {BEST_RULE}."
        + (
            " ± SE: the binomial sampling error of the value on its validation samples; cells less than about two "
            "apart are not told apart by this run, and the best of a searched cell is also the luckiest of its trials."
            if has_se
            else ""
        ),
    ]
    return "\n".join(lines)


_NOT_YET = "_No trial has ended yet: the answer appears here as trials end._"


def _with_results(note: str, results: str) -> str:
    """An experiment description with `results` above the marker and the study's own note (kept) below it."""
    study_note = note.split(RESULTS_MARKER, 1)[1] if RESULTS_MARKER in note else note
    return f"{results}\n\n{RESULTS_MARKER}\n\n{study_note.strip()}"


def _describe_results(client, experiment_id, study_run_id, cells, bests, *, column, mode, top) -> None:
    """The answer table into the experiment's description (above the study's note) and the study run's."""
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

    table = results_table(experiment_id, cells, bests, column=column, mode=mode, top=top)
    note = _retry(client.get_experiment, experiment_id).tags.get(MLFLOW_RUN_NOTE, "")
    _retry(client.set_experiment_tag, experiment_id, MLFLOW_RUN_NOTE, _with_results(note, table))
    # The study run's description keeps its link to the HTML report (analysis.report), below the table.
    run_note = _retry(client.get_run, study_run_id).data.tags.get(MLFLOW_RUN_NOTE, "")
    report = run_note[run_note.index(REPORT_MARKER) :] if REPORT_MARKER in run_note else ""
    _retry(client.set_tag, study_run_id, MLFLOW_RUN_NOTE, f"{table}\n\n{report}".rstrip())


def rollup_callback(
    tracking_uri: str,
    experiment_id: str,
    study_run_id: str,
    cell_runs: dict[str, str],
    cells: list[Cell],
    *,
    column: str,
    mode: str,
):
    """A Tune callback that rolls a cell up whenever one of its trials ends (and every cell on its first call,
    so a resumed study's earlier trials count). A failing roll-up is logged, never fatal to the study."""
    import logging

    from ray.tune import Callback

    log = logging.getLogger("sharpscale.records")
    by_key = {c.key: c for c in cells}

    class RollUp(Callback):
        def __init__(self):
            self.bests: dict[str, CellBest] = {}
            self._client = None

        def update(self, only: list[str] | None = None) -> None:
            try:
                if self._client is None:
                    self._client = tracking_client(tracking_uri)
                    only = None  # the first call reads every cell
                roll_up(
                    self._client,
                    experiment_id,
                    study_run_id,
                    cell_runs,
                    by_key,
                    column=column,
                    mode=mode,
                    bests=self.bests,
                    only=only,
                )
            except Exception:  # the record of the trials is intact; only the summary on the parents lags
                log.exception("sharpscale: rolling the best trials up onto the cell runs failed")

        def _ended(self, trial) -> None:
            key = trial.config.get("cell") if isinstance(trial.config, dict) else None
            self.update(None if key not in cell_runs else [key])

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._ended(trial)

        def on_trial_error(self, iteration, trials, trial, **info):
            self._ended(trial)

        # Tune pickles its callbacks with its state; a client holds a connection pool.
        def __getstate__(self):
            return {**self.__dict__, "_client": None}

    return RollUp()


# The study's runs in the store: its experiment, launch, study and cell runs, and how they close.


def experiment(client, name: str, artifact_location: Path, tracking_uri: str) -> str:
    """The id of the experiment `name`: found (restored if deleted), or made, its artifacts in the server's own store
    over HTTP, else under `artifact_location`."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    if tracking_uri.startswith(("http://", "https://")):
        # The server's own artifact store (mlflow-artifacts:/): every node uploads over HTTP, none needs a shared disk.
        return client.create_experiment(name)
    artifact_location.mkdir(parents=True, exist_ok=True)
    return client.create_experiment(name, artifact_location=artifact_location.resolve().as_uri())


@dataclass(frozen=True)
class Launch:
    """The launch a call of `run` or `resume` records into: its store, its experiment, its number, the study run it
    resumes (None: a new launch) and whether this call made the experiment (`release` may then delete it)."""

    uri: str
    client: Any
    experiment_id: str
    experiment_name: str
    number: int
    previous: Any = None
    new_experiment: bool = False


def open_launch(study: LoadedStudy, uri: str, *, resume: bool, new_launch: bool, explicit: bool) -> Launch:
    """On resume, the launch this file ran, in the store it ran into (resume_target; the URI may differ from `uri`),
    never a new store, experiment or launch; else the study's experiment at `uri` (made, or restored, here) and a
    launch claimed for this call (choose_launch). explicit: `uri` was given for this call, not by the study file."""
    name = study.experiment_name
    if resume:
        uri, client, experiment_id, previous = resume_target(study, uri, explicit=explicit)
        return Launch(uri, client, experiment_id, name, launch_of(previous), previous)
    client = tracking_client(uri)
    before = client.get_experiment_by_name(name)
    new_experiment = before is None or before.lifecycle_stage != "active"
    experiment_id = experiment(client, name, Path(study.spec.tracking.artifact_location), uri)
    number = choose_launch(client, experiment_id, study, name, uri, new_launch=new_launch)
    return Launch(uri, client, experiment_id, name, number, new_experiment=new_experiment)


def find_run(client, experiment_id: str, tags: dict[str, str]):
    """The newest run of the experiment that carries every one of `tags` (key and value), or None."""
    clause = " and ".join(f"tags.`{k}` = {filter_value(v)}" for k, v in tags.items())
    runs = client.search_runs([experiment_id], filter_string=clause, max_results=1)
    return runs[0] if runs else None


def _study_tags(study: LoadedStudy) -> dict[str, str]:
    return {KIND_TAG: "study", STUDY_FILE_HASH_TAG: study.file_hash}


def launch_of(run) -> int:
    """The launch a run belongs to (its LAUNCH_TAG; 1 where it has none)."""
    return int(run.data.tags.get(LAUNCH_TAG, "1"))


def choose_launch(client, experiment_id: str, study: LoadedStudy, exp_name: str, uri: str, *, new_launch: bool) -> int:
    """The launch a new run of the study starts, claimed in the store (studies.identity.claim_launch): 1, or the next
    one when asked for; refused when that would mix runs, or when a run started at the same moment claimed it."""
    earlier = client.search_runs([experiment_id], filter_string=kind_filter("study"), max_results=10_000)
    newest = max((launch_of(r) for r in earlier), default=0)
    if earlier and not new_launch:
        trials = len(client.search_runs([experiment_id], filter_string=kind_filter("trial"), max_results=10_000))
        raise StudyError(
            study.path,
            [
                f"run: MLflow experiment {exp_name!r} at {uri} already holds launch {newest} of this study ({trials} trial "
                f"run(s)); a second run would mix its trials with those. Fix: `sharpscale resume {study.path}` to continue "
                f"it, `sharpscale run --new-launch {study.path}` to start launch {newest + 1} (status, report and "
                f"load_runs show the newest launch; load_runs(..., launch='all') shows every one), or set "
                f"tracking.experiment to a new name."
            ],
        )
    artifacts = None if uri.startswith(("http://", "https://")) else _artifact_uri(study)
    for launch in range(newest + 1, newest + 1 + (100 if new_launch else 1)):
        try:
            identity.claim_launch(client, exp_name, launch, artifacts)
            return launch
        except identity.LaunchTaken:
            continue
    raise StudyError(
        study.path,
        [
            f"run: launch {newest + 1} of MLflow experiment {exp_name!r} at {uri} was claimed by another `sharpscale "
            f"run` of this study started at the same moment (or its runs were deleted since); two runs never share "
            f"a launch. Fix: let that run go on (`sharpscale status {study.path}`; `sharpscale resume` if it was "
            f"interrupted), or start one of your own with `sharpscale run --new-launch {study.path}`."
        ],
    )


def _artifact_uri(study: LoadedStudy) -> str:
    return Path(study.spec.tracking.artifact_location).resolve().as_uri()


def find_study_run(client, experiment_id: str, study: LoadedStudy):
    """The newest study run of this file (and these overrides) in the experiment, or None."""
    return find_run(client, experiment_id, _study_tags(study))


def parent_runs(
    client,
    study: LoadedStudy,
    experiment_id: str,
    commit: str,
    run,
    state_tags: dict[str, str],
    launch: int,
    opened: list[str],
    cell_runs: dict[str, str],
) -> str:
    """The study's run and one run per cell (into `cell_runs`); on resume (`run`: the study run found) they are
    reopened, never duplicated. state_tags: where the study keeps its state (studies.runner.StateLocations.tags).
    Each run id goes into `opened` as soon as it is RUNNING, for the caller to close."""
    resume = run is not None
    if run is None:
        run = client.create_run(
            experiment_id,
            run_name=study_run_name(study.spec.name, launch),
            tags={
                **_study_tags(study),
                LAUNCH_TAG: str(launch),
                GIT_COMMIT_TAG: commit,
                STUDY_FILE_TAG: str(study.path),
                NOTE_TAG: study.spec.description,
                **source_tags(study, commit),
                **state_tags,
            },
        )
        opened.append(run.info.run_id)
        client.log_artifact(run.info.run_id, str(study.path))
        if study.overrides:
            client.log_dict(run.info.run_id, {"overrides": study.overrides, "smoke": study.smoke}, "overrides.yaml")
    else:
        for key, value in state_tags.items():
            client.set_tag(run.info.run_id, key, value)
        client.update_run(run.info.run_id, status="RUNNING")
        opened.append(run.info.run_id)
    study_run_id = run.info.run_id
    for cell in study.cells:
        tags = {KIND_TAG: "cell", CELL_TAG: cell.key, PARENT_RUN_TAG: study_run_id}
        existing = find_run(client, experiment_id, tags) if resume else None
        if existing is None:
            existing = client.create_run(
                experiment_id,
                run_name=cell_label(cell),
                tags={
                    **tags,
                    STUDY_FILE_HASH_TAG: study.file_hash,
                    LAUNCH_TAG: str(launch),
                    **source_tags(study, commit),
                    **{factor_tag(k): v for k, v in cell.levels.items()},
                },
            )
            _log_params(client, existing.info.run_id, cell_params(cell))
        else:
            client.update_run(existing.info.run_id, status="RUNNING")
        opened.append(existing.info.run_id)
        cell_runs[cell.key] = existing.info.run_id
    return study_run_id


def _log_params(client, run_id: str, params: dict[str, str]) -> None:
    from mlflow.entities import Param

    _retry(client.log_batch, run_id, params=[Param(k, v) for k, v in params.items()])


def close_dangling(client, experiment_id: str, cell_runs: dict[str, str], *, interrupted: str | None) -> None:
    """No trial run may stay RUNNING: one Ray stopped (ASHA) or killed never reached its own `finish`.

    After a normal end (`interrupted` None) such a trial was stopped early on purpose; otherwise `interrupted` is
    the reason the study stopped (studies.runner.interruption_reason), and `resume` reopens the trial.
    """
    for run in client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=10_000):
        if run.data.tags.get(PARENT_RUN_TAG) not in cell_runs.values():
            continue
        # A trial whose actor Ray reclaimed right after its last epoch did finish: its record says so.
        epochs = int(run.data.params.get("schedule.epochs", 0))
        # Validation may skip epochs (train.eval_every): the metric of every epoch says which ran.
        logged = {m.step for m in client.get_metric_history(run.info.run_id, EVERY_EPOCH_METRIC)}
        if epochs and logged >= set(range(epochs)):
            status, mlflow_status = "finished", "FINISHED"
        else:
            status, mlflow_status = ("interrupted" if interrupted else "early_stopped"), "KILLED"
        _retry(client.set_tag, run.info.run_id, STATUS_TAG, status)
        if status == "interrupted":
            _retry(client.set_tag, run.info.run_id, REASON_TAG, interrupted)
        _retry(client.set_terminated, run.info.run_id, status=mlflow_status)


def closing_steps(
    client,
    uri: str,
    experiment_id: str,
    opened: list[str],
    cell_runs: dict[str, str],
    cells: list[Cell],
    *,
    column: str,
    mode: str,
    status: str,
    interrupted: str | None,
    interrupted_at: float | None,
) -> list[Callable[[], Any]]:
    """The steps, in order, that close the runs a call opened (`opened`, the study run first; each to be run whatever
    the others do): no trial run left RUNNING (close_dangling, `interrupted` its reason), those the interrupt cut at
    `interrupted_at` marked so, every cell rolled up once more, then each run ended with `status`."""
    steps: list[Callable[[], Any]] = [
        lambda: close_dangling(client, experiment_id, cell_runs, interrupted=interrupted),
    ]
    if interrupted_at is not None:
        steps.append(lambda: mark_interrupted(client, experiment_id, cell_runs, interrupted_at))
    # Every cell once more: the trials closed just above, and a resumed run's earlier ones.
    steps.append(
        lambda: rollup_callback(
            uri,
            experiment_id,
            opened[0],
            cell_runs,
            cells,
            column=column,
            mode=mode,
        ).update()
    )
    # A cell run ends when its last trial did (its duration its own); the study run ends now.
    cell_ids = set(cell_runs.values())
    steps += [
        lambda rid=rid: _retry(
            client.set_terminated,
            rid,
            status=status,
            end_time=cell_end_time(client, experiment_id, rid) if rid in cell_ids else None,
        )
        for rid in opened
    ]
    return steps


INTERRUPTED_REASON = (
    "the study was interrupted (Ctrl-C or SIGTERM) while this trial ran; `sharpscale resume` continues it"
)


def mark_interrupted(
    client, experiment_id: str, cell_runs: dict[str, str], since: float, reason: str = INTERRUPTED_REASON
) -> None:
    """Trials that Tune stopped because of the interrupt end as `early_stopped` or `failed` in their own record:
    say `interrupted` instead, so that nothing cut short by Ctrl-C looks stopped on purpose."""
    since_ms = int(since * 1000)
    for run in client.search_runs([experiment_id], filter_string=kind_filter("trial"), max_results=10_000):
        if run.data.tags.get(PARENT_RUN_TAG) not in cell_runs.values():
            continue
        ended = run.info.end_time
        if run.data.tags.get(REASON_TAG, "").startswith(NO_SPACE_REASON):
            continue  # it ended itself on the full disk: Tune holds it ended, and `resume` does not run it again
        if run.data.tags.get(STATUS_TAG) in ("early_stopped", "failed", "killed") and (
            ended is None or ended >= since_ms
        ):
            _retry(client.set_tag, run.info.run_id, STATUS_TAG, "interrupted")
            # Its own reason named what stopped it as seen from the trial (Tune's stop): say why Tune stopped it.
            _retry(client.set_tag, run.info.run_id, REASON_TAG, reason)
            if run.info.status == "RUNNING":
                _retry(client.set_terminated, run.info.run_id, status="KILLED")


def drop_lost_trials(client, experiment_id: str, known: set[str], launch: int) -> None:
    """Soft-delete the runs of trials that the interrupted driver started but never snapshotted.

    Tune cannot resume a trial it has no record of; the searcher issues a new trial in its place. The lost
    one's run is deleted from the active record (restorable with `mlflow runs restore`), so MLflow keeps
    exactly one run per trial of the study.
    """
    for run in client.search_runs([experiment_id], filter_string=kind_filter("trial"), max_results=10_000):
        if launch_of(run) == launch and run.data.tags.get(TRIAL_ID_TAG) not in known:
            _retry(client.set_tag, run.info.run_id, STATUS_TAG, "lost")
            if run.info.status == "RUNNING":
                _retry(client.set_terminated, run.info.run_id, status="KILLED")
            _retry(client.delete_run, run.info.run_id)


def close_interrupted(searcher, client, experiment_id: str, cell_runs: dict[str, str], since: float) -> None:
    """After Ctrl-C (or SIGTERM): the Optuna trials cut short are failed and marked for `resume` to continue them
    under new trials with the same values; their MLflow runs say `interrupted`."""
    searcher.fail_unfinished(interrupted=True)
    mark_interrupted(client, experiment_id, cell_runs, since)


def release(client, experiment_id: str, exp_name: str, launch: int, new_experiment: bool) -> None:
    """Undo what `run` recorded before its first run: its launch claim, and the experiment when this call made it
    and nothing else came to use it (no run, no later launch claimed by a run started beside it)."""
    identity.release_launch(client, exp_name, launch)
    if (
        new_experiment
        and not client.search_runs([experiment_id], max_results=1)
        and client.get_experiment_by_name(identity.claim_name(exp_name, launch + 1)) is None
    ):
        client.delete_experiment(experiment_id)


def resume_target(study: LoadedStudy, uri: str, *, explicit: bool):
    """(uri, client, experiment id, study run) of the launch `resume` continues (studies.identity.resume_target).

    A relative sqlite:/// tracking URI taken from the study file means a different store in each directory; when
    the store here holds no launch of the study and the launch record in its Ray storage names an existing SQLite
    store, that is the one the study ran into: resume uses it, and says so.
    """
    from trainables.tracking import sqlite_path

    recorded = identity.find_recorded_store(study, study.storage)
    other = recorded.get("tracking_uri") if recorded else None
    if not explicit and other and other != uri and not _holds_study(uri, study):
        db = sqlite_path(other)
        if db is not None and db.is_file():
            print(
                f"sharpscale: resume: the study's tracking.uri {study.spec.tracking.uri} is relative to the directory "
                f"a command runs in; launch {recorded.get('launch')} was recorded at {other}: resuming it there.",
                flush=True,
            )
            uri = other
    hint = (
        f" Its launch {recorded.get('launch')} was recorded at {other}. Fix: `sharpscale resume {study.path} "
        f"--tracking-uri {other}`, or run the command from the directory the study was started in."
        if other and other != uri
        else ""
    )
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        identity.resume_target(None, None, study, uri, hint)  # refuses: nothing to resume in a store never made
    client = tracking_client(uri)
    exp = client.get_experiment_by_name(study.experiment_name)
    experiment_id = exp.experiment_id if exp is not None and exp.lifecycle_stage == "active" else None
    previous = identity.resume_target(client, experiment_id, study, uri, hint)
    return uri, client, experiment_id, previous


def _holds_study(uri: str, study: LoadedStudy) -> bool:
    """Whether the MLflow store at `uri` exists and holds a study run of the study's experiment."""
    from trainables.tracking import sqlite_path

    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        return False
    client = tracking_client(uri)
    exp = client.get_experiment_by_name(study.experiment_name)
    return exp is not None and bool(
        client.search_runs([exp.experiment_id], filter_string=kind_filter("study"), max_results=1)
    )
