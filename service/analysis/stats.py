"""Statistics on plain numpy arrays: rank correlations, intervals, difference tests, kappa.

scipy is not a dependency of the service, so these are written out here and cross-checked
against scipy in the tests only. Conventions:
- correlations drop pairs where either value is NaN and return NaN when undefined (fewer than
  two pairs, or a constant variable), never a made-up 0;
- intervals are two-sided at ``level`` (default 95%);
- bootstraps take a ``seed`` so a report can be reproduced exactly;
- ranks treat values equal to ``TIE_DECIMALS`` decimals as tied: one measure reached by two
  routes of float arithmetic (-0.7 and -0.6999999999999998) is one value, not two ranks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

LEVEL = 0.95
POWER = 0.80
BOOTSTRAP_REPS = 2000
NAN = float("nan")

_NORMAL = NormalDist()
# Far finer than any difference between two measure values, far coarser than float rounding.
TIE_DECIMALS = 9


def z_value(level: float = LEVEL) -> float:
    """The two-sided normal quantile: 1.96 for 95%."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    return _NORMAL.inv_cdf(0.5 + level / 2.0)


def two_sided_p(z: float) -> float:
    """Two-sided p-value of a standard normal statistic."""
    if math.isnan(z):
        return NAN
    return 2.0 * (1.0 - _NORMAL.cdf(abs(z)))


# ---------------------------------------------------------------------------------------------
# Correlation


def _pairs(x: ArrayLike, y: ArrayLike) -> tuple[FloatArray, FloatArray]:
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    b = np.asarray(y, dtype=np.float64).reshape(-1)
    if a.size != b.size:
        raise ValueError(f"x and y differ in length: {a.size} != {b.size}")
    keep = ~(np.isnan(a) | np.isnan(b))
    return a[keep], b[keep]


def settle(values: ArrayLike) -> FloatArray:
    """The values rounded to ``TIE_DECIMALS``, so float noise cannot split a tie."""
    array = np.asarray(values, dtype=np.float64)
    settled: FloatArray = np.round(array, TIE_DECIMALS).astype(np.float64)
    return settled


def rankdata(values: ArrayLike) -> FloatArray:
    """Ranks 1..n, ties (equal once settled) sharing the average of the ranks they span."""
    a = settle(values).reshape(-1)
    n = a.size
    order = np.argsort(a)
    ordered = a[order]
    boundaries = np.flatnonzero(np.diff(ordered) != 0) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [n]))
    ranks: FloatArray = np.empty(n, dtype=np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def pearson(x: ArrayLike, y: ArrayLike) -> float:
    """Pearson's r over the pairs where both values are known."""
    a, b = _pairs(x, y)
    if a.size < 2:
        return NAN
    da, db = a - a.mean(), b - b.mean()
    # Elementwise products rather than np.dot: dot goes through multithreaded BLAS, whose
    # thread start-up costs more than the sum itself at these sizes on a busy machine.
    denominator = math.sqrt(float((da * da).sum()) * float((db * db).sum()))
    if denominator == 0.0:
        return NAN
    return max(-1.0, min(1.0, float((da * db).sum()) / denominator))


def spearman(x: ArrayLike, y: ArrayLike) -> float:
    """Spearman's rho: Pearson's r of the average ranks (the tie-corrected form)."""
    a, b = _pairs(x, y)
    if a.size < 2:
        return NAN
    return pearson(rankdata(a), rankdata(b))


def _tied_pairs(sorted_values: FloatArray) -> float:
    if sorted_values.size == 0:
        return 0.0
    boundaries = np.flatnonzero(np.diff(sorted_values) != 0) + 1
    runs = np.diff(np.concatenate(([0], boundaries, [sorted_values.size]))).astype(np.float64)
    return float((runs * (runs - 1.0) / 2.0).sum())


def count_inversions(values: ArrayLike) -> int:
    """Pairs i < j with values[i] > values[j] (ties are not inversions), in O(n log^2 n).

    A bottom-up merge sort done level by level in numpy: at each level, each sorted left block
    is searched for the elements of its right block, all blocks at once, by offsetting every
    value with its block number so one global ``searchsorted`` keeps the blocks apart.
    """
    raw = np.asarray(values).reshape(-1)
    n = raw.size
    if n < 2:
        return 0
    _, dense = np.unique(raw, return_inverse=True)
    current = dense.astype(np.int64).reshape(-1)
    span = int(current.max()) + 1
    position = np.arange(n, dtype=np.int64)
    total = 0
    width = 1
    while width < n:
        block = position // (2 * width)
        in_right = (position // width) % 2 == 1
        keys = block * span + current
        left_keys = keys[~in_right]
        right_block = block[in_right]
        above = np.searchsorted(left_keys, (right_block + 1) * span, side="left")
        below = np.searchsorted(left_keys, keys[in_right], side="right")
        total += int((above - below).sum())
        current = np.sort(keys) - block * span
        width *= 2
    return total


def kendall_tau_b(x: ArrayLike, y: ArrayLike) -> float:
    """Kendall's tau-b, which corrects for ties in either variable (as the paper's Fig. 24).

    tau_b = (C - D) / sqrt((n0 - n1) * (n0 - n2)), n0 = n(n-1)/2, n1 and n2 the pairs tied in x
    and in y. D is counted as the inversions of y once the pairs are sorted by (x, y); pairs tied
    in both are removed from C + D by inclusion-exclusion.
    """
    a, b = _pairs(x, y)
    a, b = settle(a), settle(b)
    n = a.size
    if n < 2:
        return NAN
    order = np.lexsort((b, a))
    xs, ys = a[order], b[order]
    n0 = n * (n - 1) / 2.0
    n1 = _tied_pairs(xs)
    n2 = _tied_pairs(np.sort(b))
    joint_change = np.flatnonzero((np.diff(xs) != 0) | (np.diff(ys) != 0)) + 1
    joint_runs = np.diff(np.concatenate(([0], joint_change, [n]))).astype(np.float64)
    n3 = float((joint_runs * (joint_runs - 1.0) / 2.0).sum())
    denominator = math.sqrt((n0 - n1) * (n0 - n2))
    if denominator == 0.0:
        return NAN
    discordant = float(count_inversions(ys))
    concordant = n0 - n1 - n2 + n3 - discordant
    return max(-1.0, min(1.0, (concordant - discordant) / denominator))


CORRELATIONS: dict[str, Callable[[ArrayLike, ArrayLike], float]] = {
    "spearman": spearman,
    "pearson": pearson,
    "kendall": kendall_tau_b,
}

# Variance factors of atanh(r) (Fieller, Hartley & Pearson 1957): 1/(n-3) for Pearson,
# 1.06/(n-3) for Spearman and 0.437/(n-4) for Kendall.
_FISHER = {"pearson": (1.0, 3), "spearman": (1.06, 3), "kendall": (0.437, 4)}


def correlation_interval(
    r: float, n: int, kind: str = "spearman", level: float = LEVEL
) -> tuple[float, float]:
    """Approximate interval of a correlation through Fisher's z (NaN when n is too small)."""
    factor, lost = _FISHER[kind]
    if math.isnan(r) or n <= lost:
        return NAN, NAN
    if abs(r) >= 1.0:
        return r, r
    half = z_value(level) * math.sqrt(factor / (n - lost))
    center = math.atanh(r)
    return math.tanh(center - half), math.tanh(center + half)


def _tie_groups(values: FloatArray) -> tuple[IntArray, int]:
    unique, groups = np.unique(settle(values), return_inverse=True)
    return groups.astype(np.int64).reshape(-1), int(unique.size)


def _resampled_ranks(groups: IntArray, n_groups: int, counts: FloatArray) -> FloatArray:
    # Average ranks within a resample, read off the original rows: a tie group holding w rows of
    # the resample, after b rows of smaller values, has the ranks b+1..b+w, averaging b+(w+1)/2.
    weight = np.bincount(groups, weights=counts, minlength=n_groups)
    before = np.cumsum(weight) - weight
    ranks: FloatArray = (before + (weight + 1.0) / 2.0)[groups]
    return ranks


def _weighted_pearson(x: FloatArray, y: FloatArray, weights: FloatArray) -> float:
    total = float(weights.sum())
    dx = x - float((weights * x).sum()) / total
    dy = y - float((weights * y).sum()) / total
    denominator = math.sqrt(float((weights * dx * dx).sum()) * float((weights * dy * dy).sum()))
    if denominator == 0.0:
        return NAN
    return float((weights * dx * dy).sum()) / denominator


def bootstrap_spearman(
    columns: Sequence[ArrayLike], y: ArrayLike, reps: int = BOOTSTRAP_REPS, seed: int = 0
) -> FloatArray:
    """Spearman of each column with ``y`` on ``reps`` shared resamples: shape (reps, columns).

    Rows with any NaN are dropped first. Each resample is a vector of row multiplicities, so
    re-ranking it takes two ``bincount`` calls instead of a sort: the statistic of every
    resample equals ``spearman`` applied to the resampled arrays themselves.
    """
    target = np.asarray(y, dtype=np.float64).reshape(-1)
    data = [np.asarray(c, dtype=np.float64).reshape(-1) for c in columns]
    keep = ~np.isnan(target)
    for column in data:
        if column.size != target.size:
            raise ValueError("every column needs one value per row of y")
        keep &= ~np.isnan(column)
    target = target[keep]
    data = [column[keep] for column in data]
    n = target.size
    out: FloatArray = np.full((reps, len(data)), np.nan)
    if n < 2:
        return out
    y_groups, y_count = _tie_groups(target)
    x_groups = [_tie_groups(column) for column in data]
    rng = _rng(seed)
    for rep in range(reps):
        counts = np.bincount(rng.integers(0, n, size=n), minlength=n).astype(np.float64)
        y_ranks = _resampled_ranks(y_groups, y_count, counts)
        for index, (groups, count) in enumerate(x_groups):
            out[rep, index] = _weighted_pearson(
                _resampled_ranks(groups, count, counts), y_ranks, counts
            )
    return out


# ---------------------------------------------------------------------------------------------
# One quantity with its uncertainty


@dataclass(frozen=True)
class Estimate:
    """A number with its standard error and interval; NaN everywhere when undefined (n = 0)."""

    value: float
    se: float
    low: float
    high: float
    n: int
    method: str

    @classmethod
    def empty(cls, method: str) -> Estimate:
        return cls(NAN, NAN, NAN, NAN, 0, method)


def wilson_interval(successes: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson's score interval of a proportion; stays inside [0, 1] and behaves at 0 and n."""
    if n <= 0:
        return NAN, NAN
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie in [0, n={n}], got {successes}")
    z = z_value(level)
    p = successes / n
    denominator = 1.0 + z * z / n
    center = (p + z * z / (2.0 * n)) / denominator
    half = z * math.sqrt(p * (1.0 - p) / n + z * z / (4.0 * n * n)) / denominator
    # At 0 and n the bound is exactly 0 or 1; the formula gets there only up to rounding.
    low = 0.0 if successes == 0 else max(0.0, center - half)
    high = 1.0 if successes == n else min(1.0, center + half)
    return low, high


def proportion(successes: int, n: int, level: float = LEVEL) -> Estimate:
    """A proportion with its binomial standard error sqrt(p(1-p)/n) and Wilson's interval."""
    if n <= 0:
        return Estimate.empty("wilson")
    p = successes / n
    low, high = wilson_interval(successes, n, level)
    return Estimate(p, math.sqrt(p * (1.0 - p) / n), low, high, n, "wilson")


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def bootstrap_means(
    values: ArrayLike, reps: int = BOOTSTRAP_REPS, seed: int = 0, *, chunk_cells: int = 2_000_000
) -> FloatArray:
    """Means of ``reps`` resamples (with replacement) of ``values``, drawn in bounded chunks."""
    data = np.asarray(values, dtype=np.float64).reshape(-1)
    n = data.size
    if n == 0:
        return np.full(reps, np.nan)
    rng = _rng(seed)
    per_chunk = max(1, chunk_cells // n)
    out: FloatArray = np.empty(reps, dtype=np.float64)
    for start in range(0, reps, per_chunk):
        stop = min(reps, start + per_chunk)
        draws = rng.integers(0, n, size=(stop - start, n))
        out[start:stop] = data[draws].mean(axis=1)
    return out


def bootstrap_statistic(
    statistic: Callable[[IntArray], float],
    n: int,
    reps: int = BOOTSTRAP_REPS,
    seed: int = 0,
) -> FloatArray:
    """``statistic`` of ``reps`` resamples; it receives the resampled row indices."""
    rng = _rng(seed)
    out: FloatArray = np.empty(reps, dtype=np.float64)
    for rep in range(reps):
        out[rep] = statistic(rng.integers(0, n, size=n))
    return out


def percentile_interval(replicates: ArrayLike, level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval of bootstrap replicates (NaN replicates ignored)."""
    data = np.asarray(replicates, dtype=np.float64)
    finite = data[np.isfinite(data)]
    if finite.size == 0:
        return NAN, NAN
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(finite, [tail, 1.0 - tail])
    return float(low), float(high)


def mean_estimate(
    values: ArrayLike, level: float = LEVEL, reps: int = BOOTSTRAP_REPS, seed: int = 0
) -> Estimate:
    """A mean with its standard error s/sqrt(n) and a bootstrap percentile interval (the
    values, e.g. reciprocal ranks, are bounded and skewed, so no normal shape is assumed)."""
    data = np.asarray(values, dtype=np.float64).reshape(-1)
    data = data[~np.isnan(data)]
    n = data.size
    if n == 0:
        return Estimate.empty("bootstrap")
    se = float(data.std(ddof=1) / math.sqrt(n)) if n > 1 else NAN
    low, high = percentile_interval(bootstrap_means(data, reps, seed), level)
    return Estimate(float(data.mean()), se, low, high, n, "bootstrap")


def statistic_estimate(
    statistic: Callable[[IntArray], float],
    n: int,
    level: float = LEVEL,
    reps: int = BOOTSTRAP_REPS,
    seed: int = 0,
) -> Estimate:
    """Any statistic of n rows with a bootstrap standard error and percentile interval."""
    if n == 0:
        return Estimate.empty("bootstrap")
    value = statistic(np.arange(n, dtype=np.int64))
    replicates = bootstrap_statistic(statistic, n, reps, seed)
    finite = replicates[np.isfinite(replicates)]
    se = float(finite.std(ddof=1)) if finite.size > 1 else NAN
    low, high = percentile_interval(replicates, level)
    return Estimate(value, se, low, high, n, "bootstrap")


# ---------------------------------------------------------------------------------------------
# Is a difference real?


@dataclass(frozen=True)
class DifferenceTest:
    """B minus A, its interval, a two-sided p-value and what the samples could have shown.

    ``minimum_detectable``: the smallest true difference these sample sizes detect with 80%
    power at the test's level; ``needed_per_group``: the sample size per group that would
    detect the observed difference so (None when it is 0 or undefined).
    """

    a: float
    b: float
    difference: float
    low: float
    high: float
    p_value: float
    n_a: int
    n_b: int
    minimum_detectable: float
    needed_per_group: int | None
    method: str
    level: float = LEVEL

    @property
    def real(self) -> bool:
        return bool(not math.isnan(self.p_value) and self.p_value < 1.0 - self.level)

    @property
    def verdict(self) -> str:
        if math.isnan(self.difference):
            return "not enough data"
        if self.real:
            return "real"
        return (
            f"not distinguishable at n={self.n_a}/{self.n_b} "
            f"(smallest detectable: {self.minimum_detectable:.3f})"
        )


def _needed(diff: float, variance_sum_per_unit: float, level: float, power: float) -> int | None:
    # n per group such that (z_a + z_b) * sqrt(variance_sum_per_unit / n) = |diff|
    if math.isnan(diff) or diff == 0.0 or variance_sum_per_unit <= 0.0:
        return None
    z = z_value(level) + _NORMAL.inv_cdf(power)
    return math.ceil(z * z * variance_sum_per_unit / (diff * diff))


def minimum_detectable_difference(
    p: float, n_a: int, n_b: int, level: float = LEVEL, power: float = POWER
) -> float:
    """Smallest difference between two proportions near ``p`` that samples of n_a and n_b
    detect with ``power``: (z_{1-a/2} + z_power) * sqrt(p(1-p)(1/n_a + 1/n_b))."""
    if n_a <= 0 or n_b <= 0 or math.isnan(p):
        return NAN
    z = z_value(level) + _NORMAL.inv_cdf(power)
    return z * math.sqrt(p * (1.0 - p) * (1.0 / n_a + 1.0 / n_b))


def two_proportion_test(
    successes_a: int, n_a: int, successes_b: int, n_b: int, level: float = LEVEL
) -> DifferenceTest:
    """Pooled two-proportion z test of B - A with Newcombe's hybrid score interval."""
    if n_a <= 0 or n_b <= 0:
        return DifferenceTest(
            NAN, NAN, NAN, NAN, NAN, NAN, max(n_a, 0), max(n_b, 0), NAN, None, "two-proportion z"
        )
    pa, pb = successes_a / n_a, successes_b / n_b
    diff = pb - pa
    la, ua = wilson_interval(successes_a, n_a, level)
    lb, ub = wilson_interval(successes_b, n_b, level)
    low = diff - math.sqrt((pb - lb) ** 2 + (ua - pa) ** 2)
    high = diff + math.sqrt((ub - pb) ** 2 + (pa - la) ** 2)
    pooled = (successes_a + successes_b) / (n_a + n_b)
    se0 = math.sqrt(pooled * (1.0 - pooled) * (1.0 / n_a + 1.0 / n_b))
    # Both samples all-0 or all-1: no variation, so nothing to reject.
    p_value = two_sided_p(diff / se0) if se0 > 0 else 1.0
    return DifferenceTest(
        a=pa,
        b=pb,
        difference=diff,
        low=low,
        high=high,
        p_value=p_value,
        n_a=n_a,
        n_b=n_b,
        minimum_detectable=minimum_detectable_difference(pooled, n_a, n_b, level),
        needed_per_group=_needed(diff, 2.0 * pooled * (1.0 - pooled), level, POWER),
        method="two-proportion z, Newcombe interval",
        level=level,
    )


def mean_difference_test(
    a: ArrayLike,
    b: ArrayLike,
    level: float = LEVEL,
    reps: int = BOOTSTRAP_REPS,
    seed: int = 0,
) -> DifferenceTest:
    """Difference of two independent means (B - A) by bootstrap: percentile interval, and the
    two-sided p-value as twice the share of replicates on the far side of 0 (so p < 1 - level
    exactly when the interval excludes 0)."""
    xa = np.asarray(a, dtype=np.float64).reshape(-1)
    xb = np.asarray(b, dtype=np.float64).reshape(-1)
    xa, xb = xa[~np.isnan(xa)], xb[~np.isnan(xb)]
    if xa.size == 0 or xb.size == 0:
        return DifferenceTest(
            NAN, NAN, NAN, NAN, NAN, NAN, int(xa.size), int(xb.size), NAN, None, "bootstrap"
        )
    diff = float(xb.mean() - xa.mean())
    replicates = bootstrap_means(xb, reps, seed + 1) - bootstrap_means(xa, reps, seed)
    low, high = percentile_interval(replicates, level)
    below = (np.count_nonzero(replicates <= 0.0) + 1) / (reps + 1)
    above = (np.count_nonzero(replicates >= 0.0) + 1) / (reps + 1)
    p_value = min(1.0, 2.0 * min(below, above))
    var_a = float(xa.var(ddof=1)) if xa.size > 1 else 0.0
    var_b = float(xb.var(ddof=1)) if xb.size > 1 else 0.0
    z = z_value(level) + _NORMAL.inv_cdf(POWER)
    detectable = z * math.sqrt(var_a / xa.size + var_b / xb.size)
    return DifferenceTest(
        a=float(xa.mean()),
        b=float(xb.mean()),
        difference=diff,
        low=low,
        high=high,
        p_value=p_value,
        n_a=int(xa.size),
        n_b=int(xb.size),
        minimum_detectable=detectable,
        needed_per_group=_needed(diff, var_a + var_b, level, POWER),
        method="bootstrap difference of means",
        level=level,
    )


def _binomial_two_sided(k: int, n: int) -> float:
    # Exact two-sided sign test at p = 1/2: twice the smaller tail, capped at 1.
    if n == 0:
        return 1.0
    smaller = min(k, n - k)
    tail = sum(math.comb(n, i) for i in range(smaller + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


def mcnemar_test(
    only_a: int, only_b: int, both: int, neither: int, level: float = LEVEL
) -> DifferenceTest:
    """Paired proportions (the same questions under A and B): McNemar's exact test on the
    discordant pairs, with a Wald interval of the paired difference (B - A)."""
    n = only_a + only_b + both + neither
    if n == 0:
        return DifferenceTest(NAN, NAN, NAN, NAN, NAN, NAN, 0, 0, NAN, None, "McNemar exact")
    pa, pb = (only_a + both) / n, (only_b + both) / n
    diff = (only_b - only_a) / n
    spread = math.sqrt(max(0.0, (only_a + only_b) - (only_b - only_a) ** 2 / n)) / n
    z = z_value(level)
    discordant = only_a + only_b
    detect_z = z + _NORMAL.inv_cdf(POWER)
    return DifferenceTest(
        a=pa,
        b=pb,
        difference=diff,
        low=diff - z * spread,
        high=diff + z * spread,
        p_value=_binomial_two_sided(only_b, discordant),
        n_a=n,
        n_b=n,
        minimum_detectable=detect_z * math.sqrt(discordant) / n if discordant else NAN,
        needed_per_group=_needed(diff, discordant / n, level, POWER),
        method="McNemar exact (paired)",
        level=level,
    )


# ---------------------------------------------------------------------------------------------
# Agreement


@dataclass(frozen=True)
class Kappa:
    """Cohen's kappa with the large-sample standard error of Fleiss, Cohen & Everitt (1969)."""

    kappa: float
    se: float
    low: float
    high: float
    observed_agreement: float
    chance_agreement: float
    n: int


def cohens_kappa(table: ArrayLike, level: float = LEVEL) -> Kappa:
    """Kappa of a square contingency table (rows: rater 1, columns: rater 2).

    Undefined (NaN) when the raters agree by chance alone with certainty (p_e = 1), e.g. both
    always say "relevant". The interval treats the rated items as independent.
    """
    counts = np.asarray(table, dtype=np.float64)
    if counts.ndim != 2 or counts.shape[0] != counts.shape[1]:
        raise ValueError(f"table must be square, got shape {counts.shape}")
    n = float(counts.sum())
    if n <= 0:
        return Kappa(NAN, NAN, NAN, NAN, NAN, NAN, 0)
    p = counts / n
    rows, cols = p.sum(axis=1), p.sum(axis=0)
    observed = float(np.trace(p))
    chance = float(rows @ cols)
    if chance >= 1.0:
        return Kappa(NAN, NAN, NAN, NAN, observed, chance, int(n))
    kappa = (observed - chance) / (1.0 - chance)
    diagonal = np.diag(p) * (1.0 - (rows + cols) * (1.0 - kappa)) ** 2
    # Off-diagonal cell (i, j) weighs (p_.i + p_j.)^2: column total of i plus row total of j.
    weights = (cols[:, None] + rows[None, :]) ** 2
    off = p * weights
    np.fill_diagonal(off, 0.0)
    variance = (
        float(diagonal.sum())
        + (1.0 - kappa) ** 2 * float(off.sum())
        - (kappa - chance * (1.0 - kappa)) ** 2
    ) / (n * (1.0 - chance) ** 2)
    se = math.sqrt(max(variance, 0.0))
    half = z_value(level) * se
    return Kappa(
        kappa=kappa,
        se=se,
        low=max(-1.0, kappa - half),
        high=min(1.0, kappa + half),
        observed_agreement=observed,
        chance_agreement=chance,
        n=int(n),
    )
