"""sharpscale's optimisation methods (SAM, ASAM, GSAM, LookSAM, SAF, MESA) behind one step interface; pure PyTorch."""

from ._gsam import GSAM
from ._looksam import LookSAM
from ._method import Method, StepOutput
from ._registry import METHODS, MethodSpec, create, method_names
from ._sam import SAM
from ._trajectory import MESA, SAF, trajectory_kl

__all__ = [
    "GSAM",
    "MESA",
    "METHODS",
    "SAF",
    "SAM",
    "LookSAM",
    "Method",
    "MethodSpec",
    "StepOutput",
    "create",
    "method_names",
    "trajectory_kl",
]
