"""Frequency admission counts every occurrence, and its pending counters expire (issue 42 item 4)."""

import torch

from ops.sparse import AdmitAfter, DynamicTable, EmbeddingCollection, EvictUnseen, FeatureSpec, SparseAdagrad
from ops.sparse.checkpoint import load_tables, save_tables


def _single(ids):
    t = torch.as_tensor(ids, dtype=torch.int64)[:, None]
    return t, torch.ones(len(t), dtype=torch.int64)


def _step(ec, ids):
    out = ec({"item": _single(ids)}, train=True)
    out["item"].sum().backward()
    ec.apply_gradients()
    ec.end_step()


def test_admission_counts_every_occurrence_and_pending_counters_expire():
    """Case sparse-admission-counts-duplicates: AdmitAfter(2), id 42 in 3 samples of one batch is
    admitted by that batch; then 20 steps of 5,000 one-off ids under EvictUnseen(2) leave at most
    the last 3 steps' ids pending (10,000 after each end_step: the steps t-1 and t), not 100,000."""
    ec = EmbeddingCollection([FeatureSpec("item", dim=4, admission=AdmitAfter(2), eviction=EvictUnseen(2))])
    t = ec.tables["table0"]
    _step(ec, [42, 7, 42, 9, 42])
    assert 42 in t.row_of and len(t) == 1                      # 3 occurrences >= 2: admitted in that batch
    assert dict(t.sightings) == {7: 1, 9: 1}                   # the one-off ids are pending, counted once
    pending = []
    for s in range(20):
        _step(ec, torch.arange(5_000) + 1_000_000 + 5_000 * s)  # never seen before, never again
        pending.append(len(t.pending))
    assert max(pending) == 10_000 and pending[-1] == 10_000     # bounded: two steps' worth of one-off ids
    assert t.pending_expired == 18 * 5_000 + 2                  # the rest (and 7, 9) expired
    assert len(t) == 0 and t.evicted == 1                       # 42's row was evicted too: unseen for 20 steps

    # without an eviction policy nothing expires (the documented behaviour): all 100,000 stay pending
    keep = EmbeddingCollection([FeatureSpec("item", dim=4, admission=AdmitAfter(2))])
    for s in range(20):
        _step(keep, torch.arange(5_000) + 5_000 * s)
    assert len(keep.tables["table0"].pending) == 100_000


def test_repeats_inside_a_multi_hot_bag_count_and_an_expired_counter_restarts():
    ec = EmbeddingCollection([FeatureSpec("tags", dim=3, admission=AdmitAfter(3), eviction=EvictUnseen(1))])
    t = ec.tables["table0"]
    ids = torch.tensor([[5, 5, 6], [5, 0, 0]])                  # 5 three times (twice in one bag), 6 once
    ec({"tags": (ids, torch.tensor([3, 1]))}, train=True)
    assert 5 in t.row_of and dict(t.sightings) == {6: 1}
    ec.end_step()                                               # step 1: 6 last sighted at 0, kept (0 >= 1 - 1)
    ec({"tags": (torch.tensor([[6]]), torch.tensor([1]))}, train=True)
    assert dict(t.sightings) == {6: 2}                          # still counting
    for _ in range(3):
        ec.end_step()                                           # 6 unseen for 3 > 1 steps: its counter expires
    assert dict(t.sightings) == {}
    ec({"tags": (torch.tensor([[6]]), torch.tensor([1]))}, train=True)
    assert dict(t.sightings) == {6: 1} and 6 not in t.row_of   # starts again from one sighting


def test_a_table_counts_the_given_occurrences_and_eval_never_counts():
    t = DynamicTable(2, SparseAdagrad(), admission=AdmitAfter(4))
    t.rows_for(torch.tensor([1, 2]), train=True, counts=torch.tensor([3, 1]))
    assert dict(t.sightings) == {1: 3, 2: 1}
    t.rows_for(torch.tensor([1, 2]), train=False, counts=torch.tensor([9, 9]))
    assert dict(t.sightings) == {1: 3, 2: 1}
    assert t.rows_for(torch.tensor([1]), train=True).tolist() == [0] and dict(t.sightings) == {2: 1}


def test_pending_counters_and_their_last_sighting_survive_a_checkpoint(tmp_path):
    spec = [FeatureSpec("item", dim=2, admission=AdmitAfter(3), eviction=EvictUnseen(2))]
    ec = EmbeddingCollection(spec)
    _step(ec, [1, 2, 2])
    _step(ec, [3])
    save_tables(ec, tmp_path / "t.safetensors")
    back = EmbeddingCollection(spec)
    load_tables(back, tmp_path / "t.safetensors")
    tb = back.tables["table0"]
    assert dict(tb.sightings) == {1: 1, 2: 2, 3: 1}
    assert tb.pending.last_sighted() == {1: 0, 2: 0, 3: 1}
    for e in (ec, back):
        e.end_step()                                            # step 3: the counters of step 0 expire
    assert dict(tb.sightings) == dict(ec.tables["table0"].sightings) == {3: 1}


def test_pending_counters_match_a_reference_over_long_random_tails():
    """Issue 42 review, property check: 6 random streams (100 steps each; a repeated head, signed 62-bit
    one-off ids and small ids, several occurrences per batch) against a plain-dict model of the rule
    (every occurrence counts, admitted at the k-th, rows and counters unseen for more than n steps
    dropped): pending counts and admitted ids equal the model's after every step, and every pending
    counter was sighted within the last n + 1 steps (bounded by the tail's recent ids)."""
    import random

    import numpy as np

    from ops.sparse.table import DynamicTable

    for trial in range(6):
        rng = random.Random(trial)
        k, n = rng.randint(1, 4), rng.randint(0, 5)
        t = DynamicTable(2, SparseAdagrad(lr=0.1), admission=AdmitAfter(k), eviction=EvictUnseen(n), block_rows=64)
        pend, rows = {}, {}
        for step in range(100):
            ids = [rng.choice([1, 2, 3, -5]) for _ in range(rng.randint(0, 4))] + \
                  [rng.randint(-2**62, 2**62) if rng.random() < 0.5 else rng.randint(0, 300) for _ in range(rng.randint(0, 30))]
            u, c = np.unique(np.array(ids, dtype=np.int64), return_counts=True)
            t.rows_for(torch.from_numpy(u), train=True, counts=torch.from_numpy(c.astype(np.int64)))
            for x, cc in zip(u.tolist(), c.tolist()):
                if x in rows:
                    rows[x] = step
                elif pend.get(x, (0, 0))[0] + cc >= k:
                    rows[x] = step
                    pend.pop(x, None)
                else:
                    pend[x] = (pend.get(x, (0, 0))[0] + cc, step)
            t.end_step()
            rows = {x: v for x, v in rows.items() if v >= step + 1 - n}
            pend = {x: v for x, v in pend.items() if v[1] >= step + 1 - n}
            assert dict(t.pending.items()) == {x: v[0] for x, v in pend.items()}, (trial, step)
            assert set(t.row_of) == set(rows), (trial, step)
            assert all(v >= step + 1 - n for v in t.pending.last_sighted().values())


def test_a_read_only_table_keeps_no_counters():
    """Issue 42 review: a ReadOnly table looked up with train=True counted every unseen id it would never
    admit (10,000 pending counters after 10 steps of 1,000 fresh ids, growing without bound)."""
    from ops.sparse import ReadOnly
    from ops.sparse.table import DynamicTable

    t = DynamicTable(2, SparseAdagrad(lr=0.1), admission=ReadOnly())
    for s in range(10):
        assert (t.rows_for(torch.arange(1000) + 1000 * s, train=True) == -1).all()
        t.end_step()
    assert len(t.pending) == 0 and len(t) == 0
