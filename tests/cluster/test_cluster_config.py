"""ray_cluster.yaml through the validation `ray up` itself runs (no cloud access), and docker/Dockerfile against it."""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

REPO = Path(__file__).resolve().parents[2]
CLUSTER_YAML = REPO / "ray_cluster.yaml"
DOCKERFILE = REPO / "docker" / "Dockerfile"
PY_TAG = f"py{sys.version_info.major}{sys.version_info.minor}"
BASE_IMAGE = f"rayproject/ray:{ray.__version__}-{PY_TAG}-gpu"

# Things that must never be in a committed file: cloud keys, private keys, passwords inside URIs.
_SECRETS = [
    re.compile(r"AKIA[0-9A-Z]{16}"),  # AWS access key id
    re.compile(r"aws_secret_access_key|AWS_SECRET_ACCESS_KEY"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@"),  # scheme://user:password@host
    re.compile(r"(?i)(password|secret|token)\s*[:=]\s*['\"]?[A-Za-z0-9/+_-]{16,}"),
]


def _load() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def _prepared() -> dict:
    # What `ray up` does before it touches a cloud: merge the provider's defaults, then validate against
    # ray/autoscaler/ray-schema.json and the cross-field rules (commands._bootstrap_config).
    config = prepare_config(copy.deepcopy(_load()))
    validate_config(config)
    return config


def test_cluster_yaml_passes_rays_own_validation():
    config = _prepared()
    types = config["available_node_types"]
    head = config["head_node_type"]
    workers = {name: t for name, t in types.items() if name != head}
    assert workers, "no worker node type: nothing could run a trial"
    assert types[head]["max_workers"] == 0
    for name, node_type in workers.items():
        assert node_type["min_workers"] == 0, f"{name}: GPU workers must scale from zero"
        assert node_type["resources"]["GPU"] >= 1, name
        assert node_type["node_config"]["ImageId"] == types[head]["node_config"]["ImageId"], name
    # Our setup commands replaced the provider defaults (which install a nightly Ray wheel).
    for key in ("head_setup_commands", "worker_setup_commands"):
        assert not any("ray-wheels" in cmd or "ray[default] @" in cmd for cmd in config[key]), config[key]


def test_validation_is_strict_so_the_check_above_means_something():
    bad = _load()
    bad["max_worker"] = 3  # a typo of max_workers
    with pytest.raises(jsonschema.ValidationError, match="max_worker"):
        validate_config(prepare_config(bad))
    bad = _load()
    bad["head_node_type"] = "no_such_type"
    with pytest.raises(ValueError, match="head_node_type"):
        validate_config(prepare_config(bad))


def test_head_keeps_dashboard_on_loopback_and_runs_the_mlflow_server():
    config = _load()
    start = " ".join(config["head_start_ray_commands"])
    assert re.search(r"ray start --head\b", start)
    assert "--dashboard-host=127.0.0.1" in start and "--dashboard-host=0.0.0.0" not in start
    assert "sharpscale server" in start and "--backend-store-uri" in start and "--artifacts-destination" in start
    workers = " ".join(config["worker_start_ray_commands"])
    assert "--address=$RAY_HEAD_IP:6379" in workers


# One made-up credential per pattern: the scan below only means something if each pattern catches its kind.
_FAKE_SECRETS = [
    "AKIA" + "ABCDEFGHIJKLMNOP",
    "aws_secret_access_key = x",
    "-----BEGIN RSA " + "PRIVATE KEY-----",
    "postgresql://sharpscale:" + "hunter2@db.internal:5432/mlflow",
    "password: " + "Zm9vYmFyYmF6cXV4MTIzNA",
]


def test_no_credentials_in_committed_cluster_files():
    for fake, pattern in zip(_FAKE_SECRETS, _SECRETS, strict=True):
        assert pattern.search(fake), f"{pattern.pattern} misses {fake!r}"
    for path in [CLUSTER_YAML, DOCKERFILE, REPO / ".dockerignore", REPO / "docs" / "cluster.md"]:
        text = path.read_text()
        for pattern in _SECRETS:
            match = pattern.search(text)
            assert match is None, f"{path.name}: looks like a credential: {match.group(0)!r}"


def test_cluster_scales_far_enough_and_its_workers_see_their_gpus():
    config = _prepared()
    types, head = config["available_node_types"], config["head_node_type"]
    workers = {name: t for name, t in types.items() if name != head}
    # The largest GPU count one node type reaches within the cluster's own cap: 16 nodes of 4 GPUs.
    reach = max(t["resources"]["GPU"] * min(t["max_workers"], config["max_workers"]) for t in workers.values())
    assert reach >= 64, (config["max_workers"], {n: (t["max_workers"], t["resources"]) for n, t in workers.items()})
    docker = config["docker"]
    worker_options = docker.get("run_options", []) + docker.get("worker_run_options", [])
    assert "--gpus all" in worker_options, worker_options
    # The head is a CPU instance: asking Docker for GPUs there would fail the container's start.
    assert "--gpus all" not in docker.get("run_options", []) + docker.get("head_run_options", [])


def test_every_shipped_studys_trial_fits_on_a_worker_node():
    """A trial whose worker asks for more than any node type offers stays PENDING forever: Ray never says why."""
    from studies.spec import load_study

    config = _load()
    nodes = {n: t["resources"] for n, t in config["available_node_types"].items() if n != config["head_node_type"]}
    studies = sorted((REPO / "studies").glob("*.yaml"))
    assert len(studies) >= 6, studies
    misfits = []
    for path in studies:
        res = load_study(path, require_data=False).spec.resources
        need = {"CPU": res.cpus_per_trial, "GPU": res.gpus_per_trial, **res.custom}  # one worker of the trial
        if not any(all(node.get(k, 0) >= v for k, v in need.items() if v) for node in nodes.values()):
            misfits.append(f"{path.name}: each worker needs {need}, node types offer {nodes}")
    assert not misfits, misfits


def test_head_runs_no_trials():
    config = _load()
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"] == {"CPU": 0, "GPU": 0}
    start = " ".join(config["head_start_ray_commands"])
    assert re.search(r"ray start --head\b[^;]*--num-cpus=0", start) and "--num-gpus=0" in start, start


def test_every_node_mounts_the_shared_storage_the_cluster_ready_studies_use():
    from studies.spec import load_study, storage_is_shared

    config = _load()
    volumes = [o.split()[1].split(":") for o in config["docker"]["run_options"] if o.startswith("-v ")]
    shared = {inside for outside, inside in volumes if outside == inside}
    mounts = [c for c in config["initialization_commands"] if not c.lstrip().startswith("#") and "mount -t nfs" in c]
    assert len(mounts) == 1 and all(f" {m}" in mounts[0] for m in shared), (mounts, shared)
    for name in ("rho_sensitivity", "data_scaling", "compute_matched"):
        study = load_study(REPO / "studies" / f"{name}.yaml", smoke=True)  # smoke: no dataset needed here
        assert study.spec.shared_mounts and set(study.spec.shared_mounts) <= shared, (name, study.spec.shared_mounts)
        assert storage_is_shared(study.storage, study.spec.shared_mounts), (name, study.storage)
        # Optuna's database defaults to beside the results: on the shared mount too.
        assert study.optuna_storage(name).startswith(f"sqlite:///{study.storage}/"), study.optuna_storage(name)


def test_docs_name_what_ray_up_needs_and_walk_through_a_shipped_study():
    doc = (REPO / "docs" / "cluster.md").read_text()
    assert "pip install boto3" in doc
    assert re.search(r"sharpscale run --address auto [^\n]*studies/rho_sensitivity\.yaml", doc)
    assert "--storage" in doc and "shared_mounts" in doc and "optuna_storage" in doc


def _from_lines() -> list[str]:
    return [line.split()[1] for line in DOCKERFILE.read_text().splitlines() if line.upper().startswith("FROM ")]


def test_dockerfile_builds_on_the_installed_rays_image():
    assert _from_lines() == [BASE_IMAGE], f"the image must match the Ray that runs `ray up` ({ray.__version__})"
    # ray_cluster.yaml runs the image built from it: its tag names the same Ray and Python.
    image = _load()["docker"]["image"]
    assert image.endswith(f"-ray{ray.__version__}-{PY_TAG}-gpu"), image
    assert "ray-ml" not in DOCKERFILE.read_text() and "ray-ml" not in image  # discontinued images


def test_dockerfile_runs_as_the_images_user_and_takes_no_secrets():
    lines = [line.strip() for line in DOCKERFILE.read_text().splitlines()]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] == "ray", users
    args = [line for line in lines if line.startswith("ARG ")]
    assert not any(re.search(r"(?i)key|secret|token|password", a) for a in args), args
    # The project is installed, with constraints that keep the image's torch and Ray.
    assert any("pip install" in line and "-c /tmp/constraints.txt" in line for line in lines)
    assert any("pip install --no-deps ." in line for line in lines)


def test_dockerignore_keeps_local_state_and_keys_out_of_the_image():
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    for entry in (".git", ".venv", "mlflow.db", "mlartifacts", "sharpscale_runs", "**/.pgpass", "**/*.pem"):
        assert entry in ignored, entry
