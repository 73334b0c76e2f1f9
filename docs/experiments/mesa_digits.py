"""Does MESA lower lambda_max against vanilla AdamW on the embedded digits? (issue 16; numbers in docs/science.md)

    PYTHONPATH=. nice python docs/experiments/mesa_digits.py --epochs 30 --seeds 0 1

Trains tiny models with `trainables.fit` on CPU (vanilla, MESA with the warmed-up teacher, and MESA with the
paper's constant decay from step 0 as it was before the warm-up), then measures the top Hessian eigenvalue by
Lanczos on 512 fixed training images (eval mode) of the final checkpoint. Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

import optim
from analysis import geometry
from trainables import fit, load_dataset, load_model

ARCHS = {
    "vit": {"name": "vit_tiny_patch16_224", "kwargs": {"patch_size": 4, "embed_dim": 64, "depth": 2, "num_heads": 4,
                                                        "mlp_ratio": 2, "global_pool": "avg", "class_token": False}},
    "mixer": {"name": "mixer_s16_224", "kwargs": {"patch_size": 4, "num_blocks": 2, "embed_dim": 64}},
}
METHODS = {"vanilla": ("none", {}), "mesa": ("mesa", {}), "mesa_no_warmup": ("mesa", {})}


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
    result = geometry.top_eigenvalues(model, lambda m, b: F.cross_entropy(m(b[0]), b[1]), batches, max_iter=30, tol=1e-3)
    return result.eigenvalues[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--archs", nargs="+", default=list(ARCHS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    args = parser.parse_args()
    paper_decay = optim.MESA.decay
    rows = []
    for arch in args.archs:
        for method in args.methods:
            for seed in args.seeds:
                # The pre-warm-up rule, for comparison: the paper's decay from step 0.
                optim.MESA.decay = (lambda self, t: self.beta) if method == "mesa_no_warmup" else paper_decay
                with tempfile.TemporaryDirectory() as tmp:
                    t0 = time.perf_counter()
                    final = fit(config(arch, method, seed, args.epochs), checkpoint_dir=tmp)
                    lam = lambda_max(tmp)
                rows.append({"arch": arch, "method": method, "seed": seed, "train_loss": final["train_loss"],
                             "val_acc": final["val_acc"], "lambda_max": lam, "seconds": time.perf_counter() - t0})
                print(rows[-1], flush=True)
    optim.MESA.decay = paper_decay
    print(f"\n| arch | method | n seeds | train loss | val acc | lambda_max (per seed) | lambda_max / vanilla |")
    print("|---|---|---|---|---|---|---|")
    for arch in args.archs:
        base = np.mean([r["lambda_max"] for r in rows if r["arch"] == arch and r["method"] == "vanilla"] or [np.nan])
        for method in args.methods:
            part = [r for r in rows if r["arch"] == arch and r["method"] == method]
            lams = [r["lambda_max"] for r in part]
            print(f"| {arch} | {method} | {len(part)} | {np.mean([r['train_loss'] for r in part]):.3f} | "
                  f"{np.mean([r['val_acc'] for r in part]):.3f} | {', '.join(f'{v:.2f}' for v in lams)} | "
                  f"{np.mean(lams) / base:.2f} |")


if __name__ == "__main__":
    main()
