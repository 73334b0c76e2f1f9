"""A Tune trial resumes exactly even when the checkpoint Tune's snapshot names was deleted after the snapshot."""

import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

from trainables import fit, load_checkpoint
from trainables.ray_train import tune_trainable

EPOCHS = 8


@pytest.fixture(scope="module")
def config(tiny_model):
    return {
        "model": tiny_model("mixer", embed_dim=32),
        "data": {"name": "digits", "img_size": 16, "batch_size": 128, "augment": "none"},
        "optimizer": {"method": "sam", "base": "sgd", "lr": 0.05, "hparams": {"rho": 0.05}},
        "schedule": {"epochs": EPOCHS, "warmup_epochs": 0},
        "train": {"device": "cpu", "seed": 3, "threads": 1},
    }


class _Stop(Exception):
    pass


def _interrupted(tmp_path: Path, name: str, config: dict):
    """A Tune run stopped as Ctrl-C stops it, part-way: its snapshot names the trial's latest checkpoint."""
    from ray import tune

    # Tune.restore brings the run's callbacks back: a file, not the callback's state, says it has fired.
    fired = tmp_path / f"{name}.interrupted"

    class Interrupt(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            if result["training_iteration"] >= 2 and not fired.exists():
                fired.touch()
                os.kill(os.getpid(), signal.SIGINT)  # Tune's own handler: stop, snapshot, return

    trainable = tune.with_resources(tune_trainable(), {"cpu": 1})
    grid = tune.Tuner(
        trainable,
        param_space={"trial": config},
        tune_config=tune.TuneConfig(num_samples=1),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(tmp_path),
            verbose=0,
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            callbacks=[Interrupt()],
        ),
    ).fit()
    recorded = grid[0]
    assert recorded.metrics["training_iteration"] < EPOCHS, "the trial ended before it could be interrupted"
    return trainable, tmp_path / name, Path(recorded.checkpoint.path)


def _resume(trainable, experiment: Path):
    from ray import tune

    grid = tune.Tuner.restore(str(experiment), trainable=trainable, resume_unfinished=True).fit()
    assert grid.num_errors == 0, grid.errors
    return grid[0]


def _assert_same_weights(checkpoint: Path, reference: dict):
    weights = load_checkpoint(checkpoint)["model"]
    for key, value in reference["model"].items():
        assert torch.equal(weights[key], value), key


@pytest.fixture(scope="module")
def straight(tmp_path_factory, config):
    where = tmp_path_factory.mktemp("straight")
    fit(config, checkpoint_dir=where)
    return load_checkpoint(where)


@pytest.mark.timeout(300)
def test_resume_continues_from_a_newer_checkpoint_than_the_snapshot_names(ray_cluster, tmp_path, straight, config):
    trainable, experiment, recorded = _interrupted(tmp_path, "newer", config)
    epoch = load_checkpoint(recorded)["epoch"]

    # What a driver killed between Tune's checkpoint deletion and its next snapshot leaves: the recorded
    # checkpoint is gone, a later one (here two epochs on, under a later index) is on disk.
    def advance(metrics, saved):
        if metrics["epoch"] == epoch + 2:
            shutil.copytree(saved, recorded.parent / f"checkpoint_{int(recorded.name.split('_')[1]) + 3:06d}")
            raise _Stop

    with pytest.raises(_Stop):
        fit(config, resume_from=recorded, reporter=advance)
    shutil.rmtree(recorded)

    result = _resume(trainable, experiment)
    assert result.metrics["epoch"] == EPOCHS - 1
    # One result per epoch, none missing or counted twice, in Tune's count as in the epochs themselves.
    assert result.metrics["training_iteration"] == EPOCHS
    # The resumed session's results: the rebuilt checkpoint's epoch again, then the rest, one per epoch.
    resumed = result.metrics_dataframe.tail(EPOCHS - (epoch + 2))
    assert list(resumed["epoch"]) == list(range(epoch + 2, EPOCHS))
    assert list(resumed["training_iteration"]) == list(range(epoch + 3, EPOCHS + 1))
    # Tune keeps one checkpoint and no directory the killed driver left behind.
    assert sorted(p.name for p in recorded.parent.glob("checkpoint_*")) == [Path(result.checkpoint.path).name]
    # Interrupted twice and resumed from a rebuilt checkpoint, it trained exactly as a straight run.
    _assert_same_weights(Path(result.checkpoint.path), straight)


@pytest.mark.timeout(300)
def test_resume_without_any_checkpoint_left_starts_the_trial_again(ray_cluster, tmp_path, straight, config):
    trainable, experiment, recorded = _interrupted(tmp_path, "none", config)
    for directory in recorded.parent.glob("checkpoint_*"):
        shutil.rmtree(directory)

    result = _resume(trainable, experiment)
    assert result.metrics["epoch"] == EPOCHS - 1
    assert result.metrics["training_iteration"] == EPOCHS
    _assert_same_weights(Path(result.checkpoint.path), straight)
