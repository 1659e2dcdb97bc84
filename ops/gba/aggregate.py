"""Gradient aggregation over a global batch (GBA, arXiv 2205.11048 §3.1-3.2), shared by every mode.

The one rule, used by the parameter server (async, SSP, Hop-BW, GBA) and by synchronous all-reduce
alike, so that switching modes changes no hyper-parameter:

- a worker sends SUMS over its local batch: the dense gradient [P] and, per embedding row it
  touched, the row gradient [d] and how many times the row occurred in the batch;
- dense parameters average over the samples the update covers (the global batch G in sync and
  GBA): ``dense = sum_i w_i g_i / sum_i n_i``;
- sparse rows, by ``RunSpec.row_grad_norm`` (docs/gba.md, "Two choices"):
  ``occurrences`` (default) average over the samples that touched them:
  ``row = sum_i w_i g_i,row / sum_i c_i,row`` (counts unweighted, so a decayed gradient moves its
  rows less; GBA §3.2); ``global_batch`` average over every sample of the update, as the mean batch
  loss of conventional data-parallel training gives: ``row = sum_i w_i g_i,row / sum_i n_i``.

``w_i`` is 1 except for GBA's staleness decay (per gradient, or per row with
``Policy.row_staleness = "per_row"``: ``w_i,row``). Shapes: P dense parameters, U unique rows, d = row width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Gradient:
    """One worker's gradient over one local batch (sums over its samples, not means)."""

    dense: torch.Tensor
    """[P] float32, sum over the batch of d loss_i / d dense parameters."""
    sparse: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    """Per table ``(ids int64 [U] unique, grads float32 [U, d] summed, counts int64 [U])``."""
    samples: int
    """Local batch size n, in samples."""
    loss_sum: float = 0.0
    """Sum of the per-sample BCE over the batch (for the training curve)."""
    compute_s: float = 0.0
    """Wall seconds the worker spent computing it (every forward/backward pass; the step time of
    the straggler detector, ``ops.gba.switching``)."""
    rng: torch.Tensor | None = None
    """The worker's torch CPU RNG state after computing it (sent only by runs that write a
    hand-over, ``RunSpec.stop_at``: the dropout stream the next trainer continues)."""


@dataclass
class Update:
    """One optimizer step: the averaged gradients of everything aggregated since the last step."""

    dense: torch.Tensor
    """[P] dense gradient, the weighted sum averaged over ``samples``."""
    sparse: dict[str, tuple[torch.Tensor, torch.Tensor]]
    """Per table ``(ids [U], grads [U, d])``, each row averaged over the samples that touched it."""
    samples: int
    """Samples the update covers (the global batch G in sync and GBA)."""
    gradients: int
    """Local-batch gradients aggregated into it."""
    loss: float
    """Mean per-sample training loss of the covered samples (at the parameters each worker pulled)."""


def dense_mean(dense_sum: torch.Tensor, samples: int) -> torch.Tensor:
    """Dense gradient averaged over the ``samples`` the update covers. Raises ValueError if samples < 1."""
    if samples < 1:
        raise ValueError(f"an update must cover at least one sample, got {samples}")
    return dense_sum / samples


def rows_mean(row_sum: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Row gradients [U, d] averaged over the samples that touched each row (counts [U], >= 1)."""
    return row_sum / counts.clamp(min=1).to(row_sum.dtype)[:, None]


def row_mean(row_sum: torch.Tensor, counts: torch.Tensor, samples: int, norm: str = "occurrences") -> torch.Tensor:
    """Row gradients [U, d] from summed row gradients [U, d]: divided by each row's occurrences
    (counts [U]; ``norm="occurrences"``) or by the ``samples`` of the update (``"global_batch"``).
    Raises ValueError for another ``norm`` or samples < 1 with ``global_batch``."""
    if norm == "occurrences":
        return rows_mean(row_sum, counts)
    if norm == "global_batch":
        if samples < 1:
            raise ValueError(f"an update must cover at least one sample, got {samples}")
        return row_sum / samples
    raise ValueError(f"row gradient normalisation must be 'occurrences' or 'global_batch', got {norm!r}")


def sum_rows(keys: torch.Tensor, values: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sum duplicate keys: keys [n], values [n, d], counts [n] -> (unique keys [U], sums [U, d], counts [U])."""
    ukeys, inv = torch.unique(keys, return_inverse=True)
    sums = torch.zeros(len(ukeys), values.shape[1], dtype=values.dtype).index_add_(0, inv, values)
    return ukeys, sums, torch.zeros(len(ukeys), dtype=torch.int64).index_add_(0, inv, counts.to(torch.int64))


@dataclass
class Aggregator:
    """Accumulates weighted gradients until the server's token control says apply (GBA §3.2).

    ``add(g, w)`` with 0 < w <= 1; ``take()`` returns the Update and resets. The aggregator does no
    scheduling: which gradients enter and when to take is ``ops.gba.control.Control``'s decision.
    ``row_norm``: the rows' denominator (``row_mean``).
    """

    row_norm: str = "occurrences"
    """``occurrences`` | ``global_batch`` (``RunSpec.row_grad_norm``)."""
    dense: torch.Tensor | None = None
    """[P] weighted sum of the dense gradients added so far; None = nothing added since the last take."""
    rows: dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = field(default_factory=dict)
    """Per table, the added ``(ids [U], weighted grads [U, d], counts [U])`` parts, summed per row at take."""
    samples: int = 0
    """Samples of the gradients added so far (unweighted)."""
    gradients: int = 0
    """Gradients added so far."""
    loss_sum: float = 0.0
    """Sum of the added gradients' per-sample losses (unweighted)."""

    def add(self, g: Gradient, weight: float = 1.0, row_weights: dict[str, torch.Tensor] | None = None) -> None:
        """Add one gradient with weight ``weight`` (its dense part, and its rows unless ``row_weights``
        gives per table a weight [U] in [0, 1] per row: GBA's per-row staleness). Raises ValueError for
        a weight outside (0, 1] (a dropped gradient never reaches the aggregator)."""
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"gradient weight must be in (0, 1], got {weight}")
        d = g.dense * weight if weight != 1.0 else g.dense
        self.dense = d.clone() if self.dense is None else self.dense.add_(d)
        for t, (ids, grads, counts) in g.sparse.items():
            if row_weights is not None and t in row_weights:
                grads = grads * row_weights[t].to(grads.dtype)[:, None]
            elif weight != 1.0:
                grads = grads * weight
            self.rows.setdefault(t, []).append((ids, grads, counts))
        self.samples += g.samples
        self.gradients += 1
        self.loss_sum += g.loss_sum

    def take(self) -> Update:
        """The averaged update of everything added since the last take. Raises ValueError when empty."""
        if self.dense is None:
            raise ValueError("nothing to apply: no gradient was added since the last update")
        sparse = {}
        for t, parts in self.rows.items():
            ids, sums, counts = sum_rows(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]),
                                         torch.cat([p[2] for p in parts]))
            sparse[t] = (ids, row_mean(sums, counts, self.samples, self.row_norm))
        up = Update(dense_mean(self.dense, self.samples), sparse, self.samples, self.gradients, self.loss_sum / self.samples)
        self.dense, self.rows, self.samples, self.gradients, self.loss_sum = None, {}, 0, 0, 0.0
        return up
