"""What a study's design can detect before it runs: the smallest paired gain and beta difference found with 80% power."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from analysis.scaling.inference import detectable

__all__ = [
    "DEFAULT_NOISE",
    "REFERENCE_LAW",
    "REFERENCE_DATASET",
    "Detectable",
    "binomial_floor",
    "detectable_effects",
    "header_statement",
    "study_detectable",
]

#: The error law the statement assumes (err(n) = E + B n^-beta, n the training fraction): the simulation harness's
#: truth (benchmarks/sim_coverage.py), a CIFAR-10-like curve from 19% error at 5% of the data to 5% at all of it.
REFERENCE_LAW: Mapping[str, float] = {"E": 0.03, "B": 0.02, "beta": 0.7}
#: Seed noise assumed when none is given: the sd of one run's accuracy across seeds, 0.5 points (issue 22's range
#: on CIFAR-10 is 0.2-1).
DEFAULT_NOISE = 0.005
#: The dataset the reference statements assume (the shipped data-scaling study's): its registry entry says how many
#: test images one confirm run is scored on.
REFERENCE_DATASET = "cifar10"


def scored_images(dataset: str = REFERENCE_DATASET, split: str = "test") -> int | None:
    """Test images one run's reported accuracy is scored on: the `split` of `dataset`'s validation set, from the
    registry (trainables.data.registry: the confirm stage scores on the 'test' half, studies/confirm.py; 5,000 images of
    CIFAR-10's 10,000). Its binomial sd is a floor under any run's noise. None where the data decide its size."""
    from trainables.data.registry import DATASETS

    spec = DATASETS.get(str(dataset))
    return spec.scored_images(split) if spec is not None else None


def binomial_floor(images: int | None = None, accuracy: float = 0.5) -> float:
    """The sd of an accuracy measured on `images` test images, sqrt(p (1 - p) / images): at p = 0.5 (the default,
    the largest it can be) 0.71 points for 5,000 images. ViT and Mixer cells at 10% of CIFAR-10 sit near it
    (0.67-0.69), above the 0.5-point reference seed noise: a statement of power from 0.5 alone claims too much.
    images None: the reference dataset's scored half (`scored_images`)."""
    images = scored_images() if images is None else images
    if not (images >= 1 and 0.0 <= accuracy <= 1.0):
        raise ValueError(f"images must be >= 1 and accuracy in [0, 1], got {images!r}, {accuracy!r}")
    return math.sqrt(accuracy * (1.0 - accuracy) / images)


@dataclass(frozen=True)
class Detectable:
    """The smallest true effects a design finds with `power`, at `confidence`, under `noise` per run.

    noise: the sd of one run used, the larger of the seed noise given (`seed_noise`) and the binomial floor of
    the images it is scored on (`floor`). gain: a paired gain (accuracy units) at one fraction, at the strictest
    level of the Holm family over the fractions (sam_gain's `significant`). beta_up / beta_down: a difference in
    beta between two methods (paired_law_difference's interval excludes 0) when the treatment's beta is larger /
    smaller, each with the standard error of the law it implies (a law with a larger beta measures its beta
    better: the two differ); NaN with fewer than 4 fractions, and beta_down NaN where no beta above 0 is far
    enough. beta_diff: the larger of the two, the one a design can promise either way.
    """

    seeds: int
    fractions: tuple[float, ...]
    noise: float
    confidence: float
    power: float
    gain: float
    beta_diff: float
    beta_up: float = math.nan
    beta_down: float = math.nan
    seed_noise: float = math.nan
    floor: float = math.nan

    def describe(self) -> str:
        """One sentence for a study header or a dry run."""
        k = len(self.fractions)
        where = f"at one of {k} fractions (Holm over them" if k > 1 else "(paired t test"
        text = (
            f"With {self.seeds} seeds and {self.noise * 100:.2g} accuracy points of noise per run ({self._noise_source()}), this "
            f"design detects with {self.power:.0%} power a paired gain of {self.gain * 100:.2g} points {where}, "
            f"{self.confidence:.0%})"
        )
        if math.isfinite(self.beta_up):
            law = REFERENCE_LAW
            down = (
                f"-{self.beta_down:.2f}"
                if math.isfinite(self.beta_down)
                else "none smaller (no beta above 0 is far enough)"
            )
            text += (
                f" and a beta difference of +{self.beta_up:.2f} / {down} (treatment's beta larger / smaller; error law "
                f"E={law['E']}, B={law['B']}, beta={law['beta']})"
            )
        elif k > 1:
            text += f"; no beta difference (comparing scaling laws needs 4+ fractions, this design has {k})"
        return text + "; a smaller true effect is likely missed: add seeds before spending GPU-hours."

    def _noise_source(self) -> str:
        if self.floor >= self.seed_noise:
            return f"the binomial floor of the scored test images, above the seed noise {self.seed_noise * 100:.2g}"
        return "seed noise, above the test images' binomial floor"


def _se_beta(fractions: np.ndarray, law: Mapping[str, float], noise: float, seeds: int) -> float:
    """The standard error of beta from the law's log-space fit over every fraction (the delta method: each run's
    log error has sd noise / err(n))."""
    E, B, beta = law["E"], law["B"], law["beta"]
    if beta < 1e-3:  # the floor and the power term are one constant: beta is not measured (and pinv breaks down)
        return math.inf
    power_term = B * fractions**-beta
    err = E + power_term
    # d log err / d (log E, log B, beta), the fit's parameters.
    jac = np.column_stack([E / err, power_term / err, -np.log(fractions) * power_term / err])
    weights = (err / noise) ** 2 * seeds
    with np.errstate(all="ignore"):
        var = float(np.linalg.pinv(jac.T @ (jac * weights[:, None]))[2, 2])
    # At beta -> 0 the floor and the power term are one constant: beta is not measured at all.
    return math.sqrt(var) if math.isfinite(var) and var > 0 else math.inf


def _beta_detectable(fractions, law, noise, seeds, confidence, power, sign: int) -> float:
    """The beta difference of one sign found with `power`: the treatment's law has beta + sign d, the baseline's
    the reference beta, each measured with its own se. NaN where no d in (0, beta) suffices downwards."""
    from scipy.optimize import brentq

    from analysis.scaling.inference import power_t

    n = np.asarray(fractions)
    base = _se_beta(n, law, noise, seeds)
    alpha = 1.0 - confidence

    def shortfall(d):
        moved = {**law, "beta": law["beta"] + sign * d}
        se = math.sqrt(base**2 + _se_beta(n, moved, noise, seeds) ** 2)
        return (power_t(d, se, seeds - 1, alpha=alpha) if math.isfinite(se) else 0.0) - power

    hi = law["beta"] - 1e-3 if sign < 0 else 1.0
    while sign > 0 and shortfall(hi) < 0 and hi < 1e3:
        hi *= 2.0
    if shortfall(hi) < 0:
        return math.nan
    return float(brentq(shortfall, 1e-9, hi, xtol=1e-6))


def detectable_effects(
    seeds: int,
    fractions: Sequence[float],
    noise: float = DEFAULT_NOISE,
    *,
    law: Mapping[str, float] = REFERENCE_LAW,
    confidence: float = 0.95,
    power: float = 0.8,
    images: int | None | str = "reference",
) -> Detectable:
    """The smallest paired gain and beta difference found with `power`, before the run (not from its data).

    The noise per run is the larger of `noise` (seed noise) and the binomial floor of `images` test images at
    50% accuracy (`binomial_floor`; "reference": the reference dataset's scored half, `scored_images`; None: seed
    noise alone). gain: the paired t test on `seeds` pairs at level
    (1 - confidence) / fractions (Holm's first step), the pair's difference having sd sqrt(2) noise; the power
    by quadrature (`analysis.scaling.power_t`), exact for normal noise. beta_up / beta_down: the same on the
    difference of two laws' betas, each law's se from its log-space fit over every fraction at its own beta
    (`_se_beta`), on seeds - 1 df. The simulation harness (benchmarks/sim_coverage.py) measures the power these
    give; docs/science.md has its table.
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
    if images == "reference":
        images = scored_images()
    floor = binomial_floor(images) if images else 0.0
    used = max(noise, floor)
    gain = detectable(
        math.sqrt(2.0) * used / math.sqrt(seeds), seeds - 1, confidence=confidence, power=power, family=len(fractions)
    )
    up = down = math.nan
    if len(fractions) >= 4:
        up = _beta_detectable(fractions, law, used, seeds, confidence, power, +1)
        down = _beta_detectable(fractions, law, used, seeds, confidence, power, -1)
    return Detectable(
        seeds=int(seeds),
        fractions=fractions,
        noise=float(used),
        confidence=confidence,
        power=power,
        gain=float(gain),
        beta_diff=float(max(up, down)) if math.isfinite(down) else float(down),
        beta_up=float(up),
        beta_down=float(down),
        seed_noise=float(noise),
        floor=float(floor),
    )


def _design(study) -> tuple[int, list[float], int, int | None]:
    """(seeds, fractions, methods, scored images) of a loaded study: seeds from its confirm stage where it has one
    (the runs the report compares), else the train.seed levels of its cells; fractions and methods from each
    cell's config; the images one compared run is scored on from the registry (`scored_images`: the 'test' half
    for confirm runs, else the cells' data.eval_split), None where the data decide or the cells' datasets differ."""
    seeds, fractions, methods, scored = set(), set(), set(), set()
    confirm = getattr(study.spec, "confirm", None)
    for cell in study.cells:
        data = cell.config.get("data", {})
        seeds.add(cell.config.get("train", {}).get("seed"))
        fractions.add(float(data.get("fraction", 1.0)))
        methods.add(str(cell.config.get("optimizer", {}).get("method")))
        split = "test" if confirm is not None else str(data.get("eval_split", "all"))
        scored.add(scored_images(str(data.get("name")), split))
    images = scored.pop() if len(scored) == 1 else None
    return (confirm.seeds if confirm is not None else len(seeds)), sorted(fractions), len(methods), images


def study_detectable(study, noise: float = DEFAULT_NOISE) -> str | None:
    """What a loaded study's design can detect, in one sentence (`sharpscale run --dry-run` prints it).

    None where the study compares no methods; with one seed, says that no comparison has an interval."""
    seeds, fractions, methods, images = _design(study)
    if methods < 2:
        return None
    if seeds < 2:
        return (
            "One seed per cell: no comparison between methods has an interval or any power; add seeds (train.seed "
            "levels, or confirm: {seeds: 5}) before spending GPU-hours."
        )
    return detectable_effects(seeds, fractions, noise, images=images).describe()


def header_statement(study, noise: float = DEFAULT_NOISE) -> str:
    """The `# Detects:` sentence of a shipped study file's header (tests/analysis/test_design.py keeps them equal)."""
    seeds, fractions, methods, images = _design(study)
    if methods < 2:
        return "Detects: no paired comparison (one method)."
    if seeds < 2:
        return "Detects: nothing between methods (one seed per cell: no interval); add seeds to compare."
    d = detectable_effects(seeds, fractions, noise, images=images)
    floor = f"the binomial floor of {images:,} test images {d.floor * 100:.2g}" if images else "no binomial floor known"
    text = (
        f"Detects (80% power, {d.noise * 100:.2g} points of noise per run: seed noise {noise * 100:.2g}, {floor}): "
        f"a paired gain of {d.gain * 100:.2g} points"
    )
    if len(fractions) > 1:
        text += f" at one of {len(fractions)} fractions"
    if math.isfinite(d.beta_up):
        down = f"-{d.beta_down:.2f}" if math.isfinite(d.beta_down) else "no smaller beta"
        text += f" and a beta difference of +{d.beta_up:.2f} / {down} (treatment's beta larger / smaller)"
    return text + " (`sharpscale run --dry-run`)."
