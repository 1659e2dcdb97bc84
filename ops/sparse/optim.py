"""Sparse optimizers: update only the rows a batch touched, with per-row state stored beside the
row in the embedding table's blocks (RecIS, arXiv 2509.20883 §3: sparse optimizer on dynamic
tables). The dense part of a model uses any ``torch.optim`` optimizer.

Each optimizer maps (weights [n, dim], state [n, state_width], grad [n, dim]) -> new (weights, state)
for the n touched rows; rows not in the batch are never read or written.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SparseAdagrad:
    """Adagrad per row, as ``torch.optim.Adagrad`` (lr_decay=0, weight_decay=0): state = sum of
    squared gradients [dim]; ``w -= lr * g / (sqrt(state) + eps)``. Duchi et al. 2011."""

    lr: float = 0.05
    """Learning rate."""
    eps: float = 1e-10
    """Added to sqrt(state) in the denominator (numerical stability)."""
    initial_accumulator_value: float = 0.0
    """Initial value of every row's sum of squared gradients."""

    def state_width(self, dim: int) -> int:
        return dim

    def slots(self, dim: int) -> list[tuple[str, int]]:
        """Layout of the state columns of a row: (name, width) in order (recorded in checkpoints)."""
        return [("sum", dim)]

    def init_state(self, n: int, dim: int) -> torch.Tensor:
        return torch.full((n, dim), self.initial_accumulator_value)

    def update(self, w: torch.Tensor, s: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = s + g * g
        return w - self.lr * g / (s.sqrt() + self.eps), s

    def update_(self, full: torch.Tensor, g: torch.Tensor, dim: int) -> None:
        """``update`` in place on full rows [n, dim + dim] (weights, then state); the same arithmetic in
        the same order, so the same bits."""
        w, s = full[:, :dim], full[:, dim:]
        new = s + g * g                                   # contiguous: elementwise ops on strided halves run slower
        s.copy_(new)
        step = self.lr * g
        step.div_(new.sqrt_().add_(self.eps))
        w.sub_(step)


@dataclass(frozen=True)
class SparseAdam:
    """Adam per row with a per-row step count (lazy Adam), as ``torch.optim.Adam`` restricted to the
    rows in the batch: state = [m (dim), v (dim), t (1)]. Kingma & Ba 2015, Algorithm 1."""

    lr: float = 1e-3
    """Learning rate."""
    beta1: float = 0.9
    """Decay rate of the first-moment estimate m."""
    beta2: float = 0.999
    """Decay rate of the second-moment estimate v."""
    eps: float = 1e-8
    """Added to the bias-corrected sqrt(v) in the denominator (numerical stability)."""

    def state_width(self, dim: int) -> int:
        return 2 * dim + 1

    def slots(self, dim: int) -> list[tuple[str, int]]:
        """Layout of the state columns of a row: (name, width) in order (recorded in checkpoints)."""
        return [("m", dim), ("v", dim), ("step", 1)]

    def init_state(self, n: int, dim: int) -> torch.Tensor:
        return torch.zeros(n, 2 * dim + 1)

    def update(self, w: torch.Tensor, s: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dim = w.shape[1]
        m, v, t = s[:, :dim], s[:, dim:2 * dim], s[:, 2 * dim:] + 1
        m = m.lerp(g, 1 - self.beta1)
        v = v * self.beta2 + (1 - self.beta2) * g * g
        bc1 = 1 - self.beta1 ** t
        bc2 = (1 - self.beta2 ** t).sqrt()
        w = w - (self.lr / bc1) * m / (v.sqrt() / bc2 + self.eps)
        return w, torch.cat([m, v, t], dim=1)

    def update_(self, full: torch.Tensor, g: torch.Tensor, dim: int) -> None:
        """``update`` written into full rows [n, 3 dim + 1] (weights, m, v, step). Computed out of place
        as ``update`` does: ``lerp_`` on a strided view can round differently (measured: 1 ulp)."""
        w, s = self.update(full[:, :dim], full[:, dim:], g)
        full[:, :dim] = w
        full[:, dim:] = s
