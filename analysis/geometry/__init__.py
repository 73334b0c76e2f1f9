"""Loss-geometry metrics of a model: Hessian spectra and trace, perturbation flatness, landscapes, activations.

One module per concept: `spectrum` (the Hessian operator, extreme eigenvalues, trace, SLQ density), `perturbation`
(average flatness, surrogate gap, m-sharpness), `landscape` (1-D/2-D loss surfaces), `activations` (active
neurons, linearity), `probes` (the measures a trial takes during training). Every public name is re-exported
here: `from analysis.geometry import top_eigenvalues`.
"""

from analysis.geometry._common import MODES, Mode, no_fused_attention
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
    PROBE_FACTORY,
    GeometryProbe,
    Measure,
    geometry_problems,
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
    HvpMode,
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

__all__ = [
    "CURVATURES",
    "MEASURES",
    "METHODS",
    "MODES",
    "PROBE_FACTORY",
    "ActiveNeuronResult",
    "BlockwiseEigenResult",
    "Curvature",
    "DensityResult",
    "EigenResult",
    "FlatnessResult",
    "GeometryProbe",
    "HessianOperator",
    "HvpMode",
    "LandscapeResult",
    "LinearityResult",
    "MSharpnessResult",
    "Measure",
    "Method",
    "Mode",
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
