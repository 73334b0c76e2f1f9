"""User errors: the one base class for a mistake the user fixes (the CLI catches it once), how values are echoed,
and what a full disk looks like from wherever it is met."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any, Iterable

__all__ = [
    "FULL_BELOW",
    "MAX_SHOWN_CHARS",
    "NO_SPACE_ERRNOS",
    "NoSpaceLeft",
    "TrialRefused",
    "UserError",
    "free_bytes",
    "nearest_existing",
    "no_space",
    "no_space_at",
    "shown",
]

# An error message quotes the value it refuses; a pasted file or an expanded YAML alias must not become megabytes of it.
MAX_SHOWN_CHARS = 120


class UserError(ValueError):
    """Input the user can correct (a study file, an option, a path, data on disk): its message names the field,
    the rule, the value and the fix. The CLI prints it without a traceback and exits 2."""


class TrialRefused(UserError):
    """Settings a trial refuses from inside, once it has built what shows the problem (its model, its training
    subset): a finite-difference measure on a kinked model, a measurement set or batch larger than the subset. The
    same settings fail the same way on every attempt, so the trial fails once: trainables.ray_train records it as
    failed and ends it without raising, which Tune's max_failures would retry."""


def shown(value: Any, limit: int = MAX_SHOWN_CHARS) -> str:
    """`repr(value)` for an error message, cut to `limit` characters (the cut says how long the whole was)."""
    from trainables.secrets import redact

    try:
        text = redact(repr(value))  # a value echoed in a message never shows a URI's password
    except Exception:  # noqa: BLE001 - a value whose repr fails is still named
        text = f"<{type(value).__name__}>"
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} chars)"


# What a full disk (or quota) says, in the errors that reach sharpscale: Python's and pyarrow's OSError, SQLite's own
# message (through SQLAlchemy, MLflow, Optuna), and those texts carried over from another process (Ray's task
# errors, Tune's TuneError, which keep only the formatted trace).
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
NO_SPACE_TEXTS = ("No space left on device", "database or disk is full", "Disk quota exceeded")


def no_space(err: BaseException | None) -> str | None:
    """The line that says `err`, or an error it was raised from, is a full disk; None when it is not one."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in NO_SPACE_ERRNOS:
            return (str(err).strip().splitlines() or [errno.errorcode.get(err.errno, "ENOSPC")])[0][:300]
        for line in str(err).splitlines():
            if any(text in line for text in NO_SPACE_TEXTS):
                return line.strip()[:300]
        err = err.__cause__ or err.__context__
    return None


def nearest_existing(path: str | Path) -> Path:
    """`path`, or its nearest existing parent folder: where to ask about the file system that will hold it."""
    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    return where


def free_bytes(path: str | Path) -> int | None:
    """Bytes free to this user on the file system that holds `path` (its nearest existing folder); None if unknown."""
    try:
        return shutil.disk_usage(nearest_existing(path)).free
    except OSError:
        return None


# A place with less free than this is full: the write that failed there was larger than what is left. Bytes.
FULL_BELOW = 64 * 2**20


def _failing_paths(err: BaseException | None) -> list[str]:
    paths, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError):
            paths += [str(f) for f in (err.filename, err.filename2) if isinstance(f, (str, Path))]
        err = err.__cause__ or err.__context__
    return paths


def _under(path: str, place: str) -> bool:
    try:
        return Path(os.path.abspath(path)).is_relative_to(Path(os.path.abspath(place)))
    except (OSError, ValueError):
        return False


def no_space_at(err: BaseException | None, places: Iterable[str | Path]) -> str | None:
    """`no_space(err)` only when the full disk is one of `places` (the study's): the path that failed lies under one
    of them, or, where the error names no path, one of them has less than FULL_BELOW bytes free. None for a full
    disk elsewhere (a DataLoader's /dev/shm, another temp folder): an error like any other, failed as found, with a
    note naming /dev/shm where that is the place."""
    full = no_space(err)
    if full is None:
        return None
    places = [str(p) for p in places]
    paths = _failing_paths(err)
    if paths:
        confirmed = any(_under(path, place) for path in paths for place in places)
    else:
        confirmed = any((room := free_bytes(place)) is not None and room < FULL_BELOW for place in places)
    if confirmed:
        return full
    if err is not None and (any(_under(p, "/dev/shm") for p in paths) or "/dev/shm" in full or "/torch_" in full):
        err.add_note(
            "(/dev/shm, the shared memory DataLoader workers pass batches through, is full: not the study's disk. "
            "Fix: give the container more shared memory (docker --shm-size) or use fewer data loader workers.)"
        )
    return None


class NoSpaceLeft(OSError):
    """A full disk stopped a study: its message names where, what the study could not record there, and the fix.
    An OSError (ENOSPC): the machine refused, not the user's input; the CLI prints it in one line and exits 1."""

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return self.strerror
