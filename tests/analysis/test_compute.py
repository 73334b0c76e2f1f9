"""Compute cost from logged epoch times, the compute-matched table, its frontier plot and report section, on a real
SQLite MLflow store whose trials carry known times and accuracies."""

import math
import warnings

import numpy as np
import pandas as pd
import pytest

from analysis import compute_matched, load_curves, load_runs, plot_compute_frontier, trial_compute, write_report
from trainables.naming import GPUS_PER_WORKER_PARAM, WORKERS_PARAM
from trainables.tracking import TrialRecorder

# (method, epochs, seconds per epoch, final val_acc per seed); SAM's cell searched two rhos per seed.
PLAN = {
    "vanilla": (2, 10.0, {0: [0.80], 1: [0.82]}),
    "vanilla_2x": (4, 10.0, {0: [0.84], 1: [0.85]}),
    "sam": (2, 20.0, {0: [0.86, 0.70], 1: [0.88, 0.60]}),
}
WORKERS, GPUS = 2, 0.5  # each trial: 2 DDP workers of half a GPU each, i.e. 1 GPU in all


@pytest.fixture(scope="module")
def store(tmp_path_factory, study_store):
    uri, target, study_run = study_store(tmp_path_factory.mktemp("compute"), "compute")
    for method, (epochs, seconds, seeds) in PLAN.items():
        for seed, finals in seeds.items():
            cell = f"arch=resnet,method={method},train.seed={seed}"
            for i, final in enumerate(finals):
                key = f"{method}-{seed}-{i}"
                params = {
                    "optimizer.method": "sam" if method == "sam" else "none",
                    "schedule.epochs": epochs,
                    "train.seed": seed,
                    WORKERS_PARAM: WORKERS,
                    GPUS_PER_WORKER_PARAM: GPUS,
                }
                rec = TrialRecorder(target, trial_key=key, run_name=key, params=params)
                rec.set_tags(
                    {
                        "factor.arch": "resnet",
                        "factor.method": method,
                        "factor.train.seed": str(seed),
                        "sharpscale.cell": cell,
                        "sharpscale.trial_id": key,
                    }
                )
                for epoch in range(epochs):
                    rec.log_epoch({"val_acc": final - 0.1 * (epochs - 1 - epoch), "epoch_time_s": seconds}, epoch)
                rec.finish("finished")
    # A study with vit too, whose one trial never finished an epoch: its cost is unknown, not 0.
    rec = TrialRecorder(target, trial_key="vit-dead", run_name="vit-dead", params={"schedule.epochs": 2})
    rec.set_tags(
        {
            "factor.arch": "vit",
            "factor.method": "vanilla",
            "factor.train.seed": "0",
            "sharpscale.cell": "arch=vit,method=vanilla,train.seed=0",
            "sharpscale.trial_id": "vit-dead",
        }
    )
    rec.finish("failed", "out of memory")
    return uri, study_run


@pytest.fixture(scope="module")
def frames(store):
    uri, _ = store
    runs = load_runs("compute", tracking_uri=uri)
    return runs, load_curves("compute", tracking_uri=uri, metrics=("epoch_time_s",))


def test_trial_compute_sums_epoch_times_times_the_resources_held(frames):
    runs, times = frames
    cost = trial_compute(runs, times).set_index("run_id")
    by_name = dict(zip(runs["run_id"], runs["trial_id"]))
    for run_id, row in cost.iterrows():
        name = by_name[run_id]
        if name == "vit-dead":
            assert row["epochs_run"] == 0 and math.isnan(row["cost_s"]) and row["unit"] == "s (resources not recorded)"
            continue
        epochs, seconds, _ = PLAN[name.rsplit("-", 2)[0]]
        assert row["epochs_run"] == epochs and row["train_s"] == pytest.approx(epochs * seconds)
        assert row["cost_s"] == pytest.approx(epochs * seconds * WORKERS * GPUS) and row["unit"] == "GPU-s"
    # Without GPUs a trial costs its workers' seconds; without the resource params, its own seconds.
    cpu = runs.assign(**{GPUS_PER_WORKER_PARAM: 0.0})
    assert set(trial_compute(cpu, times).dropna(subset=["cost_s"])["unit"]) == {"CPU worker-s"}
    assert trial_compute(cpu, times)["cost_s"].max() == pytest.approx(4 * 10.0 * WORKERS)
    bare = runs.drop(columns=[WORKERS_PARAM, GPUS_PER_WORKER_PARAM])
    assert trial_compute(bare, times)["cost_s"].max() == pytest.approx(4 * 10.0)
    with pytest.raises(ValueError, match="epoch_times.metric"):
        trial_compute(runs, times.drop(columns=["metric"]))


def test_compute_matched_pays_a_search_and_averages_seeds(frames):
    runs, times = frames
    table = compute_matched(runs, times)
    assert table.attrs["unit"] == "GPU-s"  # the vit trial without a timed epoch has no cost to show
    sam = table.loc[("resnet", "sam")]
    # Each SAM cell's answer is its better rho (0.86, 0.88); its cost both trials' (2 x 2 epochs x 20 s x 1 GPU).
    assert sam["metric_mean"] == pytest.approx(0.87) and sam["metric_se"] == pytest.approx(
        np.std([0.86, 0.88], ddof=1) / math.sqrt(2)
    )
    assert sam["cost_mean"] == pytest.approx(80.0) and sam["cost_se"] == pytest.approx(0.0)
    assert sam["run_cost_mean"] == pytest.approx(40.0)  # one run of SAM: its answer's own trial, not the search
    assert (sam["n"], sam["trials"], sam["epochs"], sam["note"]) == (2, 4, 2, "2 seeds: interval unreliable")
    assert sam["cost_n"] == 2  # every cell with a result has its cost
    twice = table.loc[("resnet", "vanilla_2x")]
    assert (twice["epochs"], twice["cost_mean"], twice["metric_mean"]) == (4, pytest.approx(40.0), pytest.approx(0.845))
    dead = table.loc[("vit", "vanilla")]
    assert dead["n"] == 0 and math.isnan(dead["metric_mean"]) and dead["note"] == "no seeds"
    one = compute_matched(runs[runs["factor.train.seed"] == "0"], times).loc[("resnet", "vanilla")]
    assert one["n"] == 1 and math.isnan(one["metric_se"]) and math.isnan(one["cost_se"])


def test_compute_matched_gains_pair_cells_by_seed(frames):
    from scipy.stats import t

    from analysis.compute import compute_matched_gains

    runs, times = frames
    gains = compute_matched_gains(runs, times, baseline="vanilla")
    sam = gains.loc[("resnet", "sam")]
    # Seed pairs: 0.86 - 0.80 and 0.88 - 0.82, both +0.06: no spread, so p = 0 and an interval of width 0.
    assert sam["gain"] == pytest.approx(0.06) and sam["n_pairs"] == 2 and sam["ci_low"] == pytest.approx(0.06)
    # One run against one run (the chosen 2-epoch trial at 20 s a epoch, the baseline's 2 epochs at 10 s), as the
    # frontier plot draws it: the search's other trial is not charged (it made the ratio 4, "SAM costs 4x").
    assert sam["cost_ratio"] == pytest.approx(40.0 / 20.0)
    twice = gains.loc[("resnet", "vanilla_2x")]
    diffs = np.array([0.84 - 0.80, 0.85 - 0.82])
    half = t.ppf(0.975, 1) * diffs.std(ddof=1) / math.sqrt(2)
    assert twice["gain"] == pytest.approx(diffs.mean()) and twice["ci_high"] - twice["ci_low"] == pytest.approx(
        2 * half
    )
    assert twice["p_holm"] >= twice["p_value"] and twice["cost_ratio"] == pytest.approx(2.0)
    assert "2 seed pairs: interval unreliable" in twice["note"]
    assert ("vit", "vanilla") not in gains.index  # the vit cell has no result to pair
    # Seed pairs alone: the table says what its intervals hold fixed (the test images, the training subset).
    assert "given the test images" in gains.attrs["conditions"] and "fraction_seed" in gains.attrs["conditions"]
    with pytest.raises(ValueError, match="not a level"):
        compute_matched_gains(runs, times, baseline="nope")


def test_frontier_plot_shows_n_draws_no_interval_for_one_seed_and_joins_the_frontier(frames, tmp_path):
    runs, times = frames
    table = compute_matched(runs, times)
    fig = plot_compute_frontier(table, path=tmp_path / "f.png")
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ax = fig.axes[0]
    assert "GPU-s" in ax.get_xlabel() and ax.get_ylabel().startswith("val_acc")
    assert "one run" in ax.get_xlabel() and "mean over seeds" in ax.get_xlabel()
    sam_x = [line.get_xdata()[0] for line in ax.get_lines() if line.get_marker() not in ("None", None, "")]
    assert max(sam_x) == pytest.approx(40.0)  # per-run costs: no point is charged its whole search (80)
    assert {t.get_text() for t in ax.texts} >= {"n=2"}
    assert any(c.get_segments() for c in ax.collections)  # n = 2: bars
    # The frontier of resnet: vanilla (40 GPU-s, 0.81) -> vanilla_2x (40, 0.845)... sorted by cost, only improvements.
    frontier = [line for line in ax.get_lines() if line.get_linewidth() == 0.9 and len(line.get_xdata()) > 1]
    assert frontier and all(np.all(np.diff(line.get_ydata()) > 0) for line in frontier)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"arch: resnet", "method: sam", "method: vanilla_2x"} <= set(labels)
    one = plot_compute_frontier(compute_matched(runs[runs["factor.train.seed"] == "0"], times))
    assert not any(c.get_segments() for c in one.axes[0].collections)  # n = 1: no bars at all
    assert "one seed" in one.axes[0].get_xlabel() and "mean over seeds" not in one.axes[0].get_xlabel()
    with pytest.raises(ValueError, match="compute_matched"):
        plot_compute_frontier(pd.DataFrame({"x": [1]}))


def test_report_writes_the_compute_section(store, tmp_path):
    uri, _ = store
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        paths = write_report("compute", tracking_uri=uri, out_dir=tmp_path, n_boot=200)
    assert {"compute_matched.md", "compute_matched.csv", "compute_frontier.png"} <= {p.name for p in paths}
    md = (tmp_path / "compute_matched.md").read_text()
    assert (
        "### arch: resnet" in md and "GPU-s mean ± SE" in md and "| sam | 2 | 80.0 ± 0.0 | 87.00 ± 1.00 | 2 | 4 |" in md
    )
    assert "| vanilla | – | – | – | 0 | 1 | no seeds |" in md  # vit: its one trial never timed an epoch
    assert "## Accuracy against compute" in (tmp_path / "report.md").read_text()
