"""Switching a running GBA job between modes (ops.gba.switching, docs/gba.md "Switching"): the
straggler detector's hysteresis on a synthetic step-time series; a switch continues from exactly
the state it left (in-process, against a never-switched run); a lock-step phase entered by a switch
hands the pre-switch batches out again; sharded tables give the same training as one PS; and a
real launched auto run (2 PS processes, 2 workers, an injected straggler) records the switch."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from ops.gba.config import Cluster, GBAConfigError, RunSpec, validate
from ops.gba.control import Control, Wait
from ops.gba.data import load
from ops.gba.model import TableShard
from ops.gba.server import ParameterServer
from ops.gba.switching import StragglerDetector, Switching
from ops.gba.trace import StragglerTrace
from ops.sparse.config import TrainConfig
from tests.ops.gba_inprocess import InProcessWorkers

G, B = 512, 256


def test_detector_switches_sync_to_gba_and_back_with_hysteresis_on_a_synthetic_series():
    det = StragglerDetector(3, Switching(k_on=2.0, k_off=1.3, patience=2, history=3))
    # per window: worker2's step time (s) — the others stay at 10 ms; 3 batches per worker per window
    series = [0.010, 0.010, 0.030, 0.010,           # one slow window: not enough (patience 2)
              0.040, 0.040,                         # 2 windows > k_on: switch to gba at window 5
              0.018, 0.018,                         # 1.8x: inside the band, stays in gba
              0.012, 0.018, 0.012, 0.012,           # < k_off twice in a row only at windows 10-11
              0.040]
    verdicts = []
    for i, t2 in enumerate(series):
        for _ in range(3):
            det.observe(0, 0.010)
            det.observe(1, 0.011)
            det.observe(2, t2)
        v = det.close_window(step=float(i))
        if v is not None:
            verdicts.append((i, v.to, v.worker))
    assert verdicts == [(5, "gba", 2), (11, "sync", None)]
    assert [w["state"] for w in det.windows][4:6] == ["normal", "straggling"]
    assert det.windows[5]["ratio"] == pytest.approx(0.040 / 0.0105, abs=1e-3)
    # a worker that finished nothing in a window counts with the elapsed time of the batch it holds
    det2 = StragglerDetector(2, Switching(patience=1))
    det2.observe(0, 0.01), det2.observe(1, 0.01)
    det2.close_window()
    det2.observe(0, 0.01)                                   # worker1 silent, 0.5 s into its batch
    v = det2.close_window(running={1: 0.5})
    assert v is not None and v.to == "gba" and v.worker == 1 and v.ratio == pytest.approx(50.0)
    with pytest.raises(GBAConfigError, match="k_off < k_on"):
        Switching(k_on=1.2, k_off=1.5).check()
    with pytest.raises(GBAConfigError, match=r"switching.schedule\[1\].step must be an integer global step > 4"):
        Switching(schedule=((4, "gba"), (3, "sync"))).check()


def test_a_switch_into_lock_step_hands_the_pre_switch_batches_out_again():
    spec = validate(RunSpec(mode="auto", train=TrainConfig(batch_size=4, epochs=1), local_batch=2,
                            cluster=Cluster(workers=2)))
    c = Control(spec, total_samples=40)
    assert c.mode == "sync" and isinstance(c.hello(0), Wait)
    b1, b0 = c.hello(1), c.hello(0)
    c.pull(0, b0), c.pull(1, b1)
    n0 = c.push(0, 0, b0, 2).next_batch
    assert isinstance(c.pull(0, n0), Wait)                   # lock-step: worker0 has its one token of step 0
    v = c.push(1, 0, b1, 2)
    assert v.apply and c.step == 1
    c.switch("gba")
    n1 = v.next_batch
    c.pull(0, n0), c.pull(1, n1)                             # both at token 1
    n0 = c.push(0, 1, n0, 2).next_batch
    c.pull(0, n0)
    assert c.push(0, 1, n0, 2).apply                         # worker0 alone completes GBA step 1 -> 2
    c.switch("sync")                                         # worker1's gradient (token 1) is from before it
    v = c.push(1, 1, n1, 2)
    assert (v.weight, v.apply, v.next_batch) == (0.0, False, n1)     # not applied; its batch comes back to it
    assert c.dropped_at_switch == 1 and c.samples_applied == 8 and c.mode == "sync"


def _drive(server: ParameterServer, data, spec: RunSpec, workers: int = 2, seed: int = 0) -> None:
    """W workers in-process; each event advances one worker (seeded) by a pull or by compute + push."""
    rng = np.random.default_rng(seed)
    ws = InProcessWorkers(server, data, spec, workers)
    for w in range(workers):
        r = server.hello(w)
        ws.state[w]["batch"] = r[1] if r[0] == "go" else None
    for w in range(workers):
        if ws.state[w]["batch"] is None:
            ws.state[w]["batch"] = server.hello(w)[1]
    while ws.live:
        ws.step(int(rng.choice(sorted(ws.live))))


def _snapshot(server: ParameterServer) -> dict:
    m, c = server.model.model, server.control
    tables = {t: tuple(x.clone() for x in tab.live()) for t, tab in m.ec.tables.items()}
    adam = {(i, k): v.clone() for i, st in m.opt.state_dict()["state"].items() for k, v in st.items()}
    return {"dense": server.model.dense(), "adam": adam,
            "tables": tables, "position": (c.next_batch_no, dict(c.claimed), list(c.reissue), c.samples_applied, c.step),
            "rng": torch.get_rng_state().clone(), "lr": [g["lr"] for g in m.opt.param_groups],
            "sparse_lr": [t.optimizer.lr for t in m.ec.tables.values()]}


def _same(a: dict, b: dict, exact: bool) -> None:
    eq = torch.equal if exact else (lambda x, y: x.shape == y.shape and torch.allclose(x, y, atol=1e-6))
    assert eq(a["dense"], b["dense"])
    assert all(eq(a["adam"][k], b["adam"][k]) for k in a["adam"])
    assert a["tables"].keys() == b["tables"].keys()
    for t in a["tables"]:
        ids, rows, _ = a["tables"][t]
        ids2, rows2, _ = b["tables"][t]
        assert torch.equal(ids, ids2) and eq(rows, rows2), t         # rows with their SparseAdagrad state
    assert a["lr"] == b["lr"] and a["sparse_lr"] == b["sparse_lr"]


def test_a_switch_continues_from_identical_state_and_changes_no_hyper_parameter(ctr_events_file):
    torch.set_num_threads(1)
    events_path, cache = ctr_events_file
    spec = RunSpec(mode="auto", train=TrainConfig(batch_size=G, epochs=0.15), local_batch=B, events_path=events_path,
                   data_cache=cache, cluster=Cluster(workers=2, eval_every=4),
                   switching=Switching(schedule=((6, "gba"),)))
    data = load(events_path, spec.train.crosses, cache)

    server = ParameterServer(spec, data)
    at_switch = {}
    switch = server.switch

    def spy(to, reason):
        at_switch["before"] = _snapshot(server)
        ev = switch(to, reason)
        at_switch["after"] = _snapshot(server)
        return ev
    server.switch = spy
    _drive(server, data, spec)
    res = server.result()

    # a never-switched run: the same auto run without a schedule, its detector unable to fire
    quiet = dataclasses.replace(spec, switching=Switching(k_on=1e9))
    ref = ParameterServer(quiet, data)
    seen = {}
    apply = ref._apply

    def stop_at_6():
        apply()
        if ref.control.samples_applied == 6 * G and "sync" not in seen:
            seen["sync"] = _snapshot(ref)
    ref._apply = stop_at_6
    _drive(ref, data, quiet)

    before, after = at_switch["before"], at_switch["after"]
    _same(before, after, exact=True)                                  # the switch itself changes nothing
    assert before["position"] == after["position"] and torch.equal(before["rng"], after["rng"])
    assert before["position"][3:] == (6 * G, 6)
    _same(before, seen["sync"], exact=False)                          # = the never-switched run at that step
    [ev] = res["switching"]["events"]
    assert (ev["from"], ev["to"], ev["global_step"], ev["optimizer_step"]) == ("sync", "gba", 6.0, 6)
    assert ev["reason"] == "schedule: switch_at step 6" and ev["train_s"] >= 0 and ev["wall_time"] > 1e9
    assert res["samples_applied"] == res["global_steps_target"] * G and res["switching"]["final_phase"] == "gba"
    assert {p["phase"] for p in res["curve"] if p["global_step"] < 6} == {"sync"}
    assert {p["phase"] for p in res["curve"] if p["global_step"] > 6} == {"gba"}
    assert res["hyper_parameters"] == ref.result()["hyper_parameters"]


def test_tables_sharded_over_two_ps_train_as_one_ps(ctr_events_file):
    """num_ps = 2 with an in-process shard: every row lives on its owner (id % 2) and the run applies
    the same updates as the unsharded one (lock-step, so the trajectory is order-independent)."""
    torch.set_num_threads(1)
    events_path, cache = ctr_events_file
    spec = RunSpec(mode="auto", train=TrainConfig(batch_size=G, epochs=0.1), local_batch=B, events_path=events_path,
                   data_cache=cache, cluster=Cluster(workers=2, eval_every=8), switching=Switching(k_on=1e9))
    data = load(events_path, spec.train.crosses, cache)
    one = ParameterServer(spec, data)
    _drive(one, data, spec)
    shard = TableShard(data.fields, spec.train)
    two_spec = dataclasses.replace(spec, cluster=Cluster(workers=2, eval_every=8, num_ps=2))
    two = ParameterServer(two_spec, data, shards=[shard])
    _drive(two, data, two_spec)
    for t, tab in one.model.model.ec.tables.items():
        ids, rows, _ = tab.live()
        i0, r0, _ = two.model.model.ec.tables[t].live()
        i1, r1, _ = shard.ec.tables[t].live()
        assert len(i0) and len(i1) and bool((i0 % 2 == 0).all()) and bool((i1 % 2 == 1).all())
        order = torch.argsort(torch.cat([i0, i1]))
        assert torch.equal(torch.cat([i0, i1])[order], ids)
        assert torch.allclose(torch.cat([r0, r1])[order], rows, atol=1e-5)
    a, b = one.result(), two.result()
    assert b["num_ps"] == 2 and a["final"]["auc"] == pytest.approx(b["final"]["auc"], abs=1e-4)
    with pytest.raises(ValueError, match="num_ps = 2 needs 1 shard client"):
        ParameterServer(two_spec, data)


def test_auto_run_with_an_injected_straggler_records_the_switch(ctr_events_file, tmp_path):
    """A real launch: 2 PS processes (tables sharded), 2 workers, worker1 computing each local batch
    6 times; the detector moves the run from sync to GBA and the result records it."""
    events_path, cache = ctr_events_file
    spec = RunSpec(mode="auto", train=TrainConfig(batch_size=G, epochs=0.25), events_path=events_path, data_cache=cache,
                   cluster=Cluster(workers=2, eval_every=8, checkpoint_every=0, num_ps=2, run_timeout_s=150.0),
                   trace=StragglerTrace(kind="persistent", slowdown=6.0), switching=Switching(patience=2)).validate()
    (tmp_path / "spec.json").write_text(spec.to_json())
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "ops.gba.launch_ps", "--spec", str(tmp_path / "spec.json"), "--out", str(out)],
                       start_new_session=True, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"})
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((out / "result.json").read_text())
    assert res["num_ps"] == 2 and res["world_size"] == 4 and res["failure"] is None
    assert res["samples_applied"] == res["global_steps_target"] * G == 39 * G
    ev = res["switching"]["events"][0]
    assert (ev["from"], ev["to"]) == ("sync", "gba") and "worker1's step time" in ev["reason"]
    assert 2 <= ev["global_step"] < 39 and "auto: switch sync -> gba at global step" in r.stderr
    assert res["step_time_s"]["worker1"] > 2 * res["step_time_s"]["worker0"]         # the slowdown is real compute
