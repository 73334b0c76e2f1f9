"""Results of studies as data: MLflow records to pandas, tables, plots and loss-geometry metrics (never needs Ray)."""

from analysis import geometry
from analysis.plots import plot_curves, plot_error_vs_n, plot_gain, plot_rho_sensitivity
from analysis.record import log_geometry
from analysis.report import write_report
from analysis.runs import load_curves, load_runs, summarize
from analysis.scaling import (
    DataMultiplier,
    FloorNotIdentifiedWarning,
    PowerLawFit,
    data_multiplier,
    fit_power_law,
    fit_scaling_table,
    fits_frame,
)
from analysis.tables import (
    FewSamplesWarning,
    RhoSensitivity,
    ScalingTable,
    best_of_search,
    method_pairs,
    rho_sensitivity,
    sam_gain,
    scaling_table,
)

__all__ = [
    "DataMultiplier",
    "FewSamplesWarning",
    "FloorNotIdentifiedWarning",
    "PowerLawFit",
    "RhoSensitivity",
    "ScalingTable",
    "best_of_search",
    "data_multiplier",
    "fit_power_law",
    "fit_scaling_table",
    "fits_frame",
    "geometry",
    "load_curves",
    "log_geometry",
    "load_runs",
    "method_pairs",
    "plot_curves",
    "plot_error_vs_n",
    "plot_gain",
    "plot_rho_sensitivity",
    "rho_sensitivity",
    "sam_gain",
    "scaling_table",
    "summarize",
    "write_report",
]
