"""Feature embeddings over dynamic tables, with table coalescing (RecIS, arXiv 2509.20883 §3.2):
features whose tables have identical attributes (dim, optimizer, admission, eviction, init) share
one physical table, their IDs namespaced by a feature slot in the top bits, so one lookup (one
dedup, one gather, one optimizer update) serves all of them.

Table keys: a table that serves one feature is keyed by the ID itself, the whole int64 range
[0, 2**63) (64-bit hashes, zero-collision tables). A coalesced table of several features is keyed
by ``slot << 52 | id``, so its IDs must be below 2**52 (``ID_BITS``); a larger ID raises
SparseInputError at lookup, naming the feature and the ID. A feature that needs 64-bit IDs takes its
own table with ``FeatureSpec(..., coalesce=False)`` (or ``EmbeddingCollection(coalesce=False)``). ``lookups`` counts physical lookups;
``lookups_uncoalesced`` counts what one-table-per-feature would have done.

Batch format, per feature: ``(ids int64 [B, L], lengths int64 [B])`` — padded IDs, the first
``lengths[b]`` of row b are real (L = 1 for single-valued fields). Output per feature: the mean of
its rows' embeddings, ``[B, dim]`` (an empty bag pools to zeros).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .data import ID_BITS
from .optim import SparseAdagrad
from .table import AdmitAll, DynamicTable, EvictUnseen, SparseInputError, check_ids

MAX_SLOTS = 1 << (63 - ID_BITS)


@dataclass(frozen=True)
class FeatureSpec:
    """One sparse feature and the attributes of its table (equal ``table_key``: tables can be shared)."""

    name: str
    """Feature name: its key in a batch and in the pooled output (unique in a collection)."""
    dim: int = 16
    """Embedding width of the feature's rows (>= 1; the optimizer state is stored beside it)."""
    optimizer: object = field(default_factory=SparseAdagrad)
    """Sparse optimizer of its rows: SparseAdagrad | SparseAdam (``ops.sparse.optim``)."""
    admission: object = field(default_factory=AdmitAll)
    """When an unseen ID gets a row: AdmitAll | AdmitAfter(k) | ReadOnly (``ops.sparse.table``)."""
    eviction: EvictUnseen | None = None
    """None = never evict; EvictUnseen(n_steps): free the rows of IDs unseen for more than n_steps steps."""
    init_scale: float = 0.01
    """Rows start Uniform(-init_scale, init_scale), a function of (seed, ID) only."""
    coalesce: bool = True
    """False: never share a table (keeps the full int64 ID range; a coalesced feature's IDs must be < 2**52)."""

    def table_key(self) -> tuple:
        return (self.dim, self.optimizer, self.admission, self.eviction, self.init_scale)


def validate_batch(batch: dict, names: list[str]) -> int:
    """Check a batch has every feature with consistent shapes; returns the batch size B.
    Raises SparseInputError naming the feature (missing, empty batch, shape, lengths) or ID."""
    missing = [n for n in names if n not in batch]
    if missing:
        raise SparseInputError(f"batch is missing feature(s) {missing}; expected {names}")
    size = None
    for n in names:
        ids, lengths = batch[n]
        if ids.ndim != 2 or lengths.ndim != 1 or ids.shape[0] != lengths.shape[0]:
            raise SparseInputError(f"feature {n!r}: expected ids [B, L] and lengths [B], got {tuple(ids.shape)} and {tuple(lengths.shape)}")
        if ids.shape[0] == 0:
            raise SparseInputError(f"feature {n!r}: empty batch (B = 0)")
        if size is not None and ids.shape[0] != size:
            raise SparseInputError(f"feature {n!r}: batch size {ids.shape[0]} != {size} of the other features")
        size = ids.shape[0]
        if lengths.numel() and (lengths.min() < 0 or lengths.max() > ids.shape[1]):
            raise SparseInputError(f"feature {n!r}: lengths must be in [0, {ids.shape[1]}]")
    return size


class EmbeddingCollection:
    """Pooled embeddings of many sparse features over coalesced dynamic tables.

    Use: ``out = ec(batch, train=True)``; ``loss.backward()``; ``ec.apply_gradients()`` (sparse
    optimizer on the touched rows only); ``ec.end_step()`` (eviction, size history).
    Raises ValueError for duplicate feature names or more than 2**11 features in one table.
    """

    def __init__(self, features: list[FeatureSpec], coalesce: bool = True, seed: int = 0, block_rows: int = 4096):
        names = [f.name for f in features]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate feature names in {names}")
        self.features = {f.name: f for f in features}
        self.coalesce = coalesce
        self.tables: dict[str, DynamicTable] = {}
        self.slot: dict[str, tuple[str, int]] = {}   # feature -> (table name, slot)
        keys: dict[tuple, str] = {}
        for f in features:
            k = f.table_key() if coalesce and f.coalesce else ("own table", f.name)
            if k not in keys:
                keys[k] = f"table{len(keys)}"
                self.tables[keys[k]] = DynamicTable(f.dim, f.optimizer, f.admission, f.eviction, block_rows=block_rows,
                                                    init_scale=f.init_scale, seed=seed, name=keys[k])
            tname = keys[k]
            n = sum(1 for t, _ in self.slot.values() if t == tname)
            if n >= MAX_SLOTS:
                raise ValueError(f"table {tname}: more than {MAX_SLOTS} coalesced features")
            self.slot[f.name] = (tname, n)
        self.lookups = 0
        self.lookups_uncoalesced = 0
        self._pending: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def features_of(self, tname: str) -> list[str]:
        """The features a table serves, in slot order."""
        return [f for f, (t, _) in self.slot.items() if t == tname]

    def key_bits(self, tname: str) -> int:
        """ID bits a table's keys leave to each feature: 63 (all of int64) for a one-feature table,
        ``ID_BITS`` (52) for a coalesced one (its top bits hold the feature slot)."""
        return 63 if len(self.features_of(tname)) == 1 else ID_BITS

    def _check(self, ids, f: str) -> torch.Tensor:
        tname = self.slot[f][0]
        bits = self.key_bits(tname)
        why = "" if bits == 63 else (
            f" (table {tname!r} coalesces features {self.features_of(tname)}: the top {63 - ID_BITS} bits of its keys hold the "
            f"feature slot; for 64-bit ids give {f!r} its own table with FeatureSpec(..., coalesce=False), or build the "
            f"collection with coalesce=False)")
        return check_ids(ids, f, bits=bits, why=why)

    def _lookup_unique(self, tname: str, uids: torch.Tensor, train: bool) -> torch.Tensor:
        """Embeddings [U, dim] of unique namespaced ids [U]; a leaf recorded for apply_gradients when training."""
        table = self.tables[tname]
        rows = table.rows_for(uids, train)
        leaf = table.read(rows)
        if train:
            leaf.requires_grad_(True)
            self._pending.append((tname, rows, leaf))
        return leaf

    def _table_values(self, tname: str, batch: dict, size: int) -> tuple[torch.Tensor, list, list]:
        """A table's namespaced ids in a batch: (ids [nnz] feature by feature, row-major; per feature the
        sample index of each id [nnz_f]; per feature nnz_f)."""
        vals, segs, counts = [], [], []
        for f in self.features_of(tname):
            ids, lengths = batch[f]
            ids = self._check(ids, f)
            mask = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
            v = ids[mask]                                      # [nnz], row-major
            segs.append(torch.repeat_interleave(torch.arange(size), lengths))
            vals.append(v | (self.slot[f][1] << ID_BITS))
            counts.append(len(v))
        return torch.cat(vals), segs, counts

    def unique_ids(self, batch: dict) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per table, the unique namespaced ids a batch looks up (sorted, int64 [U]; the same order as the
        forward pass uses) and how many times each occurs in the batch (int64 [U]). No side effects: this
        is what a parameter-server worker asks the server for before its forward pass. Raises
        SparseInputError like ``__call__``."""
        size = validate_batch(batch, list(self.features))
        out = {}
        for tname in self.tables:
            uids, inverse = torch.unique(self._table_values(tname, batch, size)[0], return_inverse=True)
            out[tname] = (uids, torch.bincount(inverse, minlength=len(uids)))
        return out

    def __call__(self, batch: dict, train: bool = True) -> dict[str, torch.Tensor]:
        """Pooled embeddings ``{feature: [B, dim]}``. See the module docstring for the batch format."""
        names = list(self.features)
        size = validate_batch(batch, names)
        out = {}
        for tname in self.tables:
            feats = self.features_of(tname)
            allv, segs, counts = self._table_values(tname, batch, size)
            uids, inverse = torch.unique(allv, return_inverse=True)
            emb = self._lookup_unique(tname, uids, train)[inverse]  # [nnz_total, dim]
            self.lookups += 1
            self.lookups_uncoalesced += len(feats)
            for f, e, seg in zip(feats, torch.split(emb, counts), segs):
                lengths = batch[f][1]
                pooled = torch.zeros(size, e.shape[1]).index_add(0, seg, e)
                out[f] = pooled / lengths.clamp(min=1).to(pooled.dtype)[:, None]
        return out

    def apply_gradients(self) -> None:
        """Sparse optimizer step on every row looked up since the last call (call after backward)."""
        pending, self._pending = self._pending, []
        for tname, rows, leaf in pending:
            if leaf.grad is not None:
                self.tables[tname].apply_gradients(rows, leaf.grad)

    def end_step(self) -> int:
        """Advance every table's step (eviction, size history). Returns rows evicted."""
        return sum(t.end_step() for t in self.tables.values())

    def size(self) -> int:
        """Live rows over all tables."""
        return sum(len(t) for t in self.tables.values())
