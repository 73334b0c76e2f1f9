"""MLflow records to pandas: one row per trial, per-epoch curves, and the per-cell summary a study prints at its end."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, Sequence, Union

import numpy as np
import pandas as pd

from trainables.errors import UserError
from trainables.metrics import COUNT_METRICS, VALIDATION_SAMPLES
from trainables.naming import (
    CELL_TAG,
    CONFIRM_STAGE,
    DEFAULT_TRACKING_URI,
    FACTOR_PREFIX,
    LAUNCH_TAG,
    SEARCH_STAGE,
    STAGE_TAG,
    STATUS_TAG,
    TRIAL_ID_TAG,
    cell_key_name,
    cell_name,
    experiment_name,
    kind_filter,
)
from trainables.tracking import config_from_tags, scored_from_tags

__all__ = [
    "BEST_RULE",
    "REPORT_MARKER",
    "SE_COLUMN",
    "CI_LOW",
    "CI_HIGH",
    "accuracy_interval",
    "SCORED_COLUMN",
    "STAGE_COLUMN",
    "StudyNotFound",
    "accuracy_se",
    "best_key",
    "cell_key_name",
    "cell_name",
    "find_store",
    "best_trials",
    "confirm_summary",
    "load_curves",
    "load_runs",
    "trials_frame",
    "measured_on",
    "split_stages",
    "status_table",
    "subsets_per_seed",
    "summarize",
    "table_format",
    "unconfirmed_cells",
    "use_table_format",
]

# Accuracies (fractions of the validation set) whose sampling error `summarize` states, and that column's name.
ACCURACY_METRICS = ("val_acc", "best_val_acc", "val_top5")
SE_COLUMN = "± SE"
# summarize's exact 95% interval of an accuracy on its validation samples (accuracy_interval): honest at p = 1.
CI_LOW, CI_HIGH = "95% low", "95% high"

_TRIAL_FILTER = kind_filter("trial")
# SAM's rho as a load_runs column (the trial config's path): the knob the tables and plots show by default.
RHO = "optimizer.hparams.rho"
# load_runs' column naming each trial's stage: 'search' or 'confirm' (trainables.naming.STAGE_TAG, studies.confirm).
STAGE_COLUMN = "stage"
# load_runs' column holding each trial's final per-image correctness (trainables.scored.ScoredImages.to_text; absent
# or NaN for runs that recorded none): what analysis.images resamples the test images from.
SCORED_COLUMN = "scored_images"
# The trial config's evaluation split (trainables.config.DataConfig.eval_split), a param column of load_runs.
_EVAL_SPLIT = "data.eval_split"

# The one definition of a group's best trial, which the summary, `summarize`, `status`, the report's tables and
# plots, the live view and the MLflow roll-ups all use (through `best_key`): without a stated tie-break each took
# another trial of a tie (the first started, the smallest rho, the last returned by a search).
# A study run's description: the answer table (rewritten by every roll-up, studies.records), then this marker, then
# the link to its HTML report (written by analysis.report): each writer keeps the other's part.
REPORT_MARKER = "<!-- sharpscale: report -->"
# The query that opens MLflow 3's UI on its model-training side: without it a page loaded afresh (a link followed,
# a bookmark) opens on the GenAI side, whatever the experiment's kind. Every address of the UI we write carries it.
UI_WORKFLOW = "workflowType=machine_learning"
# How a printed table shows a number, wherever it is printed (`status`, the summary `run` prints, `summarize` and
# the other tables in a notebook): 4 significant digits, enough for an accuracy on a few thousand images and its SE.
TABLE_FLOAT_FORMAT = "{:.4g}"
_TABLE_MAX_COLUMNS = 20


def _table_options(width: int) -> list:
    return [
        "display.width",
        width,
        "display.max_columns",
        _TABLE_MAX_COLUMNS,
        "display.float_format",
        TABLE_FLOAT_FORMAT.format,
    ]


def table_format(width: int = 200) -> pd.option_context:
    """pandas' display options, `width` columns wide, as every table sharpscale prints uses them: a context."""
    return pd.option_context(*_table_options(width))


def use_table_format(width: int = 200) -> None:
    """The same options for the rest of this session (a notebook's first cell), as `table_format` sets them."""
    options = _table_options(width)
    for key, value in zip(options[::2], options[1::2]):
        pd.set_option(key, value)


BEST_RULE = (
    "the finished trial with the best value of the objective; among equal values, the one that started first "
    "(then the smaller run id)"
)


def best_key(value: float, started, run_id: str, mode: Literal["max", "min"]) -> tuple:
    """The sort key of BEST_RULE: of a group's finished trials, the one with the smallest key is its best.

    started: the trial's start (any orderable value, e.g. MLflow's start_time in ms, or a pandas Timestamp).
    """
    return (-value if mode == "max" else value, started, run_id)


def _start_order(started) -> float:
    """A start time as a number that orders (a run with none sorts last: NaT compares false with everything, which
    would leave a tie's winner to the frame's row order)."""
    if started is None or pd.isna(started):
        return math.inf
    return float(started) if isinstance(started, (int, float)) else float(pd.Timestamp(started).value)


def best_trials(
    runs: pd.DataFrame, *, metric: str, mode: Literal["max", "min"] = "max", by: Sequence[str] = ("cell",)
) -> pd.DataFrame:
    """The best trial of each group of `by` by BEST_RULE: rows of `runs` (finished, with a finite `metric`), one a
    group, in the order of their groups. Empty when no trial qualifies."""
    by = list(by)
    if runs.empty or metric not in runs.columns:
        return runs.iloc[0:0]
    values = pd.to_numeric(runs[metric], errors="coerce").astype("float64")
    finished = runs["status"] == "finished" if "status" in runs.columns else True
    ok = runs[finished & values.map(math.isfinite)]
    if ok.empty:
        return ok
    started = ok["start_time"].map(_start_order) if "start_time" in ok.columns else pd.Series(0, index=ok.index)
    ids = ok["run_id"].astype(str) if "run_id" in ok.columns else pd.Series("", index=ok.index)
    keys = [best_key(v, s, r, mode) for v, s, r in zip(values[ok.index], started, ids)]
    order = sorted(range(len(ok)), key=keys.__getitem__)
    ranked = ok.iloc[order]
    return ranked.groupby(by, sort=True, dropna=True).head(1).sort_values(by, kind="stable")


def accuracy_se(p, n):
    """The binomial standard error of an accuracy `p` measured on `n` samples, sqrt(p (1 - p) / n): how far apart
    two cells' values must be before a run tells them apart."""
    return (p * (1 - p) / n) ** 0.5


def accuracy_interval(p, n, confidence: float = 0.95):
    """The exact (Clopper-Pearson) `confidence` interval of an accuracy `p` measured on `n` samples: (low, high),
    arrays like p. It never collapses at p = 1 or 0 as the plug-in SE does (359 of 359 correct: [0.990, 1]), and
    covers at least `confidence` of the time for every true accuracy (tests/analysis/test_runs.py simulates it)."""
    from scipy.stats import beta

    p, n = np.asarray(p, dtype="float64"), np.asarray(n, dtype="float64")
    k = np.round(p * n)
    tail = (1.0 - confidence) / 2.0
    with np.errstate(invalid="ignore"):
        low = np.where(k > 0, beta.ppf(tail, k, n - k + 1), 0.0)
        high = np.where(k < n, beta.ppf(1.0 - tail, k + 1, n - k), 1.0)
    bad = ~(np.isfinite(p) & np.isfinite(n) & (n > 0))
    return np.where(bad, np.nan, low), np.where(bad, np.nan, high)


def _experiment_name(study: str | Path, *, smoke: bool = False) -> str:
    """The MLflow experiment of a study given by its name or its YAML file (`smoke`: of its --smoke runs)."""
    p = Path(study)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        import yaml

        raw = yaml.safe_load(p.read_text()) or {}
        return experiment_name(raw["name"], (raw.get("tracking") or {}).get("experiment"), smoke=smoke)
    return experiment_name(str(study), smoke=smoke)


# MLflow keeps params as text; these are how the trial config's None, True and False read there.
_MISSING, _BOOLS = {"None", ""}, {"True": True, "False": False}


def _typed(series: pd.Series) -> pd.Series:
    """A param column with the dtype its values had in the trial config: float/int, bool, or text; None -> missing."""
    present = series[series.notna()].astype(str)
    present = present[~present.isin(_MISSING)]
    values = series.where(series.notna() & ~series.astype(str).isin(_MISSING))
    if present.empty:
        return pd.Series(float("nan"), index=series.index, dtype="float64")
    if present.isin(list(_BOOLS)).all():
        mapped = values.map(_BOOLS)
        return mapped.astype(bool) if mapped.notna().all() else mapped.astype("boolean")
    converted = pd.to_numeric(values, errors="coerce")
    if converted.notna().sum() == len(present):
        # Whole numbers stay integers when nothing is missing (epochs, seeds, batch sizes).
        whole = converted.notna().all() and present.str.fullmatch(r"-?\d+").all()
        return converted.astype("int64") if whole else converted
    return values.astype(object)


class StudyNotFound(UserError, LookupError):
    """The tracking store holds no record of the study (no such store, or no experiment of its name)."""


def find_store(start: str | Path | None = None, *, variable: str = "TRACKING_URI") -> str:
    """The tracking URI of the nearest `mlflow.db` in `start` (default: the working directory) or a folder above it:
    a notebook opened from analysis/notebooks (Jupyter's default working directory) finds the repository's store.
    variable: the name the caller's user sets instead, for the error's fix."""
    here = Path(start or Path.cwd()).resolve()
    file = Path(DEFAULT_TRACKING_URI.removeprefix("sqlite:///"))
    for folder in (here, *here.parents):
        if (folder / file).is_file():
            return f"sqlite:///{folder / file}"
    raise StudyNotFound(
        f"no MLflow store ({file}) in {here} or any folder above it. Fix: set {variable} = "
        f"'sqlite:////path/to/mlflow.db' (the store the study ran with), or run the study first (make demo)."
    )


def _open_experiment(study: str | Path, tracking_uri: str | None, *, smoke: bool = False):
    """(client, experiment, absolute uri) of a study; a StudyNotFound names the experiments that do exist.

    Reads only: a missing SQLite store is reported, never created."""
    from trainables.tracking import resolve_tracking_uri, tracking_client

    uri = resolve_tracking_uri(tracking_uri or DEFAULT_TRACKING_URI)
    try:
        client = tracking_client(uri, create=False)
    except UserError as err:
        raise StudyNotFound(str(err)) from None
    name = _experiment_name(study, smoke=smoke)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        known = sorted(e.name for e in client.search_experiments())
        raise StudyNotFound(
            f"study {name!r}: no MLflow experiment of that name at {uri}. Known: {known}. Fix: run the study, or "
            f"give the store it ran with (--tracking-uri)."
        )
    return client, exp, uri


# MLflow's largest search_runs page (its REST API's documented maximum): a study of up to 50,000 trials is one
# request, and one of exactly a page's size needs no second, empty one. Nothing is read per run: the search brings
# every param, tag and latest metric. (Splitting the read into 4 concurrent searches over start-time ranges, for a
# server's 4 workers, was measured and dropped: 5 to 25% faster on a warm server, 3.6x slower on a cold one;
# docs/benchmarks.md.)
_PAGE = 50_000


def _trial_runs(client, experiment_id: str) -> list:
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=_TRIAL_FILTER, max_results=_PAGE, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


Launch = Union[int, Literal["latest", "all"]]


def _launch(run) -> int:
    return int(run.data.tags.get(LAUNCH_TAG, "1"))  # runs recorded before launches existed are the first


def _of_launch(runs: list, launch: Launch) -> list:
    """The trial runs of one launch of the study (`latest`: the newest), or all of them (`all`)."""
    if launch == "all" or not runs:
        return runs
    if launch == "latest":
        launch = max(_launch(r) for r in runs)
    elif isinstance(launch, bool) or not isinstance(launch, int) or launch < 1:
        raise ValueError(f"launch must be 'latest', 'all' or a launch number >= 1, got {launch!r}")
    return [r for r in runs if _launch(r) == launch]


def _identity(run) -> dict:
    tags = run.data.tags
    row = {
        "run_id": run.info.run_id,
        "trial_id": tags.get(TRIAL_ID_TAG),
        "cell": tags.get(CELL_TAG, ""),
        "launch": _launch(run),
    }
    row.update({k: v for k, v in tags.items() if k.startswith(FACTOR_PREFIX)})
    return row


def load_runs(
    study: str | Path, *, tracking_uri: str | None = None, launch: Launch = "latest", smoke: bool = False
) -> pd.DataFrame:
    """The study's trials, one row each: run id and name, launch, status, factors, the resolved config (dotted paths),
    final metrics (counts such as val_samples and best_epoch as integers).

    study: the study's name or its YAML file (then its `tracking.experiment`, else its name, is the experiment).
    smoke: the study's --smoke runs (they live in the experiment `<experiment>-smoke`).
    tracking_uri: the MLflow store; a relative `sqlite:///` path is taken from the current directory.
    launch: which launch of the study (`sharpscale run --new-launch` starts another): the newest by default, a
    number, or 'all' (then group or filter by the `launch` column: launches are not replicates of each other).
    """
    client, exp, _ = _open_experiment(study, tracking_uri, smoke=smoke)
    return trials_frame(client, exp.experiment_id, launch=launch)


def trials_frame(client, experiment_id: str, *, launch: Launch = "latest") -> pd.DataFrame:
    """`load_runs`'s frame from an open client and an experiment id (a study's roll-up, which holds both)."""
    rows = []
    for run in _of_launch(_trial_runs(client, experiment_id), launch):
        row = _identity(run)
        row.update(
            {
                "run_name": run.info.run_name,
                "status": run.data.tags.get(STATUS_TAG, "unknown"),
                STAGE_COLUMN: run.data.tags.get(STAGE_TAG, SEARCH_STAGE),
                "mlflow_status": run.info.status,
                "start_time": pd.Timestamp(run.info.start_time, unit="ms"),
            }
        )
        # The whole resolved config (kept in tags: the params hold only what the study varies), then the params.
        row.update(config_from_tags(run.data.tags))
        row.update(run.data.params)
        row.update(run.data.metrics)
        if (scored := scored_from_tags(run.data.tags)) is not None:
            row[SCORED_COLUMN] = scored
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    first = ["run_id", "run_name", "trial_id", "cell", "launch", "status", STAGE_COLUMN, "mlflow_status", "start_time"]
    text = set(first) | {c for c in df.columns if c.startswith(FACTOR_PREFIX)} | {SCORED_COLUMN}
    # An empty section of the config (`optimizer.hparams: {}`) is logged as the param '{}': not a column of values.
    empty = [
        c for c in df.columns if c not in text and df[c].dropna().astype(str).eq("{}").all() and df[c].notna().any()
    ]
    df = df.drop(columns=empty)
    df = df[first + [c for c in df.columns if c not in first]]
    for col in df.columns:
        if col not in text and (df[col].dtype == object or pd.api.types.is_string_dtype(df[col])):
            df[col] = _typed(df[col])
    for col in COUNT_METRICS:
        if col in df.columns:
            values = pd.to_numeric(df[col], errors="coerce")
            whole = values.dropna().eq(values.dropna().round()).all()
            if whole:
                df[col] = values.astype("Int64" if values.isna().any() else "int64")
    return df.sort_values("start_time").reset_index(drop=True)


def load_curves(
    study: str | Path,
    *,
    tracking_uri: str | None = None,
    metrics: Sequence[str] = ("train_loss", "val_loss", "val_acc"),
    run_ids: Sequence[str] | None = None,
    max_workers: int = 4,
    launch: Launch = "latest",
    smoke: bool = False,
) -> pd.DataFrame:
    """Per-epoch histories of the study's trials as a tidy long table.

    Columns: run_id, trial_id, cell, the factor.* columns, metric, step (the epoch), value; sorted by
    run, metric, step. metrics: the metric keys to fetch; a trial that never logged one simply has no rows
    for it. run_ids: only these trials (e.g. `load_runs(...)` filtered to the best per cell); an id that is
    not a trial of the study is an error. One step logged twice (a trial resumed from an earlier
    checkpoint re-runs epochs) keeps its latest value. MLflow serves one (run, metric) history per call,
    so the calls that can return something (the run has that metric) run on `max_workers` threads. launch: as
    for `load_runs` (ignored when `run_ids` names the trials). smoke: as for `load_runs`.
    """
    if isinstance(metrics, str):
        metrics = (metrics,)
    metrics = tuple(metrics)
    if not metrics:
        raise ValueError("metrics must name at least one metric, got an empty sequence; e.g. metrics=('val_acc',)")
    if not isinstance(max_workers, int) or max_workers < 1:
        raise ValueError(f"max_workers must be an int >= 1, got {max_workers!r}; use 1 to fetch serially")
    client, exp, uri = _open_experiment(study, tracking_uri, smoke=smoke)
    runs = _trial_runs(client, exp.experiment_id)
    if run_ids is None:
        runs = _of_launch(runs, launch)
    else:
        wanted = list(dict.fromkeys(run_ids))
        known = {r.info.run_id for r in runs}
        missing = [r for r in wanted if r not in known]
        if missing:
            raise ValueError(
                f"run_ids: {len(missing)} id(s) are not trials of study {exp.name!r} at {uri}: {missing[:5]}. "
                "Fix: take the ids from load_runs(...)['run_id'] of the same study and store."
            )
        runs = [r for r in runs if r.info.run_id in set(wanted)]
    # The run's latest-metric map says which histories exist: no call is spent on a metric it never logged.
    jobs = [(run, key) for run in runs for key in metrics if key in run.data.metrics]

    def fetch(job):
        run, key = job
        return run, key, client.get_metric_history(run.info.run_id, key)

    if max_workers > 1 and len(jobs) > 1:
        with ThreadPoolExecutor(max_workers=max_workers) as pool:
            results = list(pool.map(fetch, jobs))
    else:
        results = [fetch(j) for j in jobs]
    factor_cols = sorted({k for run in runs for k in _identity(run) if k.startswith(FACTOR_PREFIX)})
    rows = []
    for run, key, history in results:
        ident = _identity(run)
        latest: dict[int, tuple[int, float]] = {}
        for m in history:
            if m.step not in latest or m.timestamp >= latest[m.step][0]:
                latest[m.step] = (m.timestamp, m.value)
        for step, (_, value) in latest.items():
            rows.append({**ident, "metric": key, "step": int(step), "value": float(value)})
    columns = ["run_id", "trial_id", "cell", "launch", *factor_cols, "metric", "step", "value"]
    df = pd.DataFrame(rows, columns=columns)
    df["step"] = df["step"].astype("int64")
    df["value"] = df["value"].astype("float64")
    return df.sort_values(["run_id", "metric", "step"]).reset_index(drop=True)


def summarize(
    runs: pd.DataFrame,
    *,
    metric: str = "val_acc",
    mode: Literal["max", "min"] = "max",
    show: tuple[str, ...] = (RHO,),
    label: str | None = None,
) -> pd.DataFrame:
    """Best trial per cell (BEST_RULE): the factors as the index, the best metric, the value of each `show` column.

    label: the statistic `metric` holds, in words, for the column's header 'best <label>' (e.g. 'val_acc (final
    epoch)'); default: the metric's name.

    A study without factors is one cell (index `cell`, the empty name); with no finished trial carrying the
    metric (every trial failed, or none ran) the table is empty: a normal outcome, not an error. For an accuracy,
    when the trials logged their validation sample count, columns `SE_COLUMN` (the binomial standard error of the
    best value, sqrt(p (1 - p) / n)), `CI_LOW`/`CI_HIGH` (its exact 95% interval, `accuracy_interval`: the SE is 0 at
    p = 1, the interval is not) and `val n` say how precisely each value is measured.
    """
    if runs.empty or metric not in runs.columns:
        return pd.DataFrame()
    factors = [c for c in runs.columns if c.startswith(FACTOR_PREFIX)] or ["cell"]
    chosen = best_trials(runs, metric=metric, mode=mode, by=factors)
    if chosen.empty:
        return pd.DataFrame()
    best = chosen[factors + [metric] + [c for c in show if c in chosen.columns]]
    if metric in ACCURACY_METRICS and VALIDATION_SAMPLES in chosen.columns:
        # The sampling error of an accuracy measured on n samples, binomial: how far apart two cells' values
        # must be before this run tells them apart (a small validation set makes it points wide).
        n = chosen[VALIDATION_SAMPLES].astype("float64").to_numpy()
        p = best[metric].to_numpy(dtype=float)
        low, high = accuracy_interval(p, n)
        best = best.assign(**{SE_COLUMN: accuracy_se(p, n), CI_LOW: low, CI_HIGH: high, "val n": n.astype("int64")})
    counts = runs.groupby(factors).size().rename("trials")
    out = best.set_index(factors).join(counts)
    out.index.names = [f.removeprefix(FACTOR_PREFIX) for f in factors]
    return out.rename(columns={metric: f"best {label or metric}"})


def status_table(
    runs: pd.DataFrame,
    planned: dict[str, int],
    *,
    metric: str,
    mode: Literal["max", "min"],
    label: str,
    knobs: Sequence[str] = (),
) -> pd.DataFrame:
    """`sharpscale status`'s table: per cell (planned: cell key -> planned trials) its trials by status, its best
    search trial's `metric` (`label` names it) with its SE where it is an accuracy, and that trial's `knobs`; numbers
    as the summary prints them, '-' where a cell has none yet."""
    planned_col = pd.Series(planned, name="planned")
    if runs.empty:
        counts = pd.DataFrame(index=planned_col.index)
    else:
        counts = runs.pivot_table(index="cell", columns="status", values="run_id", aggfunc="count", fill_value=0)
        # The best trial of each cell and its knobs, as the summary, the report and the MLflow roll-ups name it.
        search, _ = split_stages(runs)  # a cell's best is its search's (confirm trials are scored held-out)
        chosen = best_trials(search, metric=metric, mode=mode, by=["cell"]).set_index("cell")
        if not chosen.empty:
            counts[f"best {label}"] = chosen[metric]
            if metric in ACCURACY_METRICS and VALIDATION_SAMPLES in chosen.columns:
                # Beside the value, how precisely it is measured: the summary's and the study page's SE.
                counts[SE_COLUMN] = accuracy_se(
                    chosen[metric].astype("float64"), chosen[VALIDATION_SAMPLES].astype("float64")
                )
            for knob in dict.fromkeys(knobs):
                if knob in chosen.columns:
                    counts[f"best {knob.rsplit('.', 1)[-1]}"] = chosen[knob]
    table = counts.join(planned_col, how="right")
    counted = [c for c in table.columns if not str(c).startswith("best ") and c != SE_COLUMN]
    table[counted] = table[counted].fillna(0)
    for col in table.columns:
        if pd.api.types.is_float_dtype(table[col]):
            table[col] = table[col].map(lambda v: "-" if pd.isna(v) else TABLE_FLOAT_FORMAT.format(v))
    table.index = [cell_key_name(k) for k in table.index]  # one name per cell, as its trial runs carry it
    return table.fillna("-")


def subsets_per_seed(runs) -> bool:
    """Whether the study's confirm runs each trained on their seed's own subset (confirm.subsets: per_seed), read
    from the runs themselves: every confirm run's data.fraction_seed is its train.seed, over two or more seeds."""
    if runs.empty or not {"data.fraction_seed", "train.seed"} <= set(runs.columns):
        return False
    _, confirm = split_stages(runs)
    if confirm.empty:
        return False
    subsets = pd.to_numeric(confirm["data.fraction_seed"], errors="coerce")
    seeds = pd.to_numeric(confirm["train.seed"], errors="coerce")
    return bool((subsets == seeds).all() and seeds.nunique() >= 2)


def split_stages(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(search trials, confirm trials) of a load_runs frame; a frame without a stage column is all search.

    Each confirm trial is its own replicate: its `cell` becomes '<cell> seed=<train.seed>', so that any "best trial
    of a cell" reading (summarize, compute_matched) takes that one run, never the best of a cell's confirm seeds.
    """
    if runs.empty or STAGE_COLUMN not in runs.columns:
        return runs, runs.iloc[0:0]
    confirm = runs[runs[STAGE_COLUMN] == CONFIRM_STAGE].copy()
    if not confirm.empty and "train.seed" in confirm.columns:
        confirm["cell"] = confirm["cell"].astype(str) + " seed=" + confirm["train.seed"].astype(str)
    return runs[runs[STAGE_COLUMN] != CONFIRM_STAGE], confirm


def unconfirmed_cells(search: pd.DataFrame, confirm: pd.DataFrame) -> list[str]:
    """Cells with search or confirm trials but no finished confirm run (split_stages' two frames): interrupted, cut
    by the time limit, or every search trial failed. A comparison on confirm runs leaves them out, and must say so."""
    if confirm.empty:
        return []
    base = confirm["cell"].astype(str).str.rsplit(" seed=", n=1).str[0]
    done = set(base[confirm["status"] == "finished"])
    return sorted((set(search["cell"].astype(str)) | set(base)) - done)


def measured_on(runs: pd.DataFrame) -> str:
    """Which data the numbers of these trials come from, in words, for every table a report prints."""
    if runs.empty:
        return "no trials"
    stages = set(runs[STAGE_COLUMN]) if STAGE_COLUMN in runs.columns else {SEARCH_STAGE}
    splits = set(runs[_EVAL_SPLIT].dropna().astype(str)) if _EVAL_SPLIT in runs.columns else set()
    if stages == {CONFIRM_STAGE}:
        return (
            "confirm runs: fresh seeds at each cell's chosen knobs, scored on the held-out test half of the validation "
            "set, which no choice saw (selection-free)"
        )
    if splits == {"selection"}:
        return "search trials, scored on the selection half of the validation set (the data the knobs were chosen on)"
    return (
        "search trials, best of each cell's search, chosen and scored on the same validation data: biased upwards by "
        "the choice (a confirm stage, studies/confirm.py, measures without it)"
    )


def confirm_summary(confirm: pd.DataFrame, *, metric: str = "val_acc", show: tuple[str, ...] = (RHO,)) -> pd.DataFrame:
    """Per cell, its confirm runs (split_stages' second frame): mean and sd of `metric` over the finished ones, the
    standard error and 95% interval (CI_LOW, CI_HIGH) of the cell's population value, what that interval
    resamples (`interval over`), their number, the seeds, and the chosen value of each `show` column (one per cell).

    Where every run of a cell recorded its per-image correctness (SCORED_COLUMN) for `metric`, the interval is over
    seeds and test images jointly (analysis.images.crossed_t): it covers the accuracy on the population of images
    the test set stands for. Elsewhere it is Student's t over seeds, given the scored test images. attrs
    "conditions": what the table's intervals condition on, in words (both statements where rows differ).
    """
    from analysis.images import IMAGE_OVER, SEED_OVER, crossed_t, interval_conditions, scored_matrix
    from analysis.scaling.inference import paired_t

    confidence = 0.95  # CI_LOW and CI_HIGH say 95%
    if confirm.empty or metric not in confirm.columns:
        return pd.DataFrame()
    ok = confirm[(confirm["status"] == "finished") & pd.to_numeric(confirm[metric], errors="coerce").notna()]
    if ok.empty:
        return pd.DataFrame()
    ok = ok.assign(__cell=ok["cell"].str.rsplit(" seed=", n=1).str[0], __value=pd.to_numeric(ok[metric]))
    factors = [c for c in ok.columns if c.startswith(FACTOR_PREFIX)] or ["__cell"]
    rows = []
    for key, part in ok.groupby(factors, sort=False):
        values = part["__value"].astype("float64")
        n = len(values)
        sd = float(values.std(ddof=1)) if n > 1 else math.nan
        matrix = None
        if SCORED_COLUMN in part.columns:
            matrix, _ = scored_matrix(part[SCORED_COLUMN].tolist(), values.tolist())
        if matrix is not None:
            test, over = crossed_t(matrix, confidence=confidence), IMAGE_OVER
        else:
            test, over = paired_t(values.to_numpy(), confidence=confidence), SEED_OVER
        row = dict(zip(factors, key if isinstance(key, tuple) else (key,)))
        row.update({f"mean {metric}": float(values.mean()), "sd": sd, "SE": test.se, CI_LOW: test.low})
        row.update({CI_HIGH: test.high, "interval over": over if n > 1 else "", "n seeds": n})
        if "train.seed" in part.columns:
            row["seeds"] = ", ".join(str(v) for v in sorted(part["train.seed"].tolist()))
        for col in show:
            if col in part.columns and part[col].notna().any():
                row[f"chosen {col.rsplit('.', 1)[-1]}"] = part[col].iloc[0]
        rows.append(row)
    out = pd.DataFrame(rows).set_index(factors)
    out.index.names = [f.removeprefix(FACTOR_PREFIX).removeprefix("__") for f in factors]
    out.attrs["conditions"] = interval_conditions(out["interval over"])
    return out
