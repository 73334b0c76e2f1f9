"""The keyword arguments trainables.families pins per model family are those of the installed timm's constructors."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from trainables.families import _FAMILY_PATTERNS, BUILDER_KWARGS, MODEL_KWARGS, kwargs_problem

timm = pytest.importorskip("timm")


def _keywords(fn) -> set[str]:
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return {p.name for p in inspect.signature(fn).parameters.values() if p.kind not in skip} - {"self"}


def _constructors() -> dict[str, set[str]]:
    """The keywords of each timm module's model class that a family's names build (deit's and the hybrids' classes
    pass their keywords on to VisionTransformer; ByobNet overlays its extra keywords onto its ByoModelCfg)."""
    from timm.models import byobnet, eva, mlp_mixer, resnet, resnetv2, vision_transformer, vision_transformer_relpos

    vit = _keywords(vision_transformer.VisionTransformer.__init__)
    byob = _keywords(byobnet.ByobNet.__init__) | {f.name for f in dataclasses.fields(byobnet.ByoModelCfg)}
    return {
        "vision_transformer": vit,
        "vision_transformer_hybrid": vit,
        "deit": vit,
        "eva": _keywords(eva.Eva.__init__),
        "vision_transformer_relpos": _keywords(vision_transformer_relpos.VisionTransformerRelPos.__init__),
        "mlp_mixer": _keywords(mlp_mixer.MlpMixer.__init__),
        "resnet": _keywords(resnet.ResNet.__init__),
        "resnetv2": _keywords(resnetv2.ResNetV2.__init__),
        "byobnet": byob - {"cfg"},
    }


def test_each_familys_keywords_are_its_timm_constructors():
    from timm.models import _registry
    from timm.models._builder import build_model_with_cfg

    constructors = _constructors()
    for family, pattern in _FAMILY_PATTERNS:
        modules = {_registry._model_to_module[n] for n in timm.list_models() if pattern.match(n)}
        assert modules <= constructors.keys(), f"{family}: timm builds its names in {modules - constructors.keys()} too"
        assert MODEL_KWARGS[family] == set().union(*(constructors[m] for m in modules)), family
    builders = (_keywords(timm.create_model) | _keywords(build_model_with_cfg)) - {"model_name", "model_cls", "variant"}
    assert builders == BUILDER_KWARGS


def test_a_misspelt_keyword_is_named_with_the_closest_ones():
    said = kwargs_problem("vit_tiny_patch16_224", {"depth": 1, "drop_path_rat": 0.1})
    assert said.startswith("model.kwargs.drop_path_rat: timm's vit_tiny_patch16_224 takes no argument 'drop_path_rat'.")
    assert "Did you mean drop_path_rate? (or " in said and "Got drop_path_rat: 0.1;" in said, said
    assert "Fix: correct or remove it." in said
    assert kwargs_problem("resnet18", {"layers": [1, 1, 1, 1], "channels": [8, 8, 16, 16]}) is None
    assert kwargs_problem("mixer_s16_224", {"patch_size": 4, "num_blocks": 1, "embed_dim": 16}) is None
