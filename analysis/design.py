"""What a study's design can detect before it runs: the smallest paired gain and beta difference found with 80% power."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from analysis.scaling.inference import detectable

__all__ = ["DEFAULT_NOISE", "REFERENCE_LAW", "Detectable", "detectable_effects", "header_statement", "study_detectable"]

#: The error law the statement assumes (err(n) = E + B n^-beta, n the training fraction): the simulation harness's
#: truth (benchmarks/sim_coverage.py), a CIFAR-10-like curve from 19% error at 5% of the data to 5% at all of it.
REFERENCE_LAW: Mapping[str, float] = {"E": 0.03, "B": 0.02, "beta": 0.7}
#: Seed noise assumed when none is given: the sd of one run's accuracy across seeds, 0.5 points (issue 22's range
#: on CIFAR-10 is 0.2-1).
DEFAULT_NOISE = 0.005


@dataclass(frozen=True)
class Detectable:
    """The smallest true effects a design finds with `power`, at `confidence`, under `noise` per run.

    gain: a paired gain (accuracy units) at one fraction, at the strictest level of the Holm family over the
    fractions (sam_gain's `significant`). beta_diff: a difference in beta between two methods
    (paired_law_difference's interval excludes 0), NaN with fewer than 4 fractions (the law cannot be compared).
    """

    seeds: int
    fractions: tuple[float, ...]
    noise: float
    confidence: float
    power: float
    gain: float
    beta_diff: float

    def describe(self) -> str:
        """One sentence for a study header or a dry run."""
        k = len(self.fractions)
        where = f"at one of {k} fractions (Holm over them" if k > 1 else "(paired t test"
        text = (
            f"With {self.seeds} seeds and seed noise {self.noise * 100:.2g} accuracy points (sd of one run), this "
            f"design detects with {self.power:.0%} power a paired gain of {self.gain * 100:.2g} points {where}, "
            f"{self.confidence:.0%})"
        )
        if math.isfinite(self.beta_diff):
            law = REFERENCE_LAW
            text += (
                f" and a beta difference of {self.beta_diff:.2f} (error law E={law['E']}, B={law['B']}, "
                f"beta={law['beta']})"
            )
        elif k > 1:
            text += f"; no beta difference (comparing scaling laws needs 4+ fractions, this design has {k})"
        return text + "; a smaller true effect is likely missed: add seeds before spending GPU-hours."


def detectable_effects(
    seeds: int,
    fractions: Sequence[float],
    noise: float = DEFAULT_NOISE,
    *,
    law: Mapping[str, float] = REFERENCE_LAW,
    confidence: float = 0.95,
    power: float = 0.8,
) -> Detectable:
    """The smallest paired gain and beta difference found with `power`, in closed form (checked by simulation).

    gain: the paired t test on `seeds` pairs at level (1 - confidence) / fractions (Holm's first step), the pair's
    difference having sd sqrt(2) noise (the methods' seed noise independent); the power from the noncentral t
    on seeds - 1 df, exact for normal noise. beta_diff: the same on the standard error of beta from the law's
    log-space fit over every fraction (the delta method: each run's log error has sd noise / err(n)), times
    sqrt(2) for the difference, on seeds - 1 df (the report's seed-level intervals). The simulation
    harness (benchmarks/sim_coverage.py) measures the power these give; docs/science.md has its table.
    """
    if not (isinstance(seeds, (int, np.integer)) and seeds >= 2):
        raise ValueError(
            f"seeds must be an int >= 2 (one seed has no noise estimate: nothing is detected), got {seeds!r}"
        )
    fractions = tuple(sorted(float(f) for f in set(fractions)))
    if not fractions or not all(0 < f for f in fractions):
        raise ValueError(f"fractions must be positive training fractions, got {fractions}")
    if not (noise > 0 and math.isfinite(noise)):
        raise ValueError(f"noise must be the sd of one run's accuracy across seeds (> 0, e.g. 0.005), got {noise!r}")
    df = seeds - 1
    gain = detectable(
        math.sqrt(2.0) * noise / math.sqrt(seeds), df, confidence=confidence, power=power, family=len(fractions)
    )
    beta_diff = math.nan
    if len(fractions) >= 4:
        n = np.asarray(fractions)
        E, B, beta = law["E"], law["B"], law["beta"]
        power_term = B * n**-beta
        err = E + power_term
        # d log err / d (log E, log B, beta), the fit's parameters; each run's log error has sd noise / err.
        jac = np.column_stack([E / err, power_term / err, -np.log(n) * power_term / err])
        weights = (err / noise) ** 2 * seeds
        cov = np.linalg.inv(jac.T @ (jac * weights[:, None]))
        se_beta = math.sqrt(cov[2, 2])
        beta_diff = detectable(math.sqrt(2.0) * se_beta, df, confidence=confidence, power=power)
    return Detectable(
        seeds=int(seeds),
        fractions=fractions,
        noise=float(noise),
        confidence=confidence,
        power=power,
        gain=float(gain),
        beta_diff=float(beta_diff),
    )


def _design(study) -> tuple[int, list[float], int]:
    """(seeds, fractions, methods) of a loaded study: seeds from its confirm stage where it has one (the runs the
    report compares), else the train.seed levels of its cells; fractions and methods from each cell's config."""
    seeds, fractions, methods = set(), set(), set()
    for cell in study.cells:
        seeds.add(cell.config.get("train", {}).get("seed"))
        fractions.add(float(cell.config.get("data", {}).get("fraction", 1.0)))
        methods.add(str(cell.config.get("optimizer", {}).get("method")))
    confirm = getattr(study.spec, "confirm", None)
    return (confirm.seeds if confirm is not None else len(seeds)), sorted(fractions), len(methods)


def study_detectable(study, noise: float = DEFAULT_NOISE) -> str | None:
    """What a loaded study's design can detect, in one sentence (`sharpscale run --dry-run` prints it).

    None where the study compares no methods; with one seed, says that no comparison has an interval."""
    seeds, fractions, methods = _design(study)
    if methods < 2:
        return None
    if seeds < 2:
        return (
            "One seed per cell: no comparison between methods has an interval or any power; add seeds (train.seed "
            "levels, or confirm: {seeds: 5}) before spending GPU-hours."
        )
    return detectable_effects(seeds, fractions, noise).describe()


def header_statement(study, noise: float = DEFAULT_NOISE) -> str:
    """The `# Detects:` sentence of a shipped study file's header (tests/analysis/test_design.py keeps them equal)."""
    seeds, fractions, methods = _design(study)
    if methods < 2:
        return "Detects: no paired comparison (one method)."
    if seeds < 2:
        return "Detects: nothing between methods (one seed per cell: no interval); add seeds to compare."
    d = detectable_effects(seeds, fractions, noise)
    text = (
        f"Detects (80% power, seed noise {noise * 100:.2g} points per run): a paired gain of {d.gain * 100:.2g} points"
    )
    if len(fractions) > 1:
        text += f" at one of {len(fractions)} fractions"
    if math.isfinite(d.beta_diff):
        text += f" and a beta difference of {d.beta_diff:.2f}"
    return text + " (`sharpscale run --dry-run`)."
