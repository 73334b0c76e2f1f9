"""Compute cost of a study's trials (GPU-seconds from their logged epoch times) and the compute-matched table.

Each cell's answer against what it cost, so that SAM at 1x epochs meets vanilla given the same compute (2x epochs):
the baseline Foret et al. 2021 ran and most later papers omit."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import pandas as pd

from analysis.images import IMAGE_OVER, SEED_OVER, crossed_detectable, crossed_t, interval_conditions, scored_matrix
from analysis.runs import SCORED_COLUMN, best_trials
from analysis.scaling.inference import CONDITIONS, detectable, paired_t
from analysis.tables import _require_columns, holm_across, sample_note
from trainables.metrics import EPOCH_TIME
from trainables.naming import FACTOR_PREFIX, GPUS_PER_WORKER_PARAM, WORKERS_PARAM

__all__ = ["COST_UNITS", "compute_matched", "compute_matched_gains", "trial_compute"]

# The unit of a trial's cost: GPU-seconds where it held GPUs; CPU worker-seconds where it held none; plain seconds of
# its one process where its record predates the resource params (WORKERS_PARAM, GPUS_PER_WORKER_PARAM).
COST_UNITS = {"gpu": "GPU-s", "cpu": "CPU worker-s", "unknown": "s (resources not recorded)"}


def trial_compute(runs: pd.DataFrame, epoch_times: pd.DataFrame) -> pd.DataFrame:
    """Each trial's training compute, one row per run of `runs` (same index), from its per-epoch epoch_time_s.

    epoch_times: load_curves(..., metrics=("epoch_time_s",)) of the same trials (a trial's record of each epoch;
    an epoch re-run after a resume counts once, as load_curves keeps one value per epoch). Columns: run_id,
    epochs_run (epochs with a time), train_s (their seconds: training passes only, not validation or
    checkpoints), workers and gpus_per_worker (what the trial held, from its params; a fraction where trials
    shared a GPU), cost_s = train_s x workers x gpus_per_worker (GPU-seconds; x workers alone, CPU worker-seconds,
    for a trial without GPUs), and unit (COST_UNITS). A trial with no timed epoch has cost_s NaN, never 0.
    """
    _require_columns(runs, run_id="run_id")
    _require_columns(
        epoch_times, **{"epoch_times.run_id": "run_id", "epoch_times.metric": "metric", "epoch_times.value": "value"}
    )
    times = epoch_times[epoch_times["metric"] == EPOCH_TIME]
    values = pd.to_numeric(times["value"], errors="coerce")
    ok = times[np.isfinite(values.astype("float64")) & (values >= 0)]
    per_run = ok.groupby("run_id")["value"].agg(["sum", "count"])
    out = pd.DataFrame({"run_id": runs["run_id"]}, index=runs.index)
    out["epochs_run"] = out["run_id"].map(per_run["count"]).fillna(0).astype("int64")
    out["train_s"] = out["run_id"].map(per_run["sum"]).astype("float64")
    out.loc[out["epochs_run"] == 0, "train_s"] = math.nan

    def param(col: str) -> pd.Series:
        if col not in runs.columns:
            return pd.Series(math.nan, index=runs.index, dtype="float64")
        return pd.to_numeric(runs[col], errors="coerce").astype("float64")

    workers, gpus = param(WORKERS_PARAM), param(GPUS_PER_WORKER_PARAM)
    recorded = workers.notna() & gpus.notna()
    out["workers"] = workers.where(recorded, 1.0)
    out["gpus_per_worker"] = gpus.where(recorded, math.nan)
    on_gpu = recorded & (gpus > 0)
    out["cost_s"] = out["train_s"] * out["workers"] * gpus.where(on_gpu, 1.0)
    out["unit"] = np.where(on_gpu, COST_UNITS["gpu"], np.where(recorded, COST_UNITS["cpu"], COST_UNITS["unknown"]))
    return out


def _cells(runs, epoch_times, *, arch, method, seed, epochs, metric, mode) -> tuple[list[str], pd.DataFrame]:
    """One row per cell: its group keys (arch, method, other factors but seed), trials, epochs, cost and answer."""
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}; 'max' for accuracies, 'min' for losses")
    _require_columns(runs, arch=arch, method=method, metric=metric, cell="cell", status="status")
    cost = trial_compute(runs, epoch_times)
    others = sorted(c for c in runs.columns if c.startswith(FACTOR_PREFIX) and c not in (arch, method, seed))
    keys = [arch, method, *others]
    ident = [c for c in ("run_id", "start_time") if c in runs.columns]  # BEST_RULE's tie-break
    scored = [SCORED_COLUMN] if SCORED_COLUMN in runs.columns else []  # per-image records (analysis.images)
    frame = runs[[*keys, "cell", "status", metric, *ident, *scored, *([epochs] if epochs in runs.columns else [])]]
    frame = frame.copy()
    frame["cost_s"], frame["unit"] = cost["cost_s"], cost["unit"]
    frame[metric] = pd.to_numeric(frame[metric], errors="coerce").astype("float64")
    rows = []
    for cell, part in frame.groupby("cell", sort=False):
        chosen = best_trials(part, metric=metric, mode=mode, by=["cell"])
        best = float(chosen[metric].iloc[0]) if len(chosen) else math.nan
        run_cost = float(chosen["cost_s"].iloc[0]) if len(chosen) else math.nan
        record = chosen[SCORED_COLUMN].iloc[0] if scored and len(chosen) else None
        first = part.iloc[0]
        rows.append(
            {
                **{k: first[k] for k in keys},
                "cell": cell,
                "trials": len(part),
                "epochs": first[epochs] if epochs in part.columns else math.nan,
                # A trial without a timed epoch leaves its cell's cost unknown, not smaller.
                "cost_s": part["cost_s"].sum(min_count=len(part)),
                "run_cost_s": run_cost,
                "unit": first["unit"],
                "value": best,
                "scored": record,
            }
        )
    return keys, pd.DataFrame(rows)


def compute_matched(
    runs: pd.DataFrame,
    epoch_times: pd.DataFrame,
    *,
    arch: str = "factor.arch",
    method: str = "factor.method",
    seed: str | None = "factor.train.seed",
    epochs: str = "schedule.epochs",
    metric: str = "val_acc",
    mode: Literal["max", "min"] = "max",
) -> pd.DataFrame:
    """Each (arch, method, other factors) group's answer against its compute: the frontier's points.

    A cell (one combination of factor levels, one seed) delivers its best finished trial by `metric`
    (`analysis.runs.BEST_RULE`) and costs the compute of all its trials (cost: a search's trials are the price of its
    answer; `trial_compute`); run_cost is that best trial's own compute (what one run of the method costs). Cells that
    differ only in `seed` are replicates: per group, mean and standard error (sd / sqrt(n), none where n = 1) of
    the cost and of the metric, n the number of cells with a result, and a small-sample note. Groups: `arch`,
    `method` and every other factor.* column but `seed`; `epochs` (the configured schedule.epochs, so the 2x
    baseline reads as such) is a column. attrs: metric, mode, unit (the cost unit when every trial shares one).
    """
    keys, cells = _cells(
        runs, epoch_times, arch=arch, method=method, seed=seed, epochs=epochs, metric=metric, mode=mode
    )
    out_rows = []
    for key, part in cells.groupby(keys, sort=True, dropna=False):
        done = part[np.isfinite(part["value"].astype("float64"))]
        n = len(done)
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        epoch_values = sorted(
            {int(e) for e in done["epochs"] if isinstance(e, (int, float, np.number)) and math.isfinite(e)}
        )
        row["epochs"] = epoch_values[0] if len(epoch_values) == 1 else (", ".join(map(str, epoch_values)) or math.nan)
        for name, col in (("cost", "cost_s"), ("run_cost", "run_cost_s"), ("metric", "value")):
            vals = done[col].astype("float64").dropna()
            row[f"{name}_mean"] = float(vals.mean()) if len(vals) else math.nan
            row[f"{name}_se"] = float(vals.std(ddof=1) / math.sqrt(len(vals))) if len(vals) > 1 else math.nan
            if name == "cost":  # cells with a result but an untimed trial: their cost is unknown, and n says so
                row["cost_n"] = len(vals)
        units = sorted(set((done if n else part)["unit"]))
        row["unit"] = units[0] if len(units) == 1 else ", ".join(units)
        row["n"] = n
        row["trials"] = int(part["trials"].sum())
        row["note"] = sample_note(n, "seeds")
        out_rows.append(row)
    columns = [
        *keys,
        "epochs",
        "unit",
        "cost_mean",
        "cost_se",
        "cost_n",
        "run_cost_mean",
        "run_cost_se",
        "metric_mean",
        "metric_se",
        "n",
        "trials",
        "note",
    ]
    out = pd.DataFrame(out_rows, columns=columns)
    out = out.rename(columns={k: k.removeprefix(FACTOR_PREFIX) for k in keys}).set_index(
        [k.removeprefix(FACTOR_PREFIX) for k in keys]
    )
    units = sorted(set(out.loc[out["n"] > 0, "unit"]))  # a group without a result has no cost to show
    out.attrs.update(metric=metric, mode=mode, unit=units[0] if len(units) == 1 else "mixed units (see `unit`)")
    return out


def compute_matched_gains(
    runs: pd.DataFrame,
    epoch_times: pd.DataFrame,
    *,
    baseline: str,
    arch: str = "factor.arch",
    method: str = "factor.method",
    seed: str = "factor.train.seed",
    epochs: str = "schedule.epochs",
    metric: str = "val_acc",
    mode: Literal["max", "min"] = "max",
    confidence: float = 0.95,
    power: float = 0.8,
) -> pd.DataFrame:
    """Each method's gain over `baseline` (a level of `method`) at its compute, paired by seed within an arch.

    A pair: the two cells of one arch and seed (and the same other factors). gain: mean of the paired
    differences of the cells' answers (method - baseline; positive: the method scored higher), its Student-t
    interval (ci_low, ci_high) and p-value on the pairs, p_holm Holm-adjusted across the methods of an arch,
    `significant` p_holm < 1 - confidence (NA where no test can be run); detectable: the gain the pairs find with `power` (from their sd);
    cost_ratio: the mean compute of one run of the method over one run of the baseline on the same seeds
    (1 = compute-matched; a search's other trials are not counted). One row per
    (arch, other factors, method); n_pairs and a small-sample note. Where both chosen trials of every pair
    recorded their per-image correctness (load_runs' SCORED_COLUMN) on the same images, the row's interval, test
    and detectable gain are over seeds and test images jointly (analysis.images.crossed_t on the per-image
    differences), elsewhere over seed pairs alone; `interval over` says which, attrs["conditions"] what they
    condition on.
    """

    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}; 'max' for accuracies, 'min' for losses")
    _require_columns(runs, arch=arch, method=method, seed=seed, metric=metric, cell="cell", status="status")
    levels = sorted(runs[method].dropna().astype(str).unique())
    if baseline not in levels:
        raise ValueError(f"baseline={baseline!r} is not a level of {method!r} ({levels}); pass one of them")
    keys, cells = _cells(
        runs, epoch_times, arch=arch, method=method, seed=seed, epochs=epochs, metric=metric, mode=mode
    )
    cells[seed] = runs.groupby("cell")[seed].first().reindex(cells["cell"]).to_numpy()
    groups = [k for k in keys if k != method]
    alpha = 1.0 - confidence
    rows = []
    for key, part in cells.groupby(groups, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        wide = part.pivot_table(index=seed, columns=method, values="value", aggfunc="first")
        # One run's compute (the chosen trial's own), as the frontier plot draws it: a searched cell's whole search
        # would make SAM look 4-8x as dear as a baseline that ran once.
        cost = part.pivot_table(index=seed, columns=method, values="run_cost_s", aggfunc="first")
        records = {(sd, str(m)): text for sd, m, text in zip(part[seed], part[method], part["scored"])}
        if baseline not in wide.columns:
            continue
        for level in [c for c in wide.columns if c != baseline]:
            both = wide[[level, baseline]].dropna()
            test, over = _paired_test(both, records, level, baseline, confidence)
            k, mean, lo, hi, pval = test.n, test.mean, test.low, test.high, test.p_value
            share = getattr(test, "image_share", 0.0)
            mde = (
                crossed_detectable(test.se, test.df, share, confidence=confidence, power=power)
                if over == IMAGE_OVER
                else detectable(test.se, test.df, confidence=confidence, power=power)
            )
            c = cost.reindex(index=both.index, columns=[level, baseline])  # an untimed method: NaN, not a KeyError
            ratio = float(c[level].mean() / c[baseline].mean()) if k and c[baseline].mean() > 0 else math.nan
            rows.append(
                {
                    **dict(zip(groups, key)),
                    "method": level,
                    "baseline": baseline,
                    "gain": mean,
                    "ci_low": lo,
                    "ci_high": hi,
                    "p_value": pval,
                    "interval over": over if k > 1 else "",
                    "detectable": mde,
                    "cost_ratio": ratio,
                    "n_pairs": k,
                    "note": sample_note(k, "seed pairs"),
                }
            )
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    holm_across(out, groups, alpha=alpha, power=power, what="difference")
    names = [g.removeprefix(FACTOR_PREFIX) for g in groups]
    out = out.rename(columns=dict(zip(groups, names))).set_index([*names, "method"])
    conditions = (
        interval_conditions(out["interval over"]) if "scored" in cells and cells["scored"].notna().any() else CONDITIONS
    )
    out.attrs.update(metric=metric, mode=mode, confidence=confidence, baseline=baseline, conditions=conditions)
    return out


def _paired_test(both: pd.DataFrame, records: dict, level: str, baseline: str, confidence: float):
    """(test, interval over) of one method's paired gain: over seeds and test images (analysis.images.crossed_t on
    the per-image differences) where every pair's two chosen trials recorded per-image correctness of the values
    compared on the same images (records: (seed, method level) -> record), else Student's t over the seed pairs."""
    diffs = (both[level] - both[baseline]).to_numpy(dtype="float64")
    if len(both) >= 2:
        texts = [records.get((sd, str(m))) for m in (level, baseline) for sd in both.index]
        matrix, _ = scored_matrix(texts, both[level].tolist() + both[baseline].tolist())
        if matrix is not None:
            k = len(both)
            per_image = matrix[:k].astype("float64") - matrix[k:].astype("float64")
            return crossed_t(per_image, confidence=confidence), IMAGE_OVER
    return paired_t(diffs, confidence=confidence), SEED_OVER
