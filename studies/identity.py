"""One identity per launch of a study: the claim on its launch number, and what `resume` checks before continuing it.

A launch is the study file (its hash, with the --set overrides) run into one MLflow store: its study run, its Tune
experiment and its Optuna studies. `run` claims the launch number atomically (a name the store holds at most once),
so two runs started together never share one; every driver of a launch (`run`, each `resume`) holds its driver claim,
another such name, while it runs, so that two never drive one launch at once; `run` writes the launch's identity into
the Tune experiment folder; and `resume` continues only the launch whose file, store and Tune experiment all agree, or
says which one differs.
"""

from __future__ import annotations

import datetime as dt
import difflib
import fnmatch
import hashlib
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from studies.shell import shell_command
from studies.spec import LoadedStudy, StudyError
from trainables.naming import KIND_TAG, LAUNCH_TAG, STUDY_FILE_HASH_TAG, TUNE_STATE_TAG, kind_filter, launch_name
from trainables.secrets import redact

__all__ = [
    "IDENTITY_FILE",
    "DriverHolder",
    "LaunchTaken",
    "claim_driver",
    "driver_claim_name",
    "driver_holder",
    "release_driver",
    "check_fresh_experiment_dir",
    "check_launch_record",
    "check_tune_state",
    "claim_launch",
    "claim_name",
    "release_launch",
    "find_recorded_store",
    "launch_record",
    "read_launch_record",
    "record_tune_state",
    "resume_target",
    "tune_state_digest",
    "write_launch_record",
]

# The identity of the launch whose Tune experiment holds it: written by `run`, checked by `resume`.
IDENTITY_FILE = "sharpscale-launch.json"


class LaunchTaken(Exception):
    """Another run of the study claimed this launch number first."""


def claim_name(experiment: str, launch: int) -> str:
    """The MLflow experiment whose creation claims `launch` of `experiment` (kept deleted: out of every list)."""
    return f".sharpscale-claim/{experiment}/launch-{launch}"


def claim_launch(client, experiment: str, launch: int, artifact_location: str | None = None) -> None:
    """Claim `launch` of `experiment` in the store, or raise LaunchTaken when another run has claimed it.

    The store refuses a second experiment of one name (a unique constraint in its database, on any backend: an
    SQLite file, PostgreSQL, or a tracking server in front of either), so exactly one of two concurrent runs
    creates the claim. It is deleted at once: a deleted experiment keeps its name taken but shows nowhere.
    """
    from mlflow.exceptions import MlflowException

    try:
        exp_id = client.create_experiment(
            claim_name(experiment, launch), artifact_location=artifact_location, tags={KIND_TAG: "launch_claim"}
        )
    except MlflowException as err:
        if err.error_code == "RESOURCE_ALREADY_EXISTS" or "already exists" in str(err).lower():
            raise LaunchTaken(launch) from err
        raise
    client.delete_experiment(exp_id)


def release_launch(client, experiment: str, launch: int) -> None:
    """Give back a claim of `launch` that no run used (Ray failed to start, say), so the next `run` can take it.

    The claim is a deleted experiment whose name holds the launch: renamed out of the way (the store renames only
    active experiments) and deleted again, under a name no claim uses.
    """
    claim = client.get_experiment_by_name(claim_name(experiment, launch))
    if claim is not None:
        _rename_away(client, claim)


def _rename_away(client, claim) -> None:
    """Free a claim's name: the store renames only active experiments, so restore, rename, delete again."""
    if claim.lifecycle_stage == "deleted":
        client.restore_experiment(claim.experiment_id)
    client.rename_experiment(claim.experiment_id, f"{claim.name}-released-{uuid.uuid4().hex[:12]}")
    client.delete_experiment(claim.experiment_id)


# The driver claim's tags: who holds it. A claim is stale when its holder ran on this host and is gone.
_HOST, _PID, _SINCE, _COMMAND, _STARTED, _TOKEN = (
    f"sharpscale.driver.{k}" for k in ("host", "pid", "since", "command", "t", "token")
)


def driver_claim_name(experiment: str, launch: int) -> str:
    """The MLflow experiment whose creation claims the driving of `launch` (held while a driver runs it)."""
    return f".sharpscale-driver/{experiment}/launch-{launch}"


@dataclass(frozen=True)
class DriverHolder:
    """The driver that holds a launch: its host, process id, the command, when it took the claim."""

    host: str
    pid: int
    command: str
    since: str  # UTC, ISO 8601, to the second
    started: float  # the same instant as time.time(), to tell a reused process id from the holder

    def __str__(self) -> str:
        return f"`sharpscale {self.command}` (pid {self.pid} on host {self.host}, since {self.since})"

    @property
    def here(self) -> bool:
        return self.host == socket.gethostname()

    def gone(self) -> bool:
        """Whether the holder is known to have ended: it ran on this host and its process is dead (or its process id
        now belongs to a process started after the claim). A holder on another host is never known gone here."""
        if not self.here:
            return False
        import psutil

        try:
            return psutil.Process(self.pid).create_time() > self.started + 1.0
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            return False


def _holder(claim) -> DriverHolder | None:
    tags = claim.tags or {}
    try:
        return DriverHolder(tags[_HOST], int(tags[_PID]), tags[_COMMAND], tags[_SINCE], float(tags[_STARTED]))
    except (KeyError, ValueError):
        return None


def driver_holder(client, experiment: str, launch: int) -> DriverHolder | None:
    """Who drives `launch` now (its claim's holder), or None when no driver holds it."""
    claim = client.get_experiment_by_name(driver_claim_name(experiment, launch))
    return None if claim is None else _holder(claim)


def claim_driver(
    client, experiment: str, launch: int, command: str, token: str, artifact_location: str | None = None
) -> tuple[DriverHolder | None, DriverHolder | None]:
    """Take the driver claim of `launch` for this driver (`token`: its own, for `release_driver`): (None, gone) when taken, `gone` the holder of a stale claim
    that was taken over (its process on this host had ended without releasing it), else (holder, None): the claim
    another driver holds. Atomic as `claim_launch`: of two drivers claiming at once exactly one creates the name.
    """
    from mlflow.exceptions import MlflowException

    now = time.time()
    tags = {
        KIND_TAG: "driver_claim",
        _HOST: socket.gethostname(),
        _PID: str(os.getpid()),
        _COMMAND: command,
        _SINCE: dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        _STARTED: repr(now),
        _TOKEN: token,
    }
    name, gone = driver_claim_name(experiment, launch), None
    for _ in range(3):
        try:
            client.delete_experiment(client.create_experiment(name, artifact_location=artifact_location, tags=tags))
            return None, gone
        except MlflowException as err:
            if not (err.error_code == "RESOURCE_ALREADY_EXISTS" or "already exists" in str(err).lower()):
                raise
        claim = client.get_experiment_by_name(name)
        if claim is None:
            continue  # released between the two calls
        holder = _holder(claim)
        if holder is not None and not holder.gone():
            return holder, None
        gone = holder
        _rename_away(client, claim)  # of two drivers taking it over at once, the next create still admits one
    holder = driver_holder(client, experiment, launch)
    return holder, None


def release_driver(client, experiment: str, launch: int, token: str | None) -> None:
    """Give back the driver claim of `launch` that `token`'s driver holds, never another's (a claim taken over since
    is its new holder's); token None: whoever holds it (`--take-over` of a driver known gone on another host)."""
    claim = client.get_experiment_by_name(driver_claim_name(experiment, launch))
    if claim is not None and (token is None or (claim.tags or {}).get(_TOKEN) == token):
        _rename_away(client, claim)


def _study_runs(client, experiment_id: str) -> list:
    runs = client.search_runs([experiment_id], filter_string=kind_filter("study"), max_results=10_000)
    return sorted(runs, key=lambda r: (int(r.data.tags.get(LAUNCH_TAG, "1")), r.info.start_time or 0))


def _what_changed(client, run, study: LoadedStudy) -> str:
    """The first lines that differ between the study file the launch recorded and this one, for the message."""
    try:
        local = client.download_artifacts(run.info.run_id, study.path.name, dst_path=None)
        recorded = Path(local).read_text()
    except Exception:  # noqa: BLE001 - the diff only helps; the refusal stands without it
        return ""
    if recorded == study.text:
        return " The file is the same; its --set overrides differ."
    lines = [
        line
        for line in difflib.unified_diff(recorded.splitlines(), study.text.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    shown = "; ".join(line.strip() for line in lines[:6]) + ("; ..." if len(lines) > 6 else "")
    return f" Changed lines (- recorded, + now): {shown}." if shown else ""


def resume_target(client, experiment_id: str | None, study: LoadedStudy, uri: str, hint: str = ""):
    """The study run `resume` continues: the newest launch of this study in the store, when it ran this very file.

    Refused (StudyError) when the store holds no launch of the study (`hint`: where one was recorded instead), or
    when the newest launch ran another version of the file or other --set overrides: continuing it would run the
    old configuration under the new file's name.
    """
    runs = _study_runs(client, experiment_id) if experiment_id is not None else []
    if not runs:
        raise StudyError(
            study.path,
            [
                f"resume: MLflow store {redact(uri)} holds no launch of study {study.experiment_name!r} to resume."
                + (
                    hint
                    or f" Fix: give the store it ran with (--tracking-uri; a relative sqlite:/// path is relative to "
                    f"the directory `run` started in), or start it with `{shell_command('sharpscale', 'run', study.path)}`."
                )
            ],
        )
    newest = runs[-1]
    launch = int(newest.data.tags.get(LAUNCH_TAG, "1"))
    recorded = newest.data.tags.get(STUDY_FILE_HASH_TAG)
    if recorded != study.file_hash:
        raise StudyError(
            study.path,
            [
                f"resume: the study file (with its --set overrides) is not the one launch {launch} ran: recorded "
                f"hash {recorded}, now {study.file_hash}.{_what_changed(client, newest, study)} Resuming would "
                f"continue the old configuration under the edited file. Fix: restore the file (and the same --set "
                f"options) to resume launch {launch}, or run the edited study as launch {launch + 1}: "
                f"`{shell_command('sharpscale', 'run', '--new-launch', study.path)}`."
            ],
        )
    return newest


def _fs(directory: str):
    import pyarrow.fs

    return pyarrow.fs.FileSystem.from_uri(directory if "://" in directory else str(Path(directory).resolve()))


def write_launch_record(experiment_dir: str, record: dict[str, str]) -> None:
    """Write the launch's identity (study run, store, file hash, launch) into its Tune experiment folder."""
    fs, path = _fs(experiment_dir)
    fs.create_dir(path, recursive=True)
    with fs.open_output_stream(f"{path}/{IDENTITY_FILE}") as out:
        out.write(json.dumps(record, indent=1).encode())


def read_launch_record(experiment_dir: str) -> dict[str, str] | None:
    import pyarrow.fs

    fs, path = _fs(experiment_dir)
    target = f"{path}/{IDENTITY_FILE}"
    if fs.get_file_info(target).type != pyarrow.fs.FileType.File:
        return None
    with fs.open_input_stream(target) as f:
        try:
            record = json.loads(f.read().decode())
        except ValueError:
            return {}
    return record if isinstance(record, dict) else {}


def launch_record(study: LoadedStudy, uri: str, experiment_id: str, study_run_id: str, launch: int) -> dict:
    return {
        "study_run_id": study_run_id,
        "experiment_id": experiment_id,
        "tracking_uri": redact(uri),
        "study_file_hash": study.file_hash,
        "launch": launch,
    }


def check_launch_record(study: LoadedStudy, experiment_dir: str, expected: dict) -> None:
    """Refuse to resume the Tune experiment at `experiment_dir` unless it belongs to the launch being resumed.

    A launch started before launches were recorded has no record: it is resumed as before.
    """
    record = read_launch_record(experiment_dir)
    if record is None:
        return
    differs = [
        f"{key} {record.get(key)!r} there, {value!r} here"
        for key, value in expected.items()
        if key != "tracking_uri" and str(record.get(key)) != str(value)
    ]
    if not differs:
        return
    raise StudyError(
        study.path,
        [
            f"resume: the Tune experiment {experiment_dir} belongs to another launch than the one recorded at "
            f"{expected['tracking_uri']} ({'; '.join(differs)}; its store: {record.get('tracking_uri')}). Fix: "
            f"resume with the store it ran with (`{shell_command('--tracking-uri', str(record.get('tracking_uri')))}`), or start anew with "
            f"`{shell_command('sharpscale', 'run', '--new-launch', study.path)}`."
        ],
    )


def check_fresh_experiment_dir(study: LoadedStudy, experiment_dir: str, uri: str) -> None:
    """Refuse to start a launch in a Tune experiment folder that another launch (another store's) already holds."""
    record = read_launch_record(experiment_dir)
    if record is None:
        return
    raise StudyError(
        study.path,
        [
            f"run: the Ray storage folder {experiment_dir} already holds launch {record.get('launch')} of this study, "
            f"recorded in the MLflow store {record.get('tracking_uri')} (this run records at {redact(uri)}); two "
            f"launches would share one Tune experiment and one Optuna search. Fix: use that store "
            f"(`{shell_command('--tracking-uri', str(record.get('tracking_uri')))}`), or give this run its own --storage."
        ],
    )


def find_recorded_store(study: LoadedStudy, storage: str) -> dict | None:
    """The newest launch record under the study's Ray storage (a local directory): where its launches went.

    For `resume` in a store that holds none of them (run from another directory with a relative tracking URI)."""
    if "://" in storage:
        return None
    best = None
    names = {launch_name(study.experiment_name, n) for n in range(1, 1000)}
    for launch_dir in Path(storage).glob(f"{study.experiment_name}*"):
        if launch_dir.name not in names:
            continue
        record = read_launch_record(str(launch_dir))
        if record and (best is None or int(record.get("launch", 0)) > int(best.get("launch", 0))):
            best = record
    return best


# Tune's own files at the top of a launch's experiment folder, which `Tuner.restore` unpickles: tuner.pkl (the run's
# settings), and for each of these name patterns the newest file by name (a timestamp; Tune's `max(glob)` in
# `_load_newest_checkpoint` and `_find_newest_experiment_checkpoint`): the cloudpickled trials, searcher wrappers,
# callbacks' state and (for a basic-variant search) the generator. The searcher's own searcher-state-*.pkl holds
# JSON that CellSearcher reads as data, so it is not among them. The storage may be shared (docs/cluster.md);
# `resume` reads them only when they are the bytes this launch left there, as the digests recorded on its MLflow
# study run (the store, not the storage) say. Only the newest of each is recorded, so the tag stays a few hundred
# characters however many times a launch is resumed (MLflow caps a tag at 8,000).
TUNER_STATE = "tuner.pkl"
NEWEST_STATES = (
    "experiment_state-*.json",
    "search_gen_state-*.json",
    "callback-states-*.pkl",
    "basic-variant-state-*.json",
)


def tune_state_digest(experiment_dir: str) -> dict[str, str] | None:
    """File name -> sha256 of the Tune state files that `Tuner.restore` would read in a local experiment folder
    (tuner.pkl and the newest by name of each of NEWEST_STATES); None for a URI storage (not read)."""
    if "://" in experiment_dir:
        return None
    folder = Path(experiment_dir)
    if not folder.is_dir():
        return {}
    names = {p.name for p in folder.iterdir() if p.is_file()}
    read = [TUNER_STATE] if TUNER_STATE in names else []
    read += [newest for pattern in NEWEST_STATES if (newest := max(fnmatch.filter(names, pattern), default=None))]
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in sorted(read)}


def record_tune_state(client, study_run_id: str, experiment_dir: str) -> None:
    """Record on the study run the digests of Tune's state as this launch leaves it (after each `fit`)."""
    digest = tune_state_digest(experiment_dir)
    if digest:
        client.set_tag(study_run_id, TUNE_STATE_TAG, json.dumps(digest, sort_keys=True))


def check_tune_state(study: LoadedStudy, experiment_dir: str, recorded: str | None) -> str | None:
    """Refuse to resume from Tune state that this launch did not leave: a file changed or planted since its last
    record, or an experiment state cut short (written while its disk was full). Returns a warning line when there is
    no record to check against (a launch recorded before records were kept, or a URI storage), else None."""
    current = tune_state_digest(experiment_dir)
    if current is None:
        return (
            f"resume: Tune's state under {experiment_dir} (a URI storage) is not checked against this launch's "
            f"record before Tune unpickles it: the storage must be writable only by the study's users"
        )
    if recorded is None:
        return (
            f"resume: this launch has no record of Tune's state files (it ran before records were kept): "
            f"{experiment_dir} is restored unchecked"
        )
    try:
        expected = json.loads(recorded)
    except ValueError:
        expected = {}
    # Every file Tune would read must be one this launch recorded, unchanged: a newer one planted beside them, or a
    # recorded one removed so that an older one becomes the newest, is refused.
    changed = [name for name, digest in current.items() if expected.get(name) != digest]
    newest = max(fnmatch.filter(current, NEWEST_STATES[0]), default=None)
    fix = (
        f"Fix: if this launch's driver was killed hard (its last state was never recorded) and no one else can write "
        f"there, `{shell_command('sharpscale', 'resume', '--trust-storage', study.path)}`; otherwise start anew with "
        f"`{shell_command('sharpscale', 'run', '--new-launch', study.path)}`"
    )
    if changed:
        raise StudyError(
            study.path,
            [
                f"resume: Tune's state {', '.join(changed)} under {experiment_dir} is not what this launch left "
                f"there (sha256 recorded on its MLflow study run, tag {TUNE_STATE_TAG}); Tune would unpickle it, "
                f"running whatever it holds. {fix}."
            ],
        )
    if newest is not None:
        try:
            json.loads((Path(experiment_dir) / newest).read_text(encoding="utf-8"))  # plain JSON: nothing unpickled
        except (UnicodeDecodeError, ValueError):
            raise StudyError(
                study.path,
                [
                    f"resume: Tune's state {Path(experiment_dir) / newest} is cut short (written while its disk was "
                    f"full?): Tune would start this launch's trials over and lose the ones it ran. Fix: start anew "
                    f"with `{shell_command('sharpscale', 'run', '--new-launch', study.path)}`."
                ],
            ) from None
    return None
