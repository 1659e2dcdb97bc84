"""Dynamic embedding tables (RecIS, arXiv 2509.20883 §3.1): an ID -> row map over rows held in
growable blocks, each row = [embedding (dim) | optimizer state]; no fixed vocabulary and no hashing
modulo a size, so two IDs never share a row. Admission decides when an unseen ID gets a row;
eviction frees rows of IDs unseen for ``n`` steps (slots are reused).

Row initialisation is a function of (seed, ID) only (a SplitMix64 counter hash), so a row's initial
value does not depend on insertion order, process, or shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat

import numpy as np
import torch

from .data import ID_BITS


class SparseInputError(ValueError):
    """Bad IDs or batches given to the sparse engine; the message names the feature."""


@dataclass(frozen=True)
class AdmitAll:
    """Every ID seen in training gets a row."""

    def admit(self, count: int) -> bool:
        return True


@dataclass(frozen=True)
class AdmitAfter:
    """An ID gets a row on its k-th sighting in training (k >= 1); before that it reads zeros."""

    k: int = 2
    """The sighting in training on which an unseen ID gets a row (>= 1; 1 = admit at once)."""

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"AdmitAfter.k must be >= 1, got {self.k}")

    def admit(self, count: int) -> bool:
        return count >= self.k


@dataclass(frozen=True)
class ReadOnly:
    """No ID is ever admitted: unseen IDs read zeros (a frozen table; serving)."""

    def admit(self, count: int) -> bool:
        return False


@dataclass(frozen=True)
class EvictUnseen:
    """Evict an ID not looked up in training for more than ``n_steps`` optimizer steps."""

    n_steps: int = 1000
    """Evict an ID not looked up in training for more than this many optimizer steps (``end_step`` calls)."""


def check_ids(ids, feature: str, bits: int = ID_BITS, why: str = "") -> torch.Tensor:
    """IDs as int64 (any shape), validated: integer dtype, non-negative, below 2**bits (bits <= 63;
    63 is the whole non-negative int64 range). Unsigned or Python-int input at or above 2**63 is
    rejected before the cast (it would wrap to a negative int64). Raises SparseInputError naming the
    feature and the first bad id; ``why`` is appended to the message (the reason for the limit)."""
    if isinstance(ids, torch.Tensor) and ids.dtype in (torch.uint64, torch.uint32, torch.uint16):
        ids = ids.numpy()
    if not isinstance(ids, torch.Tensor):
        arr = np.asarray(ids)
        if arr.dtype.kind == "O":                       # Python ints beyond int64 and uint64
            big = [x for x in arr.flat if isinstance(x, int) and not 0 <= x < 1 << 63]
            if big:
                raise SparseInputError(f"feature {feature!r}: id {big[0]} outside [0, 2**63) (ids are int64){why}")
        if arr.dtype.kind == "u" and arr.size and int(arr.max()) >= 1 << 63:
            bad = int(arr[arr >= np.uint64(1 << 63)].flat[0])
            raise SparseInputError(f"feature {feature!r}: id {bad} outside [0, 2**63) (ids are int64){why}")
        if arr.dtype.kind == "u":
            arr = arr.astype(np.int64)
        try:
            ids = torch.as_tensor(arr)
        except (TypeError, ValueError) as e:
            raise SparseInputError(f"feature {feature!r}: ids must be integers, got {arr.dtype} ({e})") from e
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dtype.is_complex:
        raise SparseInputError(f"feature {feature!r}: ids must be integers, got dtype {ids.dtype}")
    ids = ids.to(torch.int64)
    limit = (1 << bits) if bits < 63 else None
    if ids.numel() and (ids.min() < 0 or (limit is not None and ids.max() >= limit)):
        bad = ids[(ids < 0) | ((ids >= limit) if limit is not None else False)][0].item()
        raise SparseInputError(f"feature {feature!r}: id {bad} outside [0, 2**{bits}){why}")
    return ids


_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def init_rows(ids: torch.Tensor, dim: int, seed: int, scale: float) -> torch.Tensor:
    """Uniform(-scale, scale) rows [n, dim] that depend only on (seed, id, column)."""
    with np.errstate(over="ignore"):
        base = ids.numpy().astype(np.uint64) * np.uint64(0x100000001B3) + np.uint64(seed) * np.uint64(0x2545F4914F6CDD1D)
        x = _splitmix(base[:, None] * np.uint64(1024) + np.arange(dim, dtype=np.uint64)[None, :])
    u = (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return torch.from_numpy(((2 * u - 1) * scale).astype(np.float32))


class DynamicTable:
    """An embedding table keyed by arbitrary non-negative int64 IDs (the whole range [0, 2**63)).

    Args:
        dim: embedding width. optimizer: a sparse optimizer (SparseAdagrad, SparseAdam); its state
        lives in the same row. admission: AdmitAll | AdmitAfter(k) | ReadOnly. eviction: None |
        EvictUnseen(n). block_rows: rows per storage block (the table grows a block at a time).
        init_scale: rows start Uniform(-init_scale, init_scale). seed: initialisation seed.
    """

    def __init__(self, dim: int, optimizer, admission=AdmitAll(), eviction: EvictUnseen | None = None,
                 block_rows: int = 4096, init_scale: float = 0.01, seed: int = 0, name: str = "table"):
        if dim < 1 or block_rows < 1:
            raise ValueError(f"table {name!r}: dim and block_rows must be >= 1, got {dim}, {block_rows}")
        self.dim, self.optimizer, self.admission, self.eviction = dim, optimizer, admission, eviction
        self.block_rows, self.init_scale, self.seed, self.name = block_rows, init_scale, seed, name
        self.width = dim + optimizer.state_width(dim)
        self.blocks: list[torch.Tensor] = []          # each [block_rows, width]
        self.row_of: dict[int, int] = {}              # id -> row
        self.id_of: dict[int, int] = {}               # row -> id
        self.last_seen: dict[int, int] = {}           # row -> step
        self.sightings: dict[int, int] = {}           # not-yet-admitted id -> count
        self.free: list[int] = []
        self.n_rows = 0                               # rows ever allocated (high-water mark)
        self.step = 0
        self.size_history: list[tuple[int, int]] = [(0, 0)]
        self.evicted = 0

    def __len__(self) -> int:
        return len(self.row_of)

    @property
    def capacity(self) -> int:
        return len(self.blocks) * self.block_rows

    # -- storage ---------------------------------------------------------------------------------
    def _alloc(self) -> int:
        return int(self._alloc_many(1)[0])

    def _alloc_many(self, n: int) -> torch.Tensor:
        """Rows [n] for n new ids: freed slots first (last freed first), then new rows at the high-water
        mark, growing by whole blocks. The same rows, in the same order, as n calls of ``_alloc``."""
        k = min(n, len(self.free))
        reused = self.free[len(self.free) - k:][::-1]
        del self.free[len(self.free) - k:]
        fresh = torch.arange(self.n_rows, self.n_rows + n - k, dtype=torch.int64)
        self.n_rows += n - k
        while self.capacity < self.n_rows:
            self.blocks.append(torch.zeros(self.block_rows, self.width))
        return torch.cat([torch.tensor(reused, dtype=torch.int64), fresh])

    def _by_block(self, rows: torch.Tensor):
        """(block, positions in ``rows``, offsets in the block) for each block the rows [n] touch: one
        sort instead of one mask over all rows per block."""
        blk, off = rows // self.block_rows, rows % self.block_rows
        if len(self.blocks) == 1:
            yield 0, slice(None), off
            return
        order = torch.argsort(blk)
        bs, counts = torch.unique_consecutive(blk[order], return_counts=True)
        for b, pos in zip(bs.tolist(), torch.split(order, counts.tolist())):
            yield b, pos, off[pos]

    def _gather(self, rows: torch.Tensor) -> torch.Tensor:
        """Full rows [n, width] (embedding + state) for row indices [n]."""
        out = torch.empty(len(rows), self.width)
        for b, pos, off in self._by_block(rows):
            out[pos] = self.blocks[b][off]
        return out

    def _scatter(self, rows: torch.Tensor, values: torch.Tensor) -> None:
        for b, pos, off in self._by_block(rows):
            self.blocks[b][off] = values[pos]

    def insert(self, ids: torch.Tensor, weights: torch.Tensor | None = None, state: torch.Tensor | None = None) -> torch.Tensor:
        """Give rows to (new, unique) ``ids`` [n]; initialise them (or set weights/state). Returns rows [n]."""
        rows = self._alloc_many(len(ids))
        il, rl = ids.tolist(), rows.tolist()
        self.row_of.update(zip(il, rl))
        self.id_of.update(zip(rl, il))
        self.last_seen.update(dict.fromkeys(rl, self.step))
        if self.sightings:
            for i in il:
                self.sightings.pop(i, None)
        if len(ids):
            w = init_rows(ids, self.dim, self.seed, self.init_scale) if weights is None else weights
            s = self.optimizer.init_state(len(ids), self.dim) if state is None else state
            self._scatter(rows, torch.cat([w, s], dim=1))
        return rows

    # -- lookup ----------------------------------------------------------------------------------
    def rows_for(self, uids: torch.Tensor, train: bool) -> torch.Tensor:
        """Rows [n] of unique ids [n] (-1: no row). In training, counts sightings, admits per the
        policy and marks the rows seen at the current step."""
        ul = uids.tolist()
        rows = torch.from_numpy(np.fromiter(map(self.row_of.get, ul, repeat(-1)), dtype=np.int64, count=len(ul)))
        if train:
            missing = torch.nonzero(rows < 0).flatten()
            if type(self.admission) is AdmitAll:          # every unseen id is admitted: no sighting counts
                new = missing.tolist()
            else:
                new = []
                for k in missing.tolist():
                    i = ul[k]
                    c = self.sightings.get(i, 0) + 1
                    if self.admission.admit(c):
                        new.append(k)
                    else:
                        self.sightings[i] = c
            if new:
                idx = torch.tensor(new, dtype=torch.int64)
                rows[idx] = self.insert(uids[idx])
            self.last_seen.update(dict.fromkeys(rows[rows >= 0].tolist(), self.step))
        return rows

    def read(self, rows: torch.Tensor) -> torch.Tensor:
        """Embeddings [n, dim] of rows [n]; row -1 reads zeros."""
        out = torch.zeros(len(rows), self.dim)
        ok = rows >= 0
        if ok.any():
            out[ok] = self._gather(rows[ok])[:, :self.dim]
        return out

    def weights(self, ids) -> torch.Tensor:
        """Embeddings [n, dim] of table keys (namespaced ids; zeros for keys without a row); no side effects."""
        ids = check_ids(ids, self.name, bits=63)
        return self.read(torch.tensor([self.row_of.get(i, -1) for i in ids.tolist()], dtype=torch.int64))

    # -- update ----------------------------------------------------------------------------------
    def apply_gradients(self, rows: torch.Tensor, grads: torch.Tensor) -> None:
        """Sparse optimizer step on rows [n] (unique, -1 skipped) with gradients [n, dim]; other rows are untouched."""
        ok = rows >= 0
        rows, grads = rows[ok], grads[ok]
        if len(rows):
            full = self._gather(rows)
            w, s = self.optimizer.update(full[:, :self.dim], full[:, self.dim:], grads)
            self._scatter(rows, torch.cat([w, s], dim=1))

    def end_step(self) -> int:
        """Advance the step counter, evict per policy, record the table size. Returns rows evicted."""
        self.step += 1
        n = 0
        if self.eviction is not None:
            stale = [r for r, t in self.last_seen.items() if self.step - t > self.eviction.n_steps]
            for r in stale:
                del self.row_of[self.id_of.pop(r)]
                del self.last_seen[r]
                self.free.append(r)
            n = len(stale)
            self.evicted += n
        self.size_history.append((self.step, len(self)))
        return n

    # -- checkpoint ------------------------------------------------------------------------------
    def live(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids [n] sorted, full rows [n, width], last_seen [n]) of the live rows only."""
        ids = torch.tensor(sorted(self.row_of), dtype=torch.int64)
        rows = torch.tensor([self.row_of[i] for i in ids.tolist()], dtype=torch.int64)
        seen = torch.tensor([self.last_seen[r] for r in rows.tolist()], dtype=torch.int64)
        full = self._gather(rows) if len(rows) else torch.zeros(0, self.width)
        return ids, full, seen
