"""Generation of the LM substrate: greedy or sampled continuation of left-padded prompts.

Sampling draws each token from ``softmax(top_p(top_k(logits / T)))`` with the sampling
distribution of the rollout engines (``ops.lm.sampling``: transformers' temperature, top-k and
top-p warpers, in that order); temperature 0 is greedy (argmax, deterministic). Sources: Holtzman
et al., "The Curious Case of Neural Text Degeneration" (ICLR 2020, arXiv 1904.09751) §3.1 for
nucleus sampling; Fan et al. (ACL 2018) for top-k. Used by the SFT evaluation (docs/posttrain.md,
"Student and data").
"""

from __future__ import annotations

from typing import Optional


def generate(model, prompts: list[list[int]], eot_id: int, max_new_tokens: int, n_positions: int, *,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, generator=None) -> list[list[int]]:
    """Continue each prompt by up to ``max_new_tokens`` tokens, batched with left padding.

    Args:
        model: a causal LM in eval mode (called without gradients by the caller).
        prompts: token ids per prompt; a prompt longer than ``n_positions - max_new_tokens`` keeps
            its last tokens.
        eot_id: the end-of-text token: generation of a row stops there (also the padding id).
        temperature: 0 = greedy; > 0 = sampling with top-k (0 = off) and top-p (1.0 = off).
        generator: a ``torch.Generator`` for reproducible sampling (None: torch's global one).
    Returns:
        one list of generated ids per prompt, ending before the first end-of-text token.
    Raises:
        ValueError: temperature < 0, or top_k / top_p out of range (``ops.lm.sampling.SamplingConfig``).
    """
    import torch

    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    sampling = _sampling(temperature, top_k, top_p)
    x, attn = left_pad(prompts, eot_id, max_new_tokens, n_positions)
    B = len(prompts)
    done = torch.zeros(B, dtype=torch.bool)
    out = [[] for _ in range(B)]
    for _ in range(max_new_tokens):
        pos = (attn.cumsum(1) - 1).clamp(min=0)
        logits = model(input_ids=x, attention_mask=attn, position_ids=pos).logits[:, -1]
        nxt = logits.argmax(-1) if sampling is None else next_tokens(logits, sampling, generator)
        nxt = append_tokens(out, nxt, done, eot_id)
        if bool(done.all()):
            break
        x = torch.cat([x, nxt[:, None]], 1)
        attn = torch.cat([attn, torch.ones((B, 1), dtype=torch.long)], 1)
    return out


def left_pad(prompts: list[list[int]], eot_id: int, max_new_tokens: int, n_positions: int):
    """The prompts as one left-padded batch: ``(input_ids, attention_mask)``, both int64 (B, L) with
    L the longest prompt after each keeps its last ``n_positions - max_new_tokens`` tokens; padding
    is ``eot_id`` with mask 0. Shared by ``generate`` and ``ops.posttrain.decode.greedy_cached``."""
    import torch

    keep = n_positions - max_new_tokens
    prompts = [p[-keep:] for p in prompts]
    B, L = len(prompts), max(len(p) for p in prompts)
    x = torch.full((B, L), eot_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    for i, p in enumerate(prompts):
        x[i, L - len(p):] = torch.tensor(p, dtype=torch.long)
        attn[i, L - len(p):] = 1
    return x, attn


def append_tokens(out: list[list[int]], nxt, done, eot_id: int):
    """One decoding step's bookkeeping: the next token ``nxt`` (int64 (B,)) of every finished row
    becomes ``eot_id``, each unfinished row's token is appended to ``out`` unless it is ``eot_id``,
    and ``done`` (bool (B,)) is updated in place. Returns the masked ``nxt`` (the tokens fed back)."""
    import torch

    nxt = torch.where(done, torch.full_like(nxt, eot_id), nxt)
    for i in range(len(out)):
        if not done[i] and nxt[i].item() != eot_id:
            out[i].append(int(nxt[i]))
    done |= nxt == eot_id
    return nxt


def _sampling(temperature: float, top_k: int, top_p: float):
    from ops.lm.sampling import SamplingConfig

    if temperature == 0:
        SamplingConfig(1.0, top_k, top_p)               # the filters' ranges are checked all the same
        return None
    return SamplingConfig(temperature, top_k, top_p)


def next_tokens(logits, sampling, generator: Optional[object] = None):
    """One token per row drawn from the warped distribution of ``logits`` (B, V) (``sampling``: an
    ``ops.lm.sampling.SamplingConfig``). Returns int64 (B,)."""
    import torch

    from ops.lm.sampling import warp_logits

    probs = torch.softmax(warp_logits(logits, sampling), dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
