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


# ----------------------------------------------------------------- bounded log-ratios (issue 42, item 3)

def test_case_grpo_stale_ratio_overflow_in_the_loss():
    """Case grpo-stale-ratio-overflow (tests/cases/training.json): a response token with trainer
    log-prob -2 and behaviour log-prob -91 (advantage -1) beside a healthy sample (advantage +1).
    Unbounded, exp(89) is inf in float32: the loss is inf and the gradient NaN. Bounded, the token is
    masked and counted, and the healthy tokens get exactly their own gradient."""
    assert torch.isinf(torch.exp(torch.tensor(89.0)))                 # what the unbounded ratio would be
    logp = torch.tensor([[-2.0, 0.0], [-1.0, -1.5]], requires_grad=True)
    old = torch.tensor([[-91.0, 0.0], [-1.0, -1.5]])
    mask = torch.tensor([[True, False], [True, True]])
    loss, stats = grpo_loss(logp, old, mask, [-1.0, 1.0], [True, True])
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert stats["masked_tokens"] == 1 and stats["tokens"] == 3
    # seq-mean-token-mean over 2 rows: d/dlogp of -(ratio * A) / (2 rows * 2 tokens) = -1/4 on the healthy
    # tokens; the masked token weighs like a zero-loss token (its row still counts in the denominator)
    assert logp.grad.tolist() == [[0.0, 0.0], [-0.25, -0.25]]
    assert loss.item() == pytest.approx(-0.5, abs=1e-7)              # (0 + (-1 - 1) / 2) / 2


def test_case_grpo_stale_ratio_overflow_through_the_trainer_step(model):
    """Case grpo-stale-ratio-overflow through ``StreamTrainer``: the step is not lost (version bumps,
    weights move), the masked-token count is in its metrics, and the healthy sample trains exactly as
    it would with the stale token harmless (half its own gradient: 2 rows instead of 1)."""
    import copy

    from ops.rl.rollpacker.stream import StreamTrainer, TrainSample

    healthy = TrainSample([5, 6, 7], [11, 12, 13], advantage=1.0, valid=True)
    stale = TrainSample([5, 6, 7], [14], advantage=-1.0, valid=True, old_logprobs=[-91.0])

    def trainer():
        m = copy.deepcopy(model)
        return StreamTrainer(m, torch.optim.SGD(m.parameters(), lr=0.1), micro_batch=8, max_grad_norm=None)

    ref = trainer()
    ref.add([healthy])
    g_ref = ref.gradients()
    tr = trainer()
    assert tr.logprobs([stale])[0][0] > -20                           # the trainer's log-prob: 70+ nats above
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.add([healthy, stale])
    g = tr.gradients()
    for n in g_ref:
        assert torch.isfinite(g[n]).all()
        assert (g[n] - 0.5 * g_ref[n]).abs().max() <= 1e-4 * g_ref[n].abs().max() + 1e-9, n
    assert any(g_ref[n].abs().sum() > 0 for n in g_ref)
    m = tr.step()
    assert m["masked_tokens"] == 1 and m["tokens"] == 4 and m["version"] == 1
    assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
    assert any(not torch.equal(before[n], p) for n, p in tr.model.named_parameters())


def test_case_grpo_k3_kl_overflow():
    """Case grpo-k3-kl-overflow: kl_coef 0.04, reference log-prob -2, policy log-probs -95 and -32
    (93 and 30 nats of drift) beside a token at -2.5. Unbounded, exp(93) is inf and at 30 nats the k3
    term alone is 0.04 * 1.07e13 / 3 = 1.4e11 of loss; bounded, both drifted tokens are masked and
    counted, and the healthy token's KL term and gradient are the k3 values."""
    assert torch.isinf(torch.exp(torch.tensor(93.0)))
    logp = torch.tensor([[-95.0, -32.0, -2.5]], requires_grad=True)
    ref = torch.full((1, 3), -2.0)
    mask = torch.ones((1, 3), dtype=torch.bool)
    cfg = GRPOConfig(kl_coef=0.04)
    loss, stats = grpo_loss(logp, logp.detach(), mask, [0.0], [True], cfg, ref_logp=ref)
    loss.backward()
    q = 0.5                                                            # ref - logp of the healthy token
    assert stats["masked_tokens"] == 2
    assert torch.isfinite(loss) and loss.item() == pytest.approx(0.04 * (math.exp(q) - q - 1) / 3, rel=1e-5)
    assert logp.grad[0, :2].tolist() == [0.0, 0.0]
    assert logp.grad[0, 2].item() == pytest.approx(0.04 * (1 - math.exp(q)) / 3, rel=1e-5)
    assert stats["kl"] == pytest.approx((math.exp(q) - q - 1) / 3, rel=1e-5)


def test_k3_value_is_clamped_at_kl_max_within_the_bound():
    """Within the 20-nat bound the k3 value is clamped at kl_max (veRL's low_var_kl clamp, 10): 8 nats
    of drift gives k3 = e^8 - 9 = 2972 unclamped; clamped it is 10 with no gradient."""
    logp = torch.tensor([[-10.0]], requires_grad=True)
    loss, stats = grpo_loss(logp, logp.detach(), torch.ones((1, 1), dtype=torch.bool), [0.0], [True],
                            GRPOConfig(kl_coef=0.1), ref_logp=torch.tensor([[-2.0]]))
    loss.backward()
    assert stats["masked_tokens"] == 0 and stats["kl"] == pytest.approx(10.0)
    assert loss.item() == pytest.approx(1.0) and logp.grad.item() == 0.0


def test_nan_behaviour_logprob_is_masked_and_counted():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, stats = grpo_loss(logp, torch.tensor([[float("nan"), -2.0]]), torch.ones((1, 2), dtype=torch.bool),
                            [1.0], [True])
    loss.backward()
    assert stats["masked_tokens"] == 1 and torch.isfinite(logp.grad).all()
    assert logp.grad.tolist() == [[0.0, -0.5]]


def test_dual_clip_caps_the_loss_of_a_negative_advantage():
    """veRL's dual clip (clip_ratio_c 3): at ratio e^2 = 7.4 and A = -1 the clipped surrogate gives
    7.4; dual-clipped it is 3 (and 7.4 without it)."""
    logp = torch.tensor([[0.0]], requires_grad=True)
    old = torch.tensor([[-2.0]])
    one = torch.ones((1, 1), dtype=torch.bool)
    plain, _ = grpo_loss(logp, old, one, [-1.0], [True])
    dual, _ = grpo_loss(logp, old, one, [-1.0], [True], GRPOConfig(clip_ratio_c=3.0))
    assert plain.item() == pytest.approx(math.exp(2.0), rel=1e-6) and dual.item() == pytest.approx(3.0)
    pos, _ = grpo_loss(logp, old, one, [1.0], [True], GRPOConfig(clip_ratio_c=3.0))
    assert pos.item() == pytest.approx(-1.2)                           # A > 0: the PPO clip at 1 + eps


def test_seq_mean_token_sum_and_row_weights():
    """seq-mean-token-sum: mean over rows of each row's token sum; rows spread over several samples
    (row_tokens / row_share) equal the row as one sample."""
    lp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    one = torch.ones((1, 3), dtype=torch.bool)
    split = torch.tensor([[-1.0, 0.0], [-2.0, -3.0]], requires_grad=True)
    smask = torch.tensor([[True, False], [True, True]])
    for agg in GRPOConfig.AGGS:
        cfg = GRPOConfig(agg=agg)
        whole, _ = grpo_loss(lp, lp.detach() - 0.1, one, [1.0], [True], cfg)
        parts, _ = grpo_loss(split, split.detach() - 0.1, smask, [1.0, 1.0], [True, True], cfg,
                             row_tokens=[3, 3], row_share=[1 / 3, 2 / 3])
        assert parts.item() == pytest.approx(whole.item(), rel=1e-6), agg
    s, _ = grpo_loss(lp, lp.detach(), one, [1.0], [True], GRPOConfig(agg="seq-mean-token-sum"))
    assert s.item() == pytest.approx(-3.0)
    with pytest.raises(ValueError, match="sample 1 has 2 response tokens"):
        grpo_loss(split, split.detach(), smask, [1.0, 1.0], [True, True], row_tokens=[3, 1])


def test_bad_bound_settings_name_the_field():
    for kw, field in (({"log_ratio_bound": 0}, "log_ratio_bound"), ({"log_ratio_bound": 100}, "log_ratio_bound"),
                      ({"kl_max": 0}, "kl_max"), ({"clip_ratio_c": 1.0}, "clip_ratio_c"),
                      ({"kl_coef": float("nan")}, "kl_coef")):
        with pytest.raises(ValueError, match=f"grpo.{field}"):
            GRPOConfig(**kw)


def test_extreme_logprobs_property_loss_and_grads_finite_masked_counted():
    """Issue 42 review, property check (300 random batches, seeded): log-probs, behaviour and reference
    log-probs drawn with 40% extreme values (0, -88, -1e4, -1e30, -3e38, +-inf, NaN, +1e30) under every
    aggregation, with and without KL and dual clip, bound 20 or 80: the loss and every gradient are
    finite, and ``masked_tokens`` is exactly the count of valid response tokens whose |log pi - log pi_old|
    (or, with KL, |log pi_ref - log pi|) is beyond the bound or not finite."""
    import random

    rng = random.Random(42)
    extreme = [0.0, -1e-3, -5.0, -30.0, -88.0, -100.0, -1e4, -1e30, -3e38, float("-inf"), float("inf"), float("nan"),
               1e30, 50.0]
    for trial in range(300):
        B, T = rng.randint(1, 5), rng.randint(1, 7)

        def draw():
            return torch.tensor([[rng.choice(extreme) if rng.random() < 0.4 else -rng.random() * 10 for _ in range(T)]
                                 for _ in range(B)])

        logp = draw().requires_grad_(True)
        old, ref = draw(), draw()
        mask = torch.rand(B, T, generator=torch.Generator().manual_seed(trial)) < 0.8
        valid = [rng.random() < 0.85 for _ in range(B)]
        adv = [rng.choice([0.0, 1.0, -1.0, 3.5, -50.0, float("nan"), float("inf")]) for _ in range(B)]
        cfg = GRPOConfig(kl_coef=rng.choice([0.0, 0.1]), agg=rng.choice(GRPOConfig.AGGS),
                         clip_ratio_c=rng.choice([None, 3.0]), log_ratio_bound=rng.choice([20.0, 80.0]))
        loss, st = grpo_loss(logp, old, mask, adv, valid, cfg, ref_logp=ref)
        loss.backward()
        m = mask & torch.tensor(valid)[:, None]
        beyond = m & ~((logp.detach() - old).abs() <= cfg.log_ratio_bound)
        if cfg.kl_coef > 0:
            beyond = beyond | (m & ~((ref - logp.detach()).abs() <= cfg.log_ratio_bound))
        assert torch.isfinite(loss), (trial, cfg, loss)
        assert torch.isfinite(logp.grad).all(), (trial, cfg)
        assert st["masked_tokens"] == int(beyond.sum()), (trial, st, int(beyond.sum()))
