"""`sharpscale calibrate`: how many of a study's trials should share one GPU, measured, never guessed.

A trial whose step cannot fill its GPU (launch-bound at small images and batches) leaves it partly idle; trials
sharing the GPU fill it (`resources.gpus_per_trial` below 1). How much sharing pays is measured here: the cell's own
model, method, image size and batch, on synthetic data already on the device, trained by 1, 2, ... copies of the
trial running at once on one GPU; the aggregate images per second of each count decides the fraction.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["MIN_GAIN", "Calibration", "calibrate", "probe_config", "recommend"]

# A further trial on the GPU must add at least this share of aggregate throughput to be worth its memory and its
# slower epochs (each trial's own epoch takes longer when it shares the GPU).
MIN_GAIN = 0.10


@dataclass(frozen=True)
class Calibration:
    """Aggregate training images per second with `k` trials sharing one device, and the count recommended."""

    cell: str
    device: str  # the card, as torch names it
    aggregate: dict[int, float]  # k -> summed images_per_sec of the k trials' measured epochs
    failed: dict[int, str]  # k -> why k trials could not run together (out of memory, ...)
    shares: int  # the recommended number of trials per GPU

    @property
    def gpus_per_trial(self) -> float:
        return round(1.0 / self.shares, 4)

    def lines(self) -> list[str]:
        base = self.aggregate.get(1)
        out = [f"Calibration of cell {self.cell or 'all'} on {self.device} (synthetic data on the device):"]
        out.append("  trials on one GPU   aggregate img/s   vs one trial")
        for k in sorted(self.aggregate):
            ratio = f"{self.aggregate[k] / base:.2f}x" if base else "-"
            out.append(f"  {k:>17}   {self.aggregate[k]:>15,.0f}   {ratio:>12}")
        for k, why in sorted(self.failed.items()):
            out.append(f"  {k:>17}   failed: {why}")
        out.append(
            f"Recommended: resources.gpus_per_trial: {self.gpus_per_trial:g} ({self.shares} trial(s) a GPU: each further "
            f"trial added less than {MIN_GAIN:.0%} of aggregate throughput, or did not fit). Set it in the study file, "
            f"or --set resources.gpus_per_trial={self.gpus_per_trial:g}."
        )
        return out


def recommend(aggregate: dict[int, float], min_gain: float = MIN_GAIN) -> int:
    """The largest k such that every step 1 -> 2 -> ... -> k raised aggregate throughput by at least `min_gain`."""
    if 1 not in aggregate:
        raise ValueError(f"aggregate must hold the one-trial figure (k = 1), got counts {sorted(aggregate)}")
    best = 1
    while best + 1 in aggregate and aggregate[best + 1] >= aggregate[best] * (1.0 + min_gain):
        best += 1
    return best


def probe_config(config: dict[str, Any], *, device: str, steps: int) -> dict[str, Any]:
    """The cell's trial config as a short throughput probe: its model, method, batch and image size, on synthetic
    data held on the device (the data path is not what is measured), two epochs of `steps` steps, no geometry."""
    from trainables.config import TrialConfig
    from trainables.data.registry import DATASETS

    cfg = TrialConfig.load(config)
    data = cfg.data
    spec = DATASETS[data.name]
    # The dataset's classes and default size, from its registry entry; where the data decide the classes (an image
    # folder, synthetic data), the config's synthetic_classes (10 unless set).
    classes = spec.num_classes if spec.num_classes is not None else data.synthetic_classes
    size = data.img_size or spec.default_size
    tree = cfg.model_dump(mode="json")
    tree["data"] = {
        "name": "synthetic",
        "img_size": size,
        "batch_size": data.batch_size,
        "accumulate": data.accumulate,
        "synthetic_samples": data.batch_size * steps,
        "synthetic_classes": classes,
        "num_workers": 0,
    }
    tree["schedule"] = {**tree["schedule"], "epochs": 2, "warmup_epochs": 0}
    tree["train"] = {**tree["train"], "device": device, "eval_every": 2, "checkpoint_every": 2}
    tree["geometry"] = {}
    return tree


def _one(config: dict[str, Any], start, results) -> None:
    # A spawned process: its own CUDA context, as a Tune trial's actor has.
    import torch

    from trainables.loop import fit

    seen: list[float] = []
    start.wait()  # every copy starts training together
    try:
        fit(config, reporter=lambda m, _: seen.append(m["images_per_sec"]))
        results.put(("ok", seen[-1]))  # the second epoch: the first pays for warm-up
    except torch.cuda.OutOfMemoryError as err:
        results.put(("failed", f"out of memory ({str(err).splitlines()[0][:120]})"))
    except Exception as err:  # noqa: BLE001 - any failure of k copies means k do not share well
        results.put(("failed", f"{type(err).__name__}: {str(err)[:160]}"))


def _run_together(config: dict[str, Any], k: int, timeout_s: float) -> tuple[float | None, str | None]:
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(k), ctx.Queue()
    procs = [ctx.Process(target=_one, args=(config, start, results), daemon=True) for _ in range(k)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    outcomes = []
    try:
        for _ in range(k):
            outcomes.append(results.get(timeout=max(1.0, deadline - time.monotonic())))
    except Exception:  # noqa: BLE001 - queue.Empty: a copy hung or died without a word
        outcomes.append(("failed", f"no result within {timeout_s:.0f} s"))
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    failed = [why for status, why in outcomes if status != "ok"]
    if failed:
        return None, failed[0]
    return float(sum(value for _, value in outcomes)), None


def calibrate(
    config: dict[str, Any],
    *,
    cell: str = "",
    max_shares: int = 4,
    steps: int = 30,
    device: str = "cuda",
    timeout_s: float = 300.0,
) -> Calibration:
    """Measure 1, 2, ... up to `max_shares` copies of the trial `config` training at once on one device; stops at
    the first count that fails or gains less than MIN_GAIN (a further count could not be recommended anyway)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        from trainables.errors import UserError

        raise UserError(
            "calibrate: measures trials sharing a GPU, and torch sees none here. Fix: run it on a node of the cluster "
            "the study runs on (same card), e.g. `ray exec ray_cluster.yaml 'sharpscale calibrate ...'`."
        )
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    probe = probe_config(config, device=device, steps=steps)
    aggregate: dict[int, float] = {}
    failed: dict[int, str] = {}
    for k in range(1, max_shares + 1):
        value, why = _run_together(probe, k, timeout_s)
        if value is None:
            failed[k] = why or "failed"
            break
        aggregate[k] = value
        if k > 1 and value < aggregate[k - 1] * (1.0 + MIN_GAIN):
            break
    if 1 not in aggregate:
        from trainables.errors import UserError

        raise UserError(f"calibrate: one trial of cell {cell or 'all'} alone failed on {name}: {failed.get(1)}.")
    return Calibration(cell, name, aggregate, failed, recommend(aggregate))
