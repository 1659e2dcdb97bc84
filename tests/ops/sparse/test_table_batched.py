"""The batched storage paths of DynamicTable (batched allocation, block-grouped gather/scatter, C-level
dict updates, the AdmitAll fast path) give the same rows, values and bookkeeping as the one-id-at-a-time
rules they replace."""

import torch

from ops.sparse.optim import SparseAdagrad
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
