"""The D-CPT Law fitting problem in the optimiser's coordinates (``_Problem``): the
reparameterisation, bounds, the log-sum-exp objective with its analytic gradient, the
variable-projection start grid and the L-BFGS-B solve; and ``_one_blas_thread``. ``fit``
(single-domain fits), ``heldout`` (held-out folds, bootstrap) and ``crossdomain`` (the
Cross-Domain law) each build a ``_Problem`` and read its optimum.

Source: Que et al., arXiv 2406.01375 (NeurIPS 2024), §3 (fitting the law). Fitting follows
Hoffmann et al. (Chinchilla, approach 3) as replicated by Besiroglu et al. (2024): Huber loss on
log-loss residuals, log L written as a log-sum-exp of its terms (E = exp(e)), L-BFGS-B from a grid
of starts, best kept. Three choices of ours (docs/mixture.md lists them as open): (i) the optimiser
works in a reparameterisation -- log coefficients, and the N and D power terms centred on the
data's geometric-mean N and D, so that the coefficient and its exponent are not the nearly
collinear pair they are at N ~ 1e6; (ii) starting points come from a grid over the exponents (and
eps, t) with the linear coefficients (E, A, B, C) solved by non-negative least squares for each
grid point (variable projection), and only the ``n_starts`` best grid points are refined; (iii)
the objective carries an analytic gradient. ``_Problem.at_bounds`` reports which parameters ended
on a bound. numpy/scipy only (threadpoolctl, if installed, pins BLAS to one thread during fits).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
from scipy.optimize import minimize, nnls

from .forms import (
    _E_MIN,
    _EXPONENT_MAX,
    _GRID_RANGES,
    _LOG_COEF_MIN,
    _T_GRID,
    LawForm,
    _Data,
    _law_ratio,
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
# The fitting problem in the optimiser's coordinates (log space, log-sum-exp)
#
# Every form is log L = m + LSE_k(tau_k): a log-sum-exp of terms that are linear in the
# optimiser's coordinates (Besiroglu et al. 2024, "Chinchilla Scaling: A replication attempt",
# fit the Chinchilla law this way), with xN = log N - mean(log N), xD likewise:
#
#   floor          tau_0 = e_g                       E_g = exp(e_g) (one floor per group; G = 1
#                                                    except the cross-domain law)
#   N term         tau_A = a - alpha xN  [+ t r]     A = exp(a + alpha mean(log N))
#   D term         tau_B = b - beta xD [+ eta log r] [+ t r]   (-inf at r = 0 with eta); the *_d0
#                  forms use xD = log(D + D0) - mean(log D), D0 = exp(ld0)
#   r term (dcpt)  tau_C = c + log((r+eps)^-gamma - (1+eps)^-gamma)   C = exp(c), eps = exp(leps)
#                  (anchored at r = 1, where it is 0 and tau_C = -inf; computed with expm1)
#   multiplier     m = -gamma log(r + eps) (BiMix only; else 0)
#
# [+ t r] is the Data Mixing Law's exp(t r) on the reducible terms. The gradient of log L is the
# softmax weight of each term times that term's gradient (plus the multiplier's).

_NATURAL = {"a": "A", "b": "B", "c": "C", "leps": "eps", "ld0": "D0"}  # optimiser name -> natural name
_OPT = {nat: opt for opt, nat in _NATURAL.items() if opt.startswith("l")}  # eps -> leps, D0 -> ld0: fitted as logs


def _nonlinear(form: LawForm) -> list[str]:
    """The form's nonlinear parameters (natural names), gridded for the starting points."""
    if form.family == "data_mixing_law":
        return ["alpha", "beta", "t"]
    if form.family == "bimix":
        return ["alpha", "beta", "gamma", "eps"]
    return (["alpha"] + (["eta"] if form.has_eta else []) + ["beta"] + (["D0"] if form.has_d0 else [])
            + (["gamma", "eps"] if form.has_c else []))


@dataclass
class _Problem:
    form: LawForm
    """The law form being fitted."""
    xN: np.ndarray
    """log N - lN0 per point (log non-embedding parameters, centred on the geometric-mean N)."""
    xD: np.ndarray
    """log D - lD0 per point (log CPT tokens, centred on the geometric-mean D)."""
    r: np.ndarray
    """The law's own ratio per point (r = r_d for target 'domain', 1 - r_d for 'general'), in [0, 1]."""
    logy: np.ndarray
    """log of the observed target loss per point (nats/token)."""
    group: np.ndarray
    """Floor group per point, in [0, n_groups): its own floor E (one per domain in the Cross-Domain law)."""
    n_groups: int
    """Number of floor groups (1 for a single-domain fit)."""
    lN0: float
    """Mean log N of the points (the centring of xN)."""
    lD0: float
    """Mean log D of the points (the centring of xD)."""
    delta: float
    """Huber delta on log-loss residuals (> 0)."""
    bound_override: Mapping[str, tuple[float, float]] | None = None
    """{name: (lo, hi)} overriding the form's bounds of E, alpha, beta, eta, gamma, eps, t or D0
    (finite, lo <= hi; E, eps and D0 > 0)."""
    names: list[str] = field(init=False)
    """Optimiser coordinates of theta: e<g> per group, a, alpha, b, [eta], beta, [ld0] (the *_d0 forms:
    log D0), then [c, gamma, leps] (dcpt with C), [t] (data mixing law) or [gamma, leps] (bimix)."""
    bounds: list[tuple[float, float]] = field(init=False)
    """L-BFGS-B bounds per coordinate of ``names`` (log coefficients in log space)."""

    def __post_init__(self) -> None:
        self.rpos = self.r > 0
        self.below_anchor = self.r < 1.0  # where the anchored r term is non-zero
        self._r0 = np.flatnonzero(~self.rpos)  # the D term with eta is 0 here
        self._r1 = np.flatnonzero(~self.below_anchor)  # the anchored r term is 0 here
        self.logr = np.log(np.where(self.rpos, self.r, 1.0))
        f = self.form
        self.is_dcpt = f.family == "dcpt"
        self.has_eta = self.is_dcpt and f.has_eta
        self.has_c = self.is_dcpt and f.has_c
        self.is_dml = f.family == "data_mixing_law"
        self.is_bimix = f.family == "bimix"
        self.has_d0 = self.is_dcpt and f.has_d0
        self.D = np.exp(self.xD + self.lD0)  # tokens (the D offset of the *_d0 forms is added to them)
        self.names = [f"e{g}" for g in range(self.n_groups)] + ["a", "alpha", "b"]
        self.names += ["eta"] if self.has_eta else []
        self.names += ["beta"]
        self.names += ["ld0"] if self.has_d0 else []
        self.names += ["c", "gamma", "leps"] if self.has_c else []
        self.names += ["t"] if self.is_dml else []
        self.names += ["gamma", "leps"] if self.is_bimix else []
        self.idx = {n: i for i, n in enumerate(self.names)}
        self.bounds = self._bounds()

    def _bounds(self) -> list[tuple[float, float]]:
        over = dict(self.bound_override or {})
        unknown = sorted(set(over) - {"E", "alpha", "beta", "eta", "gamma", "eps", "t", "D0"})
        if unknown:
            raise ValueError(f"bounds can override E, alpha, beta, eta, gamma, eps, t, D0; got {unknown}")
        for k, (lo, hi) in over.items():
            if not (np.isfinite(lo) and np.isfinite(hi) and lo <= hi):
                raise ValueError(f"bounds[{k!r}] must be finite with lo <= hi, got {(lo, hi)}")
            if k in ("E", "eps", "D0") and lo <= 0:
                raise ValueError(f"bounds[{k!r}] must be > 0, got {(lo, hi)}")
        nat = {**self.form.bounds, **{k: v for k, v in over.items() if k in self.form.bounds}}
        top = float(self.logy.max())
        E_lo, E_hi = over.get("E", (_E_MIN, math.inf))
        out = []
        for n in self.names:
            if n.startswith("e") and n[1:].isdigit():
                # The floor never exceeds the smallest loss of its group where it is added to
                # positive terms; BiMix multiplies it by (r + eps)^-gamma >= 2^-gamma_max.
                g = int(n[1:])
                mine = self.logy[self.group == g]
                cap = float(mine.max()) + _EXPONENT_MAX * math.log(2.0) if self.is_bimix else float(mine.min())
                hi = min(cap, math.log(E_hi)) if math.isfinite(E_hi) else cap
                out.append((min(math.log(E_lo), hi), hi))
            elif n in ("a", "b"):
                out.append((_LOG_COEF_MIN, top + 1.0))
            elif n == "c":
                # The anchored r term is about C gamma log((1+eps)/(r+eps)) at small gamma, so C
                # may need 1/gamma_min more room than the other coefficients.
                out.append((_LOG_COEF_MIN, top + 1.0 - math.log(max(nat["gamma"][0], 1e-12))))
            elif n in _OPT.values():
                lo, hi = nat[_NATURAL[n]]
                out.append((math.log(lo), math.log(hi)))
            else:
                out.append(tuple(float(x) for x in nat[n]))
        return out

    @classmethod
    def build(cls, form: LawForm, data: _Data, target: str, delta: float,
              group: np.ndarray | None = None, n_groups: int = 1,
              bounds: Mapping[str, tuple[float, float]] | None = None) -> "_Problem":
        lN, lD = np.log(data.N), np.log(data.D)
        lN0, lD0 = float(lN.mean()), float(lD.mean())
        g = np.zeros(data.n, dtype=int) if group is None else group
        return cls(form, lN - lN0, lD - lD0, _law_ratio(data.r_d, target), np.log(data.loss),
                   g, n_groups, lN0, lD0, delta, bounds)

    # -- the model in log space ------------------------------------------------------------

    def log_pred(self, theta: np.ndarray, grad: bool = False):
        """log L per point and, if asked, its Jacobian (n_points x n_theta; a buffer reused by
        the next call)."""
        i = self.idx
        G = self.n_groups
        n = len(self.logy)
        K = 4 if self.has_c else 3
        if getattr(self, "_T", None) is None or self._T.shape != (K, n):
            self._T = np.empty((K, n))
            self._J = np.zeros((n, len(self.names)))
            self._rows = np.arange(n)
        T = self._T
        T[0] = theta[0] if G == 1 else theta[:G][self.group]
        np.multiply(self.xN, -theta[i["alpha"]], out=T[1])
        T[1] += theta[i["a"]]
        if self.has_d0:
            d0 = math.exp(theta[i["ld0"]])
            xD = np.log(self.D + d0) - self.lD0
        else:
            xD = self.xD
        np.multiply(xD, -theta[i["beta"]], out=T[2])
        T[2] += theta[i["b"]]
        if self.is_dml:
            tr = theta[i["t"]] * self.r
            T[1] += tr
            T[2] += tr
        if self.has_eta:
            T[2] += theta[i["eta"]] * self.logr
            T[2, self._r0] = -np.inf
        if self.has_c or self.is_bimix:
            gamma = theta[i["gamma"]]
            eps = math.exp(theta[i["leps"]])
            lre = np.log(self.r + eps)
        if self.has_c:
            # log of C((r+eps)^-gamma - (1+eps)^-gamma) = c - gamma log(1+eps) + log expm1(gamma dl),
            # dl = log(1+eps) - log(r+eps) >= 0; -inf at r = 1 (the anchor, where the term is 0)
            l1 = math.log1p(eps)
            dl = l1 - lre
            pos = self.below_anchor
            em1 = np.expm1(gamma * np.where(pos, dl, 1.0))
            T[3] = np.log(em1)
            T[3] += theta[i["c"]] - gamma * l1
            T[3, self._r1] = -np.inf
        top = T.max(axis=0)
        ex = np.exp(T - top)
        s = ex.sum(axis=0)
        lp = top + np.log(s)
        if self.is_bimix:
            lp -= gamma * lre
        if not grad:
            return lp
        w = ex
        w /= s
        J = self._J
        if G == 1:
            J[:, 0] = w[0]
        else:
            J[:, :G] = 0.0
            J[self._rows, self.group] = w[0]
        J[:, i["a"]] = w[1]
        np.multiply(self.xN, -w[1], out=J[:, i["alpha"]])
        J[:, i["b"]] = w[2]
        np.multiply(xD, -w[2], out=J[:, i["beta"]])
        if self.has_d0:  # d xD / d ld0 = D0 / (D + D0)
            J[:, i["ld0"]] = -theta[i["beta"]] * (d0 / (self.D + d0)) * w[2]
        if self.is_dml:
            J[:, i["t"]] = self.r * (w[1] + w[2])
        if self.has_eta:
            J[:, i["eta"]] = self.logr * w[2]  # w[2] = 0 and logr = 0 at r = 0
        if self.has_c:
            ratio = np.where(pos, (em1 + 1.0) / em1, 0.0)  # d log expm1(x) / dx
            ddl = eps / (1.0 + eps) - eps / (self.r + eps)  # d dl / d leps
            J[:, i["c"]] = w[3]
            J[:, i["gamma"]] = w[3] * (np.where(pos, dl, 0.0) * ratio - l1)
            J[:, i["leps"]] = w[3] * gamma * (ratio * ddl - eps / (1.0 + eps))
        if self.is_bimix:
            J[:, i["gamma"]] = -lre
            J[:, i["leps"]] = -gamma * eps / (self.r + eps)
        return lp, J

    def value(self, theta: np.ndarray) -> float:
        """The objective without its gradient (scoring grid points)."""
        return float(np.mean(huber(self.log_pred(theta) - self.logy, self.delta))) / self.delta**2

    def objective(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean Huber of log residuals / delta^2 (so L-BFGS-B's tolerances see O(1) values)."""
        lp, J = self.log_pred(theta, grad=True)
        res = lp - self.logy
        n, d2 = len(res), self.delta**2
        value = float(np.mean(huber(res, self.delta))) / d2
        grad = J.T @ (np.clip(res, -self.delta, self.delta) / (n * d2))
        return value, grad

    # -- starting points ------------------------------------------------------------------

    def _columns(self, v: Mapping[str, float]) -> tuple[np.ndarray, list[np.ndarray]]:
        """Loss-space columns at nonlinear values ``v``: (floor multiplier per point, [N term,
        D term, (r term)]), so that L = E_g * mult + sum_k coef_k * column_k."""
        n = len(self.logy)
        mult = (self.r + v["eps"]) ** -v["gamma"] if self.is_bimix else np.ones(n)
        colA = np.exp(-v["alpha"] * self.xN)
        xD = np.log(self.D + v["D0"]) - self.lD0 if self.has_d0 else self.xD
        colB = np.exp(-v["beta"] * xD)
        if self.is_dml:
            colA, colB = colA * np.exp(v["t"] * self.r), colB * np.exp(v["t"] * self.r)
        if self.has_eta:
            colB = colB * np.where(self.rpos, np.exp(v["eta"] * self.logr), 0.0)
        cols = [colA * mult, colB * mult]
        if self.has_c:
            cols.append((self.r + v["eps"]) ** -v["gamma"] - (1.0 + v["eps"]) ** -v["gamma"])
        return mult, cols

    def _grid(self, n_grid: int) -> list[tuple[float, np.ndarray, dict[str, float]]]:
        """Every point of a grid over the nonlinear parameters, the linear coefficients (E, A, B,
        C) of each by non-negative least squares on loss: [(objective, theta, values)], best
        first."""
        nonlin = _nonlinear(self.form)
        bnd = dict(zip(self.names, self.bounds))
        levels = {}
        for k in nonlin:
            if k == "t":
                lv = np.linspace(*_T_GRID, n_grid) if n_grid > 1 else np.array([0.0])
            else:
                lv = np.geomspace(*_GRID_RANGES[k], n_grid)
            lo, hi = (math.exp(x) for x in bnd[_OPT[k]]) if k in _OPT else bnd[k]
            levels[k] = np.unique(np.clip(lv, lo, hi))
        y = np.exp(self.logy)
        onehot = np.zeros((len(y), self.n_groups))
        onehot[np.arange(len(y)), self.group] = 1.0
        scored = []
        for combo in itertools.product(*(levels[k] for k in nonlin)):
            v = dict(zip(nonlin, combo))
            mult, cols = self._columns(v)
            coef, _ = nnls(np.column_stack([onehot * mult[:, None], *cols]), y)
            # Scored as NNLS found it; started with every term alive (``_revive``).
            scored.append((self.value(self._theta_from(coef, v)), self._theta_from(self._revive(coef, cols, y), v), v))
        scored.sort(key=lambda s: s[0])
        return scored

    def _revive(self, coef: np.ndarray, cols: Sequence[np.ndarray], y: np.ndarray,
                share: float = 0.01) -> np.ndarray:
        """Raise each non-floor coefficient that NNLS set to (near) zero so its term carries
        ``share`` of the mean loss: in log coordinates a switched-off term has no gradient, so
        L-BFGS-B could never turn it back on from such a start."""
        coef = coef.copy()
        G = self.n_groups
        for k, col in enumerate(cols):
            floor = share * float(np.mean(y)) / max(float(np.mean(col)), 1e-300)
            coef[G + k] = max(coef[G + k], floor)
        return coef

    def grid_starts(self, n_grid: int, n_starts: int) -> list[np.ndarray]:
        """Best ``n_starts`` points of the start grid (``_grid``)."""
        return [th for _, th, _ in self._grid(n_grid)[:n_starts]]

    def floor_starts(self, values: Sequence[Mapping[str, float]],
                     fractions: Sequence[float] = (0.3, 0.6, 0.9)) -> list[np.ndarray]:
        """Starts with every floor fixed inside its range, at ``fractions`` of its upper bound
        (the group's smallest loss), the other linear coefficients by NNLS on what is left of the
        loss, for each set of nonlinear ``values``."""
        y = np.exp(self.logy)
        caps = np.exp(np.array([hi for (_, hi) in self.bounds[: self.n_groups]]))
        out = []
        for v in values:
            mult, cols = self._columns(v)
            for f in fractions:
                floors = f * caps
                rest = np.maximum(y - floors[self.group] * mult, 1e-12 * y)
                coef, _ = nnls(np.column_stack(cols), rest)
                out.append(self._theta_from(self._revive(np.concatenate([floors, coef]), cols, y), v))
        return out

    def _values(self, theta: np.ndarray) -> dict[str, float]:
        """The nonlinear parameters (natural names) of optimiser coordinates ``theta``."""
        t = dict(zip(self.names, theta))
        return {k: (math.exp(t[_OPT[k]]) if k in _OPT else float(t[k])) for k in _nonlinear(self.form)}

    def _theta_from(self, coef: np.ndarray, v: Mapping[str, float]) -> np.ndarray:
        G = self.n_groups
        logc = np.log(np.maximum(coef, 1e-300))
        vals = {f"e{g}": logc[g] for g in range(G)}
        vals.update(a=logc[G], b=logc[G + 1])
        if self.has_c:
            vals["c"] = logc[G + 2]
        for k, x in v.items():
            vals[_OPT.get(k, k)] = math.log(x) if k in _OPT else x
        return self.clip(np.array([vals[n] for n in self.names]))

    def clip(self, theta: np.ndarray) -> np.ndarray:
        lo, hi = np.array(self.bounds).T
        return np.clip(theta, lo, hi)

    def theta_from_params(self, p: Mapping[str, float]) -> np.ndarray:
        """Optimiser coordinates from natural parameters (single-floor problems)."""
        vals = {"e0": math.log(max(p["E"], 1e-300)), "alpha": p["alpha"], "beta": p["beta"],
                "a": math.log(max(p["A"], 1e-300)) - p["alpha"] * self.lN0,
                "b": math.log(max(p["B"], 1e-300)) - p["beta"] * self.lD0}
        for k in ("eta", "gamma", "t"):
            if k in self.idx:
                vals[k] = p[k]
        if "c" in self.idx:
            vals["c"] = math.log(max(p["C"], 1e-300))
        for k, nat in _OPT.items():
            if nat in self.idx:
                vals[nat] = math.log(p[k])
        return self.clip(np.array([vals[n] for n in self.names]))

    def natural(self, theta: np.ndarray) -> dict[str, float]:
        """Natural parameters of the shared terms (no floor) from optimiser coordinates."""
        t = dict(zip(self.names, theta))
        p = {"A": math.exp(t["a"] + t["alpha"] * self.lN0), "alpha": t["alpha"],
             "B": math.exp(t["b"] + t["beta"] * self.lD0), "beta": t["beta"]}
        for k in ("eta", "gamma", "t"):
            if k in t:
                p[k] = t[k]
        if "c" in t:
            p["C"] = math.exp(t["c"])
        for k, nat in _OPT.items():
            if nat in t:
                p[k] = math.exp(t[nat])
        return {k: float(v) for k, v in p.items()}

    def at_bounds(self, theta: np.ndarray) -> dict[str, str | None]:
        """Per optimiser coordinate (natural names; E, or E_g per group): 'lower', 'upper' or
        None. A coefficient (A, B, C) at 'lower' is a term switched off (exp(-30))."""
        out = {}
        for n, x, (lo, hi) in zip(self.names, theta, self.bounds):
            tol = 1e-6 + 1e-4 * (hi - lo)
            where = "lower" if x - lo <= tol else "upper" if hi - x <= tol else None
            if n.startswith("e") and n[1:].isdigit():
                name = "E" if self.n_groups == 1 else f"E_{n[1:]}"
            else:
                name = _NATURAL.get(n, n)
            out[name] = where
        return out

    def _refine(self, x0: np.ndarray):
        return minimize(self.objective, x0, jac=True, method="L-BFGS-B", bounds=self.bounds,
                        options={"maxiter": 1000, "ftol": 1e-11, "gtol": 1e-8})

    def solve(self, n_grid: int, n_starts: int, extra: Sequence[np.ndarray] = ()) -> np.ndarray:
        """L-BFGS-B from the best grid starts (and any extra starts); best optimum kept. An
        optimum with a floor on its lower bound is confirmed from starts with the floors inside
        their range (``floor_starts`` at the best grid points' exponents): an interior floor
        that fits better replaces it."""
        if n_grid < 1 or n_starts < 0 or (n_starts == 0 and not len(extra)):
            raise ValueError(f"n_grid must be >= 1 and n_starts >= 1 (0 only with an extra start), got {n_grid}, {n_starts}")
        grid = self._grid(n_grid)[:n_starts] if n_starts else []
        best_val, best = math.inf, None
        for x0 in list(extra) + [th for _, th, _ in grid]:
            out = self._refine(x0)
            if out.fun < best_val:
                best_val, best = float(out.fun), out.x
        G = self.n_groups
        lo = np.array([b[0] for b in self.bounds[:G]])
        if np.any(best[:G] - lo <= 1e-6 + 1e-4 * np.abs(lo)):
            for x0 in self.floor_starts([v for _, _, v in grid[:2]] or [self._values(best)]):
                out = self._refine(x0)
                if out.fun < best_val:
                    best_val, best = float(out.fun), out.x
        return best
