"""The names of the metrics the training loop reports each epoch: what a study's objective may name."""

from __future__ import annotations

__all__ = [
    "COUNT_METRICS",
    "EPOCH_METRICS",
    "EPOCH_TIME",
    "EVERY_EPOCH_METRIC",
    "FIXED_PHASES",
    "FIXED_TIME",
    "SAM_METRICS",
    "STEP_METRICS",
    "TRIAL_TIME",
    "VALIDATION_METRICS",
    "VALIDATION_SAMPLES",
    "fixed_phase_metric",
]

# `trainables.loop.evaluate`: on the validation split, after every epoch that train.eval_every names (and the last).
VALIDATION_METRICS = ("val_loss", "val_acc", "val_top5")
# How many validation samples those are: what an accuracy's sampling error follows (analysis.summarize).
VALIDATION_SAMPLES = "val_samples"
# Only where the method takes a second (perturbed) pass: SAM and its kin.
SAM_METRICS = ("surrogate_gap", "sharpness_2h_rho2")
# Every method, every epoch: the share of its steps that perturbed the weights (optimizer.schedule; LookSAM's k) and
# the forward+backward passes per step they took, which a step's cost follows.
STEP_METRICS = ("perturbed_share", "passes_per_step")
# Seconds of one epoch's training pass (not its validation): what a trial's compute is counted from (analysis.compute).
EPOCH_TIME = "epoch_time_s"
# Logged once, when a trial ends (trainables.ray_train): the seconds from the trial function's start to its end, and
# the part of them outside its training passes (its start, data load, validation, geometry, checkpoints, records),
# i.e. TRIAL_TIME less the sum of EPOCH_TIME. Of the trial's last attempt where it was retried or resumed.
TRIAL_TIME = "trial_time_s"
FIXED_TIME = "fixed_time_s"
# What FIXED_TIME is made of, each logged beside it as `fixed_<phase>_s` (fixed_phase_metric): the trial function's
# start to its record's opening (Ray's and the process's imports on an actor's first trial), opening the MLflow run
# and logging its params and tags, importing the loop (torch, timm) and the geometry probe, the dataset's load, the
# model, loaders, measurement set, optimizer and a resumed trial's restored state, the compile (compile_time_s),
# validation passes, geometry measurements, writing checkpoints, handing each epoch's result and checkpoint to Ray
# (Tune copies the checkpoint to storage), each epoch's MLflow record, and what is left (`other`: the metrics' own
# arithmetic, the trial's end and its final record).
FIXED_PHASES = (
    "start",
    "record_open",
    "imports",
    "data_load",
    "model_build",
    "compile",
    "validation",
    "geometry",
    "checkpoint",
    "report",
    "record",
    "other",
)


def fixed_phase_metric(phase: str) -> str:
    """The metric name of one of FIXED_PHASES."""
    return f"fixed_{phase}_s"


# Logged after every epoch whatever train.eval_every says: its steps are the epochs a trial's record holds.
EVERY_EPOCH_METRIC = "train_loss"
# Metrics that count (samples, an epoch number): MLflow stores every metric as a float; `load_runs` gives these back
# as integers.
COUNT_METRICS = (VALIDATION_SAMPLES, "best_epoch")
# Everything one (evaluated) epoch's result holds (`trainables.loop.fit`); tests/studies/test_adversarial.py checks a real trial's.
EPOCH_METRICS = (
    "train_loss",
    "train_acc",
    "images_per_sec",
    EPOCH_TIME,
    *VALIDATION_METRICS,
    VALIDATION_SAMPLES,
    "lr",
    "weight_norm",
    "best_val_acc",
    "best_epoch",
    *SAM_METRICS,
    *STEP_METRICS,
)
