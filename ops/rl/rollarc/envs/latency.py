"""Injected environment latency (RollArc's heterogeneous environment cost, arXiv 2512.22560 §4):
``EnvLatency`` (seeded per-step samples of one of ``LATENCY_KINDS`` at a given mean) and
``LatentEnv`` (an environment that sleeps that long before each step)."""

from __future__ import annotations

import math
import random
import threading
import time
from typing import Optional

from ops.rl.rollarc.types import StepResult, Task

from .base import LATENCY_KINDS, TextEnv


class EnvLatency:
    """Per-step latency injected into an environment (the benchmark's knob). Same mean for every
    kind except ``none``; thread-safe; seeded (``random.Random(seed)``).

    Kinds, for mean m (quantiles at m = 1 s, from the closed forms):
        none:   0 always.
        low:    lognormal, sigma 0.1, mu = ln m - sigma^2/2     (p50 1.00, p99 1.26; p99/p50 1.26)
        medium: lognormal, sigma 0.75, mu = ln m - sigma^2/2    (p50 0.75, p99 4.3;  p99/p50 5.7)
        heavy:  Pareto, alpha 1.5, scale x_m = m (alpha-1)/alpha = m/3 (p50 0.53, p99 7.2;
                p99/p50 13.6; infinite variance: sample means converge slowly).

    Args:
        kind: one of ``LATENCY_KINDS``.
        mean_s: mean seconds (>= 0).
        seed: RNG seed; give each environment instance its own.
        max_s: optional clip of each sample (lowers the mean of ``heavy``/``medium`` a little).

    Raises:
        ValueError: unknown kind, negative mean or non-positive max_s.
    """

    SIGMA = {"low": 0.1, "medium": 0.75}
    PARETO_ALPHA = 1.5

    def __init__(self, kind: str = "none", mean_s: float = 0.0, seed: int = 0, max_s: Optional[float] = None):
        if kind not in LATENCY_KINDS:
            raise ValueError(f"latency kind must be one of {LATENCY_KINDS}, got {kind!r}")
        if not (isinstance(mean_s, (int, float)) and mean_s >= 0 and math.isfinite(mean_s)):
            raise ValueError(f"latency mean_s must be a finite number >= 0, got {mean_s!r}")
        if max_s is not None and not max_s > 0:
            raise ValueError(f"latency max_s must be > 0 or None, got {max_s!r}")
        self.kind, self.mean_s, self.seed, self.max_s = kind, float(mean_s), seed, max_s
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def sample(self) -> float:
        """One latency in seconds (>= 0)."""
        if self.kind == "none" or self.mean_s == 0:
            return 0.0
        with self._lock:
            if self.kind == "heavy":
                a = self.PARETO_ALPHA
                x = self.mean_s * (a - 1) / a * self._rng.paretovariate(a)
            else:
                s = self.SIGMA[self.kind]
                x = self._rng.lognormvariate(math.log(self.mean_s) - s * s / 2, s)
        return min(x, self.max_s) if self.max_s is not None else x

    def __repr__(self):
        return f"EnvLatency(kind={self.kind!r}, mean_s={self.mean_s}, seed={self.seed}, max_s={self.max_s})"


class LatentEnv(TextEnv):
    """Wraps an environment and sleeps ``latency.sample()`` seconds before each ``step``.
    ``info["injected_latency_s"]``: seconds slept in this episode so far."""

    def __init__(self, env: TextEnv, latency: EnvLatency):
        self.env, self.latency = env, latency
        self.name = env.name
        self.injected_s = 0.0

    def reset(self, task: Task) -> str:
        self.injected_s = 0.0
        return self.env.reset(task)

    def step(self, action_text: str) -> StepResult:
        dt = self.latency.sample()
        if dt > 0:
            time.sleep(dt)
        self.injected_s += dt
        r = self.env.step(action_text)
        return StepResult(r.observation, r.done, {**r.info, "injected_latency_s": self.injected_s})

    def close(self) -> None:
        self.env.close()
