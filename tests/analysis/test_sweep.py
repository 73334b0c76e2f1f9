"""The cross-cell view of a study (analysis.sweep): knob importance over every trial, checked against designs whose
answer is known, and the parallel-coordinates plot and trial table of the report, each trial linking to its run."""

import re
import warnings

import numpy as np
import pandas as pd
import pytest

from analysis import write_report
from analysis.report import LOCAL_UI, report_html, run_link
from analysis.sweep import knob_importance, plot_parallel_coordinates, study_knobs
from trainables.tracking import TrialRecorder

RHO = "optimizer.hparams.rho"


def _study(arch_effect: float, rho_effect: float, *, trials: int, seed: int = 0, noise: float = 0.01) -> pd.DataFrame:
    """A quickstart-shaped frame: arch x method cells, `trials` SAM trials a cell with a sampled rho, one AdamW trial
    (the baseline); val_acc = arch's level + rho_effect * log10(rho) + noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for a, arch in enumerate(("mixer", "resnet", "vit")):
        for method in ("adamw", "sam"):
            for t in range(trials if method == "sam" else 1):
                rho = float(10 ** rng.uniform(-2.3, -0.3)) if method == "sam" else np.nan
                value = 0.8 + arch_effect * a + (rho_effect * np.log10(rho) if method == "sam" else 0.0)
                rows.append(
                    {
                        "run_id": f"{arch}-{method}-{t}",
                        "run_name": f"{arch}/{method} #{t}",
                        "cell": f"arch={arch},method={method}",
                        "status": "finished",
                        "start_time": pd.Timestamp("2026-11-26") + pd.Timedelta(seconds=len(rows)),
                        "factor.arch": arch,
                        "factor.method": method,
                        "optimizer.method": "none" if method == "adamw" else "sam",
                        "train.seed": 0,
                        "schedule.epochs": 10,
                        RHO: rho,
                        "val_acc": value + rng.normal(0, noise),
                    }
                )
    return pd.DataFrame(rows)


def test_the_factors_and_searched_knobs_are_found_seeds_and_constants_aside():
    runs = _study(0.05, 0.0, trials=4).assign(**{"train.seed": lambda d: np.arange(len(d))})
    assert study_knobs(runs) == (["factor.arch", "factor.method"], [RHO])


def test_importance_finds_the_factor_that_matters_and_not_the_knob_that_does_not():
    imp = knob_importance(_study(0.05, 0.0, trials=8), metric="val_acc", n_perm=300)
    assert imp.loc["factor.arch", "share"] > 0.9 and imp.loc["factor.arch", "above_chance"]
    assert imp.loc["factor.arch", "p"] < 0.01
    assert imp.index[0] == "factor.arch"  # ranked by share
    assert imp.loc[RHO, "kind"] == "searched" and imp.loc[RHO, "n"] == 24  # the SAM cells' trials only


def test_a_searched_knob_is_judged_within_its_cells_not_against_the_factors():
    # rho moves val_acc by 0.1 a decade inside every SAM cell; arch moves it by 0.05 a level.
    imp = knob_importance(_study(0.05, 0.1, trials=12), metric="val_acc", n_perm=300)
    assert imp.loc[RHO, "within_share"] > 0.8 and imp.loc[RHO, "above_chance"]
    assert imp.loc[RHO, "share"] < imp.loc[RHO, "within_share"]  # of all the variance, arch's part is not its


def test_a_knob_without_effect_is_above_chance_about_one_time_in_twenty():
    # The chance column is what a knob with no effect shows: over null designs the share exceeds it ~5% of the time.
    hits = [
        bool(
            knob_importance(_study(0.05, 0.0, trials=6, seed=s), metric="val_acc", n_perm=199).loc[RHO, "above_chance"]
        )
        for s in range(60)
    ]
    assert sum(hits) <= 9  # Binomial(60, 0.05): P(X > 9) < 0.002


def test_few_trials_get_the_caveat_printed():
    imp = knob_importance(_study(0.05, 0.0, trials=4), metric="val_acc", n_perm=99)
    assert "Few trials (15 finished" in imp.attrs["caveat"] and "chance" in imp.attrs["caveat"]
    assert imp.loc["factor.method", "min_group"] == 3 and imp.loc[RHO, "min_group"] == 2


def test_parallel_coordinates_draw_every_trial_linking_to_its_run(tmp_path):
    runs = _study(0.05, 0.02, trials=4)
    runs.loc[3, "status"] = "failed"
    links = {r: run_link(LOCAL_UI, "1", r) for r in runs["run_id"]}
    path = tmp_path / "parallel.svg"
    fig = plot_parallel_coordinates(runs, metric="val_acc", links=links, path=path)
    svg = path.read_text()
    finished = runs[runs["status"] == "finished"]["run_id"]
    for r in finished:
        assert f'href="{links[r]}"' in svg, r
    assert f'href="{links[runs.loc[3, "run_id"]]}"' not in svg  # a failed trial has no objective to draw to
    text = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "not searched" in text and "rho (log)" in text and "val_acc (max)" in text
    assert "14 finished, 1 without val_acc left out" in fig._suptitle.get_text()
    # rho lowers val_acc here, so the best trial is vit's AdamW one: a baseline, and the legend says so.
    assert {h.get_label() for h in fig.axes[0].get_legend().legend_handles} == {
        "best trial (a baseline)",
        "baseline (optimizer alone)",
    }


def _record(target, runs: pd.DataFrame) -> dict[str, str]:
    ids = {}
    for _, row in runs.iterrows():
        params = {"optimizer.method": row["optimizer.method"], "train.seed": 0}
        if np.isfinite(row[RHO]):
            params[RHO] = row[RHO]
        rec = TrialRecorder(target, trial_key=row["run_id"], run_name=row["run_name"], params=params)
        rec.set_tags(
            {"factor.arch": row["factor.arch"], "factor.method": row["factor.method"], "sharpscale.cell": row["cell"]}
        )
        rec.log_epoch({"val_acc": row["val_acc"], "val_samples": 360}, 0)
        rec.finish("finished")
        ids[row["run_name"]] = rec.run_id
    return ids


def test_the_report_shows_the_whole_study_each_trial_linking_to_its_mlflow_run(study_store, tmp_path):
    uri, target, study_run = study_store(tmp_path / "store", "sweep")
    ids = _record(target, _study(0.05, 0.02, trials=4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        paths = write_report("sweep", tracking_uri=uri, out_dir=tmp_path / "report", n_boot=100)
    names = {p.name for p in paths}
    assert {"parallel_coordinates.png", "parallel_coordinates.svg", "knob_importance.md", "trials.md"} <= names
    from mlflow.tracking import MlflowClient

    eid = MlflowClient(uri).get_run(study_run).info.experiment_id
    page = (tmp_path / "report" / "report.html").read_text()
    # The plot inline (its lines are links), every trial's row linking to its run, best first.
    svg = page[page.index("<svg") : page.index("</svg>")]
    for name, rid in ids.items():
        link = f"{LOCAL_UI}/#/experiments/{eid}/runs/{rid}?workflowType=machine_learning"  # the model-training side
        assert f'href="{link}"' in svg, name
        assert f'<a href="{link}">{name}</a>' in page, name
    trials = (tmp_path / "report" / "trials.md").read_text()
    rows = [ln for ln in trials.splitlines() if re.match(r"\| \d+ ", ln)]
    assert len(rows) == len(ids) and "(baseline)" in trials
    values = [float(r.split("|")[4]) for r in rows]
    assert values == sorted(values, reverse=True)
    importance = (tmp_path / "report" / "knob_importance.md").read_text()
    assert "| factor.arch |" in importance and "**Caveat.** Few trials (15 finished" in importance
    # Shown by MLflow's artifact view (a blob: URL of the UI's origin), the links are pointed at that origin.
    assert "location.href.match(/^blob:(https?:\\/\\/[^/]+)/)" in page and f'"{LOCAL_UI}"' in page


def test_report_html_inlines_a_figures_svg_twin_and_points_links_at_a_tracking_server(tmp_path):
    (tmp_path / "a.png").write_bytes(b"png")
    (tmp_path / "a.svg").write_text(
        '<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"><a href="x"/></svg>'
    )
    (tmp_path / "b.png").write_bytes(b"png")
    page = report_html("# R\n\n![a](a.png)\n\n![b](b.png)\n", tmp_path, ui_url="http://mlflow.lab:5000/")
    assert '<div class="svg" title="a"><svg xmlns=' in page and "<?xml" not in page
    assert page.count("data:image/png;base64,") == 1
    assert "v.startsWith(\"http://mlflow.lab:5000\" + '/#/')" in page
    with pytest.raises(ValueError):
        plot_parallel_coordinates(_study(0.0, 0.0, trials=2), metric="val_acc", path=tmp_path / "x.pdf")


def test_parallel_coordinates_read_at_a_glance_despite_one_outlier():
    runs = _study(0.05, 0.02, trials=4)
    runs.loc[4, "val_acc"] = 0.1  # one diverged trial
    fig = plot_parallel_coordinates(runs, metric="val_acc")
    ax = fig.axes[0]
    axes_x = {t.get_text(): t.get_position()[0] for t in ax.texts if t.get_position()[1] > 1.0}
    objective = axes_x["val_acc (max)"]
    # The objective's axis: rounded ticks between its two ends, not the ends alone.
    ticks = [t for t in ax.texts if np.isclose(t.get_position()[0], objective - 0.03)]
    assert len(ticks) >= 4
    # A factor's trials fan out over their level's slot: as many positions on the arch axis as trials, not three.
    arch = axes_x["arch"]
    at_arch = {round(float(line.get_ydata()[int(arch)]), 6) for line in ax.lines if len(line.get_xdata()) > 2}
    assert len(at_arch) == len(runs)
    # The outlier does not spend the colour scale, and the colour bar says where it is clipped.
    cbar = fig.axes[1]._colorbar
    assert cbar.norm.vmin > 0.5 and cbar.norm.vmax <= runs["val_acc"].max()
    assert "percentile" in cbar.ax.get_ylabel() and cbar.extend in ("min", "both")
