"""Training hyper-parameters of the CTR model (torch-free, so the Dagster asset can take its run
config defaults from here at load time)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TrainConfig:
    dim: int = 8
    hidden: tuple[int, ...] = (64, 32)
    dropout: float = 0.2
    epochs: int = 3
    batch_size: int = 256
    sparse_lr: float = 0.01
    dense_lr: float = 1e-3
    emb_l2: float = 1e-5
    """L2 on the embeddings looked up in a batch (per-sample mean), applied through the sparse grads."""
    crosses: list[str] = field(default_factory=lambda: ["gender*age_bucket", "age_bucket*occupation"])
    coalesce: bool = True
    seed: int = 0
    threads: int = 1
    """torch intra-op threads while training: small per-step kernels are fastest on one thread."""
