"""Shared fixtures for the optim tests: a tiny conv+BN classifier, a batch, a forward closure and a stepper."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import optim

NUM_CLASSES = 5
NUM_SAMPLES = 32


class TinyNet(nn.Module):
    """Conv -> BatchNorm -> ReLU -> pool -> Linear: small, has BN buffers and 1-D params."""

    def __init__(self, bn_momentum: float | None = 0.1):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6, momentum=bn_momentum)
        self.head = nn.Linear(6 * 4 * 4, NUM_CLASSES)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        x = F.adaptive_avg_pool2d(x, 4).flatten(1)
        return self.head(x)


def make_model(seed: int = 0, dtype=torch.float32, bn_momentum: float | None = 0.1) -> TinyNet:
    torch.manual_seed(seed)
    return TinyNet(bn_momentum).to(dtype)


def make_batch(step: int, batch: int = 8, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(batch, 3, 8, 8, generator=g, dtype=dtype)
    y = torch.randint(0, NUM_CLASSES, (batch,), generator=g)
    idx = torch.randperm(NUM_SAMPLES, generator=g)[:batch]
    return x, y, idx


def make_forward(model, x, y, counter: list | None = None, autocast_dtype=None):
    """optim's Forward: ``forward(rows=None, reduction="mean") -> (loss, logits)`` on the rows asked for."""

    def forward(rows=None, reduction="mean"):
        if counter is not None:
            counter.append(1)
        xs, ys = (x, y) if rows is None else (x[rows], y[rows])
        if autocast_dtype is not None:
            with torch.autocast("cpu", dtype=autocast_dtype):
                logits = model(xs)
        else:
            logits = model(xs)
        return F.cross_entropy(logits.float(), ys, reduction=reduction), logits

    return forward


def build(name, model, base=None, **kw):
    """The method at its registry entry's small settings (``METHODS[name].small.hparams``), ``hparams`` over them."""
    base = base if base is not None else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    hp = {**optim.METHODS[name].small.hparams, **kw.pop("hparams", {})}
    return optim.create(name, base, model=model, num_samples=NUM_SAMPLES, num_classes=NUM_CLASSES, **kw, **hp)


def run(method, model, steps, start=0, counter=None, autocast_dtype=None):
    """One step per 'epoch' so that SAF/MESA switch on quickly; returns the StepOutputs."""
    outs = []
    for t in range(start, start + steps):
        x, y, idx = make_batch(t)
        outs.append(
            method.train_step(make_forward(model, x, y, counter, autocast_dtype), inputs=x, indices=idx, epoch=t)
        )
    return outs


@pytest.fixture
def helpers():
    import types

    return types.SimpleNamespace(
        make_model=make_model,
        make_batch=make_batch,
        make_forward=make_forward,
        build=build,
        run=run,
        NUM_CLASSES=NUM_CLASSES,
        NUM_SAMPLES=NUM_SAMPLES,
        TinyNet=TinyNet,
    )
