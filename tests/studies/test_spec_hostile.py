"""Hostile study files of issue 36: each refused with the field, the rule and the fix, never a traceback."""

from pathlib import Path

import pytest
import yaml

from studies.spec import StudyError, load_study


def write(tmp_path: Path, data) -> Path:
    p = tmp_path / "study.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


@pytest.mark.parametrize(
    "factors, shown",
    [({"optimizer": ["sam", 0.003]}, "'sam'"), ({"f": {"a": {"optimizer": 5}}}, "got 5")],
    ids=["list-factor-on-a-section", "scalar-level-on-a-section"],
)
def test_a_level_setting_a_section_to_a_value_is_refused_not_crashed(tmp_path, factors, shown):
    # Before: AttributeError ('str'/'int' object has no attribute 'get') inside expand.
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, {"name": "t", "base": {"data": {"name": "digits"}}, "factors": factors}))
    text = str(err.value)
    assert "optimizer: Input should be a valid dictionary" in text and shown in text


def test_level_names_that_join_into_one_cell_key_are_refused(tmp_path):
    # Before: (a=x, b=y,b=z) and (a=x,b=y, b=z) both keyed "a=x,b=y,b=z": 4 cells planned, 3 run.
    factors = {
        "a": {"x": {"train.seed": 1}, "x,b=y": {"train.seed": 2}},
        "b": {"y,b=z": {"data.fraction": 0.5}, "z": {"data.fraction": 0.25}},
    }
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, {"name": "t", "base": {"data": {"name": "digits"}}, "factors": factors}))
    text = str(err.value)
    assert "cell keys must be distinct" in text and "'a=x,b=y,b=z'" in text and "Fix: rename" in text


def test_two_levels_giving_one_config_are_refused_naming_both(tmp_path):
    study = {"name": "t", "base": {"data": {"name": "digits"}}, "factors": {"data.fraction": [1, 1.0, 0.5]}}
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, study))
    text = str(err.value)
    assert "cells data.fraction=1 and data.fraction=1.0 resolve to the same config" in text
    assert "Fix: drop one" in text


@pytest.mark.parametrize(
    "level", [{"rho": 0.5}, {"optimizer.hparams.rho": 0.5}, {"optimizer": {"hparams": {"rho": 0.5}}}]
)
def test_a_level_setting_a_searched_knob_is_refused(tmp_path, level):
    # Before: validated, and every trial ran the searched rho, never the level's 0.5.
    study = {
        "name": "t",
        "base": {"data": {"name": "digits"}, "optimizer": {"method": "sam"}},
        "factors": {"f": {"big": level, "plain": {}}},
        "search": {"rho": {"type": "loguniform", "low": 0.01, "high": 0.1}},
    }
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, study))
    text = str(err.value)
    assert "a level may not set what the search samples" in text and "optimizer.hparams.rho (0.5)" in text
    assert "search.rho" in text and "Fix: drop it from the level" in text


def test_resources_finer_than_ray_places_are_refused_together(tmp_path):
    # Before: validated, then Ray refused each trial's request after it started (tracebacks, a trial RUNNING).
    study = {
        "name": "t",
        "base": {"data": {"name": "digits"}},
        "resources": {"cpus_per_trial": 1.0e-9, "gpus_per_trial": 1.0e-9, "custom": {"node_a": 1.0e-9}},
    }
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, study))
    text = str(err.value)
    for field in ("resources.cpus_per_trial", "resources.gpus_per_trial", "resources.custom.node_a"):
        assert f"{field}: a resource Ray can place is 0 or at least 0.0001" in text
    assert "got 1e-09" in text and "Fix: ask for e.g. 0.01" in text


def test_the_smallest_ray_unit_is_accepted(tmp_path):
    study = {"name": "t", "base": {"data": {"name": "digits"}}, "resources": {"cpus_per_trial": 0.0001}}
    assert load_study(write(tmp_path, study)).spec.resources.cpus_per_trial == 0.0001


MERGE_LIST = """\
name: t
defaults:
  short: &short {lr: 0.1, epochs: 2}
  long: &long {lr: 0.5, epochs: 9, weight_decay: 0.001}
base:
  data: {name: digits}
  optimizer:
    <<: [*short, *long]
"""


def test_a_merge_list_lets_the_first_map_win(tmp_path):
    # Before: PyYAML de-duplicated merged keys by object identity, so the last map's lr (0.5) won; YAML's merge
    # rule says the first listed map wins.
    from studies.spec._yaml import parse_yaml

    tree = parse_yaml(MERGE_LIST, "study.yaml")
    assert tree["base"]["optimizer"] == {"lr": 0.1, "epochs": 2, "weight_decay": 0.001}
    own = parse_yaml("a: &a {lr: 0.1}\nb: &b {lr: 0.5}\nc: {<<: [*a, *b], lr: 0.7}\n", "study.yaml")
    assert own["c"] == {"lr": 0.7}  # the mapping's own key wins over every merged one


def test_two_merge_keys_are_refused_with_a_form_that_reads_as_said():
    from studies.spec._yaml import parse_yaml

    text = "a: &a {lr: 0.1}\nb: &b {lr: 0.5}\nc:\n  <<: *a\n  <<: *b\n"
    with pytest.raises(ValueError) as err:
        parse_yaml(text, "study.yaml")
    message = str(err.value)
    assert "`<<: [*a, *b]` (where two of them set one key, the first listed wins)" in message
    recommended = parse_yaml("a: &a {lr: 0.1}\nb: &b {lr: 0.5}\nc: {<<: [*a, *b]}\n", "study.yaml")
    assert recommended["c"] == {"lr": 0.1}


def test_a_shared_key_is_reported_with_the_cells_own_problems(tmp_path):
    factors = {"a": {"x": {"train.seed": 1}, "x,b=y": {"train.seed": 2}}, "b": {"y,b=z": {}, "z": {"data.fraction": 2}}}
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, {"name": "t", "base": {"data": {"name": "digits"}}, "factors": factors}))
    assert "cell keys must be distinct" in str(err.value) and "data.fraction" in str(err.value)
