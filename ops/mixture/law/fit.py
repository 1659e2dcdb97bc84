"""The D-CPT Law: predict general and domain loss after continual pre-training (CPT) from model
size N, CPT tokens D and mixture ratio r, then choose the mixture on the fitted law.

Source: Que et al., "D-CPT Law: Domain-specific Continual Pre-Training Scaling Law for Large
Language Models", arXiv 2406.01375 (NeurIPS 2024): §3 (parameterisations, fitting, the three
usages, the Cross-Domain D-CPT Law) and §4 (fit quality and generalisation along N, D and r).
Spec and defaults: SEEDS.md §2.

Units everywhere: losses in nats/token, N in (non-embedding) parameters, D in tokens,
mixture ratios in [0, 1]. ``r_d`` is the share of domain-corpus tokens in the CPT mixture. The law
for the domain loss L_d is written in r = r_d, the law for the general loss L_g in r = 1 - r_d;
every public function takes r_d and does that conversion itself (``LawFit.predict``).

Probe points are a Polars DataFrame or a dict of equal-length arrays with columns ``n_params``,
``tokens``, ``domain_ratio``, ``loss_general``, ``loss_domain`` and (cross-domain law only)
``domain``. One *run* is one (n_params, domain_ratio[, domain]) CPT run; its checkpoints give D.

Fitting follows Hoffmann et al. (Chinchilla, approach 3) as replicated by Besiroglu et al. (2024):
Huber loss on log-loss residuals, L-BFGS-B from a grid of starts, best kept. Three choices of ours
(SEEDS.md marks the details [open]): (i) the optimiser works in a reparameterisation -- log
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
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from scipy.optimize import brentq, minimize, minimize_scalar, nnls

__all__ = [
    "FORMS",
    "LawForm",
    "LawFit",
    "Bootstrap",
    "MixturePlan",
    "CrossDomainFit",
    "huber",
    "fit_law",
    "compare_forms",
    "generalisation",
    "bootstrap",
    "tradeoff_ratio",
    "limited_domain",
    "allocate_compute",
    "fit_cross_domain",
    "estimate_k",
    "predict_unseen_domain",
    "evaluate_unseen_domain",
    "split_early",
]

TARGETS = ("domain", "general")
LOSS_COLUMN = {"domain": "loss_domain", "general": "loss_general"}
HUBER_DELTA = 1e-3  # on log-loss residuals (SEEDS.md §2: "delta about 1e-3")
N_GRID = 4  # grid levels per nonlinear parameter for the starting points
N_STARTS = 4  # best grid points refined by L-BFGS-B
N_BOOT = 20  # bootstrap refits (embedded CPU profile: ~0.1-0.3 s each)
_EXPONENT_MAX = 3.0
# N and D exponents: every published language-model fit lies well below 1 (Kaplan et al. 2020:
# 0.076/0.095; Hoffmann et al. 2022: 0.34/0.28; Besiroglu et al. 2024: 0.35/0.37). Allowing up
# to 3 let leave-one-size-out folds on the embedded probes extrapolate with alpha -> 3 (errors
# of ~1 nat); 1 keeps the fit inside the physically meaningful range.
_NB_EXPONENT_MAX = 1.0
_EPS_RANGE = (1e-4, 1.0)
_E_MIN = 1e-3
_LOG_COEF_MIN = -30.0  # exp(-30) ~ 1e-13 nats: a term switched off
# Start-grid ranges (geometric spacing) for the nonlinear parameters.
_GRID_RANGES = {
    "alpha": (0.1, 1.0),
    "beta": (0.1, 1.0),
    "eta": (0.1, 1.5),
    "gamma": (0.05, 1.0),
    "eps": (1e-3, 0.3),
}


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
# Huber loss and fit-quality metrics


def huber(residual: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    """Elementwise Huber loss: 0.5 x^2 for |x| <= delta, delta (|x| - delta/2) beyond."""
    a = np.abs(residual)
    return np.where(a <= delta, 0.5 * a * a, delta * (a - 0.5 * delta))


def _metrics(pred: np.ndarray, obs: np.ndarray, delta: float) -> dict[str, float]:
    """Mean Huber of log residuals, R^2 on loss, mean absolute relative error."""
    res = np.log(pred) - np.log(obs)
    ss_tot = float(np.sum((obs - obs.mean()) ** 2))
    ss_res = float(np.sum((obs - pred) ** 2))
    return {
        "huber": float(np.mean(huber(res, delta))),
        "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
        "mare": float(np.mean(np.abs(pred / obs - 1.0))),
    }


# --------------------------------------------------------------------------------------------
# Law forms


@dataclass(frozen=True)
class LawForm:
    """One parameterisation of L(N, D, r). All forms here are members of one family,

        L = E + A / N^alpha + B * r^eta / D^beta + C / (r + eps)^gamma,

    with some terms fixed: ``has_eta=False`` sets eta = 0 (the D term ignores r) and
    ``has_c=False`` drops the r term. ``bounds`` is the physically meaningful range of each
    parameter (data-dependent upper bounds are inf here; see ``fit_law``).
    """

    name: str
    param_names: tuple[str, ...]
    has_eta: bool
    has_c: bool
    description: str

    @property
    def uses_ratio(self) -> bool:
        return self.has_eta or self.has_c

    @property
    def bounds(self) -> dict[str, tuple[float, float]]:
        full = {
            "E": (_E_MIN, math.inf),  # irreducible loss > 0 (capped at the largest loss in fits)
            "A": (0.0, math.inf),
            "alpha": (1e-3, _NB_EXPONENT_MAX),
            "B": (0.0, math.inf),
            "eta": (0.0, _EXPONENT_MAX),
            "beta": (1e-3, _NB_EXPONENT_MAX),
            "C": (0.0, math.inf),
            "gamma": (0.0, _EXPONENT_MAX),
            "eps": _EPS_RANGE,
        }
        return {k: full[k] for k in self.param_names}

    def predict(self, params: Mapping[str, float], N, D, r) -> np.ndarray:
        """Loss (nats/token) at N parameters, D tokens and this law's ratio r (broadcast arrays).

        ``r`` is the law's own ratio: r_d for a domain-loss law, 1 - r_d for a general-loss law
        (``LawFit.predict`` takes r_d and converts). D may be inf (the D term vanishes).
        """
        N, D, r = (np.asarray(x, dtype=float) for x in (N, D, r))
        p = params
        out = p["E"] + p["A"] * N ** -p["alpha"]
        # r^eta is 0 at r = 0 for every eta >= 0 (the limit from eta > 0; the fit uses the same
        # convention), so a run without the law's corpus has no D term in this form.
        rfac = np.where(r > 0, np.abs(r) ** p["eta"], 0.0) if self.has_eta else 1.0
        out = out + p["B"] * rfac * D ** -p["beta"]
        if self.has_c:
            out = out + p["C"] * (r + p["eps"]) ** -p["gamma"]
        return out


FORMS: dict[str, LawForm] = {
    form.name: form
    for form in (
        LawForm(
            "L3",
            ("E", "A", "alpha", "B", "eta", "beta", "C", "gamma", "eps"),
            has_eta=True,
            has_c=True,
            description="E + A/N^alpha + B r^eta / D^beta + C/(r+eps)^gamma "
            "(the paper's chosen form, arXiv 2406.01375 §3)",
        ),
        LawForm(
            "r_additive",
            ("E", "A", "alpha", "B", "beta", "C", "gamma", "eps"),
            has_eta=False,
            has_c=True,
            description="E + A/N^alpha + B/D^beta + C/(r+eps)^gamma: Chinchilla plus a separate "
            "power term in r, no D-r interaction (the additive member of the paper's comparison "
            "set, §3; our rendering)",
        ),
        LawForm(
            "chinchilla",
            ("E", "A", "alpha", "B", "beta"),
            has_eta=False,
            has_c=False,
            description="E + A/N^alpha + B/D^beta: no mixture ratio (Hoffmann et al. 2022); what "
            "L3 reduces to at fixed r",
        ),
    )
}


def _form(form: str | LawForm) -> LawForm:
    if isinstance(form, LawForm):
        return form
    if form not in FORMS:
        raise ValueError(f"form must be one of {sorted(FORMS)}, got {form!r}")
    return FORMS[form]


def _check_target(target: str) -> str:
    if target not in TARGETS:
        raise ValueError(f"target must be 'domain' or 'general', got {target!r}")
    return target


def _law_ratio(r_d, target: str) -> np.ndarray:
    """The law's r from the domain ratio r_d: r_d for the domain law, 1 - r_d for the general."""
    r_d = np.asarray(r_d, dtype=float)
    return r_d if target == "domain" else 1.0 - r_d


# --------------------------------------------------------------------------------------------
# Probe points: loading and boundary checks


@dataclass(frozen=True)
class _Data:
    N: np.ndarray
    D: np.ndarray
    r_d: np.ndarray
    loss: np.ndarray
    domain: np.ndarray | None

    @property
    def n(self) -> int:
        return len(self.loss)

    def take(self, idx) -> "_Data":
        dom = None if self.domain is None else self.domain[idx]
        return _Data(self.N[idx], self.D[idx], self.r_d[idx], self.loss[idx], dom)

    def runs(self) -> np.ndarray:
        """Run id per point: one run = one (n_params, domain_ratio[, domain]) CPT run."""
        keys = list(zip(self.N.tolist(), self.r_d.tolist()))
        if self.domain is not None:
            keys = [k + (d,) for k, d in zip(keys, self.domain.tolist())]
        _, inv = np.unique(np.array([repr(k) for k in keys]), return_inverse=True)
        return inv


def _column_names(points) -> list[str]:
    if hasattr(points, "columns"):
        return list(points.columns)
    if isinstance(points, Mapping):
        return list(points.keys())
    raise TypeError(f"points must be a Polars DataFrame or a dict of arrays, got {type(points)}")


def _load(points, loss_column: str | None, need_domain: bool = False) -> _Data:
    """Convert and check probe points; ValueError names the column, row and what is wrong."""
    names = _column_names(points)
    needed = ["n_params", "tokens", "domain_ratio"]
    needed += [loss_column] if loss_column else []
    needed += ["domain"] if need_domain else []
    missing = [c for c in needed if c not in names]
    if missing:
        raise ValueError(f"points is missing column(s) {missing}; got columns {names}")
    cols = {c: np.asarray(points[c]) for c in needed}
    n = len(cols["n_params"])
    if n == 0:
        raise ValueError("points is empty")
    for c, v in cols.items():
        if v.ndim != 1 or len(v) != n:
            raise ValueError(f"column {c!r} has shape {v.shape}, expected ({n},)")
    numeric = {}
    for c in needed:
        if c == "domain":
            continue
        try:
            v = cols[c].astype(float)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"column {c!r} must be numeric: {exc}") from None
        bad = ~np.isfinite(v)
        if c == "domain_ratio":
            bad |= (v < 0.0) | (v > 1.0)
            rule = "finite and in [0, 1]"
        else:
            bad |= v <= 0.0
            rule = "finite and > 0"
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"column {c!r} must be {rule}; row {i} is {float(v[i])!r} "
                f"({int(bad.sum())} bad row(s))"
            )
        numeric[c] = v
    loss = numeric[loss_column] if loss_column else np.full(n, np.nan)
    domain = np.asarray(cols["domain"]).astype(str) if need_domain else None
    return _Data(numeric["n_params"], numeric["tokens"], numeric["domain_ratio"], loss, domain)


def _check_enough(data: _Data, form: LawForm, n_params: int) -> None:
    if data.n < n_params + 1:
        raise ValueError(
            f"{form.name} has {n_params} parameters and needs at least {n_params + 1} points, "
            f"got {data.n}"
        )
    needs = [("n_params", data.N), ("tokens", data.D)]
    if form.uses_ratio:
        needs.append(("domain_ratio", data.r_d))
    for col, v in needs:
        k = len(np.unique(v))
        if k < 2:
            raise ValueError(f"{form.name} needs at least 2 distinct {col} values, got {k}")


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
    Source: arXiv 2406.01375 §3 (L3 and the Huber/L-BFGS fit); SEEDS.md §2.
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


# --------------------------------------------------------------------------------------------
# Generalisation along N, D and r (held-out Huber and R^2 per axis)


def _pooled(data: _Data, folds: list[np.ndarray], target: str, form: LawForm, delta: float,
            n_grid: int, n_starts: int) -> dict[str, Any]:
    preds, obs, n_train = [], [], []
    for test in folds:
        train = np.setdiff1d(np.arange(data.n), test)
        fit = _fit_data(data.take(train), target, form, delta, n_grid, n_starts)
        preds.append(fit.predict(data.N[test], data.D[test], data.r_d[test]))
        obs.append(data.loss[test])
        n_train.append(len(train))
    m = _metrics(np.concatenate(preds), np.concatenate(obs), delta)
    return {"huber": m["huber"], "r2": m["r2"], "mare": m["mare"],
            "n_train": int(round(np.mean(n_train))), "n_test": int(sum(len(t) for t in folds)),
            "n_folds": len(folds)}


def _skipped(reason: str) -> dict[str, Any]:
    nan = float("nan")
    return {"huber": nan, "r2": nan, "mare": nan, "n_train": 0, "n_test": 0, "n_folds": 0,
            "skipped": reason}


@_one_blas_thread
def generalisation(points, target: str, form: str = "L3", huber_delta: float = HUBER_DELTA,
                   n_grid: int = N_GRID, n_starts: int = N_STARTS, holdout_last_k: int = 2,
                   holdout_ratios: Sequence[float] | None = None,
                   holdout_sizes: Sequence[float] | None = None) -> dict[str, Any]:
    """Held-out fit quality along each axis separately (arXiv 2406.01375 §4, SEEDS.md §2).

    - ``unseen_N``: leave-one-model-size-out over ``holdout_sizes`` (default: every distinct
      n_params except the smallest and largest; needs >= 3 sizes), predictions pooled over folds;
      ``unseen_N_extrapolation``: the same for the smallest and the largest size (reported, and
      expected to be worse: it extrapolates the N term beyond the probed range).
    - ``unseen_D``: one fit on all but the last ``holdout_last_k`` checkpoints of each run (runs
      with that many or fewer checkpoints stay whole in training); predicts the later ones.
    - ``unseen_r``: leave-one-ratio-out over ``holdout_ratios`` (default: every distinct
      domain_ratio except the smallest and largest), pooled.
    Each axis: {huber (mean Huber of log residuals), r2 (on loss), mare, n_train (mean per fold),
    n_test, n_folds}; an axis that cannot be formed has NaN metrics and a ``skipped`` reason.
    Also ``in_sample``. Costs 1 + sizes + 1 + ratios fits. Raises as ``fit_law``.

    With only 3 sizes each unseen_N fold extrapolates from 2, where E, A and alpha are not
    jointly identifiable: expect a poor unseen_N score when the N term is weak (measured: R^2
    far below 0 for a general loss whose N term is small), and probe >= 4 sizes where possible.
    """
    _check_target(target)
    f = _form(form)
    data = _load(points, LOSS_COLUMN[target])
    full = _fit_data(data, target, f, huber_delta, n_grid, n_starts)
    out: dict[str, Any] = {"form": f.name, "target": target,
                           "in_sample": {"huber": full.huber, "r2": full.r2, "n": data.n}}
    args = (target, f, huber_delta, n_grid, n_starts)
    sizes = np.unique(data.N)
    if len(sizes) < 3:
        out["unseen_N"] = out["unseen_N_extrapolation"] = _skipped(f"needs >= 3 model sizes, got {len(sizes)}")
    else:
        # Interior sizes (interpolation), like unseen_r; the smallest and largest (extrapolation
        # beyond the probed range) are reported apart: with 3-4 sizes an extrapolation fold fits
        # E, A and alpha on 2-3 sizes, which the probe noise does not pin down (measured on the
        # embedded probes: MARE 4% interior vs 15-18% for the smallest size held out).
        inner = sizes[1:-1] if holdout_sizes is None else np.asarray(holdout_sizes, dtype=float)
        folds = [fo for fo in (np.flatnonzero(np.isclose(data.N, s)) for s in inner) if len(fo)]
        out["unseen_N"] = _pooled(data, folds, *args) if folds else _skipped("no interior size to hold out")
        out["unseen_N_extrapolation"] = _pooled(data, [np.flatnonzero(data.N == s) for s in (sizes[0], sizes[-1])], *args)
    runs = data.runs()
    test = []
    for run in np.unique(runs):
        members = np.flatnonzero(runs == run)
        if len(members) > holdout_last_k:
            test.extend(members[np.argsort(data.D[members])][-holdout_last_k:])
    out["unseen_D"] = (_pooled(data, [np.array(sorted(test))], *args) if test
                       else _skipped(f"no run has more than {holdout_last_k} checkpoints"))
    ratios = np.unique(data.r_d)
    held = ratios[1:-1] if holdout_ratios is None else np.asarray(holdout_ratios, dtype=float)
    folds = [np.flatnonzero(np.isclose(data.r_d, r)) for r in held]
    folds = [fo for fo in folds if len(fo)]
    out["unseen_r"] = (_pooled(data, folds, *args) if folds
                       else _skipped("no interior domain_ratio to hold out"))
    return out


# --------------------------------------------------------------------------------------------
# Bootstrap uncertainty


@dataclass(frozen=True)
class Bootstrap:
    """Refits of one law on resampled runs. ``fit`` is the fit on all points."""

    fit: LawFit
    fits: tuple[LawFit, ...]
    seed: int

    def params(self) -> dict[str, np.ndarray]:
        """Parameter samples: {name: array of shape (len(fits),)}."""
        return {k: np.array([f.params[k] for f in self.fits]) for k in self.fit.params}


@_one_blas_thread
def bootstrap(points, target: str, form: str = "L3", n_boot: int = N_BOOT, seed: int = 0,
              huber_delta: float = HUBER_DELTA, n_grid: int = 2, n_starts: int = 2) -> Bootstrap:
    """Bootstrap the fit by resampling whole runs (n_params, domain_ratio) with replacement,
    stratified by model size (each size keeps its number of runs, so every refit still sees all
    sizes). Each refit starts from the full fit's optimum plus the ``n_starts`` best points of a
    coarse (``n_grid``) grid: ~0.1-0.3 s per refit, so the default 20 refits take a few seconds.

    With the same ``points`` and ``seed`` the domain and general bootstraps draw the same runs,
    so ``zip(boot_general.fits, boot_domain.fits)`` pairs fits of one resample. A resample that
    fails the fit's checks is redrawn (at most 10 times per refit). Raises as ``fit_law``.
    """
    _check_target(target)
    f = _form(form)
    data = _load(points, LOSS_COLUMN[target])
    full = _fit_data(data, target, f, huber_delta, N_GRID, N_STARTS)
    runs = data.runs()
    run_ids = np.unique(runs)
    run_size = {r: data.N[runs == r][0] for r in run_ids}
    strata = [[r for r in run_ids if run_size[r] == s] for s in np.unique(data.N)]
    members = {r: np.flatnonzero(runs == r) for r in run_ids}
    rng = np.random.default_rng(seed)
    fits = []
    for _ in range(n_boot):
        for _attempt in range(10):
            chosen = [r for s in strata for r in rng.choice(s, size=len(s), replace=True)]
            idx = np.concatenate([members[r] for r in chosen])
            try:
                fits.append(_fit_data(data.take(idx), target, f, huber_delta, n_grid, n_starts,
                                      init=full.params))
                break
            except ValueError:
                continue
    return Bootstrap(full, tuple(fits), seed)


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
    """Answer of one usage with its predicted losses (nats/token).

    status: 'constrained' (the general-loss constraint binds at the answer), 'unconstrained'
    (the best point of the search range satisfies the constraint; all_feasible says whether
    every point did) or 'infeasible' (no candidate satisfies it; see each usage for the answer
    returned then). ``spread`` (with ``boot=``): {field: [lo, hi]} percentiles over refits.
    """

    usage: str
    r_d: float
    n_params: float
    tokens: float
    loss_domain: float | None
    loss_general: float | None
    loss_general_base: float | None
    max_rel_increase: float | None
    status: str
    all_feasible: bool
    spread: Mapping[str, Any] | None = None

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


def _positive(name: str, value: float) -> float:
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return float(value)


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


# --------------------------------------------------------------------------------------------
# Cross-Domain D-CPT Law (arXiv 2406.01375 §3): L3 + F / K^mu, K per domain


@dataclass(frozen=True)
class CrossDomainFit:
    """Cross-Domain D-CPT Law: L3 with shared parameters plus F / K^mu per domain.

    Identifiability (our normalisation, SEEDS.md §2 [open: exact K]): the data fix only one
    constant per domain, the floor Phi_i = E + F / K_i^mu. A constant shared by all domains is
    not separable from those, nor are F, mu and the scale of K. We therefore set E = 0 (the
    shared floor is carried by F), mu = 1 and the geometric mean of K over the training domains
    to 1, so F = geometric mean of the floors and K_i = F / Phi_i (K > 1: a lower-loss domain
    than the average training domain). ``params`` holds E (= 0), A, alpha, B, eta, beta, C,
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
    domains. Source: arXiv 2406.01375 §3 (Cross-Domain D-CPT Law); SEEDS.md §2.
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

    Method (ours; SEEDS.md §2 [open: exact K]): the shared parameters stay frozen and the one
    unknown, the domain's floor Phi = F / K^mu, is fitted to the early points (e.g. the first
    2-3 checkpoints of a few small runs, ``split_early``) by the same Huber loss on log residuals
    (dense grid over log Phi, then bounded refinement). The initial loss fixes the level; the
    early slope is predicted by the shared D term rather than fitted. We chose this over a map
    (initial loss, early slope) -> log K learned across training domains because that map would be
    fitted on as few points as there are training domains (3-6), while this is a 1-parameter fit
    on all early points and stays consistent with the law. Returns K (> 0).
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
