"""Sparse checkpoints that record their sharding and load at any world size, and 64-bit IDs end to
end (case ``sparse-checkpoint-reshard``): a dynamic table with IDs {0, 2**40+7, 2**63-1} plus a few
hundred random 64-bit IDs and SparseAdam state, some IDs evicted, trained and saved sharded on 4
gloo processes, loads at world size 2 (a forward pass on 2 processes), 1 and 8 with every live ID's
embedding and optimizer row identical, evicted IDs absent, and a missing or corrupt rank file named.
"""

import datetime
import json
import shutil

import pytest
import torch

from tests.conftest import join_or_kill, cases_dir

SPECIAL = [0, 2**40 + 7, 2**63 - 1]
DIM, STEPS, SAVE_WORLD = 4, 6, 4


def _ids():
    """(ids seen every step: SPECIAL + 240 random 64-bit ids, ids seen in steps 0-1 only: 80)."""
    g = torch.Generator().manual_seed(7)
    rand = torch.randint(0, 2**63 - 1, (320,), generator=g, dtype=torch.int64)
    rand[:20] = torch.randint(0, 1000, (20,), generator=g)          # some small ids too
    kept = torch.cat([torch.tensor(SPECIAL, dtype=torch.int64), rand[80:]])
    return kept, rand[:80]


def _specs():
    from ops.sparse import EvictUnseen, FeatureSpec, SparseAdam

    return [FeatureSpec("item", dim=DIM, optimizer=SparseAdam(lr=0.05), eviction=EvictUnseen(2))]


def _step_ids(step):
    kept, early = _ids()
    return torch.cat([kept, early]) if step < 2 else kept


def _target(ids):
    return ((ids % 97).to(torch.float32)[:, None] / 97.0).expand(-1, DIM)


def _worker(rank, world, init_file, out_dir):
    import torch.distributed as dist

    from ops.sparse.checkpoint import load_sharded, save_sharded
    from ops.sparse.shard import ShardedEmbeddingCollection

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        ec = ShardedEmbeddingCollection(_specs(), seed=3)
        for s in range(STEPS):
            ids = _step_ids(s)[rank::world]
            out = ec({"item": (ids[:, None], torch.ones(len(ids), dtype=torch.int64))})["item"]
            ((out - _target(ids)) ** 2).sum().backward()
            ec.apply_gradients()
            ec.end_step()
        save_sharded(ec, f"{out_dir}/ckpt")
        torch.save(dict(zip(("ids", "rows", "last_seen"), ec.tables["table0"].live())), f"{out_dir}/ref{rank}.pt")
        g2 = dist.new_group([0, 1])
        if rank < 2:                                             # load at world size 2, then a forward pass
            ec2 = ShardedEmbeddingCollection(_specs(), seed=3, group=g2)
            load_sharded(ec2, f"{out_dir}/ckpt")
            kept, early = _ids()
            ids = torch.cat([kept, early])
            out = ec2({"item": (ids[:, None], torch.ones(len(ids), dtype=torch.int64))}, train=False)["item"]
            torch.save({"live": dict(zip(("ids", "rows", "last_seen"), ec2.tables["table0"].live())), "ids": ids,
                        "forward": out, "step": ec2.tables["table0"].step}, f"{out_dir}/w2_rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Train and save at world size 4 (4 gloo processes), load at world size 2 on ranks 0 and 1."""
    d = tmp_path_factory.mktemp("sparse-reshard")
    ctx = torch.multiprocessing.start_processes(_worker, args=(SAVE_WORLD, str(d / "store"), str(d)), nprocs=SAVE_WORLD,
                                                join=False, start_method="spawn")
    join_or_kill(ctx, 240, "the 4-process save")
    refs = [torch.load(d / f"ref{r}.pt") for r in range(SAVE_WORLD)]
    ref = {}
    for r, x in enumerate(refs):
        assert len(x["ids"]) and ((x["ids"] % SAVE_WORLD) == r).all()       # each rank held its own ids
        for i, row, seen in zip(x["ids"].tolist(), x["rows"], x["last_seen"].tolist()):
            ref[i] = (row, seen)
    return d, ref


def _by_id(live):
    ids, rows, seen = live
    return {i: (r, s) for i, r, s in zip(ids.tolist(), rows, seen.tolist())}


def _assert_same(got: dict, ref: dict):
    assert sorted(got) == sorted(ref)
    for i, (row, seen) in ref.items():
        assert torch.equal(got[i][0], row), f"id {i}: row differs"      # embedding AND SparseAdam m, v, step
        assert got[i][1] == seen


def test_case_ids_trained_and_some_evicted(saved):
    case = {c["id"]: c for c in json.loads((cases_dir() / "training.json").read_text())}["sparse-checkpoint-reshard"]
    assert "2**63-1" in case["input"] and "world size 4" in case["input"]
    _, ref = saved
    kept, early = _ids()
    assert sorted(ref) == sorted(kept.tolist())                   # every early-only id was evicted before the save
    assert all(i in ref for i in SPECIAL)
    t = torch.stack([ref[i][0][-1] for i in SPECIAL])             # SparseAdam's per-row step count
    assert t.tolist() == [float(STEPS)] * 3


def test_manifest_records_the_sharding(saved):
    from ops.sparse.checkpoint import read_manifest

    d, ref = saved
    m = read_manifest(d / "ckpt")
    assert m["world_size"] == 4 and m["sharding"] == "key % world_size"
    t = m["tables"]["table0"]
    assert t["dim"] == DIM and t["dtype"] == "float32" and t["id_dtype"] == "int64" and t["features"] == ["item"]
    assert t["optimizer"]["name"] == "SparseAdam" and t["optimizer"]["slots"] == [["m", DIM], ["v", DIM], ["step", 1]]
    assert t["width"] == DIM + 2 * DIM + 1 and t["step"] == STEPS
    assert [f["rank"] for f in m["files"]] == [0, 1, 2, 3]
    for f in m["files"]:
        ids = sorted(i for i in ref if i % 4 == f["rank"])
        e = f["tables"]["table0"]
        assert e["rows"] == len(ids) and e["id_min"] == ids[0] and e["id_max"] == ids[-1]
        assert len(f["sha256"]) == 64
    assert sum(f["tables"]["table0"]["rows"] for f in m["files"]) == len(ref)


def test_load_at_world_size_2_on_two_processes_then_forward(saved):
    d, ref = saved
    parts = [torch.load(d / f"w2_rank{r}.pt") for r in range(2)]
    got = {}
    for r, p in enumerate(parts):
        assert ((p["live"]["ids"] % 2) == r).all() and p["step"] == STEPS
        got.update(_by_id(tuple(p["live"].values())))
    _assert_same(got, ref)
    kept, early = _ids()
    for p in parts:                                               # both ranks looked up every id
        fwd = dict(zip(p["ids"].tolist(), p["forward"]))
        for i in kept.tolist():
            assert torch.equal(fwd[i], ref[i][0][:DIM])           # the trained vector
        for i in early.tolist():
            assert torch.equal(fwd[i], torch.zeros(DIM))          # evicted before the save: no row


@pytest.mark.parametrize("world", [1, 8])
def test_load_at_world_size_1_and_8(saved, world):
    from ops.sparse import EmbeddingCollection
    from ops.sparse.checkpoint import load_sharded

    d, ref = saved
    got = {}
    for r in range(world):
        ec = EmbeddingCollection(_specs(), seed=3)
        load_sharded(ec, d / "ckpt", rank=r, world=world)
        t = ec.tables["table0"]
        ids = t.live()[0]
        assert ((ids % world) == r).all() and t.step == STEPS
        got.update(_by_id(t.live()))
    _assert_same(got, ref)
    if world == 1:                                               # forward pass after loading
        kept, early = _ids()
        out = ec({"item": (kept[:, None], torch.ones(len(kept), dtype=torch.int64))}, train=False)["item"]
        assert torch.equal(out, torch.stack([ref[i][0][:DIM] for i in kept.tolist()]))
        for i in early.tolist():
            assert i not in t.row_of


def test_missing_or_corrupt_rank_file_raises_naming_it(saved, tmp_path):
    from ops.sparse import EmbeddingCollection
    from ops.sparse.checkpoint import SparseCheckpointError, load_sharded, read_manifest

    d, _ = saved
    names = [f["file"] for f in read_manifest(d / "ckpt")["files"]]
    missing = shutil.copytree(d / "ckpt", tmp_path / "missing")
    (missing / names[2]).unlink()
    with pytest.raises(SparseCheckpointError, match=names[2]):
        load_sharded(EmbeddingCollection(_specs(), seed=3), missing)
    corrupt = shutil.copytree(d / "ckpt", tmp_path / "corrupt")
    raw = bytearray((corrupt / names[1]).read_bytes())
    raw[-5] ^= 0xFF                                               # one flipped bit in the row data
    (corrupt / names[1]).write_bytes(bytes(raw))
    with pytest.raises(SparseCheckpointError, match=names[1]):
        load_sharded(EmbeddingCollection(_specs(), seed=3), corrupt)
    truncated = shutil.copytree(d / "ckpt", tmp_path / "truncated")
    (truncated / names[3]).write_bytes((truncated / names[3]).read_bytes()[:100])
    for rank, world in ((1, 2), (0, 1)):                          # rank 1 of 2 reads files 1 and 3
        with pytest.raises(SparseCheckpointError, match=names[3]):
            load_sharded(EmbeddingCollection(_specs(), seed=3), truncated, rank=rank, world=world)
    nomanifest = shutil.copytree(d / "ckpt", tmp_path / "nomanifest")
    for p in nomanifest.glob("*.json"):
        p.unlink()
    with pytest.raises(SparseCheckpointError, match="manifest"):
        load_sharded(EmbeddingCollection(_specs(), seed=3), nomanifest)


def test_a_rank_file_loaded_at_another_world_size_raises_instead_of_dropping_ids(saved):
    from ops.sparse import EmbeddingCollection
    from ops.sparse.checkpoint import SparseCheckpointError, load_tables, read_manifest

    d, _ = saved
    first = d / "ckpt" / read_manifest(d / "ckpt")["files"][0]["file"]
    with pytest.raises(SparseCheckpointError, match="rank 0 of 4.*load_sharded"):
        load_tables(EmbeddingCollection(_specs(), seed=3), first)


def test_loading_into_other_features_or_optimizer_raises_naming_the_table(saved):
    from ops.sparse import EmbeddingCollection, FeatureSpec, SparseAdagrad, SparseAdam
    from ops.sparse.checkpoint import SparseCheckpointError, load_sharded

    d, _ = saved
    with pytest.raises(SparseCheckpointError, match="table 'table0'.*features"):
        load_sharded(EmbeddingCollection([FeatureSpec("other", dim=DIM, optimizer=SparseAdam())]), d / "ckpt")
    with pytest.raises(SparseCheckpointError, match="table 'table0'.*SparseAdam"):
        load_sharded(EmbeddingCollection([FeatureSpec("item", dim=DIM, optimizer=SparseAdagrad())]), d / "ckpt")


# -- 64-bit ids ---------------------------------------------------------------------------------------

def test_64_bit_ids_lookup_update_save_load_in_one_process(tmp_path):
    from ops.sparse import EmbeddingCollection, FeatureSpec, SparseAdagrad
    from ops.sparse.checkpoint import load_tables, save_tables
    from ops.sparse.table import init_rows

    ids = torch.tensor([0, 2**52, 2**62 + 3, 2**63 - 1], dtype=torch.int64)
    batch = {"h": (ids[:, None], torch.ones(4, dtype=torch.int64))}
    ec = EmbeddingCollection([FeatureSpec("h", dim=3, optimizer=SparseAdagrad(lr=0.1))], seed=5)
    before = ec(batch)["h"]
    assert torch.equal(before, init_rows(ids, 3, 5, 0.01))        # distinct rows, initialised from the full id
    assert len({tuple(r.tolist()) for r in before}) == 4
    ec(batch)["h"].sum().backward()
    ec.apply_gradients()
    after = ec.tables["table0"].weights(ids)
    torch.testing.assert_close(after, before - 0.1, rtol=0, atol=1e-6)   # Adagrad's first step: w - lr * sign(g)
    assert sorted(ec.tables["table0"].row_of) == ids.tolist()
    path = save_tables(ec, tmp_path / "t.safetensors")
    ec2 = EmbeddingCollection([FeatureSpec("h", dim=3, optimizer=SparseAdagrad(lr=0.1))], seed=5)
    load_tables(ec2, path)
    assert torch.equal(ec2(batch, train=False)["h"], after)


def test_ids_beyond_a_coalesced_tables_key_space_raise_at_ingestion():
    import numpy as np

    from ops.sparse import EmbeddingCollection, FeatureSpec, SparseInputError

    specs = [FeatureSpec("user", dim=2), FeatureSpec("item", dim=2)]     # same attributes: one coalesced table
    ec = EmbeddingCollection(specs)
    assert len(ec.tables) == 1
    ok = {"user": (torch.tensor([[2**52 - 1]]), torch.ones(1, dtype=torch.int64)), "item": (torch.tensor([[5]]), torch.ones(1, dtype=torch.int64))}
    ec(ok)
    bad = dict(ok, item=(torch.tensor([[2**52 + 9]]), torch.ones(1, dtype=torch.int64)))
    with pytest.raises(SparseInputError, match=rf"feature 'item': id {2**52 + 9} outside \[0, 2\*\*52\).*coalesce=False"):
        ec(bad)
    own = EmbeddingCollection([FeatureSpec("user", dim=2), FeatureSpec("item", dim=2, coalesce=False)])
    assert len(own.tables) == 2                                   # its own table: the full int64 range
    own(dict(ok, item=(torch.tensor([[2**63 - 1]]), torch.ones(1, dtype=torch.int64))))
    assert own.tables[own.slot["item"][0]].row_of.keys() == {2**63 - 1}
    with pytest.raises(SparseInputError, match=rf"feature 'item': id {2**64 - 1} outside \[0, 2\*\*63\)"):
        own(dict(ok, item=(np.array([[2**64 - 1]], dtype=np.uint64), torch.ones(1, dtype=torch.int64))))


def test_reshard_chain_in_one_process_keeps_rows_and_evicted_counts(tmp_path):
    """W=1 -> 3 -> 2 with save_shard / write_manifest (the non-collective path), an AdmitAfter table
    whose pending sightings are sharded too, and a coalesced table."""
    from ops.sparse import AdmitAfter, EmbeddingCollection, EvictUnseen, FeatureSpec, SparseAdam
    from ops.sparse.checkpoint import load_sharded, save_shard, save_sharded, write_manifest

    def specs():
        return [FeatureSpec("a", dim=2, optimizer=SparseAdam(), admission=AdmitAfter(2), eviction=EvictUnseen(1)),
                FeatureSpec("b", dim=3), FeatureSpec("c", dim=3)]

    ec = EmbeddingCollection(specs(), seed=1)
    g = torch.Generator().manual_seed(0)
    for s in range(5):
        batch = {f: (torch.randint(0, 40 if s < 3 else 20, (30, 1), generator=g), torch.ones(30, dtype=torch.int64))
                 for f in ("a", "b", "c")}
        out = ec(batch)
        sum(o.pow(2).sum() for o in out.values()).backward()
        ec.apply_gradients()
        ec.end_step()
    ta = ec.tables["table0"]
    assert ta.evicted > 0 and ta.sightings and ec.features_of("table1") == ["b", "c"]
    save_sharded(ec, tmp_path / "w1")
    entries = []
    for r in range(3):
        part = EmbeddingCollection(specs(), seed=1)
        load_sharded(part, tmp_path / "w1", rank=r, world=3)
        entries.append(save_shard(part, tmp_path / "w3", rank=r, world=3))
        if r == 1:
            with pytest.raises(ValueError, match=r"holds key \d+, owned by rank"):
                save_shard(part, tmp_path / "bad", rank=0, world=3)
    write_manifest(tmp_path / "w3", entries)
    parts = []
    for r in range(2):
        p = EmbeddingCollection(specs(), seed=1)
        load_sharded(p, tmp_path / "w3", rank=r, world=2)
        parts.append(p)
    for name, t in ec.tables.items():
        ids, rows, seen = t.live()
        got = {}
        for p in parts:
            got.update(_by_id(p.tables[name].live()))
        assert sorted(got) == ids.tolist()
        for i, row, s in zip(ids.tolist(), rows, seen.tolist()):
            assert torch.equal(got[i][0], row) and got[i][1] == s
        assert {**parts[0].tables[name].sightings, **parts[1].tables[name].sightings} == t.sightings
        assert [p.tables[name].evicted for p in parts] == [t.evicted, 0]      # the total stays on rank 0
        assert all(p.tables[name].step == t.step for p in parts)
    same = EmbeddingCollection(specs(), seed=1)                           # same world size: counters exact
    load_sharded(same, tmp_path / "w1")
    assert same.tables["table0"].size_history == ta.size_history and same.tables["table0"].evicted == ta.evicted


def test_encode_features_keeps_64_bit_integer_ids():
    import polars as pl

    from ops.sparse.data import CTRDataError, encode_features

    ids, _ = encode_features(pl.DataFrame({"h": [0, 2**52 + 1, 2**63 - 1]}), ["h"])["h"]
    assert ids[:, 0].tolist() == [0, 2**52 + 1, 2**63 - 1]
    with pytest.raises(CTRDataError, match=rf"field 'h': record 1 has id {2**64 - 1} outside \[0, 2\*\*63\)"):
        encode_features(pl.DataFrame({"h": pl.Series([1, 2**64 - 1], dtype=pl.UInt64)}), ["h"])
