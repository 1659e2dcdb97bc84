"""RecIS-style sparse-dense training engine on plain torch (arXiv 2509.20883): dynamic embedding
tables with admission/eviction (table.py), sparse optimizers with per-row state (optim.py), table
coalescing (collection.py), sharding by ID over torch.distributed (shard.py), live-row safetensors
checkpoints (checkpoint.py), DeepFM (deepfm.py) and its CTR training loop (train.py).

CPU path: torch only. torchrec/fbgemm are never imported here (they are an optional GPU extra).
"""

from .collection import EmbeddingCollection, FeatureSpec
from .optim import SparseAdagrad, SparseAdam
from .table import AdmitAfter, AdmitAll, DynamicTable, EvictUnseen, ReadOnly, SparseInputError

__all__ = ["AdmitAfter", "AdmitAll", "DynamicTable", "EmbeddingCollection", "EvictUnseen", "FeatureSpec", "ReadOnly",
           "SparseAdagrad", "SparseAdam", "SparseInputError"]
