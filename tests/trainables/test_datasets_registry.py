"""The torch-free dataset registry, every entry: its loader, and each fact it owns (default size, classes, split
sizes, normalisation, root layout, archive) as the loader, the layout check and the fetch read it; and the
RandAugment check loading timm's own parser without timm's package (a pin on timm's layout)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainables.data import registry
from trainables.data.registry import DATASETS, rand_augment_problem

NAMES = list(DATASETS)


def _fake_imagefolder(root: Path, write_fake_cifar) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            for i in range(2):
                Image.fromarray(rng.integers(0, 256, size=(30, 40, 3), dtype=np.uint8)).save(
                    root / split / c / f"{i}.png"
                )
    return root


def _fake_cifar(name):
    def write(root: Path, write_fake_cifar) -> Path:
        write_fake_cifar(root, name)
        return root

    return write


#: A tiny root of each dataset that needs one, in its registered layout: a new dataset with a root adds its fake here.
FAKE_ROOTS = {"cifar10": _fake_cifar("cifar10"), "cifar100": _fake_cifar("cifar100"), "imagefolder": _fake_imagefolder}


def _root(name: str, tmp_path: Path, write_fake_cifar) -> Path | None:
    if not DATASETS[name].needs_root:
        return None
    if name not in FAKE_ROOTS:
        pytest.fail(f"dataset {name!r} needs a root: add a tiny one in its layout to FAKE_ROOTS in {__file__}")
    return FAKE_ROOTS[name](tmp_path / "root", write_fake_cifar)


@pytest.mark.parametrize("name", NAMES)
def test_every_entry_names_a_public_loader(name):
    import importlib

    from trainables import data

    spec = DATASETS[name]
    assert spec.name == name and spec.description
    module, _, attr = spec.loader.partition(":")
    assert module and attr and not attr.startswith("_"), f"{name}: loader {spec.loader!r} is not 'module:public_name'"
    assert callable(spec.load) and spec.load is getattr(importlib.import_module(module, "trainables.data"), attr)
    assert data.DATASETS is DATASETS  # one registry, re-exported where the loaders live


@pytest.mark.parametrize("name", NAMES)
def test_the_loaded_bundle_is_what_the_entry_says(name, tmp_path, write_fake_cifar):
    from trainables.data import load_dataset

    spec = DATASETS[name]
    root = _root(name, tmp_path, write_fake_cifar)
    bundle = load_dataset(name, root=None if root is None else str(root), augment="none")
    assert bundle.name == name and bundle.img_size == spec.default_size
    if spec.num_classes is not None:
        assert bundle.num_classes == spec.num_classes
    if spec.mean is not None:
        assert tuple(bundle.mean) == spec.mean and tuple(bundle.std) == spec.std
    else:  # computed from the training split
        assert len(bundle.mean) == len(bundle.std) == 1
    if spec.split_sizes is not None and root is None:  # the real data (a fake root is smaller)
        assert (bundle.num_train_full, len(bundle.val)) == spec.split_sizes
    if spec.train_class_sizes is not None and root is None:
        assert bundle.num_train_full == sum(spec.train_class_sizes)


@pytest.mark.parametrize("name", NAMES)
def test_the_root_layout_is_the_entrys(name, tmp_path, write_fake_cifar):
    from trainables.data.fetch import ARCHIVES, expected_layout, layout_problem

    spec = DATASETS[name]
    assert (spec.root_layout is not None) == spec.needs_root
    assert (expected_layout(name) != "") == spec.needs_root
    if spec.archive is not None:
        assert ARCHIVES[name] is spec.archive
        assert spec.archive.files == tuple(f for files in spec.archive.parts.values() for f in files)
        assert spec.root_layout == spec.archive.layout
    else:
        assert name not in ARCHIVES
    if not spec.needs_root:
        assert layout_problem(name, tmp_path) is None
        return
    root = _root(name, tmp_path, write_fake_cifar)
    assert layout_problem(name, root) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    problem = layout_problem(name, empty)
    assert problem is not None and f"does not hold the {name} layout: expected {expected_layout(name)}" in problem


def test_timm_auto_augment_still_loads_alone(fresh_python):
    # sharpscale reads timm/data/auto_augment.py without running timm's __init__ (which imports torch). If a timm
    # release moves that file or gives it imports from timm, this fails: the check then falls back to the ordinary
    # import (correct, seconds slower), and _timm_rand_augment's comment and this pin need a look.
    code = (
        "from trainables.data import registry\n"
        "module = registry._load_alone()\n"
        "assert module is not None, 'timm/data/auto_augment.py is missing or no longer loads on its own'\n"
        "assert module.rand_augment_transform.__module__ == registry._AUTO_AUGMENT\n"
        "assert registry.rand_augment_problem('rand-m9-mstd0.5') is None\n"
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

    alone = registry._load_alone()
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
    # class sizes must be those of the split trainables.data.digits loads, and subset_size what fraction_indices keeps.
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


@pytest.mark.parametrize("name", NAMES)
def test_the_calibration_probe_keeps_the_datasets_classes_and_size(name):
    """The probe used to guess them (100 classes for cifar100, else 10; 8 px for digits, else 32: an image folder's
    trials run at 224 px)."""
    from studies.calibrate import probe_config

    spec = DATASETS[name]
    data = {"name": name, "root": "/data" if spec.needs_root else None}
    probe = probe_config({"data": data}, device="cpu", steps=2)["data"]
    assert probe["img_size"] == spec.default_size
    assert probe["synthetic_classes"] == (spec.num_classes if spec.num_classes is not None else 10)
