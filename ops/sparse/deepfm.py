"""DeepFM (Guo et al., IJCAI 2017, "DeepFM: A Factorization-Machine based Neural Network for CTR
Prediction") on pooled field embeddings.

Each field's embedding has ``dim + 1`` columns: column 0 is the field's first-order (linear) weight,
columns 1.. are its FM latent vector v. logit = b + sum_f w_f + FM(v) + MLP(concat v), with
FM(v) = 0.5 * sum_k ((sum_f v_fk)^2 - sum_f v_fk^2) (paper eq. 2-3).
"""

from __future__ import annotations

import torch
from torch import nn


class DeepFM(nn.Module):
    """The dense part of DeepFM. Input: field embeddings ``[B, F, dim + 1]``; output: logits ``[B]``."""

    def __init__(self, n_fields: int, dim: int, hidden: tuple[int, ...] = (64, 32), dropout: float = 0.1):
        super().__init__()
        layers, width = [], n_fields * dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
            width = h
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)
        self.bias = nn.Parameter(torch.zeros(1))
        self.n_fields, self.dim = n_fields, dim

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        if e.ndim != 3 or e.shape[1:] != (self.n_fields, self.dim + 1):
            raise ValueError(f"DeepFM expects embeddings [B, {self.n_fields}, {self.dim + 1}], got {tuple(e.shape)}")
        first = e[:, :, 0].sum(1)                                   # [B]
        v = e[:, :, 1:]                                             # [B, F, dim]
        fm = 0.5 * (v.sum(1).pow(2) - v.pow(2).sum(1)).sum(1)       # [B]
        deep = self.mlp(v.flatten(1)).squeeze(1)                    # [B]
        return self.bias + first + fm + deep
