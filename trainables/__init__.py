"""Trainables: models, data and fractions, the one training loop, its Ray wrapper and its MLflow record."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each public name and the submodule that defines it. Submodules load on first use (PEP 562), so that
# `import trainables.tracking` or `trainables.config` does not pay for torch and timm (seconds, ~400 MB per process).
_HOMES = {
    "ConfigError": "config",
    "DataConfig": "config",
    "GeometryConfig": "config",
    "ModelConfig": "config",
    "OptimizerConfig": "config",
    "ScheduleConfig": "config",
    "TrainConfig": "config",
    "TrialConfig": "config",
    "DataBundle": "data",
    "fixed_batches": "data",
    "fraction_indices": "data",
    "load_dataset": "data",
    "TrialDiverged": "loop",
    "evaluate": "loop",
    "fit": "loop",
    "load_checkpoint": "loop",
    "load_model": "loop",
    "create_model": "models",
    "model_family": "models",
    "parameter_groups": "models",
    "set_fused_attention": "models",
}

__all__ = [
    "ConfigError",
    "DataBundle",
    "DataConfig",
    "GeometryConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ScheduleConfig",
    "TrainConfig",
    "TrialConfig",
    "TrialDiverged",
    "create_model",
    "evaluate",
    "fit",
    "fixed_batches",
    "fraction_indices",
    "load_checkpoint",
    "load_dataset",
    "load_model",
    "model_family",
    "parameter_groups",
    "set_fused_attention",
]

if TYPE_CHECKING:  # for type checkers and IDEs only; at run time __getattr__ imports on demand
    from trainables.config import (
        ConfigError,
        DataConfig,
        GeometryConfig,
        ModelConfig,
        OptimizerConfig,
        ScheduleConfig,
        TrainConfig,
        TrialConfig,
    )
    from trainables.data import DataBundle, fixed_batches, fraction_indices, load_dataset
    from trainables.loop import TrialDiverged, evaluate, fit, load_checkpoint, load_model
    from trainables.models import create_model, model_family, parameter_groups, set_fused_attention


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
