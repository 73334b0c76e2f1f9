"""The data preflight on a real local Ray cluster: an unreadable root fails the study before any trial, good ones pass."""

from __future__ import annotations

import shutil

import pytest
import yaml
from mlflow.tracking import MlflowClient

from studies.preflight import check_data_on_nodes, data_roots
from studies.runner import run_study
from studies.spec import StudyError, load_study


def _study(tmp_path, tiny_model, roots: list[str], name: str = "preflight", resources: dict | None = None):
    """A CIFAR-10 study with one cell per data root (nothing of it runs unless the preflight passes)."""
    study = {
        "name": name,
        "base": {
            "data": {"name": "cifar10", "root": roots[0], "augment": "none", "batch_size": 8},
            "model": tiny_model("resnet", channels=[4, 4, 4, 4]),
            "schedule": {"epochs": 1, "warmup_epochs": 0},
            "train": {"device": "cpu", "threads": 1},
        },
        "factors": {"data.root": roots},
        "resources": {"cpus_per_trial": 1, "max_concurrent_trials": 1, **(resources or {})},
        "tracking": {"artifact_location": str(tmp_path / "mlartifacts")},
        "storage": str(tmp_path / "runs"),
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


@pytest.fixture
def good_roots(tmp_path, write_fake_cifar) -> tuple[str, str]:
    """A fake CIFAR-10 at a local path and another behind a file:// URI."""
    local, remote = tmp_path / "local" / "cifar10", tmp_path / "bucket" / "cifar10"
    write_fake_cifar(local, "cifar10")
    write_fake_cifar(remote, "cifar10")
    return str(local), remote.as_uri()


@pytest.mark.ray
def test_readable_roots_pass(ray_cluster, tmp_path, good_roots, tiny_model):
    study = load_study(_study(tmp_path, tiny_model, list(good_roots)))
    assert data_roots(study) == sorted(("cifar10", r) for r in good_roots)
    check_data_on_nodes(study, timeout_s=120)


@pytest.mark.ray
def test_every_unreadable_root_is_reported_with_node_reason_and_fix(ray_cluster, tmp_path, good_roots, tiny_model):
    good_local, good_uri = good_roots
    gone, empty = tmp_path / "gone", tmp_path / "empty"
    gone.mkdir()
    empty.mkdir()
    missing_uri = (tmp_path / "no-bucket" / "cifar10").as_uri()
    # A local path must exist on the driver to pass validation; it is removed afterwards, as if only the driver had it.
    study = load_study(_study(tmp_path, tiny_model, [good_local, good_uri, str(gone), str(empty), missing_uri]))
    shutil.rmtree(gone)
    with pytest.raises(StudyError) as info:
        check_data_on_nodes(study, timeout_s=120)
    problems = info.value.problems
    assert len(problems) == 3, problems
    (node,) = [n for n in ray_cluster.nodes() if n["Alive"]]
    where = f"on node {node['NodeManagerAddress']} ({node['NodeID'][:8]}): "
    by_root = {
        root: next(p for p in problems if p.startswith(f"data.root {root!r}"))
        for root in (str(gone), str(empty), missing_uri)
    }
    assert all(where in p and ". Fix: " in p for p in problems)
    assert (
        "no such directory on this node" in by_root[str(gone)]
        and "sharpscale data fetch cifar10 --to s3://" in by_root[str(gone)]
    )
    assert (
        "does not hold the cifar10 layout" in by_root[str(empty)]
        and "missing: cifar-10-batches-py/data_batch_1" in by_root[str(empty)]
    )
    assert (
        "does not exist, seen from this node" in by_root[missing_uri] and f"--to {missing_uri}" in by_root[missing_uri]
    )
    assert not any(good_local in p or good_uri in p for p in problems)


@pytest.mark.ray
def test_only_nodes_that_can_host_a_trial_are_asked(ray_cluster, tmp_path, tiny_model):
    missing_uri = (tmp_path / "no-bucket" / "cifar10").as_uri()
    # No node of this cluster has the marker: none could run a trial, so none is asked (an autoscaler adds it later).
    pinned = load_study(_study(tmp_path, tiny_model, [missing_uri], resources={"custom": {"absent_marker": 1}}))
    check_data_on_nodes(pinned, timeout_s=120)
    with pytest.raises(StudyError, match="does not exist, seen from this node"):
        check_data_on_nodes(load_study(_study(tmp_path, tiny_model, [missing_uri])), timeout_s=120)


@pytest.mark.ray
def test_a_study_whose_data_no_node_reads_fails_before_any_trial(
    ray_cluster, tmp_path, tracking_uri, good_roots, tiny_model
):
    missing_uri = (tmp_path / "no-bucket" / "cifar10").as_uri()
    path = _study(tmp_path, tiny_model, [good_roots[0], missing_uri], name="unreadable")
    load_study(path)  # the driver cannot tell: a URI is read on the nodes
    with pytest.raises(StudyError, match=r"data.root .*no-bucket/cifar10.* does not exist, seen from this node"):
        run_study(path, tracking_uri=tracking_uri)
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("unreadable")
    # Refused before the study's runs are opened: nothing in MLflow to close or to mistake for a result.
    assert client.search_runs([exp.experiment_id]) == []
    assert not (tmp_path / "runs" / "unreadable").exists()  # Tune never started


def test_the_driver_demands_a_local_root_but_not_a_uri(tmp_path, tiny_model):
    with pytest.raises(StudyError, match=r"data.root: the directory must exist, got '/nowhere/cifar10'.*Fix:"):
        load_study(_study(tmp_path, tiny_model, ["/nowhere/cifar10"]))
    # No store is contacted at validation: the bucket need not exist for the file to be valid.
    study = load_study(
        _study(tmp_path, tiny_model, ["s3://sharpscale-no-such-bucket/cifar10", "gs://nor-this/cifar10"])
    )
    assert [r for _, r in data_roots(study)] == ["gs://nor-this/cifar10", "s3://sharpscale-no-such-bucket/cifar10"]
