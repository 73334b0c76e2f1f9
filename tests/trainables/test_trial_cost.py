"""No compute on work nobody reads: validation every k-th epoch, one dataset load per trial, refusals that fail once."""

from __future__ import annotations

import math

import pytest
import torch
from PIL import Image

import trainables.data
import trainables.loop
from trainables import ConfigError, TrialConfig, fit
from trainables.data import fixed_batches, load_dataset
from trainables.errors import TrialRefused
from trainables.metrics import EVERY_EPOCH_METRIC, VALIDATION_METRICS, VALIDATION_SAMPLES
from trainables.tracking import BEST_EPOCH_METRICS


def _config(tiny_model, epochs=2, **train):
    return {
        "model": tiny_model("mixer"),
        "data": {"name": "digits", "img_size": 16, "batch_size": 128},
        "optimizer": {"method": "sam", "lr": 0.003},
        "schedule": {"epochs": epochs, "warmup_epochs": 0},
        "train": {"device": "cpu", "seed": 3, **train},
    }


# --------------------------------------------------------------------------- train.eval_every

VALIDATION_KEYS = (*VALIDATION_METRICS, VALIDATION_SAMPLES, *BEST_EPOCH_METRICS.values(), "best_epoch")


@pytest.mark.parametrize(("epochs", "every", "evaluated"), [(5, 2, {1, 3, 4}), (3, 1, {0, 1, 2}), (3, 7, {2})])
def test_only_the_epochs_eval_every_names_and_the_last_are_evaluated(tiny_model, epochs, every, evaluated):
    seen = []
    final = fit(_config(tiny_model, epochs, eval_every=every), reporter=lambda m, _: seen.append(m))
    assert [m["epoch"] for m in seen] == list(range(epochs))
    for m in seen:
        assert math.isfinite(m[EVERY_EPOCH_METRIC]) and "epoch_time_s" in m
        if m["epoch"] in evaluated:
            assert all(key in m for key in VALIDATION_KEYS), m
        else:  # no stale copy of an earlier evaluation, no best-so-far either
            assert not any(key in m for key in VALIDATION_KEYS), m
    assert final["best_epoch"] in evaluated and final["val_samples"] > 0


def test_eval_every_must_be_a_positive_integer():
    with pytest.raises(ConfigError, match=r"train\.eval_every"):
        TrialConfig.load({"train": {"eval_every": 0}})
    assert TrialConfig().train.eval_every == 1  # the default evaluates every epoch, as before


# --------------------------------------------------------------------------- one load per trial


def _imagefolder(root):
    for split in ("train", "val"):
        for label in ("a", "b"):
            (root / split / label).mkdir(parents=True)
            for i in range(4):
                pixels = torch.randint(0, 256, (20 + i, 24, 3), dtype=torch.uint8).numpy()
                Image.fromarray(pixels).save(root / split / label / f"{i}.png")
    return str(root)


DATA_FORMS = {
    "digits host basic": {"name": "digits", "augment": "basic", "device_resident": False},
    "digits resident basic": {"name": "digits", "augment": "basic", "device_resident": True},
    "digits 16px strong": {"name": "digits", "img_size": 16, "augment": "strong"},
    "cifar10 host basic": {"name": "cifar10", "augment": "basic", "device_resident": False},
    "cifar10 resident basic": {"name": "cifar10", "augment": "basic", "device_resident": True},
    "cifar10 host strong": {"name": "cifar10", "augment": "strong"},
    "cifar10 24px basic": {"name": "cifar10", "img_size": 24, "augment": "basic"},
    "imagefolder basic": {"name": "imagefolder", "img_size": 16, "augment": "basic"},
    "synthetic": {"name": "synthetic", "synthetic_samples": 64},
}


@pytest.mark.parametrize("form", sorted(DATA_FORMS))
def test_the_measurement_set_from_the_trials_own_bundle_equals_a_fresh_unaugmented_load(form, tmp_path, fake_cifar10):
    fields = dict(DATA_FORMS[form])
    if fields["name"] == "cifar10":
        fields["root"] = str(tmp_path)
    elif fields["name"] == "imagefolder":
        fields["root"] = _imagefolder(tmp_path / "folder")
    data = TrialConfig.load({"data": fields}).data
    bundle = load_dataset(data)  # augmented, as the trial trains on it
    if hasattr(bundle.train, "to_device"):
        bundle.train.to_device(torch.device("cpu"))
    samples = min(12, len(bundle.train))
    state = torch.random.get_rng_state()
    mine = fixed_batches(data, samples=samples, batch_size=5, seed=4, bundle=bundle)
    assert torch.equal(torch.random.get_rng_state(), state)  # no augmentation draw: training's stream is untouched
    fresh = fixed_batches(data, samples=samples, batch_size=5, seed=4)
    assert [x.shape[0] for x, _ in mine] == [min(5, samples - s) for s in range(0, samples, 5)]
    for (x, y), (x0, y0) in zip(mine, fresh, strict=True):
        assert x.dtype == torch.float32 and torch.equal(x, x0) and torch.equal(y, y0)


def test_a_trial_with_geometry_loads_its_dataset_once(tiny_model, monkeypatch):
    loads = []
    real = trainables.data.load_dataset

    def counted(*args, **kwargs):
        loads.append(args)
        return real(*args, **kwargs)

    # A spy on the one loader: both the loop's call and fixed_batches' would go through it.
    monkeypatch.setattr(trainables.data, "load_dataset", counted)
    monkeypatch.setattr(trainables.loop, "load_dataset", counted)
    cfg = {**_config(tiny_model, epochs=1), "geometry": {"measures": ["probe_metric"], "batches": 2, "batch_size": 16}}
    taken = []
    metrics = fit(cfg, probe=lambda model, batches: taken.append(batches) or {"probe_metric": 1.0})
    assert len(loads) == 1 and metrics["probe_metric"] == 1.0
    assert [tuple(x.shape) for x, _ in taken[0]] == [(16, 1, 16, 16)] * 2


# --------------------------------------------------------------------------- refusals


class _RefusingProbe:
    def check(self, model, batches):
        raise ValueError("finite differences on a kinked model (relu)")

    def __call__(self, model, batches):
        raise AssertionError("never measured: refused before training")


REFUSALS = {
    "measurement set larger than the subset": (
        {"data": {"fraction": 0.05, "batch_size": 16}, "geometry": {"measures": ["m"], "batches": 2, "batch_size": 64}},
        r"geometry\.batches x geometry\.batch_size",
    ),
    "model kwargs timm does not take": ({"model": {"kwargs": {"no_such_knob": 3}}}, r"model: .*no_such_knob"),
    "probe check": ({"geometry": {"measures": ["m"], "batches": 1, "batch_size": 8}}, "kinked model"),
}


def test_a_batch_larger_than_a_known_subset_is_refused_at_load_not_in_the_trial(tiny_model):
    # The registry knows digits' training-set size, so the config refuses it before any trial starts; the loop's
    # own check (TrialRefused) stays for datasets whose size is known only once loaded (an image folder).
    cfg = _config(tiny_model, epochs=1)
    cfg["data"] = {**cfg.get("data", {}), "fraction": 0.02, "batch_size": 128}
    with pytest.raises(ConfigError, match=r"data\.batch_size: must not exceed the training-set size"):
        fit(cfg, reporter=lambda m, _: pytest.fail("trained"))


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_settings_only_the_built_trial_can_check_are_refused_before_training(case, tiny_model):
    change, message = REFUSALS[case]
    cfg = _config(tiny_model, epochs=1)
    for section, fields in change.items():
        cfg[section] = {**cfg.get(section, {}), **fields}
        if section == "model":
            cfg["model"]["kwargs"] = {**tiny_model("mixer")["kwargs"], **fields["kwargs"]}
    reported = []
    with pytest.raises(TrialRefused, match=message):
        fit(cfg, probe=_RefusingProbe(), reporter=lambda m, _: reported.append(m))
    assert reported == []  # nothing trained
