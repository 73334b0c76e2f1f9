"""Trainables: models, data and fractions, the one training loop, its Ray wrapper and its MLflow record."""

from trainables.config import (
    ConfigError,
    DataConfig,
    ModelConfig,
    OptimizerConfig,
    ScheduleConfig,
    TrainConfig,
    TrialConfig,
)
from trainables.data import DataBundle, fraction_indices, load_dataset
from trainables.loop import TrialDiverged, evaluate, fit, load_checkpoint, load_model
from trainables.models import create_model, model_family, parameter_groups, set_fused_attention

__all__ = [
    "ConfigError",
    "DataBundle",
    "DataConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ScheduleConfig",
    "TrainConfig",
    "TrialConfig",
    "TrialDiverged",
    "create_model",
    "evaluate",
    "fit",
    "fraction_indices",
    "load_checkpoint",
    "load_dataset",
    "load_model",
    "model_family",
    "parameter_groups",
    "set_fused_attention",
]
