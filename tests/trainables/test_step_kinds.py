"""A trial's optimizer.scope and optimizer.schedule: what each epoch records of its steps, a scheduled trial's exact
resume, and a scope pattern that names no parameter of the model refusing the trial before any step."""

from __future__ import annotations

import math

import pytest
import torch

from trainables import fit, load_checkpoint
from trainables.errors import UserError


@pytest.fixture
def config(tiny_model):
    def make(arch="resnet", method="sam", epochs=2, **optimizer):
        return {
            "model": tiny_model(arch),
            "data": {"name": "digits", "img_size": 16, "batch_size": 128},
            "optimizer": {"method": method, "lr": 0.003, **optimizer},
            "schedule": {"epochs": epochs, "warmup_epochs": 0},
            "train": {"device": "cpu", "seed": 3},
        }

    return make


def epochs_of(cfg, **kw):
    seen = []
    fit(cfg, reporter=lambda m, ckpt: seen.append(m), **kw)
    return seen


def test_each_epoch_records_its_perturbed_share_and_passes(config):
    late = epochs_of(config(schedule={"start_fraction": 0.5}))
    assert [m["perturbed_share"] for m in late] == [0.0, 1.0]
    assert [m["passes_per_step"] for m in late] == [1.0, 2.0]
    assert "surrogate_gap" not in late[0] and "surrogate_gap" in late[1]
    (plain,) = epochs_of(config(method="none", epochs=1))
    assert plain["perturbed_share"] == 0.0 and plain["passes_per_step"] == 1.0
    (every,) = epochs_of(config(epochs=1, schedule={"every": 2}))
    # digits' 1,437 training samples at batch 128 are 11 or 12 steps (the loader's drop_last): steps 0, 2, 4, ... perturb
    share = every["perturbed_share"]
    assert any(share == math.ceil(n / 2) / n for n in (11, 12)), share
    assert every["passes_per_step"] == pytest.approx(1.0 + share, abs=1e-12)


# 6-7 CPU-s alone (three 3-epoch SAM trainings of a ResNet): out of `make test-fast`.
@pytest.mark.slow
def test_a_scheduled_trial_resumes_bit_exactly(tmp_path, config):
    cfg = config(epochs=3, schedule={"probability": 0.5}, scope="norm")
    straight = tmp_path / "straight"
    fit(cfg, checkpoint_dir=straight)

    def interrupt(metrics, ckpt):
        if metrics["epoch"] == 1:
            raise KeyboardInterrupt

    first = tmp_path / "first"
    with pytest.raises(KeyboardInterrupt):
        fit(cfg, checkpoint_dir=first, reporter=interrupt)
    resumed = tmp_path / "resumed"
    fit(cfg, checkpoint_dir=resumed, resume_from=first)
    a, b = load_checkpoint(straight), load_checkpoint(resumed)
    assert a["method"]["schedule"] == b["method"]["schedule"]
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key


def test_a_scope_pattern_naming_no_parameter_refuses_the_trial(config):
    with pytest.raises(UserError, match=r"optimizer\.scope: .*include 'blocks\.\*' matches none.*parameter groups"):
        fit(config(epochs=1, scope={"include": ["blocks.*"]}))
