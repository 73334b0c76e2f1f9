"""The report's findings are one error-controlled family: a small run of benchmarks/sim_report_null.py, read back."""

import importlib.util
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import write_report
from analysis.report import SECTIONS
from analysis.tables import holm

ROOT = Path(__file__).resolve().parents[2]


def _sim():
    spec = importlib.util.spec_from_file_location("sim_report_null", ROOT / "benchmarks" / "sim_report_null.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The shipped data-scaling design, cut to what a test can afford: 2 archs, 2 method pairs, 4 fractions, 3 seeds.
DESIGN = """
name: null_scaling
objective: {metric: val_acc, mode: max}
base:
  data: {name: cifar10, root: /nonexistent/cifar10, augment: basic, batch_size: 256, fraction_seed: 0}
  schedule: {epochs: 10, sched: cosine, warmup_epochs: 1}
  train: {seed: 0}
factors:
  data.fraction:
    "0.1": {data.fraction: 0.1}
    "0.25": {data.fraction: 0.25}
    "0.5": {data.fraction: 0.5}
    "1.0": {data.fraction: 1.0}
  arch:
    resnet: {model.name: resnet18, optimizer.base: sgd, optimizer.lr: 0.1}
    vit: {model.name: vit_small_patch16_224, optimizer.base: adamw, optimizer.lr: 0.001}
  method:
    vanilla: {optimizer.method: none, data.augment: basic}
    sam: {optimizer.method: sam, data.augment: basic}
    aug: {optimizer.method: none, data.augment: strong}
    sam_aug: {optimizer.method: sam, data.augment: strong}
search:
  rho: {type: loguniform, low: 0.01, high: 1.0}
budget: {trials_per_cell: 2, sampler: tpe, seed: 0}
confirm: {seeds: 3}
"""

# sam_on's shape: the method factor is named `scope`, its plain level and two SAM variants, no search fraction.
SCOPE_DESIGN = """
name: null_scope
objective: {metric: val_acc, mode: max}
base:
  data: {name: cifar10, root: /nonexistent/cifar10, augment: basic, batch_size: 256}
  schedule: {epochs: 10, sched: cosine, warmup_epochs: 1}
  train: {seed: 0}
factors:
  arch:
    resnet: {model.name: resnet18, optimizer.base: sgd, optimizer.lr: 0.1}
  scope:
    vanilla: {optimizer.method: none}
    all: {optimizer.method: sam, optimizer.scope: all}
    norm: {optimizer.method: sam, optimizer.scope: norm}
search:
  rho: {type: loguniform, low: 0.01, high: 2.0}
budget: {trials_per_cell: 2, sampler: gp, seed: 0}
confirm: {seeds: 3}
"""


def _launch(tmp_path, new_mlflow_store, text: str, seed: int):
    sim = _sim()
    study = tmp_path / "study.yaml"
    study.write_text(text)
    template = tmp_path / "empty.db"
    new_mlflow_store(template)
    uri, name, _ = sim.write_null_launch(tmp_path, sim._design(study), np.random.default_rng(seed), template)
    return sim, uri, name


# 8 CPU-s alone (128 runs recorded in a real store, then the whole report): out of `make test-fast`.
@pytest.mark.slow
def test_a_null_report_adjusts_every_gain_it_prints_as_one_family(tmp_path, new_mlflow_store):
    sim, uri, name = _launch(tmp_path, new_mlflow_store, DESIGN, 3)
    out = tmp_path / "report"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_report(name, tracking_uri=uri, out_dir=out, log_to_mlflow=False, n_boot=100)
    gains = {p.name: pd.read_csv(p) for p in sorted(out.glob("gain_*.csv"))}
    assert set(gains) == {"gain_sam.csv", "gain_sam_aug.csv"}
    # Holm across every gain row of every table (16 tests), recomputed from the printed p-values, not per arch.
    p = np.concatenate([g["p_value"].to_numpy() for g in gains.values()])
    assert len(p) == 16
    np.testing.assert_allclose(np.concatenate([g["p_holm"].to_numpy() for g in gains.values()]), holm(p))
    # Nothing outside the family carries a verdict.
    findings = set().union(*(s.names(["sam", "sam_aug"], findings=True) for s in SECTIONS))
    for csv in out.glob("*.csv"):
        if csv.name not in findings:
            assert "significant" not in pd.read_csv(csv).columns, csv.name
    report = (out / "report.md").read_text()
    findings = report.index("## Findings")
    assert findings < report.index("## Per-cell summary")  # the answer leads
    assert "gain of sam over vanilla" in report[findings:] and "16 paired-gain tests" in report
    for title in ("Data multiplier of sam", "Scaling-law difference of sam over vanilla"):
        section = report[report.index(f"## {title}") :]
        assert section.split("\n\n", 2)[1].startswith("**Exploratory**"), title
    # Labels name the runs they summarise: one confirm run a seed, not a best-of-search value.
    assert (
        "Confirm-run val_acc (max) by data.fraction" in report
        and "best-of-search" not in report.split("## Per-cell")[0]
    )
    assert "every seed's confirm-run trial" in report
    # No post-hoc power anywhere: a null is told by what its interval excludes; captions name the printed columns,
    # and the seed-level intervals say what they condition on.
    assert "would be found" not in report and "80% power" not in report and "detectable" not in report
    assert "excludes gains below" in report
    from analysis.scaling import CONDITIONS

    for title in ("Scaling laws checked by extrapolation", "Scaling-law difference of sam over vanilla"):
        caption = report[report.index(f"## {title}") :].split("\n|", 1)[0]
        assert CONDITIONS in caption, title
    assert "`check_low`/`check_high`" in report and "identified:" in report
    # One exponent a series: the power-law table prints law_parameters' beta, not fit_power_law's b.
    fits = pd.read_csv(out / "scaling_fits.csv")
    assert {"beta", "beta_low", "beta_high"} <= set(fits.columns) and not {"b", "b_low", "b_high"} & set(fits.columns)
    assert "rho sensitivity" not in report or "confidence set for the best level" in report
    laws = pd.read_csv(out / "scaling_laws.csv")
    negative = pd.to_numeric(laws.get("E"), errors="coerce") < 0
    assert laws.loc[negative, "note"].str.contains("E < 0").all()
    assert sim.read_claims(out)["any"] == any(
        g["significant"].astype(str).str.lower().eq("true").any() for g in gains.values()
    )


def test_a_method_factor_by_another_name_is_compared_against_its_plain_level(tmp_path, new_mlflow_store):
    # sam_on's and late_phase's reports failed outright: their method factor is not called `method`.
    sim, uri, name = _launch(tmp_path, new_mlflow_store, SCOPE_DESIGN, 5)
    out = tmp_path / "report"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_report(name, tracking_uri=uri, out_dir=out, log_to_mlflow=False, n_boot=50)
    assert {p.name for p in out.glob("gain_*.csv")} == {"gain_all.csv", "gain_norm.csv"}
    report = (out / "report.md").read_text()
    assert "gain of all over vanilla" in report and "2 paired-gain tests" in report
    assert "error" not in sim.read_claims(out)


def test_headline_answers_the_question_per_arch_before_the_best_cell(tmp_path, study_store):
    """A quickstart-shaped study (one seed a cell, no confirm): per arch the gain with each side's exact interval
    and the chosen rho, the best cell one line below; no '± 0.000' at an accuracy of 1."""
    from analysis import headline, load_runs
    from trainables.naming import CELL_TAG
    from trainables.tracking import TrialRecorder

    uri, target, _ = study_store(tmp_path, "quick")
    acc = {("vit", "adamw"): 0.80, ("vit", "sam"): 0.85, ("resnet", "adamw"): 1.0, ("resnet", "sam"): 0.99}
    for (arch, method), value in acc.items():
        cell = f"arch={arch},method={method}"
        for i, rho in enumerate((0.02, 0.2) if method == "sam" else (None,)):
            params = {"model.name": arch, "optimizer.method": "none" if method == "adamw" else "sam", "train.seed": 0}
            if rho is not None:
                params["optimizer.hparams.rho"] = rho
            rec = TrialRecorder(target, trial_key=f"{cell}-{i}", run_name=f"{cell}-{i}", params=params)
            rec.set_tags({"factor.arch": arch, "factor.method": method, CELL_TAG: cell})
            rec.log_epoch({"val_acc": value - 0.1 * i, "val_samples": 359}, 0)
            rec.finish("finished")
    lines = headline(load_runs("quick", tracking_uri=uri))
    assert lines[0].startswith("resnet: sam - adamw = -1.00 points") and "rho = 0.02" in lines[0]
    assert "adamw 100.00 [98.98, 100.00]" in lines[0]  # Clopper-Pearson at 359 of 359, not ± 0
    assert lines[1].startswith("vit: sam - adamw = +5.00 points")
    assert lines[-1].startswith("Best cell: resnet/adamw: val_acc 100.00 95% exact [98.98, 100.00]")


def test_the_reports_law_form_is_m4_only_where_the_design_can_check_it():
    from types import SimpleNamespace

    from analysis.report import _law_form

    runs = pd.DataFrame({"data.name": ["cifar10"] * 2})
    shipped = SimpleNamespace(compared=runs, metric="val_acc", mode="max", fractions=[0.05, 0.1, 0.25, 0.5, 1.0])
    form, eps0, why = _law_form(shipped)  # data_scaling.yaml: 4 fractions below the held-out 1.0
    assert form == "saturating" and eps0 == pytest.approx(0.9) and "needs 5 fractions" in why and "has 4" in why
    six = SimpleNamespace(**{**vars(shipped), "fractions": [0.025, *shipped.fractions]})
    assert _law_form(six)[0] == "m4"
    unknown = SimpleNamespace(**{**vars(six), "compared": pd.DataFrame({"data.name": ["imagefolder"]})})
    assert _law_form(unknown)[0] == "saturating" and "unknown" in _law_form(unknown)[2]


def test_the_family_alone_gives_the_whole_reports_verdict(tmp_path, new_mlflow_store):
    # sim_report_null --family measures the family-wise rate on thousands of replicates from the family alone: it
    # must claim exactly where the whole report's CSVs do (seed 22 claims in gain_all, seed 5 nowhere).
    sim = _sim()
    study = tmp_path / "study.yaml"
    study.write_text(SCOPE_DESIGN)
    template = tmp_path / "empty.db"
    new_mlflow_store(template)
    (tmp_path / "direct").mkdir()
    direct = sim.Direct(sim._design(study), tmp_path / "direct", template)
    for seed, where in ((22, ["gain_all.csv"]), (5, None)):
        family = direct.family(seed, tmp_path / f"family{seed}")
        report = direct.report(seed, 50, tmp_path / f"report{seed}")
        assert family["family"] == report["any"] == (where is not None), seed
        assert family.get("where") == report.get("where") == where, seed
