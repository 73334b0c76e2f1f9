"""Screenshots of the MLflow UI (and optuna-dashboard) over a finished study, taken by a real headless Chromium.

What a user sees after `sharpscale run`, saved to docs/img/ and shown in docs/ui.md: the page `sharpscale ui` opens
(the answer, every trial), its description expanded, MLflow's nested runs table (study > cells > trials, every row
expanded), the chart view, a cell's run, a trial's run, `sharpscale report`'s page in MLflow's artifact view and
its whole-study view (when the report has run), and optuna-dashboard's page of one cell. Needs `chromium` on PATH
(Debian: `apt-get install chromium`).

    python docs/screenshots.py --tracking-uri sqlite:///mlflow.db --study quickstart [--out docs/img]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlflow.tracking import MlflowClient

from analysis.report import HTML_REPORT
from analysis.runs import UI_WORKFLOW
from studies.records import BEST_RUN_ID_TAG
from studies.server import free_port, stop_process_group
from trainables.naming import KIND_TAG
from trainables.tracking import resolve_tracking_uri

WINDOW = "1600,1000"
RENDER_S = 180.0  # the UI's bundle is large: on a busy 2-core machine its first render takes a minute
# MLflow 3.17's row expander in the runs table: the run name cell's icon button, a plus while the row is collapsed
# (a minus once open). Clicks every collapsed one and returns how many, so the caller repeats it as nested rows
# (the cells under the study, the trials under each cell) appear. Pinned in tests/studies/test_study_page.py.
ROW_EXPANDER = "runnamecellrenderer.tsx_46"
PLUS_ICON = "M7.25 7.25V4.5h1.5v2.75h2.75v1.5H8.75v2.75h-1.5V8.75H4.5v-1.5z"
EXPAND_ROWS = f"""
(() => {{ const plus = [...document.querySelectorAll('button')].filter(b =>
  (b.dataset.componentId || '').endsWith('{ROW_EXPANDER}') &&
  [...b.querySelectorAll('path')].some(p => p.getAttribute('d') === '{PLUS_ICON}'));
  plus.forEach(b => b.click()); return plus.length; }})()
"""
EXPAND_DESCRIPTION = """
[...document.querySelectorAll('button')].filter(b =>
  b.dataset.componentId === 'mlflow.experiment.metadata_editor.expand_button').forEach(b => b.click()); true
"""
CLOSE_ASSISTANT = """
[...document.querySelectorAll('button')].filter(b => /close/i.test(b.getAttribute('aria-label') || ''))
  .forEach(b => b.click()); true
"""
ML = UI_WORKFLOW  # MLflow 3.17's model-training side (analysis.runs)
# The chart view draws each chart (plotly) after its data arrive: the first three drawn.
CHARTS_DRAWN = "document.querySelectorAll('.js-plotly-plot .main-svg').length >= 3"
# Scrolls the heading whose text is %s to the top of the window.
SCROLL_TO = """[...document.querySelectorAll('h2')].filter(h => h.innerText.trim() === %s)
  .forEach(h => h.scrollIntoView({block: 'start'})); true"""
SETTLE_S = 3.0  # after the awaited text shows, for the rest of the page (charts) to draw


def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise SystemExit("docs/screenshots.py: no Chromium on PATH. Fix: apt-get install chromium (Debian/Ubuntu).")


class Browser:
    """A headless Chromium driven over the DevTools protocol (aiohttp's websocket client): open a page, wait until
    it shows what it should, run a script (a click), take a screenshot."""

    def __init__(self, window: str = WINDOW):
        self._profile = tempfile.TemporaryDirectory(prefix="sharpscale-chromium-")
        self.port = free_port()
        self._proc = subprocess.Popen(
            [
                browser(),
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                f"--user-data-dir={self._profile.name}",
                f"--window-size={window}",
                f"--remote-debugging-port={self.port}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._loop = asyncio.new_event_loop()
        self._ids = 0
        self._loop.run_until_complete(self._connect())

    async def _connect(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession()
        deadline = time.monotonic() + 60
        while True:
            try:
                async with self._session.get(f"http://127.0.0.1:{self.port}/json/list") as resp:
                    pages = [t for t in await resp.json() if t.get("type") == "page"]
                if pages:
                    break
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("docs/screenshots.py: Chromium's DevTools endpoint did not come up within 60 s")
            await asyncio.sleep(0.5)
        self._ws = await self._session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)

    async def _call(self, method: str, **params):
        self._ids += 1
        await self._ws.send_json({"id": self._ids, "method": method, "params": params})
        while True:
            msg = await self._ws.receive_json()
            if msg.get("id") == self._ids:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def call(self, method: str, **params):
        return self._loop.run_until_complete(self._call(method, **params))

    def evaluate(self, script: str):
        return self.call("Runtime.evaluate", expression=script, returnByValue=True).get("result", {}).get("value")

    def open(self, url: str, *, shows: str, timeout_s: float = RENDER_S) -> None:
        """Navigate to `url` and wait until the page's text contains `shows` (the UI loads its data after)."""
        # A fresh document each time: MLflow's page, moved by a change of its hash alone (the runs page with and
        # without the shared view), stayed on its loading skeleton for minutes.
        self.call("Page.navigate", url="about:blank")
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout_s
        while not self.evaluate(f"document.body && document.body.innerText.includes({shows!r})"):
            if time.monotonic() > deadline:
                print(f"warning: {url} did not show {shows!r} within {timeout_s:.0f} s; shooting it as it is")
                break
            time.sleep(1.0)
        time.sleep(SETTLE_S)

    def wait_for(self, script: str, timeout_s: float = RENDER_S) -> bool:
        """Wait until `script` evaluates true in the page (False, with a warning, after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while not self.evaluate(script):
            if time.monotonic() > deadline:
                print(f"warning: {script.strip()[:60]!r} not true within {timeout_s:.0f} s; shooting it as it is")
                return False
            time.sleep(1.0)
        time.sleep(SETTLE_S)
        return True

    def shoot(self, out: Path) -> Path:
        import base64

        data = self.call("Page.captureScreenshot", format="png")["data"]
        out.write_bytes(base64.b64decode(data))
        print(f"{out}", flush=True)
        return out

    def close(self) -> None:
        self._loop.run_until_complete(self._ws.close())
        self._loop.run_until_complete(self._session.close())
        self._loop.close()
        # Every process of Chromium's group, not its first one only: a child left writing into the profile made
        # its removal fail ("Directory not empty: 'Default'", a loaded 2-core machine).
        stop_process_group(self._proc, timeout_s=30)
        self._profile.cleanup()


@contextlib.contextmanager
def _sharpscale_ui(uri: str, log_path: Path, timeout_s: float = 900.0):
    """The MLflow UI as `sharpscale ui` serves it (studies.ui_app) over `uri`, on a free loopback port: yields its
    address once it answers; stopped with its workers on exit."""
    import urllib.error
    import urllib.request

    port = free_port()
    cmd = [sys.executable, "-m", "studies.ui_app", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--workers", "1", "--uvicorn-opts", "--no-access-log"]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the MLflow UI did not answer on {base}; see {log_path}") from None
                time.sleep(0.5)
        yield base
    finally:
        stop_process_group(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    ap.add_argument("--study", default="quickstart", help="the study's experiment name (a smoke run's ends in -smoke)")
    ap.add_argument("--optuna-storage", default=None, help="also shoot optuna-dashboard over this Optuna storage")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "img"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    uri = resolve_tracking_uri(args.tracking_uri)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(args.study)
    if exp is None:
        raise SystemExit(f"no experiment {args.study!r} at {uri}; run the study first (sharpscale run ...)")
    eid = exp.experiment_id

    def of_kind(kind: str):
        return client.search_runs([eid], filter_string=f"tags.`{KIND_TAG}` = '{kind}'", max_results=1000)

    study_run = of_kind("study")[0]
    best_trial = study_run.data.tags.get(BEST_RUN_ID_TAG)
    cells = of_kind("cell")
    best_cell = next(
        (
            c
            for c in cells
            if c.info.run_id == (client.get_run(best_trial).data.tags.get("mlflow.parentRunId") if best_trial else None)
        ),
        cells[0] if cells else None,
    )

    best_name = client.get_run(best_trial).info.run_name if best_trial else None
    cell_name = best_cell.info.run_name if best_cell is not None else None
    chrome = Browser()
    try:
        with (
            tempfile.TemporaryDirectory(prefix="sharpscale-shots-") as tmp,
            _sharpscale_ui(uri, Path(tmp) / "server.log") as base,
        ):
            # The runs table: the study run first; its rows expanded show the cells, each with its best.
            # MLflow 3.17's side bar switches between GenAI and model training, per browser (GenAI by default,
            # whatever the experiment's kind): choose model training once, as a user would.
            # The first open: the experiment's bare address typed into a new browser, which `sharpscale ui` opens
            # as the page it prints (the answer's line, every trial best first); then its description expanded.
            chrome.open(f"{base}/#/experiments/{eid}", shows="Run Name")
            print(f"typed /#/experiments/{eid} opened {chrome.evaluate('location.href')}")
            time.sleep(4 * SETTLE_S)  # the table's rows come after its header
            chrome.shoot(out / "mlflow_first_open.png")
            chrome.evaluate(CLOSE_ASSISTANT)
            chrome.evaluate(EXPAND_DESCRIPTION)
            time.sleep(SETTLE_S)
            chrome.shoot(out / "mlflow_answer.png")
            chrome.evaluate(EXPAND_DESCRIPTION)  # closed again: the browser keeps it as it was left, on every page
            time.sleep(SETTLE_S)
            # MLflow's own nested table (study > cells > trials), rows expanded.
            chrome.open(f"{base}/#/experiments/{eid}/runs?{ML}", shows="Run Name")
            time.sleep(4 * SETTLE_S)
            expanded = 0
            for _ in range(4):  # the study's row, then its cells' rows, as each level appears
                clicked = chrome.evaluate(EXPAND_ROWS) or 0
                expanded += clicked
                time.sleep(SETTLE_S)
                if not clicked:
                    break
            print(f"runs table: {expanded} rows expanded")
            chrome.shoot(out / "mlflow_runs.png")
            chrome.open(f"{base}/#/experiments/{eid}/runs?compareRunsMode=CHART&{ML}", shows="val_acc")
            chrome.wait_for(CHARTS_DRAWN)
            chrome.shoot(out / "mlflow_charts.png")
            if best_cell is not None:
                chrome.open(f"{base}/#/experiments/{eid}/runs/{best_cell.info.run_id}?{ML}", shows="best.val_acc")
                chrome.shoot(out / "mlflow_cell_run.png")
            if best_trial:
                chrome.open(f"{base}/#/experiments/{eid}/runs/{best_trial}/model-metrics?{ML}", shows="val_acc")
                chrome.shoot(out / "mlflow_trial_run.png")
            report = [a.path for a in client.list_artifacts(study_run.info.run_id, "report")]
            if f"report/{HTML_REPORT}" in report:
                # `sharpscale report`'s page as MLflow's artifact view shows it (a sandboxed frame of the UI's own
                # origin), then the same file alone, at its whole-study view (parallel coordinates, importance).
                where = f"#/experiments/{eid}/runs/{study_run.info.run_id}/artifactPath/report/{HTML_REPORT}?{ML}"
                chrome.open(f"{base}/{where}", shows=HTML_REPORT)
                time.sleep(4 * SETTLE_S)  # the frame loads after the artifact list
                chrome.shoot(out / "mlflow_report.png")
                page = client.download_artifacts(study_run.info.run_id, f"report/{HTML_REPORT}", tmp)
                chrome.open(Path(page).resolve().as_uri(), shows="The whole study")
                chrome.evaluate(SCROLL_TO % json.dumps("The whole study: every trial"))
                time.sleep(SETTLE_S)
                chrome.shoot(out / "report_whole_study.png")

        if args.optuna_storage:
            import threading

            import optuna_dashboard

            from studies.search import open_optuna_storage

            port = free_port()
            storage = open_optuna_storage(args.optuna_storage)
            threading.Thread(
                target=optuna_dashboard.run_server,
                args=(storage,),
                kwargs={"host": "127.0.0.1", "port": port},
                daemon=True,
            ).start()
            chrome.open(f"http://127.0.0.1:{port}/dashboard", shows="sam")
            chrome.shoot(out / "optuna_dashboard.png")
            wanted = f":{best_cell.data.tags.get('sharpscale.cell')}" if best_cell is not None else "sam"
            studies = [st for st in storage.get_all_studies() if st.study_name.endswith(wanted)] or [
                st for st in storage.get_all_studies() if "sam" in st.study_name
            ]
            if studies:
                sid = storage.get_study_id_from_name(studies[0].study_name)
                chrome.open(f"http://127.0.0.1:{port}/dashboard/studies/{sid}", shows="History")
                chrome.shoot(out / "optuna_cell.png")
    finally:
        chrome.close()
    print(f"best cell {cell_name}, best trial {best_name}")


if __name__ == "__main__":
    main()
