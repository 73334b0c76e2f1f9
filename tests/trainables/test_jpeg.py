"""The device path of image folders (trainables.data: crops, rand_augment, folders), run on CPU tensors: the host path's crop boxes, flip rate,
eval crop and RandAugment ops and draws, seeded, through `trainables.fit`, and `data.decode`'s rules."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.stats import binomtest, ks_2samp

from trainables import fit
from trainables.config import ConfigError, TrialConfig
from trainables.data import load_dataset
from trainables.data.crops import random_resized_crop_boxes
from trainables.data.rand_augment import DeviceRandAugment, apply_op, level_args
from trainables.data.registry import DEVICE_RAND_OPS, rand_augment_hparams
from trainables.metrics import VALIDATION_SAMPLES

CPU = torch.device("cpu")


def _smooth_image(h: int, w: int, seed: int) -> np.ndarray:
    """A smooth random RGB image (coarse noise upsampled): resampling differences stay small on it."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (h // 16 + 2, w // 16 + 2, 3), dtype=np.uint8)
    return np.asarray(Image.fromarray(coarse).resize((w, h), Image.Resampling.BICUBIC))


def _write_folder(root: Path, sizes: list[tuple[int, int]], per_class: int = 4) -> Path:
    for split in ("train", "val"):
        for c in ("a", "b"):
            d = root / split / c
            d.mkdir(parents=True)
            for i in range(per_class):
                h, w = sizes[i % len(sizes)]
                Image.fromarray(_smooth_image(h, w, seed=i + 10 * (c == "b"))).save(d / f"{i}.jpg", quality=95)
    # A PNG among the JPEGs: decoded alone on the host, the batch still goes through.
    Image.fromarray(_smooth_image(40, 56, seed=99)).save(root / "train" / "a" / "png.png")
    return root


# --------------------------------------------------------------------------- crop boxes and flips


@pytest.mark.parametrize("hw", [(375, 500), (500, 333), (90, 500)])  # the last one falls back to the central crop often
def test_random_resized_crop_boxes_have_timms_distribution(hw):
    from timm.data.transforms import RandomResizedCropAndInterpolation

    n = 30000  # KS then tells a scale range of (0.1, 1) from (0.08, 1)
    h, w = hw
    device = random_resized_crop_boxes(torch.tensor([hw] * n), torch.Generator().manual_seed(0)).double()
    random.seed(0)
    img = Image.new("RGB", (w, h))
    host = torch.tensor(
        [RandomResizedCropAndInterpolation.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3)) for _ in range(n)]
    ).double()

    def stats(boxes: torch.Tensor) -> dict[str, np.ndarray]:
        top, left, bh, bw = boxes.unbind(1)
        return {
            "scale": (bh * bw / (h * w)).numpy(),
            "log aspect": torch.log(bw / bh).numpy(),
            "top": (top / (h - bh + 1)).numpy(),
            "left": (left / (w - bw + 1)).numpy(),
        }

    for (name, d), (_, c) in zip(stats(device).items(), stats(host).items()):
        assert ks_2samp(d, c).pvalue > 1e-3, name
    top, left, bh, bw = device.unbind(1)
    assert bool(((top >= 0) & (left >= 0) & (top + bh <= h) & (left + bw <= w) & (bh >= 1) & (bw >= 1)).all())


def _gradient_jpeg(path: Path) -> Path:
    # Brightness grows to the right: every crop shows which way it was flipped.
    row = np.linspace(0, 255, 256).astype(np.uint8)
    Image.fromarray(np.repeat(np.tile(row, (192, 1))[..., None], 3, axis=2)).save(path, quality=95)
    return path


def _flipped(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x[..., :half].float().mean((1, 2, 3)) > x[..., half:].float().mean((1, 2, 3))


@pytest.mark.parametrize("augment", ["basic", "strong"])
def test_device_flips_at_the_host_rate(tmp_path, augment):
    _gradient_jpeg(_write_folder(tmp_path, [(64, 64)], per_class=1) / "train" / "a" / "0.jpg")
    n = 400
    dev = load_dataset("imagefolder", root=tmp_path, img_size=32, augment=augment, decode="device")
    host = load_dataset("imagefolder", root=tmp_path, img_size=32, augment="basic", decode="cpu")
    position = list(host.train.indices).index(0)  # train/a/0.jpg
    images = dev.train.images(dev.train.collate([dev.train.read(position)]), CPU).repeated(n)
    x = dev.train.transform(images, CPU, torch.Generator().manual_seed(1))
    if augment == "basic":
        device_flips = int(_flipped(x).sum())
    else:  # RandAugment may rotate, solarize or invert a crop: count flips on the same draws without it
        ra, dev.train.rand_augment = dev.train.rand_augment, None
        device_flips = int(_flipped(dev.train.transform(images, CPU, torch.Generator().manual_seed(1))).sum())
        dev.train.rand_augment = ra
    torch.manual_seed(1)
    host_flips = int(sum(bool(_flipped(host.train[position][0][None])) for _ in range(n)))
    for flips in (device_flips, host_flips):
        assert binomtest(flips, n, 0.5).pvalue > 1e-3
    assert binomtest(device_flips, n, host_flips / n).pvalue > 1e-4


def test_eval_crop_and_decode_match_the_host_transform(tmp_path):
    _write_folder(tmp_path, [(75, 100), (100, 66), (64, 64)], per_class=3)
    host = load_dataset("imagefolder", root=tmp_path, img_size=32, augment="none", decode="cpu")
    dev = load_dataset("imagefolder", root=tmp_path, img_size=32, augment="none", decode="device")
    assert type(dev.val).__name__ == "FolderBytes" and type(host.val).__name__ != "FolderBytes"
    for split in ("train", "val"):
        a, b = getattr(host, split), getattr(dev, split)
        assert len(a) == len(b)
        for i in range(len(a)):
            ha, hb = a[i], b[i]
            assert ha[1:] == hb[1:]
            # Bicubic (PIL) against area-averaged bilinear (roi_align): close on smooth images, in normalised units.
            assert (ha[0] - dev.prepare(hb[0][None])[0]).abs().mean() < 0.05, (split, i)


# --------------------------------------------------------------------------- RandAugment


def _timm_rand_augment(config: str = "rand-m9-mstd0.5", size: int = 64):
    from timm.data.auto_augment import rand_augment_transform

    return rand_augment_transform(
        config, {**rand_augment_hparams(size, (0.485, 0.456, 0.406)), "interpolation": Image.Resampling.BICUBIC}
    )


@pytest.mark.parametrize("name", sorted(DEVICE_RAND_OPS))
def test_level_args_are_timms(name):
    from timm.data.auto_augment import LEVEL_TO_ARG

    hparams = {**rand_augment_hparams(64, (0.5, 0.5, 0.5)), "translate_pct": 0.45}
    level = LEVEL_TO_ARG[name]
    for m in np.linspace(0.0, 10.0, 41):
        if level is None:
            continue
        random.seed(int(m * 100))
        want = level(float(m), hparams)[0]
        mag = torch.tensor([m])
        got = {float(level_args(name, mag, torch.tensor([neg]), hparams)[0]) for neg in (False, True)}
        assert any(math.isclose(want, g, abs_tol=1e-9) for g in got), (m, want, got)


@pytest.mark.parametrize("name", sorted(DEVICE_RAND_OPS))
def test_each_device_op_matches_pil(name):
    from timm.data.auto_augment import LEVEL_TO_ARG, NAME_TO_OP

    size, fill = 64, (124, 116, 104)
    hparams = {**rand_augment_hparams(size, (0.485, 0.456, 0.406)), "translate_pct": 0.45}
    pixels = _smooth_image(size, size, seed=3)
    x = torch.from_numpy(pixels.copy()).permute(2, 0, 1)[None].double()
    for m, neg in ((3.0, False), (9.0, True), (7.0, False)):
        arg = level_args(name, torch.tensor([m]), torch.tensor([neg]), hparams)
        args = () if LEVEL_TO_ARG[name] is None else (float(arg[0]) if "Posterize" not in name else int(arg[0]),)
        if "Solarize" in name and args:
            args = (int(args[0]),)
        want = NAME_TO_OP[name](Image.fromarray(pixels), *args, fillcolor=fill, resample=Image.Resampling.BICUBIC)
        want = torch.from_numpy(np.asarray(want)).permute(2, 0, 1).double()
        got = apply_op(name, x.clone(), arg, mode="bicubic", fill=fill)[0]
        diff = (got - want).abs()
        # Whole-pixel agreement for point ops; resampled ops may differ by a bicubic kernel's rounding and edges.
        geometric = name.startswith(("Rotate", "Shear", "Translate"))
        assert diff.mean() < (2.0 if geometric else 0.6), (m, neg, float(diff.mean()))
        assert (diff > 24).float().mean() < (0.03 if geometric else 0.005), (m, neg)


def test_rand_augment_draws_have_timms_rates():
    ra = _timm_rand_augment("rand-m9-mstd0.5")
    n = 20000
    layers = DeviceRandAugment(ra).draws(n, torch.Generator().manual_seed(0))
    assert len(layers) == ra.num_layers == 2
    k = len(ra.ops)
    for d in layers:
        counts = torch.bincount(d["op"], minlength=k).numpy()
        from scipy.stats import chisquare

        assert chisquare(counts).pvalue > 1e-3  # uniform over the ops, with replacement
        assert binomtest(int(d["apply"].sum()), n, ra.ops[0].prob).pvalue > 1e-3
        mag = d["magnitude"].numpy()
        rng = np.random.default_rng(0)  # timm: gauss(m, mstd), clipped to [0, 10]
        ref = np.clip(rng.normal(ra.ops[0].magnitude, ra.ops[0].magnitude_std, n), 0, 10)
        assert ks_2samp(mag, ref).pvalue > 1e-3
        assert binomtest(int(d["negate"].sum()), n, 0.5).pvalue > 1e-3
    # Each layer draws independently: both layers pick the same op about 1/k of the time.
    same = int((layers[0]["op"] == layers[1]["op"]).sum())
    assert binomtest(same, n, 1 / k).pvalue > 1e-3


# --------------------------------------------------------------------------- through fit, and the setting


@pytest.mark.parametrize(("augment", "workers"), [("basic", 0), ("strong", 1)])
def test_fit_on_the_device_path_on_cpu_is_seeded(tmp_path, tiny_model, augment, workers):
    _write_folder(tmp_path, [(40, 50), (50, 36)], per_class=6)
    cfg = {
        "model": tiny_model("vit", embed_dim=32),
        "data": {
            "name": "imagefolder",
            "root": str(tmp_path),
            "img_size": 16,
            "augment": augment,
            "decode": "device",
            "batch_size": 4,
            "eval_batch_size": 5,
            "num_workers": workers,
        },
        "optimizer": {"method": "sam", "lr": 1e-3},
        "schedule": {"epochs": 2},
        "train": {"device": "cpu", "threads": 1},
    }
    timing = ("epoch_time_s", "images_per_sec")
    first, second = fit(cfg), fit(cfg)
    assert {k: v for k, v in first.items() if k not in timing} == {k: v for k, v in second.items() if k not in timing}
    assert np.isfinite(first["train_loss"]) and first[VALIDATION_SAMPLES] == 12


def test_decode_auto_picks_the_device_on_cuda_only_and_the_setting_is_checked(tmp_path):
    _write_folder(tmp_path, [(40, 50)], per_class=1)
    assert type(load_dataset("imagefolder", root=tmp_path).train).__name__ == "_FolderImages"  # no device given
    assert type(load_dataset("imagefolder", root=tmp_path, device="cpu").train).__name__ == "_FolderImages"
    with pytest.raises(ConfigError) as err:
        TrialConfig.load({"data": {"name": "digits", "decode": "device"}})
    assert "data.decode" in str(err.value) and "'digits'" in str(err.value)
    # A RandAugment set with ops the device lacks (timm's '3a': desaturate, blur): refused on 'device' ...
    bad = {"name": "imagefolder", "root": str(tmp_path), "augment": "strong", "randaugment": "rand-m9-t3a"}
    with pytest.raises(ConfigError) as err:
        TrialConfig.load({"data": {**bad, "decode": "device"}})
    assert "data.decode" in str(err.value) and "Desaturate" in str(err.value)
    # ... and auto keeps it on the host for a CUDA trial (deciding needs no GPU), which otherwise decodes on the device.
    assert type(load_dataset(TrialConfig.load({"data": bad}).data, device="cuda").train).__name__ == "_FolderImages"
    assert type(load_dataset("imagefolder", root=tmp_path, augment="strong", device="cuda").train).__name__ == (
        "FolderBytes"
    )


def test_weighted_rand_augment_draws_without_replacement_at_timms_weights():
    # 'tweights': timm picks a sample's ops by its weights, without replacement (np.random.choice(replace=False)).
    ra = _timm_rand_augment("rand-m9-mstd0.5-tweights")
    n = 20000
    layers = DeviceRandAugment(ra).draws(n, torch.Generator().manual_seed(0))
    assert bool((layers[0]["op"] != layers[1]["op"]).all())
    from scipy.stats import chisquare

    counts = torch.bincount(layers[0]["op"], minlength=len(ra.ops)).numpy()
    weights = np.asarray(ra.choice_weights)
    assert chisquare(counts, weights / weights.sum() * n).pvalue > 1e-3  # the first pick follows the weights


# --------------------------------------------------------------------------- the same bytes as before the host rework


# What the device augmentation of commit 39f8b88 (op by op, a copy per op) gave on the inputs below: digests of its
# outputs and its generator's state, written by that code itself before it was removed (its text stays in git: the
# parent of 9426b0e). The vectorised host side must reproduce it to the bit, generator reads included. The pixels
# of the geometric ops are torch's CPU kernels', whose rounding differs from one CPU to another (that old code on an
# AMD EPYC with AVX-512 kernels against its default kernels: up to 0.12% of pixels by one level, one pixel by more),
# so each machine kind the old code ran on has its byte digests ("kernel_variants"), and the new code must give one
# kind's bytes exactly; the generator's reads and the draws are the same everywhere and have one digest each.
GOLDEN_39F8B88 = Path(__file__).with_name("jpeg_39f8b88.json")


def _golden() -> dict:
    import json

    return json.loads(GOLDEN_39F8B88.read_text())


def _byte_digests(kind: str, key: str) -> list:
    """Every recorded machine kind's byte digests of one transform case (kind 'transform': a list over its seeds) or
    op (kind 'ops': {mode: digest}), the first written's first."""
    golden = _golden()
    first = golden[kind][key]
    first = (
        [s["bytes"] for s in first["seeds"]] if kind == "transform" else {m: first[m] for m in ("bilinear", "bicubic")}
    )
    return [first, *(v[kind][key] for v in golden.get("kernel_variants", []))]


def _digest(x: torch.Tensor) -> str:
    """The tensor's dtype, shape and bytes, in one sha256."""
    import hashlib

    x = x.contiguous()
    h = hashlib.sha256(f"{x.dtype}{tuple(x.shape)}".encode())
    h.update(x.numpy().tobytes())
    return h.hexdigest()


def _mixed_batch(n: int, seed: int = 0):
    from trainables.data.crops import Images

    rng = np.random.default_rng(seed)
    sizes = [(int(h), int(w)) for h, w in rng.choice([(40, 40), (40, 52), (48, 36), (37, 61)], n)]
    return Images.of(
        [
            torch.from_numpy(_smooth_image(64, 64, seed=i)[:h, :w].copy()).permute(2, 0, 1)
            for i, (h, w) in enumerate(sizes)
        ]
    )


@pytest.mark.parametrize(
    ("config", "interpolation", "ops"),
    [
        ("rand-m9-mstd0.5", "bicubic", None),  # the strong recipe's, as the ImageNet transform builds it
        ("rand-m9-mstd0.5", None, None),  # timm's own default: bilinear or bicubic drawn per op
        ("rand-m7-mstd101-inc1-n3", None, None),  # uniform magnitudes, increasing ops, 3 layers
        ("rand-m9-mstd0.5-tweights", "bilinear", None),  # weighted choice without replacement
        ("rand-m8-n4-mstd1", None, sorted(DEVICE_RAND_OPS)),  # every op the device has
    ],
)
def test_transform_gives_the_bytes_and_draws_of_commit_39f8b88(config, interpolation, ops):
    from timm.data.auto_augment import rand_augment_transform

    from trainables.data.folders import FolderBytes

    old = _golden()["transform"][f"{config}|{interpolation}|{'all' if ops else None}"]
    size, n = 24, 96
    hparams = {**rand_augment_hparams(size, (0.485, 0.456, 0.406)), "translate_pct": 0.45}
    if interpolation is not None:
        hparams["interpolation"] = getattr(Image.Resampling, interpolation.upper())
    ra = rand_augment_transform(config, hparams, transforms=ops)
    new = FolderBytes([], np.arange(0), size, train=True, rand_augment=ra)
    images = _mixed_batch(n)
    assert len(images.groups) == 4
    got_bytes = []
    for seed, want in zip(range(3), old["seeds"], strict=True):
        b = torch.Generator().manual_seed(seed)
        got_bytes.append(_digest(new.transform(images, CPU, b)))
        assert _digest(b.get_state()) == want["generator"]  # the same reads of the generator: later batches agree too
    # Every seed's bytes those of one machine kind the old code ran on (a kind's kernels round alike on every seed).
    assert got_bytes in _byte_digests("transform", f"{config}|{interpolation}|{'all' if ops else None}"), got_bytes
    # The draws themselves, layer by layer.
    draws = new.rand_augment.draws(n, torch.Generator().manual_seed(5))
    for w, g in zip(old["draws"], draws, strict=True):
        assert w.keys() == g.keys() and all(_digest(g[k]) == w[k] for k in w), sorted(g)


@pytest.mark.parametrize("name", sorted(DEVICE_RAND_OPS))
def test_level_args_and_apply_op_are_those_of_commit_39f8b88(name):
    old = _golden()["ops"][name]
    hparams = {**rand_augment_hparams(24, (0.5, 0.5, 0.5)), "translate_pct": 0.45}
    mag = torch.tensor([0.0, 0.25, 1.0, 3.3, 5.0, 7.7, 9.0, 10.0]).repeat(2)
    neg = torch.arange(16) >= 8
    got = level_args(name, mag, neg, hparams)
    want = old["level_args"]
    # To the bit, the sign of a zero included (a -0 rotation or shear is timm's too).
    assert str(got.dtype) == want["dtype"] and list(got.shape) == want["shape"], (got.dtype, got.shape)
    assert [float(v).hex() for v in got.double().flatten()] == want["hex"], got
    x = torch.from_numpy(_smooth_image(24, 32, seed=4).copy()).permute(2, 0, 1)[None].float().expand(16, -1, -1, -1)
    outputs = {
        mode: _digest(apply_op(name, x.clone(), got, mode=mode, fill=(124, 116, 104)))
        for mode in ("bilinear", "bicubic")
    }
    assert outputs in _byte_digests("ops", name), outputs  # both modes one machine kind's bytes


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_to_all_hands_back_each_tensor_from_one_copy(device):
    from trainables.data.crops import _to_all

    host = [
        torch.arange(3),
        torch.linspace(-1, 1, 5),  # 20 bytes: the next tensor starts at a multiple of 8 all the same
        torch.tensor([7, 0, 255], dtype=torch.uint8),
        torch.tensor([[True, False], [False, True]]),
        torch.tensor(2.5, dtype=torch.float64),
        torch.arange(12.0).view(3, 4).T,  # not contiguous
    ]
    out = _to_all(host, torch.device(device))
    assert [(t.dtype, t.shape, t.device.type) for t in out] == [(t.dtype, t.shape, device) for t in host]
    if device == "cpu":
        assert all(torch.equal(a, b) for a, b in zip(out, host))
        assert len({t.untyped_storage().data_ptr() for t in out}) == 1  # views of one buffer


def test_roi_align_operator_is_torchvisions_public_function():
    # crop_resize calls torchvision's registered operator, skipping the public function's Python checks: a pin on the
    # operator's argument order (a torchvision that reorders them fails here).
    from torchvision.ops import roi_align

    from trainables.data.crops import _roi_align

    planes = torch.rand(3, 3, 37, 50, generator=torch.Generator().manual_seed(0)) * 255
    rois = torch.tensor([[0, 1.0, 2.0, 41.0, 30.0], [1, 0.0, 0.0, 50.0, 37.0], [2, 7.5, 3.25, 20.0, 36.0]])
    want = roi_align(planes, rois, (13, 13), spatial_scale=1.0, sampling_ratio=-1, aligned=True)
    assert torch.equal(_roi_align(planes, rois, 13), want)
