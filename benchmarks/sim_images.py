"""Coverage of the confirm table's and the paired gain's intervals when runs share their test images, by simulation.

Each simulated study is the confirm stage of the shipped data-scaling design (studies/data_scaling.yaml's
fractions; vanilla and SAM, `--seeds` fresh seeds a cell, no true difference) scored on `--images` test images,
each run's per-image correctness drawn from a model in which the test set's luck is shared:

  run r gets image i right  <=>  a z_(m,i) + b e_(r,i) + d_r > t_c,   a^2 + b^2 = 1

z_(m,i) is image i's difficulty for method m (sqrt(kappa) u_i + sqrt(1 - kappa) v_(m,i): `--arm-corr` kappa of it
shared by both methods, every fraction of a method the same), e_(r,i) the run's own per-image luck, d_r its seed
effect (sd chosen so that one run's accuracy has sd `--noise`), t_c the threshold that makes the cell's population
accuracy (over seeds and images) exactly 1 - L(fraction) of analysis.design.REFERENCE_LAW. a is solved so that
`--common` of a run's binomial variance p (1 - p) / images is common to the runs scored on those images (issue 32's
"half"). The runs, with their records (trainables.scored.ScoredImages.to_text in load_runs' SCORED_COLUMN), go
through `confirm_summary`, `sam_gain` and `gain_family` as a report calls them, once with the records and once
without (the seeds-only fallback), and beside them a two-level percentile bootstrap (seeds and images resampled
jointly, the same image draws for both arms). Measured against the population truth: each 95% interval's coverage,
the simultaneous band's (all fractions at once) and the family-wise rate of "significant" gains.

  PYTHONPATH=. python -m benchmarks.sim_images --studies 400 --seeds 5 3 [--record]

--direct measures the intervals straight from the simulated arrays (analysis.images.crossed_t against the
seed-level t, no tables: fast enough for several `--arm-corr` values; study i drawn from seed 20000 + i):

  PYTHONPATH=. python -m benchmarks.sim_images --direct --studies 250 --seeds 5 3 --arm-corr 0 0.5 0.9

--laws measures instead the scaling-law and compute-matched intervals (`law_study`): law_extrapolation's held-out
prediction interval against the population error at the largest fraction and its check, paired_law_difference's
E and beta against 0, compute_matched_gains' per-fraction gains against 0, each with the records and without:

  PYTHONPATH=. python -m benchmarks.sim_images --laws --studies 400 --seeds 5 3 [--record]

--record appends the figures to benchmarks/results/image_coverage.csv (benchmarks.results).
"""

from __future__ import annotations

import argparse
import functools
import math
import time
import warnings

import numpy as np
import pandas as pd

from analysis.design import REFERENCE_LAW
from analysis.runs import SCORED_COLUMN, confirm_summary
from analysis.tables import gain_family
from trainables.scored import ScoredImages

METHODS = (("vanilla", "none"), ("sam", "sam"))


def fractions() -> tuple[float, ...]:
    from benchmarks.sim_coverage import FRACTIONS

    return FRACTIONS


def population_accuracy(fraction: float) -> float:
    law = REFERENCE_LAW
    return 1.0 - (law["E"] + law["B"] * fraction ** -law["beta"])


@functools.lru_cache(maxsize=None)
def loading(p: float, common: float) -> float:
    """a^2, the correlation of two runs' latents on one image, at which `common` of a run's binomial variance at
    accuracy p is common to runs scored on the same images: Var_i(P(right | image)) = common p (1 - p)."""
    from scipy.optimize import brentq
    from scipy.stats import multivariate_normal, norm

    if common <= 0.0:
        return 0.0
    x = norm.ppf(p)

    def share(rho: float) -> float:
        both = multivariate_normal(mean=[0.0, 0.0], cov=[[1.0, rho], [rho, 1.0]]).cdf([x, x])
        return (both - p * p) / (p * (1.0 - p)) - common

    return float(brentq(share, 1e-9, 1.0 - 1e-9, xtol=1e-10))


def study_runs(
    rng: np.random.Generator,
    *,
    seeds: int,
    images: int,
    noise: float,
    common: float,
    arm_corr: float,
    fracs=None,
) -> tuple[pd.DataFrame, dict, dict]:
    """(runs frame as load_runs gives a confirm stage's runs, with SCORED_COLUMN; the (method, fraction) ->
    (seeds, images) bool correctness; the (method, fraction) -> population accuracy)."""
    from scipy.stats import norm

    fracs = fractions() if fracs is None else fracs
    u = rng.standard_normal(images)
    positions, labels = np.arange(images), np.zeros(images, dtype=np.int64)
    rows, correct, truth = [], {}, {}
    for method, opt in METHODS:
        z = math.sqrt(arm_corr) * u + math.sqrt(1.0 - arm_corr) * rng.standard_normal(images)
        for f in fracs:
            p = population_accuracy(f)
            a2 = loading(p, common)
            a, b = math.sqrt(a2), math.sqrt(1.0 - a2)
            sd_seed = noise / norm.pdf(norm.ppf(p))  # a run's accuracy moves by about phi(t) d_r
            t = -norm.ppf(p) * math.sqrt(1.0 + sd_seed**2)
            d = sd_seed * rng.standard_normal(seeds)
            c = (a * z[None, :] + b * rng.standard_normal((seeds, images)) + d[:, None]) > t
            correct[(method, f)], truth[(method, f)] = c, p
            for s in range(seeds):
                cell = f"arch=resnet,data.fraction={f:g},method={method}"
                text = ScoredImages.of(c[s], dataset="sim", split="test", positions=positions, labels=labels)
                rows.append(
                    {
                        "run_id": f"{cell}/{s}",
                        "cell": f"{cell} seed={s}",
                        "status": "finished",
                        "stage": "confirm",
                        "factor.arch": "resnet",
                        "factor.method": method,
                        "factor.data.fraction": f"{f:g}",
                        "optimizer.method": opt,
                        "data.fraction": f,
                        "train.seed": s,
                        "val_acc": float(c[s].mean()),
                        SCORED_COLUMN: text.to_text(),
                    }
                )
    return pd.DataFrame(rows), correct, truth


def _two_level(values: np.ndarray, rng: np.random.Generator, draws: int, images_idx: np.ndarray) -> tuple[float, float]:
    """The 95% percentile interval of the mean of a (seeds, images) array under the two-level bootstrap: seeds
    drawn with replacement, images by the shared `images_idx` counts (draws, images)."""
    s = values.shape[0]
    per_seed = (
        values.astype("float32") @ images_idx.T / values.shape[1]
    )  # (seeds, draws): each seed's mean on each image draw
    pick = rng.integers(0, s, size=(draws, s))
    stats = per_seed[pick, np.arange(draws)[:, None]].mean(axis=1)
    return float(np.quantile(stats, 0.025)), float(np.quantile(stats, 0.975))


def one_study(
    seed: int,
    *,
    seeds: int,
    images: int = 5000,
    noise: float = 0.005,
    common: float = 0.5,
    arm_corr: float = 0.5,
    draws: int = 200,
) -> dict[str, float]:
    """One simulated study: coverage (1.0 / 0.0, averaged over its cells or fractions) of each interval kind."""
    rng = np.random.default_rng(seed)
    runs, correct, truth = study_runs(rng, seeds=seeds, images=images, noise=noise, common=common, arm_corr=arm_corr)
    out: dict[str, float] = {}
    # One image draw for the whole study: every run is scored on the same images.
    idx = np.stack([np.bincount(rng.integers(0, images, images), minlength=images) for _ in range(draws)])
    idx = idx.astype("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind, frame in (("images", runs), ("seeds", runs.drop(columns=[SCORED_COLUMN]))):
            table = confirm_summary(frame, metric="val_acc")
            covered = []
            for key, row in table.iterrows():
                at = dict(zip(table.index.names, key))
                p = truth[(at["method"], float(at["data.fraction"]))]
                covered.append(row["95% low"] <= p <= row["95% high"])
            out[f"confirm, {kind}"] = float(np.mean(covered))
            (gain,) = gain_family(frame, [("sam", "vanilla")], fraction="data.fraction").values()
            out[f"gain, {kind}"] = float(((gain["ci_low"] <= 0) & (0 <= gain["ci_high"])).mean())
            out[f"band, {kind}"] = float(((gain["band_low"] <= 0) & (0 <= gain["band_high"])).all())
            out[f"any significant, {kind}"] = float(gain["significant"].fillna(False).astype(bool).any())
        covered, gains = [], []
        for (m, f), c in correct.items():
            lo, hi = _two_level(c.astype("float64"), rng, draws, idx)
            covered.append(lo <= truth[(m, f)] <= hi)
            if m == "sam":
                lo, hi = _two_level(c.astype("float64") - correct[("vanilla", f)].astype("float64"), rng, draws, idx)
                gains.append(lo <= 0 <= hi)
        out["confirm, two-level bootstrap"] = float(np.mean(covered))
        out["gain, two-level bootstrap"] = float(np.mean(gains))
    return out


def direct_rates(studies: int, seeds: int, *, arm_corr: float, images: int = 5000, noise: float = 0.005,
                 common: float = 0.5) -> dict[str, float]:  # fmt: skip
    """Coverage of each cell's population accuracy and of each fraction's gain 0, straight from crossed_t and the
    seed-level t (analysis.scaling.paired_t) on the arrays of `studies` simulated studies."""
    from analysis.images import crossed_t
    from analysis.scaling import paired_t

    hits: dict[str, list[bool]] = {k: [] for k in ("confirm, seeds", "confirm, images", "gain, seeds", "gain, images")}
    for i in range(studies):
        rng = np.random.default_rng(20000 + i)
        _, correct, truth = study_runs(rng, seeds=seeds, images=images, noise=noise, common=common, arm_corr=arm_corr)
        for (m, f), c in correct.items():
            for kind, test in (("seeds", paired_t(c.mean(axis=1))), ("images", crossed_t(c.astype("float64")))):
                hits[f"confirm, {kind}"].append(test.low <= truth[(m, f)] <= test.high)
            if m == "sam":
                d = c.astype("float64") - correct[("vanilla", f)]
                for kind, test in (("seeds", paired_t(d.mean(axis=1))), ("images", crossed_t(d))):
                    hits[f"gain, {kind}"].append(test.low <= 0 <= test.high)
    return {k: float(np.mean(v)) for k, v in hits.items()}


def _series(runs: pd.DataFrame, method: str) -> tuple[np.ndarray, ...]:
    """(n, err, seed, records) of one method's runs, fraction-major as table_points gives them."""
    part = runs[runs["factor.method"] == method].sort_values(["data.fraction", "train.seed"])
    n = part["data.fraction"].to_numpy(dtype="float64")
    err = 1.0 - part["val_acc"].to_numpy(dtype="float64")
    return n, err, part["train.seed"].to_numpy(), part[SCORED_COLUMN].tolist()


def law_study(
    seed: int, *, seeds: int, images: int = 5000, noise: float = 0.005, common: float = 0.5, arm_corr: float = 0.5
) -> dict[str, float]:
    """One simulated study through the law and compute-matched functions as the report calls them, with the runs'
    per-image records and without: whether the held-out prediction's interval covers the population error at the
    largest fraction, whether the check holds 0 (`consistent`; the law is true), whether the paired law
    differences in E and beta hold 0 (no true difference; NaN where a fit leaves the parameter unidentified),
    and the share of compute-matched gains (one per fraction) whose interval holds 0."""
    from analysis.compute import compute_matched_gains
    from analysis.scaling import law_extrapolation, paired_law_difference

    rng = np.random.default_rng(seed)
    runs, correct, truth = study_runs(rng, seeds=seeds, images=images, noise=noise, common=common, arm_corr=arm_corr)
    top = max(fractions())
    n, err_b, s, rec_b = _series(runs, "vanilla")
    _, err_t, _, rec_t = _series(runs, "sam")
    epoch_times = pd.DataFrame({"run_id": [], "metric": [], "value": []})
    out: dict[str, float] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind, with_records in (("images", True), ("seeds", False)):
            ex = law_extrapolation(
                n, err_b, s, forms=("saturating",), heldout=top, scored=rec_b if with_records else None
            ).loc["saturating"]
            out[f"law prediction, {kind}"] = float(
                ex["prediction_low"] <= 1.0 - truth[("vanilla", top)] <= ex["prediction_high"]
            )
            out[f"law check holds 0, {kind}"] = float(bool(ex["consistent"]))
            diff = paired_law_difference(
                n, err_t, err_b, s, scored_treatment=rec_t if with_records else None,
                scored_baseline=rec_b if with_records else None,
            )  # fmt: skip
            for p in ("E", "beta"):
                lo, hi = diff.loc[p, "diff_low"], diff.loc[p, "diff_high"]
                out[f"law difference {p}, {kind}"] = float(lo <= 0 <= hi) if math.isfinite(lo) else math.nan
            frame = runs if with_records else runs.drop(columns=[SCORED_COLUMN])
            gains = compute_matched_gains(frame, epoch_times, baseline="vanilla", seed="train.seed")
            out[f"compute-matched gain, {kind}"] = float(((gains["ci_low"] <= 0) & (0 <= gains["ci_high"])).mean())
    return out


def wilson(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def run(studies: int, seeds: int, *, laws: bool = False, **kwargs) -> tuple[pd.Series, pd.Series]:
    """(mean of each rate, studies it rests on) over `studies` simulated studies, study i drawn from seed i:
    `one_study`'s, or `law_study`'s with laws (a law difference left unidentified in a study counts in neither)."""
    if laws:
        kwargs.pop("draws", None)
        frame = pd.DataFrame([law_study(i, seeds=seeds, **kwargs) for i in range(studies)])
    else:
        frame = pd.DataFrame([one_study(i, seeds=seeds, **kwargs) for i in range(studies)])
    return frame.mean(), frame.notna().sum()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=400)
    ap.add_argument("--seeds", type=int, nargs="+", default=[5, 3])
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--noise", type=float, default=0.005, help="sd of one run's accuracy from its seed (fraction)")
    ap.add_argument("--common", type=float, default=0.5, help="share of the binomial variance common to runs")
    ap.add_argument(
        "--arm-corr", type=float, nargs="+", default=[0.5], help="share of an image's difficulty both arms share"
    )
    ap.add_argument("--direct", action="store_true", help="intervals straight from the arrays, per --arm-corr")
    ap.add_argument("--draws", type=int, default=200, help="draws of the two-level bootstrap shown beside")
    ap.add_argument("--laws", action="store_true", help="the law and compute-matched intervals (law_study)")
    ap.add_argument("--record", action="store_true", help="append the figures to benchmarks/results/")
    args = ap.parse_args(argv)
    if args.direct:
        for seeds in args.seeds:
            for corr in args.arm_corr:
                rates = direct_rates(args.studies, seeds, arm_corr=corr, images=args.images, noise=args.noise,
                                     common=args.common)  # fmt: skip
                print(seeds, corr, {k: f"{v:.1%}" for k, v in rates.items()}, flush=True)
        return
    table, rows = [], []
    for seeds in args.seeds:
        t0 = time.perf_counter()
        rates, counts = run(
            args.studies,
            seeds,
            laws=args.laws,
            images=args.images,
            noise=args.noise,
            common=args.common,
            arm_corr=args.arm_corr[0],
            draws=args.draws,
        )
        took = time.perf_counter() - t0
        # Per-cell rates are averaged within a study, so their Wilson interval (on studies) is conservative.
        ci = {k: wilson(v, int(counts[k])) for k, v in rates.items()}
        text = {k: f"{v:.1%} ({ci[k][0]:.1%}-{ci[k][1]:.1%})" for k, v in rates.items()}
        table.append({"seeds": seeds, "studies": args.studies, **text, "minutes": f"{took / 60:.1f}"})
        for k, v in rates.items():
            rows.append(
                {
                    "figure": f"{k}, {seeds} seeds",
                    "value": f"{v:.4f}",
                    "unit": "share of studies" if "significant" in k or "band" in k else "coverage",
                    "note": (
                        f"{int(counts[k])} studies, {args.images} images, noise {args.noise}, common {args.common}, "
                        f"arm corr {args.arm_corr[0]}; Wilson 95% {ci[k][0]:.3f}-{ci[k][1]:.3f}"
                    ),
                }
            )
    frame = pd.DataFrame(table).set_index("seeds").T
    print(frame.to_string())
    if args.record:
        from benchmarks.results import append

        print(append("image_coverage", rows))


if __name__ == "__main__":
    main()
