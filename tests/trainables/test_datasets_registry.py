"""The torch-free dataset registry: every entry's loader exists, and the RandAugment check loads timm's own parser without timm's package (a pin on timm's layout)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainables import datasets
from trainables.datasets import DATASETS, rand_augment_problem

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", list(DATASETS))
def test_every_entry_names_a_loader(name):
    from trainables import data

    spec = DATASETS[name]
    assert spec.name == name and spec.description
    assert callable(spec.load) and spec.load is getattr(data, spec.loader)
    assert data.DATASETS is DATASETS  # one registry, re-exported where the loaders live


def test_timm_auto_augment_still_loads_alone():
    # sharpscale reads timm/data/auto_augment.py without running timm's __init__ (which imports torch). If a timm
    # release moves that file or gives it imports from timm, this fails: the check then falls back to the ordinary
    # import (correct, seconds slower), and _timm_rand_augment's comment and this pin need a look.
    code = (
        "import sys\n"
        "from trainables import datasets\n"
        "module = datasets._load_alone()\n"
        "assert module is not None, 'timm/data/auto_augment.py is missing or no longer loads on its own'\n"
        "assert module.rand_augment_transform.__module__ == datasets._AUTO_AUGMENT\n"
        "assert datasets.rand_augment_problem('rand-m9-mstd0.5') is None\n"
        "heavy = sorted(m for m in ('torch', 'timm') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr


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
