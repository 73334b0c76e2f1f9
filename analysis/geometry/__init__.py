"""Loss-geometry metrics of a model: Hessian spectra and trace, perturbation flatness, landscapes, activations.

One module per concept: `spectrum` (the Hessian operator, extreme eigenvalues, trace, SLQ density), `perturbation`
(average flatness, surrogate gap, m-sharpness), `landscape` (1-D/2-D loss surfaces), `activations` (active
neurons, linearity), `probes` (the measures a trial takes during training), `names` (what a study file may
name, read without torch). Every public name is re-exported here, imported on first use:
`from analysis.geometry import top_eigenvalues`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Imported on first use (PEP 562): a study's validation reads `names` without importing torch through the rest.
_EXPORTS = {
    "ActiveNeuronResult": "activations",
    "BlockwiseEigenResult": "spectrum",
    "CURVATURES": "spectrum",
    "Curvature": "spectrum",
    "DensityResult": "spectrum",
    "EigenResult": "spectrum",
    "FlatnessResult": "perturbation",
    "GeometryProbe": "probes",
    "HVP_MODES": "names",
    "HessianOperator": "spectrum",
    "HvpMode": "names",
    "LandscapeResult": "landscape",
    "LinearityResult": "activations",
    "MEASURES": "probes",
    "MEASURE_NAMES": "names",
    "METHODS": "spectrum",
    "MODES": "_common",
    "MSharpnessResult": "perturbation",
    "Measure": "probes",
    "Method": "spectrum",
    "Mode": "_common",
    "ProbePlan": "names",
    "probe_plan": "names",
    "SurrogateGapResult": "perturbation",
    "TraceResult": "spectrum",
    "active_neuron_fraction": "activations",
    "average_flatness": "perturbation",
    "blockwise_top_eigenvalues": "spectrum",
    "default_parameter_groups": "spectrum",
    "eigenvalue_density": "spectrum",
    "filter_normalized_direction": "landscape",
    "geometry_problems": "names",
    "hessian_operator": "spectrum",
    "hessian_trace": "spectrum",
    "linearity_missing_rate": "activations",
    "loss_landscape_1d": "landscape",
    "loss_landscape_2d": "landscape",
    "m_sharpness": "perturbation",
    "make_probe": "probes",
    "no_fused_attention": "_common",
    "smallest_eigenvalue": "spectrum",
    "stability_threshold": "probes",
    "surrogate_gap": "perturbation",
    "top_eigenvalues": "spectrum",
}

__all__ = [
    "ActiveNeuronResult",
    "BlockwiseEigenResult",
    "CURVATURES",
    "Curvature",
    "DensityResult",
    "EigenResult",
    "FlatnessResult",
    "GeometryProbe",
    "HVP_MODES",
    "HessianOperator",
    "HvpMode",
    "LandscapeResult",
    "LinearityResult",
    "MEASURES",
    "MEASURE_NAMES",
    "METHODS",
    "MODES",
    "MSharpnessResult",
    "Measure",
    "Method",
    "Mode",
    "ProbePlan",
    "probe_plan",
    "SurrogateGapResult",
    "TraceResult",
    "active_neuron_fraction",
    "average_flatness",
    "blockwise_top_eigenvalues",
    "default_parameter_groups",
    "eigenvalue_density",
    "filter_normalized_direction",
    "geometry_problems",
    "hessian_operator",
    "hessian_trace",
    "linearity_missing_rate",
    "loss_landscape_1d",
    "loss_landscape_2d",
    "m_sharpness",
    "make_probe",
    "no_fused_attention",
    "smallest_eigenvalue",
    "stability_threshold",
    "surrogate_gap",
    "top_eigenvalues",
]

if TYPE_CHECKING:
    from analysis.geometry._common import (
        MODES,
        Mode,
        no_fused_attention,
    )
    from analysis.geometry.activations import (
        ActiveNeuronResult,
        LinearityResult,
        active_neuron_fraction,
        linearity_missing_rate,
    )
    from analysis.geometry.landscape import (
        LandscapeResult,
        filter_normalized_direction,
        loss_landscape_1d,
        loss_landscape_2d,
    )
    from analysis.geometry.names import (
        HVP_MODES,
        MEASURE_NAMES,
        HvpMode,
        ProbePlan,
        geometry_problems,
        probe_plan,
    )
    from analysis.geometry.perturbation import (
        FlatnessResult,
        MSharpnessResult,
        SurrogateGapResult,
        average_flatness,
        m_sharpness,
        surrogate_gap,
    )
    from analysis.geometry.probes import (
        MEASURES,
        GeometryProbe,
        Measure,
        make_probe,
        stability_threshold,
    )
    from analysis.geometry.spectrum import (
        CURVATURES,
        METHODS,
        BlockwiseEigenResult,
        Curvature,
        DensityResult,
        EigenResult,
        HessianOperator,
        Method,
        TraceResult,
        blockwise_top_eigenvalues,
        default_parameter_groups,
        eigenvalue_density,
        hessian_operator,
        hessian_trace,
        smallest_eigenvalue,
        top_eigenvalues,
    )


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
