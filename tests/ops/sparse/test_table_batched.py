"""The batched storage paths of DynamicTable (batched allocation, block-grouped gather/scatter, the
vectorised id map and per-row arrays, the AdmitAll fast path) give the same rows, values and bookkeeping
as the one-id-at-a-time dict rules they replace."""

import numpy as np
import pytest
import torch

from ops.sparse.optim import SparseAdagrad, SparseAdam
from ops.sparse.table import AdmitAfter, AdmitAll, DynamicTable, EvictUnseen


def test_batched_allocation_reuses_freed_slots_last_freed_first_then_grows_by_blocks():
    t = DynamicTable(2, SparseAdagrad(), block_rows=4)
    t.free = [7, 2, 5]                        # as eviction leaves it: pop() gives 5, then 2, then 7
    t.n_rows, t.blocks = 8, [torch.zeros(4, 4), torch.zeros(4, 4)]
    rows = t._alloc_many(6)
    assert rows.tolist() == [5, 2, 7, 8, 9, 10]   # what six calls of the old per-id _alloc gave
    assert t.free == [] and t.n_rows == 11 and t.capacity == 12 and len(t.blocks) == 3
    assert t._alloc() == 11 and t._alloc() == 12 and t.capacity == 16


def test_gather_and_scatter_across_many_blocks_match_a_flat_reference():
    g = torch.Generator().manual_seed(0)
    t = DynamicTable(3, SparseAdagrad(), block_rows=5)
    ids = torch.randperm(10_000, generator=g)[:97]
    t.insert(ids)
    assert len(t.blocks) == 20
    flat = torch.cat(t.blocks)                                      # [100, 6]
    rows = torch.randperm(97, generator=g)[:60]
    assert torch.equal(t._gather(rows), flat[rows])
    vals = torch.randn(60, 6, generator=g)
    t._scatter(rows, vals)
    flat[rows] = vals
    assert torch.equal(torch.cat(t.blocks), flat)                   # untouched rows unchanged too
    assert torch.equal(t._gather(torch.tensor([], dtype=torch.int64)), torch.zeros(0, 6))
    t.blocks = [b + 1 for b in t.blocks]                            # new block tensors: no stale cached view
    assert torch.equal(t._gather(rows), flat[rows] + 1)


def test_apply_gradients_after_read_uses_the_rows_it_is_given():
    t = DynamicTable(2, SparseAdagrad(), block_rows=2)              # three blocks
    t.insert(torch.tensor([1, 2, 3, 4, 5]))
    rows = torch.tensor([0, 3])
    t.read(rows)                                                    # remembers the plan of rows [0, 3]
    before = t._gather(torch.arange(5))
    rows[1] = 4                                                     # the caller changes its tensor in place
    t.apply_gradients(rows, torch.ones(2, 2))
    after = t._gather(torch.arange(5))
    assert torch.equal(after[[1, 2, 3]], before[[1, 2, 3]]) and not torch.equal(after[4], before[4])


def test_lookup_bookkeeping_and_admission_paths():
    t = DynamicTable(2, SparseAdagrad(), block_rows=2)
    t.rows_for(torch.tensor([10, 20, 30]), train=True)
    t.end_step()
    rows = t.rows_for(torch.tensor([5, 20, 40]), train=True)
    assert rows.tolist() == [3, 1, 4]
    assert t.row_of == {10: 0, 20: 1, 30: 2, 5: 3, 40: 4} and t.id_of == {0: 10, 1: 20, 2: 30, 3: 5, 4: 40}
    assert t.last_seen == {0: 0, 1: 1, 2: 0, 3: 1, 4: 1} and t.sightings == {}
    assert t.rows_for(torch.tensor([99]), train=False).tolist() == [-1] and 99 not in t.row_of

    class AdmitOdd(AdmitAll):                 # a subclass that overrides admit() must not take the fast path
        def admit(self, count):
            return False
    s = DynamicTable(2, SparseAdagrad(), admission=AdmitOdd())
    assert s.rows_for(torch.tensor([1, 2]), train=True).tolist() == [-1, -1] and s.sightings == {1: 1, 2: 1}

    a = DynamicTable(2, SparseAdagrad(), admission=AdmitAfter(2), eviction=EvictUnseen(1))
    a.rows_for(torch.tensor([7]), train=True)
    assert a.sightings == {7: 1} and len(a) == 0
    assert a.rows_for(torch.tensor([7]), train=True).tolist() == [0] and a.sightings == {}


class _DictTable:
    """DynamicTable's bookkeeping as it was with Python dicts, one id at a time: the reference for the
    array-based table. Dicts keep insertion order, so eviction frees stale rows in the order they got
    their ids, and the free list is reused last-freed first."""

    def __init__(self, admission, n_steps):
        self.admission, self.n_steps = admission, n_steps
        self.row_of, self.id_of, self.last_seen, self.sightings, self.free = {}, {}, {}, {}, []
        self.sighted = {}                     # pending id -> last step it was sighted in
        self.n_rows = self.step = 0

    def rows_for(self, ids, train):
        rows = [self.row_of.get(i, -1) for i in ids]
        if train:
            for k, i in enumerate(ids):
                if rows[k] < 0:
                    c = self.sightings.get(i, 0) + 1
                    if self.admission.admit(c):
                        rows[k] = self.free.pop() if self.free else self.n_rows
                        self.n_rows += rows[k] == self.n_rows
                        self.row_of[i], self.id_of[rows[k]] = rows[k], i
                        self.sightings.pop(i, None), self.sighted.pop(i, None)
                    else:
                        self.sightings[i] = c
                        self.sighted[i] = self.step
            for r in rows:
                if r >= 0:
                    self.last_seen[r] = self.step
        return rows

    def end_step(self):
        self.step += 1
        stale = [r for r, t in self.last_seen.items() if self.step - t > self.n_steps]
        for r in stale:
            del self.row_of[self.id_of.pop(r)]
            del self.last_seen[r]
            self.free.append(r)
        for i in [i for i, t in self.sighted.items() if self.step - t > self.n_steps]:   # pending counters expire too
            del self.sightings[i], self.sighted[i]
        return len(stale)


@pytest.mark.parametrize("admission,n_steps", [(AdmitAll(), 1), (AdmitAll(), 3), (AdmitAfter(2), 2)])
def test_array_bookkeeping_matches_the_dict_rules_under_admission_and_eviction(admission, n_steps):
    rng = np.random.default_rng(n_steps)
    t = DynamicTable(2, SparseAdagrad(), admission=admission, eviction=EvictUnseen(n_steps), block_rows=3)
    ref = _DictTable(admission, n_steps)
    for step in range(80):
        ids = np.unique(rng.integers(0, 60, int(rng.integers(1, 25)))) * 1_000_003 + (1 << 62)
        train = step % 7 != 3
        rows = t.rows_for(torch.from_numpy(ids), train=train)
        assert rows.tolist() == ref.rows_for(ids.tolist(), train)
        if train:
            t.apply_gradients(rows, torch.ones(len(rows), 2))
        assert t.end_step() == ref.end_step()
        assert list(t.row_of.items()) == list(ref.row_of.items())          # same content, same (insertion) order
        assert t.id_of == ref.id_of and t.last_seen == ref.last_seen and list(t.last_seen) == list(ref.last_seen)
        assert t.free == ref.free and t.n_rows == ref.n_rows and t.sightings == ref.sightings and len(t) == len(ref.row_of)
        ids_live, full, seen = t.live()
        assert ids_live.tolist() == sorted(ref.row_of)
        assert seen.tolist() == [ref.last_seen[ref.row_of[i]] for i in sorted(ref.row_of)]
        assert torch.equal(full, t._gather(torch.tensor([ref.row_of[i] for i in sorted(ref.row_of)], dtype=torch.int64)))
    assert t.evicted > 0 and ref.free                       # slots were freed and reused


def test_dict_views_read_and_set_like_the_old_dicts():
    t = DynamicTable(2, SparseAdagrad(), block_rows=2)
    t.insert(torch.tensor([30, 10, 2**63 - 1]))
    assert t.row_of[10] == 1 and t.row_of.get(11) is None and 2**63 - 1 in t.row_of and -5 not in t.row_of
    assert 2**64 not in t.row_of and "x" not in t.row_of and 3 not in t.id_of
    assert list(t.row_of) == [30, 10, 2**63 - 1] and t.row_of.values() == [0, 1, 2] and len(t.row_of) == 3
    assert t.id_of[2] == 2**63 - 1 and t.row_of.keys() == {10, 30, 2**63 - 1}
    t.last_seen[1] = 7
    assert t.last_seen == {0: 0, 1: 7, 2: 0} and repr(t.last_seen) == "{0: 0, 1: 7, 2: 0}"
    with pytest.raises(KeyError):
        t.last_seen[5] = 1                                  # not a live row
    with pytest.raises(ValueError, match="table 'table': id 10 already has a row"):
        t.insert(torch.tensor([4, 10]))
    assert len(t) == 3 and t.n_rows == 3                    # the failed insert changed nothing


@pytest.mark.parametrize("opt", [SparseAdagrad(lr=0.1), SparseAdam(lr=0.01)], ids=["adagrad", "adam"])
def test_in_place_update_gives_the_same_bits_as_the_out_of_place_rule(opt):
    g = torch.Generator().manual_seed(1)
    dim = 5
    full = torch.rand(50, dim + opt.state_width(dim), generator=g)
    grads = torch.randn(50, dim, generator=g)
    for _ in range(3):                                              # Adam's step count and bias correction move
        w, s = opt.update(full[:, :dim], full[:, dim:], grads)
        expect = torch.cat([w, s], dim=1)
        opt.update_(full, grads, dim)
        assert torch.equal(full, expect)


def test_rows_kept_by_a_read_for_update_are_used_only_while_no_row_was_written():
    def pair():
        return [DynamicTable(3, SparseAdagrad(lr=0.5), block_rows=4) for _ in range(2)]

    g = torch.Generator().manual_seed(2)
    grads = [torch.randn(3, 3, generator=g) for _ in range(3)]
    kept, ref = pair()
    for t in (kept, ref):
        t.insert(torch.tensor([11, 12, 13, 14, 15, 16]))
    rows = torch.tensor([0, 4, 5])
    kept.read(rows, for_update=True)
    ref.read(rows)
    kept.apply_gradients(rows, grads[0])                             # the kept rows
    ref.apply_gradients(rows, grads[0])                              # gathered again
    assert torch.equal(torch.cat(kept.blocks), torch.cat(ref.blocks))
    kept.apply_gradients(rows, grads[1])                             # the keep is spent: gathers the updated rows
    ref.apply_gradients(rows, grads[1])
    assert torch.equal(torch.cat(kept.blocks), torch.cat(ref.blocks))
    kept.read(rows, for_update=True)
    kept.apply_gradients(torch.tensor([4]), grads[2][:1])            # another write to row 4: the keep is stale
    ref.apply_gradients(torch.tensor([4]), grads[2][:1])
    kept.apply_gradients(rows, grads[2])
    ref.apply_gradients(rows, grads[2])
    assert torch.equal(torch.cat(kept.blocks), torch.cat(ref.blocks))
    out = kept.read(torch.tensor([-1, 1]), for_update=True)          # a missing row reads zeros; the rest is kept
    assert torch.equal(out[0], torch.zeros(3)) and torch.equal(out[1], ref.read(torch.tensor([1]))[0])
