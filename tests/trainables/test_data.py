"""Tests for trainables.data (the bundle, seeds and dataset modules): fraction subsets, index semantics, dataset layouts and their errors."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from trainables.data import DatasetError, fraction_indices, load_dataset

DIGITS_TOTAL = 1797  # scikit-learn's load_digits


# --------------------------------------------------------------------------- fake data on disk


def _write_fake_imagefolder(root: Path, classes: dict[str, tuple[str, ...]], per_class: int = 3) -> Path:
    """Write `root/<split>/<class>/<i>.png|jpg` small RGB images; `classes` maps split -> class names."""
    rng = np.random.default_rng(0)
    for split, names in classes.items():
        for name in names:
            d = root / split / name
            d.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, size=(30 + i, 40, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(d / f"{i}.{'png' if i % 2 else 'jpg'}")
    return root


def _unnormalise(x: torch.Tensor, mean, std) -> torch.Tensor:
    return x * torch.tensor(std).view(-1, 1, 1) + torch.tensor(mean).view(-1, 1, 1)


# --------------------------------------------------------------------------- fraction_indices


def test_fraction_is_stratified_with_rounding_and_one_per_class():
    labels = np.repeat([0, 1, 2, 3], [10, 20, 35, 3])
    picked = fraction_indices(labels, 0.25, seed=0)
    counts = np.bincount(labels[picked], minlength=4)
    # round(2.5)=3 (half up), 5, round(8.75)=9, round(0.75)=1
    assert counts.tolist() == [3, 5, 9, 1]
    tiny = fraction_indices(labels, 0.01, seed=0)
    assert np.bincount(labels[tiny], minlength=4).tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_fractions_are_nested_for_one_seed(seed):
    labels = np.random.default_rng(3).integers(0, 7, size=500)
    subsets = [set(fraction_indices(labels, f, seed).tolist()) for f in (0.1, 0.25, 0.5, 1.0)]
    for small, large in zip(subsets, subsets[1:]):
        assert small < large
    assert subsets[-1] == set(range(500))


def test_fractions_are_seeded_sorted_int64():
    labels = np.random.default_rng(4).integers(0, 5, size=300)
    a = fraction_indices(labels, 0.3, seed=5)
    assert a.dtype == np.int64
    assert np.all(np.diff(a) > 0)
    np.testing.assert_array_equal(a, fraction_indices(list(labels), 0.3, seed=5))
    np.testing.assert_array_equal(a, fraction_indices(torch.from_numpy(labels), 0.3, seed=5))
    assert not np.array_equal(a, fraction_indices(labels, 0.3, seed=6))
    np.testing.assert_array_equal(fraction_indices(labels, 1.0, seed=9), np.arange(300))


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.5, math.nan, math.inf, "0.5", True, None])
def test_bad_fraction_is_rejected_naming_field_rule_and_value(bad):
    with pytest.raises(DatasetError) as info:
        fraction_indices(np.array([0, 1, 1]), bad, seed=0)
    message = str(info.value)
    assert "`fraction`" in message and "0 < fraction <= 1" in message and repr(bad) in message
    assert isinstance(info.value, ValueError)


def test_bad_labels_and_seed_are_rejected():
    with pytest.raises(DatasetError, match="labels"):
        fraction_indices(np.array([0.5, 1.0]), 0.5, seed=0)
    with pytest.raises(DatasetError, match="seed"):
        fraction_indices(np.array([0, 1]), 0.5, seed=-1)


def test_load_dataset_reports_every_argument_problem_at_once():
    with pytest.raises(DatasetError) as info:
        load_dataset("cifar", augment="stronk", fraction=0, img_size=0, mixup_alpha=-1, fraction_seed=-2)
    message = str(info.value)
    fields = (
        "data.name:",
        "data.augment:",
        "data.fraction:",
        "data.img_size:",
        "data.mixup_alpha:",
        "data.fraction_seed:",
    )
    for expected in (*fields, "Did you mean 'cifar10'", "Did you mean 'strong'", "got -2", "got 'stronk'"):
        assert expected in message
    with pytest.raises(DatasetError, match="data.root: required for data.name='cifar10'"):
        load_dataset("cifar10")
    with pytest.raises(DatasetError, match="data.randaugment: must be a timm RandAugment string .*'rand-q9'"):
        load_dataset("cifar10", root="/nonexistent", augment="strong", randaugment="rand-q9")
    with pytest.raises(DatasetError, match="data.device_resident: true is impossible here: augment 'strong'"):
        load_dataset("cifar10", root="/nonexistent", augment="strong", device_resident=True)


# --------------------------------------------------------------------------- digits


def test_digits_are_read_as_scikit_learns_load_digits_gives_them():
    # Pins the file digits_raw reads without importing scikit-learn to the public loader's output, exactly; and
    # that the fast path is the one taken (no scikit-learn import), which is its reason to exist.
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    from trainables.data.digits import digits_raw

    pixels, labels = digits_raw()
    raw = load_digits()
    assert pixels.shape == (1797, 64) and np.array_equal(pixels, raw.data) and np.array_equal(labels, raw.target)
    code = "import sys; from trainables.data.digits import digits_raw; digits_raw(); print('sklearn' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == "False"


def test_digits_bundle_shapes_and_normalisation():
    b = load_dataset("digits", img_size=16, augment="none")
    assert (b.num_classes, b.in_chans, b.img_size, b.name) == (10, 1, 16, "digits")
    assert b.num_train_full + len(b.val) == DIGITS_TOTAL
    assert len(b.train) == b.num_train_full and b.mixup is None
    x, y, i = b.train[0]
    assert x.shape == (1, 16, 16) and x.dtype == torch.float32
    assert isinstance(y, int) and isinstance(i, int)
    train = torch.stack([b.train[k][0] for k in range(len(b.train))])
    assert abs(train.mean().item()) < 1e-4 and abs(train.std().item() - 1) < 1e-3
    # Val is a stratified 20%: every class is in it with its share.
    val_counts = np.bincount([b.val[k][1] for k in range(len(b.val))], minlength=10)
    assert val_counts.min() >= 30
    assert load_dataset("digits").train[0][0].shape == (1, 8, 8)


def test_digits_indices_are_full_set_indices_and_val_is_fixed():
    full = load_dataset("digits", augment="none")
    assert [full.train[k][2] for k in range(len(full.train))] == list(range(full.num_train_full))
    sub = load_dataset("digits", augment="none", fraction=0.25, fraction_seed=3)
    assert sub.num_train_full == full.num_train_full
    assert 0.23 * full.num_train_full < len(sub.train) < 0.27 * full.num_train_full
    np.testing.assert_array_equal([sub.train[k][2] for k in range(len(sub.train))], sub.train_indices)
    for k in range(0, len(sub.train), 37):
        x, y, index = sub.train[k]
        fx, fy, findex = full.train[index]
        assert (y, index) == (fy, findex)
        torch.testing.assert_close(x, fx, rtol=0, atol=0)
    other = load_dataset("digits", augment="basic", fraction=0.1, fraction_seed=8)
    assert set(other.train_indices) != set(sub.train_indices)
    for bundle in (sub, other):
        assert len(bundle.val) == len(full.val)
        for k in range(0, len(full.val), 29):
            vx, vy, vi = bundle.val[k]
            fx, fy, fi = full.val[k]
            assert (vy, vi) == (fy, fi) == (fy, k)
            torch.testing.assert_close(vx, fx, rtol=0, atol=0)


def test_digits_basic_augmentation_is_a_one_pixel_translation():
    plain = load_dataset("digits", augment="none")
    aug = load_dataset("digits", augment="basic")
    background = -plain.mean[0] / plain.std[0]
    torch.manual_seed(0)
    seen = set()
    for k in range(40):
        x = aug.train[k][0]
        padded = F.pad(plain.train[k][0], (1, 1, 1, 1), value=background)
        shifts = [(dy, dx) for dy in range(3) for dx in range(3) if torch.equal(padded[:, dy : dy + 8, dx : dx + 8], x)]
        assert shifts, f"item {k} is not a shift of the plain image by at most one pixel"
        seen.update(shifts)
    assert len(seen) > 3
    # Val is never augmented.
    torch.testing.assert_close(aug.val[0][0], plain.val[0][0], rtol=0, atol=0)


def test_digits_strong_gives_mixup_with_soft_targets():
    b = load_dataset("digits", img_size=16, augment="strong", mixup_alpha=1.0)
    assert load_dataset("digits", augment="basic").mixup is None
    assert load_dataset("digits", augment="strong", mixup_alpha=0).mixup is None
    loader = torch.utils.data.DataLoader(b.train, batch_size=128, shuffle=True)
    np.random.seed(0)
    for x, y, index in loader:
        assert y.dtype == torch.int64 and index.dtype == torch.int64
        x_mixed, y_soft = b.mixup(x.clone(), y)
        assert x_mixed.shape == x.shape
        assert y_soft.shape == (len(y), 10) and y_soft.dtype == torch.float32
        torch.testing.assert_close(y_soft.sum(1), torch.ones(len(y)))
    # The last batch (1438 % 128 = 30) and any odd batch work too; soft targets really are soft.
    _, y_soft = b.mixup(x[:5].clone(), y[:5])
    assert y_soft.shape == (5, 10)
    assert (y_soft.max(1).values < 1).any()


# --------------------------------------------------------------------------- CIFAR


def test_fake_cifar10_loads_with_labels_pixels_and_indices(fake_cifar10, tmp_path):
    b = load_dataset("cifar10", root=tmp_path, augment="none")
    assert (b.num_classes, b.in_chans, b.img_size, b.num_train_full, len(b.val)) == (10, 3, 32, 20, 6)
    assert b.classes[:2] == ("class_0", "class_1")
    for k in (0, 7, 19):
        x, y, index = b.train[k]
        # Host workers hand over uint8 pixels; the bundle normalises them where the batch is.
        assert x.shape == (3, 32, 32) and x.dtype == torch.uint8
        assert (y, index) == (fake_cifar10["train_labels"][k], k)
        expected = torch.from_numpy(fake_cifar10["train_data"][k].reshape(3, 32, 32)).float() / 255
        normalised = b.prepare(x[None])[0]
        assert normalised.dtype == torch.float32
        torch.testing.assert_close(_unnormalise(normalised, b.mean, b.std), expected, rtol=0, atol=1e-5)
    assert [b.val[k][1] for k in range(6)] == fake_cifar10["test_labels"].tolist()
    # The official files were written by numpy 1.x, whose arrays name `numpy.core.multiarray`.
    first = fake_cifar10["folder"] / "data_batch_1"
    old_style = first.read_bytes().replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert old_style != first.read_bytes()
    first.write_bytes(old_style)
    assert load_dataset("cifar10", root=tmp_path, augment="none").train[1][1] == fake_cifar10["train_labels"][1]
    # `root` may also be the cifar-10-batches-py folder itself.
    direct = load_dataset("cifar10", root=fake_cifar10["folder"], fraction=0.5, augment="basic")
    assert direct.num_train_full == 20
    assert [direct.train[k][2] for k in range(len(direct.train))] == direct.train_indices.tolist()
    assert direct.train[0][0].shape == (3, 32, 32)


def test_a_seeded_batch_draws_from_its_seed_and_leaves_the_process_generators_as_they_were(fake_cifar10, tmp_path):
    import random

    from trainables.data import SeededBatch, batch_seeds

    train = load_dataset("cifar10", root=tmp_path, augment="strong", device_resident=False).train
    positions = list(range(12))

    def states():
        return torch.get_rng_state(), random.getstate(), np.random.get_state()

    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    before = states()
    first = train.__getitems__(SeededBatch(positions, 5))
    after = states()
    # Crops, flips (torch's generator) and RandAugment (Python's and numpy's): none of them moved in this process.
    assert torch.equal(after[0], before[0]) and after[1] == before[1]
    assert all(np.array_equal(a, b) for a, b in zip(after[2], before[2]))
    again = train.__getitems__(SeededBatch(positions, 5))
    other = train.__getitems__(SeededBatch(positions, 6))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again))
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(first, other))
    assert [item[2] for item in first] == [item[2] for item in train.__getitems__(positions)]  # a plain list too
    # A batch's seed is a function of (seed, epoch, rank, its number) alone, not of how many batches an epoch has.
    assert batch_seeds(3, 1, 0, 5) == batch_seeds(3, 1, 0, 9)[:5] != batch_seeds(3, 2, 0, 5) != batch_seeds(3, 1, 1, 5)


def test_fake_cifar100_loads(tmp_path, write_fake_cifar):
    written = write_fake_cifar(tmp_path, "cifar100", per_batch=12, n_test=5)
    b = load_dataset("cifar100", root=tmp_path, augment="strong", img_size=40)
    assert (b.num_classes, b.num_train_full, len(b.val), b.img_size) == (100, 12, 5, 40)
    x, y, index = b.train[3]
    assert x.shape == (3, 40, 40) and y == written["train_labels"][b.train_indices[3]]
    assert b.val[4][0].shape == (3, 40, 40)
    _, soft = b.mixup(torch.randn(4, 3, 40, 40), torch.tensor([0, 1, 2, 99]))
    assert soft.shape == (4, 100)


def _cifar_error(root) -> str:
    with pytest.raises(DatasetError) as info:
        load_dataset("cifar10", root=root)
    return str(info.value)


def test_cifar_missing_or_empty_dir_names_path_and_layout(tmp_path):
    for root in (tmp_path / "absent", tmp_path):
        message = _cifar_error(root)
        assert str(root) in message and "cifar-10-batches-py/{data_batch_1" in message and "Fix:" in message
    assert "no such file or directory" in _cifar_error(tmp_path / "absent")
    assert "an empty directory" in _cifar_error(tmp_path)


def test_cifar_missing_file_is_named(fake_cifar10, tmp_path):
    (fake_cifar10["folder"] / "test_batch").unlink()
    message = _cifar_error(tmp_path)
    assert "missing: test_batch" in message and str(fake_cifar10["folder"]) in message


@pytest.mark.parametrize(
    "content, found",
    [
        (b"this is not a pickle", "not a valid pickle"),
        (pickle.dumps([1, 2, 3]), "not a dict"),
        (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8)}), "without the key"),
        (pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}), "(N, 3072) uint8"),
        (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}), "not 2 integers"),
        (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}), "outside 0..9"),
        # A pickle that calls a function on load must be refused, not run.
        (pickle.dumps(len), "refusing to load global builtins.len"),
    ],
)
def test_corrupt_cifar_file_names_file_layout_and_problem(fake_cifar10, tmp_path, content, found):
    bad = fake_cifar10["folder"] / "data_batch_3"
    bad.write_bytes(content)
    message = _cifar_error(tmp_path)
    assert str(bad) in message and "cifar-10-batches-py/{data_batch_1" in message and found in message


# --------------------------------------------------------------------------- ImageFolder


def test_imagefolder_loads_with_transforms_and_mixup(tmp_path):
    _write_fake_imagefolder(tmp_path, {"train": ("cat", "dog"), "val": ("cat", "dog")}, per_class=3)
    b = load_dataset("imagefolder", root=tmp_path, img_size=32, augment="basic", fraction=0.5)
    assert (b.num_classes, b.in_chans, b.img_size, b.classes, b.num_train_full) == (2, 3, 32, ("cat", "dog"), 6)
    assert len(b.train) == 4 and b.mixup is None  # round(1.5) = 2 per class
    for k in range(len(b.train)):
        x, y, index = b.train[k]
        assert x.shape == (3, 32, 32) and x.dtype == torch.float32
        assert index == b.train_indices[k] and y == index // 3
    assert [b.val[k][1:] for k in range(6)] == [(k // 3, k) for k in range(6)]
    strong = load_dataset("imagefolder", root=tmp_path, img_size=32, augment="strong")
    assert strong.train[0][0].shape == (3, 32, 32)
    _, soft = strong.mixup(torch.randn(3, 3, 32, 32), torch.tensor([0, 1, 1]))
    assert soft.shape == (3, 2)
    assert load_dataset("imagefolder", root=tmp_path, img_size=24, augment="none").train[1][0].shape == (3, 24, 24)


def test_imagefolder_mismatched_classes_and_missing_split_are_rejected(tmp_path):
    _write_fake_imagefolder(tmp_path, {"train": ("cat", "dog"), "val": ("cat", "emu")}, per_class=1)
    with pytest.raises(DatasetError) as info:
        load_dataset("imagefolder", root=tmp_path, img_size=32)
    message = str(info.value)
    assert str(tmp_path) in message and "only in train: ['dog']" in message and "only in val: ['emu']" in message
    assert "<root>/train/<class_name>/" in message
    other = tmp_path / "no_val"
    _write_fake_imagefolder(other, {"train": ("cat",)}, per_class=1)
    with pytest.raises(DatasetError, match="no such file or directory") as info:
        load_dataset("imagefolder", root=other)
    assert str(other / "val") in str(info.value)
