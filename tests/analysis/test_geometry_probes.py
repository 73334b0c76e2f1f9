"""Geometry inside a trial: the geometry section's checks, the probe of each registered measure, fit's measurements
at the epochs asked (equal to analysis.geometry on the saved checkpoint), the Ray wrapper's probe import, the
edge-of-stability line and its plot."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from analysis.geometry import MEASURES, hessian_trace, make_probe, probe_plan, stability_threshold, top_eigenvalues
from analysis.geometry.probes import METRIC_PREFIX
from analysis.plots import plot_sharpness
from studies.spec import StudyError, load_study
from trainables import ConfigError, TrialConfig, create_model, fit, fixed_batches, load_model
from trainables.loop import GEOMETRY_TIME_METRIC
from trainables.ray_train import load_probe


class _Recorder:
    wants_checkpoint = False

    def __init__(self):
        self.epochs: dict[int, dict[str, float]] = {}

    def log_epoch(self, metrics, epoch, timestamp_ms):
        self.epochs[epoch] = dict(metrics)

    def log_artifact(self, path, artifact_path=None):
        pass


@pytest.fixture
def config(tiny_model):
    def make(epochs=3, **geometry):
        return {
            "model": tiny_model("mixer"),
            "data": {"name": "digits", "img_size": 16, "batch_size": 128},
            "optimizer": {"method": "none", "base": "sgd", "lr": 0.05},
            "schedule": {"epochs": epochs, "warmup_epochs": 0},
            "train": {"device": "cpu", "seed": 1, "threads": 1},
            "geometry": {"batches": 2, "batch_size": 16, "max_iter": 8, "trace_samples": 4, **geometry},
        }

    return make


def test_bad_geometry_sections_name_field_rule_value_and_fix(config, tmp_path):
    cfg = config(measures=["lambda_max", "lambda_max"], every=-1, batches=0, colour="red")
    with pytest.raises(ConfigError) as err:
        TrialConfig.load(cfg)
    text = str(err.value)
    assert len(err.value.problems) == 4, text  # every problem at once
    assert "geometry.every: Input should be greater than or equal to 0, got -1." in text
    assert "geometry.batches: Input should be greater than or equal to 1, got 0." in text
    assert "geometry.colour: unknown key. Fix:" in text
    assert "geometry.measures: each measure is listed once, got ['lambda_max'] more than once. Fix:" in text

    # Names and hvp_mode are the registry's: a study checks them at load, with the other problems of its file.
    import yaml

    # Two cells share the base's geometry section: each problem is said once, naming the cells it is in.
    study = {
        "name": "g",
        "base": config(measures=["lambda_mx", "hessian_trace"], hvp_mode="exact"),
        "factors": {"optimizer.lr": [0.01, 0.02]},
    }
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(study))
    with pytest.raises(StudyError) as err:
        load_study(path)
    problems = err.value.problems
    assert len(problems) == 2, problems
    assert problems[0].startswith("geometry.measures") and problems[0].endswith(
        "(cells: optimizer.lr=0.01; optimizer.lr=0.02)"
    )
    assert "geometry.measures: must name measures of analysis.geometry.probes.MEASURES" in problems[0]
    assert "got 'lambda_mx'. Fix: Did you mean 'lambda_max'?" in problems[0]
    assert "geometry.hvp_mode: must be one of auto, double_backward" in problems[1] and "got 'exact'" in problems[1]
    with pytest.raises(ConfigError, match="lambda_mx"):
        make_probe(study["base"] | {"geometry": {"measures": ["lambda_mx"]}})


def test_the_torch_free_names_are_the_registrys():
    # A study's validation checks measure names and product modes from analysis.geometry.names, without torch;
    # the registry and the solvers' Literal are the things named.
    from analysis.geometry import names, spectrum

    assert tuple(MEASURES) == names.MEASURE_NAMES
    assert spectrum.HvpMode is names.HvpMode  # the solvers take the modes named there, and no other
    assert {"finite_difference", "finite_difference_central"} <= set(names.HVP_MODES)


def test_off_by_default_and_due_epochs():
    g = TrialConfig().geometry
    assert not g.enabled and not any(g.due(e, 10) for e in range(10))
    g = g.model_copy(update={"measures": ["lambda_max"]})
    assert [e for e in range(10) if g.due(e, 10)] == [9]  # every: 0, at the end only
    g = g.model_copy(update={"every": 4})
    assert [e for e in range(10) if g.due(e, 10)] == [3, 7, 9]


@pytest.mark.parametrize("name", sorted(MEASURES))
def test_every_registered_measure_gives_prefixed_finite_metrics(name, config):
    cfg = TrialConfig.load(config(measures=[name]))
    torch.manual_seed(0)
    model = create_model(cfg.model, num_classes=10, in_chans=1, img_size=16)
    batches = fixed_batches(cfg.data, samples=32, batch_size=16, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    metrics = make_probe(cfg)(model, batches)
    assert metrics and all(k.startswith(METRIC_PREFIX + MEASURES[name].prefix) for k in metrics)
    assert all(math.isfinite(v) for v in metrics.values())
    # The probe leaves the model as it found it: training goes on from the same weights.
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_fit_measures_at_the_epochs_asked_and_agrees_with_the_checkpoint(config, tmp_path):
    cfg = config(epochs=3, measures=["lambda_max", "hessian_trace"], every=2)
    with_geometry, without = _Recorder(), _Recorder()
    final = fit(cfg, recorder=with_geometry, probe=make_probe(cfg), checkpoint_dir=tmp_path)
    fit({**cfg, "geometry": {}}, recorder=without)
    measured = {e for e, m in with_geometry.epochs.items() if "geometry/lambda_max" in m}
    assert measured == {1, 2}  # after every 2nd epoch, and after the last
    assert all((GEOMETRY_TIME_METRIC in m) == (e in measured) for e, m in with_geometry.epochs.items())
    # Measuring changes nothing in training (each epoch reseeds; the probe restores the model)...
    for epoch, m in without.epochs.items():
        assert with_geometry.epochs[epoch]["train_loss"] == m["train_loss"]
        assert with_geometry.epochs[epoch]["val_acc"] == m["val_acc"]
    # ...and its values are analysis.geometry's on the final checkpoint and the same fixed samples (known answer).
    model, loaded = load_model(tmp_path)
    g = loaded.geometry
    batches = fixed_batches(loaded.data, samples=g.batches * g.batch_size, batch_size=g.batch_size, seed=g.seed)

    def loss(m, b):
        return torch.nn.functional.cross_entropy(m(b[0]), b[1])

    eig = top_eigenvalues(model, loss, batches, max_iter=g.max_iter, tol=g.tol, seed=g.seed, mask_seed=g.seed)
    trace = hessian_trace(model, loss, batches, samples=g.trace_samples, seed=g.seed, mask_seed=g.seed)
    assert final["geometry/lambda_max"] == pytest.approx(eig.eigenvalues[0], rel=1e-5)
    assert final["geometry/hessian_trace"] == pytest.approx(trace.trace, rel=1e-5)
    assert with_geometry.epochs[2]["geometry/lambda_max"] == final["geometry/lambda_max"]


def test_fit_refuses_geometry_it_cannot_take_before_training(config):
    with pytest.raises(ValueError, match="fit got no probe"):
        fit(config(measures=["lambda_max"]))
    cfg = config(measures=["lambda_max"], batches=20, batch_size=128)
    reported = []
    with pytest.raises(ValueError, match=r"geometry.batches x geometry.batch_size: must not exceed .* got 20 x 128"):
        fit(cfg, probe=make_probe(cfg), reporter=lambda m, c: reported.append(m))
    assert reported == []  # refused before the first epoch


def test_finite_differences_on_a_kinked_model_are_refused_before_training(config, tiny_model):
    # The first product would find ReLU only after every epoch; the probe's check finds it before the first.
    cfg = {**config(measures=["lambda_max"], hvp_mode="finite_difference"), "model": tiny_model("resnet")}
    reported = []
    with pytest.raises(ValueError, match="cannot measure this model: its loss applies relu"):
        fit(cfg, probe=make_probe(cfg), reporter=lambda m, c: reported.append(m))
    assert reported == []
    # A smooth model passes the check, and the check leaves its training exactly as it was.
    smooth = config(epochs=1, measures=["lambda_max"], hvp_mode="finite_difference")
    with_check = fit(smooth, probe=make_probe(smooth))
    without = fit({**smooth, "geometry": {}})
    assert with_check["train_loss"] == without["train_loss"] and with_check["val_acc"] == without["val_acc"]


def test_perturbation_measures_on_a_kinked_model_are_not_refused(config, tiny_model):
    # average_flatness takes no Hessian-vector product: hvp_mode does not apply to it.
    cfg = {
        **config(epochs=1, measures=["average_flatness"], hvp_mode="finite_difference"),
        "model": tiny_model("resnet"),
    }
    assert math.isfinite(fit(cfg, probe=make_probe(cfg))["geometry/average_flatness"])


def test_a_failed_measurement_keeps_the_epoch(config):
    # A probe that raises (out of memory, say) must not cost the trained epoch: it is recorded without measures.
    from trainables.loop import GEOMETRY_FAILED_METRIC

    def broken(model, batches):
        raise RuntimeError("CUDA out of memory (simulated)")

    recorder = _Recorder()
    cfg = config(epochs=2, measures=["lambda_max"])
    with pytest.warns(RuntimeWarning, match="measurement failed .*simulated.* recorded without its measures"):
        final = fit(cfg, probe=broken, recorder=recorder)
    assert sorted(recorder.epochs) == [0, 1] and final["val_acc"] == recorder.epochs[1]["val_acc"]
    assert recorder.epochs[1][GEOMETRY_FAILED_METRIC] == 1.0 and GEOMETRY_FAILED_METRIC not in recorder.epochs[0]
    assert not any(k.startswith("geometry/") for k in recorder.epochs[1])


def test_ray_wrapper_builds_the_probe_planned_in_the_payload(config, fresh_python):
    cfg = TrialConfig.load(config(measures=["surrogate_gap"]))
    assert load_probe({}, TrialConfig.load(config())) is None  # no geometry: nothing imported, nothing asked
    assert probe_plan(config()) is None
    probe = load_probe({"probe": probe_plan(cfg)}, cfg)
    assert probe.measures == [MEASURES["surrogate_gap"]] and probe.geometry == cfg.geometry
    with pytest.raises(ValueError, match="holds no probe plan"):
        load_probe({}, cfg)
    # A plan of other settings (another trial's, or a string as the payload once held) is refused by name.
    other = probe_plan(config(measures=["lambda_max"]))
    with pytest.raises(ValueError, match=r"must be the probe plan of this trial's geometry section .*lambda_max"):
        load_probe({"probe": other}, cfg)
    with pytest.raises(ValueError, match="must be the probe plan"):
        load_probe({"probe": "analysis.geometry.probes:make_probe"}, cfg)
    # Its settings are checked when it is made, and making it imports no torch (the study runner makes it).
    with pytest.raises(ConfigError, match="geometry.measures: must name measures"):
        probe_plan({**config(), "geometry": {"measures": ["lambda_mx"]}})
    code = "from analysis.geometry.names import probe_plan\nprobe_plan({'geometry': {'measures': ['lambda_max']}})\n"
    fresh_python(code, not_imported=("torch",))


def test_stability_threshold():
    assert stability_threshold(0.1, "sgd") == pytest.approx(20.0)
    assert stability_threshold(0.1, "sgd", momentum=0.9) == pytest.approx(38.0)  # 2(1 + beta)/lr, heavy ball
    assert math.isnan(stability_threshold(1e-3, "adamw"))  # adaptive: the preconditioned sharpness, not measured
    assert math.isnan(stability_threshold(0.0, "sgd"))  # the end of a cosine schedule: no edge


def test_plot_sharpness_draws_each_trial_and_the_sgd_edge():
    rows = []
    for run, arch, base in (("a", "resnet", "sgd"), ("b", "vit", "adamw")):
        for step, lr in enumerate([0.1, 0.05, 0.01]):
            rows.append(
                {"run_id": run, "factor.arch": arch, "factor.method": "sam", "metric": "lr", "step": step, "value": lr}
            )
            rows.append(
                {
                    "run_id": run,
                    "factor.arch": arch,
                    "factor.method": "sam",
                    "metric": "geometry/lambda_max",
                    "step": step,
                    "value": 5.0 + step,
                }
            )
    runs = pd.DataFrame(
        {"run_id": ["a", "b"], "optimizer.base": ["sgd", "adamw"], "optimizer.momentum": ["0.9", "0.9"]}
    )
    fig = plot_sharpness(pd.DataFrame(rows), runs)
    resnet, vit = fig.axes[:2]
    assert len(resnet.lines) == 2 and len(vit.lines) == 1  # the trial and its edge; AdamW: no edge
    assert list(resnet.lines[1].get_ydata()) == pytest.approx([3.8 / lr for lr in (0.1, 0.05, 0.01)])  # 2(1 + 0.9)/lr
    assert "1 adaptive-base run" in fig._suptitle.get_text()
    with pytest.raises(ValueError, match="no 'geometry/lambda_max' values"):
        plot_sharpness(pd.DataFrame(rows).query("metric == 'lr'"))
