"""Remainder by repeated subtraction: the verifiable, long-tailed scratchpad task of the small RL policy.

The RL systems (RollPacker, docs/rollpacker.md; RollArc, docs/rollarc.md) need a policy that gets
rewards and responses whose length depends on the prompt with a long tail. A problem is ``a:N=``
(a: divisor in 2..9, N: a non-negative integer); the correct response subtracts ``a`` from the
running value, one line per subtraction, until the value is below ``a``, then writes that value,
``N mod a``, in ``\\boxed{}``::

    7:45=
    38
    31
    24
    17
    10
    3
    \\boxed{3}

A response has ``q = N // a`` lines of at most 4 characters (tokens: the tokenizer is
character-level) plus the boxed answer, so its length is linear in the quotient and the length tail
of a batch is the tail of the quotients. Every line is a local operation (the previous line minus
the digit at position 0 of the prompt), so a small model learns it in minutes and its remaining
errors are per-line slips: the longer the chain, the lower the pass rate, which is what GRPO then
improves. ``sample_problem`` draws q from a power law ``p(q) ~ q^-alpha`` on ``[1, max_lines]``
(the RL prompt distribution: median 2-3 lines, a few 40-60-line problems per batch); the SFT warm
start trains on a flatter law so every length is seen. The answer is checked by the project's
reward (``ops.rl.reward``: the last ``\\boxed{}``, verified with math-verify) like any curated
problem.

Torch-free; ``build_tokenizer`` imports ``tokenizers``/``transformers`` inside.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

EOS = "<eos>"
#: Every character a prompt, a response or a multi-turn observation may hold (docs/rl_policy.md).
CHARS = "0123456789+-:=\n\\boxed{}|?k"
TASK = "repeated-subtraction"


@dataclass(frozen=True)
class Problem:
    """One problem: ``N mod a`` by repeated subtraction."""

    uid: str
    """Stable id (``<prefix>-<seed>-<k>``)."""
    a: int
    """The divisor a (2..9 in ``sample_problem``'s problems)."""
    n: int
    """The dividend N (the answer is N mod a)."""

    @property
    def lines(self) -> int:
        """Subtractions of the correct response (the quotient N // a)."""
        return self.n // self.a

    @property
    def prompt(self) -> str:
        return f"{self.a}:{self.n}="

    @property
    def answer(self) -> str:
        return str(self.n % self.a)


def chain(a: int, n: int) -> list[str]:
    """The scratchpad lines of ``n mod a`` (no newline): n - a, n - 2a, ... down to n mod a."""
    out, v = [], n
    while v >= a:
        v -= a
        out.append(str(v))
    return out


def solution(a: int, n: int) -> str:
    """The correct response of ``a:n=`` (without EOS): the chain, then ``\\boxed{n mod a}``."""
    return "".join("\n" + line for line in chain(a, n)) + "\n\\boxed{" + str(n % a) + "}"


def sample_lines(rng: random.Random, max_lines: int, alpha: float) -> int:
    """A quotient q in ``[1, max_lines]`` with ``p(q) ~ q^-alpha`` (alpha 0 = uniform). Raises
    ValueError for max_lines < 1 or alpha < 0."""
    if max_lines < 1:
        raise ValueError(f"scratchpad.max_lines must be >= 1, got {max_lines}")
    if alpha < 0:
        raise ValueError(f"scratchpad.alpha must be >= 0, got {alpha}")
    weights = [q ** -alpha for q in range(1, max_lines + 1)]
    return rng.choices(range(1, max_lines + 1), weights=weights)[0]


def sample_problem(rng: random.Random, uid: str, max_lines: int = 60, alpha: float = 1.2) -> Problem:
    """One problem: divisor a uniform in 2..9, quotient q from ``sample_lines``, remainder uniform
    in ``[0, a)``; N = q a + r."""
    a = rng.randint(2, 9)
    q = sample_lines(rng, max_lines, alpha)
    return Problem(uid, a, q * a + rng.randrange(a))


def problems(seed: int, count: int, max_lines: int = 60, alpha: float = 1.2, prefix: str = "sub") -> list[Problem]:
    """``count`` problems of a seeded stream (``uid = f"{prefix}-{seed}-{k}"``); distinct seeds give
    disjoint uids, so a held-out set is a different seed."""
    rng = random.Random(f"{TASK}:{seed}")
    return [sample_problem(rng, f"{prefix}-{seed}-{k}", max_lines, alpha) for k in range(count)]


def build_tokenizer(folder: Optional[str | Path] = None):
    """The character-level tokenizer of the task (``transformers.PreTrainedTokenizerFast`` over a
    ``tokenizers`` WordLevel model; one token per character of ``CHARS``, ``<eos>`` = pad = id 0).
    Saved to ``folder`` (``tokenizer.json`` + config, loadable with ``AutoTokenizer``) when given."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {EOS: 0, **{ch: i + 1 for i, ch in enumerate(CHARS)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token=EOS))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=EOS, pad_token=EOS, unk_token=EOS)
    if folder is not None:
        tok.save_pretrained(str(folder))
    return tok


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` (one per character). Raises ValueError naming the first character the
    vocabulary does not hold."""
    bad = next((ch for ch in text if ch not in CHARS), None)
    if bad is not None:
        raise ValueError(f"scratchpad tokenizer: character {bad!r} is not in the vocabulary {CHARS!r}")
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def to_prompt(tokenizer, p: Problem):
    """The RL ``Prompt`` of a problem (token ids of ``a:N=``, answer ``N mod a``, numeric)."""
    from ops.rl.types import Prompt

    return Prompt(uid=p.uid, token_ids=tuple(encode(tokenizer, p.prompt)), text=p.prompt, answer=p.answer,
                  answer_type="numeric")


def response_length(p: Problem) -> int:
    """Tokens of the correct response, EOS included."""
    return len(solution(p.a, p.n)) + 1


def score_text(p: Problem, text: str) -> bool:
    """Whether a response ends with the correct ``\\boxed{N mod a}`` (the fast local check of the
    held-out evaluation; training rewards go through the reward service)."""
    return text.rstrip().endswith("\\boxed{" + p.answer + "}")


def heldout_accuracy(model, tokenizer, probs: list[Problem], temperature: float = 1.0, max_new_tokens: int = 256,
                     batch: int = 128, seed: int = 0) -> dict:
    """Pass rate of ``model`` on held-out problems: one response per problem, greedy when
    ``temperature`` is 0, else sampled at ``temperature`` (torch's RNG forked and seeded with
    ``seed``, so the call leaves the caller's stream untouched and repeats exactly).

    Returns ``{"accuracy": fraction in [0, 1], "n": problems, "by_lines": {bucket: [accuracy, n]},
    "mean_len": mean response tokens}``; buckets are quotient ranges ``1``, ``2-3``, ``4-7``,
    ``8-15``, ``16-31``, ``32+``. Raises ValueError for an empty problem list."""
    import torch

    if not probs:
        raise ValueError("heldout_accuracy: no problems")
    pad = tokenizer.pad_token_id
    hits, lens, buckets = [], [], {}
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        for k in range(0, len(probs), batch):
            chunk = probs[k:k + batch]
            ids = [encode(tokenizer, p.prompt) for p in chunk]
            w = max(map(len, ids))
            x = torch.full((len(ids), w), pad, dtype=torch.long)
            att = torch.zeros_like(x)
            for i, a in enumerate(ids):
                x[i, w - len(a):] = torch.tensor(a)
                att[i, w - len(a):] = 1
            first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
            if first is not None:                                # the model's device (GPU runs)
                x, att = x.to(first.device), att.to(first.device)
            kw = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else {"do_sample": False}
            out = model.generate(input_ids=x, attention_mask=att, max_new_tokens=max_new_tokens, pad_token_id=pad,
                                 eos_token_id=tokenizer.eos_token_id, **kw)
            for p, row in zip(chunk, out[:, w:].cpu().tolist()):
                n = next((j for j, t in enumerate(row) if t == tokenizer.eos_token_id), len(row))
                ok = score_text(p, tokenizer.decode(row[:n]))
                hits.append(ok)
                lens.append(n + 1)
                q = p.lines
                b = "1" if q < 2 else "2-3" if q < 4 else "4-7" if q < 8 else "8-15" if q < 16 else "16-31" if q < 32 else "32+"
                buckets.setdefault(b, []).append(ok)
    return {"accuracy": sum(hits) / len(hits), "n": len(hits), "mean_len": sum(lens) / len(lens),
            "by_lines": {b: [sum(v) / len(v), len(v)] for b, v in buckets.items()}}


# ------------------------------------------------------------------------------ multi-turn (tool) form

#: Lines the policy writes per turn in the multi-turn form before it asks the checker (``?``).
TURN_LINES = 8
#: The checker's reply to a turn whose lines are all correct (any wrong line ends the episode).
CHECK_OK = "ok"


def tool_prompt(p: Problem) -> str:
    """The multi-turn form of a problem: ``a:N?`` (the ``?`` asks for checked turns)."""
    return f"{p.a}:{p.n}?"


def tool_turns(a: int, n: int, turn_lines: int = TURN_LINES) -> list[tuple[str, Optional[str]]]:
    """The correct trajectory of ``a:N?``: ``(assistant text, observation)`` per turn. Every turn but
    the last writes ``turn_lines`` chain lines and ends with ``?`` (a check request; observation
    ``CHECK_OK``); the last writes the remaining lines and ``\\boxed{N mod a}`` (observation None:
    the episode ends). Turns: ``q // turn_lines + 1``."""
    lines = chain(a, n)
    turns: list[tuple[str, Optional[str]]] = []
    while len(lines) >= turn_lines:
        head, lines = lines[:turn_lines], lines[turn_lines:]
        turns.append(("".join("\n" + x for x in head) + "?", CHECK_OK))
    turns.append(("".join("\n" + x for x in lines) + "\n\\boxed{" + str(n % a) + "}", None))
    return turns
