"""Activation measures: the share of active MLP neurons per block, and the linearity missing rate of midpoints."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from analysis.geometry._common import (
    MODES,
    Mode,
    _check_choice,
    _check_int,
    _metrics,
    _Scope,
)
from analysis.geometry._hvp import fixed_rng


@dataclass(frozen=True)
class ActiveNeuronResult:
    """Share of MLP hidden activations > 0, per block, over `num_samples` inputs."""

    blocks: tuple[str, ...]
    fractions: tuple[float, ...]
    active: tuple[int, ...]
    total: tuple[int, ...]
    num_samples: int
    mode: str

    def as_dict(self) -> dict[str, float]:
        return dict(zip(self.blocks, self.fractions))

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        return _metrics(prefix, {f"active_fraction/{b}": f for b, f in zip(self.blocks, self.fractions)})

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "blocks": np.asarray(self.blocks),
            "fractions": np.asarray(self.fractions, dtype=np.float64),
            "active": np.asarray(self.active, dtype=np.int64),
            "total": np.asarray(self.total, dtype=np.int64),
        }


@dataclass(frozen=True)
class LinearityResult:
    """Share of different-label pairs whose midpoint is predicted as neither label (Zhang et al. 2018)."""

    missing_rate: float
    std_error: float
    misses: int
    pairs: int
    exhaustive: bool
    seed: int
    mode: str
    num_inputs: int

    def to_metrics(self, prefix: str = "") -> dict[str, float]:
        return _metrics(prefix, {"missing_rate": self.missing_rate, "missing_rate_std_error": self.std_error})


def _activation_groups(model: nn.Module) -> dict[str, list[nn.Module]]:
    """Hidden activation modules per block: the `act` of every mlp / mlp_tokens / mlp_channels (ViT, Mixer),
    or every act* inside a residual block layerL.B (ResNet)."""
    groups: dict[str, list[nn.Module]] = {}
    for name, module in model.named_modules():
        parent, _, leaf = name.rpartition(".")
        owner = parent.rpartition(".")[2]
        if leaf == "act" and owner in ("mlp", "mlp_tokens", "mlp_channels"):
            groups.setdefault(parent, []).append(module)
        elif leaf.startswith("act") and leaf[3:].isdigit():
            stage, _, index = parent.partition(".")
            if stage.startswith("layer") and stage[5:].isdigit() and index.isdigit():
                groups.setdefault(parent, []).append(module)
    return groups


def _input_chunks(inputs: Any, batch_size_: int) -> list[torch.Tensor]:
    if isinstance(inputs, torch.Tensor):
        if inputs.dim() == 0:
            raise ValueError("inputs must be a batch of samples (dim 0 = samples), got a 0-d tensor")
        return list(torch.split(inputs, batch_size_))
    chunks = list(inputs)
    if not chunks or not all(isinstance(c, torch.Tensor) for c in chunks):
        raise ValueError("inputs must be a tensor of samples or a non-empty list of input tensors")
    return chunks


def active_neuron_fraction(
    model: nn.Module,
    inputs: Any,
    *,
    mode: Mode = "eval",
    batch_size: int = 256,
    activations: Mapping[str, Sequence[nn.Module]] | None = None,
    seed: int = 0,
) -> ActiveNeuronResult:
    """Per block, the share of hidden activations > 0 over the given inputs (Chen et al. 2022, Figure 2).

    Counted at the output of the activation module inside each block's mlp / mlp_channels /
    mlp_tokens (for GELU, > 0 exactly where its input is > 0); for a timm ResNet, over every act* of each
    residual block. `activations` maps block names to modules to count instead. inputs: a tensor of
    samples (fed in chunks of batch_size) or a list of input batches. In train mode, dropout draws from
    `seed` (the caller's RNG state is left alone).
    """
    mode = _check_choice("mode", mode, MODES)
    _check_int("batch_size", batch_size, 1, "feed at least one sample at a time")
    _check_int("seed", seed, 0, "use a non-negative seed")
    groups = dict(activations) if activations is not None else _activation_groups(model)
    if not groups:
        raise ValueError(
            f"found no MLP activation module in a {type(model).__name__} (looked for *.mlp.act, *.mlp_tokens.act, "
            "*.mlp_channels.act, layerL.B.act*); pass activations={block name: [modules]}"
        )
    counts = {name: [0, 0] for name in groups}
    handles = []

    def counter(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: torch.Tensor) -> None:
            counts[name][0] += int((output > 0).sum())
            counts[name][1] += output.numel()

        return hook

    samples = 0
    try:
        for name, modules in groups.items():
            for module in modules:
                handles.append(module.register_forward_hook(counter(name)))
        with _Scope(model, mode, keep_params=False), torch.no_grad():
            for index, chunk in enumerate(_input_chunks(inputs, batch_size)):
                with fixed_rng(mode == "train", seed + index, chunk.device):
                    model(chunk)
                samples += chunk.shape[0]
    finally:
        for handle in handles:
            handle.remove()
    names = tuple(groups)
    return ActiveNeuronResult(
        blocks=names,
        fractions=tuple(counts[n][0] / counts[n][1] if counts[n][1] else math.nan for n in names),
        active=tuple(counts[n][0] for n in names),
        total=tuple(counts[n][1] for n in names),
        num_samples=samples,
        mode=mode,
    )


def _sample_pairs(labels: torch.Tensor, pairs: int | None, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = labels.shape[0]
    if pairs is None:
        i, j = torch.triu_indices(n, n, offset=1)
        keep = labels[i] != labels[j]
        return i[keep], j[keep]
    generator = torch.Generator().manual_seed(seed)
    found_i, found_j, total = [], [], 0
    for _ in range(100):
        i = torch.randint(0, n, (4 * pairs,), generator=generator)
        j = torch.randint(0, n, (4 * pairs,), generator=generator)
        keep = labels[i] != labels[j]
        found_i.append(i[keep])
        found_j.append(j[keep])
        total += int(keep.sum())
        if total >= pairs:
            break
    if total < pairs:
        raise ValueError(
            f"pairs={pairs}: found only {total} pairs with different labels in {n} inputs after many draws; "
            "pass more varied labels or fewer pairs"
        )
    return torch.cat(found_i)[:pairs], torch.cat(found_j)[:pairs]


def linearity_missing_rate(
    model: nn.Module,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    *,
    pairs: int | None = 1000,
    seed: int = 0,
    mode: Mode = "eval",
    batch_size: int = 256,
) -> LinearityResult:
    """Share of pairs (x_i, x_j) with y_i != y_j whose midpoint (x_i + x_j)/2 is predicted (argmax of
    the model's output) as neither y_i nor y_j (Chen et al. 2022, Table 6; Zhang et al. 2018).

    pairs: how many different-label pairs to draw at random (with replacement), or None for every
    such pair i < j (exact; O(N^2) memory, for small samples). `seed` draws the pairs (and, in train
    mode, the dropout masks; the caller's RNG state is left alone).
    """
    mode = _check_choice("mode", mode, MODES)
    _check_int("seed", seed, 0, "use a non-negative seed")
    _check_int("batch_size", batch_size, 1, "feed at least one midpoint at a time")
    if pairs is not None:
        _check_int("pairs", pairs, 1, "draw at least one pair, or pass None for all pairs")
    if not isinstance(inputs, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise ValueError("inputs and labels must be tensors (samples along dim 0)")
    if labels.dim() != 1 or inputs.dim() == 0 or inputs.shape[0] != labels.shape[0]:
        raise ValueError(
            f"labels must be 1-D with one label per input, got inputs {tuple(inputs.shape)} and labels "
            f"{tuple(labels.shape)}"
        )
    cpu_labels = labels.detach().cpu()
    if cpu_labels.unique().numel() < 2:
        raise ValueError("labels must hold at least two different classes to form pairs with different labels")
    first, second = _sample_pairs(cpu_labels, pairs, seed)
    misses = 0
    with _Scope(model, mode, keep_params=False), torch.no_grad():
        for start in range(0, first.numel(), batch_size):
            i = first[start : start + batch_size]
            j = second[start : start + batch_size]
            mid = (inputs[i.to(inputs.device)] + inputs[j.to(inputs.device)]) / 2
            with fixed_rng(mode == "train", seed + start, mid.device):
                predicted = model(mid).argmax(dim=-1).cpu()
            misses += int(((predicted != cpu_labels[i]) & (predicted != cpu_labels[j])).sum())
    count = first.numel()
    rate = misses / count
    return LinearityResult(
        missing_rate=rate,
        std_error=math.sqrt(rate * (1 - rate) / count),
        misses=misses,
        pairs=count,
        exhaustive=pairs is None,
        seed=seed,
        mode=mode,
        num_inputs=labels.shape[0],
    )
