"""D-CPT Law identification, noise ceiling and comparison forms (ops.mixture.law): E is interior
and recovered on a synthetic law, the noise ceiling of repeated runs matches its analytic value,
the Data Mixing Law and BiMix recover their own generating parameters, bootstrap intervals cover
the truth, and the cross-domain K stays inside its bounds.

Probe grids mimic the real probes (docs/mixture.md): 4 sizes spanning ~70x, 5 ratios including 0
and 1, 6 doubling checkpoints from 4,096 tokens.
"""

from __future__ import annotations


import numpy as np
import pytest

from ops.mixture import law
from tests.conftest import stack_domains

SIZES = (6592.0, 25472.0, 150080.0, 447552.0)
RATIOS = (0.0, 0.25, 0.5, 0.75, 1.0)
TOKENS = tuple(4096.0 * 2.0**k for k in range(6))
# L3 with the floor E at r = 1 (the r term is anchored there): docs/mixture.md, "Identification".
TRUE_L3 = dict(E=3.0, A=12.0, alpha=0.25, B=40.0, eta=0.3, beta=0.35, C=0.5, gamma=0.5, eps=0.02)
TRUE_DML = dict(E=2.0, A=30.0, alpha=0.3, B=60.0, beta=0.35, t=-1.2)
TRUE_BIMIX = dict(E=2.5, A=30.0, alpha=0.3, B=50.0, beta=0.35, gamma=0.15, eps=0.05)


def grid(sizes=SIZES, tokens=TOKENS, ratios=RATIOS):
    return (a.ravel() for a in np.meshgrid(sizes, tokens, ratios, indexing="ij"))


def points(form: str, params: dict, noise: float = 0.0, seed: int = 0, n_seeds: int = 1, **grid_kw):
    """Domain-loss probe points of ``form`` with multiplicative log-normal noise; ``n_seeds``
    repeated runs per configuration (a ``seed`` column when > 1)."""
    N, D, R = grid(**grid_kw)
    mu = law.FORMS[form].predict(params, N, D, R)
    rng = np.random.default_rng(seed)
    out = {k: np.tile(v, n_seeds) for k, v in {"n_params": N, "tokens": D, "domain_ratio": R}.items()}
    out["loss_domain"] = np.tile(mu, n_seeds) * np.exp(rng.normal(0.0, noise, mu.size * n_seeds))
    if n_seeds > 1:
        out["seed"] = np.repeat(np.arange(n_seeds), mu.size)
    return out


# ---------------------------------------------------------------------------------------------
# Identification of E


def test_l3_floor_is_interior_and_recovered_under_noise():
    fit = law.fit_law(points("L3", TRUE_L3, noise=0.003, seed=1), "domain")
    assert fit.at_bound["E"] is None  # interior: neither 1e-3 nor the smallest loss
    assert fit.params["E"] == pytest.approx(TRUE_L3["E"], rel=0.05)
    assert fit.params["alpha"] == pytest.approx(TRUE_L3["alpha"], abs=0.03)
    assert fit.params["beta"] == pytest.approx(TRUE_L3["beta"], abs=0.03)
    assert set(fit.at_bound) == set(law.FORMS["L3"].param_names)
    # the recorded bounds survive JSON
    back = law.LawFit.from_dict(fit.to_dict())
    assert back.at_bound == fit.at_bound and back.identified == fit.identified


def test_a_floor_the_data_do_not_support_is_reported_on_its_bound():
    # No floor at all (E at its lower bound 1e-3 in the truth): the fit must say it is on the bound.
    truth = {**TRUE_L3, "E": 1e-3}
    fit = law.fit_law(points("L3", truth), "domain")
    assert fit.at_bound["E"] == "lower" and fit.identified is False
    # and an explicit E range is honoured, with the optimum reported on it
    fit2 = law.fit_law(points("L3", TRUE_L3), "domain", bounds={"E": (3.5, 4.0)})
    assert fit2.params["E"] == pytest.approx(3.5) and fit2.at_bound["E"] == "lower"
    with pytest.raises(ValueError, match=r"bounds can override .*; got \['A'\]"):
        law.fit_law(points("L3", TRUE_L3), "domain", bounds={"A": (0.0, 1.0)})


def test_a_fit_stored_in_the_papers_parameterisation_predicts_unchanged():
    # Written before the r term was anchored (no "r_term" key): E + C/(r+eps)^gamma, the paper's L3.
    paper = dict(E=1.2, A=40.0, alpha=0.3, B=60.0, eta=0.1, beta=0.35, C=0.4, gamma=0.3, eps=0.02)
    old = {"form": "L3", "target": "domain", "params": paper, "huber": 0.0, "r2": 1.0, "n_points": 0}
    fit = law.LawFit.from_dict(old)
    N, D, r = 3e5, 5e4, np.array([0.0, 0.3, 1.0])
    by_hand = (paper["E"] + paper["A"] * N ** -paper["alpha"] + paper["B"] * r ** paper["eta"] * D ** -paper["beta"]
               + paper["C"] * (r + paper["eps"]) ** -paper["gamma"])
    assert fit.predict(N, D, r) == pytest.approx(by_hand, rel=1e-12)
    assert fit.paper_params()["E"] == pytest.approx(paper["E"])
    assert law.LawFit.from_dict(fit.to_dict()).predict(N, D, r) == pytest.approx(by_hand, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# Comparison forms: each recovers its own generating parameters


@pytest.mark.parametrize("form, truth", [("data_mixing_law", TRUE_DML), ("bimix", TRUE_BIMIX)])
def test_comparison_form_recovers_its_generating_parameters(form, truth):
    exact = law.fit_law(points(form, truth), "domain", form)
    for name, value in truth.items():
        assert exact.params[name] == pytest.approx(value, rel=2e-3, abs=1e-4), (form, name)
    assert exact.identified
    noisy = law.fit_law(points(form, truth, noise=0.003, seed=2), "domain", form)
    assert noisy.params["E"] == pytest.approx(truth["E"], rel=0.05)
    assert noisy.params["alpha"] == pytest.approx(truth["alpha"], abs=0.03)
    assert noisy.params["beta"] == pytest.approx(truth["beta"], abs=0.03)


def test_general_law_of_a_comparison_form_is_evaluated_at_one_minus_domain_ratio():
    N, D, R = grid()
    pts = {"n_params": N, "tokens": D, "domain_ratio": R,
           "loss_general": law.FORMS["data_mixing_law"].predict(TRUE_DML, N, D, 1 - R)}
    fit = law.fit_law(pts, "general", "data_mixing_law")
    assert fit.params["t"] == pytest.approx(TRUE_DML["t"], abs=1e-3)
    assert fit.predict(1e5, 1e4, 0.9) == pytest.approx(law.FORMS["data_mixing_law"].predict(TRUE_DML, 1e5, 1e4, 0.1))


def test_generalisation_scores_every_form_by_name_with_an_extrapolation_mare():
    pts = points("bimix", TRUE_BIMIX, noise=0.002, seed=3)
    out = law.compare_generalisation(pts, "domain", forms=("bimix", "chinchilla"), n_grid=2, n_starts=1)
    for form in ("bimix", "chinchilla"):
        largest = out[form]["unseen_N_largest"]
        assert largest["n_test"] == len(TOKENS) * len(RATIOS) and largest["n_folds"] == 1
        assert np.isfinite(largest["mare"]) and largest["r2_ceiling"] is None  # one seed
    # the generating form extrapolates to the largest size; Chinchilla (no r) cannot fit r at all
    assert out["bimix"]["unseen_N_largest"]["mare"] < 0.01
    assert out["chinchilla"]["unseen_r"]["mare"] > 5 * out["bimix"]["unseen_r"]["mare"]


# ---------------------------------------------------------------------------------------------
# Seed noise and the noise ceiling


def test_noise_ceiling_of_repeated_runs_equals_the_analytic_value():
    # Additive Gaussian seed noise sigma on known configuration means mu: the best R^2 any model
    # can reach is 1 - sigma^2 / (Var(mu) + sigma^2).
    N, D, R = grid(sizes=np.geomspace(1e4, 1e6, 10), tokens=np.geomspace(4096, 131072, 10),
                   ratios=np.linspace(0, 1, 10))
    mu = law.FORMS["L3"].predict(TRUE_L3, N, D, R)
    sigma = float(np.std(mu)) * 0.8
    k = 4
    rng = np.random.default_rng(7)
    pts = {"n_params": np.tile(N, k), "tokens": np.tile(D, k), "domain_ratio": np.tile(R, k),
           "loss_domain": np.tile(mu, k) + rng.normal(0.0, sigma, mu.size * k),
           "seed": np.repeat([f"s{i}" for i in range(k)], mu.size)}
    analytic = 1.0 - sigma**2 / (np.var(mu) + sigma**2)  # = 1 - 0.64 / 1.64
    ceiling = law.noise_ceiling(pts, "domain")
    assert ceiling == pytest.approx(analytic, abs=0.02)
    noise = law.seed_noise(pts, "domain")
    assert noise.loss_std == pytest.approx(sigma, rel=0.04)
    assert noise.n_configs == mu.size and noise.n_seeds_max == k
    # the estimator is exactly 1 - sum of per-configuration seed variances / total sum of squares
    y = pts["loss_domain"]
    per_config = np.var(y.reshape(k, -1), axis=0, ddof=1)
    assert ceiling == pytest.approx(1 - k * per_config.sum() / np.sum((y - y.mean()) ** 2), rel=1e-12)


def test_a_single_seed_gives_no_noise_estimate():
    one = points("L3", TRUE_L3, noise=0.01)
    assert law.seed_noise(one, "domain") is None and law.noise_ceiling(one, "domain") is None
    assert law.noise_ceiling({**one, "seed": np.zeros(len(one["tokens"]), int)}, "domain") is None
    assert law.r2_floor(None) is None
    g = law.generalisation(one, "domain", "chinchilla", n_grid=2, n_starts=1)
    assert g["noise"] is None and g["unseen_D"]["r2_ceiling"] is None


def test_floor_derives_from_the_ceiling_and_rejects_bad_input():
    assert law.r2_floor(0.95) == pytest.approx(0.9)  # held-out MSE <= 2x the noise variance
    assert law.r2_floor(0.95, noise_multiple=1.0) == pytest.approx(0.95)
    assert law.r2_floor(0.4) == pytest.approx(-0.2)  # noise-dominated axis: a lenient floor
    with pytest.raises(ValueError, match="noise_multiple must be a finite number >= 1"):
        law.r2_floor(0.9, noise_multiple=0.5)
    with pytest.raises(ValueError, match=r"ceiling must be an R\^2 <= 1"):
        law.r2_floor(1.5)
    dup = points("L3", TRUE_L3, n_seeds=2)
    dup["seed"] = dup["seed"].copy()
    dup["seed"][len(dup["tokens"]) // 2] = 0  # the first configuration's second run reuses seed 0
    with pytest.raises(ValueError, match=r"configuration \(n_params=6592, domain_ratio=0, tokens=4096\) "
                                         r"has 2 points but 1 distinct seeds"):
        law.seed_noise(dup, "domain")


def test_generalisation_reports_the_ceiling_next_to_each_held_out_r2():
    pts = points("chinchilla", dict(E=2.0, A=30.0, alpha=0.3, B=60.0, beta=0.35), noise=0.01,
                 seed=4, n_seeds=2, ratios=(0.5,))
    g = law.generalisation(pts, "domain", "chinchilla", n_grid=2, n_starts=1)
    assert g["noise"]["n_seeds_max"] == 2 and g["noise"]["log_std"] == pytest.approx(0.01, rel=0.3)
    for axis in ("in_sample", "unseen_N", "unseen_N_largest", "unseen_D"):
        c = g[axis]["r2_ceiling"]
        assert c is not None and 0.0 < c < 1.0, axis
    # a correct law sits near, and on average not above, the ceiling
    assert g["in_sample"]["r2"] <= g["in_sample"]["r2_ceiling"] + 0.02
    assert g["unseen_D"]["r2"] > law.r2_floor(g["unseen_D"]["r2_ceiling"])


# ---------------------------------------------------------------------------------------------
# Bootstrap intervals


def test_bootstrap_intervals_cover_the_generating_parameters():
    pts = points("data_mixing_law", TRUE_DML, noise=0.003, seed=5, n_seeds=2)
    boot = law.bootstrap(pts, "domain", "data_mixing_law", n_boot=12, seed=0)
    iv = boot.intervals(95)
    for name in ("E", "alpha", "beta", "t"):
        lo, hi = iv[name]
        assert lo <= TRUE_DML[name] <= hi, (name, lo, hi)
        assert hi - lo < 0.5 * abs(TRUE_DML[name]), (name, lo, hi)
    s = boot.summary()
    assert s["n_boot"] == 12 and s["params"]["E"]["at_bound"] is None
    assert 0.0 <= s["params"]["E"]["refits_at_bound"] <= 1.0
    with pytest.raises(ValueError, match=r"level must be in \(0, 100\)"):
        boot.intervals(100)


# ---------------------------------------------------------------------------------------------
# Cross-domain K: bounded, with an interval, and its compute


def _domains(floors: dict[str, float], seed: int, noise: float = 0.003):
    """Domains sharing every L3 parameter except the floor."""
    return stack_domains({name: points("L3", {**TRUE_L3, "E": phi}, noise=noise, seed=seed + i)
                          for i, (name, phi) in enumerate(floors.items())})


def test_cross_domain_k_stays_within_its_bounds_with_an_interval():
    fit = law.fit_cross_domain(_domains({"code": 2.0, "law": 3.0, "music": 4.0}, seed=10),
                               n_grid=2, n_starts=2)
    k_min, k_max = fit.k_range
    assert k_min == pytest.approx(min(fit.k.values()) / law.K_MARGIN)
    assert k_max == pytest.approx(max(fit.k.values()) * law.K_MARGIN)
    # An ordinary unseen domain: K inside the training range, its interval around it.
    early, later = law.split_early(_domains({"math": 2.5}, seed=20), n_early=2)
    ev = law.evaluate_unseen_domain(fit, early, later, n_boot=30)
    assert fit.k["law"] < ev["K"] < fit.k["code"] and ev["K_at_bound"] == 0.0
    assert ev["K_lo"] <= ev["K"] <= ev["K_hi"] and ev["mare"] < 0.01
    # A domain whose losses lie below what the shared terms alone predict (floor -> 0): K used to
    # run off to ~1e5; now it stops at its bound and says so.
    low = _domains({"odd": 0.5}, seed=30)
    low["loss_domain"] = low["loss_domain"] * 0.6
    early, later = law.split_early(low, n_early=2)
    ev = law.evaluate_unseen_domain(fit, early, later, n_boot=10)
    assert ev["K"] == pytest.approx(k_max, rel=1e-3) and ev["K_at_bound"] == 1.0
    assert k_min <= ev["K_lo"] <= ev["K_hi"] <= k_max * (1 + 1e-9)
    assert all(isinstance(v, float) or isinstance(v, int) for v in ev.values())


def test_estimation_cost_counts_six_n_d_of_the_runs_k_needs():
    pts = points("L3", TRUE_L3)
    early, _ = law.split_early(pts, n_early=2)
    cost = law.estimation_cost(early, pts)
    n_sum = sum(SIZES) * len(RATIOS)
    assert cost["flops_full"] == pytest.approx(6 * n_sum * TOKENS[-1])
    assert cost["flops_k"] == pytest.approx(6 * n_sum * TOKENS[1])
    assert cost["fraction"] == pytest.approx(TOKENS[1] / TOKENS[-1])  # 1/16 on this grid
    # K from the two smallest sizes only: below the paper's ~1% of the full grid
    small, _ = law.split_early(pts, n_early=2, max_n_params=SIZES[1])
    frac = law.estimation_cost(small, pts)["fraction"]
    assert frac == pytest.approx((SIZES[0] + SIZES[1]) / sum(SIZES) * TOKENS[1] / TOKENS[-1])
    assert frac < 0.01
    with pytest.raises(ValueError, match="no run has n_params <= max_n_params=1"):
        law.split_early(pts, n_early=2, max_n_params=1)


# ---------------------------------------------------------------------------------------------
# The D term with an offset (docs/mixture.md, "Forms")

TRUE_L3_D0 = dict(TRUE_L3, B=15.0, D0=2e4)


def test_offset_d_term_has_the_analytic_gradient():
    from scipy.optimize import check_grad

    from ops.mixture.law.problem import _Problem
    from ops.mixture.law.forms import _load

    data = _load(points("L3_d0", TRUE_L3_D0, noise=0.002, seed=3), "loss_domain")
    rng = np.random.default_rng(0)
    for form in ("L3_d0", "r_additive_d0"):
        prob = _Problem.build(law.FORMS[form], data, "domain", law.HUBER_DELTA)
        theta = prob.theta_from_params(TRUE_L3_D0) + rng.normal(0.0, 0.05, len(prob.names))
        j = prob.names.index("ld0")
        err = check_grad(lambda t: prob.log_pred(t)[7], lambda t: prob.log_pred(t, grad=True)[1][7], theta)
        assert err < 1e-5, (form, err)
        # the offset's own column is not zero: the term depends on D0 where D is comparable to it
        assert abs(prob.log_pred(theta, grad=True)[1][:, j]).max() > 1e-3


def test_offset_form_follows_a_bending_d_curve_that_a_pure_power_cannot():
    pts = points("L3_d0", TRUE_L3_D0, noise=0.001, seed=4)
    bent = law.fit_law(pts, "domain", "L3_d0")
    pure = law.fit_law(pts, "domain", "L3")
    assert set(bent.params) == set(law.FORMS["L3_d0"].param_names)
    assert 5e3 < bent.params["D0"] < 8e4  # the generating 2e4 within a factor of 4
    assert bent.huber < 0.5 * pure.huber
    # finite at D = 0 (where the pure power diverges), and the JSON round trip keeps D0
    with np.errstate(divide="ignore"):
        assert np.isfinite(bent.predict(447552.0, 0.0, 0.5)) and not np.isfinite(pure.predict(447552.0, 0.0, 0.5))
    back = law.LawFit.from_dict(bent.to_dict())
    assert back.predict(1e6, 3e5, 0.4) == pytest.approx(bent.predict(1e6, 3e5, 0.4), rel=1e-12)
    with pytest.raises(ValueError, match="dcpt family only"):
        law.LawForm("x", ("E",), has_eta=False, has_c=False, description="", family="bimix", has_d0=True)
