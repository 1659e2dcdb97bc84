"""The D-CPT Law: predict general and domain loss after continual pre-training (CPT) from model
size N, CPT tokens D and mixture ratio r, then choose the mixture on the fitted law.

Source: Que et al., "D-CPT Law: Domain-specific Continual Pre-Training Scaling Law for Large
Language Models", arXiv 2406.01375 (NeurIPS 2024): §3 (parameterisations, fitting, the three
usages, the Cross-Domain D-CPT Law) and §4 (fit quality and generalisation along N, D and r).
Spec, defaults and the choices that are ours: docs/mixture.md.

Modules, by concept (each imports only those before it):

- ``forms``: the parameterisations (``LawForm``, ``FORMS``: L3, r-additive, Chinchilla, L3 and
  r-additive with a D term offset by D0 (B / (D + D0)^beta), and for comparison the Data Mixing
  Law of Ye et al. 2024 and BiMix of Ge et al. 2024), the Huber loss
  and fit metrics, the fit's defaults, and loading/checking probe points (§3).
- ``fit``: the optimiser's problem (log-sum-exp in log space), ``LawFit`` (with the parameters
  on a bound), ``fit_law`` and ``compare_forms`` (§3-§4).
- ``noise``: seed noise of repeated probe runs, the noise ceiling of R^2 and the held-out floor
  derived from it (``seed_noise``, ``noise_ceiling``, ``r2_floor``).
- ``heldout``: held-out generalisation along N, D and r (``generalisation``,
  ``compare_generalisation``, §4) and the run-level ``bootstrap`` with percentile intervals.
- ``usages``: ``MixturePlan`` and the three usages, ``tradeoff_ratio``, ``limited_domain`` and
  ``allocate_compute`` (§3).
- ``crossdomain``: the Cross-Domain D-CPT Law, ``fit_cross_domain``, ``split_early``,
  ``estimate_k`` (bounded), ``estimate_k_interval``, ``estimation_cost`` (FLOPs of K vs a full
  fit), ``predict_unseen_domain``, ``evaluate_unseen_domain`` and one leave-one-domain-out fold
  (``leave_one_domain_out``, §3.2).
- ``config``: the parameters, defaults and ranges of the fit, its held-out floor and the plan
  (``LawFitParams``, ``FitFloorParams``, ``MixturePlanParams``), which the ``dcpt_law_fit``,
  ``dcpt_fit_heldout_r2`` and ``mixture_plan`` run configs mirror.

Units and probe-point columns: see ``forms``. This package re-exports the public names, loaded on
first use, so callers use ``from ops.mixture import law; law.fit_law(...)``. numpy/scipy only; no
torch, no dagster.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Public name -> the submodule defining it. Loaded on first use (PEP 562), so that importing
# ``ops.mixture.law.config`` (the run-config defaults the Dagster code location reads at load)
# pulls in numpy only, not scipy.
_EXPORTS = {
    **dict.fromkeys(("CrossDomainFit", "K_MARGIN", "estimate_k", "estimate_k_interval", "estimation_cost",
                     "evaluate_unseen_domain", "fit_cross_domain", "leave_one_domain_out", "predict_unseen_domain",
                     "split_early"), "crossdomain"),
    **dict.fromkeys(("DCPT_FORMS", "LawFit", "compare_forms", "fit_law"), "fit"),
    **dict.fromkeys(("FORMS", "HUBER_DELTA", "LOSS_COLUMN", "N_BOOT", "N_GRID", "N_STARTS", "TARGETS", "LawForm",
                     "huber"), "forms"),
    **dict.fromkeys(("Bootstrap", "bootstrap", "compare_generalisation", "generalisation"), "heldout"),
    **dict.fromkeys(("NOISE_MULTIPLE", "SeedNoise", "noise_ceiling", "r2_floor", "seed_noise"), "noise"),
    **dict.fromkeys(("MixturePlan", "allocate_compute", "limited_domain", "tradeoff_ratio"), "usages"),
    **dict.fromkeys(("LawFitParams", "FitFloorParams", "MixturePlanParams"), "config"),
}

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only  # noqa: F401
    from .config import FitFloorParams, LawFitParams, MixturePlanParams
    from .crossdomain import (K_MARGIN, CrossDomainFit, estimate_k, estimate_k_interval, estimation_cost,
                              evaluate_unseen_domain, fit_cross_domain, leave_one_domain_out, predict_unseen_domain,
                              split_early)
    from .fit import DCPT_FORMS, LawFit, compare_forms, fit_law
    from .forms import FORMS, HUBER_DELTA, LOSS_COLUMN, N_BOOT, N_GRID, N_STARTS, TARGETS, LawForm, huber
    from .heldout import Bootstrap, bootstrap, compare_generalisation, generalisation
    from .noise import NOISE_MULTIPLE, SeedNoise, noise_ceiling, r2_floor, seed_noise
    from .usages import MixturePlan, allocate_compute, limited_domain, tradeoff_ratio


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


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
    "compare_generalisation",
    "bootstrap",
    "SeedNoise",
    "seed_noise",
    "noise_ceiling",
    "r2_floor",
    "tradeoff_ratio",
    "limited_domain",
    "allocate_compute",
    "fit_cross_domain",
    "estimate_k",
    "estimate_k_interval",
    "estimation_cost",
    "predict_unseen_domain",
    "evaluate_unseen_domain",
    "leave_one_domain_out",
    "split_early",
    "LawFitParams",
    "FitFloorParams",
    "MixturePlanParams",
]
