"""Evaluation hooks of the LM substrate: validation losses of token streams, teacher-forced response
losses and token log-probabilities of completions.

Every function takes the unwrapped model already in eval mode without gradients
(``ops.lm.train.Trainer.evaluate`` / ``ops.lm.train.evaluating``). Losses are next-token
cross-entropies in nats per token (docs/mixture.md, "Probe grid"; docs/posttrain.md, "Student and
data").
"""

from __future__ import annotations

import numpy as np


def stream_losses(model, streams: dict[str, np.ndarray], dp, batch: int = 16) -> dict[str, float]:
    """Mean next-token loss (nats/token) of each validation stream, over every rank.

    Args:
        streams: name -> blocks (n, T) of token ids; rank r scores blocks r, r + world, ...
        dp: ``ops.lm.train.DataParallel`` (the sums are all-reduced over its ranks).
        batch: blocks per forward pass.
    Returns:
        name -> loss; every rank gets the same numbers.
    """
    import torch
    import torch.nn.functional as F

    out = {}
    for name, blocks in streams.items():
        mine = blocks[dp.rank::dp.world]
        s = torch.zeros(2, dtype=torch.float64, device=model.device)   # gloo on CPU, NCCL on GPU
        for i in range(0, len(mine), batch):
            x = torch.from_numpy(np.asarray(mine[i:i + batch], dtype=np.int64)).to(model.device)
            logits = model(input_ids=x).logits[:, :-1]
            s[0] += F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="sum").double()
            s[1] += x[:, 1:].numel()
        dp.all_sum(s)
        out[name] = float(s[0] / s[1])
    return out


def _teacher_forced(model, prompts: list[list[int]], completions: list[list[int]], pad_id: int, n_positions: int):
    """Per-token cross-entropy (B, T - 1) of prompt + completion rows (right-padded with ``pad_id``,
    cut to their last ``n_positions`` tokens) and the mask (B, T - 1) of completion tokens."""
    import torch
    import torch.nn.functional as F

    seqs, masks = [], []
    for p, g in zip(prompts, completions):
        seqs.append((p + g)[-n_positions:])
        masks.append(([0] * len(p) + [1] * len(g))[-n_positions:])
    T = max(len(s) for s in seqs)
    x = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mk = torch.zeros((len(seqs), T))
    for i, (s, m) in enumerate(zip(seqs, masks)):
        x[i, :len(s)] = torch.tensor(s)
        mk[i, :len(m)] = torch.tensor(m, dtype=torch.float)
    logits = model(input_ids=x).logits[:, :-1]
    ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="none").view(len(seqs), -1)
    return ce, mk[:, 1:]


def response_losses(model, prompts: list[list[int]], golds: list[list[int]], eot_id: int, n_positions: int) -> list[float]:
    """Teacher-forced mean cross-entropy (nats/token) of each gold response given its prompt; a
    response cut away entirely by ``n_positions`` scores 0."""
    ce, m = _teacher_forced(model, prompts, golds, eot_id, n_positions)
    return ((ce * m).sum(1) / m.sum(1).clamp(min=1)).tolist()


def completion_logprobs(model, prompts: list[list[int]], completions: list[list[int]], pad_id: int,
                        n_positions: int) -> list[list[float]]:
    """Log-probability (nats) of each completion token given the prompt and the tokens before it,
    under the model's softmax (one list per completion, its kept tokens in order)."""
    ce, m = _teacher_forced(model, prompts, completions, pad_id, n_positions)
    return [(-ce[i][m[i] > 0]).tolist() for i in range(len(prompts))]
