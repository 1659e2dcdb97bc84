"""Seeded straggler traces shared by every mode (GBA, arXiv 2205.11048 §5: stragglers in a shared
cluster; docs/gba.md, "Straggler trace").

A trace gives each (worker, k) — worker index in [0, W), k its k-th local batch — a slowdown
multiplier m >= 1. The slowdown is real work, not a sleep: the worker computes the forward and
backward pass of that local batch ``passes(worker, k) `` times and keeps only the first gradient
(``ops.gba.model.repeat``; the RNG is restored after the extra passes, so the kept gradient and
the dropout stream are those of an unslowed worker). ``passes`` is floor(m), plus one more pass
with probability frac(m) drawn from (seed, worker, k), so the expected work is m x one pass. A
worker is thus m times slower for as long as the machine has a core for it (on an oversubscribed
machine, CPU contention adds to it; docs/gba.md, "Known limits").

Kinds: ``none`` (m = 1); ``persistent`` (worker ``slow_worker`` has m = ``slowdown`` on its local
batches ``onset`` <= k < ``recovery`` (-1: to the end), the others 1); ``random`` (every worker,
every local batch: m = 1 + X with X exponential of mean ``mean_extra``, or Pareto (Lomax) with
shape ``pareto_shape`` scaled to mean ``mean_extra``). The draw for (worker, k) depends only on
(seed, worker, k), so every mode replays the same trace.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import GBAConfigError

KINDS = ("none", "persistent", "random")
DISTRIBUTIONS = ("exponential", "pareto")
MAX_PASSES = 64
"""Cap on the passes of one local batch (a Pareto draw can be huge)."""


@dataclass(frozen=True)
class StragglerTrace:
    kind: str = "none"
    """Trace kind: none (m = 1) | persistent (one slow worker) | random (every worker, random extra time)."""
    slowdown: float = 4.0
    """Persistent: the slow worker's multiplier m of compute time on its slow local batches (>= 1)."""
    slow_worker: int = -1
    """Index of the persistent straggler; negative counts from the end (-1 = the last worker)."""
    distribution: str = "exponential"
    """Random: law of the extra time X in m = 1 + X: exponential | pareto (Lomax)."""
    mean_extra: float = 1.0
    """Random: mean of the extra time X, as a multiple of compute time (>= 0)."""
    pareto_shape: float = 2.5
    """Random, pareto: shape of the Lomax law, scaled to mean ``mean_extra`` (> 1: a finite mean)."""
    onset: int = 0
    """Persistent straggler: slow from its local batch ``onset`` ..."""
    recovery: int = -1
    """... up to (not including) its local batch ``recovery``; -1 = to the end of the run."""
    seed: int = 0
    """Seed of the draws: the draw for (worker, k) depends only on (seed, worker, k); every mode replays it."""

    def check(self, workers: int) -> None:
        """Raises GBAConfigError naming the field (unknown kind or distribution, slowdown < 1,
        negative mean extra, Pareto shape <= 1, straggler index outside the workers, onset < 0,
        recovery not after the onset)."""
        if self.kind not in KINDS:
            raise GBAConfigError(f"trace.kind must be one of {KINDS}, got {self.kind!r}")
        if self.distribution not in DISTRIBUTIONS:
            raise GBAConfigError(f"trace.distribution must be one of {DISTRIBUTIONS}, got {self.distribution!r}")
        if self.slowdown < 1.0:
            raise GBAConfigError(f"trace.slowdown must be >= 1 (a multiplier of compute time), got {self.slowdown}")
        if self.mean_extra < 0:
            raise GBAConfigError(f"trace.mean_extra must be >= 0, got {self.mean_extra}")
        if self.pareto_shape <= 1.0:
            raise GBAConfigError(f"trace.pareto_shape must be > 1 (finite mean), got {self.pareto_shape}")
        if self.kind == "persistent" and not -workers <= self.slow_worker < workers:
            raise GBAConfigError(f"trace.slow_worker must index one of the {workers} workers, got {self.slow_worker}")
        if self.onset < 0 or (self.recovery != -1 and self.recovery <= self.onset):
            raise GBAConfigError(f"trace.onset must be >= 0 and trace.recovery -1 or > onset, got {self.onset}, {self.recovery}")

    def multiplier(self, worker: int, k: int, workers: int) -> float:
        """Slowdown multiplier (>= 1) of ``worker``'s ``k``-th local batch in a run of ``workers``."""
        if self.kind == "none":
            return 1.0
        if self.kind == "persistent":
            on = k >= self.onset and (self.recovery == -1 or k < self.recovery)
            return self.slowdown if on and worker == self.slow_worker % workers else 1.0
        rng = self._rng(worker, k)
        if self.distribution == "exponential":
            return 1.0 + float(rng.exponential(self.mean_extra))
        return 1.0 + self.mean_extra * (self.pareto_shape - 1.0) * float(rng.pareto(self.pareto_shape))

    def _rng(self, worker: int, k: int, stream: int = 0):
        import numpy as np

        return np.random.default_rng([self.seed, worker, k, stream])

    def passes(self, worker: int, k: int, workers: int) -> int:
        """Forward/backward passes (>= 1, <= MAX_PASSES) that ``worker`` computes for its ``k``-th
        local batch: floor(m), plus one with probability frac(m) (seeded by (seed, worker, k))."""
        m = self.multiplier(worker, k, workers)
        n = int(m)
        frac = m - n
        if frac > 0 and float(self._rng(worker, k, 1).random()) < frac:
            n += 1
        return max(1, min(MAX_PASSES, n))
