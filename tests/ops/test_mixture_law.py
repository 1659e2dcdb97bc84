"""D-CPT Law (ops.mixture.law): fits recover known laws, the usages agree with brute force on
the fitted law, the cross-domain law transfers to an unseen domain, bad inputs fail clearly.

Probe grids mimic the real probes: 3 model sizes spanning 10x, 5-6 mixture ratios including 0
and 1, 6 exponentially spaced checkpoints from 1e5 to 3e6 tokens, 0.3% multiplicative noise.
"""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest

from ops.mixture import law
from tests.conftest import stack_domains

SIZES = (2e5, 7e5, 2e6)
RATIOS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
TOKENS = tuple(np.geomspace(1e5, 3e6, 6))
# Domain law in r = r_d; general law in r = 1 - r_d.
TRUE_D = dict(E=1.2, A=60.0, alpha=0.35, B=12.0, eta=0.3, beta=0.3, C=0.5, gamma=0.4, eps=0.02)
TRUE_G = dict(E=2.0, A=45.0, alpha=0.3, B=8.0, eta=0.5, beta=0.28, C=0.08, gamma=0.5, eps=0.05)


def _true(params, N, D, r):
    return law.FORMS["L3"].predict(params, N, D, r)


def probes(sizes=SIZES, ratios=RATIOS, tokens=TOKENS, noise=0.003, seed=0,
           p_domain=TRUE_D, p_general=TRUE_G) -> dict[str, np.ndarray]:
    N, D, R = (a.ravel() for a in np.meshgrid(sizes, tokens, ratios, indexing="ij"))
    rng = np.random.default_rng(seed)
    return {
        "n_params": N,
        "tokens": D,
        "domain_ratio": R,
        "loss_domain": _true(p_domain, N, D, R) * np.exp(rng.normal(0, noise, N.size)),
        "loss_general": _true(p_general, N, D, 1 - R) * np.exp(rng.normal(0, noise, N.size)),
    }


@pytest.fixture(scope="module")
def fits() -> tuple[law.LawFit, law.LawFit]:
    pts = pl.DataFrame(probes())
    return law.fit_law(pts, "general"), law.fit_law(pts, "domain")


# ---------------------------------------------------------------------------------------------
# Fitting


def test_l3_fit_predicts_unseen_grid_points_of_the_generating_law(fits):
    fit_g, fit_d = fits
    # Points between the probes: other ratios, checkpoints between probe checkpoints, a mid size.
    N, D, R = (a.ravel() for a in np.meshgrid((4e5, 1.2e6), (1.7e5, 6e5, 2e6), (0.1, 0.5, 0.9),
                                              indexing="ij"))
    rel_d = np.abs(fit_d.predict(N, D, R) / _true(TRUE_D, N, D, R) - 1)
    rel_g = np.abs(fit_g.predict(N, D, R) / _true(TRUE_G, N, D, 1 - R) - 1)
    assert rel_d.max() < 0.01 and rel_g.max() < 0.01
    assert fit_d.r2 > 0.999 and fit_g.r2 > 0.99
    assert fit_d.n_points == len(RATIOS) * len(SIZES) * len(TOKENS)


def test_l3_recovers_floor_and_exponents():
    fit = law.fit_law(probes(noise=0.001, seed=3), "domain")
    assert fit.params["E"] == pytest.approx(TRUE_D["E"], rel=0.05)
    assert fit.params["alpha"] == pytest.approx(TRUE_D["alpha"], abs=0.03)
    assert fit.params["beta"] == pytest.approx(TRUE_D["beta"], abs=0.03)
    assert fit.params["eta"] == pytest.approx(TRUE_D["eta"], abs=0.05)


def test_noise_free_fit_is_exact():
    fit = law.fit_law(probes(noise=0.0), "domain")
    for name, value in TRUE_D.items():
        assert fit.params[name] == pytest.approx(value, rel=1e-3), name


def test_forms_that_ignore_the_ratio_fit_worse_on_ratio_varying_data():
    quality = law.compare_forms(probes(), "domain")
    assert set(quality) == {"L3", "r_additive", "chinchilla"}
    assert quality["chinchilla"]["huber"] > 20 * quality["L3"]["huber"]
    assert quality["r_additive"]["huber"] > quality["L3"]["huber"]
    assert quality["L3"]["n_params"] == 9 and quality["chinchilla"]["n_params"] == 5


def test_general_law_is_evaluated_at_one_minus_domain_ratio(fits):
    fit_g, _ = fits
    direct = law.FORMS["L3"].predict(fit_g.params, 7e5, 1e6, 1 - 0.95)
    assert fit_g.predict(7e5, 1e6, 0.95) == pytest.approx(direct)
    # and that is the general loss the probes measured at r_d = 0.95, not at r_d = 0.05
    truth = _true(TRUE_G, 7e5, 1e6, 0.05)
    assert fit_g.predict(7e5, 1e6, 0.95) == pytest.approx(truth, rel=0.005)
    assert abs(fit_g.predict(7e5, 1e6, 0.05) / truth - 1) > 0.01


def test_fit_round_trips_through_json(fits):
    fit_g, _ = fits
    d = json.loads(json.dumps(fit_g.to_dict()))
    back = law.LawFit.from_dict(d)
    assert back.predict(2e6, 3e6, 0.5) == pytest.approx(fit_g.predict(2e6, 3e6, 0.5))
    assert d["target"] == "general" and set(d["params"]) == set(law.FORMS["L3"].param_names)


# ---------------------------------------------------------------------------------------------
# Generalisation and bootstrap


def test_generalisation_reports_each_axis_on_held_out_points():
    pts = probes(sizes=(2e5, 5e5, 1e6, 2e6), ratios=(0.0, 0.25, 0.5, 0.75, 1.0))
    g = law.generalisation(pts, "domain", n_grid=3, n_starts=3)
    for axis in ("unseen_N", "unseen_D", "unseen_r"):
        m = g[axis]
        assert np.isfinite([m["huber"], m["r2"]]).all(), axis
        assert m["r2"] > 0.95, (axis, m)
        assert m["n_test"] > 0 and m["n_train"] > 0
    assert g["unseen_N"]["n_folds"] == 2 and g["unseen_N"]["n_test"] == 60  # interior sizes only
    ext = g["unseen_N_extrapolation"]  # smallest and largest size held out
    assert ext["n_folds"] == 2 and ext["n_test"] == 60 and ext["r2"] > 0.9
    assert g["unseen_D"]["n_test"] == 2 * 4 * 5  # last 2 checkpoints of each run
    assert g["unseen_r"]["n_folds"] == 3  # interior ratios only


def test_bootstrap_spread_brackets_a_narrow_range(fits):
    pts = probes()
    bg = law.bootstrap(pts, "general", n_boot=4, seed=1)
    bd = law.bootstrap(pts, "domain", n_boot=4, seed=1)
    assert len(bd.fits) == 4 and bd.params()["alpha"].shape == (4,)
    plan = law.tradeoff_ratio(bg.fit, bd.fit, 1e6, 1e6, T=0.01, boot=(bg, bd))
    lo, hi = plan.spread["r_d"]
    assert lo <= hi and hi - lo < 0.1
    assert plan.spread["n_boot"] == 4
    assert plan.spread["loss_domain"][0] <= plan.spread["loss_domain"][1]
    json.dumps(plan.to_dict())


# ---------------------------------------------------------------------------------------------
# The three usages against brute force on the same fitted law


def test_tradeoff_matches_a_grid_search_and_respects_the_constraint(fits):
    fit_g, fit_d = fits
    N, D, T = 1e6, 1e6, 0.01
    plan = law.tradeoff_ratio(fit_g, fit_d, N, D, T=T)
    r = np.linspace(0, 1, 1001)
    base = fit_g.predict(N, D, 0.0)
    ok = (fit_g.predict(N, D, r) - base) / base <= T
    r_bf = r[ok][np.argmin(fit_d.predict(N, D, r[ok]))]
    assert plan.status == "constrained" and plan.feasible and not plan.all_feasible
    assert abs(plan.r_d - r_bf) <= 1e-3
    assert (plan.loss_general - base) / base <= T + 1e-9
    assert plan.loss_domain <= fit_d.predict(N, D, r_bf) + 1e-9
    assert plan.loss_domain == pytest.approx(fit_d.predict(N, D, plan.r_d))


def _law(target, **params) -> law.LawFit:
    return law.LawFit("L3", target, params, huber=0.0, r2=1.0, n_points=0)


# General loss rising monotonically with r_d (eta = 0), domain loss falling (eta = 0).
MONO_G = _law("general", E=2.0, A=40.0, alpha=0.3, B=5.0, eta=0.0, beta=0.3, C=0.1, gamma=0.5,
              eps=0.05)
MONO_D = _law("domain", E=1.0, A=40.0, alpha=0.3, B=5.0, eta=0.0, beta=0.3, C=0.5, gamma=0.4,
              eps=0.02)


def test_tradeoff_with_no_feasible_positive_ratio_answers_zero_and_says_so():
    plan = law.tradeoff_ratio(MONO_G, MONO_D, 1e6, 1e6, T=0.0)
    assert plan.r_d == 0.0 and plan.status == "infeasible" and not plan.feasible
    below = float(MONO_G.predict(1e6, 1e6, 0.0)) * 0.9  # base already better than any CPT
    assert law.tradeoff_ratio(MONO_G, MONO_D, 1e6, 1e6, T=0.03, L_g0=below).r_d == 0.0


def test_tradeoff_with_every_ratio_feasible_answers_one():
    plan = law.tradeoff_ratio(MONO_G, MONO_D, 1e6, 1e6, T=1.0)
    assert plan.r_d == 1.0 and plan.all_feasible and plan.status == "unconstrained"


def test_tradeoff_rejects_swapped_fits():
    with pytest.raises(ValueError, match="fit_general must be fitted on target 'general'"):
        law.tradeoff_ratio(MONO_D, MONO_G, 1e6, 1e6)


def test_limited_domain_matches_a_grid_search(fits):
    fit_g, fit_d = fits
    N, Dd, T = 7e5, 3e5, 0.002
    plan = law.limited_domain(fit_g, fit_d, N, Dd, T=T, max_tokens=3e7)
    r = np.linspace(0.01, 1, 1001)
    D = Dd / r
    base = fit_g.predict(N, D, 0.0)
    ok = (fit_g.predict(N, D, r) - base) / base <= T
    i = np.argmin(np.where(ok, fit_d.predict(N, D, r), np.inf))
    assert abs(plan.r_d - r[i]) <= 1e-3
    assert plan.tokens == pytest.approx(Dd / plan.r_d) and plan.domain_tokens == pytest.approx(Dd)
    assert plan.loss_domain <= fit_d.predict(N, D[i], r[i]) + 1e-9


def test_allocate_compute_matches_a_log_grid_search(fits):
    fit_g, fit_d = fits
    C, r_d = 6 * 2e6 * 3e7, 0.5
    plan = law.allocate_compute(fit_d, C, r_d)
    logn = np.linspace(math.log(1e4), math.log(C / 6), 4001)
    n = np.exp(logn)
    loss = fit_d.predict(n, C / (6 * n), r_d)
    step = logn[1] - logn[0]
    assert abs(math.log(plan.n_params) - logn[np.argmin(loss)]) <= step
    assert plan.n_params * plan.tokens * 6 == pytest.approx(C)
    assert plan.loss_domain <= loss.min() + 1e-9
    # with a general-loss constraint the answer satisfies it
    plan_c = law.allocate_compute(fit_d, C, r_d, fit_general=fit_g, T=0.01)
    base = fit_g.predict(plan_c.n_params, plan_c.tokens, 0.0)
    assert (plan_c.loss_general - base) / base <= 0.01 + 1e-9


# ---------------------------------------------------------------------------------------------
# Cross-Domain D-CPT Law


def _domains(floors: dict[str, float], seed: int) -> dict[str, np.ndarray]:
    """Domains sharing every L3 parameter except the floor E + F/K^mu."""
    return stack_domains({name: probes(ratios=(0.0, 0.25, 0.5, 0.75, 1.0), seed=seed + i, p_domain={**TRUE_D, "E": phi})
                          for i, (name, phi) in enumerate(floors.items())})


def test_cross_domain_law_predicts_an_unseen_domain_from_its_early_checkpoints():
    fit = law.fit_cross_domain(_domains({"code": 0.9, "law": 1.6, "music": 2.0}, seed=10),
                               n_grid=3, n_starts=3)
    assert math.exp(np.mean(np.log(list(fit.k.values())))) == pytest.approx(1.0)
    assert fit.k["code"] > fit.k["law"] > fit.k["music"]  # lower floor -> larger K
    early, later = law.split_early(_domains({"math": 1.2}, seed=20), n_early=2)
    assert len(early["tokens"]) == 2 * 15 and len(later["tokens"]) == 4 * 15
    result = law.evaluate_unseen_domain(fit, early, later)
    assert fit.k["law"] < result["K"] < fit.k["code"]
    assert result["mare"] < 0.01 and result["r2"] > 0.99
    # A K-less law (one pooled L3 over the training domains) misses the new domain badly.
    pooled = law.fit_law(_domains({"code": 0.9, "law": 1.6, "music": 2.0}, seed=10), "domain",
                         n_grid=3, n_starts=3)
    pred = pooled.predict(later["n_params"], later["tokens"], later["domain_ratio"])
    assert np.mean(np.abs(pred / later["loss_domain"] - 1)) > 5 * result["mare"]
    pred_k = law.predict_unseen_domain(fit, result["K"], later["n_params"], later["tokens"],
                                       later["domain_ratio"])
    assert np.mean(np.abs(pred_k / later["loss_domain"] - 1)) == pytest.approx(result["mare"])


def test_cross_domain_needs_two_domains():
    pts = _domains({"code": 0.9}, seed=0)
    with pytest.raises(ValueError, match="at least 2 distinct domain values, got 1"):
        law.fit_cross_domain(pts)
    with pytest.raises(ValueError, match=r"missing column\(s\) \['domain'\]"):
        law.fit_cross_domain(probes())


# ---------------------------------------------------------------------------------------------
# Bad inputs


def _subset(pts, mask):
    return {k: v[mask] for k, v in pts.items()}


def test_too_few_points_for_the_form():
    pts = _subset(probes(), np.arange(108) < 6)
    with pytest.raises(ValueError, match="L3 has 9 parameters and needs at least 10 points, got 6"):
        law.fit_law(pts, "domain")


def test_nan_loss_names_column_and_row():
    pts = probes()
    pts["loss_domain"] = pts["loss_domain"].copy()
    pts["loss_domain"][3] = np.nan
    with pytest.raises(ValueError, match=r"'loss_domain' must be finite and > 0; row 3 is nan"):
        law.fit_law(pl.DataFrame(pts), "domain")
    law.fit_law(pts, "general", form="chinchilla")  # the other loss column is not read


def test_single_ratio_is_rejected_for_l3_but_fine_for_chinchilla():
    pts = _subset(probes(), probes()["domain_ratio"] == 0.4)
    with pytest.raises(ValueError, match="L3 needs at least 2 distinct domain_ratio values, got 1"):
        law.fit_law(pts, "domain")
    assert law.fit_law(pts, "domain", form="chinchilla").r2 > 0.99


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("domain_ratio", 1.5, r"'domain_ratio' must be finite and in \[0, 1\]; row 5 is 1.5"),
        ("domain_ratio", -0.1, r"'domain_ratio' must be finite and in \[0, 1\]; row 5 is -0.1"),
        ("tokens", 0.0, r"'tokens' must be finite and > 0; row 5 is 0.0"),
        ("loss_domain", -1.0, r"'loss_domain' must be finite and > 0; row 5 is -1.0"),
        ("n_params", np.inf, r"'n_params' must be finite and > 0; row 5 is inf"),
    ],
)
def test_out_of_range_values_name_the_column_and_row(column, value, message):
    pts = probes()
    pts[column] = pts[column].copy()
    pts[column][5] = value
    with pytest.raises(ValueError, match=message):
        law.fit_law(pts, "domain")


def test_missing_column_and_unknown_form_or_target():
    pts = probes()
    del pts["tokens"]
    with pytest.raises(ValueError, match=r"missing column\(s\) \['tokens'\]"):
        law.fit_law(pts, "domain")
    with pytest.raises(ValueError, match="form must be one of"):
        law.fit_law(probes(), "domain", form="L9")
    with pytest.raises(ValueError, match="target must be 'domain' or 'general'"):
        law.fit_law(probes(), "loss_domain")


def test_leave_one_domain_out_scores_the_held_domain_from_its_early_checkpoints():
    """One fold as dcpt_law_fit runs it: fit on the other sub-domains, K from the held one's first
    2 checkpoints per run; with K the later checkpoints are predicted to < 1%, and K = 1 (the
    training domains' mean floor) misses them by far more."""
    pts = _domains({"code": 0.9, "law": 1.6, "music": 2.0, "math": 1.2}, seed=10)
    row = law.leave_one_domain_out(pts, "math", early_checkpoints=2)
    assert row["unseen_domain"] == "math" and row["early_points"] == 2 * 15 and row["later_points"] == 4 * 15
    assert row["mare"] < 0.01 and row["r2"] > 0.99
    assert row["mare_without_K"] > 5 * row["mare"]
    with pytest.raises(ValueError, match="no point of sub-domain 'art'"):
        law.leave_one_domain_out(pts, "art")
