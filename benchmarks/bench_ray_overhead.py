"""What Ray Train costs around the loop: one trial through Ray Train (1 worker) against `trainables.fit`, side by side.

Runs on CPU (this project's 2-core machines). For E1 and E2 epochs of the same config it times the in-process
`fit` and `fit_distributed` with one worker, interleaved, and reports Ray's fixed start-up cost (intercept) and
its per-epoch overhead (slope difference), both from wall-clock medians.

  python -m benchmarks.bench_ray_overhead [--repeats 3] [--epochs 1 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

CONFIG = {
    "model": {"name": "mixer_s16_224", "kwargs": {"patch_size": 4, "num_blocks": 2, "embed_dim": 64}},
    "data": {"name": "digits", "img_size": 16, "batch_size": 64},
    "optimizer": {"method": "sam", "hparams": {"rho": 0.05}},
    "schedule": {"warmup_epochs": 0},
    "train": {"device": "cpu", "threads": 1, "seed": 0},
}


def _config(epochs: int) -> dict:
    return {**CONFIG, "schedule": {**CONFIG["schedule"], "epochs": epochs}}


def time_fit(epochs: int) -> float:
    from trainables import fit

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        fit(_config(epochs), checkpoint_dir=d)  # checkpoints every epoch, as the Ray path does
    return time.perf_counter() - t0


def time_ray(epochs: int, storage: str, name: str) -> float:
    from trainables.ray_train import DistributedPlan, fit_distributed

    t0 = time.perf_counter()
    fit_distributed(
        _config(epochs), plan=DistributedPlan(workers=1, cpus_per_worker=1, storage_path=storage), name=name
    )
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, nargs=2, default=[1, 4], metavar=("E1", "E2"))
    args = p.parse_args()

    import ray
    import torch

    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=True, log_to_driver=False, configure_logging=False)
    try:
        times: dict[tuple[str, int], list[float]] = {}
        with tempfile.TemporaryDirectory() as storage:
            for r in range(args.repeats):
                for e in args.epochs:  # interleaved, so load on the machine hits both paths alike
                    times.setdefault(("fit", e), []).append(time_fit(e))
                    times.setdefault(("ray", e), []).append(time_ray(e, storage, f"r{r}e{e}"))
    finally:
        ray.shutdown()

    med = {k: statistics.median(v) for k, v in times.items()}
    e1, e2 = args.epochs
    slope_fit = (med["fit", e2] - med["fit", e1]) / (e2 - e1)
    slope_ray = (med["ray", e2] - med["ray", e1]) / (e2 - e1)
    startup = (med["ray", e1] - slope_ray * e1) - (med["fit", e1] - slope_fit * e1)
    print(f"# Ray Train (1 worker) vs trainables.fit, {os.cpu_count()} CPUs, median of {args.repeats}")
    print("| path | epochs | wall s |")
    print("| --- | --- | --- |")
    for (path, e), v in sorted(med.items()):
        print(f"| {path} | {e} | {v:.2f} |")
    print(f"\nRay's fixed start-up cost: {startup:.2f} s per trial")
    print(
        f"Per-epoch time: fit {slope_fit:.3f} s, Ray Train {slope_ray:.3f} s -> overhead {slope_ray - slope_fit:+.3f} s "
        f"per epoch ({(slope_ray / slope_fit - 1) * 100:+.1f}%)"
    )


if __name__ == "__main__":
    main()
