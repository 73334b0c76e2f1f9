"""A study's report: every table (Markdown and CSV) and plot (PNG) that its records support, logged to its study run under report/."""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import math
import re
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from analysis.compute import compute_matched, compute_matched_gains
from analysis.geometry.names import METRIC_PREFIX
from analysis.images import IMAGE_OVER, interval_conditions, subset_wording
from analysis.plots import (
    plot_compute_frontier,
    plot_curves,
    plot_error_vs_n,
    plot_gain,
    plot_rho_sensitivity,
    plot_sharpness,
)
from analysis.runs import (
    REPORT_MARKER,
    RHO,
    UI_WORKFLOW,
    _open_experiment,
    best_key,
    best_trials,
    confirm_summary,
    load_curves,
    load_runs,
    measured_on,
    split_stages,
    subsets_per_seed,
    summarize,
    unconfirmed_cells,
)
from analysis.scaling import (
    CONDITIONS,
    chance_error,
    data_multiplier,
    default_form,
    fit_scaling_table,
    fits_frame,
    law_extrapolation,
    law_parameters,
    paired_law_difference,
    table_points,
    table_scored,
)
from analysis.sweep import PLAIN_METHOD, knob_importance, plot_parallel_coordinates, study_knobs
from analysis.tables import (
    FAMILY_ALPHA,
    _markdown,
    _yes,
    gain_family,
    geometry_correlation,
    headline,
    method_column,
    method_pairs,
    rho_sensitivity,
    rho_transfer,
    scaling_table,
)
from trainables.metrics import EPOCH_TIME
from trainables.naming import KIND_TAG, kind_filter

__all__ = ["ARTIFACT_DIR", "HTML_REPORT", "report_html", "write_report"]

ARTIFACT_DIR = "report"
# The one self-contained page of the report (tables as HTML, plots embedded): MLflow's artifact view renders it.
HTML_REPORT = "report.html"
_FRACTION = "data.fraction"
_SEED = "train.seed"
# Where `sharpscale ui` serves a local store by default (studies.server.DEFAULT_PORT): the report's links to each
# trial's MLflow run start here unless the store is a tracking server. Shown by MLflow's own artifact view, the
# page rewrites them to the address it is served from (_LINK_SCRIPT).
LOCAL_UI = "http://127.0.0.1:5000"
# MLflow's artifact view shows an HTML artifact in a sandboxed iframe from a blob: URL of the UI's own origin; links
# written for LOCAL_UI are pointed at that origin, so a click opens the trial's run whatever the UI's address.
_LINK_SCRIPT = """<script>(() => {
  const m = location.href.match(/^blob:(https?:\\/\\/[^/]+)/); if (!m) return;
  for (const a of document.querySelectorAll('a')) for (const k of ['href', 'xlink:href']) {
    const v = a.getAttribute(k);
    if (v && v.startsWith(BASE + '/#/')) a.setAttribute(k, m[1] + v.slice(BASE.length));
  }
})();</script>"""


def _objective(study: str | Path) -> tuple[str, str] | None:
    """The study file's objective (metric, mode) when `study` is its YAML path."""
    p = Path(study)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        import yaml

        raw = yaml.safe_load(p.read_text()) or {}
        obj = raw.get("objective") or {}
        metric = obj.get("metric", "val_acc")
        if obj.get("epoch") == "best":  # the study ranks trials by their best epoch (studies.spec.Objective)
            from trainables.tracking import BEST_EPOCH_METRICS

            metric = BEST_EPOCH_METRICS.get(metric, metric)
        return metric, obj.get("mode", "max")
    return None


def statistic_label(column: str) -> str:
    """A metric column of load_runs in words: its final epoch's value, or its best epoch's ('best_val_acc')."""
    from trainables.tracking import BEST_EPOCH_METRICS

    best = {v: k for k, v in BEST_EPOCH_METRICS.items()}
    return f"{best[column]} (best epoch)" if column in best else f"{column} (final epoch)"


def _study_run_id(client, experiment) -> str:
    found = client.search_runs(
        [experiment.experiment_id],
        filter_string=kind_filter("study"),
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not found:
        raise LookupError(
            f"experiment {experiment.name!r} has no study run (tag {KIND_TAG}=study) to log the report to. "
            "Fix: run the study with `sharpscale run`, which creates it, or pass log_to_mlflow=False."
        )
    return found[0].info.run_id  # a resumed study with an edited file has several: the latest one


def _distinct(runs: pd.DataFrame, col: str, *, positive: bool = False) -> list:
    if col not in runs.columns:
        return []
    ok = runs[runs["status"] == "finished"][col]
    values = pd.to_numeric(ok, errors="coerce").dropna()
    if positive:
        values = values[values > 0]
    return sorted(values.unique().tolist())


class _Writer:
    """Writes the report's files, remembering each path in order. per_seed: the study's confirm seeds each drew
    their own training subset, which every conditions statement it writes then says (analysis.images)."""

    def __init__(self, out_dir: Path, per_seed: bool = False):
        self.out_dir = out_dir
        self.per_seed = per_seed
        self.paths: list[Path] = []
        self.sections: list[str] = []

    def text(self, name: str, text: str) -> Path:
        path = self.out_dir / name
        path.write_text(subset_wording(text, self.per_seed))
        self.paths.append(path)
        return path

    def csv(self, name: str, frame: pd.DataFrame, *, index: bool = True) -> Path:
        path = self.out_dir / name
        frame.to_csv(path, index=index)
        self.paths.append(path)
        return path

    def figure(self, name: str, fig) -> Path:
        path = self.out_dir / name
        fig.savefig(path, dpi=120)  # the format from the name's suffix (.png, .svg)
        self.paths.append(path)
        return path

    def section(self, title: str, body: str, image: str | None = None) -> None:
        body = subset_wording(body.strip(), self.per_seed)
        self.sections.append(f"## {title}\n\n{body}\n" + (f"\n![{title}]({image})\n" if image else ""))

    def table(self, stem: str, title: str, markdown: str, frame: pd.DataFrame, *, index: bool = True) -> None:
        """A table three ways: `markdown` (its prose and rendering) as `<stem>.md` and as the report's section
        `title`, and `frame` (the data behind it, which may carry more columns) as `<stem>.csv`."""
        self.text(f"{stem}.md", markdown)
        self.csv(f"{stem}.csv", frame, index=index)
        self.section(title, markdown)


def _fmt(frame: pd.DataFrame, digits: int = 4) -> pd.DataFrame:
    out = frame.copy()
    for col in out.columns:
        if pd.api.types.is_float_dtype(out[col]):
            out[col] = out[col].map(lambda v: "–" if math.isnan(v) else f"{v:.{digits}g}")  # inf prints as inf
        elif out[col].hasnans:  # e.g. `significant` where no test could be run: blank, not False or <NA>
            out[col] = out[col].astype(object).where(out[col].notna(), "–")
    return out


def _inline(text: str) -> str:
    """One line of the report's markdown as HTML: escaped, then **bold**, `code` and [text](url) links."""
    out = html.escape(text, quote=False)
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", lambda m: f'<a href="{html.escape(m[2])}">{m[1]}</a>', out)


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def report_html(markdown: str, images: Path, *, ui_url: str = LOCAL_UI) -> str:
    """The report's markdown (headings, paragraphs, lists, pipe tables, images) as one self-contained HTML page:
    each `![title](file.png)` embedded from `images` as a base64 data URI (its .svg twin inline where one was
    written, so the links drawn in it work), so the
    file opens anywhere, alone. Only the markdown this module writes is understood; anything else is kept as an
    escaped paragraph. ui_url: the MLflow UI its run links start with, pointed at the UI's own address when that UI
    shows the page (_LINK_SCRIPT)."""
    body: list[str] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif m := re.fullmatch(r"(#{1,6}) (.*)", line):
            level = len(m[1])
            body.append(f"<h{level}>{_inline(m[2])}</h{level}>")
            i += 1
        elif m := re.fullmatch(r"!\[([^\]]*)\]\(([^)]+)\)", line.strip()):
            path = images / m[2]
            if path.with_suffix(".svg").is_file():  # its SVG twin inline, so the links drawn in it (runs) work
                svg = path.with_suffix(".svg").read_text()
                body.append(f'<div class="svg" title="{html.escape(m[1])}">{svg[svg.index("<svg") :]}</div>')
            elif path.is_file():
                data = base64.b64encode(path.read_bytes()).decode("ascii")
                body.append(f'<img alt="{html.escape(m[1])}" src="data:image/png;base64,{data}">')
            else:
                body.append(f"<p>{_inline(line)} (image not written)</p>")
            i += 1
        elif line.lstrip().startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|?[\s:|-]+\|?", lines[i + 1]):
            head = "".join(f"<th>{_inline(c)}</th>" for c in _cells(line))
            rows = []
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                rows.append("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in _cells(lines[i])) + "</tr>")
                i += 1
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            body.append("<ul>" + "".join(items) + "</ul>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not re.match(r"#|!\[|\||- ", lines[i].lstrip()):
                para.append(_inline(lines[i]))
                i += 1
            if not para:  # a line no rule above took (a lone table row): kept as text
                para, i = [_inline(line)], i + 1
            body.append("<p>" + " ".join(para) + "</p>")
    title = next((re.sub(r"^# ", "", ln) for ln in lines if ln.startswith("# ")), "Report")
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1100px;margin:1em auto;padding:0 1em;line-height:1.4}"
        "table{border-collapse:collapse;margin:.5em 0;font-size:.9em}th,td{border:1px solid #ccc;padding:2px 6px;"
        "text-align:right}th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}img{max-width:100%}"
        ".svg svg{max-width:100%;height:auto}"
    )
    script = _LINK_SCRIPT.replace("BASE", json.dumps(ui_url.rstrip("/")))
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{style}</style></head><body>\n" + "\n".join(body) + f"\n{script}\n</body></html>\n"
    )


def write_report(
    study: str | Path,
    *,
    tracking_uri: str | None = None,
    out_dir: str | Path,
    log_to_mlflow: bool = True,
    metric: str | None = None,
    mode: Literal["max", "min"] | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    smoke: bool = False,
) -> list[Path]:
    """Write every table and plot the study's records support into out_dir; log them to its study run under report/.

    study: its name (MLflow experiment) or YAML file, as for load_runs; smoke: its --smoke runs, likewise. metric / mode: default to the study
    file's objective, else val_acc / max. What is written, decided from the columns present, is SECTIONS's (listed
    below, one line per section: report.md's order, what it needs, its files; {level}: once per sharpness-aware
    level of the family), and always report.md, an index of everything with the notes, and report.html, the same as
    one self-contained page (tables as HTML, plots embedded: `report_html`).
    Every table says which data its numbers come from (`measured_on`). A study with a confirm stage
    (studies.confirm) compares its cells on the confirm runs only: fresh seeds at each cell's chosen knobs, scored on
    the validation set's held-out half; its search trials (the selection half) feed the summary of the search, the
    curves and the rho sensitivity, which are about the choice. Without confirm runs, the search trials are all
    there is, and the tables say that they were chosen and scored on the same data.
    Warnings raised on the way (too few seeds, unidentified floors) are written into report.md's notes
    and re-issued. Returns the written paths. With log_to_mlflow, the files go to the latest run tagged
    sharpscale.kind=study in the study's experiment, under report/ (LookupError when there is none), and its
    description gets a link to report/report.html; a store that refuses the files (read-only) leaves them local,
    with a warning.
    """
    report = _open_report(
        study,
        tracking_uri=tracking_uri,
        out_dir=out_dir,
        log_to_mlflow=log_to_mlflow,
        metric=metric,
        mode=mode,
        n_boot=n_boot,
        seed=seed,
        smoke=smoke,
    )
    # What the sections warn of (too few seeds, an unidentified floor) is caught, to head report.md as its notes.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _write_sections(report)
    noted = _noted(caught)
    _write_pages(report, noted)
    _reissue(noted)
    if report.study_run is not None:
        _log_to_study_run(report)
    return report.w.paths


@dataclass(eq=False)
class _Report:
    """One report: what write_report was asked, the study's records, and the choices every section shares."""

    study: str | Path
    tracking_uri: str | None
    smoke: bool
    metric: str
    mode: str
    n_boot: int
    boot_seed: int  # write_report's `seed`: of the bootstraps and permutations, no trial's
    client: Any
    experiment: Any
    study_run: str | None  # the run the files are logged to; None: they stay local
    runs: pd.DataFrame
    search: pd.DataFrame
    confirm: pd.DataFrame
    compared: pd.DataFrame  # what the cells are compared on: the confirm runs where the study has them
    source: str  # measured_on(compared)
    search_source: str  # measured_on(search)
    w: _Writer
    # A maximised accuracy is shown in percent, with 2 decimals.
    scale: float
    digits: int
    unit: str
    arch: str  # the columns naming each trial's arch, method and seed
    method: str
    seed_col: str | None
    shown: tuple[str, ...]  # the knob columns the per-cell tables show: rho, where the study has it
    fractions: list  # the compared runs' distinct data fractions
    ui_url: str  # the MLflow UI the trial links start with
    # The report's findings: every (treatment, baseline) gain table, adjusted over the whole family (_gain_family);
    # its first entry is the study's primary contrast. Nothing outside it is printed as significant.
    family: dict = dataclasses.field(default_factory=dict)
    best_ids: list = dataclasses.field(default_factory=list)  # each cell's best trial (_curves_section)

    @property
    def scales_data(self) -> bool:
        """A data-scaling study: its compared runs have 2+ data fractions."""
        return len(self.fractions) >= 2


def _open_report(study, *, tracking_uri, out_dir, log_to_mlflow, metric, mode, n_boot, seed, smoke) -> _Report:
    """The report's folder, objective, study run and records, every bad input refused before a file is written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metric, mode = _report_objective(study, metric, mode)
    client, experiment, _ = _open_experiment(study, tracking_uri, smoke=smoke)
    study_run = _study_run_id(client, experiment) if log_to_mlflow else None
    runs = _load_trials(study, experiment, metric, tracking_uri=tracking_uri, smoke=smoke)
    search, confirm = split_stages(runs)
    compared = confirm if not confirm.empty else search
    percent = "acc" in metric and mode == "max"
    scale, digits = (100.0, 2) if percent else (1.0, 4)
    return _Report(
        study=study,
        tracking_uri=tracking_uri,
        smoke=smoke,
        metric=metric,
        mode=mode,
        n_boot=n_boot,
        boot_seed=seed,
        client=client,
        experiment=experiment,
        study_run=study_run,
        runs=runs,
        search=search,
        confirm=confirm,
        compared=compared,
        source=measured_on(compared),
        search_source=measured_on(search),
        w=_Writer(out, per_seed=subsets_per_seed(runs)),
        scale=scale,
        digits=digits,
        unit=" (%)" if percent else "",
        arch="factor.arch" if "factor.arch" in runs.columns else "model.name",
        method=method_column(runs),
        seed_col=_SEED if _SEED in runs.columns else None,
        shown=tuple(c for c in (RHO,) if c in runs.columns),
        fractions=_distinct(compared, _FRACTION),
        ui_url=str(tracking_uri) if str(tracking_uri or "").startswith(("http://", "https://")) else LOCAL_UI,
    )


def _report_objective(study, metric: str | None, mode: str | None) -> tuple[str, str]:
    """(metric, mode) of the report: those given, else the study file's objective, else val_acc / max."""
    objective = _objective(study) or ("val_acc", "max")
    metric = metric or objective[0]
    mode = mode or objective[1]
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    return metric, mode


def _load_trials(study, experiment, metric: str, *, tracking_uri, smoke) -> pd.DataFrame:
    """The study's trials (load_runs), refused when there are none or none logged `metric`."""
    runs = load_runs(study, tracking_uri=tracking_uri, smoke=smoke)
    if runs.empty:
        raise ValueError(f"study {experiment.name!r} has no trial runs yet; run it before writing its report")
    if metric not in runs.columns:
        metrics = sorted(
            c for c in runs.columns if c in ("val_acc", "val_loss", "train_loss", "best_val_acc", "val_top5")
        )
        raise ValueError(f"metric {metric!r} was never logged by the study's trials; logged metrics include {metrics}")
    return runs


def _write_sections(r: _Report) -> None:
    """Every section the records support, in report.md's order: the entries of SECTIONS whose `applies` holds."""
    r.family = _gain_family(r)
    for section in SECTIONS:
        if section.applies(r):
            section.write(r)


def _noted(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    """The caught warnings that report.md notes and write_report re-issues: all but deprecations, which are about
    the libraries' next versions, not the study."""
    return [c for c in caught if not issubclass(c.category, (DeprecationWarning, FutureWarning))]


def _write_pages(r: _Report, noted: list[warnings.WarningMessage]) -> None:
    """report.md (what was compared on which data, the notes once each, every section) and report.html."""
    notes = list(dict.fromkeys(f"{type(c.message).__name__}: {c.message}" for c in noted))
    runs = r.runs
    head = (
        f"# Report of study {r.experiment.name!r}\n\n{len(runs)} trials "
        f"({int((runs['status'] == 'finished').sum())} finished; {len(r.search)} search, {len(r.confirm)} confirm); "
        f"objective {statistic_label(r.metric)} ({r.mode}).\n\nCells are compared on: {r.source}.\n\n"
    )
    if notes:
        head += "## Notes\n\n" + "\n".join(f"- {n}" for n in notes) + "\n\n"
    markdown = head + "\n".join(r.w.sections)
    r.w.text("report.md", markdown)
    r.w.text(HTML_REPORT, report_html(markdown, r.w.out_dir, ui_url=r.ui_url))


def _reissue(noted: list[warnings.WarningMessage]) -> None:
    """Each noted warning again, now that report.md holds it, so that write_report's caller sees it too."""
    for c in noted:
        warnings.warn(c.message, c.category, stacklevel=3)  # 3: past this step and write_report, to its caller


def _log_to_study_run(r: _Report) -> None:
    """Every written file to the study run under report/, then a link to report.html in the run's description."""
    try:
        for path in r.w.paths:
            r.client.log_artifact(r.study_run, str(path), ARTIFACT_DIR)
    except OSError as e:  # a read-only store (a copy opened from a CD, a shared folder): the files stay local
        warnings.warn(
            f"the report was written to {r.w.out_dir} but not logged to the study run: its artifact store refused it "
            f"({e}). Fix: run `sharpscale report` on a writable copy of the store, or pass --no-mlflow.",
            stacklevel=3,  # past this step and write_report, to its caller
        )
    else:
        _link_report(r.client, r.experiment.experiment_id, r.study_run)


def _summary_section(r: _Report) -> None:
    """Each cell's best search trial (summarize): every report has it."""
    search = r.search
    summary_runs = (
        search if any(c.startswith("factor.") for c in r.runs.columns) else search.assign(**{"factor.study": "all"})
    )
    summary = summarize(summary_runs, metric=r.metric, mode=r.mode, show=r.shown, label=statistic_label(r.metric))
    answer = headline(r.runs, metric=r.metric, mode=r.mode)
    summary_md = (
        "".join(f"{line}\n\n" for line in answer)
        + f"Best finished search trial per cell by {statistic_label(r.metric)}, {r.mode}. Numbers from: "
        f"{r.search_source}.\n\n" + _markdown(_fmt(summary))
    )
    r.w.table("summary", "Per-cell summary of the search", summary_md, summary)


def _confirm_section(r: _Report) -> None:
    """Each cell's confirm runs (confirm_summary), after a warning naming the cells that have none."""
    if missing := unconfirmed_cells(r.search, r.confirm):
        warnings.warn(
            f"{len(missing)} cell(s) have no finished confirm run, and are left out of every comparison: "
            f"{missing[:6]}{' ...' if len(missing) > 6 else ''}. Their confirm stage was interrupted or cut by "
            f"the time limit (`sharpscale resume` finishes it), or every search trial failed.",
            stacklevel=2,
        )
    chosen = confirm_summary(r.confirm, metric=r.metric, show=r.shown)
    confirm_md = (
        f"Each cell's confirm runs: {statistic_label(r.metric)} mean and sd over its fresh seeds at the knobs its "
        "search chose, the standard error and 95% interval of the cell's population value (what each row's "
        f"interval resamples: `interval over`). {_conditions(chosen)} Numbers from: {r.source}.\n\n"
        + _markdown(_fmt(chosen))
    )
    r.w.table("confirm", "Per-cell confirm runs (what the comparisons below use)", confirm_md, chosen)


def _curves_section(r: _Report) -> None:
    """Per-epoch curves of each cell's best trial; those trials' run ids kept for the sharpness plot (r.best_ids)."""
    best_ids = r.best_ids = _best_run_ids(r.search if not r.search.empty else r.compared, r.metric, r.mode)
    if best_ids:
        curves = load_curves(
            r.study,
            tracking_uri=r.tracking_uri,
            smoke=r.smoke,
            metrics=("train_loss", "val_loss", r.metric),
            run_ids=best_ids,
        )
        if not curves.empty:
            r.w.figure("curves.png", plot_curves(curves, labels=_knob_labels(r.runs, best_ids)))
            r.w.section(
                "Learning curves",
                "Per-epoch curves of each cell's best trial, its searched knob at the end of each curve.",
                "curves.png",
            )


def _measured_geometry(runs: pd.DataFrame) -> bool:
    """Whether the trials logged geometry measures, and both accuracies their gap needs."""
    return any(c.startswith(METRIC_PREFIX) for c in runs.columns) and {"train_acc", "val_acc"} <= set(runs.columns)


def _geometry_section(r: _Report) -> None:
    """Kendall's tau of each geometry measure with the generalisation gap (geometry_correlation)."""
    tau = geometry_correlation(r.runs)
    tau_md = (
        "Kendall's tau between each geometry measure (its last logged value: after the final epoch for a "
        "geometry section) and the generalisation gap (train_acc - val_acc) over finished trials, n of "
        "them with both; tau_<h>: the mean tau within groups of trials that differ only in "
        "hyperparameter h (Jiang et al. 2020), groups_<h> how many such groups.\n\n" + _markdown(_fmt(tau))
    )
    r.w.table("geometry_tau", "Geometry against the generalisation gap", tau_md, tau)


def run_link(ui_url: str, experiment_id: str, run_id: str) -> str:
    """The address of a trial's run in the MLflow UI at `ui_url`."""
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{UI_WORKFLOW}"


def _study_section(r: _Report) -> None:
    """The whole study at once (analysis.sweep): every trial on one parallel-coordinates plot, each knob's share of
    the objective's variance over all trials, and every trial ranked, each linking to its MLflow run."""
    w, search, metric, mode, experiment_id = r.w, r.search, r.metric, r.mode, r.experiment.experiment_id
    ok = search[search["status"] == "finished"] if "status" in search.columns else search
    if len(ok) < 2 or metric not in ok.columns:
        return
    factors, knobs = study_knobs(ok)
    links = {run_id: run_link(r.ui_url, experiment_id, run_id) for run_id in search["run_id"].astype(str)}
    fig = plot_parallel_coordinates(search, metric=metric, mode=mode, factors=factors, knobs=knobs, links=links)
    w.figure("parallel_coordinates.png", fig)
    w.figure("parallel_coordinates.svg", fig)
    source = r.search_source
    w.section(
        "The whole study: every trial",
        "Each finished search trial is one line across the study's factors and searched knobs to the objective, "
        f"coloured by {metric} (brighter is better); baseline trials (optimizer.method '{PLAIN_METHOD}') are dashed "
        "black, the best trial red; a knob a cell does not search sits at 'not searched'. In report.html each line "
        f"links to its trial's MLflow run. Numbers from: {source}.",
        "parallel_coordinates.png",
    )
    importance = knob_importance(search, metric=metric, factors=factors, knobs=knobs, seed=r.boot_seed)
    if not importance.empty:
        shown = importance.assign(above_chance=importance["above_chance"].map({True: "yes", False: "no"}))
        md = (
            _EXPLORATORY
            + f"Each knob's share of the variance of {metric} over the study's {int(len(ok))} finished search trials "
            "(`analysis.sweep.knob_importance`): a factor's, the variance between its levels' means (every trial); a "
            "searched knob's, what its quantile bins explain within the cells that search it (their cell means "
            "removed; `within_share`: of the within-cell variance alone). Shares are each knob alone and need not add "
            "to 1. `chance`: the 95th percentile of the share when the objective is permuted (a knob with no effect "
            "in this design reaches it 1 time in 20), `p` the permutation p-value. Numbers from: "
            f"{source}.\n\n" + _markdown(_fmt(shown, 3))
        )
        if caveat := importance.attrs.get("caveat"):
            md += f"\n**Caveat.** {caveat}\n"
        w.text("knob_importance.md", md)
        w.csv("knob_importance.csv", importance)
        w.section("Which knobs matter, over the whole study", md)
    _trials_table(r, knobs)


def _trials_table(r: _Report, knobs: list[str]) -> None:
    """Every search trial, best first by BEST_RULE across the whole study, its name linking to its MLflow run."""
    search, metric, mode = r.search, r.metric, r.mode
    values = pd.to_numeric(search[metric], errors="coerce").astype("float64")
    finished = search["status"] == "finished" if "status" in search.columns else pd.Series(True, index=search.index)
    started = search["start_time"] if "start_time" in search.columns else pd.Series(0, index=search.index)
    ranked = sorted(
        search.index,
        key=lambda i: (
            not (finished[i] and math.isfinite(values[i])),
            best_key(values[i] if math.isfinite(values[i]) else 0.0, started[i], str(search.at[i, "run_id"]), mode),
        ),
    )
    baseline = (
        search["optimizer.method"].astype(str) == PLAIN_METHOD
        if "optimizer.method" in search.columns
        else pd.Series(False, index=search.index)
    )
    rows = []
    for rank, i in enumerate(ranked):
        name = str(search.at[i, "run_name"]) if "run_name" in search.columns else str(search.at[i, "run_id"])
        row = {
            "rank": rank if finished[i] and math.isfinite(values[i]) else "–",
            "trial": f"[{name}]({run_link(r.ui_url, r.experiment.experiment_id, str(search.at[i, 'run_id']))})",
            "cell": str(search.at[i, "cell"]) + (" (baseline)" if baseline[i] else ""),
            metric: f"{values[i]:.4f}" if math.isfinite(values[i]) else "–",
            "status": str(search.at[i, "status"]) if "status" in search.columns else "",
        }
        for k in knobs:
            v = pd.to_numeric(pd.Series([search.at[i, k]]), errors="coerce").iloc[0]
            row[k.rsplit(".", 1)[-1]] = f"{v:.4g}" if pd.notna(v) else "–"
        row["run id"] = str(search.at[i, "run_id"])
        rows.append(row)
    table = pd.DataFrame(rows).set_index("rank")
    md = (
        f"Every search trial, best first by {metric} ({mode}) across the whole study (among equal values the one "
        "that started first), each linking to its MLflow run.\n\n" + _markdown(table)
    )
    r.w.table(
        "trials", "Every trial, best first", md, table.assign(trial=[str(search.at[i, "run_name"]) for i in ranked])
    )


def _link_report(client, experiment_id: str, run_id: str) -> None:
    """A line under the study run's description linking to report.html in MLflow's artifact view (the roll-up,
    which rewrites the description's table, keeps what follows REPORT_MARKER)."""
    import datetime as dt

    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    link = f"#/experiments/{experiment_id}/runs/{run_id}/artifactPath/{ARTIFACT_DIR}/{HTML_REPORT}?{UI_WORKFLOW}"
    line = f"**Full report** (every table and plot, one page): [{ARTIFACT_DIR}/{HTML_REPORT}]({link}), written {when}."
    note = client.get_run(run_id).data.tags.get(MLFLOW_RUN_NOTE, "")
    client.set_tag(run_id, MLFLOW_RUN_NOTE, f"{note.split(REPORT_MARKER, 1)[0].rstrip()}\n\n{REPORT_MARKER}\n\n{line}")


_SHARPNESS = METRIC_PREFIX + "lambda_max"


def _sharpness_section(r: _Report) -> None:
    """lambda_max during training of each cell's best trial, against SGD's edge of stability (plot_sharpness)."""
    runs, best_ids = r.runs, r.best_ids
    if _SHARPNESS not in runs.columns or not best_ids:
        return
    measured = set(runs.loc[pd.to_numeric(runs[_SHARPNESS], errors="coerce").notna(), "run_id"])
    ids = [run_id for run_id in best_ids if run_id in measured]
    if not ids:
        return
    curves = load_curves(r.study, tracking_uri=r.tracking_uri, smoke=r.smoke, metrics=(_SHARPNESS, "lr"), run_ids=ids)
    steps = curves[curves["metric"] == _SHARPNESS].groupby("run_id")["step"].nunique()
    if curves.empty or not (steps >= 2).any():
        return  # measured at the end only: the tau table has it, a curve needs several epochs
    r.w.figure("sharpness.png", plot_sharpness(curves, runs))
    r.w.section(
        "Sharpness during training",
        "lambda_max of the Hessian of the training loss (fixed unaugmented training samples, geometry section of the "
        "study) at the epochs it was measured, for each cell's best trial. Dotted: the edge of stability of the SGD "
        "trials, 2(1 + momentum)/lr at that epoch's lr (Cohen et al. 2021); gradient descent at that lr cannot stay "
        "where lambda_max is above it. AdamW trials have no line: their edge concerns the preconditioned sharpness, "
        "which is not measured here; sharpness-aware methods also move the edge (their step is not plain SGD's).",
        "sharpness.png",
    )


def _knob_labels(runs: pd.DataFrame, run_ids: list[str]) -> dict[str, str]:
    """run_id -> 'rho=0.0196' for the trials with a (positive) rho: what tells SAM's curves apart."""
    if RHO not in runs.columns:
        return {}
    rows = runs[runs["run_id"].isin(run_ids)]
    values = pd.to_numeric(rows[RHO], errors="coerce")
    name = RHO.rsplit(".", 1)[-1]
    return {r: f"{name}={v:.3g}" for r, v in zip(rows["run_id"], values) if np.isfinite(v) and v > 0}


def _best_run_ids(runs: pd.DataFrame, metric: str, mode: str) -> list[str]:
    return best_trials(runs, metric=metric, mode=mode, by=["cell"])["run_id"].tolist()


def _pairs(runs: pd.DataFrame, method: str) -> list[tuple[str, str]]:
    if "optimizer.method" not in runs.columns or method not in runs.columns:
        return []
    return method_pairs(runs, method=method)


def _slug(level: str) -> str:
    """A method level as part of a file name (gain_<slug>.md): every character but letters, digits and -_. as _."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in level)


def _scaling_section(r: _Report) -> None:
    """Error against data fraction (scaling_table), with 3+ fractions its power laws, with 4+ the laws checked by
    extrapolation, and where seeds pair each sharpness-aware level's gain and data multiplier over its partner."""
    w, runs, source, seed, fractions = r.w, r.compared, r.source, r.seed_col, r.fractions
    table = scaling_table(
        runs, arch=r.arch, method=r.method, fraction=_FRACTION, seed=seed, metric=r.metric, mode=r.mode
    )
    md = f"Numbers from: {source}.\n\n" + table.to_markdown(digits=r.digits, scale=r.scale, runs=_per_seed(r))
    w.text("scaling.md", md)
    w.csv("scaling.csv", table.long(), index=False)
    fits = fit_scaling_table(table, n_boot=r.n_boot, seed=r.boot_seed) if len(fractions) >= 3 else {}
    w.figure("scaling.png", plot_error_vs_n(table, fits))
    w.section(f"Data scaling{r.unit}", md, "scaling.png")
    if fits:
        form, eps0, form_note = _law_form(r)
        frame = _one_beta(fits_frame(fits), table, seed is not None, r.boot_seed, form=form, eps0=eps0)
        fits_md = (
            f"Numbers from: {source}. "
            "Power laws err(n) = a n^-b + c on 1 - metric (or the metric when minimised) per (arch, method), "
            "n = training-set fraction, least squares on every seed's point. Intervals (column `interval` says "
            "which, and its coverage measured by simulation, benchmarks/sim_coverage.py --power-laws: docs/science.md): "
            "with 2+ seeds the delete-one-seed jackknife with Student's t on seeds - 1 df, the seed being the "
            "independent unit; with one seed none (its offset, shared by its points, cannot be resampled); without "
            "seeds a residual bootstrap over points, which ignores that a seed's points are correlated. "
            + (
                "One exponent a series: with seeds, the fit's b is not printed; `beta` [beta_low, beta_high] is "
                f"the exponent of the law form {form} ({_FORM_EQUATION[form]}) fitted on every seed's point in log "
                f"space (analysis.scaling.law_parameters: {_FORM_INTERVAL[form]}, no interval where not "
                f"identified), the beta the scaling-law sections use. {form_note} " + _conditions(frame)
                if "beta" in frame.columns
                else ""
            )
            + "\n\n"
            + _markdown(_fmt(frame))
        )
        w.text("scaling_fits.md", fits_md)
        w.csv("scaling_fits.csv", frame)
        w.section("Power-law fits", fits_md)
    if seed is None:  # a gain pairs seeds
        return
    pairs = list(r.family) or _pairs(runs, r.method)
    if len(fractions) >= 4:
        _laws_section(r, table, pairs)
    for level, base in pairs:
        if (level, base) in r.family:
            _gain_section(r, level, base)
        _multiplier_section(r, fits, level, base)


def _multiplier_section(r: _Report, fits: dict, level: str, base: str) -> None:
    """How many times more data `base` needs to match `level`, at each fraction, from their power laws."""
    rows = []
    for a in sorted({k[0] for k in fits}):
        fv, ft = fits.get((a, base)), fits.get((a, level))
        if fv is None or ft is None:
            continue
        for f in r.fractions:
            m = data_multiplier(fv, ft, float(f))
            rows.append(
                {
                    "arch": a,
                    "treatment": level,
                    "fraction": f,
                    "multiplier": m.multiplier,
                    "low": m.interval[0],
                    "high": m.interval[1],
                    "explanation": m.explanation,
                }
            )
    if not rows:
        return
    mult = pd.DataFrame(rows)
    mult_md = (
        _EXPLORATORY
        + f"How many times more data {base} needs to match {level}'s fitted error at each fraction, from the "
        "power-law fits above; the interval from the same fits' seed-level jackknife (none with one seed), each "
        "row's explanation saying which and its coverage measured by simulation "
        f"(docs/science.md). Numbers from: {r.source}.\n\n"
        + _markdown(_fmt(mult.set_index(["arch", "treatment", "fraction"])))
    )
    r.w.table(f"data_multiplier_{_slug(level)}", f"Data multiplier of {level}", mult_md, mult, index=False)


_EXPLORATORY = (
    "**Exploratory** (outside the report's error-controlled family, see Findings: its intervals and tests are "
    "per comparison, unadjusted, and nothing in it is a finding). "
)


def _gain_family(r: _Report) -> dict[tuple[str, str], pd.DataFrame]:
    """The report's family of findings (analysis.tables.gain_family) on the compared runs; empty where seeds cannot
    pair (no seed column, or one fraction without confirm runs: the search trials of a cell are not replicates)."""
    if r.seed_col is None or not (r.scales_data or not r.confirm.empty):
        return {}
    return gain_family(
        r.compared,
        _pairs(r.compared, r.method),
        arch=r.arch,
        method=r.method,
        fraction=_FRACTION,
        seed=r.seed_col,
        metric=r.metric,
        mode=r.mode,
        alpha=FAMILY_ALPHA,
    )


def _chosen_knob(r: _Report, level: str, arch, fraction) -> str:
    """The rho the `level` cell chose at (arch, fraction), from its compared runs (one value: the confirm runs'); ''
    where it has none or several (a search without confirm runs)."""
    if RHO not in r.compared.columns:
        return ""
    part = r.compared[(r.compared[r.method].astype(str) == level) & (r.compared[r.arch].astype(str) == str(arch))]
    if _FRACTION in part.columns and r.scales_data:
        part = part[pd.to_numeric(part[_FRACTION], errors="coerce") == float(fraction)]
    values = pd.to_numeric(part[RHO], errors="coerce").dropna().unique()
    return f", rho = {values[0]:.3g}" if len(values) == 1 else ""


def _findings_section(r: _Report) -> None:
    """The study's answer first: the primary contrast per arch (and fraction), then what the family found."""
    if not r.family:
        r.w.section(
            "Findings",
            "No error-controlled finding: the study has no paired comparison (seed-paired runs of a "
            "sharpness-aware level and its plain partner). Every table below is descriptive or exploratory.",
        )
        return
    (level, base), gain = next(iter(r.family.items()))
    m = gain.attrs["family_size"]
    tables = ", ".join(f"{t} over {b}" for t, b in r.family)
    lines = []
    for (arch, fraction), row in gain.iterrows():
        where = f"{arch}" + (f" at fraction {fraction}" if r.scales_data else "")
        value = row["gain"] * r.scale
        if not math.isfinite(value):
            lines.append(f"- {where}: no pair")
            continue
        lo, hi = row["band_low"] * r.scale, row["band_high"] * r.scale
        span = f" [{lo:+.{r.digits}f}, {hi:+.{r.digits}f}]" if math.isfinite(lo) else " (no interval)"
        verdict = "significant" if _yes(row["significant"]) else "not significant"
        lines.append(
            f"- {where}: {level} - {base} = {value:+.{r.digits}f}{' points' if r.unit else ''}{span}, "
            f"{int(row['n_pairs'])} seed pairs{_chosen_knob(r, level, arch, fraction)}: {verdict}"
        )
    found = [
        f"{t} over {b}, {a}" + (f" at {f}" if r.scales_data else "")
        for (t, b), g in r.family.items()
        for (a, f), sig in g["significant"].items()
        if _yes(sig)
    ]
    md = (
        f"Primary contrast (the study's question): the gain of {level} over {base} in {r.metric}, paired by seed, "
        f"per arch{' and fraction' if r.scales_data else ''}; the knob each {level} cell chose on its search trials, "
        f"the gain measured on: {r.source}. Intervals: simultaneous {1 - FAMILY_ALPHA:.0%} (Bonferroni over the "
        f"family).\n\n" + "\n".join(lines) + "\n\n"
        f"The family of findings: the {m} paired-gain tests of {tables} (every arch and fraction); its "
        f"family-wise error rate is held at {FAMILY_ALPHA:.0%} by Holm's step-down across all of them (p_holm in the "
        "gain tables; a step-down test, so it can reject where the simultaneous interval still touches 0). "
        + (f"Significant: {'; '.join(found)}." if found else "No test of the family is significant.")
        + " Every other test or interval in this report (scaling-law parameters, data multipliers, rho, compute, "
        "knob importance) is exploratory: per comparison, unadjusted, never a finding."
    )
    r.w.section("Findings", md)


def _gain_section(r: _Report, level: str, base: str) -> None:
    """The gain of a sharpness-aware `level` over its plain partner `base`, paired by seed, adjusted as part of the
    report's family (_gain_family)."""
    w, source, metric = r.w, r.source, r.metric
    gain = r.family[(level, base)]
    slug = _slug(level)
    m = gain.attrs["family_size"]
    gain_md = (
        f"Gain of {level} over {base} in {metric}, paired by seed. Numbers from: {source}. ci_low/ci_high: "
        f"{gain.attrs['confidence']:.0%} Student-t interval of that row alone (unadjusted; se and df its own, "
        "over what `interval over` names); "
        f"p_holm: the paired t test's p-value, Holm-adjusted across the report's whole family of {m} gain tests "
        f"(every method pair, arch and fraction; `significant` below {FAMILY_ALPHA:.2g}); band_low/band_high: the "
        f"interval simultaneous over that family (Bonferroni, what the plot draws); a row without a significant "
        "gain says in its note what that interval excludes (no post-hoc power: what the design could detect is "
        "stated before the runs, analysis/design.py). "
        + _conditions(gain)
        + "\n\n"
        + _markdown(_fmt(gain.drop(columns=["detectable"], errors="ignore")))
    )
    w.text(f"gain_{slug}.md", gain_md)
    w.csv(f"gain_{slug}.csv", gain)
    w.figure(
        f"gain_{slug}.png",
        plot_gain(
            gain,
            interval=("band_low", "band_high"),
            interval_label=f"{1 - FAMILY_ALPHA:.0%} simultaneous over the report's {m} gain tests (Bonferroni)",
        ),
    )
    w.section(f"Gain of {level} over {base}", gain_md, f"gain_{slug}.png")


def _rho_section(r: _Report) -> None:
    """The objective against the searched rho over the search trials (rho_sensitivity), split by fraction in a
    data-scaling study, and then whether the best rho moves with the data (rho_transfer)."""
    w, runs, source = r.w, r.search, r.search_source
    by = (_FRACTION,) if r.scales_data else ()
    # The rho = 0 reference line: the plain level, when every sharpness-aware level pairs with the same one (and
    # has trials here: with a confirm stage a plain level searches nothing, and is compared on its confirm runs).
    bases = {b for _, b in _pairs(runs, r.method)}
    base = bases.pop() if len(bases) == 1 else None
    result = rho_sensitivity(
        runs,
        param=RHO,
        arch=r.arch,
        method=r.method,
        by=by,
        metric=r.metric,
        mode=r.mode,
        baseline=base,
        n_boot=max(r.n_boot, 100),
        boot_seed=r.boot_seed,
    )
    md = _EXPLORATORY + f"Numbers from: {source}.\n\n" + result.to_markdown()
    w.text("rho_sensitivity.md", md)
    w.csv("rho_levels.csv", result.levels, index=False)
    w.csv("rho_best.csv", result.best)
    w.figure("rho_sensitivity.png", plot_rho_sensitivity(result))
    w.section("rho sensitivity", md, "rho_sensitivity.png")
    if by:
        transfer = rho_transfer(result, fraction=by[0])
        transfer_md = (
            _EXPLORATORY + "Does the best rho move with the amount of data? Best rho per fraction [the ends of its "
            f"{result.confidence:.0%} confidence set for the best level, calibrated at ties], the slope of "
            "log10(best rho) on log10(fraction) with its interval (slope_low, slope_high: the slope's range over "
            "every choice of a level from each fraction's confidence set, the sets taken at 1 - alpha / fractions "
            "so that they cover jointly: a conservative projection; a slope whose interval holds 0 is no evidence "
            "of a move), and whether the sets of all fractions overlap (then the data cannot tell a moving rho "
            f"from a fixed one). Numbers from: {source}.\n\n" + _markdown(_fmt(transfer))
        )
        w.text("rho_transfer.md", transfer_md)
        w.csv("rho_transfer.csv", transfer)
        w.section("rho transfer across data", transfer_md)


def _per_seed(r: _Report) -> str:
    """What one seed's value in the compared tables is: its confirm run, or the best trial of its search."""
    return "confirm-run" if not r.confirm.empty else "best-of-search"


def _negative_floor_note(laws: pd.DataFrame) -> pd.DataFrame:
    """A note on each row whose fitted floor E is below 0: an error floor under zero is unphysical, so the held-in
    fractions do not identify it (the curve has not flattened); its E and the prediction rest on the form alone."""
    if "E" not in laws.columns:
        return laws
    e = pd.to_numeric(laws["E"], errors="coerce")
    bad = e < 0
    if "note" not in laws.columns:
        laws["note"] = ""
    if bad.any():
        why = "E < 0: an error floor below zero is unphysical; these fractions do not identify it"
        laws.loc[bad, "note"] = [
            why if not isinstance(n, str) or not n else f"{n}; {why}" for n in laws.loc[bad, "note"]
        ]
    return laws


def _chance(runs: pd.DataFrame, metric: str, mode: str) -> float | None:
    """M4's eps0 for the study's dataset (one data.name) and metric; None where unknown."""
    names = runs["data.name"].dropna().astype(str).unique() if "data.name" in runs.columns else []
    return chance_error(names[0], metric, mode=mode) if len(names) == 1 else None


# How each law form reads and how law_parameters / paired_law_difference give its intervals, said in the captions.
_FORM_EQUATION = {
    "saturating": "L(n) = E + B n^-beta",
    "m4": "(L - E) / (eps0 - L)^alpha = B n^-beta, eps0 the error of a model that learned nothing",
    "broken": "L(n) = E + B n^-beta (1 + n/n_break)^-beta2",
}
_FORM_INTERVAL = {
    "saturating": "seed-level parametric bootstrap-t, 2,000 draws, each side at least Student t on seeds - 1 df",
    "m4": "delete-one-seed jackknife, Student t on seeds - 1 df; its coverage is not measured by simulation",
    "broken": "delete-one-seed jackknife, Student t on seeds - 1 df; its coverage is not measured by simulation",
}


def _law_form(r: _Report) -> tuple[str, float | None, str]:
    """(form, eps0, why) of the report's law tables: `default_form` of the study's eps0 (_chance) and the
    fractions below the held-out largest one, so that the form checked by extrapolation is the one compared."""
    eps0 = _chance(r.compared, r.metric, r.mode)
    held_in = len(r.fractions) - 1
    form = default_form(eps0, held_in)
    if form == "m4":
        why = (
            f"The form is M4 (eps0 = {eps0:.4g}): on the published vision learning curves it extrapolates with a "
            "median log RMSE of 0.027 against the saturating form's 0.071 (docs/benchmarks.md)."
        )
    elif eps0 is None:
        why = (
            "The form is E + B n^-beta: M4, which extrapolates better on the published learning curves "
            "(docs/benchmarks.md), needs the error of a model that learned nothing, unknown for this dataset/metric."
        )
    else:
        why = (
            f"The form is E + B n^-beta: M4, which extrapolates better on the published learning curves "
            f"(docs/benchmarks.md), has 4 parameters and needs 5 fractions below the held-out one; this design has "
            f"{held_in}."
        )
    return form, eps0, why


def _one_beta(
    frame: pd.DataFrame, table, seeded: bool, boot_seed: int, *, form: str = "saturating", eps0: float | None = None
) -> pd.DataFrame:
    """The power-law table with law_parameters' beta in place of fit_power_law's b: two exponents of one series
    with different intervals in one report read as two findings (issue 32). Without seeds there is no
    seed-level beta, and b stays."""
    if not seeded or frame.empty:
        return frame
    betas = []
    for arch, method in frame.index:
        n, err, seeds = table_points(table, arch, method)
        row = {"beta": math.nan, "beta_low": math.nan, "beta_high": math.nan}
        if len(np.unique(seeds)) >= 2 and len(np.unique(n)) >= 3 and not np.all(err == 0):
            par = law_parameters(n, err, seeds, form=form, eps0=eps0 if form == "m4" else None, boot_seed=boot_seed)
            row = {
                "beta": par.loc["beta", "estimate"],
                "beta_low": par.loc["beta", "low"],
                "beta_high": par.loc["beta", "high"],
            }
        betas.append(row)
    out = frame.drop(columns=["b", "b_low", "b_high"])
    at = list(out.columns).index("a_high") + 1 if "a_high" in out.columns else 0
    for i, col in enumerate(("beta", "beta_low", "beta_high")):
        out.insert(at + i, col, [b[col] for b in betas])
    out.attrs["conditions"] = CONDITIONS  # law_parameters' intervals: over seeds, as every other here
    return out


def _conditions(frame: pd.DataFrame) -> str:
    """What a frame's seed-level intervals condition on (its attrs["conditions"]), said beside them."""
    said = frame.attrs.get("conditions") or CONDITIONS
    return f"The intervals are {said}."


_LAW_COLUMNS = (
    "n_seeds",
    "E",
    "E_low",
    "E_high",
    "beta",
    "beta_low",
    "beta_high",
    "heldout_n",
    "observed",
    "prediction",
    "prediction_low",
    "prediction_high",
    "check",
    "check_se",
    "pi_low",
    "pi_high",
    "consistent",
    "check_low",
    "check_high",
    "interval over",
    "supported",
    "note",
)


def _laws_section(r: _Report, table, pairs: list[tuple[str, str]]) -> None:
    """Scaling laws checked by extrapolation, and each sharpness-aware level's paired difference in beta and E."""
    # The largest fraction is held out and predicted; eps0: M4's error of a model that learned nothing (_chance).
    heldout, eps0 = float(max(r.fractions)), _chance(r.compared, r.metric, r.mode)
    form, _, form_note = _law_form(r)
    laws = _law_checks(table, heldout, eps0)
    if laws is None:
        return
    show = [c for c in _LAW_COLUMNS if c in laws.columns]
    verdicts = "\n".join(f"- {a}/{m}: {v}" for (a, m), v in laws["verdict"].groupby(level=[0, 1]).first().items() if v)
    md = (
        "Scaling laws checked by extrapolation: each form fitted in log space (Huber loss, delta scaled to the "
        "residuals, several starts) on the error (1 - metric, or the metric when minimised) of every seed's "
        f"{_per_seed(r)} trial at the fractions below {heldout:g}, which is held out and predicted. "
        f"Numbers from: {r.source}. Every number of a row comes from that one held-in fit: E, beta and the "
        "prediction with 95% intervals (the saturating form: a seed-level parametric bootstrap-t, 2,000 draws, each "
        "side at least Student t on seeds - 1 df; the other forms: delete-one-seed jackknife, Student t; in the "
        f"rows whose `interval over` reads '{IMAGE_OVER}', each widened by the test images' variance, from the "
        "runs' per-image correctness: analysis.images); `check` = "
        "prediction - observed mean at the held-out fraction, `check_se` its seed-level standard error (the "
        "prediction's error and the observed mean's), `pi_low`/`pi_high` the prediction interval of the held-out "
        "mean over its seeds, `consistent` whether the observed mean is inside it; `check_low`/`check_high` the "
        "95% interval of `check`: the mispredictions these seeds do not exclude (what a consistent check rules out "
        "is what lies outside it). A form is named better only where its held-out error is smaller by more than "
        "that difference's own noise. "
        + _conditions(laws)
        + "\n\n"
        + _markdown(_fmt(laws[show]))
        + ("\n" + verdicts + "\n" if verdicts else "")
    )
    r.w.text("scaling_laws.md", md)
    r.w.csv("scaling_laws.csv", laws)
    r.w.section("Scaling laws checked by extrapolation", md)
    for level, base in pairs:
        _law_difference_table(r, table, level, base, form=form, form_note=form_note, eps0=eps0)


def _law_checks(table, heldout: float, eps0: float | None) -> pd.DataFrame | None:
    """law_extrapolation of each (arch, method) with its largest fraction held out, one frame indexed by (arch,
    method, form); a series too short or all zero is a row that says so. None when the table has no series."""
    frames = []
    for arch, method in table.mean.index:
        n, err, seeds = table_points(table, arch, method)
        if len(np.unique(n[n < heldout])) < 3 or np.all(err == 0):
            why = "every error is 0: nothing to fit" if len(err) and np.all(err == 0) else "fewer than 3 fractions"
            frames.append(pd.DataFrame([{"arch": arch, "method": method, "form": "-", "note": why, "verdict": ""}]))
            continue
        frame = law_extrapolation(n, err, seeds, heldout=heldout, eps0=eps0, scored=table_scored(table, arch, method))
        verdict = frame.attrs.get("verdict", "")
        frame = frame.reset_index()
        frame.insert(0, "method", method)
        frame.insert(0, "arch", arch)
        frame["verdict"] = verdict
        frames.append(frame)
    if not frames:
        return None
    out = _negative_floor_note(pd.concat(frames, ignore_index=True)).set_index(["arch", "method", "form"])
    out.attrs["conditions"] = interval_conditions(out["interval over"] if "interval over" in out else [])
    return out


def _law_difference_table(
    r: _Report, table, level: str, base: str, *, form: str, form_note: str, eps0: float | None
) -> None:
    """The table of level - base in each parameter of the report's law form, per arch, paired by seed; none where
    no arch has enough fractions both ran."""
    rows = []
    for arch in sorted({str(a) for a, _ in table.mean.index}):
        nt, et, st = table_points(table, arch, level)
        nb, eb, sb = table_points(table, arch, base)
        rt = table_scored(table, arch, level) or [None] * len(nt)  # per-image records, where the runs have them
        rb = table_scored(table, arch, base) or [None] * len(nb)
        tb = {(f, s): (e, r) for f, e, s, r in zip(nb, eb, sb, rb)}
        keep = [(f, e, s, *tb[(f, s)], r) for f, e, s, r in zip(nt, et, st, rt) if (f, s) in tb]
        if len({k[0] for k in keep}) < (5 if form == "m4" else 4):  # one more n than the form's parameters
            continue
        f, e_t, s_, e_b = (np.asarray(v) for v in list(zip(*keep))[:4])
        if np.all(e_t == 0) or np.all(e_b == 0):
            continue
        diff = paired_law_difference(
            f, e_t, e_b, s_, form=form, eps0=eps0 if form == "m4" else None,
            scored_treatment=[k[5] for k in keep], scored_baseline=[k[4] for k in keep],
        ).reset_index()  # fmt: skip
        diff.insert(0, "arch", arch)
        rows.append(diff)
    if not rows:
        return
    frame = pd.concat(rows, ignore_index=True).set_index(["arch", "param"])
    frame.attrs["conditions"] = interval_conditions(frame["interval over"])
    md = (
        _EXPLORATORY + f"{level} - {base} in each parameter of {_FORM_EQUATION[form]} (error), fitted on every "
        f"fraction, paired by seed. {form_note} Numbers from: {r.source}. diff_low/diff_high: 95% interval "
        + (
            "(seed-level parametric bootstrap-t of the difference, 2,000 draws refitting both laws, "
            "studentised by the paired seeds' influence; each side at least Student t on seeds - 1 df); "
            if form == "saturating"
            else f"({_FORM_INTERVAL[form]}, each leave-one-out refitting both laws without the same seed); "
        )
        + f"in the rows whose `interval over` reads '{IMAGE_OVER}' widened by the test images' variance (both arms' "
        "per-image correctness on the same images: analysis.images) and the p-value with it; "
        + "identified: whether both fits pin the "
        "parameter down (where not: no interval and no p-value, the difference is between two edges of its "
        "range); where the interval holds 0, the note says what it excludes. "
        + _conditions(frame)
        + "\n\n"
        + _markdown(_fmt(frame))
    )
    r.w.table(f"law_difference_{_slug(level)}", f"Scaling-law difference of {level} over {base}", md, frame)


def _compares_compute(runs: pd.DataFrame, method: str) -> bool:
    """Whether the trials differ in what they spend compute on: 2+ methods or 2+ epoch counts, with epoch times logged."""
    if EPOCH_TIME not in runs.columns or "run_id" not in runs.columns:
        return False
    methods = runs[method].nunique() if method in runs.columns else 0
    epochs = runs["schedule.epochs"].nunique() if "schedule.epochs" in runs.columns else 0
    return methods >= 2 or epochs >= 2


def _compute_section(r: _Report) -> None:
    """Accuracy against training compute: a table per arch and the frontier plot (analysis.compute)."""
    w, runs, source, arch, method, metric, mode = r.w, r.compared, r.source, r.arch, r.method, r.metric, r.mode
    epoch_times = load_curves(
        r.study, tracking_uri=r.tracking_uri, smoke=r.smoke, metrics=(EPOCH_TIME,), run_ids=runs["run_id"].tolist()
    )
    seed = f"factor.{_SEED}" if f"factor.{_SEED}" in runs.columns else None
    table = compute_matched(runs, epoch_times, arch=arch, method=method, seed=seed, metric=metric, mode=mode)
    if table.empty:
        return
    cost_unit = table.attrs["unit"]

    def pm(mean, se, factor, digits):
        if not math.isfinite(mean):
            return "–"
        return f"{mean * factor:.{digits}f} ± " + (f"{se * factor:.{digits}f}" if math.isfinite(se) else "–")

    blocks = []
    for a, part in table.groupby(level=0, sort=True):
        shown = pd.DataFrame(
            {
                "epochs": [
                    e if isinstance(e, str) else (f"{e:.0f}" if math.isfinite(e) else "–") for e in part["epochs"]
                ],
                f"{cost_unit} mean ± SE": [pm(m, e, 1.0, 1) for m, e in zip(part["cost_mean"], part["cost_se"])],
                f"{metric}{r.unit} mean ± SE": [
                    pm(m, e, r.scale, 2) for m, e in zip(part["metric_mean"], part["metric_se"])
                ],
                "n": part["n"].to_numpy(),
                "trials": part["trials"].to_numpy(),
                "note": part["note"].to_numpy(),
                f"{cost_unit} of one run": [
                    pm(m, e, 1.0, 1) for m, e in zip(part["run_cost_mean"], part["run_cost_se"])
                ],
            },
            index=part.index.droplevel(0),
        )
        if (part["cost_n"] != part["n"]).any():  # some cells' cost is unknown (an untimed trial): say over how many
            shown.insert(2, f"{cost_unit} n", part["cost_n"].to_numpy())
        blocks.append(f"### arch: {a}\n\n" + _markdown(shown))
    md = (
        f"Each cell's answer (its best finished trial by {statistic_label(metric)}) against the training compute of "
        f"its whole search, every trial of the cell, and (last column, what the plot shows) of one run, that "
        f"trial's own ({cost_unit}: the logged per-epoch epoch_time_s summed, x workers x GPUs per worker; validation "
        "and checkpoints not counted); mean ± SE over seeds, n = cells with a result, '–' where n = 1. "
        "A method beats more epochs of vanilla only if it is better at equal or lower compute. Numbers from: "
        f"{source}.\n\n" + "\n".join(blocks)
    )
    pair_on = seed or r.seed_col
    if pair_on is not None and "optimizer.method" in runs.columns:
        plain = sorted(runs.loc[runs["optimizer.method"].astype(str) == "none", method].dropna().astype(str).unique())
        paired = [
            compute_matched_gains(
                runs, epoch_times, baseline=b, arch=arch, method=method, seed=pair_on, metric=metric, mode=mode
            )
            for b in plain
        ]
        paired = [p for p in paired if not p.empty]
        if paired:
            # Outside the report's family: its p-values stay, its verdicts go (nothing exploratory is 'significant').
            gains = pd.concat(paired).drop(columns=["significant", "detectable"], errors="ignore")
            md += (
                f"\n### Paired by seed\n\n{_EXPLORATORY}Each method against each plain level of the same arch, paired by seed: "
                f"gain in {metric} (method - baseline), its 95% interval (Student t over the seed pairs, or over "
                f"seeds and test images where `interval over` reads '{IMAGE_OVER}'), p_holm "
                "Holm-adjusted across the methods compared with one baseline (a null row's note says what its "
                "interval excludes), cost_ratio one run's compute of the method over one of the baseline on those seeds (1: matched). "
                f"The intervals are {_gain_conditions(paired)}. "
                f"Numbers from: {source}.\n\n" + _markdown(_fmt(gains))
            )
            w.csv("compute_matched_gains.csv", gains)
    w.text("compute_matched.md", md)
    w.csv("compute_matched.csv", table)
    w.figure("compute_frontier.png", plot_compute_frontier(table))
    w.section("Accuracy against compute", md, "compute_frontier.png")


def _gain_conditions(paired: list[pd.DataFrame]) -> str:
    """What compute_matched_gains' intervals condition on, over all its tables (analysis.images' wording)."""
    said = {p.attrs["conditions"] for p in paired}
    if len(said) == 1:
        return said.pop()
    return interval_conditions(pd.concat([p["interval over"] for p in paired]))


def _gain_sections(r: _Report) -> None:
    # One fraction: the confirm runs still pair by seed, so each sharpness-aware level's gain is stated.
    for level, base in r.family:
        _gain_section(r, level, base)


@dataclass(frozen=True)
class Section:
    """One section of the report: the function that writes it (given the _Report), the files it writes where the
    records support them ({level}: once per sharpness-aware level of the family, as _slug names it), whether its
    numbers are the report's findings (the error-controlled family), exploratory (per comparison, unadjusted) or
    descriptive, which of its files carry the family's verdicts (`findings`: only those may say "significant"),
    what it needs (said in write_report's docstring), and when it applies."""

    name: str
    write: Callable[[_Report], None]
    files: tuple[str, ...]
    kind: Literal["finding", "exploratory", "descriptive"]
    needs: str
    applies: Callable[[_Report], bool] = lambda r: True
    findings: tuple[str, ...] = ()

    def names(self, levels: Iterable[str] = (), *, findings: bool = False) -> set[str]:
        """Its file names (findings: only those of `findings`), each {level} spelled out for every one of `levels`."""
        slugs = [_slug(level) for level in levels]
        files = self.findings if findings else self.files
        return {f.format(level=s) for f in files for s in (slugs if "{level}" in f else [""])}


#: The report's sections in report.md's order; a new table is its function and one entry here.
SECTIONS: tuple[Section, ...] = (
    Section("findings", _findings_section, (), "finding", "always: the primary contrast and the family's tests"),
    Section("summary", _summary_section, ("summary.md", "summary.csv"), "descriptive", "always (`summarize`)"),
    Section(
        "study",
        _study_section,
        (
            "parallel_coordinates.png",
            "parallel_coordinates.svg",
            "knob_importance.md",
            "knob_importance.csv",
            "trials.md",
            "trials.csv",
        ),
        "exploratory",
        "always: every trial, its knobs and links; knob importance where knobs were searched",
    ),
    Section(
        "confirm",
        _confirm_section,
        ("confirm.md", "confirm.csv"),
        "descriptive",
        "confirm runs: per cell, mean ± SE over its confirm seeds and the chosen knob (`confirm_summary`)",
        lambda r: not r.confirm.empty,
    ),
    Section("curves", _curves_section, ("curves.png",), "descriptive", "histories: each cell's best trial's curves"),
    Section(
        "scaling",
        _scaling_section,
        (
            "scaling.md",
            "scaling.csv",
            "scaling.png",
            "scaling_fits.md",
            "scaling_fits.csv",
            "scaling_laws.md",
            "scaling_laws.csv",
            "law_difference_{level}.md",
            "law_difference_{level}.csv",
            "gain_{level}.md",
            "gain_{level}.csv",
            "gain_{level}.png",
            "data_multiplier_{level}.md",
            "data_multiplier_{level}.csv",
        ),
        "exploratory",
        "2+ data fractions: Table 5's shape, log-log error against the fraction, with 3+ fractions the power laws, "
        "their extrapolation and the data multipliers (exploratory), and each level's gain over its plain partner "
        "(`method_pairs`; the family's findings)",
        lambda r: r.scales_data,
        findings=("gain_{level}.md", "gain_{level}.csv", "gain_{level}.png"),
    ),
    Section(
        "gain",
        _gain_sections,
        ("gain_{level}.md", "gain_{level}.csv", "gain_{level}.png"),
        "finding",
        "one data fraction and seed-paired confirm runs: each level's gain over its plain partner",
        lambda r: not r.scales_data and bool(r.family),
        findings=("gain_{level}.md", "gain_{level}.csv", "gain_{level}.png"),
    ),
    Section(
        "geometry",
        _geometry_section,
        ("geometry_tau.md", "geometry_tau.csv"),
        "exploratory",
        "geometry/* columns (a study's geometry: section, or analysis.log_geometry): Kendall's tau with the gap",
        lambda r: _measured_geometry(r.runs),
    ),
    Section(
        "sharpness",
        _sharpness_section,
        ("sharpness.png",),
        "descriptive",
        "lambda_max measured at several epochs (geometry.every)",
    ),
    Section(
        "rho",
        _rho_section,
        (
            "rho_sensitivity.md",
            "rho_levels.csv",
            "rho_best.csv",
            "rho_sensitivity.png",
            "rho_transfer.md",
            "rho_transfer.csv",
        ),
        "exploratory",
        "rho searched (2+ distinct positive optimizer.hparams.rho), split by fraction where the study has several",
        lambda r: len(_distinct(r.search, RHO, positive=True)) >= 2,
    ),
    Section(
        "compute",
        _compute_section,
        ("compute_matched.md", "compute_matched.csv", "compute_matched_gains.csv", "compute_frontier.png"),
        "exploratory",
        "one data fraction, epoch times logged, and 2+ methods or 2+ epoch counts: per arch each method's epochs, "
        "training compute and objective (mean ± SE, n)",
        lambda r: not r.scales_data and _compares_compute(r.compared, r.method),
    ),
)

#: The pages every report writes besides its sections (_write_pages).
PAGES = ("report.md", HTML_REPORT)


def _sections_doc() -> str:
    lines = [f"      - {s.name} ({s.kind}): {s.needs}; {', '.join(s.files) or 'report.md only'}." for s in SECTIONS]
    return "\n    Sections (SECTIONS):\n" + "\n".join(lines) + "\n"


write_report.__doc__ = (write_report.__doc__ or "") + _sections_doc()
