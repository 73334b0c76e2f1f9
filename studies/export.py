"""`sharpscale export`: a local MLflow store (SQLite file and artifact folders) copied into one folder that travels,
its artifact locations rewritten to the copy's, so `report`, `ui` and the notebooks work on it after the original is
gone (MLflow records absolute `file://` locations: a plain copy of mlflow.db still points at the original's files)."""

from __future__ import annotations

import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from trainables.errors import UserError
from trainables.naming import DEFAULT_ARTIFACT_ROOT, STORE_FILE

__all__ = ["ARTIFACTS_DIR", "STORE_FILE", "Exported", "export_store"]

# The copy's artifact root (one folder per experiment id below it) and store file: the defaults a study writes.
ARTIFACTS_DIR = DEFAULT_ARTIFACT_ROOT


@dataclass(frozen=True)
class Exported:
    """What `export_store` wrote: the copy's tracking URI, its experiments and runs, and the run folders copied
    (a run that logged no file has none)."""

    tracking_uri: str
    experiments: int
    runs: int
    folders: int


def _local_path(uri: str | None) -> Path | None:
    if not uri:
        return None
    if uri.startswith("file:"):
        return Path(unquote(urlparse(uri).path))
    if "://" not in uri and ":" not in uri.split("/", 1)[0]:
        return Path(uri)
    return None  # s3://, gs://, mlflow-artifacts:/ ...: not on this machine; they travel by themselves


def export_store(tracking_uri: str, dest: str | Path) -> Exported:
    """Copy the SQLite store `tracking_uri` and every local artifact its runs have into the folder `dest` (new or
    empty): `dest/mlflow.db` and `dest/mlartifacts/<experiment id>/<run id>/...`, the copy's artifact locations
    pointing there. Artifacts kept elsewhere (s3://, a server's mlflow-artifacts:/) keep their locations."""
    from trainables.tracking import check_tracking_uri, resolve_tracking_uri

    uri = check_tracking_uri(resolve_tracking_uri(tracking_uri))  # a URI with a password is refused, unshown
    if not uri.startswith("sqlite:///"):
        raise UserError(
            f"tracking URI: export copies a local SQLite store, got {uri}. Fix: a server's store travels with its "
            f"database; export a local one, e.g. --tracking-uri sqlite:///mlflow.db."
        )
    source = Path(uri[len("sqlite:///") :])
    if not source.is_file():
        raise UserError(f"tracking URI: no store at {source}. Fix: give the store the study ran with (--tracking-uri).")
    dest = Path(dest).expanduser().resolve()
    if dest.exists() and any(dest.iterdir()):
        raise UserError(f"DEST: an empty or new folder must be given, got {dest}, which holds files. Fix: another one.")
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / STORE_FILE
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)  # a consistent copy, even while another process writes
    folders = 0
    with sqlite3.connect(target) as db:
        experiments = db.execute("SELECT experiment_id, artifact_location FROM experiments").fetchall()
        runs = db.execute("SELECT run_uuid, experiment_id, artifact_uri FROM runs").fetchall()
        for exp_id, location in experiments:
            if _local_path(location) is None:
                continue
            root = dest / ARTIFACTS_DIR / str(exp_id)
            root.mkdir(parents=True, exist_ok=True)
            db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?", (root.as_uri(), exp_id))
        for run_id, exp_id, artifact_uri in runs:
            old = _local_path(artifact_uri)
            if old is None:
                continue
            # A run's artifact URI is <its experiment's location>/<run id>/artifacts: its run folder moves whole.
            folder = old.parent if old.name == "artifacts" else old
            new_folder = dest / ARTIFACTS_DIR / str(exp_id) / run_id
            if folder.is_dir():
                shutil.copytree(folder, new_folder, dirs_exist_ok=True)
                folders += 1
            new_uri = (new_folder / "artifacts").as_uri() if old.name == "artifacts" else new_folder.as_uri()
            db.execute("UPDATE runs SET artifact_uri = ? WHERE run_uuid = ?", (new_uri, run_id))
    return Exported(f"sqlite:///{target}", len(experiments), len(runs), folders)
