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

from .problem import _one_blas_thread, _Problem
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


K_MARGIN = 10.0  # an unseen domain's K may lie up to 10x beyond the training domains' range


@dataclass(frozen=True)
class CrossDomainFit:
    """Cross-Domain D-CPT Law: L3 with shared parameters plus F / K^mu per domain.

    Identifiability (our normalisation; the exact K is open, see docs/mixture.md): the data fix
    only one constant per domain, the floor Phi_i = E + F / K_i^mu. A constant shared by all
    domains is not separable from those, nor are F, mu and the scale of K. We therefore set E = 0
    (the shared floor is carried by F), mu = 1 and the geometric mean of K over the training
    domains to 1, so F = geometric mean of the floors and K_i = F / Phi_i (K > 1: a lower-loss
    domain than the average training domain). Only Phi is fitted; K is reported from it.
    """

    target: str
    """The loss fitted: 'domain' (law in r = r_d) or 'general' (r = 1 - r_d)."""
    params: Mapping[str, float]
    """The shared parameters: E (= 0), A, alpha, B, eta, beta, C, gamma, eps, F and mu (= 1)."""
    k: Mapping[str, float]
    """Training domain -> its Domain-specific Learnable Coefficient K (geometric mean 1)."""
    huber: float
    """In-sample mean Huber loss of log residuals (delta ``huber_delta``), over all training domains."""
    r2: float
    """In-sample R^2 on loss, over all training domains."""
    n_points: int
    """Probe points the law was fitted on (all training domains)."""
    huber_delta: float = HUBER_DELTA
    """Huber delta on log-loss residuals used by the fit (> 0)."""
    k_range: tuple[float, float] | None = None
    """(K_min, K_max), the bounds an unseen domain's K is estimated in: the training domains' range widened
    ``K_MARGIN`` (10) times at each end (None for a fit made before the range was recorded)."""
    at_bound: Mapping[str, str | None] | None = None
    """As ``LawFit.at_bound`` ({parameter: 'lower' | 'upper' | None}), the floors named E_<domain>."""

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
                "huber_delta": float(self.huber_delta),
                "k_range": None if self.k_range is None else [float(x) for x in self.k_range],
                "at_bound": None if self.at_bound is None else dict(self.at_bound)}


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
    k = {str(d): F / float(v) for d, v in zip(domains, floors)}
    k_range = (min(k.values()) / K_MARGIN, max(k.values()) * K_MARGIN)
    at = prob.at_bounds(theta)
    at = {(f"E_{domains[int(n[2:])]}" if n.startswith("E_") else n): v for n, v in at.items()}
    fit = CrossDomainFit(target, params, k, 0.0, 0.0, data.n, huber_delta, k_range, at)
    pred = np.empty(data.n)
    for d in domains:
        m = data.domain == d
        pred[m] = fit.predict(data.N[m], data.D[m], data.r_d[m], str(d))
    met = _metrics(pred, data.loss, huber_delta)
    return CrossDomainFit(target, params, k, met["huber"], met["r2"], data.n, huber_delta, k_range, at)


def split_early(points, n_early: int = 3, max_n_params: float | None = None
                ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Split points into the first ``n_early`` checkpoints (smallest tokens) of each run and the
    rest. Runs are (n_params, domain_ratio[, domain][, seed]). With ``max_n_params`` only runs of
    at most that size contribute early points (a cheaper signal: ``estimation_cost``); every other
    point is in the rest. Returns two dicts of numpy arrays with all input columns. Raises
    ValueError for missing/invalid n_params, tokens, domain_ratio, or no early point."""
    names = _column_names(points)
    data = _load(points, None)
    if "domain" in names:
        data = _Data(data.N, data.D, data.r_d, data.loss, np.asarray(points["domain"]).astype(str),
                     data.seed)
    runs = data.runs()
    early = np.zeros(data.n, bool)
    for run in np.unique(runs):
        members = np.flatnonzero(runs == run)
        if max_n_params is not None and data.N[members[0]] > max_n_params:
            continue
        early[members[np.argsort(data.D[members])][:n_early]] = True
    if not early.any():
        raise ValueError(f"split_early: no run has n_params <= max_n_params={max_n_params}")
    cols = {c: np.asarray(points[c]) for c in names}
    return ({c: v[early] for c, v in cols.items()}, {c: v[~early] for c, v in cols.items()})


def _phi_problem(fit: CrossDomainFit, data: _Data):
    """The 1-parameter problem of an unseen domain: its floor Phi = F / K^mu with the shared
    terms frozen. Returns (objective over an array of log Phi, (lo, hi) of log Phi)."""
    shared = fit.predict(data.N, data.D, data.r_d, 1.0) - fit.params["F"]
    delta = fit.huber_delta
    logy = np.log(data.loss)
    F, mu = fit.params["F"], fit.params["mu"]
    hi = float(logy.min())  # the floor cannot exceed a loss: the shared terms are >= 0
    if fit.k_range is None:  # a fit from before the K range was recorded: the old grid
        lo = math.log(1e-6)
    else:
        k_lo, k_hi = fit.k_range
        lo = math.log(F / k_hi ** mu)
        hi = min(hi, math.log(F / k_lo ** mu))
    lo = min(lo, hi)

    def obj(lphi):
        lphi = np.atleast_1d(np.asarray(lphi, dtype=float))
        res = np.log(shared[None, :] + np.exp(lphi)[:, None]) - logy[None, :]
        return np.mean(huber(res, delta), axis=1)

    return obj, (lo, hi)


def _fit_phi(obj, lo: float, hi: float, n_grid: int = 400) -> float:
    if hi - lo < 1e-12:
        return lo
    grid = np.linspace(lo, hi, n_grid)
    vals = obj(grid)
    i = int(np.argmin(vals))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, n_grid - 1)]
    x = minimize_scalar(lambda z: float(obj(z)[0]), bounds=(a, b), method="bounded").x
    return float(x) if obj(x)[0] <= vals[i] else float(grid[i])


def estimate_k(fit: CrossDomainFit, early_points) -> float:
    """Domain-specific Learnable Coefficient K of an unseen domain from its cheap early points.

    Method (ours; the exact K is open, see docs/mixture.md): the shared parameters stay frozen and
    the one unknown, the domain's floor Phi = F / K^mu, is fitted to the early points (e.g. the
    first 2-3 checkpoints of a few small runs, ``split_early``) by the same Huber loss on log
    residuals (dense grid over log Phi, then bounded refinement). Phi is bounded above by the
    smallest early loss and K to ``fit.k_range`` (the training domains' K widened 10x at each
    end): a domain the shared terms already over-predict no longer drives Phi to 0 and K to
    ~1e5. The initial loss fixes the level; the early slope is predicted by the shared D term
    rather than fitted. We chose this over a map (initial loss, early slope) -> log K learned
    across training domains because that map would be fitted on as few points as there are
    training domains (3-6). Returns K (> 0); ``estimate_k_interval`` adds its bootstrap interval
    and whether it sits on a bound.
    Raises ValueError for invalid points (as ``fit_law``); any number of points >= 1 is accepted.
    """
    data = _load(early_points, LOSS_COLUMN[fit.target])
    obj, (lo, hi) = _phi_problem(fit, data)
    lphi = _fit_phi(obj, lo, hi)
    return float((fit.params["F"] / math.exp(lphi)) ** (1.0 / fit.params["mu"]))


def estimate_k_interval(fit: CrossDomainFit, early_points, n_boot: int = 100, seed: int = 0,
                        level: float = 95.0) -> dict[str, Any]:
    """K of an unseen domain (``estimate_k``) with a bootstrap interval: the early points'
    runs (n_params, domain_ratio[, seed]) resampled with replacement ``n_boot`` times and Phi refitted
    (shared parameters held at ``fit``: the interval is conditional on the shared fit).

    Returns {K, K_lo, K_hi (central ``level`` percent), K_min, K_max (the bounds, None for an
    old fit), K_at_bound (bool: K within 1e-3 relative of a bound), n_boot}. Raises ValueError
    for invalid points, n_boot < 0 or level outside (0, 100).
    """
    if n_boot < 0 or not 0.0 < level < 100.0:
        raise ValueError(f"n_boot must be >= 0 and level in (0, 100), got {n_boot}, {level}")
    data = _load(early_points, LOSS_COLUMN[fit.target])
    F, mu = fit.params["F"], fit.params["mu"]
    to_k = lambda lphi: float((F / math.exp(lphi)) ** (1.0 / mu))  # noqa: E731
    obj, (lo, hi) = _phi_problem(fit, data)
    lphi = _fit_phi(obj, lo, hi)
    K = to_k(lphi)
    runs = data.runs()
    run_ids = np.unique(runs)
    members = {r: np.flatnonzero(runs == r) for r in run_ids}
    rng = np.random.default_rng(seed)
    ks = []
    for _ in range(n_boot):
        idx = np.concatenate([members[r] for r in rng.choice(run_ids, size=len(run_ids), replace=True)])
        o, (a, b) = _phi_problem(fit, data.take(idx))
        ks.append(to_k(_fit_phi(o, a, b, n_grid=100)))
    q = (50.0 - level / 2.0, 50.0 + level / 2.0)
    k_lo, k_hi = (float(x) for x in np.percentile(ks, q)) if ks else (float("nan"), float("nan"))
    k_min, k_max = to_k(hi), to_k(lo)  # Phi's upper bound is K's lower bound
    at = bool(abs(K / k_min - 1) < 1e-3 or abs(K / k_max - 1) < 1e-3)
    return {"K": K, "K_lo": k_lo, "K_hi": k_hi,
            "K_min": k_min if fit.k_range is not None else None,
            "K_max": k_max if fit.k_range is not None else None,
            "K_at_bound": at, "n_boot": len(ks)}


def _run_flops(data: _Data, flops_per_param_token: float) -> float:
    runs = data.runs()
    return float(sum(flops_per_param_token * data.N[runs == r][0] * data.D[runs == r].max()
                     for r in np.unique(runs)))


def estimation_cost(early_points, all_points, flops_per_param_token: float = 6.0) -> dict[str, float]:
    """Training compute behind K versus behind a full fit, C = 6 N D per run (arXiv 2406.01375
    §3 reports K from early signals at about 1% of the training cost).

    Each run (n_params, domain_ratio[, seed]) counts once, trained to its last point in the set:
    ``early_points`` (e.g. ``split_early``'s first part) is what estimating K needs, ``all_points``
    the full grid. Pass one domain's points: the sub-domains are scored on the same physical runs.
    Returns {flops_k, flops_full, fraction}. Raises ValueError for invalid points.
    """
    early = _load(early_points, None)
    full = _load(all_points, None)
    fk, ff = _run_flops(early, flops_per_param_token), _run_flops(full, flops_per_param_token)
    return {"flops_k": fk, "flops_full": ff, "fraction": fk / ff}


def predict_unseen_domain(fit: CrossDomainFit, K: float, N, D, r_d) -> np.ndarray:
    """Predicted loss (nats/token) of an unseen domain with coefficient K (``estimate_k``) at
    N parameters, D tokens and domain ratio r_d (broadcast arrays)."""
    return fit.predict(N, D, r_d, K)


def evaluate_unseen_domain(fit: CrossDomainFit, early_points, later_points,
                           n_boot: int = 100) -> dict[str, float]:
    """Estimate K from ``early_points`` and score predictions of ``later_points`` (the same
    domain's real later checkpoints): {K, K_lo, K_hi (95% bootstrap over early runs), K_min,
    K_max (bounds; NaN for an old fit), K_at_bound (1.0 / 0.0), huber, r2, mare (mean
    |pred/obs - 1|), n_early, n_later, flops_k, flops_full, compute_fraction (``estimation_cost``
    with early + later as the full grid)}. Every value is a float. Raises ValueError for invalid
    points."""
    est = estimate_k_interval(fit, early_points, n_boot=n_boot)
    K = est["K"]
    later = _load(later_points, LOSS_COLUMN[fit.target])
    pred = fit.predict(later.N, later.D, later.r_d, K)
    m = _metrics(pred, later.loss, fit.huber_delta)
    n_early = len(np.asarray(early_points["n_params"]))
    early = _load(early_points, None)
    both = _Data(np.concatenate([early.N, later.N]), np.concatenate([early.D, later.D]),
                 np.concatenate([early.r_d, later.r_d]), np.concatenate([early.loss, later.loss]),
                 None, None if early.seed is None or later.seed is None
                 else np.concatenate([early.seed, later.seed]))
    fk, ff = _run_flops(early, 6.0), _run_flops(both, 6.0)
    nan = float("nan")
    return {"K": K, "K_lo": est["K_lo"], "K_hi": est["K_hi"],
            "K_min": nan if est["K_min"] is None else est["K_min"],
            "K_max": nan if est["K_max"] is None else est["K_max"],
            "K_at_bound": float(est["K_at_bound"]), **m, "n_early": n_early, "n_later": later.n,
            "flops_k": fk, "flops_full": ff, "compute_fraction": fk / ff}


def leave_one_domain_out(points, held: str, huber_delta: float = HUBER_DELTA, early_checkpoints: int = 2,
                         target: str = "domain") -> dict[str, Any]:
    """One fold of the Cross-Domain law's leave-one-domain-out score (arXiv 2406.01375 §3.2): fit
    the shared parameters on every sub-domain but ``held``, estimate ``held``'s K from its first
    ``early_checkpoints`` checkpoints per run (``split_early``) and predict its later ones.

    ``points``: a long table (polars DataFrame or dict of arrays) with a ``domain`` column, one row
    per (run, checkpoint, sub-domain), as ``fit_cross_domain`` takes. Returns {unseen_domain, K,
    r2, mare, mare_without_K (the same prediction with K = 1, the training domains' mean floor),
    early_points, later_points}, rounded to 4 decimals. Raises ValueError when ``held`` has no
    point or the fit's inputs are invalid."""
    domain = np.asarray(points["domain"]).astype(str)
    if not (domain == held).any():
        raise ValueError(f"leave_one_domain_out: no point of sub-domain {held!r}")
    cols = {c: np.asarray(points[c]) for c in _column_names(points)}
    cols["domain"] = domain
    train = {c: v[domain != held] for c, v in cols.items()}
    test = {c: v[domain == held] for c, v in cols.items()}
    cd = fit_cross_domain(train, target, huber_delta=huber_delta)
    early, later = split_early(test, early_checkpoints)
    ev = evaluate_unseen_domain(cd, early, later)
    col = LOSS_COLUMN[target]
    base = predict_unseen_domain(cd, 1.0, later["n_params"], later["tokens"], later["domain_ratio"])
    return {"unseen_domain": held, "K": round(ev["K"], 4), "r2": round(ev["r2"], 4), "mare": round(ev["mare"], 4),
            "mare_without_K": round(float(np.mean(np.abs(base / later[col] - 1))), 4),
            "early_points": len(early["tokens"]), "later_points": len(later["tokens"])}
