"""The D-CPT Law bootstrap resamples a unit that varies, and says when its intervals are not intervals
(ops.mixture.law.heldout, issue 39 item 3).

Before: with one run per model size (a grid at one ratio) the run bootstrap drew the same points every
time, so every refit was the full fit and the intervals had zero width, with no warning; on 25
synthetic Chinchilla points at 1% noise they covered none of the five true parameters.
"""

from __future__ import annotations

import numpy as np
import pytest

from ops.mixture import law

TRUE = {"E": 1.8, "A": 60.0, "alpha": 0.34, "B": 300.0, "beta": 0.28}


def chinchilla_points(k: int = 5, noise: float = 0.01, seed: int = 0) -> dict:
    """k sizes x k token counts of the Chinchilla form at one ratio (one run per size), log-normal noise."""
    N, D = (a.ravel() for a in np.meshgrid(np.geomspace(1e5, 1e8, k), np.geomspace(1e6, 1e9, k), indexing="ij"))
    mu = law.FORMS["chinchilla"].predict(TRUE, N, D, np.zeros_like(N))
    y = mu * np.exp(np.random.default_rng(seed).normal(0.0, noise, mu.size))
    return {"n_params": N, "tokens": D, "domain_ratio": np.full(N.size, 0.5), "loss_general": y}


def test_one_run_per_size_resamples_residuals_and_the_intervals_have_width():
    pts = chinchilla_points()
    boot = law.bootstrap(pts, "general", "chinchilla", n_boot=8, seed=0, n_grid=1, n_starts=0)
    assert boot.unit == "residuals" and len(boot.fits) == 8
    iv = boot.intervals(95)
    for k in TRUE:
        assert iv[k][1] > iv[k][0] * (1 + 1e-4), (k, iv[k])          # not the zero width of identical refits
    assert len({round(f.params["alpha"], 9) for f in boot.fits}) == 8  # every resample differs
    with pytest.raises(ValueError, match=r"unit 'runs' cannot vary here: every model size has exactly one run"):
        law.bootstrap(pts, "general", "chinchilla", n_boot=2, unit="runs")
    with pytest.raises(ValueError, match=r"unit must be one of \('auto', 'runs', 'residuals'\), got 'points'"):
        law.bootstrap(pts, "general", "chinchilla", n_boot=2, unit="points")


def test_an_exact_fit_leaves_nothing_to_resample_and_is_refused():
    pts = chinchilla_points(noise=0.0)
    with pytest.raises(ValueError, match="residuals are all zero"):
        law.bootstrap(pts, "general", "chinchilla", n_boot=2)


def test_a_fit_with_a_parameter_on_a_bound_quotes_no_interval():
    """E forced onto its bound (E in [2.5, 3.0], truth 1.8): the fit is labelled not identified, its
    summary lists E and gives the refits' range under another name, not as lo/hi."""
    pts = chinchilla_points(seed=3)
    boot = law.bootstrap(pts, "general", "chinchilla", n_boot=4, seed=0, n_grid=1, n_starts=0,
                         bounds={"E": (2.5, 3.0)})
    assert boot.identified is False and boot.not_identified() == {"E": "lower"}
    s = boot.summary()
    assert s["identified"] is False and s["not_identified"] == {"E": "lower"} and s["unit"] == "residuals"
    for k, p in s["params"].items():
        assert p["lo"] is None and p["hi"] is None and len(p["refit_range"]) == 2, k
    assert s["params"]["E"]["value"] == pytest.approx(2.5)
    free = law.bootstrap(pts, "general", "chinchilla", n_boot=4, seed=0, n_grid=1, n_starts=0).summary()
    assert free["identified"] is True and free["params"]["E"]["lo"] < free["params"]["E"]["hi"]


@pytest.mark.slow
def test_residual_bootstrap_intervals_cover_the_truth_in_90_percent_of_100_fits():
    """Slow (~50 s on 2 shared cores): 100 simulated data sets of 49 Chinchilla points (7 sizes x 7
    token counts, one run per size, 1% log-normal noise, default Huber delta), each bootstrapped with
    100 residual refits; every parameter's 95% interval must cover its true value in >= 90 of the 100
    fits. Measured (2026-12-06): E 0.96, A 0.92, alpha 0.92, B 0.94, beta 0.94 (with numpy's default
    percentile positions instead of Weibull's: 0.93/0.89/0.89/0.89/0.90, which fails) -- docs/mixture.md,
    "Bootstrap coverage"."""
    hits = dict.fromkeys(TRUE, 0)
    for i in range(100):
        pts = chinchilla_points(k=7, seed=1000 + i)
        iv = law.bootstrap(pts, "general", "chinchilla", n_boot=100, seed=i, n_grid=1, n_starts=0).intervals(95)
        for k in TRUE:
            hits[k] += iv[k][0] <= TRUE[k] <= iv[k][1]
    assert all(h >= 90 for h in hits.values()), hits
