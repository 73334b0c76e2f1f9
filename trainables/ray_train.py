"""The thin Ray layer: a Tune function trainable (and a Ray Train worker loop) around `trainables.fit`."""

from __future__ import annotations

import math
import traceback
from pathlib import Path
from typing import Any

from trainables.config import TrialConfig
from trainables.loop import TrialDiverged, describe_hardware, fit
from trainables.tracking import TrackingTarget, TrialRecorder

__all__ = ["run_tune_trial"]


def _hardware_tags() -> dict[str, str]:
    return {f"sharpscale.{k}": v for k, v in describe_hardware().items()}


def run_tune_trial(payload: dict[str, Any]) -> None:
    """Tune function trainable: one trial, resumed from Tune's checkpoint when there is one, recorded in MLflow.

    payload: {"trial": trial config dict, "tracking": TrackingTarget fields, "objective": {"metric", "mode"},
    "tags": extra run tags, "run_name": str}.
    """
    from ray import tune

    ctx = tune.get_context()
    trial_id = ctx.get_trial_id()
    cfg = TrialConfig.load(payload["trial"])
    target = TrackingTarget(**payload["tracking"])
    recorder = TrialRecorder(
        target,
        trial_key=trial_id,
        run_name=payload.get("run_name") or ctx.get_trial_name(),
        params=cfg.flat(),
    )
    recorder.set_tags({"sharpscale.trial_id": trial_id, **_hardware_tags(), **payload.get("tags", {})})
    metric = payload["objective"]["metric"]

    def report(metrics: dict[str, float], checkpoint_dir: Path | None) -> None:
        checkpoint = tune.Checkpoint.from_directory(str(checkpoint_dir)) if checkpoint_dir else None
        tune.report({**metrics, "diverged": 0, "mlflow_run_id": recorder.run_id}, checkpoint=checkpoint)

    resume = tune.get_checkpoint()
    try:
        if resume is not None:
            with resume.as_directory() as ckpt_dir:
                fit(cfg, resume_from=ckpt_dir, reporter=report, recorder=recorder)
        else:
            fit(cfg, reporter=report, recorder=recorder)
    except TrialDiverged as err:
        recorder.finish("diverged", str(err))
        # A final result so the searcher sees the failure; the objective is nan, never a number to optimise.
        tune.report({metric: math.nan, "diverged": 1, "epoch": err.epoch, "mlflow_run_id": recorder.run_id})
        return
    except BaseException as err:
        # Ray retries the trial from its checkpoint; the run reopens under the same trial key.
        recorder.finish("failed", "".join(traceback.format_exception(err))[-4000:])
        raise
    recorder.finish("finished")
