"""Selection simulation: how often a data-scaling study claims a SAM gain that does not exist, by design.

Synthetic studies with SAM exactly equal to vanilla, as `load_runs` frames (the columns the report reads), fed
through the report's own comparison path: `analysis.split_stages` picks what is compared (the confirm runs where
there are any) and `analysis.sam_gain` states the gain per fraction, paired by seed. The truth (issue 22): error
L(n) = E + B n^-beta with E = 0.03, B = 0.02, beta = 0.7 at 5 fractions 0.05-1.0; a trial's accuracy is 1 - L(n)
plus independent seed noise of `noise_small` points at the smallest fraction falling log-linearly to `noise_large`
at the whole set (the same for every trial: rho does nothing, SAM is vanilla). Two designs:

  best_of_search: today's shipped data_scaling before the confirm stage: per fraction and seed, the best of 4 SAM
      trials (rho searched) against one vanilla trial, chosen on the same validation data that reports them.
  confirm: the confirm stage (studies/confirm.py): the search's trials choose rho on the selection half, and five
      fresh seeds per cell at that choice, scored on the held-out half, are what is compared (5 trials a side).

Claims counted per study: "significant gain": some fraction's gain is significant and positive (the table's
`significant` column where sam_gain gives one, else its interval lies above zero); "grows as data shrinks": the
smallest fraction's gain is significant and positive and larger than the largest fraction's. Target: at most 5%
of studies for each under the confirm design. docs/science.md has the table.

  python -m benchmarks.sim_selection [--studies 400] [--seeds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.runs import split_stages
from analysis.tables import sam_gain
from trainables.naming import CONFIRM_STAGE, SEARCH_STAGE

FRACTIONS = (0.05, 0.1, 0.25, 0.5, 1.0)
E, B, BETA = 0.03, 0.02, 0.7
SEARCH_TRIALS = 4
CONFIRM_SEED_START = 1000  # studies.spec.Confirm's default


def true_accuracy(fraction: float) -> float:
    return 1.0 - (E + B * fraction**-BETA)


def noise_sd(fraction: float, small: float, large: float) -> float:
    """Seed noise (accuracy, not points) at a fraction: `small` points at the smallest, `large` at the whole set."""
    t = (math.log(fraction) - math.log(FRACTIONS[0])) / (math.log(FRACTIONS[-1]) - math.log(FRACTIONS[0]))
    return (small + t * (large - small)) / 100.0


def _row(i: int, stage: str, method: str, fraction: float, seed: int, rho: float | None, split: str, acc: float):
    cell = f"data.fraction={fraction},arch=resnet,method={method}"
    return {
        "run_id": f"r{i}",
        "trial_id": f"t{i}",
        "cell": cell,
        "launch": 1,
        "status": "finished",
        "stage": stage,
        "mlflow_status": "FINISHED",
        "factor.data.fraction": str(fraction),
        "factor.arch": "resnet",
        "factor.method": method,
        "data.fraction": fraction,
        "data.eval_split": split,
        "train.seed": seed,
        "optimizer.method": "sam" if method == "sam" else "none",
        "optimizer.hparams.rho": rho if rho is not None else math.nan,
        "val_acc": acc,
    }


def simulate_runs(
    design: str, rng: np.random.Generator, *, seeds: int = 5, noise_small: float = 1.0, noise_large: float = 0.2
) -> pd.DataFrame:
    """One synthetic study's trial runs (load_runs' columns) under SAM = vanilla, in the given design."""
    rows = []
    for f in FRACTIONS:
        truth, sd = true_accuracy(f), noise_sd(f, noise_small, noise_large)
        if design == "best_of_search":
            for seed in range(seeds):
                rows.append(_row(len(rows), SEARCH_STAGE, "vanilla", f, seed, None, "all", truth + rng.normal(0, sd)))
                for _ in range(SEARCH_TRIALS):
                    rho = float(10 ** rng.uniform(-2, 0))
                    rows.append(_row(len(rows), SEARCH_STAGE, "sam", f, seed, rho, "all", truth + rng.normal(0, sd)))
        elif design == "confirm":
            # The search (SAM cells only, one seed): it chooses rho on the selection half; its values are not compared.
            search = [(float(10 ** rng.uniform(-2, 0)), truth + rng.normal(0, sd)) for _ in range(SEARCH_TRIALS)]
            for rho, acc in search:
                rows.append(_row(len(rows), SEARCH_STAGE, "sam", f, 0, rho, "selection", acc))
            chosen = max(search, key=lambda t: t[1])[0]
            for i in range(seeds):
                seed = CONFIRM_SEED_START + i
                rows.append(_row(len(rows), CONFIRM_STAGE, "vanilla", f, seed, None, "test", truth + rng.normal(0, sd)))
                rows.append(_row(len(rows), CONFIRM_STAGE, "sam", f, seed, chosen, "test", truth + rng.normal(0, sd)))
        else:
            raise ValueError(f"design must be 'best_of_search' or 'confirm', got {design!r}")
    return pd.DataFrame(rows)


def compared_gain(runs: pd.DataFrame) -> pd.DataFrame:
    """The report's gain table of a study: the confirm runs where there are any, else every trial."""
    search, confirm = split_stages(runs)
    compared = confirm if not confirm.empty else search
    return sam_gain(
        compared,
        baseline="vanilla",
        treatment="sam",
        arch="factor.arch",
        method="factor.method",
        fraction="data.fraction",
        seed="train.seed",
        metric="val_acc",
        mode="max",
    )


def _significant_positive(gain: pd.DataFrame) -> pd.Series:
    if "significant" in gain.columns:
        return gain["significant"].fillna(False).astype(bool) & (gain["gain"] > 0)
    return gain["ci_low"] > 0


def claims(gain: pd.DataFrame) -> dict[str, float]:
    """What one study's gain table claims: a significant gain somewhere, and one that grows as data shrinks."""
    table = gain.reset_index()
    table = table.assign(fraction=table["fraction"].astype(float)).sort_values("fraction")
    sig = _significant_positive(table.set_index("fraction")).to_numpy()
    g = table["gain"].to_numpy(dtype=float)
    return {
        "gain_smallest": float(g[0]),
        "gain_largest": float(g[-1]),
        "larger_small": float(g[0] > g[-1]),  # no claim: half the studies under any fair design
        "significant": float(sig.any()),
        "grows": float(bool(sig[0]) and g[0] > g[-1]),
    }


def run(design: str, studies: int, *, seed: int = 0, **kwargs) -> dict[str, float]:
    """Mean of each claim over `studies` simulated studies of `design` (rates as fractions of studies)."""
    rng = np.random.default_rng([seed, 0 if design == "best_of_search" else 1])
    results = [claims(compared_gain(simulate_runs(design, rng, **kwargs))) for _ in range(studies)]
    out = {k: float(np.mean([r[k] for r in results])) for k in results[0]}
    out["studies"] = studies
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", type=int, default=400)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--noise-small", type=float, default=1.0, help="seed noise (points) at fraction 0.05")
    parser.add_argument("--noise-large", type=float, default=0.2, help="seed noise (points) at fraction 1.0")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    rows = {}
    for design in ("best_of_search", "confirm"):
        rows[design] = run(
            design, args.studies, seeds=args.seeds, noise_small=args.noise_small, noise_large=args.noise_large
        )
    print(
        f"SAM = vanilla, {args.studies} studies per design, {args.seeds} seeds, seed noise "
        f"{args.noise_small}-{args.noise_large} points, fractions {FRACTIONS}\n"
    )
    print(
        "| design | mean gain at 0.05 (points) | mean gain at 1.0 (points) | gain at 0.05 > at 1.0 | "
        "'significant' gain | 'grows as data shrinks' |"
    )
    print("|---|---|---|---|---|---|")
    for design, r in rows.items():
        print(
            f"| {design} | {100 * r['gain_smallest']:+.2f} | {100 * r['gain_largest']:+.2f} | "
            f"{100 * r['larger_small']:.0f}% | {100 * r['significant']:.1f}% | {100 * r['grows']:.1f}% |"
        )
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
