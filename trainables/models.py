"""Model construction: any timm ViT, MLP-Mixer or ResNet by name, untrained, sized for the data at hand."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainables.config import CHECKPOINT_KWARG, ModelConfig, checkpoint_problem
from trainables.families import Family, model_family

if TYPE_CHECKING:
    import torch
    from torch import nn

# torch is imported where it is used. The families and their rule (model_family) live in trainables.families, which
# the config rules read without this module.

__all__ = ["Family", "create_model", "fused_attention", "model_family", "parameter_groups", "set_fused_attention"]

# timm's Mixer entry points hard-code these three and reject overrides ("multiple values for keyword"),
# so an override rebuilds the variant through timm's own builder with the merged arguments.
_MIXER_SIZES = {"s": (8, 512), "b": (12, 768), "l": (24, 1024)}
_MIXER_NAME = re.compile(r"^mixer_([sbl])(16|32)_224$")


def _cifar_stem(model: nn.Module) -> None:
    # Small images lose all resolution to the 7x7/2 conv and the max-pool; the CIFAR ResNet stem keeps it.
    from torch import nn

    conv = model.conv1
    model.conv1 = nn.Conv2d(conv.in_channels, conv.out_channels, 3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()


def create_model(
    cfg: ModelConfig, *, num_classes: int, in_chans: int, img_size: int, load_init: bool = True
) -> nn.Module:
    """Build the configured model for `num_classes` classes on `in_chans` x `img_size`^2 inputs: untrained, or with
    its starting weights `model.kwargs.checkpoint_path` read in when load_init (False where a trained checkpoint's
    weights replace them anyway: a trained model loaded back, a trial resumed; the file may be gone by then)."""
    family = model_family(cfg.name)
    kwargs: dict[str, Any] = dict(num_classes=num_classes, in_chans=in_chans, drop_rate=cfg.drop_rate)
    if cfg.drop_path_rate:
        kwargs["drop_path_rate"] = cfg.drop_path_rate
    if family in ("vit", "mixer"):
        kwargs["img_size"] = img_size
    kwargs.update(cfg.kwargs)
    checkpoint = kwargs.pop(CHECKPOINT_KWARG, None)  # read here, as weights only: timm's own load would unpickle

    import timm  # here, not at the top: validating a study reads model_family and must not pay for timm

    mixer = _MIXER_NAME.match(cfg.name)
    if family == "mixer" and mixer and {"patch_size", "num_blocks", "embed_dim"} & set(cfg.kwargs):
        from timm.models import build_model_with_cfg
        from timm.models.mlp_mixer import MlpMixer

        num_blocks, embed_dim = _MIXER_SIZES[mixer.group(1)]
        merged = dict(patch_size=int(mixer.group(2)), num_blocks=num_blocks, embed_dim=embed_dim) | kwargs
        model = build_model_with_cfg(MlpMixer, cfg.name, pretrained=False, **merged)
    else:
        model = timm.create_model(cfg.name, pretrained=False, **kwargs)

    if family == "resnet" and cfg.cifar_stem:
        _cifar_stem(model)
    set_fused_attention(model, cfg.fused_attn)
    if (
        load_init and checkpoint is not None and not any(p.is_meta for p in model.parameters())
    ):  # meta: built to check kwargs
        load_weights(model, checkpoint, cfg.checkpoint_roots)
    return model


def load_weights(model: nn.Module, path: str, roots: tuple[str, ...]) -> None:
    """Load `model.kwargs.checkpoint_path` into `model`: only a file inside `roots` as this node resolves it, and
    only tensors (torch.load weights_only=True: a pickle holding code is refused, never run). Each refusal is a
    TrialRefused (the same file fails every attempt: failed once, not retried)."""
    import torch

    from trainables.errors import TrialRefused

    field = f"model.kwargs.{CHECKPOINT_KWARG}"
    problem = checkpoint_problem(path, roots)  # again here: a link may have changed since the study was validated
    if problem:
        raise TrialRefused(problem)
    try:
        state = torch.load(Path(path).resolve(), map_location="cpu", weights_only=True)
    except OSError as err:
        raise TrialRefused(
            f"{field}: cannot read {path!r} on this node ({err.strerror}). Fix: give a file every node reads."
        ) from None
    except Exception as err:  # noqa: BLE001 - torch raises UnpicklingError, RuntimeError, ... for what it refuses
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise TrialRefused(
            f"{field}: {path!r} is not a plain weights file (torch.load weights_only=True refused it: {first}). Fix: "
            f"save the model's state_dict alone (torch.save(model.state_dict(), path))."
        ) from None
    if isinstance(state, dict):
        for key in ("state_dict", "model", "state_dict_ema"):  # timm's and common training scripts' wrappers
            if isinstance(state.get(key), dict):
                state = state[key]
                break
    if not isinstance(state, dict):
        raise TrialRefused(
            f"{field}: {path!r} holds a {type(state).__name__}, not a state_dict. Fix: save model.state_dict()."
        )
    state = {k.removeprefix("module."): v for k, v in state.items()}  # saved from a DDP-wrapped model
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        first = (str(err).strip().splitlines() or ["mismatch"])[0][:300]
        raise TrialRefused(
            f"{field}: {path!r} does not fit {type(model).__name__} as configured ({first}). Fix: give the weights of "
            f"this architecture (model.name and model.kwargs as when they were saved)."
        ) from None


def set_fused_attention(model: nn.Module, enabled: bool) -> None:
    """Switch timm's fused (flash / SDPA) attention on or off; it has no double backward, which Hessians need."""
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = enabled


@contextlib.contextmanager
def fused_attention(model: nn.Module, enabled: bool) -> Iterator[nn.Module]:
    """set_fused_attention inside a `with` block; each module's own flag comes back on exit, even after an error."""
    saved = [(m, m.fused_attn) for m in model.modules() if hasattr(m, "fused_attn")]
    set_fused_attention(model, enabled)
    try:
        yield model
    finally:
        for module, flag in saved:
            module.fused_attn = flag


def weight_norm(model: nn.Module) -> torch.Tensor:
    """Global L2 norm of all parameters, as a 0-d tensor (no host sync)."""
    import torch

    return torch.nn.utils.get_total_norm([p.detach() for p in model.parameters()]).float()


def parameter_groups(model: nn.Module) -> dict[str, list[str]]:
    """Named parameter groups of a timm ViT, MLP-Mixer or ResNet, by parameter name (for per-block analysis).

    ViT: "patch_embed", "attn" and "mlp" (over all blocks), "norms", "head", then "blocks.N", "blocks.N.attn",
    "blocks.N.mlp". Mixer: "stem", "mlp_tokens", "mlp_channels", "norms", "head", "blocks.N",
    "blocks.N.mlp_tokens", "blocks.N.mlp_channels" (Table 4 of Chen et al. 2022). ResNet: "stem" (conv1, bn1),
    "layer1" .. "layer4", "fc". Empty groups are left out.
    """
    names = [n for n, p in model.named_parameters() if p.requires_grad]

    def under(prefix: str) -> list[str]:
        return [n for n in names if n.startswith(prefix + ".")]

    def component(part: str) -> list[str]:
        return [n for n in names if n.startswith("blocks.") and n.split(".")[2:3] == [part]]

    blocks = sorted({int(n.split(".")[1]) for n in names if n.startswith("blocks.") and n.split(".")[1].isdigit()})
    if under("patch_embed") and component("attn"):
        parts, groups = ("attn", "mlp"), {"patch_embed": under("patch_embed")}
    elif under("stem") and component("mlp_tokens"):
        parts, groups = ("mlp_tokens", "mlp_channels"), {"stem": under("stem")}
    elif under("conv1") and under("layer1"):
        groups = {"stem": under("conv1") + under("bn1")}
        groups.update({f"layer{i}": under(f"layer{i}") for i in range(1, 5)})
        groups["fc"] = under("fc")
        return {name: group for name, group in groups.items() if group}
    else:
        raise ValueError(
            f"cannot derive parameter groups for a {type(model).__name__}: expected timm parameter names of a ViT "
            "(patch_embed.*, blocks.N.attn.*), an MLP-Mixer (stem.*, blocks.N.mlp_tokens.*) or a ResNet "
            "(conv1.*, layer1.*); pass the groups explicitly"
        )
    for part in parts:
        groups[part] = component(part)
    groups["norms"] = [n for n in names if ".norm" in n or n.startswith("norm") or n.startswith("fc_norm")]
    groups["head"] = under("head")
    for i in blocks:
        groups[f"blocks.{i}"] = under(f"blocks.{i}")
        for part in parts:
            groups[f"blocks.{i}.{part}"] = under(f"blocks.{i}.{part}")
    return {name: group for name, group in groups.items() if group}
