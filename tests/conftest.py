"""Shared fixtures: quiet offline environment, one real local Ray cluster per session, small study files, fake data."""

import os

# The session's local Ray clusters, and the `sharpscale run` drivers the tests start, stay on 127.0.0.1 (what a local
# study does: studies.cli.LOOPBACK_RAY_ENV). The multi-node tests turn it back on for their own nodes.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import contextlib
import copy
import inspect
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

# The quiet offline environment of the session and of every process its tests start: set before Ray, MLflow or timm
# are imported anywhere in the session (numpy, pytest and torch, above, bring none of them).
QUIET_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
for _key, _value in QUIET_ENV.items():
    os.environ.setdefault(_key, _value)

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
OBJECT_STORE_BYTES = 256 * 1024 * 1024


# The files that take minutes (Ray clusters, servers, whole studies), longest first, as the last full run measured
# them (CPU-s, docs/testing.md). `make test` hands whole files to two pytest-xdist workers in collection order
# (--no-loadscope-reorder: xdist would otherwise order them by number of tests); run last, one of these would leave a
# worker alone on it for minutes at the end, so they go first and the short files fill in around them.
_LONG_FILES = (
    "tests/cluster/test_two_node.py",
    "tests/studies/test_shipped.py",
    "tests/studies/test_adversarial.py",
    "tests/studies/test_failures.py",
    "tests/studies/test_stops.py",
    "tests/test_end_to_end.py",
    "tests/trainables/test_distributed.py",
    "tests/studies/test_multiworker.py",
    "tests/studies/test_hardening.py",
    "tests/studies/test_schedulers.py",
    "tests/cluster/test_sim_scale.py",
    "tests/trainables/test_device_check.py",
    "tests/cluster/test_cluster_storage.py",
    "tests/trainables/test_tune_resume.py",
    "tests/studies/test_confirm.py",
    "tests/studies/test_launches.py",
    "tests/studies/test_state.py",
    "tests/studies/test_claims.py",
)
# The long files that start no Ray cluster (seconds a test, a minute or two a file). They run after every file that
# asks for the session's Ray cluster (`ray_cluster`), so that each worker stops its cluster before them instead of
# keeping it idle to the end: an idle local cluster (GCS, raylet, dashboard and its modules, agents, log monitor, idle
# workers) burns about 4 CPU-s a minute of the two cores (measured here, 2026-11-27).
_LONG_FILES_WITHOUT_RAY = (
    "tests/trainables/test_compiled.py",
    "tests/trainables/test_dali.py",  # DALI CPU pipelines with RandAugment: minutes on 2 cores
    "tests/cluster/test_server.py",
    "tests/analysis/test_notebooks.py",
    "tests/studies/test_ui.py",
)


def _file(item) -> str:
    return item.nodeid.split("::", 1)[0]


def _asks_for_ray(item) -> bool:
    return "ray_cluster" in item.fixturenames  # directly or through a fixture of its own


# What a test's code starts, read from its source, the sources of the fixtures it uses and of the helpers (functions,
# classes) of their own modules that these name, followed to the end: a Ray cluster (a study run in-process or by the
# CLI, in-process or in a subprocess, a `ray start` node, `ray.init`, the scale simulation's script) or a server
# process (the MLflow UI or server, optuna-dashboard). The session cluster is also seen through the fixture
# (`_asks_for_ray`); a file of _LONG_FILES / _LONG_FILES_WITHOUT_RAY is `slow` whole.
_STARTS_RAY = (
    "run_study(",
    "ray.init(",
    '"ray", "start"',
    '"start", "--block"',
    "ray start",
    '.run("run"',
    '.start("run"',
    '"studies.cli", "run", str(',
    '"resume"',
    "sim_scale.py",
)
_STARTS_SERVER = (
    '.start("ui"',
    '.start("dashboard"',
    '.start("server"',
    '"server", "--',
    "mlflow server",
    "start_server(",
    "sim_scale.py",
)


def _own_helpers(func) -> tuple:
    """`func` and, followed to the end, the functions and classes of its own module that its code names, and the
    strings of that module it names (a script a subprocess runs, `python -c SCRIPT`)."""
    found, seen, stack = [], set(), [func]
    while stack:
        obj = inspect.unwrap(stack.pop())
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        found.append(obj)
        codes = [obj.__code__] if inspect.isfunction(obj) else []
        if inspect.isclass(obj):
            codes = [f.__code__ for f in vars(obj).values() if inspect.isfunction(f)]
        module = getattr(obj, "__module__", None)
        scope = getattr(obj, "__globals__", None) or vars(sys.modules.get(module, object()))
        while codes:
            code = codes.pop()
            codes.extend(c for c in code.co_consts if inspect.iscode(c))
            for name in code.co_names:
                helper = scope.get(name)
                if (inspect.isfunction(helper) or inspect.isclass(helper)) and helper.__module__ == module:
                    stack.append(helper)
                elif isinstance(helper, str) and len(helper) > 20:
                    found.append(helper)
    return tuple(found)


# Per function and per object, once a session: a parametrized test and a common fixture recur in hundreds of items,
# and inspect.getsource of a class parses its whole module (29 CPU-s of collection uncached, 2,066 tests).
_HELPERS: dict = {}
_SOURCES: dict = {}


def _source_of(obj) -> str:
    if isinstance(obj, str):
        return obj
    key = id(obj)
    if key not in _SOURCES:
        try:
            _SOURCES[key] = (obj, inspect.getsource(obj))
        except (OSError, TypeError):  # a test or fixture without Python source of its own
            _SOURCES[key] = (obj, "")
    return _SOURCES[key][1]


def _source(item) -> str:
    """The test's source, its fixtures' and their own modules' helpers', a call's arguments joined to its line."""
    roots = [item.function] if hasattr(item, "function") else []
    for name in item.fixturenames:
        roots += [fixturedef.func for fixturedef in item._fixtureinfo.name2fixturedefs.get(name, ())]
    parts, seen = [], set()
    for root in roots:
        if id(root) not in _HELPERS:
            _HELPERS[id(root)] = (root, _own_helpers(root))
        for obj in _HELPERS[id(root)][1]:
            if id(obj) not in seen:
                seen.add(id(obj))
                parts.append(_source_of(obj))
    return re.sub(r"\(\s+", "(", "\n".join(parts))


def _mark_by_use(items) -> None:
    """The markers `make test-fast` deselects on (`-m "not ray and not server and not slow"`), from what each test
    uses; a marker a test carries already (`@pytest.mark.ray`) stays."""
    long_files = set(_LONG_FILES + _LONG_FILES_WITHOUT_RAY)
    for item in items:
        source = _source(item)
        if _asks_for_ray(item) or any(s in source for s in _STARTS_RAY):
            item.add_marker(pytest.mark.ray)
        if any(s in source for s in _STARTS_SERVER) or any(name.endswith("server") for name in item.fixturenames):
            item.add_marker(pytest.mark.server)
        if _file(item) in long_files:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)  # marked before pytest's own hook deselects by `-m`
def pytest_collection_modifyitems(config, items):
    missing = [path for path in _LONG_FILES + _LONG_FILES_WITHOUT_RAY if not (REPO / path).is_file()]
    if missing:  # a renamed file would silently lose its place
        raise pytest.UsageError(
            f"tests/conftest.py: _LONG_FILES / _LONG_FILES_WITHOUT_RAY name files that do not exist: {missing}"
        )
    _mark_by_use(items)
    on_ray = {_file(item) for item in items if _asks_for_ray(item)}
    first = {path: i for i, path in enumerate(_LONG_FILES)}
    later = {path: i for i, path in enumerate(_LONG_FILES_WITHOUT_RAY)}
    # A file with a test that marks itself slow (test_security's planted compile cache: 116 CPU-s) goes with them:
    # left among the short files it could be the last file of a worker, the other idle beside it.
    for item in items:
        if item.get_closest_marker("slow") is not None:
            later.setdefault(_file(item), len(later))

    def place(item) -> tuple[int, int]:
        path = _file(item)
        if path in first:
            return 0, first[path]
        if path in on_ray:  # the short files that use the session's cluster, while it is up
            return 1, 0
        if path in later:
            return 2, later[path]
        return 3, 0

    items.sort(key=place)  # stable: within a place, files and tests keep their order


# SHARPSCALE_AUDIT_MARKERS=1: each test's markers are checked against the processes it started (sampled every
# 0.2 s below this pytest process): one that started a Ray node (raylet, gcs_server) or a server (`mlflow server`, a
# `sharpscale ui/server/dashboard`) without its marker fails, naming what the derivation above missed. Off by default:
# the sampling costs CPU the suite needs; run it after changing the rules or adding tests that start processes.
_AUDIT = os.environ.get("SHARPSCALE_AUDIT_MARKERS") == "1"
_STARTED_RAY = ("/raylet ", "/gcs_server ", "studies.cli run", "studies.cli resume")
_STARTED_SERVER = ("mlflow server", "mlflow ui", "studies.cli ui", "studies.cli server", "studies.cli dashboard")


_STARTED = pytest.StashKey[object]()


class _Started:
    """The command lines of this process's descendants seen since `reset`, sampled by a daemon thread."""

    def __init__(self) -> None:
        import threading

        import psutil

        self._me, self._lock, self.seen = psutil.Process(), threading.Lock(), set()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        import psutil

        while True:
            for proc in self._me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    line = " ".join(proc.cmdline()).replace("-m studies.cli", "studies.cli") + " "
                    with self._lock:
                        self.seen.add(line)
            time.sleep(0.2)

    def reset(self) -> set:
        with self._lock:
            seen, self.seen = self.seen, set()
        return seen


@pytest.fixture(autouse=_AUDIT)
def _audit_markers(request):
    """SHARPSCALE_AUDIT_MARKERS=1: fail a test that started Ray or a server without the marker that says so."""
    started = request.config.stash.get(_STARTED, None)
    if started is None:
        started = request.config.stash[_STARTED] = _Started()
    before = started.reset()
    yield
    new = started.reset() - before
    marks = {m.name for m in request.node.iter_markers()}
    for marker, signs in (("ray", _STARTED_RAY), ("server", _STARTED_SERVER)):
        found = sorted(line[:160] for line in new if any(s in line for s in signs))
        assert marker in marks or not found, (
            f"started {found[:3]} but is not marked {marker}: tests/conftest.py's _STARTS_* rules did not see it; "
            f"extend them or mark the test @pytest.mark.{marker}"
        )


_RAY_LAST_USE = pytest.StashKey[int]()
_POSITION = pytest.StashKey[dict]()


def pytest_collection_finish(session):
    """Where this session's last test that asks for the session's Ray cluster is, for `pytest_runtest_teardown`."""
    items = session.items
    session.config.stash[_RAY_LAST_USE] = max((i for i, item in enumerate(items) if _asks_for_ray(item)), default=-1)
    session.config.stash[_POSITION] = {item.nodeid: i for i, item in enumerate(items)}


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item, nextitem):
    """Stop the session's Ray cluster once this worker's next test comes after every test that asks for it.

    Each pytest-xdist worker runs its files in collection order (`make test`: --no-loadscope-reorder), so a worker past
    the last `ray_cluster` test gets none later; idle to the session's end, its cluster would burn CPU the other worker
    needs. A test that asks for it after all (a selection run out of order) starts it again."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    position = item.config.stash.get(_POSITION, {})
    if nextitem is None or position.get(nextitem.nodeid, -1) > item.config.stash.get(_RAY_LAST_USE, -1):
        ray.shutdown()


# One tiny model per family, the one every test that trains a model starts from: a few thousand parameters at
# 16 px, seconds on one CPU thread. A test that needs another size says so through overrides of timm's kwargs.
TINY_MODELS = {
    "vit": {"name": "vit_tiny_patch16_224", "kwargs": {"patch_size": 4, "embed_dim": 16, "depth": 1, "num_heads": 2}},
    "mixer": {"name": "mixer_s16_224", "kwargs": {"patch_size": 4, "num_blocks": 1, "embed_dim": 16}},
    "resnet": {"name": "resnet18", "cifar_stem": True, "kwargs": {"layers": [1, 1, 1, 1], "channels": [8, 8, 16, 16]}},
}


def _tiny_model(family: str = "mixer", *, dotted: bool = False, **kwargs) -> dict:
    """The trial config's `model` section of a tiny `family` model, timm kwargs overridden by `kwargs`.

    dotted: as the dotted paths a study's factor level sets ({"model.name": ..., "model.kwargs": ...}).
    """
    model = copy.deepcopy(TINY_MODELS[family])
    model["kwargs"].update(kwargs)
    return {f"model.{k}": v for k, v in model.items()} if dotted else model


@pytest.fixture(scope="session")
def tiny_model():
    """`_tiny_model`, as a fixture: the tests run under --import-mode=importlib, where conftest is no module."""
    return _tiny_model


def _tiny_study(where: Path, name: str, *, base: dict | None = None, **sections) -> Path:
    """Write `where/<name>.yaml`: the smallest real study, one cell of a tiny Mixer on digits trained by SAM for 2
    epochs on one CPU thread, rho searched, 2 trials of 1 CPU one at a time; its artifacts and Ray storage under
    `where`. One at a time, the second trial reuses the first one's Ray actor (Tune's reuse_actors) instead of a
    second process importing torch, timm and MLflow beside it: seconds of CPU less on the suite's two cores.

    base: keys replacing those of the study's base section; sections: top-level sections replacing the defaults
    (budget, resources, search, ...). Returns the file's path.
    """
    import yaml

    study = {
        "name": name,
        "base": {
            "model": _tiny_model("mixer"),
            "data": {"name": "digits", "img_size": 16, "batch_size": 128},
            "optimizer": {"method": "sam"},
            "schedule": {"epochs": 2, "warmup_epochs": 0},
            "train": {"device": "cpu", "threads": 1},
            **(base or {}),
        },
        "search": {"rho": {"type": "loguniform", "low": 0.01, "high": 0.1}},
        "budget": {"trials_per_cell": 2},
        "resources": {"cpus_per_trial": 1, "max_concurrent_trials": 1},
        "tracking": {"artifact_location": str(where / "mlartifacts")},
        "storage": str(where / "runs"),
        **sections,
    }
    path = where / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def tiny_study():
    """`_tiny_study`, as a fixture (see `tiny_model`)."""
    return _tiny_study


@pytest.fixture
def ray_cluster(_ray_down_at_end):
    """A real local Ray cluster (with its dashboard, which Train-inside-Tune needs), started by the first test of this
    worker that asks for it and kept for the next ones (a `no_ray` test stops it; the next asker starts it again),
    stopped after this worker's last test that asks for it (`pytest_runtest_teardown`)."""
    import ray

    if not ray.is_initialized():
        # Each pytest-xdist worker starts its own cluster: a small object store each, not Ray's default 30% of RAM.
        ray.init(
            num_cpus=2,
            include_dashboard=True,
            log_to_driver=False,
            configure_logging=False,
            object_store_memory=OBJECT_STORE_BYTES,
        )
    return ray


@pytest.fixture
def no_ray():
    """This process without a Ray connection, for a test of what happens before Ray starts: with the worker's cluster
    up (`ray_cluster`, from a test that ran before in this worker), `sharpscale run` would use it instead of refusing
    at load what this machine cannot host, and would wait on it. The cluster is stopped; the next asker restarts it."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def _ray_down_at_end():
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def _empty_mlflow_db(tmp_path_factory) -> Path:
    """An empty MLflow SQLite store, its schema created and migrated once per pytest worker.

    Creating the schema runs every MLflow migration: 4-9 s on this machine, paid by each test that opened a fresh
    store. A copy of this file is the same store (the schema is all a fresh store holds, besides MLflow's Default
    experiment), so tests copy it instead. Tests of store creation itself use their own paths, not this.
    """
    from trainables.tracking import tracking_client

    db = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    tracking_client(f"sqlite:///{db}")
    return db


@pytest.fixture(scope="session")
def new_mlflow_store(_empty_mlflow_db):
    """`make(path) -> uri`: a real, empty MLflow SQLite store at `path` (a copy of the session's migrated one)."""

    def make(path: Path) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_empty_mlflow_db, path)
        return f"sqlite:///{path}"

    return make


@pytest.fixture
def tracking_uri(tmp_path, new_mlflow_store) -> str:
    """A real MLflow SQLite store in the test's own directory."""
    return new_mlflow_store(tmp_path / "mlflow.db")


def _write_fake_cifar(root: Path, name: str = "cifar10", per_batch: int = 4, n_test: int = 6, seed: int = 0) -> dict:
    """Write a tiny CIFAR tree in the official python-pickle format (Python 2 style bytes keys).

    Returns the arrays written: train/test data (N, 3072) uint8 and labels, in file order.
    """
    rng = np.random.default_rng(seed)
    num_classes = 10 if name == "cifar10" else 100
    folder = root / ("cifar-10-batches-py" if name == "cifar10" else "cifar-100-python")
    folder.mkdir(parents=True, exist_ok=True)
    label_key = b"labels" if name == "cifar10" else b"fine_labels"
    train_files = [f"data_batch_{i}" for i in range(1, 6)] if name == "cifar10" else ["train"]
    test_file = "test_batch" if name == "cifar10" else "test"
    meta_file, names_key = ("batches.meta", b"label_names") if name == "cifar10" else ("meta", b"fine_label_names")

    def dump(path: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = rng.integers(0, num_classes, size=n)
        batch = {b"batch_label": b"fake", label_key: labels.tolist(), b"data": data, b"filenames": [b"x.png"] * n}
        if name == "cifar100":
            batch[b"coarse_labels"] = (labels // 5).tolist()
        path.write_bytes(pickle.dumps(batch, protocol=2))
        return data, labels

    n_train = per_batch * 5 if name == "cifar10" else per_batch
    parts = [dump(folder / f, n_train // len(train_files)) for f in train_files]
    test = dump(folder / test_file, n_test)
    names = [f"class_{i}".encode() for i in range(num_classes)]
    (folder / meta_file).write_bytes(pickle.dumps({names_key: names}, protocol=2))
    return {
        "folder": folder,
        "train_data": np.concatenate([p[0] for p in parts]),
        "train_labels": np.concatenate([p[1] for p in parts]),
        "test_data": test[0],
        "test_labels": test[1],
    }


@pytest.fixture(scope="session")
def write_fake_cifar():
    """`_write_fake_cifar`, as a fixture: the tests run under --import-mode=importlib, where conftest is no module."""
    return _write_fake_cifar


def _fresh_python(code: str, *, not_imported: tuple[str, ...], then: str = "", timeout: float = 120) -> None:
    """Run `code` in a fresh interpreter and assert that it succeeds with none of the modules `not_imported` imported
    by its end (`sys` is imported for it); `then` runs after that check (e.g. to show a module still loads on use).

    The interpreter sees this checkout, the quiet offline environment and /usr/bin:/bin, nothing else of this process:
    what it imports is what `code` asks for, not what this session happens to have loaded or set.
    """
    script = (
        "import sys\n"
        f"{code.rstrip()}\n"
        f"heavy = sorted(m for m in {tuple(not_imported)!r} if m in sys.modules)\n"
        "assert not heavy, heavy\n"
        f"{then}"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", **QUIET_ENV},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="session")
def fresh_python():
    """`_fresh_python`, as a fixture (see `tiny_model`)."""
    return _fresh_python


# `python -m studies.cli` with SIGINT at its default, as a user's terminal starts a command, whatever this test process
# inherited: a test runner started in the background by a non-interactive shell ignores SIGINT, a child inherits
# that, and Python then never turns SIGINT into KeyboardInterrupt, so a Ctrl-C a test sends would be lost.
_AS_FROM_A_TERMINAL = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('studies.cli', run_name='__main__', alter_sys=True)"
)


class CliProcesses:
    """`python -m studies.cli ...` in processes of their own, as a user's shell starts them: this checkout first on
    the path, the quiet offline environment, each in a session (process group) of its own. What a test started is
    killed at its end, group and all, whatever the test left running."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(
        self, *args, cwd: Path | None = None, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env: dict | None = None
    ) -> subprocess.Popen:
        """Start `sharpscale *args` (text output; by default stdout and stderr in one pipe); env: variables added."""
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        proc = subprocess.Popen(
            [sys.executable, "-c", _AS_FROM_A_TERMINAL, *map(str, args)],
            cwd=cwd,
            env={**os.environ, **QUIET_ENV, "PYTHONPATH": path, **(env or {})},
            stdout=stdout,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
        self.started.append(proc)
        return proc

    def run(
        self, *args, cwd: Path | None = None, timeout: float, env: dict | None = None
    ) -> subprocess.CompletedProcess:
        """`sharpscale *args` to its end, stdout and stderr apart (env: variables added). On a timeout the test's end
        takes down its whole group (subprocess.run's timeout would kill the driver alone and leave a study's Ray
        running)."""
        proc = self.start(*args, cwd=cwd, stderr=subprocess.PIPE, env=env)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    @staticmethod
    def wait_for(proc: subprocess.Popen, condition, *, timeout: float, what: str, every: float = 0.2):
        """Poll `condition()` until it returns something true, and return that: a state observed while `proc` still
        runs (it is checked after each read). Fails if `proc` ends first or `timeout` seconds pass."""
        deadline = time.monotonic() + timeout
        while True:
            found = condition()
            if proc.poll() is not None:
                out = err = None
                with contextlib.suppress(subprocess.TimeoutExpired):  # a pipe its leftovers may still hold open
                    out, err = proc.communicate(timeout=30)
                raise AssertionError(
                    f"{proc.args[3:]} ended (status {proc.returncode}) before {what}:\n"
                    f"{(out or '')[-3000:]}{(err or '')[-3000:]}"
                )
            if found:
                return found
            assert time.monotonic() < deadline, f"{what}: not reached within {timeout} s"
            time.sleep(every)

    def kill_all(self) -> None:
        for proc in self.started:
            # A server started below the launcher runs in a process group of its own; a killed driver's Ray processes
            # live on in the driver's group.
            if proc.poll() is None:
                below = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
                for child in below:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(os.getpgid(int(child)), signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)


@pytest.fixture
def cli_process():
    """A `CliProcesses`: the test's `sharpscale` processes, started and waited on; killed at the test's end."""
    processes = CliProcesses()
    try:
        yield processes
    finally:
        processes.kill_all()
