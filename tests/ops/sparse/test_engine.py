"""The sparse engine: optimizers vs a dense torch reference, admission/eviction, coalescing,
checkpoints, bad inputs, and the torchrec-free CPU path."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from ops.sparse import (AdmitAfter, DynamicTable, EmbeddingCollection, EvictUnseen, FeatureSpec, ReadOnly, SparseAdagrad,
                        SparseAdam, SparseInputError)
from ops.sparse.checkpoint import load_tables, save_tables
from tests.conftest import ROOT, cases_dir


def _single(ids):
    t = torch.as_tensor(ids, dtype=torch.int64)[:, None]
    return t, torch.ones(len(t), dtype=torch.int64)


def _run_sparse_vs_dense(opt_sparse, opt_dense_cls, dense_kw, steps):
    """Train one table and a dense nn.Parameter holding the same touched rows, on the same loss."""
    table = DynamicTable(4, opt_sparse, block_rows=3)   # small blocks: rows span several blocks
    all_ids = torch.tensor([5, 900, 17, 3_000_000_000, 42, 7])
    table.insert(all_ids)
    before = table.weights(all_ids).clone()
    touched = torch.tensor([0, 2, 3])                   # rows 900 (1), 42 (4) and 7 (5) are never in a batch
    dense = torch.nn.Parameter(before[touched].clone())
    opt = opt_dense_cls([dense], **dense_kw)
    target = torch.linspace(-1, 1, 4)
    for s in range(steps):
        sel = torch.tensor([0, 1, 2, s % 3, (s + 1) % 3])           # every touched row, some twice
        batch = all_ids[touched[sel]]
        uids, inv = torch.unique(batch, return_inverse=True)
        rows = table.rows_for(uids, train=True)
        leaf = table.read(rows).requires_grad_(True)
        w = torch.arange(1, len(batch) + 1, dtype=torch.float32)[:, None]
        (w * (leaf[inv] - target * (s + 1)) ** 2).sum().backward()
        table.apply_gradients(rows, leaf.grad)
        opt.zero_grad()
        (w * (dense[sel] - target * (s + 1)) ** 2).sum().backward()
        opt.step()
    return table, all_ids, before, dense.detach(), touched


@pytest.mark.parametrize("opt_sparse,cls,kw", [
    (SparseAdagrad(lr=0.1), torch.optim.Adagrad, {"lr": 0.1}),
    (SparseAdam(lr=0.05), torch.optim.Adam, {"lr": 0.05}),
])
def test_sparse_optimizer_equals_dense_reference_and_leaves_untouched_rows(opt_sparse, cls, kw):
    table, ids, before, dense, touched = _run_sparse_vs_dense(opt_sparse, cls, kw, steps=6)
    after = table.weights(ids)
    torch.testing.assert_close(after[touched], dense, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(after[touched], before[touched])          # it did train
    untouched = torch.tensor([1, 4, 5])
    assert torch.equal(after[untouched], before[untouched])             # bit-identical
    state = table._gather(torch.tensor([table.row_of[int(i)] for i in ids[untouched]]))[:, 4:]
    assert torch.count_nonzero(state) == 0


def test_sparse_adam_keeps_a_step_count_per_row():
    table = DynamicTable(2, SparseAdam(lr=0.1))
    rows = table.insert(torch.tensor([1, 2]))
    table.apply_gradients(rows, torch.ones(2, 2))
    table.apply_gradients(rows[:1], torch.ones(1, 2))
    steps = table._gather(rows)[:, -1]
    assert steps.tolist() == [2.0, 1.0]


def test_admit_after_k_sightings_and_read_only_tables():
    t = DynamicTable(3, SparseAdagrad(), admission=AdmitAfter(3))
    ids = torch.tensor([10, 20])
    for k in range(2):
        rows = t.rows_for(ids, train=True)
        assert rows.tolist() == [-1, -1] and len(t) == 0
        assert torch.equal(t.read(rows), torch.zeros(2, 3))            # not admitted: zeros
    assert (t.rows_for(ids, train=True) >= 0).all() and len(t) == 2   # third sighting admits
    t.rows_for(torch.tensor([30]), train=False)                        # eval never counts or admits
    assert 30 not in t.sightings and len(t) == 2
    ro = DynamicTable(3, SparseAdagrad(), admission=ReadOnly())
    for _ in range(5):
        ro.rows_for(ids, train=True)
    assert len(ro) == 0


def test_eviction_frees_rows_unseen_for_n_steps_and_reuses_slots():
    t = DynamicTable(2, SparseAdagrad(), eviction=EvictUnseen(n_steps=2), block_rows=2)
    t.rows_for(torch.tensor([1, 2, 3]), train=True)
    t.end_step()                                        # step 1
    for _ in range(3):                                  # only id 1 keeps being seen
        t.rows_for(torch.tensor([1]), train=True)
        t.end_step()
    assert sorted(t.row_of) == [1] and t.evicted == 2
    # ids 2, 3 seen in step 0 only; unseen in steps 1 and 2 -> evicted when step 2 ends
    assert [n for _, n in t.size_history] == [0, 3, 3, 1, 1]
    cap = t.capacity
    t.rows_for(torch.tensor([4, 5]), train=True)       # freed slots reused: no new block
    assert t.capacity == cap and len(t) == 3


def test_row_initialisation_depends_only_on_id():
    a, b = DynamicTable(4, SparseAdagrad(), seed=3), DynamicTable(4, SparseAdagrad(), seed=3)
    a.insert(torch.tensor([1, 2, 3]))
    b.insert(torch.tensor([3, 2, 1]))
    assert torch.equal(a.weights([1, 2, 3]), b.weights([1, 2, 3]))
    assert not torch.equal(a.weights([1]), a.weights([2]))


def _specs():
    return [FeatureSpec("user", dim=4), FeatureSpec("item", dim=4), FeatureSpec("genre", dim=4),
            FeatureSpec("year", dim=2, optimizer=SparseAdam())]


def _batch():
    return {"user": _single([1, 2, 1]), "item": _single([1, 7, 8]),
            "genre": (torch.tensor([[3, 4], [5, 0], [0, 0]]), torch.tensor([2, 1, 0])), "year": _single([1995, 1995, 1990])}


def test_coalescing_shares_tables_counts_lookups_and_keeps_features_apart():
    ec = EmbeddingCollection(_specs(), coalesce=True)
    assert len(ec.tables) == 2                           # user/item/genre share one (same attributes); year has its own
    out = ec(_batch())
    assert ec.lookups == 2 and ec.lookups_uncoalesced == 4
    assert len(ec.tables["table0"]) == 2 + 3 + 3         # user 1 and item 1 are different rows
    assert not torch.equal(out["user"][0], out["item"][0])
    assert torch.equal(out["genre"][2], torch.zeros(4))  # empty bag
    g = ec.tables["table0"]
    total = g.weights([3 | (2 << 52)]) + g.weights([4 | (2 << 52)])      # sum pooling: RecIS's default
    torch.testing.assert_close(out["genre"][0], total[0])
    plain = EmbeddingCollection(_specs(), coalesce=False)
    plain_out = plain(_batch())
    assert plain.lookups == 4 and len(plain.tables) == 4
    for f in out:                                        # same ids, same init per id -> same outputs up to namespacing
        assert out[f].shape == plain_out[f].shape


@pytest.mark.parametrize("batch,msg", [
    ({"user": _single([1, -2**63, 3])}, "feature 'user': id -9223372036854775808 is reserved"),
    ({"user": (torch.tensor([[1.0], [2.0]]), torch.ones(2, dtype=torch.int64))}, "feature 'user': ids must be integers"),
    ({"user": (torch.zeros(0, 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))}, "feature 'user': empty batch"),
    ({"item": _single([1])}, "missing feature(s) ['user']"),
    ({"user": (torch.tensor([[1, 2]]), torch.tensor([3]))}, "feature 'user': lengths must be in [0, 2]"),
])
def test_bad_inputs_raise_clear_errors(batch, msg):
    ec = EmbeddingCollection([FeatureSpec("user", dim=2)])
    with pytest.raises(SparseInputError) as e:
        ec(batch)
    assert msg in str(e.value)


def _train(ec, net, opt, steps, start=0):
    g = torch.Generator().manual_seed(0)
    batches = [{"user": _single(torch.randint(0, 50, (16,), generator=g)), "item": _single(torch.randint(0, 80, (16,), generator=g)),
                "genre": (torch.randint(0, 10, (16, 3), generator=g), torch.randint(0, 4, (16,), generator=g)),
                "year": _single(torch.randint(1950, 2000, (16,), generator=g))} for _ in range(12)]
    for s in range(start, start + steps):
        out = ec(batches[s])
        z = net(torch.cat([out[f] for f in ("user", "item", "genre", "year")], 1)).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z, (batches[s]["user"][0][:, 0] % 2).float())
        opt.zero_grad()
        loss.backward()
        opt.step()
        ec.apply_gradients()
        ec.end_step()


def _fresh():
    torch.manual_seed(1)
    specs = [FeatureSpec("user", dim=4, admission=AdmitAfter(2), eviction=EvictUnseen(3)), FeatureSpec("item", dim=4),
             FeatureSpec("genre", dim=4), FeatureSpec("year", dim=2, optimizer=SparseAdam())]
    ec = EmbeddingCollection(specs)
    net = torch.nn.Linear(14, 1)
    return ec, net, torch.optim.Adam(net.parameters(), lr=0.01)


def test_checkpoint_round_trip_is_bit_exact_and_resume_matches_uninterrupted(tmp_path):
    from safetensors.torch import load_file

    ec, net, opt = _fresh()
    _train(ec, net, opt, 12)
    ec2, net2, opt2 = _fresh()
    _train(ec2, net2, opt2, 6)
    path = save_tables(ec2, tmp_path / "tables.safetensors")
    torch.save({"net": net2.state_dict(), "opt": opt2.state_dict()}, tmp_path / "dense.pt")
    saved = load_file(str(path))
    assert saved["table0/ids"].shape[0] == len(ec2.tables["table0"])      # only live rows
    ec3, net3, opt3 = _fresh()
    load_tables(ec3, path)
    for name in ec2.tables:                                               # round trip: bit-exact
        for a, b in zip(ec2.tables[name].live(), ec3.tables[name].live()):
            assert torch.equal(a, b)
        assert ec2.tables[name].sightings == ec3.tables[name].sightings
    dense = torch.load(tmp_path / "dense.pt")
    net3.load_state_dict(dense["net"])
    opt3.load_state_dict(dense["opt"])
    _train(ec3, net3, opt3, 6, start=6)
    assert ec.tables["table0"].evicted > 0                                # eviction happened across the resume
    for name in ec.tables:
        for a, b in zip(ec.tables[name].live(), ec3.tables[name].live()):
            assert torch.equal(a, b)
    for a, b in zip(net.parameters(), net3.parameters()):
        assert torch.equal(a, b)


def test_cpu_path_imports_without_torchrec():
    case = {c["id"]: c for c in json.loads((cases_dir() / "training.json").read_text())}["cpu-path-without-torchrec"]
    assert "sparse" in case["system"]
    code = ("import sys; sys.modules['torchrec'] = None; sys.modules['fbgemm_gpu'] = None\n"   # import of either fails
            "import torch, ops.sparse, ops.sparse.train, ops.sparse.shard, ops.sparse.checkpoint\n"
            "from ops.sparse import EmbeddingCollection, FeatureSpec\n"
            "ec = EmbeddingCollection([FeatureSpec('u', dim=2)])\n"
            "out = ec({'u': (torch.tensor([[3]]), torch.tensor([1]))})\n"
            "print(sorted(m for m in sys.modules if m.startswith(('torchrec', 'fbgemm')) and sys.modules[m] is not None), tuple(out['u'].shape))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] (1, 2)"


def _bag_coefficients(batch, name, pooling):
    """Per position [B, L]: the factor of that id's row in its bag's pooled vector (0 for padding),
    written out from the definitions (sum: w; mean: w / sum w; sqrtn: w / sqrt(sum w^2))."""
    ids, lengths = batch[name][0], batch[name][1]
    mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).to(torch.float32)
    w = (batch[name][2] if len(batch[name]) == 3 else torch.ones(ids.shape)) * mask
    if pooling == "sum":
        return w
    den = w.sum(1, keepdim=True) if pooling == "mean" else (w * w).sum(1, keepdim=True).sqrt()
    return w / torch.where(den == 0, torch.ones_like(den), den)


def _pooled_reference(ec, batch, name):
    """Each bag of the feature's rows pooled per its FeatureSpec, computed with plain torch from the table's weights."""
    tname, slot = ec.slot[name]
    ids = batch[name][0]
    t = ec.tables[tname]
    keys = ids if ec.key_bits(tname) == 63 else ids | (slot << 52)
    rows = t.weights(keys.reshape(-1)).reshape(*ids.shape, t.dim)
    return (rows * _bag_coefficients(batch, name, ec.features[name].pooling)[..., None]).sum(1)


@pytest.mark.parametrize("pooling,weighted", [("mean", False), ("sum", False), ("sqrtn", False), ("sum", True),
                                              ("mean", True), ("sqrtn", True)])
@pytest.mark.parametrize("kind", ["single", "uniform", "mixed", "mixed widths"])
def test_pooling_fast_paths_match_plain_torch(kind, pooling, weighted):
    g = torch.Generator().manual_seed(3)
    B = 32
    ec = EmbeddingCollection([FeatureSpec("a", dim=4, pooling=pooling), FeatureSpec("b", dim=4, pooling=pooling),
                              FeatureSpec("c", dim=4, coalesce=False, pooling=pooling)])
    if kind == "single":
        batch = {n: (torch.randint(0, 40, (B, 1), generator=g), torch.ones(B, dtype=torch.int64)) for n in "abc"}
    elif kind == "uniform":
        batch = {n: (torch.randint(0, 40, (B, 3), generator=g), torch.full((B,), 3)) for n in "abc"}
    elif kind == "mixed":
        batch = {n: (torch.randint(0, 40, (B, 3), generator=g), torch.randint(0, 4, (B,), generator=g)) for n in "abc"}
    else:
        batch = {"a": (torch.randint(0, 40, (B, 1), generator=g), torch.ones(B, dtype=torch.int64)),
                 "b": (torch.randint(0, 40, (B, 4), generator=g), torch.full((B,), 4)),
                 "c": (torch.randint(0, 40, (B, 2), generator=g), torch.randint(0, 3, (B,), generator=g))}
    if weighted:                                         # per-id weights in [0.5, 2); padding weights are ignored
        batch = {n: (ids, lens, 0.5 + 1.5 * torch.rand(ids.shape, generator=g)) for n, (ids, lens) in batch.items()}
    out = ec(batch)                                      # admits every id
    for n in "abc":
        torch.testing.assert_close(out[n], _pooled_reference(ec, batch, n), rtol=1e-6, atol=1e-7)
    # gradients: d(sum(out * w)) / d(row) = sum over the row's positions of w[b] * (its bag coefficient)
    w = {n: torch.randn(B, 4, generator=g) for n in "abc"}
    sum((out[n] * w[n]).sum() for n in "abc").backward()
    for tname, rows, leaf in ec._pending:
        t = ec.tables[tname]
        want = torch.zeros_like(leaf)
        for n in ec.features_of(tname):
            ids, lengths = batch[n][0], batch[n][1]
            coef = _bag_coefficients(batch, n, pooling)
            keys = ids if ec.key_bits(tname) == 63 else ids | (ec.slot[n][1] << 52)
            r = t.id_map.get(keys.reshape(-1).numpy())
            pos = {int(x): i for i, x in enumerate(rows.tolist())}
            for p, row in enumerate(r.tolist()):
                b, j = divmod(p, ids.shape[1])
                if j < lengths[b]:
                    want[pos[row]] += w[n][b] * coef[b, j]
        torch.testing.assert_close(leaf.grad, want, rtol=1e-5, atol=1e-7)
    ec.apply_gradients()


def test_padding_ids_are_checked_on_the_fast_path():
    ec = EmbeddingCollection([FeatureSpec("user", dim=2), FeatureSpec("item", dim=2)])     # coalesced: ids in [0, 2**52)
    with pytest.raises(SparseInputError, match="feature 'user': id -1 outside"):
        ec({"user": (torch.tensor([[1, -1], [2, 3]]), torch.tensor([1, 2])), "item": _single([1, 2])})
