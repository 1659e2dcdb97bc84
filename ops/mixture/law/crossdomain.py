"""The Cross-Domain D-CPT Law (arXiv 2406.01375 §3): L3 with shared parameters plus a term
F / K^mu per domain, K the Domain-specific Learnable Coefficient. Fitting it on several training
domains (``fit_cross_domain``), splitting a run's cheap early checkpoints from the rest
(``split_early``), estimating K of an unseen domain from those early points (``estimate_k``), and
predicting and scoring that domain's later losses (``predict_unseen_domain``,
``evaluate_unseen_domain``).

Source: Que et al., arXiv 2406.01375 (NeurIPS 2024), §3 (Cross-Domain D-CPT Law). The paper
leaves the exact K open; our normalisation (``CrossDomainFit``) and estimation method
(``estimate_k``) are described in docs/mixture.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from scipy.optimize import minimize_scalar

from .fit import _one_blas_thread, _Problem
from .forms import (
    FORMS,
    HUBER_DELTA,
    LOSS_COLUMN,
    N_GRID,
    N_STARTS,
    _check_enough,
    _check_target,
    _column_names,
    _Data,
    _law_ratio,
    _load,
    _metrics,
    _positive,
    huber,
)


# --------------------------------------------------------------------------------------------
# Cross-Domain D-CPT Law (arXiv 2406.01375 §3): L3 + F / K^mu, K per domain


@dataclass(frozen=True)
class CrossDomainFit:
    """Cross-Domain D-CPT Law: L3 with shared parameters plus F / K^mu per domain.

    Identifiability (our normalisation; the exact K is open, see docs/mixture.md): the data fix
    only one constant per domain, the floor Phi_i = E + F / K_i^mu. A constant shared by all
    domains is not separable from those, nor are F, mu and the scale of K. We therefore set E = 0
    (the shared floor is carried by F), mu = 1 and the geometric mean of K over the training
    domains to 1, so F = geometric mean of the floors and K_i = F / Phi_i (K > 1: a lower-loss
    domain than the average training domain). ``params`` holds E (= 0), A, alpha, B, eta, beta, C,
    gamma, eps, F and mu (= 1); ``k`` the training domains' K.
    """

    target: str
    params: Mapping[str, float]
    k: Mapping[str, float]
    huber: float
    r2: float
    n_points: int
    huber_delta: float = HUBER_DELTA

    def predict(self, N, D, r_d, K: float | str) -> np.ndarray:
        """Loss (nats/token) at N, D, domain ratio r_d, for K (a float) or a training domain."""
        if isinstance(K, str):
            if K not in self.k:
                raise ValueError(f"unknown domain {K!r}; fitted domains are {sorted(self.k)}")
            K = self.k[K]
        K = _positive("K", K)
        p = self.params
        shared = FORMS["L3"].predict({**p, "E": 0.0}, N, D, _law_ratio(r_d, self.target))
        return shared + p["F"] / K ** p["mu"]

    def to_dict(self) -> dict[str, Any]:
        return {"form": "L3+F/K^mu", "target": self.target,
                "params": {k: float(v) for k, v in self.params.items()},
                "k": {d: float(v) for d, v in self.k.items()}, "huber": float(self.huber),
                "r2": float(self.r2), "n_points": int(self.n_points),
                "huber_delta": float(self.huber_delta)}


@_one_blas_thread
def fit_cross_domain(points, target: str = "domain", huber_delta: float = HUBER_DELTA,
                     n_grid: int = N_GRID, n_starts: int = N_STARTS) -> CrossDomainFit:
    """Fit the Cross-Domain D-CPT Law on points from several training domains (``domain``
    column): shared A, alpha, B, eta, beta, C, gamma, eps and one floor per domain, reported as
    F and K under the normalisation in ``CrossDomainFit``. Same loss, optimiser and start grid
    as ``fit_law`` (NNLS gives every domain its own floor column).

    Raises ValueError as ``fit_law``, for a missing ``domain`` column, or for fewer than 2
    domains. Source: arXiv 2406.01375 §3 (Cross-Domain D-CPT Law); docs/mixture.md.
    """
    _check_target(target)
    data = _load(points, LOSS_COLUMN[target], need_domain=True)
    domains, group = np.unique(data.domain, return_inverse=True)
    if len(domains) < 2:
        raise ValueError(
            f"cross-domain law needs at least 2 distinct domain values, got {len(domains)}")
    form = FORMS["L3"]
    n_free = len(form.param_names) - 1 + len(domains)
    _check_enough(data, form, n_free)
    prob = _Problem.build(form, data, target, huber_delta, group, len(domains))
    theta = prob.solve(n_grid, n_starts)
    floors = np.exp(theta[: len(domains)])
    F = float(np.exp(np.mean(np.log(floors))))
    params = {"E": 0.0, **prob.natural(theta), "F": F, "mu": 1.0}
    fit = CrossDomainFit(target, params, {str(d): F / float(v) for d, v in zip(domains, floors)},
                         0.0, 0.0, data.n, huber_delta)
    pred = np.empty(data.n)
    for d in domains:
        m = data.domain == d
        pred[m] = fit.predict(data.N[m], data.D[m], data.r_d[m], str(d))
    met = _metrics(pred, data.loss, huber_delta)
    return CrossDomainFit(target, params, fit.k, met["huber"], met["r2"], data.n, huber_delta)


def split_early(points, n_early: int = 3) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Split points into the first ``n_early`` checkpoints (smallest tokens) of each run and the
    rest. Runs are (n_params, domain_ratio[, domain]). Returns two dicts of numpy arrays with all
    input columns. Raises ValueError for missing/invalid n_params, tokens, domain_ratio."""
    names = _column_names(points)
    data = _load(points, None)
    if "domain" in names:
        data = _Data(data.N, data.D, data.r_d, data.loss, np.asarray(points["domain"]).astype(str))
    runs = data.runs()
    early = np.zeros(data.n, bool)
    for run in np.unique(runs):
        members = np.flatnonzero(runs == run)
        early[members[np.argsort(data.D[members])][:n_early]] = True
    cols = {c: np.asarray(points[c]) for c in names}
    return ({c: v[early] for c, v in cols.items()}, {c: v[~early] for c, v in cols.items()})


def estimate_k(fit: CrossDomainFit, early_points) -> float:
    """Domain-specific Learnable Coefficient K of an unseen domain from its cheap early points.

    Method (ours; the exact K is open, see docs/mixture.md): the shared parameters stay frozen and
    the one unknown, the domain's floor Phi = F / K^mu, is fitted to the early points (e.g. the
    first 2-3 checkpoints of a few small runs, ``split_early``) by the same Huber loss on log
    residuals (dense grid over log Phi, then bounded refinement). The initial loss fixes the level;
    the early slope is predicted by the shared D term rather than fitted. We chose this over a map
    (initial loss, early slope) -> log K learned across training domains because that map would be
    fitted on as few points as there are training domains (3-6), while this is a 1-parameter fit on
    all early points and stays consistent with the law. Returns K (> 0).
    Raises ValueError for invalid points (as ``fit_law``); any number of points >= 1 is accepted.
    """
    data = _load(early_points, LOSS_COLUMN[fit.target])
    shared = fit.predict(data.N, data.D, data.r_d, 1.0) - fit.params["F"]
    delta = fit.huber_delta
    logy = np.log(data.loss)

    def obj(lphi):
        return float(np.mean(huber(np.log(shared + np.exp(lphi)) - logy, delta)))

    grid = np.linspace(math.log(1e-6), float(logy.max()), 400)
    vals = [obj(x) for x in grid]
    i = int(np.argmin(vals))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    lphi = minimize_scalar(obj, bounds=(a, b), method="bounded").x
    return float((fit.params["F"] / math.exp(lphi)) ** (1.0 / fit.params["mu"]))


def predict_unseen_domain(fit: CrossDomainFit, K: float, N, D, r_d) -> np.ndarray:
    """Predicted loss (nats/token) of an unseen domain with coefficient K (``estimate_k``) at
    N parameters, D tokens and domain ratio r_d (broadcast arrays)."""
    return fit.predict(N, D, r_d, K)


def evaluate_unseen_domain(fit: CrossDomainFit, early_points, later_points) -> dict[str, float]:
    """Estimate K from ``early_points`` and score predictions of ``later_points`` (the same
    domain's real later checkpoints): {K, huber, r2, mare (mean |pred/obs - 1|), n_early,
    n_later}. Raises ValueError for invalid points."""
    K = estimate_k(fit, early_points)
    later = _load(later_points, LOSS_COLUMN[fit.target])
    pred = fit.predict(later.N, later.D, later.r_d, K)
    m = _metrics(pred, later.loss, fit.huber_delta)
    n_early = len(np.asarray(early_points["n_params"]))
    return {"K": K, **m, "n_early": n_early, "n_later": later.n}
