"""The discrete-event simulator (sim/des/): the closed-form engine against a step-by-step
reference, determinism, equal resources, the schedulers' invariants, and the calibration's effect."""

import json
import math
import random
from collections import deque

import pytest

from ops.rl.rollpacker.scheduler import RoundPlan, run_round
from ops.rl.types import Prompt
from sim.des import (Allocation, DESEngine, EventLoop, Instance, Request, RollArcConfig, RollPackerConfig,
                     rollarc_allocation, run_rollarc_method, simulate_rollarc, simulate_rollpacker)
from sim.des.rollpacker import _reward_done, _train_end
from sim.roofline import CALIBRATION_SCHEMA, H800, QWEN25_7B, Calibration, Roofline
from sim.traces import LENGTH_TRACE_SCHEMA, AgenticTurns, LogNormalLengths, MeasuredLengths, tail_ratio

COST = Roofline(H800, QWEN25_7B)


def reference_engine(cost, arrivals, aborts, max_seqs, kv_cap, token_budget):
    """Token-by-token continuous batching with the rules Instance documents (FCFS admission with a 1%
    KV watermark and a prefill token budget, chunked prefill, recompute preemption of the newest
    sequence, aborts applied at the next step boundary). Returns {rid: finish time}."""
    watermark = int(0.01 * kv_cap)
    pending = sorted(arrivals, key=lambda a: (a[0], a[1]))         # (t, rid, new, decode)
    ab = sorted(aborts)
    waiting, running, done = deque(), [], {}
    t, no = 0.0, 0
    while pending or waiting or running:
        while pending and pending[0][0] <= t + 1e-12:
            _, rid, new, dec = pending.pop(0)
            waiting.append({"rid": rid, "new": new, "cached": 0, "decode": dec})
        while ab and ab[0][0] <= t + 1e-12:
            _, rid = ab.pop(0)
            running = [r for r in running if r["rid"] != rid]
            waiting = deque(r for r in waiting if r["rid"] != rid)
        if not waiting and not running:
            if not pending:
                break
            t = max(t, pending[0][0])
            continue
        s = sum(r["ctx"] for r in running)
        ctx, budget, admit = s + len(running), token_budget, []
        while waiting and len(running) + len(admit) < max_seqs:
            q = waiting[0]
            need = q["cached"] + q["new"] + 1
            if ctx + need + watermark > kv_cap or (admit and q["new"] > budget):
                break
            admit.append(waiting.popleft())
            budget -= q["new"]
            ctx += need
        if admit:
            t += cost.iteration_s(len(running), s, [(q["new"], q["cached"]) for q in admit])
            for r in running:
                r["ctx"] += 1
                r["left"] -= 1
            for q in admit:
                running.append({"rid": q["rid"], "ctx": q["cached"] + q["new"] + 1, "left": q["decode"] - 1, "no": no})
                no += 1
        else:
            while running and kv_cap - s < len(running):
                v = max(running, key=lambda r: r["no"])
                running.remove(v)
                waiting.appendleft({"rid": v["rid"], "new": v["ctx"], "cached": 0, "decode": v["left"] + 1})
                s -= v["ctx"]
            if not running:
                continue
            t += cost.iteration_s(len(running), s)
            for r in running:
                r["ctx"] += 1
                r["left"] -= 1
        for r in [r for r in running if r["left"] == 0]:
            done[r["rid"]] = t
            running.remove(r)
    return done


@pytest.mark.parametrize("seed,kv_cap,budget", [(0, 10**6, 16384), (1, 3000, 16384), (2, 2500, 300), (3, 10**6, 200)])
def test_closed_form_engine_equals_the_step_by_step_reference(seed, kv_cap, budget):
    rng = random.Random(seed)
    arrivals = [(round(rng.uniform(0, 2.0), 4) if i > 3 else 0.0, i, rng.randint(1, 400), rng.randint(1, 300))
                for i in range(30)]
    aborts = [(rng.uniform(0.1, 2.0), rid) for rid in rng.sample(range(30), 3)]
    loop = EventLoop()
    inst = Instance(loop, COST, max_seqs=8, kv_capacity=kv_cap, token_budget=budget)
    got = {}
    for t, rid, new, dec in arrivals:
        loop.at(t, lambda t, r=Request(rid, new, 0, dec, lambda t, q: got.__setitem__(q.rid, t)): inst.submit(t, r))
    for t, rid in aborts:
        loop.at(t, lambda t, rid=rid: inst.abort(t, rid))
    loop.run()
    ref = reference_engine(COST, arrivals, aborts, 8, kv_cap, budget)
    assert got.keys() == ref.keys()
    for rid in ref:
        assert got[rid] == pytest.approx(ref[rid], rel=1e-9), rid
    if kv_cap < 10**4:
        assert inst.preemptions > 0                                   # the small KV cache forced preemptions


def test_single_request_is_one_prefill_then_its_decode_steps():
    loop = EventLoop()
    inst = Instance(loop, COST)
    out = {}
    inst.submit(0.0, Request(0, 200, 0, 50, lambda t, q: out.setdefault("t", t)))
    loop.run()
    expected = COST.prefill_s(1, 200) + sum(COST.decode_step_s(1, 201 + j) for j in range(49))
    assert out["t"] == pytest.approx(expected, rel=1e-12)


def test_sibling_samples_share_the_prompt_prefill():
    loop = EventLoop()
    inst = Instance(loop, COST)
    out = {}
    for i in range(2):
        inst.submit(0.0, Request(i, 1000, 0, 10, lambda t, q: out.setdefault(q.rid, t), prefix="p0"))
    loop.run()
    # one pass prefills 1,000 + 1 tokens (the second sample hits the prefix cache)
    first = COST.iteration_s(0, 0.0, [(1000, 0), (1, 999)])
    rest = sum(COST.decode_step_s(2, 1001 + j) for j in range(9))
    assert out[0] == out[1] == pytest.approx(first + rest, rel=1e-12)


def _small_rp(**kw):
    return RollPackerConfig(gpus=8, prompts_per_step=16, responses_per_prompt=4, steps=10, max_new_tokens=16384,
                            reward_workers=8, trace=LogNormalLengths(median=300, max_len=16384), **kw)


def test_short_round_accepts_p0_groups_and_aborts_the_rest():
    eng = DESEngine(LogNormalLengths(median=300), COST, instances=4)
    prompts = [Prompt(f"q{i}") for i in range(10)]
    res = run_round(eng, RoundPlan(0, "short", prompts, 5, 8, 4), 16384, math.inf)
    assert len(res.groups) == 8 and all(len(g.completions) == 4 for g in res.groups)
    assert len(res.aborted) == 2
    finishes = [c.t_finish_s for g in res.groups for c in g.completions]
    assert max(finishes) == pytest.approx(res.batch.timings["wall_s"])
    assert sum(c.finish_reason == "abort" for c in res.batch.completions) > 0


def test_rollpacker_simulation_is_deterministic_and_trains_every_prompt_once():
    cfg = _small_rp()
    a, b = simulate_rollpacker(cfg, seed=3), simulate_rollpacker(cfg, seed=3)
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)
    c = simulate_rollpacker(cfg, seed=4)
    assert c["methods"]["baseline"]["total_s"] != a["methods"]["baseline"]["total_s"]
    for m in a["methods"].values():
        assert m["trained_responses"] == 10 * 16 * 4 and m["steps"] == 10
    assert a["methods"]["tail_batching"]["long_rounds"] >= 1
    # the reward scheduler and the stream trainer only remove waiting: each stage is no slower
    t = [a["methods"][m]["total_s"] for m in ("tail_batching", "tail_batching+reward", "rollpacker")]
    assert t[0] >= t[1] >= t[2]


def test_each_rollpacker_stage_shortens_the_epoch():
    # baseline > + tail batching > + reward scheduler > + stream trainer (RollPacker §6's ablation order)
    m = simulate_rollpacker(_small_rp(), seed=0)["methods"]
    t = [m[k]["total_s"] for k in ("baseline", "tail_batching", "tail_batching+reward", "rollpacker")]
    assert t[0] > t[1] > t[2] > t[3]


def test_rewards_queue_fifo_on_the_workers():
    assert _reward_done([0.0, 0.0, 0.0], [1.0, 2.0, 3.0], workers=1) == [1.0, 3.0, 6.0]
    assert _reward_done([5.0, 0.0], [1.0, 1.0], workers=2) == [6.0, 1.0]


def test_stream_training_uses_drained_instances_before_the_rollout_ends():
    # 4 GPUs in 2 instances of 2; one instance drains at t=2, rollout ends at t=10; 8 GPU-s of work ready at 0
    assert _train_end([0.0], [8.0], [2.0, 10.0], 10.0, gpus=4, gpus_per_instance=2, stream=True) == pytest.approx(6.0)
    # without the stream trainer the work starts after the rollout on all GPUs
    assert _train_end([0.0], [8.0], [2.0, 10.0], 10.0, gpus=4, gpus_per_instance=2, stream=False) == pytest.approx(12.0)
    # work left at the rollout's end finishes on every GPU
    assert _train_end([0.0], [40.0], [2.0, 10.0], 10.0, gpus=4, gpus_per_instance=2, stream=True) == pytest.approx(16.0)


def test_every_rollpacker_method_owns_the_same_gpus():
    res = simulate_rollpacker(_small_rp(), seed=0)
    for m in res["methods"].values():
        assert m["allocation"] == {"colocated": 8, "rollout": 0, "trainer": 0, "gpus": 8}
        assert m["gpu_seconds_budget"] == pytest.approx(8 * m["total_s"])
        assert m["gpu_seconds_rollout_busy"] + m["gpu_seconds_train_busy"] <= m["gpu_seconds_budget"] * (1 + 1e-9)


def _small_ra(**kw):
    return RollArcConfig(gpus=8, steps=4, groups_per_step=4, group_size=4, max_turns=6,
                         turns=AgenticTurns(done_turns=(2, 8)), **kw)


def test_rollarc_methods_are_deterministic_and_own_the_same_gpus():
    cfg = _small_ra(env_latency="heavy")
    a = simulate_rollarc(cfg, seed=1, trainer_gpus=4)
    b = simulate_rollarc(cfg, seed=1, trainer_gpus=4)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert simulate_rollarc(cfg, seed=2, trainer_gpus=4)["methods"]["monolithic"]["total_s"] != \
        a["methods"]["monolithic"]["total_s"]
    for name, m in a["methods"].items():
        assert m["allocation"]["gpus"] == 8, name
        assert m["steps"] == 4
        assert m["gpu_seconds_budget"] == pytest.approx(8 * m["total_s"])
        al = m["allocation"]
        if al["colocated"]:
            assert m["gpu_seconds_rollout_busy"] + m["gpu_seconds_train_busy"] <= m["gpu_seconds_budget"] * (1 + 1e-9)
        else:
            assert al["rollout"] + al["trainer"] == 8
            assert m["gpu_seconds_train_busy"] <= al["trainer"] * m["total_s"] * (1 + 1e-9)
            assert m["gpu_seconds_rollout_busy"] <= al["rollout"] * m["total_s"] * (1 + 1e-9)
    assert rollarc_allocation(cfg, "monolithic") == Allocation(colocated=8)
    assert rollarc_allocation(cfg, "rollarc_a1", 2) == Allocation(rollout=6, trainer=2)


def test_rollarc_staleness_stays_within_the_async_ratio():
    cfg = _small_ra(env_latency="medium")
    for method, ratio in (("async0", 0), ("rollarc_a1", 1), ("rollarc_a2", 2)):
        r = run_rollarc_method(cfg, method, seed=0, trainer_gpus=4)
        hist = {int(k): v for k, v in r["staleness_hist"].items()}
        assert max(hist) <= ratio and sum(hist.values()) == 4 * 4, method
    assert run_rollarc_method(cfg, "monolithic", seed=0)["staleness_hist"] == {"0": 16}
    with pytest.raises(ValueError, match="unknown RollArc method"):
        run_rollarc_method(cfg, "bogus", seed=0)


def test_async_ratio_zero_waits_for_the_whole_step_and_lockstep_waits_longer():
    cfg = _small_ra(env_latency="heavy")
    mono = run_rollarc_method(cfg, "monolithic", seed=0)["total_s"]
    r0 = run_rollarc_method(cfg, "async0", seed=0)["total_s"]
    assert r0 < mono                       # no per-turn barrier on the same GPUs


def test_calibration_scales_the_simulated_rollout(tmp_path):
    pts = {"decode": [], "prefill": []}
    for b in (1, 64):
        for c in (16, 32768):
            pts["decode"].append({"batch": b, "context": c, "seconds": 2 * COST.raw_iteration_s(b, b * c)})
            pts["prefill"].append({"batch": b, "context": c, "seconds": 2 * COST.raw_iteration_s(0, 0.0, [(c, 0.0)] * b)})
    p = tmp_path / "cal.json"
    p.write_text(json.dumps({"schema": CALIBRATION_SCHEMA, "device": {"profile": "h800"}, "models": {"qwen2.5-7b": pts}}))
    slow = Roofline(H800, QWEN25_7B, calibration=Calibration.load(p))
    prompts = [Prompt(f"q{i}") for i in range(8)]
    walls = []
    for cost in (COST, slow):
        eng = DESEngine(LogNormalLengths(median=300), cost, instances=2)
        walls.append(run_round(eng, RoundPlan(0, "sync", prompts, 4, 8, 4), 16384, math.inf).batch.timings["wall_s"])
    assert walls[1] == pytest.approx(2 * walls[0], rel=1e-6)


def test_measured_trace_replays_its_lengths(tmp_path):
    p = tmp_path / "trace.json"
    p.write_text(json.dumps({"schema": LENGTH_TRACE_SCHEMA, "prompts": [
        {"uid": "a", "prompt_tokens": 100, "response_lengths": [10, 20]},
        {"uid": "b", "prompt_tokens": 50, "response_lengths": [5000]}]}))
    tr = MeasuredLengths.load(p)
    for i in range(20):
        lens = tr.lengths(f"p{i}", 6)
        assert set(lens) <= {10, 20} or set(lens) == {5000}
        assert tr.prompt_tokens(f"p{i}") == (50 if lens[0] == 5000 else 100)
    p.write_text(json.dumps({"schema": LENGTH_TRACE_SCHEMA, "prompts": [{"uid": "a", "response_lengths": []}]}))
    with pytest.raises(ValueError, match=r"prompts\[0\]\.response_lengths"):
        MeasuredLengths.load(p)


def test_default_length_trace_has_the_published_tail():
    t = tail_ratio(LogNormalLengths(seed=0))                 # 20 steps of 128 prompts x 8 responses
    assert 25 <= t["max_over_median_mean"] <= 32
    assert 900 <= t["median_tokens_mean"] <= 1100
