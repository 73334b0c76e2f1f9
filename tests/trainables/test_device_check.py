"""`train.device: auto` refuses to fall back to the CPU when Ray gave the trial a GPU that torch cannot see.

A real Ray cluster that advertises one GPU on this GPU-less machine (`ray.init(num_gpus=1)`) is exactly what a
node whose container lacks `--gpus all` looks like. It runs in a subprocess: the session's cluster has no GPU.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch sees no GPU")

_DRIVER = r"""
import json, sys
import ray
from mlflow.tracking import MlflowClient
from studies.runner import run_study

ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
outcome = run_study(sys.argv[1], tracking_uri=sys.argv[2])
client = MlflowClient(sys.argv[2])
runs = client.search_runs([outcome.experiment_id], "tags.`sharpscale.kind` = 'trial'")
print("RESULT " + json.dumps({
    "errored": outcome.errored,
    "runs": {r.data.params["train.device"]: [r.data.tags.get("sharpscale.status"), r.data.tags.get("sharpscale.reason", "")]
             for r in runs},
}))
"""


@pytest.mark.timeout(300)
def test_auto_device_with_a_ray_gpu_torch_cannot_see_fails_the_trial_with_the_fix(tmp_path, tiny_model, tracking_uri):
    study = {
        "name": "device",
        "base": {
            "model": tiny_model("mixer"),
            "data": {"name": "digits", "img_size": 16, "batch_size": 256, "augment": "none"},
            "schedule": {"epochs": 1, "warmup_epochs": 0},
            "train": {"threads": 1},
        },
        # Both trials get Ray's GPU; only `auto` would silently train on the CPU.
        "factors": {"train.device": ["auto", "cpu"]},
        "resources": {"cpus_per_trial": 1, "gpus_per_trial": 1, "max_concurrent_trials": 1, "max_failures": 0},
        "storage": str(tmp_path / "runs"),
        "tracking": {"artifact_location": str(tmp_path / "mlartifacts")},
    }
    path = tmp_path / "device.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(path), tracking_uri],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        start_new_session=True,
    )
    assert out.returncode == 0 and "RESULT " in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.split("RESULT ", 1)[1])
    assert result["errored"] == 1
    status, reason = result["runs"]["auto"]
    assert status == "failed"
    for part in (
        "train.device: 'auto'",
        "ray.get_gpu_ids() = [",
        "torch sees none",
        "Fix:",
        "--gpus all",
        "train.device: cpu",
    ):
        assert part in reason, reason
    assert result["runs"]["cpu"][0] == "finished"  # asked for the CPU on purpose: no error
