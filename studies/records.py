"""How a study's MLflow record reads: the experiment's kind, note and opening view, trial names, source tags, and the
roll-up of each cell's best trial onto its cell run, of the study's best onto the study run, and of the answer table
into the descriptions. The runs' life (opened, claimed, interrupted, closed) is studies.launch's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from analysis.runs import (
    ACCURACY_METRICS,
    BEST_RULE,
    REPORT_MARKER,
    UI_WORKFLOW,
    accuracy_se,
    best_key,
    cell_name,
)
from studies.spec import Cell, LoadedStudy
from trainables.metrics import VALIDATION_SAMPLES
from trainables.naming import (
    BEST_CELL_TAG,
    BEST_RUN_ID_TAG,
    BEST_RUN_TAG,
    CELL_TAG,
    CONFIRM_STAGE,
    KIND_TAG,
    LAUNCH_TAG,
    PARENT_RUN_TAG,
    STAGE_TAG,
    STATUS_TAG,
    STUDY_FILE_HASH_TAG,
    kind_filter,
)
from trainables.tracking import filter_value, retry_locked, tracking_client

__all__ = [
    "EXPERIMENT_KIND",
    "EXPERIMENT_KIND_TAG",
    "NUMBERING",
    "RESULTS_MARKER",
    "VIEW_KEY",
    "VIEW_NAME",
    "VIEW_TAG",
    "CellBest",
    "cell_end_time",
    "cell_label",
    "cell_params",
    "chart_state",
    "describe_experiment",
    "enveloped_view",
    "find_run",
    "find_study_run",
    "launch_of",
    "results_table",
    "roll_up",
    "rollup_callback",
    "runs_page_path",
    "saved_view",
    "source_tags",
    "study_tags",
    "trial_params",
    "trial_run_name",
    "view_state",
]

# The experiment's kind, as MLflow names it (the experiment's type in its UI and API). MLflow 3.17's UI does not open
# an experiment by it (its side, GenAI or model training, comes from the browser: studies.ui_app picks it). The
# value is the UI's, not the Python API's: tests/studies/test_records.py pins it against the installed UI bundle.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# The experiment's description is the study's note, this marker, then the answer table that every roll-up rewrites:
# the runs page renders it (markdown) above the runs, so the answer shows on the first screen without a click.
RESULTS_MARKER = "<!-- sharpscale: results -->"
# The runs page opens on a view saved as an experiment tag (MLflow's own saved view: the tag
# `mlflow.sharedViewState.<key>`, opened by `?viewStateShareKey=<key>` and listed under "Views" by its name), the UI's
# names pinned by tests/studies/test_study_page.py against the installed bundle: every trial in one flat list, best
# first, with the objective and the knobs as columns.
VIEW_KEY = "sharpscale"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
VIEW_NAME = "sharpscale: every trial, best first"
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

    from mlflow.utils.mlflow_tags import (
        MLFLOW_EXPERIMENT_PRIMARY_METRIC_GREATER_IS_BETTER,
        MLFLOW_EXPERIMENT_PRIMARY_METRIC_NAME,
        MLFLOW_RUN_NOTE,
    )

    objective = study.spec.objective
    existing = retry_locked(client.get_experiment, experiment_id).tags
    note = existing.get(MLFLOW_RUN_NOTE, "")
    # A resumed (or relaunched) study keeps the answer it has until its roll-up writes the new one.
    previous = note.split(RESULTS_MARKER, 1)[0].strip() if RESULTS_MARKER in note else _NOT_YET
    tags = {
        EXPERIMENT_KIND_TAG: EXPERIMENT_KIND,
        MLFLOW_RUN_NOTE: _with_results(experiment_note(study), previous),
        MLFLOW_EXPERIMENT_PRIMARY_METRIC_NAME: objective.column,
        MLFLOW_EXPERIMENT_PRIMARY_METRIC_GREATER_IS_BETTER: str(objective.mode == "max").lower(),
        VIEW_TAG: saved_view(view_state(study), existing.get(VIEW_TAG)),
    }
    for key, value in tags.items():
        retry_locked(client.set_experiment_tag, experiment_id, key, value)


def saved_view(state: dict[str, Any], previous: str | None = None) -> str:
    """The view tag's value as MLflow 3.17's "Views" menu lists it: an envelope with the view's name, its creation
    and update times (ms) and the view state as a JSON string; a view rewritten (a resumed study) keeps its
    creation time, so it keeps its place in the menu."""
    import json
    import time

    now = int(time.time() * 1000)
    created = now
    try:
        created = int(json.loads(previous)["createdAt"]) if previous else now
    except (ValueError, KeyError, TypeError):
        pass  # a view written before the envelope (the bare state): created now
    return _envelope(json.dumps(state), created, now)


def _envelope(state: str, created: int, updated: int) -> str:
    import json

    return json.dumps({"name": VIEW_NAME, "createdAt": created, "updatedAt": updated, "state": state})


def enveloped_view(value: str, created: int) -> str | None:
    """`value` of a view tag written before the envelope (a store from before MLflow's "Views" menu listed it: the
    bare view state, which the UI neither lists nor opens) as `saved_view` writes it, created at `created` (ms);
    None for a value that is an envelope already, or no view state. For readers that must not write (the UI that
    `sharpscale ui` and `sharpscale server` serve); `resume` rewrites the tag itself."""
    import json

    try:
        bare = json.loads(value)
    except ValueError:
        return None
    if not isinstance(bare, dict) or "state" in bare or "searchFilter" not in bare:
        return None
    return _envelope(value, created, created)


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
        # the chart view
        **chart_state(objective.column, knobs),
    }


# The chart view's section of model metrics (the UI's name, pinned with the card fields by tests/studies/
# test_records.py). Marked reordered, the UI appends every metric the view does not name after the ones it does,
# instead of sorting them in by name (13 `fixed_*` timings came before `val_acc`).
_MODEL_METRICS = "Model metrics"
_CHART_SECTION = "sharpscale-model-metrics"


def _card(kind: str, uuid: str, **fields: Any) -> dict[str, Any]:
    base = {"uuid": uuid, "type": kind, "metricSectionId": _CHART_SECTION, "deleted": False, "isGenerated": False}
    return {**base, "runsCountToCompare": 100 if kind == "SCATTER" else 10, **fields}


def chart_state(objective: str, knobs: list[str]) -> dict[str, Any]:
    """The chart view's opening cards, as MLflow's shared view state carries them: the objective per epoch, then
    the objective against each searched knob; every other metric after them, in the UI's own order."""
    line = _card(
        "LINE",
        "sharpscale-objective",
        metricKey=objective,
        displayName=objective,
        lineSmoothness=0,
        xAxisKey="step",
        xAxisScaleType="linear",
        scaleType="linear",
        selectedXAxisMetricKey="",
        yAxisKey="metric",
        yAxisExpressions=[],
        ignoreOutliers=False,
        useGlobalXaxisKey=True,
        useGlobalLineSmoothing=True,
        range={},
    )
    scatters = [
        _card(
            "SCATTER",
            f"sharpscale-knob-{i}",
            xaxis={"key": knob, "type": "PARAM"},
            yaxis={"key": objective, "type": "METRIC"},
        )
        for i, knob in enumerate(knobs)
    ]
    section = {"uuid": _CHART_SECTION, "name": _MODEL_METRICS, "display": True, "isReordered": True}
    return {"compareRunCharts": [line, *scatters], "compareRunSections": [{**section, "deleted": False}]}


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
    names = dict.fromkeys(p.rsplit(".", 1)[-1] for c in study.cells for p in c.space)
    knobs = ", ".join(f"{BEST_PREFIX}{n}" for n in names) or "none searched"
    parts = [study.spec.description, " ".join(header)] if header else [study.spec.description]
    parts.append(
        f"Objective: {objective.label}, {objective.mode}imised. Runs nest study > cell > trial; each cell run "
        f"carries its best trial's {BEST_PREFIX}{objective.column}, its best knobs ({knobs}) and its "
        f"trial counts, the study run the best cell's. Study file: {study.path}."
    )
    return "\n\n".join(_md(p) for p in parts if p)


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


def cell_label(cell: Cell) -> str:
    """A cell in a few characters, its one name (analysis.runs.cell_name): 'vit/sam', 'fraction=0.1/resnet/sam/seed=0';
    'all' without factors."""
    return cell_name(cell.levels)


def _value_text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


# Every number that names a trial or an epoch is zero-based, as the tools it is read beside number them: MLflow logs
# epoch k at step k (its charts' x axis, `best_epoch`), and optuna-dashboard shows a cell's searched trial as
# "Trial k", k its Optuna number, which a trial run's name carries as "#k". Counts stay counts ("3/10 epochs",
# "1/4 trials"). docs/ui.md states the rule.
NUMBERING = (
    "zero-based: trial #k is Optuna's Trial k in its cell, epoch k is MLflow's step k and Optuna's intermediate step k"
)


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

    runs = retry_locked(
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
    retry_locked(client.log_batch, run_id, metrics=metrics, tags=[RunTag(k, v) for k, v in tags.items()])


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
    trials = retry_locked(
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
    return f"[{_md(name)}](#/experiments/{experiment_id}/runs/{best.run_id}?{_WORKFLOW})"  # the model-training side


def _md(text: str) -> str:
    """`text` as MLflow's renderer (showdown, GitHub flavour) shows it literally: it would take `<knob>` for an
    HTML tag and pair asterisks and word-edge underscores into emphasis; a mid-word underscore (val_acc) it keeps,
    so that stays unescaped and reads the same in the experiment list, which shows a description raw."""
    import re

    text = re.sub(r"([\\*])", r"\\\1", text)
    text = re.sub(r"(?<!\w)_|_(?!\w)", r"\\_", text)
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text)


def _plain(line: str) -> str:
    """The description's first line as MLflow's experiment list shows it (raw text): nothing markdown would
    change, so it reads the same there and on the runs page."""
    import re

    # A mid-word underscore (val_acc) stays: markdown leaves it, and the metric keeps its name.
    return re.sub(r"[*`<>#|]|(?<!\w)_|_(?!\w)", " ", line).strip()


def results_table(
    experiment_id: str,
    cells: dict[str, Cell],
    bests: dict[str, CellBest],
    *,
    column: str,
    mode: str,
    top: str | None,
    answer: list[str] = (),
) -> str:
    """The answer as markdown. First `answer` (analysis.tables.headline: the study's question answered, the best
    cell one line below), its first line plain text (MLflow's experiment list shows a description raw); then per
    cell its best value (± its SE for an accuracy), knob(s), trials and a link to its best trial's run, cells in
    study order, the study's best marked. A list, not a table: the experiment list shows it raw too, and a
    rendered table's columns have no spacing between them."""
    import datetime as dt

    ended = sum(n for b in bests.values() for status, n in b.counts.items() if status != "running")
    planned = sum(c.planned for c in cells.values())
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    has_se = column in ACCURACY_METRICS
    answer = [line for line in answer if line.strip()]
    if not answer:
        answer = [f"No trial has finished with a {column} yet ({ended} of {planned} trials ended)."]
    lines = [_plain(answer[0])]
    for line in answer[1:]:
        lines += ["", _md(line)]
    lines += [
        "",
        _md(f"{ended} of {planned} trials ended, as of {when}; {mode}imising {column}. Each cell's best:"),
        "",
    ]
    for key, cell in cells.items():
        best = bests.get(key) or CellBest()
        finished, failed = best.counts.get("finished", 0), best.counts.get("failed", 0)
        trials = f"{finished} of {cell.planned} trials finished" + (f", {failed} failed" if failed > 0 else "")
        label = _md(cell_label(cell)) + (" (the study's best)" if key == top else "")
        if best.value is None:
            lines.append(f"- {label}: no finished trial; {trials}")
            continue
        se = _se_text(best, column) if has_se else "–"
        value = _fmt(best.value) + (f" ± {se}" if se != "–" else "")
        knobs = _knobs_text(best)
        lines.append(
            f"- {label}: {_md(column)} {value}{f', {_md(knobs)}' if knobs else ''}; {trials}; best trial "
            f"{_link(experiment_id, best)}"
        )
    lines += [
        "",
        _md(f"Best: {BEST_RULE}.")
        + (
            " ± SE: the binomial sampling error of the value on its validation samples; cells less than about two "
            "apart are not told apart by this run, and the best of a searched cell is also the luckiest of its trials."
            if has_se
            else ""
        ),
    ]
    return "\n".join(lines)


_NOT_YET = "No trial has ended yet: the answer appears here as trials end."  # plain: the list shows it raw


def _with_results(note: str, results: str) -> str:
    """An experiment description with `results` above the marker and the study's own note (kept) below it."""
    study_note = note.split(RESULTS_MARKER, 1)[1] if RESULTS_MARKER in note else note
    return f"{results}\n\n{RESULTS_MARKER}\n\n{study_note.strip()}"


def _describe_results(client, experiment_id, study_run_id, cells, bests, *, column, mode, top) -> None:
    """The answer table into the experiment's description (above the study's note) and the study run's."""
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

    from analysis.runs import trials_frame
    from analysis.tables import headline

    # The answer is analysis's (the report and the CLI print the same lines first); only its layout is here.
    answer = headline(trials_frame(client, experiment_id), metric=column, mode=mode)
    table = results_table(experiment_id, cells, bests, column=column, mode=mode, top=top, answer=answer)
    note = retry_locked(client.get_experiment, experiment_id).tags.get(MLFLOW_RUN_NOTE, "")
    retry_locked(client.set_experiment_tag, experiment_id, MLFLOW_RUN_NOTE, _with_results(note, table))
    # The study run's description keeps its link to the HTML report (analysis.report), below the table.
    run_note = retry_locked(client.get_run, study_run_id).data.tags.get(MLFLOW_RUN_NOTE, "")
    report = run_note[run_note.index(REPORT_MARKER) :] if REPORT_MARKER in run_note else ""
    retry_locked(client.set_tag, study_run_id, MLFLOW_RUN_NOTE, f"{table}\n\n{report}".rstrip())


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


# The study's runs as they read back: a study run of the file, the launch a run belongs to.


def find_run(client, experiment_id: str, tags: dict[str, str]):
    """The newest run of the experiment that carries every one of `tags` (key and value), or None."""
    clause = " and ".join(f"tags.`{k}` = {filter_value(v)}" for k, v in tags.items())
    runs = client.search_runs([experiment_id], filter_string=clause, max_results=1)
    return runs[0] if runs else None


def study_tags(study: LoadedStudy) -> dict[str, str]:
    return {KIND_TAG: "study", STUDY_FILE_HASH_TAG: study.file_hash}


def launch_of(run) -> int:
    """The launch a run belongs to (its LAUNCH_TAG; 1 where it has none)."""
    return int(run.data.tags.get(LAUNCH_TAG, "1"))


def find_study_run(client, experiment_id: str, study: LoadedStudy):
    """The newest study run of this file (and these overrides) in the experiment, or None."""
    return find_run(client, experiment_id, study_tags(study))
