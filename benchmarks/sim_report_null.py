"""How often a whole report claims a difference when there is none: null launches of the shipped designs.

Each replicate writes one launch of a shipped study file (its factors, search budget and confirm seeds read from the
YAML, not from the report code) into a real MLflow SQLite store, through the trial recorder the runner uses and with
the tags the runner sets (factor levels, cell, stage), every method's accuracy drawn from the same distribution (a
per-(arch, fraction) mean, a per-seed offset shared by every method, per-run noise). It then runs `write_report` and
reads back what the report wrote: a report "claims a difference" when any CSV it wrote has a `significant` entry
that is true (the only verdicts the report prints; everything else is labelled exploratory), and, for comparison,
how often the exploratory intervals exclude their null (a data multiplier of 1, a law difference of 0).

    python benchmarks/sim_report_null.py --design studies/data_scaling.yaml --reports 200
"""

from __future__ import annotations

import argparse
import itertools
import math
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

NOISE = 0.005  # per-run sd of the accuracy: the reference seed noise of the shipped designs (0.5 points)
SEED_SD = 0.005  # per-seed offset, shared by every method at that seed (what pairing by seed removes)
SEARCH_SPREAD = 0.01  # how much a search trial's rho moves its score: none of it differs between methods


def _design(path: Path, smoke: bool = False) -> dict:
    raw = yaml.safe_load(path.read_text())
    factors = raw["factors"]
    budget = raw.get("budget") or {}
    confirm = (raw.get("confirm") or {}).get("seeds", 0)
    return {
        "name": raw["name"],
        "factors": factors,
        "trials": int(budget.get("trials_per_cell", 1)),
        "repeats": int(budget.get("repeats_without_search", 1)),
        "confirm": int(confirm),
        "searched": "rho" in (raw.get("search") or {}),
    }


def _level_config(levels: dict, factors: dict) -> dict:
    """The config values the cell's levels fix (dotted keys), as the study file's factors write them."""
    out = {}
    for factor, level in levels.items():
        for k, v in (factors[factor][level] or {}).items():
            out[k] = v
    return out


def write_null_launch(
    root: Path, design: dict, rng: np.random.Generator, template: Path | None = None
) -> tuple[str, str]:
    """One null launch of `design` into a new store under root; returns (tracking uri, experiment name)."""
    from mlflow.tracking import MlflowClient

    from trainables.naming import CONFIRM_STAGE, KIND_TAG, SEARCH_STAGE
    from trainables.tracking import TrackingTarget

    db = root / "mlflow.db"
    if template is not None:  # a migrated empty store, copied: migrating a new one costs seconds
        shutil.copy(template, db)
    uri = f"sqlite:///{db}"
    client = MlflowClient(uri)
    name = design["name"]
    exp = client.create_experiment(name, artifact_location=(root / "art").as_uri())
    study_run = client.create_run(exp, run_name=name, tags={KIND_TAG: "study"}).info.run_id
    target = TrackingTarget(uri, exp, parent_run_id=study_run)
    factors = design["factors"]
    names = list(factors)
    confirm_seeds = [1000 + i for i in range(design["confirm"])]
    seed_offset = {s: rng.normal(0, SEED_SD) for s in [0, *confirm_seeds]}
    means: dict = {}
    for combo in itertools.product(*(list(factors[f]) for f in names)):
        levels = dict(zip(names, combo))
        config = _level_config(levels, factors)
        cell = ",".join(f"{k}={v}" for k, v in levels.items())
        sharp = str(config.get("optimizer.method", "none")) != "none"
        # Null: the mean depends on the arch and the data alone, never on the method.
        # Error falls with the data as a saturating power law (a per-arch floor and scale), the same for every method.
        arch = levels.get("arch")
        if arch not in means:
            means[arch] = (0.03 + 0.04 * rng.random(), 0.02 + 0.03 * rng.random())
        floor, scale = means[arch]
        mu = 1.0 - floor - scale * float(config.get("data.fraction", 1.0)) ** -0.5
        params = {k: v for k, v in config.items() if not isinstance(v, (dict, list))}
        searches = design["searched"] and sharp
        count = design["trials"] if searches else design["repeats"]
        best = None
        for t in range(count):
            extra = {}
            if searches:
                extra["optimizer.hparams.rho"] = float(math.exp(rng.uniform(math.log(0.01), math.log(1.0))))
            elif sharp and "rho" in config:
                extra["optimizer.hparams.rho"] = float(config["rho"])
            value = float(np.clip(mu + seed_offset[0] + rng.normal(0, NOISE) + rng.normal(0, SEARCH_SPREAD), 0, 1))
            _record(target, f"{cell}-s{t}", {**params, **extra, "train.seed": 0}, levels, cell, value, SEARCH_STAGE)
            if best is None or value > best[0]:
                best = (value, extra)
        for s in confirm_seeds:
            value = float(np.clip(mu + seed_offset[s] + rng.normal(0, NOISE), 0, 1))
            _record(target, f"{cell}-c{s}", {**params, **best[1], "train.seed": s}, levels, cell, value, CONFIRM_STAGE)
    return uri, name


def _record(target, key, params, levels, cell, value, stage) -> None:
    from trainables.naming import CELL_TAG, STAGE_TAG
    from trainables.tracking import TrialRecorder

    rec = TrialRecorder(target, trial_key=key, run_name=key, params=params)
    rec.set_tags({**{f"factor.{k}": str(v) for k, v in levels.items()}, CELL_TAG: cell, STAGE_TAG: stage})
    rec.log_epoch({"val_acc": value, "train_loss": 1.0 - value}, 0)
    rec.finish("finished")


def _true(column: pd.Series) -> bool:
    return bool(column.astype(str).str.lower().eq("true").any())


def read_claims(out: Path) -> dict:
    """What the written report claims, from its files alone."""
    claims = {"any": False, "exploratory_multiplier": False, "exploratory_law": False}
    for csv in sorted(out.glob("*.csv")):
        frame = pd.read_csv(csv)
        if "significant" in frame.columns and _true(frame["significant"]):
            claims["any"] = True
            claims.setdefault("where", []).append(csv.name)
        if csv.name.startswith("data_multiplier_") and {"low", "high"} <= set(frame.columns):
            ok = frame[["low", "high"]].dropna()
            claims["exploratory_multiplier"] |= bool(((ok["low"] > 1) | (ok["high"] < 1)).any())
        if csv.name.startswith("law_difference_") and {"diff_low", "diff_high"} <= set(frame.columns):
            ok = frame[["diff_low", "diff_high"]].dropna()
            claims["exploratory_law"] |= bool(((ok["diff_low"] > 0) | (ok["diff_high"] < 0)).any())
    return claims


def empty_store(path: Path) -> Path:
    """A migrated empty MLflow SQLite store at path (the template every replicate copies)."""
    from mlflow.tracking import MlflowClient

    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


def one_report(design: dict, seed: int, *, n_boot: int = 200, template: Path | None = None) -> dict:
    """One null launch and its report; a report that fails counts as an error (printed), not as a claim."""
    from analysis import write_report

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        uri, name = write_null_launch(root, design, rng, template)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                write_report(
                    name, tracking_uri=uri, out_dir=root / "report", log_to_mlflow=False, n_boot=n_boot, seed=seed
                )
        except Exception as e:  # noqa: BLE001 - the simulation reports failures, it does not stop on one
            return {"any": False, "exploratory_multiplier": False, "exploratory_law": False, "error": repr(e)}
        return read_claims(root / "report")


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--design", type=Path, action="append", help="a shipped study file (repeatable)")
    ap.add_argument("--reports", type=int, default=100, help="null reports per design")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    designs = args.design or [Path("studies/data_scaling.yaml")]
    with tempfile.TemporaryDirectory() as tmp:
        template = empty_store(Path(tmp) / "empty.db")
        for path in designs:
            _summarise(path, [one_report(_design(path), args.seed + i, template=template) for i in range(args.reports)])


def _summarise(path: Path, results: list[dict]) -> None:
    errors = [r["error"] for r in results if "error" in r]
    results = [r for r in results if "error" not in r]
    if errors:
        print(f"{path.name}: {len(errors)} report(s) failed, e.g. {errors[0]}")
    if results:
        for what in ("any", "exploratory_multiplier", "exploratory_law"):
            k = sum(r[what] for r in results)
            lo, hi = wilson(k, len(results))
            print(f"{path.name}: {what}: {k}/{len(results)} = {k / len(results):.3f} (95% Wilson {lo:.3f}-{hi:.3f})")


if __name__ == "__main__":
    main()
