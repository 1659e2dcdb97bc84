"""Seeded straggler traces shared by every mode (GBA, arXiv 2205.11048 §5: stragglers in a shared
cluster; docs/gba.md, "Straggler trace").

A trace gives each (worker, k) — worker index in [0, W), k its k-th local batch — a slowdown
multiplier m >= 1: the worker's local batch takes m times its measured compute time, by sleeping
the difference. Sleep-based slowdowns model a worker that is slow for reasons outside the job
(a busy host), and keep the 2-core machine from being the bottleneck. ``base_delay_s`` adds a
simulated compute time to every local batch of every worker (0 = the real compute only), so a
benchmark can emulate a heavier model without burning CPU.

Kinds: ``none`` (m = 1); ``persistent`` (worker ``slow_worker`` has m = ``slowdown`` on every local
batch, the others 1); ``random`` (every worker, every local batch: m = 1 + X with X exponential of
mean ``mean_extra``, or Pareto (Lomax) with shape ``pareto_shape`` scaled to mean ``mean_extra``).
The draw for (worker, k) depends only on (seed, worker, k), so every mode replays the same trace.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import GBAConfigError

KINDS = ("none", "persistent", "random")
DISTRIBUTIONS = ("exponential", "pareto")


@dataclass(frozen=True)
class StragglerTrace:
    kind: str = "none"
    slowdown: float = 4.0
    slow_worker: int = -1
    """Index of the persistent straggler; negative counts from the end (-1 = the last worker)."""
    distribution: str = "exponential"
    mean_extra: float = 1.0
    pareto_shape: float = 2.5
    base_delay_s: float = 0.0
    seed: int = 0

    def check(self, workers: int) -> None:
        """Raises GBAConfigError naming the field (unknown kind or distribution, slowdown < 1,
        negative delays, Pareto shape <= 1, straggler index outside the workers)."""
        if self.kind not in KINDS:
            raise GBAConfigError(f"trace.kind must be one of {KINDS}, got {self.kind!r}")
        if self.distribution not in DISTRIBUTIONS:
            raise GBAConfigError(f"trace.distribution must be one of {DISTRIBUTIONS}, got {self.distribution!r}")
        if self.slowdown < 1.0:
            raise GBAConfigError(f"trace.slowdown must be >= 1 (a multiplier of compute time), got {self.slowdown}")
        if self.mean_extra < 0 or self.base_delay_s < 0:
            raise GBAConfigError(f"trace.mean_extra and trace.base_delay_s must be >= 0, got {self.mean_extra}, {self.base_delay_s}")
        if self.pareto_shape <= 1.0:
            raise GBAConfigError(f"trace.pareto_shape must be > 1 (finite mean), got {self.pareto_shape}")
        if self.kind == "persistent" and not -workers <= self.slow_worker < workers:
            raise GBAConfigError(f"trace.slow_worker must index one of the {workers} workers, got {self.slow_worker}")

    def multiplier(self, worker: int, k: int, workers: int) -> float:
        """Slowdown multiplier (>= 1) of ``worker``'s ``k``-th local batch in a run of ``workers``."""
        if self.kind == "none":
            return 1.0
        if self.kind == "persistent":
            return self.slowdown if worker == self.slow_worker % workers else 1.0
        import numpy as np

        rng = np.random.default_rng([self.seed, worker, k])
        if self.distribution == "exponential":
            return 1.0 + float(rng.exponential(self.mean_extra))
        return 1.0 + self.mean_extra * (self.pareto_shape - 1.0) * float(rng.pareto(self.pareto_shape))

    def delay_s(self, worker: int, k: int, workers: int, compute_s: float) -> float:
        """Seconds to sleep after a local batch that took ``compute_s`` to compute, so that it takes
        ``multiplier x (compute_s + base_delay_s)`` in all."""
        return self.base_delay_s + (self.multiplier(worker, k, workers) - 1.0) * (compute_s + self.base_delay_s)
