"""Staleness decay f(tau) of GBA's token control (arXiv 2205.11048 §3.2) and staleness histograms.

A worker pulls parameters at global step ``token`` and pushes its gradient when the server is at
global step ``step``; its staleness is tau = step - token (in optimizer steps). GBA keeps gradients
with small staleness as they are and decays those whose staleness exceeds a threshold. The paper
fixes neither f nor the threshold [open]; the default here is

    f(tau) = 1                                  for tau <= threshold   (threshold = 1)
    f(tau) = rate ** (tau - threshold)          above it                (rate = 0.5)
    f(tau) = 0  (gradient dropped)              for tau > drop_after    (drop_after = None: never)

threshold = 1 is the staleness a worker of average speed sees when the global batch is one local
batch per worker (M = W): while it computes, the others complete about one global step. A
straggler k times slower sees about k - 1 global steps and is decayed.

Any callable ``int -> float in [0, 1]`` can replace it (``Policy.decay``); 0 drops the gradient.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .errors import GBAConfigError


@dataclass(frozen=True)
class StalenessDecay:
    """f(tau): the weight of a gradient of staleness tau (global steps). See the module docstring."""

    threshold: int = 1
    """Staleness tau (global steps) up to which a gradient keeps weight 1 (>= 0)."""
    rate: float = 0.5
    """Decay base above the threshold: f(tau) = rate ** (tau - threshold), in [0, 1]."""
    drop_after: int | None = None
    """Drop (weight 0) gradients with staleness above this, >= threshold; None = never drop, only decay."""

    def check(self) -> None:
        """Raises GBAConfigError naming the field (negative threshold, rate outside [0, 1], drop_after
        below the threshold)."""
        if self.threshold < 0:
            raise GBAConfigError(f"policy.decay.threshold must be >= 0, got {self.threshold}")
        if not 0.0 <= self.rate <= 1.0:
            raise GBAConfigError(f"policy.decay.rate must be in [0, 1], got {self.rate}")
        if self.drop_after is not None and self.drop_after < self.threshold:
            raise GBAConfigError(f"policy.decay.drop_after ({self.drop_after}) must be >= threshold ({self.threshold})")

    def __call__(self, tau: int) -> float:
        if tau < 0:
            raise ValueError(f"staleness must be >= 0, got {tau} (a token from the future)")
        if self.drop_after is not None and tau > self.drop_after:
            return 0.0
        if tau <= self.threshold:
            return 1.0
        return float(self.rate ** (tau - self.threshold))


def histogram(taus: list[int]) -> dict[int, int]:
    """Staleness -> number of gradients, every value from 0 to the maximum present (zeros kept)."""
    counts = Counter(taus)
    return {t: counts.get(t, 0) for t in range(0, max(counts, default=-1) + 1)}
