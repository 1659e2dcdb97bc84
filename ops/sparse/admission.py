"""When an unseen ID gets a row of a dynamic table, and when a row is freed (RecIS, arXiv 2509.20883 §3.1,
feature admission and eviction): the admission policies :class:`AdmitAll`, :class:`AdmitAfter` and
:class:`ReadOnly`, the eviction policy :class:`EvictUnseen`, and :class:`PendingCounts`, the sighting counters
of IDs not admitted yet. :class:`ops.sparse.table.DynamicTable` applies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from operator import index

import numpy as np

from .idmap import IdMap
from .ids import _int64s


@dataclass(frozen=True)
class AdmitAll:
    """Every ID seen in training gets a row."""

    def admit(self, count: int) -> bool:
        return True


@dataclass(frozen=True)
class AdmitAfter:
    """An ID gets a row on its k-th sighting in training (k >= 1); before that it reads zeros.

    Every occurrence counts: an ID in 3 samples of one batch (or 3 times in one multi-hot bag) has
    3 sightings after that batch (``EmbeddingCollection`` passes the batch's occurrence counts to
    ``DynamicTable.rows_for``). The counters of IDs not yet admitted are kept in
    ``DynamicTable.pending`` and expire under the table's ``EvictUnseen(n)`` like rows do: an ID not
    sighted for more than n steps starts again from zero. Without an eviction policy they are kept
    until admission."""

    k: int = 2
    """The sighting in training on which an unseen ID gets a row (>= 1; 1 = admit at once)."""

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"AdmitAfter.k must be >= 1, got {self.k}")

    def admit(self, count):
        """Whether ``count`` sightings (an int, or an int64 array [n]: then a bool array [n]) admit."""
        return count >= self.k


@dataclass(frozen=True)
class ReadOnly:
    """No ID is ever admitted: unseen IDs read zeros (a frozen table; serving). Its sightings are not
    counted (``DynamicTable.pending`` stays empty: counters nothing can use would grow without bound)."""

    def admit(self, count: int) -> bool:
        return False


@dataclass(frozen=True)
class EvictUnseen:
    """Evict an ID not looked up in training for more than ``n_steps`` optimizer steps."""

    n_steps: int = 1000
    """Evict an ID not looked up in training for more than this many optimizer steps (``end_step`` calls)."""


class PendingCounts(Mapping):
    """Sighting counters of IDs that have no row yet (admission's bookkeeping), as a read-only
    ``{id: count}`` mapping, held in arrays: an ``IdMap`` from ID to a slot, and per slot the count
    and the last training step the ID was sighted in.

    Counters expire: ``expire(before)`` drops every counter last sighted before step ``before``
    (``DynamicTable.end_step`` calls it under ``EvictUnseen(n)`` with the same cut-off as for rows,
    so a long tail of one-off IDs holds at most the IDs of the last n + 1 steps). Memory: the id map
    (32-64 bytes per key) plus 17 bytes per slot.
    """

    def __init__(self):
        self.map = IdMap()
        self.ids = np.zeros(0, dtype=np.int64)
        self.count = np.zeros(0, dtype=np.int64)
        self.seen = np.zeros(0, dtype=np.int64)
        self.used = np.zeros(0, dtype=bool)
        self.free: list[int] = []
        self.n_slots = 0

    def __len__(self) -> int:
        return len(self.map)

    def __getitem__(self, key) -> int:
        try:
            s = int(self.map.find(np.array([index(key)], dtype=np.int64))[0])
        except (TypeError, OverflowError):
            s = -1
        if s < 0:
            raise KeyError(key)
        return int(self.count[self.map.vals[s]])

    def _live(self) -> np.ndarray:
        return np.flatnonzero(self.used[:self.n_slots])

    def __iter__(self):
        return iter(self.ids[self._live()].tolist())

    def items(self) -> list[tuple[int, int]]:
        live = self._live()
        return list(zip(self.ids[live].tolist(), self.count[live].tolist()))

    def values(self) -> list[int]:
        return self.count[self._live()].tolist()

    def last_sighted(self) -> dict[int, int]:
        """{id: last training step it was sighted in} of the pending IDs."""
        live = self._live()
        return dict(zip(self.ids[live].tolist(), self.seen[live].tolist()))

    def __repr__(self) -> str:
        return repr(dict(self.items()))

    def _slots(self, n: int) -> np.ndarray:
        k = min(n, len(self.free))
        reused = np.array(self.free[len(self.free) - k:], dtype=np.int64)
        del self.free[len(self.free) - k:]
        fresh = np.arange(self.n_slots, self.n_slots + n - k, dtype=np.int64)
        self.n_slots += n - k
        if len(self.ids) < self.n_slots:
            grow = max(self.n_slots, 2 * len(self.ids), 64) - len(self.ids)
            self.ids = np.concatenate([self.ids, np.zeros(grow, dtype=np.int64)])
            self.count = np.concatenate([self.count, np.zeros(grow, dtype=np.int64)])
            self.seen = np.concatenate([self.seen, np.zeros(grow, dtype=np.int64)])
            self.used = np.concatenate([self.used, np.zeros(grow, dtype=bool)])
        return np.concatenate([reused, fresh])

    def add(self, ids: np.ndarray, counts: np.ndarray, step: int) -> np.ndarray:
        """Add ``counts`` int64 [n] sightings to distinct ``ids`` int64 [n] at training step ``step``;
        returns their totals int64 [n] (new IDs start from 0)."""
        slots = self.map.get(ids)
        new = np.flatnonzero(slots < 0)
        if len(new):
            s = self._slots(len(new))
            self.map.insert(ids[new], s, check=False)
            self.ids[s], self.count[s], self.used[s] = ids[new], 0, True
            slots[new] = s
        self.count[slots] += counts
        self.seen[slots] = step
        return self.count[slots].copy()

    def discard(self, ids: np.ndarray) -> None:
        """Drop the counters of ``ids`` int64 [n] (distinct; those without a counter are ignored)."""
        if not len(self.map) or not len(ids):
            return
        slots = self.map.get(ids)
        ok = slots >= 0
        if ok.any():
            self._drop(slots[ok])

    def _drop(self, slots: np.ndarray) -> None:
        self.map.delete(self.ids[slots])
        self.used[slots] = False
        self.free.extend(slots.tolist())

    def expire(self, before: int) -> int:
        """Drop the counters last sighted before training step ``before``; returns how many."""
        live = self._live()
        stale = live[self.seen[live] < before]
        if len(stale):
            self._drop(stale)
        return len(stale)

    def load(self, ids, counts, steps) -> None:
        """Replace every counter by ``ids`` [p] (distinct) with ``counts`` [p] last sighted at ``steps`` [p]."""
        self.__init__()
        ids, counts, steps = _int64s(ids), _int64s(counts), _int64s(steps)
        if len(ids):
            s = self._slots(len(ids))
            self.map.insert(ids, s)
            self.ids[s], self.count[s], self.seen[s], self.used[s] = ids, counts, steps, True
