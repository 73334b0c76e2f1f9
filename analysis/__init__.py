"""Results of studies as data: MLflow records to pandas, tables, plots and loss-geometry metrics (never needs Ray)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each public name and the submodule that defines it. Submodules load on first use (PEP 562), so that
# `from analysis import load_runs` (`sharpscale status`) does not pay for torch (geometry) or matplotlib (plots).
_HOMES = {
    "COST_UNITS": "compute",
    "compute_matched": "compute",
    "compute_matched_gains": "compute",
    "detectable_effects": "design",
    "trial_compute": "compute",
    "plot_compute_frontier": "plots",
    "plot_curves": "plots",
    "plot_sharpness": "plots",
    "plot_error_vs_n": "plots",
    "plot_gain": "plots",
    "plot_rho_sensitivity": "plots",
    "checkpointed_trials": "record",
    "log_geometry": "record",
    "measure_checkpoint": "record",
    "measure_study": "record",
    "write_report": "report",
    "headline": "tables",
    "accuracy_interval": "runs",
    "confirm_summary": "runs",
    "load_curves": "runs",
    "load_runs": "runs",
    "measured_on": "runs",
    "split_stages": "runs",
    "summarize": "runs",
    "unconfirmed_cells": "runs",
    "DataMultiplier": "scaling",
    "FloorNotIdentifiedWarning": "scaling",
    "LawFit": "scaling",
    "PowerLawFit": "scaling",
    "chance_error": "scaling",
    "data_multiplier": "scaling",
    "fit_law": "scaling",
    "fit_power_law": "scaling",
    "fit_scaling_table": "scaling",
    "fits_frame": "scaling",
    "law_extrapolation": "scaling",
    "law_parameters": "scaling",
    "paired_law_difference": "scaling",
    "FewSamplesWarning": "tables",
    "RhoSensitivity": "tables",
    "ScalingTable": "tables",
    "best_of_search": "tables",
    "geometry_correlation": "tables",
    "method_pairs": "tables",
    "rho_sensitivity": "tables",
    "sam_gain": "tables",
    "scaling_table": "tables",
    "knob_importance": "sweep",
    "plot_parallel_coordinates": "sweep",
}
_SUBMODULES = ("geometry",)  # public as modules: `from analysis import geometry`

__all__ = [
    "COST_UNITS",
    "DataMultiplier",
    "FewSamplesWarning",
    "FloorNotIdentifiedWarning",
    "LawFit",
    "PowerLawFit",
    "RhoSensitivity",
    "ScalingTable",
    "best_of_search",
    "chance_error",
    "checkpointed_trials",
    "compute_matched",
    "compute_matched_gains",
    "confirm_summary",
    "data_multiplier",
    "detectable_effects",
    "fit_law",
    "fit_power_law",
    "fit_scaling_table",
    "fits_frame",
    "geometry",
    "geometry_correlation",
    "law_extrapolation",
    "law_parameters",
    "load_curves",
    "load_runs",
    "log_geometry",
    "measure_checkpoint",
    "measure_study",
    "measured_on",
    "method_pairs",
    "paired_law_difference",
    "plot_compute_frontier",
    "plot_curves",
    "plot_error_vs_n",
    "plot_gain",
    "plot_rho_sensitivity",
    "plot_sharpness",
    "rho_sensitivity",
    "sam_gain",
    "scaling_table",
    "knob_importance",
    "plot_parallel_coordinates",
    "split_stages",
    "summarize",
    "accuracy_interval",
    "trial_compute",
    "unconfirmed_cells",
    "write_report",
    "headline",
]

if TYPE_CHECKING:  # for type checkers and IDEs only; at run time __getattr__ imports on demand
    from analysis import geometry
    from analysis.compute import COST_UNITS, compute_matched, trial_compute
    from analysis.plots import (
        plot_compute_frontier,
        plot_curves,
        plot_error_vs_n,
        plot_gain,
        plot_rho_sensitivity,
        plot_sharpness,
    )
    from analysis.record import checkpointed_trials, log_geometry, measure_checkpoint, measure_study
    from analysis.report import write_report
    from analysis.runs import (
        accuracy_interval,
        confirm_summary,
        load_curves,
        load_runs,
        measured_on,
        split_stages,
        summarize,
        unconfirmed_cells,
    )
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
    from analysis.sweep import knob_importance, plot_parallel_coordinates
    from analysis.tables import (
        FewSamplesWarning,
        RhoSensitivity,
        ScalingTable,
        best_of_search,
        geometry_correlation,
        headline,
        method_pairs,
        rho_sensitivity,
        sam_gain,
        scaling_table,
    )


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    elif (home := _HOMES.get(name)) is not None:
        value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
