"""On a real multi-node Ray cluster, a study whose state is on one node's disk is refused before any trial.

Two `ray start` nodes on this machine, as in test_two_node.py (same class, same cleanup: only what the test
started is stopped, never `ray stop`): a head that offers no CPU, as ray_cluster.yaml's does, then a worker.
The driver runs in subprocesses, never sharing the pytest process's Ray state.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from studies.server import pids_naming
from tests.cluster.test_two_node import TwoNodeCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[2]

# Each rule against the connected cluster: the problems `check_cluster_storage` reports, or [] when it accepts.
_CHECKS = r"""
import json, sys
import ray
from studies.preflight import check_cluster_storage
from studies.runner import state_locations
from studies.spec import StudyError, load_study
from trainables.ray_train import DistributedPlan

ray.init(address=sys.argv[1], log_to_driver=False)
out = {}
for name, overrides in json.loads(sys.argv[3]).items():
    study = load_study(sys.argv[2], overrides=overrides)
    try:
        check_cluster_storage(study, state_locations(study, "s"), DistributedPlan(), connected=True)
        out[name] = []
    except StudyError as err:
        out[name] = err.problems
print("CHECKS " + json.dumps(out))
"""


class ZeroCpuHeadCluster(TwoNodeCluster):
    def __init__(self, logs: Path):
        super().__init__(logs)
        self._head_args = [a if a != "--num-cpus=1" else "--num-cpus=0" for a in self._head_args]


@pytest.fixture
def cluster(tmp_path):
    c = ZeroCpuHeadCluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()
        shutil.rmtree(c.temp_dir, ignore_errors=True)


def _study(tmp_path: Path) -> Path:
    study = {
        "name": "local-state",
        "base": {"data": {"name": "digits", "img_size": 16}, "schedule": {"epochs": 1}, "train": {"device": "cpu"}},
        "storage": "runs",  # beside the study file: one node's disk
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def test_node_local_state_refused_on_a_multi_node_cluster(cluster, tmp_path, tracking_uri):
    study = _study(tmp_path)
    cluster.start_head()
    cluster._wait_started("head")

    # The head alone, offering no CPU: every trial would run on a worker the autoscaler adds.
    tracking = tracking_uri
    driver = subprocess.run(
        [
            sys.executable,
            "-m",
            "studies.cli",
            "run",
            str(study),
            "--address",
            cluster.address,
            "--tracking-uri",
            tracking,
        ],
        env=cluster.env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    assert driver.returncode == 2, driver.stdout[-2000:] + driver.stderr[-3000:]
    assert f"storage: a path on this node, got '{tmp_path / 'runs'}'" in driver.stderr, driver.stderr[-3000:]
    for part in ("Unable to set up cluster storage", "Fix:", "shared_mounts", "s3://"):
        assert part in driver.stderr, driver.stderr[-3000:]
    assert "Traceback" not in driver.stderr
    # Refused before anything was written: no Tune results, no MLflow run.
    assert not (tmp_path / "runs" / "local-state").exists()
    from mlflow.tracking import MlflowClient

    exp = MlflowClient(tracking).get_experiment_by_name("local-state")
    assert exp is None or not MlflowClient(tracking).search_runs([exp.experiment_id])

    cluster.start_worker()
    cases = {
        "local": {},
        "declared_shared": {"storage": str(tmp_path / "nfs" / "runs"), "shared_mounts": [str(tmp_path / "nfs")]},
        "outside_the_mount": {"storage": str(tmp_path / "runs"), "shared_mounts": [str(tmp_path / "nfs")]},
        "bucket_without_optuna": {"storage": "s3://bucket/runs"},
        "bucket_with_optuna": {"storage": "s3://bucket/runs", "optuna_storage": "postgresql://me@db:5432/optuna"},
    }
    checks = subprocess.run(
        [sys.executable, "-c", _CHECKS, cluster.address, str(study), json.dumps(cases)],
        env=cluster.env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    assert checks.returncode == 0, checks.stdout[-2000:] + checks.stderr[-3000:]
    problems = json.loads(checks.stdout.split("CHECKS ", 1)[1])
    assert [p.split(":")[0] for p in problems["local"]] == ["storage"], problems
    assert "(2 node(s) alive now)" in problems["local"][0]
    assert problems["declared_shared"] == [] and problems["bucket_with_optuna"] == []
    assert [p.split(":")[0] for p in problems["outside_the_mount"]] == ["storage"]
    assert [p.split(":")[0] for p in problems["bucket_without_optuna"]] == ["optuna_storage"]
    assert "journal:///" in problems["bucket_without_optuna"][0]

    assert cluster.stop() == []
    assert not pids_naming(str(cluster.temp_dir))
