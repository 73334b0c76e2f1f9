"""A trial's per-image correctness: packed and read back bit for bit, aligned across runs, recorded by fit and MLflow."""

import json

import numpy as np
import pytest

from trainables import fit, load_checkpoint
from trainables.scored import ScoredImages, images_digest


def test_the_bits_round_trip_at_every_length_and_stay_compact():
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 8, 9, 4999, 5000, 50000):
        correct = rng.random(n) < 0.9
        scored = ScoredImages.of(correct, dataset="cifar10", split="test", positions=np.arange(n), labels=np.zeros(n))
        back = ScoredImages.from_text(scored.to_text())
        assert back.digest == scored.digest and back.correct.dtype == bool
        np.testing.assert_array_equal(back.correct, correct)
    five = ScoredImages.of(
        np.ones(5000), dataset="cifar10", split="test", positions=np.arange(5000), labels=np.ones(5000)
    )
    assert len(five.to_text()) < 900  # one tag, no chunks: 625 bytes of bits


def test_the_digest_tells_apart_what_would_misalign_two_vectors():
    pos, labels = np.arange(10), np.arange(10) % 3
    same = images_digest("cifar10", "test", pos, labels)
    assert images_digest("cifar10", "test", pos.copy(), labels.copy()) == same
    assert images_digest("cifar10", "selection", pos, labels) != same
    assert images_digest("cifar100", "test", pos, labels) != same
    assert images_digest("cifar10", "test", pos[::-1], labels[::-1]) != same  # the same images in another order
    assert images_digest("cifar10", "test", pos, np.roll(labels, 1)) != same  # another version of the dataset


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{}",
        json.dumps({"format": 2, "n": 1, "digest": "x", "bits": "gA=="}),
        json.dumps({"format": 1, "n": 20, "digest": "x", "bits": "gA=="}),  # 1 byte for 20 images: torn
        json.dumps({"format": 1, "n": 1, "digest": "x", "bits": "not base64!"}),
    ],
)
def test_a_record_that_is_not_one_is_refused(text):
    with pytest.raises(ValueError):
        ScoredImages.from_text(text)


class _Scored:
    """A recorder that keeps what fit hands it, the scored images included."""

    wants_checkpoint = False

    def __init__(self):
        self.epochs, self.scored = [], []

    def log_epoch(self, metrics, epoch, timestamp_ms):
        self.epochs.append(epoch)

    def log_artifact(self, path, artifact_path=None):
        raise AssertionError("no artifact wanted")

    def log_scored(self, text):
        self.scored.append(ScoredImages.from_text(text))


def _trial(tiny_model, seed: int, split: str = "test", epochs: int = 2) -> dict:
    return {
        "model": tiny_model("mixer"),
        "data": {"name": "digits", "img_size": 16, "batch_size": 128, "eval_split": split, "eval_batch_size": 50},
        "optimizer": {"method": "none", "lr": 0.003},
        "schedule": {"epochs": epochs, "warmup_epochs": 0},
        "train": {"device": "cpu", "seed": seed},
    }


def test_fit_records_the_final_evaluation_image_by_image(tiny_model, tmp_path):
    """Once, at the last epoch: its bits' mean is the reported val_acc, one bit per scored image; two seeds scored on
    the same split share the digest, the other split does not; a trial resumed at its end records it again."""
    records = {}
    for seed, split in ((1, "test"), (2, "test"), (1, "selection")):
        rec = _Scored()
        ckpt = tmp_path / f"{seed}-{split}"
        metrics = fit(_trial(tiny_model, seed, split), recorder=rec, checkpoint_dir=ckpt)
        assert rec.epochs == [0, 1] and len(rec.scored) == 1
        (scored,) = rec.scored
        assert len(scored.correct) == metrics["val_samples"]
        assert scored.correct.sum() == round(metrics["val_acc"] * metrics["val_samples"])
        records[(seed, split)] = (scored, ckpt)
    (a, ckpt), (b, _), (other, _) = records[(1, "test")], records[(2, "test")], records[(1, "selection")]
    assert a.digest == b.digest != other.digest
    assert not np.array_equal(a.correct, b.correct)  # two models: the bits are each run's own

    again = _Scored()
    assert load_checkpoint(ckpt)["scored"] == a.to_text()
    fit(_trial(tiny_model, 1), recorder=again, resume_from=ckpt)
    assert again.epochs == [1] and [s.to_text() for s in again.scored] == [a.to_text()]


def test_a_recorder_without_log_scored_still_records_the_trial(tiny_model):
    class Plain(_Scored):
        log_scored = None

    rec = Plain()
    fit(_trial(tiny_model, 1, epochs=1), recorder=rec)
    assert rec.epochs == [0]


def test_the_record_goes_through_mlflow_tags_and_back(tmp_path):
    from mlflow.tracking import MlflowClient

    from trainables.tracking import TrackingTarget, TrialRecorder, scored_from_tags

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rec = TrialRecorder(TrackingTarget(uri, "0"), trial_key="k", run_name="k", params={})
    rng = np.random.default_rng(1)
    # 60,000 images (an ImageNet-sized split) take more than one tag: chunked and joined again.
    for n in (5000, 60000):
        scored = ScoredImages.of(
            rng.random(n) < 0.8, dataset="x", split="test", positions=np.arange(n), labels=np.zeros(n)
        )
        rec.log_scored(scored.to_text())
        (run,) = MlflowClient(uri).search_runs(["0"])
        back = ScoredImages.from_text(scored_from_tags(run.data.tags))
        np.testing.assert_array_equal(back.correct, scored.correct)
    assert scored_from_tags({}) is None


def test_a_reopened_run_never_reads_an_earlier_attempts_chunks(tmp_path):
    # A trial retried or restarted reopens its run (same trial key). Its earlier attempt's record, three tags long,
    # must neither lend its tail to this attempt's shorter record nor pass as this attempt's when it writes none.
    from mlflow.tracking import MlflowClient

    from trainables.naming import SCORED_TAG
    from trainables.tracking import TrackingTarget, TrialRecorder, scored_from_tags

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rng = np.random.default_rng(2)

    def record(n):
        return ScoredImages.of(
            rng.random(n) < 0.7, dataset="x", split="test", positions=np.arange(n), labels=np.zeros(n)
        ).to_text()

    def tags():
        (run,) = MlflowClient(uri).search_runs(["0"])
        return run.data.tags

    long, short = record(120000), record(5000)
    first = TrialRecorder(TrackingTarget(uri, "0"), trial_key="k", run_name="k", params={})
    first.log_scored(long)
    assert scored_from_tags(tags()) == long and f"{SCORED_TAG}.3" in tags()
    again = TrialRecorder(TrackingTarget(uri, "0"), trial_key="k", run_name="k", params={})
    assert again.run_id == first.run_id
    assert scored_from_tags(tags()) is None  # this attempt has not evaluated yet
    again.log_scored(short)
    assert scored_from_tags(tags()) == short
    # Within one attempt too: a record written over a longer one keeps none of its chunks.
    third = TrialRecorder(TrackingTarget(uri, "0"), trial_key="k", run_name="k", params={})
    third.log_scored(long)
    third.log_scored(short)
    assert scored_from_tags(tags()) == short
