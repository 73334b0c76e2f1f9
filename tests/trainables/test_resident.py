"""The data paths: device-resident batches with the host path's distribution, seeded; host crops equal torchvision's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from trainables import fit
from trainables.data import load_dataset, random_crop_flip

PAD, SIZE, DRAWS = 4, 8, 8100  # 81 offsets x 2 flips: 50 draws per bin on average


def _coordinate_image() -> torch.Tensor:
    """One (1, SIZE, SIZE) image whose pixel (r, c) holds r * 16 + c + 1; 0 is what padding shows."""
    r, c = torch.meshgrid(torch.arange(SIZE), torch.arange(SIZE), indexing="ij")
    return (r * 16 + c + 1).to(torch.uint8)[None]


def _offsets_and_flip(crop: torch.Tensor) -> tuple[int, int, bool]:
    """Recover (row offset, column offset, flipped) of a crop of the PAD-padded coordinate image."""
    rows, cols = torch.nonzero(crop[0] > 0, as_tuple=True)
    i, j = int(rows[0]), int(cols[0])  # first real pixel in row-major order; at least SIZE - PAD follow it
    src_r, src_c = divmod(int(crop[0, i, j]) - 1, 16)
    flipped = bool(crop[0, i, j + 1] < crop[0, i, j])
    # Unflipped, crop[i, j] = padded[dy + i, dx + j]; flipped, crop[i, j] = padded[dy + i, dx + SIZE - 1 - j].
    dx = src_c + PAD - ((SIZE - 1 - j) if flipped else j)
    return src_r + PAD - i, dx, flipped


def _host_crops(n: int, seed: int) -> list[tuple[int, int, bool]]:
    from PIL import Image
    from torchvision import transforms as T

    torch.manual_seed(seed)
    tf = T.Compose([T.RandomCrop(SIZE, padding=PAD), T.RandomHorizontalFlip(), T.PILToTensor()])
    img = Image.fromarray(_coordinate_image()[0].numpy())
    return [_offsets_and_flip(tf(img)) for _ in range(n)]


def _device_crops(n: int, seed: int) -> list[tuple[int, int, bool]]:
    torch.manual_seed(seed)
    batch = _coordinate_image()[None].expand(n, 1, SIZE, SIZE).contiguous()
    crops = random_crop_flip(batch, pad=PAD, flip=True)
    return [_offsets_and_flip(c) for c in crops]


def _counts(draws: list[tuple[int, int, bool]]) -> np.ndarray:
    counts = np.zeros((2 * PAD + 1, 2 * PAD + 1, 2))
    for dy, dx, f in draws:
        counts[dy, dx, int(f)] += 1
    return counts.ravel()


def test_offset_recovery_reads_known_crops():
    # The reader the distribution tests rely on, checked against hand-made crops.
    padded = torch.nn.functional.pad(_coordinate_image(), (PAD,) * 4)
    for dy, dx in [(0, 0), (PAD, PAD), (2 * PAD, 1), (3, 2 * PAD)]:
        crop = padded[:, dy : dy + SIZE, dx : dx + SIZE]
        assert _offsets_and_flip(crop) == (dy, dx, False)
        assert _offsets_and_flip(crop.flip(-1)) == (dy, dx, True)


def test_device_crop_and_flip_have_the_host_distribution():
    device, host = _counts(_device_crops(DRAWS, seed=1)), _counts(_host_crops(DRAWS // 4, seed=1))
    # Every offset and both flips occur, each about equally often: uniform by a chi-square test ...
    assert (device > 0).all() and (host > 0).all()
    assert chisquare(device).pvalue > 1e-3
    assert chisquare(host).pvalue > 1e-3
    # ... and the two paths agree: flip rate and mean offsets within sampling error.
    d, h = np.array(_device_crops(DRAWS, seed=2)), np.array(_host_crops(DRAWS // 4, seed=2))
    assert abs(d[:, 2].mean() - 0.5) < 0.03 and abs(h[:, 2].mean() - 0.5) < 0.05
    np.testing.assert_allclose(d[:, :2].mean(0), [PAD, PAD], atol=0.15)
    np.testing.assert_allclose(h[:, :2].mean(0), [PAD, PAD], atol=0.3)


def test_each_crop_equals_the_padded_slice_and_its_mirror():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(1, 256, (64, 3, SIZE, SIZE), dtype=torch.uint8, generator=g)
    torch.manual_seed(5)
    crops = random_crop_flip(images, pad=PAD, flip=True)
    torch.manual_seed(5)  # the same draws, replayed by hand
    offsets = torch.randint(0, 2 * PAD + 1, (64, 2))
    flips = torch.rand(64) < 0.5
    padded = torch.nn.functional.pad(images, (PAD,) * 4)
    for k in range(64):
        dy, dx = offsets[k].tolist()
        expected = padded[k, :, dy : dy + SIZE, dx : dx + SIZE]
        torch.testing.assert_close(crops[k], expected.flip(-1) if flips[k] else expected, rtol=0, atol=0)


def test_resident_batches_are_reproducible_per_seed_and_vary_with_it():
    b = load_dataset("digits", augment="basic", device_resident=True)
    torch.manual_seed(3)
    first = b.train.get_batch(list(range(32)))[0]
    torch.manual_seed(3)
    again = b.train.get_batch(list(range(32)))[0]
    torch.manual_seed(4)
    other = b.train.get_batch(list(range(32)))[0]
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_resident_cifar_matches_the_host_path_pixel_for_pixel(fake_cifar10, tmp_path):
    host = load_dataset("cifar10", root=tmp_path, augment="none", fraction=0.5)
    resident = load_dataset("cifar10", root=tmp_path, augment="none", fraction=0.5, device_resident=True)
    assert resident.resident and not host.resident
    assert resident.train_indices.tolist() == host.train_indices.tolist()
    x, y, index = resident.train.get_batch(list(range(len(resident.train))))
    for k in range(len(host.train)):
        hx, hy, hi = host.train[k]
        assert torch.equal(x[k], hx) and (int(y[k]), int(index[k])) == (hy, hi)
    vx, vy, _ = resident.val.get_batch(list(range(len(resident.val))))
    torch.testing.assert_close(
        resident.prepare(vx), host.prepare(torch.stack([host.val[k][0] for k in range(len(host.val))]))
    )
    assert vy.tolist() == fake_cifar10["test_labels"].tolist()


def test_auto_residency_follows_device_augmentation_and_size(fake_cifar10, tmp_path):
    assert load_dataset("cifar10", root=tmp_path, device="cuda").resident
    assert not load_dataset("cifar10", root=tmp_path, device="cpu").resident
    assert not load_dataset("cifar10", root=tmp_path, device="cuda", augment="strong").resident
    assert not load_dataset("cifar10", root=tmp_path, device="cuda", img_size=40).resident
    assert load_dataset("digits", device="cuda").resident


def _tiny(tiny_model, data: dict) -> dict:
    return {
        "model": tiny_model("vit", embed_dim=32),
        "data": {"batch_size": 8, "eval_batch_size": 5, **data},
        "optimizer": {"method": "sam", "lr": 1e-3},
        "schedule": {"epochs": 2},
        "train": {"device": "cpu", "threads": 1},
    }


@pytest.mark.parametrize("augment", ["none", "basic"])
def test_fit_on_resident_cifar_is_seeded_and_equals_the_host_path_without_augmentation(
    fake_cifar10, tmp_path, augment, tiny_model
):
    data = {"name": "cifar10", "root": str(tmp_path), "augment": augment}
    timing = ("epoch_time_s", "images_per_sec")

    def learned(metrics: dict) -> dict:
        return {k: v for k, v in metrics.items() if k not in timing}

    resident = fit(_tiny(tiny_model, {**data, "device_resident": True}))
    assert learned(resident) == learned(fit(_tiny(tiny_model, {**data, "device_resident": True})))  # bit for bit
    host = fit(_tiny(tiny_model, {**data, "device_resident": False, "num_workers": 0}))
    if augment == "none":
        # Same pixels, same batches, same arithmetic: the two data paths train the same model.
        keys = ("train_loss", "train_acc", "val_loss", "val_acc")
        assert {k: resident[k] for k in keys} == pytest.approx({k: host[k] for k in keys}, rel=1e-6)
    assert np.isfinite(host["train_loss"])


@pytest.mark.parametrize("augment", ["basic", "strong"])
def test_host_crop_by_slicing_equals_torchvision_pixel_for_pixel(fake_cifar10, tmp_path, augment):
    # The host path slices a pre-padded array instead of PIL's pad-and-crop; same draws, so the same pixels.
    from PIL import Image
    from torchvision import transforms as T

    from trainables.data.cifar import _rand_augment
    from trainables.data.registry import DATASETS

    b = load_dataset("cifar10", root=tmp_path, augment=augment, device_resident=False)
    steps = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()]
    if augment == "strong":
        steps.append(_rand_augment("rand-m9-mstd0.5", 32, DATASETS["cifar10"].mean))
    reference = T.Compose([*steps, T.PILToTensor()])
    import random

    def seed(k: int) -> None:  # RandAugment draws from Python's and numpy's generators
        torch.manual_seed(k), random.seed(k), np.random.seed(k)

    for k in range(len(b.train)):
        seed(100 + k)
        ours = b.train[k][0]
        seed(100 + k)
        pixels = fake_cifar10["train_data"][b.train_indices[k]].reshape(3, 32, 32).transpose(1, 2, 0)
        assert torch.equal(ours, reference(Image.fromarray(pixels)))
