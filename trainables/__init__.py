"""Trainables: models, data and fractions, the one training loop, its Ray wrapper and its MLflow record."""

from __future__ import annotations

from optim.lazy import exports

# Each public name once, with the submodule that defines it. Submodules load on first use (PEP 562), so that
# `import trainables.tracking` or `trainables.config` does not pay for torch and timm (seconds, ~400 MB per process).
# Type checkers read __init__.pyi, generated from this by optim.lazy.write_stubs().
__all__, __getattr__, __dir__ = exports(
    __name__,
    {
        "config": (
            "ConfigError",
            "DataConfig",
            "GeometryConfig",
            "ModelConfig",
            "OptimizerConfig",
            "ScheduleConfig",
            "TrainConfig",
            "TrialConfig",
        ),
        "data.bundle": ("DataBundle",),
        "data.load": ("fixed_batches", "load_dataset"),
        "data.seeds": ("fraction_indices",),
        "loop": ("TrialDiverged", "evaluate", "fit", "load_checkpoint", "load_model"),
        "models": ("create_model", "model_family", "parameter_groups", "set_fused_attention"),
    },
)
