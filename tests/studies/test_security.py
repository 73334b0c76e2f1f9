"""Issue 36's security cases: no code read from the study's storage (the compile caches live on the node's own disk,
private to the trial's user), host checks that parse addresses (no DNS rebinding through a name that begins like a
private address), one credential rule for every URI, and servers that say why they could not start.
"""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# --- 1. Nothing executable read from shared storage --------------------------------------------------------------


class _Planted:
    """A cache entry as an attacker who can write the study's storage would plant it: unpickling it runs code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def _trial(tiny_model, **train) -> dict:
    return {
        "model": tiny_model("mixer"),
        "data": {"name": "digits", "img_size": 16, "batch_size": 64, "fraction": 0.2},
        "optimizer": {"method": "none", "base": "sgd", "lr": 0.05},
        "schedule": {"epochs": 1, "warmup_epochs": 0},
        "train": {"device": "cpu", "seed": 3, "threads": 1, "compile": "default", **train},
    }


# The trial as a study's trial runs it (trainables.ray_train._execute, Tune's report replaced by a list), with the
# payload a study's driver handed it before issue 36: the study storage's compile_cache named in it.
_STUDY_TRIAL = """
import json, sys
from trainables.config import TrialConfig
from trainables.ray_train import _execute
cfg, payload = TrialConfig.load(json.loads(sys.argv[1])), json.loads(sys.argv[2])
class Checkpoint:
    from_directory = staticmethod(lambda path: path)
_execute(cfg, checkpoint=None, sink=lambda metrics, checkpoint: None, checkpoint_cls=Checkpoint, recorder=None, metric="val_acc",
         probe_from=payload)
"""
_FIT = "import json, sys; from trainables import fit; fit(json.loads(sys.argv[1]))"


def _python(code: str, *args: str, tmpdir: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
    env.update(PYTHONPATH=str(REPO), TMPDIR=str(tmpdir))
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.timeout(900)
def test_a_planted_compile_cache_entry_in_the_study_storage_is_never_loaded(tiny_model, tmp_path):
    storage = tmp_path / "storage"
    shared_cache = storage / "compile_cache"
    node = tmp_path / "node"
    node.mkdir(mode=0o700)
    # An earlier trial compiled the same graphs into the storage's cache (a study's trials all did, before issue 36).
    done = _python(_FIT, json.dumps(_trial(tiny_model, compile_cache=str(shared_cache))), tmpdir=node)
    assert done.returncode == 0, done.stderr[-3000:]
    entries = [p for p in shared_cache.rglob("*") if p.is_file()]
    assert entries, "the first trial compiled nothing into the cache"
    # Someone who can write the storage replaces every entry: pickles by a pickle that runs code, modules by code.
    marker = tmp_path / "planted-code-ran"
    payload = pickle.dumps(_Planted(marker))
    for entry in entries:
        if entry.suffix == ".py":
            entry.write_text(f"open({str(marker)!r}, 'w').write('ran')\n" + entry.read_text())
        elif entry.suffix not in (".so", ".cpp", ".h", ".lock"):
            entry.write_bytes(payload)
    ran = _python(
        _STUDY_TRIAL, json.dumps(_trial(tiny_model)), json.dumps({"compile_cache": str(shared_cache)}), tmpdir=node
    )
    assert not marker.exists(), "a trial ran code planted in the study storage's compile cache"
    assert ran.returncode == 0, ran.stderr[-3000:]
    # It compiled into its own node-local cache, private to its user.
    own = node / f"sharpscale-compile-{os.getuid()}"
    assert own.is_dir() and stat.S_IMODE(own.stat().st_mode) == 0o700
    assert any(p.is_file() for p in own.rglob("*"))


def test_the_study_payload_names_no_compile_cache():
    # The driver hands its trials no cache on the study's storage (studies/runner.py built one until issue 36).
    text = (REPO / "studies" / "runner.py").read_text()
    assert '"compile_cache"' not in text


@pytest.fixture
def node_tmp(tmp_path, monkeypatch):
    """A private temporary directory standing for the node's TMPDIR, and the TORCH* variables put back after."""
    import tempfile

    node = tmp_path / "node"
    node.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(node))
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.setenv(var, "unset-by-the-test")
    return node


def test_the_default_compile_cache_is_node_local_and_private(node_tmp):
    from trainables.compiled import use_cache_dir

    where = use_cache_dir(None)
    assert where == node_tmp / f"sharpscale-compile-{os.getuid()}"
    assert stat.S_IMODE(where.stat().st_mode) == 0o700
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(where)
    assert os.environ["TRITON_CACHE_DIR"] == str(where / "triton")


@pytest.mark.parametrize(
    "case, rule",
    [
        ("default-open", "mode 777"),  # someone made the default folder first, writable by all
        ("explicit-readable", "mode 755"),
        ("parent-writable", "another user could replace"),
        ("link-to-open", "another user could replace"),
        ("a-file", "not a directory"),
    ],
)
def test_a_compile_cache_another_user_could_write_is_refused(case, rule, node_tmp):
    from trainables.compiled import use_cache_dir
    from trainables.errors import TrialRefused

    default = node_tmp / f"sharpscale-compile-{os.getuid()}"
    path = None
    if case == "default-open":
        default.mkdir()
        default.chmod(0o777)
    elif case == "explicit-readable":
        path = node_tmp / "mine"
        path.mkdir()
        path.chmod(0o755)
    elif case == "parent-writable":
        shared = node_tmp / "shared"
        shared.mkdir()
        shared.chmod(0o777)  # writable by all, not sticky: anyone may rename the cache folder away and plant another
        path = shared / "cache"
    elif case == "link-to-open":
        shared = node_tmp / "shared"
        shared.mkdir()
        shared.chmod(0o777)
        (shared / "cache").mkdir(mode=0o700)
        default.symlink_to(shared / "cache")
    else:
        default.write_text("")
    with pytest.raises(TrialRefused, match=rule) as err:
        use_cache_dir(path)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "unset-by-the-test"
    assert "Fix:" in str(err.value)
