"""sharpscale's law forms against estimators M1-M4 on the published learning curves of Alabdulmohsin et al. 2022.

The data (../shared/data/scaling-benchmark/, its README: source, license, columns, the paper's figures) hold 92
curves: 72 few-shot image classification (vision file), 20 language (NMT, LM, BIG-Bench). Each curve is its own
extrapolation problem: fit on its Training=1 points, predict the Training=0 ones (all at larger x), score by the
RMSE of log predictions (natural log). The estimators, written from the paper's equations (not its code):

  M1  eps = beta x^c                                   (a pure power law)
  M2  eps - eps_inf = beta x^c                         (a power law to a floor)
  M3  eps = beta (x^-1 + gamma)^-c                     (Bansal et al. 2022)
  M4  (eps - eps_inf) / (eps_0 - eps)^alpha = beta x^c (eps_0 the random-guessing loss, fixed)

each fitted by least squares on log eps from several starts (c < 0, alpha >= 0, eps_inf in [0, min eps)); M4's
prediction solves its implicit equation by bisection on (eps_inf, eps_0). sharpscale's forms are
`analysis.scaling.fit_law`'s ("saturating"; "broken"; "m4" with the same eps_0; "default", the form fit_law picks
given eps_0: analysis.scaling.default_form), fitted as the report fits them (Huber loss, delta scaled to the
residuals).

  python -m benchmarks.bench_scaling_curves [--data ../shared/data/scaling-benchmark] [--limit N]

prints the RMSE per curve and per domain (median, mean, wins), appends one CSV row per (curve, estimator) to
benchmarks/results/scaling_curves/per_curve.csv with the machine, versions, commit, date and command, and the
per-domain medians and win shares to benchmarks/results/scaling_curves.csv (docs/benchmarks.md's table).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import platform
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.scaling import fit_law
from benchmarks import results

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "scaling-benchmark"
RESULTS = REPO / "benchmarks" / "results" / "scaling_curves" / "per_curve.csv"
PAPER = ("M1", "M2", "M3", "M4")
SHARPSCALE = ("saturating", "broken", "m4", "default")
#: Classes of the few-shot tasks: the random-guessing error 1 - 1/classes is M4's eps_0 (the paper fixes it there).
CLASSES = {"bird": 200, "c": 100, "cal": 101, "inet": 1000}


def load_curves(data: Path = DATA) -> dict[tuple[str, str, str], pd.DataFrame]:
    """(domain, task, model) -> its distinct points (x, loss, training), sorted by x: the LM rows come 4 times each."""
    frames = [pd.read_csv(data / name) for name in ("benchmark.vision.csv", "benchmark.lang.csv")]
    rows = pd.concat(frames, ignore_index=True)
    rows.columns = ["domain", "task", "model", "x", "loss", "training"]
    curves = {}
    for key, part in rows.groupby(["domain", "task", "model"], sort=True):
        curves[tuple(map(str, key))] = part[["x", "loss", "training"]].drop_duplicates().sort_values("x")
    return curves


def chance_loss(domain: str, task: str) -> float:
    """M4's eps_0: the random-guessing error of a few-shot task; 1 for the language losses (rescaled to [0, 1])."""
    if domain == "IC":
        return 1.0 - 1.0 / CLASSES[task.split("_")[0]]
    return 1.0


# ------------------------------------------------------------------------------------- the paper's estimators


def _m4_eps(lx: np.ndarray, e_inf: float, log_beta: float, c: float, alpha: float, eps0: float) -> np.ndarray:
    """Solve (eps - e_inf) / (eps0 - eps)^alpha = beta x^c for eps in (e_inf, eps0): its left side rises in eps."""
    target = log_beta + c * lx
    lo = np.full(lx.shape, e_inf)
    hi = np.full(lx.shape, eps0)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        g = np.log(np.maximum(mid - e_inf, 1e-300)) - alpha * np.log(np.maximum(eps0 - mid, 1e-300)) - target
        lo, hi = np.where(g < 0, mid, lo), np.where(g < 0, hi, mid)
    return 0.5 * (lo + hi)


def _log_model(name: str, p: np.ndarray, lx: np.ndarray, eps0: float) -> np.ndarray:
    if name == "M1":
        return p[0] + p[1] * lx
    if name == "M2":
        return np.log(p[0] + np.exp(p[1] + p[2] * lx))
    if name == "M3":  # beta (x^-1 + gamma)^-c with x^-1 = exp(-lx), gamma = exp(p[2]) > 0
        return p[0] + p[1] * np.logaddexp(-lx, p[2])
    return np.log(np.maximum(_m4_eps(lx, p[0], p[1], p[2], p[3], eps0), 1e-300))


def _starts(name: str, lx: np.ndarray, ly: np.ndarray, eps0: float) -> tuple[list[np.ndarray], tuple]:
    """Starts and bounds in the internal parameters; x is rescaled (lx = log x - its mean) for conditioning."""
    slope, icpt = np.polyfit(lx, ly, 1)
    low = float(np.exp(ly.min()))
    floors = [0.0, 0.5 * low, 0.9 * low, 0.99 * low]
    if name == "M1":
        return [np.array([icpt, min(slope, -1e-6)])], ([-50, -10], [50, 0])
    if name == "M2":
        starts = []
        for e in floors:
            s, i = np.polyfit(lx, np.log(np.maximum(np.exp(ly) - e, 1e-12)), 1)
            starts.append(np.array([e, i, min(s, -1e-6)]))
        return starts, ([0, -50, -10], [low * (1 - 1e-9), 50, 0])
    if name == "M3":
        # eps -> beta gamma^-c as x grows: the floor's log is p0 - p1 p2; starts spread gamma over the x range.
        starts = [np.array([icpt, -min(slope, -1e-6), g]) for g in (-lx.max() - 3, -lx.max(), -lx.mean(), 0.0)]
        return starts, ([-50, 0, -60], [50, 10, 60])
    starts = []
    for e in floors:
        # With e_inf fixed the log form is linear in (log beta, c, alpha): least squares gives the start.
        y = np.log(np.maximum(np.exp(ly) - e, 1e-12))
        design = np.column_stack([np.ones_like(lx), lx, np.log(eps0 - np.exp(ly))])
        coef = np.linalg.lstsq(design, y, rcond=None)[0]
        starts.append(np.array([e, coef[0], min(coef[1], -1e-6), float(np.clip(coef[2], 0.0, 10.0))]))
    return starts, ([0, -50, -10, 0], [low * (1 - 1e-9), 50, 0, 10])


def fit_paper(name: str, x: np.ndarray, loss: np.ndarray, eps0: float):
    """Fit one of M1-M4 to (x, loss) by least squares on log loss; returns predict(x) -> loss."""
    from scipy.optimize import least_squares

    x0 = float(np.exp(np.log(x).mean()))
    lx, ly = np.log(x / x0), np.log(loss)
    starts, (lower, upper) = _starts(name, lx, ly, eps0)
    lower, upper = np.asarray(lower, dtype="float64"), np.asarray(upper, dtype="float64")
    best = None
    for s in starts:
        s = np.clip(s, lower + 1e-12 * (1 + np.abs(lower)), upper - 1e-12 * (1 + np.abs(upper)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = least_squares(lambda p: _log_model(name, p, lx, eps0) - ly, s, bounds=(lower, upper))
        if best is None or res.cost < best.cost:
            best = res
    theta = best.x
    return lambda xs: np.exp(_log_model(name, theta, np.log(np.asarray(xs, dtype="float64") / x0), eps0))


def fit_sharpscale(form: str, x: np.ndarray, loss: np.ndarray, eps0: float):
    """Fit one of sharpscale's forms as the report does ("default": the form fit_law picks given eps0,
    analysis.scaling.default_form); returns predict(x) -> loss."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if form == "default":
            law = fit_law(x, loss, eps0=eps0)
        else:
            law = fit_law(x, loss, form=form, eps0=eps0 if form == "m4" else None)
    return law.predict


# ------------------------------------------------------------------------------------------------- scoring


def log_rmse(predicted: np.ndarray, observed: np.ndarray) -> float:
    """The paper's score: sqrt(mean (log predicted - log observed)^2), natural log."""
    return float(np.sqrt(np.mean((np.log(np.maximum(predicted, 1e-300)) - np.log(observed)) ** 2)))


def score_curve(points: pd.DataFrame, eps0: float, estimators=PAPER + SHARPSCALE) -> dict[str, float]:
    """Each estimator's held-out log RMSE on one curve (NaN where it cannot be fitted to the training points)."""
    train = points[points["training"] == 1]
    test = points[points["training"] == 0]
    x, y = train["x"].to_numpy("float64"), train["loss"].to_numpy("float64")
    out = {}
    for name in estimators:
        try:
            fit = fit_paper if name in PAPER else fit_sharpscale
            predict = fit(name, x, y, eps0)
            out[name] = log_rmse(np.asarray(predict(test["x"].to_numpy("float64"))), test["loss"].to_numpy("float64"))
        except ValueError:  # too few distinct x for the form's parameters
            out[name] = math.nan
    return out


def score_all(curves, estimators=PAPER + SHARPSCALE) -> pd.DataFrame:
    """One row per curve: domain, task, model, and each estimator's log RMSE."""
    rows = []
    for (domain, task, model), points in curves.items():
        rows.append(
            {
                "domain": domain,
                "task": task,
                "model": model,
                **score_curve(points, chance_loss(domain, task), estimators),
            }
        )
    return pd.DataFrame(rows)


def summary(scores: pd.DataFrame, estimators) -> pd.DataFrame:
    """Per domain and estimator: curves, median and mean log RMSE, and the share of curves where it is best
    (ties count for each tied estimator, as the paper's Figure 1 counts them)."""
    rows = []
    for domain, part in scores.groupby("domain", sort=True):
        values = part[list(estimators)]
        best = values.min(axis=1)
        for name in estimators:
            rows.append(
                {
                    "domain": domain,
                    "estimator": name,
                    "curves": int(values[name].notna().sum()),
                    "median": float(values[name].median()),
                    "mean": float(values[name].mean()),
                    "wins": float((values[name] <= best * (1 + 1e-9)).mean()),
                }
            )
    return pd.DataFrame(rows)


def _environment() -> dict[str, str]:
    import scipy

    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "machine": f"CPU: {platform.processor() or platform.machine()} ({os.cpu_count()} cores), no accelerator",
        "versions": f"python {platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}",
        "commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(["python", *sys.argv]),
    }


def write_rows(scores: pd.DataFrame, estimators, path: Path = RESULTS) -> None:
    """Append one CSV row per (curve, estimator) with the run's environment."""
    env = _environment()
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with path.open("a", newline="") as fh:
        writer = csv.writer(fh)
        if new:
            writer.writerow(["domain", "task", "model", "estimator", "log_rmse", *env])
        for _, row in scores.iterrows():
            for name in estimators:
                writer.writerow([row["domain"], row["task"], row["model"], name, f"{row[name]:.6g}", *env.values()])


def summary_rows(table: pd.DataFrame) -> list[dict]:
    """The summary as benchmarks.results rows: per domain and estimator, the median log RMSE and the win share."""
    rows = []
    for _, r in table.iterrows():
        where = f"{r['domain']} ({r['curves']} curves), {r['estimator']}"
        rows.append({"figure": f"median log RMSE, {where}", "value": f"{r['median']:.4g}"})
        rows.append({"figure": f"share of curves best, {where}", "value": f"{r['wins']:.3g}"})
    return rows


def write_summary(table: pd.DataFrame) -> None:
    results.append("scaling_curves", summary_rows(table), device="CPU (no accelerator needed)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="folder with benchmark.vision.csv, benchmark.lang.csv")
    parser.add_argument("--limit", type=int, default=0, help="score only the first N curves (0: all 92)")
    parser.add_argument("--no-write", action="store_true", help="print only; append nothing to benchmarks/results/")
    args = parser.parse_args(argv)
    curves = load_curves(args.data)
    if args.limit:
        curves = dict(list(curves.items())[: args.limit])
    estimators = PAPER + SHARPSCALE
    scores = score_all(curves, estimators)
    pd.set_option("display.width", 200)
    print(scores.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print()
    print(summary(scores, estimators).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if not args.no_write:
        write_rows(scores, estimators)
        write_summary(summary(scores, estimators))
        print(f"\nappended {len(scores) * len(estimators)} rows to {RESULTS} and the summary to scaling_curves.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
