"""Does MESA lower lambda_max against vanilla AdamW on the embedded digits? (issue 16; numbers in docs/science.md)

    PYTHONPATH=. nice python docs/experiments/mesa_digits.py --epochs 30 --seeds 0 1
    PYTHONPATH=. python docs/experiments/mesa_digits.py --epochs 30 --seeds 0 1 2 3 4 5 6 7 --jobs 16

Trains tiny models with `trainables.fit` on CPU (vanilla; SAM, the control that shows the measure moves; MESA with
the warmed-up teacher; and MESA with the paper's constant decay from step 0 as it was before the warm-up), then
measures the top Hessian eigenvalue by Lanczos on 512 fixed training images (eval mode) of the final checkpoint.
Prints one Markdown table: per method, the geometric mean over seeds of lambda_max / vanilla's on the same seed
(paired: a seed fixes the initial weights and the data order) with a 95% bootstrap interval over seeds.
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

import optim
from analysis import geometry
from trainables import fit, load_dataset, load_model

ARCHS = {
    "vit": {
        "name": "vit_tiny_patch16_224",
        "kwargs": {
            "patch_size": 4,
            "embed_dim": 64,
            "depth": 2,
            "num_heads": 4,
            "mlp_ratio": 2,
            "global_pool": "avg",
            "class_token": False,
        },
    },
    "mixer": {"name": "mixer_s16_224", "kwargs": {"patch_size": 4, "num_blocks": 2, "embed_dim": 64}},
}
METHODS = {
    "vanilla": ("none", {}),
    "sam": ("sam", {"rho": 0.05}),
    "mesa": ("mesa", {}),
    "mesa_no_warmup": ("mesa", {}),
    # Probes of why MESA does not flatten here: a stronger trajectory term, and one on from the first epoch.
    "mesa_lam3": ("mesa", {"lam": 3.0}),
    "mesa_from_start": ("mesa", {"e_start": 0}),
}
DEFAULT_METHODS = ["vanilla", "sam", "mesa", "mesa_no_warmup"]


def config(arch: str, method: str, seed: int, epochs: int) -> dict:
    name, hp = METHODS[method]
    return {
        "data": {"name": "digits", "img_size": 16, "augment": "basic", "batch_size": 32},
        "model": ARCHS[arch],
        "optimizer": {"base": "adamw", "lr": 0.004, "weight_decay": 0.05, "method": name, "hparams": hp},
        "schedule": {"epochs": epochs, "sched": "cosine", "warmup_epochs": 1},
        "train": {"device": "cpu", "threads": 1, "seed": seed},
    }


def lambda_max(checkpoint: str, images: int = 512) -> float:
    model, cfg = load_model(checkpoint)
    # The same 512 training images for every model, without augmentation: one fixed loss function.
    data = cfg.data.model_copy(update={"augment": "none", "device_resident": False})
    bundle = load_dataset(data, device=torch.device("cpu"))
    items = [bundle.train[i] for i in range(images)]
    x = bundle.prepare(torch.stack([item[0] for item in items]))
    y = torch.tensor([item[1] for item in items])
    batches = [(x[i : i + 128], y[i : i + 128]) for i in range(0, images, 128)]
    result = geometry.top_eigenvalues(
        model, lambda m, b: F.cross_entropy(m(b[0]), b[1]), batches, max_iter=30, tol=1e-3
    )
    return result.eigenvalues[0]


def run_one(job: tuple[str, str, int, int]) -> dict:
    arch, method, seed, epochs = job
    torch.set_num_threads(1)
    paper_decay = optim.MESA.decay
    # The pre-warm-up rule, for comparison: the paper's decay from step 0.
    optim.MESA.decay = (lambda self, t: self.beta) if method == "mesa_no_warmup" else paper_decay
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            final = fit(config(arch, method, seed, epochs), checkpoint_dir=tmp)
            lam = lambda_max(tmp)
    finally:
        optim.MESA.decay = paper_decay
    row = {
        "arch": arch,
        "method": method,
        "seed": seed,
        "train_loss": final["train_loss"],
        "val_acc": final["val_acc"],
        "lambda_max": lam,
        "seconds": time.perf_counter() - t0,
    }
    print(row, flush=True)
    return row


def paired_ratio(rows: list[dict], arch: str, method: str, n_boot: int = 10_000) -> tuple[float, float, float, int]:
    """Geometric mean over seeds of lambda_max(method) / lambda_max(vanilla) on the same seed, and its 95% bootstrap
    interval over seeds (percentile); n = the seeds both have."""
    base = {r["seed"]: r["lambda_max"] for r in rows if r["arch"] == arch and r["method"] == "vanilla"}
    mine = {r["seed"]: r["lambda_max"] for r in rows if r["arch"] == arch and r["method"] == method}
    seeds = sorted(set(base) & set(mine))
    logs = np.log([mine[s] / base[s] for s in seeds])
    if len(logs) < 2:
        return float(np.exp(logs.mean())) if len(logs) else np.nan, np.nan, np.nan, len(logs)
    rng = np.random.default_rng(0)
    boots = logs[rng.integers(0, len(logs), size=(n_boot, len(logs)))].mean(axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return float(np.exp(logs.mean())), float(np.exp(lo)), float(np.exp(hi)), len(logs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--archs", nargs="+", default=list(ARCHS))
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=list(METHODS))
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, one CPU thread each")
    args = parser.parse_args()
    jobs = [(a, m, s, args.epochs) for a in args.archs for m in args.methods for s in args.seeds]
    if args.jobs > 1:
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            rows = pool.map(run_one, jobs, chunksize=1)
    else:
        rows = [run_one(job) for job in jobs]
    print(
        "\n| arch | method | n seeds | train CE loss | val acc | lambda_max median (min-max) | "
        "lambda_max / vanilla, same seed: geometric mean [95% CI over seeds] |"
    )
    print("|---|---|---|---|---|---|---|")
    for arch in args.archs:
        for method in args.methods:
            part = [r for r in rows if r["arch"] == arch and r["method"] == method]
            lams = [r["lambda_max"] for r in part]
            ratio, lo, hi, n = paired_ratio(rows, arch, method)
            shown = "1 (itself)" if method == "vanilla" else f"{ratio:.2f} [{lo:.2f}, {hi:.2f}] (n = {n})"
            print(
                f"| {arch} | {method} | {len(part)} | {np.mean([r['train_loss'] for r in part]):.3f} | "
                f"{np.mean([r['val_acc'] for r in part]):.3f} | {np.median(lams):.1f} ({min(lams):.1f}-{max(lams):.1f}) | "
                f"{shown} |"
            )


if __name__ == "__main__":
    main()
