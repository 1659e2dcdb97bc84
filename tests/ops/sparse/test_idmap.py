"""The vectorised ID -> row map (ops.sparse.idmap.IdMap) against a Python dict: random insert / lookup /
delete sequences with growth and tombstones, keys that all share a home slot (long probe chains, several
new keys claiming the same free slot in one round), probes that wrap past the last slot, and bad input."""

import numpy as np
import pytest

from ops.sparse.idmap import EMPTY, MAX_LOAD, MIN_KEY, TOMBSTONE, IdMap, splitmix64


def _check(m: IdMap, ref: dict) -> None:
    """The map equals ``ref`` and its counters and load factor hold."""
    assert len(m) == len(ref) == int((m.keys >= 0).sum())
    assert m.tombstones == int((m.keys == TOMBSTONE).sum())
    assert m.size + m.tombstones <= m.capacity * MAX_LOAD
    assert m.capacity & (m.capacity - 1) == 0
    k, v = m.items()
    assert dict(zip(k.tolist(), v.tolist())) == ref
    if ref:
        keys = np.array(list(ref), dtype=np.int64)
        assert m.get(keys).tolist() == list(ref.values())


def _sharing_home(n: int, low_bits: int, want: int = 0, start: int = 0) -> np.ndarray:
    """n distinct non-negative keys whose splitmix64 hash has ``want`` in its low ``low_bits`` bits: they
    share a home slot in every map of at most 2**low_bits slots."""
    out, x = [], start
    while len(out) < n:
        c = np.arange(x, x + (1 << 16), dtype=np.int64)
        h = splitmix64(c.view(np.uint64)) & np.uint64((1 << low_bits) - 1)
        out.extend(c[h == np.uint64(want)].tolist())
        x += 1 << 16
    return np.array(out[:n], dtype=np.int64)


@pytest.mark.parametrize("seed", range(6))
def test_random_insert_lookup_delete_matches_a_dict(seed):
    rng = np.random.default_rng(seed)
    m, ref = IdMap(), {}
    hi = [1 << 12, 1 << 40, 1 << 63][seed % 3]                 # dense small ids, sparse ones, the whole int64 range
    for step in range(150):
        q = np.unique(rng.integers(0, hi, int(rng.integers(0, 400)), dtype=np.int64))
        got = m.get(q)
        assert got.tolist() == [ref.get(k, -1) for k in q.tolist()]
        assert (m.find(q) >= 0).tolist() == [k in ref for k in q.tolist()]
        new = rng.permutation(q[got < 0])
        vals = rng.integers(0, 1 << 40, len(new))
        m.insert(new, vals, check=bool(step % 2))
        ref.update(zip(new.tolist(), vals.tolist()))
        if ref and rng.random() < 0.5:                         # delete a random share of the live keys
            live = np.array(list(ref), dtype=np.int64)
            gone = rng.choice(live, size=int(rng.integers(1, len(live) + 1)), replace=False)
            m.delete(gone)
            for k in gone.tolist():
                del ref[k]
        _check(m, ref)
    assert m.capacity > 16                                     # it grew


def test_keys_sharing_a_home_slot_collide_in_one_round_and_stay_findable():
    keys = _sharing_home(60, low_bits=12)                      # one home slot in any map up to 4096 slots
    m = IdMap(capacity=256)
    m.insert(keys[:40], np.arange(40))                         # 40 keys claim the same free slot in round 1
    ref = dict(zip(keys[:40].tolist(), range(40)))
    _check(m, ref)
    home = int(m._home(keys[:1])[0])
    run = (home + np.arange(40)) & m.mask
    assert (m.keys[run] >= 0).all()                            # one contiguous probe run
    m.delete(keys[10:30:2])                                    # tombstones in the middle of the run
    for k in keys[10:30:2].tolist():
        del ref[k]
    _check(m, ref)
    assert m.get(keys[31:40]).tolist() == list(range(31, 40))  # found past the tombstones
    m.insert(keys[40:], np.arange(40, 60))                     # new keys reuse the tombstones
    ref.update(zip(keys[40:].tolist(), range(40, 60)))
    _check(m, ref)
    assert m.tombstones == 0


def test_probes_wrap_past_the_last_slot_and_bulk_rebuild_wraps_too():
    m = IdMap(capacity=64)                                     # 24 keys fit without a rebuild (3/8 of 64)
    keys = _sharing_home(20, low_bits=6, want=63)              # home = the last slot of a 64-slot map
    m.insert(keys, np.arange(20))
    assert m.capacity == 64 and m.keys[63] >= 0 and (m.keys[:19] >= 0).all()
    _check(m, dict(zip(keys.tolist(), range(20))))
    fresh = IdMap()                                            # 16 slots: one insert of 20 rebuilds to 64 ...
    fresh.insert(keys, np.arange(20))                          # ... where bulk placement runs past the end
    assert fresh.capacity == 64
    _check(fresh, dict(zip(keys.tolist(), range(20))))


def test_growth_and_tombstone_purge_keep_the_load_factor():
    rng = np.random.default_rng(1)
    m, ref = IdMap(), {}
    for _ in range(40):                                        # churn: as many deletes as inserts at a steady size
        new = np.setdiff1d(np.unique(rng.integers(0, 1 << 50, 300)), np.array(list(ref), dtype=np.int64))
        m.insert(new, new * 2)
        ref.update(zip(new.tolist(), (new * 2).tolist()))
        if len(ref) > 1000:
            gone = rng.choice(np.array(list(ref), dtype=np.int64), size=len(new), replace=False)
            m.delete(gone)
            for k in gone.tolist():
                del ref[k]
        _check(m, ref)
    assert m.capacity <= 4096                                  # tombstones were purged, not grown into
    big = IdMap()
    keys = np.unique(rng.integers(0, 1 << 62, 50_000))
    big.insert(keys, np.arange(len(keys)))                     # one bulk insert from empty
    _check(big, dict(zip(keys.tolist(), range(len(keys)))))


def test_bad_keys_raise_and_change_nothing():
    m = IdMap()
    m.insert(np.array([5, 9]), np.array([0, 1]))
    for keys, msg in (([3, -2**63], "reserved"), ([3, -2**63 + 1], "reserved"), ([3, 3], "given twice"),
                      ([9, 4], "already has a row")):
        with pytest.raises(ValueError, match=msg):
            m.insert(np.array(keys), np.array([7, 8]))
        _check(m, {5: 0, 9: 1})
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        m.insert(np.array([1, 2]), np.array([1]))
    with pytest.raises(KeyError):
        m.delete(np.array([5, 6]))
    _check(m, {5: 0, 9: 1})
    assert m.get(np.array([], dtype=np.int64)).tolist() == [] and 5 in m and 6 not in m
    assert -1 not in m and -2 not in m and 2**64 not in m and m.get(np.array([-1, 9, -2])).tolist() == [-1, 1, -1]
    assert set(m.keys[m.keys < MIN_KEY].tolist()) == {EMPTY} and EMPTY in m.keys
    m.insert(np.array([-1, -2, MIN_KEY, 2**63 - 1]), np.array([2, 3, 4, 5]))        # signed ids are keys too
    assert m.get(np.array([-1, -2, MIN_KEY, 2**63 - 1, 5, TOMBSTONE, EMPTY])).tolist() == [2, 3, 4, 5, 0, -1, -1]
    m.delete(np.array([-1]))
    assert -1 not in m and TOMBSTONE in m.keys.tolist() and m.get(np.array([-2])).tolist() == [3]
