"""One RL step end to end in process: the transformers engine (tiny policy), the reward scorer
(its verifier processes, called in process), GRPO with the stream trainer, versioned weight sync — baseline and RollPacker."""

from pathlib import Path

import pytest
import torch

from ops.rl.engine import HFEngine
from ops.rl.policy import chat_prompt, tiny_policy
from ops.rl.reward import LocalRewardTransport, RewardClient, RewardResult, RewardScorer, RewardServiceError
from ops.rl.rollpacker.loop import RLStep, StepConfig
from ops.rl.rollpacker.scheduler import RoundPlanner, TailBatching
from ops.rl.rollpacker.stream import StreamTrainer
from ops.rl.weights import export_state, sync_weights

MODEL_DIR = Path(__file__).resolve().parents[2] / ".models" / "SmolLM2-135M-Instruct"



@pytest.fixture(scope="module")
def reward():
    with RewardScorer(workers=1, item_timeout_s=20) as scorer:
        yield LocalRewardTransport(scorer)


def setup(tok, overlap, stream, score=None, url=None, max_failed=0.25):
    pol = lambda: tiny_policy(len(tok), seed=0, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    engine = HFEngine(pol(), tok)
    model = pol()
    trainer = StreamTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), micro_batch=4, pad_id=tok.pad_token_id)
    score = score or RewardClient(url, timeout_s=30, max_retries=1).score

    def publish(tr, version):
        sync_weights(engine, export_state(tr.model), version)

    cfg = StepConfig(max_new_tokens=8, timeout_s=60, reward_overlap=overlap, stream_train=stream, max_failed_fraction=max_failed)
    return engine, RLStep(engine, trainer, score, publish, cfg)


def epoch(tok, n):
    return [chat_prompt(tok, f"q{i}", f"What is {i} + 1?", answer=str(i + 1)) for i in range(n)]


@pytest.mark.parametrize("tail_batching, overlap, stream", [(False, False, False), (True, True, True)])
def test_steps_train_p0_by_r0_on_policy_and_publish_the_next_version(tok, reward, tail_batching, overlap, stream):
    engine, step = setup(tok, overlap, stream, url=reward)
    planner = RoundPlanner(epoch(tok, 4), TailBatching(2, 3, eta=1.5, enabled=tail_batching))
    try:
        for k in range(2):
            plan = planner.next_round()
            rnd, m = step.run(plan)
            planner.requeue(rnd.aborted)
            assert m["trained_responses"] == 6 and m["policy_versions"] == [k]
            assert m["policy_version_after"] == k + 1 == engine.version
            assert m["verified"] + m["wrong"] + m["unparseable"] + m["reward_failed"] == 6
            assert m["unparseable"] == 6 and m["reward_failed"] == 0          # a random policy never writes \boxed{}
            assert m["zero_signal_groups"] == 1.0 and m["loss"] == 0.0 and m["step_s"] > 0
            assert m["round"] == ("short" if tail_batching and k == 0 else "long" if tail_batching else "sync")
    finally:
        step.close()


def test_the_step_fails_when_too_many_rewards_failed(tok):
    def all_failed(items):
        return [RewardResult(it.key, None, "failed", error="HTTP 503") for it in items]

    engine, step = setup(tok, True, True, score=all_failed)
    try:
        with pytest.raises(RewardServiceError, match="reward.max_failed_fraction"):
            step.run(RoundPlanner(epoch(tok, 2), TailBatching(2, 2, enabled=False)).next_round())
        assert engine.version == 0                                            # nothing published
    finally:
        step.close()
