"""Data-scaling laws and their inference: power laws, saturating laws, resampling over seeds, extrapolation.

Every name that lived in the former analysis/scaling.py is importable from here (`from analysis.scaling import X`)."""

from __future__ import annotations

from analysis.scaling.extrapolation import (
    law_extrapolation,
    law_parameters,
    paired_law_difference,
    table_points,
    table_scored,
)
from analysis.scaling.inference import CONDITIONS, TTest, detectable, jackknife_se, paired_t, power_t, t_quantile, tost
from analysis.scaling.laws import HUBER_SDS, LAW_FORMS, LawFit, chance_error, default_form, fit_law, robust_delta
from analysis.scaling.power_law import (
    POWER_LAW_COVERAGE,
    DataMultiplier,
    FloorNotIdentifiedWarning,
    PowerLawFit,
    data_multiplier,
    fit_power_law,
    fit_scaling_table,
    fits_frame,
)
from analysis.scaling.resampling import BOOT_DRAWS, saturating_bootstrap_t

__all__ = [
    "BOOT_DRAWS",
    "CONDITIONS",
    "HUBER_SDS",
    "LAW_FORMS",
    "POWER_LAW_COVERAGE",
    "DataMultiplier",
    "FloorNotIdentifiedWarning",
    "LawFit",
    "PowerLawFit",
    "TTest",
    "chance_error",
    "data_multiplier",
    "detectable",
    "default_form",
    "fit_law",
    "fit_power_law",
    "fit_scaling_table",
    "fits_frame",
    "jackknife_se",
    "law_extrapolation",
    "law_parameters",
    "paired_law_difference",
    "paired_t",
    "power_t",
    "robust_delta",
    "saturating_bootstrap_t",
    "t_quantile",
    "table_points",
    "table_scored",
    "tost",
]
