"""DDP, 2 processes, gloo, CPU: per-replica vs global perturbation, communication counts, GSAM's single all-reduce,
LookSAM and SAF consistency across ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import optim

WORLD = 2


def _model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(16, 5),
    )


def _batch(rank, step):
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(6, 3, 6, 6, generator=g), torch.randint(0, 5, (6,), generator=g)


def _flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def _run_method(rank, name, global_perturbation, steps=1, local=False, **hp):
    """Returns per-step (eps, final grads, hook calls in pass 1, hook calls total), params, manual all-reduces."""
    model = _model()
    net = model if local else nn.parallel.DistributedDataParallel(model)
    hook_calls = [0]
    in_hook = [False]
    if not local:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def counting_hook(state, bucket):
            hook_calls[0] += 1
            in_hook[0] = True
            try:
                return default_hooks.allreduce_hook(state, bucket)
            finally:
                in_hook[0] = False

        net.register_comm_hook(None, counting_hook)
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    finals = []
    base.register_step_pre_hook(lambda o, a, k: finals.append(_flat([p.grad for p in model.parameters()]).clone()))
    method = optim.create(name, base, model=net, global_perturbation=global_perturbation, **hp)
    real_all_reduce = dist.all_reduce
    manual = [0]

    numel = sum(p.numel() for p in model.parameters())

    def counting_all_reduce(tensor, *a, **k):
        # Gradient-sized all-reduces outside DDP's hook (DDP itself also all-reduces small flags).
        manual[0] += int(tensor.numel() == numel and not in_hook[0])
        return real_all_reduce(tensor, *a, **k)

    dist.all_reduce = counting_all_reduce
    records = []
    try:
        for step in range(steps):
            x, y = _batch(rank, step)
            snaps, calls = [], []

            def forward(rows=None, reduction="mean", x=x, y=y, snaps=snaps, calls=calls):
                snaps.append(_flat([p.detach() for p in model.parameters()]).clone())
                calls.append(hook_calls[0])
                xs, ys = (x, y) if rows is None else (x[rows], y[rows])
                logits = net(xs)
                return F.cross_entropy(logits, ys, reduction=reduction), logits

            start = hook_calls[0]
            method.train_step(forward, inputs=x, epoch=0)
            eps = snaps[1] - snaps[0] if len(snaps) == 2 else None
            records.append(
                {
                    "eps": eps,
                    "final": finals[-1],
                    "pass1_calls": (calls[1] - start) if len(calls) == 2 else None,
                    "calls": hook_calls[0] - start,
                }
            )
    finally:
        dist.all_reduce = real_all_reduce
    return {"steps": records, "params": _flat([p.detach() for p in model.parameters()]), "manual": manual[0]}


def _saf_reshuffled(rank):
    """Every rank reads the logits recorded for that very sample, whichever rank saw it."""
    n, c = 12, 3
    saf = optim.SAF(n, c, lam=1.0, tau=1.0, e_tilde=1, e_start=1)

    def logits_of(idx, epoch):  # a known function of (sample, epoch)
        return torch.stack([torch.arange(c, dtype=torch.float32) * (i + 1) + epoch for i in idx.tolist()])

    errors = []
    for epoch in range(4):
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(epoch))  # same on every rank
        for batch in perm[rank::WORLD].split(3):  # this rank's shard, reshuffled every epoch
            z = logits_of(batch, epoch)
            loss = saf.loss(z, batch, epoch)
            if epoch >= 2:
                want = optim.trajectory_kl(z, logits_of(batch, epoch - 1).half().float(), 1.0)
                errors.append(float((loss - want).abs()))
                errors.append(
                    float(
                        (saf.buffer[(epoch - 1) % 2, batch].float() - logits_of(batch, epoch - 1).half().float())
                        .abs()
                        .max()
                    )
                )
    # After epoch 3 every sample's slot holds epoch 3's logits, including those other ranks saw.
    full = saf.buffer[3 % 2].float()
    errors.append(float((full - logits_of(torch.arange(n), 3).half().float()).abs().max()))
    return errors


def _m_sharpness(rank, m_ddp, m_single, steps=2):
    """SAM under DDP (each replica's batch of 6, per-replica perturbation, m = m_ddp) and, on one process, SAM on
    both replicas' batches together (12 samples, rank 0's first) with m = m_single: the final parameters."""

    def forward_of(net, x, y):
        def forward(rows=None, reduction="mean"):
            xs, ys = (x, y) if rows is None else (x[rows], y[rows])
            z = net(xs)
            return F.cross_entropy(z, ys, reduction=reduction), z

        return forward

    out = {}
    for label, m, world in (("ddp", m_ddp, True), ("single", m_single, False)):
        model = _model()
        net = nn.parallel.DistributedDataParallel(model) if world else model
        method = optim.create(
            "sam", torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model=net, rho=0.05, m=m
        )
        for step in range(steps):
            if world:
                x, y = _batch(rank, step)
            else:
                x, y = (torch.cat(t) for t in zip(*(_batch(r, step) for r in range(WORLD))))
            method.train_step(forward_of(net, x, y), inputs=x)
        out[label] = _flat([p.detach() for p in model.parameters()]).clone()
    return out


def _sampa_two_ranks(rank, steps=3):
    """SAMPa's two-rank form (rank 0 takes grad f(x~), rank 1 grad f(y')) fed the same batch on both ranks, as the
    official code is, and SAMPa on one process on that batch: the final parameters of each."""
    out = {}
    for label, parallel in (("two_ranks", True), ("single", False)):
        model = _model()
        net = nn.parallel.DistributedDataParallel(model) if parallel else model
        base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        method = optim.create("sampa", base, model=net, rho=0.05, lmbda=0.3, parallel=parallel)
        for step in range(steps):
            x, y = _batch(0, step)

            def forward(rows=None, reduction="mean", x=x, y=y, net=net):
                logits = net(x)
                return F.cross_entropy(logits, y, reduction=reduction), logits

            method.train_step(forward, inputs=x)
        out[label] = _flat([p.detach() for p in model.parameters()]).clone()
    lone = _model()
    method = optim.create("sampa", torch.optim.SGD(lone.parameters(), lr=0.1), model=lone, parallel=True)
    before = _flat([p.detach() for p in lone.parameters()]).clone()
    x, y = _batch(0, 0)
    try:
        method.train_step(lambda rows=None, reduction="mean": (F.cross_entropy(lone(x), y), lone(x)), inputs=x)
    except ValueError as e:
        assert torch.equal(_flat([p.detach() for p in lone.parameters()]), before)  # refused before any pass
        out["one_rank_error"] = str(e)
    return out


def _bsam_replicas(rank, steps=3):
    """bSAM under DDP on each rank's own batch: the final parameters, its precision s, and each step's ascent point
    (pass 2's weights) less its draw (pass 1's)."""
    model = _model()
    net = nn.parallel.DistributedDataParallel(model)
    method = optim.create("bsam", torch.optim.SGD(model.parameters(), lr=0.1), model=net, num_samples=60, rho=0.05)
    ascents = []
    for step in range(steps):
        x, y = _batch(rank, step)
        snaps = []

        def forward(rows=None, reduction="mean", x=x, y=y, snaps=snaps):
            snaps.append(_flat([p.detach() for p in model.parameters()]).clone())
            logits = net(x)
            return F.cross_entropy(logits, y, reduction=reduction), logits

        method.train_step(forward, inputs=x)
        ascents.append((snaps[0], snaps[1]))
    s = _flat([method._s[p] for p in model.parameters()])
    return {"params": _flat([p.detach() for p in model.parameters()]), "s": s, "points": ascents}


def _worker(rank, out):
    torch.set_num_threads(1)
    # A file rendezvous: a free TCP port picked in advance can be taken by another process before rank 0 binds it.
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=WORLD)
    try:
        res = {
            "sam": _run_method(rank, "sam", False, steps=2, rho=0.05),
            "sam_global": _run_method(rank, "sam", True, steps=2, rho=0.05),
            "gsam": _run_method(rank, "gsam", False, steps=2, alpha=0.3, rho_max=0.05, rho_min=0.05),
            "gsam_local": _run_method(rank, "gsam", False, steps=1, local=True, alpha=0.3, rho_max=0.05, rho_min=0.05),
            "gsam_global": _run_method(rank, "gsam", True, steps=2, alpha=0.3, rho_max=0.05, rho_min=0.05),
            "looksam": _run_method(rank, "looksam", False, steps=5, k=2),
            "mesa": _run_method(rank, "mesa", False, steps=2, e_start=0, beta=0.9),
            "saf_errors": _saf_reshuffled(rank),
            "sam_accumulate": _run_method(rank, "sam", False, steps=2, rho=0.05, accumulate=3),
            "esam": _run_method(rank, "esam", False, steps=3, beta=0.5, gamma=0.5),
            "esam_global": _run_method(rank, "esam", True, steps=3, beta=0.5, gamma=0.5),
            "fsam": _run_method(rank, "fsam", False, steps=3),
            "msam": _run_method(rank, "msam", False, steps=3),
            "m_replica": _m_sharpness(rank, None, 6),  # per-replica perturbation: m = the replica's 6 samples
            "m_replica_set": _m_sharpness(rank, 6, 6),
            "m_split": _m_sharpness(rank, 3, 3),  # groups of 3 inside each replica
            "sam_scope": _run_method(rank, "sam", False, steps=2, rho=0.05, scope="norm"),
            "sam_adaptive": _run_method(
                rank, "sam", False, steps=5, rho=0.05, schedule={"adaptive": {"c": 0.0, "decay": 0.5}}
            ),
            "gsam_every": _run_method(rank, "gsam", False, steps=4, schedule={"every": 2}),
            "sampa": _run_method(rank, "sampa", False, steps=3, rho=0.05, lmbda=0.3),
            "vasso": _run_method(rank, "vasso", False, steps=3, rho=0.05, theta=0.4),
            "rwp": _run_method(rank, "rwp", False, steps=3, sigma=0.05, lmbda=0.5, eta=0.1, beta=0.9),
            "rwp_m": _run_method(rank, "rwp", False, steps=3, sigma=0.05, lmbda=0.5, eta=0.1, beta=0.9, m=2),
            "gam": _run_method(rank, "gam", False, steps=3, rho=0.2, rho_prime=0.05, alpha=0.3, beta=0.4, gamma=0.5),
            "lookbehind": _run_method(rank, "lookbehind", False, steps=2, rho=0.05, k=2, alpha=0.5),
            "lookbehind_global": _run_method(rank, "lookbehind", True, steps=2, rho=0.05, k=2, alpha=0.5),
            "sampa_two_ranks": _sampa_two_ranks(rank),
            "bsam": _bsam_replicas(rank),
        }
        torch.save(res, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(str(out),), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_sam_per_replica_perturbation(ranks):
    r0, r1 = ranks[0]["sam"], ranks[1]["sam"]
    for s0, s1 in zip(r0["steps"], r1["steps"]):
        assert not torch.allclose(s0["eps"], s1["eps"])  # each replica perturbs with its own gradient
        _close(s0["final"], s1["final"])  # the update gradient is all-reduced
        assert s0["pass1_calls"] == 0 and s1["pass1_calls"] == 0  # pass 1 under no_sync: no all-reduce
        assert s0["calls"] >= 1  # pass 2's ordinary DDP all-reduce (same as a plain step)
    _close(r0["params"], r1["params"])
    assert r0["manual"] == 0


def test_sam_global_perturbation(ranks):
    r0, r1 = ranks[0]["sam_global"], ranks[1]["sam_global"]
    for s0, s1 in zip(r0["steps"], r1["steps"]):
        _close(s0["eps"], s1["eps"])
        assert s0["pass1_calls"] >= 1
        _close(s0["final"], s1["final"])
    assert not torch.allclose(ranks[0]["sam"]["steps"][0]["eps"], r0["steps"][0]["eps"])


def test_gsam_combines_locally_then_one_all_reduce(ranks):
    r0, r1 = ranks[0]["gsam"], ranks[1]["gsam"]
    for s0, s1 in zip(r0["steps"], r1["steps"]):
        assert s0["calls"] == 0 and s1["calls"] == 0  # neither pass syncs through DDP
        assert not torch.allclose(s0["eps"], s1["eps"])
        _close(s0["final"], s1["final"])
    assert r0["manual"] == 2  # exactly one all-reduce (one bucket) per step, two steps
    # The all-reduced gradient is the mean of each replica's locally formed g_gsam.
    local = [ranks[r]["gsam_local"]["steps"][0]["final"] for r in range(WORLD)]
    _close(r0["steps"][0]["final"], sum(local) / WORLD)
    g0, g1 = ranks[0]["gsam_global"], ranks[1]["gsam_global"]
    for s0, s1 in zip(g0["steps"], g1["steps"]):
        _close(s0["eps"], s1["eps"])
        _close(s0["final"], s1["final"])
    assert g0["manual"] == 0


def test_looksam_replicas_stay_identical(ranks):
    _close(ranks[0]["looksam"]["params"], ranks[1]["looksam"]["params"])
    for s0, s1 in zip(ranks[0]["looksam"]["steps"], ranks[1]["looksam"]["steps"]):
        _close(s0["final"], s1["final"])


def test_mesa_under_ddp(ranks):
    _close(ranks[0]["mesa"]["params"], ranks[1]["mesa"]["params"])


def test_saf_reads_each_samples_own_logits_across_ranks(ranks):
    for r in range(WORLD):
        errors = ranks[r]["saf_errors"]
        assert len(errors) > 4 and max(errors) < 1e-6, errors


@pytest.mark.parametrize("case", ["m_replica", "m_replica_set", "m_split"])
def test_ddp_m_sharpness_equals_the_single_process_m_split(ranks, case):
    # docs/algorithms.md, "m-sharpness": the algorithm a study measures does not change with the GPU count.
    r0, r1 = ranks[0][case], ranks[1][case]
    _close(r0["ddp"], r1["ddp"])
    _close(r0["ddp"], r0["single"])
    assert not torch.allclose(ranks[0]["m_split"]["single"], ranks[0]["m_replica"]["single"])  # m matters


@pytest.mark.parametrize(
    "case",
    [
        "sam_accumulate",
        "esam",
        "esam_global",
        "fsam",
        "msam",
        "sam_scope",
        "sam_adaptive",
        "gsam_every",
        "sampa",
        "vasso",
        "rwp",
        "rwp_m",
        "gam",
        "lookbehind",
        "lookbehind_global",
    ],
)
def test_new_settings_keep_replicas_identical(ranks, case):
    _close(ranks[0][case]["params"], ranks[1][case]["params"])
    for s0, s1 in zip(ranks[0][case]["steps"], ranks[1][case]["steps"]):
        _close(s0["final"], s1["final"])


def test_micro_batches_sync_once_per_synced_pass(ranks):
    # Pass 1 per-replica (no all-reduce at all), pass 2 synced on its last micro-batch only: the same DDP
    # communication as the whole-batch SAM step.
    for acc, plain in zip(ranks[0]["sam_accumulate"]["steps"], ranks[0]["sam"]["steps"]):
        assert acc["calls"] == plain["calls"] >= 1
    assert ranks[0]["sam_accumulate"]["manual"] == 0


def test_a_scope_perturbs_only_its_parameters_on_each_replica(ranks):
    # The model's BatchNorm weight and bias sit after the conv's 4*3*3*3 + 4 entries; eps is zero everywhere else,
    # and per replica (each from its own gradient).
    start = 4 * 3 * 3 * 3 + 4
    for r in range(WORLD):
        for step in ranks[r]["sam_scope"]["steps"]:
            eps = step["eps"]
            assert eps[start : start + 8].abs().min() > 0
            assert torch.count_nonzero(eps[:start]) == 0 and torch.count_nonzero(eps[start + 8 :]) == 0
    assert not torch.equal(ranks[0]["sam_scope"]["steps"][0]["eps"], ranks[1]["sam_scope"]["steps"][0]["eps"])


def test_scheduled_replicas_take_the_same_kind_of_step(ranks):
    # The adaptive gate decides on the replicas' mean ||g||^2, so every replica perturbs (two forwards) or not alike.
    for case in ("sam_adaptive", "gsam_every"):
        kinds = [[s["eps"] is not None for s in ranks[r][case]["steps"]] for r in range(WORLD)]
        assert kinds[0] == kinds[1] and True in kinds[0] and False in kinds[0], (case, kinds)


def test_sampa_syncs_both_passes(ranks):
    """SAMPa on one replica computing both gradients: DDP averages each pass (so d, and with it the perturbation and
    the optimistic point, is the same on every replica), and nothing is all-reduced by hand."""
    for r in ranks:
        assert r["sampa"]["manual"] == 0
        steps = r["sampa"]["steps"]
        assert steps[0]["calls"] == 2 * steps[0]["pass1_calls"] > 0
        assert all(s["calls"] == steps[0]["calls"] for s in steps)
    for s0, s1 in zip(ranks[0]["sampa"]["steps"][1:], ranks[1]["sampa"]["steps"][1:]):
        _close(s0["eps"], s1["eps"])


def test_sampa_two_ranks_is_the_one_device_step(ranks):
    """Each rank computes one of the step's two gradients and one all-reduce hands both to both: on the same batch
    the trajectory is one process's SAMPa, and both ranks hold the same weights."""
    for r in ranks:
        _close(r["sampa_two_ranks"]["two_ranks"], r["sampa_two_ranks"]["single"])
        assert "exactly 2 ranks, but got 1" in r["sampa_two_ranks"]["one_rank_error"]
    assert torch.equal(ranks[0]["sampa_two_ranks"]["two_ranks"], ranks[1]["sampa_two_ranks"]["two_ranks"])


def test_bsam_keeps_replicas_identical_with_per_replica_ascents(ranks):
    # docs/algorithms.md, "bSAM": one draw on every replica, each replica's ascent along its own g, |g| averaged over
    # the replicas before s reads it and pass 2 synced: w and s stay one across replicas.
    r0, r1 = ranks[0]["bsam"], ranks[1]["bsam"]
    _close(r0["params"], r1["params"])
    _close(r0["s"], r1["s"])
    for (d0, a0), (d1, a1) in zip(r0["points"], r1["points"]):
        _close(d0, d1)  # the same draw
        assert not torch.allclose(a0, a1)  # each replica's own ascent
