"""Image folders through DALI (trainables.data.dali), run as CPU pipelines (the GPU's graph with its decode on the CPU):
timm's crop-box and flip distributions, eval's central crop, seeded epochs, rank shares, DALI's checkpoints, the
loader's selection and its config errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.stats import binomtest, ks_2samp

pytest.importorskip("nvidia.dali", reason="DALI is not installed (pip install 'sharpscale[dali]'; CI installs it)")

from trainables.config import DataConfig  # noqa: E402
from trainables.data import load_dataset  # noqa: E402
from trainables.data.crops import center_crop_boxes, random_resized_crop_boxes  # noqa: E402
from trainables.data.dali import DaliBatches, FolderDali, build_pipeline, dali_rand_augment_plan  # noqa: E402
from trainables.data.folders import FolderBytes  # noqa: E402

CPU = torch.device("cpu")
OUT = 64


def _ramp(path, h: int, w: int) -> str:
    """A lossless image whose red channel is its column and green its row: a crop shows its own box."""
    y, x = np.mgrid[0:h, 0:w]
    Image.fromarray(np.stack([x, y, np.zeros_like(x)], -1).astype(np.uint8)).save(path)
    return str(path)


def _raw(files, *, train: bool, seed: int = 0, batch: int = 100, size: int = OUT) -> np.ndarray:
    """The pipeline's images of `files` in pixel values (mean 0, std 1/255 undoes the normalisation)."""
    pipe = build_pipeline(
        files, list(range(len(files))), size=size, train=train, batch_size=batch, seed=seed,
        mean=(0.0, 0.0, 0.0), std=(1 / 255,) * 3,
    )  # fmt: skip
    out = [np.array(pipe.run()[0].as_tensor()) for _ in range(-(-len(files) // batch))]
    return np.concatenate(out)[: len(files)]


def _boxes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(top, left, height, width) of each ramp crop, and whether it was flipped: a line fitted to the crop's interior
    red (green) profile gives the box's width (height) from its slope and its start from its intercept."""
    s = x.shape[-1]
    j = np.arange(4, s - 4) + 0.5  # the interior: the resize's edge taps see past the box
    red, green = x[:, 0, :, 4:-4].mean(1), x[:, 1, 4:-4, :].mean(2)
    slope_x = np.polyfit(j, red.T, 1)
    slope_y = np.polyfit(j, green.T, 1)
    flipped = slope_x[0] < 0
    w, h = np.abs(slope_x[0]) * s, slope_y[0] * s
    left = np.where(flipped, slope_x[1] + slope_x[0] * s, slope_x[1]) + 0.5
    top = slope_y[1] + 0.5
    return np.stack([top, left, h, w], 1), flipped


@pytest.mark.parametrize("hw", [(200, 256), (60, 256)])  # the second falls back to the central crop often
def test_crop_boxes_and_flips_have_timms_distribution(tmp_path, hw):
    h, w = hw
    n = 3000
    x = _raw([_ramp(tmp_path / "ramp.png", h, w)] * n, train=True)
    boxes, flipped = _boxes(x)
    torch_boxes = random_resized_crop_boxes(torch.tensor([hw] * 30000), torch.Generator().manual_seed(0)).double()

    def stats(b: np.ndarray) -> dict[str, np.ndarray]:
        top, left, bh, bw = b.T
        return {"scale": bh * bw / (h * w), "log aspect": np.log(bw / bh), "top": top / (h - bh + 1),
                "left": left / (w - bw + 1)}  # fmt: skip

    # Where a crop falls back (no attempt fit), DALI draws timm's box but places it at random, where timm centres it:
    # on the shape that falls back often, the placement is not compared.
    compared = ("scale", "log aspect") if hw == (60, 256) else ("scale", "log aspect", "top", "left")
    dali, timm = stats(np.round(boxes)), stats(torch_boxes.numpy())
    for name in compared:
        assert ks_2samp(dali[name], timm[name]).pvalue > 1e-3, name
    # The torch path flips with probability 0.5 (trainables.data.folders); so does DALI's.
    assert binomtest(int(flipped.sum()), n, 0.5).pvalue > 1e-3


def test_eval_crop_is_timms_central_crop(tmp_path):
    for hw in ((200, 256), (256, 120)):
        x = _raw([_ramp(tmp_path / f"{hw}.png", *hw)], train=False, batch=1, size=48)
        boxes, flipped = _boxes(x)
        assert not flipped.any()
        expected = center_crop_boxes(torch.tensor([hw]), 48).numpy()
        # Within 1.5 output pixels (of a box side / 48 input pixels each): DALI keeps the resized side fractional
        # (69.12, not torchvision's 69) and centres the crop in it, torchvision rounds the offset to an integer.
        np.testing.assert_allclose(boxes, expected, atol=1.5 * expected[0, 2] / 48, err_msg=str(hw))


def _folder(tmp_path, n: int = 48) -> str:
    root = tmp_path / "folder"
    rng = np.random.default_rng(0)
    for split, count in (("train", n), ("val", 12)):
        for i in range(count):
            d = root / split / f"c{i % 3}"
            d.mkdir(parents=True, exist_ok=True)
            hw = (40, 56) if i % 2 else (56, 36)
            Image.fromarray(rng.integers(0, 255, (*hw, 3), dtype=np.uint8)).save(d / f"{i}.jpg", quality=90)
    return str(root)


def _bundle(root: str, augment: str = "basic"):
    return load_dataset("imagefolder", root=root, img_size=32, augment=augment, decode="device", loader="dali")


def _epoch(loader: DaliBatches, seed: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    torch.manual_seed(seed)  # as the loop seeds each epoch
    return list(loader)


@pytest.mark.parametrize("augment", ["basic", "strong"])
def test_same_seed_same_batches(tmp_path, augment):
    train = _bundle(_folder(tmp_path), augment).train
    assert isinstance(train, FolderDali)
    sampler = torch.utils.data.BatchSampler(torch.randperm(len(train)).tolist(), 8, drop_last=True)
    loader = train.device_loader(sampler, CPU)
    a, b, c = _epoch(loader, 1), _epoch(loader, 1), _epoch(loader, 2)
    assert len(a) == len(sampler)
    for (xa, ya, ia), (xb, yb, ib), batch in zip(a, b, sampler):
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and torch.equal(ia, ib)
        # The sampler's order, with the folder's labels: what the torch loader hands over for the same batch.
        assert ia.tolist() == [int(train.indices[i]) for i in batch]
        assert ya.tolist() == [int(train.targets[i]) for i in batch]
        assert xa.dtype == torch.float32 and xa.shape == (8, 3, 32, 32)
    assert any(not torch.equal(xa, xc) for (xa, _, _), (xc, _, _) in zip(a, c))


def test_ranks_read_disjoint_shares(tmp_path):
    from trainables.loop import _GlobalBatchSampler

    train = _bundle(_folder(tmp_path)).train
    seen = []
    for rank in (0, 1):
        sampler = _GlobalBatchSampler(len(train), 16, rank, 2, seed=3)
        seen.append({int(i) for _, _, idx in _epoch(train.device_loader(sampler, CPU), 0) for i in idx})
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) == 16 * (len(train) // 16)


@pytest.mark.parametrize("augment", ["basic", "strong"])
def test_checkpoint_resumes_the_epoch_bit_exactly(tmp_path, augment):
    train = _bundle(_folder(tmp_path), augment).train
    sampler = torch.utils.data.BatchSampler(torch.randperm(len(train)).tolist(), 8, drop_last=True)
    whole = _epoch(train.device_loader(sampler, CPU), 5)
    loader = train.device_loader(sampler, CPU)
    torch.manual_seed(5)
    it = iter(loader)
    first = [next(it), next(it)]
    state = loader.checkpoint()
    del it
    again = train.device_loader(sampler, CPU)
    again.resume(state)
    torch.manual_seed(99)  # the checkpoint, not the global generator, holds the draws
    rest = list(again)
    assert len(rest) == len(whole) - 2
    for (x, y, i), (xw, yw, iw) in zip(first + rest, whole):
        assert torch.equal(x, xw) and torch.equal(y, yw) and torch.equal(i, iw)


def test_eval_passes_repeat(tmp_path):
    val = _bundle(_folder(tmp_path)).val
    batches = torch.utils.data.BatchSampler(range(len(val)), 5, drop_last=False)  # a short last batch
    loader = val.device_loader(batches, CPU)
    a, b = list(loader), list(loader)
    assert [len(y) for _, y, _ in a] == [5, 5, 2]
    assert [i.tolist() for _, _, i in a] == [list(bt) for bt in batches]
    for (xa, _, _), (xb, _, _) in zip(a, b):
        assert torch.equal(xa, xb)


def test_rand_augment_follows_timms_string():
    from timm.data.auto_augment import rand_augment_transform

    from trainables.data.dali import _DALI_OPS
    from trainables.data.registry import DEVICE_RAND_OPS, rand_augment_hparams

    assert DEVICE_RAND_OPS <= set(_DALI_OPS)  # every op the device path applies, DALI applies
    plan = dali_rand_augment_plan(rand_augment_transform("rand-m9-mstd0.5", rand_augment_hparams(224, (0.5,) * 3)))
    assert (plan["n"], plan["m"], plan["skip"]) == (2, 27, 0.5)
    assert "solarize_add" in plan["ops"] and "invert" in plan["ops"]
    plan = dali_rand_augment_plan(rand_augment_transform("rand-m5-n3-inc1", rand_augment_hparams(224, (0.5,) * 3)))
    assert (plan["n"], plan["m"]) == (3, 15)


def test_loader_selection_and_errors(tmp_path, monkeypatch):
    root = _folder(tmp_path)
    # Not on CUDA: today's path stays under auto.
    auto = load_dataset("imagefolder", root=root, img_size=32, decode="device")
    assert type(auto.train) is FolderBytes
    with pytest.raises(ValueError, match=r"data\.loader: 'dali' decodes on the device.*data\.decode='cpu'.*Fix"):
        DataConfig(name="imagefolder", root=root, decode="cpu", loader="dali")
    with pytest.raises(ValueError, match=r"data\.loader: 'dali' is for datasets.*data\.name='cifar10'.*Fix"):
        DataConfig(name="cifar10", root=root, loader="dali")
    import trainables.data.registry as registry

    monkeypatch.setattr(registry, "dali_available", lambda: False)
    with pytest.raises(
        ValueError, match=r"data\.loader: 'dali' needs NVIDIA DALI.*Fix: pip install 'sharpscale\[dali\]'"
    ):
        DataConfig(name="imagefolder", root=root, loader="dali")
    DataConfig(name="imagefolder", root=root)  # auto stays valid without DALI


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: DALI's mixed (GPU) decoder")
def test_dali_by_name_on_cuda_and_auto_keeps_torch(tmp_path):
    root = _folder(tmp_path)
    assert type(load_dataset("imagefolder", root=root, img_size=32, device="cuda").train) is FolderBytes
    bundle = load_dataset("imagefolder", root=root, img_size=32, device="cuda", loader="dali")
    assert isinstance(bundle.train, FolderDali)
    sampler = torch.utils.data.BatchSampler(range(len(bundle.train)), 8, drop_last=True)
    x, y, _ = next(iter(bundle.train.device_loader(sampler, torch.device("cuda"))))
    assert x.is_cuda and y.is_cuda and x.shape == (8, 3, 32, 32) and x.dtype == torch.float32
