"""RecIS semantics in the sparse engine (issue 44): one optimizer update per row per step, pooling
modes, SparseAdamW, shared tables, initialisers, signed IDs. Each is checked against a dense torch
reference or values written out from the definition."""

import pytest
import torch

from ops.sparse import EmbeddingCollection, FeatureSpec, SparseAdagrad, SparseInputError


def _single(ids):
    t = torch.as_tensor(ids, dtype=torch.int64)[:, None]
    return t, torch.ones(len(t), dtype=torch.int64)


def test_a_table_looked_up_twice_in_a_step_gets_one_update_of_the_summed_gradient():
    """Issue 44 item 1: two lookups of one table before apply_gradients -> one Adagrad step on the sum
    of their gradients, equal to torch.optim.Adagrad on a dense copy of the rows."""
    ec = EmbeddingCollection([FeatureSpec("a", dim=3, optimizer=SparseAdagrad(lr=0.1))])
    ids = torch.tensor([5, 6, 9])
    first, second = {"a": _single([5, 6])}, {"a": _single([5, 9, 5])}
    ec(first), ec(second)                                 # admit the rows, then read their initial values
    ec._pending.clear()
    t = ec.tables["table0"]
    dense = torch.nn.Parameter(t.weights(ids).clone())
    opt = torch.optim.Adagrad([dense], lr=0.1)
    g = torch.Generator().manual_seed(0)
    c1, c2 = torch.randn(2, 3, generator=g), torch.randn(3, 3, generator=g)
    for step in range(3):
        out1, out2 = ec(first)["a"], ec(second)["a"]       # two lookups of the same table in one step
        ((out1 * c1).sum() + (out2 ** 2 * c2).sum()).backward()
        ec.apply_gradients()
        ec.end_step()
        d1, d2 = dense[torch.tensor([0, 1])], dense[torch.tensor([0, 2, 0])]
        opt.zero_grad()
        ((d1 * c1).sum() + (d2 ** 2 * c2).sum()).backward()
        opt.step()
        torch.testing.assert_close(t.weights(ids), dense.detach(), rtol=1e-6, atol=1e-7)
        assert t.weights([5])[0, 0] != t.weights([6])[0, 0]


def test_pooling_is_validated_and_weights_must_match_the_ids():
    with pytest.raises(ValueError, match="feature 'a': pooling must be one of"):
        FeatureSpec("a", pooling="tile")
    ec = EmbeddingCollection([FeatureSpec("a", dim=2)])
    ids, lengths = torch.tensor([[1, 2]]), torch.tensor([2])
    with pytest.raises(SparseInputError, match="feature 'a': weights must be a float tensor shaped like its ids"):
        ec({"a": (ids, lengths, torch.ones(1, 3))})
    with pytest.raises(SparseInputError, match="feature 'a': weights must be a float tensor"):
        ec({"a": (ids, lengths, torch.ones(1, 2, dtype=torch.int64))})


def test_deepfm_keeps_mean_pooling_and_the_engine_defaults_to_sum():
    from ops.sparse.config import TrainConfig
    from ops.sparse.train import CTRModel

    assert FeatureSpec("x").pooling == "sum"
    m = CTRModel(["genres"], TrainConfig(dim=2))
    batch = {"genres": (torch.tensor([[1, 2]]), torch.tensor([2]))}
    out = m.ec(batch, train=True)["genres"]
    t = m.ec.tables["table0"]
    torch.testing.assert_close(out[0], t.weights([1, 2]).mean(0))
    s = CTRModel(["genres"], TrainConfig(dim=2), feature_kw={"pooling": "sum"})
    torch.testing.assert_close(s.ec(batch, train=True)["genres"][0], s.ec.tables["table0"].weights([1, 2]).sum(0))


def _adamw_reference(bias_correction):
    """A table with SparseAdamW trained 6 steps: ids 1, 2 touched every step, id 3 only from step 3;
    beside it torch.optim.AdamW on dense copies (id 3 its own parameter, stepped only when touched;
    per_table: its step count starts at the table's). Returns (table weights, reference) per id."""
    from ops.sparse import DynamicTable, SparseAdamW

    opt = SparseAdamW(lr=0.05, weight_decay=0.1, bias_correction=bias_correction)
    t = DynamicTable(3, opt, block_rows=2)
    t.insert(torch.tensor([1, 2, 3]))
    both = torch.nn.Parameter(t.weights([1, 2]).clone())
    late = torch.nn.Parameter(t.weights([3]).clone())
    kw = dict(lr=0.05, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    o_both, o_late = torch.optim.AdamW([both], **kw), torch.optim.AdamW([late], **kw)
    target = torch.tensor([0.5, -1.0, 2.0])
    for step in range(6):
        ids = torch.tensor([1, 2, 3] if step >= 3 else [1, 2])
        rows = t.rows_for(ids, train=True)
        leaf = t.read(rows, for_update=True).requires_grad_(True)
        ((leaf - target * (step + 1)) ** 2).sum().backward()
        t.apply_gradients(rows, leaf.grad)
        t.end_step()
        o_both.zero_grad()
        ((both - target * (step + 1)) ** 2).sum().backward()
        o_both.step()
        if step >= 3:
            if step == 3 and bias_correction == "per_table":   # the table's count, not the row's
                o_late.state[late] = {"step": torch.tensor(3.0), "exp_avg": torch.zeros_like(late),
                                      "exp_avg_sq": torch.zeros_like(late)}
            o_late.zero_grad()
            ((late - target * (step + 1)) ** 2).sum().backward()
            o_late.step()
    return t.weights([1, 2, 3]), torch.cat([both.detach(), late.detach()])


@pytest.mark.parametrize("bias_correction", ["per_table", "per_row"])
def test_sparse_adamw_equals_dense_adamw_on_the_touched_rows(bias_correction):
    """Issue 44 item 3: decoupled decay and the Adam step on touched rows only, bias correction per
    table (RecIS) or per row, against torch.optim.AdamW."""
    got, want = _adamw_reference(bias_correction)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_bias_correction_count_per_table_moves_a_late_row_by_3_16_lr():
    """Issue 44: Adam at lr 1e-3, a row first updated at step 10,000 moves 3.16e-3 with RecIS's
    per-table count and 1.0e-3 with a per-row count."""
    from ops.sparse import DynamicTable, SparseAdam, SparseAdamW

    moves = {}
    for name, opt in [("table", SparseAdamW(lr=1e-3, weight_decay=0.0)), ("row", SparseAdam(lr=1e-3)),
                      ("table adam", SparseAdam(lr=1e-3, bias_correction="per_table"))]:
        t = DynamicTable(2, opt)
        t.step = 9_999                                   # the table has trained 9,999 steps
        rows = t.rows_for(torch.tensor([7]), train=True)
        before = t.weights([7]).clone()
        t.apply_gradients(rows, torch.tensor([[0.3, -2.0]]))
        moves[name] = (before - t.weights([7])).abs()[0]
    torch.testing.assert_close(moves["row"], torch.full((2,), 1.0e-3), rtol=1e-4, atol=0)
    want = 1e-3 * 0.1 / (1 - 0.9 ** 10_000) / (0.001 ** 0.5 / (1 - 0.999 ** 10_000) ** 0.5)   # = 3.1631e-3
    torch.testing.assert_close(moves["table"], torch.full((2,), want), rtol=1e-4, atol=0)
    torch.testing.assert_close(moves["table adam"], moves["table"])
    assert abs(want - 3.16e-3) < 1e-5
    with pytest.raises(ValueError, match="SparseAdamW.bias_correction must be one of"):
        SparseAdamW(bias_correction="global")


def test_shared_tables_look_up_one_row_per_id_for_both_features():
    """Issue 44 item 4: two features with one shared_name read and train the same rows."""
    specs = [FeatureSpec("click_item", dim=2, shared_name="item", optimizer=SparseAdagrad(lr=0.1)),
             FeatureSpec("buy_item", dim=2, shared_name="item", optimizer=SparseAdagrad(lr=0.1), pooling="mean"),
             FeatureSpec("user", dim=2, optimizer=SparseAdagrad(lr=0.1))]
    for coalesce in (True, False):
        ec = EmbeddingCollection(specs, coalesce=coalesce)
        assert ec.slot["click_item"] == ec.slot["buy_item"] != ec.slot["user"]
        out = ec({"click_item": _single([7, 8]), "buy_item": _single([7, 9]), "user": _single([7, 7])})
        torch.testing.assert_close(out["click_item"][0], out["buy_item"][0])     # id 7: one row
        user_before = out["user"][0].detach().clone()
        tname = ec.slot["click_item"][0]
        before = out["click_item"][0].detach().clone()
        (out["click_item"][0].sum() + out["buy_item"][0].sum()).backward()
        ec.apply_gradients()
        t = ec.tables[tname]
        key = 7 if ec.key_bits(tname) == 63 else 7 | (ec.slot["click_item"][1] << 52)
        # one Adagrad step on the summed gradient 2: w - 0.1 * 2 / sqrt(4)
        torch.testing.assert_close(t.weights([key])[0], before - 0.1)
        ut, us = ec.slot["user"]
        ukey = 7 if ec.key_bits(ut) == 63 else 7 | (us << 52)
        assert torch.equal(ec.tables[ut].weights([ukey])[0], user_before)     # user 7 is another row: untouched
    with pytest.raises(ValueError, match="share rows .shared_name 'item'. but their tables differ"):
        EmbeddingCollection([FeatureSpec("a", dim=2, shared_name="item"), FeatureSpec("b", dim=3, shared_name="item")])


@pytest.mark.parametrize("init", ["zeros", "uniform", "normal", "truncated_normal"])
def test_initialisers_follow_their_distribution_and_depend_only_on_seed_and_id(init):
    from ops.sparse.table import init_rows

    ids = torch.arange(20_000) * 7919 + 3
    w = init_rows(ids, 8, seed=1, scale=0.05, kind=init).double()
    assert torch.equal(init_rows(ids.flip(0), 8, 1, 0.05, init), init_rows(ids, 8, 1, 0.05, init).flip(0))
    if init == "zeros":
        assert not w.any()
        return
    std = {"uniform": 0.05 / 3 ** 0.5, "normal": 0.05, "truncated_normal": 0.05 * 0.8796}[init]   # 0.8796: N(0,1) cut at +-2
    assert abs(float(w.mean())) < 3e-4 and abs(float(w.std()) / std - 1) < 0.01
    bound = {"uniform": 0.05, "truncated_normal": 0.1, "normal": float("inf")}[init]
    assert float(w.abs().max()) <= bound
    if init == "normal":
        assert float(w.abs().max()) > 0.18                  # the normal's tail reaches past 3.6 std in 160k draws
    ec = EmbeddingCollection([FeatureSpec("a", dim=8, init=init, init_scale=0.05)], seed=1)
    ec({"a": _single([3, 10])})
    torch.testing.assert_close(ec.tables["table0"].weights([3, 10]), init_rows(torch.tensor([3, 10]), 8, 1, 0.05, init))


def test_signed_64_bit_ids_and_string_hashes_get_their_own_rows():
    """Issue 44 item 4: negative int64 IDs (RecIS's string hashes) are keys of a one-feature table;
    a coalesced table still refuses them, naming the feature and the remedy."""
    from ops.sparse.data import hash_ids, stable_id

    words = ["movie:1", "movie:2", "user:alice", "user:bob", "genre:Drama", "x" * 100]
    h = hash_ids(words)
    assert h.dtype.name == "int64" and (h < 0).any() and (h > 0).any()             # signed: some negative
    assert hash_ids(words, bits=52).tolist() == [stable_id(w) for w in words]
    assert hash_ids(["movie:1"]).tolist() == [h[0]]                                   # stable
    with pytest.raises(TypeError, match="value 1 is int 7"):
        hash_ids(["a", 7])
    ids = torch.from_numpy(h)
    extremes = torch.tensor([-2**63 + 2, -1, 2**63 - 1], dtype=torch.int64)
    ec = EmbeddingCollection([FeatureSpec("title", dim=3, coalesce=False), FeatureSpec("user", dim=3), FeatureSpec("age", dim=3)])
    both = torch.cat([ids, extremes])
    out = ec({"title": _single(both), "user": _single(torch.arange(9)), "age": _single(torch.arange(9))})["title"]
    t = ec.tables[ec.slot["title"][0]]
    assert len(t) == 9 and sorted(t.row_of) == sorted(both.tolist())
    torch.testing.assert_close(out, t.weights(both))
    assert len(set(t.rows_for(both, train=False).tolist())) == 9                      # nine distinct rows
    with pytest.raises(SparseInputError, match="feature 'user': id -5 outside .0, 2\\*\\*52.*own table"):
        ec({"title": _single([1]), "user": _single([-5]), "age": _single([1])})
    with pytest.raises(SparseInputError, match="is reserved"):
        ec({"title": _single([-2**63]), "user": _single([1]), "age": _single([1])})
