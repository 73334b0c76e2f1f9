"""Data roots on any node: a URI root is staged once per node into a verified local cache; a local path is used in place."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from trainables.errors import UserError

__all__ = [
    "CACHE_ENV",
    "DEFAULT_CACHE",
    "MANIFEST",
    "StagingError",
    "cache_dir",
    "cache_path",
    "is_staged",
    "is_uri",
    "open_uri",
    "stage_root",
]

CACHE_ENV = "SHARPSCALE_DATA_CACHE"
DEFAULT_CACHE = "~/.cache/sharpscale/data"
MANIFEST = ".sharpscale-manifest.json"
_MANIFEST_VERSION = 1
_CHUNK = 1 << 20
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_log = logging.getLogger(__name__)

# Staged directories this process has hashed completely, with the sizes and mtimes it saw then: a trial that
# loads the same root again re-reads only the file metadata, not every byte.
_verified: dict[Path, tuple] = {}


class StagingError(UserError):
    """A data root URI cannot be opened or copied; the message names the URI (its credentials redacted), the
    reason and the fix."""

    def __init__(self, message: str):
        from trainables.secrets import redact

        super().__init__(redact(message))


def is_uri(root: object) -> bool:
    """True for `scheme://...` roots (s3://, gs://, file://, hdfs://, ...); False for local or shared paths."""
    return isinstance(root, str) and bool(_URI.match(root))


def cache_dir() -> Path:
    """The node-local directory of staged roots: $SHARPSCALE_DATA_CACHE, else ~/.cache/sharpscale/data."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def _normalise(uri: str) -> str:
    # s3://b/cifar10/ and s3://b/cifar10 are one root; file:/// stays itself.
    return re.sub(r"(?<=[^/])/+$", "", uri)


def cache_path(root: str) -> Path:
    """Where URI `root` is (or would be) staged on this node: a readable name plus a hash of the URI."""
    uri = _normalise(root)
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", uri.rsplit("/", 1)[-1] or "root")[:40]
    return cache_dir() / f"{tail}-{digest}"


def open_uri(uri: str):
    """(pyarrow filesystem, path inside it) for `uri`; StagingError when pyarrow cannot open it."""
    try:
        from pyarrow import fs as pafs
    except ImportError as exc:  # pragma: no cover - pyarrow is a declared dependency
        raise StagingError(
            f"data root {uri!r}: a URI needs pyarrow, which is not installed. Fix: pip install pyarrow"
        ) from exc
    try:
        filesystem, path = pafs.FileSystem.from_uri(uri)
    except (ValueError, NotImplementedError, OSError) as exc:
        raise StagingError(
            f"data root {uri!r}: pyarrow cannot open it ({exc}). Fix: use a scheme pyarrow.fs knows (s3://, gs://, "
            f"hdfs://, abfs://, file://) with this node's credentials for it, or a local or shared path."
        ) from exc
    return filesystem, path.rstrip("/") or "/"


def _fix_upload(uri: str) -> str:
    return f"upload the dataset there (e.g. `sharpscale data fetch cifar10 --to {uri}`) or correct the URI"


def _source_files(uri: str) -> tuple[object, list[tuple[str, str, int | None]], list[str]]:
    """The filesystem, [(path in the store, relative path, size)] of every file under `uri`, and its sub-directories."""
    from pyarrow import fs as pafs

    filesystem, base = open_uri(uri)
    try:
        info = filesystem.get_file_info(base)
        if info.type == pafs.FileType.NotFound:
            raise StagingError(f"data root {uri!r}: does not exist. Fix: {_fix_upload(uri)}.")
        if info.type != pafs.FileType.Directory:
            raise StagingError(
                f"data root {uri!r}: is a file, not a directory. Fix: point data.root at the directory that holds "
                f"the dataset (for CIFAR, the one holding cifar-10-batches-py), not at an archive."
            )
        entries = filesystem.get_file_info(pafs.FileSelector(base, recursive=True))
    except OSError as exc:
        raise StagingError(
            f"data root {uri!r}: cannot be listed ({exc}). Fix: check this node's credentials and network for it."
        ) from exc
    files, dirs = [], []
    prefix = base.rstrip("/") + "/"
    for entry in entries:
        if not entry.path.startswith(prefix):
            continue
        rel = PurePosixPath(entry.path[len(prefix) :])
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise StagingError(
                f"data root {uri!r}: lists an entry outside itself ({entry.path!r}). Fix: check the store."
            )
        if str(rel) == MANIFEST:
            continue  # a staged copy uploaded back: its manifest is rebuilt here
        if entry.type == pafs.FileType.File:
            files.append((entry.path, str(rel), entry.size))
        elif entry.type == pafs.FileType.Directory:
            dirs.append(str(rel))
    if not files:
        raise StagingError(f"data root {uri!r}: is an empty directory. Fix: {_fix_upload(uri)}.")
    return filesystem, files, dirs


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _read_manifest(target: Path, uri: str) -> dict | None:
    try:
        manifest = json.loads((target / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(manifest, dict) and manifest.get("version") == _MANIFEST_VERSION and manifest.get("uri") == uri
    return manifest if ok and isinstance(manifest.get("files"), dict) else None


def _fingerprint(target: Path, manifest: dict) -> tuple | None:
    """Sizes and mtimes of the manifest's files, or None when one is missing or has the wrong size."""
    seen = []
    for rel, facts in sorted(manifest["files"].items()):
        try:
            st = (target / rel).stat()
        except OSError:
            return None
        if st.st_size != facts.get("size"):
            return None
        seen.append((rel, st.st_size, st.st_mtime_ns))
    return tuple(seen)


def _check(target: Path, uri: str, *, deep: bool) -> bool:
    manifest = _read_manifest(target, uri)
    if manifest is None:
        return False
    fingerprint = _fingerprint(target, manifest)
    if fingerprint is None:
        return False
    if not deep:
        return True
    if _verified.get(target) == fingerprint:
        return True
    for rel, facts in manifest["files"].items():
        if _sha256(target / rel) != facts.get("sha256"):
            return False
    _verified[target] = fingerprint
    return True


def is_staged(root: str) -> bool:
    """Whether URI `root` is in this node's cache, complete by its manifest's file list and sizes (no hashing)."""
    return is_uri(root) and _check(cache_path(root), _normalise(root), deep=False)


@contextlib.contextmanager
def _locked(lock_file: Path, mode: int) -> Iterator[None]:
    # flock: the kernel drops the lock when its holder dies, so a killed trial never leaves the cache locked.
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)


def _copy(filesystem, src: str, dst: Path, size: int | None, uri: str, rel: str) -> dict:
    h, n = hashlib.sha256(), 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        with filesystem.open_input_stream(src) as stream, open(dst, "wb") as out:
            while chunk := stream.read(_CHUNK):
                h.update(chunk)
                out.write(chunk)
                n += len(chunk)
    except OSError as exc:
        raise StagingError(
            f"data root {uri!r}: copying {rel!r} failed ({exc}). Fix: check this node's credentials, network and "
            f"free space in {cache_dir()} (${CACHE_ENV}); the next trial on this node tries again."
        ) from exc
    if size is not None and n != size:
        raise StagingError(
            f"data root {uri!r}: read {n} bytes of {rel!r}, the store lists {size}. "
            f"Fix: the object changed while it was copied or the read was cut short; the next trial tries again."
        )
    return {"size": n, "sha256": h.hexdigest()}


def _stage(uri: str, target: Path) -> None:
    filesystem, files, dirs = _source_files(uri)
    _log.info("staging %s (%d files) into %s", uri, len(files), target)
    cache = target.parent
    # Only the holder of the exclusive lock writes here, so any temp dir of this root is a dead stager's leftover.
    for stale in cache.glob(f".{target.name}.*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=cache))
    try:
        for rel in dirs:
            (tmp / rel).mkdir(parents=True, exist_ok=True)
        manifest = {
            "version": _MANIFEST_VERSION,
            "uri": uri,
            "files": {rel: _copy(filesystem, src, tmp / rel, size, uri, rel) for src, rel, size in files},
        }
        # Written last: a copy cut short has no manifest and is never taken for a complete one.
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        if target.exists():
            old = cache / f".{target.name}.old-{os.getpid()}"
            os.rename(target, old)
            shutil.rmtree(old, ignore_errors=True)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def stage_root(root: str | os.PathLike) -> Path:
    """The local directory to read data root `root` from.

    A local or shared path is returned as it is (with ~ expanded): nothing is copied. A URI (any scheme
    pyarrow.fs opens: s3://, gs://, file://, ...) is copied once per node into `cache_path(root)` under
    `cache_dir()`: under an exclusive file lock (trials starting together on one node wait for the first),
    into a temp dir renamed into place when complete, with a manifest of every file's size and sha256
    written last. Before each use the copy is checked against its manifest (fully hashed once per process);
    a half-copied or corrupted copy is staged again. Raises StagingError naming the URI, reason and fix.
    """
    if not is_uri(str(root)):
        return Path(root).expanduser()
    uri = _normalise(str(root))
    target = cache_path(uri)
    cache = target.parent
    cache.mkdir(parents=True, exist_ok=True)
    lock = cache / f"{target.name}.lock"
    with _locked(lock, fcntl.LOCK_SH):
        if _check(target, uri, deep=True):
            return target
    with _locked(lock, fcntl.LOCK_EX):
        # Another process may have staged it between the two locks.
        if not _check(target, uri, deep=True):
            _stage(uri, target)
            # The copy was hashed as it was written: this process need not read it again.
            manifest = _read_manifest(target, uri)
            fingerprint = _fingerprint(target, manifest) if manifest else None
            if fingerprint is None:
                raise StagingError(
                    f"data root {uri!r}: the staged copy in {target} does not match its manifest right after staging. "
                    f"Fix: check that nothing else writes to {cache_dir()} (${CACHE_ENV})."
                )
            _verified[target] = fingerprint
    return target
