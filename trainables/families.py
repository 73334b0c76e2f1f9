"""The model families sharpscale supports and the rule that names a timm model's family, torch-free: the config
rules read it (a study validates without torch), and trainables.models builds by it."""

from __future__ import annotations

import re
from typing import Literal

__all__ = ["Family", "model_family"]

Family = Literal["vit", "mixer", "resnet"]

_FAMILY_PATTERNS: tuple[tuple[Family, re.Pattern[str]], ...] = (
    ("vit", re.compile(r"^(vit|deit)_")),
    ("mixer", re.compile(r"^mixer_")),
    ("resnet", re.compile(r"^(resnet|resnext|wide_resnet|seresnet|resnetv2)")),
)


def model_family(name: str) -> Family:
    """The architecture family of a timm model name; a clear error for anything sharpscale does not support."""
    for family, pattern in _FAMILY_PATTERNS:
        if pattern.match(name):
            return family
    raise ValueError(
        f"model.name: must be a timm ViT (vit_*, deit_*), MLP-Mixer (mixer_*) or ResNet (resnet*, resnext*, "
        f"wide_resnet*) name, got {name!r}. Fix: pick one of timm.list_models('vit_*'), "
        f"timm.list_models('mixer_*') or timm.list_models('resnet*')."
    )
