"""The geometry names a study file may use, checked without torch: the measures a trial can take, the product modes."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from trainables.config import GeometryConfig

#: How a Hessian-vector product is computed; "auto" picks an exact mode by model class (see spectrum._AUTO_HVP_MODE).
#: The finite-difference modes approximate it from gradients (1 or 2 per product; see _hvp.HessianCore).
HvpMode = Literal["auto", "double_backward", "forward_over_reverse", "finite_difference", "finite_difference_central"]
HVP_MODES: tuple[str, ...] = get_args(HvpMode)
#: The measures a `geometry:` section may name, in the order a trial takes them; each is an entry of
#: `analysis.geometry.probes.MEASURES` (tests/analysis/test_geometry_probes.py holds the two equal).
MEASURE_NAMES: tuple[str, ...] = (
    "lambda_max",
    "hessian_trace",
    "blockwise_lambda_max",
    "average_flatness",
    "surrogate_gap",
)
#: What every geometry metric's name starts with, in a trial's record and in `log_geometry`'s (analysis.record).
METRIC_PREFIX = "geometry/"
#: The import path of the probe factory, as the runner hands it to each trial (trainables.ray_train imports it).
PROBE_FACTORY = "analysis.geometry.probes:make_probe"


def geometry_problems(geometry: "GeometryConfig") -> list[str]:
    """What is wrong with a geometry section beyond its types (names the registry does not know), one line each."""
    problems = []
    for name in geometry.measures:
        if name not in MEASURE_NAMES:
            close = difflib.get_close_matches(name, list(MEASURE_NAMES), n=1)
            hint = f"Did you mean {close[0]!r}? " if close else ""
            problems.append(
                f"geometry.measures: must name measures of analysis.geometry.probes.MEASURES "
                f"({', '.join(MEASURE_NAMES)}), got {name!r}. Fix: {hint}pick among those."
            )
    if geometry.hvp_mode not in HVP_MODES:
        close = difflib.get_close_matches(geometry.hvp_mode, HVP_MODES, n=1)
        problems.append(
            f"geometry.hvp_mode: must be one of {', '.join(HVP_MODES)}, got {geometry.hvp_mode!r}. Fix: "
            + (f"did you mean {close[0]!r}?" if close else "leave it at 'auto'.")
        )
    return problems
