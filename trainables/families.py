"""The model families sharpscale supports, the rule that names a timm model's family, and the keyword arguments each
family's timm constructors take, torch-free: the config rules read them (a study validates without torch), and
trainables.models builds by them."""

from __future__ import annotations

import difflib
import re
from typing import Literal

__all__ = ["BUILDER_KWARGS", "MODEL_KWARGS", "Family", "kwargs_problem", "model_family"]

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


# The keywords of timm's constructors for each family's names (timm 1.0.31): a family's union over the classes its
# names build (vit: VisionTransformer, Eva, VisionTransformerRelPos; mixer: MlpMixer; resnet: ResNet, ResNetV2,
# ByobNet and the ByoModelCfg fields it overlays). A union, so that a misspelt key is refused at validate while a key
# of another class of the family is left to the build (studies.preflight). Derived from timm, never edited by hand:
# tests/trainables/test_families.py compares them with the installed timm's signatures.
MODEL_KWARGS: dict[Family, frozenset[str]] = {
    "vit": frozenset(
        {
            "act_layer",
            "attn_drop_rate",
            "attn_layer",
            "attn_only_layer_scale",
            "attn_pool_mlp_ratio",
            "attn_pool_num_heads",
            "attn_type",
            "block_fn",
            "class_token",
            "depth",
            "device",
            "drop_path_rate",
            "drop_rate",
            "dtype",
            "dynamic_img_pad",
            "dynamic_img_size",
            "embed_dim",
            "embed_layer",
            "embed_norm_layer",
            "fc_norm",
            "final_norm",
            "fix_init",
            "global_pool",
            "head_init_scale",
            "img_size",
            "in_chans",
            "init_values",
            "mlp_layer",
            "mlp_ratio",
            "no_embed_class",
            "norm_layer",
            "num_classes",
            "num_heads",
            "num_kv_heads",
            "num_reg_tokens",
            "patch_drop_rate",
            "patch_size",
            "pool_include_prefix",
            "pos_drop_rate",
            "pos_embed",
            "pre_norm",
            "proj_bias",
            "proj_drop_rate",
            "qk_norm",
            "qkv_bias",
            "qkv_fused",
            "ref_feat_shape",
            "reg_tokens",
            "rel_pos_dim",
            "rel_pos_type",
            "rope_grid_indexing",
            "rope_grid_offset",
            "rope_jitter_coords",
            "rope_mrope_section",
            "rope_rescale_coords",
            "rope_rotate_half",
            "rope_shift_coords",
            "rope_temperature",
            "rope_type",
            "scale_attn_inner",
            "scale_attn_norm",
            "scale_mlp",
            "scale_mlp_norm",
            "shared_rel_pos",
            "swiglu_align_to",
            "swiglu_mlp",
            "use_abs_pos_emb",
            "use_fc_norm",
            "use_post_norm",
            "use_post_transformer_norm",
            "use_pre_transformer_norm",
            "use_rot_pos_emb",
            "weight_init",
        }
    ),
    "mixer": frozenset(
        {
            "act_layer",
            "block_layer",
            "device",
            "drop_path_rate",
            "drop_rate",
            "dtype",
            "embed_dim",
            "global_pool",
            "img_size",
            "in_chans",
            "mlp_layer",
            "mlp_ratio",
            "nlhb",
            "norm_layer",
            "num_blocks",
            "num_classes",
            "patch_size",
            "proj_drop_rate",
            "stem_norm",
        }
    ),
    "resnet": frozenset(
        {
            "aa_layer",
            "act_layer",
            "attn_kwargs",
            "attn_layer",
            "avg_down",
            "base_width",
            "basic",
            "block",
            "block_args",
            "block_kwargs",
            "block_reduce_first",
            "blocks",
            "bottle_ratio",
            "cardinality",
            "channels",
            "conv_layer",
            "device",
            "down_kernel_size",
            "downsample",
            "drop_block_rate",
            "drop_block_size",
            "drop_path_rate",
            "drop_rate",
            "dtype",
            "fixed_input_size",
            "global_pool",
            "head_hidden_size",
            "head_type",
            "img_size",
            "in_chans",
            "layers",
            "norm_layer",
            "num_classes",
            "num_features",
            "output_stride",
            "preact",
            "replace_stem_pool",
            "self_attn_kwargs",
            "self_attn_layer",
            "stem_chs",
            "stem_pool",
            "stem_type",
            "stem_width",
            "width_factor",
            "zero_init_last",
        }
    ),
}
# What timm.create_model and build_model_with_cfg take themselves, whatever the family (the ones that load weights
# are refused by their own rule, trainables.config.FILE_LOADING_KWARGS).
BUILDER_KWARGS = frozenset(
    {
        "cache_dir",
        "checkpoint_path",
        "exportable",
        "feature_cfg",
        "kwargs_filter",
        "model_cfg",
        "no_jit",
        "pretrained",
        "pretrained_cfg",
        "pretrained_cfg_overlay",
        "pretrained_filter_fn",
        "pretrained_model_args",
        "pretrained_strict",
        "scriptable",
    }
)


def kwargs_problem(name: str, kwargs) -> str | None:
    """Why `model.kwargs` cannot go to timm model `name` (None: every key is one its family's constructors take): the
    first key none of them takes, its value, and the closest keys they do take."""
    family = model_family(name)
    known = MODEL_KWARGS[family] | BUILDER_KWARGS
    unknown = [k for k in kwargs if k not in known]
    if not unknown:
        return None
    key = unknown[0]
    close = difflib.get_close_matches(str(key), sorted(known), n=3, cutoff=0.6)
    # Worded as studies.preflight words what the build finds, so one mistake reads alike wherever it is caught.
    hint = f" Did you mean {close[0]}?" if close else ""
    if len(close) > 1:
        hint += f" (or {', '.join(close[1:])})"
    return (
        f"model.kwargs.{key}: timm's {name} takes no argument {key!r}.{hint} Got {key}: {kwargs[key]!r}; no {family} "
        f"constructor of timm takes it. Fix: correct or remove it."
    )
