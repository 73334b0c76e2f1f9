"""The registry's torch-free knob declarations: defaults equal the classes' signatures, the study check (`check_hparams`) says exactly what building the method says, and reading the registry imports no torch."""

from __future__ import annotations

import importlib
import inspect
import itertools
import math
from pathlib import Path

import pytest
import torch

import optim
from optim import METHODS, check_hparams, create

NAMES = list(METHODS)
ROOT = Path(__file__).resolve().parents[2]

# The one declared default that is not the class's: asam is the class SAM with adaptive=True, and the ASAM
# authors' radius is ten times SAM's (create always passes the declared one).
OVERRIDES = {("asam", "rho")}


@pytest.mark.parametrize("name", NAMES)
def test_declared_defaults_are_the_signatures(name):
    spec = METHODS[name]
    # A factory that takes every knob without a default (SAF's, MESA's) names where the defaults are.
    where = spec.small.defaults_in
    owner = (
        spec.build if not where else getattr(importlib.import_module(where.split(":")[0], "optim"), where.split(":")[1])
    )
    params = inspect.signature(owner).parameters
    for knob in spec.knobs:
        assert knob.name in params, f"{name}: knob {knob.name} is not a parameter of {owner}"
        if (name, knob.name) in OVERRIDES:
            assert params[knob.name].default != knob.default
            continue
        assert params[knob.name].default == knob.default, (name, knob.name)
    assert set(spec.hparams) == {k.name for k in spec.knobs}


# Values that break some rule of some knob, and values that pass most: every knob of every method gets each.
PROBES = [-1, -0.1, 0, 0.0, 0.3, 0.5, 1, 1.0, 2, 2.5, 3, 7, 1e9, math.nan, math.inf, True, False]


def _outcome(fn):
    try:
        fn()
    except (ValueError, TypeError) as err:
        return str(err)
    return None


@pytest.mark.parametrize("name", NAMES)
def test_check_hparams_says_what_building_says(name):
    # Every knob at every probe value, and with SGD without momentum: the torch-free check and the class agree on
    # whether it is accepted and, word for word, on the error.
    spec = METHODS[name]
    cases = [{}] + [{k.name: v} for k in spec.knobs for v in PROBES]
    cases += [{"e_tilde": 4, "e_start": 4}, {"e_tilde": 5, "e_start": 4}] if name == "saf" else []
    cases += [{"rho_max": 0.2, "rho_min": 0.3}, {"lr_max": 0.5, "lr_min": 0.6}] if name == "gsam" else []
    checked = 0
    for hp in cases:
        # global_perturbation: the trial's setting that excludes m-sharpness (m), checked by both as well.
        for (base, momentum), gp in itertools.product((("adamw", None), ("sgd", 0.9), ("sgd", 0.0)), (False, True)):
            model = torch.nn.Linear(2, 2)
            if base == "sgd":
                opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
            else:
                opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            built = _outcome(
                lambda: create(name, opt, model=model, num_samples=4, num_classes=2, global_perturbation=gp, **hp)
            )
            declared = _outcome(
                lambda: check_hparams(
                    name,
                    base=type(opt).__name__,
                    base_keeps_momentum=base == "adamw" or momentum > 0,
                    global_perturbation=gp,
                    **hp,
                )
            )
            assert declared == built, (name, hp, base, momentum, gp)
            checked += built is not None
    assert checked > 0 or not spec.knobs


def test_m_sharpness_with_a_global_perturbation_is_refused_at_load():
    # Before any trial starts: a study's validation loads each cell's TrialConfig.
    from trainables.config import ConfigError, TrialConfig

    cfg = {"optimizer": {"method": "sam", "hparams": {"m": 32}, "global_perturbation": True}}
    with pytest.raises(ConfigError, match=r"m must satisfy m unset when global_perturbation=True.*m=32"):
        TrialConfig.load(cfg)
    TrialConfig.load({"optimizer": {"method": "sam", "hparams": {"m": 32}}})  # either one alone is fine


def test_unknown_names_and_knobs_are_refused_like_create():
    with pytest.raises(ValueError, match="unknown method 'gasm'.*did you mean 'gsam'"):
        check_hparams("gasm", base="AdamW", base_keeps_momentum=True)
    with pytest.raises(ValueError, match=r"'sam' does not take hparam\(s\) alpha.*accepts: rho=0.05, p=2"):
        check_hparams("sam", base="AdamW", base_keeps_momentum=True, alpha=0.1)


def test_the_registry_and_a_study_check_import_no_torch(fresh_python):
    # What `sharpscale validate` reads: the registry, the trial config's checks (a method's knobs, a model family,
    # a dataset and its RandAugment string). Torch costs seconds on import (and torch._dynamo more on a first
    # optimizer); the classes load it when a method is built.
    code = (
        "import optim\n"
        "from trainables.config import TrialConfig\n"
        "assert [n for n in optim.METHODS] and optim.METHODS['sam'].hparams['rho'] == 0.05\n"
        "for method, spec in optim.METHODS.items():\n"
        "    # A method with an update of its own says which base knobs it needs at one value (bSAM: weight_decay 0).\n"
        "    needs = dict(spec.own_update.requires) if spec.own_update else {}\n"
        "    TrialConfig.load({'model': {'name': 'resnet18'}, 'optimizer': {'method': method, **needs},\n"
        "                      'data': {'augment': 'strong', 'randaugment': 'rand-m9-n3-mstd0.5'}})\n"
        "try:\n"
        "    TrialConfig.load({'optimizer': {'method': 'gsam', 'hparams': {'rho_max': 0.01}}})\n"
        "except Exception as err:\n"
        "    assert 'rho_min <= rho_max' in str(err), err\n"
        "else:\n"
        "    raise AssertionError('rho_min > rho_max passed')\n"
    )
    fresh_python(
        code,
        not_imported=("torch", "timm", "torchvision"),
        then="assert optim.SAM.__name__ == 'SAM' and 'torch' in sys.modules  # the classes still load on use\n",
    )


# F-SAM: d_t = (1 - sigma (1 - lmbda)) g_t - sigma lmbda m_{t-1}. At sigma (1 - lmbda) >= 1 the first step's
# perturbation (m_{-1} = 0) is zero or points downhill; the old code took it.
FSAM_REFUSED = [{"sigma": 3.0}, {"sigma": 2.0, "lmbda": 0.5}, {"sigma": 1.0, "lmbda": 0.0}]
FSAM_RULE = r"^sigma must satisfy sigma \* \(1 - lmbda\) < 1 \(lmbda=[0-9.]+\), but got sigma=[0-9.]+; .*pass sigma < "


@pytest.mark.parametrize("hp", FSAM_REFUSED, ids=lambda hp: ",".join(f"{k}={v}" for k, v in hp.items()))
def test_fsam_refuses_sigma_times_one_minus_lmbda_from_one_up(hp):
    model = torch.nn.Linear(2, 2)
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match=FSAM_RULE):
        optim.FriendlySAM(base, model=model, **hp)  # the class itself, not only create()
    with pytest.raises(ValueError, match=FSAM_RULE):
        check_hparams("fsam", base="SGD", base_keeps_momentum=True, **hp)
    limit = 1.0 / (1.0 - hp.get("lmbda", 0.6))
    below = {**hp, "sigma": limit * (1 - 1e-9)}  # just under the bound: accepted by both
    optim.FriendlySAM(base, model=model, **below)
    check_hparams("fsam", base="SGD", base_keeps_momentum=True, **below)


def test_fsam_relation_is_refused_by_sharpscale_validate(tmp_path, cli_process):
    # The study's validation (torch-free) names the field, the rule, the value and the fix, before any trial.
    study = tmp_path / "fsam.yaml"
    study.write_text(
        "name: fsam_uphill\n"
        "objective: {metric: val_acc, mode: max}\n"
        "base:\n"
        "  data: {name: digits, img_size: 16, batch_size: 32}\n"
        "  model: {name: resnet18}\n"
        "  optimizer: {base: sgd, momentum: 0.9, method: fsam, hparams: {sigma: 3.0}}\n"
    )
    done = cli_process.run("validate", study, cwd=ROOT, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "optimizer.hparams: sigma must satisfy sigma * (1 - lmbda) < 1 (lmbda=0.6), but got sigma=3.0" in done.stderr
    assert "pass sigma < 2.5" in done.stderr
