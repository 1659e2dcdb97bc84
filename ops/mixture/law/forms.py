"""D-CPT Law forms: the parameterisations of L(N, D, r), the Huber loss and fit metrics, the
defaults of the fit, and the loading and checking of probe points.

Source: Que et al., "D-CPT Law: Domain-specific Continual Pre-Training Scaling Law for Large
Language Models", arXiv 2406.01375 (NeurIPS 2024), §3 (the parameterisations: L3, the paper's
chosen form, and the forms it is compared with); the comparison forms of Ye et al. 2024 (Data
Mixing Laws, arXiv 2403.16952) and Ge et al. 2024 (BiMix, arXiv 2405.14908). Spec and defaults:
docs/mixture.md.

Units everywhere: losses in nats/token, N in (non-embedding) parameters, D in tokens,
mixture ratios in [0, 1]. ``r_d`` is the share of domain-corpus tokens in the CPT mixture. The law
for the domain loss L_d is written in r = r_d, the law for the general loss L_g in r = 1 - r_d;
every public function takes r_d and does that conversion itself (``LawFit.predict``).

Probe points are a Polars DataFrame or a dict of equal-length arrays with columns ``n_params``,
``tokens``, ``domain_ratio``, ``loss_general``, ``loss_domain``, (cross-domain law only)
``domain`` and, optionally, ``seed`` (the training seed of repeated probe runs: same size, ratio
and D, different seed; ``noise`` estimates the seed noise from them). One *run* is one
(n_params, domain_ratio[, domain][, seed]) CPT run; its checkpoints give D.
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
_GAMMA_MIN = 1e-3  # the anchored r term C((r+eps)^-gamma - (1+eps)^-gamma) vanishes at gamma = 0
_D0_RANGE = (1e2, 1e7)  # D offset of the *_d0 forms, tokens (the probes' checkpoints span ~4e3-1.3e5)
_T_MAX = 10.0  # |t| of the Data Mixing Law's exp(t r): r in [0, 1], so e^10 ~ 2e4 across the range
_FAMILIES = ("dcpt", "data_mixing_law", "bimix")
_LOG_COEF_MIN = -30.0  # exp(-30) ~ 1e-13 nats: a term switched off
# Start-grid ranges (geometric spacing) for the nonlinear parameters.
_GRID_RANGES = {
    "alpha": (0.1, 1.0),
    "beta": (0.1, 1.0),
    "eta": (0.1, 1.5),
    "gamma": (0.05, 1.0),
    "eps": (1e-3, 0.3),
    "D0": (1e3, 1e6),
}
_T_GRID = (-3.0, 3.0)  # linear spacing (t may take either sign)


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
    """One parameterisation of L(N, D, r), in one of three families (``family``):

    - ``"dcpt"`` (arXiv 2406.01375 §3): L = E + A / N^alpha + B * r^eta / D^beta
      + C * ((r + eps)^-gamma - (1 + eps)^-gamma), with some terms fixed: ``has_eta=False`` sets
      eta = 0 (the D term ignores r) and ``has_c=False`` drops the r term. L3, r_additive and
      chinchilla. The r term is the paper's C / (r + eps)^gamma anchored at r = 1, where it is 0:
      its constant part belongs to E, which is then the floor at r = 1 and identified (with the
      paper's term a near-constant C term duplicates E; docs/mixture.md, "Identification"). The
      paper's E is E - C / (1 + eps)^gamma (``LawFit.paper_params``).
    - ``"data_mixing_law"`` (Ye et al. 2024, arXiv 2403.16952, Eq. 1 combined with N/D scaling; our
      simplification, docs/mixture.md): L = E + (A / N^alpha + B / D^beta) * exp(t * r).
    - ``"bimix"`` (Ge et al. 2024, arXiv 2405.14908; extended to N, docs/mixture.md):
      L = (E + A / N^alpha + B / D^beta) / (r + eps)^gamma.

    Every family is a log-sum-exp of linear terms in log space (``fit``), so E = exp(e) is a free
    log-coefficient like the others. ``bounds`` is the range of each parameter (data-dependent upper
    bounds are inf here; see ``fit_law``).
    """

    name: str
    """The form's key in ``FORMS`` (L3, r_additive, chinchilla, data_mixing_law, bimix, L3_d0,
    r_additive_d0)."""
    param_names: tuple[str, ...]
    """Natural parameter names, in order (E first), as in ``LawFit.params``."""
    has_eta: bool
    """dcpt family: the D term carries r^eta (False: eta = 0, the D term ignores r)."""
    has_c: bool
    """dcpt family: the anchored r term C((r + eps)^-gamma - (1 + eps)^-gamma) is present (False: dropped)."""
    description: str
    """One-line formula and source of the form (for reports)."""
    family: str = "dcpt"
    """The family: "dcpt", "data_mixing_law" or "bimix" (ValueError otherwise)."""
    has_d0: bool = False
    """dcpt family: the D term is B r^eta / (D + D0)^beta with a fitted offset D0 (tokens) instead of
    B r^eta / D^beta, so that it is finite at D = 0 (where a continually trained model starts from its
    base loss) and its log-log slope -beta D / (D + D0) steepens with D (docs/mixture.md,
    "Forms"). The offset plays the role of Hernandez et al.'s (2021, arXiv 2102.01293) effective
    data transferred."""

    def __post_init__(self):
        if self.family not in _FAMILIES:
            raise ValueError(f"LawForm.family must be one of {_FAMILIES}, got {self.family!r}")
        if self.has_d0 and self.family != "dcpt":
            raise ValueError(f"LawForm.has_d0 is defined for the dcpt family only, got {self.family!r}")

    @property
    def uses_ratio(self) -> bool:
        return self.family != "dcpt" or self.has_eta or self.has_c

    @property
    def bounds(self) -> dict[str, tuple[float, float]]:
        full = {
            "E": (_E_MIN, math.inf),  # irreducible loss > 0 (capped at the data in fits)
            "A": (0.0, math.inf),
            "alpha": (1e-3, _NB_EXPONENT_MAX),
            "B": (0.0, math.inf),
            "eta": (0.0, _EXPONENT_MAX),
            "beta": (1e-3, _NB_EXPONENT_MAX),
            "C": (0.0, math.inf),
            "gamma": (_GAMMA_MIN, _EXPONENT_MAX),
            "eps": _EPS_RANGE,
            "t": (-_T_MAX, _T_MAX),
            "D0": _D0_RANGE,
        }
        return {k: full[k] for k in self.param_names}

    def predict(self, params: Mapping[str, float], N, D, r) -> np.ndarray:
        """Loss (nats/token) at N parameters, D tokens and this law's ratio r (broadcast arrays).

        ``r`` is the law's own ratio: r_d for a domain-loss law, 1 - r_d for a general-loss law
        (``LawFit.predict`` takes r_d and converts). D may be inf (the D term vanishes).
        """
        N, D, r = (np.asarray(x, dtype=float) for x in (N, D, r))
        p = params
        if self.family == "data_mixing_law":
            return p["E"] + (p["A"] * N ** -p["alpha"] + p["B"] * D ** -p["beta"]) * np.exp(p["t"] * r)
        if self.family == "bimix":
            return (p["E"] + p["A"] * N ** -p["alpha"] + p["B"] * D ** -p["beta"]) * (r + p["eps"]) ** -p["gamma"]
        out = p["E"] + p["A"] * N ** -p["alpha"]
        # r^eta is 0 at r = 0 for every eta >= 0 (the limit from eta > 0; the fit uses the same
        # convention), so a run without the law's corpus has no D term in this form.
        rfac = np.where(r > 0, np.abs(r) ** p["eta"], 0.0) if self.has_eta else 1.0
        out = out + p["B"] * rfac * (D + p["D0"] if self.has_d0 else D) ** -p["beta"]
        if self.has_c:
            # the r term anchored at r = 1, where it is 0 (docs/mixture.md, "Identification")
            out = out + p["C"] * ((r + p["eps"]) ** -p["gamma"] - (1.0 + p["eps"]) ** -p["gamma"])
        return out


FORMS: dict[str, LawForm] = {
    form.name: form
    for form in (
        LawForm(
            "L3",
            ("E", "A", "alpha", "B", "eta", "beta", "C", "gamma", "eps"),
            has_eta=True,
            has_c=True,
            description="E + A/N^alpha + B r^eta / D^beta + C((r+eps)^-gamma - (1+eps)^-gamma) "
            "(the paper's chosen form, arXiv 2406.01375 §3, its r term anchored at r = 1)",
        ),
        LawForm(
            "r_additive",
            ("E", "A", "alpha", "B", "beta", "C", "gamma", "eps"),
            has_eta=False,
            has_c=True,
            description="E + A/N^alpha + B/D^beta + C((r+eps)^-gamma - (1+eps)^-gamma): Chinchilla plus a separate "
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
        LawForm(
            "data_mixing_law",
            ("E", "A", "alpha", "B", "beta", "t"),
            has_eta=False,
            has_c=False,
            description="E + (A/N^alpha + B/D^beta) exp(t r): the Data Mixing Law c + k exp(t r) "
            "(Ye et al. 2024, arXiv 2403.16952, Eq. 1, two domains) with c = E and the scale k "
            "the Chinchilla reducible loss in N and D (our one-step simplification of the paper's "
            "nested laws)",
            family="data_mixing_law",
        ),
        LawForm(
            "bimix",
            ("E", "A", "alpha", "B", "beta", "gamma", "eps"),
            has_eta=False,
            has_c=False,
            description="(E + A/N^alpha + B/D^beta) / (r+eps)^gamma: BiMix A/r^alpha (B/s^beta + C) "
            "(Ge et al. 2024, arXiv 2405.14908) with steps s -> tokens D, an N term added to its "
            "constant, and r + eps so that r = 0 is finite (our extension)",
            family="bimix",
        ),
        LawForm(
            "L3_d0",
            ("E", "A", "alpha", "B", "eta", "beta", "D0", "C", "gamma", "eps"),
            has_eta=True,
            has_c=True,
            has_d0=True,
            description="E + A/N^alpha + B r^eta / (D+D0)^beta + C((r+eps)^-gamma - (1+eps)^-gamma): L3 "
            "with a D term finite at D = 0 (offset D0 in tokens; our variant, docs/mixture.md)",
        ),
        LawForm(
            "r_additive_d0",
            ("E", "A", "alpha", "B", "beta", "D0", "C", "gamma", "eps"),
            has_eta=False,
            has_c=True,
            has_d0=True,
            description="E + A/N^alpha + B/(D+D0)^beta + C((r+eps)^-gamma - (1+eps)^-gamma): r_additive "
            "with a D term finite at D = 0 (our variant, docs/mixture.md)",
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
    """Non-embedding parameters per point (the ``n_params`` column; finite, > 0)."""
    D: np.ndarray
    """CPT tokens per point (the ``tokens`` column; finite, > 0)."""
    r_d: np.ndarray
    """Domain ratio of each point's mixture (the ``domain_ratio`` column; in [0, 1])."""
    loss: np.ndarray
    """The target loss per point (nats/token, > 0); NaN when loaded without a loss column."""
    domain: np.ndarray | None
    """Domain name per point (str; the ``domain`` column), or None when not needed."""
    seed: np.ndarray | None = None
    """Training seed of each point's run (str), if given (None: no ``seed`` column)."""

    @property
    def n(self) -> int:
        return len(self.loss)

    def take(self, idx) -> "_Data":
        dom = None if self.domain is None else self.domain[idx]
        seed = None if self.seed is None else self.seed[idx]
        return _Data(self.N[idx], self.D[idx], self.r_d[idx], self.loss[idx], dom, seed)

    def runs(self) -> np.ndarray:
        """Run id per point: one run = one (n_params, domain_ratio[, domain][, seed]) CPT run."""
        keys = list(zip(self.N.tolist(), self.r_d.tolist()))
        if self.domain is not None:
            keys = [k + (d,) for k, d in zip(keys, self.domain.tolist())]
        if self.seed is not None:
            keys = [k + (s,) for k, s in zip(keys, self.seed.tolist())]
        _, inv = np.unique(np.array([repr(k) for k in keys]), return_inverse=True)
        return inv

    def configs(self) -> np.ndarray:
        """Configuration id per point: (n_params, domain_ratio, tokens[, domain]), seeds pooled.
        Points with the same id are repeated measurements of one configuration."""
        keys = list(zip(self.N.tolist(), self.r_d.tolist(), self.D.tolist()))
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
    seed = None
    if "seed" in names:  # optional: repeated probe runs (docs/mixture.md, "Noise ceiling")
        raw = np.asarray(points["seed"])
        if raw.ndim != 1 or len(raw) != n:
            raise ValueError(f"column 'seed' has shape {raw.shape}, expected ({n},)")
        missing_seed = np.array([v is None or (isinstance(v, float) and v != v) for v in raw.tolist()])
        if missing_seed.any():
            i = int(np.flatnonzero(missing_seed)[0])
            raise ValueError(f"column 'seed' must not be null; row {i} is {raw[i]!r} "
                             f"({int(missing_seed.sum())} null row(s))")
        seed = np.array([str(v) for v in raw.tolist()])
    return _Data(numeric["n_params"], numeric["tokens"], numeric["domain_ratio"], loss, domain, seed)


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
