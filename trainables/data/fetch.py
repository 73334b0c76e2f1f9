"""Fetching a dataset's official archive (its URL, md5 and layout: the registry's, trainables.data.registry): download,
md5 check, safe unpacking, upload to a URI; and the check that a data root holds a dataset's layout."""

from __future__ import annotations

import difflib
import hashlib
import os
import posixpath
import re
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from trainables.data.registry import DATASETS, Archive, expected_layout
from trainables.data.staging import StagingError, is_uri, open_uri
from trainables.errors import UserError

__all__ = ["ARCHIVES", "Archive", "FetchError", "expected_layout", "fetch_dataset", "layout_problem"]

_CHUNK = 1 << 20
_DOWNLOAD_TIMEOUT_S = 60


#: Each dataset's official archive: the registry's (trainables.data.registry), for the datasets that have one.
ARCHIVES: dict[str, Archive] = {name: spec.archive for name, spec in DATASETS.items() if spec.archive is not None}


class FetchError(UserError):
    """A dataset cannot be fetched, checked, unpacked or uploaded; the message names the value, the rule and the fix."""

    def __init__(self, message: str):
        from trainables.secrets import redact

        super().__init__(redact(message))  # an echoed --url or --to never shows its credentials


def _kinds(root: str | Path, paths: list[str]) -> dict[str, str | None]:
    """'file', 'dir' or None for each relative path under a local root or a URI root."""
    if not is_uri(str(root)):
        base = Path(root).expanduser()
        return {p: "dir" if (base / p).is_dir() else "file" if (base / p).is_file() else None for p in paths}
    from pyarrow import fs as pafs

    filesystem, base = open_uri(str(root))
    infos = filesystem.get_file_info([posixpath.join(base, p.rstrip("/")) for p in paths])
    kind = {pafs.FileType.File: "file", pafs.FileType.Directory: "dir"}
    return {p: kind.get(info.type) for p, info in zip(paths, infos)}


def layout_problem(name: str, root: str | Path) -> str | None:
    """None when `root` (a local path or a URI) holds dataset `name`'s files where its loader looks, else why not.

    Only names are checked, not contents: a quick check a node can run before any trial.
    """
    spec = DATASETS.get(name)
    layout = spec.root_layout if spec is not None else None
    if layout is None:
        return None
    alternatives = layout.alternatives
    kinds = _kinds(root, sorted({p for alt in alternatives for p in alt}))

    def missing(alt: tuple[str, ...]) -> list[str]:
        return [p for p in alt if kinds[p] != ("dir" if p.endswith("/") else "file")]

    closest = min(alternatives, key=lambda alt: len(missing(alt)))
    if not missing(closest):
        return None
    return f"does not hold the {name} layout: expected {expected_layout(name)}; missing: {', '.join(missing(closest))}"


def _archive(name: str) -> Archive:
    if name in ARCHIVES:
        return ARCHIVES[name]
    close = difflib.get_close_matches(str(name), list(ARCHIVES), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise FetchError(
        f"dataset: must be one of {sorted(ARCHIVES)} (the datasets with an official archive), got {name!r}{hint}. "
        f"Fix: name one of those; put other data (an ImageFolder tree) in place yourself."
    )


def _download(name: str, url: str, path: Path) -> str:
    """Save `url` to `path`; return the md5 of what arrived."""
    h = hashlib.md5(usedforsecurity=False)
    request = urllib.request.Request(url, headers={"User-Agent": "sharpscale"})
    try:
        with urllib.request.urlopen(request, timeout=_DOWNLOAD_TIMEOUT_S) as response, open(path, "wb") as out:
            while chunk := response.read(_CHUNK):
                h.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        if isinstance(exc, urllib.error.HTTPError):
            reason = f"HTTP {exc.code} {exc.reason}"
        else:
            reason = getattr(exc, "reason", None) or exc
        raise FetchError(
            f"--url {url!r}: the {name} archive could not be downloaded ({reason}). Fix: check that this machine "
            f"reaches it, or pass --url with a reachable mirror of the archive (and --md5 if its archive differs)."
        ) from exc
    return h.hexdigest()


def _member_problem(member: tarfile.TarInfo, dest: Path) -> str | None:
    name = PurePosixPath(member.name)
    if member.name.startswith("/") or name.is_absolute():
        return "an absolute path"
    if ".." in name.parts:
        return "a '..' component"
    if member.ischr() or member.isblk() or member.isfifo():
        return "a device or FIFO"
    if member.issym() or member.islnk():
        link = member.linkname
        if link.startswith("/"):
            return f"a link to the absolute path {link!r}"
        # A symlink is relative to its own folder, a hard link to the archive's root.
        start = dest / name.parent if member.issym() else dest
        resolved = os.path.normpath(start / link)
        if os.path.commonpath([resolved, str(dest)]) != str(dest):
            return f"a link to {link!r}, outside the target directory"
    return None


def _extract(name: str, archive: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            bad = [f"{m.name!r} ({why})" for m in members if (why := _member_problem(m, dest.resolve()))]
            if bad:
                raise FetchError(
                    f"archive: refusing to unpack members that would land outside the target directory: "
                    f"{'; '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}. Fix: this is not the official {name} "
                    f"archive; fetch it from the official URL or a trusted mirror."
                )
            # The data filter (Python >= 3.11.4) refuses the same, and special files, again as it unpacks.
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, members=members, filter="data")
            else:  # pragma: no cover - every member was checked above
                tar.extractall(dest, members=members)
    except tarfile.FilterError as exc:
        raise FetchError(
            f"archive: refusing to unpack it ({exc}). Fix: this is not the official {name} archive; fetch it from "
            f"the official URL or a trusted mirror."
        ) from exc
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise FetchError(
            f"archive: cannot be unpacked as a .tar.gz ({type(exc).__name__}: {exc}). Fix: check that --url names "
            f"the python-version {name} archive."
        ) from exc


def _upload(folder: Path, uri: str, sub: str) -> None:
    filesystem, base = open_uri(uri)
    top = posixpath.join(base, sub)
    filesystem.create_dir(top, recursive=True)
    for path in sorted(folder.rglob("*")):
        dest = posixpath.join(top, path.relative_to(folder).as_posix())
        if path.is_dir():
            filesystem.create_dir(dest, recursive=True)
            continue
        with open(path, "rb") as src, filesystem.open_output_stream(dest) as out:
            shutil.copyfileobj(src, out, _CHUNK)


def fetch_dataset(
    name: str,
    to: str | os.PathLike,
    *,
    url: str | None = None,
    md5: str | None = None,
    log: Callable[[str], None] | None = None,
) -> str:
    """Download dataset `name`'s official archive, check its md5, unpack it safely and put it at `to`.

    `to` is a local directory (the dataset's folder, e.g. cifar-10-batches-py, is created in it, replacing an
    older one whole) or a URI that pyarrow.fs opens (s3://, gs://, file://, ...), where the folder is uploaded.
    Either way `to` is then what `data.root` names. `url` and `md5` override the official ones (mirrors).
    Returns `to` as data.root should say it; raises FetchError naming the value, the rule and the fix.
    """
    archive = _archive(name)
    url, md5 = _source(archive, url, md5, to)
    say = log or (lambda _msg: None)
    to = str(to)
    remote = is_uri(to)
    where, scratch_parent = _destination(to, remote)
    with tempfile.TemporaryDirectory(prefix=".sharpscale-fetch-", dir=scratch_parent) as scratch:
        scratch = Path(scratch)
        folder = _unpacked(name, archive, url, md5, scratch, say)
        if remote:
            say(f"uploading {archive.folder} to {where}")
            try:
                _upload(folder, where, archive.folder)
            except OSError as exc:
                raise FetchError(
                    f"--to {to!r}: uploading failed ({exc}). Fix: check this machine's credentials and access to it."
                ) from exc
        else:
            final = Path(where) / archive.folder
            if final.exists():
                os.rename(final, scratch / "replaced")
            os.rename(folder, final)
    say(f"{name} is at {where}/{archive.folder}")
    return where


def _source(archive: Archive, url: str | None, md5: str | None, to: str | os.PathLike) -> tuple[str, str]:
    """The archive's URL and md5 (a mirror's, else the official ones), checked: no credentials in --url or --to,
    an md5 of 32 hex digits."""
    from trainables.secrets import credential_problem

    for flag, value in (("--url", url), ("--to", str(to))):
        if value and (problem := credential_problem(flag, value)):
            raise FetchError(problem)
    md5 = (md5 or archive.md5).strip().lower()
    if not re.fullmatch(r"[0-9a-f]{32}", md5):
        raise FetchError(f"--md5: must be 32 hexadecimal digits, got {md5!r}. Fix: copy the mirror's md5 whole.")
    return url or archive.url, md5


def _destination(to: str, remote: bool) -> tuple[str, Path | None]:
    """Where the folder goes (a URI whose scheme opens, or a local directory, made if absent), and the local
    directory to unpack in (None: a temporary one, for an upload)."""
    if remote:
        try:
            open_uri(to)  # an unknown scheme fails now, not after the download
        except StagingError as exc:
            raise FetchError(f"--to: {exc}") from None
        return to.rstrip("/"), None
    local = Path(to).expanduser()
    if local.exists() and not local.is_dir():
        raise FetchError(f"--to {to!r}: is a file, not a directory. Fix: name a directory (it is created if absent).")
    local.mkdir(parents=True, exist_ok=True)
    # Unpacked beside its destination, so that putting it in place is one rename on one filesystem.
    return str(local.resolve()), local


def _unpacked(name: str, archive: Archive, url: str, md5: str, scratch: Path, say: Callable[[str], None]) -> Path:
    """The archive downloaded into `scratch`, its md5 checked, unpacked safely: the folder holding every file the
    loader reads."""
    say(f"downloading {url}")
    got = _download(name, url, scratch / "archive.tar.gz")
    if got != md5:
        raise FetchError(
            f"md5: the archive from {url} has md5 {got}, expected {md5}. Fix: the download is corrupt or not the "
            f"official {name} python-version archive; run again, or fetch from the official URL "
            f"({archive.url}); pass --md5 only for a mirror you trust whose archive differs."
        )
    say(f"md5 {got} matches; unpacking")
    _extract(name, scratch / "archive.tar.gz", scratch / "unpacked")
    folder = scratch / "unpacked" / archive.folder
    absent = [f for f in archive.files if not (folder / f).is_file()]
    if absent:
        raise FetchError(
            f"archive: has no {archive.folder}/{{{', '.join(absent)}}}, which its loader reads. "
            f"Fix: --url must name the python-version {name} archive ({archive.url})."
        )
    return folder
