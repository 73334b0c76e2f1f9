"""Results of studies as data: MLflow records to pandas, tables, plots and loss-geometry metrics (never needs Ray)."""

from analysis import geometry
from analysis.plots import plot_curves, plot_error_vs_n, plot_gain, plot_rho_sensitivity
from analysis.record import log_geometry
from analysis.report import write_report
from analysis.runs import load_curves, load_runs, summarize
from analysis.scaling import (
    DataMultiplier,
    FloorNotIdentifiedWarning,
    LawFit,
    PowerLawFit,
    data_multiplier,
    fit_law,
    fit_power_law,
    fit_scaling_table,
    fits_frame,
    law_extrapolation,
    paired_law_difference,
)
from analysis.tables import (
    FewSamplesWarning,
    RhoSensitivity,
    ScalingTable,
    best_of_search,
    geometry_correlation,
    method_pairs,
    rho_sensitivity,
    sam_gain,
    scaling_table,
)

__all__ = [
    "DataMultiplier",
    "FewSamplesWarning",
    "FloorNotIdentifiedWarning",
    "LawFit",
    "PowerLawFit",
    "RhoSensitivity",
    "ScalingTable",
    "best_of_search",
    "data_multiplier",
    "fit_law",
    "fit_power_law",
    "fit_scaling_table",
    "fits_frame",
    "geometry",
    "geometry_correlation",
    "law_extrapolation",
    "load_curves",
    "load_runs",
    "log_geometry",
    "method_pairs",
    "paired_law_difference",
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
