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
    re.compile(r"AKIA[0-9A-Z]{16}"),                                 # AWS access key id
    re.compile(r"aws_secret_access_key|AWS_SECRET_ACCESS_KEY"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@"),           # scheme://user:password@host
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
    assert len(workers) == 2  # counts what the checks below cover
    assert types[head]["resources"].get("GPU", 0) == 0 and types[head]["max_workers"] == 0
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


def test_no_credentials_in_committed_cluster_files():
    files = [CLUSTER_YAML, DOCKERFILE, REPO / ".dockerignore", REPO / "docs" / "cluster.md"]
    for path in files:
        text = path.read_text()
        for pattern in _SECRETS:
            match = pattern.search(text)
            assert match is None, f"{path.name}: looks like a credential: {match.group(0)!r}"
    assert len(files) == 4


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
