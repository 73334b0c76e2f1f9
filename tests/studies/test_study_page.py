"""The study page: the answer table in the experiment's description, read back through a real MLflow UI's REST API
(and, where Chromium is installed, on the first screen of a real headless browser), `sharpscale ui` printing that
page's address and nothing else; and a store that travels (`sharpscale export`)."""

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from studies.records import RESULTS_MARKER, VIEW_KEY, VIEW_NAME, describe_experiment, roll_up, source_tags
from studies.server import free_port, group_alive
from studies.spec import load_study
from trainables.naming import CELL_TAG, KIND_TAG, LOG_FILE, factor_tag
from trainables.tracking import TrackingTarget, TrialRecorder

REPO = Path(__file__).resolve().parents[2]


_OPTIMIZER = {"sam": "sam", "adamw": "none"}  # the quickstart's method levels as their configs' optimizer.method


def _trial(exp, parent, key, value, rho, *, uri, cell, samples=360):
    tags = {CELL_TAG: cell.key, **{factor_tag(k): v for k, v in cell.levels.items()}}
    recorder = TrialRecorder(
        TrackingTarget(uri, exp, parent, tags=tags),
        trial_key=key,
        run_name=key,
        params={"optimizer.hparams.rho": rho, "optimizer.method": _OPTIMIZER[cell.levels["method"]]},
    )
    # fixed_time_s sorts before val_acc: the chart view must still open on the objective (records.chart_state).
    recorder.log_epoch({"val_acc": value, "val_samples": samples, "fixed_time_s": 1.0}, 0)
    recorder.finish("finished")
    return recorder.run_id


def _recorded_study(uri: str, artifacts: Path | None = None):
    """A quickstart-shaped record: the vit cells, three SAM trials (two tied at the best value), one AdamW."""
    from mlflow.tracking import MlflowClient

    study = load_study(REPO / "studies" / "quickstart.yaml")
    client = MlflowClient(uri)
    exp = client.create_experiment(study.experiment_name, artifact_location=artifacts.as_uri() if artifacts else None)
    describe_experiment(client, exp, study)
    study_run = client.create_run(exp, tags={KIND_TAG: "study", **source_tags(study, "abc")}).info.run_id
    cells = {c.key: c for c in study.cells if c.levels["arch"] == "vit"}
    cell_runs = {
        k: client.create_run(exp, tags={KIND_TAG: "cell", "mlflow.parentRunId": study_run}).info.run_id for k in cells
    }
    sam = next(k for k in cells if "sam" in k)
    adamw = next(k for k in cells if "adamw" in k)
    first = _trial(exp, cell_runs[sam], "sam-first", 0.9, 0.05, uri=uri, cell=cells[sam])
    _trial(exp, cell_runs[sam], "sam-tied-later", 0.9, 0.4, uri=uri, cell=cells[sam])
    _trial(exp, cell_runs[sam], "sam-worse", 0.8, 0.01, uri=uri, cell=cells[sam])
    _trial(exp, cell_runs[adamw], "adamw", 0.85, None, uri=uri, cell=cells[adamw])
    roll_up(client, exp, study_run, cell_runs, cells, column="val_acc", mode="max", bests={})
    return study, exp, study_run, first


def test_the_answer_table_is_the_experiments_description_and_ties_go_to_the_first_trial(tracking_uri):
    from mlflow.tracking import MlflowClient

    study, exp, study_run, first = _recorded_study(tracking_uri)
    client = MlflowClient(tracking_uri)
    note = client.get_experiment(exp).tags["mlflow.note.content"]
    table, intro = note.split(RESULTS_MARKER)
    assert "Question:" in intro  # the study's own note stays, below the answer
    # The first line (all the UI shows of a description before a click) is analysis's answer to the study's
    # question, SAM's gain over AdamW per architecture; the best cell below it.
    from analysis.runs import trials_frame
    from analysis.tables import headline

    answer = headline(trials_frame(client, exp))
    first_line = note.splitlines()[0]
    assert first_line == answer[0] and first_line.startswith("vit: sam - adamw = +5.00 points")
    assert next(line for line in note.splitlines() if line.startswith("Best cell:")) == answer[-1]
    # MLflow's experiment list shows a description raw: its first line has no markdown and no HTML.
    assert not re.search(r"[*|<>`#]|(?<!\w)_|_(?!\w)", first_line), first_line
    assert "<!--" not in note.split(first_line, 1)[0]
    assert "4 of 5 trials ended" in table  # the vit cells: 4 SAM trials, 1 AdamW
    sam_row = next(line for line in table.splitlines() if line.startswith("- vit/sam"))
    # 0.9 on 360 samples: SE sqrt(0.9 * 0.1 / 360) = 0.0158; the tie at 0.9 goes to the trial that started first.
    assert "(the study's best): val_acc 0.9000 ± 0.016, rho=0.05; 3 of 4 trials finished;" in sam_row
    assert f"[sam-first](#/experiments/{exp}/runs/{first}?workflowType=machine_learning)" in sam_row
    assert "- vit/adamw: val_acc 0.8500 ± 0.019; 1 of 1 trials finished;" in table
    assert "|" not in table  # no table: its columns render with no space between them
    assert "(best.rho)" in intro and "<knob>" not in note  # a knob's column by its name, not an HTML-like tag
    assert client.get_run(study_run).data.tags["mlflow.note.content"] == table.strip()
    assert client.get_run(study_run).data.metrics["best.rho"] == 0.05  # the roll-up names the same trial
    # MLflow's saved-view envelope (listed under "Views" by its name), the view state inside it as a JSON string.
    saved = json.loads(client.get_experiment(exp).tags[f"mlflow.sharedViewState.{VIEW_KEY}"])
    assert (
        saved["name"] == VIEW_NAME and isinstance(saved["createdAt"], int) and saved["updatedAt"] >= saved["createdAt"]
    )
    view = json.loads(saved["state"])
    assert view["orderByKey"] == "metrics.`val_acc`" and "params.`optimizer.hparams.rho`" in view["selectedColumns"]


def test_view_state_names_are_the_installed_uis():
    # The opening view is read by the UI bundle: pin the names it uses (an MLflow upgrade that renames them fails
    # here instead of the page silently opening on its default view).
    import mlflow

    js = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    text = "".join(p.read_text(errors="ignore") for p in js.glob("*.js"))
    assert 'U="viewStateShareKey",$="mlflow.sharedViewState."' in text
    # The "Views" menu lists a tag whose value is this envelope (records.saved_view); the shared-view loader
    # reads the state out of it.
    assert "JSON.stringify({name:e,createdAt:i,updatedAt:a,state:t})" in text
    assert '"string"!==typeof i.name||"number"!==typeof i.createdAt||"string"!==typeof i.state' in text
    assert '["searchFilter","orderByKey","orderByAsc","startTime","lifecycleFilter","modelVersionFilter"' in text
    for key in ('"selectedColumns"', '"runsHiddenMode"', '"columnWidths"', 'SHOWALL="SHOW_ALL"', 'DATASET:"Dataset"'):
        assert key in text
    assert 'I=(e,t)=>e+".`"+t+"`"' in text  # the column key: metrics.`val_acc`
    # The chart view's cards and section (records.chart_state): shared-view keys, card fields, the section's name,
    # and the rule that a section marked reordered gets the metrics the view does not name appended, not sorted in.
    assert '"compareRunCharts","compareRunSections"' in text and 'MODEL_METRICS="Model metrics"' in text
    assert 'this.xaxis={key:"",type:"METRIC"}' in text and 'type:"PARAM"' in text
    assert "s=!!r&&r.isReordered,l={...p.getEmptyChartCardByType(a,!0,(0,o.yk)(),n),metricKey:e" in text
    assert 'this.type=c.LINE,this.metricKey="",this.selectedMetricKeys=void 0,this.lineSmoothness=0' in text
    # docs/screenshots.py expands the runs table's rows by this button and its plus icon.
    shots = _screenshots_module()
    assert shots.ROW_EXPANDER in text and shots.PLUS_ICON in text


def _screenshots_module():
    spec = importlib.util.spec_from_file_location("sharpscale_screenshots", REPO / "docs" / "screenshots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Whether an element whose text starts with %s is seen: inside the window and inside every clipping box around it.
_SEEN = """
(() => {
  const seen = e => { const r = e.getBoundingClientRect();
    if (!(r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight)) return false;
    for (let p = e.parentElement; p; p = p.parentElement) {
      if (getComputedStyle(p).overflow === 'visible') continue;
      const c = p.getBoundingClientRect();
      if (r.top < c.top || r.top + 12 > c.bottom) return false;  // its first line shows
    }
    return true; };
  return [...document.querySelectorAll('p, td, li')].filter(e => e.innerText.trim().startsWith(%s)).some(seen);
})()
"""
_EXPAND = """[...document.querySelectorAll('button')].filter(b =>
  b.dataset.componentId === 'mlflow.experiment.metadata_editor.expand_button').forEach(b => b.click()); true"""


def _shows(chrome, text: str, timeout_s: float = 120.0) -> bool:
    """Whether the page's text comes to contain `text` within `timeout_s` (the UI loads its data in steps)."""
    deadline = time.monotonic() + timeout_s
    while not chrome.evaluate(f"document.body.innerText.includes({json.dumps(text)})"):
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)
    return True


@pytest.mark.timeout(600)
def test_sharpscale_ui_prints_only_the_study_page_which_shows_the_answer(tmp_path, tracking_uri, cli_process):
    study, exp, _, _ = _recorded_study(tracking_uri)
    port = free_port()
    proc = cli_process.start(
        "ui",
        "--tracking-uri",
        tracking_uri,
        "--port",
        port,
        stderr=subprocess.PIPE,
        env={"PYTHONWARNINGS": "default"},  # a warning would show, were it not routed to the log
    )
    line = proc.stdout.readline().strip()  # printed once the UI answers
    base = f"http://127.0.0.1:{port}"
    page = f"{base}/#/experiments/{exp}/runs?workflowType=machine_learning&viewStateShareKey={VIEW_KEY}"
    assert line == f"MLflow UI: {page}  (Ctrl-C stops it)"
    url = f"{base}/api/2.0/mlflow/experiments/get?experiment_id={exp}"
    with urllib.request.urlopen(url, timeout=30) as resp:
        tags = {t["key"]: t["value"] for t in json.load(resp)["experiment"]["tags"]}
    answer = "vit: sam - adamw = +5.00 points (no interval for the gain: one run a side; sam 90.00"
    assert tags["mlflow.note.content"].startswith(answer)
    assert "- vit/sam (the study's best): val_acc 0.9000 ± 0.016, rho=0.05;" in tags["mlflow.note.content"]
    for _ in range(5):  # page views: their request lines must not reach the terminal
        urllib.request.urlopen(f"{base}/", timeout=30).read()

    has_browser = bool(shutil.which("chromium") or shutil.which("chromium-browser"))
    # The CI installs Chromium and sets this: there the browser's part cannot be skipped silently.
    assert has_browser or not os.environ.get("SHARPSCALE_REQUIRE_BROWSER"), "no chromium on PATH"
    if has_browser:
        chrome = _screenshots_module().Browser()
        try:
            chrome.open(page, shows=answer, timeout_s=300)
            chrome.shoot(tmp_path / "first_open.png")
            headline = json.dumps(answer)
            assert chrome.evaluate(_SEEN % headline), "the answer is not on the first screen"
            shots = _screenshots_module()
            # Every cell's row: one click on the description's expander.
            chrome.evaluate(_EXPAND)
            assert _shows(chrome, "vit/adamw")
            assert chrome.evaluate(_SEEN % json.dumps("vit/adamw: val_acc 0.8500")), "the cells are not shown expanded"
            # Every trial, as rows of the table, without a click (the rows come after the description).
            shown = _shows(chrome, "sam-tied-later")
            chrome.shoot(tmp_path / "expanded.png")
            assert shown, f"no trial row on the first open; see {tmp_path / 'first_open.png'}"
            assert "workflowType=genai" not in chrome.evaluate("location.href")
            # The chart view of the same view: the objective first, then the objective against rho, then the rest.
            chrome.open(f"{page}&compareRunsMode=CHART", shows="fixed_time_s")
            chrome.wait_for(shots.CHARTS_DRAWN)
            chrome.shoot(tmp_path / "charts.png")
            text = chrome.evaluate("document.body.innerText")
            charts = text[text.index("Model metrics") :] if "Model metrics" in text else text
            assert charts.index("val_acc") < charts.index("fixed_time_s"), charts[:400]
            assert "optimizer.hparams.rho" in charts.split("fixed_time_s", 1)[0], charts[:400]
            # MLflow's own nested table (study > cells > trials): docs/screenshots.py opens every row, as its
            # shot of that table shows them (the trials hide under collapsed rows until then).
            shots = _screenshots_module()
            chrome.open(f"{base}/#/experiments/{exp}/runs?workflowType=machine_learning", shows="Run Name")
            opened = 0
            for _ in range(4):
                clicked = chrome.evaluate(shots.EXPAND_ROWS) or 0
                opened += clicked
                if not clicked and _shows(chrome, "sam-tied-later", timeout_s=5):
                    break
                time.sleep(shots.SETTLE_S)
            assert opened >= 3 and _shows(chrome, "sam-tied-later"), f"{opened} rows expanded"
            # The report's links, shown from a blob: address of the UI's origin (as MLflow's artifact view shows
            # report.html), point at that origin, whatever address the report was written for.
            from analysis.report import report_html, run_link

            link = run_link("http://127.0.0.1:5000", exp, "abc")
            page_html = report_html(f"# R\n\n[open-this-trial]({link})\n", tmp_path)
            chrome.evaluate(
                f"location.href = URL.createObjectURL(new Blob([{json.dumps(page_html)}], {{type: 'text/html'}}))"
            )
            assert _shows(chrome, "open-this-trial")
            assert chrome.evaluate("document.querySelector('a').href") == run_link(base, exp, "abc")
        finally:
            chrome.close()

    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    group = os.getpgid(int(children[0]))
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert out.strip() == "" and err.strip() == "", (out, err)  # nothing but the address
    deadline = time.monotonic() + 60  # MLflow's workers can take a while to go on 2 busy cores
    while group_alive(group) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not group_alive(group)
    assert (tmp_path / "sharpscale.log").stat().st_size > 0  # where the server's output went
    assert "GET /" not in (tmp_path / "sharpscale.log").read_text()  # no access lines there either


def test_the_ui_side_is_chosen_by_the_browsers_storage_as_studies_ui_app_sets_it():
    # MLflow 3.17's UI ignores the experiment's kind tag (its flag for the side switch is on) and reads the side from
    # this storage entry, GenAI when it is absent: pin both, and the page `sharpscale ui` serves, to the bundle.
    import mlflow

    from studies.ui_app import WORKFLOW_STORAGE_KEY, index_html

    js = Path(mlflow.__file__).parent / "server" / "js" / "build"
    text = "".join(p.read_text(errors="ignore") for p in (js / "static" / "js").glob("main.*.js"))
    key, version = WORKFLOW_STORAGE_KEY.rsplit("_v", 1)
    assert f'key:"{key}",version:{version},initialValue:c' in text and "const o=(e,t)=>`${e}_v${t}`" in text
    assert 'e.MACHINE_LEARNING="machine_learning"' in text and "const c=l.GENAI" in text
    assert "const l=e=>{const{workflowType:t}=(0,a.B)(),n=(0,s.Z0)();return(0,r.useMemo)(()=>n?m(t):" in text
    page = index_html((js / "index.html").read_text(), ["7"])
    assert page.index('new Set(["7"])') < page.index("</head>") < page.index("<body>")
    assert page.index("<script>") > page.index('<meta charset="utf-8"/>')  # the charset stays first


@contextlib.contextmanager
def _serving(how: str, uri: str, tmp_path: Path, cli_process):
    """The MLflow UI over `uri` as `sharpscale ui` (`how` "ui") or `sharpscale server` ("server") serves it: yields
    its base address once it answers."""
    if how == "server":
        from studies.server import start_server

        artifacts = str(tmp_path / "served-artifacts")
        with start_server(backend_store_uri=uri, artifacts_destination=artifacts, log_path=tmp_path / "server.log") as (
            _,
            base,
        ):
            yield base
        return
    port = free_port()
    proc = cli_process.start("ui", "--tracking-uri", uri, "--port", port, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith("MLflow UI: ")
    yield f"http://127.0.0.1:{port}"


def _needs_browser() -> None:
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        assert not os.environ.get("SHARPSCALE_REQUIRE_BROWSER"), "no chromium on PATH"
        pytest.skip("no chromium on PATH")


def _on_the_view(chrome, name: str, tmp_path: Path) -> None:
    """The page `chrome` shows is the study's view on the model-training side: every trial, the objective's column,
    the view named under "Views"."""
    shown = _shows(chrome, "sam-tied-later", timeout_s=300)
    chrome.shoot(tmp_path / f"{name}.png")
    where = chrome.evaluate("location.href")
    assert shown, f"{name}: no trial row at {where}; see {tmp_path / name}.png"
    assert "workflowType=machine_learning" in where and f"viewStateShareKey={VIEW_KEY}" in where, where
    headers = chrome.evaluate("[...document.querySelectorAll('[role=columnheader]')].map(h => h.innerText)")
    assert any("val_acc" in h for h in headers), headers
    assert _shows(chrome, VIEW_NAME, timeout_s=30), "the view is not named in the Views menu"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("how", ["ui", "server"])
def test_every_way_into_a_study_lands_on_its_view_on_the_model_training_side(how, tmp_path, tracking_uri, cli_process):
    """A typed `/#/experiments/<id>` and a click on the experiment in MLflow's list, in a new browser, open the
    study's runs table (every trial, the objective's column) on the model-training side, its view named under
    "Views", in the UI of `sharpscale ui` and of `sharpscale server` alike; the Default experiment, which has no
    view, opens MLflow's own runs page on that side."""
    _needs_browser()
    study, exp, _, _ = _recorded_study(tracking_uri)
    shots = _screenshots_module()
    with _serving(how, tracking_uri, tmp_path, cli_process) as base:
        chrome = shots.Browser()
        try:
            chrome.open(f"{base}/#/experiments/{exp}", shows="sam-tied-later", timeout_s=300)
            _on_the_view(chrome, "typed", tmp_path)
            chrome.open(f"{base}/#/experiments", shows=study.experiment_name, timeout_s=300)
            chrome.evaluate(
                f"[...document.querySelectorAll('a')].filter(a => a.innerText.trim() === "
                f"{json.dumps(study.experiment_name)})[0].click(); true"
            )
            _on_the_view(chrome, "clicked", tmp_path)
            chrome.open(f"{base}/#/experiments/0", shows="Run Name", timeout_s=300)
            where = chrome.evaluate("location.href")
            assert "/experiments/0/runs" in where and "workflowType=machine_learning" in where, where
            assert "viewStateShareKey" not in where
        finally:
            chrome.close()


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.timeout(900)
def test_a_store_from_before_the_views_envelope_opens_on_its_view_and_is_not_written(
    tmp_path, new_mlflow_store, cli_process
):
    """A store whose view tag is the bare view state (written before the tag held MLflow's envelope, until a
    `resume` rewrites it): `sharpscale ui` opens the study on its view, listed under "Views", and leaves the store
    as it was, byte for byte, with no file added but the UI's own log."""
    from mlflow.tracking import MlflowClient

    from studies.records import VIEW_TAG, view_state

    _needs_browser()
    store = tmp_path / "old"
    uri = new_mlflow_store(store / "mlflow.db")
    study, exp, _, _ = _recorded_study(uri, artifacts=store / "mlartifacts")
    MlflowClient(uri).set_experiment_tag(exp, VIEW_TAG, json.dumps(view_state(study)))  # as 7c2d88f wrote it
    before = _files(store)
    shots = _screenshots_module()
    with _serving("ui", uri, tmp_path, cli_process) as base:
        chrome = shots.Browser()
        try:
            chrome.open(f"{base}/#/experiments/{exp}", shows="sam-tied-later", timeout_s=300)
            _on_the_view(chrome, "old_store", tmp_path)
        finally:
            chrome.close()
    after = _files(store)
    after.pop(LOG_FILE)  # the server's output (tests above): written by `ui` beside the store, never into it
    assert after.keys() == before.keys() and after == before, sorted(set(after) ^ set(before))


@pytest.mark.timeout(600)
def test_an_exported_store_travels_report_and_ui_work_on_the_copy_alone(tmp_path, new_mlflow_store, cli_process):
    from mlflow.tracking import MlflowClient

    from studies.cli import main

    original = tmp_path / "original"
    uri = new_mlflow_store(original / "mlflow.db")
    study, exp, study_run, first = _recorded_study(uri, artifacts=original / "mlartifacts")
    MlflowClient(uri).log_text(first, "kept with the trial", "note.txt")
    assert MlflowClient(uri).get_experiment(exp).artifact_location.startswith(original.as_uri())

    copy = tmp_path / "elsewhere" / "store"
    assert main(["export", str(copy), "--tracking-uri", uri]) == 0
    shutil.rmtree(original)  # the copy must need nothing of it
    copied = f"sqlite:///{copy / 'mlflow.db'}"
    client = MlflowClient(copied)
    assert client.get_experiment(exp).artifact_location.startswith(copy.as_uri())
    assert Path(client.download_artifacts(first, "note.txt", str(tmp_path))).read_text() == "kept with the trial"

    out = tmp_path / "report"
    assert main(["report", str(REPO / "studies" / "quickstart.yaml"), "--tracking-uri", copied, "--out", str(out)]) == 0
    assert (out / "summary.md").is_file()
    logged = [a.path for a in client.list_artifacts(study_run, "report")]
    assert "report/summary.md" in logged and (copy / "mlartifacts").is_dir()
    assert not original.exists()  # the report wrote into the copy, not back into the original's folders

    port = free_port()
    proc = cli_process.start("ui", "--tracking-uri", copied, "--port", port, stderr=subprocess.PIPE)
    line = proc.stdout.readline().strip()
    assert f"/#/experiments/{exp}/runs?" in line, line
    base = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(f"{base}/get-artifact?path=note.txt&run_uuid={first}", timeout=60) as resp:
        assert resp.read().decode() == "kept with the trial"  # what the UI's artifact view fetches


def test_status_names_each_cells_best_trial_and_knob_as_the_page_does(tracking_uri, capsys):
    from studies.cli import main

    _recorded_study(tracking_uri)
    capsys.readouterr()
    assert main(["status", str(REPO / "studies" / "quickstart.yaml"), "--tracking-uri", tracking_uri]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "best rho" in line)
    sam = next(line for line in out.splitlines() if line.startswith("vit/sam "))
    # The tie at 0.9 goes to the trial that started first (rho 0.05), as on the study page and in the roll-up.
    assert header.index("best rho") > header.index("best val_acc") and sam.split()[-2:] == ["0.05", "4"]


def test_status_prints_the_standard_error_beside_each_cells_best_value(tracking_uri, capsys):
    import warnings

    import pandas as pd

    from studies.cli import main

    _recorded_study(tracking_uri)
    capsys.readouterr()
    with warnings.catch_warnings():  # the table of text and numbers, built without pandas' dtype warnings
        warnings.simplefilter("error", pd.errors.PandasChangeWarning)
        assert main(["status", str(REPO / "studies" / "quickstart.yaml"), "--tracking-uri", tracking_uri]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "best val_acc" in line)
    # Right after the value, as the summary and the study page state it: 0.9 on 360 samples, sqrt(.9 .1 / 360).
    assert header.index("± SE") > header.index("best val_acc") and header.index("± SE") < header.index("best rho")
    sam = next(line for line in out.splitlines() if line.startswith("vit/sam "))
    adamw = next(line for line in out.splitlines() if line.startswith("vit/adamw "))
    assert "0.9 0.01581 0.05" in " ".join(sam.split()) and "0.85 0.01882" in " ".join(adamw.split())
    # A cell with no finished trial has no value and no SE: '-', not a count of 0.
    mixer = next(line for line in out.splitlines() if line.startswith("mixer/sam "))
    assert mixer.split()[-4:-1] == ["-", "-", "-"]


def test_export_counts_the_experiments_the_list_shows_not_the_hidden_launch_claims(tmp_path, new_mlflow_store):
    from mlflow.tracking import MlflowClient

    from studies.export import export_store
    from studies.identity import claim_launch, claim_name

    uri = new_mlflow_store(tmp_path / "original" / "mlflow.db")
    client = MlflowClient(uri)
    client.create_experiment("quickstart")
    claim_launch(client, "quickstart", 1)  # a deleted experiment that keeps launch 1 taken
    shown = len(client.search_experiments())  # Default and quickstart
    done = export_store(uri, tmp_path / "copy")
    assert done.experiments == shown == 2
    copied = MlflowClient(done.tracking_uri)
    assert copied.get_experiment_by_name(claim_name("quickstart", 1)) is not None  # still taken in the copy
