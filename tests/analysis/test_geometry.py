"""Known-answer tests of analysis.geometry: quadratics with chosen spectra, exact Hessians, hand-built models."""

import copy
import math

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import Mlp
from timm.models.mlp_mixer import MlpMixer
from torch import nn

from analysis import geometry
from analysis.geometry._hvp import FlatOperator, HessianCore, LossOracle, ieee_fp32, lanczos, slq

# The algebraic top is 9 while the eigenvalue of largest magnitude is -10: plain power iteration finds -10.
SPECTRUM = [-10.0, 9.0, 6.0, 3.0, 0.5, 0.1, -1.0, -4.0]
BATCH = [torch.zeros(1)]  # the quadratic ignores its batch; one batch of one sample


class Quadratic(nn.Module):
    """L(w) = 0.5 w^T A w + c^T w, whose Hessian is A wherever w is."""

    def __init__(self, matrix: torch.Tensor, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        n = matrix.shape[0]
        self.register_buffer("matrix", matrix)
        self.register_buffer("linear", torch.randn(n, generator=generator, dtype=torch.float64))
        self.w = nn.Parameter(torch.randn(n, generator=generator, dtype=torch.float64))


def quadratic_loss(model: Quadratic, batch) -> torch.Tensor:
    return 0.5 * model.w @ model.matrix @ model.w + model.linear @ model.w


def matrix_with_spectrum(spectrum, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    n = len(spectrum)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
    return q @ torch.diag(torch.tensor(spectrum, dtype=torch.float64)) @ q.T, q


def eigenvector_of(q: torch.Tensor, value: float) -> torch.Tensor:
    return q[:, SPECTRUM.index(value)]


def cross_entropy(model: nn.Module, batch) -> torch.Tensor:
    inputs, labels = batch
    return F.cross_entropy(model(inputs), labels)


def tiny_vit() -> nn.Module:
    return timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=16,
        patch_size=4,
        embed_dim=16,
        depth=2,
        num_heads=2,
        num_classes=3,
    )


def tiny_mixer() -> nn.Module:
    torch.manual_seed(0)
    model = MlpMixer(num_classes=3, img_size=16, patch_size=4, num_blocks=2, embed_dim=16)
    nn.init.normal_(model.head.weight)  # timm zero-initialises the head, which zeroes every other Hessian block
    return model


def tiny_resnet() -> nn.Module:
    return timm.create_model(
        "resnet18", pretrained=False, layers=(1, 1, 1, 1), channels=(4, 8, 8, 8), stem_width=4, num_classes=3
    )


def image_batches(seed: int = 0, sizes=(4, 3)):
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, 3, 16, 16, generator=generator), torch.randint(0, 3, (n,), generator=generator)) for n in sizes
    ]


# ------------------------------------------------------------------------------------ quadratic spectra


@pytest.mark.parametrize("hvp_mode", ["double_backward", "forward_over_reverse"])
@pytest.mark.parametrize("method", ["power", "lanczos"])
def test_top_eigenvalue_is_the_algebraic_largest(method, hvp_mode):
    matrix, q = matrix_with_spectrum(SPECTRUM)
    model = Quadratic(matrix)
    result = geometry.top_eigenvalues(
        model, quadratic_loss, BATCH, method=method, hvp_mode=hvp_mode, tol=1e-10, max_iter=2000
    )
    assert result.eigenvalues[0] == pytest.approx(9.0, abs=1e-6)
    assert abs(float(result.eigenvectors[0] @ eigenvector_of(q, 9.0))) > 1 - 1e-6
    assert result.converged and result.hvp_mode == hvp_mode and result.method == method
    if method == "power":
        assert result.shift == pytest.approx(10.0, rel=1e-6)  # it had to shift past -10
    metrics = result.to_metrics("hessian/")
    assert metrics["hessian/lambda_max"] == result.eigenvalues[0]
    assert metrics["hessian/lambda_max_converged"] == 1.0
    assert all(isinstance(v, float) for v in metrics.values())
    assert result.to_arrays()["history"].shape == (result.iterations,)


@pytest.mark.parametrize("method", ["power", "lanczos"])
def test_top_three_and_smallest_eigenpairs(method):
    matrix, q = matrix_with_spectrum(SPECTRUM)
    model = Quadratic(matrix)
    top = geometry.top_eigenvalues(model, quadratic_loss, BATCH, k=3, method=method, tol=1e-10, max_iter=2000)
    np.testing.assert_allclose(top.eigenvalues, [9.0, 6.0, 3.0], atol=1e-6)
    for value, vector in zip([9.0, 6.0, 3.0], top.eigenvectors):
        assert abs(float(vector @ eigenvector_of(q, value))) > 1 - 1e-6
    low = geometry.smallest_eigenvalue(model, quadratic_loss, BATCH, k=2, method=method, tol=1e-10, max_iter=2000)
    np.testing.assert_allclose(low.eigenvalues, [-10.0, -4.0], atol=1e-6)
    assert abs(float(low.eigenvectors[0] @ eigenvector_of(q, -10.0))) > 1 - 1e-6
    assert low.which == "smallest" and "lambda_min" in low.to_metrics()


def test_lanczos_restarts_after_breakdown_and_finds_a_repeated_eigenvalue():
    # One Krylov sequence sees a repeated eigenvalue once; the restart finds its second copy.
    spectrum = [5.0, 5.0, 2.0, 1.0, -3.0, 0.5]
    matrix, _ = matrix_with_spectrum(spectrum)
    result = geometry.top_eigenvalues(Quadratic(matrix), quadratic_loss, BATCH, k=3, tol=1e-10, max_iter=50)
    np.testing.assert_allclose(result.eigenvalues, [5.0, 5.0, 2.0], atol=1e-8)
    assert result.converged


def test_power_iteration_reports_no_convergence_when_cut_short():
    matrix, _ = matrix_with_spectrum([1.0, 0.99, 0.98, 0.5])
    result = geometry.top_eigenvalues(Quadratic(matrix), quadratic_loss, BATCH, method="power", max_iter=3, tol=1e-12)
    assert not result.converged and result.iterations == 3


def test_hutchinson_trace_of_a_quadratic():
    matrix, _ = matrix_with_spectrum(SPECTRUM)
    result = geometry.hessian_trace(Quadratic(matrix), quadratic_loss, BATCH, samples=400, seed=3)
    assert result.std_error > 0
    assert abs(result.trace - float(matrix.trace())) < 4 * result.std_error
    assert result.samples == 400 and len(result.to_arrays()["estimates"]) == 400
    # With a diagonal Hessian every Rademacher probe gives the exact trace.
    diagonal = geometry.hessian_trace(
        Quadratic(torch.diag(torch.tensor(SPECTRUM, dtype=torch.float64))), quadratic_loss, BATCH, samples=5
    )
    assert diagonal.trace == pytest.approx(sum(SPECTRUM), abs=1e-12) and diagonal.std_error == pytest.approx(
        0, abs=1e-12
    )


def test_average_flatness_of_a_quadratic():
    matrix, _ = matrix_with_spectrum([4.0, 3.0, 2.0, 1.0, 0.5, -1.0])
    model = Quadratic(matrix)
    sigma = 0.3
    result = geometry.average_flatness(model, quadratic_loss, BATCH, sigma=sigma, draws=2000, seed=1)
    with torch.no_grad():
        loss = float(quadratic_loss(model, None))
    assert result.loss == pytest.approx(loss, abs=1e-12)
    expected = loss + sigma**2 / 2 * float(matrix.trace())
    assert abs(result.perturbed_loss - expected) < 4 * result.std_error
    assert result.to_metrics()["average_flatness_gap"] == pytest.approx(result.perturbed_loss - result.loss)


def test_surrogate_gap_of_a_quadratic():
    matrix, _ = matrix_with_spectrum(SPECTRUM)
    model = Quadratic(matrix)
    rho = 0.2
    result = geometry.surrogate_gap(model, quadratic_loss, BATCH, rho)
    grad = (matrix @ model.w + model.linear).detach()
    eps = rho * grad / grad.norm()
    gap = float(eps @ grad + 0.5 * eps @ matrix @ eps)
    assert result.gap == pytest.approx(gap, abs=1e-10)
    assert result.sigma_max_estimate == pytest.approx(2 * gap / rho**2, abs=1e-8)
    assert result.grad_norm == pytest.approx(float(grad.norm()), abs=1e-12)


def test_blockwise_eigenvalues_are_those_of_the_diagonal_blocks():
    class TwoBlocks(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Parameter(torch.ones(3, dtype=torch.float64))
            self.b = nn.Parameter(torch.ones(4, dtype=torch.float64))

    block_a, _ = matrix_with_spectrum([2.0, -7.0, 1.0], seed=1)
    block_b, _ = matrix_with_spectrum([5.0, 0.5, -1.0, 3.0], seed=2)
    coupling = torch.randn(3, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    full = torch.block_diag(block_a, block_b)
    full[:3, 3:], full[3:, :3] = coupling, coupling.T  # the full Hessian is coupled, its diagonal blocks are not

    def loss_fn(model, batch):
        w = torch.cat([model.a, model.b])
        return 0.5 * w @ full @ w

    model = TwoBlocks()
    for method in ("lanczos", "power"):
        result = geometry.blockwise_top_eigenvalues(
            model, loss_fn, BATCH, {"a": ["a"], "b": [model.b]}, method=method, tol=1e-10, max_iter=2000
        )
        assert result["a"].eigenvalues[0] == pytest.approx(2.0, abs=1e-6)
        assert result["b"].eigenvalues[0] == pytest.approx(5.0, abs=1e-6)
        assert result["a"].num_params == 3 and result["b"].num_params == 4
        assert result.to_metrics("blocks/")["blocks/b/lambda_max"] == result["b"].eigenvalues[0]
    whole = geometry.top_eigenvalues(model, loss_fn, BATCH, tol=1e-10)
    assert whole.eigenvalues[0] == pytest.approx(float(torch.linalg.eigvalsh(full)[-1]), abs=1e-6)
    assert whole.eigenvalues[0] > 5.2  # the coupling matters for the whole, not for the blocks


# ------------------------------------------------------------------- a tiny network, exact Hessian


def tiny_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 3)).double()


def mlp_batches():
    generator = torch.Generator().manual_seed(1)
    # Unequal batch sizes: the mean loss must weight each batch by its samples.
    return [
        (torch.randn(n, 3, generator=generator, dtype=torch.float64), torch.randint(0, 3, (n,), generator=generator))
        for n in (3, 5)
    ]


def exact_hessian(model: nn.Module, batches) -> torch.Tensor:
    inputs = torch.cat([b[0] for b in batches])
    labels = torch.cat([b[1] for b in batches])
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def loss_of(vector):
        parts = torch.split(vector, [math.prod(s) for s in shapes])
        params = {n: part.view(s) for n, part, s in zip(names, parts, shapes)}
        return F.cross_entropy(torch.func.functional_call(model, params, (inputs,)), labels)

    return torch.autograd.functional.hessian(loss_of, flat)


@pytest.mark.parametrize("hvp_mode", ["double_backward", "forward_over_reverse"])
def test_tiny_mlp_against_the_exact_hessian(hvp_mode):
    model, batches = tiny_mlp(), mlp_batches()
    hessian = exact_hessian(model, batches)
    exact = torch.linalg.eigvalsh(hessian)
    vector = torch.randn(hessian.shape[0], generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with geometry.hessian_operator(model, cross_entropy, batches, hvp_mode=hvp_mode) as operator:
        torch.testing.assert_close(operator(vector), hessian @ vector, atol=1e-12, rtol=1e-10)
        assert operator.num_samples == 8
    top = geometry.top_eigenvalues(model, cross_entropy, batches, k=3, hvp_mode=hvp_mode, tol=1e-10)
    np.testing.assert_allclose(top.eigenvalues, exact.flip(0)[:3].numpy(), atol=1e-8)
    power = geometry.top_eigenvalues(
        model, cross_entropy, batches, method="power", hvp_mode=hvp_mode, tol=1e-10, max_iter=3000
    )
    assert power.eigenvalues[0] == pytest.approx(float(exact[-1]), abs=1e-6)
    low = geometry.smallest_eigenvalue(model, cross_entropy, batches, hvp_mode=hvp_mode, tol=1e-10)
    assert low.eigenvalues[0] == pytest.approx(float(exact[0]), abs=1e-8)
    trace = geometry.hessian_trace(model, cross_entropy, batches, samples=300, hvp_mode=hvp_mode)
    assert abs(trace.trace - float(hessian.trace())) < 4 * trace.std_error


@pytest.mark.parametrize("train", [False, True])
def test_cheap_second_order_layers_give_the_stock_products(train):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, stride=2, padding=1),
        nn.BatchNorm2d(4),
        nn.Tanh(),
        nn.Conv2d(4, 6, 3, padding=2, dilation=2, groups=2, bias=False),
        nn.BatchNorm2d(6),
        nn.Tanh(),
        nn.Flatten(),
        nn.Linear(6 * 5 * 5, 3),
    ).double()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):  # running statistics unlike the batch's
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
                module.weight.uniform_(0.5, 2)
    batch = (torch.randn(5, 3, 9, 9, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1]))
    model.train(train)
    names, params = zip(*model.named_parameters())
    oracle = LossOracle(model, cross_entropy, [batch], train=train, seed=0)
    vector = torch.randn(
        sum(p.numel() for p in params), generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    products = {}
    for label, mode, cheap in [
        ("stock", "double_backward", False),
        ("cheap", "double_backward", True),
        ("forward", "forward_over_reverse", True),
    ]:
        core = HessianCore(oracle, names, params, hvp_mode=mode, cache_graphs=True, cheap_layers=cheap)
        products[label] = FlatOperator(core, range(len(params)))(vector)
    torch.testing.assert_close(products["cheap"], products["stock"], atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(products["forward"], products["stock"], atol=1e-12, rtol=1e-10)


def test_slq_density_against_the_dense_eigendecomposition():
    model, batches = tiny_mlp(), mlp_batches()
    hessian = exact_hessian(model, batches)
    exact = torch.linalg.eigvalsh(hessian).numpy()
    size = hessian.shape[0]
    # Full Lanczos (steps = size): every node with weight is an eigenvalue of H, and each probe's weights sum to 1.
    full = geometry.eigenvalue_density(model, cross_entropy, batches, probes=40, steps=size, seed=1)
    used = full.weights > 1e-10
    assert np.abs(full.nodes[used][:, None] - exact[None, :]).min(axis=1).max() < 1e-7
    np.testing.assert_allclose(full.weights.sum(axis=1), 1.0, atol=1e-10)
    # Moments: mean over probes of the quadratures estimates tr(H^k) / size (unbiased for Rademacher probes).
    for k in (1, 2):
        per_probe = np.sum(full.weights * full.nodes**k, axis=1)
        se = per_probe.std(ddof=1) / np.sqrt(len(per_probe))
        assert abs(full.moment(k) - np.sum(exact**k) / size) < 4 * se + 1e-9
    # A short run still finds the extremes (Lanczos converges there first) and gives a density of mass 1.
    short = geometry.eigenvalue_density(model, cross_entropy, batches, probes=3, steps=15, seed=2)
    assert short.to_metrics()["slq_lambda_max"] == pytest.approx(exact[-1], rel=1e-4)
    grid = np.linspace(exact[0] - 1, exact[-1] + 1, 4001)
    assert np.trapezoid(short.density(grid, sigma=0.05), grid) == pytest.approx(1.0, abs=1e-3)
    assert short.hvp_count <= 3 * 15


def exact_ggn(model: nn.Module, batches) -> torch.Tensor:
    """J^T H_z J of the mean cross-entropy over all samples, from the full Jacobian of the outputs."""
    inputs = torch.cat([b[0] for b in batches])
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def outputs_of(vector):
        parts = torch.split(vector, [math.prod(s) for s in shapes])
        return torch.func.functional_call(model, {n: p.view(s) for n, p, s in zip(names, parts, shapes)}, (inputs,))

    z = outputs_of(flat).detach()
    jac = torch.autograd.functional.jacobian(outputs_of, flat).reshape(-1, flat.numel())
    probs = torch.softmax(z, dim=-1)
    h_z = torch.block_diag(*[(torch.diag(p) - torch.outer(p, p)) / len(z) for p in probs])
    return jac.T @ h_z @ jac


def test_ggn_option_against_the_dense_gauss_newton_matrix():
    model, batches = tiny_mlp(), mlp_batches()
    ggn = exact_ggn(model, batches)
    for cache in (True, False):
        dense = _dense(model, batches, curvature="ggn", cache_graphs=cache)
        torch.testing.assert_close(dense, ggn, atol=1e-12, rtol=1e-10)
    exact = torch.linalg.eigvalsh(ggn)
    assert float(exact[0]) > -1e-12  # positive semi-definite, unlike the Hessian of this network
    assert float(torch.linalg.eigvalsh(exact_hessian(model, batches))[0]) < -1e-6
    top = geometry.top_eigenvalues(model, cross_entropy, batches, curvature="ggn", tol=1e-10)
    assert top.eigenvalues[0] == pytest.approx(float(exact[-1]), abs=1e-8) and top.curvature == "ggn"
    density = geometry.eigenvalue_density(model, cross_entropy, batches, probes=2, steps=ggn.shape[0], curvature="ggn")
    assert density.nodes[density.weights > 1e-10].min() > -1e-8
    with pytest.raises(ValueError, match="curvature must be one of"):
        geometry.hessian_trace(model, cross_entropy, batches, curvature="fisher")


# ------------------------------------------------------------------------------- finite differences


@pytest.mark.parametrize(("hvp_mode", "rtol"), [("finite_difference", 1e-6), ("finite_difference_central", 1e-9)])
def test_finite_difference_products_and_spectra_against_the_dense_hessian(hvp_mode, rtol):
    model, batches = tiny_mlp(), mlp_batches()
    hessian = exact_hessian(model, batches)
    exact = torch.linalg.eigvalsh(hessian)
    generator = torch.Generator().manual_seed(2)
    with geometry.hessian_operator(model, cross_entropy, batches, hvp_mode=hvp_mode) as operator:
        for scale in (1.0, 1e-3, 1e3):  # the step follows ||v||: the relative error does not depend on v's scale
            vector = scale * torch.randn(hessian.shape[0], generator=generator, dtype=torch.float64)
            want = hessian @ vector
            assert float((operator(vector) - want).norm() / want.norm()) < rtol
        assert operator.hvp_count == 3
    top = geometry.top_eigenvalues(model, cross_entropy, batches, k=2, hvp_mode=hvp_mode, tol=1e-8)
    np.testing.assert_allclose(top.eigenvalues, exact.flip(0)[:2].numpy(), rtol=10 * rtol)
    assert top.hvp_mode == hvp_mode
    low = geometry.smallest_eigenvalue(model, cross_entropy, batches, hvp_mode=hvp_mode, tol=1e-8)
    assert low.eigenvalues[0] == pytest.approx(float(exact[0]), rel=10 * rtol, abs=10 * rtol * float(exact.abs().max()))
    # Same probes as the exact mode: each Hutchinson sample and each SLQ moment agrees to the product's error.
    trace = geometry.hessian_trace(model, cross_entropy, batches, samples=50, hvp_mode=hvp_mode, seed=4)
    reference = geometry.hessian_trace(model, cross_entropy, batches, samples=50, hvp_mode="double_backward", seed=4)
    np.testing.assert_allclose(
        trace.estimates, reference.estimates, rtol=10 * rtol, atol=10 * rtol * float(hessian.trace())
    )
    assert abs(trace.trace - float(hessian.trace())) < 4 * trace.std_error
    size = hessian.shape[0]
    density = geometry.eigenvalue_density(
        model, cross_entropy, batches, probes=10, steps=size, seed=1, hvp_mode=hvp_mode
    )
    reference = geometry.eigenvalue_density(
        model, cross_entropy, batches, probes=10, steps=size, seed=1, hvp_mode="double_backward"
    )
    for k in (1, 2):
        assert density.moment(k) == pytest.approx(reference.moment(k), rel=100 * rtol)
        per_probe = np.sum(density.weights * density.nodes**k, axis=1)
        se = per_probe.std(ddof=1) / np.sqrt(len(per_probe))
        assert abs(density.moment(k) - float((exact**k).sum()) / size) < 4 * se + 1e-9
    assert density.to_metrics()["slq_lambda_max"] == pytest.approx(float(exact[-1]), rel=100 * rtol)


def test_finite_difference_holds_dropout_masks_and_restores_weights_bit_for_bit():
    # Train mode: the shifted and the clean gradient must see the same masks, or the difference is noise of O(1/h).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Dropout(0.5), nn.Linear(8, 3)).double()
    batches = mlp_batches()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    vector = torch.randn(
        sum(p.numel() for p in model.parameters()), generator=torch.Generator().manual_seed(5), dtype=torch.float64
    )
    with geometry.hessian_operator(model, cross_entropy, batches, mode="train", hvp_mode="double_backward") as h:
        want = h(vector)
    with geometry.hessian_operator(model, cross_entropy, batches, mode="train", hvp_mode="finite_difference") as h:
        got = h(vector)
        # Inside the operator, between products, the weights are already back exactly.
        assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
        again = h(vector)
    assert float((got - want).norm() / want.norm()) < 1e-6
    assert torch.equal(got, again)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_finite_difference_lambda_max_of_a_float32_tiny_vit_is_within_one_percent():
    torch.manual_seed(0)
    model = tiny_vit()
    nn.init.normal_(model.head.weight)  # a zero head would make most of the Hessian vanish
    batches = image_batches()
    exact = geometry.top_eigenvalues(model, cross_entropy, batches, hvp_mode="double_backward", max_iter=20, tol=1e-4)
    approx = geometry.top_eigenvalues(
        model, cross_entropy, batches, hvp_mode="finite_difference", max_iter=20, tol=1e-4
    )
    assert next(model.parameters()).dtype == torch.float32
    assert approx.eigenvalues[0] == pytest.approx(exact.eigenvalues[0], rel=1e-2)


@pytest.mark.parametrize("hvp_mode", ["finite_difference", "finite_difference_central"])
@pytest.mark.parametrize("kinked", ["relu", "max_pool"])
def test_finite_difference_refuses_kinked_models_and_leaves_them_as_they_were(hvp_mode, kinked):
    # A ReLU or a max pool makes the gradient jump: the difference quotient does not converge to H v (ResNet-50 was
    # off by 33x), so the mode must say so instead of returning a number, and leave the model untouched.
    if kinked == "relu":
        model, batches, mode = Mixed(torch.relu).eval(), image_batches(sizes=(4,)), "train"
        batches[0] = (batches[0][0][:, :, :16, :16], torch.tensor([0, 1, 2, 0]))
    else:
        model, batches, mode = tiny_resnet().eval(), image_batches(), "eval"  # its stem max-pools (and ReLUs)
        for block in list(model.modules()):
            for name in ("act1", "act2", "act3"):
                if hasattr(block, name):
                    setattr(block, name, nn.Tanh())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    modes = [m.training for m in model.modules()]
    rng = torch.get_rng_state()
    word = "relu" if kinked == "relu" else "max_pool2d"
    with pytest.raises(
        ValueError,
        match=rf"hvp_mode='{hvp_mode}' cannot measure this model: its loss applies {word} "
        r".*Use hvp_mode='auto'",
    ):
        geometry.top_eigenvalues(model, cross_entropy, batches, mode=mode, max_iter=3, hvp_mode=hvp_mode)
    assert [m.training for m in model.modules()] == modes
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


def test_finite_difference_accepts_a_kink_that_only_touches_the_data():
    # relu of the inputs does not depend on the weights: the loss stays smooth in them, products stay right.
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 3)).double()

    class DataRelu(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(torch.relu(x))

    model, batches = DataRelu(), mlp_batches()
    hessian = exact_hessian(model, batches)
    vector = torch.randn(hessian.shape[0], generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with geometry.hessian_operator(model, cross_entropy, batches, hvp_mode="finite_difference") as operator:
        got = operator(vector)
    want = hessian @ vector
    assert float((got - want).norm() / want.norm()) < 1e-6


def test_finite_difference_puts_the_weights_back_bit_for_bit_after_a_failed_product():
    torch.manual_seed(0)
    model = tiny_vit()
    batches = image_batches()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    calls = {"n": 0}

    def failing(model, batch):
        calls["n"] += 1
        if calls["n"] == 5:  # inside the second product, after its in-place shift of the weights
            raise RuntimeError("out of memory (simulated)")
        return cross_entropy(model, batch)

    vector = torch.randn(sum(p.numel() for p in model.parameters()), generator=torch.Generator().manual_seed(1))
    with geometry.hessian_operator(model, failing, batches, hvp_mode="finite_difference") as operator:
        operator(vector)  # the clean gradient (2 batches) and the shifted one (2 more)
        assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
        with pytest.raises(RuntimeError, match="simulated"):
            operator(vector)
        assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_finite_difference_gradients_run_in_ieee_float32_and_the_callers_tf32_settings_come_back():
    backends = [torch.backends.cuda.matmul, torch.backends.cudnn.conv]
    if not all(hasattr(b, "fp32_precision") for b in backends):
        pytest.skip("torch < 2.9 has no fp32_precision switches (ieee_fp32 then sets the allow_tf32 flags)")
    before = [b.fp32_precision for b in backends]
    seen = []

    def recording(model, batch):
        seen.append(tuple(b.fp32_precision for b in backends))
        return cross_entropy(model, batch)

    try:
        for b in backends:
            b.fp32_precision = "tf32"  # a caller who trains in TF32
        with ieee_fp32():
            assert [b.fp32_precision for b in backends] == ["ieee", "ieee"]
        assert [b.fp32_precision for b in backends] == ["tf32", "tf32"]
        model, batches = tiny_mlp(), mlp_batches()
        with geometry.hessian_operator(model, recording, batches, hvp_mode="finite_difference") as operator:
            operator(torch.ones(operator.num_params, dtype=torch.float64))
        assert seen and set(seen) == {("ieee", "ieee")}
        assert [b.fp32_precision for b in backends] == ["tf32", "tf32"]
    finally:
        for b, value in zip(backends, before):
            b.fp32_precision = value


def test_lanczos_and_slq_past_the_first_block_of_basis_rows():
    # 48 > the 32 rows the basis starts with: it must grow and stay orthonormal (full reorthogonalisation).
    spectrum = torch.linspace(-3.0, 7.0, 48, dtype=torch.float64)
    matrix, _ = matrix_with_spectrum(spectrum.tolist(), seed=3)
    settings = dict(generator=torch.Generator().manual_seed(0), dtype=torch.float64, device=torch.device("cpu"))
    out = lanczos(lambda v: matrix @ v, 48, k=3, sign=1.0, max_iter=48, tol=1e-10, **settings)
    np.testing.assert_allclose(out.values, spectrum.flip(0)[:3].numpy(), rtol=1e-10)
    for value, vector in zip(out.values, out.vectors):
        assert float((matrix @ vector - value * vector).norm()) < 1e-8
    nodes, weights = slq(lambda v: matrix @ v, 48, probes=2, steps=48, **settings)
    for p in range(2):
        np.testing.assert_allclose(np.sort(nodes[p].numpy()), spectrum.numpy(), atol=1e-9)
        assert float(weights[p].sum()) == pytest.approx(1.0, abs=1e-12)


def _dense(model, batches, **kw) -> torch.Tensor:
    with geometry.hessian_operator(model, cross_entropy, batches, **kw) as h:
        return torch.stack([h(e) for e in torch.eye(h.num_params, dtype=torch.float64)])


def test_one_hessian_per_measurement_set_whatever_each_measures_seed():
    # In train mode the seed of a measure draws its probes or start vector; the dropout masks (so the Hessian)
    # come from mask_seed alone: lambda_max with seed 0 and the trace with seed 3 measure the same matrix.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Dropout(0.5), nn.Linear(8, 3)).double()
    batches = mlp_batches()
    dense = _dense(model, batches, mode="train")
    other = _dense(model, batches, mode="train", mask_seed=1)
    assert (dense - other).abs().max() > 1e-3  # other masks: another Hessian
    exact = torch.linalg.eigvalsh((dense + dense.T) / 2)
    for seed in (0, 3):
        top = geometry.top_eigenvalues(model, cross_entropy, batches, mode="train", seed=seed, tol=1e-10)
        assert top.eigenvalues[0] == pytest.approx(float(exact[-1]), abs=1e-8) and top.mask_seed == 0
        trace = geometry.hessian_trace(model, cross_entropy, batches, mode="train", seed=seed, samples=600)
        assert abs(trace.trace - float(dense.trace())) < 4 * trace.std_error and trace.mask_seed == 0
    top1 = geometry.top_eigenvalues(model, cross_entropy, batches, mode="train", mask_seed=1, tol=1e-10)
    assert top1.eigenvalues[0] == pytest.approx(float(torch.linalg.eigvalsh((other + other.T) / 2)[-1]), abs=1e-8)


def test_train_mode_hessian_is_one_symmetric_operator_despite_dropout():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Dropout(0.5), nn.Linear(8, 3)).double()
    batches = mlp_batches()
    generator = torch.Generator().manual_seed(5)
    products = {}
    for hvp_mode in ("double_backward", "forward_over_reverse"):
        for cache in (True, False):
            with geometry.hessian_operator(
                model, cross_entropy, batches, mode="train", hvp_mode=hvp_mode, cache_graphs=cache
            ) as h:
                if not products:
                    u = torch.randn(h.num_params, generator=generator, dtype=torch.float64)
                    v = torch.randn(h.num_params, generator=generator, dtype=torch.float64)
                hu, hv = h(u), h(v)
            # Fresh dropout masks per product would break the symmetry <u, Hv> = <v, Hu>.
            assert float(u @ hv) == pytest.approx(float(v @ hu), abs=1e-10)
            products[(hvp_mode, cache)] = hv
    reference = products[("double_backward", True)]
    for hv in products.values():
        torch.testing.assert_close(hv, reference, atol=1e-12, rtol=1e-10)


# --------------------------------------------------------------------------- m-sharpness


def regression_batches():
    generator = torch.Generator().manual_seed(4)
    inputs = torch.randn(10, 3, generator=generator, dtype=torch.float64)
    targets = torch.randn(10, generator=generator, dtype=torch.float64)
    return [(inputs, targets)]


def regression_loss(model, batch):
    inputs, targets = batch
    return 0.5 * ((model(inputs).squeeze(-1) - targets) ** 2).mean()


def test_m_sharpness_by_hand_and_against_the_surrogate_gap():
    torch.manual_seed(0)
    model = nn.Linear(3, 1, bias=False).double()
    batches = regression_batches()
    rho = 0.1
    result = geometry.m_sharpness(model, regression_loss, batches, rho, 4)
    assert result.num_subbatches == 2 and result.dropped_samples == 2  # 10 samples: two of 4, two left out
    w = model.weight.detach().reshape(-1)
    inputs, targets = batches[0]
    expected = []
    for start in (0, 4):
        x, t = inputs[start : start + 4], targets[start : start + 4]
        residual = x @ w - t
        grad = x.T @ residual / 4
        eps = rho * grad / grad.norm()
        expected.append(float((0.5 * (x @ (w + eps) - t) ** 2).mean() - (0.5 * residual**2).mean()))
    np.testing.assert_allclose(result.values, expected, atol=1e-12)
    assert result.sharpness == pytest.approx(np.mean(expected), abs=1e-12)
    # m = the whole batch is the plain one-step surrogate gap of that batch.
    whole = geometry.m_sharpness(model, regression_loss, batches, rho, 10)
    assert whole.sharpness == pytest.approx(geometry.surrogate_gap(model, regression_loss, batches, rho).gap, abs=1e-12)


# ----------------------------------------------------------------------------------- landscapes


def test_filter_normalized_direction():
    model = tiny_resnet()
    direction = geometry.filter_normalized_direction(model, 3)
    for name, param in model.named_parameters():
        d = direction[name]
        if param.dim() <= 1:
            assert torch.count_nonzero(d) == 0, name
        else:
            torch.testing.assert_close(
                d.reshape(d.shape[0], -1).norm(dim=1), param.detach().reshape(param.shape[0], -1).norm(dim=1)
            )
    again = geometry.filter_normalized_direction(model, 3)
    other = geometry.filter_normalized_direction(model, 4)
    assert all(torch.equal(direction[n], again[n]) for n in direction)
    assert not torch.equal(direction["conv1.weight"], other["conv1.weight"])


def test_filter_normalisation_makes_the_landscape_blind_to_scale_before_batchnorm():
    torch.manual_seed(0)
    # A tiny eps: BN's eps is the one thing that sees the scale of its input.
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4, eps=1e-14), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 7 * 7, 3)
    ).double()
    scaled = copy.deepcopy(model)
    with torch.no_grad():
        scaled[0].weight.mul_(7.0)
    batches = [(torch.randn(6, 3, 9, 9, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2]))]
    # Train-mode BN normalises with the batch statistics, so the two networks are one function.
    curve = geometry.loss_landscape_1d(model, cross_entropy, batches, steps=7, span=1.0, mode="train")
    scaled_curve = geometry.loss_landscape_1d(scaled, cross_entropy, batches, steps=7, span=1.0, mode="train")
    np.testing.assert_allclose(curve.losses, scaled_curve.losses, rtol=1e-9)
    assert np.ptp(curve.losses) > 1e-3  # a flat curve would pass the comparison above for nothing


def test_landscape_centre_is_the_loss_at_w():
    model, batches = tiny_mlp(), mlp_batches()
    with torch.no_grad():
        loss = (3 * float(cross_entropy(model, batches[0])) + 5 * float(cross_entropy(model, batches[1]))) / 8
    line = geometry.loss_landscape_1d(model, cross_entropy, batches, steps=5, span=0.5, seed=2)
    assert line.alphas == (-0.5, -0.25, 0.0, 0.25, 0.5)
    assert line.losses[2] == pytest.approx(loss, abs=1e-14) and line.loss == pytest.approx(loss, abs=1e-14)
    plane = geometry.loss_landscape_2d(model, cross_entropy, batches, steps=3, span=0.5, seed=2)
    assert plane.losses[1][1] == pytest.approx(loss, abs=1e-14)
    assert plane.to_arrays()["losses"].shape == (3, 3)
    # The 2-D plane's first axis is the 1-D line's direction (both from `seed`).
    assert plane.losses[0][1] == pytest.approx(line.losses[0], abs=1e-14)


# ------------------------------------------------------------------------ activations, linearity


class Block(nn.Module):
    def __init__(self, act_layer):
        super().__init__()
        self.mlp = Mlp(2, 4, 2, act_layer=act_layer)

    def forward(self, x):
        return self.mlp(x)


class TwoBlockNet(nn.Module):
    def __init__(self, act_layer):
        super().__init__()
        self.blocks = nn.ModuleList([Block(act_layer), Block(act_layer)])
        with torch.no_grad():
            # Block 0: hidden = (x1, x2, -x1, -x2): exactly half positive for inputs without zeros.
            self.blocks[0].mlp.fc1.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]]))
            self.blocks[0].mlp.fc1.bias.zero_()
            # Block 1: hidden = (1, 1, 1, -1) whatever comes in: three quarters positive.
            self.blocks[1].mlp.fc1.weight.zero_()
            self.blocks[1].mlp.fc1.bias.copy_(torch.tensor([1.0, 1.0, 1.0, -1.0]))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize("act_layer", [nn.GELU, nn.ReLU])
def test_active_neuron_fraction_of_a_hand_built_net(act_layer):
    model = TwoBlockNet(act_layer)
    inputs = torch.tensor([[1.0, 2.0], [-1.0, 3.0], [2.0, -5.0], [-0.5, -0.25], [4.0, 1.0]])
    result = geometry.active_neuron_fraction(model, inputs, batch_size=2)
    assert result.as_dict() == {"blocks.0.mlp": 0.5, "blocks.1.mlp": 0.75}
    assert result.total == (20, 20) and result.num_samples == 5
    assert result.to_metrics("act/") == {
        "act/active_fraction/blocks.0.mlp": 0.5,
        "act/active_fraction/blocks.1.mlp": 0.75,
    }


def test_active_neuron_fraction_finds_the_blocks_of_timm_models():
    images = image_batches()[0][0]
    mixer = geometry.active_neuron_fraction(tiny_mixer(), images)
    assert mixer.blocks == (
        "blocks.0.mlp_tokens",
        "blocks.0.mlp_channels",
        "blocks.1.mlp_tokens",
        "blocks.1.mlp_channels",
    )
    vit = geometry.active_neuron_fraction(tiny_vit(), images)
    assert vit.blocks == ("blocks.0.mlp", "blocks.1.mlp")
    assert vit.total[0] == 4 * 17 * 64  # samples x tokens (16 patches + class token) x hidden units
    resnet = geometry.active_neuron_fraction(tiny_resnet(), images)
    assert resnet.blocks == ("layer1.0", "layer2.0", "layer3.0", "layer4.0")
    for result in (mixer, vit, resnet):
        assert all(0.0 < f < 1.0 for f in result.fractions)


class Prototypes(nn.Module):
    """1-D nearest prototype: class 0 at -1, class 1 at +1, class 2 at 0."""

    def forward(self, x):
        return -((x - torch.tensor([-1.0, 1.0, 0.0])) ** 2)


def test_linearity_missing_rate_of_a_hand_built_classifier():
    inputs = torch.tensor([[-1.0], [-1.0], [1.0], [3.0], [3.0], [3.0]])
    labels = torch.tensor([0, 0, 1, 1, 1, 1])
    # 2 x 4 pairs with different labels; only (-1, 1) meets at 0, class 2: 2 misses of 8.
    exact = geometry.linearity_missing_rate(Prototypes(), inputs, labels, pairs=None)
    assert (exact.misses, exact.pairs, exact.missing_rate) == (2, 8, 0.25)
    sampled = geometry.linearity_missing_rate(Prototypes(), inputs, labels, pairs=2000, seed=1)
    assert sampled.pairs == 2000 and abs(sampled.missing_rate - 0.25) < 4 * sampled.std_error
    assert sampled == geometry.linearity_missing_rate(Prototypes(), inputs, labels, pairs=2000, seed=1)


# ------------------------------------------------------------------------ timm models, groups


def test_tiny_vit_runs_with_fused_attention_switched_off_and_back_on():
    model = tiny_vit().train()
    attention = [m for m in model.modules() if hasattr(m, "fused_attn")]
    for module in attention:
        module.fused_attn = True  # fused SDPA has no double backward: left on, the HVP fails
    seen = []

    def loss_fn(model, batch):
        seen.append([m.fused_attn for m in attention])
        return cross_entropy(model, batch)

    state = {k: v.clone() for k, v in model.state_dict().items()}
    result = geometry.top_eigenvalues(model, loss_fn, image_batches(), k=2, max_iter=30)
    assert seen and not any(any(flags) for flags in seen)
    assert all(m.fused_attn for m in attention)
    assert model.training and result.mode == "eval" and result.hvp_mode == "double_backward"
    assert result.eigenvalues[0] >= result.eigenvalues[1] and result.num_samples == 7
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_no_fused_attention_restores_flags_after_an_error():
    model = tiny_vit()
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = True
    with pytest.raises(RuntimeError, match="boom"):
        with geometry.no_fused_attention(model):
            assert not model.blocks[0].attn.fused_attn
            raise RuntimeError("boom")
    assert model.blocks[0].attn.fused_attn and model.blocks[1].attn.fused_attn


def test_default_parameter_groups_of_tiny_timm_models():
    vit = tiny_vit()
    groups = geometry.default_parameter_groups(vit)
    assert list(groups) == [
        "patch_embed",
        "attn",
        "mlp",
        "norms",
        "head",
        "blocks.0",
        "blocks.0.attn",
        "blocks.0.mlp",
        "blocks.1",
        "blocks.1.attn",
        "blocks.1.mlp",
    ]
    assert groups["head"] == ["head.weight", "head.bias"]
    norm_modules = {n for n, m in vit.named_modules() if isinstance(m, nn.LayerNorm)}
    assert set(groups["norms"]) == {n for n, _ in vit.named_parameters() if n.rpartition(".")[0] in norm_modules}
    assert groups["patch_embed"] == ["patch_embed.proj.weight", "patch_embed.proj.bias"]
    assert groups["attn"] == groups["blocks.0.attn"] + groups["blocks.1.attn"]
    assert set(groups["blocks.1"]) == {n for n, _ in vit.named_parameters() if n.startswith("blocks.1.")}

    mixer = geometry.default_parameter_groups(tiny_mixer())
    assert list(mixer)[:3] == ["stem", "mlp_tokens", "mlp_channels"]
    assert mixer["blocks.1.mlp_tokens"] == [
        f"blocks.1.mlp_tokens.{p}" for p in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
    ]

    resnet = geometry.default_parameter_groups(tiny_resnet())
    assert list(resnet) == ["stem", "layer1", "layer2", "layer3", "layer4", "fc"]
    assert resnet["stem"] == ["conv1.weight", "bn1.weight", "bn1.bias"]

    with pytest.raises(ValueError, match="pass the groups"):
        geometry.default_parameter_groups(tiny_mlp())


def test_blockwise_on_a_tiny_mixer_shares_one_graph():
    model = tiny_mixer()
    groups = {
        k: v for k, v in geometry.default_parameter_groups(model).items() if k in ("stem", "blocks.0", "blocks.1")
    }
    result = geometry.blockwise_top_eigenvalues(model, cross_entropy, image_batches(), groups, max_iter=20)
    assert result.groups == ("stem", "blocks.0", "blocks.1")
    assert all(r.eigenvalues[0] > 0 and r.hvp_count > 0 for r in result.results)
    assert list(result.to_arrays()["lambda_max"]) == [r.eigenvalues[0] for r in result.results]


# --------------------------------------------------------------------- state, validation


class Mixed(nn.Module):
    def __init__(self, act=torch.relu):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(4 * 14 * 14, 3)
        self.act = act

    def forward(self, x):
        return self.head(self.drop(self.act(self.bn(self.conv(x)))).flatten(1))


CALLS = {
    "top_eigenvalues": lambda m, b: geometry.top_eigenvalues(m, cross_entropy, b, mode="train", max_iter=5),
    "smallest_eigenvalue": lambda m, b: geometry.smallest_eigenvalue(m, cross_entropy, b, mode="train", max_iter=5),
    "power": lambda m, b: geometry.top_eigenvalues(m, cross_entropy, b, mode="train", method="power", max_iter=5),
    "blockwise": lambda m, b: geometry.blockwise_top_eigenvalues(
        m, cross_entropy, b, {"c": ["conv.weight"]}, mode="train", max_iter=5
    ),
    "trace": lambda m, b: geometry.hessian_trace(m, cross_entropy, b, samples=2, mode="train"),
    "trace_fd": lambda m, b: geometry.hessian_trace(
        m, cross_entropy, b, samples=2, mode="train", hvp_mode="finite_difference"
    ),
    "lanczos_fd": lambda m, b: geometry.top_eigenvalues(
        m, cross_entropy, b, mode="train", max_iter=5, hvp_mode="finite_difference"
    ),
    "blockwise_fd": lambda m, b: geometry.blockwise_top_eigenvalues(
        m,
        cross_entropy,
        b,
        {"c": ["conv.weight"], "h": ["head.weight"]},
        mode="train",
        max_iter=5,
        hvp_mode="finite_difference_central",
    ),
    "density_fd": lambda m, b: geometry.eigenvalue_density(
        m, cross_entropy, b, probes=2, steps=3, mode="train", hvp_mode="finite_difference"
    ),
    "flatness": lambda m, b: geometry.average_flatness(m, cross_entropy, b, draws=2, mode="train"),
    "surrogate_gap": lambda m, b: geometry.surrogate_gap(m, cross_entropy, b, 0.05, mode="train"),
    "m_sharpness": lambda m, b: geometry.m_sharpness(m, cross_entropy, b, 0.05, 2, mode="train"),
    "landscape_1d": lambda m, b: geometry.loss_landscape_1d(m, cross_entropy, b, steps=3, mode="train"),
    "landscape_2d": lambda m, b: geometry.loss_landscape_2d(m, cross_entropy, b, steps=2, mode="train"),
    "active": lambda m, b: geometry.active_neuron_fraction(m, b[0][0], mode="train", activations={"bn": [m.bn]}),
    "linearity": lambda m, b: geometry.linearity_missing_rate(m, b[0][0], b[0][1], pairs=4, mode="train"),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_metric_restores_modes_weights_buffers_and_rng(name):
    # Finite differences refuse ReLU (test_finite_difference_refuses_kinked_models_...): their calls get GELU.
    model = Mixed(F.gelu if name.endswith("_fd") else torch.relu).eval()
    model.drop.train()  # a mixed state must come back module by module
    batches = image_batches(sizes=(4,))
    batches[0] = (batches[0][0][:, :, :16, :16], torch.tensor([0, 1, 2, 0]))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    modes = [m.training for m in model.modules()]
    rng = torch.get_rng_state()
    result = CALLS[name](model, batches)
    assert result.mode == "train"
    assert [m.training for m in model.modules()] == modes
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: geometry.top_eigenvalues(m, quadratic_loss, BATCH, k=0), "k must be >= 1, got 0"),
        (
            lambda m: geometry.top_eigenvalues(m, quadratic_loss, BATCH, k=9),
            r"k must be <= the number of parameters \(8\), got 9",
        ),
        (
            lambda m: geometry.top_eigenvalues(m, quadratic_loss, BATCH, method="lanczso"),
            "method must be one of 'lanczos', 'power', got 'lanczso'",
        ),
        (lambda m: geometry.top_eigenvalues(m, quadratic_loss, BATCH, hvp_mode="jvp"), "hvp_mode must be one of"),
        (
            lambda m: geometry.top_eigenvalues(m, quadratic_loss, BATCH, hvp_mode="finite_difference", curvature="ggn"),
            r"hvp_mode='finite_difference' with curvature='ggn'.*Use curvature='hessian'",
        ),
        (
            lambda m: geometry.top_eigenvalues(m, quadratic_loss, BATCH, mode="training"),
            "mode must be one of 'eval', 'train'",
        ),
        (lambda m: geometry.top_eigenvalues(m, quadratic_loss, BATCH, tol=0), "tol must be a finite number > 0, got 0"),
        (lambda m: geometry.top_eigenvalues(m, quadratic_loss, iter(BATCH)), "batches must be re-iterable"),
        (lambda m: geometry.top_eigenvalues(m, quadratic_loss, []), "at least one batch"),
        (lambda m: geometry.top_eigenvalues(m, quadratic_loss, BATCH, params=["v"]), "does not have"),
        (lambda m: geometry.hessian_trace(m, quadratic_loss, BATCH, samples=1), "samples must be >= 2, got 1"),
        (
            lambda m: geometry.average_flatness(m, quadratic_loss, BATCH, sigma=-1.0),
            "sigma must be a finite number > 0",
        ),
        (lambda m: geometry.m_sharpness(m, quadratic_loss, BATCH, 0.1, 2), "m must be <= the largest batch size"),
        (lambda m: geometry.loss_landscape_1d(m, quadratic_loss, BATCH, steps=1), "steps must be >= 2, got 1"),
        (lambda m: geometry.blockwise_top_eigenvalues(m, quadratic_loss, BATCH, {"g": []}), r"groups\['g'\] is empty"),
    ],
)
def test_invalid_arguments_raise_clear_errors(call, message):
    matrix, _ = matrix_with_spectrum(SPECTRUM)
    with pytest.raises(ValueError, match=message):
        call(Quadratic(matrix))
