"""Sparse optimizers: update only the rows a batch touched, with per-row state stored beside the
row in the embedding table's blocks (RecIS, arXiv 2509.20883 §3: sparse optimizer on dynamic
tables). The dense part of a model uses any ``torch.optim`` optimizer.

Each optimizer maps (weights [n, dim], state [n, state_width], grad [n, dim]) -> new (weights, state)
for the n touched rows; rows not in the batch are never read or written. A table applies one update
per row and step (the gradients of every lookup of the step summed first, ``ops.sparse.collection``).

Adam's bias correction needs a step count t. ``bias_correction="per_row"``: t counts the updates of
the row itself (stored in the row; lazy Adam, ``torch.optim.SparseAdam``). ``"per_table"``: t is the
table's training step + 1 (``DynamicTable.step``, the ``end_step`` count, so it is checkpointed with
the table), the same for every row, as RecIS's sparse Adam/AdamW keep one count per table: a row
first updated at step 10,000 then takes a step of lr * (1 - beta1) / sqrt(1 - beta2) ~ 3.16 lr
(defaults), where per-row counting gives lr.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BIAS_CORRECTIONS = ("per_row", "per_table")


def _check_bias_correction(name: str, mode: str) -> None:
    if mode not in BIAS_CORRECTIONS:
        raise ValueError(f"{name}.bias_correction must be one of {BIAS_CORRECTIONS}, got {mode!r}")


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
    bias_correction: str = "per_row"
    """Step count t of the bias correction: "per_row" (the row's own updates) | "per_table" (the
    table's step + 1, as RecIS; module docstring)."""

    def __post_init__(self):
        _check_bias_correction(type(self).__name__, self.bias_correction)

    def state_width(self, dim: int) -> int:
        return 2 * dim + 1

    def slots(self, dim: int) -> list[tuple[str, int]]:
        """Layout of the state columns of a row: (name, width) in order (recorded in checkpoints)."""
        return [("m", dim), ("v", dim), ("step", 1)]

    def init_state(self, n: int, dim: int) -> torch.Tensor:
        return torch.zeros(n, 2 * dim + 1)

    def update(self, w: torch.Tensor, s: torch.Tensor, g: torch.Tensor,
               table_step: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """New (weights [n, dim], state [n, 2 dim + 1]); ``table_step``: t for ``"per_table"`` bias
        correction (the table passes it; required then, raises ValueError without it)."""
        dim = w.shape[1]
        m, v, t = s[:, :dim], s[:, dim:2 * dim], s[:, 2 * dim:] + 1
        if self.bias_correction == "per_table":
            if table_step is None:
                raise ValueError(f"{type(self).__name__}(bias_correction='per_table') needs the table's step")
            tb = torch.full_like(t, float(table_step))
        else:
            tb = t
        w = self._decay(w)
        m = m.lerp(g, 1 - self.beta1)
        v = v * self.beta2 + (1 - self.beta2) * g * g
        bc1 = 1 - self.beta1 ** tb
        bc2 = (1 - self.beta2 ** tb).sqrt()
        w = w - (self.lr / bc1) * m / (v.sqrt() / bc2 + self.eps)
        return w, torch.cat([m, v, t], dim=1)

    def _decay(self, w: torch.Tensor) -> torch.Tensor:
        return w

    def update_(self, full: torch.Tensor, g: torch.Tensor, dim: int, table_step: int | None = None) -> None:
        """``update`` written into full rows [n, 3 dim + 1] (weights, m, v, step). Computed out of place
        as ``update`` does: ``lerp_`` on a strided view can round differently (measured: 1 ulp)."""
        w, s = self.update(full[:, :dim], full[:, dim:], g, table_step)
        full[:, :dim] = w
        full[:, dim:] = s


@dataclass(frozen=True)
class SparseAdamW(SparseAdam):
    """AdamW per row (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization", Algorithm 2)
    on the touched rows only: each row in the batch first decays, ``w *= 1 - lr * weight_decay``, then
    takes the Adam step, as ``torch.optim.AdamW``; rows not in the batch neither decay nor move. The
    bias correction counts per table by default (RecIS's SparseAdamW); state = [m (dim), v (dim), t (1)]
    as SparseAdam (t = the row's own update count, kept for ``"per_row"``)."""

    weight_decay: float = 0.01
    """Decoupled weight decay coefficient (torch.optim.AdamW's default)."""
    bias_correction: str = "per_table"
    """"per_table" (RecIS) | "per_row" (lazy Adam's count); see the module docstring."""

    def __post_init__(self):
        super().__post_init__()
        if self.weight_decay < 0:
            raise ValueError(f"SparseAdamW.weight_decay must be >= 0, got {self.weight_decay}")

    def _decay(self, w: torch.Tensor) -> torch.Tensor:
        return w * (1 - self.lr * self.weight_decay) if self.weight_decay else w
