"""Ray Train runs the very same loop: 2 gloo workers match the in-process run (geometry measured on rank 0 included);
a killed worker resumes exactly."""

import os
import signal
import threading
import time

import pytest
import torch

from trainables import fit, load_checkpoint
from trainables.ray_train import DistributedPlan, fit_distributed


# LayerNorm, not BatchNorm, and no augmentation: per-rank batch statistics and per-rank random draws are
# legitimate differences between 2 workers and 1 process; everything else must agree.
@pytest.fixture
def config(tiny_model):
    return {
        "model": tiny_model("mixer", num_blocks=2, embed_dim=64),
        "data": {"name": "digits", "img_size": 16, "batch_size": 64, "augment": "none"},
        # SGD, not AdamW: Adam divides by sqrt(v), so a parameter whose gradient is pure round-off (the Mixer's
        # token-MLP output bias, cancelled by the next LayerNorm) moves by full steps in a noise-chosen direction.
        "optimizer": {"method": "none", "base": "sgd", "lr": 0.05},
        "schedule": {"epochs": 4, "warmup_epochs": 0},
        "train": {"device": "cpu", "seed": 5, "threads": 1},
    }


def _weights(result):
    state = load_checkpoint(result.checkpoint.path)
    return state, state["model"]


def _checkpoints(run_dir) -> list:
    return [p for p in run_dir.iterdir() if p.name.startswith("checkpoint")] if run_dir.exists() else []


def _newest_epoch(run_dir) -> int:
    """The newest epoch a complete checkpoint under run_dir holds (Ray Train names them by time, not epoch)."""
    epochs = []
    for path in _checkpoints(run_dir):
        try:
            epochs.append(load_checkpoint(path)["epoch"])
        except Exception:  # noqa: BLE001 - one still being copied: not complete, not counted
            pass
    return max(epochs, default=-1)


def _worker_pids(ray):
    from ray.util.state import list_actors

    # This session's cluster by address: another pytest worker's cluster may run on this machine too.
    address = ray.get_runtime_context().gcs_address
    actors = list_actors(address=address, filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")])
    return [a.pid for a in actors]


@pytest.mark.timeout(600)
def test_two_workers_match_in_process_and_survive_a_killed_worker(ray_cluster, tmp_path, config):
    from analysis.geometry import make_probe, probe_plan

    # The straight runs also measure lambda_max (rank 0 alone under DDP; the measurement changes no training number).
    measured = {
        **config,
        "geometry": {"measures": ["lambda_max"], "every": 2, "batches": 1, "batch_size": 64, "max_iter": 8},
    }
    local = tmp_path / "local"
    fit(measured, checkpoint_dir=local, probe=make_probe(measured))
    reference = load_checkpoint(local)

    plan = DistributedPlan(workers=2, cpus_per_worker=1, max_failures=2, storage_path=str(tmp_path / "ray"))
    straight = fit_distributed(measured, plan=plan, name="straight", payload={"probe": probe_plan(measured)})
    state, weights = _weights(straight)
    assert state["epoch"] == config["schedule"]["epochs"] - 1
    assert state["metrics"]["geometry/lambda_max"] == pytest.approx(
        reference["metrics"]["geometry/lambda_max"], rel=1e-3
    )
    # Same global batches, mean of per-rank means = global mean: equal up to float reassociation.
    for key, value in reference["model"].items():
        if value.dtype.is_floating_point:
            torch.testing.assert_close(weights[key], value, rtol=1e-4, atol=1e-5, msg=key)
        else:
            assert torch.equal(weights[key], value), key

    # Once the first checkpoint exists, hold both workers (SIGSTOP) so nothing runs between looking and killing:
    # the kill cannot race the end of training. Then kill one (SIGKILL), let the other go on; Ray Train restarts
    # the group from the checkpoint.
    out = {}
    thread = threading.Thread(
        target=lambda: out.setdefault("result", fit_distributed(config, plan=plan, name="killed"))
    )
    thread.start()
    run_dir = tmp_path / "ray" / "killed"
    deadline = time.time() + 300
    killed, held_at = None, None
    while time.time() < deadline and killed is None and thread.is_alive():
        if _newest_epoch(run_dir) >= 0:
            pids = _worker_pids(ray_cluster)
            if len(pids) == plan.workers:
                for pid in pids:
                    os.kill(pid, signal.SIGSTOP)
                held_at = _newest_epoch(run_dir)
                os.kill(pids[-1], signal.SIGKILL)
                killed = pids[-1]
                for pid in pids[:-1]:
                    os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)
    thread.join(timeout=400)
    assert killed is not None, "training finished before a worker could be killed"
    last_epoch = config["schedule"]["epochs"] - 1
    assert 0 <= held_at < last_epoch, f"held after epoch {held_at} of {last_epoch}: the kill interrupted nothing"
    result = out["result"]
    state_k, weights_k = _weights(result)
    assert state_k["epoch"] == config["schedule"]["epochs"] - 1
    assert result.metrics["val_acc"] == straight.metrics["val_acc"]
    assert result.metrics["train_loss"] == pytest.approx(straight.metrics["train_loss"], rel=1e-6)
    for key, value in weights.items():
        torch.testing.assert_close(weights_k[key], value, rtol=1e-6, atol=1e-7, msg=key)


@pytest.mark.timeout(600)
def test_sampa_two_rank_form_through_ray_train_trains_what_one_process_does(ray_cluster, tmp_path, config):
    """SAMPa's parallel=True form (issue 34) through Ray Train: two gloo workers each take the whole global batch,
    rank 0 computing the perturbation's gradient g(x~) and rank 1 the update's g(y), at once; the trial they train
    is the one a single process trains with parallel=False, every step: each epoch's training loss and the final
    weights agree to float rounding (no reassociation here: each gradient is one rank's alone, the other's row 0)."""
    one = {**config, "optimizer": {**config["optimizer"], "method": "sampa", "hparams": {"rho": 0.05, "lmbda": 0.3}}}
    two = {**one, "optimizer": {**one["optimizer"], "hparams": {**one["optimizer"]["hparams"], "parallel": True}}}
    epochs = []
    fit(one, checkpoint_dir=tmp_path / "one", reporter=lambda metrics, _: epochs.append(dict(metrics)))
    reference = load_checkpoint(tmp_path / "one")

    plan = DistributedPlan(workers=2, cpus_per_worker=1, max_failures=0, storage_path=str(tmp_path / "ray"))
    result = fit_distributed(two, plan=plan, name="sampa_two_ranks")
    state, weights = _weights(result)
    assert state["epoch"] == config["schedule"]["epochs"] - 1
    # The epochs Ray Train's result keeps (those of its kept checkpoints), each against the same epoch in one process;
    # the final weights below carry every step.
    local = {int(m["epoch"]): m for m in epochs}
    curve = result.metrics_dataframe
    assert len(curve) and int(curve["epoch"].max()) == config["schedule"]["epochs"] - 1
    for _, row in curve.iterrows():
        assert row["train_loss"] == pytest.approx(local[int(row["epoch"])]["train_loss"], rel=1e-6)
        assert row["train_acc"] == local[int(row["epoch"])]["train_acc"]  # the whole batch counted once, on rank 0
        assert row["passes_per_step"] == 1.0  # per rank: each takes one of the step's two passes
    assert result.metrics["val_acc"] == epochs[-1]["val_acc"]
    for key, value in reference["model"].items():
        torch.testing.assert_close(weights[key], value, rtol=1e-6, atol=1e-7, msg=key)
