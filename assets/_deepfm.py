"""The DeepFM hyper-parameters that both CTR trainings show in the Launchpad: ``ctr_model`` (one
process, docs/sparse.md) and ``gba_run`` (every GBA mode, docs/gba.md). Defaults and meanings are
``ops.sparse.config.TrainConfig``'s; each asset's config adds its own fields and declares the ops
dataclass it mirrors (``assets._config.mirrors``)."""

import dagster as dg

from ops.sparse.config import TrainConfig

from ._config import mirrors

_T = TrainConfig()


@mirrors(TrainConfig)
class DeepFMConfig(dg.Config):
    """The DeepFM model (Guo et al. 2017) on the sparse engine and its two optimizers."""

    dim: int = _T.dim
    """FM latent width per field (each table row holds dim + 1: the first-order weight too)."""
    hidden: list[int] = list(_T.hidden)
    """Widths of the MLP's hidden layers."""
    dropout: float = _T.dropout
    sparse_lr: float = _T.sparse_lr
    """SparseAdagrad learning rate of the embedding rows."""
    dense_lr: float = _T.dense_lr
    """torch.optim.Adam learning rate of the DeepFM MLP."""
    emb_l2: float = _T.emb_l2
    """L2 on the embeddings looked up in a batch (per-sample mean)."""
    crosses: list[str] = list(_T.crosses)
    """Crossed fields 'a*b' of single-valued columns."""
    seed: int = _T.seed
