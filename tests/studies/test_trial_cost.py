"""On real Ray, Optuna and SQLite MLflow: a trial that refuses its settings fails once (no Tune retry), and a study
whose trials validate every other epoch runs through Tune, ASHA and the searcher."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from analysis import load_runs
from studies.runner import run_study
from trainables.metrics import FIXED_PHASES, FIXED_TIME, fixed_phase_metric
from trainables.naming import PARENT_RUN_TAG, kind_filter
from trainables.ray_train import run_tune_trial


def _counting_trainable(folder: str):
    """The real trial, leaving one file per attempt in `folder`: how often Tune started it."""

    def trial(payload):
        with open(os.path.join(folder, f"{payload['cell']}.{uuid.uuid4().hex}"), "w"):
            pass
        run_tune_trial(payload)

    return trial


@pytest.mark.timeout(900)
def test_a_refused_trial_fails_once_and_gapped_validation_runs_through_tune(
    ray_cluster, tmp_path, tracking_uri, tiny_model
):
    resnet = tiny_model("resnet", dotted=True)
    study = {
        "name": "refusals",
        "base": {
            "data": {"name": "digits", "img_size": 16, "batch_size": 32},
            "optimizer": {"method": "sam", "lr": 0.003},
            "schedule": {"epochs": 3, "warmup_epochs": 0},
            "train": {"device": "cpu", "threads": 1, "eval_every": 2},
            "geometry": {"measures": ["lambda_max"], "batches": 1, "batch_size": 32, "max_iter": 3},
        },
        "factors": {
            "case": {
                # epoch 0 is not evaluated: Tune, ASHA and the searcher take a result without the objective
                "ok": {**tiny_model("mixer", dotted=True)},
                # finite differences on ReLUs: refused by the probe's check, which needs the built model
                "kinked": {**resnet, "geometry.hvp_mode": "finite_difference"},
                # 2 x 64 measurement samples from a subset of about 72
                "oversized": {
                    **tiny_model("mixer", dotted=True),
                    "data.fraction": 0.05,
                    "geometry.batches": 2,
                    "geometry.batch_size": 64,
                },
            }
        },
        "search": {"rho": {"type": "loguniform", "low": 0.01, "high": 0.1}},
        "budget": {"trials_per_cell": 1, "seed": 0, "asha": {"grace_period": 1}},
        "resources": {"cpus_per_trial": 1, "max_concurrent_trials": 2, "max_failures": 2},
        "tracking": {"artifact_location": str(tmp_path / "mlartifacts")},
        "storage": str(tmp_path / "runs"),
    }
    path = tmp_path / "refusals.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    attempts = tmp_path / "attempts"
    attempts.mkdir()

    outcome = run_study(path, tracking_uri=tracking_uri, trainable=_counting_trainable(str(attempts)))

    started = sorted(p.name.split(".")[0].removeprefix("case=") for p in attempts.iterdir())
    assert started == ["kinked", "ok", "oversized"]  # one attempt each: max_failures (2) never retried a refusal
    assert (outcome.trials, outcome.errored, outcome.refused) == (3, 2, 2)
    runs = load_runs("refusals", tracking_uri=tracking_uri).set_index("factor.case")
    assert runs.loc["ok", "status"] == "finished"
    client = MlflowClient(tracking_uri)
    for case, words in (("kinked", "relu"), ("oversized", "geometry.batches x geometry.batch_size")):
        assert (runs.loc[case, "status"], runs.loc[case, "mlflow_status"]) == ("failed", "FAILED")
        reason = client.get_run(runs.loc[case, "run_id"]).data.tags["sharpscale.reason"]
        assert reason.startswith("refused: ") and words in reason, reason
    # The ok trial validated after epochs 1 and 2 only, and its train_loss every epoch.
    ok = runs.loc["ok", "run_id"]
    assert [m.step for m in client.get_metric_history(ok, "val_acc")] == [1, 2]
    assert [m.step for m in client.get_metric_history(ok, "train_loss")] == [0, 1, 2]
    # Its time outside training, and what that was made of: the parts add up to it.
    recorded = client.get_run(ok).data.metrics
    parts = [recorded[fixed_phase_metric(p)] for p in FIXED_PHASES]
    assert sum(parts) == pytest.approx(recorded[FIXED_TIME]) and recorded[fixed_phase_metric("geometry")] > 0
    # Zero-based (studies.records.NUMBERING): the cell's first trial is #0, Optuna's Trial 0 of its study.
    assert client.get_run(ok).info.run_name.endswith(" #0")
    # Each cell run ends when its last trial ended (its duration its own), not when the study closed.
    exp = client.get_run(ok).info.experiment_id
    study_run = client.search_runs([exp], filter_string=kind_filter("study"))[0]
    study_end = study_run.info.end_time
    # Every run records its wall beside the estimate (here its wall alone: its tiny models have no CPU row).
    assert study_run.data.metrics["wall_h"] > 0 and "estimate.wall_h" not in study_run.data.metrics
    cells = client.search_runs([exp], filter_string=kind_filter("cell"))
    assert len(cells) == 3
    for cell in cells:
        trials = client.search_runs([exp], filter_string=f"tags.`{PARENT_RUN_TAG}` = '{cell.info.run_id}'")
        assert trials and cell.info.end_time == max(t.info.end_time for t in trials) < study_end

    storage = f"sqlite:///{tmp_path / 'runs' / 'refusals.optuna.db'}"
    states = {
        s.study_name.split("case=")[1]: [
            t.state.name for t in optuna.load_study(study_name=s.study_name, storage=storage).trials
        ]
        for s in optuna.get_all_study_summaries(storage)
    }
    assert states == {"ok": ["COMPLETE"], "kinked": ["FAIL"], "oversized": ["FAIL"]}


# --------------------------------------------------------------------------- cost told from measured figures


def _gpu_study(tmp_path, cells: dict, epochs=10, gpus=1.0, trials=2) -> str:
    study = {
        "name": "costed",
        "base": {
            "data": {"name": "cifar10", "root": str(tmp_path), "batch_size": 256},
            "schedule": {"epochs": epochs, "warmup_epochs": 1},
        },
        "factors": {"arch": cells},
        "budget": {"repeats_without_search": trials},
        "resources": {"cpus_per_trial": 1, "gpus_per_trial": gpus},
    }
    path = tmp_path / "costed.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return str(path)


def test_dry_run_prints_gpu_hours_from_the_one_table_of_measured_figures(tmp_path, capsys):
    from studies.cli import main
    from studies.cost import CARD_FIGURES, REFERENCE_CARD, two_sig

    resnet = {"model.name": "resnet18", "model.cifar_stem": True}
    path = _gpu_study(
        tmp_path,
        {
            "plain": {**resnet, "optimizer.method": "none"},
            "sam": {**resnet, "optimizer.method": "sam"},
            "unmeasured": {"model.name": "resnet50", "optimizer.method": "none"},
        },
        gpus=0.5,
    )
    assert main(["run", "--dry-run", "--address", "auto", path]) == 0
    out = capsys.readouterr().out
    row = next(r for r in CARD_FIGURES if r.card == REFERENCE_CARD and r.model == "resnet18" and r.batch_size == 256)
    seen = (50_000 // 256) * 256
    hours = 2 * 10 * seen * (1 / row.train_none + 1 / row.train_sam) * 0.5 / 3600  # 2 trials a cell, half a GPU each
    assert f"Estimated cost: {two_sig(hours)} GPU-hours on {REFERENCE_CARD}" in out  # 2 significant figures
    assert "No estimate for cell unmeasured: no measured figure of resnet50" in out


def test_a_cpu_study_is_costed_in_trial_hours_from_the_cpu_rows(capsys):
    from studies.cli import main
    from studies.cost import CARD_FIGURES, CPU_CARD

    assert main(["run", "--dry-run", str(Path(__file__).resolve().parents[2] / "studies" / "quickstart.yaml")]) == 0
    out = capsys.readouterr().out
    # The full quickstart's models (bench_trial_cost --study) and its --smoke form's have their CPU rows.
    card = next(r.card for r in CARD_FIGURES if r.card.startswith(CPU_CARD))
    assert f"trial-hours (one trial's CPUs each) on {card}" in out and "No estimate" not in out
    assert (
        main(["run", "--dry-run", "--smoke", str(Path(__file__).resolve().parents[2] / "studies/quickstart.yaml")]) == 0
    )
    out = capsys.readouterr().out
    assert f"trial-hours (one trial's CPUs each) on {card}" in out and "No estimate" not in out
    assert "start-up" in out and "tail of the last trials" in out


@pytest.mark.parametrize(
    ("aggregate", "shares"),
    [({1: 100.0}, 1), ({1: 100.0, 2: 109.0}, 1), ({1: 100.0, 2: 152.0, 3: 160.0}, 2), ({1: 10.0, 2: 21, 3: 31}, 3)],
)
def test_the_recommended_count_is_the_largest_whose_every_added_trial_pays(aggregate, shares):
    from studies.calibrate import recommend

    assert recommend(aggregate) == shares


def test_the_training_share_is_training_device_seconds_over_held_device_seconds():
    from studies.tuning import TRAINING_SHARE_METRICS, training_share
    from trainables.ray_train import DistributedPlan

    plan = DistributedPlan(workers=1, cpus_per_worker=4, gpus_per_worker=0.5)
    # 3 trials trained 60 s each on half a GPU, on a 2-GPU cluster, for 100 s: 90 of 200 GPU-seconds.
    assert training_share([60.0, 60.0, 60.0], plan, 100.0, {"GPU": 2.0, "CPU": 32.0}) == (
        TRAINING_SHARE_METRICS["gpu"],
        pytest.approx(0.45),
    )
    cpu = DistributedPlan(workers=2, cpus_per_worker=1, gpus_per_worker=0.0)
    assert training_share([10.0], cpu, 10.0, {"CPU": 4.0}) == (TRAINING_SHARE_METRICS["cpu"], pytest.approx(0.5))
    assert training_share([10.0], plan, 10.0, {"CPU": 4.0}) is None  # no GPU held: no share of it


# 13 CPU-s alone (side-by-side copies of a trial, each a process importing torch and timm): out of `make test-fast`.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_calibrate_measures_copies_of_a_trial_side_by_side_and_recommends(tmp_path, capsys, tiny_model):
    from studies.cli import main

    study = {
        "name": "shares",
        "base": {
            "model": tiny_model("mixer"),
            "data": {"name": "digits", "img_size": 16, "batch_size": 32},
            "train": {"device": "cpu", "threads": 1},
            "schedule": {"epochs": 2, "warmup_epochs": 0},
        },
    }
    path = tmp_path / "shares.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    assert main(["calibrate", str(path), "--device", "cpu", "--max-shares", "2", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "Calibration of cell all on cpu" in out and "Recommended: resources.gpus_per_trial:" in out
    lines = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in lines][:1] == ["1"] and float(lines[0][1].replace(",", "")) > 0


SHIPPED = sorted((Path(__file__).resolve().parents[2] / "studies").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_each_shipped_cost_comment_is_the_dry_runs_estimate(path):
    import re

    from studies.cost import estimate_study
    from studies.spec import load_study

    header = " ".join(line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#"))
    estimate = estimate_study(load_study(path, require_data=False))
    if not estimate.cells:
        assert "no GPU needed" in header  # a CPU study says so instead
        return
    if estimate.cpu:  # a CPU study costed from the CPU rows: its wall on the cores the comment names
        found = re.search(r"about ([\d.]+) minutes on (\d+) CPU cores, no GPU needed", header)
        assert found, f"{path.name}: no 'about X minutes on N CPU cores, no GPU needed' in its Cost comment"
        decimals = len(found.group(1).partition(".")[2])
        assert found.group(1) == f"{estimate.wall_h * 60:.{decimals}f}" and estimate.slots == int(found.group(2))
        return
    found = re.search(
        r"about ([\d.]+) GPU-hours of training epochs on an? (NVIDIA [A-Z0-9]+ [0-9]+GB [A-Z0-9]+)", header
    )
    assert found, f"{path.name}: no 'about X GPU-hours of training epochs on <card>' in its Cost comment"
    decimals = len(found.group(1).partition(".")[2])  # as precise as the comment writes it
    assert (found.group(1), found.group(2)) == (f"{estimate.gpu_hours:.{decimals}f}", estimate.card)


def test_a_trial_that_validated_every_other_epoch_and_ran_to_its_end_is_closed_as_finished(tracking_uri):
    from mlflow.entities import Metric, Param

    from studies.launch import close_dangling
    from trainables.naming import PARENT_RUN_TAG, STATUS_TAG

    client = MlflowClient(tracking_uri)
    exp = client.create_experiment("gaps")
    cell = client.create_run(exp).info.run_id
    trial = client.create_run(exp, tags={PARENT_RUN_TAG: cell}).info.run_id
    # Three epochs, eval_every 2: train_loss after every epoch, val_loss after epochs 1 and 2 only; Ray reclaimed
    # the actor before the trial's own finish ran, so the run is still RUNNING.
    metrics = [Metric("train_loss", 1.0, 0, e) for e in range(3)] + [Metric("val_loss", 1.0, 0, e) for e in (1, 2)]
    client.log_batch(trial, metrics=metrics, params=[Param("schedule.epochs", "3")])
    close_dangling(client, exp, {"cell": cell}, interrupted=None)
    run = client.get_run(trial)
    assert (run.data.tags[STATUS_TAG], run.info.status) == ("finished", "FINISHED")


def test_a_card_with_measured_validation_and_fixed_seconds_counts_them(tmp_path):
    from studies.cost import CARD_FIGURES, estimate_study
    from studies.spec import load_study

    row = next(r for r in CARD_FIGURES if r.val and r.fixed_s and r.checkpoint_s and r.model == "resnet18")
    resnet = {"model.name": "resnet18", "model.cifar_stem": True, "optimizer.method": "none"}
    path = _gpu_study(tmp_path, {"r": {**resnet, "train.eval_every": 3, "train.checkpoint_every": 2}}, trials=1)
    estimate = estimate_study(load_study(path, require_data=False), cluster_card=row.card, gpus=4)
    seen = (50_000 // 256) * 256
    # 10 epochs: validated after epochs 2, 5, 8 and 9; checkpointed after 1, 3, 5, 7 and 9.
    # Compiled on CUDA (train.compile auto), and the row measured the compiled step: its speed and cold compile.
    seconds = 10 * seen / row.compiled_none + 4 * 10_000 / row.val + row.fixed_s + row.compile_s + 5 * row.checkpoint_s
    assert estimate.card == row.card and estimate.gpu_hours == pytest.approx(seconds / 3600)
    assert "validation passes" in estimate.lines()[0] and "On this cluster's 4 GPU(s)" in estimate.lines()[1]


# --------------------------------------------------------------------------- the GPU's busy fraction


def test_the_busy_fraction_is_the_mean_utilisation_the_sampler_read(tmp_path):
    import sys

    from studies.busy import GpuBusySampler

    # A stand-in for nvidia-smi: two GPUs' lines per sample, and a line that is not a number (skipped, counted).
    script = tmp_path / "smi.py"
    script.write_text("for line in ['100', '0', '[N/A]', '50', '50', '80', '40']:\n    print(line, flush=True)\n")
    sampler = GpuBusySampler([sys.executable, str(script)])
    assert sampler.start()
    sampler.wait(timeout=120)
    assert sampler.stop() == pytest.approx((100 + 0 + 50 + 50 + 80 + 40) / 600)
    assert (len(sampler.samples), sampler.skipped) == (6, 1)
    # Nothing read (no GPU line at all): no fraction, never a 0 that looks measured.
    silent = GpuBusySampler([sys.executable, "-c", "pass"])
    assert silent.start()
    silent.wait(timeout=120)
    assert silent.stop() is None


def test_the_sampler_reads_the_gpus_this_node_gives_its_trials_and_only_where_it_sees_them_all(monkeypatch):
    import studies.busy
    import studies.tuning
    from studies.busy import nvidia_smi_command
    from trainables.ray_train import DistributedPlan

    monkeypatch.setattr(studies.busy.shutil, "which", lambda name: None)
    assert nvidia_smi_command({}) is None
    assert studies.tuning._busy_sampler(DistributedPlan(gpus_per_worker=1), {"GPU": 1}) is None  # no nvidia-smi
    monkeypatch.setattr(studies.busy.shutil, "which", lambda name: f"/usr/bin/{name}")
    command = nvidia_smi_command({"CUDA_VISIBLE_DEVICES": "2,3"}, interval_ms=250)
    assert command[:2] == ["/usr/bin/nvidia-smi", "--id=2,3"] and "-lms=250" in command
    assert "--id" not in " ".join(nvidia_smi_command({}))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    gpu = DistributedPlan(gpus_per_worker=0.5)
    assert studies.tuning._busy_sampler(DistributedPlan(), {"CPU": 8}) is None  # trials on CPUs: nothing to sample
    assert studies.tuning._busy_sampler(gpu, {"GPU": 2}).command == nvidia_smi_command()
    assert studies.tuning._busy_sampler(gpu, {"GPU": 4}) is None  # two GPUs elsewhere would go unsampled


def test_an_auto_checkpoint_cadence_is_costed_as_the_first_the_last_and_one_each_ratio_of_its_cost(tmp_path):
    from studies.cost import CARD_FIGURES, estimate_study
    from studies.spec import load_study
    from trainables.config import CHECKPOINT_AUTO_RATIO

    row = next(r for r in CARD_FIGURES if r.val and r.fixed_s and r.checkpoint_s and r.model == "resnet18")
    resnet = {"model.name": "resnet18", "model.cifar_stem": True, "optimizer.method": "none"}
    costs = {}
    for epochs in (2, 30):
        path = _gpu_study(tmp_path, {"r": {**resnet, "train.checkpoint_every": "auto"}}, epochs=epochs, trials=1)
        costs[epochs] = estimate_study(load_study(path, require_data=False), cluster_card=row.card).gpu_hours * 3600
    seen = (50_000 // 256) * 256
    two = 2 * (seen / row.compiled_none + 10_000 / row.val) + row.fixed_s + row.compile_s
    assert costs[2] == pytest.approx(two + 2 * row.checkpoint_s)  # the first epoch and the last, nothing more
    rest = 30 * (seen / row.compiled_none + 10_000 / row.val) + row.fixed_s + row.compile_s
    every = CHECKPOINT_AUTO_RATIO * row.checkpoint_s
    assert rest > every  # long enough that 'auto' adds checkpoints between the first and the last
    assert costs[30] == pytest.approx(rest + (2 + int(rest // every)) * row.checkpoint_s)


def test_a_trial_is_costed_at_the_step_it_will_run_and_an_eager_figure_for_a_compiled_one_is_called_an_upper_bound(
    tmp_path,
):
    from studies.cost import CARD_FIGURES, REFERENCE_CARD, compiled_speedup, estimate_study
    from studies.spec import load_study

    row = next(r for r in CARD_FIGURES if r.compiled_none and r.val and r.fixed_s and r.model == "resnet18")
    resnet = {
        "model.name": "resnet18",
        "model.cifar_stem": True,
        "optimizer.method": "sam",
        "train.checkpoint_every": 9,
    }
    levels = {"compiled": resnet, "eager": {**resnet, "train.compile": "off"}}
    study = load_study(_gpu_study(tmp_path, levels, trials=1), require_data=False)
    by_cell = {c.cell: c for c in estimate_study(study, cluster_card=row.card).cells}
    seen = (50_000 // 256) * 256
    rest = 10 * 10_000 / row.val + row.fixed_s + 2 * row.checkpoint_s  # 10 validations; checkpoints after epochs 9, 10
    compiled, eager = by_cell["compiled"], by_cell["eager"]  # the cells' one names
    assert (compiled.compiles, compiled.compiled, eager.compiles, eager.compiled) == (True, True, False, False)
    assert compiled.gpu_hours * 3600 == pytest.approx(10 * seen / row.compiled_sam + rest + row.compile_s)
    assert eager.gpu_hours * 3600 == pytest.approx(10 * seen / row.train_sam + rest)
    # A card measured eager only: the compiling cell is costed eager, and the estimate says what that means.
    lines = estimate_study(study, cluster_card=REFERENCE_CARD).lines()
    low, high = compiled_speedup()
    assert 1 < low <= high
    said = [line for line in lines if "figures are of the eager step" in line]
    assert said == [
        f"  The {REFERENCE_CARD}'s figures are of the eager step, and the trials of 1 of the 2 cells compile theirs "
        f"(train.compile): on the cards measured both ways the compiled step trained {low:.1f}-{high:.1f}x as fast, "
        "so their training part is an upper bound."
    ]
    assert not any("eager step" in line for line in estimate_study(study, cluster_card=row.card).lines())
