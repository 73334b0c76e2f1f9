"""Study files: expansion into cells, conditional search spaces, and every invalid file reported at once."""

from pathlib import Path

import pytest
import yaml

from studies.spec import StudyError, load_study

REPO = Path(__file__).resolve().parents[2]

GOOD = {
    "name": "t",
    "base": {"data": {"name": "digits", "img_size": 16}, "schedule": {"epochs": 2}},
    "factors": {
        "arch": {
            "vit": {
                "model.name": "vit_tiny_patch16_224",
                "model.kwargs": {"patch_size": 4, "embed_dim": 16, "depth": 1, "num_heads": 2},
            },
            "resnet": {"model.name": "resnet18", "model.cifar_stem": True},
        },
        "method": {"adamw": {"optimizer.method": "none"}, "sam": {"optimizer.method": "sam"}},
    },
    "search": {"rho": {"type": "loguniform", "low": 0.01, "high": 0.5}},
    "budget": {"trials_per_cell": 3},
}


def write(tmp_path, data) -> Path:
    p = tmp_path / "study.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def test_cells_and_conditional_search(tmp_path):
    study = load_study(write(tmp_path, GOOD))
    keys = [c.key for c in study.cells]
    assert keys == [
        "arch=vit,method=adamw",
        "arch=vit,method=sam",
        "arch=resnet,method=adamw",
        "arch=resnet,method=sam",
    ]
    by_key = {c.key: c for c in study.cells}
    # rho is SAM's knob: the AdamW cells search nothing and run once.
    assert by_key["arch=vit,method=adamw"].space == {}
    assert by_key["arch=vit,method=adamw"].trials == 1
    assert list(by_key["arch=vit,method=sam"].space) == ["optimizer.hparams.rho"]
    assert by_key["arch=vit,method=sam"].trials == 3
    assert study.total_trials == 2 * 1 + 2 * 3
    assert by_key["arch=resnet,method=sam"].config["model"]["cifar_stem"] is True


def test_list_factor_is_a_config_path(tmp_path):
    data = dict(GOOD, factors={"data.fraction": [0.25, 1.0]}, search={})
    study = load_study(write(tmp_path, data))
    assert [c.config["data"]["fraction"] for c in study.cells] == [0.25, 1.0]
    assert [c.levels for c in study.cells] == [{"data.fraction": "0.25"}, {"data.fraction": "1.0"}]


def test_smoke_forces_tiny_digits_runs(tmp_path):
    data = dict(GOOD, base={"data": {"name": "cifar10", "root": "/nowhere"}, "schedule": {"epochs": 300}})
    study = load_study(write(tmp_path, data), smoke=True)
    for cell in study.cells:
        assert cell.config["data"]["name"] == "digits"
        assert cell.config["schedule"]["epochs"] == 2
        assert cell.trials <= 2


def test_shipped_quickstart_is_valid_and_big_enough():
    study = load_study(REPO / "studies" / "quickstart.yaml")
    archs = {c.levels["arch"] for c in study.cells}
    assert archs == {"vit", "mixer", "resnet"}
    assert {c.config["optimizer"]["method"] for c in study.cells} == {"none", "sam"}
    assert study.total_trials >= 12
    assert study.spec.resources.max_concurrent_trials == 2  # on many cores too: TPE sees results before most trials
    assert all(c.config["data"]["name"] == "digits" for c in study.cells)


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d.update(epochs=3), "epochs: unknown key"),
        (
            lambda d: d["base"]["schedule"].update(epochs=0),
            "schedule.epochs: Input should be greater than or equal to 1, got 0",
        ),
        (
            lambda d: d["search"].update(rho={"type": "loguniform", "low": 0.5, "high": 0.1}),
            "search.rho: low < high must hold, got low=0.5, high=0.1",
        ),
        (
            lambda d: d["search"].update(rho={"type": "loguniform", "low": -1, "high": 0.1}),
            "search.rho.loguniform.low: Input should be greater than 0",
        ),
        (
            lambda d: d["factors"]["method"].update(gsamm={"optimizer.method": "gsamm"}),
            "optimizer.method: must be one of",
        ),
        (
            lambda d: d["factors"]["method"].update(bad={"optimizer.methd": "sam"}),
            "factors.method.bad.optimizer.methd: not a trial config path",
        ),
        (
            lambda d: d["search"].update(rhoo={"type": "uniform", "low": 0, "high": 1}),
            "search.rhoo: not a method hparam",
        ),
        (
            lambda d: d["search"].update(alpha={"type": "uniform", "low": 0, "high": 1}),
            "search.alpha: applies to no cell",
        ),
        (
            lambda d: d["search"].update(rho={"type": "uniform", "low": -0.5, "high": 0.1}),
            "search.optimizer.hparams.rho = -0.5",
        ),
        (lambda d: d["base"]["data"].update(name="cifar10"), "data.root: required for data.name='cifar10'"),
        (lambda d: d["base"]["data"].update(fraction=1.5), "data.fraction: Input should be less than or equal to 1"),
        (lambda d: d.update(name="bad name!"), "name: must be one file-name component"),
        (
            lambda d: d["budget"].update(sampler="cmaes"),
            "budget.sampler: Input should be 'tpe', 'gp', 'random' or 'grid'",
        ),
        (lambda d: d["factors"]["arch"].update(vgg={"model.name": "vgg16"}), "model.name: must be a timm ViT"),
        (
            lambda d: d.update(resources={"max_concurrent_trials": 0}),
            "resources.max_concurrent_trials: Input should be greater than or equal to 1",
        ),
    ],
)
def test_invalid_study_names_field_rule_and_value(tmp_path, mutate, expected):
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    mutate(data)
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, data))
    assert expected in str(err.value), str(err.value)


def test_every_error_reported_at_once(tmp_path):
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["factors"]["method"]["bad"] = {"optimizer.method": "samm"}
    data["factors"]["arch"]["vgg"] = {"model.name": "vgg16"}
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, data))
    text = str(err.value)
    assert "Did you mean 'sam'?" in text
    assert "vgg16" in text
    assert len(err.value.problems) >= 2


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(StudyError, match="does not exist"):
        load_study(tmp_path / "nope.yaml")
    p = tmp_path / "broken.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(StudyError, match="YAML syntax"):
        load_study(p)


@pytest.mark.parametrize("field", ["name", "experiment"])
@pytest.mark.parametrize("bad", ["/tmp/x", "../../escaped", "a/b", "..", "x..y", "-dash", ""])
def test_names_that_become_paths_cannot_leave_storage(tmp_path, field, bad):
    study = {"name": "ok", "tracking": {}}
    if field == "name":
        study["name"] = bad
    else:
        study["tracking"]["experiment"] = bad
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(study))
    with pytest.raises(StudyError) as info:
        load_study(path)
    where = "name" if field == "name" else "tracking.experiment"
    assert f"{where}: must be one file-name component" in str(info.value) and "Fix:" in str(info.value)


def test_objective_names_its_statistic(tmp_path):
    final = load_study(write(tmp_path, GOOD)).spec.objective
    assert (final.column, final.label) == ("val_acc", "val_acc (final epoch)")
    best = load_study(write(tmp_path, {**GOOD, "objective": {"metric": "val_acc", "epoch": "best"}})).spec.objective
    assert (best.column, best.label) == ("best_val_acc", "val_acc (best epoch)")
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, {**GOOD, "objective": {"metric": "val_loss", "mode": "min", "epoch": "best"}}))
    assert "objective.epoch" in str(err.value) and "val_loss" in str(err.value) and "Fix" in str(err.value)


def test_smoke_form_keeps_the_levels_it_names(tmp_path):
    data = {
        **GOOD,
        "factors": {**GOOD["factors"], "data.fraction": [0.1, 0.25, 0.5, 1.0]},
        "smoke_form": {"levels": {"data.fraction": [0.1, 0.5, 1.0], "arch": ["resnet"]}, "trials_per_cell": 2},
    }
    study = load_study(write(tmp_path, data), smoke=True)
    assert sorted({c.levels["data.fraction"] for c in study.cells}) == ["0.1", "0.5", "1.0"]
    assert {c.levels["arch"] for c in study.cells} == {"resnet"}
    assert {c.levels["method"]: c.trials for c in study.cells} == {"adamw": 1, "sam": 2}
    bad = {**data, "smoke_form": {"levels": {"data.fraction": [0.3], "size": ["big"]}}}
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, bad), smoke=True)
    text = str(err.value)
    assert "smoke_form.levels.size: not a factor" in text and "smoke_form.levels.data.fraction" in text


@pytest.mark.parametrize("key, meant", [("train.epochs", "schedule.epochs"), ("optimizer.l", "optimizer.lr")])
def test_set_of_an_unknown_path_suggests_the_known_one(key, meant):
    with pytest.raises(StudyError) as err:
        load_study(REPO / "studies" / "quickstart.yaml", overrides={key: 3})
    assert f"--set {key}" in str(err.value) and f"Did you mean {meant}?" in str(err.value)


def test_smoke_keeps_each_cells_ratio_of_epochs(tmp_path):
    # A level with twice the epochs (the compute-matched baseline) or ten times (equal steps on a tenth of the
    # data) keeps that ratio in the tiny run; the shortest cell runs the smoke's epochs.
    data = {
        **GOOD,
        "search": {},
        "base": {**GOOD["base"], "schedule": {"epochs": 100}},
        "factors": {
            "method": {
                "short": {"optimizer.method": "none"},
                "double": {"optimizer.method": "none", "schedule.epochs": 200},
                "tenfold": {"optimizer.method": "sam", "schedule.epochs": 1000},
            }
        },
    }
    full = {c.levels["method"]: c.config["schedule"]["epochs"] for c in load_study(write(tmp_path, data)).cells}
    assert full == {"short": 100, "double": 200, "tenfold": 1000}
    smoke = {
        c.levels["method"]: c.config["schedule"]["epochs"] for c in load_study(write(tmp_path, data), smoke=True).cells
    }
    assert smoke == {"short": 2, "double": 4, "tenfold": 20}
    # The smoke's own epochs (smoke: schedule.epochs) are the shortest kept cell's; a dropped cell sets nothing.
    data["smoke"] = {"schedule": {"epochs": 3}}
    data["smoke_form"] = {"levels": {"method": ["double", "tenfold"]}}
    smoke = {
        c.levels["method"]: c.config["schedule"]["epochs"] for c in load_study(write(tmp_path, data), smoke=True).cells
    }
    assert smoke == {"double": 3, "tenfold": 15}


def test_bare_knob_of_a_level_reaches_only_methods_that_take_it(tmp_path):
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["search"] = {}
    data["factors"]["arch"]["vit"]["rho"] = 0.1
    data["factors"]["arch"]["resnet"]["rho"] = 0.05
    cells = {c.key: c.config["optimizer"].get("hparams", {}) for c in load_study(write(tmp_path, data)).cells}
    assert cells == {
        "arch=vit,method=adamw": {},
        "arch=vit,method=sam": {"rho": 0.1},
        "arch=resnet,method=adamw": {},
        "arch=resnet,method=sam": {"rho": 0.05},
    }
    with pytest.raises(StudyError) as err:  # --set of a value the levels fix would be silently replaced
        load_study(write(tmp_path, data), overrides={"optimizer.hparams.rho": 0.2})
    assert "factor 'arch'" in str(err.value)
    data["factors"]["arch"]["vit"]["alpha"] = 0.3  # GSAM's and LookSAM's knob: no cell's method takes it
    with pytest.raises(StudyError, match="factors.arch.vit.alpha: applies to no cell"):
        load_study(write(tmp_path, data))
    data["factors"]["arch"]["vit"]["rhoo"] = 0.3
    with pytest.raises(StudyError, match="factors.arch.vit.rhoo: not a trial config path nor a method knob"):
        load_study(write(tmp_path, data))


def test_smoke_with_an_invalid_epochs_level_reports_it_instead_of_failing(tmp_path):
    data = {
        **GOOD,
        "search": {},
        "factors": {
            "method": {"a": {"optimizer.method": "none"}, "b": {"optimizer.method": "none", "schedule.epochs": "many"}}
        },
    }
    with pytest.raises(StudyError, match="schedule.epochs"):
        load_study(write(tmp_path, data), smoke=True)


@pytest.mark.parametrize("workers, refused", [(1, True), (3, True), (2, False)])
def test_sampas_two_rank_form_needs_two_workers_before_ray_starts(tmp_path, workers, refused):
    """SAMPa's parallel=True takes its step's two gradients on two data-parallel workers (optim.SharedBatch): another
    worker count would fail every trial at its first step, so the study file is refused naming the field and fix."""
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["factors"]["method"]["sampa"] = {"optimizer.method": "sampa", "optimizer.hparams.parallel": True}
    data["resources"] = {"workers_per_trial": workers}
    if not refused:
        assert any(c.levels["method"] == "sampa" for c in load_study(write(tmp_path, data)).cells)
        return
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, data))
    said = str(err.value)
    assert "optimizer.hparams.parallel: sampa's parallel=True form" in said, said
    assert (
        f"needs resources.workers_per_trial = 2, got {workers}" in said
        and "Fix: set resources.workers_per_trial: 2" in said
    )


def _with_bsam(settings=None):
    """GOOD with an SGD architecture and bSAM (an own-update method: no weight decay, no SGD base) among the methods."""
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["search"] = {}
    data["factors"]["arch"]["resnet"].update({"optimizer.base": "sgd", "optimizer.weight_decay": 5e-4})
    data["factors"]["method"]["bsam"] = {"optimizer.method": "bsam"}
    if settings is not None:
        data["method_settings"] = settings
    return data


def test_method_settings_apply_to_their_methods_cells_over_the_levels(tmp_path):
    with pytest.raises(StudyError, match="weight_decay must be 0.0 for bsam") as err:
        load_study(write(tmp_path, _with_bsam()))  # the architecture's SGD and weight decay reach bSAM's cells
    # The fix names the section that sets them in bSAM's cells alone, with the values it would take.
    assert "method_settings: {bsam: {optimizer.base: adamw, optimizer.weight_decay: 0.0}}" in str(err.value)
    settings = {"bsam": {"optimizer.base": "adamw", "optimizer.weight_decay": 0.0}}
    cells = {c.key: c.config["optimizer"] for c in load_study(write(tmp_path, _with_bsam(settings))).cells}
    assert cells["arch=resnet,method=bsam"]["base"] == "adamw"
    assert cells["arch=resnet,method=bsam"]["weight_decay"] == 0.0
    assert cells["arch=vit,method=bsam"]["weight_decay"] == 0.0
    assert (cells["arch=resnet,method=sam"]["base"], cells["arch=resnet,method=sam"]["weight_decay"]) == ("sgd", 5e-4)
    assert "weight_decay" not in cells["arch=vit,method=sam"]  # the others keep the levels' and base's settings
    settings["bsam"]["optimizer.grad_clip"] = 1.0  # a path no level sets: a --set of it the settings would replace
    with pytest.raises(StudyError, match="method_settings.bsam"):
        load_study(write(tmp_path, _with_bsam(settings)), overrides={"optimizer.grad_clip": 0.5})


@pytest.mark.parametrize(
    "settings, expected",
    [
        ({"bsamm": {"optimizer.weight_decay": 0.0}}, "method_settings.'bsamm': not a registered method"),
        ({"bsam": {"optimizer.method": "sam"}}, "method_settings.bsam.optimizer.method: method_settings apply to"),
        ({"bsam": {"delta": 1e-4}}, "method_settings.bsam.delta: a bare knob name is not taken here"),
        ({"bsam": {"optimizer.wd": 0.0}}, "method_settings.bsam.optimizer.wd: not a trial config path"),
        ({"gam": {"optimizer.weight_decay": 0.0}}, "method_settings.gam: applies to no cell"),
    ],
)
def test_bad_method_settings_name_the_field_and_the_fix(tmp_path, settings, expected):
    data = _with_bsam({"bsam": {"optimizer.base": "adamw", "optimizer.weight_decay": 0.0}, **settings})
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, data))
    assert expected in str(err.value) and "Fix:" in str(err.value), str(err.value)


def test_method_settings_may_not_set_what_the_search_samples(tmp_path):
    data = _with_bsam(
        {"bsam": {"optimizer.base": "adamw", "optimizer.weight_decay": 0.0, "optimizer.hparams.rho": 0.02}}
    )
    data["search"] = {"rho": {"type": "loguniform", "low": 0.01, "high": 0.5}}
    with pytest.raises(
        StudyError, match="method_settings.bsam.optimizer.hparams.rho: a level may not set what the search"
    ):
        load_study(write(tmp_path, data))
