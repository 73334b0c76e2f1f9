"""Checkpoints continue the exact trajectory; LookSAM's evaluation count; SAF's ring buffer; MESA's teacher."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch

import optim
from optim import METHODS


def _snapshot(model):
    return [t.detach().clone() for t in list(model.parameters()) + list(model.buffers())]


def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("name", list(METHODS))
def test_checkpoint_resumes_bit_exact(name, helpers):
    def fresh():
        model = helpers.make_model()
        base = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
        sched = torch.optim.lr_scheduler.LambdaLR(base, lambda t: 1.0 / (1 + t))
        return model, helpers.build(name, model, base), sched

    def go(model, method, sched, start, steps):
        for t in range(start, start + steps):
            helpers.run(method, model, 1, start=t)
            sched.step()

    # Save after 3 steps: LookSAM (k=2) holds a g_v, SAF's buffer holds epochs 1-2, MESA's teacher has moved.
    model, method, sched = fresh()
    go(model, method, sched, 0, 3)
    ckpt = _roundtrip({"model": model.state_dict(), "method": method.state_dict(), "sched": sched.state_dict()})
    go(model, method, sched, 3, 4)
    expected = _snapshot(model)

    model2, method2, sched2 = fresh()
    model2.load_state_dict(ckpt["model"])
    method2.load_state_dict(ckpt["method"])
    sched2.load_state_dict(ckpt["sched"])
    go(model2, method2, sched2, 3, 4)
    for a, b in zip(expected, _snapshot(model2)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    state = method.state_dict()
    assert set(state) == {"base_optimizer", "method", "scaler"} and state["scaler"] is None  # no fp16 here
    if name == "gsam":
        assert state["method"]["rho_t"] == method.rho_t
    if name == "looksam":
        assert state["method"]["step"] == 7 and state["method"]["g_v"]
    if name == "saf":
        assert state["method"]["buffer"].dtype == torch.float16
    if name == "mesa":
        assert "teacher" in state["method"]


@pytest.mark.parametrize("n,k", [(7, 3), (10, 5), (4, 1), (5, 10)])
def test_looksam_evaluates_n_plus_ceil_n_over_k_times(n, k, helpers):
    model = helpers.make_model()
    method = helpers.build("looksam", model, hparams={"k": k})
    counter = []
    outs = helpers.run(method, model, n, counter=counter)
    assert len(counter) == n + math.ceil(n / k)
    assert [o.perturbed_loss is not None for o in outs] == [t % k == 0 for t in range(n)]


# ----------------------------------------------------------------------------- SAF
def test_saf_ring_buffer_reads_the_same_samples_logits_from_e_tilde_epochs_ago():
    n, c, e_tilde = 10, 4, 2
    saf = optim.SAF(n, c, lam=1.0, tau=1.0, e_tilde=e_tilde, e_start=2)
    assert saf.buffer_bytes == (e_tilde + 1) * n * c * 2
    history = {}
    g = torch.Generator().manual_seed(0)
    for epoch in range(6):
        perm = torch.randperm(n, generator=g)  # reshuffled every epoch
        for batch in perm.split(4):
            z = torch.randn(len(batch), c, generator=g)
            history[epoch, batch] = z
            loss = saf.loss(z, batch, epoch)
            if epoch <= 2:
                assert loss == 0
                continue
            past = torch.stack([history_of(history, epoch - e_tilde, int(i)) for i in batch]).half().float()
            torch.testing.assert_close(loss, optim.trajectory_kl(z, past, 1.0), rtol=1e-6, atol=1e-7)
        assert saf.buffer.shape == (e_tilde + 1, n, c) and saf.buffer.dtype == torch.float16


def history_of(history, epoch, index):
    for (e, batch), z in history.items():
        if e == epoch and index in batch.tolist():
            return z[batch.tolist().index(index)]
    raise KeyError(index)


def test_saf_indexes_the_full_training_set(helpers):
    # A fraction subset: indices are those of the full set (here up to 31), not positions in the batch.
    model = helpers.make_model()
    method = helpers.build("saf", model)
    x, y, _ = helpers.make_batch(0)
    idx = torch.tensor([31, 2, 17, 5, 30, 0, 9, 12])
    with torch.no_grad():
        z = copy.deepcopy(model)(x)  # the logits the step will see (train mode, weights before the step)
    method.train_step(helpers.make_forward(model, x, y), inputs=x, indices=idx, epoch=0)
    torch.testing.assert_close(method.regulariser.buffer[0, idx].float(), z.half().float())
    with pytest.raises(ValueError, match="saf needs indices="):
        method.train_step(helpers.make_forward(model, x, y), inputs=x, epoch=0)


def test_saf_refuses_e_start_before_e_tilde():
    with pytest.raises(ValueError, match=r"e_start must satisfy e_start >= e_tilde \(=3\), but got e_start=2"):
        optim.SAF(10, 3, e_tilde=3, e_start=2)


# ----------------------------------------------------------------------------- MESA
def test_mesa_teacher_is_an_ema_of_weights_and_buffers_from_step_0(helpers):
    model = helpers.make_model()
    beta = 0.9
    method = helpers.build("mesa", model, hparams={"beta": beta, "e_start": 100})
    teacher = method.regulariser.teacher
    assert teacher is not model and not teacher.training
    assert all(not p.requires_grad for p in teacher.parameters())
    v = {k: t.clone().double() for k, t in model.state_dict().items()}
    for t in range(3):  # inactive epochs: the teacher still follows
        helpers.run(method, model, 1, start=t)
        beta_t = min(beta, (1 + t) / (10 + t))  # docs/algorithms.md (MESA): the warmed-up decay
        for k, s in model.state_dict().items():
            if s.is_floating_point():
                v[k] = beta_t * v[k] + (1 - beta_t) * s.double()
            else:
                v[k] = s.clone()
        for k, tt in teacher.state_dict().items():
            torch.testing.assert_close(tt.to(v[k].dtype), v[k], rtol=1e-6, atol=1e-7)
    assert int(teacher.bn.num_batches_tracked) == 3
    assert method.regulariser.updates == 3 and method.state_dict()["method"]["updates"] == 3


def test_mesa_decay_warms_up_to_beta_and_resumes_with_its_count(helpers):
    mesa = helpers.build("mesa", helpers.make_model(), hparams={"beta": 0.9998}).regulariser
    assert [mesa.decay(t) for t in (0, 1, 90)] == [0.1, 2 / 11, 0.91]
    # beta is reached exactly at warmup_steps and not one update earlier
    assert mesa.warmup_steps == 44_990
    assert mesa.decay(mesa.warmup_steps) == 0.9998 and mesa.decay(mesa.warmup_steps - 1) < 0.9998
    assert mesa.decay(10**7) == 0.9998
    mesa.updates = 1234
    state = mesa.state_dict()
    fresh = helpers.build("mesa", helpers.make_model(), hparams={"beta": 0.9998}).regulariser
    fresh.load_state_dict(state)
    assert fresh.updates == 1234
    # a checkpoint from before the warm-up (no count) goes on at beta, as it ran
    fresh.load_state_dict({"teacher": state["teacher"]})
    assert fresh.decay(fresh.updates) == 0.9998


def test_mesa_says_when_a_run_is_too_short(helpers):
    method = helpers.build("mesa", helpers.make_model(), hparams={"beta": 0.9998, "e_start": 5})
    # 30 epochs x 44 steps: the paper's beta is never reached
    (note,) = method.run_warnings(epochs=30, steps_per_epoch=44)
    assert "44,990" in note and "1,320" in note and f"{1 / (1 - min(0.9998, 1321 / 1330)):.0f} steps" in note
    assert method.run_warnings(epochs=300, steps_per_epoch=1000) == []
    never = method.run_warnings(epochs=6, steps_per_epoch=10**5)
    assert len(never) == 1 and "never on" in never[0] and "e_start=5" in never[0]


def test_mesa_unwraps_and_needs_inputs(helpers):
    model = helpers.make_model()
    method = helpers.build("mesa", model)
    x, y, idx = helpers.make_batch(0)
    with pytest.raises(ValueError, match="mesa needs inputs="):
        method.train_step(helpers.make_forward(model, x, y), indices=idx, epoch=5)
