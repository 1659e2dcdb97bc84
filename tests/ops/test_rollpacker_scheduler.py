"""Tail batching invariants (RollPacker §4.1) on scripted and heavy-tailed length traces, with the
unchanged scheduler driving the discrete-event simulator's engine (``sim.des.DESEngine``: continuous
batching, roofline step costs of a 7B model on an H800)."""

from collections import Counter

import pytest

from ops.rl.rollpacker.scheduler import RoundPlanner, SchedulerConfigError, TailBatching, run_epoch
from ops.rl.types import Prompt
from sim.des import DESEngine
from sim.roofline import H800, QWEN25_7B, Roofline
from sim.traces import LogNormalLengths, ScriptedLengths

COST = Roofline(H800, QWEN25_7B)


def engine_on(trace, instances=1):
    return DESEngine(trace, COST, instances)


def prompts(n, prefix="p"):
    return [Prompt(uid=f"{prefix}{i}") for i in range(n)]


def epoch(engine, ps, cfg, max_new_tokens=100_000):
    """Run an epoch; the 'trainer' bumps the policy version after every step."""
    versions = []

    def before(plan):
        versions.append(engine.version)

    def after(res):
        engine.version += 1

    out = run_epoch(engine, RoundPlanner(ps, cfg), max_new_tokens, timeout_s=1e9, before_round=before, after_round=after)
    return out, versions


def test_every_step_trains_exactly_p0_by_r0_on_policy_samples():
    cfg = TailBatching(prompts_per_step=4, responses_per_prompt=3, eta=1.25)
    engine = engine_on(LogNormalLengths(median=200, seed=1), instances=2)
    rounds, versions = epoch(engine, prompts(40), cfg)
    for r, v in zip(rounds, versions):
        assert len(r.groups) == 4 and all(len(g.completions) == 3 for g in r.groups)
        assert {c.policy_version for g in r.groups for c in g.completions} == {v}
        assert all(c.finish_reason in ("stop", "length") for g in r.groups for c in g.completions)
        assert len({(c.prompt_uid, c.index) for g in r.groups for c in g.completions}) == 12
    assert [r.plan.kind for r in rounds].count("short") > 0 and [r.plan.kind for r in rounds].count("long") > 0


def test_a_long_prompt_is_aborted_in_a_short_round_and_trained_in_a_long_round():
    # p1 always writes 5,000 tokens, everything else 10-40: the short round must not wait for it
    lengths = {f"p{i}": [10 + i, 20 + i, 30 + i, 40 + i] for i in range(8)}
    lengths["p1"] = [5000] * 4
    cfg = TailBatching(prompts_per_step=4, responses_per_prompt=3, eta=1.25)   # launch 5 x 4
    engine = engine_on(ScriptedLengths(lengths))
    rounds, _ = epoch(engine, prompts(8), cfg)
    first = rounds[0]
    assert first.plan.kind == "short" and [p.uid for p in first.plan.prompts] == ["p0", "p1", "p2", "p3", "p4"]
    assert [p.uid for p in first.aborted] == ["p1"]
    assert first.metrics["max_response_len"] <= 34 and first.metrics["finish_abort"] > 0
    long_round = next(r for r in rounds if "p1" in {g.prompt.uid for g in r.groups})
    assert long_round.plan.kind == "long" and long_round.plan.n == 3
    assert [c.length for g in long_round.groups if g.prompt.uid == "p1" for c in g.completions] == [5000] * 3
    # a short round accepts the first R0 responses to finish: the three shortest of each prompt
    p0 = next(g for g in first.groups if g.prompt.uid == "p0")
    assert sorted(c.length for c in p0.completions) == [10, 20, 30]


def test_over_an_epoch_the_trained_prompts_equal_the_baselines():
    ps = prompts(48)
    trace = LogNormalLengths(median=300, seed=7)
    tb_rounds, _ = epoch(engine_on(trace, instances=3), ps, TailBatching(4, 4, eta=1.5))
    base_rounds, _ = epoch(engine_on(trace, instances=3), ps, TailBatching(4, 4, enabled=False))
    tb = Counter(g.prompt.uid for r in tb_rounds for g in r.groups)
    base = Counter(g.prompt.uid for r in base_rounds for g in r.groups)
    assert tb == base == Counter({p.uid: 1 for p in ps})
    assert len(tb_rounds) == len(base_rounds) == 12
    assert [p.uid for r in base_rounds for p in r.plan.prompts] == [p.uid for p in ps]
    assert {r.plan.kind for r in base_rounds} == {"sync"}
    # heavy tail: short rounds cut the longest trained response against the baseline
    short_max = max(r.metrics["max_response_len"] for r in tb_rounds if r.plan.kind == "short")
    base_max = max(r.metrics["max_response_len"] for r in base_rounds)
    assert short_max < base_max


def test_long_round_period_is_one_over_eta_minus_one_short_rounds_on_a_steady_trace():
    cfg = TailBatching(prompts_per_step=8, responses_per_prompt=2, eta=1.25)   # 10 launched, 2 queued
    rounds, _ = epoch(engine_on(LogNormalLengths(median=100, seed=3)), prompts(200), cfg)
    kinds = "".join(r.plan.kind[0].upper() for r in rounds)
    assert kinds == "SSSSL" * 5
    assert kinds.count("S") / kinds.count("L") == pytest.approx(1 / (1.25 - 1))


def test_the_epoch_tail_is_trained_not_dropped():
    # 12 prompts, P0 = 4, eta = 1.25: 5 launched per short round; after two short rounds 2 fresh
    # prompts are left (< P0) and join the 2 queued ones for a final long round
    cfg = TailBatching(prompts_per_step=4, responses_per_prompt=2, eta=1.25)
    rounds, _ = epoch(engine_on(LogNormalLengths(median=100, seed=5)), prompts(12), cfg)
    assert [r.plan.kind for r in rounds] == ["short", "short", "long"]
    assert [p.uid for p in rounds[2].plan.prompts][2:] == ["p10", "p11"]
    assert sorted(g.prompt.uid for r in rounds for g in r.groups) == sorted(p.uid for p in prompts(12))
    assert all(len(r.groups) == 4 for r in rounds)


def test_a_stalled_round_ends_at_the_timeout_and_counts_the_timeouts():
    lengths = {f"p{i}": [10] * 4 for i in range(4)}
    lengths["p2"] = [10, 10, 10_000_000, 10]                 # one response never ends
    engine = engine_on(ScriptedLengths(lengths))
    cfg = TailBatching(prompts_per_step=4, responses_per_prompt=4, enabled=False)
    [r] = run_epoch(engine, RoundPlanner(prompts(4), cfg), max_new_tokens=10**9, timeout_s=5.0)
    assert r.metrics["rollout_s"] == pytest.approx(5.0) and r.metrics["finish_timeout"] == 1
    assert r.metrics["trained_timeout"] == 1 and len(r.groups) == 4
    [c] = [c for g in r.groups for c in g.completions if c.finish_reason == "timeout"]
    # the tokens it generated in 5 s: at least one, at most 5 s over the fastest decode step there is
    assert 0 < c.length <= 5.0 / COST.decode_step_s(1, 1)


@pytest.mark.parametrize("kw, field", [
    ({"prompts_per_step": 0, "responses_per_prompt": 2}, "tail_batching.prompts_per_step"),
    ({"prompts_per_step": 2, "responses_per_prompt": 0}, "tail_batching.responses_per_prompt"),
    ({"prompts_per_step": 2, "responses_per_prompt": 2, "eta": 0.9}, "tail_batching.eta"),
])
def test_bad_parameters_name_the_field(kw, field):
    with pytest.raises(SchedulerConfigError, match=field):
        TailBatching(**kw)


def test_an_epoch_that_is_not_a_multiple_of_p0_is_rejected():
    with pytest.raises(SchedulerConfigError, match="multiple of tail_batching.prompts_per_step"):
        RoundPlanner(prompts(10), TailBatching(4, 2))
