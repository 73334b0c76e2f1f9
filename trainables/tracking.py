"""MLflow record of one trial: exactly one run per trial key, its config, per-epoch metrics, tags and final status."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainables.metrics import EVERY_EPOCH_METRIC
from trainables.naming import (
    CONFIG_TAG,
    KIND_TAG,
    PARENT_RUN_TAG,
    REASON_TAG,
    SCORED_TAG,
    STATUS_TAG,
    TRIAL_KEY_TAG,
)

__all__ = [
    "BEST_EPOCH_METRICS",
    "LAST_EPOCH_RESULT_KEY",
    "NO_SPACE_REASON",
    "NO_SPACE_RESULT_KEY",
    "REFUSED_RESULT_KEY",
    "TRACKING_SCHEMES",
    "TrackingTarget",
    "TrialRecorder",
    "check_tracking_uri",
    "config_from_tags",
    "config_tags",
    "dataset_input",
    "filter_value",
    "resolve_tracking_uri",
    "retry_locked",
    "scored_from_tags",
    "tracking_client",
    "trial_runtime_env",
]

# The stores sharpscale records to: an SQLite file, a server, or a database MLflow opens itself.
TRACKING_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")

# The key under which a trial reports its MLflow run id with every result, so the searcher can label its trial.
RUN_ID_RESULT_KEY = "mlflow_run_id"
# 1 in the one result of a trial that refused its settings (trainables.errors.TrialRefused): failed, not retried.
REFUSED_RESULT_KEY = "refused"
# The one result of a trial that met a full disk (trainables.errors.no_space): the line saying so. Failed, not
# retried (each retry would meet the same disk), and the runner stops the study on it.
NO_SPACE_RESULT_KEY = "no_space"
# 1 in the result of a trial's last epoch (0 in the others): the trial still owes that epoch's record, its final
# checkpoint and its run's end, which it writes after the report, so no scheduler may stop it there
# (studies.runner's scheduler lets such a result continue; the trial then ends on its own).
LAST_EPOCH_RESULT_KEY = "last_epoch"
# The start of the reason of the trial that met the study's full disk: it ended itself (Tune marks it TERMINATED,
# which `resume` does not run again), so it stays failed where the trials the stop cut short become `interrupted`.
NO_SPACE_REASON = "no space left on a disk the trial writes to"
# Metrics whose best epoch so far every trial reports beside them (trainables.loop), by the metric's name.
BEST_EPOCH_METRICS = {"val_acc": "best_val_acc"}

_MAX_PARAM_LEN = 6000  # MLflow's limit on a param value
_EPOCH_KEY = EVERY_EPOCH_METRIC  # its steps say which epochs a run holds


@dataclass(frozen=True)
class TrackingTarget:
    """Where a trial's run goes: the store, the experiment, the parent run, and the tags it carries."""

    tracking_uri: str
    experiment_id: str
    parent_run_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


def resolve_tracking_uri(uri: str, base: Path | None = None) -> str:
    """Make a relative `sqlite:///x.db` absolute, so Ray workers in other directories write to the same file."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        path = (base or Path.cwd()) / uri[len(prefix) :]
        return prefix + str(path.resolve())
    if "://" not in uri:  # a bare path: MLflow's file store is deprecated, so a path means an SQLite file
        return prefix + str(((base or Path.cwd()) / uri).resolve())
    return uri


def trial_runtime_env(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The Ray runtime environment that gives every trial the MLflow credentials of the driver's environment.

    Trials create MlflowClients on Ray's worker processes, which do not inherit the driver's environment when
    Ray runs elsewhere (`--address`); an MLflow server started with `sharpscale server --auth` answers them 401.
    Forwarded, when set: MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_TOKEN. None when none
    is set. A variable that a Ray job's own runtime environment already sets (`ray job submit --runtime-env-json`)
    is left to it: it reaches every worker anyway, and ray.init refuses a key set twice.
    """
    from mlflow.environment_variables import (
        MLFLOW_TRACKING_PASSWORD,
        MLFLOW_TRACKING_TOKEN,
        MLFLOW_TRACKING_USERNAME,
    )

    environ = os.environ if environ is None else environ
    # Set by Ray's job supervisor for a submitted job's driver; tests/studies pin its name and layout.
    job = json.loads(environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
    from_job = ((job.get("runtime_env") or {}).get("env_vars") or {}).keys()
    names = (MLFLOW_TRACKING_USERNAME.name, MLFLOW_TRACKING_PASSWORD.name, MLFLOW_TRACKING_TOKEN.name)
    env_vars = {name: environ[name] for name in names if environ.get(name) and name not in from_job}
    return {"env_vars": env_vars} if env_vars else None


def check_tracking_uri(uri: str) -> str:
    """`uri` when MLflow can record to it (a scheme of TRACKING_SCHEMES), else a UserError naming the fix."""
    from trainables.errors import UserError, shown
    from trainables.secrets import credential_problem, redact

    if problem := credential_problem("tracking URI", uri):
        raise UserError(problem)
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    if scheme not in TRACKING_SCHEMES:
        raise UserError(
            f"tracking URI: must be sqlite:///path/mlflow.db, http(s)://HOST:PORT of an MLflow server, or a database "
            f"URL ({', '.join(s + '://' for s in TRACKING_SCHEMES)}), got {shown(redact(uri))}. Fix: e.g. --tracking-uri "
            f"sqlite:///mlflow.db, or http://127.0.0.1:5000 for `sharpscale server`."
        )
    return uri


def filter_value(value: str) -> str:
    """`value` quoted for an MLflow filter string (`tags.x = <it>`). MLflow's parser has no escape: a value with a
    single quote is written in double quotes; one with both kinds cannot be searched (studies refuse such names)."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise ValueError(f"{value!r}: an MLflow filter cannot hold both quote characters; rename it without one of them")


def sqlite_path(uri: str) -> Path | None:
    """The file of an `sqlite:///` tracking URI, else None."""
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def tracking_client(tracking_uri: str, *, create: bool = True):
    """The one place sharpscale opens an MLflow store. An SQLite file is created (schema and migrations) under a
    file lock beside it, so two processes starting on a fresh store do not both create its tables.
    create=False: a missing SQLite file is a UserError (a read-only command must not create one at a typo)."""
    from mlflow.tracking import MlflowClient

    from trainables.errors import UserError

    check_tracking_uri(tracking_uri)
    db = sqlite_path(tracking_uri)
    if db is None:
        if tracking_uri.startswith(("http://", "https://")):
            _check_server_answers(tracking_uri)
        return MlflowClient(tracking_uri=tracking_uri)
    if not create and not db.is_file():
        raise UserError(
            f"tracking URI: no MLflow store at {db} (the file does not exist; nothing was created). Fix: give the "
            f"store the study ran with (--tracking-uri sqlite:///PATH/mlflow.db), or run the study first."
        )
    from filelock import FileLock, Timeout

    lock = str(db) + ".lock"
    if create:
        db.parent.mkdir(parents=True, exist_ok=True)
    # Held only while a store's tables are created: a command that creates nothing waits a little, then says so.
    # It takes the lock only where one exists (a creator makes it before the file), so it leaves no file behind.
    held = FileLock(lock, timeout=300 if create else STORE_LOCK_WAIT_S)
    try:
        with held if create or Path(lock).exists() else contextlib.nullcontext():
            client = MlflowClient(tracking_uri=tracking_uri)
            client.search_experiments(max_results=1)  # the store is open: its schema created and migrated if needed
    except Timeout:
        raise UserError(
            f"tracking URI: the MLflow store {db} is locked ({lock} held for {STORE_LOCK_WAIT_S:g} s by another "
            f"process, one creating the store). Fix: wait for that process (`fuser {lock}` names it), then retry."
        ) from None
    except Exception as err:
        if "malformed" in str(err) or "not a database" in str(err) or "file is encrypted" in str(err):
            raise UserError(
                f"tracking URI: {db} is not a readable SQLite database (damaged or truncated: "
                f"{str(err).splitlines()[0][:200]}). Fix: restore it from a backup (`sqlite3 {db} .recover` may save "
                f"its runs), or record to another store (--tracking-uri)."
            ) from None
        raise
    return client


# How long a command that only reads waits for a store's creation lock before it says who holds it.
STORE_LOCK_WAIT_S = 10.0
# How long the first request to an MLflow server may take to connect before the command says nothing answers.
SERVER_CONNECT_TIMEOUT_S = 10.0


def _check_server_answers(uri: str) -> None:
    """A UserError at once when nothing answers at an http(s) tracking URI (MLflow's client would retry for
    minutes, silently, then raise a chained traceback). Any HTTP answer, even 401/404, means a server is there."""
    import urllib.error
    import urllib.request

    from trainables.errors import UserError
    from trainables.secrets import redact, without_userinfo

    try:
        # Without the user info, which urllib would take for part of the host (any answer will do: no login).
        with urllib.request.urlopen(without_userinfo(uri).rstrip("/") + "/health", timeout=SERVER_CONNECT_TIMEOUT_S):
            return
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise UserError(
            f"tracking URI: nothing answers at {redact(uri)} ({reason}). Fix: start the MLflow server (`sharpscale "
            f"server`, docs/cluster.md) or correct --tracking-uri; an SSH tunnel must be up before the command."
        ) from None


def retry_locked(fn, *args, attempts: int = 8, **kwargs):
    """`fn(*args, **kwargs)`, tried again (with a growing pause) while the store says it is locked."""
    # Concurrent trials share one SQLite file; a writer can find it locked for a moment.
    delay = 0.2
    for i in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # MLflow wraps sqlite's OperationalError in its own exception types
            if "locked" not in str(err).lower() or i == attempts - 1:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


# MLflow's longest tag value (mlflow.utils.validation.MAX_TAG_VAL_LENGTH in 3.17), less room for safety.
_TAG_CHUNK = 7000


def _chunked(key: str, text: str) -> dict[str, str]:
    """`text` over the tags key, key.2, ... (each at most one tag's length); `_unchunked` reads it back."""
    parts = [text[i : i + _TAG_CHUNK] for i in range(0, len(text), _TAG_CHUNK)] or [""]
    return {key if i == 0 else f"{key}.{i + 1}": part for i, part in enumerate(parts)}


def _chunk_keys(tags: Mapping[str, str], key: str) -> set[str]:
    """The tags of `tags` that hold chunks of `key` (`_chunked`): key itself and key.2, key.3, ..."""
    return {k for k in tags if k == key or (k.startswith(f"{key}.") and k[len(key) + 1 :].isdigit())}


def _unchunked(tags: Mapping[str, str], key: str) -> str | None:
    if key not in tags:
        return None
    text, i = tags[key], 2
    while f"{key}.{i}" in tags:
        text, i = text + tags[f"{key}.{i}"], i + 1
    return text


def config_tags(flat: dict[str, Any]) -> dict[str, str]:
    """A flat config as the JSON of its values as MLflow writes params (str(value)), over CONFIG_TAG, CONFIG_TAG.2,
    ... (each at most one tag's length); `config_from_tags` reads it back."""
    return _chunked(CONFIG_TAG, json.dumps({k: str(v) for k, v in flat.items()}, separators=(",", ":")))


def config_from_tags(tags: dict[str, str]) -> dict[str, str]:
    """The flat config `config_tags` wrote into a run's tags ({} when it has none)."""
    text = _unchunked(tags, CONFIG_TAG)
    return {} if text is None else json.loads(text)


def scored_from_tags(tags: Mapping[str, str]) -> str | None:
    """The scored-images record `TrialRecorder.log_scored` wrote into a run's tags (None when it has none: a run of
    an older sharpscale, or one that never finished its last evaluation)."""
    return _unchunked(tags, SCORED_TAG)


class TrialRecorder:
    """Owns one trial's MLflow run: get-or-create by trial key, log params once, metrics per epoch, close it."""

    def __init__(
        self,
        target: TrackingTarget,
        trial_key: str,
        run_name: str,
        params: dict[str, Any],
        *,
        wants_checkpoint: bool = False,
    ):
        from mlflow.entities import Param

        self._client = tracking_client(target.tracking_uri)
        self.target = target
        self.wants_checkpoint = wants_checkpoint
        existing = retry_locked(
            self._client.search_runs,
            [target.experiment_id],
            filter_string=f"tags.`{TRIAL_KEY_TAG}` = {filter_value(trial_key)}",
            max_results=2,
        )
        self._scored_keys: set[str] = set()  # the run's SCORED_TAG chunks, all of this attempt's writing
        if existing:
            self.run_id = existing[0].info.run_id
            retry_locked(self._client.update_run, self.run_id, status="RUNNING")
            self._logged = {m.step for m in retry_locked(self._client.get_metric_history, self.run_id, _EPOCH_KEY)}
            # An earlier attempt's per-image record is of its own evaluation: kept, a shorter record of this one
            # would be read with its stale tail chunks, and one this attempt never writes would pass as its own.
            # This attempt writes its own at its end, from its last epoch or the final checkpoint it resumes.
            self._drop_tags(_chunk_keys(existing[0].data.tags, SCORED_TAG))
            return
        self._logged: set[int] = set()
        tags = {KIND_TAG: "trial", TRIAL_KEY_TAG: trial_key, STATUS_TAG: "running", **target.tags}
        if target.parent_run_id:
            tags[PARENT_RUN_TAG] = target.parent_run_id
        run = retry_locked(self._client.create_run, target.experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id
        params_list = [Param(k, _param_value(v)) for k, v in sorted(params.items())]
        for i in range(0, len(params_list), 100):  # MLflow's batch limit for params
            retry_locked(self._client.log_batch, self.run_id, params=params_list[i : i + 100])

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        retry_locked(self._client.log_batch, self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_epoch(self, metrics: dict[str, float], epoch: int, timestamp_ms: int | None = None) -> None:
        """One epoch's metrics at step=epoch, once: an epoch already recorded keeps its first record.

        A retried or resumed trial can re-run epochs that were recorded before the interruption (Ray resumes
        from the last checkpoint its driver knew of); MLflow cannot delete a metric value, so the first stands.
        """
        from mlflow.entities import Metric

        if epoch in self._logged:
            return

        now = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        batch = [
            Metric(k, float(v), now, epoch)
            for k, v in metrics.items()
            if k != "epoch" and isinstance(v, (int, float)) and math.isfinite(float(v))
        ]
        retry_locked(self._client.log_batch, self.run_id, metrics=batch)
        if any(m.key == _EPOCH_KEY for m in batch):
            self._logged.add(epoch)

    def log_summary(self, metrics: dict[str, float]) -> None:
        """Metrics of the whole trial (not of an epoch), at step 0; a later attempt's values supersede them."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, 0) for k, v in metrics.items() if math.isfinite(float(v))]
        retry_locked(self._client.log_batch, self.run_id, metrics=batch)

    def log_scored(self, text: str) -> None:
        """The final evaluation's per-image correctness (trainables.scored.ScoredImages.to_text) as tags: they come
        back with every search of runs, so reading them costs a report no request per run."""
        tags = _chunked(SCORED_TAG, text)
        self._drop_tags(self._scored_keys - set(tags))  # a longer record's tail: never read as part of this one
        self.set_tags(tags)
        self._scored_keys = set(tags)

    def _drop_tags(self, keys) -> None:
        for key in sorted(keys):
            retry_locked(self._client.delete_tag, self.run_id, key)

    def log_dataset(self, data: Mapping[str, Any]) -> None:
        """The trial's training set as an MLflow dataset input (the UI's Dataset column); `data`: its data config."""
        from mlflow.entities import Dataset, DatasetInput, InputTag
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        name, digest, source_type, source, profile = dataset_input(data)
        dataset = Dataset(name=name, digest=digest, source_type=source_type, source=source, profile=profile)
        inputs = [DatasetInput(dataset, tags=[InputTag(MLFLOW_DATASET_CONTEXT, "train")])]
        retry_locked(self._client.log_inputs, self.run_id, datasets=inputs)

    def log_text(self, text: str, artifact_file: str) -> None:
        retry_locked(self._client.log_text, self.run_id, text, artifact_file)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        retry_locked(self._client.log_artifact, self.run_id, str(path), artifact_path)

    def finish(self, status: str, reason: str | None = None) -> None:
        """status: 'finished', 'early_stopped', 'failed', 'diverged', 'killed' or 'interrupted'; MLflow's status follows."""
        tags = {STATUS_TAG: status}
        if reason:
            tags[REASON_TAG] = reason[:5000]
        self.set_tags(tags)
        mlflow_status = {
            "finished": "FINISHED",
            "early_stopped": "KILLED",
            "killed": "KILLED",
            "interrupted": "KILLED",
        }.get(status, "FAILED")
        retry_locked(self._client.set_terminated, self.run_id, status=mlflow_status)


def dataset_input(data: Mapping[str, Any]) -> tuple[str, str, str, str, str]:
    """(name, digest, source type, source, profile) of a trial's training set, from its data config.

    The subset a trial trains on is a function of the dataset, its fraction and the fraction's seed
    (trainables.data.fraction_indices is deterministic), so those three make the digest: equal digests, equal
    training examples. The name carries the fraction, so the UI's Dataset column tells the subsets apart.
    """
    import hashlib

    name, fraction, seed = str(data.get("name")), float(data.get("fraction", 1.0)), int(data.get("fraction_seed", 0))
    root = data.get("root")
    key = json.dumps({"name": name, "fraction": fraction, "fraction_seed": seed}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    source_type = "embedded" if root is None else ("uri" if "://" in str(root) else "local")
    source = json.dumps({"root": None if root is None else str(root)})
    profile = json.dumps({"fraction": fraction, "fraction_seed": seed, "augment": data.get("augment")})
    label = name if fraction == 1.0 else f"{name} x{fraction:g}"
    return f"{label} seed={seed}" if fraction != 1.0 else label, digest, source_type, source, profile


def _param_value(value: Any) -> str:
    text = str(value)
    return text if len(text) <= _MAX_PARAM_LEN else text[: _MAX_PARAM_LEN - 3] + "..."
