"""GRPO: group-normalised advantages and the clipped policy-gradient loss with optional KL.

Source: Shao et al., DeepSeekMath (arXiv 2402.03300) §4.1 — for the R responses of one prompt with
rewards r_1..r_R, A_i = (r_i - mean(r)) / std(r), given to every token of response i; the loss is
the PPO clipped surrogate -min(rho A, clip(rho, 1-eps, 1+eps) A) with rho = pi / pi_old per token,
plus beta * KL(pi || pi_ref) (the k3 estimator exp(q) - q - 1, q = log pi_ref - log pi).
RollPacker (arXiv 2509.21009) and RollArc (arXiv 2512.22560) train with it.

Edge cases (tests/cases/training.json):
* ``grpo-zero-variance-group``: a group whose valid rewards are all equal (std <= ``std_floor``,
  fp residue included) gets advantage exactly 0, never 0/0; the fraction of such groups is reported
  as ``zero_signal_groups``.
* ``grpo-empty-response-and-nan-reward``: a response is *valid* when it has >= 1 token and a finite
  reward. Invalid responses are excluded from the group statistics and from the loss (numerator and
  denominator), masked with ``torch.where`` (never multiplied: NaN * 0 is NaN); per-response token
  means divide by max(1, T). A batch with them gives exactly the loss of its valid responses.

* ``grpo-stale-ratio-overflow`` / ``grpo-k3-kl-overflow``: the log-ratios are bounded before ``exp``.
  A token whose trainer-vs-behaviour log-ratio ``log pi - log pi_old`` has magnitude above
  ``log_ratio_bound`` (20 nats by default, veRL's clamp of ``negative_approx_kl``; a NaN or infinite
  log-ratio counts as beyond) is masked out of the policy-gradient term: its log-ratio is replaced
  by 0 *before* ``exp`` (so neither the forward nor the backward pass ever sees exp(89) = inf or
  0 * inf = NaN) and its term is 0. Likewise the k3 KL term of a token whose ``log pi_ref - log pi``
  is beyond the bound is masked, and the k3 value is clamped to ``kl_max`` (veRL's ``low_var_kl``
  clamp, 10). The tokens with a masked term are counted (``masked_tokens`` in the stats, and in the
  trainer's step metrics); they stay in the loss's denominators (a masked token weighs like a token
  with zero loss), so the rest of the step trains exactly as it would beside a harmless token.

Aggregation (veRL's names, ``agg``): ``seq-mean-token-mean`` (mean over rows of each row's token
mean: GRPO, TRL's ``grpo`` loss), ``seq-mean-token-sum`` (mean over rows of each row's token sum:
Dr. GRPO's constant normaliser up to a factor) and ``token-mean`` (mean over all tokens: DAPO). A
*row* is one response; a multi-turn trajectory (RollArc) is one row whose LLM turns are trained as
separate samples: each sample carries the row's token count (``row_tokens``, the denominator of the
row's token mean) and its share of the row (``row_share``, summing to 1 over the row's samples), so
a trajectory weighs the same whatever its number of turns, environment tokens (context only) never
trained (case ``rollarc-turn-weighting``).

The loss is returned as (numerator, denominator) so that the stream trainer can add numerators of
partial batches and divide once (``ops.rl.rollpacker.stream``). pi and pi_old are the engine's
*sampling* distribution (temperature, top-k, top-p renormalisation): ``token_logprobs`` scores with
``ops.lm.sampling.sampling_logprobs``, the function the engine records its log-probs with (case
``logprob-temperature-consistent``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from ops.lm.sampling import SamplingConfig, sampling_logprobs


@dataclass(frozen=True)
class GRPOConfig:
    """Loss hyper-parameters. ``__post_init__`` raises ValueError naming the field (``grpo.<field>``)."""

    clip_eps: float = 0.2
    """PPO clip range eps, in (0, 1): the ratio pi / pi_old is clipped to [1 - eps, 1 + eps_high]."""
    clip_eps_high: Optional[float] = None
    """Upper clip eps_high (None = clip_eps; DAPO's clip-higher uses a larger one)."""
    kl_coef: float = 0.0
    """beta of the KL penalty to the reference policy (>= 0; 0 disables it; > 0 needs ref log-probs)."""
    scale: str = "std"
    """``std`` (GRPO: divide by the group's std) or ``none`` (Dr. GRPO: centre only)."""
    std_floor: float = 1e-6
    """Groups whose reward std is <= this get advantage 0 (zero-signal groups)."""
    eps: float = 1e-6
    """Added to the group's std in the division."""
    agg: str = "seq-mean-token-mean"
    """``seq-mean-token-mean`` (mean over rows of each row's token mean; GRPO), ``seq-mean-token-sum``
    (mean over rows of each row's token sum) or ``token-mean`` (mean over all tokens of the batch; DAPO).
    A row is a response, or a whole multi-turn trajectory (``row_tokens`` / ``row_share``)."""
    log_ratio_bound: float = 20.0
    """Bound in nats on |log pi - log pi_old| and |log pi_ref - log pi|, in (0, 80] (exp(80) is finite in
    float32): a token beyond it has that term masked (log-ratio set to 0 before exp, term 0) and counted in
    ``masked_tokens``. 20 is veRL's clamp of ``negative_approx_kl``."""
    kl_max: float = 10.0
    """Upper clamp of the per-token k3 KL value (veRL's ``low_var_kl`` clamps to 10), > 0."""
    clip_ratio_c: Optional[float] = None
    """Dual-clip constant c > 1 (Ye et al., arXiv 1912.09729; veRL's ``clip_ratio_c``, 3.0 there): for a
    negative advantage the per-token loss is capped at -c * A. None = off (plain PPO clip)."""

    AGGS = ("seq-mean-token-mean", "seq-mean-token-sum", "token-mean")

    def __post_init__(self):
        if self.scale not in ("std", "none"):
            raise ValueError(f"grpo.scale must be 'std' or 'none', got {self.scale!r}")
        if self.agg not in self.AGGS:
            raise ValueError(f"grpo.agg must be one of {list(self.AGGS)}, got {self.agg!r}")
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"grpo.clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.clip_eps_high is not None and not 0 < self.clip_eps_high:
            raise ValueError(f"grpo.clip_eps_high must be > 0 or None, got {self.clip_eps_high}")
        if not self.kl_coef >= 0:
            raise ValueError(f"grpo.kl_coef must be >= 0, got {self.kl_coef}")
        if not 0 < self.log_ratio_bound <= 80:
            raise ValueError(f"grpo.log_ratio_bound must be in (0, 80] nats, got {self.log_ratio_bound}")
        if not self.kl_max > 0:
            raise ValueError(f"grpo.kl_max must be > 0, got {self.kl_max}")
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1:
            raise ValueError(f"grpo.clip_ratio_c must be > 1 or None, got {self.clip_ratio_c}")


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def group_advantages(rewards: Sequence[Optional[float]], lengths: Optional[Sequence[int]] = None,
                     cfg: GRPOConfig = GRPOConfig()) -> tuple[list[float], list[bool], bool]:
    """Advantages of one group.

    Args:
        rewards: R rewards (None or NaN = not computed / failed).
        lengths: R response lengths in tokens (0 = empty response); None = all non-empty.
    Returns:
        (advantages [R], valid [R], zero_signal): invalid responses get advantage 0.0; a group with
        fewer than 2 valid responses or std <= std_floor is zero-signal (all advantages 0.0).
    """
    lengths = lengths if lengths is not None else [1] * len(rewards)
    if len(lengths) != len(rewards):
        raise ValueError(f"group_advantages: {len(rewards)} rewards but {len(lengths)} lengths")
    valid = [_finite(r) and n > 0 for r, n in zip(rewards, lengths)]
    vals = [float(r) for r, v in zip(rewards, valid) if v]
    if len(vals) < 2:
        return [0.0] * len(rewards), valid, True
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((x - mean) ** 2 for x in vals) / (len(vals) - 1))
    if std <= cfg.std_floor or max(vals) == min(vals):
        return [0.0] * len(rewards), valid, True
    den = std + cfg.eps if cfg.scale == "std" else 1.0
    return [(float(r) - mean) / den if v else 0.0 for r, v in zip(rewards, valid)], valid, False


def batch_advantages(groups: Sequence[Sequence[Optional[float]]], lengths: Optional[Sequence[Sequence[int]]] = None,
                     cfg: GRPOConfig = GRPOConfig()) -> tuple[list[list[float]], list[list[bool]], dict]:
    """``group_advantages`` of every group, plus stats: ``zero_signal_groups`` (fraction),
    ``invalid_responses`` (empty or reward not finite)."""
    advs, valids, zero = [], [], 0
    for k, g in enumerate(groups):
        a, v, z = group_advantages(g, None if lengths is None else lengths[k], cfg)
        advs.append(a)
        valids.append(v)
        zero += z
    n = max(1, len(groups))
    return advs, valids, {"zero_signal_groups": zero / n, "invalid_responses": sum(not x for v in valids for x in v)}


def token_logprobs(model, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                   sampling: Optional[SamplingConfig] = None, pad_id: int = 0):
    """Log-probabilities of each response token under ``model``'s sampling distribution (with grad).

    Args:
        prompt_ids, response_ids: B prompts and B responses (token id lists; responses may be empty).
        sampling: the engine's SamplingConfig (temperature, top-k, top-p; ``ops.lm.sampling``); the
            log-probs are ``sampling_logprobs`` of the model's logits, the function the engine records
            with, so on unchanged weights they equal the engine's per token. None = T 1, no filter.
            A token the filters remove (possible only off-policy) gets -inf (PPO ratio 0).
    Returns:
        (logp [B, T], mask [B, T] bool) with T = max response length (>= 1); padded positions are 0.
    """
    import torch

    sampling = sampling if sampling is not None else SamplingConfig()
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(f"token_logprobs.sampling must be an ops.lm.sampling.SamplingConfig, got {sampling!r}")

    B = len(prompt_ids)
    T = max(1, max((len(r) for r in response_ids), default=1))
    seqs = [list(p) + list(r) for p, r in zip(prompt_ids, response_ids)]
    L = max(len(s) for s in seqs)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    att = torch.zeros((B, L), dtype=torch.long)
    for b, s in enumerate(seqs):                                  # right padding: positions start at 0
        ids[b, : len(s)] = torch.tensor(s)
        att[b, : len(s)] = 1
    from ops.rl.engine import model_device

    dev = model_device(model)
    ids, att = ids.to(dev), att.to(dev)
    # only the positions that predict response tokens need logits: keep the last L - start (the
    # [B, L, V] logits dominate memory at a 49k vocabulary)
    start = max(0, min(len(p) for p in prompt_ids) - 1)
    keep = L - start
    logits = model(input_ids=ids, attention_mask=att, logits_to_keep=keep).logits[:, :-1]  # [B, keep - 1, V]
    tgt = ids[:, start + 1:]                                                              # [B, keep - 1]
    tok_lp = sampling_logprobs(logits, sampling).gather(2, tgt[..., None])[..., 0]         # [B, keep - 1]
    out = torch.zeros((B, T), dtype=tok_lp.dtype, device=dev)
    mask = torch.zeros((B, T), dtype=torch.bool, device=dev)
    rows, cols, src = [], [], []
    for b, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        for t in range(len(r)):
            rows.append(b)
            cols.append(t)
            src.append(len(p) - 1 + t - start)
    if rows:
        rows_t, cols_t, src_t = (torch.tensor(x, device=dev) for x in (rows, cols, src))
        out = out.index_put((rows_t, cols_t), tok_lp[rows_t, src_t])
        mask[rows_t, cols_t] = True
    return out, mask


def grpo_loss_terms(logp, old_logp, mask, advantages, valid, cfg: GRPOConfig = GRPOConfig(), ref_logp=None,
                    row_tokens=None, row_share=None):
    """The GRPO loss of a (partial) batch as (numerator, denominator, stats).

    Per token (``m`` = mask & valid): ``pg = max(-rho A, -clip(rho, 1 - eps, 1 + eps_high) A)`` with
    ``rho = exp(log pi - log pi_old)`` (capped at -c A for A < 0 with ``clip_ratio_c``), plus
    ``kl_coef * min(k3, kl_max)`` with ``k3 = exp(q) - q - 1``, ``q = log pi_ref - log pi``. Each
    log-ratio beyond ``cfg.log_ratio_bound`` nats (or not finite) is set to 0 before exp and its term
    masked (module docstring); the count is ``stats["masked_tokens"]``.

    Args:
        logp: [B, T] log-probs with grad; old_logp: [B, T] of the policy that sampled (detached);
        mask: [B, T] bool, True on response tokens; advantages: [B] (NaN allowed where invalid);
        valid: [B] bool; ref_logp: [B, T] reference log-probs (needed when kl_coef > 0).
        row_tokens: [B] token count of the row each sample belongs to (the denominator of its token
            mean under ``seq-mean-token-mean``), >= the sample's own tokens; None = each sample is its
            own row (its own token count). row_share: [B] the sample's share of its row in the
            row-count denominator (the shares of a row's samples sum to 1); None = 1 each.
    Returns:
        numerator (scalar tensor with grad), denominator (float: sum of ``row_share`` over valid
        samples for the ``seq-mean-*`` modes, valid tokens for ``token-mean``), stats (clip_fraction,
        kl, tokens, valid_responses, masked_tokens). The loss is numerator / max(1, denominator).
    Raises:
        ValueError: kl_coef > 0 without ref_logp, shape mismatch, or a row_tokens entry below the
            sample's own valid tokens (naming the sample).
    """
    import torch

    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"grpo: logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and mask "
                         f"{tuple(mask.shape)} must have one shape [B, T]")
    if cfg.kl_coef > 0 and ref_logp is None:
        raise ValueError("grpo.kl_coef > 0 needs ref_logp (log-probs of the reference policy)")
    B = logp.shape[0]
    valid = torch.as_tensor(valid, dtype=torch.bool, device=logp.device)
    adv = torch.as_tensor(advantages, dtype=logp.dtype, device=logp.device)
    adv = torch.where(valid & torch.isfinite(adv), adv, torch.zeros_like(adv))
    m = mask & valid[:, None]
    zeros = torch.zeros_like(logp)
    bound = cfg.log_ratio_bound
    # the log-ratio is bounded before exp: beyond the bound (NaN included: the comparison is False)
    # it is replaced by 0, so exp never overflows and no 0 * inf reaches the backward pass
    delta = logp - old_logp
    pg_ok = m & (delta.abs() <= bound)
    ratio = torch.exp(torch.where(pg_ok, delta, zeros))
    hi = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    a = adv[:, None]
    pg = torch.maximum(-ratio * a, -torch.clamp(ratio, 1 - cfg.clip_eps, 1 + hi) * a)
    if cfg.clip_ratio_c is not None:                              # dual clip: bounded loss for A < 0
        pg = torch.where(a < 0, torch.minimum(pg, -cfg.clip_ratio_c * a), pg)
    per_tok = torch.where(pg_ok, pg, zeros)
    bad = m & ~pg_ok
    kl = zeros
    if cfg.kl_coef > 0:
        q = ref_logp - logp
        kl_ok = m & (q.abs() <= bound)
        qc = torch.where(kl_ok, q, zeros)
        kl = torch.where(kl_ok, torch.clamp(torch.exp(qc) - qc - 1, max=cfg.kl_max), zeros)
        per_tok = per_tok + cfg.kl_coef * kl
        bad = bad | (m & ~kl_ok)
    per_tok = torch.where(m, per_tok, zeros)
    n_tok = m.sum(dim=1)
    rt = n_tok.to(logp.dtype) if row_tokens is None else torch.as_tensor(row_tokens, dtype=logp.dtype, device=logp.device)
    share = torch.ones(B, dtype=logp.dtype, device=logp.device) if row_share is None else \
        torch.as_tensor(row_share, dtype=logp.dtype, device=logp.device)
    if rt.shape != (B,) or share.shape != (B,):
        raise ValueError(f"grpo: row_tokens {tuple(rt.shape)} and row_share {tuple(share.shape)} must have shape [{B}]")
    short = (valid & (rt < n_tok)).nonzero().flatten().tolist()
    if short:
        b = short[0]
        raise ValueError(f"grpo: sample {b} has {int(n_tok[b])} response tokens but row_tokens {float(rt[b])}: "
                         f"a row counts at least the tokens of each of its samples")
    per_seq = per_tok.sum(dim=1)
    if cfg.agg == "token-mean":
        num = per_tok.sum()
        den = float(n_tok.sum())
    else:
        if cfg.agg == "seq-mean-token-mean":
            per_seq = per_seq / rt.clamp(min=1)
        num = torch.where(valid, per_seq, torch.zeros_like(per_seq)).sum()
        den = float(torch.where(valid, share, torch.zeros_like(share)).sum())
    clipped = ((ratio < 1 - cfg.clip_eps) | (ratio > 1 + hi)) & pg_ok
    ntok = max(1, int(m.sum()))
    stats = {"clip_fraction": float(clipped.sum()) / ntok, "kl": float(kl.sum().detach()) / ntok,
             "tokens": int(m.sum()), "valid_responses": int(valid.sum()), "masked_tokens": int(bad.sum())}
    return num, den, stats


def grpo_loss(logp, old_logp, mask, advantages, valid, cfg: GRPOConfig = GRPOConfig(), ref_logp=None,
              row_tokens=None, row_share=None):
    """Loss = numerator / max(1, denominator) of ``grpo_loss_terms`` (same arguments). Returns (loss, stats)."""
    num, den, stats = grpo_loss_terms(logp, old_logp, mask, advantages, valid, cfg, ref_logp, row_tokens, row_share)
    return num / max(1.0, den), stats
