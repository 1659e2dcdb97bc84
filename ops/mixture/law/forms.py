"""D-CPT Law forms: the parameterisations of L(N, D, r), the Huber loss and fit metrics, the
defaults of the fit, and the loading and checking of probe points.

Source: Que et al., "D-CPT Law: Domain-specific Continual Pre-Training Scaling Law for Large
Language Models", arXiv 2406.01375 (NeurIPS 2024), §3 (the parameterisations: L3, the paper's
chosen form, and the forms it is compared with). Spec and defaults: docs/mixture.md.

Units everywhere: losses in nats/token, N in (non-embedding) parameters, D in tokens,
mixture ratios in [0, 1]. ``r_d`` is the share of domain-corpus tokens in the CPT mixture. The law
for the domain loss L_d is written in r = r_d, the law for the general loss L_g in r = 1 - r_d;
every public function takes r_d and does that conversion itself (``LawFit.predict``).

Probe points are a Polars DataFrame or a dict of equal-length arrays with columns ``n_params``,
``tokens``, ``domain_ratio``, ``loss_general``, ``loss_domain`` and (cross-domain law only)
``domain``. One *run* is one (n_params, domain_ratio[, domain]) CPT run; its checkpoints give D.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

TARGETS = ("domain", "general")
LOSS_COLUMN = {"domain": "loss_domain", "general": "loss_general"}
HUBER_DELTA = 1e-3  # on log-loss residuals (default: docs/mixture.md)
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


def _positive(name: str, value: float) -> float:
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return float(value)


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
