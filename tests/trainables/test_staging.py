"""trainables.data.staging: a URI data root staged once per node, locked, atomic and verified; a local path used in place."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainables.data import load_dataset, staging
from trainables.data.staging import (
    MANIFEST,
    StagingError,
    cache_dir,
    cache_path,
    is_staged,
    is_uri,
    stage_root,
)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A node cache of the test's own; the per-process record of hashed copies starts empty."""
    where = tmp_path / "node-cache"
    monkeypatch.setenv(staging.CACHE_ENV, str(where))
    monkeypatch.setattr(staging, "_verified", {})
    return where


@pytest.fixture
def source(tmp_path, write_fake_cifar) -> tuple[str, Path, dict]:
    """A fake CIFAR-10 in a directory reached through a file:// URI: (uri, directory, arrays written)."""
    where = tmp_path / "bucket" / "cifar10"
    written = write_fake_cifar(where, "cifar10")
    return where.as_uri(), where, written


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_uri_rule_and_cache_location(monkeypatch):
    assert is_uri("s3://bucket/cifar10") and is_uri("gs://b/x") and is_uri("file:///data/cifar10")
    assert (
        not is_uri("/data/cifar10") and not is_uri("~/data/cifar10") and not is_uri("data/s3:/x") and not is_uri(None)
    )
    monkeypatch.delenv(staging.CACHE_ENV, raising=False)
    assert cache_dir() == Path.home() / ".cache" / "sharpscale" / "data"
    monkeypatch.setenv(staging.CACHE_ENV, "/somewhere/else")
    assert cache_path("s3://b/cifar10").parent == Path("/somewhere/else")
    # One root, one cache entry, whatever its trailing slash; another root, another entry.
    assert cache_path("s3://b/cifar10/") == cache_path("s3://b/cifar10")
    assert cache_path("s3://b/cifar10") != cache_path("s3://c/cifar10")
    assert cache_path("s3://b/cifar10").name.startswith("cifar10-")


def test_local_path_is_used_in_place(cache, tmp_path, monkeypatch):
    assert stage_root(str(tmp_path)) == tmp_path
    assert stage_root(tmp_path) == tmp_path
    monkeypatch.setenv("HOME", str(tmp_path))
    assert stage_root("~/data/cifar10") == tmp_path / "data" / "cifar10"
    assert not cache.exists()  # nothing was copied anywhere


def test_uri_is_staged_once_with_a_manifest_and_loads(cache, source):
    uri, where, written = source
    assert not is_staged(uri)
    staged = stage_root(uri)
    assert staged == cache_path(uri) and staged.parent == cache
    assert is_staged(uri) and is_staged(uri + "/")
    files = _tree(where)
    assert {k: v for k, v in _tree(staged).items() if k != MANIFEST} == files
    manifest = json.loads((staged / MANIFEST).read_text())
    assert manifest["uri"] == uri and sorted(manifest["files"]) == sorted(files)
    assert all(manifest["files"][k]["size"] == len(v) for k, v in files.items())
    # No temp dir is left beside it.
    assert sorted(p.name for p in cache.iterdir()) == sorted([staged.name, f"{staged.name}.lock"])

    # Used, not copied again: the store may even be gone.
    inode = (staged / "cifar-10-batches-py" / "test_batch").stat().st_ino
    for f in where.rglob("*"):
        if f.is_file():
            f.unlink()
    assert stage_root(uri) == staged
    bundle = load_dataset("cifar10", root=uri, augment="none")
    assert (staged / "cifar-10-batches-py" / "test_batch").stat().st_ino == inode
    assert bundle.num_train_full == len(written["train_labels"])
    assert [bundle.val[k][1] for k in range(len(bundle.val))] == written["test_labels"].tolist()


@pytest.mark.parametrize("damage", ["flip_a_byte", "truncate", "no_manifest", "delete_a_file"])
def test_a_corrupt_or_half_copied_cache_is_staged_again(cache, source, damage):
    uri, where, _ = source
    staged = stage_root(uri)
    victim = staged / "cifar-10-batches-py" / "data_batch_2"
    if damage == "flip_a_byte":
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF  # same size: only the hash tells
        victim.write_bytes(bytes(data))
    elif damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:100])
    elif damage == "no_manifest":  # what a copy cut short looks like
        (staged / MANIFEST).unlink()
    else:
        victim.unlink()
    assert stage_root(uri) == staged
    assert {k: v for k, v in _tree(staged).items() if k != MANIFEST} == _tree(where)
    assert is_staged(uri)


def test_a_new_process_hashes_the_copy_before_use(cache, source):
    uri, where, _ = source
    staged = stage_root(uri)
    victim = staged / "cifar-10-batches-py" / "batches.meta"
    data = bytearray(victim.read_bytes())
    data[-3] ^= 0x01
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(0, 0))  # even with its old size and an unhelpful mtime
    staging._verified.clear()  # a fresh process knows nothing
    stage_root(uri)
    assert victim.read_bytes() == (where / "cifar-10-batches-py" / "batches.meta").read_bytes()


def test_leftovers_of_a_killed_stager_are_removed(cache, source):
    uri, _, _ = source
    target = cache_path(uri)
    cache.mkdir(parents=True)
    leftover = cache / f".{target.name}.tmp-dead"
    (leftover / "cifar-10-batches-py").mkdir(parents=True)
    (leftover / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"half")
    stage_root(uri)
    assert not leftover.exists()


def test_bad_uris_are_refused_naming_uri_reason_and_fix(cache, tmp_path):
    missing = (tmp_path / "nowhere").as_uri()
    with pytest.raises(StagingError, match="does not exist") as info:
        stage_root(missing)
    assert missing in str(info.value) and "sharpscale data fetch cifar10 --to" in str(info.value)
    (tmp_path / "file.tar.gz").write_bytes(b"x")
    with pytest.raises(StagingError, match="is a file, not a directory.*Fix:"):
        stage_root((tmp_path / "file.tar.gz").as_uri())
    (tmp_path / "empty").mkdir()
    with pytest.raises(StagingError, match="empty directory.*Fix:"):
        stage_root((tmp_path / "empty").as_uri())
    with pytest.raises(StagingError, match="pyarrow cannot open it.*Fix:"):
        stage_root("nosuchscheme://bucket/cifar10")
    assert not any(p.name.startswith(".") for p in cache.iterdir())


_CHILD = textwrap.dedent(
    """
    import importlib.util, logging, sys
    # The module alone, not the package: importing torch four times at once would be the slow part.
    spec = importlib.util.spec_from_file_location("staging_alone", sys.argv[2])
    staging = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(staging)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
    print("ready", flush=True)
    print(staging.stage_root(sys.argv[1]), flush=True)
    """
)


@pytest.mark.timeout(120)
def test_trials_starting_together_on_one_node_stage_once(cache, source):
    uri, where, _ = source
    target = cache_path(uri)
    cache.mkdir(parents=True)
    # Hold the lock while four processes start, so that all of them want the root at the same moment.
    fd = os.open(cache / f"{target.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    procs = []
    try:
        for _ in range(4):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _CHILD, uri, staging.__file__],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        assert not target.exists()
    finally:
        os.close(fd)
    paths, staged = set(), 0
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        paths.add(out.strip().splitlines()[-1])
        staged += err.count(f": staging {uri} ")
    assert paths == {str(target)}
    assert staged == 1
    assert {k: v for k, v in _tree(target).items() if k != MANIFEST} == _tree(where)
