"""MLflow records to pandas: one row per trial, and the per-cell summary a study prints at its end."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import pandas as pd

__all__ = ["load_runs", "summarize"]

_TRIAL_FILTER = "tags.`sharpscale.kind` = 'trial'"


def _experiment_name(study: str | Path) -> str:
    p = Path(study)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        import yaml

        raw = yaml.safe_load(p.read_text()) or {}
        return (raw.get("tracking") or {}).get("experiment") or raw["name"]
    return str(study)


def _numeric(series: pd.Series) -> pd.Series:
    converted = pd.to_numeric(series, errors="coerce")
    # Keep text columns as text: only convert when every present value is a number.
    return converted if converted.notna().sum() == series.notna().sum() else series


def load_runs(study: str | Path, *, tracking_uri: str | None = None) -> pd.DataFrame:
    """The study's trials, one row each: run ids, status, factors, params (dotted config paths), final metrics.

    study: the study's name (its MLflow experiment; smoke runs live in `<name>-smoke`) or its YAML file.
    tracking_uri: the MLflow store; a relative `sqlite:///` path is taken from the current directory.
    """
    from mlflow.tracking import MlflowClient

    from trainables.tracking import STATUS_TAG

    uri = _absolute_uri(tracking_uri or "sqlite:///mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    name = _experiment_name(study)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        known = sorted(e.name for e in client.search_experiments())
        raise LookupError(f"study {name!r}: no MLflow experiment of that name at {uri}. Known: {known}.")
    rows = []
    token = None
    while True:
        page = client.search_runs([exp.experiment_id], filter_string=_TRIAL_FILTER, max_results=1000, page_token=token)
        for run in page:
            tags = run.data.tags
            row = {
                "run_id": run.info.run_id,
                "trial_id": tags.get("sharpscale.trial_id"),
                "cell": tags.get("sharpscale.cell", ""),
                "status": tags.get(STATUS_TAG, "unknown"),
                "mlflow_status": run.info.status,
                "start_time": pd.Timestamp(run.info.start_time, unit="ms"),
            }
            row.update({f"factor.{k[7:]}": v for k, v in tags.items() if k.startswith("factor.")})
            row.update(run.data.params)
            row.update(run.data.metrics)
            rows.append(row)
        token = page.token
        if not token:
            break
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    for col in df.columns:
        if (df[col].dtype == object or pd.api.types.is_string_dtype(df[col])) and col not in ("run_id", "trial_id", "cell", "status", "mlflow_status"):
            df[col] = _numeric(df[col])
    return df.sort_values("start_time").reset_index(drop=True)


def _absolute_uri(uri: str) -> str:
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str(Path(uri[len(prefix):]).resolve())
    return uri


def summarize(
    runs: pd.DataFrame,
    *,
    metric: str = "val_acc",
    mode: Literal["max", "min"] = "max",
    show: tuple[str, ...] = ("optimizer.hparams.rho",),
) -> pd.DataFrame:
    """Best trial per cell: the factors as the index, the best metric, the value of each `show` column there."""
    factors = [c for c in runs.columns if c.startswith("factor.")]
    ok = runs[(runs["status"] == "finished") & runs[metric].map(lambda v: isinstance(v, float) and math.isfinite(v))]
    if ok.empty:
        return pd.DataFrame()
    idx = ok.groupby(factors)[metric].idxmax() if mode == "max" else ok.groupby(factors)[metric].idxmin()
    best = ok.loc[idx.values, factors + [metric] + [c for c in show if c in ok.columns]]
    counts = runs.groupby(factors).size().rename("trials")
    out = best.set_index(factors).join(counts)
    out.index.names = [f[7:] for f in factors]
    return out.rename(columns={metric: f"best {metric}"})
