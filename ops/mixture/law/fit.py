"""Fitting one D-CPT Law form to probe points: the fitted law (``LawFit``), ``fit_law`` and
``compare_forms``. The optimiser's problem they solve (reparameterisation, bounds, objective,
start grid) is ``problem._Problem``.

Source: Que et al., arXiv 2406.01375 (NeurIPS 2024), §3 (fitting the law; comparison of the
parameterisations) and §4 (fit quality). Forms, units and probe-point columns: ``forms``. Every
fit records which parameters ended on a bound (``LawFit.at_bound``). numpy/scipy only; no torch,
no dagster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .forms import (
    FORMS,
    HUBER_DELTA,
    LOSS_COLUMN,
    N_GRID,
    N_STARTS,
    LawForm,
    _check_enough,
    _check_target,
    _Data,
    _form,
    _law_ratio,
    _load,
    _metrics,
)
from .problem import _one_blas_thread, _Problem

_R_TERM = "anchored_at_r1"  # LawFit.to_dict marker: the r term is C((r+eps)^-gamma - (1+eps)^-gamma)


# --------------------------------------------------------------------------------------------
# Single-domain fits


@dataclass(frozen=True)
class LawFit:
    """A fitted law for one target loss (arXiv 2406.01375 §3)."""

    form: str
    """Name of the law form fitted (a key of ``FORMS``)."""
    target: str
    """The loss fitted: 'domain' (law in r = r_d, loss_domain) or 'general' (r = 1 - r_d, loss_general)."""
    params: Mapping[str, float]
    """Natural parameters of ``FORMS[form]`` in the law's own ratio (r = r_d for target 'domain', r = 1 -
    r_d for target 'general')."""
    huber: float
    """In-sample mean Huber loss of log residuals (delta ``huber_delta``)."""
    r2: float
    """In-sample R^2 on loss (NaN when the observed losses do not vary)."""
    n_points: int
    """Probe points the law was fitted on."""
    huber_delta: float = HUBER_DELTA
    """Huber delta on log-loss residuals used by the fit (> 0)."""
    at_bound: Mapping[str, str | None] | None = None
    """{parameter: 'lower' | 'upper' | None}, where the optimum sits on a bound of the fit (None for a fit
    made before this was recorded). A parameter on a bound is not identified by the data: the optimum would
    lie beyond it. For A, B, C 'lower' means the term is off."""

    @property
    def identified(self) -> bool | None:
        """True when no parameter sits on a bound (None when ``at_bound`` was not recorded)."""
        if self.at_bound is None:
            return None
        return not any(self.at_bound.values())

    def predict(self, N, D, r_d) -> np.ndarray:
        """Predicted loss (nats/token) at N parameters, D CPT tokens and domain ratio r_d.

        Arrays broadcast. Always pass r_d, the domain share of the mixture: the general-loss law
        is evaluated at r = 1 - r_d here, so callers never convert.
        """
        return FORMS[self.form].predict(self.params, N, D, _law_ratio(r_d, self.target))

    def paper_params(self) -> dict[str, float]:
        """The parameters in the D-CPT paper's parameterisation (arXiv 2406.01375 §3), where the
        r term C/(r + eps)^gamma is not anchored: E_paper = E - C/(1 + eps)^gamma (may be <= 0:
        the data then prefer no separate irreducible loss). Other forms: ``params`` unchanged."""
        p = dict(self.params)
        if FORMS[self.form].family == "dcpt" and FORMS[self.form].has_c:
            p["E"] = p["E"] - p["C"] * (1.0 + p["eps"]) ** -p["gamma"]
        return p

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable summary (plain floats and strings)."""
        return {"form": self.form, "target": self.target,
                "params": {k: float(v) for k, v in self.params.items()},
                "huber": float(self.huber), "r2": float(self.r2),
                "n_points": int(self.n_points), "huber_delta": float(self.huber_delta),
                "at_bound": None if self.at_bound is None else dict(self.at_bound),
                "r_term": _R_TERM}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LawFit":
        """Inverse of ``to_dict``. A dict written before the r term was anchored (no ``r_term``
        key) is converted exactly: E + C/(r+eps)^gamma = E' + C((r+eps)^-gamma - (1+eps)^-gamma)
        with E' = E + C/(1+eps)^gamma, so its predictions are unchanged."""
        at = d.get("at_bound")
        params = dict(d["params"])
        f = FORMS[d["form"]]
        if d.get("r_term") != _R_TERM and f.family == "dcpt" and f.has_c:
            params["E"] = params["E"] + params["C"] * (1.0 + params["eps"]) ** -params["gamma"]
        return cls(d["form"], d["target"], params, d["huber"], d["r2"],
                   d["n_points"], d.get("huber_delta", HUBER_DELTA),
                   None if at is None else dict(at))


def _fit_data(data: _Data, target: str, form: LawForm, huber_delta: float, n_grid: int,
              n_starts: int, init: Mapping[str, float] | None = None,
              bounds: Mapping[str, tuple[float, float]] | None = None) -> LawFit:
    n_free = len(form.param_names)
    _check_enough(data, form, n_free)
    prob = _Problem.build(form, data, target, huber_delta, bounds=bounds)
    extra = [prob.theta_from_params(init)] if init is not None else []
    theta = prob.solve(n_grid, n_starts, extra)
    params = {"E": float(math.exp(theta[0])), **prob.natural(theta)}
    params = {k: params[k] for k in form.param_names}
    at = prob.at_bounds(theta)
    pred = form.predict(params, data.N, data.D, _law_ratio(data.r_d, target))
    m = _metrics(pred, data.loss, huber_delta)
    return LawFit(form.name, target, params, m["huber"], m["r2"], data.n, huber_delta,
                  {k: at[k] for k in form.param_names})


@_one_blas_thread
def fit_law(points, target: str, form: str = "L3", huber_delta: float = HUBER_DELTA,
            n_grid: int = N_GRID, n_starts: int = N_STARTS,
            init: Mapping[str, float] | None = None,
            bounds: Mapping[str, tuple[float, float]] | None = None) -> LawFit:
    """Fit one law form to probe points for the domain or the general loss.

    Minimises the mean Huber loss (``huber_delta``, default 1e-3) of log(pred) - log(obs), with
    log(pred) a log-sum-exp of the form's terms (E = exp(e); Besiroglu et al. 2024), by L-BFGS-B
    inside each parameter's bounds (``FORMS[form].bounds``, overridden per parameter by
    ``bounds`` = {name: (lo, hi)} for E, alpha, beta, eta, gamma, eps, t, D0; E is also capped at the
    smallest observed loss, where the floor is additive). Starts: a grid of ``n_grid`` levels per
    nonlinear parameter (4^5 = 1024 grid points for L3) with the linear coefficients by NNLS; the
    ``n_starts`` best are refined (plus ``init``, natural parameters, if given). Deterministic.
    ~0.2-0.6 s for 150 points on one core. ``LawFit.at_bound`` reports each parameter on a bound.

    points: DataFrame or dict with n_params, tokens, domain_ratio and loss_<target> (n rows;
    optional ``seed``: repeated runs are separate points).
    target: 'domain' (law in r = r_d, fits loss_domain) or 'general' (r = 1 - r_d, loss_general).
    Raises ValueError for a missing column, non-finite or non-positive n_params/tokens/loss (with
    the row), domain_ratio outside [0, 1], fewer points than parameters + 1, fewer than 2
    distinct n_params / tokens / domain_ratio (the last only for forms that use r), or a bad
    ``bounds`` entry. Source: arXiv 2406.01375 §3 (L3 and the Huber/L-BFGS fit); docs/mixture.md.
    """
    _check_target(target)
    f = _form(form)
    data = _load(points, LOSS_COLUMN[target])
    return _fit_data(data, target, f, huber_delta, n_grid, n_starts, init, bounds)


DCPT_FORMS = ("L3", "r_additive", "chinchilla")  # compare_forms' default: the paper's family


@_one_blas_thread
def compare_forms(points, target: str, forms: Sequence[str] = DCPT_FORMS,
                  **fit_kwargs) -> dict[str, dict[str, Any]]:
    """In-sample fit quality of each form on the same points: {form: {huber, r2, n_params,
    at_bound}}.

    The paper's comparison of parameterisations (arXiv 2406.01375 §3-§4); by default L3 against
    the r-additive power form and Chinchilla; pass ``forms=tuple(FORMS)`` to add the Data Mixing
    Law and BiMix. Same arguments and errors as ``fit_law``.
    """
    out = {}
    for name in forms:
        fit = fit_law(points, target, name, **fit_kwargs)
        out[name] = {"huber": fit.huber, "r2": fit.r2, "n_params": len(fit.params),
                     "at_bound": dict(fit.at_bound)}
    return out
