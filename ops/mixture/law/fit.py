"""Fitting one D-CPT Law form to probe points: the optimiser's problem (``_Problem``), the
fitted law (``LawFit``), ``fit_law`` and ``compare_forms``.

Source: Que et al., arXiv 2406.01375 (NeurIPS 2024), §3 (fitting the law; comparison of the
parameterisations) and §4 (fit quality). Forms, units and probe-point columns: ``forms``.

Fitting follows Hoffmann et al. (Chinchilla, approach 3) as replicated by Besiroglu et al. (2024):
Huber loss on log-loss residuals, L-BFGS-B from a grid of starts, best kept. Three choices of ours
(docs/mixture.md lists the details as open): (i) the optimiser works in a reparameterisation -- log
coefficients, and the N and D power terms centred on the data's geometric-mean N and D, so that the
coefficient and its exponent are not the nearly collinear pair they are at N ~ 1e6; (ii) starting
points come from a grid over the exponents (and eps) with the linear coefficients (E, A, B, C)
solved by non-negative least squares for each grid point (variable projection), and only the
``n_starts`` best grid points are refined; (iii) the objective carries an analytic gradient.
numpy/scipy only (threadpoolctl, if installed, pins BLAS to one thread during fits); no torch,
no dagster.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from scipy.optimize import minimize, nnls

from .forms import (
    _E_MIN,
    _EPS_RANGE,
    _EXPONENT_MAX,
    _GRID_RANGES,
    _LOG_COEF_MIN,
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
    huber,
)


def _one_blas_thread(fn):
    """Run ``fn`` with BLAS limited to one thread. scipy's L-BFGS-B calls BLAS on tiny arrays;
    a multi-threaded OpenBLAS then spends its time waking threads (measured 10x slower fits on
    a shared 2-core box). threadpoolctl (a scikit-learn dependency) is optional."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            from threadpoolctl import threadpool_limits
            limit = threadpool_limits(1, user_api="blas")
        except ImportError:  # pragma: no cover - fall back to whatever BLAS does
            limit = contextlib.nullcontext()
        with limit:
            return fn(*args, **kwargs)

    return wrapper


# --------------------------------------------------------------------------------------------
# The fitting problem in the optimiser's coordinates
#
# theta = [e_0..e_{G-1}, a, alpha, b, (eta), beta, (c, gamma, leps)] with
#   E_g = exp(e_g)                       (one floor per group; G = 1 except cross-domain)
#   A / N^alpha        = exp(a - alpha * xN),   xN = log N - mean(log N)
#   B r^eta / D^beta   = exp(b - beta * xD + eta * log r)   (0 at r = 0), xD likewise
#   C / (r + eps)^gamma = exp(c - gamma * log(r + eps)),   eps = exp(leps)


@dataclass
class _Problem:
    form: LawForm
    xN: np.ndarray
    xD: np.ndarray
    r: np.ndarray
    logy: np.ndarray
    group: np.ndarray
    n_groups: int
    lN0: float
    lD0: float
    delta: float
    names: list[str] = field(init=False)
    bounds: list[tuple[float, float]] = field(init=False)

    def __post_init__(self) -> None:
        self.rpos = self.r > 0
        self.logr = np.log(np.where(self.rpos, self.r, 1.0))
        f = self.form
        self.names = [f"e{g}" for g in range(self.n_groups)] + ["a", "alpha", "b"]
        self.names += ["eta"] if f.has_eta else []
        self.names += ["beta"] + (["c", "gamma", "leps"] if f.has_c else [])
        top = float(self.logy.max())
        box = {
            "a": (_LOG_COEF_MIN, top + 1.0),
            "b": (_LOG_COEF_MIN, top + 1.0),
            "c": (_LOG_COEF_MIN, top + 1.0),
            "alpha": f.bounds["alpha"],
            "beta": f.bounds["beta"],
            "eta": (0.0, _EXPONENT_MAX),
            "gamma": (0.0, _EXPONENT_MAX),
            "leps": (math.log(_EPS_RANGE[0]), math.log(_EPS_RANGE[1])),
        }
        self.bounds = [
            (math.log(_E_MIN), top) if n.startswith("e") and n[1:].isdigit() else box[n]
            for n in self.names
        ]
        self.idx = {n: i for i, n in enumerate(self.names)}

    @classmethod
    def build(cls, form: LawForm, data: _Data, target: str, delta: float,
              group: np.ndarray | None = None, n_groups: int = 1) -> "_Problem":
        lN, lD = np.log(data.N), np.log(data.D)
        lN0, lD0 = float(lN.mean()), float(lD.mean())
        g = np.zeros(data.n, dtype=int) if group is None else group
        return cls(form, lN - lN0, lD - lD0, _law_ratio(data.r_d, target), np.log(data.loss),
                   g, n_groups, lN0, lD0, delta)

    def shared_terms(self, theta: np.ndarray, grad: bool = False):
        """Sum of the N, D and r terms (no floor) and, if asked, their partials."""
        t = dict(zip(self.names, theta))
        tA = np.exp(t["a"] - t["alpha"] * self.xN)
        expo = t["b"] - t["beta"] * self.xD
        if self.form.has_eta:
            tB = np.where(self.rpos, np.exp(expo + t["eta"] * self.logr), 0.0)
        else:
            tB = np.exp(expo)
        total = tA + tB
        parts = {"a": tA, "alpha": -self.xN * tA, "b": tB, "beta": -self.xD * tB}
        if self.form.has_eta:
            parts["eta"] = tB * self.logr
        if self.form.has_c:
            eps = math.exp(t["leps"])
            lre = np.log(self.r + eps)
            tC = np.exp(t["c"] - t["gamma"] * lre)
            total = total + tC
            parts.update(c=tC, gamma=-lre * tC, leps=-t["gamma"] * tC * eps / (self.r + eps))
        return (total, parts) if grad else total

    def objective(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean Huber of log residuals / delta^2 (so L-BFGS-B's tolerances see O(1) values)."""
        total, parts = self.shared_terms(theta, grad=True)
        floor = np.exp(theta[: self.n_groups])[self.group]
        pred = floor + total
        res = np.log(pred) - self.logy
        n, d2 = len(res), self.delta**2
        value = float(np.mean(huber(res, self.delta))) / d2
        w = np.clip(res, -self.delta, self.delta) / pred / (n * d2)  # dHuber/dpred per point
        grad = np.empty_like(theta)
        grad[: self.n_groups] = np.bincount(self.group, weights=w * floor, minlength=self.n_groups)
        for name, dp in parts.items():
            grad[self.idx[name]] = float(w @ dp)
        return value, grad

    # -- starting points ------------------------------------------------------------------

    def grid_starts(self, n_grid: int, n_starts: int) -> list[np.ndarray]:
        """Best ``n_starts`` points of an exponent grid, linear coefficients by NNLS on loss."""
        levels = {k: np.geomspace(*_GRID_RANGES[k], n_grid) for k in _GRID_RANGES}
        nonlin = ["alpha"] + (["eta"] if self.form.has_eta else []) + ["beta"]
        nonlin += ["gamma", "eps"] if self.form.has_c else []
        y = np.exp(self.logy)
        onehot = np.zeros((len(y), self.n_groups))
        onehot[np.arange(len(y)), self.group] = 1.0
        scored = []
        for combo in itertools.product(*(levels[k] for k in nonlin)):
            v = dict(zip(nonlin, combo))
            cols = [onehot, np.exp(-v["alpha"] * self.xN)[:, None]]
            colB = np.exp(-v["beta"] * self.xD)
            if self.form.has_eta:
                colB = colB * np.where(self.rpos, np.exp(v["eta"] * self.logr), 0.0)
            cols.append(colB[:, None])
            if self.form.has_c:
                cols.append(((self.r + v["eps"]) ** -v["gamma"])[:, None])
            coef, _ = nnls(np.hstack(cols), y)
            theta = self._theta_from(coef, v)
            scored.append((self.objective(theta)[0], theta))
        scored.sort(key=lambda s: s[0])
        return [th for _, th in scored[:n_starts]]

    def _theta_from(self, coef: np.ndarray, v: Mapping[str, float]) -> np.ndarray:
        G = self.n_groups
        logc = np.log(np.maximum(coef, 1e-300))
        vals = {f"e{g}": logc[g] for g in range(G)}
        vals.update(a=logc[G], alpha=v["alpha"], b=logc[G + 1], beta=v["beta"])
        if self.form.has_eta:
            vals["eta"] = v["eta"]
        if self.form.has_c:
            vals.update(c=logc[G + 2], gamma=v["gamma"], leps=math.log(v["eps"]))
        return self.clip(np.array([vals[n] for n in self.names]))

    def clip(self, theta: np.ndarray) -> np.ndarray:
        lo, hi = np.array(self.bounds).T
        return np.clip(theta, lo, hi)

    def theta_from_params(self, p: Mapping[str, float]) -> np.ndarray:
        """Optimiser coordinates from natural parameters (single-floor problems)."""
        vals = {"e0": math.log(max(p["E"], _E_MIN)), "alpha": p["alpha"], "beta": p["beta"],
                "a": math.log(max(p["A"], 1e-300)) - p["alpha"] * self.lN0,
                "b": math.log(max(p["B"], 1e-300)) - p["beta"] * self.lD0}
        if self.form.has_eta:
            vals["eta"] = p["eta"]
        if self.form.has_c:
            vals.update(c=math.log(max(p["C"], 1e-300)), gamma=p["gamma"], leps=math.log(p["eps"]))
        return self.clip(np.array([vals[n] for n in self.names]))

    def natural(self, theta: np.ndarray) -> dict[str, float]:
        """Natural parameters of the shared terms (no floor) from optimiser coordinates."""
        t = dict(zip(self.names, theta))
        p = {"A": math.exp(t["a"] + t["alpha"] * self.lN0), "alpha": t["alpha"],
             "B": math.exp(t["b"] + t["beta"] * self.lD0), "beta": t["beta"]}
        if self.form.has_eta:
            p["eta"] = t["eta"]
        if self.form.has_c:
            p.update(C=math.exp(t["c"]), gamma=t["gamma"], eps=math.exp(t["leps"]))
        return {k: float(v) for k, v in p.items()}

    def solve(self, n_grid: int, n_starts: int, extra: Sequence[np.ndarray] = ()) -> np.ndarray:
        """L-BFGS-B from the best grid starts (and any extra starts); best optimum kept."""
        if n_grid < 1 or n_starts < 1:
            raise ValueError(f"n_grid and n_starts must be >= 1, got {n_grid}, {n_starts}")
        best_val, best = math.inf, None
        for x0 in list(extra) + self.grid_starts(n_grid, n_starts):
            out = minimize(self.objective, x0, jac=True, method="L-BFGS-B", bounds=self.bounds,
                           options={"maxiter": 1000, "ftol": 1e-11, "gtol": 1e-8})
            if out.fun < best_val:
                best_val, best = float(out.fun), out.x
        return best


# --------------------------------------------------------------------------------------------
# Single-domain fits


@dataclass(frozen=True)
class LawFit:
    """A fitted D-CPT law for one target loss (arXiv 2406.01375 §3).

    ``params`` are natural parameters of ``FORMS[form]`` in the law's own ratio (r = r_d for
    target 'domain', r = 1 - r_d for target 'general'). ``huber`` is the in-sample mean Huber
    loss of log residuals (delta ``huber_delta``), ``r2`` the in-sample R^2 on loss.
    """

    form: str
    target: str
    params: Mapping[str, float]
    huber: float
    r2: float
    n_points: int
    huber_delta: float = HUBER_DELTA

    def predict(self, N, D, r_d) -> np.ndarray:
        """Predicted loss (nats/token) at N parameters, D CPT tokens and domain ratio r_d.

        Arrays broadcast. Always pass r_d, the domain share of the mixture: the general-loss law
        is evaluated at r = 1 - r_d here, so callers never convert.
        """
        return FORMS[self.form].predict(self.params, N, D, _law_ratio(r_d, self.target))

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable summary (plain floats and strings)."""
        return {"form": self.form, "target": self.target,
                "params": {k: float(v) for k, v in self.params.items()},
                "huber": float(self.huber), "r2": float(self.r2),
                "n_points": int(self.n_points), "huber_delta": float(self.huber_delta)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LawFit":
        return cls(d["form"], d["target"], dict(d["params"]), d["huber"], d["r2"],
                   d["n_points"], d.get("huber_delta", HUBER_DELTA))


def _fit_data(data: _Data, target: str, form: LawForm, huber_delta: float, n_grid: int,
              n_starts: int, init: Mapping[str, float] | None = None) -> LawFit:
    n_free = len(form.param_names)
    _check_enough(data, form, n_free)
    prob = _Problem.build(form, data, target, huber_delta)
    extra = [prob.theta_from_params(init)] if init is not None else []
    theta = prob.solve(n_grid, n_starts, extra)
    params = {"E": float(math.exp(theta[0])), **prob.natural(theta)}
    params = {k: params[k] for k in form.param_names}
    pred = form.predict(params, data.N, data.D, _law_ratio(data.r_d, target))
    m = _metrics(pred, data.loss, huber_delta)
    return LawFit(form.name, target, params, m["huber"], m["r2"], data.n, huber_delta)


@_one_blas_thread
def fit_law(points, target: str, form: str = "L3", huber_delta: float = HUBER_DELTA,
            n_grid: int = N_GRID, n_starts: int = N_STARTS,
            init: Mapping[str, float] | None = None) -> LawFit:
    """Fit one D-CPT law form to probe points for the domain or the general loss.

    Minimises the mean Huber loss (``huber_delta``, default 1e-3) of log(pred) - log(obs) with
    L-BFGS-B inside each parameter's bounds (``FORMS[form].bounds``; E is also capped at the
    largest observed loss). Starts: a grid of ``n_grid`` levels per nonlinear parameter
    (alpha, beta, eta, gamma, eps as the form has them: 4^5 = 1024 grid points for L3) with the
    linear coefficients by NNLS; the ``n_starts`` best are refined (plus ``init``, natural
    parameters, if given). Deterministic. ~0.2-0.6 s for 150 points on one core.

    points: DataFrame or dict with n_params, tokens, domain_ratio and loss_<target> (n rows).
    target: 'domain' (law in r = r_d, fits loss_domain) or 'general' (r = 1 - r_d, loss_general).
    Raises ValueError for a missing column, non-finite or non-positive n_params/tokens/loss (with
    the row), domain_ratio outside [0, 1], fewer points than parameters + 1, or fewer than 2
    distinct n_params / tokens / domain_ratio (the last only for forms that use r).
    Source: arXiv 2406.01375 §3 (L3 and the Huber/L-BFGS fit); docs/mixture.md.
    """
    _check_target(target)
    f = _form(form)
    data = _load(points, LOSS_COLUMN[target])
    return _fit_data(data, target, f, huber_delta, n_grid, n_starts, init)


@_one_blas_thread
def compare_forms(points, target: str, forms: Sequence[str] = tuple(FORMS),
                  **fit_kwargs) -> dict[str, dict[str, Any]]:
    """In-sample fit quality of each form on the same points: {form: {huber, r2, n_params}}.

    The paper's comparison of parameterisations (arXiv 2406.01375 §3-§4); ours is L3 against the
    r-additive power form and Chinchilla. Same arguments and errors as ``fit_law``.
    """
    out = {}
    for name in forms:
        fit = fit_law(points, target, name, **fit_kwargs)
        out[name] = {"huber": fit.huber, "r2": fit.r2, "n_params": len(fit.params)}
    return out
