"""How well a fitted D-CPT Law generalises and how certain it is: held-out fit quality along N,
D and r separately (``generalisation``, ``compare_generalisation`` for several forms by name),
each axis next to its noise ceiling (``noise``), and refits on resampled runs (``Bootstrap``,
``bootstrap``) with percentile intervals per parameter, whose spread the usages report.

Source: Que et al., arXiv 2406.01375 (NeurIPS 2024), §4 (generalisability of the law along model
size N, data size D and mixture ratio r). The choice of held-out folds and the run-level bootstrap
are ours: docs/mixture.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .fit import LawFit, _fit_data
from .problem import _one_blas_thread, _Problem
from .forms import (
    FORMS,
    HUBER_DELTA,
    LOSS_COLUMN,
    N_BOOT,
    N_GRID,
    N_STARTS,
    LawForm,
    _check_target,
    _Data,
    _form,
    _load,
    _metrics,
)
from .noise import SeedNoise, _seed_noise


# --------------------------------------------------------------------------------------------
# Generalisation along N, D and r (held-out Huber and R^2 per axis)


def _pooled(data: _Data, folds: list[np.ndarray], target: str, form: LawForm, delta: float,
            n_grid: int, n_starts: int, bounds=None, noise: SeedNoise | None = None) -> dict[str, Any]:
    preds, obs, n_train, at_bound = [], [], [], {}
    for test in folds:
        train = np.setdiff1d(np.arange(data.n), test)
        fit = _fit_data(data.take(train), target, form, delta, n_grid, n_starts, bounds=bounds)
        preds.append(fit.predict(data.N[test], data.D[test], data.r_d[test]))
        obs.append(data.loss[test])
        n_train.append(len(train))
        for k, v in fit.at_bound.items():
            at_bound[k] = at_bound.get(k, 0) + (v is not None)
    m = _metrics(np.concatenate(preds), np.concatenate(obs), delta)
    every = np.concatenate(folds)
    return {"huber": m["huber"], "r2": m["r2"], "mare": m["mare"],
            "r2_ceiling": None if noise is None else noise.ceiling(data.loss, every),
            "n_train": int(round(np.mean(n_train))), "n_test": int(len(every)),
            "n_folds": len(folds), "folds_at_bound": at_bound}


def _skipped(reason: str) -> dict[str, Any]:
    nan = float("nan")
    return {"huber": nan, "r2": nan, "mare": nan, "r2_ceiling": None, "n_train": 0, "n_test": 0,
            "n_folds": 0, "folds_at_bound": {}, "skipped": reason}


@_one_blas_thread
def generalisation(points, target: str, form: str = "L3", huber_delta: float = HUBER_DELTA,
                   n_grid: int = N_GRID, n_starts: int = N_STARTS, holdout_last_k: int = 2,
                   holdout_ratios: Sequence[float] | None = None,
                   holdout_sizes: Sequence[float] | None = None,
                   bounds: Mapping[str, tuple[float, float]] | None = None) -> dict[str, Any]:
    """Held-out fit quality along each axis separately (arXiv 2406.01375 §4; docs/mixture.md).

    - ``unseen_N``: leave-one-model-size-out over ``holdout_sizes`` (default: every distinct
      n_params except the smallest and largest; needs >= 3 sizes), predictions pooled over folds;
      ``unseen_N_extrapolation``: the same for the smallest and the largest size (reported, and
      expected to be worse: it extrapolates the N term beyond the probed range);
      ``unseen_N_largest``: the largest size alone (the extrapolation a plan for a larger target
      relies on; its ``mare`` is the extrapolation MARE).
    - ``unseen_D``: one fit on all but the last ``holdout_last_k`` checkpoints of each run (runs
      with that many or fewer checkpoints stay whole in training); predicts the later ones.
    - ``unseen_r``: leave-one-ratio-out over ``holdout_ratios`` (default: every distinct
      domain_ratio except the smallest and largest), pooled.
    Each axis: {huber (mean Huber of log residuals), r2 (on loss), mare, r2_ceiling (the noise
    ceiling of R^2 on that axis's held-out points, ``noise``; None without repeated seeds),
    n_train (mean per fold), n_test, n_folds, folds_at_bound ({parameter: folds whose fit ended
    on a bound})}; an axis that cannot be formed has NaN metrics and a ``skipped`` reason. Also
    ``in_sample`` (with ``at_bound`` and ``r2_ceiling``) and ``noise`` (``SeedNoise.to_dict()``
    or None). ``bounds`` as in ``fit_law``. Costs 1 + sizes + 1 + ratios fits. Raises as
    ``fit_law`` (and ``seed_noise`` for a duplicated seed).

    With only 3 sizes each unseen_N fold extrapolates from 2, where E, A and alpha are not
    jointly identifiable: expect a poor unseen_N score when the N term is weak (measured: R^2
    far below 0 for a general loss whose N term is small), and probe >= 4 sizes where possible.
    """
    _check_target(target)
    f = _form(form)
    data = _load(points, LOSS_COLUMN[target])
    noise = _seed_noise(data, target)
    full = _fit_data(data, target, f, huber_delta, n_grid, n_starts, bounds=bounds)
    out: dict[str, Any] = {"form": f.name, "target": target,
                           "in_sample": {"huber": full.huber, "r2": full.r2, "n": data.n,
                                         "r2_ceiling": None if noise is None else noise.ceiling(data.loss),
                                         "at_bound": dict(full.at_bound)},
                           "noise": None if noise is None else noise.to_dict()}
    args = (target, f, huber_delta, n_grid, n_starts, bounds, noise)
    sizes = np.unique(data.N)
    if len(sizes) < 3:
        out["unseen_N"] = out["unseen_N_extrapolation"] = out["unseen_N_largest"] = _skipped(
            f"needs >= 3 model sizes, got {len(sizes)}")
    else:
        # Interior sizes (interpolation), like unseen_r; the smallest and largest (extrapolation
        # beyond the probed range) are reported apart: with 3-4 sizes an extrapolation fold fits
        # E, A and alpha on 2-3 sizes, which the probe noise does not pin down (measured on the
        # embedded probes: MARE 4% interior vs 15-18% for the smallest size held out).
        inner = sizes[1:-1] if holdout_sizes is None else np.asarray(holdout_sizes, dtype=float)
        folds = [fo for fo in (np.flatnonzero(np.isclose(data.N, s)) for s in inner) if len(fo)]
        out["unseen_N"] = _pooled(data, folds, *args) if folds else _skipped("no interior size to hold out")
        out["unseen_N_extrapolation"] = _pooled(data, [np.flatnonzero(data.N == s) for s in (sizes[0], sizes[-1])], *args)
        # The extrapolation a plan needs (a target larger than every probe): the largest size alone.
        out["unseen_N_largest"] = _pooled(data, [np.flatnonzero(data.N == sizes[-1])], *args)
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


BOOT_UNITS = ("auto", "runs", "residuals")
"""What ``bootstrap`` resamples: whole runs within each model size, log-loss residuals of the full
fit, or 'auto' (runs when every size has >= 2 runs, else residuals)."""


@dataclass(frozen=True)
class Bootstrap:
    """Refits of one law on resampled data (``unit``: whole runs or residuals)."""

    fit: LawFit
    """The fit on all points."""
    fits: tuple[LawFit, ...]
    """The refits, one per bootstrap resample (of whole runs stratified by model size, or of residuals)."""
    seed: int
    """Seed of the resampling (same seed and points: the domain and general bootstraps draw the same runs)."""
    unit: str = "runs"
    """The resampled unit: 'runs' (whole runs, stratified by model size) or 'residuals' (the full fit's
    log-loss residuals, leverage-modified and centred, added back to its predictions)."""

    def params(self) -> dict[str, np.ndarray]:
        """Parameter samples: {name: array of shape (len(fits),)}."""
        return {k: np.array([f.params[k] for f in self.fits]) for k in self.fit.params}

    @property
    def identified(self) -> bool | None:
        """The full fit's identification (``LawFit.identified``): False when a parameter sits on a bound."""
        return self.fit.identified

    def not_identified(self) -> dict[str, str]:
        """{parameter: 'lower' | 'upper'} for every parameter of the full fit on a bound (empty when
        identified or not recorded)."""
        return {k: v for k, v in (self.fit.at_bound or {}).items() if v}

    def intervals(self, level: float = 95.0) -> dict[str, tuple[float, float]]:
        """Percentile intervals per parameter: {name: (lo, hi)} at ``level`` percent (central;
        95 -> 2.5th and 97.5th percentiles of the refits). Empty when there are no refits.
        These are confidence intervals only when the fit is identified (``identified``): with a
        parameter on a bound they are the refits' range, not an interval (``summary`` says which).
        Raises ValueError for level outside (0, 100)."""
        if not 0.0 < level < 100.0:
            raise ValueError(f"level must be in (0, 100), got {level!r}")
        if not self.fits:
            return {}
        q = (50.0 - level / 2.0, 50.0 + level / 2.0)
        # Weibull plotting positions (Hyndman & Fan type 6: the q-quantile sits at order statistic q (B + 1),
        # Efron & Tibshirani 1993, §13.3): numpy's default (type 7) pulls both ends inwards, to ~93% nominal
        # at B = 100 refits for a 95% interval
        return {k: tuple(float(x) for x in np.percentile(v, q, method="weibull")) for k, v in self.params().items()}

    def at_bound_share(self) -> dict[str, float]:
        """Per parameter, the share of refits whose optimum sits on a bound (0 without refits or
        where refits did not record it)."""
        n = len(self.fits)
        return {k: (sum(1 for f in self.fits if f.at_bound and f.at_bound.get(k)) / n if n else 0.0)
                for k in self.fit.params}

    def summary(self, level: float = 95.0) -> dict[str, Any]:
        """JSON-ready per-parameter report: {name: {value, lo, hi, at_bound, refits_at_bound}}
        plus ``n_boot``, ``level``, ``unit``, ``identified`` and ``not_identified`` (the parameters
        on a bound). When the fit is not identified, ``lo``/``hi`` are None and the refits' range is
        under ``refit_range`` instead: an optimum on a bound would lie beyond it, so the percentiles
        of the refits are not a confidence interval of anything."""
        iv = self.intervals(level)
        share = self.at_bound_share()
        at = self.fit.at_bound or {}
        ident = self.identified is not False
        out: dict[str, Any] = {"n_boot": len(self.fits), "level": level, "unit": self.unit,
                               "identified": self.identified, "not_identified": self.not_identified(),
                               "params": {}}
        for k, v in self.fit.params.items():
            lo, hi = iv.get(k, (float("nan"), float("nan")))
            row = {"value": float(v), "at_bound": at.get(k), "refits_at_bound": share[k]}
            if ident:
                row.update(lo=lo, hi=hi)
            else:
                row.update(lo=None, hi=None, refit_range=[lo, hi])
            out["params"][k] = row
        return out


def _boot_unit(unit: str, strata: Sequence[Sequence]) -> str:
    if unit not in BOOT_UNITS:
        raise ValueError(f"bootstrap: unit must be one of {BOOT_UNITS}, got {unit!r}")
    single = [i for i, s in enumerate(strata) if len(s) < 2]
    if unit == "auto":
        return "residuals" if single else "runs"
    if unit == "runs" and len(single) == len(strata):
        raise ValueError(
            "bootstrap: unit 'runs' cannot vary here: every model size has exactly one run, so resampling whole runs "
            "within each size draws the same points every time and the intervals would have zero width; "
            "use unit='residuals' (or 'auto'), or train >= 2 runs per size (ratios or seeds)")
    return unit


@_one_blas_thread
def bootstrap(points, target: str, form: str = "L3", n_boot: int = N_BOOT, seed: int = 0,
              huber_delta: float = HUBER_DELTA, n_grid: int = 2, n_starts: int = 2,
              bounds: Mapping[str, tuple[float, float]] | None = None, unit: str = "auto") -> Bootstrap:
    """Bootstrap the fit (``n_boot`` refits) by resampling a unit that varies (``unit``):

    - 'runs': whole runs (n_params, domain_ratio[, seed]) with replacement, stratified by model
      size (each size keeps its number of runs, so every refit still sees all sizes). Refused
      (ValueError) when every size has one run: each resample would be the full data again.
    - 'residuals': the full fit's log-loss residuals, modified by their leverage (r_i / sqrt(1 - h_i),
      h from the Jacobian of log L at the optimum; Davison & Hinkley 1997, Alg. 6.1) and centred,
      drawn with replacement and added to its log predictions. Refused when the residuals are all zero (an exact fit: nothing varies).
    - 'auto' (default): 'runs' when every size has >= 2 runs, else 'residuals' (with one run at
      some size, its points would never vary between resamples).

    Each refit starts from the full fit's optimum plus the ``n_starts`` best points of a coarse
    (``n_grid``) grid: ~0.03-0.3 s per refit. ``Bootstrap.intervals`` gives percentile intervals
    per parameter; they are confidence intervals only when the fit is identified (no parameter on
    a bound; ``Bootstrap.summary``). Coverage, measured by tests/ops/test_mixture_law_identified.py:
    95% residual-bootstrap intervals on 25 synthetic Chinchilla points (1% noise) cover every true
    parameter in >= 90% of 100 simulated fits.

    With the same ``points`` and ``seed`` the domain and general bootstraps draw the same runs
    (and residual indices), so ``zip(boot_general.fits, boot_domain.fits)`` pairs fits of one
    resample. A run resample that fails the fit's checks is redrawn (at most 10 times per refit).
    ``bounds`` as in ``fit_law``. Raises as ``fit_law``, and ValueError for an unknown ``unit`` or
    a unit that cannot vary (message names it).
    """
    _check_target(target)
    f = _form(form)
    data = _load(points, LOSS_COLUMN[target])
    runs = data.runs()
    run_ids = np.unique(runs)
    run_size = {r: data.N[runs == r][0] for r in run_ids}
    strata = [[r for r in run_ids if run_size[r] == s] for s in np.unique(data.N)]
    unit = _boot_unit(unit, strata)
    full = _fit_data(data, target, f, huber_delta, N_GRID, N_STARTS, bounds=bounds)
    rng = np.random.default_rng(seed)
    fits = []
    if unit == "residuals":
        log_pred = np.log(full.predict(data.N, data.D, data.r_d))
        p = len(full.params)
        if data.n <= p:
            raise ValueError(f"bootstrap: residuals need more points than parameters ({data.n} <= {p})")
        # modified residuals (Davison & Hinkley 1997, Alg. 6.1): r_i / sqrt(1 - h_i) with h the leverages of
        # the log-loss Jacobian at the optimum (a point the fit leans on leaves a shrunken residual), centred
        prob = _Problem.build(f, data, target, huber_delta, bounds=bounds)
        J = prob.log_pred(prob.theta_from_params(full.params), grad=True)[1].copy()
        h = np.clip(np.sum(np.linalg.qr(J)[0] ** 2, axis=1), 0.0, 0.99)
        res = (np.log(data.loss) - log_pred) / np.sqrt(1.0 - h)
        res = res - res.mean()
        if not np.any(np.abs(res) > 1e-9):   # log residuals: below 1e-9 is the optimiser's precision, not noise
            raise ValueError("bootstrap: the fit's residuals are all zero (an exact fit), so a residual "
                             "bootstrap cannot vary; there is no sampling noise to estimate from these points")
        for _ in range(n_boot):
            boot = data.take(np.arange(data.n))
            boot.loss[:] = np.exp(log_pred + rng.choice(res, size=data.n, replace=True))
            fits.append(_fit_data(boot, target, f, huber_delta, n_grid, n_starts,
                                  init=full.params, bounds=bounds))
        return Bootstrap(full, tuple(fits), seed, unit)
    members = {r: np.flatnonzero(runs == r) for r in run_ids}
    for _ in range(n_boot):
        for _attempt in range(10):
            chosen = [r for s in strata for r in rng.choice(s, size=len(s), replace=True)]
            idx = np.concatenate([members[r] for r in chosen])
            try:
                fits.append(_fit_data(data.take(idx), target, f, huber_delta, n_grid, n_starts,
                                      init=full.params, bounds=bounds))
                break
            except ValueError:
                continue
    return Bootstrap(full, tuple(fits), seed, unit)


@_one_blas_thread
def compare_generalisation(points, target: str, forms: Sequence[str] = tuple(FORMS),
                           **kwargs) -> dict[str, dict[str, Any]]:
    """``generalisation`` for each form by name on the same points: {form: result}. Default: every
    registered form (L3, r_additive, chinchilla, data_mixing_law, bimix, L3_d0, r_additive_d0). Each result carries
    R^2, MARE and the noise ceiling per axis, so ``out[f]["unseen_N_largest"]["mare"]`` is form
    f's extrapolation MARE. kwargs as ``generalisation``; raises as ``generalisation``."""
    return {name: generalisation(points, target, name, **kwargs) for name in forms}
