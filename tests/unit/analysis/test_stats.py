"""The analysis statistics against scipy (a test-only reference) and published values."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sp  # type: ignore[import-untyped]

from service.analysis import stats

RNG_SEEDS = range(8)


def _samples(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    # Ties on both sides, as response grades (1-5) and measures such as precision have.
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 4, n).astype(float)
    y = rng.integers(1, 6, n) + (rng.random(n) < 0.3) * rng.random(n)
    return x, y


@pytest.mark.parametrize("n", [2, 3, 7, 50, 400])
@pytest.mark.parametrize("seed", RNG_SEEDS)
def test_correlations_match_scipy_with_ties(n: int, seed: int) -> None:
    x, y = _samples(seed, n)
    expected = {
        "spearman": sp.spearmanr(x, y).statistic,
        "pearson": sp.pearsonr(x, y).statistic if n > 2 else np.corrcoef(x, y)[0, 1],
        "kendall": sp.kendalltau(x, y, variant="b").statistic,
    }
    for name, function in stats.CORRELATIONS.items():
        got = function(x, y)
        if np.isnan(expected[name]):
            assert math.isnan(got), name
        else:
            assert got == pytest.approx(float(expected[name]), abs=1e-12), name


def test_correlations_match_scipy_on_continuous_data() -> None:
    rng = np.random.default_rng(11)
    x = rng.normal(size=3000)
    y = 0.4 * x + rng.normal(size=3000)
    assert stats.pearson(x, y) == pytest.approx(sp.pearsonr(x, y).statistic, abs=1e-12)
    assert stats.spearman(x, y) == pytest.approx(sp.spearmanr(x, y).statistic, abs=1e-12)
    assert stats.kendall_tau_b(x, y) == pytest.approx(sp.kendalltau(x, y).statistic, abs=1e-12)


def test_correlations_drop_pairs_with_a_missing_value_and_refuse_constants() -> None:
    x = [1.0, 2.0, np.nan, 4.0, 5.0]
    y = [2.0, 1.0, 3.0, np.nan, 7.0]
    kept_x, kept_y = [1.0, 2.0, 5.0], [2.0, 1.0, 7.0]
    assert stats.spearman(x, y) == pytest.approx(sp.spearmanr(kept_x, kept_y).statistic)
    assert stats.kendall_tau_b(x, y) == pytest.approx(sp.kendalltau(kept_x, kept_y).statistic)
    for function in stats.CORRELATIONS.values():
        assert math.isnan(function([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
        assert math.isnan(function([1.0], [2.0]))
    with pytest.raises(ValueError, match="differ in length"):
        stats.pearson([1.0, 2.0], [1.0])


def test_count_inversions_matches_brute_force() -> None:
    rng = np.random.default_rng(3)
    for n in [0, 1, 2, 5, 16, 17, 100]:
        values = rng.integers(0, 6, n)
        brute = sum(1 for i, j in itertools.combinations(range(n), 2) if values[i] > values[j])
        assert stats.count_inversions(values) == brute


def test_rankdata_averages_ties_like_scipy() -> None:
    values = [3.0, 1.0, 3.0, 2.0, 3.0, 1.0]
    assert stats.rankdata(values).tolist() == sp.rankdata(values).tolist()


def test_fisher_interval_of_pearson_matches_scipy() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=60)
    y = 0.5 * x + rng.normal(size=60)
    result = sp.pearsonr(x, y)
    low, high = stats.correlation_interval(float(result.statistic), 60, "pearson")
    expected = result.confidence_interval(0.95)
    assert low == pytest.approx(expected.low, abs=1e-9)
    assert high == pytest.approx(expected.high, abs=1e-9)
    too_few = stats.correlation_interval(0.3, 3, "spearman")
    assert math.isnan(too_few[0])
    assert math.isnan(too_few[1])


# Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I, method 3.
@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_interval_reproduces_newcombe(
    successes: int, n: int, low: float, high: float
) -> None:
    got = stats.wilson_interval(successes, n)
    assert got[0] == pytest.approx(low, abs=5e-5)
    assert got[1] == pytest.approx(high, abs=5e-5)


def test_wilson_interval_matches_scipy_and_stays_in_bounds() -> None:
    for successes, n in [(39, 50), (0, 7), (7, 7), (1, 1000), (500, 1000)]:
        expected = sp.binomtest(successes, n).proportion_ci(0.95, method="wilson")
        low, high = stats.wilson_interval(successes, n)
        assert low == pytest.approx(expected.low)
        assert high == pytest.approx(expected.high)
        assert 0.0 <= low <= successes / n <= high <= 1.0
    assert stats.wilson_interval(0, 5)[0] == 0.0
    assert stats.wilson_interval(5, 5)[1] == 1.0


def test_proportion_carries_the_articles_standard_error() -> None:
    # The article: sqrt(0.78 * 0.22 / 50) = 0.0586, "two standard errors is about 12 points".
    estimate = stats.proportion(39, 50)
    assert estimate.value == pytest.approx(0.78)
    assert estimate.se == pytest.approx(0.0586, abs=5e-5)
    assert 2 * estimate.se == pytest.approx(0.12, abs=0.005)
    assert math.isnan(stats.proportion(0, 0).value)


def test_two_proportion_test_agrees_with_chi_square_and_the_article() -> None:
    # The pooled z test is the uncorrected chi-square test of the 2x2 table.
    test = stats.two_proportion_test(39, 50, 43, 50)
    table = [[39, 11], [43, 7]]
    expected = sp.chi2_contingency(table, correction=False).pvalue
    assert test.p_value == pytest.approx(expected, rel=1e-9)
    assert test.difference == pytest.approx(0.08)
    # The article: 50 questions are "not enough to declare a 3 point improvement real".
    small = stats.two_proportion_test(39, 50, 40, 50)
    assert not small.real
    assert small.minimum_detectable > 0.2
    assert small.needed_per_group is not None
    assert small.needed_per_group > 2000
    assert "not distinguishable" in small.verdict
    large = stats.two_proportion_test(7800, 10000, 8100, 10000)
    assert large.real
    assert large.verdict == "real"
    assert large.low > 0


def test_newcombe_difference_interval_reproduces_the_published_example() -> None:
    # Newcombe (1998), "Interval estimation for the difference between independent
    # proportions", example (a): 56/70 - 48/80, method 10: 0.0524 to 0.3339.
    test = stats.two_proportion_test(48, 80, 56, 70)
    assert test.difference == pytest.approx(0.2)
    assert test.low == pytest.approx(0.0524, abs=5e-5)
    assert test.high == pytest.approx(0.3339, abs=5e-5)


def test_mcnemar_uses_the_exact_binomial_on_discordant_pairs() -> None:
    test = stats.mcnemar_test(only_a=3, only_b=12, both=30, neither=5)
    assert test.p_value == pytest.approx(sp.binomtest(12, 15, 0.5).pvalue)
    assert test.difference == pytest.approx(9 / 50)
    assert test.real
    assert not stats.mcnemar_test(5, 6, 30, 9).real


def test_cohens_kappa_point_value_and_standard_error() -> None:
    # 50 items: both say yes 20, only rater 1 yes 5, only rater 2 yes 10, both no 15:
    # p_o = 0.7, p_e = 0.5 * 0.6 + 0.5 * 0.4 = 0.5, kappa = 0.4.
    table = np.array([[20, 5], [10, 15]])
    result = stats.cohens_kappa(table)
    assert result.kappa == pytest.approx(0.4)
    assert result.observed_agreement == pytest.approx(0.7)
    assert result.chance_agreement == pytest.approx(0.5)
    # The closed-form standard error against the spread of kappa over resampled tables.
    rng = np.random.default_rng(1)
    draws = rng.multinomial(50, (table / 50).ravel(), size=20000).reshape(-1, 2, 2)
    kappas = [stats.cohens_kappa(d).kappa for d in draws]
    assert result.se == pytest.approx(float(np.nanstd(kappas)), rel=0.06)
    assert result.low == pytest.approx(0.4 - 1.959964 * result.se)


def test_cohens_kappa_edges() -> None:
    perfect = stats.cohens_kappa([[10, 0], [0, 30]])
    assert perfect.kappa == pytest.approx(1.0)
    assert perfect.high == 1.0
    assert math.isnan(stats.cohens_kappa([[10, 0], [0, 0]]).kappa)
    assert math.isnan(stats.cohens_kappa([[0, 0], [0, 0]]).kappa)
    with pytest.raises(ValueError, match="square"):
        stats.cohens_kappa([[1, 2, 3]])


def test_bootstrap_mean_interval_is_reproducible_and_covers_at_its_level() -> None:
    rng = np.random.default_rng(2)
    values = rng.exponential(size=40)
    first = stats.mean_estimate(values, seed=9)
    assert first == stats.mean_estimate(values, seed=9)
    assert first.se == pytest.approx(values.std(ddof=1) / math.sqrt(40))
    covered = 0
    trials = 300
    for trial in range(trials):
        sample = rng.binomial(1, 0.3, size=60).astype(float)
        estimate = stats.mean_estimate(sample, reps=500, seed=trial)
        covered += estimate.low <= 0.3 <= estimate.high
    assert 0.88 <= covered / trials <= 0.99


def test_mean_difference_test_separates_a_real_shift_from_noise() -> None:
    rng = np.random.default_rng(4)
    a = rng.normal(0.0, 1.0, 400)
    shifted = stats.mean_difference_test(a, rng.normal(0.5, 1.0, 400))
    assert shifted.real
    assert shifted.low > 0
    same = stats.mean_difference_test(a, rng.normal(0.0, 1.0, 400))
    assert not same.real
    assert same.low < 0 < same.high
    # The p-value and the interval say the same thing.
    assert (same.p_value < 0.05) == (same.low > 0 or same.high < 0)
    assert math.isnan(stats.mean_difference_test([], [1.0]).difference)


def test_statistic_estimate_bootstraps_any_statistic() -> None:
    values = np.arange(100, dtype=float)
    median = stats.statistic_estimate(lambda rows: float(np.median(values[rows])), 100, seed=1)
    assert median.value == pytest.approx(49.5)
    assert median.low < 49.5 < median.high
    assert median.method == "bootstrap"


def test_bootstrap_spearman_equals_spearman_of_the_resampled_rows() -> None:
    x, y = _samples(6, 80)
    z = np.round(x + np.random.default_rng(6).normal(size=80))
    replicates = stats.bootstrap_spearman([x, z], y, reps=25, seed=3)
    # Replay the same resamples explicitly and rank them the slow way.
    rng = np.random.default_rng(3)
    for rep in range(25):
        rows = rng.integers(0, 80, size=80)
        assert replicates[rep, 0] == pytest.approx(stats.spearman(x[rows], y[rows]), abs=1e-12)
        assert replicates[rep, 1] == pytest.approx(stats.spearman(z[rows], y[rows]), abs=1e-12)
    with pytest.raises(ValueError, match="one value per row"):
        stats.bootstrap_spearman([x[:5]], y)
