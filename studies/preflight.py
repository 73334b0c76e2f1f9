"""Before any trial, every check a study run makes (or the study fails naming what to fix): before anything is
recorded, the address, resources and devices this machine or cluster offers and the models' kwargs; then the state
locations and the Tune experiment a resume restores; once Ray is up, the cluster's storage, its nodes' resources and
every node's data roots."""

from __future__ import annotations

import contextlib
import getpass
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from studies import identity
from studies.shell import shell_command
from studies.spec import LoadedStudy, StudyError
from trainables.errors import shown
from trainables.naming import TUNE_STATE_TAG
from trainables.secrets import redact

if TYPE_CHECKING:
    from studies.launch import Launch
    from studies.locations import StateLocations
    from trainables.ray_train import DistributedPlan

__all__ = [
    "ADDRESS_PROBE_S",
    "AUTOSCALER_CONFIG",
    "NODE_CHECK_TIMEOUT_S",
    "check_address",
    "check_before_recording",
    "check_cluster",
    "check_cluster_resources",
    "check_cluster_storage",
    "check_data_on_nodes",
    "check_local_devices",
    "check_local_resources",
    "check_model_kwargs",
    "check_state_paths",
    "check_trials_fit_the_data",
    "check_tune_experiment",
    "data_roots",
    "ensure_local_dirs",
]

NODE_CHECK_TIMEOUT_S = 120.0
_GUIDE = "docs/cluster.md, 'Data on every node'"
_SHOWN_NODES = 5


def data_roots(study: LoadedStudy) -> list[tuple[str, str]]:
    """The distinct (data.name, data.root) pairs of the study's cells that name a root."""
    from trainables.config import DataConfig

    default_name = DataConfig.model_fields["name"].default
    pairs = set()
    for cell in study.cells:
        data = cell.config.get("data") or {}
        if data.get("root") is not None:
            pairs.add((str(data.get("name", default_name)), str(data["root"])))
    return sorted(pairs)


def _fix_for(name: str, root: str) -> str:
    from trainables.data.fetch import ARCHIVES

    if name in ARCHIVES:
        return f"`{shell_command('sharpscale', 'data', 'fetch', name, '--to', root)}` puts it there"
    return "copy the dataset's folder there"


def _root_problem(name: str, root: str) -> tuple[str, str] | None:
    """(reason, fix) when this node cannot read data root `root` of dataset `name`, else None."""
    from trainables.data.fetch import layout_problem
    from trainables.data.staging import StagingError, cache_path, is_staged, is_uri, open_uri

    if is_uri(root):
        if is_staged(root):
            target = cache_path(root)
            problem = layout_problem(name, target)
            if problem:
                return (
                    f"its copy staged on this node at {target} {problem}",
                    f"correct the data at the URI, then delete {target}",
                )
            return None
        try:
            from pyarrow import fs as pafs

            filesystem, path = open_uri(root)
            info = filesystem.get_file_info(path)
            if info.type == pafs.FileType.NotFound:
                return "does not exist, seen from this node", f"{_fix_for(name, root)}, or correct the URI"
            if info.type != pafs.FileType.Directory:
                return "is a file, not a directory", "point data.root at the directory that holds the dataset"
            problem = layout_problem(name, root)
        except StagingError as exc:
            return f"pyarrow cannot open it here ({exc.__cause__ or exc})", (
                "use a scheme pyarrow.fs knows (s3://, gs://, hdfs://, abfs://, file://) or a path"
            )
        except OSError as exc:
            return f"cannot be read from this node ({exc})", (
                "give this node access to it (instance profile, service account or credentials in its environment)"
            )
        return (problem, f"{_fix_for(name, root)}, or correct the URI") if problem else None
    path = Path(root).expanduser()
    if not path.exists():
        return f"no such directory on this node ({path})", (
            f"put the data at that path on every node (a shared filesystem mounted on all of them), or store it "
            f"once where every node reads it and set data.root to its URI, e.g. `sharpscale data fetch {name} "
            f"--to s3://BUCKET/{name}` and data.root: s3://BUCKET/{name} ({_GUIDE})"
        )
    if not path.is_dir():
        return f"{path} is a file, not a directory", "point data.root at the directory that holds the dataset"
    if not os.access(path, os.R_OK | os.X_OK):
        return f"{path} is not readable by this node's Ray workers (user {getpass.getuser()})", "make it readable"
    problem = layout_problem(name, path)
    return (problem, f"{_fix_for(name, str(path))} on this node, or correct data.root") if problem else None


def _check_node(roots: list[tuple[str, str]]) -> list[tuple[str, str, str, str]]:
    """Run on one node: [(name, root, reason, fix)] for each root it cannot read."""
    out = []
    for name, root in roots:
        problem = _root_problem(name, root)
        if problem:
            out.append((name, root, *problem))
    return out


def _can_host(total: dict[str, float], request: dict[str, float]) -> bool:
    return all(total.get(key, 0.0) >= amount for key, amount in request.items() if amount > 0)


def check_data_on_nodes(study: LoadedStudy, *, timeout_s: float = NODE_CHECK_TIMEOUT_S) -> None:
    """Raise StudyError when a node that can host a trial cannot read one of the study's data roots.

    Runs one small task (no CPU booked) on every alive node whose resources fit one trial (one worker of
    it), pinned there by node affinity. A local root must exist there and have the dataset's layout; a URI
    root must be in that node's staging cache or be a directory pyarrow lists there with the layout. Every
    failure of every node is reported at once: node, root, reason, fix. Nodes that join later (autoscaling)
    are not checked; a trial there reports an unreadable root itself. Needs Ray initialised.
    """
    roots = data_roots(study)
    if not roots:
        return
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    res = study.resources
    request = {"CPU": res.cpus_per_trial, "GPU": res.gpus_per_trial, **res.custom}
    nodes = [n for n in ray.nodes() if n.get("Alive") and _can_host(n.get("Resources", {}), request)]
    if not nodes:
        return  # none can host a trial yet (an autoscaler adds them): Tune waits, and each trial checks its own root
    check = ray.remote(num_cpus=0, max_retries=0)(_check_node)
    pending = {
        check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(
            roots
        ): node
        for node in nodes
    }
    ready, late = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
    failures: dict[tuple[str, str, str], list[str]] = {}

    def label(node) -> str:
        return f"{node.get('NodeManagerAddress', '?')} ({node['NodeID'][:8]})"

    for ref in ready:
        node = pending[ref]
        try:
            found = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - whatever broke the check there, the node is not known to be fit
            found = [
                (
                    "-",
                    root,
                    f"the check could not run there ({type(exc).__name__}: {exc})",
                    "check the node with `ray status` and its logs",
                )
                for _, root in roots
            ]
        for _name, root, reason, fix in found:
            failures.setdefault((root, reason, fix), []).append(label(node))
    for ref in late:
        ray.cancel(ref, force=True)
        node = pending[ref]
        for _, root in roots:
            failures.setdefault(
                (root, f"the node did not answer within {timeout_s:g} s", "check the node with `ray status`"), []
            ).append(label(node))
    if not failures:
        return
    problems = []
    for (root, reason, fix), where in sorted(failures.items()):
        shown = ", ".join(where[:_SHOWN_NODES]) + (
            f" and {len(where) - _SHOWN_NODES} more" if len(where) > _SHOWN_NODES else ""
        )
        node_word = "node" if len(where) == 1 else f"{len(where)} nodes"
        problems.append(redact(f"data.root {root!r} on {node_word} {shown}: {reason}. Fix: {fix}."))
    raise StudyError(study.path, problems)


def check_model_kwargs(study: LoadedStudy) -> None:
    """Refuse, before Ray starts, a `model.kwargs` key that the model's timm class does not take (a typo would fail
    every trial, each with Tune's retries). Each distinct model is built on the meta device: no memory, no weights.

    Only unknown keywords are refused here; any other error of a model depends on the data it is built for, and
    is left to the trial, which names it.
    """
    import json
    import re

    import torch

    from trainables.config import TrialConfig
    from trainables.models import create_model

    seen: dict[str, list[str]] = {}
    models = {}
    for cell in study.cells:
        cfg = TrialConfig.load(cell.config)
        key = json.dumps(cfg.model.model_dump(), sort_keys=True, default=str)
        seen.setdefault(key, []).append(cell.key or "all")
        models[key] = cfg
    problems = []
    for key, cfg in models.items():
        try:
            with torch.device("meta"):
                create_model(cfg.model, num_classes=10, in_chans=3, img_size=cfg.data.img_size or 32)
        except TypeError as err:
            bad = re.search(r"unexpected keyword argument '([^']+)'", str(err))
            if bad is None:
                continue
            name = bad.group(1)
            import difflib

            close = difflib.get_close_matches(name, _kwargs_taken(cfg.model.name), n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            cells = seen[key]
            problems.append(
                f"model.kwargs.{name}: timm's {cfg.model.name} takes no argument {name!r}.{hint} Fix: correct or "
                f"remove it (cells: {'; '.join(cells[:3])}{f'; and {len(cells) - 3} more' if len(cells) > 3 else ''})."
            )
    if problems:
        raise StudyError(study.path, problems)


def _kwargs_taken(model_name: str) -> list[str]:
    """The keyword names of the timm model class behind `model_name` (for did-you-mean hints)."""
    import inspect

    import timm

    try:
        module = inspect.getmodule(timm.models.model_entrypoint(model_name))
        classes = [c for _, c in inspect.getmembers(module, inspect.isclass) if issubclass(c, _torch_module())]
    except Exception:  # noqa: BLE001 - only a hint
        return []
    names: list[str] = []
    for cls in classes:
        names += [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "args", "kwargs")]
    return sorted(set(names))


def _torch_module():
    import torch

    return torch.nn.Module


def check_trials_fit_the_data(study: LoadedStudy) -> None:
    """Refuse, before Ray starts, a `model.kwargs.num_classes` that is not the data's number of classes where the data
    fixes it (a registered dataset's, or the synthetic set's): every trial would fail on its first batch, or learn a
    head whose extra classes never occur."""
    from trainables.config import TrialConfig
    from trainables.data.registry import DATASETS

    problems = {}
    for cell in study.cells:
        cfg = TrialConfig.load(cell.config)
        asked = cfg.model.kwargs.get("num_classes")
        spec = DATASETS.get(cfg.data.name)
        classes = cfg.data.synthetic_classes if cfg.data.name == "synthetic" else (spec.num_classes if spec else None)
        if asked is None or classes is None or asked == classes:
            continue
        problems.setdefault(
            (asked, cfg.data.name),
            f"model.kwargs.num_classes: {asked}, and {cfg.data.name} has {classes} classes (cell {cell.key or 'all'}). "
            f"Fix: drop model.kwargs.num_classes (each model is built for its data's classes), or set it to {classes}.",
        )
    if problems:
        raise StudyError(study.path, list(problems.values()))


def check_local_devices(study: LoadedStudy) -> None:
    """Refuse, before Ray starts, trials that ask for `train.device: cuda` from a local cluster on a machine without
    a CUDA device: each would fail at its start, after the cluster came up."""
    from trainables.config import TrialConfig

    cells = [c.key or "all" for c in study.cells if TrialConfig.load(c.config).train.device == "cuda"]
    if not cells:
        return
    import torch

    if torch.cuda.is_available():
        return
    raise StudyError(
        study.path,
        [
            f"train.device: cuda, and this machine has no CUDA device (torch {torch.__version__} sees none; cells: "
            f"{'; '.join(cells[:3])}{' ...' if len(cells) > 3 else ''}). Fix: `train.device: auto` (CUDA where there is "
            f"one, else the CPU) or cpu, or run on a cluster with GPU nodes (--address, resources.gpus_per_trial)."
        ],
    )


def check_state_paths(study: LoadedStudy, storage: str, optuna_storage: str) -> None:
    """Refuse, before Ray starts, state locations the study could not use: a path holding `{` or `}` (Optuna and Tune
    read them as format fields), and a local Optuna database that is damaged or that this user cannot write (a
    resume would fail after its runs were reopened)."""
    problems = []
    for field, value in (("storage", storage), ("optuna_storage", optuna_storage)):
        if "{" in value or "}" in value:
            problems.append(
                f"{field}: {redact(value)!r} holds '{{' or '}}', which the libraries that write there read as format "
                f"fields. Fix: a location without braces (--storage / --set {field}=...)."
            )
    if not problems and optuna_storage.startswith("sqlite:///"):
        db = Path(optuna_storage[len("sqlite:///") :])
        problem = _sqlite_problem(db)
        if problem:
            problems.append(f"optuna_storage: {db} {problem}")
    if problems:
        raise StudyError(study.path, problems)


def _sqlite_problem(db: Path) -> str | None:
    """Why the Optuna SQLite database `db` cannot serve a study (damaged, not writable), with the fix; None if it can
    (or does not exist yet: it is made where its folder can be)."""
    import sqlite3

    if not db.exists():
        return None
    mount_read_only = bool(os.statvfs(db.parent).f_flag & os.ST_RDONLY)  # root's os.access ignores modes only
    if mount_read_only or not os.access(db, os.W_OK) or not os.access(db.parent, os.W_OK):
        where = db if not (mount_read_only or os.access(db, os.W_OK)) else db.parent
        return (
            f"cannot be written by user {getpass.getuser()} ({where} is read-only); the study's search records every "
            f"trial there. Fix: make it writable again (or mount it read-write), then run the command again."
        )
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as con:
            con.execute("select count(*) from sqlite_master").fetchone()
            ok = con.execute("pragma quick_check").fetchone()
    except sqlite3.DatabaseError as err:
        ok = (str(err),)
    if ok and ok[0] != "ok":
        return (
            f"is damaged ({str(ok[0])[:200]}): Optuna cannot read this study's search from it. Fix: restore it from a "
            f"backup; without one, `sharpscale run --new-launch` starts the search anew."
        )
    return None


# What Ray's start-up failures say, and the fix each needs: (words of the cause, lower case; the fix).
_RAY_START_FIXES = (
    (
        ("af_unix path", "path length cannot exceed"),
        "the path of Ray's temporary directory is too long for its sockets (at most 107 bytes): run with a short "
        "one, e.g. RAY_TMPDIR=/tmp",
    ),
    (
        ("no space left",),
        "free space on the disk of Ray's temporary directory (`df -h /tmp`), or set RAY_TMPDIR to "
        "a directory on a disk with room",
    ),
    (
        ("permission denied", "read-only file system"),
        "let Ray write its temporary directory: set RAY_TMPDIR to a directory of your own",
    ),
    (
        ("address already in use",),
        "another process holds a port Ray needs: `ray stop` if it is a Ray of yours, or run where the port is free",
    ),
    (
        ("/dev/shm", "object store", "out of memory", "cannot allocate memory"),
        "free memory (Ray's object store "
        "takes a share of it, in /dev/shm), or run fewer trials at once with --num-cpus",
    ),
    (
        ("version mismatch", "version of ray", "python version"),
        "install on this machine the Ray and Python versions the cluster runs (`ray --version` there)",
    ),
    (
        ("could not find any running ray instance",),
        "no Ray cluster runs on this node: start one (`ray start "
        "--head`), give its head's address, or drop --address to run here",
    ),
)
# Lines of a traceback or of Ray's framing that say nothing about the cause.
_FRAMING = ("traceback (most recent call last)", 'file "', "during handling of", "the above exception")


def _cause_line(err: BaseException) -> str:
    """The last meaningful line of `err`'s innermost cause (Ray's error text says where it failed first, why last)."""
    chain, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        chain.append(err)  # `err` first, its innermost cause last: Ray's outer errors say where, their causes why
        err = err.__cause__ or err.__context__
    lines = [
        (type(e).__name__, line.strip())
        for e in chain
        for line in str(e).splitlines()
        if line.strip().strip("-=^~*. ") and not line.strip().lower().startswith(_FRAMING)
    ]
    if not lines:
        return type(chain[-1]).__name__ if chain else "unknown error"
    kind, line = lines[-1]
    return f"{kind}: {line[:300]}"


def ray_start_problem(err: BaseException, address: str | None) -> str:
    """Ray's failure to start (or to reach a cluster) as one line: its cause's last meaningful line, and the fix
    that cause needs; the generic fix only where the cause is none of the known ones."""
    cause = _cause_line(err)
    text = "\n".join(str(e) for e in (err, err.__cause__, err.__context__) if e is not None).lower()
    fix = next((fix for words, fix in _RAY_START_FIXES if any(w in text for w in words)), None)
    if fix is None:
        fix = (
            "check the address (`ray status --address ...` on that cluster), or drop --address to run here"
            if address
            else "`ray start --head` shows Ray's own error; check free memory and /tmp space, or try --num-cpus"
        )
    where = f"reach the Ray cluster at {address}" if address else "start a local Ray cluster"
    return f"ray: could not {where}: {cause}. Fix: {fix}."


def _trials_leave_this_node(plan: DistributedPlan) -> bool:
    """Whether the connected cluster runs trials on nodes other than this driver's: it has several (alive)
    nodes, or this node cannot host one trial (a head that offers no CPU/GPU; the autoscaler adds the workers)."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    if len(alive) > 1:
        return True
    here = ray.get_runtime_context().get_node_id()
    offers = next((n.get("Resources", {}) for n in alive if n.get("NodeID") == here), {})
    needs = {"CPU": plan.cpus_per_worker, "GPU": plan.gpus_per_worker, **plan.custom}
    return any(offers.get(name, 0.0) < amount for name, amount in needs.items() if amount > 0)


def check_cluster_storage(
    study: LoadedStudy, locations: StateLocations, plan: DistributedPlan, *, connected: bool
) -> None:
    """Refuse, before any trial, state that the cluster's other nodes cannot reach or that dies with this node.

    connected: the driver joined an existing cluster (--address); a cluster it started itself is this node alone.
    """
    import ray

    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    if not (nodes > 1 or (connected and _trials_leave_this_node(plan))):
        return
    where = f"the Ray cluster runs trials on other nodes than this driver's ({nodes} node(s) alive now)"
    problems = []
    if not locations.shared:
        mounts = study.spec.shared_mounts
        problems.append(
            f"storage: a path on this node, got {shown(locations.storage)}, and {where}: the first checkpoint written on "
            f'another node would fail ("Unable to set up cluster storage"). Fix: use storage that every node '
            f"reaches: a path on an NFS/EFS mount seen at the same place on every node, listed in shared_mounts "
            f"(e.g. --storage /mnt/shared/sharpscale_runs with `shared_mounts: [/mnt/shared]` in the study file"
            f"{'; listed now: ' + ', '.join(mounts) if mounts else ''}), or a bucket: --storage s3://BUCKET/sharpscale_runs "
            f"or gs://BUCKET/sharpscale_runs (docs/cluster.md)."
        )
    elif locations.optuna_default and "://" in locations.storage:
        problems.append(
            f"optuna_storage: required when storage is a URI ({locations.storage}) and {where}: its default, "
            f"{locations.optuna_storage}, is a file on this node only, lost with its container. Fix: set "
            f"optuna_storage in the study file or with --set optuna_storage=..., e.g. "
            f"journal:///mnt/shared/sharpscale_runs/{study.spec.name}.optuna.journal on an NFS mount, or an RDB URL "
            f"such as postgresql://USER@HOST:5432/optuna."
        )
    if problems:
        raise StudyError(study.path, problems)


def ensure_local_dirs(study: LoadedStudy, locations: StateLocations) -> None:
    """Create the local directories the study writes to, or say why not (before any trial starts)."""
    paths = [] if "://" in locations.storage else [("storage", Path(locations.storage))]
    if locations.optuna_storage.startswith("sqlite:///"):
        paths.append(("optuna_storage", Path(locations.optuna_storage[len("sqlite:///") :]).parent))
    elif locations.optuna_storage.startswith("journal:///"):
        paths.append(("optuna_storage", Path(locations.optuna_storage[len("journal://") :]).parent))
    problems = []
    for field, path in paths:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            problems.append(
                f"{field}: cannot create the directory {path} ({err.strerror}). Fix: mount the storage it names on this "
                f"node, or choose another one for this run, e.g. --storage ~/sharpscale_runs."
            )
    if problems:
        raise StudyError(study.path, problems)


# How long `run --address` waits for the cluster's port to accept a connection before saying nothing listens there:
# Ray itself retries a dead address for minutes, silently.
ADDRESS_PROBE_S = 5.0


def check_address(study: LoadedStudy, address: str) -> None:
    """Refuse at once an --address HOST:PORT (or ray://HOST:PORT) where nothing accepts a connection, before any
    record is made; 'auto' and other forms are left to Ray."""
    import socket

    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host or "/" in target:
        return
    host = host.strip("[]")  # [::1]:6379
    try:
        with socket.create_connection((host, int(port)), timeout=ADDRESS_PROBE_S):
            return
    except OSError as err:
        why = "timed out" if isinstance(err, TimeoutError) else (err.strerror or type(err).__name__)
    raise StudyError(
        study.path,
        [
            f"--address {address}: nothing answers at {host}:{port} ({why} within {ADDRESS_PROBE_S:g} s). Fix: start "
            f"the cluster (`ray start --head` on {host}) or give its head's address (`ray status` there prints it), "
            f"or drop --address to run on this machine."
        ],
    )


def check_before_recording(study: LoadedStudy, address: str | None, num_cpus: int | None, *, real_trials: bool) -> None:
    """Refuse, before anything is recorded or Ray starts, a study whose trials could never run here. The cheap
    checks first: building the models imports torch and timm (seconds), which a refusal of the address or the
    resources need not wait for."""
    ray_mod = sys.modules.get("ray")
    if ray_mod is not None and ray_mod.is_initialized():
        check_cluster_resources(study)  # the caller's Ray connection, which the study will use
    elif not address:
        check_local_resources(study, num_cpus)  # before Ray starts: a trial this machine cannot host waits forever
        if real_trials:
            check_local_devices(study)  # cuda asked of a local cluster on a machine without it
    else:
        check_address(study, address)  # before anything is recorded: a dead address would claim a launch, then wait
    if real_trials:  # the real trials build timm models: a kwargs typo would fail each, each retried
        check_trials_fit_the_data(study)
        check_model_kwargs(study)


def check_cluster(study: LoadedStudy, locations: StateLocations, plan: DistributedPlan, address: str | None) -> None:
    """Once Ray is up: every problem with the cluster, where the state goes and the data surfaces here, before any
    MLflow run or trial exists."""
    if address:
        check_cluster_resources(study)
    check_cluster_storage(study, locations, plan, connected=bool(address))
    ensure_local_dirs(study, locations)
    check_data_on_nodes(study)  # a node that cannot read the data fails the study here


def check_tune_experiment(
    study: LoadedStudy, target: Launch, experiment_dir: str, *, resume: bool, trust_storage: bool
) -> bool:
    """The Tune experiment folder: on resume, the one this launch left (its launch record, its state files, unless
    trust_storage); on a fresh launch, none there yet (identity.check_fresh_experiment_dir). Returns whether Tune
    restores its state (False: a new Tune experiment, also for a launch stopped before its Tune experiment began)."""
    if not resume:
        identity.check_fresh_experiment_dir(study, experiment_dir, target.uri)
        return False
    from ray import tune

    previous = target.previous
    identity.check_launch_record(
        study,
        experiment_dir,
        identity.launch_record(study, target.uri, target.experiment_id, previous.info.run_id, target.number),
    )

    if not tune.Tuner.can_restore(experiment_dir):
        if identity.read_launch_record(experiment_dir) is not None:
            # Stopped after its runs were made and before Tune wrote its state. A trial started in that window (a
            # loaded machine widens it) has no Tune snapshot to resume from: its run is dropped as lost, as a trial
            # the driver never snapshotted is on any resume, and the searcher issues its values again.
            started = target.trial_runs()
            if started:
                target.drop_lost_trials(set())
            dropped = f" ({started} trial run(s) it had begun are deleted as lost)" if started else ""
            print(
                f"sharpscale: resume: launch {target.number} was stopped before Tune recorded its first trial"
                f"{dropped}; its trials start now.",
                flush=True,
            )
            return False
        raise StudyError(
            study.path,
            [
                f"resume: no interrupted run of this study under {experiment_dir}. "
                f"Fix: start it with `sharpscale run`, or give the storage it ran with (--storage)."
            ],
        )
    # Tuner.restore unpickles Tune's files from the storage: only the ones this launch left there.
    recorded = previous.data.tags.get(TUNE_STATE_TAG)
    if trust_storage:
        print(f"sharpscale: warning: --trust-storage: Tune's state under {experiment_dir} is restored unchecked")
    elif unchecked := identity.check_tune_state(study, experiment_dir, recorded):
        print(f"sharpscale: warning: {unchecked}", flush=True)
    _check_searcher_state(study, experiment_dir)
    return True


def _check_searcher_state(study: LoadedStudy, experiment_dir: str) -> None:
    """The searcher's state Tune would hand to CellSearcher.restore (the newest searcher-state-*.pkl by name, as
    Tune's Searcher.restore_from_dir picks it), read here first: refused inside Tune's restore, it would leave the
    resume waiting for a second Ctrl-C instead of saying why in one line."""
    if "://" in experiment_dir:
        return
    from studies.search import read_searcher_state

    states = sorted(Path(experiment_dir).glob("searcher-state-*.pkl"))
    if states:
        read_searcher_state(str(states[-1]), {c.key for c in study.cells})


def _node_problem(request: dict[str, float], offers: list[tuple[str, dict[str, float]]], where: str) -> str | None:
    """Why no node of `offers` ([(name, resources)]) can host one trial worker asking `request`, or None."""
    wanted = {k: v for k, v in request.items() if v > 0}
    if not offers or any(all(res.get(k, 0.0) >= v for k, v in wanted.items()) for _, res in offers):
        return None
    short = sorted({k for k, v in wanted.items() if all(res.get(k, 0.0) < v for _, res in offers)})
    largest = {k: max(res.get(k, 0.0) for _, res in offers) for k in wanted}
    asked = ", ".join(f"{k}={v:g}" for k, v in wanted.items())
    has = ", ".join(f"{k}={largest[k]:g}" for k in wanted)
    names = {"CPU": "resources.cpus_per_trial", "GPU": "resources.gpus_per_trial"}
    fields = ", ".join(names.get(k, f"resources.custom.{k}") for k in short) or "resources"
    return (
        f"{fields}: each trial (each worker) asks {asked}, and no node of {where} can ever give it (the most any "
        f"node has: {has}); Tune would wait forever. Fix: ask for at most that, or run on a cluster with such nodes "
        f"(--address)."
    )


def check_local_resources(study: LoadedStudy, num_cpus: int | None) -> None:
    """Refuse, before Ray starts, a trial that the local cluster this machine would start cannot host."""
    res = study.resources
    # Ray counts the CPUs this process may run on (a container's or a taskset's share), not the machine's.
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cpus = float(num_cpus if num_cpus is not None else usable)
    offers = {"CPU": cpus, "GPU": float(_local_gpus()) if res.gpus_per_trial > 0 else 0.0}
    request = {"CPU": res.cpus_per_trial, "GPU": res.gpus_per_trial, **res.custom}
    if problem := _node_problem(request, [("this machine", offers)], "the local Ray cluster (this machine)"):
        raise StudyError(study.path, [problem])


def _local_gpus() -> int:
    # Only asked when a trial wants a GPU; torch is what the trials use to see them.
    import torch

    return torch.cuda.device_count()


# Where the Ray cluster launcher (`ray up`) leaves the cluster's config on the head, for its autoscaler to read.
AUTOSCALER_CONFIG = "~/ray_bootstrap_config.yaml"


def check_cluster_resources(study: LoadedStudy, autoscaler_config: str | Path = AUTOSCALER_CONFIG) -> None:
    """Refuse a trial (worker) that no node of the connected cluster, and no node type its autoscaler may add
    (the launcher's config on this head), can host. Without that config (KubeRay, a hand-started cluster) the
    autoscaler's node types are unknown here: then only a warning, since it may add a node that fits."""
    import ray

    res = study.resources
    request = {"CPU": res.cpus_per_trial, "GPU": res.gpus_per_trial, **res.custom}
    offers = [(n.get("NodeManagerAddress", "?"), n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]
    types = _autoscaler_node_types(Path(autoscaler_config).expanduser())
    if types is not None:
        if problem := _node_problem(request, offers + types, "the cluster (its nodes and its autoscaler's node types)"):
            raise StudyError(study.path, [problem])
    elif problem := _node_problem(request, offers, "the cluster now"):
        print(
            f"sharpscale: warning: {problem.replace('Tune would wait forever', 'unless its autoscaler adds a node type that fits, Tune waits forever')}",
            flush=True,
        )


def _autoscaler_node_types(config: Path) -> list[tuple[str, dict[str, float]]] | None:
    """(type name, resources) of each node type the launcher's config declares, or None without a readable one."""
    import yaml

    try:
        types = (yaml.safe_load(config.read_text()) or {}).get("available_node_types") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    out = []
    for name, spec in types.items():
        resources = spec.get("resources") if isinstance(spec, dict) else None
        if not isinstance(resources, dict):
            return None  # the launcher detects this type's resources itself: they are not known here
        out.append((f"node type {name}", {k: float(v) for k, v in resources.items() if isinstance(v, (int, float))}))
    return out or None
