"""The three usages of a fitted D-CPT Law (arXiv 2406.01375 §3): the answer of each is a
``MixturePlan``.

1. Trade-off (``tradeoff_ratio``): the domain ratio r_d that minimises the domain loss while the
   general loss rises by at most a fraction T.
2. Limited domain data (``limited_domain``): with a fixed number of domain tokens, the r_d (and so
   the total CPT tokens) that minimises the domain loss under the same constraint.
3. Resource allocation (``allocate_compute``): with fixed CPT compute C = k N D at a given r_d, the
   model size N (and tokens D) that minimises the predicted loss.

Source: Que et al., arXiv 2406.01375 (NeurIPS 2024), §3 (usages of the D-CPT Law). The search
(dense grid, then bounded 1-D refinement or a root of the constraint) and the bootstrap spread of
the answer are ours: docs/mixture.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from scipy.optimize import brentq, minimize_scalar

from .fit import LawFit
from .forms import _positive
from .heldout import Bootstrap


def _spread(plans: Sequence["MixturePlan"], q: tuple[float, float]) -> dict[str, Any]:
    out: dict[str, Any] = {"q": list(q), "n_boot": len(plans)}
    for key in ("r_d", "n_params", "tokens", "loss_domain", "loss_general"):
        vals = np.array([getattr(p, key) for p in plans if getattr(p, key) is not None], float)
        if len(vals):
            lo, hi = np.percentile(vals, q)
            out[key] = [float(lo), float(hi)]
    return out


# --------------------------------------------------------------------------------------------
# The three usages (arXiv 2406.01375 §3: trade-off, limited domain data, resource allocation)


@dataclass(frozen=True)
class MixturePlan:
    """Answer of one usage with its predicted losses (nats/token)."""

    usage: str
    """The usage answered: 'tradeoff', 'limited_domain' or 'allocate_compute'."""
    r_d: float
    """Domain ratio of the CPT mixture, in [0, 1]."""
    n_params: float
    """Model size N (non-embedding parameters)."""
    tokens: float
    """CPT tokens D (limited_domain: domain tokens / r_d; allocate_compute: C / (k N))."""
    loss_domain: float | None
    """Predicted domain loss at the answer (nats/token); None when allocate_compute fits the general law."""
    loss_general: float | None
    """Predicted general loss at the answer (nats/token); None when allocate_compute had no general law."""
    loss_general_base: float | None
    """L_g0, the general loss the rise is measured against (nats/token): the measured one when passed, else
    the general law at r_d = 0 and the same N, D; None without a general law."""
    max_rel_increase: float | None
    """T, the allowed relative rise of the general loss over L_g0 (None: no general-loss constraint)."""
    status: str
    """'constrained' (the general-loss constraint binds at the answer), 'unconstrained' (the best point of
    the search range satisfies it) or 'infeasible' (no candidate does; see each usage for the answer then)."""
    all_feasible: bool
    """Every point of the search grid satisfies the general-loss constraint."""
    spread: Mapping[str, Any] | None = None
    """With ``boot=``: {field: [lo, hi]} percentiles over the bootstrap refits, plus ``q`` and ``n_boot``."""

    @property
    def feasible(self) -> bool:
        return self.status != "infeasible"

    @property
    def domain_tokens(self) -> float:
        return self.r_d * self.tokens

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["spread"] = dict(self.spread) if self.spread is not None else None
        d.update(feasible=self.feasible, domain_tokens=self.domain_tokens)
        return d


def _argmin_constrained(f: Callable[[np.ndarray], np.ndarray],
                        g: Callable[[np.ndarray], np.ndarray] | None,
                        lo: float, hi: float, n_grid: int):
    """Minimise f on [lo, hi] subject to g <= 0: dense grid, then a bounded 1-D refinement
    around the best feasible grid point, or a root of g where a neighbour is infeasible.
    Returns (x, status, ok): ok is the grid's feasibility mask; x is None when none is."""
    xs = np.linspace(lo, hi, n_grid)
    fx = f(xs)
    ok = np.ones(n_grid, bool) if g is None else g(xs) <= 0
    if not ok.any():
        return None, "infeasible", ok
    i = int(np.flatnonzero(ok)[np.argmin(fx[ok])])
    best_x, best_f = xs[i], fx[i]
    a, b = xs[max(i - 1, 0)], xs[min(i + 1, n_grid - 1)]
    cand = []
    if b > a:
        res = minimize_scalar(lambda x: float(f(np.array([x]))[0]), bounds=(a, b),
                              method="bounded", options={"xatol": 1e-10 * max(1.0, abs(hi))})
        cand.append(res.x)
    if g is not None:
        for j in (i - 1, i + 1):
            if 0 <= j < n_grid and not ok[j]:
                gi = lambda x: float(g(np.array([x]))[0])  # noqa: E731
                root = brentq(gi, min(xs[i], xs[j]), max(xs[i], xs[j]), xtol=1e-12)
                # step to the feasible side of the root
                cand.append(root + (1e-12 if j < i else -1e-12))
    for x in cand:
        x = float(np.clip(x, lo, hi))
        if g is not None and g(np.array([x]))[0] > 1e-10:  # feasible up to float error
            continue
        fv = float(f(np.array([x]))[0])
        if fv < best_f:
            best_x, best_f = x, fv
    binding = g is not None and abs(float(g(np.array([best_x]))[0])) < 1e-6
    return float(best_x), ("constrained" if binding else "unconstrained"), ok


def _check_pair(fit_general: LawFit, fit_domain: LawFit) -> None:
    if fit_general.target != "general":
        raise ValueError(
            f"fit_general must be fitted on target 'general', got {fit_general.target!r}")
    if fit_domain.target != "domain":
        raise ValueError(
            f"fit_domain must be fitted on target 'domain', got {fit_domain.target!r}")


def tradeoff_ratio(fit_general: LawFit, fit_domain: LawFit, N: float, D: float, T: float = 0.03,
                   L_g0: float | None = None, n_grid: int = 2001,
                   boot: tuple[Bootstrap, Bootstrap] | None = None,
                   q: tuple[float, float] = (10, 90)) -> MixturePlan:
    """Usage 1, trade-off (arXiv 2406.01375 §3): the domain ratio r_d in [0, 1] that minimises the
    predicted domain loss L_d(N, D, r_d) subject to (L_g(N, D, r_d) - L_g0) / L_g0 <= T.

    N: parameters, D: CPT tokens (scalars). L_g0: the base model's general loss before CPT
    (nats/token; pass the measured one). None uses fit_general at r_d = 0 with the same N and D
    (same training budget spent on general data only). Search: ``n_grid``-point grid on [0, 1]
    refined by bounded 1-D minimisation or by a root of the constraint. If no r_d > 0 satisfies
    the constraint the answer is r_d = 0 with status 'infeasible'. ``boot`` = (bootstrap of the
    general law, bootstrap of the domain law) adds the q-percentile spread of the answer.
    Raises ValueError if the fits' targets are swapped or N, D are not positive.
    """
    _check_pair(fit_general, fit_domain)
    N, D = _positive("N", N), _positive("D", D)
    base = float(fit_general.predict(N, D, 0.0)) if L_g0 is None else _positive("L_g0", L_g0)
    r, status, ok = _argmin_constrained(
        lambda x: fit_domain.predict(N, D, x),
        lambda x: (fit_general.predict(N, D, x) - base) / base - T, 0.0, 1.0, n_grid)
    if not ok[1:].any():  # no r_d > 0 (to grid resolution 1 / (n_grid - 1)) is feasible
        r, status = 0.0, "infeasible"
    spread = None
    if boot is not None:
        spread = _spread([tradeoff_ratio(g, d, N, D, T, L_g0, n_grid)
                          for g, d in zip(boot[0].fits, boot[1].fits)], q)
    return MixturePlan("tradeoff", r, N, D, float(fit_domain.predict(N, D, r)),
                       float(fit_general.predict(N, D, r)), base, T, status, bool(ok.all()),
                       spread)


def limited_domain(fit_general: LawFit, fit_domain: LawFit, N: float, domain_tokens: float,
                   T: float = 0.03, L_g0: float | None = None, max_tokens: float | None = None,
                   r_min: float = 1e-3, n_grid: int = 2001,
                   boot: tuple[Bootstrap, Bootstrap] | None = None,
                   q: tuple[float, float] = (10, 90)) -> MixturePlan:
    """Usage 2, limited domain data (arXiv 2406.01375 §3): domain tokens D_d are fixed, so a
    ratio r_d implies D = D_d / r_d CPT tokens. Chooses r_d in [r_lo, 1] minimising
    L_d(N, D_d / r_d, r_d) subject to the general-loss constraint of ``tradeoff_ratio``, with
    r_lo = max(r_min, D_d / max_tokens) (max_tokens caps the total CPT budget).

    L_g0 None compares each candidate with fit_general at r_d = 0 and the same D = D_d / r_d.
    status 'infeasible' (no r_d in range satisfies the constraint) returns r_d = r_lo.
    Returns the plan with tokens = D_d / r_d. ``boot`` as in ``tradeoff_ratio``.
    Raises ValueError for swapped fits or non-positive N, domain_tokens, max_tokens.
    """
    _check_pair(fit_general, fit_domain)
    N, Dd = _positive("N", N), _positive("domain_tokens", domain_tokens)
    r_lo = r_min if max_tokens is None else max(r_min, Dd / _positive("max_tokens", max_tokens))
    if r_lo >= 1.0:
        raise ValueError(f"max_tokens={max_tokens} is below domain_tokens={Dd}: no ratio fits")

    def g(x):
        lg = fit_general.predict(N, Dd / x, x)
        b = fit_general.predict(N, Dd / x, 0.0) if L_g0 is None else L_g0
        return (lg - b) / b - T

    r, status, ok = _argmin_constrained(lambda x: fit_domain.predict(N, Dd / x, x), g,
                                        r_lo, 1.0, n_grid)
    if r is None:
        r, status = r_lo, "infeasible"
    D = Dd / r
    base = float(fit_general.predict(N, D, 0.0)) if L_g0 is None else float(L_g0)
    spread = None
    if boot is not None:
        spread = _spread([limited_domain(g_, d_, N, Dd, T, L_g0, max_tokens, r_min, n_grid)
                          for g_, d_ in zip(boot[0].fits, boot[1].fits)], q)
    return MixturePlan("limited_domain", r, N, D, float(fit_domain.predict(N, D, r)),
                       float(fit_general.predict(N, D, r)), base, T, status, bool(ok.all()),
                       spread)


def allocate_compute(fit: LawFit, C: float, r_d: float, flops_per_param_token: float = 6.0,
                     fit_general: LawFit | None = None, T: float = 0.03,
                     n_bounds: tuple[float, float] = (1e4, 1e13), n_grid: int = 2001,
                     boot: Bootstrap | None = None, boot_general: Bootstrap | None = None,
                     q: tuple[float, float] = (10, 90)) -> MixturePlan:
    """Usage 3, resource allocation (arXiv 2406.01375 §3): fixed CPT compute C (FLOPs) with
    C = k N D (k = ``flops_per_param_token``, 6 for a dense transformer) at ratio r_d; chooses
    N in ``n_bounds`` (and D = C / (k N) >= 1) minimising ``fit``'s predicted loss. Search is a
    log-spaced grid refined by bounded 1-D minimisation in log N.

    With a domain ``fit`` and ``fit_general``, N must also keep the general loss within T of the
    same-size model trained on the same tokens with r_d = 0 (a scalar base loss cannot serve:
    the base model changes with N). If no N satisfies it, the answer is the N with the smallest
    violation, status 'infeasible'. ``boot`` (and ``boot_general``, paired by seed) add spread.
    Raises ValueError for non-positive C, r_d outside [0, 1], fit_general with a general fit.
    """
    C = _positive("C", C)
    k = _positive("flops_per_param_token", flops_per_param_token)
    if not 0.0 <= r_d <= 1.0:
        raise ValueError(f"r_d must lie in [0, 1], got {r_d!r}")
    if fit_general is not None and (fit.target != "domain" or fit_general.target != "general"):
        raise ValueError("a general-loss constraint needs fit.target 'domain' and "
                         "fit_general.target 'general'")
    lo, hi = math.log(n_bounds[0]), min(math.log(n_bounds[1]), math.log(C / k))
    if hi <= lo:
        raise ValueError(f"C={C:g} is too small for n_bounds={n_bounds} (needs D >= 1)")

    def f(x):
        n = np.exp(x)
        return fit.predict(n, C / (k * n), r_d)

    g = None
    if fit_general is not None:
        def g(x):
            n = np.exp(x)
            b = fit_general.predict(n, C / (k * n), 0.0)
            return (fit_general.predict(n, C / (k * n), r_d) - b) / b - T

    x, status, ok = _argmin_constrained(f, g, lo, hi, n_grid)
    if x is None:
        xs = np.linspace(lo, hi, n_grid)
        x, status = float(xs[np.argmin(g(xs))]), "infeasible"
    N = math.exp(x)
    D = C / (k * N)
    loss = float(fit.predict(N, D, r_d))
    lg = loss if fit.target == "general" else (
        float(fit_general.predict(N, D, r_d)) if fit_general is not None else None)
    base = float(fit_general.predict(N, D, 0.0)) if fit_general is not None else None
    spread = None
    if boot is not None:
        gens = boot_general.fits if boot_general is not None else [None] * len(boot.fits)
        spread = _spread([allocate_compute(fi, C, r_d, k, gi, T, n_bounds, n_grid)
                          for fi, gi in zip(boot.fits, gens)], q)
    return MixturePlan("allocate_compute", float(r_d), N, D,
                       loss if fit.target == "domain" else None, lg, base,
                       T if fit_general is not None else None, status, bool(ok.all()), spread)
