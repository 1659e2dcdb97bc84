"""RollArc multi-turn GRPO weighs trajectories, not turns (case rollarc-turn-weighting; issue 42,
item 7), and its trainer spec's grpo section reaches the trainer.

The oracle is the GRPO loss written from first principles in float64 with a trajectory as ONE row
whose environment tokens are masked — what TRL's GRPO loss (per-sequence token mean, then the mean
over sequences) and veRL's ``agg_loss`` (``seq-mean-token-mean``, ``seq-mean-token-sum``,
``token-mean``) compute on such a row: per response token
``l = max(-rho A, -clip(rho, 1 - eps, 1 + eps) A)``, ``rho = exp(logp - old_logp)``, weighed
1 / (G |o_i|), 1 / G or 1 / N by the aggregation.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from ops.rl.grpo import GRPOConfig, grpo_loss_terms, token_logprobs
from ops.rl.rollarc.samples import grpo_samples
from ops.rl.rollarc.types import Group, Segment, Task, Trajectory

TURNS = (1, 3, 2, 1)
REWARDS = (1.0, 0.0, 0.0, 1.0)        # mean 0.5: every advantage has the same magnitude
ENV_TOKENS = 4                        # observation tokens between turns (context, never trained)


def _group(seed: int = 0, off_policy: float = 0.0, vocab: int = 97):
    """One group of four trajectories with 1, 3, 2 and 1 LLM turns of 5-7 tokens each. Each turn's
    prompt is the whole conversation so far (first prompt + responses + observations). Returns the
    group and, per trajectory, its full row (token ids after the first prompt) and response mask."""
    rng = random.Random(seed)
    trajs, rows = [], []
    for i, (turns, r) in enumerate(zip(TURNS, REWARDS)):
        ctx = [rng.randrange(3, vocab) for _ in range(6)]
        first = list(ctx)
        row, rmask, segs = [], [], []
        for k in range(turns):
            resp = [rng.randrange(3, vocab) for _ in range(rng.randint(5, 7))]
            lp = [-rng.uniform(0.5, 4.0) for _ in resp]
            segs.append(Segment(prompt_ids=list(ctx), response_ids=resp, logprobs=lp, policy_version=0,
                                pool="colocated", finish_reason="stop"))
            ctx += resp
            row += resp
            rmask += [True] * len(resp)
            if k < turns - 1:
                obs = [rng.randrange(3, vocab) for _ in range(ENV_TOKENS)]
                ctx += obs
                row += obs
                rmask += [False] * len(obs)
        trajs.append(Trajectory(group_id="g", index=i, task=Task("t", "frozenlake", {}), created_step=0,
                                segments=segs, reward=r, turns=turns))
        rows.append((first, row, rmask))
    return Group("g", Task("t", "frozenlake", {}), 0, trajs), rows


def _trainer_grads(samples, cfg, delta):
    """d loss / d logp per sample (float64) through ``grpo_loss_terms`` in micro-batches of 2 (a
    trajectory's turns land in different micro-batches, as in the stream trainer), logp = old + delta."""
    leaves, num, den = [], 0.0, 0.0
    for i in range(0, len(samples), 2):
        mb = samples[i:i + 2]
        T = max(len(s.response_ids) for s in mb)
        old = torch.zeros((len(mb), T), dtype=torch.float64)
        mask = torch.zeros((len(mb), T), dtype=torch.bool)
        d = torch.zeros((len(mb), T), dtype=torch.float64)
        for b, s in enumerate(mb):
            n = len(s.response_ids)
            old[b, :n] = torch.tensor(s.old_logprobs, dtype=torch.float64)
            mask[b, :n] = True
            d[b, :n] = torch.tensor(delta[i + b], dtype=torch.float64)
        logp = (old + d).requires_grad_(True)
        leaves.append(logp)
        n_, d_, _ = grpo_loss_terms(logp, old, mask, [s.advantage for s in mb], [s.valid for s in mb], cfg,
                                    row_tokens=[s.row_tokens for s in mb] if mb[0].row_tokens is not None else None,
                                    row_share=[s.row_share for s in mb] if mb[0].row_tokens is not None else None)
        num, den = num + n_, den + d_
    loss = num / max(1.0, den)
    loss.backward()
    grads = [g for lf in leaves for g in lf.grad]
    return float(loss.detach()), [grads[k][: len(s.response_ids)].numpy() for k, s in enumerate(samples)]


def _oracle(group, advantages, delta, agg, eps=0.2):
    """Loss and per-trajectory gradient mass of the trajectory-as-one-row GRPO loss, float64 numpy.
    ``delta``: per trajectory, logp - old_logp over its response tokens (turns concatenated; the
    environment tokens between them carry no loss)."""
    G = len(group.trajectories)
    N = sum(t.response_tokens for t in group.trajectories)
    loss, mass = 0.0, []
    for t, A, dl in zip(group.trajectories, advantages, delta):
        rho = np.exp(np.asarray(dl, dtype=np.float64))
        per_tok = np.maximum(-rho * A, -np.clip(rho, 1 - eps, 1 + eps) * A)
        clipped = ((A > 0) & (rho > 1 + eps)) | ((A < 0) & (rho < 1 - eps))
        dtok = np.where(clipped, 0.0, -rho * A)                       # d per_tok / d logp
        w = {"seq-mean-token-mean": 1.0 / (G * len(dl)), "seq-mean-token-sum": 1.0 / G, "token-mean": 1.0 / N}[agg]
        loss += w * per_tok.sum()
        mass.append(w * np.abs(dtok).sum())
    return loss, np.asarray(mass)


def _by_trajectory(samples, grads):
    out, k = [], 0
    for turns in TURNS:
        out.append(float(sum(np.abs(g).sum() for g in grads[k:k + turns])))
        k += turns
    return np.asarray(out)


@pytest.mark.parametrize("agg", GRPOConfig.AGGS)
@pytest.mark.parametrize("off_policy", [0.0, 0.4])
def test_case_rollarc_turn_weighting_matches_the_trajectory_row_oracle(agg, off_policy):
    """Case rollarc-turn-weighting (tests/cases/training.json): four trajectories with 1, 3, 2 and 1
    turns, advantages of equal magnitude. Each trajectory's share of the gradient mass and the loss
    equal the float64 oracle (a trajectory = one row, environment tokens masked) to 1e-12, on-policy
    and off-policy (log-ratios ~N(0, 0.4): some tokens clipped); under seq-mean-token-mean every
    trajectory weighs 0.25 whatever its number of turns."""
    group, _ = _group(seed=1)
    cfg = GRPOConfig(agg=agg)
    samples, st = grpo_samples([group], cfg)
    assert st["segments"] == sum(TURNS) == len(samples)
    rng = np.random.default_rng(7)
    delta = [rng.normal(0.0, off_policy, len(s.response_ids)) for s in samples]
    loss, grads = _trainer_grads(samples, cfg, delta)
    adv, k = [], 0
    traj_delta = []
    for turns in TURNS:
        adv.append(samples[k].advantage)
        traj_delta.append(np.concatenate(delta[k:k + turns]))
        k += turns
    assert np.allclose(np.abs(adv), abs(adv[0])) and abs(adv[0]) > 0.8
    o_loss, o_mass = _oracle(group, adv, traj_delta, agg)
    mass = _by_trajectory(samples, grads)
    assert loss == pytest.approx(o_loss, rel=1e-12, abs=1e-15)
    assert np.allclose(mass, o_mass, rtol=1e-12, atol=1e-15)
    if agg == "seq-mean-token-mean" and off_policy == 0.0:
        assert np.allclose(mass / mass.sum(), 0.25, atol=1e-12)        # 0.25 each, whatever the turns
        assert abs(loss) < 1e-12                                       # advantages sum to 0 on-policy


def test_per_turn_rows_overweight_long_trajectories():
    """The defect the case names, shown with the same loss: when each turn is its own row (no
    row_tokens), a trajectory's gradient mass grows with its turns (1/7, 3/7, 2/7, 1/7 on-policy);
    one row per trajectory gives 1/4 each."""
    group, _ = _group(seed=1)
    samples, _ = grpo_samples([group])
    zero = [np.zeros(len(s.response_ids)) for s in samples]
    per_turn = [type(s)(**{**s.__dict__, "row_tokens": None, "row_share": 1.0}) for s in samples]
    _, g_turn = _trainer_grads(per_turn, GRPOConfig(), zero)
    _, g_traj = _trainer_grads(samples, GRPOConfig(), zero)
    m_turn, m_traj = _by_trajectory(per_turn, g_turn), _by_trajectory(samples, g_traj)
    assert np.allclose(m_turn / m_turn.sum(), np.asarray(TURNS) / sum(TURNS), atol=1e-12)
    assert np.allclose(m_traj / m_traj.sum(), 0.25, atol=1e-12)


def test_stream_trainer_on_a_policy_equals_one_forward_per_trajectory():
    """End to end on a tiny Llama: ``grpo_samples`` -> ``StreamTrainer`` (micro-batches of 2, so
    turns of one trajectory are split) gives the parameter gradients of the oracle that runs each
    trajectory as ONE sequence (first prompt + turns + observations) with the environment tokens
    masked, off-policy (behaviour log-probs = the policy's minus noise)."""
    import copy

    from ops.rl.policy import tiny_policy
    from ops.rl.rollpacker.stream import StreamTrainer

    model = tiny_policy(vocab_size=97, seed=0)
    group, rows = _group(seed=2)
    cfg = GRPOConfig()
    samples, _ = grpo_samples([group], cfg)
    tr = StreamTrainer(copy.deepcopy(model), torch.optim.SGD(model.parameters(), lr=0.0), cfg, micro_batch=2,
                       max_grad_norm=None)
    cur = tr.logprobs(samples)
    rng = random.Random(3)
    noisy = []
    for s, lp in zip(samples, cur):                           # behaviour = current - |noise| (ratios 1..1.5)
        s.old_logprobs = [x - rng.uniform(0.0, 0.4) for x in lp]
        noisy.append(s.old_logprobs)
    tr.add(samples)
    g = tr.gradients()

    ref = copy.deepcopy(model)
    ref.train()
    firsts = [r[0] for r in rows]
    logp, mask = token_logprobs(ref, firsts, [r[1] for r in rows])
    G, loss, k = len(rows), 0.0, 0
    for i, (turns, (_, row, rmask)) in enumerate(zip(TURNS, rows)):
        A = samples[k].advantage
        old = [x for seg in noisy[k:k + turns] for x in seg]
        pos = [j for j, on in enumerate(rmask) if on]                # response tokens; observations masked
        lp = logp[i, pos]
        rho = torch.exp(lp - torch.tensor(old))
        per_tok = torch.maximum(-rho * A, -torch.clamp(rho, 0.8, 1.2) * A)
        loss = loss + per_tok.mean() / G
        k += turns
    loss.backward()
    for n, p in ref.named_parameters():
        if p.grad is None:
            continue
        assert (g[n] - p.grad).abs().max() <= 1e-4 * p.grad.abs().max() + 1e-9, n
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in ref.parameters())


def test_trainer_spec_grpo_section_reaches_the_trainer(tmp_path):
    """Case rollarc-turn-weighting, configurable part: RollArc's trainer spec has a grpo section
    (aggregation, scaling, clip, KL: ``roles.grpo``, a typed GRPOConfig) to the trainer actor; bad values
    fail when the spec is built, naming the field by its path."""
    from ops.rl import scratchpad as sp
    from ops.rl.ray_actors import _TrainerImpl
    from dataclasses import asdict

    from ops.rl.rollarc.driver import RunSpec

    tok = tmp_path / "tok"
    sp.build_tokenizer(tok)

    def spec_of(**grpo):
        return RunSpec.from_dict({"methods": ["monolithic"], "roles": {"tokenizer_dir": str(tok), "grpo": grpo}})

    spec = spec_of(agg="token-mean", scale="none", clip_eps=0.3, kl_coef=0.02)
    pol = spec.role_spec.policy()
    assert pol["grpo"] == asdict(GRPOConfig(agg="token-mean", scale="none", clip_eps=0.3, kl_coef=0.02))
    tr = _TrainerImpl(pol).trainer
    assert (tr.cfg.agg, tr.cfg.scale, tr.cfg.clip_eps, tr.cfg.kl_coef) == ("token-mean", "none", 0.3, 0.02)
    assert tr.ref_model is not None and not any(p.requires_grad for p in tr.ref_model.parameters())
    assert spec_of().role_spec.grpo_config() == GRPOConfig()
    with pytest.raises(ValueError, match=r"^roles\.grpo\.agg must be one of"):
        spec_of(agg="sum")
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['roles\.grpo\.aggregation'\]"):
        spec_of(aggregation="token-mean")
    # the advantages follow the section's scaling: Dr. GRPO (none) centres only
    group, _ = _group(seed=1)
    a_std = grpo_samples([group], GRPOConfig())[0][0].advantage
    a_none = grpo_samples([group], GRPOConfig(scale="none"))[0][0].advantage
    assert a_none == pytest.approx(0.5) and a_std == pytest.approx(0.5 / (math.sqrt(1 / 3) + 1e-6), rel=1e-12)


def test_masked_tokens_reach_the_rollarc_step_row():
    """Case grpo-stale-ratio-overflow in a RollArc step: the roles' ``train`` (LocalRoles' body, on a
    StreamTrainer over a tiny Llama) trains a group in which one turn carries a behaviour log-prob 80
    nats below the trainer's; the step is applied and its row (``core._step_row``) reports
    ``masked_tokens`` 1 with a finite loss and gradient norm."""
    import asyncio
    import types

    from ops.rl.policy import tiny_policy
    from ops.rl.rollarc.core import _step_row
    from ops.rl.rollarc.local_roles import LocalRoles
    from ops.rl.rollarc.roles_common import BusyClock, RoleSpec
    from ops.rl.rollpacker.stream import StreamTrainer

    model = tiny_policy(vocab_size=97, seed=0)
    group, _ = _group(seed=4)
    tr = StreamTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), micro_batch=4)
    samples, _ = grpo_samples([group])
    for t, lps in zip((s for tj in group.trajectories for s in tj.segments), tr.logprobs(samples)):
        t.logprobs = list(lps)                                          # on-policy ...
    group.trajectories[1].segments[2].logprobs[0] -= 80.0               # ... but one stale token
    roles = types.SimpleNamespace(spec=RoleSpec(tokenizer_dir=""), trainer=tr, train_clock=BusyClock())
    metrics = asyncio.run(LocalRoles.train(roles, [group], 0))
    row = _step_row(0, [group], metrics, 0.0, 0.0)
    assert row["masked_tokens"] == 1 and tr.version == 1
    assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"]) and row["grad_norm"] > 0
    assert row["segments"] == sum(TURNS) and row["tokens"] == sum(t.response_tokens for t in group.trajectories)
