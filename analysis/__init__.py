"""Results of studies as data: MLflow records to pandas, tables, plots and loss-geometry metrics (never needs Ray)."""

from analysis.runs import load_runs, summarize

__all__ = ["load_runs", "summarize"]
