"""sharpscale's optimisation methods (SAM, ASAM, GSAM, LookSAM, SAF, MESA, ESAM, F-SAM, MSAM) behind one step interface; pure PyTorch."""

from ._esam import ESAM
from ._fsam import FriendlySAM
from ._gsam import GSAM
from ._looksam import LookSAM
from ._method import Method, StepOutput
from ._msam import MSAM
from ._registry import METHODS, MethodSpec, create, method_names
from ._sam import SAM
from ._trajectory import MESA, SAF, trajectory_kl

__all__ = [
    "ESAM",
    "GSAM",
    "MESA",
    "METHODS",
    "MSAM",
    "SAF",
    "SAM",
    "FriendlySAM",
    "LookSAM",
    "Method",
    "MethodSpec",
    "StepOutput",
    "create",
    "method_names",
    "trajectory_kl",
]
