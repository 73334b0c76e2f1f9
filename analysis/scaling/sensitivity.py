"""How a fitted law's statistics move with each of its points: the first-order sensitivity of the Huber fit.

A law's intervals resample seeds; the test images every run was scored on move all its points at once, which no
seed resample sees. analysis.images turns a statistic's derivative in each point's error into that image part
(`linear_image_variance`); this module gives the derivative, for every form, from the fit's optimum: the fit
solves sum_j psi(r_j) J_j = 0 (r = log L(n_j) - log err_j, psi the Huber loss's derivative, J = d log L / d
theta), so to first order d theta / d log err_j = H^-1 psi'(r_j) J_j with H = sum_j psi'(r_j) J_j J_j^T (Gauss-
Newton: the residuals' own curvature left out), over the parameters not at a bound (a bound holds its parameter).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from analysis.scaling.laws import _LAW_PARAMS, _LOG_FLOOR, LawFit, _law_log_pred, _law_params


def _numeric_gradient(f: Callable[[np.ndarray], np.ndarray], theta: np.ndarray) -> np.ndarray:
    """Central differences of f (vector-valued) in each of theta's entries: (len(f), len(theta))."""
    cols = []
    for k in range(len(theta)):
        h = 1e-6 * max(1.0, abs(float(theta[k])))
        up, down = theta.copy(), theta.copy()
        up[k] += h
        down[k] -= h
        cols.append((np.atleast_1d(f(up)) - np.atleast_1d(f(down))) / (2.0 * h))
    return np.column_stack(cols)


def law_statistic(fit: LawFit, name: str, *, heldout: float | None = None) -> Callable[[np.ndarray], float]:
    """A statistic of the law as a function of its internal parameters: a parameter ("E", "B", "beta", ...) or
    "prediction" (the error at `heldout`)."""
    if name == "prediction":
        if heldout is None:
            raise ValueError("law_statistic('prediction') needs heldout, the n predicted")
        lx = np.array([math.log(float(heldout) / fit.n0)])
        return lambda th: float(np.exp(_law_log_pred(fit.form, th, lx, fit.eps0))[0])
    if name not in fit.params:
        raise ValueError(f"law_statistic: {name!r} is not a parameter of the {fit.form} form ({list(fit.params)})")
    return lambda th: _law_params(fit.form, th, fit.n0)[name]


def point_gradient(fit: LawFit, n, err, statistic: Callable[[np.ndarray], float]) -> np.ndarray:
    """d statistic / d err_j for each point (n_j, err_j) the law was fitted on, to first order (module docstring).
    A point in the Huber loss's linear part, or at the log floor, moves nothing: its entry is 0."""
    n = np.asarray(n, dtype="float64").ravel()
    err = np.asarray(err, dtype="float64").ravel()
    theta = np.asarray(fit.theta, dtype="float64")
    lx = np.log(n / fit.n0)
    ly = np.log(np.maximum(err, _LOG_FLOOR))
    free = np.array([p not in fit.at_bound for p in _LAW_PARAMS[fit.form]])
    jac = _numeric_gradient(lambda th: _law_log_pred(fit.form, th, lx, fit.eps0), theta)[:, free]
    r = _law_log_pred(fit.form, theta, lx, fit.eps0) - ly
    delta = fit.huber_delta if math.isfinite(fit.huber_delta) else math.inf
    psi1 = (np.abs(r) <= delta).astype("float64")
    hess = jac.T @ (psi1[:, None] * jac)
    grad = _numeric_gradient(lambda th: np.array([statistic(th)]), theta)[0, free]
    d_log_err = (psi1[:, None] * jac) @ (np.linalg.pinv(hess, hermitian=True) @ grad)
    return np.where(err > _LOG_FLOOR, d_log_err / np.maximum(err, _LOG_FLOOR), 0.0)
