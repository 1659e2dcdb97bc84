"""GRPO training samples of RollArc's trajectories (``grpo_samples``): one trajectory is one row of
its group's loss, every LLM turn one sample with the trajectory's group-normalised advantage and its
engine log-probabilities as the old policy (RollArc, arXiv 2512.22560 §4; GRPO, arXiv 2402.03300 §4.1)."""

from __future__ import annotations

from typing import Sequence

from .types import Group


def grpo_samples(groups: Sequence[Group], cfg=None) -> tuple[list, dict]:
    """GRPO training samples of trajectories, one trajectory = one row of its group's loss.

    Each segment (LLM turn) is one sample with the trajectory's group-normalised advantage and its
    engine log-probabilities as the old policy (off-policy ratio for stale segments); environment
    tokens are context only (never trained). The samples of one trajectory carry its response
    tokens over all turns as ``row_tokens`` and their share of it as ``row_share``, so under
    ``seq-mean-token-mean`` the trajectory's loss is one token mean over all its turns with one
    denominator, and it weighs the same whatever its number of turns (TRL's and veRL's GRPO with a
    trajectory as one row and environment tokens masked; case ``rollarc-turn-weighting``). Before,
    each turn was its own row: a 3-turn trajectory got 3x the weight of a 1-turn one.

    Args:
        groups: the step's groups. cfg: the trainer's ``ops.rl.grpo.GRPOConfig`` (its ``scale``,
            ``std_floor`` and ``eps`` set the advantages); None = the defaults.
    Returns: (list of ``ops.rl.rollpacker.stream.TrainSample``, stats: zero_signal_groups,
        invalid_trajectories, segments).
    """
    from ops.rl.grpo import GRPOConfig, group_advantages
    from ops.rl.rollpacker.stream import TrainSample

    cfg = cfg if cfg is not None else GRPOConfig()
    if not isinstance(cfg, GRPOConfig):
        raise TypeError(f"grpo_samples.cfg must be an ops.rl.grpo.GRPOConfig, got {cfg!r}")
    out, zero, invalid = [], 0, 0
    for g in groups:
        rewards = [t.reward for t in g.trajectories]
        lengths = [t.response_tokens for t in g.trajectories]
        adv, valid, z = group_advantages(rewards, lengths, cfg)
        zero += z
        invalid += sum(not v for v in valid)
        for t, a, v in zip(g.trajectories, adv, valid):
            n = t.response_tokens
            for s in t.segments:
                out.append(TrainSample(prompt_ids=s.prompt_ids, response_ids=s.response_ids, advantage=a,
                                       valid=v and len(s.response_ids) > 0, old_logprobs=s.logprobs,
                                       row_tokens=n, row_share=len(s.response_ids) / n if n else 0.0))
    return out, {"zero_signal_groups": zero / max(1, len(groups)), "invalid_trajectories": invalid, "segments": len(out)}
