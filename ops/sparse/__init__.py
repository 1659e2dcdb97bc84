"""RecIS-style sparse-dense training engine on plain torch (arXiv 2509.20883): dynamic embedding
tables (table.py) with admission/eviction policies (admission.py), ID validation and per-ID row
initialisation (ids.py), sparse optimizers with per-row state (optim.py), table coalescing
(collection.py), sharding by ID over torch.distributed (shard.py), live-row safetensors checkpoints
that load at any world size (checkpoint.py), DeepFM (deepfm.py) and its CTR training loop (train.py).

CPU path: torch only. torchrec/fbgemm are never imported here (they are an optional GPU extra).
"""

import importlib

# Loaded on first use (PEP 562), so that `ops.sparse.config` stays importable without torch when
# the Dagster code location loads.
_EXPORTS = {
    "EmbeddingCollection": "collection", "FeatureSpec": "collection",
    "SparseAdagrad": "optim", "SparseAdam": "optim", "SparseAdamW": "optim",
    "AdmitAfter": "admission", "AdmitAll": "admission", "DynamicTable": "table", "EvictUnseen": "admission",
    "ReadOnly": "admission", "SparseInputError": "ids",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["AdmitAfter", "AdmitAll", "DynamicTable", "EmbeddingCollection", "EvictUnseen", "FeatureSpec", "ReadOnly",
           "SparseAdagrad", "SparseAdam", "SparseAdamW", "SparseInputError"]
