"""The real thing on real GPUs: a shipped study through Ray Tune + Optuna + MLflow, and a 2-GPU Ray Train trial.

  python -m benchmarks.bench_ray_gpu study        # studies/rho_sensitivity.yaml, reduced, on fake CIFAR-10, 1 GPU a trial
  python -m benchmarks.bench_ray_gpu ddp          # one trial: 2 Ray Train workers with NCCL vs the same trial in-process

`study` runs the shipped file through the real runner (local Ray cluster, Tune, Optuna, MLflow on SQLite) with
only its size reduced (epochs, training fraction, trials per cell) and prints what MLflow recorded per trial,
the card included. `ddp` checks that 2 workers reproduce the in-process trial's metrics (fp32, SAM with one
global perturbation, which is the same algorithm on 1 or 2 GPUs) and times both at bf16 with SAM's default
per-replica perturbation. Needs Ray, Optuna and MLflow (see docs/benchmarks.md for carrying them to a GPU host).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import yaml  # noqa: E402  (after the quiet environment above, which Ray and MLflow read at import)

from benchmarks.bench_data import write_fake_cifar10  # noqa: E402


def cmd_study(args) -> None:
    import pandas as pd

    from analysis import load_runs
    from studies.runner import run_study
    from trainables.naming import tag

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_fake_cifar10(tmp / "cifar10", n_train=args.n_train, n_test=2000)
        study = yaml.safe_load((REPO / "studies" / f"{args.study}.yaml").read_text())
        study["base"]["data"]["root"] = str(tmp / "cifar10")
        study["base"]["schedule"] = {**study["base"].get("schedule", {}), "epochs": args.epochs, "warmup_epochs": 0}
        study["budget"] = {**study.get("budget", {}), "trials_per_cell": args.trials_per_cell}
        study["storage"] = str(tmp / "runs")
        path = tmp / f"{args.study}.yaml"
        path.write_text(yaml.safe_dump(study))
        uri = f"sqlite:///{tmp / 'mlflow.db'}"
        t0 = time.perf_counter()
        outcome = run_study(path, tracking_uri=uri, smoke=args.smoke)
        wall = time.perf_counter() - t0
        runs = load_runs(path, tracking_uri=uri, smoke=args.smoke)
        from mlflow.tracking import MlflowClient

        client = MlflowClient(uri)
        runs["card"] = [client.get_run(r).data.tags.get(tag("card"), "?") for r in runs["run_id"]]
        cols = ["cell", "status", "card", "optimizer.hparams.rho", "images_per_sec", "val_acc"]
        print(
            f"# {args.study} reduced ({args.epochs} epochs, {args.n_train} fake CIFAR-10 images, "
            f"{args.trials_per_cell} trials per searched cell): {outcome.trials} trials, {outcome.errored} errored, "
            f"{wall:.0f} s wall"
        )
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(runs[cols].sort_values("cell").to_string(index=False))


def _ddp_config(
    root: Path, *, method_hparams: dict, precision: str, global_eps: bool, epochs: int, augment: str
) -> dict:
    return {
        "model": {"name": "vit_small_patch16_224", "kwargs": {"patch_size": 4}},
        "data": {"name": "cifar10", "root": str(root), "augment": augment, "batch_size": 512, "eval_batch_size": 1000},
        "optimizer": {"method": "sam", "lr": 1e-3, "hparams": method_hparams, "global_perturbation": global_eps},
        "schedule": {"epochs": epochs, "sched": "cosine"},
        "train": {"device": "cuda", "precision": precision, "seed": 0, "checkpoint_every": 1000},
    }


def cmd_ddp(args) -> None:
    import ray
    import torch

    from trainables import fit
    from trainables.ray_train import DistributedPlan, fit_distributed

    # Determinism for the metric comparison: no TF32, deterministic cuDNN paths where they exist.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    card = torch.cuda.get_device_name()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_fake_cifar10(tmp / "cifar10", n_train=args.n_train, n_test=2000)
        ray.init(num_gpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        plan = DistributedPlan(workers=2, cpus_per_worker=4, gpus_per_worker=1, storage_path=str(tmp / "train"))
        try:
            rows = []
            # Augmentation draws are seeded per rank, so the metric check trains without it.
            for label, precision, global_eps, epochs, augment in (
                ("fp32, global eps, no augmentation (metrics)", "fp32", True, 2, "none"),
                ("bf16, per-replica eps, basic augmentation (speed)", "bf16", False, 3, "basic"),
            ):
                cfg = _ddp_config(
                    tmp / "cifar10",
                    method_hparams={"rho": 0.05},
                    precision=precision,
                    global_eps=global_eps,
                    epochs=epochs,
                    augment=augment,
                )
                seen: list[float] = []
                one = fit(cfg, reporter=lambda m, c: seen.append(m["images_per_sec"]))
                one_ips = max(seen[1:]) if len(seen) > 1 else seen[-1]
                result = fit_distributed(cfg, plan=plan, name=f"ddp-{precision}")
                two = result.metrics
                rows.append((label, one, two, one_ips))
        finally:
            ray.shutdown()
    print(
        f"# one trial (ViT-S/4 @32, global batch 512, SAM rho 0.05, fake CIFAR-10 {args.n_train} images): "
        f"Ray Train 2 workers x {card} (NCCL) vs in-process on 1 GPU"
    )
    print("| run | metric | in-process | 2 workers | relative difference |")
    print("| --- | --- | --- | --- | --- |")
    for label, one, two, one_ips in rows:
        for key in ("train_loss", "train_acc", "val_loss", "val_acc"):
            a, b = one[key], two[key]
            print(f"| {label} | {key} | {a:.6f} | {b:.6f} | {abs(a - b) / max(abs(a), 1e-12):.2e} |")
        print(
            f"| {label} | images/s (last epoch) | {one_ips:,.0f} | {two['images_per_sec']:,.0f} | "
            f"ratio {two['images_per_sec'] / one_ips:.2f}x |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="part", required=True)
    s = sub.add_parser("study")
    s.add_argument("--study", default="rho_sensitivity")
    s.add_argument("--epochs", type=int, default=2)
    s.add_argument("--n-train", type=int, default=10_000)
    s.add_argument("--trials-per-cell", type=int, default=2)
    s.add_argument("--smoke", action="store_true", help="the study's --smoke form on CPU: checks the script only")
    s.set_defaults(func=cmd_study)
    d = sub.add_parser("ddp")
    d.add_argument("--n-train", type=int, default=20_480)
    d.set_defaults(func=cmd_ddp)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
