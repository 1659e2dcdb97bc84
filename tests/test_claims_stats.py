"""The statistics of benchmarks.claims (issue 38, item 1): intervals with known values, the bootstrap's
coverage on synthetic data, the verdict rules at their boundaries."""

import numpy as np
import pytest

from benchmarks.claims.stats import (delta_method_ratio_interval, paired_t_interval, ratio_of_means_interval,
                                     verdict)


def test_paired_t_interval_of_a_known_sample():
    # mean 3, sd sqrt(2.5), t_{0.975,4} = 2.776445: half-width 2.776445 * 1.581139 / sqrt(5) = 1.963243
    mean, lo, hi = paired_t_interval([1, 2, 3, 4, 5])
    assert mean == pytest.approx(3.0)
    assert lo == pytest.approx(1.036757, abs=1e-6)
    assert hi == pytest.approx(4.963243, abs=1e-6)


def test_paired_t_interval_90_percent_is_narrower():
    _, lo, hi = paired_t_interval([1, 2, 3, 4, 5], level=0.90)  # t_{0.95,4} = 2.131847
    assert (lo, hi) == pytest.approx((3 - 1.507443, 3 + 1.507443), abs=1e-6)


@pytest.mark.parametrize("bad", [[1.0], [1.0, float("nan")], [[1.0, 2.0]]])
def test_paired_t_interval_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        paired_t_interval(bad)


def test_ratio_is_the_ratio_of_means_not_the_mean_of_ratios():
    # ratio of means (2+2)/(1+4) = 0.8; the mean of per-seed ratios would be (2 + 0.5)/2 = 1.25
    est, lo, hi = ratio_of_means_interval([2.0, 2.0], [1.0, 4.0], n_resamples=2000)
    assert est == pytest.approx(0.8)
    assert lo <= 0.8 <= hi


def test_ratio_bootstrap_is_paired_over_seeds():
    # a large seed effect shared by both arms: paired resampling sees a tight ratio of ~2, an
    # unpaired bootstrap (arms resampled independently) would span roughly [1.3, 3]
    rng = np.random.default_rng(7)
    seed_effect = rng.uniform(1, 10, size=12)
    t = 2 * seed_effect * rng.normal(1, 0.01, 12)
    est, lo, hi = ratio_of_means_interval(t, seed_effect)
    assert est == pytest.approx(2.0, abs=0.03)
    assert hi - lo < 0.06


def _studies(n_seeds, n_studies=400, sigma=0.3, seed=11):
    """Synthetic 2-arm studies: lognormal times around 3 s (baseline) and 1 s (treatment) with a
    seed effect both arms share; the true ratio of mean times is exactly 3."""
    rng = np.random.default_rng(seed)
    for _ in range(n_studies):
        common = rng.normal(0, 0.2, n_seeds)
        yield 3 * np.exp(common + rng.normal(0, sigma, n_seeds)), np.exp(common + rng.normal(0, sigma, n_seeds))


def test_delta_method_covers_the_true_ratio_about_95_percent_with_5_seeds():
    covered = sum(lo <= 3.0 <= hi for base, treat in _studies(5)
                  for _, lo, hi in [delta_method_ratio_interval(base, treat)])
    assert 0.90 <= covered / 400 <= 0.975, covered  # measured 0.93; a z quantile or unpaired variance falls outside


def test_bootstrap_undercovers_with_5_seeds_which_is_why_speed_designs_use_the_delta_method():
    covered = sum(lo <= 3.0 <= hi for i, (base, treat) in enumerate(_studies(5, n_studies=200))
                  for _, lo, hi in [ratio_of_means_interval(base, treat, n_resamples=1000, rng_seed=i)])
    assert covered / 200 < 0.88, covered  # measured ~0.81


def test_bootstrap_covers_about_95_percent_with_20_seeds():
    covered = sum(lo <= 3.0 <= hi for i, (base, treat) in enumerate(_studies(20, n_studies=200, seed=5))
                  for _, lo, hi in [ratio_of_means_interval(base, treat, n_resamples=1000, rng_seed=i)])
    assert 0.87 <= covered / 200 <= 0.985, covered


def test_bootstrap_agrees_with_the_delta_method_on_a_large_sample():
    rng = np.random.default_rng(3)
    a = rng.normal(10, 1, 400)
    b = rng.normal(4, 0.5, 400)
    _, blo, bhi = ratio_of_means_interval(a, b, n_resamples=4000)
    r, dlo, dhi = delta_method_ratio_interval(a, b)  # t_{399} ~ z: first order agrees with the bootstrap
    assert r == pytest.approx(a.mean() / b.mean())
    assert blo == pytest.approx(dlo, abs=0.02) and bhi == pytest.approx(dhi, abs=0.02)


def test_ratio_interval_is_reproducible_from_its_rng_seed():
    a, b = [3.1, 2.9, 3.4, 3.0, 2.7], [1.0, 1.1, 0.9, 1.2, 1.0]
    assert ratio_of_means_interval(a, b, rng_seed=5) == ratio_of_means_interval(a, b, rng_seed=5)


@pytest.mark.parametrize("fn", [ratio_of_means_interval, delta_method_ratio_interval])
def test_ratio_rejects_a_non_positive_denominator_and_unequal_lengths(fn):
    with pytest.raises(ValueError, match="denominator"):
        fn([1, 2], [1, 0])
    with pytest.raises(ValueError, match="length"):
        fn([1, 2, 3], [1, 2])


def test_delta_method_interval_of_a_known_sample():
    # a = [2, 4, 6], b = [1, 2, 2]: R = 12/5 = 2.4; Var(a)=4, Var(b)=1/3, Cov=1;
    # var = (4 - 4.8 + 5.76/3) / (3 * (5/3)^2) = 1.12 / 8.3333 = 0.1344; t_{0.975,2} = 4.302653
    r, lo, hi = delta_method_ratio_interval([2, 4, 6], [1, 2, 2])
    half = 4.302653 * 0.1344 ** 0.5
    assert r == pytest.approx(2.4)
    assert (lo, hi) == pytest.approx((2.4 - half, 2.4 + half), abs=1e-5)


@pytest.mark.parametrize("kind,lo,hi,margin,expected", [
    # superiority / speed: shown iff lo > m, not shown iff hi < m (strict at the boundary)
    ("paired_difference", 0.01, 2.0, 0.0, "shown"),
    ("paired_difference", 0.0, 2.0, 0.0, "inconclusive"),
    ("paired_difference", -2.0, -0.01, 0.0, "not shown"),
    ("paired_difference", -2.0, 0.0, 0.0, "inconclusive"),
    ("speed_ratio", 1.51, 2.0, 1.5, "shown"),
    ("speed_ratio", 1.5, 2.0, 1.5, "inconclusive"),
    ("speed_ratio", 1.1, 1.49, 1.5, "not shown"),
    # non-inferiority, margin 2 points: the loss (-lo) must stay below 2
    ("non_inferiority", -1.99, 3.0, 2.0, "shown"),
    ("non_inferiority", -2.0, 3.0, 2.0, "inconclusive"),
    ("non_inferiority", -5.0, -2.01, 2.0, "not shown"),
    # equivalence, margin 0.01: the whole interval inside (-m, m)
    ("equivalence", -0.009, 0.009, 0.01, "shown"),
    ("equivalence", -0.01, 0.009, 0.01, "inconclusive"),
    ("equivalence", 0.011, 0.02, 0.01, "not shown"),
    ("equivalence", -0.03, -0.011, 0.01, "not shown"),
    ("equivalence", -0.02, 0.02, 0.01, "inconclusive"),
])
def test_verdict_rules_at_their_boundaries(kind, lo, hi, margin, expected):
    assert verdict(kind, lo, hi, margin, seeds_run=5, seeds_planned=5) == expected


def test_verdict_is_incomplete_until_every_registered_seed_ran():
    assert verdict("paired_difference", 1.0, 2.0, 0.0, seeds_run=4, seeds_planned=5) == "incomplete"
    assert verdict("paired_difference", None, None, 0.0, seeds_run=5, seeds_planned=5) == "inconclusive"


def test_verdict_rejects_unknown_kind_and_negative_margin():
    with pytest.raises(ValueError, match="kind"):
        verdict("superiority", 0, 1, 0, 1, 1)
    with pytest.raises(ValueError, match="margin"):
        verdict("non_inferiority", 0, 1, -1, 1, 1)
