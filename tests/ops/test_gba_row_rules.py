"""The two documented choices of how GBA treats embedding rows (docs/gba.md, "Two choices"; issue 38
item 3b), each a config switch with a test, and the hand-over round trip in one process (fast).

- ``RunSpec.row_grad_norm``: a row's summed gradient divided by its ID's occurrences in the update
  (``occurrences``, default) or by the update's samples (``global_batch``, the conventional
  data-parallel mean); the all-reduce trainer and the PS apply the same rule.
- ``Policy.row_staleness``: one staleness per gradient decays every row (``global``, default, the
  paper's token) or each row is decayed by the updates *that row* received since the pull
  (``per_row``)."""

from __future__ import annotations

import dataclasses
import datetime

import pytest
import torch

from ops.gba import handover
from ops.gba.aggregate import Aggregator, Gradient, row_mean
from ops.gba.config import Cluster, GBAConfigError, Policy, RunSpec, validate
from ops.gba.data import SampleStream, load, take
from ops.gba.model import TableShard
from ops.gba.server import ParameterServer
from ops.gba.staleness import StalenessDecay
from ops.gba.switching import Switching
from ops.sparse.config import TrainConfig
from tests.ops.gba_inprocess import InProcessWorkers

G, B = 512, 256


def test_row_mean_divides_by_occurrences_or_by_the_global_batch():
    """One update of 2 gradients of 4 samples each (G = 8): row 7 occurs 3 times in all, row 9 once."""
    g1 = Gradient(torch.zeros(2), {"t": (torch.tensor([7, 9]), torch.tensor([[3.0, 6.0], [1.0, 1.0]]),
                                         torch.tensor([2, 1]))}, samples=4)
    g2 = Gradient(torch.zeros(2), {"t": (torch.tensor([7]), torch.tensor([[3.0, 0.0]]), torch.tensor([1]))}, samples=4)
    for norm, want in (("occurrences", [[2.0, 2.0], [1.0, 1.0]]), ("global_batch", [[0.75, 0.75], [0.125, 0.125]])):
        agg = Aggregator(row_norm=norm)
        agg.add(g1)
        agg.add(g2)
        ids, rows = agg.take().sparse["t"]
        assert ids.tolist() == [7, 9] and rows.tolist() == want, norm
    with pytest.raises(ValueError, match="'occurrences' or 'global_batch'"):
        row_mean(torch.ones(1, 1), torch.ones(1), 8, "mean")
    with pytest.raises(GBAConfigError, match="row_grad_norm must be one of"):
        validate(RunSpec(row_grad_norm="batch"))
    with pytest.raises(GBAConfigError, match="policy.row_staleness must be one of"):
        validate(RunSpec(policy=Policy(row_staleness="rows")))


def _rows_after_3_steps(ctr_events_file, norm: str) -> dict:
    """{table: (PS rows, sync rows)} after 3 lock-step PS steps (2 in-process workers) and 3
    all-reduce steps (one rank) of the same spec with ``row_grad_norm = norm``."""
    import torch.distributed as dist

    from ops.gba.sync import SyncTrainer

    events_path, cache = ctr_events_file
    data = load(events_path, [*TrainConfig().crosses], cache)
    spec = RunSpec(mode="auto", train=TrainConfig(batch_size=G, epochs=3.5 * G / data.n_train, dropout=0.0),
                   local_batch=B, events_path=events_path, data_cache=cache, row_grad_norm=norm,
                   cluster=Cluster(workers=2, eval_every=8, checkpoint_every=0), switching=Switching(k_on=1e9))
    ps = ParameterServer(spec, data)
    ws = InProcessWorkers(ps, data, spec, 2)
    assert ps.hello(0)[0] == "wait"                                # the start barrier
    for w in (1, 0):
        ws.state[w]["batch"] = ps.hello(w)[1]
    while ws.live:
        for w in sorted(ws.live):
            ws.step(w)
    assert ps.control.step == 3
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        trainer = SyncTrainer(dataclasses.replace(spec, mode="sync", cluster=Cluster(workers=1, eval_every=8,
                                                                                      checkpoint_every=0)), data)
        trainer.run()
    finally:
        dist.destroy_process_group()
    out = {}
    for t, tab in ps.model.model.ec.tables.items():
        ids, rows, _ = tab.live()
        ids2, rows2, _ = trainer.model.ec.tables[t].live()
        assert torch.equal(ids, ids2), t
        out[t] = (rows, rows2)
    return out


def test_sync_and_the_lockstep_ps_apply_the_same_row_rule(ctr_events_file):
    """Both trainers read ``row_grad_norm``: for each value, 3 lock-step global steps on the PS (2
    workers, zero staleness, no dropout) leave the same rows as 3 all-reduce steps; the two values
    give different rows (so neither trainer ignores the setting)."""
    torch.set_num_threads(1)
    got = {norm: _rows_after_3_steps(ctr_events_file, norm) for norm in ("occurrences", "global_batch")}
    for norm, tables in got.items():
        for t, (ps_rows, sync_rows) in tables.items():
            assert torch.allclose(ps_rows, sync_rows, atol=1e-6), (norm, t)
    occ, glob = got["occurrences"], got["global_batch"]
    assert all(not torch.allclose(occ[t][0], glob[t][0], atol=1e-4) for t in occ)


@pytest.mark.parametrize("rule", ["global", "per_row"])
def test_row_staleness_global_decays_every_row_per_row_only_rows_updated_since_the_pull(ctr_events_file, rule):
    """GBA, W = 2, M = 2, f = 1 up to staleness 1 then 0.5 per step. Worker 0 pulls for batch b0 at
    token 0; worker 1 then completes global steps 1 and 2 alone (batches b1..b4). b0's gradient
    arrives with global staleness 2: ``global`` weighs every row 0.5; ``per_row`` weighs a row
    f(number of the 2 steps whose update touched it): 1 for rows of b0 not in b1..b4 or in one of
    the steps, 0.5 for rows updated in both (the ids are read from the batches themselves)."""
    torch.set_num_threads(1)
    events_path, cache = ctr_events_file
    data = load(events_path, [*TrainConfig().crosses], cache)
    spec = RunSpec(mode="gba", train=TrainConfig(batch_size=G, epochs=0.1), local_batch=B, events_path=events_path,
                   data_cache=cache, cluster=Cluster(workers=2, eval_every=100, checkpoint_every=0),
                   policy=Policy(decay=StalenessDecay(threshold=1, rate=0.5), row_staleness=rule))
    ps = ParameterServer(spec, data)
    seen = []
    add = ps.agg.add
    ps.agg.add = lambda g, w=1.0, rw=None: (seen.append((g, w, rw)), add(g, w, rw))[1]
    ws = InProcessWorkers(ps, data, spec, 2)
    ps.hello(0)
    ws.state[1]["batch"] = ps.hello(1)[1]
    ws.state[0]["batch"] = ps.hello(0)[1]
    b0 = ws.state[0]["batch"]
    ws.step(0)                                                     # worker 0 pulls at token 0
    while ps.control.step < 2:
        ws.step(1)                                                 # worker 1: pull, push, ... two global steps
    ws.step(0)                                                     # worker 0 pushes, staleness 2
    g, w, rw = seen[-1]
    assert w == 0.5                                                # the dense part: global tau = 2 -> 0.5
    stream = SampleStream(data.n_train, B, spec.train.seed)
    model = ws.models[0]
    others = [b for b in range(5) if b != b0]
    by_step = [others[0:2], others[2:4]]                           # worker 1's batches, 2 per global step
    for t, (ids, _, _) in g.sparse.items():
        if rule == "global":
            assert rw is None
            continue
        updated = [torch.unique(torch.cat([model.ids(take(data.train, stream.indices(b)))[t][0] for b in bs]))
                   for bs in by_step]
        tau = sum(torch.isin(ids, u).to(torch.int64) for u in updated)
        want = torch.where(tau <= 1, 1.0, 0.5)
        assert torch.equal(rw[t], want), t
        assert (tau == 0).any() and (tau == 2).any()               # both kinds of rows occur
    if rule == "per_row":
        assert len(rw) == len(g.sparse)


def test_handover_round_trip_in_one_process_is_bit_identical(ctr_events_file, tmp_path):
    """Fast companion of tests/ops/test_gba_handover.py: one sync rank (world 1) stops at global step
    2 and writes H1; a GBA PS with 3 table processes (2 in-process shards) loads it and stops at once
    (H2); sync loads H2 and stops at once (H3): H1 = H2 = H3 tensor for tensor."""
    import torch.distributed as dist

    from ops.gba.sync import SyncTrainer
    from ops.sparse.train import CTRModel

    torch.set_num_threads(1)
    events_path, cache = ctr_events_file
    data = load(events_path, [*TrainConfig().crosses], cache)
    spec = RunSpec(mode="sync", train=TrainConfig(batch_size=G, epochs=0.05), local_batch=B, events_path=events_path,
                   data_cache=cache, cluster=Cluster(workers=1, eval_every=8, checkpoint_every=0), stop_at=2,
                   handover_to=str(tmp_path / "H1"))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        SyncTrainer(spec, data).run()
        ps = dataclasses.replace(spec, mode="gba", handover_from=str(tmp_path / "H1"), handover_to=str(tmp_path / "H2"),
                                 cluster=dataclasses.replace(spec.cluster, num_ps=3))
        ParameterServer(ps, data, shards=[TableShard(data.fields, spec.train) for _ in range(2)])
        SyncTrainer(dataclasses.replace(spec, handover_from=str(tmp_path / "H2"), handover_to=str(tmp_path / "H3")),
                    data).run()
    finally:
        dist.destroy_process_group()

    def contents(name):
        folder = tmp_path / name
        st = handover.load_state(folder)
        m = CTRModel(data.fields, spec.train)
        handover.load_tables(folder, m.ec, 0, 1)
        rec = handover.read(folder)
        return st, {t: tab.live() for t, tab in m.ec.tables.items()}, rec

    s1, t1, r1 = contents("H1")
    assert r1["next_batch"] == 4 and r1["global_step"] == 2
    for name in ("H2", "H3"):
        s, t, r = contents(name)
        for k, v in s1["net"].items():
            assert torch.equal(v, s["net"][k]), (name, k)
        for i, st in s1["opt"]["state"].items():
            for k, v in st.items():
                assert torch.equal(v, s["opt"]["state"][i][k]), (name, i, k)
        assert torch.equal(s1["rng"][0], s["rng"][0])
        for tn, (ids, rows, seen) in t1.items():
            assert torch.equal(ids, t[tn][0]) and torch.equal(rows, t[tn][1]) and torch.equal(seen, t[tn][2]), (name, tn)
        assert (r["global_step"], r["next_batch"], r["reissue"]) == (2, 4, [])
    # a corrupt state file is refused by name
    (tmp_path / "H3" / "state.pt").write_bytes(b"x")
    with pytest.raises(handover.HandoverError, match="state.pt: SHA-256 differs"):
        handover.read(tmp_path / "H3")
