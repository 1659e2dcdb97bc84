"""Feature embeddings over dynamic tables, with table coalescing (RecIS, arXiv 2509.20883 §3.2):
features whose tables have identical attributes (dim, optimizer, admission, eviction, init) share
one physical table, their IDs namespaced by a feature slot in the top bits, so one lookup (one
dedup, one gather, one optimizer update) serves all of them.

Table keys: a table that serves one feature (or features sharing one key space, ``shared_name``) is
keyed by the ID itself, any signed int64 from -2**63 + 2 to 2**63 - 1 (64-bit hashes such as
RecIS's, often negative; zero-collision tables). A coalesced table of several features is keyed by
``slot << 52 | id``, so its IDs must be in [0, 2**52) (``ID_BITS``); another ID raises
SparseInputError at lookup, naming the feature and the ID. A feature that needs 64-bit or negative
IDs takes its own table with ``FeatureSpec(..., coalesce=False)`` (or ``EmbeddingCollection(coalesce=False)``). ``lookups`` counts physical lookups;
``lookups_uncoalesced`` counts what one-table-per-feature would have done.

Batch format, per feature: ``(ids int64 [B, L], lengths int64 [B])`` or ``(ids, lengths, weights
float [B, L])`` — padded IDs, the first ``lengths[b]`` of row b are real (L = 1 for single-valued
fields); ``weights`` are per-ID weights (padding positions ignored). Output per feature ``[B, dim]``:
its bag pooled by the feature's ``pooling`` (with weights w_i and rows e_i of a bag):

- ``"sum"`` (the default, as RecIS's and TensorFlow's ``embedding_lookup_sparse``): sum_i w_i e_i;
- ``"mean"``: sum_i w_i e_i / sum_i w_i (unweighted: / L_b);
- ``"sqrtn"``: sum_i w_i e_i / sqrt(sum_i w_i^2) (unweighted: / sqrt(L_b)).

An empty bag pools to zeros; a bag whose denominator is 0 (weights summing to 0) pools to its
weighted sum. For single-valued unweighted features the three are the same. RecIS's ``tile``
combiner (concatenation of a fixed number of IDs) is not offered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .data import ID_BITS
from .optim import SparseAdagrad
from .idmap import MIN_KEY
from .admission import AdmitAll, EvictUnseen
from .ids import INITS, SparseInputError, check_ids
from .table import DynamicTable

MAX_SLOTS = 1 << (63 - ID_BITS)
POOLINGS = ("sum", "mean", "sqrtn")


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
    """When an unseen ID gets a row: AdmitAll | AdmitAfter(k) | ReadOnly (``ops.sparse.admission``)."""
    eviction: EvictUnseen | None = None
    """None = never evict; EvictUnseen(n_steps): free the rows of IDs unseen for more than n_steps steps."""
    init_scale: float = 0.01
    """Half-width (uniform) or standard deviation (normal, truncated_normal) of the initial rows."""
    init: str = "uniform"
    """Row initialiser: "uniform" (default) | "zeros" (RecIS's default) | "normal" | "truncated_normal"
    (at +-2 std); a function of (seed, ID) only (``ops.sparse.ids.init_rows``)."""
    coalesce: bool = True
    """False: never share a table (keeps the full int64 ID range; a coalesced feature's IDs must be < 2**52)."""
    pooling: str = "sum"
    """How a bag of IDs pools to one vector: "sum" (RecIS's default) | "mean" | "sqrtn" (module docstring)."""
    shared_name: str | None = None
    """Features with the same shared_name look up the same rows (one table, one key space: ID 7 of
    either is the same row, trained by both), as RecIS's ``shared_name``. Their table attributes
    (dim, optimizer, admission, eviction, init, coalesce) must be equal; pooling may differ."""

    def __post_init__(self):
        if self.pooling not in POOLINGS:
            raise ValueError(f"feature {self.name!r}: pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.init not in INITS:
            raise ValueError(f"feature {self.name!r}: init must be one of {INITS}, got {self.init!r}")

    def table_key(self) -> tuple:
        return (self.dim, self.optimizer, self.admission, self.eviction, self.init_scale, self.init)


def validate_batch(batch: dict, names: list[str]) -> int:
    """Check a batch has every feature with consistent shapes; returns the batch size B.
    Raises SparseInputError naming the feature (missing, empty batch, shape, lengths) or ID."""
    return _validate(batch, names)[0]


def _validate(batch: dict, names: list[str]) -> tuple[int, list[bool]]:
    """``validate_batch``, also returning per feature (in ``names`` order) whether every bag is full
    (``lengths == L`` for ids [B, L]). The lengths of all features are range-checked by one reduction
    over their concatenation when they share L; any problem reruns the feature-by-feature checks,
    which raise the error naming the first bad feature."""
    missing = [n for n in names if n not in batch]
    if missing:
        raise SparseInputError(f"batch is missing feature(s) {missing}; expected {names}")
    pairs = [batch[n] for n in names]
    size = pairs[0][0].shape[0] if pairs and getattr(pairs[0][0], "ndim", 0) >= 1 else None
    widths = set()
    ok = size is not None and size > 0
    for p in pairs:
        if not ok:
            break
        ids, lengths = p[0], p[1]
        ok = (ids.ndim == 2 and isinstance(lengths, torch.Tensor) and lengths.ndim == 1
              and ids.shape[0] == lengths.shape[0] == size)
        widths.add(ids.shape[1] if ok else None)
    if ok and len(widths) == 1:
        width = widths.pop()
        lens = pairs[0][1] if len(pairs) == 1 else torch.cat([p[1] for p in pairs])
        if any(len(p) != 2 for p in pairs):
            return _validate_slow(pairs, names)
        lo, hi = torch.aminmax(lens)
        lo, hi = int(lo), int(hi)
        if 0 <= lo and hi <= width:
            return size, [lo == hi == width] * len(pairs)
    return _validate_slow(pairs, names)


def _validate_slow(pairs: list, names: list[str]) -> tuple[int, list[bool]]:
    """``_validate`` feature by feature (raises on the first bad feature)."""
    size, full = None, []
    for n, p in zip(names, pairs):
        if not isinstance(p, (tuple, list)) or len(p) not in (2, 3):
            raise SparseInputError(f"feature {n!r}: expected (ids, lengths) or (ids, lengths, weights)")
        ids, lengths = p[0], p[1]
        if ids.ndim != 2 or lengths.ndim != 1 or ids.shape[0] != lengths.shape[0]:
            raise SparseInputError(f"feature {n!r}: expected ids [B, L] and lengths [B], got {tuple(ids.shape)} and {tuple(lengths.shape)}")
        if ids.shape[0] == 0:
            raise SparseInputError(f"feature {n!r}: empty batch (B = 0)")
        if size is not None and ids.shape[0] != size:
            raise SparseInputError(f"feature {n!r}: batch size {ids.shape[0]} != {size} of the other features")
        size = ids.shape[0]
        lo, hi = int(lengths.min()), int(lengths.max())
        if lo < 0 or hi > ids.shape[1]:
            raise SparseInputError(f"feature {n!r}: lengths must be in [0, {ids.shape[1]}]")
        if len(p) == 3:
            w = p[2]
            if not isinstance(w, torch.Tensor) or not w.dtype.is_floating_point or tuple(w.shape) != tuple(ids.shape):
                raise SparseInputError(f"feature {n!r}: weights must be a float tensor shaped like its ids "
                                       f"{tuple(ids.shape)}, got {getattr(w, 'dtype', type(w))} {tuple(getattr(w, 'shape', ()))}")
        full.append(lo == hi == ids.shape[1])
    return size, full


class _Pool(torch.autograd.Function):
    """Per feature of one table, each bag pooled from the rows of ``leaf`` [U, dim] that ``inverse``
    [nnz] names; one output [B, dim] per entry of ``plan``. ``plan`` entries are ``(start, end, seg,
    div, w)``: the feature's ids are ``inverse[start:end]`` (row-major), ``seg`` [end - start] their
    sample indices, ``w`` [end - start, 1] their weights (None: 1) and ``div`` [B, 1] the bags'
    denominators (None: sum pooling) — seg, div and w all None for unweighted single-valued features
    (every bag holds one id): the output is then a gather. Output = index_add(seg, w * e) / div.
    Backward adds each id's gradient to its row in position order (feature by feature, row-major),
    the order and arithmetic of the autograd graph of indexing, ``index_add`` and division it replaces."""

    @staticmethod
    def forward(ctx, leaf, inverse, plan, size):
        ctx.plan, ctx.shape = plan, leaf.shape
        ctx.save_for_backward(inverse)
        outs = []
        for start, end, seg, div, w in plan:
            e = leaf.index_select(0, inverse[start:end])
            if seg is None:
                outs.append(e)
            else:
                o = torch.zeros(size, leaf.shape[1], dtype=leaf.dtype).index_add_(0, seg, e if w is None else e * w)
                outs.append(o if div is None else o / div)
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        (inverse,) = ctx.saved_tensors
        g_leaf = torch.zeros(ctx.shape, dtype=grads[0].dtype)
        for (start, end, seg, div, w), g in zip(ctx.plan, grads):
            if seg is not None:
                g = (g if div is None else g / div).index_select(0, seg)
                if w is not None:
                    g = g * w
            g_leaf.index_add_(0, inverse[start:end], g.contiguous())   # a strided source adds slower
        return g_leaf, None, None, None


def _denominator(bag_sizes, pooling: str):
    """A bag's divisor for unweighted pooling: its size (mean) or the size's square root (sqrtn);
    ``bag_sizes`` a float or a float tensor [B, 1] (sizes clamped to >= 1)."""
    if pooling == "mean":
        return bag_sizes
    return bag_sizes ** 0.5 if isinstance(bag_sizes, float) else bag_sizes.sqrt()


def _by_table(entries) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    """{table: [(rows [n_i], grads [n_i, dim]), ...]} of (table, rows, grads) entries, in order."""
    out: dict[str, list] = {}
    for tname, rows, grads in entries:
        out.setdefault(tname, []).append((rows, grads))
    return out


def merge_row_grads(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """One (rows [U], grads [U, dim]) from several lookups' (rows [n_i] unique within a part, -1 = no row;
    grads [n_i, dim]): the gradients of a row summed over the parts, rows without a row dropped. A single
    part is returned as it is (bit-identical to the unmerged path)."""
    if len(parts) == 1:
        return parts[0]
    rows = torch.cat([r for r, _ in parts])
    grads = torch.cat([g for _, g in parts])
    keep = rows >= 0
    rows, grads = rows[keep], grads[keep]
    uniq, inv = torch.unique(rows, return_inverse=True)
    return uniq, torch.zeros(len(uniq), grads.shape[1], dtype=grads.dtype).index_add_(0, inv, grads)


class EmbeddingCollection:
    """Pooled embeddings of many sparse features over coalesced dynamic tables.

    Use: ``out = ec(batch, train=True)``; ``loss.backward()``; ``ec.apply_gradients()`` (sparse
    optimizer on the touched rows only); ``ec.end_step()`` (eviction, size history).
    Raises ValueError for duplicate feature names, more than 2**11 features in one table, or
    features of one ``shared_name`` whose table attributes differ.
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
        shared: dict[str, FeatureSpec] = {}
        for f in features:
            if f.shared_name is not None:
                first = shared.setdefault(f.shared_name, f)
                if (first.table_key(), first.coalesce) != (f.table_key(), f.coalesce):
                    raise ValueError(f"features {first.name!r} and {f.name!r} share rows (shared_name {f.shared_name!r}) "
                                     f"but their tables differ: {(first.table_key(), first.coalesce)} vs "
                                     f"{(f.table_key(), f.coalesce)}")
        groups: dict[tuple[str, str], int] = {}          # (table, shared_name or feature) -> slot
        for f in features:
            group = f.shared_name if f.shared_name is not None else f"feature:{f.name}"
            k = f.table_key() if coalesce and f.coalesce else ("own table", group)
            if k not in keys:
                keys[k] = f"table{len(keys)}"
                self.tables[keys[k]] = DynamicTable(f.dim, f.optimizer, f.admission, f.eviction, block_rows=block_rows,
                                                    init_scale=f.init_scale, seed=seed, name=keys[k], init=f.init)
            tname = keys[k]
            if (tname, group) not in groups:
                n = sum(1 for t, _ in groups if t == tname)
                if n >= MAX_SLOTS:
                    raise ValueError(f"table {tname}: more than {MAX_SLOTS} coalesced features")
                groups[(tname, group)] = n
            self.slot[f.name] = (tname, groups[(tname, group)])
        self.lookups = 0
        self.lookups_uncoalesced = 0
        self._pending: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        self._consts: dict[tuple, torch.Tensor] = {}    # tensors constant for a batch shape (_cached)

    def features_of(self, tname: str) -> list[str]:
        """The features a table serves, in slot order."""
        return [f for f, (t, _) in self.slot.items() if t == tname]

    def key_bits(self, tname: str) -> int:
        """ID bits a table's keys leave to each feature: 63 (all of int64) for a table of one feature
        (or of features sharing one key space, ``shared_name``), ``ID_BITS`` (52) for a coalesced one
        (its top bits hold the feature slot)."""
        return 63 if len({s for t, s in self.slot.values() if t == tname}) == 1 else ID_BITS

    def _check(self, ids, f: str) -> torch.Tensor:
        tname = self.slot[f][0]
        bits = self.key_bits(tname)
        if bits == 63:
            return check_ids(ids, f, signed=True)
        why = (
            f" (table {tname!r} coalesces features {self.features_of(tname)}: the top {63 - ID_BITS} bits of its keys hold the "
            f"feature slot; for 64-bit or negative ids give {f!r} its own table with FeatureSpec(..., coalesce=False), or build the "
            f"collection with coalesce=False)")
        return check_ids(ids, f, bits=bits, why=why)

    def _lookup_unique(self, tname: str, uids: torch.Tensor, train: bool, counts: torch.Tensor | None = None) -> torch.Tensor:
        """Embeddings [U, dim] of unique namespaced ids [U]; a leaf recorded for apply_gradients when training.
        ``counts`` int64 [U]: occurrences of each id in the batch (admission counts every one); None = once each."""
        table = self.tables[tname]
        rows = table.rows_for(uids, train, counts)
        leaf = table.read(rows, for_update=train)
        if train:
            leaf.requires_grad_(True)
            self._pending.append((tname, rows, leaf))
        return leaf

    def _cached(self, key: tuple, make):
        """A tensor constant for a batch shape (aranges, segment ids, slot offsets), made once."""
        t = self._consts.get(key)
        if t is None:
            if len(self._consts) > 256:
                self._consts.clear()
            t = self._consts[key] = make()
        return t

    def _table_values(self, tname: str, batch: dict, size: int, full: dict) -> tuple[torch.Tensor, list]:
        """A table's namespaced ids in a batch and its pooling plan: (ids int64 [nnz] feature by
        feature, row-major; per feature ``(start, end, seg, div, w)`` as ``_Pool`` takes it). ``full``:
        feature -> every bag full (lengths == L). IDs are range-checked once on the concatenation
        of the table's int64 ids; a bad one reruns the per-feature check, which names the feature."""
        feats = self.features_of(tname)
        flat, raw, plan, start = [], [], [], 0
        fast = all(isinstance(batch[f][0], torch.Tensor) and batch[f][0].dtype == torch.int64 for f in feats)
        for f in feats:
            ids, lengths = batch[f][0], batch[f][1]
            weights = batch[f][2] if len(batch[f]) == 3 else None
            pooling = self.features[f].pooling
            if not fast:
                ids = self._check(ids, f)
            width = ids.shape[1]
            w = None
            if full[f]:
                v = ids.reshape(-1)
                if width == 1 and weights is None:
                    seg = div = None
                else:
                    seg = self._cached(("seg", size, width), lambda: torch.arange(size).repeat_interleave(width))
                    if weights is None:
                        div = None if pooling == "sum" else self._cached(
                            ("div", size, width, pooling), lambda: torch.full((size, 1), _denominator(float(max(width, 1)), pooling)))
                    else:
                        w = weights.reshape(-1, 1).to(torch.get_default_dtype())
            else:
                mask = self._cached(("arange", width), lambda: torch.arange(width))[None, :] < lengths[:, None]
                v = ids[mask]                                  # [nnz_f], row-major
                seg = torch.repeat_interleave(self._cached(("arange", size), lambda: torch.arange(size)), lengths)
                if weights is None:
                    div = None if pooling == "sum" else _denominator(
                        lengths.clamp(min=1).to(torch.get_default_dtype())[:, None], pooling)
                else:
                    w = weights[mask].reshape(-1, 1).to(torch.get_default_dtype())
            if w is not None:
                if pooling == "sum":
                    div = None
                else:                                          # sum of w (mean) or of w^2 (sqrtn) per bag; 0 -> 1
                    den = torch.zeros(size, 1, dtype=w.dtype).index_add_(0, seg, w if pooling == "mean" else w * w)
                    den = torch.where(den == 0, torch.ones_like(den), den)
                    div = den if pooling == "mean" else den.sqrt()
            flat.append(v)
            raw.append(ids.reshape(-1))                        # padding included: every id is checked
            plan.append((start, start + len(v), seg, div, w))
            start += len(v)
        allv = flat[0] if len(flat) == 1 else torch.cat(flat)
        if fast:
            bits = self.key_bits(tname)
            held = allv if all(full[f] for f in feats) else raw[0] if len(raw) == 1 else torch.cat(raw)
            if len(held):
                lo, hi = torch.aminmax(held)
                if int(lo) < (MIN_KEY if bits == 63 else 0) or (bits < 63 and int(hi) >= 1 << bits):
                    for f in feats:                            # raises naming the first bad feature and id
                        self._check(batch[f][0], f)
        if self.key_bits(tname) < 63:                        # coalesced: the slot in the top bits
            counts = tuple(e - s for s, e, _, _, _ in plan)
            slots = tuple(self.slot[f][1] for f in feats)
            allv = allv | self._cached(("slots", counts, slots), lambda: torch.cat(
                [torch.full((c,), s << ID_BITS, dtype=torch.int64) for c, s in zip(counts, slots)]))
        return allv, plan                                      # one feature: slot 0 (may view the caller's ids)

    def unique_ids(self, batch: dict) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per table, the unique namespaced ids a batch looks up (sorted, int64 [U]; the same order as the
        forward pass uses) and how many times each occurs in the batch (int64 [U]). No side effects: this
        is what a parameter-server worker asks the server for before its forward pass. Raises
        SparseInputError like ``__call__``."""
        names = list(self.features)
        size, full = _validate(batch, names)
        full = dict(zip(names, full))
        out = {}
        for tname in self.tables:
            uids, inverse = torch.unique(self._table_values(tname, batch, size, full)[0], return_inverse=True)
            out[tname] = (uids, torch.bincount(inverse, minlength=len(uids)))
        return out

    def __call__(self, batch: dict, train: bool = True) -> dict[str, torch.Tensor]:
        """Pooled embeddings ``{feature: [B, dim]}``. See the module docstring for the batch format.
        Single-valued features (every length 1) pool by a gather; features whose bags are all full
        (lengths == L) skip the padding mask; the result is the same either way."""
        names = list(self.features)
        size, full = _validate(batch, names)
        full = dict(zip(names, full))
        out = {}
        for tname in self.tables:
            feats = self.features_of(tname)
            allv, plan = self._table_values(tname, batch, size, full)
            counts = None
            if train and type(self.tables[tname].admission) is not AdmitAll:   # admission counts every occurrence
                uids, inverse, counts = torch.unique(allv, return_inverse=True, return_counts=True)
            else:
                uids, inverse = torch.unique(allv, return_inverse=True)
            leaf = self._lookup_unique(tname, uids, train, counts)
            self.lookups += 1
            self.lookups_uncoalesced += len(feats)
            out.update(zip(feats, _Pool.apply(leaf, inverse, plan, size)))
        return out

    def apply_gradients(self) -> None:
        """Sparse optimizer step on every row looked up since the last call (call after backward).

        One update per row and call, however many lookups touched it: a table looked up several times
        (the collection called more than once before this) has the gradients of all its lookups summed
        per row first, then one optimizer step on the sum (as RecIS does; two Adagrad steps on the
        parts would move a row differently from one step on the whole)."""
        pending, self._pending = self._pending, []
        for tname, parts in _by_table((t, r, leaf.grad) for t, r, leaf in pending if leaf.grad is not None).items():
            self.tables[tname].apply_gradients(*merge_row_grads(parts))

    def end_step(self) -> int:
        """Advance every table's step (eviction, size history). Returns rows evicted."""
        return sum(t.end_step() for t in self.tables.values())

    def size(self) -> int:
        """Live rows over all tables."""
        return sum(len(t) for t in self.tables.values())
