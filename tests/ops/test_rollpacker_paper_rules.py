"""RollPacker's claims run with the paper's semantics where Crucible's shared RL core departs from it
(arXiv 2509.21009; issue 38, docs/rollpacker.md "Paper semantics"):

* a verifier timeout scores 0 (the paper's reward scheduler) instead of ``failed`` (masked);
* no round is cut by the wall clock: a rollout reaching ``timeout_s`` fails the step;
* keeping the first R0 of ceil(eta R0) responses trains shorter responses (the selection the
  authors' design shares), measured on the production planner over the simulated engine;
* the trainer spec carries RollArc's ``grpo`` section (aggregation, scaling, clip, KL) and the
  setting reaches the loss.
"""

import math
import statistics

import pytest
import torch

from ops.rl.engine import HFEngine
from ops.rl.grpo import GRPOConfig, group_advantages
from ops.rl.policy import chat_prompt, tiny_policy
from ops.rl.reward import (LocalRewardTransport, RewardClient, RewardItem, RewardResult, RewardScorer,
                           RewardServiceError)
from ops.rl.rollpacker.driver import RunSpec, step_config
from ops.rl.rollpacker.loop import VERIFIER_TIMEOUT, RLStep, StepConfig, timed_out_as_zero
from ops.rl.rollpacker.scheduler import RoundPlan, RoundPlanner, TailBatching, run_epoch
from ops.rl.rollpacker.stream import StreamTrainer, TrainSample
from ops.rl.types import Prompt
from ops.rl.weights import export_state, sync_weights


def slow_answer(salt: int = 0) -> str:
    """A final answer whose verification takes ~1 s on a quiet 2-core machine (a 600-term sum of
    fractions; 0.43 s at 300 terms, 0.11 s at 60), ten times the 0.1 s limit below, and slower under
    load: a real verifier timeout, not a simulated one. ``salt`` makes each item's text distinct, so
    no parse cache in a worker that survived an item can make the next one fast."""
    return "\\boxed{" + "+".join(f"\\frac{{{i}}}{{{i + 1 + salt}}}" for i in range(1, 600)) + "}"


@pytest.fixture(scope="module")
def timing_out_scorer():
    """The real verifier pool with a 0.1 s per-item limit (math-verify imported here first, so the
    worker pebble re-forks after each timeout starts warm)."""
    from ops.rl.reward import score_one

    score_one(RewardItem("warm", "\\boxed{1}", "1"))
    with RewardScorer(workers=1, item_timeout_s=0.1) as scorer:
        yield scorer


def _slow_client(scorer):
    """``RewardClient.score`` over the real scorer, every response's final answer replaced by a distinct
    ``slow_answer``."""
    client = RewardClient(LocalRewardTransport(scorer), timeout_s=30, max_retries=0)
    return lambda items: client.score([RewardItem(it.key, slow_answer(j), it.answer) for j, it in enumerate(items)])


def test_a_real_verifier_timeout_scores_zero_and_a_service_fault_stays_failed(timing_out_scorer):
    [r] = _slow_client(timing_out_scorer)([RewardItem("q/0", "", "2")])
    assert r.status == "failed" and r.score is None and r.error.startswith(VERIFIER_TIMEOUT)   # the scorer's own words
    z = timed_out_as_zero(r)
    assert (z.key, z.score, z.status, z.failed, z.error) == ("q/0", 0.0, "timeout", False, r.error)
    fault = RewardResult("q/1", None, "failed", error="reward actor call timed out after 30s")
    assert timed_out_as_zero(fault) is fault                                   # the service's fault: still failed
    ok = RewardResult("q/2", 1.0, "verified")
    assert timed_out_as_zero(ok) is ok
    # in a group: zero trains the timed-out response with a negative advantage; mask drops it
    rewards = [1.0, None, 0.0, 1.0]
    as_zero = [1.0, timed_out_as_zero(RewardResult("k", None, "failed", error=r.error)).value, 0.0, 1.0]
    adv_zero, valid_zero, _ = group_advantages(as_zero)
    adv_mask, valid_mask, _ = group_advantages([math.nan if x is None else x for x in rewards])
    assert valid_zero == [True] * 4 and adv_zero[1] < 0 and adv_zero[1] == pytest.approx(adv_zero[2])
    assert valid_mask == [True, False, True, True] and adv_mask[1] == 0.0


def _step(tok, score, cfg: StepConfig):
    pol = lambda: tiny_policy(len(tok), seed=0, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    engine = HFEngine(pol(), tok)
    model = pol()
    trainer = StreamTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), micro_batch=4, pad_id=tok.pad_token_id)
    return engine, RLStep(engine, trainer, score, lambda tr, v: sync_weights(engine, export_state(tr.model), v), cfg)


def _epoch(tok, n):
    return [chat_prompt(tok, f"q{i}", f"What is {i} + 1?", answer=str(i + 1)) for i in range(n)]


@pytest.mark.parametrize("overlap, stream", [(False, False), (True, True)])
def test_verifier_timeouts_train_as_zero_under_the_paper_rule_and_fail_the_step_under_mask(
        tok, timing_out_scorer, overlap, stream):
    score = _slow_client(timing_out_scorer)
    for rule in ("zero", "mask"):
        engine, step = _step(tok, score, StepConfig(max_new_tokens=8, timeout_s=60, reward_overlap=overlap,
                                                    stream_train=stream, timed_out_reward=rule))
        plan = RoundPlanner(_epoch(tok, 2), TailBatching(2, 2, enabled=False)).next_round()
        try:
            if rule == "zero":
                _, m = step.run(plan)
                assert m["reward_timeout_zero"] == 4 and m["reward_failed"] == 0 and m["reward_mean"] == 0.0
                assert m["reward_failed_fraction"] == 0.0 and engine.version == 1      # trained and published
            else:
                with pytest.raises(RewardServiceError, match="reward.max_failed_fraction"):
                    step.run(plan)                                                     # 100% failed > 25%
                assert engine.version == 0
        finally:
            step.close()
    with pytest.raises(ValueError, match="rollpacker.timed_out_reward"):
        StepConfig(timed_out_reward="drop")


@pytest.mark.parametrize("kind", ["sync", "long", "short"])
def test_no_round_is_cut_by_the_wall_clock_unless_asked(tok, kind):
    """A random tiny policy over SmolLM2's 49k vocabulary almost never emits EOS, so 4,000 new tokens
    run far past a 0.2 s rollout limit: the engine ends them ``timeout``."""
    def score(items):
        return [RewardResult(it.key, 0.0, "wrong") for it in items]

    prompts = _epoch(tok, 3)
    plan = {"sync": RoundPlan(0, "sync", prompts[:2], 2, 2, 2), "long": RoundPlan(0, "long", prompts[:2], 2, 2, 2),
            "short": RoundPlan(0, "short", prompts, 3, 2, 2)}[kind]
    for cut in (False, True):
        engine, step = _step(tok, score, StepConfig(max_new_tokens=4000, timeout_s=0.2, wall_clock_cut=cut))
        try:
            if not cut:
                with pytest.raises(TimeoutError, match=rf"\({kind} round\): 4 trained responses were cut"):
                    step.run(plan)
                assert engine.version == 0                                             # nothing trained
            else:
                _, m = step.run(plan)
                assert m["trained_timeout"] == 4 and engine.version == 1
        finally:
            step.close()


def test_short_rounds_train_shorter_responses_than_the_baseline():
    """The selection of keeping the first R0 of ceil(eta R0) responses, on the production planner and
    acceptance rule over the discrete-event simulator's engine (``sim.des.DESEngine``, one 7B engine on an
    H800; heavy-tailed lengths, median 100, P0 = R0 = 8, 12 steps, eta 1.25): every prompt is trained
    once in both, but tail batching's trained responses are 17-20% shorter on each of 3 seeds (measured
    168.5 -> 134.5, 158.4 -> 130.6, 173.8 -> 139.3 tokens)."""
    from sim.des import DESEngine
    from sim.roofline import H800, QWEN25_7B, Roofline
    from sim.traces import LogNormalLengths

    for seed in range(3):
        mean = {}
        for tb in (False, True):
            prompts = [Prompt(f"p{i}", [1], "") for i in range(8 * 12)]
            res = run_epoch(DESEngine(LogNormalLengths(median=100, seed=seed, max_len=4096), Roofline(H800, QWEN25_7B), 1),
                            RoundPlanner(prompts, TailBatching(8, 8, 1.25, enabled=tb)), 4096, 1e9)
            assert sorted(g.prompt.uid for r in res for g in r.groups) == sorted(p.uid for p in prompts)
            mean[tb] = statistics.fmean(c.length for r in res for g in r.groups for c in g.completions)
        assert 0.75 < mean[True] / mean[False] < 0.9, (seed, mean)


def test_grpo_section_reaches_the_trainer_and_its_loss(tmp_path):
    """RollArc's ``grpo`` section, mirrored: the RunSpec's grpo_* fields become the trainer spec's
    ``grpo`` section (non-defaults only), the trainer actor builds its GRPOConfig from it, the driver's
    advantages use the same config, and the aggregation changes the loss: two on-policy responses
    of 2 and 6 tokens with advantages +1 and -1 (ratio 1, KL 0 at the start) give loss 0 with GRPO's
    seq-mean-token-mean and (-1*2 + 1*6) / 8 = 0.5 with token-mean."""
    from ops.rl import scratchpad as sp
    from ops.rl.ray_actors import _TrainerImpl

    tok = tmp_path / "tok"
    sp.build_tokenizer(tok)
    base = dict(task="scratchpad", tokenizer_dir=str(tok), methods=["rollpacker"])
    spec = RunSpec(**base, grpo_agg="token-mean", grpo_scale="none", grpo_clip_eps=0.3, grpo_kl_coef=0.02).validate()
    pol = spec.policy()
    assert pol["grpo"] == {"agg": "token-mean", "scale": "none", "clip_eps": 0.3, "kl_coef": 0.02}
    assert RunSpec(**base).validate().policy()["grpo"] == {}
    cfg = step_config(spec, "rollpacker")
    assert cfg.grpo == GRPOConfig(agg="token-mean", scale="none", clip_eps=0.3, kl_coef=0.02)
    assert (cfg.timed_out_reward, cfg.wall_clock_cut, cfg.reward_overlap, cfg.stream_train) == ("zero", False, True, True)
    assert group_advantages([1.0, 0.0], cfg=cfg.grpo)[0] == [0.5, -0.5]                  # Dr. GRPO: centred only
    losses = {}
    for name, s in (("default", RunSpec(**base).validate()), ("token-mean", spec)):
        tr = _TrainerImpl({**s.policy(), "micro_batch": 4}).trainer
        assert (tr.cfg.agg, tr.ref_model is not None) == ((("seq-mean-token-mean", False) if name == "default"
                                                          else ("token-mean", True)))
        tr.add([TrainSample([5, 6, 7], [8, 9], 1.0, True), TrainSample([5, 6, 7], [8, 9, 10, 11, 12, 13], -1.0, True)])
        losses[name] = tr.step()["loss"]
    assert losses["default"] == pytest.approx(0.0, abs=1e-6) and losses["token-mean"] == pytest.approx(0.5, abs=1e-5)
    with pytest.raises(ValueError, match=r"rollpacker\.grpo_agg"):
        RunSpec(**base, grpo_agg="sum").validate()
    with pytest.raises(ValueError, match=r"rollpacker\.grpo_kl_coef"):
        RunSpec(**base, grpo_kl_coef=-1.0).validate()
    with pytest.raises(ValueError, match=r"rollpacker\.wall_clock_cut"):
        RunSpec(**base, wall_clock_cut="no").validate()
