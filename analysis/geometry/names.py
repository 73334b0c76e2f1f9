"""The geometry names a study file may use, checked without torch: the measures a trial can take, the product modes;
and the probe plan the layer above hands each trial."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    from analysis.geometry.probes import GeometryProbe
    from trainables.config import GeometryConfig, TrialConfig

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


@dataclass(frozen=True)
class ProbePlan:
    """A trial's in-trial geometry probe as the layer above (the study runner) builds it and hands it to the trial
    in its payload: the geometry section it measures with, checked when the plan is made (without torch). The
    trial checks those settings against its own config (trainables.ray_train.load_probe) and builds the probe,
    with torch, where it runs: trainables never imports analysis."""

    geometry: GeometryConfig

    def __post_init__(self) -> None:
        problems = geometry_problems(self.geometry)
        if problems:
            from trainables.config import ConfigError

            raise ConfigError(problems)

    def build(self) -> GeometryProbe:
        from analysis.geometry.probes import GeometryProbe

        return GeometryProbe(self.geometry)


def probe_plan(config: TrialConfig | dict[str, Any]) -> ProbePlan | None:
    """The probe plan of a trial config's geometry section; None where it names no measures (nothing to hand on)."""
    from trainables.config import TrialConfig

    geometry = TrialConfig.load(config).geometry
    return ProbePlan(geometry) if geometry.enabled else None
