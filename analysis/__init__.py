"""Results of studies as data: MLflow records to pandas, tables, plots and loss-geometry metrics (never needs Ray)."""

from __future__ import annotations

from optim.lazy import exports

# Each public name once, with the submodule that defines it. Submodules load on first use (PEP 562), so that
# `from analysis import load_runs` (`sharpscale status`) does not pay for torch (geometry) or matplotlib (plots).
# Type checkers read __init__.pyi, generated from this by optim.lazy.write_stubs().
__all__, __getattr__, __dir__ = exports(
    __name__,
    {
        "compute": ("COST_UNITS", "compute_matched", "compute_matched_gains", "trial_compute"),
        "design": ("detectable_effects",),
        "images": ("crossed_t", "linear_image_variance"),
        "plots": (
            "plot_compute_frontier",
            "plot_curves",
            "plot_sharpness",
            "plot_error_vs_n",
            "plot_gain",
            "plot_rho_sensitivity",
        ),
        "record": (
            "checkpointed_trials",
            "download_checkpoint",
            "log_geometry",
            "measure_checkpoint",
            "measure_study",
            "trial_batches",
        ),
        "report": ("report_html", "write_report"),
        "runs": (
            "confirm_summary",
            "load_curves",
            "load_runs",
            "measured_on",
            "split_stages",
            "summarize",
            "unconfirmed_cells",
            "accuracy_interval",
            "find_store",
            "status_table",
            "best_trials",
            "use_table_format",
        ),
        "scaling": (
            "DataMultiplier",
            "FloorNotIdentifiedWarning",
            "LawFit",
            "PowerLawFit",
            "chance_error",
            "data_multiplier",
            "fit_law",
            "fit_power_law",
            "fit_scaling_table",
            "fits_frame",
            "law_extrapolation",
            "law_parameters",
            "paired_law_difference",
            "default_form",
            "paired_t",
            "power_t",
            "tost",
            "table_scored",
        ),
        "tables": (
            "FewSamplesWarning",
            "RhoSensitivity",
            "ScalingTable",
            "best_of_search",
            "geometry_correlation",
            "method_pairs",
            "rho_sensitivity",
            "sam_gain",
            "scaling_table",
            "format_cell",
            "holm",
            "rho_transfer",
            "sample_note",
            "headline",
            "gain_family",
        ),
        "sweep": ("best_level_set", "knob_importance", "plot_parallel_coordinates", "transfer_slope"),
    },
    modules=("geometry",),
)
