"""Intervals over seeds and test images jointly, from the per-image correctness runs record (trainables.scored).

A cell's runs are scored on the same test images, so a test set's luck (its share of hard images) moves every one
of them together: resampling seeds alone never sees it, and the interval then covers the accuracy on these images,
not on the images the test set stands for. With each run's per-image correctness the estimate's variance splits
into its two parts, exactly for a mean over a crossed (seed x image) design:

  Var(mean) = Var_seed / S + Cov_image / N

where Var_seed is the variance of one seed's accuracy (today's seed-level part, which already holds each run's own
binomial noise) and Cov_image the covariance, over images, of two different seeds' per-image correctness: the
part of the image-to-image variation the seeds share, which only a new test set would redraw. A paired comparison
does the same on per-image differences (treatment - baseline, one seed pair, the same images), so the images both
arms find hard cancel as they should.

The interval's quantile is that of the mean over sqrt(its estimated variance) when the seed part is estimated on
S - 1 df and the image part (thousands of images) is taken as known: a mixture of Student's t and the normal by the
image part's share of the variance (`mixed_t_ppf`; Student's t at share 0, the normal at 1), and never less than
the seeds' own t interval (`crossed_quantile`). The share is estimated, from the seeds' noisy spread: where that
spread comes out small by chance the share comes out large and the quantile near the normal's, both at once, so
the plain plug-in narrowed the interval below the seeds' own (a gain at 3 seeds covered 91.5%; Satterthwaite's df
92.9%, in benchmarks/sim_images); bounded below by the seeds' t it keeps what the seeds alone guarantee.

A statistic that is not a mean (a scaling law's held-out prediction, its parameters, two laws' difference: a
fit to many cells' runs) gets its image part the same way to first order: with g_r its derivative in run r's
accuracy, it moves with the images as sum_r g_r acc_r, the mean over seeds and images of the (seeds, images)
array D_(s,i) = S sum_(runs r of seed s) g_r c_(r,i), whose image part is image_covariance(D) / N
(`linear_image_variance`; every cell of the fit shares the test images, so images hard at every fraction, or for
both arms, move the fit as they should and cancel in a difference where they should). `with_images` widens the
statistic's seed-level interval (a jackknife-t or a bootstrap-t, asymmetric or not) by the ratio of
`crossed_quantile` times the joint se to the seeds' t times their se: at share 0 the seeds' interval itself.

Why not a two-level bootstrap (seeds and images resampled jointly)? It counts each run's own binomial noise twice
(once in the seeds' spread, once in the images') and its seed level has 10 distinct resamples at 3 seeds, a
percentile interval too narrow by design (analysis.scaling.inference); benchmarks/sim_coverage.py --images-per-image
measures both against the population accuracy (docs/science.md, "Intervals over seeds and test images").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analysis.scaling.inference import CONDITIONS, TTest
from trainables.scored import ScoredImages

__all__ = [
    "IMAGE_CONDITIONS",
    "IMAGE_OVER",
    "SEED_CONDITIONS",
    "SEED_OVER",
    "interval_conditions",
    "CrossedT",
    "crossed_detectable",
    "crossed_p",
    "crossed_quantile",
    "crossed_t",
    "image_covariance",
    "linear_image_variance",
    "with_images",
    "mixed_t_cdf",
    "mixed_t_ppf",
    "scored_matrix",
    "subset_wording",
]

#: What an interval over seeds and test images conditions on (said beside it, as CONDITIONS is beside seed-level ones).
IMAGE_CONDITIONS = (
    "over seeds and test images jointly (each run's per-image correctness, the images drawn alike for every run of "
    "a cell and both arms of a pair), given the training subset (data.fraction_seed): another subset would move "
    "every run of a cell together, which no interval here includes"
)
#: The fallback's condition, for runs recorded without per-image correctness (a store of an older sharpscale).
SEED_CONDITIONS = CONDITIONS + " (these runs recorded no per-image correctness)"
# Where each confirm seed trained on its own training subset (studies' confirm.subsets: per_seed), the subset is no
# longer held fixed for the confirm runs: the same statements, their subset clause saying so.
_PER_SEED_SUBSETS = (
    "each confirm seed trained on its own training subset (confirm.subsets: per_seed), so intervals over confirm runs "
    "include the variation from one drawn subset to another (search runs share the one of data.fraction_seed)"
)
_SUBSET_WORDING = (
    (
        IMAGE_CONDITIONS,
        IMAGE_CONDITIONS.split(", given the training subset")[0] + f"; {_PER_SEED_SUBSETS}",
    ),
    (
        CONDITIONS,
        "over seeds, given the test images the runs were scored on: another test set would move every run of a cell "
        f"together, which no interval here includes; {_PER_SEED_SUBSETS}",
    ),
)


def subset_wording(text: str, per_seed: bool) -> str:
    """`text` (a report's prose) with every conditions statement's training-subset clause as it holds for the runs:
    unchanged where the subset is fixed, and saying that each confirm seed drew its own where it did."""
    if per_seed:
        for fixed, drawn in _SUBSET_WORDING:
            text = text.replace(fixed, drawn)
    return text


#: The `interval over` column of confirm_summary and sam_gain: what each row's interval resamples.
IMAGE_OVER = "seeds and test images"
SEED_OVER = "seeds"


def interval_conditions(over) -> str:
    """What a table's intervals condition on, to follow "The intervals are ...", from its `interval over` values
    (both statements where its rows differ: some cells' runs recorded per-image correctness, some did not)."""
    used = {str(v) for v in over} & {IMAGE_OVER, SEED_OVER}
    if used == {IMAGE_OVER}:
        return IMAGE_CONDITIONS
    if used == {IMAGE_OVER, SEED_OVER}:
        return (
            f"{IMAGE_CONDITIONS}, in the rows whose `interval over` reads '{IMAGE_OVER}'; in those reading "
            f"'{SEED_OVER}' they are {SEED_CONDITIONS}"
        )
    return SEED_CONDITIONS


def scored_matrix(texts: Sequence, accuracies: Sequence[float]) -> tuple[np.ndarray | None, str]:
    """The runs' per-image correctness as a (runs, images) bool array, from their records (ScoredImages.to_text,
    one per run) and the accuracies the table reads for them; (None, why) where they cannot stand for those values:
    a run without a record, records of other images (their digests differ: another dataset, split or order), or a
    record whose accuracy is not the value read (a metric other than the final evaluation's top-1)."""
    rows = []
    digests = set()
    for text, acc in zip(texts, accuracies, strict=True):
        if not isinstance(text, str) or not text:
            return None, "some run recorded no per-image correctness"
        try:
            scored = ScoredImages.from_text(text)
        except ValueError as err:
            return None, f"a per-image record is unreadable ({err})"
        n = len(scored.correct)
        if not n or not (math.isfinite(float(acc)) and abs(scored.accuracy - float(acc)) <= 0.5 / n):
            return None, "the per-image records are not of the value compared (not the final evaluation's accuracy)"
        digests.add(scored.digest)
        rows.append(scored.correct)
    if len(digests) > 1:
        return None, "the runs were scored on different images (their records' digests differ)"
    if not rows:
        return None, "no runs"
    return np.vstack(rows), ""


def image_covariance(values: np.ndarray) -> float:
    """The mean, over pairs of different rows, of their covariance across columns (ddof 1): of a (seeds, images)
    array, the image-to-image variation that the seeds share. NaN with fewer than 2 rows or columns."""
    d = np.asarray(values, dtype="float64")
    s, n = d.shape
    if s < 2 or n < 2:
        return math.nan
    # The sum of all s x s covariances is s^2 times the variance of the column means; less the s variances.
    all_pairs = s * s * float(d.mean(axis=0).var(ddof=1))
    own = float(d.var(axis=1, ddof=1).sum())
    return (all_pairs - own) / (s * (s - 1))


def mixed_t_cdf(x: float, df: float, share: float) -> float:
    """P(T <= x) for T = Z / sqrt((1 - share) W / df + share), Z normal, W chi-square on df: the mean over the
    square root of its estimated variance when `share` of the variance is known exactly and the rest is estimated
    on df degrees of freedom. Student's t at share 0, the normal at share 1."""
    from scipy.stats import norm, t

    if share <= 0.0:
        return float(t.cdf(x, df))
    if share >= 1.0 or not math.isfinite(df):
        return float(norm.cdf(x))
    ratio, weight = _chi2_nodes(float(df))
    return float(np.sum(weight * norm.cdf(x * np.sqrt((1.0 - share) * ratio + share))))


@functools.lru_cache(maxsize=64)
def _chi2_nodes(df: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes (W / df at W = the chi-square's quantile of u^2) and weights (2 u du, Gauss-Legendre on u in [0, 1]) of
    an expectation over W: on the u scale sqrt(W) is smooth at 0 for every df, so 200 nodes hold the cdf to 1e-9."""
    from scipy.stats import chi2

    u, w = np.polynomial.legendre.leggauss(200)
    u, w = (u + 1.0) / 2.0, w / 2.0
    return chi2.ppf(u * u, df) / df, 2.0 * u * w


def mixed_t_ppf(p: float, df: float, share: float) -> float:
    """The quantile of `mixed_t_cdf`: between the normal's and Student's t's on df."""
    from scipy.optimize import brentq
    from scipy.stats import norm, t

    if share <= 0.0:
        return float(t.ppf(p, df))
    if p < 0.5:  # symmetric
        return -mixed_t_ppf(1.0 - p, df, share)
    lo, hi = float(norm.ppf(p)), float(t.ppf(p, df))
    if share >= 1.0 or not math.isfinite(df) or hi - lo < 1e-12:
        return lo
    # The bracket a little wider than the two limits: the quadrature's last digits must not put the root outside.
    return float(brentq(lambda x: mixed_t_cdf(x, df, share) - p, 0.999 * lo, 1.001 * hi, xtol=1e-10))


def crossed_quantile(p: float, df: float, share: float) -> float:
    """The quantile, in units of the joint se, of an interval over seeds and images: mixed_t_ppf, or the seeds' own
    Student t quantile (in joint-se units: t sqrt(1 - share)) where that is wider."""
    from scipy.stats import t

    return max(mixed_t_ppf(p, df, share), float(t.ppf(p, df)) * math.sqrt(max(1.0 - share, 0.0)))


def crossed_p(z: float, df: float, share: float) -> float:
    """The two-sided p-value of `crossed_quantile`'s test: z (estimate over the joint se) beyond both quantiles."""
    from scipy.stats import t

    seeds = 2.0 * float(t.sf(abs(z) / math.sqrt(1.0 - share), df)) if share < 1.0 else 0.0
    return max(2.0 * (1.0 - mixed_t_cdf(abs(z), df, share)), seeds)


def crossed_detectable(se: float, df: float, share: float, *, confidence: float = 0.95, power: float = 0.8,
                       family: int = 1) -> float:  # fmt: skip
    """The gain an interval over seeds and images (joint se, seed df, image share) finds with `power` at level
    (1 - confidence) / family: (crossed_quantile of the level + that of the power) x se. NaN where df < 1."""
    if not (df >= 1 and math.isfinite(se) and se > 0):
        return math.nan
    alpha = 1.0 - confidence
    return float((crossed_quantile(1 - alpha / (2 * family), df, share) + crossed_quantile(power, df, share)) * se)


@dataclass(frozen=True)
class CrossedT(TTest):
    """crossed_t's result: TTest's fields (df those of the seed part, S - 1) and the test images' share of the
    estimate's variance, which sets the quantile (`mixed_t_ppf`)."""

    image_share: float = 0.0


def crossed_t(values: np.ndarray, *, confidence: float = 0.95, family: int = 1) -> CrossedT:
    """The t interval and test of the mean of a (seeds, images) array of per-image values (correctness, or paired
    differences): variance Var_seed / S + max(0, Cov_image) / N, the quantile of `mixed_t_ppf` (module docstring).
    The fields of analysis.scaling.paired_t (to which it reduces with one image); NaN with fewer than 2 seeds."""
    d = np.asarray(values, dtype="float64")
    s, n = d.shape
    per_seed = d.mean(axis=1)
    mean = float(per_seed.mean()) if s else math.nan
    if s < 2:
        return CrossedT(mean, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, max(s - 1, 0), s)
    v_seed = float(per_seed.var(ddof=1)) / s
    v_image = max(image_covariance(d), 0.0) / n if n > 1 else 0.0
    v = v_seed + v_image
    se = math.sqrt(v)
    share = v_image / v if v > 0 else 0.0
    df = s - 1
    q = crossed_quantile(0.5 + confidence / 2.0, df, share)
    qb = crossed_quantile(1.0 - (1.0 - confidence) / (2.0 * family), df, share)
    pval = crossed_p(mean / se, df, share) if se > 0 else (0.0 if mean != 0 else 1.0)
    return CrossedT(mean, se, mean - q * se, mean + q * se, mean - qb * se, mean + qb * se, pval, df, s, share)


def linear_image_variance(correct: np.ndarray, gradient, seeds) -> float:
    """The test images' part of the variance of a statistic whose first-order change is sum_r gradient_r acc_r
    over runs r (one row of `correct`, a (runs, images) bool or 0/1 array, a `seeds` entry each): image_covariance
    of D_(s,i) = S sum_(r of seed s) gradient_r correct_(r,i) over N (module docstring). A gradient in the runs'
    errors (1 - accuracy) gives the same variance. NaN with fewer than 2 seeds or images."""
    c = np.asarray(correct, dtype="float64")
    g = np.asarray(gradient, dtype="float64").ravel()
    seeds = np.asarray(seeds).ravel()
    if c.ndim != 2 or not (len(c) == len(g) == len(seeds)):
        raise ValueError(
            f"linear_image_variance needs one gradient and one seed per row of correct (runs, images), got "
            f"correct {c.shape}, gradient {g.shape}, seeds {seeds.shape}"
        )
    order = np.unique(seeds)
    onehot = (seeds[:, None] == order[None, :]).astype("float64")
    d = len(order) * ((onehot * np.where(np.isfinite(g), g, 0.0)[:, None]).T @ c)
    cov = image_covariance(d)
    return max(cov, 0.0) / c.shape[1] if math.isfinite(cov) else math.nan


def with_images(
    estimate: float, low: float, high: float, se: float, v_image: float, df: float, *, confidence: float = 0.95,
    log: bool = False,
) -> tuple[float, float, float, float]:  # fmt: skip
    """(low, high, se, share) of a seed-level interval (low, high) of `estimate`, of seed-level standard error `se`
    on df, with the test images' variance `v_image` added: each side times crossed_quantile x joint se over the
    seeds' t x se (>= 1), so that a bootstrap-t keeps its asymmetry. log: the interval and se are on the log scale
    of a positive estimate (v_image that of log estimate). Unchanged, share 0, where v_image is not positive or
    the interval not finite."""
    from scipy.stats import t

    values = (estimate, low, high, se, v_image)
    if not (all(math.isfinite(v) for v in values) and se > 0 and v_image > 0 and df >= 1):
        return low, high, se, 0.0
    if log and min(estimate, low, high) <= 0:
        return low, high, se, 0.0
    joint = math.sqrt(se * se + v_image)
    share = v_image / (joint * joint)
    p = 0.5 + confidence / 2.0
    factor = crossed_quantile(p, df, share) * joint / (float(t.ppf(p, df)) * se)
    if log:
        return estimate * (low / estimate) ** factor, estimate * (high / estimate) ** factor, joint, share
    return estimate - (estimate - low) * factor, estimate + (high - estimate) * factor, joint, share
