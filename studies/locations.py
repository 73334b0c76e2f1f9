"""Where a study run keeps its state and writes (Ray's storage, Optuna's database, the MLflow store, the log), and
what a full disk at one of those places means for the study."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studies.shell import shell_command
from studies.spec import DEFAULT_STORAGE, LoadedStudy, StudyError, storage_is_shared
from trainables.errors import NoSpaceLeft, free_bytes, nearest_existing, no_space_at
from trainables.naming import LOG_FILE, OPTUNA_STORAGE_TAG, STORAGE_TAG

__all__ = [
    "StateLocations",
    "full_disk_error",
    "log_file",
    "no_space_error",
    "state_locations",
    "study_places",
]


@dataclass(frozen=True)
class StateLocations:
    """Where a study run keeps its state: Ray's results and checkpoints, Optuna's database."""

    storage: str
    optuna_storage: str
    shared: bool  # every node reaches `storage`
    optuna_default: bool  # optuna_storage was not set, only derived

    def tags(self) -> dict[str, str]:
        return {STORAGE_TAG: self.storage, OPTUNA_STORAGE_TAG: self.optuna_storage}


def state_locations(study: LoadedStudy, run_name: str, recorded: dict[str, str] | None = None) -> StateLocations:
    """Where the study's state goes; `recorded`: the tags of the study run being resumed.

    A resumed run keeps its recorded Ray storage unless `storage` is overridden (the results were moved), and
    always its Optuna storage: Tune restores the searcher, with the storage it was built with.
    """
    overridden = study.location_overrides
    storage, optuna = study.storage, study.optuna_storage(run_name)
    if recorded and STORAGE_TAG in recorded:
        if "storage" not in overridden:
            storage = recorded[STORAGE_TAG]
        kept = recorded.get(OPTUNA_STORAGE_TAG, optuna)
        if "optuna_storage" in overridden and optuna != kept:
            raise StudyError(
                study.path,
                [
                    f"optuna_storage: a resumed run reopens the Optuna storage it started with, {kept}; got {optuna}. "
                    f"Fix: drop the optuna_storage override (and keep the database at {kept}), or start a new run."
                ],
            )
        optuna = kept
    return StateLocations(
        storage=storage,
        optuna_storage=optuna,
        shared=storage_is_shared(storage, study.spec.shared_mounts),
        optuna_default=study.spec.optuna_storage is None,
    )


def _device_of(path: str):
    """The file system holding `path` (its nearest existing folder)."""
    try:
        return nearest_existing(path).stat().st_dev
    except OSError:
        return path


def study_places(study: LoadedStudy, locations: StateLocations, uri: str) -> list[tuple[str, str]]:
    """The local places a study writes to, each with what lives there: where a full disk is the study's."""
    places = []
    if "://" not in locations.storage:
        places.append((locations.storage, "the study's storage (Tune's checkpoints and state)"))
    if locations.optuna_storage.startswith(("sqlite:///", "journal:///")):
        places.append((locations.optuna_storage.partition(":///")[2], "the Optuna database"))
    if uri.startswith("sqlite:///"):
        places.append((uri[len("sqlite:///") :], "the MLflow store"))
    artifacts = study.spec.tracking.artifact_location
    if artifacts and "://" not in str(artifacts):
        places.append((str(Path(artifacts).resolve()), "the MLflow artifacts"))
    return places


def no_space_error(study: LoadedStudy, locations: StateLocations, uri: str, what: list[str]) -> NoSpaceLeft:
    """The one line for a study a full disk stopped: of the places it writes to, the one with the least room,
    what lives there, what could not be written, and the fix."""
    places = study_places(study, locations, uri)
    disks: dict[Any, tuple[int, str, list[str]]] = {}  # one entry per file system, in the order above
    for path, label in places:
        room = free_bytes(path)
        if room is not None:
            disks.setdefault(_device_of(path), (room, path, []))[2].append(label)
    if disks:
        room, path, labels = min(disks.values(), key=lambda d: d[0])  # the first of the fullest
        where = f"{path} ({', '.join(labels)}; {room} bytes free)"
    else:
        where = "a disk the study writes to"
    return NoSpaceLeft(
        f"no space left on {where}: {'; '.join(what)}. The study stopped; its runs and trials are closed as interrupted where "
        f"their store could still record it. Fix: free space on that disk, then `{shell_command('sharpscale', 'resume', study.path)}` "
        f"continues the study."
    )


def full_disk_error(study: LoadedStudy, locations: StateLocations, uri: str, err: BaseException) -> NoSpaceLeft | None:
    """A full disk met outside the trials (a record of the runner's, the store itself): the one line that names it,
    not the trace of whichever library met it first; None for any other error."""
    places = [path for path, _ in study_places(study, locations, uri)]
    full = None if isinstance(err, (NoSpaceLeft, KeyboardInterrupt)) else no_space_at(err, places)
    return None if full is None else no_space_error(study, locations, uri, [f"the study could not write ({full})"])


def log_file(study: LoadedStudy, locations: StateLocations, run_name: str) -> Path:
    """Where a run's library log goes: beside its Ray results, or beside the study file when those are remote."""
    base = Path(locations.storage) if "://" not in locations.storage else study.path.parent / DEFAULT_STORAGE
    return base / run_name / LOG_FILE
