"""Parameters of the D-CPT Law fit, its held-out floor and the mixture plan: meaning, default and
range of each, in one place. The ``dcpt_law_fit``, ``dcpt_fit_heldout_r2`` and ``mixture_plan``
run configs (assets/mixture.py) mirror these dataclasses field for field and take their defaults
from here; the assets build them from the run config, which checks every range once.

Source: Que et al., "D-CPT Law", arXiv 2406.01375: §3 (fitting, the three usages, the
Cross-Domain law), §4 (generalisation along N, D and r). Defaults and the choices that are ours:
docs/mixture.md. numpy only (through ``forms``), so the code location loads it without scipy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .forms import FORMS, HUBER_DELTA, N_BOOT


def _finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


@dataclass
class LawFitParams:
    """Parameters of the ``dcpt_law_fit`` asset.

    Raises:
        ValueError: a field outside its range (the message names it and the range).
    """

    forms: list[str] = field(default_factory=lambda: ["L3", "r_additive", "chinchilla", "L3_d0", "r_additive_d0"])
    """Law forms compared, non-empty (keys of ``ops.mixture.law.FORMS``: L3, r_additive, chinchilla,
    data_mixing_law, bimix, L3_d0, r_additive_d0); the first is the one the plan uses. The two *_d0
    forms (a D term finite at D = 0) joined the default by the rule registered for them: they beat
    L3 at both validation sizes (docs/mixture.md, "Forms")."""
    huber_delta: float = HUBER_DELTA
    """Huber delta on log-loss residuals (> 0; docs/mixture.md)."""
    holdout_last_k: int = 2
    """Unseen-D axis: the last k checkpoints of every run are held out (>= 1)."""
    n_boot: int = N_BOOT
    """Bootstrap refits (resampled runs) behind the plan's uncertainty (>= 0)."""
    early_checkpoints: int = 2
    """Cross-Domain law: checkpoints per run that count as an unseen domain's cheap early signal (>= 1)."""
    min_subdomain_share: float = 0.03
    """Sub-domains with a smaller share of domain tokens are left out of the Cross-Domain law (in [0, 1))."""
    workers: int = 0
    """Processes the independent fits run on (form fits, held-out folds per target, bootstrap per target,
    one Cross-Domain fit per unseen sub-domain), >= 0; 0 = every core the process may use (joblib's count,
    which honours cgroup CPU quotas), 1 = in this process. The results do not depend on it (each fit is
    deterministic)."""

    def __post_init__(self):
        self.forms = list(self.forms)
        unknown = [f for f in self.forms if f not in FORMS]
        if not self.forms or unknown:
            raise ValueError(f"dcpt_law_fit.forms must be a non-empty list of {sorted(FORMS)}, got {self.forms}")
        if not _finite("dcpt_law_fit.huber_delta", self.huber_delta) > 0:
            raise ValueError(f"dcpt_law_fit.huber_delta must be > 0, got {self.huber_delta}")
        for name, lo in (("holdout_last_k", 1), ("n_boot", 0), ("early_checkpoints", 1), ("workers", 0)):
            if getattr(self, name) < lo:
                raise ValueError(f"dcpt_law_fit.{name} must be >= {lo}, got {getattr(self, name)}")
        if not 0.0 <= _finite("dcpt_law_fit.min_subdomain_share", self.min_subdomain_share) < 1.0:
            raise ValueError(f"dcpt_law_fit.min_subdomain_share must be in [0, 1), got {self.min_subdomain_share}")


@dataclass
class FitFloorParams:
    """Parameters of the ``dcpt_fit_heldout_r2`` asset check: a fixed floor on the held-out R^2
    of the chosen form, which catches a broken fit (R^2 <= 0, an exploding extrapolation).

    A second, noise-derived floor (``noise.r2_floor``: 1 - k (1 - noise ceiling)) was a WARN check
    (``dcpt_fit_within_noise``) until it was removed: the probes' seeds agree so closely (domain
    ceiling ~0.998) that the floor asked for a held-out error near the seed noise, which the
    law, fitted across a 68x range of N, does not reach at probe scale, so it warned
    on every run (docs/mixture.md, "Noise ceiling"). The ceiling is still reported per axis.

    Raises:
        ValueError: a field outside its range (the message names it and the range).
    """

    min_heldout_r2: float = 0.3
    """The R^2 (<= 1) every held-out axis (unseen N, D, r) of both targets must reach. At probe scale the
    losses move a few tenths of a nat across N, D and r_d against ~0.05-0.1 nats of single-seed training
    noise and the embedded probes reach 0.48-0.94 held out, so 0.3 only catches a broken fit (R^2 <= 0,
    an exploding extrapolation) without failing an honest one. Raise it for production-size probes."""

    def __post_init__(self):
        if _finite("dcpt_fit_heldout_r2.min_heldout_r2", self.min_heldout_r2) > 1.0:
            raise ValueError(f"dcpt_fit_heldout_r2.min_heldout_r2 must be <= 1 (R^2), got {self.min_heldout_r2}")


@dataclass
class MixturePlanParams:
    """The target of the ``mixture_plan`` asset (arXiv 2406.01375 §3, the three usages). Zero
    means: derived from the probe grid (documented per field).

    Raises:
        ValueError: a field outside its range (the message names it and the range).
    """

    target_n_params: float = 0.0
    """Non-embedding parameters N of the target model (>= 0); 0 = the largest probed size (whose measured
    base general loss is then L_g0)."""
    target_tokens: float = 0.0
    """CPT tokens D of the target run (>= 0); 0 = 4x the largest probed D (a 4x extrapolation in D)."""
    max_general_degradation: float = 0.03
    """T: allowed relative rise of the general loss over the base model's (>= 0; paper example: 3%)."""
    domain_tokens: float = 0.0
    """Usage 2: the domain tokens available (>= 0); 0 = a quarter of target_tokens."""
    compute_flops: float = 0.0
    """Usage 3: the CPT compute budget C (FLOPs, C = 6 N D; >= 0); 0 = 6 x target N x target D."""
    max_extrapolation: float = 10.0
    """Usage 3 searches N (and D = C / 6N) no further than this multiple (>= 1) of the largest probed
    N (D)."""
    quantiles: list[float] = field(default_factory=lambda: [10.0, 90.0])
    """The two percentiles (0 <= low < high <= 100) of the bootstrap spread reported with each answer."""

    def __post_init__(self):
        for name in ("target_n_params", "target_tokens", "max_general_degradation", "domain_tokens", "compute_flops"):
            if _finite(f"mixture_plan.{name}", getattr(self, name)) < 0:
                raise ValueError(f"mixture_plan.{name} must be >= 0, got {getattr(self, name)}")
        if _finite("mixture_plan.max_extrapolation", self.max_extrapolation) < 1.0:
            raise ValueError(f"mixture_plan.max_extrapolation must be >= 1, got {self.max_extrapolation}")
        q = [_finite("mixture_plan.quantiles", x) for x in self.quantiles]
        if len(q) != 2 or not 0.0 <= q[0] < q[1] <= 100.0:
            raise ValueError(f"mixture_plan.quantiles must be two percentiles 0 <= low < high <= 100, got {list(self.quantiles)}")
        self.quantiles = q
