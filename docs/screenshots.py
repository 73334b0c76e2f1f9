"""Screenshots of the MLflow UI (and optuna-dashboard) over a finished study, taken by a real headless Chromium.

What a user sees after `sharpscale run`, saved to docs/img/ and shown in docs/ui.md: the experiment's runs page
(study > cells > trials, each cell's best value and knob on its row), a cell's run, a trial's run, the chart view,
and optuna-dashboard's page of one cell. Needs `chromium` on PATH (Debian: `apt-get install chromium`).

    python docs/screenshots.py --tracking-uri sqlite:///mlflow.db --study quickstart [--out docs/img]
"""

from __future__ import annotations

import argparse
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

from studies.records import BEST_RUN_ID_TAG
from studies.server import free_port, start_server
from trainables.tracking import KIND_TAG, resolve_tracking_uri

WINDOW = "1600,1000"
# Chromium's virtual time runs while the page is busy; the UI's API calls are real ones and need wall time too.
RENDER_MS = 25_000


def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise SystemExit("docs/screenshots.py: no Chromium on PATH. Fix: apt-get install chromium (Debian/Ubuntu).")


def shoot(url: str, out: Path, *, window: str = WINDOW) -> Path:
    """One screenshot of `url` after it rendered, by headless Chromium in a fresh profile."""
    with tempfile.TemporaryDirectory(prefix="sharpscale-chromium-") as profile:
        subprocess.run(
            [browser(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={window}",
             f"--virtual-time-budget={RENDER_MS}", f"--screenshot={out}", url],
            check=True, capture_output=True, timeout=180,
        )
    print(f"{out}  <- {url}", flush=True)
    return out


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
    best_cell = next((c for c in cells if c.info.run_id == (client.get_run(best_trial).data.tags.get("mlflow.parentRunId")
                                                             if best_trial else None)), cells[0] if cells else None)

    with tempfile.TemporaryDirectory(prefix="sharpscale-shots-") as tmp, start_server(
        backend_store_uri=uri, artifacts_destination=str(Path(tmp) / "artifacts"), log_path=Path(tmp) / "server.log"
    ) as (_, base):
        shoot(f"{base}/#/experiments/{eid}/runs", out / "mlflow_runs.png")
        shoot(f"{base}/#/experiments/{eid}/runs?compareRunsMode=CHART", out / "mlflow_charts.png")
        if best_cell is not None:
            shoot(f"{base}/#/experiments/{eid}/runs/{best_cell.info.run_id}", out / "mlflow_cell_run.png")
        if best_trial:
            shoot(f"{base}/#/experiments/{eid}/runs/{best_trial}/model-metrics", out / "mlflow_trial_run.png")

    if args.optuna_storage:
        import threading

        import optuna_dashboard

        from studies.search import open_optuna_storage

        port = free_port()
        threading.Thread(
            target=optuna_dashboard.run_server, args=(open_optuna_storage(args.optuna_storage),),
            kwargs={"host": "127.0.0.1", "port": port}, daemon=True,
        ).start()
        time.sleep(3)
        shoot(f"http://127.0.0.1:{port}/dashboard", out / "optuna_dashboard.png")
        storage = open_optuna_storage(args.optuna_storage)
        searched = [s for s in storage.get_all_studies() if "sam" in s.study_name]
        if searched:
            study_id = storage.get_study_id_from_name(searched[0].study_name)
            shoot(f"http://127.0.0.1:{port}/dashboard/studies/{study_id}", out / "optuna_cell.png")
            shoot(f"http://127.0.0.1:{port}/dashboard/studies/{study_id}/trials", out / "optuna_trials.png")


if __name__ == "__main__":
    main()
