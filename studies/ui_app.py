"""The MLflow UI as `sharpscale ui` serves it: MLflow's own server and app, whose page opens every way into a study
(a typed `/#/experiments/<id>`, the experiment list, a breadcrumb) on the study's view, on the model-training side.

MLflow 3.17's UI takes its side (GenAI or model training) from the browser's storage, GenAI in a new browser,
whatever the experiment's kind tag says, and the address after `#` never reaches a server: only a script in the page
can pick. `python -m studies.ui_app ARGS` runs `mlflow ui ARGS` with this module's `app` in MLflow's place.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Iterable, Sequence

from analysis.runs import UI_WORKFLOW
from studies.records import VIEW_KEY, VIEW_TAG

__all__ = ["ASGI_APP", "MLFLOW_ASGI_APP", "WORKFLOW_STORAGE_KEY", "index_html", "main", "page_script"]

ASGI_APP = "studies.ui_app:app"
# What `mlflow ui` serves (mlflow.server._run_server, with uvicorn): replaced by ASGI_APP, which wraps it.
MLFLOW_ASGI_APP = "mlflow.server.fastapi_app:app"
# The browser storage entry that holds the UI's side (its useLocalStorage: `${key}_v${version}`, a JSON value),
# pinned with the side's value by tests/studies/test_study_page.py against the installed bundle.
WORKFLOW_STORAGE_KEY = "mlflow.workflowType_v1"
_MODEL_TRAINING = UI_WORKFLOW.split("=", 1)[1]

# Runs before MLflow's bundle (a deferred script). A new browser gets the model-training side (a side the user picks
# later is kept). An experiment's bare address opens, for a study with the saved view, its runs page on that view:
# typed into a new tab, rewritten before the app reads it; reached inside the app (the list's link and the breadcrumb
# push it, a hash typed into an open tab pops it), rewritten and the page loaded again, as typed. The app's router
# does not take a new address mid-way: its redirect to the runs page, then its own address updates, wrote the view
# out again each time the script changed the address without a load (headless Chromium, MLflow 3.17.2).
_SCRIPT = r"""<script>(() => {
  const views = new Set(%(views)s);
  try {
    if (localStorage.getItem(%(storage)s) === null) localStorage.setItem(%(storage)s, %(side)s);
  } catch (e) {}
  const study = (hash) => {
    const m = /^#\/experiments\/([0-9]+)\/?$/.exec(hash);
    return m && views.has(m[1]) ? `#/experiments/${m[1]}/runs?%(workflow)s&viewStateShareKey=%(key)s` : null;
  };
  const replace = history.replaceState.bind(history);
  const push = history.pushState.bind(history);
  const first = study(location.hash);
  if (first) replace(history.state, "", first);
  history.pushState = (state, title, url) => {
    const to = url == null ? null : study(new URL(url, location.href).hash);
    if (!to) return push(state, title, url);
    push(null, "", to);
    location.reload();
  };
  addEventListener("popstate", () => {
    const to = study(location.hash);
    if (to) {
      replace(null, "", to);
      location.reload();
    }
  });
})();</script>"""


def page_script(view_experiments: Iterable[str]) -> str:
    """The `<script>` that `index_html` puts into MLflow's page; `view_experiments`: the ids of the experiments
    that hold the study view (records.VIEW_TAG)."""
    return _SCRIPT % {
        "views": json.dumps(sorted(str(e) for e in view_experiments)),
        "storage": json.dumps(WORKFLOW_STORAGE_KEY),
        "side": json.dumps(json.dumps(_MODEL_TRAINING)),
        "workflow": UI_WORKFLOW,
        "key": VIEW_KEY,
    }


def index_html(page: str, view_experiments: Iterable[str]) -> str:
    """MLflow's index.html `page` with `page_script` at the end of its head (before the deferred bundle runs)."""
    at = page.find("</head>")
    if at < 0:
        raise ValueError("MLflow's index.html has no </head>: this MLflow's UI is not the one studies.ui_app knows")
    return page[:at] + page_script(view_experiments) + page[at:]


def _view_experiments() -> list[str]:
    from mlflow.entities import ViewType
    from mlflow.server.handlers import _get_tracking_store

    found = _get_tracking_store().search_experiments(
        view_type=ViewType.ACTIVE_ONLY, max_results=50000, filter_string=f"tags.`{VIEW_TAG}` LIKE '%'"
    )
    return [e.experiment_id for e in found]


def _serve_index():
    from pathlib import Path

    from flask import Response
    from mlflow.server import app as flask_app

    page = (Path(flask_app.static_folder) / "index.html").read_text()
    # Never cached: which experiments hold the view changes as studies run.
    return Response(index_html(page, _view_experiments()), mimetype="text/html", headers={"Cache-Control": "no-store"})


@functools.cache
def _app():
    from mlflow.server import app as flask_app
    from mlflow.server.fastapi_app import app

    if "serve" not in flask_app.view_functions:
        raise RuntimeError("MLflow's app has no 'serve' view (its index.html): studies.ui_app needs MLflow 3.17")
    flask_app.view_functions["serve"] = _serve_index
    return app


def __getattr__(name: str):
    # Built on first use (uvicorn's import of ASGI_APP in each worker), not when the launcher imports this module.
    if name == "app":
        return _app()
    raise AttributeError(name)


def main(argv: Sequence[str]) -> None:
    """`mlflow ui ARGV`, serving ASGI_APP instead of MLFLOW_ASGI_APP."""
    import mlflow.server
    from mlflow.cli import cli

    build = mlflow.server._build_uvicorn_command

    def ours(uvicorn_opts, host, port, workers, app_name, *args, **kwargs):
        if app_name != MLFLOW_ASGI_APP:
            raise RuntimeError(f"mlflow ui serves {app_name!r}, not {MLFLOW_ASGI_APP!r}: studies.ui_app needs 3.17")
        return build(uvicorn_opts, host, port, workers, ASGI_APP, *args, **kwargs)

    mlflow.server._build_uvicorn_command = ours
    cli.main(args=["ui", *argv], prog_name="mlflow")


if __name__ == "__main__":
    main(sys.argv[1:])
