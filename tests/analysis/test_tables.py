"""Tables, fits, plots and the report on a real SQLite MLflow store whose trials carry known numbers."""

import itertools
import math
import warnings

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from analysis import (
    FloorNotIdentifiedWarning,
    data_multiplier,
    fit_power_law,
    fit_scaling_table,
    load_curves,
    load_runs,
    method_pairs,
    plot_error_vs_n,
    plot_gain,
    plot_rho_sensitivity,
    rho_sensitivity,
    sam_gain,
    scaling_table,
    write_report,
)
from analysis.report import PAGES, SECTIONS
from trainables.tracking import TrackingTarget, TrialRecorder

ARCHS = ("resnet", "vit")
FRACTIONS = (0.1, 0.25, 0.5, 1.0)
SEEDS = (0, 1, 2)
# Seed offsets of the best trial; different per method, so the paired differences are not all equal.
DELTA = {"adamw": (-0.01, 0.0, 0.01), "sam": (0.0, -0.01, 0.01)}
# The one combination whose seed 2 failed: (arch, method, fraction) -> the seeds that finished.
FAILED = ("resnet", "adamw", 0.1, 2)
RHO_BEST = {"vit": 0.2, "resnet": 0.02}
RHO_GRID = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


def error(arch: str, method: str, fraction: float) -> float:
    """The known error curves: a f^-0.5 + c per (arch, method)."""
    a, c = {
        ("vit", "adamw"): (0.1, 0.10),
        ("vit", "sam"): (0.06, 0.08),
        ("resnet", "adamw"): (0.05, 0.06),
        ("resnet", "sam"): (0.04, 0.05),
    }[(arch, method)]
    return a * fraction**-0.5 + c


def base_acc(arch, method, fraction):
    return 1.0 - error(arch, method, fraction)


def _record(target, key, params, factors, cell, values, status="finished"):
    rec = TrialRecorder(target, trial_key=key, run_name=key, params=params)
    rec.set_tags(
        {**{f"factor.{k}": str(v) for k, v in factors.items()}, "sharpscale.cell": cell, "sharpscale.trial_id": key}
    )
    for epoch, value in enumerate(values):
        rec.log_epoch({"val_acc": value, "train_loss": 1.0 / (epoch + 1)}, epoch)
    rec.finish(status, None if status == "finished" else "loss became nan")
    return rec.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory, study_store):
    """One store for the module (a new SQLite store costs seconds): a data-scaling study and a rho grid."""
    root = tmp_path_factory.mktemp("store")
    uri, target, study_run = study_store(root, "scaling")
    for arch in ARCHS:
        for method in ("adamw", "sam"):
            for fraction in FRACTIONS:
                for s in SEEDS:
                    factors = {"arch": arch, "method": method, "data.fraction": fraction, "train.seed": s}
                    cell = ",".join(f"{k}={v}" for k, v in factors.items())
                    params = {
                        "model.name": arch,
                        "optimizer.method": "none" if method == "adamw" else method,
                        "data.fraction": fraction,
                        "train.seed": s,
                    }
                    best = base_acc(arch, method, fraction) + DELTA[method][s]
                    key = f"{arch}-{method}-{fraction}-{s}"
                    if (arch, method, fraction, s) == FAILED:
                        _record(target, key, params, factors, cell, [0.99], status="failed")
                        continue
                    if method == "adamw":  # nothing to search: one trial, as the runner's repeats_without_search=1
                        _record(target, key + "-a", params, factors, cell, [best - 0.2, best])
                    else:  # two search trials: the better one counts, the other is worse by 0.05
                        win, lose = (0.2, 0.05) if arch == "vit" else (0.05, 0.2)
                        _record(
                            target,
                            key + "-a",
                            {**params, "optimizer.hparams.rho": win},
                            factors,
                            cell,
                            [best - 0.2, best],
                        )
                        _record(
                            target, key + "-b", {**params, "optimizer.hparams.rho": lose}, factors, cell, [best - 0.05]
                        )
    # One diverged trial whose last logged accuracy beats every other: it must never win a search.
    _record(
        target,
        "vit-sam-diverged",
        {
            "model.name": "vit",
            "optimizer.method": "sam",
            "data.fraction": 1.0,
            "train.seed": 0,
            "optimizer.hparams.rho": 2.0,
        },
        {"arch": "vit", "method": "sam", "data.fraction": 1.0, "train.seed": 0},
        "arch=vit,method=sam,data.fraction=1.0,train.seed=0",
        [0.999],
        status="diverged",
    )

    rho_exp = MlflowClient(uri).create_experiment("rho", artifact_location=(root / "art-rho").as_uri())
    rho_target = TrackingTarget(uri, rho_exp)
    for arch in ARCHS:
        for rho in RHO_GRID:
            for s in (0, 1):
                # A parabola in log10(rho), peaked at the architecture's best rho; seeds differ by 0.002.
                acc = 0.9 - 0.05 * (math.log10(rho) - math.log10(RHO_BEST[arch])) ** 2 + (0.002 if s else -0.002)
                factors = {"arch": arch, "method": "sam"}
                _record(
                    rho_target,
                    f"{arch}-{rho}-{s}",
                    {"model.name": arch, "optimizer.method": "sam", "optimizer.hparams.rho": rho, "train.seed": s},
                    factors,
                    "arch={arch},method=sam".format(arch=arch),
                    [acc],
                )
    _record_geometry(uri, root)
    return uri, study_run


def _record_geometry(uri, root):
    """Experiment "geo": trials as a geometry section records them (every: 2 of 3 epochs), gap rising with rho and lr."""
    target = TrackingTarget(
        uri, MlflowClient(uri).create_experiment("geo", artifact_location=(root / "art-geo").as_uri())
    )
    for rho, lr in itertools.product([0.01, 0.05, 0.1], [0.1, 0.05]):
        key = f"rho{rho}-lr{lr}"
        rec = TrialRecorder(
            target,
            trial_key=key,
            run_name=key,
            params={"optimizer.method": "sam", "optimizer.base": "sgd", "optimizer.momentum": 0.9},
        )
        rec.set_tags(
            {
                "factor.arch": "resnet",
                "factor.rho": str(rho),
                "factor.lr": str(lr),
                "sharpscale.cell": f"arch=resnet,rho={rho},lr={lr}",
                "sharpscale.trial_id": key,
            }
        )
        gap = 0.1 * rho + lr
        for epoch, scale in enumerate([1.0, 0.5, 0.1]):
            metrics = {"train_loss": 1.0 / (epoch + 1), "lr": lr * scale, "train_acc": 0.9 + gap, "val_acc": 0.9}
            if epoch >= 1:
                metrics.update(
                    {
                        "geometry/lambda_max": 10 * gap + epoch,
                        "geometry/lambda_max_converged": 1.0,
                        "geometry_time_s": 0.5,
                    }
                )
            rec.log_epoch(metrics, epoch)
        rec.finish("finished")


@pytest.fixture(scope="module")
def runs(store):
    return load_runs("scaling", tracking_uri=store[0])


# ------------------------------------------------------------------------------------------ scaling table


def test_scaling_table_takes_best_of_search_then_mean_sd_over_seeds(runs):
    table = scaling_table(runs)
    assert list(table.mean.columns) == list(FRACTIONS)
    assert list(table.mean.index) == [("resnet", "adamw"), ("resnet", "sam"), ("vit", "adamw"), ("vit", "sam")]
    for arch in ARCHS:
        for method in ("adamw", "sam"):
            for f in FRACTIONS:
                if (arch, method, f) == FAILED[:3]:
                    continue
                # Offsets (-0.01, 0, 0.01) in some order: mean = the base accuracy, sd = 0.01 exactly.
                assert table.mean.loc[(arch, method), f] == pytest.approx(base_acc(arch, method, f), abs=1e-12)
                assert table.sd.loc[(arch, method), f] == pytest.approx(0.01, abs=1e-12)
                assert table.n.loc[(arch, method), f] == 3
    # The failed seed 2 is left out: seeds 0 and 1 remain (offsets -0.01 and 0).
    b = base_acc("resnet", "adamw", 0.1)
    assert table.n.loc[("resnet", "adamw"), 0.1] == 2
    assert table.mean.loc[("resnet", "adamw"), 0.1] == pytest.approx(b - 0.005, abs=1e-12)
    assert table.sd.loc[("resnet", "adamw"), 0.1] == pytest.approx(0.01 / math.sqrt(2), abs=1e-12)
    # The diverged trial (0.999) never wins: vit/sam at 1.0 keeps its base accuracy.
    assert table.mean.loc[("vit", "sam"), 1.0] == pytest.approx(base_acc("vit", "sam", 1.0), abs=1e-12)
    assert (table.best["val_acc"].dropna() < 0.99).all() and table.best["val_acc"].isna().sum() == 1  # the failed seed
    text = table.formatted(digits=2, scale=100.0)
    assert text.loc[("vit", "adamw"), 0.25] == f"{100 * base_acc('vit', 'adamw', 0.25):.2f} ± 1.00 (3)"
    assert text.loc[("resnet", "adamw"), 0.1] == f"{100 * (b - 0.005):.2f} ± 0.71 (2)"
    md = table.to_markdown(digits=2, scale=100.0)
    assert md.count("\n| ") == 4 + 1 and "± 1.00 (3)" in md  # header + 4 rows
    long = table.long()
    assert len(long) == 16 and set(long.columns) == {"arch", "method", "fraction", "mean", "sd", "n"}


def test_scaling_table_names_a_missing_column_and_the_ones_present(runs):
    with pytest.raises(ValueError, match=r"fraction='data.frac'.*Columns present: .*'data.fraction'"):
        scaling_table(runs, fraction="data.frac")


def test_best_of_search_refuses_to_maximise_across_another_factor(runs):
    # Without the seed in the keys, a group holds the cells of three seeds.
    with pytest.raises(ValueError, match=r"several cells.*factor\.train\.seed"):
        scaling_table(runs, seed=None)


# ------------------------------------------------------------------------------------------------- gain


def test_sam_gain_pairs_by_seed_with_a_t_interval_around_the_true_gain(runs):
    from scipy.stats import t

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a small sample is said in the table, not on stderr
        gain = sam_gain(runs, baseline="none", treatment="sam")
    assert gain.attrs["baseline"] == "adamw"  # found through optimizer.method = none
    for arch in ARCHS:
        for f in FRACTIONS:
            row = gain.loc[(arch, f)]
            true_gain = base_acc(arch, "sam", f) - base_acc(arch, "adamw", f)
            if (arch, f) == ("resnet", 0.1):
                # Seeds 0 and 1: sam offsets (0, -0.01), adamw (-0.01, 0): differences +0.01 and -0.01.
                assert row["n_pairs"] == 2 and row["note"].startswith("2 seed pairs: interval unreliable")
                assert row["gain"] == pytest.approx(true_gain, abs=1e-12)
                continue
            assert row["n_pairs"] == 3 and row["note"] in (
                "",
                f"no gain detected: the family-wide interval excludes gains below {row['band_low']:.3g} "
                f"and above {row['band_high']:.3g}",
            )
            # Paired differences: offsets (0 - -0.01, -0.01 - 0, 0.01 - 0.01) = (+0.01, -0.01, 0).
            assert row["gain"] == pytest.approx(true_gain, abs=1e-12)
            assert row["sd"] == pytest.approx(0.01, abs=1e-12)
            assert row["ci_low"] < true_gain < row["ci_high"]
            # Student's t on 3 pairs: mean ± t(0.975, 2) x sd / sqrt(3), exact (a bootstrap over 3 pairs is too narrow).
            half = t.ppf(0.975, 2) * 0.01 / np.sqrt(3)
            assert row["ci_high"] - row["ci_low"] == pytest.approx(2 * half, rel=1e-9)
            # The band over the arch's 4 fractions is wider (Bonferroni), Holm's p no smaller than the raw one.
            assert row["band_high"] - row["band_low"] == pytest.approx(2 * t.ppf(1 - 0.025 / 4, 2) * 0.01 / np.sqrt(3))
            assert row["p_holm"] >= row["p_value"] and row["significant"] == (row["p_holm"] < 0.05)
            if not row["significant"]:
                # What a null says is what its interval excludes, not a post-hoc power from the observed sd.
                assert row["detectable"] > half and "excludes gains below" in row["note"]
                assert "power" not in row["note"]
    again = sam_gain(runs[runs["factor.arch"] == "vit"], baseline="adamw", treatment="sam")
    assert again.loc[("vit", 0.5), "ci_low"] == gain.loc[("vit", 0.5), "ci_low"]  # no draws: reproducible
    one = sam_gain(runs[runs["train.seed"].astype(int) == 0])
    assert (one["n_pairs"] == 1).all() and one["ci_low"].isna().all() and one["ci_high"].isna().all()
    assert set(one["note"]) == {"one seed pair only: no interval"} and not one["significant"].any()


def test_sam_gain_takes_its_test_from_the_one_paired_t(runs, monkeypatch):
    import analysis.scaling

    seen = []
    real = analysis.scaling.paired_t

    def spy(diffs, **kw):
        seen.append(len(diffs))
        return real(diffs, **kw)

    monkeypatch.setattr(analysis.scaling, "paired_t", spy)
    gain = sam_gain(runs, baseline="none", treatment="sam")
    assert sorted(seen) == sorted(gain["n_pairs"].tolist())


def test_significant_is_blank_where_no_test_can_be_run(runs):
    # One seed pair per fraction: no p-value, so "not significant" is no verdict: NA in the table, "–" in the
    # report (issue 23: it printed False).
    from analysis.report import _fmt

    one = sam_gain(runs[runs["train.seed"].astype(int) == 0])
    assert one["significant"].isna().all() and one["p_holm"].isna().all()
    assert set(_fmt(one)["significant"]) == {"–"}
    every = sam_gain(runs)
    assert every["significant"].notna().all()
    assert set(_fmt(every)["significant"]) <= {True, False}


def test_holm_adjusts_step_down():
    from analysis.tables import holm

    adjusted = holm([0.01, 0.04, 0.03, float("nan")])
    assert adjusted[:3] == pytest.approx([0.03, 0.06, 0.06]) and np.isnan(adjusted[3])


def test_scaling_table_says_n_and_notes_small_cells(runs):
    two = scaling_table(runs[runs["train.seed"].astype(int) < 2]).to_markdown()
    assert "n = number of seeds" in two and "(2)" in two
    assert "Note: 16 of 16 cells rest on fewer than 3 seeds (n = [2])" in two
    # All seeds: only resnet@0.1 (one seed's trials failed) rests on 2.
    assert "Note: 1 of 16 cells rest on fewer than 3 seeds (n = [2])" in scaling_table(runs).to_markdown()


def test_sam_gain_unknown_level_lists_the_levels(runs):
    with pytest.raises(ValueError, match=r"treatment='gsam'.*\['adamw', 'sam'\]"):
        sam_gain(runs, treatment="gsam")


def test_method_pairs_match_each_sam_level_with_the_plain_level_of_the_same_settings(runs):
    import pandas as pd

    assert method_pairs(runs) == [("sam", "adamw")]
    # Table 5's four methods: SAM pairs with Vanilla, SAM + AUG with AUG (same data.augment).
    levels = {
        "vanilla": ("none", "basic"),
        "sam": ("sam", "basic"),
        "aug": ("none", "strong"),
        "sam_aug": ("sam", "strong"),
    }
    table5 = pd.DataFrame(
        [
            {"factor.method": lv, "optimizer.method": opt, "data.augment": aug, "model.name": arch, "train.seed": s}
            for lv, (opt, aug) in levels.items()
            for arch in ("vit", "resnet")
            for s in (0, 1)
        ]
    )
    assert sorted(method_pairs(table5)) == [("sam", "vanilla"), ("sam_aug", "aug")]
    with pytest.raises(ValueError, match=r"several levels .* \['aug', 'vanilla'\]"):
        sam_gain(
            table5.assign(**{"data.fraction": 1.0, "val_acc": 0.5, "status": "finished"}),
            baseline="none",
            arch="model.name",
        )


# ------------------------------------------------------------------------------------------- power laws


def test_power_law_recovers_known_parameters_without_noise():
    n = np.geomspace(100, 1e5, 8)
    fit = fit_power_law(n, 2.0 * n**-0.5 + 0.1, n_boot=100)
    assert (fit.a, fit.b, fit.c) == pytest.approx((2.0, 0.5, 0.1), rel=1e-6)
    assert fit.floor_identified and fit.note == ""
    assert fit.predict(400.0) == pytest.approx(0.2, rel=1e-6)


def test_power_law_with_noise_has_intervals_that_contain_the_truth():
    rng = np.random.default_rng(3)
    n = np.repeat(np.geomspace(100, 1e5, 8), 3)  # three seeds per size
    err = 2.0 * n**-0.5 + 0.1 + rng.normal(0.0, 0.003, len(n))
    fit = fit_power_law(n, err, n_boot=300, seed=0)
    assert fit.b == pytest.approx(0.5, abs=0.05) and fit.c == pytest.approx(0.1, abs=0.005)
    for name, truth in (("a", 2.0), ("b", 0.5), ("c", 0.1)):
        lo, hi = fit.intervals[name]
        assert lo <= truth <= hi, (name, lo, hi)
    assert fit.floor_identified
    assert fit.samples.shape == (300, 3)


def test_power_law_warns_and_flags_an_unidentifiable_floor():
    n = np.array([0.1, 0.3, 1.0])
    with pytest.warns(FloorNotIdentifiedWarning, match="only 3 distinct n"):
        fit = fit_power_law(n, 0.1 * n**-0.5 + 0.1, n_boot=100)
    assert not fit.floor_identified and math.isnan(fit.intervals["c"][0])
    # A curve still steep at the largest n: the floor's interval covers most of [0, min err].
    rng = np.random.default_rng(0)
    n = np.repeat(np.geomspace(100, 1e5, 6), 3)
    with pytest.warns(FloorNotIdentifiedWarning, match="insensitive to the floor"):
        fit = fit_power_law(n, 0.5 * n**-0.3 + 0.05 + rng.normal(0, 0.01, len(n)), n_boot=200)
    assert not fit.floor_identified


def test_power_law_rejects_too_few_points():
    with pytest.raises(ValueError, match="at least 3 points"):
        fit_power_law([1.0, 2.0], [0.3, 0.2])


def test_data_multiplier_on_known_curves():
    f = np.array([0.1, 0.25, 0.5, 1.0])
    vanilla = fit_power_law(f, 0.3 * f**-0.5 + 0.1, n_boot=100)
    sam = fit_power_law(f, 0.2 * f**-0.5 + 0.05, n_boot=100)
    # SAM's error at n=1 is 0.25; 0.3 n'^-0.5 + 0.1 = 0.25 gives n' = 4.
    m = data_multiplier(vanilla, sam, 1.0)
    assert m.multiplier == pytest.approx(4.0, rel=1e-6) and m.reachable and m.extrapolated
    assert m.interval[0] <= 4.0 + 1e-6 and m.interval[1] >= 4.0 - 1e-6
    # At n=0.25 SAM's error is 0.45: n' = (0.3 / 0.35)^2.
    assert data_multiplier(vanilla, sam, 0.25).multiplier == pytest.approx((0.3 / 0.35) ** 2 / 0.25, rel=1e-6)
    # A vanilla floor (0.3) above SAM's error at n=1 (0.25): unreachable, said so.
    high_floor = fit_power_law(f, 0.3 * f**-0.5 + 0.3, n_boot=100)
    m = data_multiplier(high_floor, sam, 1.0)
    assert m.multiplier == math.inf and not m.reachable and "unreachable" in m.explanation


def test_fit_scaling_table_recovers_the_generating_curves(runs):
    table = scaling_table(runs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FloorNotIdentifiedWarning)
        fits = fit_scaling_table(table, n_boot=100)
    fit = fits[("vit", "adamw")]
    # Seed offsets average out at every fraction, so the fit goes through the generating curve.
    assert fit.b == pytest.approx(0.5, abs=0.05)
    assert fit.predict(0.5) == pytest.approx(error("vit", "adamw", 0.5), abs=0.003)


# ------------------------------------------------------------------------------------------------- rho


def test_rho_sensitivity_picks_each_architectures_best_rho(store):
    runs = load_runs("rho", tracking_uri=store[0])
    result = rho_sensitivity(runs, n_boot=500)
    assert result.best.loc[("vit", "sam"), "best_rho"] == 0.2
    assert result.best.loc[("resnet", "sam"), "best_rho"] == 0.02
    vit = result.levels[result.levels["arch"] == "vit"].set_index("rho")
    assert vit.loc[0.2, "mean"] == pytest.approx(0.9, abs=1e-12) and vit.loc[0.2, "n"] == 2
    assert vit.loc[0.2, "sd"] == pytest.approx(0.004 / math.sqrt(2), abs=1e-12)
    assert result.best.loc[("vit", "sam"), "rho_low"] <= 0.2 <= result.best.loc[("vit", "sam"), "rho_high"]
    assert vit["p_best"].sum() == pytest.approx(1.0) and vit["p_best"].idxmax() == 0.2
    binned = rho_sensitivity(runs, bins=3, n_boot=500)
    assert len(binned.levels[binned.levels["arch"] == "vit"]) == 3


def test_the_best_rhos_interval_is_the_confidence_set_calibrated_at_ties(store):
    from analysis.runs import RHO
    from analysis.sweep import best_level_set

    runs = load_runs("rho", tracking_uri=store[0])
    result = rho_sensitivity(runs, n_boot=500)
    from analysis.tables import _ok

    done = _ok(runs, "val_acc")
    done = done[pd.to_numeric(done[RHO], errors="coerce") > 0]
    for (arch, method), row in result.best.iterrows():
        part = done[(done["factor.arch"] == arch) & (done["factor.method"] == method)]
        rho = pd.to_numeric(part[RHO])
        levels = sorted(rho.unique())
        expected = best_level_set(levels, [part.loc[rho == v, "val_acc"].to_numpy() for v in levels])["set"]
        assert (row["rho_low"], row["rho_high"]) == (min(expected), max(expected)), (arch, method)
        assert row["best_set"] == ", ".join(f"{v:.4g}" for v in expected)
    # Two levels exactly as good: both stay in the set (a bootstrap of the argmax drops one in ~40% of such studies).
    tie = done[(done["factor.arch"] == "vit") & (done["factor.method"] == "sam")].copy()
    rho = pd.to_numeric(tie[RHO])
    top = rho == 0.2
    twin = tie[top].assign(**{RHO: 0.5, "run_id": tie.loc[top, "run_id"] + "-twin"})
    tied = rho_sensitivity(pd.concat([tie[rho != 0.5], twin], ignore_index=True), n_boot=200).best.iloc[0]
    assert tied["rho_low"] <= 0.2 and tied["rho_high"] >= 0.5 and "0.2" in tied["best_set"]
    assert "confidence set for the best level" in result.to_markdown()


def test_rho_sensitivity_on_the_scaling_study_splits_by_fraction(runs):
    result = rho_sensitivity(runs, by=("data.fraction",), baseline="none", n_boot=200)
    assert result.best.loc[("vit", "sam", 0.5), "best_rho"] == 0.2
    assert result.best.loc[("resnet", "sam", 0.5), "best_rho"] == 0.05
    # The baseline (rho = 0 column of Table 13): the mean over adamw's finished trials (seed offsets cancel).
    assert result.best.loc[("vit", "sam", 0.5), "baseline"] == pytest.approx(base_acc("vit", "adamw", 0.5), abs=1e-12)


def test_rho_transfer_says_whether_the_best_rho_moves_with_data(runs):
    from analysis.tables import rho_transfer

    result = rho_sensitivity(runs, by=("data.fraction",), n_boot=200)
    table = rho_transfer(result)
    # The fixture's best rho is 0.2 for the ViT at every fraction: slope 0.
    assert table.loc[("vit", "sam"), "slope"] == pytest.approx(0.0, abs=1e-12)
    assert table.loc[("vit", "sam"), "fractions"] == 4 and table.loc[("vit", "sam"), "rho@0.5"].startswith("0.2")
    # The slope comes with its interval (issue 22: a slope without uncertainty reads as a trend).
    for key, row in table.iterrows():
        if np.isfinite(row["slope_low"]):
            assert row["slope_low"] <= row["slope"] <= row["slope_high"], key
    assert np.isfinite(table["slope_low"]).any()
    with pytest.raises(ValueError, match="by=\\('data.fraction',\\)"):
        rho_transfer(rho_sensitivity(runs, n_boot=200))


# ------------------------------------------------------------------------------------------- curves, plots


def test_load_curves_is_tidy_per_epoch(store, runs):
    ids = runs[runs["trial_id"] == "vit-sam-0.5-1-a"]["run_id"].tolist()
    curves = load_curves("scaling", tracking_uri=store[0], metrics=("val_acc", "train_loss"), run_ids=ids)
    assert list(curves.columns) == [
        "run_id",
        "trial_id",
        "cell",
        "launch",
        "factor.arch",
        "factor.data.fraction",
        "factor.method",
        "factor.train.seed",
        "metric",
        "step",
        "value",
    ]
    assert set(curves["launch"]) == {1}  # recorded before launches were tagged: the first
    acc = curves[curves["metric"] == "val_acc"]
    best = base_acc("vit", "sam", 0.5) - 0.01
    assert acc["step"].tolist() == [0, 1] and acc["value"].tolist() == pytest.approx([best - 0.2, best])
    assert curves[curves["metric"] == "train_loss"]["value"].tolist() == [1.0, 0.5]
    with pytest.raises(ValueError, match="not trials of study"):
        load_curves("scaling", tracking_uri=store[0], run_ids=["nope"])


def test_plots_write_png_files(runs, tmp_path):
    table = scaling_table(runs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fits = fit_scaling_table(table, n_boot=100)
        gain = sam_gain(runs)
        rho = rho_sensitivity(runs, by=("data.fraction",), n_boot=200)
    paths = [tmp_path / "scaling.png", tmp_path / "gain.png", tmp_path / "rho.png"]
    figs = [
        plot_error_vs_n(table, fits, path=paths[0]),
        plot_gain(gain, path=paths[1]),
        plot_rho_sensitivity(rho, path=paths[2]),
    ]
    for path, fig in zip(paths, figs):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
        assert fig.axes[0].get_xscale() == "log"
    assert figs[0].axes[0].get_yscale() == "log"
    with pytest.raises(ValueError, match=r"must end in \.png"):
        plot_gain(gain, path=tmp_path / "gain.pdf")


def test_plots_label_every_axis_show_n_and_draw_no_interval_the_data_cannot_give(runs, tmp_path):
    one_seed = runs[runs["train.seed"].astype(int) == 0]
    table = scaling_table(one_seed)
    # A perfect score is an error of 0, which a log axis cannot show: it must be marked, not dropped.
    table.mean.iloc[0, 0] = 1.0
    fig = plot_error_vs_n(table)
    ax = fig.axes[0]
    assert ax.get_xlabel() and ax.get_ylabel()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "error 0 (a log axis cannot show it): on the bottom edge" in labels and all(
        "n=1 seeds" in t for t in labels if " / " in t
    )
    assert not any(c.get_segments() for c in ax.collections)  # n = 1: no error bars at all
    xlo, xhi = ax.get_xlim()
    assert xlo > 0.05 and xhi < 2.0  # the measured fractions 0.1..1, not padded to the next decade
    gain = sam_gain(one_seed)
    gfig = plot_gain(gain)
    gax = gfig.axes[0]
    assert gax.get_xlabel() and gax.get_ylabel() and not any(c.get_segments() for c in gax.collections)
    assert any("no gain (sam = adamw)" == t.get_text() for t in gax.get_legend().get_texts())
    rho = rho_sensitivity(one_seed, by=("data.fraction",), baseline="none", n_boot=200)
    rfig = plot_rho_sensitivity(rho)
    assert all(a.get_xlabel() for a in rfig.axes) and rfig.axes[0].get_ylabel()
    # Each panel its own y axis and label (one arch's range must not flatten another's), the knob's own name on x.
    panels = [a for a in rfig.axes if a.get_title().startswith("arch:")]
    assert len(panels) >= 2 and all(a.get_ylabel() for a in panels)
    assert not panels[0].get_shared_y_axes().joined(panels[0], panels[1])
    assert panels[0].get_xlabel() == "rho (log scale)"
    assert not any(p.__class__.__name__ == "Rectangle" and p.get_alpha() == 0.12 for a in rfig.axes for p in a.patches)
    assert any(t.get_text().startswith("baseline (rho = 0)") for t in rfig.axes[0].get_legend().get_texts())
    ticks = [t for t in rfig.axes[0].get_xticks() if rfig.axes[0].get_xlim()[0] <= t <= rfig.axes[0].get_xlim()[1]]
    assert len(ticks) >= 2  # a labelled log axis, even over less than a decade


# ------------------------------------------------------------------------------------------------ report


def test_write_report_writes_tables_and_plots_and_logs_them_to_the_study_run(store, tmp_path):
    uri, study_run = store
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        paths = write_report("scaling", tracking_uri=uri, out_dir=tmp_path / "report", n_boot=200)
    names = {p.name for p in paths}
    # Every file of every section this store's records support (3 data fractions of sam and its plain partner
    # adamw, rho searched, histories; no confirm runs, no geometry, no compute comparison), and the two pages: the
    # section table names them (analysis.report.SECTIONS), so a new table is picked up here.
    unsupported = {"confirm", "gain", "geometry", "sharpness", "compute"}
    expected = set(PAGES).union(*(s.names(["sam"]) for s in SECTIONS if s.name not in unsupported))
    assert names == expected
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
    report = (tmp_path / "report" / "report.md").read_text()
    assert (
        "## Data scaling (%)" in report
        and "2 seed pairs: interval unreliable" in report
        and "![rho sensitivity]" in report
    )
    assert (
        "## Scaling laws checked by extrapolation" in report and "## Scaling-law difference of sam over adamw" in report
    )
    # The power-law fits get the table's seeds (their offsets are shared by every fraction): seed-level intervals,
    # and the data multiplier's interval pairs the two fits' left-out seeds.
    power_laws = pd.read_csv(tmp_path / "report" / "scaling_fits.csv")
    assert power_laws["interval"].str.startswith("delete-one-seed jackknife over 3 seeds").all()
    assert "paired over 3 seeds" in (tmp_path / "report" / "data_multiplier_sam.md").read_text()
    logged = {a.path for a in MlflowClient(uri).list_artifacts(study_run, "report")}
    assert logged == {f"report/{n}" for n in expected}
    # The one self-contained page: report.md's tables as HTML tables (the answer's numbers in them), every plot
    # embedded, no file it needs beside it; the study run's description links to it in MLflow's artifact view.
    page = (tmp_path / "report" / "report.html").read_text()
    summary = (tmp_path / "report" / "summary.md").read_text()
    row = next(ln for ln in summary.splitlines() if ln.startswith("| resnet"))
    assert "<td>" + "</td><td>".join(c.strip() for c in row.strip("| ").split("|")) + "</td>" in page
    assert "<h2>Data scaling (%)</h2>" in page and "| ---" not in page
    pngs = sorted(n for n in expected if n.endswith(".png") and n[:-4] + ".svg" not in expected)  # SVG: inline
    assert page.count('src="data:image/png;base64,') == len(pngs) and ".png)" not in page
    import base64

    assert base64.b64encode((tmp_path / "report" / "curves.png").read_bytes()).decode() in page
    note = MlflowClient(uri).get_run(study_run).data.tags["mlflow.note.content"]
    experiment_id = MlflowClient(uri).get_run(study_run).info.experiment_id
    link = (
        f"#/experiments/{experiment_id}/runs/{study_run}/artifactPath/report/report.html?workflowType=machine_learning"
    )
    assert f"({link})" in note  # on MLflow's model-training side, as every address the study writes
    with warnings.catch_warnings():  # written again: one link, not two
        warnings.simplefilter("ignore")
        write_report("scaling", tracking_uri=uri, out_dir=tmp_path / "report2", n_boot=50)
    assert MlflowClient(uri).get_run(study_run).data.tags["mlflow.note.content"].count("report.html?") == 1


def test_write_report_without_a_study_run_says_how_to_proceed(store, tmp_path):
    with pytest.raises(LookupError, match="log_to_mlflow=False"):
        write_report("rho", tracking_uri=store[0], out_dir=tmp_path)
    paths = write_report("rho", tracking_uri=store[0], out_dir=tmp_path, log_to_mlflow=False, n_boot=200)
    assert {p.name for p in paths} >= {"summary.md", "rho_sensitivity.png", "report.md"}
    assert "scaling.md" not in {p.name for p in paths}  # one fraction: no data-scaling table


def test_report_of_trials_that_measured_geometry(store, tmp_path):
    paths = write_report("geo", tracking_uri=store[0], out_dir=tmp_path, log_to_mlflow=False, n_boot=100)
    assert {"geometry_tau.md", "geometry_tau.csv", "sharpness.png"} <= {p.name for p in paths}
    tau = pd.read_csv(tmp_path / "geometry_tau.csv", index_col="measure")
    assert list(tau.index) == ["geometry/lambda_max"]  # bookkeeping and geometry_time_s are no measures
    assert tau.loc["geometry/lambda_max", "n"] == 6 and tau.loc["geometry/lambda_max", "tau"] == pytest.approx(1.0)
    assert tau.loc["geometry/lambda_max", "tau_rho"] == pytest.approx(1.0)  # within each lr, rho alone moves both
    assert tau.loc["geometry/lambda_max", "groups_rho"] == 2
    report = (tmp_path / "report.md").read_text()
    assert "## Geometry against the generalisation gap" in report and "## Sharpness during training" in report


def test_analysis_imports_neither_ray_nor_optuna():
    import subprocess
    import sys

    code = (
        "import sys, analysis, analysis.report, analysis.plots, analysis.scaling, analysis.tables; "
        "bad = [m for m in ('ray', 'optuna') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_curves_legend_shows_what_the_lines_show_and_sam_curves_carry_their_rho():
    from analysis import plot_curves

    rows = []
    for run, arch, method in (("a", "vit", "adamw"), ("b", "vit", "sam")):
        for step in range(3):
            rows.append(
                {"run_id": run, "cell": f"{arch}/{method}", "factor.arch": arch, "factor.method": method,
                 "metric": "val_acc", "step": step, "value": 0.5 + 0.1 * step}
            )  # fmt: skip
    fig = plot_curves(pd.DataFrame(rows), labels={"b": "rho=0.05"})
    legend = fig.legends[0]
    # The curves carry no markers, so neither do the legend's method entries; the dash patterns get a long swatch.
    assert all(h.get_marker() in (None, "None", "") for h in legend.legend_handles)
    assert legend.handlelength >= 3
    assert [t.get_text() for t in fig.axes[0].texts] == ["rho=0.05"]


def test_one_training_set_size_is_no_log_log_plot(runs):
    one = runs[runs["data.fraction"] == runs["data.fraction"].min()]
    fig = plot_error_vs_n(scaling_table(one))
    ax = fig.axes[0]
    assert ax.get_xscale() == "linear" and ax.get_yscale() == "linear"
    assert "no scaling to show" in fig._suptitle.get_text()
    assert plot_error_vs_n(scaling_table(runs)).axes[0].get_xscale() == "log"  # several sizes: log-log as before
