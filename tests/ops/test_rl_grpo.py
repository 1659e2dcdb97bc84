"""GRPO edge cases (tests/cases/training.json: grpo-zero-variance-group,
grpo-empty-response-and-nan-reward) on a tiny random-init Llama."""

import math

import pytest
import torch

from ops.rl.grpo import GRPOConfig, batch_advantages, group_advantages, grpo_loss, token_logprobs
from ops.rl.policy import tiny_policy


@pytest.fixture(scope="module")
def model():
    return tiny_policy(vocab_size=97, seed=0)


def loss_and_grads(model, prompts, responses, adv, valid, cfg=GRPOConfig()):
    model.zero_grad(set_to_none=True)
    logp, mask = token_logprobs(model, prompts, responses)
    loss, stats = grpo_loss(logp, logp.detach(), mask, adv, valid, cfg)
    loss.backward()
    grads = {n: p.grad.clone() if p.grad is not None else torch.zeros_like(p) for n, p in model.named_parameters()}
    return loss.detach(), grads, stats


def test_case_grpo_zero_variance_group(model):
    # every group has identical rewards, including values with fp residue in their mean (0.1 x 3)
    groups = [[0.5] * 4, [0.1] * 3 + [0.1], [1.0] * 4, [0.0] * 4]
    adv, valid, stats = batch_advantages(groups)
    assert all(a == 0.0 for g in adv for a in g) and all(not math.isnan(a) for g in adv for a in g)
    assert stats["zero_signal_groups"] == 1.0
    prompts = [[5, 6, 7]] * 16
    responses = [[8 + i % 5] * (1 + i % 4) for i in range(16)]
    loss, grads, _ = loss_and_grads(model, prompts, responses, [a for g in adv for a in g], [v for g in valid for v in g])
    assert torch.isfinite(loss) and loss.item() == 0.0
    assert all(torch.isfinite(g).all() and (g == 0).all() for g in grads.values())


def test_fp_residue_below_the_std_floor_is_zero_signal():
    a, _, zero = group_advantages([0.3, 0.1 + 0.2, 0.3])      # 0.1 + 0.2 != 0.3 in binary fp
    assert zero and a == [0.0, 0.0, 0.0]


def test_a_group_with_signal_is_normalised():
    a, valid, zero = group_advantages([1.0, 0.0, 1.0, 0.0])
    assert not zero and valid == [True] * 4
    assert a == pytest.approx([0.866, -0.866, 0.866, -0.866], abs=1e-3)          # (r - 0.5) / std(ddof=1)


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_case_grpo_empty_response_and_nan_reward(model, agg):
    cfg = GRPOConfig(agg=agg)
    prompt = [5, 6, 7, 9]
    normal = [[11, 12, 13], [14, 15], [16, 17, 18, 19]]
    rewards_normal = [1.0, 0.0, 1.0]
    # the mixed batch: the same three, an empty response (reward 0.0) and a NaN reward
    responses = normal + [[], [20, 21]]
    rewards = rewards_normal + [0.0, float("nan")]
    adv, valid, zero = group_advantages(rewards, [len(r) for r in responses], cfg)
    adv_n, valid_n, _ = group_advantages(rewards_normal, None, cfg)
    assert valid == [True, True, True, False, False] and not zero
    assert adv[:3] == adv_n and adv[3:] == [0.0, 0.0]               # NaN excluded from the group statistics
    loss, grads, stats = loss_and_grads(model, [prompt] * 5, responses, adv, valid, cfg)
    loss_n, grads_n, _ = loss_and_grads(model, [prompt] * 3, normal, adv_n, valid_n, cfg)
    assert torch.isfinite(loss)                 # its value is 0 at ratio 1 (advantages sum to 0); gradients are not
    assert any(g.abs().sum() > 0 for g in grads.values())
    assert loss.item() == pytest.approx(loss_n.item(), rel=1e-5, abs=1e-7)
    for n in grads:
        assert torch.isfinite(grads[n]).all()
        assert torch.allclose(grads[n], grads_n[n], rtol=1e-4, atol=1e-7), n
    assert stats["valid_responses"] == 3


def test_nan_advantage_of_an_invalid_response_does_not_poison_the_loss(model):
    logp, mask = token_logprobs(model, [[5, 6]] * 2, [[7, 8], [9]])
    loss, _ = grpo_loss(logp, logp.detach(), mask, [1.0, float("nan")], [True, False])
    assert torch.isfinite(loss)


def test_kl_term_needs_a_reference_and_is_zero_against_itself(model):
    logp, mask = token_logprobs(model, [[5, 6]] * 2, [[7, 8], [9]])
    with pytest.raises(ValueError, match="kl_coef"):
        grpo_loss(logp, logp.detach(), mask, [1.0, -1.0], [True, True], GRPOConfig(kl_coef=0.1))
    _, stats = grpo_loss(logp, logp.detach(), mask, [1.0, -1.0], [True, True], GRPOConfig(kl_coef=0.1), ref_logp=logp.detach())
    assert stats["kl"] == pytest.approx(0.0, abs=1e-7)


def test_bad_loss_settings_name_the_field():
    with pytest.raises(ValueError, match="grpo.agg"):
        GRPOConfig(agg="sum")
    with pytest.raises(ValueError, match="grpo.clip_eps"):
        GRPOConfig(clip_eps=1.5)
