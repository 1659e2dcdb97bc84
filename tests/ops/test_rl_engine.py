"""The transformers rollout engine: finish reasons, log-probs, wall-clock timeouts (case
rollout-never-ends), tail-batching aborts, and versioned weight sync."""

import threading
import time
from pathlib import Path

import pytest
import torch

from ops.rl.engine import EngineNotReady, HFEngine, guarded_generate
from ops.rl.grpo import token_logprobs
from ops.rl.policy import chat_prompt, tiny_policy
from ops.rl.rollpacker.scheduler import RoundPlan, run_round
from ops.rl.types import Completion, Prompt, RolloutBatch
from ops.rl.weights import WeightSyncError, export_state, sync_weights

MODEL_DIR = Path(__file__).resolve().parents[2] / ".models" / "SmolLM2-135M-Instruct"



@pytest.fixture()
def engine(tok):
    torch.manual_seed(0)
    return HFEngine(tiny_policy(len(tok), seed=0, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id), tok)


def prompts(tok, k=2):
    return [chat_prompt(tok, f"q{i}", f"What is {i} + {i}?", answer=str(2 * i)) for i in range(k)]


def test_responses_carry_tokens_logprobs_reason_and_version(engine, tok):
    ps = prompts(tok)
    out = engine.generate(ps, n=3, max_new_tokens=12, timeout_s=60)
    assert [(c.prompt_uid, c.index) for c in out.completions] == [(p.uid, i) for p in ps for i in range(3)]
    for c in out.completions:
        assert c.finish_reason in ("stop", "length") and 1 <= c.length <= 12 and c.policy_version == 0
        assert len(c.logprobs) == c.length and all(lp <= 0 for lp in c.logprobs)
    # the recorded log-probs are those of the sampled distribution: the trainer recomputes them
    c = out.completions[0]
    lp, _ = token_logprobs(engine.model, [ps[0].token_ids], [c.token_ids])
    assert torch.allclose(lp[0, : c.length], torch.tensor(c.logprobs), atol=1e-4)
    assert 0.0 <= out.timings["bubble_ratio"] < 1.0 and out.timings["decode_steps"] >= 1


def test_case_rollout_never_ends_sampler_that_never_stops(engine, tok):
    # random weights almost never emit EOS: every response must end by max_new_tokens
    out = engine.generate(prompts(tok, 1), n=4, max_new_tokens=16, timeout_s=60)
    assert {c.finish_reason for c in out.completions} == {"length"} and {c.length for c in out.completions} == {16}


def test_case_rollout_never_ends_wall_clock_timeout(engine, tok):
    fwd = engine.model.forward

    def slow(*a, **kw):
        time.sleep(0.05)
        return fwd(*a, **kw)

    engine.model.forward = slow
    t = time.monotonic()
    seen = []
    out = engine.generate(prompts(tok, 1), n=2, max_new_tokens=1500, timeout_s=0.5, on_finish=lambda c: seen.append(c) and False)
    took = time.monotonic() - t
    assert took < 2.0
    assert {c.finish_reason for c in out.completions} == {"timeout"} and all(0 < c.length < 40 for c in out.completions)
    assert len(seen) == 2                                       # timed-out responses are reported, so the step can end


class StalledEngine:
    """An engine whose call never returns (a hung rank)."""

    version = 3

    def __init__(self):
        self.release = threading.Event()

    def generate(self, prompts, n, max_new_tokens, stop=None, timeout_s=60.0, on_finish=None):
        self.release.wait(60)
        return RolloutBatch([])


def test_case_rollout_never_ends_stalled_engine_call():
    e = StalledEngine()
    plan = RoundPlan(0, "sync", [Prompt("a"), Prompt("b")], 2, 2, 2)

    class Guarded:
        def generate(self, *a, **kw):
            return guarded_generate(e, *a, grace_s=0.2, **kw)

    t = time.monotonic()
    r = run_round(Guarded(), plan, max_new_tokens=8, timeout_s=0.3)
    assert time.monotonic() - t < 2.0
    assert r.metrics["finish_timeout"] == 4 and r.metrics["trained_timeout"] == 4 and e.stalled
    assert all(c.length == 0 and c.policy_version == 3 for g in r.groups for c in g.completions)
    e.release.set()


def test_abort_from_on_finish_ends_the_batch(engine, tok):
    calls = []

    def first_wins(c: Completion) -> bool:
        calls.append(c)
        return True

    # a stop string that random tokens hit at different steps
    out = engine.generate(prompts(tok, 2), n=2, max_new_tokens=200, stop=["e"], timeout_s=60, on_finish=first_wins)
    [first] = calls
    assert first.finish_reason == "stop"
    for c in out.completions:
        assert c.finish_reason == "abort" or c.length == first.length
    assert any(c.finish_reason == "abort" for c in out.completions)


def test_abort_from_another_thread_ends_the_batch(engine, tok):
    timer = threading.Timer(0.3, engine.abort)
    timer.start()
    t = time.monotonic()
    out = engine.generate(prompts(tok, 1), n=2, max_new_tokens=1500, timeout_s=60)
    reasons = [c.finish_reason for c in out.completions]
    # a sample may reach EOS ("stop") in the 0.3 s before the abort (seen once in a fresh make test);
    # every other one ends "abort", long before 1,500 tokens
    assert time.monotonic() - t < 5 and "abort" in reasons and set(reasons) <= {"abort", "stop"}, reasons


def test_weights_publish_a_version_only_after_a_complete_sync(engine, tok):
    trained = tiny_policy(len(tok), seed=7, eos_token_id=tok.eos_token_id)
    state = export_state(trained)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    partial = dict(list(state.items())[:3])
    with pytest.raises(WeightSyncError, match="incomplete"):
        sync_weights(engine, partial, version=1)
    assert engine.version == 0 and all(torch.equal(before[k], v) for k, v in engine.model.state_dict().items())
    assert sync_weights(engine, state, version=1, n_chunks=3) == 1 and engine.version == 1
    assert all(torch.equal(state[k], v) for k, v in engine.model.state_dict().items())
    out = engine.generate(prompts(tok, 1), n=1, max_new_tokens=2, timeout_s=60)
    assert out.completions[0].policy_version == 1
    with pytest.raises(WeightSyncError, match="already holds version 1"):
        sync_weights(engine, state, version=1)
    engine.version = None
    with pytest.raises(EngineNotReady):
        engine.generate(prompts(tok, 1), n=1, max_new_tokens=2, timeout_s=60)


@pytest.mark.parametrize("kw, field", [({"n": 0}, "generate.n"), ({"max_new_tokens": 0}, "generate.max_new_tokens"),
                                       ({"timeout_s": 0}, "generate.timeout_s")])
def test_bad_generate_arguments_name_the_field(engine, tok, kw, field):
    args = {"n": 1, "max_new_tokens": 4, "timeout_s": 10} | kw
    with pytest.raises(ValueError, match=field):
        engine.generate(prompts(tok, 1), **args)
