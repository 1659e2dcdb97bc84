"""Seed noise of the probe losses and the best R^2 any law can reach under it.

Repeated probe runs -- the same model size, mixture ratio and CPT tokens D trained with different
seeds (a ``seed`` column in the points) -- measure how much a loss moves when nothing but the seed
changes. That spread bounds what a fitted law can explain: a law that predicted every
configuration's seed-mean exactly would still leave the seed-to-seed variance unexplained, so
its R^2 on loss is at most the *noise ceiling*

    R^2_max = 1 - sum_i s_i^2 / sum_i (y_i - mean(y))^2

over the scored points i, with s_i^2 the seed variance (ddof = 1) of point i's configuration.
``r2_floor`` turns a ceiling into the floor a held-out R^2 must reach (docs/mixture.md, "Noise
ceiling").

With one seed per configuration (or no ``seed`` column) nothing here can be estimated and every
function returns None rather than a guess.

Source: the noise ceiling is the standard explainable-variance bound (e.g. the "noise ceiling" of
encoding models in neuroscience; for scaling laws, Hoffmann et al. 2022 and Besiroglu et al. 2024
discuss the run-to-run noise their fits cannot explain). The D-CPT Law paper (arXiv 2406.01375)
reports a single run per configuration; repeating seeds is our addition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .forms import LOSS_COLUMN, _check_target, _Data, _load

NOISE_MULTIPLE = 2.0  # r2_floor default: held-out MSE may be at most 2x the seed noise variance


@dataclass(frozen=True)
class SeedNoise:
    """Seed noise of one target loss."""

    target: str
    """The loss: 'domain' or 'general'."""
    log_std: float
    """Pooled seed standard deviation of log loss (ddof = 1 within each configuration, pooled over
    configurations by degrees of freedom): the noise floor of a log-space fit."""
    loss_std: float
    """The same pooled seed standard deviation of the loss itself (nats/token)."""
    point_log_std: np.ndarray
    """Per point, the seed std of log loss of its configuration (NaN where the configuration has a single
    seed); shape (n_points,)."""
    point_var: np.ndarray
    """Per point, the seed variance of the loss (ddof = 1) of its configuration, or the pooled relative
    variance times loss^2 where it has a single seed; shape (n_points,)."""
    n_configs: int
    """Configurations with >= 2 seeds."""
    n_seeds_max: int
    """Most seeds of one configuration."""

    def ceiling(self, loss: np.ndarray, idx: np.ndarray | None = None) -> float | None:
        """Noise ceiling of R^2 on the points ``idx`` (default all) of ``loss`` (the same points the
        noise was estimated on): 1 - sum s_i^2 / sum (y_i - mean y)^2. None for fewer than 2
        points or no spread."""
        y = np.asarray(loss, dtype=float)
        sel = np.arange(len(y)) if idx is None else np.asarray(idx)
        if len(sel) < 2:
            return None
        ys = y[sel]
        ss_tot = float(np.sum((ys - ys.mean()) ** 2))
        if not ss_tot > 0:
            return None
        return 1.0 - float(np.sum(self.point_var[sel])) / ss_tot

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "log_std": self.log_std, "loss_std": self.loss_std,
                "n_configs": self.n_configs, "n_seeds_max": self.n_seeds_max}


def _seed_noise(data: _Data, target: str) -> SeedNoise | None:
    if data.seed is None:
        return None
    cfg = data.configs()
    n = data.n
    logy = np.log(data.loss)
    point_log_std = np.full(n, np.nan)
    point_var = np.full(n, np.nan)
    ss_log = ss_loss = 0.0
    dof = 0
    n_configs, n_seeds_max = 0, 1
    for c in np.unique(cfg):
        members = np.flatnonzero(cfg == c)
        seeds = np.unique(data.seed[members])
        if len(seeds) != len(members):
            raise ValueError(
                f"seed noise: configuration (n_params={data.N[members[0]]:g}, "
                f"domain_ratio={data.r_d[members[0]]:g}, tokens={data.D[members[0]]:g}) has "
                f"{len(members)} points but {len(seeds)} distinct seeds; one point per seed expected")
        if len(seeds) < 2:
            continue
        lv = float(np.var(logy[members], ddof=1))
        v = float(np.var(data.loss[members], ddof=1))
        point_log_std[members] = math.sqrt(lv)
        point_var[members] = v
        ss_log += lv * (len(members) - 1)
        ss_loss += v * (len(members) - 1)
        dof += len(members) - 1
        n_configs += 1
        n_seeds_max = max(n_seeds_max, len(members))
    if dof == 0:
        return None
    log_var = ss_log / dof
    single = np.isnan(point_var)
    # A configuration run with one seed: the pooled relative noise at its loss (log-space noise
    # is close to homoscedastic across sizes and ratios; its variance on loss is y^2 var(log y)).
    point_var[single] = data.loss[single] ** 2 * log_var
    return SeedNoise(target, math.sqrt(log_var), math.sqrt(ss_loss / dof), point_log_std,
                     point_var, n_configs, n_seeds_max)


def seed_noise(points, target: str) -> SeedNoise | None:
    """Seed noise of the ``target`` loss from repeated probe runs (arXiv 2406.01375 reports one run
    per configuration; docs/mixture.md, "Noise ceiling").

    points: probe points (``forms``) with a ``seed`` column; a configuration is one
    (n_params, domain_ratio, tokens[, domain]); its points with distinct seeds are its repeats.
    Returns None -- no estimate, not an error -- without a ``seed`` column or when no
    configuration has two or more seeds. Raises ValueError for invalid points (as ``fit_law``) or
    a configuration with two points of the same seed.
    """
    _check_target(target)
    return _seed_noise(_load(points, LOSS_COLUMN[target]), target)


def noise_ceiling(points, target: str) -> float | None:
    """Noise ceiling of R^2 on loss over all ``points`` (``SeedNoise.ceiling``): the best R^2 any
    model can reach given the seed noise, 1 - sum_i s_i^2 / sum_i (y_i - mean y)^2. None with a
    single seed per configuration or no ``seed`` column. Raises as ``seed_noise``."""
    _check_target(target)
    data = _load(points, LOSS_COLUMN[target])
    noise = _seed_noise(data, target)
    return None if noise is None else noise.ceiling(data.loss)


def r2_floor(ceiling: float | None, noise_multiple: float = NOISE_MULTIPLE,
             fallback: float | None = None) -> float | None:
    """The held-out R^2 a law must reach, derived from the noise ceiling of the same points.

        floor = 1 - noise_multiple * (1 - ceiling)

    i.e. the law's held-out mean squared error may be at most ``noise_multiple`` times the seed
    noise variance (1 - ceiling is the noise's share of the total variance). With the default 2
    the law's own error may be as large as the seed noise itself (MSE = noise + error^2 <=
    2 x noise) -- a correct law fitted on n points with p parameters has about (1 + p/n) x noise
    when interpolating. The floor moves with the data: high when seeds agree, low (even negative)
    when the noise dominates an axis, so the check is never a number chosen because it passes.

    ceiling: from ``SeedNoise.ceiling`` / ``noise_ceiling`` / the ``r2_ceiling`` of each axis of
    ``generalisation``; None or NaN (a single seed) returns ``fallback`` (None unless given: the caller's
    fixed floor). noise_multiple: >= 1. Raises ValueError for noise_multiple < 1 or a ceiling
    above 1 or not finite.
    """
    if not (isinstance(noise_multiple, (int, float)) and math.isfinite(noise_multiple) and noise_multiple >= 1):
        raise ValueError(f"noise_multiple must be a finite number >= 1, got {noise_multiple!r}")
    if ceiling is None or (isinstance(ceiling, float) and math.isnan(ceiling)):
        return fallback
    c = float(ceiling)
    if not math.isfinite(c) or c > 1.0:
        raise ValueError(f"ceiling must be an R^2 <= 1 (or None / NaN: no estimate), got {ceiling!r}")
    return 1.0 - noise_multiple * (1.0 - c)
