"""The torch-free dataset registry: every entry's loader exists, and the RandAugment check loads timm's own parser without timm's package (a pin on timm's layout)."""

from __future__ import annotations

import pytest

from trainables import datasets
from trainables.datasets import DATASETS, rand_augment_problem


@pytest.mark.parametrize("name", list(DATASETS))
def test_every_entry_names_a_loader(name):
    from trainables import data

    spec = DATASETS[name]
    assert spec.name == name and spec.description
    assert callable(spec.load) and spec.load is getattr(data, spec.loader)
    assert data.DATASETS is DATASETS  # one registry, re-exported where the loaders live


def test_timm_auto_augment_still_loads_alone(fresh_python):
    # sharpscale reads timm/data/auto_augment.py without running timm's __init__ (which imports torch). If a timm
    # release moves that file or gives it imports from timm, this fails: the check then falls back to the ordinary
    # import (correct, seconds slower), and _timm_rand_augment's comment and this pin need a look.
    code = (
        "from trainables import datasets\n"
        "module = datasets._load_alone()\n"
        "assert module is not None, 'timm/data/auto_augment.py is missing or no longer loads on its own'\n"
        "assert module.rand_augment_transform.__module__ == datasets._AUTO_AUGMENT\n"
        "assert datasets.rand_augment_problem('rand-m9-mstd0.5') is None\n"
    )
    fresh_python(code, not_imported=("torch", "timm"), timeout=60)


STRINGS = [
    "rand-m9-mstd0.5",
    "rand-m9-n3-mstd0.5-inc1",
    "rand-mstd1-tweights",
    "rand-m5-p0.3-mmax20",
    "rand",
    "rand-x9",
    "augmix-m5",
    "",
    "rand-mfoo",
    "rand-n2.5",
    "rand-tnosuchset",
]


@pytest.mark.parametrize("config", STRINGS)
def test_the_lone_parser_judges_as_timm_does(config):
    from timm.data.auto_augment import rand_augment_transform

    alone = datasets._load_alone()
    hparams = dict(translate_const=14, img_mean=(128, 128, 128))

    def verdict(fn):
        try:
            fn(config, dict(hparams))
        except Exception as exc:  # noqa: BLE001 - timm signals a bad string with asserts and ValueErrors
            return type(exc).__name__
        return None

    assert verdict(alone.rand_augment_transform) == verdict(rand_augment_transform)
    assert (rand_augment_problem(config) is None) == (verdict(rand_augment_transform) is None)


@pytest.mark.parametrize("fraction", [1.0, 0.5, 0.1, 0.045, 0.01])
def test_registered_class_sizes_give_the_loaded_subset_size(fraction):
    # The config rules size a fraction's subset from the registry, before any data is loaded: the registry's digits
    # class sizes must be those of the split trainables.data loads, and subset_size what fraction_indices keeps.
    from trainables.data import load_dataset

    bundle = load_dataset("digits", fraction=fraction, batch_size=1)
    assert len(bundle.train) == DATASETS["digits"].subset_size(fraction)


@pytest.mark.parametrize("name", [n for n, spec in DATASETS.items() if spec.train_class_sizes is not None])
@pytest.mark.parametrize("batch_size", [1, 64])
def test_a_fraction_under_one_sample_is_refused_at_load(name, batch_size):
    """`data.fraction: 1e-9` validated and then failed in every trial, 3 retries each (issue 24)."""
    from trainables.config import ConfigError, TrialConfig

    data = {"name": name, "fraction": 1e-9, "batch_size": batch_size}
    if DATASETS[name].needs_root:
        data["root"] = "/data"
    with pytest.raises(ConfigError) as err:
        TrialConfig.load({"data": data})
    text = str(err.value)
    assert "data.fraction: must keep at least one" in text and "got 1e-09" in text and "Fix: use at least" in text, text


@pytest.mark.parametrize("name", [n for n, spec in DATASETS.items() if spec.train_class_sizes is not None])
def test_a_fraction_smaller_than_one_batch_is_refused_at_load_with_the_least_fraction(name):
    from trainables.config import ConfigError, TrialConfig

    spec = DATASETS[name]
    total = sum(spec.train_class_sizes)
    batch = 3 * len(spec.train_class_sizes)  # each class keeps at least one: a smaller batch always fits
    fraction = batch / total / 3
    data = {"name": name, "fraction": fraction, "batch_size": batch, "root": "/data" if spec.needs_root else None}
    with pytest.raises(ConfigError) as err:
        TrialConfig.load({"data": data})
    text = str(err.value)
    assert "data.batch_size: must not exceed the training-set size" in text and f"got {batch}" in text, text
    least = float(text.split("raise data.fraction to at least ")[1].split()[0].rstrip("."))
    assert spec.subset_size(least) >= batch
    TrialConfig.load({"data": {**data, "fraction": least}})  # the fix it names passes
