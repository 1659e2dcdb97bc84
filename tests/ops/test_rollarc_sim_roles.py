"""SimRoles (RollArc's scheduler on a scaled-real-time cost model): the cost model per call, version
stamping, determinism across schedulers, both schedulers end to end, the staleness bound, the
heavy-tail advantage of trajectory-level asynchrony, time scaling, and the benchmark's smoke run."""

import asyncio
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ops.rl.rollarc.core import ArcConfig, run_rollarc
from ops.rl.rollarc.monolithic import run_monolithic
from ops.rl.rollarc.router import PoolProfile
from ops.rl.rollarc.types import Task
from sim.rollarc_roles import SimConfig, SimRoles

ROOT = Path(__file__).resolve().parents[2]
H = PoolProfile("gpu_compute", prefill_tok_s=10_000.0, decode_tok_s=100.0, max_batch=4)
B = PoolProfile("gpu_bandwidth", prefill_tok_s=2_000.0, decode_tok_s=125.0, max_batch=4)


def synthetic_tasks(prefix="t"):
    return (Task(uid=f"{prefix}{i}", env="synthetic", spec={}) for i in itertools.count())


def run(fn, roles, cfg, tasks=None):
    return asyncio.run(fn(roles, cfg, tasks or synthetic_tasks()))


def test_llm_cost_is_prefill_then_decode_and_prefill_queues_per_engine():
    roles = SimRoles(SimConfig(engines={"gpu_compute": 1}, profiles={"gpu_compute": H}), time_scale=1e-3)
    task = Task("t0", "synthetic", {})

    async def go():
        await roles.env_reset("g/0", task)
        await roles.env_reset("g/1", task)
        return await asyncio.gather(roles.llm([], "g/0", 0), roles.llm([], "g/1", 0)), \
            roles.workload("g/0")[0], roles.workload("g/1")[0]

    (s0, s1), w0, w1 = asyncio.run(go())
    assert s0.latency_s == pytest.approx(w0.prefill_tokens / 10_000 + w0.decode_tokens / 100, rel=1e-6)
    # the second request's prefill waits behind the first one's on the same engine; decode overlaps
    assert s1.latency_s == pytest.approx((w0.prefill_tokens + w1.prefill_tokens) / 10_000 + w1.decode_tokens / 100,
                                         rel=1e-3)
    assert len(s0.response_ids) == w0.decode_tokens and len(s0.prompt_ids) == w0.prompt_tokens
    assert len(s0.logprobs) == w0.decode_tokens and s0.pool == "gpu_compute" and s0.policy_version == 0


def test_affinity_sends_the_long_first_turn_to_the_bandwidth_pool():
    cfg = SimConfig(engines={"gpu_compute": 1, "gpu_bandwidth": 1}, profiles={"gpu_compute": H, "gpu_bandwidth": B})
    roles = SimRoles(cfg, time_scale=1e-4)

    async def go():
        await roles.env_reset("g/0", Task("t0", "synthetic", {}))
        return await roles.llm([], "g/0", 0)

    seg = asyncio.run(go())
    assert seg.pool == "gpu_bandwidth"                 # unknown turn kind: expected 2048 tokens -> decode-heavy
    assert roles.stats()["engine_requests"] == {"gpu_compute": [0], "gpu_bandwidth": [1]}


def test_static_batch_is_held_by_its_slowest_sequence():
    one = SimConfig(engines={"gpu_compute": 1}, profiles={"gpu_compute": H}, colocated_engines={"gpu_compute": 1})
    roles = SimRoles(one, time_scale=1e-4)

    async def go(r, n):
        for i in range(n):
            await r.env_reset(f"g/{i}", Task("t0", "synthetic", {}))
        return await r.llm_batch([([], f"g/{i}", 0) for i in range(n)]), [r.workload(f"g/{i}")[0] for i in range(n)]

    segs, ws = asyncio.run(go(roles, 3))
    want = sum(w.prefill_tokens for w in ws) / 10_000 + max(w.decode_tokens for w in ws) / 100
    assert [s.latency_s for s in segs] == pytest.approx([want] * 3)
    # max_batch 1 -> three waves: the decodes add up
    tiny = PoolProfile("gpu_compute", 10_000.0, 100.0, max_batch=1)
    secs, pools = SimRoles(SimConfig(engines={"gpu_compute": 1}, profiles={"gpu_compute": tiny},
                                     colocated_engines={"gpu_compute": 1})).batch_seconds(ws)
    assert secs == pytest.approx(sum(w.prefill_tokens / 10_000 + w.decode_tokens / 100 for w in ws))
    # two colocated engines split the batch round-robin; the slower engine sets the time
    two = SimRoles(SimConfig(engines={"gpu_compute": 1}, profiles={"gpu_compute": H},
                             colocated_engines={"gpu_compute": 2}))
    secs2, pools2 = two.batch_seconds(ws)
    e0 = (ws[0].prefill_tokens + ws[2].prefill_tokens) / 10_000 + max(ws[0].decode_tokens, ws[2].decode_tokens) / 100
    e1 = ws[1].prefill_tokens / 10_000 + ws[1].decode_tokens / 100
    assert secs2 == pytest.approx(max(e0, e1)) and pools2 == ["gpu_compute"] * 3


def test_version_changes_only_when_publish_completes():
    roles = SimRoles(SimConfig(publish_s=10.0), time_scale=0.01)       # a 0.1 s wall sync

    async def go():
        await roles.env_reset("g/0", Task("t0", "synthetic", {}))
        pub = asyncio.ensure_future(roles.publish(1))
        await asyncio.sleep(0.03)
        mid_version = roles.version
        seg = await roles.llm([], "g/0", 0)                             # admitted during the sync
        await pub
        return mid_version, seg.policy_version, roles.version

    assert asyncio.run(go()) == (0, 0, 1)
    with pytest.raises(ValueError, match="older than the published version"):
        asyncio.run(roles.publish(0))


def test_same_seed_and_task_give_the_same_trajectory_whatever_the_group_id():
    async def play(roles, key):
        await roles.env_reset(key, Task("t7", "synthetic", {}))
        w = roles.workload(key)
        steps, lat = 0, []
        while True:
            r = await roles.env_step(key, "x")
            steps += 1
            lat.append(r.info["injected_latency_s"])
            if r.done:
                return w, steps, lat

    a = asyncio.run(play(SimRoles(time_scale=1e-5, seed=3), "s0-g0-t7/2"))
    b = asyncio.run(play(SimRoles(time_scale=1e-5, seed=3), "s4-g9-t7/2"))
    c = asyncio.run(play(SimRoles(time_scale=1e-5, seed=4), "s0-g0-t7/2"))
    assert a == b
    assert a[0] != c[0]
    assert 4 <= a[1] <= 12                                            # SimConfig.done_turns


def test_invalid_settings_are_named():
    with pytest.raises(ValueError, match="time_scale"):
        SimRoles(time_scale=0)
    with pytest.raises(ValueError, match="env_latency"):
        SimConfig(env_latency="huge")
    with pytest.raises(ValueError, match="profiles has no entry"):
        SimConfig(engines={"gpu_compute": 1}, profiles={})
    roles = SimRoles(SimConfig(workload_turns=2), time_scale=1e-4)

    async def go():
        await roles.env_reset("g/0", Task("t0", "synthetic", {}))
        await roles.llm([], "g/0", 2)

    with pytest.raises(ValueError, match="workload_turns"):
        asyncio.run(go())


SMALL = dict(steps=4, groups_per_step=3, group_size=4, max_turns=5)


@pytest.mark.parametrize("ratio", [1, 2])
def test_rollarc_on_sim_roles_keeps_staleness_within_async_ratio(ratio):
    roles = SimRoles(SimConfig(env_latency="medium", workload_turns=5), time_scale=0.003, seed=ratio)
    res = run(run_rollarc, roles, ArcConfig(redundancy=1, async_ratio=ratio, **SMALL))
    assert res.trained_trajectories == 4 * 3 * 4
    assert max(res.staleness_hist) <= ratio and all(r["max_staleness"] <= ratio for r in res.steps)
    assert sum(v for k, v in res.staleness_hist.items() if k > 0) > 0          # asynchrony is real
    assert res.dropped_trajectories > 0                                          # redundancy is used
    versions = [v for t in res.trajectories for v in t["versions"]]
    assert min(versions) == 0 and max(versions) <= 3
    assert {p for t in res.trajectories for p in t["pools"]} == {"gpu_compute", "gpu_bandwidth"}
    rewards = [t["reward"] for t in res.trajectories]
    assert set(rewards) == {0.0, 1.0}                                            # groups have variance
    assert [r["train_tokens"] > 0 for r in res.steps] == [True] * 4


def test_monolithic_on_sim_roles_is_synchronous_and_batched():
    roles = SimRoles(SimConfig(env_latency="medium", workload_turns=5), time_scale=0.002)
    res = run(run_monolithic, roles, ArcConfig(redundancy=0, async_ratio=0, **SMALL))
    assert res.staleness_hist == {0: 12} and res.trained_trajectories == 48
    st = roles.stats()
    assert st["llm"] == 0 and 4 <= st["llm_batch"] <= 4 * 5                     # one batched call per turn
    assert st["llm_batch_sequences"] == sum(t["turns"] for t in res.trajectories)
    assert all(t["versions"] == [t["created_step"]] * t["turns"] for t in res.trajectories)


@pytest.mark.parametrize("seed", [0, 1])
def test_rollarc_beats_the_lockstep_baseline_under_heavy_tailed_latency(seed):
    cfg = dict(steps=3, groups_per_step=4, group_size=4, max_turns=6)
    sim = SimConfig(env_latency="heavy", workload_turns=6)
    base_scale, arc_scale = 0.02, 0.04      # wall = simulated x scale: CPU overhead is amplified by 1/scale, so not smaller (a loaded CI box)
    mono = run(run_monolithic, SimRoles(sim, time_scale=base_scale, seed=seed), ArcConfig(redundancy=0, async_ratio=0, **cfg))
    arc = run(run_rollarc, SimRoles(sim, time_scale=arc_scale, seed=seed), ArcConfig(redundancy=1, async_ratio=1, **cfg))
    speedup = (mono.wall_s / base_scale) / (arc.wall_s / arc_scale)
    assert speedup > 1.5, speedup
    assert mono.trained_trajectories == arc.trained_trajectories == 48


def test_time_scale_maps_simulated_to_wall_seconds():
    roles = SimRoles(SimConfig(train_fixed_s=2.0), time_scale=0.02)
    t = time.perf_counter()
    out = asyncio.run(roles.train([], 0))
    wall = time.perf_counter() - t
    assert out["sim_train_s"] == 2.0 and 0.038 <= wall < 0.2
    # a whole run: the simulated seconds do not depend on the scale, the wall seconds do
    cfg = ArcConfig(redundancy=1, async_ratio=1, steps=3, groups_per_step=2, group_size=3, max_turns=4)
    sims, walls = [], []
    for scale in (0.01, 0.02):                      # coarser: the trainer polls every 10 ms wall
        res = run(run_rollarc, SimRoles(SimConfig(env_latency="low", workload_turns=4), time_scale=scale), cfg)
        sims.append(res.wall_s / scale)
        walls.append(res.wall_s)
    assert sims[0] == pytest.approx(sims[1], rel=0.1)
    assert walls[1] / walls[0] == pytest.approx(2.0, rel=0.25)


def test_real_frozenlake_env_and_verifier_through_rollarc():
    class Capture(SimRoles):
        trained = []

        async def train(self, groups, step):
            self.trained += [t for g in groups for t in g.trajectories]
            return await super().train(groups, step)

    roles = Capture(SimConfig(env_latency="low", env_mean_s=0.5, workload_turns=8), time_scale=0.002, env_mode="real")
    tasks = (Task(f"lake{i}", "frozenlake", {"map_seed": i, "size": 4}) for i in itertools.count())
    res = run(run_rollarc, roles, ArcConfig(steps=2, groups_per_step=2, group_size=3, redundancy=1, async_ratio=1,
                                            max_turns=8), tasks)
    assert res.trained_trajectories == 12 and len(roles.trained) == 12
    for t in roles.trained:
        assert t.reward == (1.0 if t.submission.get("reached_goal") else 0.0)
        assert all(s.text.startswith("Action: ") for s in t.segments)
        assert len(t.submission["actions"]) == t.turns


def test_benchmark_quick_writes_the_three_sections(tmp_path):
    out = tmp_path / "rollarc.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks/rollarc_bench.py"), "--quick", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads(out.read_text())
    assert {"latency_sweep", "routing_ablation", "real"} <= set(d)
    assert set(d["latency_sweep"]["kinds"]) == {"low", "medium", "heavy"}
    for kind in d["latency_sweep"]["kinds"].values():
        assert set(kind["speedup_vs_monolithic"]) == {"async0", "rollarc_a1", "rollarc_a2"}
        assert kind["summary"]["monolithic"]["sim_s_mean"] > 0
        r2 = kind["runs"]["rollarc_a2"]["0"]
        assert max(int(k) for k in r2["staleness_hist"]) <= 2
    assert "same_hardware_speedup" in d["routing_ablation"]["default"]
    assert "skipped" in d["real"]
    assert d["commands"][0].endswith("--quick --out " + str(out)) and d["machine"]["nproc"] >= 1
