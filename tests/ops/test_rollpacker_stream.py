"""Stream trainer (RollPacker §4.3): gradients accumulated group by group (as groups finish, on a
background thread) and renormalised once equal the all-at-once gradients and update."""

import random

import pytest
import torch

from ops.rl.grpo import GRPOConfig, group_advantages, grpo_loss, token_logprobs
from ops.rl.policy import tiny_policy
from ops.rl.rollpacker.stream import StreamTrainer, StreamWorker, TrainSample


def batch(seed=0, groups=3, R=4):
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(3, 90) for _ in range(rng.randint(2, 6))]
        rewards = [float(rng.random() < 0.5) for _ in range(R)]
        rewards[0], rewards[1] = 1.0, 0.0
        resp = [[rng.randrange(3, 90) for _ in range(rng.randint(0 if i == 3 else 1, 9))] for i in range(R)]
        adv, valid, _ = group_advantages(rewards, [len(r) for r in resp])
        out.append([TrainSample(prompt, r, a, v) for r, a, v in zip(resp, adv, valid)])
    return out


def trainer(agg, micro_batch=8, lr=1e-2):
    m = tiny_policy(vocab_size=97, seed=1)
    return StreamTrainer(m, torch.optim.SGD(m.parameters(), lr=lr), GRPOConfig(agg=agg), micro_batch=micro_batch,
                         max_grad_norm=None)


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_stream_gradients_equal_the_batched_gradients(agg):
    groups = batch()
    flat = [s for g in groups for s in g]
    # reference: one loss over the whole batch, by hand
    ref = tiny_policy(vocab_size=97, seed=1)
    logp, mask = token_logprobs(ref, [s.prompt_ids for s in flat], [s.response_ids for s in flat])
    loss, _ = grpo_loss(logp, logp.detach(), mask, [s.advantage for s in flat], [s.valid for s in flat], GRPOConfig(agg=agg))
    loss.backward()
    want = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
    # stream: groups arrive one at a time (reverse finish order, micro-batches of 3) on a worker thread
    t = trainer(agg, micro_batch=3)
    w = StreamWorker(t)
    for g in reversed(groups):
        w.put(g)
    w.drain(timeout_s=60)
    w.close()
    got = t.gradients()
    assert set(got) == set(want)
    for n in want:
        assert torch.allclose(got[n], want[n], rtol=1e-4, atol=1e-7), n
    assert t.stats["valid_responses"] == sum(s.valid for s in flat)


def test_stream_step_equals_the_all_at_once_step():
    groups = batch(seed=3)
    a, b = trainer("seq-mean-token-mean"), trainer("seq-mean-token-mean", micro_batch=2)
    a.add([s for g in groups for s in g])
    for g in groups:
        b.add(g)
    ma, mb = a.step(), b.step()
    assert ma["version"] == mb["version"] == 1 and ma["loss"] == pytest.approx(mb["loss"], rel=1e-5)
    for (n, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.allclose(pa, pb, rtol=1e-5, atol=1e-7), n
    assert any(not torch.equal(pa, pb0) for pa, pb0 in zip(a.model.parameters(), tiny_policy(97, seed=1).parameters()))
