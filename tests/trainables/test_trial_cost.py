"""No compute on work nobody reads: validation every k-th epoch, one dataset load per trial, refusals that fail once."""

from __future__ import annotations

import math
import pickle
import time

import numpy as np
import pytest
import torch
from PIL import Image

import trainables.data.cifar
import trainables.data.load
import trainables.loop
from trainables import ConfigError, TrialConfig, fit
from trainables.data import fixed_batches, load_dataset
from trainables.errors import TrialRefused
from trainables.metrics import EVERY_EPOCH_METRIC, VALIDATION_METRICS, VALIDATION_SAMPLES
from trainables.tracking import BEST_EPOCH_METRICS


def _config(tiny_model, epochs=2, **train):
    return {
        "model": tiny_model("mixer"),
        "data": {"name": "digits", "img_size": 16, "batch_size": 128},
        "optimizer": {"method": "sam", "lr": 0.003},
        "schedule": {"epochs": epochs, "warmup_epochs": 0},
        "train": {"device": "cpu", "seed": 3, **train},
    }


# --------------------------------------------------------------------------- train.eval_every

VALIDATION_KEYS = (*VALIDATION_METRICS, VALIDATION_SAMPLES, *BEST_EPOCH_METRICS.values(), "best_epoch")


@pytest.mark.parametrize(("epochs", "every", "evaluated"), [(5, 2, {1, 3, 4}), (3, 1, {0, 1, 2}), (3, 7, {2})])
def test_only_the_epochs_eval_every_names_and_the_last_are_evaluated(tiny_model, epochs, every, evaluated):
    seen = []
    final = fit(_config(tiny_model, epochs, eval_every=every), reporter=lambda m, _: seen.append(m))
    assert [m["epoch"] for m in seen] == list(range(epochs))
    for m in seen:
        assert math.isfinite(m[EVERY_EPOCH_METRIC]) and "epoch_time_s" in m
        if m["epoch"] in evaluated:
            assert all(key in m for key in VALIDATION_KEYS), m
        else:  # no stale copy of an earlier evaluation, no best-so-far either
            assert not any(key in m for key in VALIDATION_KEYS), m
    assert final["best_epoch"] in evaluated and final["val_samples"] > 0


def test_eval_every_must_be_a_positive_integer():
    with pytest.raises(ConfigError, match=r"train\.eval_every"):
        TrialConfig.load({"train": {"eval_every": 0}})
    assert TrialConfig().train.eval_every == 1  # the default evaluates every epoch, as before


# --------------------------------------------------------------------------- one load per trial


def _imagefolder(root):
    for split in ("train", "val"):
        for label in ("a", "b"):
            (root / split / label).mkdir(parents=True)
            for i in range(4):
                pixels = torch.randint(0, 256, (20 + i, 24, 3), dtype=torch.uint8).numpy()
                Image.fromarray(pixels).save(root / split / label / f"{i}.png")
    return str(root)


DATA_FORMS = {
    "digits host basic": {"name": "digits", "augment": "basic", "device_resident": False},
    "digits resident basic": {"name": "digits", "augment": "basic", "device_resident": True},
    "digits 16px strong": {"name": "digits", "img_size": 16, "augment": "strong"},
    "cifar10 host basic": {"name": "cifar10", "augment": "basic", "device_resident": False},
    "cifar10 resident basic": {"name": "cifar10", "augment": "basic", "device_resident": True},
    "cifar10 host strong": {"name": "cifar10", "augment": "strong"},
    "cifar10 24px basic": {"name": "cifar10", "img_size": 24, "augment": "basic"},
    "imagefolder basic": {"name": "imagefolder", "img_size": 16, "augment": "basic"},
    "synthetic": {"name": "synthetic", "synthetic_samples": 64},
}


@pytest.mark.parametrize("form", sorted(DATA_FORMS))
def test_the_measurement_set_from_the_trials_own_bundle_equals_a_fresh_unaugmented_load(form, tmp_path, fake_cifar10):
    fields = dict(DATA_FORMS[form])
    if fields["name"] == "cifar10":
        fields["root"] = str(tmp_path)
    elif fields["name"] == "imagefolder":
        fields["root"] = _imagefolder(tmp_path / "folder")
    data = TrialConfig.load({"data": fields}).data
    bundle = load_dataset(data)  # augmented, as the trial trains on it
    if hasattr(bundle.train, "to_device"):
        bundle.train.to_device(torch.device("cpu"))
    samples = min(12, len(bundle.train))
    state = torch.random.get_rng_state()
    mine = fixed_batches(data, samples=samples, batch_size=5, seed=4, bundle=bundle)
    assert torch.equal(torch.random.get_rng_state(), state)  # no augmentation draw: training's stream is untouched
    fresh = fixed_batches(data, samples=samples, batch_size=5, seed=4)
    assert [x.shape[0] for x, _ in mine] == [min(5, samples - s) for s in range(0, samples, 5)]
    for (x, y), (x0, y0) in zip(mine, fresh, strict=True):
        assert x.dtype == torch.float32 and torch.equal(x, x0) and torch.equal(y, y0)


def test_a_trial_with_geometry_loads_its_dataset_once(tiny_model, monkeypatch):
    loads = []
    real = trainables.data.load.load_dataset

    def counted(*args, **kwargs):
        loads.append(args)
        return real(*args, **kwargs)

    # A spy on the one loader: both the loop's call and fixed_batches' would go through it.
    monkeypatch.setattr(trainables.data.load, "load_dataset", counted)
    monkeypatch.setattr(trainables.loop, "load_dataset", counted)
    cfg = {**_config(tiny_model, epochs=1), "geometry": {"measures": ["probe_metric"], "batches": 2, "batch_size": 16}}
    taken = []
    metrics = fit(cfg, probe=lambda model, batches: taken.append(batches) or {"probe_metric": 1.0})
    assert len(loads) == 1 and metrics["probe_metric"] == 1.0
    assert [tuple(x.shape) for x, _ in taken[0]] == [(16, 1, 16, 16)] * 2


# --------------------------------------------------------------------------- refusals


class _RefusingProbe:
    def check(self, model, batches):
        raise ValueError("finite differences on a kinked model (relu)")

    def __call__(self, model, batches):
        raise AssertionError("never measured: refused before training")


REFUSALS = {
    "measurement set larger than the subset": (
        {"data": {"fraction": 0.05, "batch_size": 16}, "geometry": {"measures": ["m"], "batches": 2, "batch_size": 64}},
        r"geometry\.batches x geometry\.batch_size",
    ),
    "model kwargs timm does not take": ({"model": {"kwargs": {"no_such_knob": 3}}}, r"model: .*no_such_knob"),
    "probe check": ({"geometry": {"measures": ["m"], "batches": 1, "batch_size": 8}}, "kinked model"),
}


def test_a_batch_larger_than_a_known_subset_is_refused_at_load_not_in_the_trial(tiny_model):
    # The registry knows digits' training-set size, so the config refuses it before any trial starts; the loop's
    # own check (TrialRefused) stays for datasets whose size is known only once loaded (an image folder).
    cfg = _config(tiny_model, epochs=1)
    cfg["data"] = {**cfg.get("data", {}), "fraction": 0.02, "batch_size": 128}
    with pytest.raises(ConfigError, match=r"data\.batch_size: must not exceed the training-set size"):
        fit(cfg, reporter=lambda m, _: pytest.fail("trained"))


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_settings_only_the_built_trial_can_check_are_refused_before_training(case, tiny_model):
    change, message = REFUSALS[case]
    cfg = _config(tiny_model, epochs=1)
    for section, fields in change.items():
        cfg[section] = {**cfg.get(section, {}), **fields}
        if section == "model":
            cfg["model"]["kwargs"] = {**tiny_model("mixer")["kwargs"], **fields["kwargs"]}
    reported = []
    with pytest.raises(TrialRefused, match=message):
        fit(cfg, probe=_RefusingProbe(), reporter=lambda m, _: reported.append(m))
    assert reported == []  # nothing trained


# --------------------------------------------------------------------------- the dataset read once per process


def test_a_process_reads_the_cifar_files_once_and_again_when_they_change(fake_cifar10, tmp_path, monkeypatch):
    # Tune runs trial after trial in one actor process: the pickles are read once, while they stay the same files.
    reads = []
    real = trainables.data.cifar._read_cifar_batch
    monkeypatch.setattr(trainables.data.cifar, "_CIFAR_CACHE", {})
    monkeypatch.setattr(trainables.data.cifar, "_read_cifar_batch", lambda *a: reads.append(a[1].name) or real(*a))
    first = load_dataset("cifar10", root=tmp_path, augment="basic", device_resident=True)
    assert sorted(reads) == ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5"] + [
        "test_batch"
    ]
    reads.clear()
    again = load_dataset("cifar10", root=tmp_path, augment="none", fraction=0.5)  # another form, the same files
    assert reads == []
    assert torch.equal(again.val[3][0], first.val[3][0]) and again.val[3][1] == first.val[3][1]
    # Shared by every bundle, so read-only: no trial can alter a later one's data.
    _, train_x, train_y, *_ = next(iter(trainables.data.cifar._CIFAR_CACHE.values()))
    assert not train_x.flags.writeable and not train_y.flags.writeable
    # A file written again (another size here) is read again, with its new contents.
    batch = fake_cifar10["folder"] / "test_batch"
    relabelled = trainables.data.cifar._read_pickle("cifar10", batch)
    relabelled = {k.encode(): v for k, v in relabelled.items()}
    relabelled[b"labels"] = [(int(v) + 1) % 10 for v in relabelled[b"labels"]] + [0]
    relabelled[b"data"] = np.concatenate([relabelled[b"data"], relabelled[b"data"][:1]])
    batch.write_bytes(pickle.dumps(relabelled, protocol=2))
    changed = load_dataset("cifar10", root=tmp_path, augment="none")
    assert reads and len(changed.val) == len(first.val) + 1
    assert changed.val[3][1] == (first.val[3][1] + 1) % 10


# --------------------------------------------------------------------------- checkpoint cadence, fixed cost's parts


@pytest.mark.parametrize(("every", "ratio", "saved"), [(1, None, [0, 1, 2, 3]), (3, None, [2, 3]),
                                                       ("auto", 1e9, [0, 3]), ("auto", 0, [0, 1, 2, 3])])  # fmt: skip
def test_checkpoints_follow_checkpoint_every_and_auto_their_own_cost(tiny_model, monkeypatch, every, ratio, saved):
    # 'auto': the first epoch (which measures a checkpoint's cost) and the last always; in between, an epoch ending
    # CHECKPOINT_AUTO_RATIO x that cost after the last one: never at a huge ratio, every epoch at 0.
    if ratio is not None:
        monkeypatch.setattr(trainables.loop, "CHECKPOINT_AUTO_RATIO", ratio)
    seen = []
    fit(_config(tiny_model, epochs=4, checkpoint_every=every), reporter=lambda m, c: seen.append((m["epoch"], c)))
    assert [e for e, c in seen if c is not None] == saved


def test_an_auto_checkpointed_trial_resumes_from_its_last_checkpoint_as_if_uninterrupted(
    tiny_model, monkeypatch, tmp_path
):
    # Fewer checkpoints lose more work to an interruption, never correctness: resumed from the first epoch's
    # checkpoint (the only one before the last), the trial ends where the uninterrupted one did.
    monkeypatch.setattr(trainables.loop, "CHECKPOINT_AUTO_RATIO", 1e9)
    cfg = _config(tiny_model, epochs=3, checkpoint_every="auto")
    whole = fit(cfg)

    class Interrupted(Exception):
        pass

    def interrupt(metrics, checkpoint):
        if metrics["epoch"] == 1:
            raise Interrupted

    with pytest.raises(Interrupted):
        fit(cfg, checkpoint_dir=tmp_path, reporter=interrupt)
    assert trainables.loop.load_checkpoint(tmp_path)["epoch"] == 0  # epoch 1 was not checkpointed
    resumed = fit(cfg, resume_from=tmp_path)
    assert resumed["train_loss"] == whole["train_loss"] and resumed["val_acc"] == whole["val_acc"]
    assert resumed["weight_norm"] == whole["weight_norm"]


def test_checkpoint_every_takes_a_positive_integer_or_auto():
    assert TrialConfig.load({"train": {"checkpoint_every": "auto"}}).train.checkpoint_every == "auto"
    for bad in (0, "sometimes", 1.5):
        with pytest.raises(ConfigError, match=r"train\.checkpoint_every"):
            TrialConfig.load({"train": {"checkpoint_every": bad}})
    assert TrialConfig().train.checkpoint_every == 1  # the library's default: every epoch, as before


def test_a_trials_fixed_time_is_logged_with_its_parts_which_add_up_to_it(tiny_model, tmp_path):
    # The trial function outside Ray: a real SQLite MLflow record, Tune's report replaced by a list.
    from mlflow.tracking import MlflowClient

    from trainables.metrics import EPOCH_TIME, FIXED_PHASES, FIXED_TIME, TRIAL_TIME, fixed_phase_metric
    from trainables.ray_train import _execute, _opened_recorder
    from trainables.tracking import TrackingTarget, tracking_client

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = tracking_client(uri).create_experiment("cost")
    payload = {"tracking": TrackingTarget(uri, experiment).__dict__, "probe": "no.such:probe"}
    cfg = TrialConfig.load(_config(tiny_model, epochs=2))
    started = time.perf_counter()
    timings = {}
    recorder = _opened_recorder(payload, "t1", "t1", cfg, started, timings)
    reported = []

    class Checkpoint:
        from_directory = staticmethod(lambda path: path)

    _execute(
        cfg,
        checkpoint=None,
        sink=lambda metrics, checkpoint: reported.append((metrics, checkpoint)),
        checkpoint_cls=Checkpoint,
        recorder=recorder,
        metric="val_acc",
        probe_from=payload,
        started=started,
        timings=timings,
    )
    metrics = MlflowClient(uri).get_run(recorder.run_id).data.metrics
    parts = {p: metrics[fixed_phase_metric(p)] for p in FIXED_PHASES}
    trained = sum(m[EPOCH_TIME] for m, _ in reported)
    assert metrics[FIXED_TIME] == pytest.approx(metrics[TRIAL_TIME] - trained)
    assert sum(parts.values()) == pytest.approx(metrics[FIXED_TIME])
    measured = ("record_open", "data_load", "model_build", "validation", "checkpoint", "report", "record")
    assert all(parts[p] > 0 for p in measured), parts
    assert parts["compile"] == parts["geometry"] == 0.0  # eager on CPU, no geometry asked for
    assert parts["other"] >= -1e-6
