"""Coverage and power of the report's intervals, by simulation: runs frames from a known scaling law through the report's functions.

Each simulated study is a runs frame with the columns `analysis.load_runs` returns (one finished trial per
method, fraction and seed: a confirm stage's runs), vanilla and SAM both with error L(n) = E + B n^-beta (E = 0.03,
B = 0.02, beta = 0.7; `analysis.design.REFERENCE_LAW`) at the shipped design's fractions (studies/data_scaling.yaml), plus independent seed noise of sd
`noise` accuracy points per run. It goes through what `write_report` calls: `scaling_table`, `table_points`,
`law_extrapolation` (the largest fraction held out), `law_parameters` (all fractions), `paired_law_difference`
and `sam_gain`. Measured: how often each 95% interval covers the truth (beta, E, the held-out prediction, the
paired beta difference 0, the per-fraction gain 0), how often a true law "fails" the held-out check, how often
`sam_gain` calls some fraction significant under no difference (family-wise), and the power at the effects
`analysis.design.detectable_effects` says the design detects with 80% power. docs/science.md has the table:

  PYTHONPATH=. python -m benchmarks.sim_coverage --studies 400 [--jobs 2]

--power-laws measures instead the power-law fits' intervals (`fit_scaling_table`, `data_multiplier`): the
seed-level jackknife-t against the old bootstrap over points, on runs whose noise is partly a seed's offset shared
by its fractions (`--seed-share`); docs/science.md, "Power-law fits and the data multiplier", has that table:

  PYTHONPATH=. python -m benchmarks.sim_coverage --power-laws --studies 200 --seeds 3 5 --seed-share 0 0.5 --noise 0.005
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.design import REFERENCE_LAW, detectable_effects
from analysis.scaling import (
    BOOT_DRAWS,
    FloorNotIdentifiedWarning,
    data_multiplier,
    fit_law,
    fit_power_law,
    fit_scaling_table,
    law_extrapolation,
    law_parameters,
    paired_law_difference,
    saturating_bootstrap_t,
    table_points,
)
from analysis.tables import sam_gain, scaling_table


def shipped_fractions() -> tuple[float, ...]:
    """The fractions of studies/data_scaling.yaml: the simulated studies are the design that ships."""
    from studies.spec import load_study

    study = load_study(Path(__file__).resolve().parents[1] / "studies" / "data_scaling.yaml", require_data=False)
    return tuple(sorted({float(c.config.get("data", {}).get("fraction", 1.0)) for c in study.cells}))


FRACTIONS = shipped_fractions()


def law(n, E=REFERENCE_LAW["E"], B=REFERENCE_LAW["B"], beta=REFERENCE_LAW["beta"]):
    return E + B * np.asarray(n, dtype="float64") ** -beta


def synthetic_runs(
    rng: np.random.Generator,
    *,
    seeds: int,
    noise: float,
    fractions=FRACTIONS,
    sam_beta: float = REFERENCE_LAW["beta"],
    sam_gain_points: float = 0.0,
    gain_fraction: float | None = None,
    seed_share: float = 0.0,
    images: int = 0,
    common: float = 0.5,
) -> pd.DataFrame:
    """A runs frame in load_runs' shape: vanilla and SAM, one finished trial per (method, fraction, seed).

    val_acc = 1 - L(n) + noise x N(0, 1), clipped to [0, 1]; SAM's law may have another beta, and a gain in
    accuracy at `gain_fraction` (every fraction when None); no difference by default. seed_share: the share of
    the noise variance that is an offset of the (method, seed), the same at every fraction (a seed's nested
    subsets and its initialisation): noise x (sqrt(share) u_seed + sqrt(1 - share) e_run), so each run's sd stays
    `noise` while a seed's points are correlated (0, the default, draws exactly what it drew before). images: the
    test images each run is scored on (0: none, the seed noise alone): adds their binomial noise, variance
    p (1 - p) / images, of which the share `common` is one draw for every seed of a (method, fraction) cell (its
    runs are scored on the same images, so the test set's luck moves them together) and the rest each run's own."""
    if not 0.0 <= seed_share <= 1.0:
        raise ValueError(f"seed_share must be in [0, 1] (a share of the noise variance), got {seed_share!r}")
    offsets = rng.standard_normal((2, seeds)) if seed_share > 0 else np.zeros((2, seeds))
    rows = []
    for m, (method, opt) in enumerate((("vanilla", "none"), ("sam", "sam"))):
        for f in fractions:
            cell_draw = rng.standard_normal() if images else 0.0
            for s in range(seeds):
                err = float(law(f, beta=sam_beta if method == "sam" else REFERENCE_LAW["beta"]))
                shifted = method == "sam" and (gain_fraction is None or f == gain_fraction)
                own = math.sqrt(1.0 - seed_share) * rng.standard_normal()
                shared = math.sqrt(seed_share) * offsets[m, s]
                acc = 1.0 - err + (sam_gain_points if shifted else 0.0) + noise * (own + shared)
                if images:
                    sd = math.sqrt((1.0 - err) * err / images)
                    acc += sd * (math.sqrt(common) * cell_draw + math.sqrt(1.0 - common) * rng.standard_normal())
                cell = f"arch=resnet,data.fraction={f:g},method={method},train.seed={s}"
                rows.append(
                    {
                        "run_id": f"{cell}/0",
                        "cell": cell,
                        "status": "finished",
                        "factor.arch": "resnet",
                        "factor.method": method,
                        "factor.data.fraction": f"{f:g}",
                        "factor.train.seed": str(s),
                        "optimizer.method": opt,
                        "data.fraction": f,
                        "train.seed": s,
                        "val_acc": min(max(acc, 0.0), 1.0),
                    }
                )
    return pd.DataFrame(rows)


def one_study(
    seed: int, seeds: int, noise: float, *, full: bool = True, laws: bool = True, images: int = 0
) -> dict[str, float]:
    """One simulated study under "SAM = vanilla": which intervals cover the truth (1.0) or not (0.0).

    laws=False measures sam_gain only (no law is fitted); images: test-set noise as synthetic_runs adds it."""
    rng = np.random.default_rng(seed)
    runs = synthetic_runs(rng, seeds=seeds, noise=noise, images=images)
    out: dict[str, float] = {}
    top = max(FRACTIONS)
    truth = {"beta": REFERENCE_LAW["beta"], "E": REFERENCE_LAW["E"], "prediction": float(law(top))}
    if laws:
        table = scaling_table(runs, fraction="data.fraction")
        n, err, s = table_points(table, "resnet", "vanilla")
        ex = law_extrapolation(n, err, s, forms=("saturating",), heldout=top).loc["saturating"]
        for p, value in truth.items():
            out[f"heldin_{p}"] = float(ex[f"{p}_low"] <= value <= ex[f"{p}_high"])
        out["check_fails"] = float(not ex["consistent"])
    gain = sam_gain(runs, baseline="vanilla", treatment="sam", fraction="data.fraction")
    out["gain_covers"] = float(((gain["ci_low"] <= 0) & (0 <= gain["ci_high"])).mean())
    out["band_covers"] = float(((gain["band_low"] <= 0) & (0 <= gain["band_high"])).all())
    out["any_significant"] = float(gain["significant"].any())
    if full and laws:
        params = law_parameters(n, err, s)
        for p in ("beta", "E"):
            out[f"all_{p}"] = float(params.loc[p, "low"] <= truth[p] <= params.loc[p, "high"])
        _, err_t, _ = table_points(table, "resnet", "sam")
        diff = paired_law_difference(n, err_t, err, s)
        out["diff_beta"] = float(diff.loc["beta", "diff_low"] <= 0 <= diff.loc["beta", "diff_high"])
        out["diff_E"] = float(diff.loc["E", "diff_low"] <= 0 <= diff.loc["E", "diff_high"])
    return out


def held_in_intervals(seed: int, seeds: int, noise: float) -> dict[str, float]:
    """The held-in law's intervals of one study, straight from arrays (no runs frame: the suite's fast check).

    The same points as one_study's vanilla series: fit on the 4 smallest fractions, `saturating_bootstrap_t`
    for E, beta, the prediction at 1.0 and the check against the observed mean there. For each quantity,
    whether the shipped interval covers the truth (`<q>`) and whether a known-bad one does (`<q>_z`: the
    estimate ± 1.96 seed-level se, the normal quantile on S - 1 = 2 df that the issue's intervals amounted to)."""
    rng = np.random.default_rng(seed)
    n = np.repeat(np.asarray(FRACTIONS), seeds)
    who = np.tile(np.arange(seeds), len(FRACTIONS))
    acc = np.clip(1.0 - law(n) + noise * rng.standard_normal(len(n)), 0.0, 1.0)
    err = 1.0 - acc
    top = max(FRACTIONS)
    inner = n < top
    fit = fit_law(n[inner], err[inner])
    boot = saturating_bootstrap_t(
        n[inner], err[inner], who[inner], fit, heldout=top, observed=err[~inner], observed_seeds=who[~inner]
    )
    truth = {"beta": REFERENCE_LAW["beta"], "E": REFERENCE_LAW["E"], "prediction": float(law(top)), "check": 0.0}
    out = {}
    for q, value in truth.items():
        est, lo, hi, se = boot[q]
        out[q] = float(lo <= value <= hi)
        out[f"{q}_z"] = float(abs(est - value) <= 1.96 * se)
    return out


def power_study(seed: int, seeds: int, noise: float, images: int = 0) -> dict[str, float]:
    """One study with SAM better by the design's detectable effects (stated for the noise it simulates): whether
    each is found."""
    d = detectable_effects(seeds, FRACTIONS, noise, images=images or None)
    rng = np.random.default_rng(seed)
    runs = synthetic_runs(rng, seeds=seeds, noise=noise, sam_beta=REFERENCE_LAW["beta"] + d.beta_up, images=images)
    table = scaling_table(runs, fraction="data.fraction")
    n, err_b, s = table_points(table, "resnet", "vanilla")
    _, err_t, _ = table_points(table, "resnet", "sam")
    diff = paired_law_difference(n, err_t, err_b, s).loc["beta"]
    # The gain at one fraction (the smallest), the others equal: what detectable_effects states.
    shifted = synthetic_runs(
        np.random.default_rng(seed), seeds=seeds, noise=noise, sam_gain_points=d.gain, gain_fraction=FRACTIONS[0],
        images=images,
    )  # fmt: skip
    gain = sam_gain(shifted, baseline="vanilla", treatment="sam", fraction="data.fraction")
    return {"power_beta": float(diff["diff_low"] > 0), "power_gain": float(gain["significant"].fillna(False).iloc[0])}


def power_law_intervals(seed: int, seeds: int, noise: float, seed_share: float, n_boot: int = 200) -> dict[str, float]:
    """One simulated study through the report's power-law path (`fit_scaling_table`, `data_multiplier`): whether
    the seed-level interval (`<q>`: the delete-one-seed jackknife-t, the table's seeds passed) and the old one
    (`<q>_old`: the residual bootstrap over points, the same points without their seeds, `n_boot` draws) cover
    the truth. Quantities: a, b, c of vanilla's fit (B, beta, E of the reference law), and the data multiplier of
    SAM over vanilla (truth 1: the same law) at the smallest and the largest fraction. `<q>_none`: the interval
    is NaN (counted as not covering)."""
    rng = np.random.default_rng(seed)
    runs = synthetic_runs(rng, seeds=seeds, noise=noise, seed_share=seed_share)
    table = scaling_table(runs, fraction="data.fraction")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FloorNotIdentifiedWarning)
        new = fit_scaling_table(table, n_boot=n_boot, seed=seed)
        old = {}
        for key in new:
            n, err, _ = table_points(table, *key)
            # One seed: fit_scaling_table's fit is already this one (the same draws), not refitted.
            old[key] = new[key] if seeds == 1 else fit_power_law(n, err, n_boot=n_boot, seed=seed)
    truth = {"a": REFERENCE_LAW["B"], "b": REFERENCE_LAW["beta"], "c": REFERENCE_LAW["E"]}
    out: dict[str, float] = {}
    for tag, fits in (("", new), ("_old", old)):
        vanilla, sam = fits[("resnet", "vanilla")], fits[("resnet", "sam")]
        for q, value in truth.items():
            lo, hi = vanilla.intervals[q]
            out[f"{q}{tag}"] = float(lo <= value <= hi)
        for name, f in (("mult_low", min(FRACTIONS)), ("mult_top", max(FRACTIONS))):
            lo, hi = data_multiplier(vanilla, sam, f).interval
            out[f"{name}{tag}"] = float(lo <= 1.0 <= hi)
            out[f"{name}{tag}_none"] = float(not (lo <= hi))
    return out


def _run_power_laws(args):
    return power_law_intervals(*args)


def simulate_power_laws(
    seeds: int, noise: float, seed_share: float, studies: int, *, n_boot: int = 200, jobs: int = 1, first: int = 0
) -> dict[str, float]:
    """Mean over `studies` simulated studies of each rate power_law_intervals measures."""
    tasks = [(first + i, seeds, noise, seed_share, n_boot) for i in range(studies)]
    return _mean_rates(_run_power_laws, tasks, jobs, chunksize=4)


POWER_LAW_COLUMNS = {
    "a": "a (= B)",
    "b": "b (= beta)",
    "c": "c (= E)",
    "mult_low": "multiplier at 0.05",
    "mult_top": "multiplier at 1.0",
}


def _main_power_laws(args) -> int:
    """The power-law table: per (seeds, seed share), each quantity's coverage by the seed-level and the old interval."""
    header = None
    for seeds in args.seeds:
        for noise in args.noise:
            for share in args.seed_share:
                t0 = time.perf_counter()
                rates = simulate_power_laws(seeds, noise, share, args.studies, n_boot=args.n_boot, jobs=args.jobs)
                row = {"seeds": seeds, "noise (points)": f"{noise * 100:g}", "seed share": f"{share:g}"}
                for k, name in POWER_LAW_COLUMNS.items():
                    for tag, label in (("", "seeds"), ("_old", "points")):
                        lo, hi = wilson(rates[k + tag], args.studies)
                        cell = f"{100 * rates[k + tag]:.1f}% ({100 * lo:.1f}-{100 * hi:.1f})"
                        if rates.get(f"{k}{tag}_none", 0.0) > 0:
                            cell += f", {100 * rates[f'{k}{tag}_none']:.1f}% none"
                        row[f"{name}, {label}"] = cell
                if header is None:
                    header = list(row)
                    print("| " + " | ".join(header) + " |")
                    print("|" + "---|" * len(header), flush=True)
                print("| " + " | ".join(str(row.get(c, "")) for c in header) + " |", flush=True)
                print(f"seeds={seeds} noise={noise} share={share}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(
        f"\n{args.studies} studies per row; in brackets each rate's 95% Monte Carlo interval (Wilson); 'seeds': the "
        f"delete-one-seed jackknife-t; 'points': the residual bootstrap over points ({args.n_boot} draws); 'none': "
        "share of studies without an interval (counted as not covering)."
    )
    return 0


def _run(args):
    kind, seed, seeds, noise, full, laws, images = args
    if kind == "coverage":
        return one_study(seed, seeds, noise, full=full, laws=laws, images=images)
    return power_study(seed, seeds, noise, images)


def simulate(
    seeds: int,
    noise: float,
    studies: int,
    *,
    full: bool = True,
    power: bool = True,
    jobs: int = 1,
    first: int = 0,
    laws: bool = True,
    images: int = 0,
) -> dict[str, float]:
    """Mean over `studies` simulated studies of each measured rate (one_study's, and power_study's if power)."""
    tasks = [("coverage", first + i, seeds, noise, full, laws, images) for i in range(studies)]
    if power:
        tasks += [("power", 10**6 + first + i, seeds, noise, full, laws, images) for i in range(studies)]
    return _mean_rates(_run, tasks, jobs, chunksize=8)


def _mean_rates(run, tasks: list, jobs: int, chunksize: int) -> dict[str, float]:
    """Each rate's mean over the simulated studies `run(task)` measures, on `jobs` processes."""
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(run, tasks, chunksize=chunksize))
    else:
        results = [run(t) for t in tasks]
    frame = pd.DataFrame(results)
    return {c: float(frame[c].mean()) for c in frame.columns}


COLUMNS = {
    "heldin_beta": "beta (held-in fit)",
    "heldin_E": "E (held-in fit)",
    "heldin_prediction": "held-out prediction",
    "all_beta": "beta (all fractions)",
    "all_E": "E (all fractions)",
    "diff_beta": "beta difference",
    "diff_E": "E difference",
    "gain_covers": "gain, per fraction",
    "band_covers": "gain band, all fractions",
    "check_fails": "true law fails held-out check",
    "any_significant": "some fraction 'significant'",
    "power_beta": "power at detectable beta diff",
    "power_gain": "power at detectable gain",
}


def wilson(rate: float, studies: int, z: float = 1.96) -> tuple[float, float]:
    """The Monte Carlo interval (Wilson, 95%) of a rate measured on `studies` simulated studies."""
    centre = (rate + z * z / (2 * studies)) / (1 + z * z / studies)
    half = z * math.sqrt(rate * (1 - rate) / studies + z * z / (4 * studies * studies)) / (1 + z * z / studies)
    return centre - half, centre + half


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=400, help="simulated studies per (seeds, noise)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[3, 5])
    parser.add_argument("--noise", type=float, nargs="+", default=[0.002, 0.005, 0.01], help="sd of one run's accuracy")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--no-power", dest="power", action="store_false", help="coverage only (no power studies)")
    parser.add_argument(
        "--power-laws",
        action="store_true",
        help="instead: the power-law fits' intervals (fit_power_law, data_multiplier), seed-level against over points",
    )
    parser.add_argument(
        "--seed-share",
        type=float,
        nargs="+",
        default=[0.0, 0.5],
        help="with --power-laws: share of the noise variance that is a seed's offset at every fraction",
    )
    parser.add_argument("--n-boot", type=int, default=200, help="with --power-laws: draws of the bootstrap over points")
    parser.add_argument(
        "--images", type=int, default=0, help="test images per run: adds their binomial noise, half common to a cell"
    )
    args = parser.parse_args(argv)
    if args.power_laws:
        return _main_power_laws(args)
    header = None
    for seeds in args.seeds:
        for noise in args.noise:
            t0 = time.perf_counter()
            rates = simulate(seeds, noise, args.studies, jobs=args.jobs, power=args.power, images=args.images)
            d = detectable_effects(seeds, FRACTIONS, noise, images=args.images or None)
            row = {"seeds": seeds, "noise (points)": f"{noise * 100:g}"}
            for k, v in rates.items():
                lo, hi = wilson(v, args.studies)
                row[COLUMNS[k]] = f"{100 * v:.1f}% ({100 * lo:.1f}-{100 * hi:.1f})"
            row.update(
                {"detectable gain (points)": f"{d.gain * 100:.2f}", "detectable beta diff (up)": f"{d.beta_up:.3f}"}
            )
            if header is None:  # each row as it is measured: a long run shows its progress
                header = list(row)
                print("| " + " | ".join(header) + " |")
                print("|" + "---|" * len(header), flush=True)
            print("| " + " | ".join(str(row.get(c, "")) for c in header) + " |", flush=True)
            print(f"seeds={seeds} noise={noise}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    print(
        f"\n{args.studies} studies per row; in brackets each rate's 95% Monte Carlo interval (Wilson); "
        f"{BOOT_DRAWS} bootstrap-t draws per interval."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
