"""The MLflow UI as `sharpscale ui` and `sharpscale server` serve it: MLflow's own server and app, whose page opens
every way into a study (a typed `/#/experiments/<id>`, the experiment list, a breadcrumb) on the study's view, on the
model-training side.

MLflow 3.17's UI takes its side (GenAI or model training) from the browser's storage, GenAI in a new browser,
whatever the experiment's kind tag says, and the address after `#` never reaches a server: only a script in the page
can pick. `python -m studies.ui_app ui ARGS` runs `mlflow ui ARGS`, `python -m studies.ui_app server ARGS` runs
`mlflow server ARGS` (its basic-auth app too), with this module's app in MLflow's place.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Iterable, Sequence

from analysis.runs import UI_WORKFLOW
from studies.records import VIEW_KEY, VIEW_TAG, enveloped_view

__all__ = [
    "ASGI_APP",
    "AUTH_ASGI_APP",
    "COMMANDS",
    "MLFLOW_ASGI_APP",
    "MLFLOW_AUTH_APP",
    "WORKFLOW_STORAGE_KEY",
    "create_auth_app",
    "envelope_views",
    "index_html",
    "main",
    "page_script",
]

ASGI_APP = "studies.ui_app:app"
AUTH_ASGI_APP = "studies.ui_app:create_auth_app"
# What `mlflow ui` / `mlflow server` serve (mlflow.server._run_server, with uvicorn), and `--app-name basic-auth`
# (MLflow's entry point, a factory): replaced by ours, which wrap them.
MLFLOW_ASGI_APP = "mlflow.server.fastapi_app:app"
MLFLOW_AUTH_APP = "mlflow.server.auth:create_app"
_OURS = {MLFLOW_ASGI_APP: ASGI_APP, MLFLOW_AUTH_APP: AUTH_ASGI_APP}
# The MLflow commands `main` runs.
COMMANDS = ("ui", "server")
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


def envelope_views(data: object, created: int = 0) -> bool:
    """Every view tag (`{"key": VIEW_TAG, "value": ...}`) in the decoded JSON `data` whose value is a bare view
    state (a store written before the envelope) given as records.enveloped_view has it, in place, created at the
    creation time of the experiment that holds it (`creation_time` or GraphQL's `creationTime`, else `created`).
    Returns whether any changed."""
    changed = False
    if isinstance(data, list):
        for item in data:
            changed = envelope_views(item, created) | changed
    elif isinstance(data, dict):
        at = data.get("creation_time", data.get("creationTime", created))
        try:
            at = int(at)
        except (TypeError, ValueError):
            at = created
        if data.get("key") == VIEW_TAG and isinstance(data.get("value"), str):
            if (value := enveloped_view(data["value"], at)) is not None:
                data["value"] = value
                changed = True
        for item in data.values():
            changed = envelope_views(item, at) | changed
    return changed


# The readers of experiments' tags in MLflow 3.17's UI: its REST calls (experiments/get, get-by-name, search) and
# GraphQL (mlflowGetExperiment).
_EXPERIMENT_READS = ("/mlflow/experiments/get", "/mlflow/experiments/get-by-name", "/mlflow/experiments/search")


def _envelope_bare_views(response):
    """A store written before the view's envelope opens on its view, listed under "Views", as one written since
    does: the answer carries the envelope, and nothing is written into the store (opening a store reads only;
    `sharpscale resume` rewrites the tag)."""
    import json

    from flask import request

    path = request.path.rstrip("/")
    if not (path.endswith(_EXPERIMENT_READS) or path.endswith("/graphql")) or response.mimetype != "application/json":
        return response
    if VIEW_TAG.encode() not in response.get_data():
        return response
    data = json.loads(response.get_data())
    if envelope_views(data):
        response.set_data(json.dumps(data))
    return response


@functools.cache
def _serve_study_pages() -> None:
    """MLflow's Flask app, which both MLflow's FastAPI app and its basic-auth app wrap, serving the page with
    `page_script` and the views of old stores enveloped."""
    from mlflow.server import app as flask_app

    if "serve" not in flask_app.view_functions:
        raise RuntimeError("MLflow's app has no 'serve' view (its index.html): studies.ui_app needs MLflow 3.17")
    flask_app.view_functions["serve"] = _serve_index
    flask_app.after_request(_envelope_bare_views)


@functools.cache
def _app():
    from mlflow.server.fastapi_app import app

    _serve_study_pages()
    return app


def create_auth_app():
    """MLflow's basic-auth app (`mlflow server --app-name basic-auth`, a factory uvicorn calls) serving the page
    as `app` does."""
    from mlflow.server.auth import create_app

    app = create_app()
    _serve_study_pages()
    return app


def __getattr__(name: str):
    # Built on first use (uvicorn's import of ASGI_APP in each worker), not when the launcher imports this module.
    if name == "app":
        return _app()
    raise AttributeError(name)


def main(argv: Sequence[str]) -> None:
    """`mlflow COMMAND ARGS` for ARGV = [COMMAND, *ARGS], COMMAND one of COMMANDS, serving our app (ASGI_APP,
    AUTH_ASGI_APP) instead of MLflow's."""
    import mlflow.server
    from mlflow.cli import cli

    if not argv or argv[0] not in COMMANDS:
        raise SystemExit(f"usage: python -m studies.ui_app {{{','.join(COMMANDS)}}} [mlflow options]; got {argv!r}")
    build = mlflow.server._build_uvicorn_command

    def ours(uvicorn_opts, host, port, workers, app_name, *args, **kwargs):
        if app_name not in _OURS:
            raise RuntimeError(f"mlflow serves {app_name!r}, not one of {sorted(_OURS)}: studies.ui_app needs 3.17")
        return build(uvicorn_opts, host, port, workers, _OURS[app_name], *args, **kwargs)

    def refused(*args, **kwargs):
        # Another server than uvicorn would serve MLflow's own page, silently on the GenAI side.
        raise SystemExit("studies.ui_app serves MLflow's UI through uvicorn only: drop --gunicorn-opts/--waitress-opts")

    mlflow.server._build_uvicorn_command = ours
    mlflow.server._build_gunicorn_command = refused
    mlflow.server._build_waitress_command = refused
    cli.main(args=list(argv), prog_name="mlflow")


if __name__ == "__main__":
    main(sys.argv[1:])
