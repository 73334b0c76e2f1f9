"""optimizer.schedule: the default is today's step (no wrapper); a step the schedule does not give the method is the
base optimizer's step bit for bit; start_epoch, every, probability and the adaptive gate pick the steps they say,
identically after a resume; bad schedules fail with the field, the rule, the value and the fix."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch

import optim
from optim import Schedule, check_schedule
from tests.optim.conftest import build, make_batch, make_forward, make_model

PERTURBING = [name for name, spec in optim.METHODS.items() if spec.perturbs]


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def step(method, model, t, epoch=0):
    x, y, idx = make_batch(t)
    return method.train_step(make_forward(model, x, y), inputs=x, indices=idx, epoch=epoch)


def test_the_default_schedule_is_the_method_itself():
    model = make_model(0)
    for schedule in (None, {}, {"every": 1, "probability": 1.0, "start_epoch": 0}, Schedule()):
        method = build("sam", model, schedule=schedule)
        assert type(method).__name__ == "SAM"


@pytest.mark.parametrize("name", PERTURBING)
def test_steps_off_the_schedule_are_the_base_optimizers_step_bit_for_bit(name):
    """every=2: steps 0, 2 are the method's, 1, 3 the base optimizer's; the same run built by hand from the method
    and `none` on one base optimizer (whose state carries over) gives the same weights bit for bit."""
    model_s = make_model(1)
    scheduled = build(name, model_s, schedule={"every": 2})
    assert isinstance(scheduled, optim.Method) and isinstance(scheduled, optim.Scheduled)
    kinds = [step(scheduled, model_s, t).perturbed for t in range(4)]

    model_h = make_model(1)
    method = build(name, model_h)
    plain = optim.create("none", method.base_optimizer, model=model_h)
    for t in range(4):
        step(method if t % 2 == 0 else plain, model_h, t)
    for a, b in zip(params(model_s), params(model_h)):
        assert torch.equal(a, b)
    # LookSAM's second own step is a one-pass step; MSAM's first has no v, SAMPa's no gradient at y yet.
    if name not in ("looksam", "msam", "sampa"):
        assert kinds == [True, False, True, False]


def test_before_start_epoch_every_step_is_none_and_after_it_the_method():
    model_s, model_n, model_m = make_model(2), make_model(2), make_model(2)
    scheduled = build("gsam", model_s, schedule={"start_epoch": 1})
    none = build("none", model_n)
    for t in range(3):
        out = step(scheduled, model_s, t, epoch=0)
        step(none, model_n, t, epoch=0)
        assert not out.perturbed and out.perturbed_loss is None and out.passes == 1.0
    for a, b in zip(params(model_s), params(model_n)):
        assert torch.equal(a, b)
    # From epoch 1 on: GSAM on the base state `none` left (same optimizer class and settings).
    method = build("gsam", model_m)
    plain = build("none", model_m, base=method.base_optimizer)
    for t in range(3):
        step(plain, model_m, t)
    out = step(scheduled, model_s, 3, epoch=1)
    step(method, model_m, 3, epoch=1)
    assert out.perturbed and out.passes == 2.0
    for a, b in zip(params(model_s), params(model_m)):
        assert torch.equal(a, b)


def test_start_fraction_is_the_first_epoch_at_or_after_it():
    assert check_schedule({"start_fraction": 0.875}, epochs=200).start_epoch == 175
    assert check_schedule({"start_fraction": 0.5}, epochs=3).start_epoch == 2
    assert check_schedule({"start_fraction": 0.0}, epochs=3).start_epoch == 0
    kept = check_schedule({"start_fraction": 0.5})  # no run length yet: kept as given, resolved by create(epochs=)
    assert kept.start_fraction == 0.5 and kept.resolved(3).start_epoch == 2 and kept.share(4) == 0.5
    model = make_model(0)
    with pytest.raises(ValueError, match=r"schedule\.start_fraction=0\.5 needs the run's length"):
        build("sam", model, schedule={"start_fraction": 0.5})
    assert build("sam", model, schedule={"start_fraction": 0.5}, epochs=4).schedule.start_epoch == 2


def test_probability_draws_once_a_step_from_the_seeded_stream():
    torch.manual_seed(7)
    model = make_model(0)
    torch.manual_seed(7)
    method = build("sam", model, schedule={"probability": 0.5})
    expected = random.Random(7)
    got = [step(method, model, t).perturbed for t in range(12)]
    assert got == [expected.random() < 0.5 for _ in range(12)]
    assert 0 < sum(got) < 12


def test_a_resumed_run_takes_the_same_steps():
    def run(stop_at=None, state=None):
        torch.manual_seed(11)
        model = make_model(0)
        method = build("sam", model, schedule={"probability": 0.5, "every": 1})
        start = 0
        if state is not None:
            model.load_state_dict(state["model"])
            method.load_state_dict(state["method"])
            start = state["t"]
        kinds = []
        for t in range(start, 8):
            if t == stop_at:
                return {"model": model.state_dict(), "method": method.state_dict(), "t": t}
            kinds.append(step(method, model, t).perturbed)
        return kinds, params(model)

    whole, w_whole = run()
    saved = run(stop_at=4)
    torch.manual_seed(999)  # a resumed process's own seed does not matter: the stream is in the checkpoint
    rest, w_rest = run(state=saved)
    assert rest == whole[4:]
    for a, b in zip(w_whole, w_rest):
        assert torch.equal(a, b)


def test_the_adaptive_gate_is_ae_sams_rule_and_its_plain_steps_are_the_base_step():
    c, decay = 0.5, 0.8
    model = make_model(3)
    method = build("sam", model, schedule={"adaptive": {"c": c, "decay": decay}})
    mean = var = None
    kinds = []
    for t in range(8):
        # The rule, from the clean gradient at this step's w, computed on a copy.
        probe = make_model(3)
        probe.load_state_dict(model.state_dict())
        x, y, idx = make_batch(t)
        loss, _ = make_forward(probe, x, y)()
        loss.backward()
        sq = sum((p.grad.double() ** 2).sum() for p in probe.parameters()).item()
        if mean is None:
            mean, var = sq, 0.0
        else:
            mean = decay * mean + (1 - decay) * sq
            var = decay * var + (1 - decay) * (sq - mean) ** 2
        want = sq >= mean + c * math.sqrt(var)
        before = make_model(3)
        before.load_state_dict(model.state_dict())
        if not want:  # the base optimizer's step, on a copy of the base state
            base = torch.optim.SGD(before.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
            base.load_state_dict(copy.deepcopy(method.base_optimizer.state_dict()))  # its own buffers
            step(optim.create("none", base, model=before), before, t)
        out = step(method, model, t)
        assert out.perturbed == want, t
        kinds.append(want)
        if not want:
            for a, b in zip(params(model), params(before)):
                assert torch.equal(a, b)
        assert method._mean == pytest.approx(mean, rel=1e-5)
    assert True in kinds and False in kinds  # the case reaches both kinds of step


def test_the_adaptive_gate_takes_only_the_methods_that_compute_the_clean_gradient_first():
    adaptive = {"adaptive": {"c": 1.0, "decay": 0.9}}
    for name in ("sam", "asam", "gsam", "fsam"):
        optim.check_hparams(name, base="SGD", base_keeps_momentum=True, schedule=adaptive)
    for name in ("esam", "looksam", "msam"):
        with pytest.raises(ValueError, match=r"schedule\.adaptive must be unset for " + name):
            optim.check_hparams(name, base="SGD", base_keeps_momentum=True, schedule=adaptive)
    with pytest.raises(ValueError, match="with m=4"):
        optim.check_hparams("sam", base="SGD", base_keeps_momentum=True, schedule=adaptive, m=4)
    with pytest.raises(ValueError, match="with m=4"):
        build("sam", make_model(0), schedule=adaptive, hparams={"m": 4})


@pytest.mark.parametrize(
    "schedule, match",
    [
        ({"probability": 0.0}, r"schedule\.probability must satisfy 0 < probability <= 1, but got probability=0\.0"),
        ({"probability": 1.5}, r"schedule\.probability must satisfy 0 < probability <= 1"),
        ({"every": 0}, r"schedule\.every must satisfy every >= 1"),
        ({"start_epoch": -1}, r"schedule\.start_epoch must satisfy start_epoch >= 0"),
        ({"start_epoch": 1, "start_fraction": 0.5}, "not both"),
        ({"adaptive": {"c": 1.0}}, r"schedule\.adaptive .* the threshold needs the EMA"),
        ({"adaptive": {"c": 1.0, "decay": 1.0}}, r"schedule\.adaptive\.decay must satisfy 0 <= decay < 1"),
        ({"start": 3}, "takes keys among"),
        ({"start_epoch": 10}, r"start_epoch < the run's epochs \(10\).* never perturbs"),
    ],
)
def test_bad_schedules_fail_with_the_field_the_rule_and_the_fix(schedule, match):
    with pytest.raises(ValueError, match=match):
        check_schedule(schedule, epochs=10)


def test_a_method_that_does_not_perturb_takes_no_schedule():
    for name in ("none", "saf", "mesa"):
        with pytest.raises(ValueError, match="does not perturb"):
            optim.check_hparams(name, base="SGD", base_keeps_momentum=True, schedule={"every": 2})


def test_share_of_the_schedule():
    assert Schedule().share(10) == 1.0
    assert Schedule(start_epoch=175).share(200) == pytest.approx(0.125)
    assert Schedule(every=4, probability=0.5).share(10) == pytest.approx(0.125)
    assert Schedule(adaptive_c=0.0, adaptive_decay=0.9).share(10) == pytest.approx(0.5)


def test_fp16_overflow_on_a_scheduled_step_puts_the_stream_back():
    torch.manual_seed(5)
    model = make_model(0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    torch.manual_seed(5)
    method = build("sam", model, schedule={"probability": 0.5}, scaler=scaler)
    before = method._random.getstate()
    x, y, idx = make_batch(0)
    fwd = make_forward(model, x, y)

    def overflowing(rows=None, reduction="mean"):
        loss, logits = fwd(rows, reduction)
        return loss * float("inf"), logits

    out = method.train_step(overflowing, inputs=x, indices=idx)
    assert out.skipped and method._random.getstate() == before and method._count == 0


def test_each_kind_of_step_compiles_once():
    """A compiled model's graphs are the same for the method's steps and the plain ones: switching kind compiles
    nothing new (torch._dynamo's frame count stays where the first two steps left it)."""
    from torch._dynamo.utils import counters

    from trainables import compiled

    torch._dynamo.reset()
    model = make_model(4)
    net = compiled.CompiledModule(model, "default", backend="aot_eager")
    method = build("sam", net, base=torch.optim.SGD(model.parameters(), lr=0.05), schedule={"every": 2})
    step(method, net, 0)
    step(method, net, 1)
    frames = counters["stats"]["unique_graphs"]
    for t in range(2, 8):
        step(method, net, t)
    assert counters["stats"]["unique_graphs"] == frames


@pytest.mark.parametrize(
    "optimizer, match",
    [
        ({"method": "sam", "schedule": {"probability": 0}}, r"optimizer\.schedule: schedule\.probability must satisfy"),
        ({"method": "sam", "schedule": {"start_fraction": 0.95}}, r"start_epoch < the run's epochs \(10\)"),
        ({"method": "sam", "schedule": {"start_epoch": 10}}, r"optimizer\.schedule: .* never perturbs"),
        ({"method": "sam", "schedule": {"adaptive": {"c": 1}}}, r"optimizer\.schedule: .* needs the EMA"),
        ({"method": "esam", "schedule": {"adaptive": {"c": 1, "decay": 0.9}}}, "adaptive must be unset for esam"),
        ({"method": "saf", "schedule": {"every": 2}}, r"optimizer\.schedule: .* does not perturb"),
        ({"method": "none", "scope": "norm"}, r"optimizer\.scope: scope must be 'all' for none"),
        ({"method": "sam", "scope": "bn"}, r"optimizer\.scope: scope must satisfy one of \('all', 'norm'\)"),
        ({"method": "sam", "scope": {"include": []}}, r"optimizer\.scope: .* at least one include or exclude"),
    ],
)
def test_a_trial_config_refuses_a_bad_scope_or_schedule_at_load(optimizer, match):
    from trainables.config import ConfigError, TrialConfig

    with pytest.raises(ConfigError, match=match):
        TrialConfig.load({"optimizer": optimizer, "schedule": {"epochs": 10}})
    # 0.9 of 10 epochs starts at epoch 9: accepted.
    TrialConfig.load({"optimizer": {"method": "sam", "schedule": {"start_fraction": 0.9}}, "schedule": {"epochs": 10}})
