"""The prepared form of an image folder (trainables.data.prepare, `sharpscale data prepare`) on tiny folders the tests
write: its sizes follow torchvision's Resize, its eval crops match the original's, it loads as an image folder, and
every refusal comes before anything is written."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, JpegImagePlugin
from scipy.stats import ks_2samp

from trainables import fit
from trainables.data import load_dataset
from trainables.data.crops import random_resized_crop_boxes
from trainables.data.prepare import (
    INDEX_FILE,
    MANIFEST,
    PIXELS_FILE,
    PixelSplit,
    PrepareError,
    default_short_side,
    prepare_folder,
    read_manifest,
    resized_size,
)
from trainables.metrics import VALIDATION_SAMPLES

CPU = torch.device("cpu")


def _textured(h: int, w: int, seed: int, cell: int = 8) -> np.ndarray:
    # As a photo: detail in brightness (blobs of `cell` pixels plus grain), colour that varies slowly (a JPEG's
    # 4:2:0 chroma keeps it).
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 200, (h // cell + 2, w // cell + 2), dtype=np.uint8)
    luma = np.asarray(Image.fromarray(coarse).resize((w, h), Image.Resampling.BICUBIC), dtype=np.float64)
    tint = rng.uniform(0, 55, 3) * np.linspace(0, 1, w)[None, :, None]
    return np.clip(luma[..., None] + tint + rng.normal(0, 3, (h, w, 1)), 0, 255).astype(np.uint8)


def _folder(root: Path, sizes=((75, 100), (120, 90), (30, 40)), per_class: int = 3, cell: int = 8) -> Path:
    for split in ("train", "val"):
        for k, c in enumerate(("cat", "dog")):
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                h, w = sizes[i % len(sizes)]
                img = _textured(h, w, seed=100 * k + i, cell=cell)
                Image.fromarray(img).save(root / split / c / f"{i}.jpg", quality=95)
    return root


def test_sizes_follow_torchvision_resize():
    from torchvision.transforms import Resize

    for h, w in [(375, 500), (500, 375), (333, 500), (256, 341), (257, 1000), (100, 80), (64, 64)]:
        img = Image.new("RGB", (w, h))
        want_w, want_h = Resize(64)(img).size if min(h, w) > 64 else (w, h)  # prepare never upscales
        assert resized_size(h, w, 64) == (want_h, want_w), (h, w)
    assert default_short_side(224) == 256


def test_prepare_writes_the_layout_sizes_and_manifest(tmp_path):
    src = _folder(tmp_path / "src")
    Image.fromarray(_textured(80, 60, 7)).save(src / "train" / "dog" / "extra.png")  # a PNG becomes a JPEG
    done = prepare_folder(src, tmp_path / "out", short_side=48, quality=95, workers=1)
    out = tmp_path / "out"
    assert done.files == {"train": 7, "val": 6}
    assert (done.resized, done.copied) == (9, 4)  # the 30x40 JPEGs are copied, the PNG is re-encoded
    assert read_manifest(out) == done
    manifest = json.loads((out / MANIFEST).read_text())
    assert (manifest["short_side"], manifest["quality"], manifest["subsampling"]) == (48, 95, "4:2:0")
    assert not list(tmp_path.glob(".out.preparing-*"))  # the staging folder was renamed, nothing left over
    for path in src.rglob("*.*"):
        rel = path.relative_to(src).with_suffix(".jpg")
        with Image.open(path) as a, Image.open(out / rel) as b:
            w, h = a.size
            assert b.size[::-1] == resized_size(h, w, 48)
            assert b.format == "JPEG" and b.mode == "RGB"
            assert not b.info.get("progressive")  # baseline: nvjpeg's hardware path decodes it
            if min(h, w) > 48 or path.suffix != ".jpg":
                assert JpegImagePlugin.get_sampling(b) == 2  # 4:2:0, as the manifest says
        if min(h, w) <= 48 and path.suffix == ".jpg":
            assert (out / rel).read_bytes() == path.read_bytes()
    assert done.pixels_after < done.pixels_before
    # An ordinary image folder: both decode paths load it, with the same classes.
    for decode in ("cpu", "device"):
        bundle = load_dataset("imagefolder", root=out, img_size=32, augment="basic", decode=decode, device="cpu")
        assert bundle.classes == ("cat", "dog") and len(bundle.train) == 7
        x, _, _ = bundle.val[0]
        assert tuple(x.shape) == (3, 32, 32)


def test_prepared_eval_crops_match_the_originals(tmp_path):
    """At the default short side the eval transform (resize the shorter side to img_size / 0.875, central crop) of a
    prepared image is that of its original, up to the JPEG re-encoding."""
    src = _folder(tmp_path / "src", sizes=((150, 200), (210, 160)), per_class=2, cell=20)
    size = 32
    prepare_folder(src, tmp_path / "out", short_side=default_short_side(size), quality=95, workers=1)
    a = load_dataset("imagefolder", root=src, img_size=size, augment="none", decode="cpu").val
    b = load_dataset("imagefolder", root=tmp_path / "out", img_size=size, augment="none", decode="cpu").val
    diffs, shifted = [], []
    for i in range(len(a)):
        xa, xb = a[i][0], b[i][0]
        diffs.append((xa - xb).abs().mean().item())
        shifted.append((xa[..., 1:] - xb[..., :-1]).abs().mean().item())  # what a one-pixel offset would give
    # Normalised units (one grey level is about 0.017): the re-encoding stays far below a one-pixel shift.
    assert max(diffs) < 0.05, diffs
    assert min(shifted) > 4 * max(diffs), (diffs, shifted)


def test_crop_boxes_keep_their_relative_distribution_on_prepared_sizes():
    """Random-resized crops are drawn relative to the image: on the prepared size (256 x 341 for 375 x 500) the
    boxes' area and aspect fractions have the distribution they have on the original (integer rounding aside)."""
    n = 20_000
    orig = random_resized_crop_boxes(torch.tensor([[375, 500]] * n), torch.Generator().manual_seed(0)).double()
    prep = random_resized_crop_boxes(torch.tensor([[256, 341]] * n), torch.Generator().manual_seed(1)).double()
    for col, (h, w) in ((2, (375, 256)), (3, (500, 341))):
        assert ks_2samp((orig[:, col] / h).numpy(), (prep[:, col] / w).numpy()).pvalue > 1e-3
    assert (
        ks_2samp(
            (orig[:, 2] * orig[:, 3] / (375 * 500)).numpy(), (prep[:, 2] * prep[:, 3] / (256 * 341)).numpy()
        ).pvalue
        > 1e-3
    )
    # The test can fail: another scale range on the prepared images is caught at this n.
    other = random_resized_crop_boxes(
        torch.tensor([[256, 341]] * n), torch.Generator().manual_seed(1), scale=(0.12, 1.0)
    ).double()
    area = (other[:, 2] * other[:, 3] / (256 * 341)).numpy()
    assert ks_2samp((orig[:, 2] * orig[:, 3] / (375 * 500)).numpy(), area).pvalue < 1e-6


def test_every_problem_is_refused_at_once_before_writing(tmp_path):
    with pytest.raises(PrepareError) as err:
        prepare_folder(tmp_path / "missing", tmp_path / "out", short_side=8, quality=100, workers=0)
    text = str(err.value)
    for part in ("SOURCE", "is not a directory", "--short-side must be in [16, 8192]", "got 8", "--quality", "got 100",
                 "--workers must be at least 1"):  # fmt: skip
        assert part in text, part
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "case, expected",
    [
        ("dest_not_empty", "exists and is not an empty directory"),
        ("dest_inside", "lies inside SOURCE"),
        ("prepared_source", "is itself a prepared folder"),
        ("no_val", "has no 'val' folder"),
        ("collision", "would both be written as"),
    ],
)
def test_refusals(tmp_path, case, expected):
    src = _folder(tmp_path / "src", per_class=1)
    dest = tmp_path / "out"
    if case == "dest_not_empty":
        dest.mkdir()
        (dest / "keep.txt").write_text("mine")
    elif case == "dest_inside":
        dest = src / "prepared"
    elif case == "prepared_source":
        (src / MANIFEST).write_text("{}")
    elif case == "no_val":
        import shutil

        shutil.rmtree(src / "val")
    elif case == "collision":
        Image.fromarray(_textured(20, 20, 1)).save(src / "train" / "cat" / "0.png")
    with pytest.raises(PrepareError, match=expected):
        prepare_folder(src, dest, short_side=16, workers=1)
    if case == "dest_not_empty":
        assert [p.name for p in dest.iterdir()] == ["keep.txt"]
    elif case != "dest_inside":
        assert not dest.exists()


@pytest.mark.parametrize("form", ["jpeg", "pixels"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_failed_run_leaves_no_half_prepared_folder_and_names_every_unreadable_image(tmp_path, workers, form):
    src = _folder(tmp_path / "src", per_class=2)
    (src / "train" / "dog" / "9.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    (src / "val" / "cat" / "8.png").write_bytes(b"\x89PNG truncated")
    # A header that reads, a body that does not (the pixel form's second pass meets it).
    whole = (src / "val" / "dog" / "0.jpg").read_bytes()
    (src / "val" / "dog" / "0.jpg").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(PrepareError, match=r"3 image\(s\) in SOURCE could not be read") as err:
        prepare_folder(src, tmp_path / "out", short_side=16, workers=workers, form=form)
    text = str(err.value)
    for bad in ("train/dog/9.jpg", "val/cat/8.png", "val/dog/0.jpg"):
        assert f"'{src / bad}': " in text, bad
    assert "Fix: replace or remove each of them in SOURCE" in text
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.preparing-*"))


def test_a_small_progressive_jpeg_is_re_encoded_as_baseline(tmp_path):
    src = _folder(tmp_path / "src", sizes=((30, 40),), per_class=1)
    Image.fromarray(_textured(30, 40, 5)).save(src / "train" / "cat" / "p.jpg", quality=95, progressive=True)
    done = prepare_folder(src, tmp_path / "out", short_side=48, workers=1)
    assert (done.resized, done.copied, sum(done.files.values())) == (0, 4, 5)  # the progressive one: re-encoded
    with Image.open(tmp_path / "out" / "train" / "cat" / "p.jpg") as img:
        assert not img.info.get("progressive") and JpegImagePlugin.get_sampling(img) == 2


def test_a_manifest_of_another_version_is_refused_with_the_fix(tmp_path):
    src = _folder(tmp_path / "src", per_class=1)
    prepare_folder(src, tmp_path / "out", short_side=16, workers=1)
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    del manifest["subsampling"]  # as version 1 wrote it
    manifest["version"] = 1
    (tmp_path / "out" / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(PrepareError, match=r"version 1, but this sharpscale reads version 3 \(it lacks subsampling\)"):
        read_manifest(tmp_path / "out")


def test_a_version_2_manifest_reads_as_the_jpeg_form(tmp_path):
    src = _folder(tmp_path / "src", per_class=1)
    done = prepare_folder(src, tmp_path / "out", short_side=16, workers=1)
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    del manifest["form"], manifest["classes"]  # as version 2 wrote it
    manifest["version"] = 2
    (tmp_path / "out" / MANIFEST).write_text(json.dumps(manifest))
    assert read_manifest(tmp_path / "out") == dataclasses.replace(done, classes=[])


# --------------------------------------------------------------------------- the pixel form


def _resized(path: Path, short_side: int) -> np.ndarray:
    with Image.open(path) as img:
        rgb = img.convert("RGB")
        h, w = rgb.size[1], rgb.size[0]
        new_h, new_w = resized_size(h, w, short_side)
        if (new_h, new_w) != (h, w):
            rgb = rgb.resize((new_w, new_h), Image.Resampling.BICUBIC)
        return np.asarray(rgb)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_pixel_form_holds_every_image_resized_in_image_folder_order(tmp_path, workers):
    from torchvision.datasets import ImageFolder

    src = _folder(tmp_path / "src")
    Image.fromarray(_textured(80, 60, 7)).save(src / "train" / "dog" / "extra.png")
    done = prepare_folder(src, tmp_path / "px", short_side=48, workers=workers, form="pixels")
    out = tmp_path / "px"
    assert (done.form, done.classes, done.quality, done.subsampling) == ("pixels", ["cat", "dog"], None, None)
    assert done.files == {"train": 7, "val": 6} and (done.resized, done.copied) == (9, 0)
    assert read_manifest(out) == done
    sizes = 0
    for split in ("train", "val"):
        pixels = PixelSplit(out / split)
        folder = ImageFolder(str(src / split))
        assert pixels.labels.tolist() == folder.targets  # torchvision's order and labels
        for i, (path, _) in enumerate(folder.samples):
            np.testing.assert_array_equal(pixels.pixels(i), _resized(Path(path), 48))
        # Pickled (to a DataLoader worker) without its mapping, and maps the file again there.
        again = pickle.loads(pickle.dumps(pixels))
        assert again._map is None and np.array_equal(again.pixels(len(again) - 1), pixels.pixels(len(pixels) - 1))
        sizes += (out / split / PIXELS_FILE).stat().st_size
        assert (out / split / INDEX_FILE).is_file() and not list((out / split).glob("*/"))
    assert done.bytes_after == sizes == 3 * done.pixels_after


def test_the_pixel_form_loads_as_the_folder_it_came_from(tmp_path):
    """At the default short side its eval images are the original's, pixel for pixel, on the host path (the eval
    resize of an image already at that size is a copy), and the device path crops the same pixels."""
    src = _folder(tmp_path / "src", sizes=((150, 200), (210, 160)), per_class=2, cell=20)
    size = 32
    prepare_folder(src, tmp_path / "px", short_side=default_short_side(size), workers=1, form="pixels")
    orig = load_dataset("imagefolder", root=src, img_size=size, augment="none", decode="cpu")
    host = load_dataset("imagefolder", root=tmp_path / "px", img_size=size, augment="none", decode="cpu")
    dev = load_dataset("imagefolder", root=tmp_path / "px", img_size=size, augment="basic", decode="device")
    assert type(dev.val).__name__ == "FolderPixels" and host.classes == orig.classes == dev.classes
    assert len(host.train) == len(orig.train) == len(dev.train)
    for split in ("train", "val"):
        for i in range(len(getattr(orig, split))):
            a, b = getattr(orig, split)[i], getattr(host, split)[i]
            assert a[1:] == b[1:] and torch.equal(a[0], b[0]), (split, i)
    for i in range(len(orig.val)):
        a, c = orig.val[i], dev.val[i]
        assert a[1:] == c[1:] and c[0].dtype == torch.uint8
        assert (a[0] - dev.prepare(c[0][None])[0]).abs().max() < 1e-5, i


@pytest.mark.parametrize("decode", ["cpu", "device"])
def test_fit_on_the_pixel_form_is_seeded_with_workers(tmp_path, tiny_model, decode):
    src = _folder(tmp_path / "src", sizes=((40, 50), (50, 36)), per_class=4)
    prepare_folder(src, tmp_path / "px", short_side=20, workers=1, form="pixels")
    cfg = {
        "model": tiny_model("vit", embed_dim=32),
        "data": {"name": "imagefolder", "root": str(tmp_path / "px"), "img_size": 16, "augment": "basic",
                 "decode": decode, "batch_size": 4, "eval_batch_size": 5, "num_workers": 1},
        "optimizer": {"method": "sam", "lr": 1e-3},
        "schedule": {"epochs": 2},
        "train": {"device": "cpu", "threads": 1},
    }  # fmt: skip
    timing = ("epoch_time_s", "images_per_sec")
    first, second = fit(cfg), fit(cfg)
    assert {k: v for k, v in first.items() if k not in timing} == {k: v for k, v in second.items() if k not in timing}
    assert np.isfinite(first["train_loss"]) and first[VALIDATION_SAMPLES] == 8


def test_a_pixel_batch_is_one_copy_viewed_by_size_and_keeps_the_samplers_order(tmp_path):
    """The loader's batch: the pixels laid out by size in one tensor, one view a size; the batch handed on (images,
    labels, indices) in the sampler's order, as every other path keeps it (m-sharpness groups, micro-batches and mixup
    pairs are consecutive rows); its eval crops are those of the items one by one."""
    src = _folder(tmp_path / "src", sizes=((40, 50), (50, 36), (40, 50), (30, 30)), per_class=4)
    prepare_folder(src, tmp_path / "px", short_side=32, workers=1, form="pixels")
    dev = load_dataset("imagefolder", root=tmp_path / "px", img_size=16, augment="none", decode="device")
    split = dev.val
    order = np.random.default_rng(0).permutation(len(split)).tolist()
    batch = split.collate([split.read(i) for i in order])
    assert batch.indices.tolist() == order  # val indices are positions
    assert batch.labels.tolist() == [int(split._split.labels[i]) for i in order]
    laid_out = [tuple(split._split.shapes[order[k]]) for k in batch.order.tolist()]
    assert laid_out == sorted(laid_out) and sorted(batch.order.tolist()) == list(range(len(order)))
    images = split.images(batch, CPU)
    assert len(images.groups) == len(set(laid_out)) == 3 and images.n == len(order)
    for rows, group in images.groups:
        for row, img in zip(rows.tolist(), group):
            want = split._split.pixels(order[row])
            assert torch.equal(img, torch.from_numpy(np.ascontiguousarray(want.transpose(2, 0, 1))))
    x = split.transform(images, CPU, torch.Generator().manual_seed(0))
    one_by_one = torch.stack([split[i][0] for i in order])
    assert torch.equal(x, one_by_one)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_device_loader_hands_on_batches_in_the_samplers_order(tmp_path, workers):
    """Through the loader fit uses (workers, pinning off on CPU, the producer thread), each batch's indices and labels
    are the sampler's, and its images are the items' own crops in that order."""
    src = _folder(tmp_path / "src", sizes=((40, 50), (50, 36), (30, 30)), per_class=5)
    prepare_folder(src, tmp_path / "px", short_side=32, workers=1, form="pixels")
    dev = load_dataset("imagefolder", root=tmp_path / "px", img_size=16, augment="none", decode="device")
    split = dev.val
    sampler = [[7, 2, 9, 0, 4], [1, 8, 3, 6, 5]]
    loader = split.device_loader(sampler, CPU, num_workers=workers, pin_memory=False, persistent_workers=False)
    seen = list(loader)
    assert [b[2].tolist() for b in seen] == sampler
    for (x, y, indices), positions in zip(seen, sampler):
        assert y.tolist() == [int(split._split.labels[i]) for i in positions]
        assert torch.equal(x, torch.stack([split[i][0] for i in positions]))


def _default_path(split, sampler, workers):
    # FolderBytes' loader on the same split: workers collate each batch and hand it over in shared memory.
    from trainables.data.folders import FolderBytes

    return FolderBytes.device_loader(
        split, sampler, CPU, num_workers=workers, pin_memory=False, persistent_workers=False
    )


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("spread", [6.0, 0.0])
def test_the_slot_ring_hands_on_the_default_paths_batches_over_epochs_and_broken_passes(
    tmp_path, monkeypatch, workers, spread
):
    """Workers reading straight into the ring's slots give the batches the default path gives, epoch after epoch
    with persistent workers, after a pass left half-read (its slots reclaimed), and with slots too small for some
    batches (slots of a mean batch: the larger ones come in their spill)."""
    from trainables.data.slots import _SlotRing

    if not spread:
        monkeypatch.setattr(_SlotRing, "SIZE_MARGIN", 1.0)
    monkeypatch.setattr(_SlotRing, "SIZE_SPREAD", spread)
    src = _folder(tmp_path / "src", sizes=((40, 50), (50, 36), (30, 30), (64, 20)), per_class=12)
    prepare_folder(src, tmp_path / "px", short_side=32, workers=1, form="pixels")
    split = load_dataset("imagefolder", root=tmp_path / "px", img_size=16, augment="none", decode="device").val
    rng = np.random.default_rng(0)
    epochs = [[rng.permutation(len(split))[k : k + 5].tolist() for k in range(0, 20, 5)] for _ in range(3)]
    sampler = _Epochs(epochs)
    loader = split.device_loader(sampler, CPU, num_workers=workers, pin_memory=False, persistent_workers=workers > 0)
    spilled = []
    ring = loader.ring
    batch_of = ring.batch
    monkeypatch.setattr(ring, "batch", lambda filled: spilled.append(filled.spill is not None) or batch_of(filled))
    for epoch, batches in enumerate(epochs):
        sampler.epoch = epoch
        want = list(_default_path(split, batches, 0))
        got = []
        for item in loader:
            got.append(item)
            if epoch == 1 and len(got) == 2:
                break  # a pass left half-read: the next one reclaims the slots its batches held
        for (x, y, i), (wx, wy, wi) in zip(got, want):
            assert torch.equal(i, wi) and torch.equal(y, wy) and torch.equal(x, wx)
        assert len(got) == (2 if epoch == 1 else len(batches))
    assert (spread == 0) == any(spilled) and not all(spilled)
    assert sorted(ring._free) == list(range(len(ring.buffer))) and not ring._held


class _Epochs:
    """A batch sampler over fixed epochs of batches (set `epoch` before each pass), sized as the loop's."""

    def __init__(self, epochs):
        self.epochs, self.epoch = epochs, 0
        self.batch_size = max(len(b) for e in epochs for b in e)

    def __len__(self):
        return len(self.epochs[self.epoch])

    def __iter__(self):
        return iter(self.epochs[self.epoch])


def test_slots_larger_than_the_free_shared_memory_are_refused_with_the_fix(tmp_path):
    """A full tmpfs faults a worker's write (SIGBUS) instead of refusing it: the ring checks the room first."""
    import shutil

    from trainables.data.slots import _check_shared_memory
    from trainables.errors import TrialRefused

    free = shutil.disk_usage(tmp_path).free
    _check_shared_memory(2, 2**20, where=str(tmp_path))
    with pytest.raises(
        TrialRefused, match=r"data.num_workers: .* needs .* GiB of shared memory \(14 batch slots"
    ) as err:
        _check_shared_memory(14, free // 14 + 2**20, where=str(tmp_path))
    assert "--shm-size" in str(err.value) and f"{tmp_path} has" in str(err.value)


def test_read_into_completes_short_reads_and_matches_the_mapping(tmp_path, monkeypatch):
    import os

    src = _folder(tmp_path / "src", per_class=2)
    prepare_folder(src, tmp_path / "px", short_side=24, workers=1, form="pixels")
    split = PixelSplit(tmp_path / "px" / "train")
    preadv = os.preadv
    calls = []

    def short(fd, buffers, offset):  # the OS may return fewer bytes than asked
        calls.append(offset)
        return preadv(fd, [buffers[0][:7]], offset)

    monkeypatch.setattr(os, "preadv", short)
    for i in range(len(split)):
        out = np.empty(split.nbytes(i), dtype=np.uint8)
        split.read_into(i, out)
        assert np.array_equal(out.reshape(split.pixels(i).shape), split.pixels(i))
    assert len(calls) > len(split)


# --------------------------------------------------------------------------- the pixel form: refusals and damage


def _pixels(tmp_path, **kw) -> Path:
    prepare_folder(
        _folder(tmp_path / "src", per_class=2), tmp_path / "px", short_side=24, workers=1, form="pixels", **kw
    )
    return tmp_path / "px"


def _load(root):
    return load_dataset("imagefolder", root=root, img_size=16, augment="none", decode="device")


@pytest.mark.parametrize("damage", ["truncated", "missing", "index", "labels", "manifest"])
def test_a_damaged_pixel_folder_is_refused_at_load_with_the_command_that_remakes_it(tmp_path, damage):
    root = _pixels(tmp_path)
    src = tmp_path / "src"
    if damage == "truncated":
        data = (root / "val" / PIXELS_FILE).read_bytes()
        (root / "val" / PIXELS_FILE).write_bytes(data[:-100])
        expected = (
            rf"pixel file '.*val/{PIXELS_FILE}' holds {len(data) - 100:,} bytes where its index names {len(data):,}"
        )
    elif damage == "missing":
        (root / "train" / PIXELS_FILE).unlink()
        expected = "pixel file .* is missing"
    elif damage == "index":
        np.save(root / "train" / INDEX_FILE, np.arange(8))
        expected = r"is int64 \(8,\), not int64 \(N, 4\)"
    elif damage == "labels":
        index = np.load(root / "train" / INDEX_FILE)
        index[0, 3] = 7
        np.save(root / "train" / INDEX_FILE, index)
        expected = "train labels leave the manifest's 2 classes"
    else:
        (root / MANIFEST).write_text('{"format": "sharpscale-prepa')
        expected = "manifest that cannot be read"
    with pytest.raises(PrepareError, match=expected) as err:
        _load(root)
    if damage != "manifest":
        assert f"`sharpscale data prepare {src.resolve()} --to NEW_DIR --form pixels`" in str(err.value)
    else:
        assert "prepare the source again" in str(err.value)


@pytest.mark.parametrize("form", ["jpeg", "pixels"])
@pytest.mark.parametrize("case", ["val_lacks_a_class", "val_without_images", "no_class_folders"])
def test_a_source_its_image_folder_would_refuse_is_refused_before_writing(tmp_path, form, case):
    import shutil

    src = _folder(tmp_path / "src", per_class=1)
    if case == "val_lacks_a_class":
        shutil.rmtree(src / "val" / "dog")
        expected = r"different class folders \(only in train: \['dog'\]; only in val: \[\]\)"
    elif case == "val_without_images":
        for f in (src / "val").rglob("*.jpg"):
            f.unlink()
        expected = "val' holds no images"
    else:
        shutil.rmtree(src / "train")
        (src / "train").mkdir()
        expected = "Couldn't find any class folder"
    with pytest.raises(PrepareError, match=expected):
        prepare_folder(src, tmp_path / "out", short_side=16, workers=1, form=form)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.preparing-*"))


def test_short_writes_are_completed(tmp_path, monkeypatch):
    """os.pwrite may write less than asked: every byte still reaches the file (it is sparse: a gap reads as black)."""
    import os

    real = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: real(fd, bytes(data)[: max(1, len(data) // 3)], offset))
    root = _pixels(tmp_path)
    split = PixelSplit(root / "train")
    from torchvision.datasets import ImageFolder

    for i, (path, _) in enumerate(ImageFolder(str(tmp_path / "src" / "train")).samples):
        np.testing.assert_array_equal(split.pixels(i), _resized(Path(path), 24))


def test_a_disk_too_small_is_refused_before_any_pixel_is_written_and_a_full_one_says_so(tmp_path, monkeypatch):
    import errno
    import os
    import shutil

    src = _folder(tmp_path / "src", per_class=2)
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    with pytest.raises(
        PrepareError, match=r"the pixel form needs [\d,]+ bytes \(0\.00 GB\), and '.*' has 1,000 free\. Fix: free"
    ):
        prepare_folder(src, tmp_path / "px", short_side=24, workers=1, form="pixels")
    monkeypatch.setattr(shutil, "disk_usage", real)

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(PrepareError, match=r"the disk of --to '.*px' filled while writing .*Fix: free space"):
        prepare_folder(src, tmp_path / "px", short_side=24, workers=1, form="pixels")
    assert not (tmp_path / "px").exists() and not list(tmp_path.glob(".px.preparing-*"))


def test_what_an_interrupted_run_left_is_named_with_its_removal(tmp_path):
    src = _folder(tmp_path / "src", per_class=1)
    (tmp_path / ".px.preparing-4242" / "train").mkdir(parents=True)
    with pytest.raises(
        PrepareError, match=r"'.*\.px\.preparing-4242' is what an interrupted .* Fix: remove it \(rm -r"
    ):
        prepare_folder(src, tmp_path / "px", short_side=16, workers=1, form="pixels")


def test_quality_is_the_jpeg_forms_and_manifests_of_other_forms_or_newer_versions_are_refused(tmp_path):
    src = _folder(tmp_path / "src", per_class=1)
    with pytest.raises(PrepareError, match=r"--quality is the JPEG form's, got 80 with --form pixels"):
        prepare_folder(src, tmp_path / "px", short_side=16, workers=1, form="pixels", quality=80)
    root = _pixels(tmp_path / "b")
    manifest = json.loads((root / MANIFEST).read_text())
    (root / MANIFEST).write_text(json.dumps({**manifest, "form": "tiles"}))
    with pytest.raises(PrepareError, match=r"names form 'tiles', not one of \['jpeg', 'pixels'\]"):
        read_manifest(root)
    (root / MANIFEST).write_text(json.dumps({**manifest, "version": 4}))
    with pytest.raises(PrepareError, match=r"version 4, written by a newer sharpscale .* Fix: upgrade sharpscale"):
        read_manifest(root)


def test_a_version_2_jpeg_folder_still_loads(tmp_path):
    src = _folder(tmp_path / "src", per_class=1)
    prepare_folder(src, tmp_path / "out", short_side=16, workers=1)
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    del manifest["form"], manifest["classes"]
    (tmp_path / "out" / MANIFEST).write_text(json.dumps({**manifest, "version": 2}))
    bundle = load_dataset("imagefolder", root=tmp_path / "out", img_size=16, augment="none", decode="cpu")
    assert bundle.classes == ("cat", "dog") and len(bundle.val) == 2


def test_a_link_loop_lists_each_real_image_once(tmp_path):
    # Before: os.walk followed train/cat/loop -> train/cat some 40 levels deep, and the class came out 41-fold.
    src = _folder(tmp_path / "src", per_class=2)
    (src / "train" / "cat" / "loop").symlink_to(src / "train" / "cat", target_is_directory=True)
    (src / "train" / "dog" / "again.jpg").symlink_to(src / "train" / "dog" / "0.jpg")
    prepared = prepare_folder(src, tmp_path / "out", short_side=16, workers=1)
    assert prepared.files == {"train": 4, "val": 4}
    assert sorted(p.name for p in (tmp_path / "out" / "train" / "cat").rglob("*.jpg")) == ["0.jpg", "1.jpg"]


def test_a_fifo_named_like_an_image_is_listed_never_opened(tmp_path):
    # Before: the FIFO was opened as an image and the run blocked on it for ever.
    import os
    import threading

    src = _folder(tmp_path / "src", per_class=1)
    os.mkfifo(src / "train" / "cat" / "x.jpg")
    (src / "val" / "dog" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    outcome: list[BaseException] = []

    def prepare():
        try:
            prepare_folder(src, tmp_path / "out", short_side=16, workers=1)
        except BaseException as err:  # the test reads it below, whatever it is
            outcome.append(err)

    worker = threading.Thread(target=prepare, daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive(), "prepare blocked on the FIFO"
    assert len(outcome) == 1 and isinstance(outcome[0], PrepareError)
    text = str(outcome[0])
    assert f"'{src / 'train' / 'cat' / 'x.jpg'}' is a FIFO, not a regular file, so it was not opened" in text
    assert f"'{src / 'val' / 'dog' / 'gone.jpg'}' cannot be read" in text and "Fix: remove it from SOURCE" in text
    assert not (tmp_path / "out").exists()
