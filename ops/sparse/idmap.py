"""The ID -> row map of a dynamic table: an open-addressing hash map over two numpy int64 arrays,
probed for a whole batch of keys at once.

RecIS (arXiv 2509.20883 §3.1) keeps a dynamic table's ID -> row map in a GPU hash table that resolves
a batch of IDs in parallel. This is its CPU analogue: every numpy operation works on all the keys of
a batch still being probed, so the per-ID cost is a few vectorised array operations instead of one
Python dict access (a batch of 12k distinct IDs resolves against 1.3M keys in about 0.3-0.6 ms on one
CPU core, where the dict took about 6 ms).

Layout: ``keys`` int64 [capacity] (a power of two) holds an ID, ``EMPTY`` (-2**63, never used) or
``TOMBSTONE`` (-2**63 + 1, a deleted key); ``vals`` int64 [capacity] the row of the ID in the same
slot. Keys are signed int64 IDs from ``MIN_KEY`` = -2**63 + 2 to 2**63 - 1: the two markers are the
only values a key cannot take. A key's home slot is
``splitmix64(key) & (capacity - 1)``; collisions probe linearly (slot + 1, + 2, ...). A lookup round
reads every unresolved key's next slot (the first round) or next ``WINDOW`` slots (later rounds) and
resolves each key at the first slot holding it (hit) or EMPTY (miss); tombstones keep a probe going.

Load factor: occupied slots (live keys + tombstones) stay at most ``MAX_LOAD`` = 1/2 of the
capacity: linear probing then averages about 1.5 probes per hit and 2.5 per miss (Knuth, TAOCP vol. 3
§6.4), and an EMPTY slot always exists, so every probe sequence ends. An insert that would pass the
limit rebuilds the map (dropping tombstones) at the smallest power-of-two capacity that leaves it at
most ``REHASH_LOAD`` = 3/8 full, so rebuilds are amortised O(1) per key. Memory: 16 bytes per slot,
i.e. 32 to 64 bytes per live key.
"""

from __future__ import annotations

import numpy as np

EMPTY = -(1 << 63)
"""Marker of a slot never used since the last rebuild: a probe sequence ends there."""
TOMBSTONE = EMPTY + 1
"""Marker of a slot whose key was deleted: probes go past it; inserts may reuse it."""
MIN_KEY = EMPTY + 2
"""Smallest key (every int64 above the two markers is one)."""
MAX_LOAD = 0.5
"""Largest fraction of slots holding a key or a tombstone; an insert past it rebuilds the map."""
REHASH_LOAD = 0.375
"""Largest fraction of slots a rebuild leaves occupied (room for at least capacity/8 inserts)."""
MIN_CAPACITY = 16
"""Smallest number of slots."""
WINDOW = 8
"""Slots a probe round reads per key after the first (home-slot) round: the few keys still probing
then finish in one or two rounds instead of one round per extra slot."""
_WINDOW_OFFSETS = np.arange(WINDOW, dtype=np.int64)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser (Steele, Lea and Flood 2014) of uint64 values [any shape]: uint64, same shape."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _capacity_for(n: int) -> int:
    """Smallest power of two >= MIN_CAPACITY holding n keys at most REHASH_LOAD full."""
    cap = MIN_CAPACITY
    while n > cap * REHASH_LOAD:
        cap *= 2
    return cap


def _as_keys(keys) -> np.ndarray:
    """Keys as a contiguous int64 array [n] (1-D)."""
    return np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)


class IdMap:
    """Map from int64 IDs (>= ``MIN_KEY``) to int64 values (a dynamic table's rows), batch at a time.

    Args:
        capacity: slots to start with (rounded up to a power of two >= MIN_CAPACITY); the map grows
        by itself.

    Attributes: ``keys``, ``vals`` int64 [capacity] (see the module docstring); ``size`` live keys;
    ``tombstones`` deleted-key slots not yet reclaimed by a rebuild.
    """

    def __init__(self, capacity: int = MIN_CAPACITY):
        cap = MIN_CAPACITY
        while cap < capacity:
            cap *= 2
        self._reset(cap)

    def _reset(self, cap: int) -> None:
        self.keys = np.full(cap, EMPTY, dtype=np.int64)
        self.vals = np.empty(cap, dtype=np.int64)              # read only where keys holds a key
        self.mask = cap - 1
        self.size = 0
        self.tombstones = 0

    def __len__(self) -> int:
        return self.size

    @property
    def capacity(self) -> int:
        return len(self.keys)

    def _home(self, keys: np.ndarray) -> np.ndarray:
        """Home slots int64 [n] of int64 keys [n]."""
        return (splitmix64(keys.view(np.uint64)) & np.uint64(self.mask)).view(np.int64)

    # -- lookup ----------------------------------------------------------------------------------
    def find(self, keys) -> np.ndarray:
        """Slots int64 [n] holding int64 ``keys`` [n] (-1 for a key not in the map, e.g. a marker value)."""
        keys = _as_keys(keys)
        slots = np.full(len(keys), -1, dtype=np.int64)
        if not len(keys) or not self.size:
            return slots
        if keys.min() < MIN_KEY:                               # never stored; must not match EMPTY / TOMBSTONE
            ok = np.flatnonzero(keys >= MIN_KEY)
            slots[ok] = self.find(keys[ok])
            return slots
        table, mask = self.keys, self.mask
        probe, idx, k = self._home(keys), None, keys          # idx None: the active set is every key
        cur = table[probe]                                     # round 1: the home slots
        hit = cur == k
        slots[hit] = probe[hit]
        go = np.flatnonzero(~hit & (cur != EMPTY))             # past another key or a tombstone
        idx, probe, k = go, (probe[go] + 1) & mask, k[go]
        while len(idx):                                        # then WINDOW slots per key and round
            win = table[(probe[:, None] + _WINDOW_OFFSETS) & mask]
            hitw = win == k[:, None]
            stopw = hitw | (win == EMPTY)
            at = np.arange(len(idx))
            j = stopw.argmax(axis=1)                           # the first slot holding the key or EMPTY
            hit = hitw[at, j]
            slots[idx[hit]] = (probe[hit] + j[hit]) & mask
            go = np.flatnonzero(~stopw[at, j])
            idx, probe, k = idx[go], (probe[go] + WINDOW) & mask, k[go]
        return slots

    def get(self, keys, default: int = -1) -> np.ndarray:
        """Values int64 [n] of int64 ``keys`` [n]; ``default`` for a key not in the map."""
        slots = self.find(keys)
        out = self.vals[slots]                                 # slot -1 reads the last slot: masked below
        out[slots < 0] = default
        return out

    def __contains__(self, key) -> bool:
        try:
            k = np.array([key], dtype=np.int64)
        except (OverflowError, TypeError, ValueError):         # not an int64: never a key
            return False
        return bool(self.find(k)[0] >= 0)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys int64 [size], values int64 [size]) of every live key, in slot order."""
        live = np.flatnonzero(self.keys >= MIN_KEY)            # then take: faster than a sparse boolean mask
        return self.keys[live], self.vals[live]

    # -- update ----------------------------------------------------------------------------------
    def check_new(self, keys) -> None:
        """Raise ValueError unless int64 ``keys`` [n] are at least ``MIN_KEY``, distinct and not in the
        map (the message names the first offending key)."""
        keys = _as_keys(keys)
        if not len(keys):
            return
        if keys.min() < MIN_KEY:
            raise ValueError(f"id {int(keys[keys < MIN_KEY][0])} is reserved (ids are int64 in [-2**63 + 2, 2**63))")
        srt = np.sort(keys)
        dup = srt[1:][srt[1:] == srt[:-1]]
        if len(dup):
            raise ValueError(f"id {int(dup[0])} is given twice")
        there = self.find(keys) >= 0
        if there.any():
            raise ValueError(f"id {int(keys[there][0])} already has a row")

    def insert(self, keys, vals, check: bool = True) -> None:
        """Add int64 ``keys`` [n] with values ``vals`` [n]. The keys must be >= ``MIN_KEY``, distinct and
        not in the map; ``check=False`` skips verifying that (the caller knows it: e.g. the keys just
        missed in ``find``). Raises ValueError for a reserved, repeated or present key (``check``), or
        when keys and values differ in length; then nothing changes."""
        keys, vals = _as_keys(keys), _as_keys(vals)
        if len(keys) != len(vals):
            raise ValueError(f"IdMap.insert: {len(keys)} keys but {len(vals)} values")
        if check:
            self.check_new(keys)
        if not len(keys):
            return
        if (self.size + self.tombstones + len(keys)) > self.capacity * MAX_LOAD:
            self._rebuild(keys, vals)
        else:
            self._place(keys, vals)

    def _place(self, keys: np.ndarray, vals: np.ndarray) -> None:
        """Write absent distinct keys [n] and their values [n] into free slots (room is assured).
        Several keys probing the same free slot in one round all write it; the one whose key stays
        there wins, the others probe on."""
        table, mask = self.keys, self.mask
        probe, idx = self._home(keys), np.arange(len(keys))
        reused, width = 0, 1                                   # round 1: the home slots; then WINDOW slots
        while len(idx):
            if width == 1:
                cand = probe
                was = table[probe]
                has = was < MIN_KEY                            # EMPTY or TOMBSTONE
            else:
                win = table[(probe[:, None] + _WINDOW_OFFSETS) & mask]
                at = np.arange(len(idx))
                j = (win < MIN_KEY).argmax(axis=1)             # the first free slot in the window
                was = win[at, j]
                has = was < MIN_KEY
                cand = (probe + j) & mask
            free = np.flatnonzero(has)
            fi, fs = idx[free], cand[free]
            table[fs] = keys[fi]
            won = table[fs] == keys[fi]
            self.vals[fs[won]] = vals[fi[won]]
            reused += int(np.count_nonzero(was[free[won]] == TOMBSTONE))
            stay = np.ones(len(idx), dtype=bool)
            stay[free[won]] = False
            nxt = np.where(has, cand + 1, probe + width) & mask  # a loser goes on after the slot it lost
            idx, probe, width = idx[stay], nxt[stay], WINDOW
        self.size += len(keys)
        self.tombstones -= reused

    def delete(self, keys) -> None:
        """Remove int64 ``keys`` [n] (distinct, all in the map); their slots become tombstones.
        Raises KeyError naming a key not in the map (then nothing is removed)."""
        slots = self.find(keys)
        if (slots < 0).any():
            raise KeyError(int(_as_keys(keys)[slots < 0][0]))
        self.keys[slots] = TOMBSTONE
        self.size -= len(slots)
        self.tombstones += len(slots)

    def _rebuild(self, new_keys: np.ndarray, new_vals: np.ndarray) -> None:
        """Place the live keys and absent distinct ``new_keys`` [k] (values ``new_vals`` [k]) into a
        fresh map sized for them all (drops tombstones).

        Bulk placement, no probe rounds: in order of home slot, key i goes to ``max(home_i, slot of
        key i-1 + 1)``, i.e. ``i + max over j <= i of (home_j - j)`` (a running maximum): exactly where
        linear probing puts keys inserted in that order. Keys that would run past the last slot are
        then placed by ``_place`` (they wrap around to the start)."""
        keys, vals = self.items()
        keys, vals = np.concatenate([keys, new_keys]), np.concatenate([vals, new_vals])
        m = len(keys)
        self._reset(_capacity_for(m))
        if not m:
            return
        home = self._home(keys)
        bits = max(1, (m - 1).bit_length())
        at = np.arange(m, dtype=np.int64)
        if self.capacity < 1 << (63 - bits):                  # sort (home, position) pairs packed in one int64
            order = np.sort((home << bits) | at)
            order &= (1 << bits) - 1
        else:
            order = np.argsort(home, kind="stable")
        slot = home[order]
        del home
        slot -= at
        np.maximum.accumulate(slot, out=slot)
        slot += at
        del at
        fit = int(np.searchsorted(slot, self.capacity))       # slot increases: the keys that fit are a prefix
        self.keys[slot[:fit]] = keys[order[:fit]]
        self.vals[slot[:fit]] = vals[order[:fit]]
        self.size = fit
        if fit < m:
            self._place(keys[order[fit:]], vals[order[fit:]])
