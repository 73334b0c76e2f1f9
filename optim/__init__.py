"""sharpscale's optimisation methods (SAM, ASAM, GSAM, LookSAM, SAF, MESA, ESAM, F-SAM, MSAM) behind one step interface; pure PyTorch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ._registry import METHODS, MethodSpec, check_hparams, check_step_kinds, create, method_names
from ._schedule import Schedule, check_schedule
from ._scope import check_scope

if TYPE_CHECKING:
    from ._esam import ESAM
    from ._fsam import FriendlySAM
    from ._gsam import GSAM
    from ._looksam import LookSAM
    from ._method import Method, StepKeywords, StepOutput
    from ._msam import MSAM
    from ._sam import SAM
    from ._scheduled import Scheduled
    from ._trajectory import MESA, SAF, trajectory_kl

# The registry (names, knobs and their rules) imports no torch, so a study file validates without it; the classes
# load torch when first named.
_LAZY = {
    "ESAM": "_esam",
    "FriendlySAM": "_fsam",
    "GSAM": "_gsam",
    "LookSAM": "_looksam",
    "Method": "_method",
    "StepKeywords": "_method",
    "StepOutput": "_method",
    "MSAM": "_msam",
    "SAM": "_sam",
    "Scheduled": "_scheduled",
    "MESA": "_trajectory",
    "SAF": "_trajectory",
    "trajectory_kl": "_trajectory",
}

__all__ = [
    "ESAM",
    "GSAM",
    "MESA",
    "METHODS",
    "MSAM",
    "SAF",
    "SAM",
    "Schedule",
    "Scheduled",
    "FriendlySAM",
    "LookSAM",
    "Method",
    "MethodSpec",
    "StepKeywords",
    "StepOutput",
    "check_hparams",
    "check_schedule",
    "check_scope",
    "check_step_kinds",
    "create",
    "method_names",
    "trajectory_kl",
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
