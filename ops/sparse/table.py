"""Dynamic embedding tables (RecIS, arXiv 2509.20883 §3.1): an ID -> row map over rows held in
growable blocks, each row = [embedding (dim) | optimizer state]; no fixed vocabulary and no hashing
modulo a size, so two IDs never share a row. Admission decides when an unseen ID gets a row;
eviction frees rows of IDs unseen for ``n`` steps (slots are reused).

The map is a vectorised open-addressing hash map (``ops.sparse.idmap.IdMap``) and the per-row
bookkeeping (ID, last-seen step, insertion order) is numpy arrays indexed by row, so a batch's lookup,
admission, last-seen update and eviction are a few array operations, not one Python dict access per
ID. Gather and scatter copy whole rows block by block after one sort of the row indices.

Admission and eviction policies and the pending sighting counters are in ``ops.sparse.admission``; ID
validation and row initialisation (a function of (seed, ID) only) in ``ops.sparse.ids``. Both are importable
from here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import index

import numpy as np
import torch

from .admission import AdmitAfter, AdmitAll, EvictUnseen, PendingCounts, ReadOnly
from .idmap import MIN_KEY, IdMap
from .ids import INITS, SparseInputError, _int64s, check_ids, init_rows

__all__ = ["FREE", "INITS", "AdmitAfter", "AdmitAll", "DynamicTable", "EvictUnseen", "PendingCounts", "ReadOnly",
           "SparseInputError", "check_ids", "init_rows"]

FREE = -(1 << 63)
"""``id_by_row`` of a row that holds no ID (an int64 no ID can take: ``ops.sparse.idmap.EMPTY``)."""


def _records(a: np.ndarray) -> np.ndarray:
    """A 2-D array [n, c] whose last axis is contiguous, as a 1-D view [n] of opaque c-element
    records: fancy indexing then copies whole rows (memcpy) instead of element by element."""
    return a.view(np.dtype((np.void, a.shape[1] * a.itemsize)))[:, 0]


class _TableView(Mapping):
    """A read-only dict view of a table's per-row arrays: what ``row_of`` (id -> row), ``id_of``
    (row -> id) and ``last_seen`` (row -> step) were when they were dicts. Iteration follows insertion
    order, as a dict's did; one key reads the arrays (the id map for ``row_of``), iterating is O(n)."""

    def __init__(self, table: DynamicTable, kind: str):
        self._t, self._kind = table, kind

    def _row(self, key) -> int:
        """The live row a key names (a row for id_of / last_seen, an id for row_of); KeyError if none."""
        t = self._t
        try:
            k = index(key)
            if self._kind == "row_of":
                r = int(t.id_map.get(np.array([k], dtype=np.int64))[0]) if MIN_KEY <= k < 1 << 63 else -1
            else:
                r = k if 0 <= k < min(t.n_rows, len(t.id_by_row)) and t.id_by_row[k] != FREE else -1
        except (TypeError, OverflowError):
            r = -1
        if r < 0:
            raise KeyError(key)
        return r

    def _by_row(self) -> np.ndarray:
        """The per-row array holding the values of an id_of / last_seen view."""
        return self._t.id_by_row if self._kind == "id_of" else self._t.seen_step

    def __getitem__(self, key) -> int:
        r = self._row(key)
        return r if self._kind == "row_of" else int(self._by_row()[r])

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys int64 [n], values int64 [n]) in insertion order."""
        rows = self._t.live_rows()
        if self._kind == "row_of":
            return self._t.id_by_row[rows], rows
        return rows, self._by_row()[rows]

    def __iter__(self):
        return iter(self._arrays()[0].tolist())

    def __len__(self) -> int:
        return len(self._t)

    def values(self) -> list[int]:
        return self._arrays()[1].tolist()

    def items(self) -> list[tuple[int, int]]:
        k, v = self._arrays()
        return list(zip(k.tolist(), v.tolist()))

    def __repr__(self) -> str:
        return repr(dict(self.items()))


class _LastSeenView(_TableView):
    """``last_seen``: also settable for a live row (``t.last_seen[row] = step``)."""

    def __setitem__(self, row, step) -> None:
        self._t.seen_step[self._row(row)] = step


class DynamicTable:
    """An embedding table keyed by arbitrary signed int64 IDs (every int64 from -2**63 + 2 to 2**63 - 1:
    RecIS's string hashes are often negative; the two lowest values mark free slots of the id map).

    Args:
        dim: embedding width. optimizer: a sparse optimizer (SparseAdagrad, SparseAdam); its state
        lives in the same row. admission: AdmitAll | AdmitAfter(k) | ReadOnly. eviction: None |
        EvictUnseen(n). block_rows: rows per storage block (the table grows a block at a time).
        init_scale: the half-width (uniform) or standard deviation (normals) of the initial rows.
        seed: initialisation seed. init: "uniform" (default) | "zeros" | "normal" | "truncated_normal"
        (``init_rows``).

    Bookkeeping: ``id_map`` the ID -> row map (``ops.sparse.idmap.IdMap``); numpy int64 arrays indexed
    by row (at least ``n_rows`` long, grown geometrically): ``id_by_row`` the ID a row holds (``FREE``: free or
    never used), ``seen_step`` the last training step a live row was looked up in, ``insert_seq`` the
    order in which live rows got their IDs (eviction frees stale rows in that order). ``row_of`` /
    ``id_of`` / ``last_seen`` are dict views of these; ``sightings`` (not-yet-admitted ID -> count) is a
    mapping view of ``pending`` (the ``PendingCounts`` of IDs not yet admitted: count and last
    sighting step; expired by ``end_step`` under ``EvictUnseen``) and ``free`` (freed rows, reused last
    freed first) a list.
    """

    def __init__(self, dim: int, optimizer, admission=AdmitAll(), eviction: EvictUnseen | None = None,
                 block_rows: int = 4096, init_scale: float = 0.01, seed: int = 0, name: str = "table",
                 init: str = "uniform"):
        if init not in INITS:
            raise ValueError(f"table {name!r}: init must be one of {INITS}, got {init!r}")
        self.init = init
        if dim < 1 or block_rows < 1:
            raise ValueError(f"table {name!r}: dim and block_rows must be >= 1, got {dim}, {block_rows}")
        self.dim, self.optimizer, self.admission, self.eviction = dim, optimizer, admission, eviction
        self.block_rows, self.init_scale, self.seed, self.name = block_rows, init_scale, seed, name
        self.width = dim + optimizer.state_width(dim)
        self.blocks: list[torch.Tensor] = []          # each [block_rows, width]
        self.id_map = IdMap()                         # id -> row
        self.id_by_row = np.full(0, FREE, dtype=np.int64)
        self.seen_step = np.zeros(0, dtype=np.int64)
        self.insert_seq = np.zeros(0, dtype=np.int64)
        self.n_inserted = 0                           # ids ever given a row (the next insert_seq)
        self.pending = PendingCounts()                # not-yet-admitted id -> (count, last sighting step)
        self.pending_expired = 0                      # pending counters dropped by eviction so far
        self.free: list[int] = []
        self.n_rows = 0                               # rows ever allocated (high-water mark)
        self.step = 0
        self._views: dict[int, tuple] = {}            # block -> (tensor, full-row records, embedding records)
        self._plan_memo: tuple | None = None          # (rows, plan) of the last read(): apply_gradients reuses it
        self._update_memo: tuple | None = None        # (rows, full rows [n, width], writes) of read(for_update=True)
        self.writes = 0                               # row writes so far (a version: a memo of older rows is stale)
        self.size_history: list[tuple[int, int]] = [(0, 0)]
        self.evicted = 0

    def __len__(self) -> int:
        return len(self.id_map)

    @property
    def sightings(self) -> PendingCounts:
        """{id: sightings} of the IDs not yet admitted (a read-only view of ``pending``)."""
        return self.pending

    @sightings.setter
    def sightings(self, counts: Mapping) -> None:
        """Replace the pending counters by ``{id: count}``, all last sighted at the current step."""
        ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        self.pending.load(ids, np.fromiter(counts.values(), dtype=np.int64, count=len(counts)),
                          np.full(len(ids), self.step, dtype=np.int64))

    @property
    def capacity(self) -> int:
        return len(self.blocks) * self.block_rows

    @property
    def row_of(self) -> _TableView:
        """{id: row} of the live ids (a read-only view, insertion order)."""
        return _TableView(self, "row_of")

    @property
    def id_of(self) -> _TableView:
        """{row: id} of the live rows (a read-only view, insertion order)."""
        return _TableView(self, "id_of")

    @property
    def last_seen(self) -> _LastSeenView:
        """{row: last training step it was looked up in} of the live rows (a view; a live row's entry is settable)."""
        return _LastSeenView(self, "last_seen")

    def live_rows(self) -> np.ndarray:
        """Rows int64 [len(self)] holding an id, in the order they got it (a dict's iteration order)."""
        rows = np.flatnonzero(self.id_by_row[:self.n_rows] != FREE)
        return rows[np.argsort(self.insert_seq[rows], kind="stable")]

    # -- storage ---------------------------------------------------------------------------------
    def _alloc(self) -> int:
        return int(self._alloc_rows(1)[0])

    def _alloc_many(self, n: int) -> torch.Tensor:
        """Rows [n] for n new ids: freed slots first (last freed first), then new rows at the high-water
        mark, growing by whole blocks. The same rows, in the same order, as n calls of ``_alloc``."""
        return torch.from_numpy(self._alloc_rows(n))

    def _alloc_rows(self, n: int) -> np.ndarray:
        """``_alloc_many`` as int64 numpy [n]; also grows the per-row arrays to cover the new rows."""
        k = min(n, len(self.free))
        reused = np.array(self.free[len(self.free) - k:][::-1], dtype=np.int64)
        del self.free[len(self.free) - k:]
        fresh = np.arange(self.n_rows, self.n_rows + n - k, dtype=np.int64)
        self.n_rows += n - k
        while self.capacity < self.n_rows:
            self.blocks.append(torch.zeros(self.block_rows, self.width))
        if len(self.id_by_row) < self.n_rows:
            grow = max(self.n_rows, 2 * len(self.id_by_row), 64) - len(self.id_by_row)
            self.id_by_row = np.concatenate([self.id_by_row, np.full(grow, FREE, dtype=np.int64)])
            self.seen_step = np.concatenate([self.seen_step, np.zeros(grow, dtype=np.int64)])
            self.insert_seq = np.concatenate([self.insert_seq, np.zeros(grow, dtype=np.int64)])
        return np.concatenate([reused, fresh])

    def _plan(self, rows: np.ndarray):
        """How rows int64 [n] (each < capacity) lie in the blocks: (order, offsets, runs). ``order``
        int64 [n]: positions of ``rows`` by ascending row (None: one block, rows as given);
        ``offsets`` int64 [n]: the rows' offsets in their blocks, in that order; ``runs``: (block,
        start, end) slices of that order, one per block touched. One sort, then a few array
        operations per block (rows ascending within a block also read memory in order)."""
        n, br = len(rows), self.block_rows
        if len(self.blocks) == 1:
            return None, rows, [(0, 0, n)]
        bits = max(1, (n - 1).bit_length())
        if n and int(rows.max()) < 1 << (63 - bits):           # sort (row, position) pairs packed in one int64
            key = np.sort((rows << bits) | np.arange(n, dtype=np.int64))
            order, srt = key & ((1 << bits) - 1), key >> bits
        else:
            order = np.argsort(rows, kind="stable")
            srt = rows[order]
        blk = srt // br
        cut = (np.flatnonzero(blk[1:] != blk[:-1]) + 1).tolist()
        starts, ends = [0] + cut, cut + [n]
        return order, srt - blk * br, [(int(blk[s]), s, e) for s, e in zip(starts, ends) if e > s]

    def _plan_for(self, rows: np.ndarray, remember: bool = False):
        """``_plan(rows)``, reusing the remembered plan of the same rows (``read`` remembers its rows'
        plan for the ``apply_gradients`` of the same step; the plan depends on the rows only)."""
        memo = self._plan_memo
        if memo is not None and len(memo[0]) == len(rows) and np.array_equal(memo[0], rows):
            return memo[1]
        if not remember:
            return self._plan(rows)
        rows = rows.copy()                                     # a caller may change its rows tensor later
        plan = self._plan(rows)
        self._plan_memo = (rows, plan)
        return plan

    def _block_records(self, b: int, embedding_only: bool) -> np.ndarray:
        """Block ``b`` as a record view [block_rows] of its full rows or of their embedding columns
        (cached per block: making the view costs more than copying a few rows out of it)."""
        blk = self.blocks[b]
        v = self._views.get(b)
        if v is None or v[0] is not blk:
            a = blk.numpy()
            v = self._views[b] = (blk, _records(a), _records(a[:, :self.dim]))
        return v[2] if embedding_only else v[1]

    def _gather_np(self, rows: np.ndarray, embedding_only: bool = False, plan=None) -> np.ndarray:
        """Full rows [n, width] (or their embeddings [n, dim]) of rows int64 [n], as a new array."""
        order, off, runs = self._plan(rows) if plan is None else plan
        out = np.empty((len(rows), self.dim if embedding_only else self.width), dtype=self.blocks[0].numpy().dtype)
        dst = _records(out)
        for b, s, e in runs:
            src = self._block_records(b, embedding_only)
            if order is None:
                dst[:] = src[off]
            else:
                dst[order[s:e]] = src[off[s:e]]
        return out

    def _scatter_np(self, rows: np.ndarray, values: torch.Tensor, plan=None) -> None:
        """Write full rows ``values`` [n, width] to rows int64 [n] (distinct)."""
        order, off, runs = self._plan(rows) if plan is None else plan
        if not runs:
            return
        self.writes += 1
        src = _records(values.detach().to(self.blocks[0].dtype).contiguous().numpy())
        for b, s, e in runs:
            dst = self._block_records(b, False)
            if order is None:
                dst[off] = src
            else:
                dst[off[s:e]] = src[order[s:e]]

    def _gather(self, rows: torch.Tensor) -> torch.Tensor:
        """Full rows [n, width] (embedding + state) for row indices [n]."""
        if not len(rows):
            return torch.zeros(0, self.width)
        return torch.from_numpy(self._gather_np(_int64s(rows)))

    def _scatter(self, rows: torch.Tensor, values: torch.Tensor) -> None:
        """Write full rows ``values`` [n, width] to row indices [n] (distinct)."""
        if len(rows):
            self._scatter_np(_int64s(rows), values)

    def insert(self, ids: torch.Tensor, weights: torch.Tensor | None = None, state: torch.Tensor | None = None) -> torch.Tensor:
        """Give rows to (new, unique) ``ids`` [n]; initialise them (or set weights/state). Returns rows [n].
        Raises ValueError (naming the table) for a negative id, an id given twice or one that already
        has a row; then nothing changes."""
        keys = _int64s(ids)
        try:
            self.id_map.check_new(keys)
        except ValueError as e:
            raise ValueError(f"table {self.name!r}: {e}") from e
        return torch.from_numpy(self._insert(keys, weights, state))

    def _insert(self, keys: np.ndarray, weights: torch.Tensor | None = None, state: torch.Tensor | None = None) -> np.ndarray:
        """``insert`` of int64 ``keys`` [n] known to be new and distinct; rows int64 [n]."""
        n = len(keys)
        rows = self._alloc_rows(n)
        self.id_map.insert(keys, rows, check=False)
        self.id_by_row[rows] = keys
        self.seen_step[rows] = self.step
        self.insert_seq[rows] = np.arange(self.n_inserted, self.n_inserted + n, dtype=np.int64)
        self.n_inserted += n
        if len(self.pending):
            self.pending.discard(keys)
        if n:
            w = init_rows(torch.from_numpy(keys), self.dim, self.seed, self.init_scale, self.init) if weights is None else weights
            s = self.optimizer.init_state(n, self.dim) if state is None else state
            self._scatter_np(rows, torch.cat([w, s], dim=1))
        return rows

    # -- lookup ----------------------------------------------------------------------------------
    def rows_for(self, uids: torch.Tensor, train: bool, counts=None) -> torch.Tensor:
        """Rows [n] of unique ids [n] (-1: no row). In training, counts sightings, admits per the
        policy and marks the rows seen at the current step. ``counts`` int64 [n]: how many times each
        ID occurs in the batch (every occurrence is a sighting); None = once each. Raises
        SparseInputError for a negative id."""
        u = _int64s(uids)
        if len(u) and u.min() < MIN_KEY:
            raise SparseInputError(f"table {self.name!r}: id {int(u[u < MIN_KEY][0])} is reserved (ids are int64 in "
                                   f"[-2**63 + 2, 2**63))")
        rows = self.id_map.get(u)
        if train:
            missing = np.flatnonzero(rows < 0)
            if len(missing):
                if type(self.admission) is AdmitAll:      # every unseen id is admitted: no sighting counts
                    new = missing
                elif type(self.admission) is ReadOnly:    # never admitted: counting would only grow `pending`
                    new = missing[:0]
                else:
                    c = np.ones(len(missing), dtype=np.int64) if counts is None else _int64s(counts)[missing]
                    total = self.pending.add(u[missing], c, self.step)
                    if type(self.admission) in (AdmitAfter, ReadOnly):
                        ok = np.broadcast_to(np.asarray(self.admission.admit(total), dtype=bool), total.shape)
                    else:                                 # a policy of the user's own: one count at a time
                        ok = np.array([bool(self.admission.admit(int(x))) for x in total.tolist()], dtype=bool)
                    new = missing[ok]
                if len(new):
                    rows[new] = self._insert(u[new])
                self.seen_step[rows[rows >= 0]] = self.step
            else:
                self.seen_step[rows] = self.step
        return torch.from_numpy(rows)

    def read(self, rows: torch.Tensor, for_update: bool = False) -> torch.Tensor:
        """Embeddings [n, dim] of rows [n]; row -1 reads zeros. ``for_update``: the caller will pass the
        same rows to ``apply_gradients`` next; the full rows (embedding + optimizer state) are gathered
        once here and kept until then, so the update does not gather them again (kept only while no
        row is written in between: ``writes`` versions the rows)."""
        r = _int64s(rows)
        ok = None
        if len(r) and r.min() < 0:
            ok = np.flatnonzero(r >= 0)
            r = r[ok]
        plan = self._plan_for(r, remember=True) if len(r) else None
        if not len(r):
            return torch.zeros(len(rows), self.dim)
        if for_update:
            full = self._gather_np(r, plan=plan)
            self._update_memo = (self._plan_memo[0], full, self.writes)
            got = np.ascontiguousarray(full[:, :self.dim])
        else:
            got = self._gather_np(r, True, plan)
        if ok is None:
            return torch.from_numpy(got)
        out = torch.zeros(len(rows), self.dim)
        if len(ok):
            out[torch.from_numpy(ok)] = torch.from_numpy(got)
        return out

    def weights(self, ids) -> torch.Tensor:
        """Embeddings [n, dim] of table keys (namespaced ids; zeros for keys without a row); no side effects."""
        ids = check_ids(ids, self.name, signed=True)
        return self.read(torch.from_numpy(self.id_map.get(_int64s(ids))))

    # -- update ----------------------------------------------------------------------------------
    def apply_gradients(self, rows: torch.Tensor, grads: torch.Tensor) -> None:
        """Sparse optimizer step on rows [n] (unique, -1 skipped) with gradients [n, dim]; other rows are
        untouched. Uses the full rows kept by ``read(rows, for_update=True)`` when no row was written
        since; else gathers them. The optimizer updates them in place (``update_``) when it can."""
        r = _int64s(rows)
        if len(r) and r.min() < 0:
            ok = np.flatnonzero(r >= 0)
            r, grads = r[ok], grads[torch.from_numpy(ok)]
        memo, self._update_memo = self._update_memo, None
        if not len(r):
            return
        plan = self._plan_for(r)
        if memo is not None and memo[2] == self.writes and len(memo[0]) == len(r) and np.array_equal(memo[0], r):
            full = torch.from_numpy(memo[1])
        else:
            full = torch.from_numpy(self._gather_np(r, plan=plan))
        step_ = getattr(self.optimizer, "update_", None)
        kw = {"table_step": self.step + 1} if getattr(self.optimizer, "bias_correction", None) == "per_table" else {}
        if step_ is not None:
            step_(full, grads, self.dim, **kw)
        else:
            w, s = self.optimizer.update(full[:, :self.dim], full[:, self.dim:], grads, **kw)
            full = torch.cat([w, s], dim=1)
        self._scatter_np(r, full, plan=plan)

    def end_step(self) -> int:
        """Advance the step counter, evict per policy, record the table size. Returns rows evicted."""
        self.step += 1
        n = 0
        if self.eviction is not None:
            held = self.id_by_row[:self.n_rows]
            stale = np.flatnonzero((held != FREE) & (self.seen_step[:len(held)] < self.step - self.eviction.n_steps))
            if len(stale):
                stale = stale[np.argsort(self.insert_seq[stale], kind="stable")]   # as a dict by insertion
                self.id_map.delete(self.id_by_row[stale])
                self.id_by_row[stale] = FREE
                self.free.extend(stale.tolist())
            n = len(stale)
            self.evicted += n
            self.pending_expired += self.pending.expire(self.step - self.eviction.n_steps)
        self.size_history.append((self.step, len(self)))
        return n

    # -- checkpoint ------------------------------------------------------------------------------
    def live(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids [n] sorted, full rows [n, width], last_seen [n]) of the live rows only."""
        rows = np.flatnonzero(self.id_by_row[:self.n_rows] != FREE)
        ids = self.id_by_row[rows]
        order = np.argsort(ids, kind="stable")
        rows, ids = rows[order], ids[order]
        full = torch.from_numpy(self._gather_np(rows)) if len(rows) else torch.zeros(0, self.width)
        return torch.from_numpy(ids), full, torch.from_numpy(self.seen_step[rows])
