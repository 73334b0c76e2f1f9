"""Hostile study files of issue 36: each refused with the field, the rule and the fix, never a traceback."""

import os
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


# --- issue 36, item 11: unclear messages made clear ----------------------------------------------------------------


def test_the_smoke_forms_own_batch_is_said_to_be_the_smoke_forms(tmp_path):
    # Before: "data.batch_size: ... got 64. Fix: lower the batch size" where the file's batch fits its data (1,000
    # CIFAR-10 samples): --smoke set 64 on the digits' 30.
    study = {"name": "t", "base": {"data": {"name": "cifar10", "root": "/data/cifar10", "fraction": 0.02}}}
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, study), smoke=True)
    text = str(err.value)
    assert "--smoke set data.batch_size=64, the smoke form's own value" in text
    assert "smoke: {data: {batch_size: VALUE}}" in text
    study["smoke"] = {"data": {"batch_size": 16}}  # the fix it gives
    assert load_study(write(tmp_path, study), smoke=True).cells[0].config["data"]["batch_size"] == 16


def test_a_batch_the_file_itself_sets_is_not_blamed_on_the_smoke_form(tmp_path):
    data = {"name": "cifar10", "root": "/data/cifar10", "fraction": 0.02}
    study = {"name": "t", "base": {"data": data}, "smoke": {"data": {"batch_size": 40}}}
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, study), smoke=True)
    assert "got 40" in str(err.value) and "--smoke set" not in str(err.value)


@pytest.mark.parametrize(
    "field, study_part",
    [
        ("storage", {"storage": "$HOME/runs"}),
        ("optuna_storage", {"optuna_storage": "${SCRATCH}/optuna.db"}),
        ("tracking.uri", {"tracking": {"uri": "sqlite:///${HOME}/mlflow.db"}}),
        ("tracking.artifact_location", {"tracking": {"artifact_location": "$WORK/mlartifacts"}}),
        ("shared_mounts.0", {"shared_mounts": ["$SCRATCH"]}),
        ("data.root", {"base": {"data": {"name": "digits", "root": "${DATA}/cifar10"}}}),
    ],
)
def test_a_shell_variable_in_a_path_is_refused_naming_the_field(tmp_path, field, study_part):
    # Before: taken as written (a directory literally named `$HOME` under the study's folder, a relative mount, a
    # data root that "must exist"), never expanded nor refused.
    study = {"name": "t", "base": {"data": {"name": "digits"}}, **study_part}
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, study))
    text = str(err.value)
    assert f"{field}: a path is used as written" in text and "is a shell variable that is not expanded" in text
    assert "Fix: write the path out" in text


def test_the_home_variables_fix_writes_the_path_out(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", "/home/alice")
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, {"name": "t", "storage": "$HOME/runs"}))
    assert "Fix: write the path out (here: '/home/alice/runs')" in str(err.value)


def test_a_dollar_that_is_no_variable_is_a_plain_path(tmp_path):
    assert load_study(write(tmp_path, {"name": "t", "storage": str(tmp_path / "a$1")})).spec.storage.endswith("a$1")


@pytest.mark.parametrize(
    "study_part, field",
    [
        ({"storage": ""}, "storage"),
        ({"optuna_storage": " "}, "optuna_storage"),
        ({"tracking": {"uri": ""}}, "tracking.uri"),
        ({"shared_mounts": [""]}, "shared_mounts.0"),
    ],
)
def test_an_empty_location_is_refused(tmp_path, study_part, field):
    # Before: storage '' was the study file's own directory, and tracking.uri '' MLflow's default, without a word.
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, {"name": "t", "base": {"data": {"name": "digits"}}, **study_part}))
    assert f"{field}: must name a directory or URI, got the empty text" in str(err.value)


def test_an_empty_storage_override_is_refused(tmp_path):
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, {"name": "t"}), overrides={"storage": ""})
    assert "storage: must name a directory or URI" in str(err.value)


def test_every_independent_problem_of_a_file_is_listed_at_once(tmp_path):
    # Before: the budget's and resources' problems alone; the cell's epochs and the empty storage came one fix later.
    study = {
        "name": "t",
        "budget": {"trials_per_cell": 0},
        "resources": {"cpus_per_trial": -1},
        "storage": "",
        "base": {"data": {"name": "digits"}, "schedule": {"epochs": -1}},
    }
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, study))
    problems = err.value.problems
    assert len(problems) == 4, problems
    for field in ("budget.trials_per_cell", "resources.cpus_per_trial", "storage: must name", "schedule.epochs"):
        assert sum(field in p for p in problems) == 1, (field, problems)


def test_a_cross_field_problem_is_listed_with_the_cells(tmp_path):
    study = {
        "name": "t",
        "base": {"data": {"name": "digits"}, "schedule": {"epochs": 0}, "optimizer": {"method": "sam"}},
        "search": {"rho": {"type": "uniform", "low": 0.5, "high": 0.1}},
    }
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, study))
    text = str(err.value)
    assert "search.rho: low < high must hold" in text and "schedule.epochs" in text


def test_a_broken_cell_defining_field_stops_before_the_cells(tmp_path):
    # A refused factors section would leave cells that are not the file's: their problems are not guessed at.
    study = {"name": "t", "base": {"data": {"name": "digits"}, "schedule": {"epochs": -1}}, "factors": 3}
    with pytest.raises(StudyError) as err:
        load_study(write(tmp_path, study))
    assert [p for p in err.value.problems if p.startswith("factors")] and "schedule.epochs" not in str(err.value)


@pytest.mark.parametrize("text", ["", "\n\n", "# nothing yet\n", "---\n"])
def test_an_empty_study_file_says_so_and_shows_a_minimal_study(tmp_path, text):
    # Before: "top level: must be a mapping of study fields, got NoneType."
    p = tmp_path / "study.yaml"
    p.write_text(text)
    with pytest.raises(StudyError) as err:
        load_study(p)
    message = str(err.value)
    assert "study file: is empty" in message and "NoneType" not in message
    assert "`name: my-study`" in message and "quickstart.yaml" in message
    shipped = Path(message.split("e.g. ", 1)[1].split(")", 1)[0])
    assert shipped.is_file() and load_study(shipped, require_data=False).spec.name


def test_a_list_at_the_top_is_named_as_a_list(tmp_path):
    p = tmp_path / "study.yaml"
    p.write_text("- name: t\n")
    with pytest.raises(StudyError) as err:
        load_study(p)
    assert "got a list" in str(err.value) and "list" in str(err.value) and "quickstart.yaml" in str(err.value)


def test_a_mapping_set_merges_into_the_files(tmp_path):
    # Before: --set budget={seed: 3} replaced the budget, so trials_per_cell and time_limit_s fell back to defaults.
    study = {
        "name": "t",
        "budget": {"trials_per_cell": 3, "time_limit_s": 60},
        "base": {"data": {"name": "digits", "fraction": 0.5}, "optimizer": {"method": "sam"}},
        "search": {"rho": {"type": "loguniform", "low": 0.01, "high": 0.1}},
    }
    loaded = load_study(write(tmp_path, study), overrides={"budget": {"seed": 3}, "data": {"batch_size": 32}})
    assert (loaded.spec.budget.trials_per_cell, loaded.spec.budget.time_limit_s, loaded.spec.budget.seed) == (3, 60, 3)
    assert loaded.cells[0].config["data"] == {"name": "digits", "fraction": 0.5, "batch_size": 32}
    cleared = load_study(write(tmp_path, study), overrides={"budget.time_limit_s": None})
    assert cleared.spec.budget.time_limit_s is None and cleared.spec.budget.trials_per_cell == 3


def test_model_kwargs_set_as_a_mapping_replace_the_files_whole(tmp_path):
    study = {"name": "t", "base": {"data": {"name": "digits"}, "model": {"kwargs": {"depth": 2, "embed_dim": 32}}}}
    loaded = load_study(write(tmp_path, study), overrides={"model.kwargs": {"depth": 1}})
    assert loaded.cells[0].config["model"]["kwargs"] == {"depth": 1}


def test_a_directory_is_named_a_directory(tmp_path):
    # Before: "study file: does not exist".
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "mine.yaml").write_text("name: t\n")
    with pytest.raises(StudyError) as err:
        load_study(tmp_path / "runs")
    text = str(err.value)
    assert "is a directory, not a study file" in text and "does not exist" not in text
    assert f"e.g. {tmp_path / 'runs' / 'mine.yaml'}" in text


def test_a_fifo_is_named_and_never_opened(tmp_path):
    # Before: "does not exist". Opening a FIFO for reading blocks until a writer comes: the test would hang.
    fifo = tmp_path / "study.yaml"
    os.mkfifo(fifo)
    with pytest.raises(StudyError) as err:
        load_study(fifo)
    assert "is a named pipe (FIFO), not a regular file" in str(err.value) and "does not exist" not in str(err.value)


def test_a_missing_file_still_says_it_does_not_exist(tmp_path):
    with pytest.raises(StudyError) as err:
        load_study(tmp_path / "nope.yaml")
    assert "study file: does not exist" in str(err.value)
