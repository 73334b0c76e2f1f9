"""How often a whole report claims a difference when there is none: null launches of the shipped designs.

Each replicate writes one launch of a shipped study file (its factors, search budget and confirm seeds read from the
YAML, not from the report code) into a real MLflow SQLite store, through the trial recorder the runner uses and with
the tags the runner sets (factor levels, cell, stage), every method's accuracy drawn from the same distribution (a
per-(arch, fraction) mean, a per-seed offset shared by every method, per-run noise). It then runs `write_report` and
reads back what the report wrote: a report "claims a difference" when any CSV it wrote has a `significant` entry
that is true (the only verdicts the report prints; everything else is labelled exploratory), and, for comparison,
how often the exploratory intervals exclude their null (a data multiplier of 1, a law difference of 0).

    python benchmarks/sim_report_null.py --design studies/data_scaling.yaml --reports 200
    python benchmarks/sim_report_null.py --design studies/data_scaling.yaml --reports 2000 --family  # the family alone
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shutil
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

NOISE = 0.005  # per-run sd of the accuracy: the reference seed noise of the shipped designs (0.5 points)
SEED_SD = 0.005  # per-seed offset, shared by every method at that seed (what pairing by seed removes)
SEARCH_SPREAD = 0.01  # how much a search trial's rho moves its score: none of it differs between methods


def _design(path: Path) -> dict:
    """The study's cells as the runner plans them (`studies.spec.load_study`: levels, trials, confirm seeds)."""
    from studies.records import trial_params
    from studies.spec import load_study

    loaded = load_study(path, require_data=False)
    confirm = loaded.spec.confirm
    return {
        "name": loaded.spec.name,
        "path": path,
        "cells": {c.key: c for c in loaded.cells},
        "params": trial_params(loaded),
        "confirm_seeds": confirm.seed_list if confirm is not None else [],
    }


def _leaves(tree: dict, prefix: str = "") -> dict:
    """A config tree's scalar leaves as dotted keys: the params a trial logs (nested sections are not params)."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_leaves(v, f"{prefix}{k}."))
        elif not isinstance(v, list):
            out[f"{prefix}{k}"] = v
    return out


def null_records(design: dict, rng: np.random.Generator) -> list[dict]:
    """Every trial of one null launch of `design`: its run name, params, factor levels, cell, stage and accuracy.

    Null: a cell's mean depends on its arch and data fraction, never on its method (or any other factor). A seed's
    offset is shared by every cell at that seed (what pairing by seed removes); each run adds its own noise, and a
    search trial's sampled rho moves its score by chance alone."""
    from trainables.naming import CONFIRM_STAGE, SEARCH_STAGE

    seeds = {0, *design["confirm_seeds"]} | {
        int(_leaves(c.config).get("train.seed", 0)) for c in design["cells"].values()
    }
    seed_offset = {s: rng.normal(0, SEED_SD) for s in sorted(seeds)}
    means: dict = {}
    records = []
    for cell in design["cells"].values():
        params = _leaves(cell.config)
        arch = cell.levels.get("arch")
        if arch not in means:
            means[arch] = (0.03 + 0.04 * rng.random(), 0.02 + 0.03 * rng.random())
        floor, scale = means[arch]
        # Error falls with the data as a saturating power law (a per-arch floor and scale), the same for every method.
        mu = 1.0 - floor - scale * float(params.get("data.fraction", 1.0)) ** -0.5
        seed = int(params.get("train.seed", 0))
        best = None
        for t in range(cell.trials):
            extra = {}
            for path, dom in cell.space.items():  # loguniform (the shipped studies' rho)
                extra[path] = float(math.exp(rng.uniform(math.log(dom.low), math.log(dom.high))))
            spread = rng.normal(0, SEARCH_SPREAD) if cell.space else 0.0
            value = float(np.clip(mu + seed_offset[seed] + rng.normal(0, NOISE) + spread, 0, 1))
            records.append(_rec(cell, f"{cell.key}-s{t}", extra, None, value, SEARCH_STAGE))
            if best is None or value > best[0]:
                best = (value, extra)
        for s in design["confirm_seeds"][: cell.confirm]:
            value = float(np.clip(mu + seed_offset[s] + rng.normal(0, NOISE), 0, 1))
            chosen = best[1] if best is not None else {}
            records.append(_rec(cell, f"{cell.key}-c{s}", chosen, s, value, CONFIRM_STAGE))
    return records


def _rec(cell, name: str, sample: dict, seed: int | None, value: float, stage: str) -> dict:
    return {"name": name, "sample": sample, "seed": seed, "cell": cell.key, "value": value, "stage": stage}


def write_null_launch(
    root: Path, design: dict, rng: np.random.Generator, template: Path | None = None
) -> tuple[str, str, list[dict]]:
    """One null launch of `design` into a new store under root; returns (tracking uri, experiment name, records)."""
    from mlflow.tracking import MlflowClient

    from trainables.naming import KIND_TAG
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
    records = null_records(design, rng)
    for r in records:
        _record(target, design, r)
    return uri, name, records


def _record(target, design: dict, r: dict) -> None:
    """One trial's run as the runner writes it: the trial config `studies.tuning` hands the trial (the sample
    applied, or the confirm config), its flat config's study-varying params and its config tags, the cell's factor
    and stage tags, one epoch of metrics, finished."""
    from studies.confirm import confirm_config
    from studies.search import apply_sample
    from trainables.config import TrialConfig
    from trainables.naming import CELL_TAG, STAGE_TAG, factor_tag
    from trainables.tracking import TrialRecorder, config_tags

    cell = design["cells"][r["cell"]]
    tree = apply_sample(cell.config, r["sample"]) if r["seed"] is None else confirm_config(cell, r["sample"], r["seed"])
    flat = TrialConfig.load(tree).flat()
    params = {k: v for k, v in flat.items() if k in set(design["params"])}
    rec = TrialRecorder(target, trial_key=r["name"], run_name=r["name"], params=params)
    tags = {CELL_TAG: cell.key, STAGE_TAG: r["stage"], **{factor_tag(k): v for k, v in cell.levels.items()}}
    rec.set_tags({**tags, **config_tags(flat)})
    rec.log_epoch({"val_acc": r["value"], "train_loss": 1.0 - r["value"]}, 0)
    rec.finish("finished")


def _true(column: pd.Series) -> bool:
    return bool(column.astype(str).str.lower().eq("true").any())


# What report.md prints as a verdict: a Findings line ending "significant" (not "not significant"), or its summary.
_PRINTED = re.compile(r"(?<!not ): significant$|^Significant: |\. Significant: ", re.M)


def read_claims(out: Path) -> dict:
    """What the written report claims, from its files alone: a `significant` entry that is true in any CSV, and,
    separately, a verdict printed in report.md (the two must agree; the summary counts a disagreement)."""
    claims = {"any": False, "printed": False, "exploratory_multiplier": False, "exploratory_law": False}
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
    md = out / "report.md"
    claims["printed"] = bool(md.exists() and _PRINTED.search(md.read_text()))
    return claims


def empty_store(path: Path) -> Path:
    """A migrated empty MLflow SQLite store at path (the template every replicate copies)."""
    from mlflow.tracking import MlflowClient

    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


def _write(name: str, uri: str, out: Path, seed: int, n_boot: int) -> dict:
    from analysis import write_report

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            write_report(name, tracking_uri=uri, out_dir=out, log_to_mlflow=False, n_boot=n_boot, seed=seed)
    except Exception as e:  # noqa: BLE001 - the simulation reports failures, it does not stop on one
        return {
            "any": False,
            "printed": False,
            "exploratory_multiplier": False,
            "exploratory_law": False,
            "error": repr(e),
        }
    return read_claims(out)


def one_report(design: dict, seed: int, *, n_boot: int = 200, template: Path | None = None) -> dict:
    """One null launch written into a real store, and its report; a report that fails counts as an error."""
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        uri, name, _ = write_null_launch(root, design, rng, template)
        return _write(name, uri, root / "report", seed, n_boot)


class Direct:
    """write_report's inputs fed straight from a tagged-run frame: one real store per design (its experiment and a
    `load_runs` frame, the template), and each replicate's accuracies and sampled knobs set into a copy of that
    frame by run name. Writing 450 runs into SQLite costs 34 s a report against 9 s for the report itself; the
    frame is what `load_runs` returns from such a store (`cross_check` compares the reports' CSVs both ways).
    Figures are closed unsaved: they print no verdict, and saving them is a third of the report's time."""

    def __init__(self, design: dict, root: Path, template: Path | None, save_figures: bool = False):
        from analysis import load_runs

        self.design = design
        self.root = root
        self.uri, self.name, _ = write_null_launch(
            root, design, np.random.default_rng(2**31), template
        )  # no replicate draws 2**31
        self.frame = load_runs(self.name, tracking_uri=self.uri)
        self.save_figures = save_figures

    def frame_for(self, records: list[dict]) -> pd.DataFrame:
        by = {r["name"]: r for r in records}
        f = self.frame.copy()
        names = f["run_name"].astype(str)
        f["val_acc"] = [by[n]["value"] for n in names]
        f["train_loss"] = 1.0 - f["val_acc"]
        searched = {p for c in self.design["cells"].values() for p in c.space}
        for col in searched:
            f[col] = pd.to_numeric(pd.Series([by[n]["sample"].get(col) for n in names], index=f.index))
        return f

    def report(self, seed: int, n_boot: int, out: Path) -> dict:
        from unittest import mock

        import matplotlib.pyplot as plt

        import analysis.report as rep

        frame = self.frame_for(null_records(self.design, np.random.default_rng(seed)))
        with contextlib.ExitStack() as stack:
            stack.enter_context(mock.patch.object(rep, "load_runs", lambda *a, **k: frame.copy()))
            if not self.save_figures:
                stack.enter_context(mock.patch.object(rep._Writer, "figure", lambda _, name, fig: plt.close(fig)))
            shutil.rmtree(out, ignore_errors=True)
            return _write(self.name, self.uri, out, seed, n_boot)

    def family(self, seed: int, out: Path) -> dict:
        """The report's family of findings alone on replicate `seed`'s draws: what write_report computes first
        (`analysis.report._open_report` on the same frame, then `_gain_family`, the only tables that may say
        "significant"), without the sections that print nothing verdict-bearing. A report claims a difference
        exactly when this does (the CSVs of the family's gain tables are the family's frames), at about 0.2 s a
        replicate against 15-40 s for a whole report: how the family-wise rate is measured on thousands."""
        from unittest import mock

        import analysis.report as rep

        frame = self.frame_for(null_records(self.design, np.random.default_rng(seed)))
        with mock.patch.object(rep, "load_runs", lambda *a, **k: frame.copy()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = rep._open_report(
                self.name, tracking_uri=self.uri, out_dir=out, log_to_mlflow=False, metric=None, mode=None,
                n_boot=0, seed=seed, smoke=False,
            )  # fmt: skip
            family = rep._gain_family(r)
        where = [
            f"gain_{rep._slug(level)}.csv"
            for (level, _), gain in family.items()
            if bool(gain["significant"].fillna(False).astype(bool).any())
        ]
        return {"family": bool(where), **({"where": where} if where else {})}


def cross_check(design: dict, seeds: list[int], template: Path, n_boot: int) -> list[str]:
    """Reports from real stores against the direct path's on the same draws: every CSV but the run ids equal."""
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "direct").mkdir()
        direct = Direct(design, root / "direct", template)
        for seed in seeds:
            store = root / f"real{seed}"
            store.mkdir()
            uri, name, _ = write_null_launch(store, design, np.random.default_rng(seed), template)
            a = _write(name, uri, store / "report", seed, n_boot)
            b = direct.report(seed, n_boot, root / f"direct{seed}")
            if "error" in a or "error" in b or a != b:
                problems.append(f"seed {seed}: real store {a} against direct {b}")
            for csv in sorted((store / "report").glob("*.csv")):
                x, y = pd.read_csv(csv), pd.read_csv(root / f"direct{seed}" / csv.name)
                x, y = (t.drop(columns=["run id"], errors="ignore") for t in (x, y))
                if not x.equals(y):
                    problems.append(f"seed {seed}: {csv.name} differs")
    return problems


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    from scipy.stats import beta

    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def _chunk(args: tuple) -> list[dict]:
    path, seeds, n_boot, tmp, family = args
    design = _design(path)
    root = Path(tempfile.mkdtemp(dir=tmp))
    direct = Direct(design, root, empty_store(root / "empty.db"))
    if family:
        return [direct.family(s, root / "r") for s in seeds]
    return [direct.report(s, n_boot, root / "r") for s in seeds]


#: What a whole report is scored on (read_claims), and what --family scores (Direct.family).
REPORT_CLAIMS = ("any", "exploratory_multiplier", "exploratory_law")
FAMILY_CLAIMS = ("family",)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--design", type=Path, action="append", help="a shipped study file (repeatable)")
    ap.add_argument("--reports", type=int, default=100, help="null reports per design")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-boot", type=int, default=200, help="write_report's bootstrap draws")
    ap.add_argument("--real", action="store_true", help="every replicate through a real store (slow)")
    ap.add_argument("--check", type=int, default=0, help="replicates compared real store against direct")
    ap.add_argument(
        "--family",
        action="store_true",
        help="direct path, the report's family of findings alone (Direct.family: claim 'family', the same verdict "
        "as 'any' at about 0.2 s a replicate)",
    )
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--csv", type=Path, help="append the per-design rows here")
    ap.add_argument(
        "--jsonl",
        type=Path,
        help="direct path, designs interleaved (seed by seed), each report's claims appended here as it ends: a run "
        "stopped early keeps every design at about the same count",
    )
    ap.add_argument("--summarise", type=Path, help="a --jsonl file: its per-design rows (--csv) and markdown table")
    args = ap.parse_args()
    if args.family and (args.real or args.jsonl is not None or args.summarise is not None):
        ap.error("--family runs the direct path alone: drop --real, --jsonl and --summarise")
    if args.summarise is not None:
        _summarise_jsonl(args.summarise, args)
        return
    designs = args.design or [Path("studies/data_scaling.yaml")]
    with tempfile.TemporaryDirectory() as tmp:
        template = empty_store(Path(tmp) / "empty.db")
        if args.jsonl is not None:
            _interleaved(designs, args, Path(tmp), template)
            return
        for path in designs:
            design = _design(path)
            seeds = [args.seed + i for i in range(args.reports)]
            t0 = time.time()
            if args.check:
                problems = cross_check(design, seeds[: args.check], template, args.n_boot)
                print(f"{path.name}: cross-check of {args.check} real stores: {len(problems)} mismatch(es)")
                for p in problems:
                    print("  ", p)
            if args.real:
                results = [one_report(design, s, n_boot=args.n_boot, template=template) for s in seeds]
            else:
                parts = [(path, seeds[i :: args.jobs], args.n_boot, tmp, args.family) for i in range(args.jobs)]
                with ProcessPoolExecutor(args.jobs) as pool:
                    results = [r for part in pool.map(_chunk, parts) for r in part]
            rows = _summarise(path, results, time.time() - t0, args)
            if args.csv is not None:
                _append(args.csv, rows)


def _interleaved(designs: list[Path], args, tmp: Path, template: Path) -> None:
    import json

    directs = {}
    for path in designs:
        (tmp / path.stem).mkdir()
        directs[path] = Direct(_design(path), tmp / path.stem, template)
    for i in range(args.reports):
        for path, direct in directs.items():
            t0 = time.time()
            claims = direct.report(args.seed + i, args.n_boot, tmp / path.stem / "r")
            row = {"design": path.name, "seed": args.seed + i, "seconds": round(time.time() - t0, 1), **claims}
            with args.jsonl.open("a") as f:
                f.write(json.dumps(row) + "\n")


def _summarise_jsonl(path: Path, args) -> None:
    """The per-design rows of a --jsonl file (printed, appended to --csv) and the markdown table docs/science.md
    carries."""
    import json

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    table = [
        "| design | null reports | claim any difference (Clopper-Pearson 95%) | exploratory multiplier excludes 1 "
        "| exploratory law difference excludes 0 | failed |",
        "|---|---|---|---|---|---|",
    ]
    for design in dict.fromkeys(r["design"] for r in rows):
        results = [r for r in rows if r["design"] == design]
        seconds = sum(r["seconds"] for r in results)
        out = _summarise(Path(design), results, seconds, args)
        if args.csv is not None:
            _append(args.csv, out)
        by = {r["claim"]: r for r in out}
        cells = [
            f"{by[c]['claiming']}/{by[c]['reports']} = {by[c]['rate']:.1%} ({by[c]['cp_low']:.1%}-{by[c]['cp_high']:.1%})"
            for c in ("any", "exploratory_multiplier", "exploratory_law")
        ]
        table.append(
            f"| {design.removesuffix('.yaml')} | {by['any']['reports']} | "
            + " | ".join(cells)
            + f" | {by['any']['failed']} |"
        )
    print("\n".join(table))


def _summarise(path: Path, results: list[dict], seconds: float, args) -> list[dict]:
    errors = [r["error"] for r in results if "error" in r]
    ok = [r for r in results if "error" not in r]
    if errors:
        print(f"{path.name}: {len(errors)} report(s) failed, e.g. {errors[0]}")
    disagree = sum(r["any"] != r["printed"] for r in ok if "printed" in r)
    rows = []
    for what in FAMILY_CLAIMS if getattr(args, "family", False) else REPORT_CLAIMS:
        k = sum(r[what] for r in ok)
        lo, hi = clopper_pearson(k, len(ok)) if ok else (math.nan, math.nan)
        print(f"{path.name}: {what}: {k}/{len(ok)} = {k / max(len(ok), 1):.3f} (95% Clopper-Pearson {lo:.3f}-{hi:.3f})")
        rows.append(
            {
                "design": path.name,
                "claim": what,
                "reports": len(ok),
                "claiming": k,
                "rate": k / max(len(ok), 1),
                "cp_low": lo,
                "cp_high": hi,
                "failed": len(errors),
                "csv_vs_md_disagree": disagree,
                "mode": _mode(args),
                "check": args.check,
                "n_boot": args.n_boot,
                "seed": args.seed,
                "seconds": round(seconds),
                **_machine(),
            }
        )
    where: dict = {}
    for r in ok:
        for w in r.get("where", []):
            where[w] = where.get(w, 0) + 1
    if where:
        print(f"{path.name}: claiming files: {where}")
    return rows


def _mode(args) -> str:
    """How the replicates were scored: whole reports through real stores or the direct path, or the family alone."""
    if getattr(args, "real", False):
        return "real"
    return "family" if getattr(args, "family", False) else "direct"


def _machine() -> dict:
    import platform
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()} {os.cpu_count()} cpus", "commit": commit}


def _append(path: Path, rows: list[dict]) -> None:
    frame = pd.DataFrame(rows)
    frame.to_csv(path, mode="a", header=not path.exists(), index=False)


if __name__ == "__main__":
    main()
