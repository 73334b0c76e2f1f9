"""The confirm stage (studies/confirm.py): its study-file section, the searcher's choice and fresh-seed trials (on real
Optuna storage, through a pickled restore as Tune's resume does it), and a tiny study end to end on a real local Ray
cluster into a real SQLite MLflow store, read back by the report's comparison."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import yaml
from ray.tune.search import Searcher

from studies.search import CellSearcher
from studies.spec import Cell, LogUniform, StudyError, load_study
from trainables.data import eval_positions

RHO = "optimizer.hparams.rho"
SPACE = {RHO: LogUniform(type="loguniform", low=0.01, high=1.0)}


def _study_dict(tmp_path: Path, tiny: dict, **extra) -> dict:
    study = {
        "name": "confirm_tiny",
        "base": {
            "data": {"name": "digits", "img_size": 8, "batch_size": 128, "augment": "none"},
            "model": tiny,
            "optimizer": {"base": "sgd", "lr": 0.05},
            "schedule": {"epochs": 1, "warmup_epochs": 0},
            "train": {"device": "cpu", "threads": 1, "seed": 0},
        },
        "factors": {"method": {"vanilla": {"optimizer.method": "none"}, "sam": {"optimizer.method": "sam"}}},
        "search": {"rho": {"type": "loguniform", "low": 0.01, "high": 0.5}},
        "budget": {"trials_per_cell": 2, "sampler": "random"},
        "confirm": {"seeds": 2},
        "resources": {"cpus_per_trial": 1, "max_concurrent_trials": 2, "max_failures": 0},
        "storage": str(tmp_path / "runs"),
        "tracking": {"artifact_location": str(tmp_path / "mlartifacts")},
    }
    study.update(extra)
    return study


def _write(tmp_path: Path, study: dict) -> Path:
    path = tmp_path / f"{study['name']}.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


# ------------------------------------------------------------------------------------------------ the study file


def test_expansion_plans_search_then_confirm_trials(tmp_path, tiny_model):
    study = load_study(_write(tmp_path, _study_dict(tmp_path, tiny_model("resnet"))))
    cells = {c.levels["method"]: c for c in study.cells}
    # Nothing to choose in the vanilla cell: its confirm seeds are all its trials; SAM searches, then confirms.
    assert (cells["vanilla"].trials, cells["vanilla"].confirm) == (0, 2)
    assert (cells["sam"].trials, cells["sam"].confirm) == (2, 2)
    assert study.total_trials == 6
    # The search scores on the selection half; the confirm trials on the other (studies.confirm.confirm_config).
    assert {c.config["data"]["eval_split"] for c in study.cells} == {"selection"}
    assert study.spec.confirm.seed_list == [1000, 1001]


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"confirm": {"seeds": 2, "seed_start": 0}}, "confirm.seed_start: the confirm seeds 0..1 must be fresh"),
        ({"factors": {"train.seed": [0, 1]}}, "factors.train.seed: with a confirm stage"),
        ({"budget": {"trials_per_cell": 2, "asha": {}}}, "confirm: a confirm stage needs every confirm trial"),
        ({"confirm": {"seeds": 0}}, "confirm.seeds"),
        (
            {
                "confirm": {"seeds": 2, "subsets": "per_seed"},
                "search": {"data.fraction_seed": {"type": "int", "low": 0, "high": 3}},
            },
            "search.data.fraction_seed: confirm.subsets 'per_seed' sets each confirm run's subset to its seed",
        ),
        ({"confirm": {"seeds": 2, "subsets": "each"}}, "confirm.subsets"),
    ],
)
def test_a_confirm_stage_it_cannot_run_is_refused_naming_the_field(tmp_path, tiny_model, change, expected):
    study = _study_dict(tmp_path, tiny_model("resnet"))
    study.update(change)
    with pytest.raises(StudyError) as err:
        load_study(_write(tmp_path, study))
    assert expected in str(err.value)


def test_a_hand_set_eval_split_is_refused_with_a_confirm_stage(tmp_path, tiny_model):
    study = _study_dict(tmp_path, tiny_model("resnet"))
    study["base"]["data"]["eval_split"] = "all"
    with pytest.raises(StudyError, match="data.eval_split is set"):
        load_study(_write(tmp_path, study))


@pytest.mark.parametrize("subsets", ["fixed", "per_seed"])
def test_a_confirm_run_trains_on_the_subset_its_subsets_rule_names(tmp_path, tiny_model, subsets):
    from studies.confirm import confirm_config

    study = _study_dict(tmp_path, tiny_model("resnet"), confirm={"seeds": 2, "subsets": subsets})
    study["base"]["data"].update(fraction=0.5, fraction_seed=7)
    spec = load_study(_write(tmp_path, study))
    assert spec.spec.confirm.subsets == subsets
    cell = next(c for c in spec.cells if c.levels["method"] == "sam")
    trees = [confirm_config(cell, {RHO: 0.1}, seed, spec.spec.confirm.subsets) for seed in spec.spec.confirm.seed_list]
    # fixed: the cell's own subset for every seed (the default, today's behaviour); per_seed: seed s trains on
    # subset s, so two cells at one seed share a subset and still pair.
    expected = [7, 7] if subsets == "fixed" else [1000, 1001]
    assert [t["data"]["fraction_seed"] for t in trees] == expected
    assert [t["train"]["seed"] for t in trees] == [1000, 1001] and cell.config["data"]["fraction_seed"] == 7


@pytest.mark.parametrize("n", [1, 2, 359, 360, 10_000])
def test_the_evaluation_halves_are_disjoint_fixed_and_cover_the_validation_set(n):
    selection, test = eval_positions(n, "selection"), eval_positions(n, "test")
    assert not set(selection) & set(test)
    assert sorted([*selection, *test]) == list(range(n)) == list(eval_positions(n, "all"))
    assert len(test) - len(selection) in (0, 1)
    assert list(eval_positions(n, "test")) == list(test)  # the same for every trial


# ------------------------------------------------------------------------------------------------ the searcher


def _payload(cell, sample, confirm=None):  # module level: the searcher must pickle as Tune pickles it
    return {"cell": cell.key, "sample": dict(sample), "confirm": confirm}


def _searcher(tmp_path, *, seeds=(1000, 1001)):
    cells = [
        Cell(key="method=vanilla", levels={"method": "vanilla"}, config={}, space={}, trials=0, confirm=len(seeds)),
        Cell(key="method=sam", levels={"method": "sam"}, config={}, space=SPACE, trials=3, confirm=len(seeds)),
    ]
    return CellSearcher(
        cells,
        metric="val_acc",
        mode="max",
        sampler="random",
        seed=0,
        storage_url=f"journal://{tmp_path / 'optuna.log'}",
        study_name="c",
        payload=_payload,
        confirm_seeds={c.key: list(seeds) for c in cells},
    )


def test_confirm_trials_repeat_the_best_search_trial_with_fresh_seeds(tmp_path):
    searcher = _searcher(tmp_path)
    search = [searcher.suggest(f"s{i}") for i in range(3)]
    assert all(p["confirm"] is None for p in search)
    # The vanilla cell has nothing to choose: its confirm trials go out at once, while SAM's search runs.
    first = [searcher.suggest(f"c{i}") for i in range(2)]
    assert [(p["cell"], p["confirm"]) for p in first] == [
        ("method=vanilla", (1000, None)),
        ("method=vanilla", (1001, None)),
    ]
    assert searcher.suggest("wait") is None  # SAM has not chosen: ask again later, not FINISHED
    searcher.on_trial_complete("s0", {"val_acc": 0.5})
    searcher.on_trial_complete("s1", {"val_acc": 0.9})
    assert searcher.suggest("wait") is None
    searcher.on_trial_complete("s2", {"val_acc": math.nan, "diverged": True})  # failed: never chosen
    sam = [searcher.suggest(f"c{i}") for i in range(2, 4)]
    assert [p["confirm"][0] for p in sam] == [1000, 1001]
    assert all(p["sample"] == search[1]["sample"] for p in sam)  # the best search trial's rho
    assert all(p["confirm"][1] == search[1]["run_name"] for p in sam)
    # A confirm trial's result chooses nothing and reaches no Optuna study.
    searcher.on_trial_complete("c2", {"val_acc": 0.99})
    assert searcher.suggest("done") is Searcher.FINISHED


def test_a_tie_confirms_the_trial_that_started_first_as_the_report_calls_best(tmp_path):
    # analysis.runs.BEST_RULE breaks a tie by start order; the confirm stage must repeat that same trial, not the
    # one that happened to end first (the report would name one rho and confirm another).
    searcher = _searcher(tmp_path, seeds=(1000,))
    search = [searcher.suggest(f"s{i}") for i in range(3)]
    searcher.suggest("v")  # the vanilla confirm trial
    searcher.on_trial_complete("s2", {"val_acc": 0.9})  # started last, ends first
    searcher.on_trial_complete("s1", {"val_acc": 0.9})
    searcher.on_trial_complete("s0", {"val_acc": 0.5})
    (confirm,) = [searcher.suggest("c0")]
    assert confirm["sample"] == search[1]["sample"] and confirm["confirm"][1] == search[1]["run_name"]


def test_a_cell_whose_every_search_trial_failed_has_no_confirm_trials(tmp_path):
    searcher = _searcher(tmp_path, seeds=(1000,))
    for i in range(3):
        searcher.suggest(f"s{i}")
    searcher.suggest("v")  # the vanilla confirm trial
    for i in range(3):
        searcher.on_trial_complete(f"s{i}", {"val_acc": math.nan, "diverged": True})
    assert searcher.suggest("x") is Searcher.FINISHED
    assert searcher.unconfirmed() == ["method=sam"]


def test_resume_keeps_the_choice_and_never_reissues_a_snapshotted_confirm_trial(tmp_path):
    searcher = _searcher(tmp_path)
    search = [searcher.suggest(f"s{i}") for i in range(3)]
    for i, value in enumerate((0.4, 0.8, 0.6)):
        searcher.on_trial_complete(f"s{i}", {"val_acc": value})
    issued = [searcher.suggest(f"c{i}") for i in range(3)]  # vanilla 1000, 1001, then SAM 1000
    snapshot = tmp_path / "searcher.pkl"
    searcher.save(str(snapshot))
    # `resume`: Tune unpickles the searcher and restores its last snapshot; the interrupted confirm trial c2
    # continues as the same Tune trial (Tune's own record), so only SAM's seed 1001 is left to issue.
    restored = pickle.loads(pickle.dumps(searcher))
    restored.restore(str(snapshot))
    nxt = restored.suggest("c3")
    assert nxt["confirm"][0] == 1001 and nxt["sample"] == search[1]["sample"] == issued[2]["sample"]
    assert restored.suggest("c4") is Searcher.FINISHED


def test_resume_from_a_snapshot_before_the_choice_chooses_when_the_search_trials_end_again(tmp_path):
    searcher = _searcher(tmp_path)
    search = [searcher.suggest(f"s{i}") for i in range(3)]
    searcher.on_trial_complete("s0", {"val_acc": 0.4})
    snapshot = tmp_path / "early.pkl"
    searcher.save(str(snapshot))  # s1 and s2 were running: Tune resumes them from their checkpoints
    restored = pickle.loads(pickle.dumps(searcher))
    restored.restore(str(snapshot))
    [restored.suggest(f"v{i}") for i in range(2)]  # vanilla's confirm trials (lost after the snapshot: issued again)
    assert restored.suggest("wait") is None
    restored.on_trial_complete("s1", {"val_acc": 0.3})
    restored.on_trial_complete("s2", {"val_acc": 0.7})
    assert restored.suggest("c0")["sample"] == search[2]["sample"]


# ------------------------------------------------------------------------------------------------ end to end


@pytest.mark.timeout(900)
def test_a_study_with_a_confirm_stage_end_to_end(ray_cluster, tmp_path, tracking_uri, tiny_model, capsys):
    from mlflow.tracking import MlflowClient

    from analysis import load_runs, split_stages
    from studies.cli import main
    from trainables.data import load_dataset
    from trainables.naming import CHOSEN_FROM_TAG, STAGE_TAG

    # One subset per confirm seed (confirm.subsets: per_seed), the search keeps subset 0: at fraction 1 every subset
    # is the whole set, so the runs are today's, and the recorded fraction_seed shows the rule reached them.
    study = _study_dict(tmp_path, tiny_model("resnet"), confirm={"seeds": 2, "subsets": "per_seed"})
    path = _write(tmp_path, study)
    assert main(["run", str(path), "--tracking-uri", tracking_uri]) == 0
    assert "6 trials in" in capsys.readouterr().out

    runs = load_runs(path, tracking_uri=tracking_uri)
    assert len(runs) == 6 and set(runs["status"]) == {"finished"} and set(runs["mlflow_status"]) == {"FINISHED"}
    search, confirm = split_stages(runs)
    assert len(search) == 2 and set(search["factor.method"]) == {"sam"}
    assert set(search["data.eval_split"]) == {"selection"} and set(search["train.seed"]) == {0}
    # Fresh seeds, one trial each per cell, scored on the held-out half.
    assert sorted(confirm["train.seed"]) == [1000, 1000, 1001, 1001]
    assert set(confirm["data.eval_split"]) == {"test"}
    assert set(search["data.fraction_seed"]) == {0}
    assert (confirm["data.fraction_seed"] == confirm["train.seed"]).all()
    n_val = len(load_dataset("digits", img_size=8).val)
    assert set(search["val_samples"]) == {n_val // 2} and set(confirm["val_samples"]) == {n_val - n_val // 2}
    # SAM's confirm runs repeat the best search trial's rho, and name that trial.
    best = search.loc[search["val_acc"].idxmax()]
    sam = confirm[confirm["factor.method"] == "sam"]
    assert (sam["optimizer.hparams.rho"] == best["optimizer.hparams.rho"]).all()
    client = MlflowClient(tracking_uri)
    best_name = client.get_run(best["run_id"]).info.run_name
    for run_id in confirm["run_id"]:
        tags = client.get_run(run_id).data.tags
        assert tags[STAGE_TAG] == "confirm"
        assert tags.get(CHOSEN_FROM_TAG) == (best_name if run_id in set(sam["run_id"]) else None)

    # The report compares the cells on the confirm runs alone, and says so.
    out = tmp_path / "report"
    assert main(["report", str(path), "--tracking-uri", tracking_uri, "--out", str(out)]) == 0
    gain_csv = next(out.glob("gain_*.csv"))
    import pandas as pd

    gain = pd.read_csv(gain_csv)
    vanilla = confirm[confirm["factor.method"] == "vanilla"]
    assert gain["n_pairs"].tolist() == [2]
    assert np.isclose(gain["baseline"].iloc[0], vanilla["val_acc"].mean())
    assert np.isclose(gain["treatment"].iloc[0], sam["val_acc"].mean())
    assert "Numbers from: confirm runs" in next(out.glob("gain_*.md")).read_text()
    assert "Cells are compared on: confirm runs" in (out / "report.md").read_text()
    # Each confirm seed drew its own subset: no statement in the report says its intervals are given one subset.
    said = (out / "report.md").read_text()
    assert "each confirm seed trained on its own training subset" in said and "given the training subset" not in said
    assert "selection half" in (out / "summary.md").read_text()
    assert (out / "confirm.csv").exists()


# ------------------------------------------------------------------------------------------------ the report's reading


def _frames():
    from benchmarks import sim_selection as sim

    return sim.simulate_runs("confirm", np.random.default_rng(0), seeds=3)


def test_the_report_compares_confirm_runs_and_names_their_data():
    from analysis import confirm_summary, measured_on, split_stages, unconfirmed_cells

    runs = _frames()
    search, confirm = split_stages(runs)
    assert "confirm runs" in measured_on(confirm) and "held-out test half" in measured_on(confirm)
    assert "selection half" in measured_on(search)
    legacy = search.assign(**{"data.eval_split": "all"}).drop(columns=["stage"])
    assert "biased upwards by the choice" in measured_on(legacy)
    assert split_stages(legacy)[1].empty  # recorded before stages: every trial is a search trial
    # Each confirm run is its own replicate: no "best of a cell" reading can pick among its seeds.
    assert confirm["cell"].nunique() == len(confirm)
    table = confirm_summary(confirm, metric="val_acc")
    assert set(table["n seeds"]) == {3} and set(table["seeds"]) == {"1000, 1001, 1002"}
    sam = confirm[confirm["factor.method"] == "sam"]
    first = sam[sam["data.fraction"] == 0.05]
    row = table.loc[("0.05", "resnet", "sam")]
    assert np.isclose(row["mean val_acc"], first["val_acc"].mean())
    assert row["chosen rho"] == first["optimizer.hparams.rho"].iloc[0]
    # A cell whose confirm stage did not finish is named, not silently dropped.
    assert unconfirmed_cells(search, confirm) == []
    cut = confirm.assign(
        status=np.where(confirm["cell"].str.startswith("data.fraction=0.05,"), "interrupted", "finished")
    )
    assert unconfirmed_cells(search, cut) == [
        "data.fraction=0.05,arch=resnet,method=sam",
        "data.fraction=0.05,arch=resnet,method=vanilla",
    ]
