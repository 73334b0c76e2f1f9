"""Per-interval coverage of the report's exploratory intervals under the null of `sim_report_null`.

`benchmarks/sim_report_null.py` counts reports in which *any* exploratory interval excludes its null (a data
multiplier of 1, a law difference of 0); on data_scaling.yaml that is a family of 30 multiplier intervals (3 archs x
2 method pairs x 5 fractions) and 18 law-difference intervals (3 archs x 2 pairs x E, B, beta), none adjusted, so a
high share of reports with one exclusion is what calibrated per-comparison intervals give. This script measures
each interval on its own: the same null draws (`sim_report_null.null_records`, its confirm runs), through the
functions `write_report` calls (`scaling_table`, `fit_scaling_table`, `data_multiplier`, `paired_law_difference`
in the report's saturating form), no MLflow store. One row per quantity (multiplier at each fraction, each law
parameter): intervals, how many exclude the null, how many are absent, the rate with its Clopper-Pearson 95%
interval, and the share of reports where some interval of that quantity excludes it.

    python -m benchmarks.sim_null_intervals --design studies/data_scaling.yaml --reports 150 \
        --csv benchmarks/results/null_intervals.csv
    python -m benchmarks.sim_null_intervals --markdown benchmarks/results/null_intervals.csv
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.sim_report_null import _design, _machine, clopper_pearson, null_records


def confirm_frame(design: dict, records: list[dict]) -> pd.DataFrame:
    """The confirm runs of one null launch as a runs frame in the columns `scaling_table` reads."""
    rows = []
    for r in records:
        if r["seed"] is None:  # search trials: the report compares confirm runs
            continue
        cell = design["cells"][r["cell"]]
        flat = {**cell.levels}
        rows.append(
            {
                "run_id": r["name"],
                "status": "finished",
                "factor.arch": str(flat["arch"]),
                "factor.method": str(flat["method"]),
                "data.fraction": float(flat["data.fraction"]),
                "train.seed": r["seed"],
                "val_acc": r["value"],
                "optimizer.method": str(cell.config["optimizer"]["method"]),
                "data.augment": str(cell.config["data"]["augment"]),
            }
        )
    return pd.DataFrame(rows)


def one_replicate(design: dict, seed: int, *, laws: bool = True) -> list[dict]:
    """Every exploratory interval of one null report: (quantity, arch, pair, excludes, absent)."""
    from analysis.scaling import data_multiplier, fit_scaling_table, paired_law_difference, table_points
    from analysis.tables import method_pairs, scaling_table

    runs = confirm_frame(design, null_records(design, np.random.default_rng(seed)))
    table = scaling_table(runs, fraction="data.fraction")
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fits = fit_scaling_table(table, n_boot=200, seed=seed)
        for arch in sorted(runs["factor.arch"].unique()):
            for level, base in method_pairs(runs):
                for f in sorted(runs["data.fraction"].unique()):
                    lo, hi = data_multiplier(fits[(arch, base)], fits[(arch, level)], float(f)).interval
                    out.append(_row(seed, f"multiplier at {f:g}", arch, level, lo, hi, 1.0))
                if not laws:
                    continue
                n, e_t, s = table_points(table, arch, level)
                _, e_b, _ = table_points(table, arch, base)
                diff = paired_law_difference(n, e_t, e_b, s, form="saturating")
                for p, row in diff.iterrows():
                    out.append(_row(seed, f"law difference {p}", arch, level, row["diff_low"], row["diff_high"], 0.0))
    return out


def _row(seed: int, quantity: str, arch: str, pair: str, lo: float, hi: float, null: float) -> dict:
    absent = not (lo <= hi)
    return {
        "seed": seed,
        "quantity": quantity,
        "arch": arch,
        "pair": pair,
        "absent": absent,
        "excludes": (not absent) and (lo > null or hi < null),
    }


def summarise(design_name: str, rows: list[dict], seconds: float) -> pd.DataFrame:
    """One row per quantity: intervals, exclusions, absent intervals, rate (CP 95%), reports with one excluding."""
    frame = pd.DataFrame(rows)
    out = []
    for quantity, part in frame.groupby("quantity", sort=False):
        present = part[~part["absent"]]
        k, n = int(present["excludes"].sum()), len(present)
        lo, hi = clopper_pearson(k, n) if n else (float("nan"), float("nan"))
        out.append(
            {
                "design": design_name,
                "quantity": quantity,
                "reports": part["seed"].nunique(),
                "intervals": n,
                "excluding": k,
                "absent": int(part["absent"].sum()),
                "rate": k / max(n, 1),
                "cp_low": lo,
                "cp_high": hi,
                "reports_with_one_excluding": float(part.groupby("seed")["excludes"].any().mean()),
                "seconds": round(seconds),
                **_machine(),
            }
        )
    return pd.DataFrame(out)


def markdown(csv: Path) -> str:
    """The table docs/science.md carries: the newest run's rows of a --csv file (its last commit and seconds)."""
    frame = pd.read_csv(csv)
    last = frame[(frame["commit"] == frame["commit"].iloc[-1]) & (frame["seconds"] == frame["seconds"].iloc[-1])]
    lines = [
        "| quantity (null value) | null reports | intervals excluding the null (Clopper-Pearson 95%) | absent "
        "| reports where one of its 6 excludes it |",
        "|---|---|---|---|---|",
    ]
    for r in last.itertuples():
        null = "1" if r.quantity.startswith("multiplier") else "0"
        lines.append(
            f"| {r.quantity} ({null}) | {r.reports} | {r.excluding}/{r.intervals} = {r.rate:.1%} "
            f"({r.cp_low:.1%}-{r.cp_high:.1%}) | {r.absent} | {r.reports_with_one_excluding:.1%} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--design", type=Path, default=Path("studies/data_scaling.yaml"))
    ap.add_argument("--reports", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--csv", type=Path, help="append the per-quantity rows here")
    ap.add_argument("--markdown", type=Path, help="a --csv file: print its newest run's table (docs/science.md)")
    args = ap.parse_args()
    if args.markdown is not None:
        print(markdown(args.markdown))
        return
    design = _design(args.design)
    t0 = time.time()
    rows = [r for i in range(args.reports) for r in one_replicate(design, args.seed + i)]
    table = summarise(args.design.name, rows, time.time() - t0)
    print(table.drop(columns=["date", "machine", "commit"]).to_string(index=False))
    if args.csv is not None:
        table.to_csv(args.csv, mode="a", header=not args.csv.exists(), index=False)


if __name__ == "__main__":
    main()
