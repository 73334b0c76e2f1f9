"""A second run of a study never mixes into the first: refused, or a new launch that analysis keeps apart."""

import optuna
import pytest

from analysis import load_curves, load_runs
from studies.runner import run_study
from studies.spec import StudyError


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_second_run_is_refused_or_a_new_launch_kept_apart(ray_cluster, tmp_path, tracking_uri, tiny_study):
    path = tiny_study(
        tmp_path,
        "twice",
        base={"schedule": {"epochs": 1, "warmup_epochs": 0}},
        factors={"arch": {"mixer": {}}},
        budget={"trials_per_cell": 2, "sampler": "random", "seed": 3},
    )
    first = run_study(path, tracking_uri=tracking_uri)
    assert (first.trials, first.errored) == (2, 0)

    with pytest.raises(StudyError, match=r"already holds launch 1 of this study \(2 trial run\(s\)\).*--new-launch"):
        run_study(path, tracking_uri=tracking_uri)
    assert len(load_runs("twice", tracking_uri=tracking_uri, launch="all")) == 2  # the refusal wrote nothing

    second = run_study(path, tracking_uri=tracking_uri, new_launch=True)
    assert (second.trials, second.errored) == (2, 0)
    every = load_runs("twice", tracking_uri=tracking_uri, launch="all")
    assert sorted(every["launch"]) == [1, 1, 2, 2]
    newest = load_runs("twice", tracking_uri=tracking_uri)
    assert list(newest["launch"]) == [2, 2] and set(newest["run_id"]) == set(every[every.launch == 2]["run_id"])
    assert set(load_runs("twice", tracking_uri=tracking_uri, launch=1)["run_id"]) == set(
        every[every.launch == 1]["run_id"]
    )
    assert set(load_curves("twice", tracking_uri=tracking_uri, metrics=("val_acc",))["launch"]) == {2}

    # Each launch has its own Tune experiment and its own Optuna studies: the second did not resume the first's search.
    assert (tmp_path / "runs" / "twice").is_dir() and (tmp_path / "runs" / "twice-launch2").is_dir()
    for name in ("twice", "twice-launch2"):
        storage = f"sqlite:///{tmp_path / 'runs' / f'{name}.optuna.db'}"
        (summary,) = optuna.get_all_study_summaries(storage)
        assert summary.n_trials == 2
    with pytest.raises(ValueError, match="launch must be 'latest', 'all' or a launch number"):
        load_runs("twice", tracking_uri=tracking_uri, launch=0)
