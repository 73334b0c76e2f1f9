"""`sharpscale export`: a local MLflow store (SQLite file and artifact folders) copied into one folder that travels,
its artifact locations rewritten to the copy's and its Optuna databases and study files carried, so `report`, `ui`,
`dashboard` and the notebooks work on it after the original is
gone (MLflow records absolute `file://` locations: a plain copy of mlflow.db still points at the original's files)."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from trainables.errors import UserError
from trainables.naming import DEFAULT_ARTIFACT_ROOT, STORE_FILE

__all__ = [
    "ARTIFACTS_DIR",
    "OPTUNA_DIR",
    "STORE_FILE",
    "STUDIES_DIR",
    "Exported",
    "adopt_moved_store",
    "export_store",
    "locations_outside",
    "travelled_path",
]

# The copy's artifact root (one folder per experiment id below it) and store file: the defaults a study writes.
ARTIFACTS_DIR = DEFAULT_ARTIFACT_ROOT
# Where an export keeps the study's Optuna databases and study files, so `dashboard`, `status` and `report` find them
# in the copy (the study run's tags name them).
OPTUNA_DIR = "optuna"
STUDIES_DIR = "studies"


@dataclass(frozen=True)
class Exported:
    """What `export_store` wrote: the copy's tracking URI, its experiments (those its list shows; the hidden launch
    claims are copied too) and runs, and the run folders copied (a run that logged no file has none)."""

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


def _store_dir(tracking_uri: str) -> Path | None:
    return Path(tracking_uri[len("sqlite:///") :]).parent if tracking_uri.startswith("sqlite:///") else None


def _own_root(store: Path, recorded: Path, exp_id) -> Path:
    """Where the store's own artifact folder keeps an experiment recorded at `recorded`: the same path below its
    `mlartifacts/` as below the original's (`mlartifacts/` itself, or `mlartifacts/<id>` as an export lays it out)."""
    parts = recorded.parts
    if ARTIFACTS_DIR in parts:
        at = len(parts) - 1 - parts[::-1].index(ARTIFACTS_DIR)
        return store.joinpath(ARTIFACTS_DIR, *parts[at + 1 :])
    return store / ARTIFACTS_DIR / str(exp_id)


def _moved_rows(db: sqlite3.Connection, store: Path) -> tuple[list[tuple], list[tuple], list[str]]:
    """The experiments (with runs) whose recorded local artifact root is gone while the store's own
    `mlartifacts/<experiment id>` is there: their (new uri, id) and their runs' (new uri, run id), each run's
    location rebased from the old root onto the new one; and the gone roots the store does not hold.
    A run's folder may be absent for good reason (it logged no file), so the experiment's root decides."""
    exps, runs, outside = [], [], []
    for exp_id, location in db.execute(
        "SELECT experiment_id, artifact_location FROM experiments WHERE experiment_id IN (SELECT experiment_id FROM runs)"
    ).fetchall():
        recorded = _local_path(location)
        if recorded is None or recorded.exists():
            continue
        own = _own_root(store, recorded, exp_id)
        if not own.is_dir():
            outside.append(location)
            continue
        exps.append((own.as_uri(), exp_id))
        for run_id, uri in db.execute("SELECT run_uuid, artifact_uri FROM runs WHERE experiment_id = ?", (exp_id,)):
            path = _local_path(uri)
            if path is not None and path.is_relative_to(recorded):
                runs.append(((own / path.relative_to(recorded)).as_uri(), run_id))
    return exps, runs, outside


def _read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)  # reading never creates a file


def _copy_store(source: Path, target: Path) -> None:
    """A consistent copy of the SQLite file `source` at `target`, even while another process writes to it; a
    "database is locked" error once another writer has held it for STORE_LOCK_WAIT_S."""
    from trainables.tracking import STORE_LOCK_WAIT_S

    deadline = time.monotonic() + STORE_LOCK_WAIT_S

    def give_up_when_held(status: int, remaining: int, pages: int) -> None:
        # sqlite3's backup retries a source that stays locked forever; an error from here ends it.
        if status in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) and time.monotonic() > deadline:
            raise sqlite3.OperationalError("database is locked")

    with _read_only(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst, progress=give_up_when_held, sleep=0.25)


def locations_outside(tracking_uri: str) -> list[str]:
    """The artifact locations an SQLite store records outside itself that are absent and that its own artifact
    folder does not hold either (a plain copy of mlflow.db without its artifacts); [] for other stores."""
    store = _store_dir(tracking_uri)
    if store is None or not (store / STORE_FILE).is_file():
        return []
    with _read_only(Path(tracking_uri[len("sqlite:///") :])) as db:
        return _moved_rows(db, store)[2]


def adopt_moved_store(tracking_uri: str) -> int:
    """Point a copied or moved SQLite store's artifact locations at its own artifact folder where the recorded
    (absolute) ones are gone and its folder holds them, so what MLflow writes or serves stays inside the store.
    Returns how many locations moved; changes nothing in any other store. For commands that write the store."""
    store = _store_dir(tracking_uri)
    if store is None:
        return 0
    db_path = Path(tracking_uri[len("sqlite:///") :])
    if not db_path.is_file():
        return 0
    with _read_only(db_path) as db:
        exps, runs, _ = _moved_rows(db, store)
    if not exps and not runs:
        return 0
    with sqlite3.connect(db_path) as db:
        db.executemany("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?", exps)
        db.executemany("UPDATE runs SET artifact_uri = ? WHERE run_uuid = ?", runs)
    return len(exps) + len(runs)


def travelled_path(tracking_uri: str, recorded: str | Path, folder: str) -> Path | None:
    """A file a study run's tag names (`recorded`), as this store has it: where recorded if there, else the same
    name in the store's `folder` (where `export` put it, wherever the export has since moved) or beside its mlflow.db
    (a plain copy of the folder); None if none."""
    recorded = Path(recorded)
    if recorded.is_file():
        return recorded
    store = _store_dir(tracking_uri)
    for there in (store / folder, store) if store is not None else ():  # an export's layout, or beside mlflow.db
        if (there / recorded.name).is_file():
            return there / recorded.name
    return None


def _carry_state(db: sqlite3.Connection, dest: Path) -> None:
    """Copy each study run's Optuna database (SQLite) and study file into `dest`, its tags rewritten to the copies."""
    from trainables.naming import OPTUNA_STORAGE_TAG, STUDY_FILE_TAG

    for key, value in db.execute(
        "SELECT DISTINCT key, value FROM tags WHERE key IN (?, ?)", (OPTUNA_STORAGE_TAG, STUDY_FILE_TAG)
    ).fetchall():
        if key == STUDY_FILE_TAG:
            source = Path(value)
            if not source.is_file():
                continue
            copied = dest / STUDIES_DIR / source.name
            copied.parent.mkdir(exist_ok=True)
            if not copied.exists():
                shutil.copyfile(source, copied)
            new = str(copied)
        else:
            if not value.startswith("sqlite:///"):
                continue  # a server's database or a journal on shared storage: not this machine's to carry
            source = Path(value[len("sqlite:///") :])
            if not source.is_file():
                continue
            copied = dest / OPTUNA_DIR / source.name
            copied.parent.mkdir(exist_ok=True)
            if not copied.exists():
                with _read_only(source) as src, sqlite3.connect(copied) as dst:
                    src.backup(dst)
            new = f"sqlite:///{copied}"
        db.execute("UPDATE tags SET value = ? WHERE key = ? AND value = ?", (new, key, value))


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
    made = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / STORE_FILE
    try:
        _copy_store(source, target)
    except sqlite3.Error:
        target.unlink(missing_ok=True)  # no half copy: an export into the same folder works once the store is free
        if made:
            with contextlib.suppress(OSError):
                dest.rmdir()
        raise
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
        _carry_state(db, dest)
        # The count is of what the copy's experiment list shows: a launch's claims are deleted experiments
        # (studies.identity), copied so the launches stay taken, but no experiment a user would look for.
        shown = db.execute("SELECT COUNT(*) FROM experiments WHERE lifecycle_stage = 'active'").fetchone()[0]
    return Exported(f"sqlite:///{target}", shown, len(runs), folders)
