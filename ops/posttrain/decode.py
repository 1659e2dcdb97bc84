"""Greedy decoding with a key/value cache for the SFT evaluation (docs/posttrain.md, "Stage 2 and
the comparison").

The same decoding as ``ops.lm.generate.generate`` at temperature 0 — left-padded prompts, a prompt
longer than ``n_positions - max_new_tokens`` keeps its last tokens, positions counted from each
row's first real token, a row stops at its first end-of-text token — but each new token costs one
forward step over one position (the transformers ``past_key_values`` cache) instead of a forward
pass over the whole sequence. On the embedded student (a 2,048-token vocabulary, ~30-token
prompts, 16 new tokens) the full recomputation spends most of its time in the output layer of
positions whose logits are thrown away; the evaluation of every post-training checkpoint is
generation-bound, so this is what keeps three seeds per arm inside the main job's budget. Equality
with ``ops.lm.generate.generate`` is tested on a real checkpoint (tests/ops/test_posttrain_sft.py);
the padding and the per-step bookkeeping are ``generate``'s own (``ops.lm.generate.left_pad``,
``append_tokens``).
"""

from __future__ import annotations


def greedy_cached(model, prompts: list[list[int]], eot_id: int, max_new_tokens: int, n_positions: int) -> list[list[int]]:
    """Greedy continuation of each prompt by up to ``max_new_tokens`` tokens.

    Args:
        model: a transformers causal LM in eval mode that accepts ``past_key_values`` and
            ``use_cache`` (GPT-2 and the other Hugging Face causal LMs); called without gradients
            by the caller.
        prompts: token ids per prompt (each non-empty).
        eot_id: the end-of-text token (generation of a row stops there; also the padding id).
        max_new_tokens: >= 1; n_positions: the model's context length.
    Returns:
        one list of generated ids per prompt, ending before the first end-of-text token.
    Raises:
        ValueError: max_new_tokens < 1 or >= n_positions, or an empty prompt.
    """
    import torch

    from ops.lm.generate import append_tokens, left_pad

    if not 1 <= max_new_tokens < n_positions:
        raise ValueError(f"greedy_cached: max_new_tokens must be in [1, n_positions), got {max_new_tokens} ({n_positions})")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("greedy_cached: an empty prompt")
    if not prompts:
        return []
    x, attn = left_pad(prompts, eot_id, max_new_tokens, n_positions)
    B = len(prompts)
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    step = model(input_ids=x, attention_mask=attn, position_ids=pos, use_cache=True)
    past, logits, last = step.past_key_values, step.logits[:, -1], pos[:, -1]
    done = torch.zeros(B, dtype=torch.bool)
    out: list[list[int]] = [[] for _ in range(B)]
    for k in range(max_new_tokens):
        nxt = append_tokens(out, logits.argmax(-1), done, eot_id)
        if bool(done.all()) or k == max_new_tokens - 1:
            break
        attn = torch.cat([attn, torch.ones((B, 1), dtype=torch.long)], 1)
        last = last + 1
        step = model(input_ids=nxt[:, None], attention_mask=attn, position_ids=last[:, None], past_key_values=past,
                     use_cache=True)
        past, logits = step.past_key_values, step.logits[:, -1]
    return out
