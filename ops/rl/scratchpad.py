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

**Splits of the problem space** (docs/rl_policy.md, "Train / held-out / generalisation splits"). The
space is every ``(a, q, r)``: divisor a in 2..9, quotient q in 1..60, remainder r in 0..a-1, i.e.
2,640 distinct prompts ``a:N=`` (N = q a + r). Seeded streams drawn from the whole space repeat
prompts: a held-out set that differs from the training stream only by seed (uid) shares most of its
prompts with it (200 of 256 for a 240-step GRPO stream). So the space itself is split, by content:

* ``generalisation``: every prompt whose quotient is in ``GENERALISATION_QUOTIENTS`` (7, 14, ..., 56:
  quotients never trained on; 352 prompts);
* ``heldout``: of every other (a, q) cell, the one remainder ``heldout_remainder(a, q)`` (a salted
  sha256 of the cell; 416 prompts): in-distribution, every (divisor, length) cell has a held-out
  prompt and keeps its other a - 1 prompts for training;
* ``train``: the rest (1,872 prompts). Every training stream (the SFT warm start, GRPO / RollPacker,
  RollArc) draws from ``train`` only; every evaluation from ``heldout`` or ``generalisation``.

``split_of(a, n)`` names a prompt's split; ``sample_problem(..., split=...)`` draws within one.

Torch-free; ``build_tokenizer`` imports ``tokenizers``/``transformers`` inside.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from pathlib import Path
from typing import Optional

EOS = "<eos>"
#: Every character a prompt, a response or a multi-turn observation may hold (docs/rl_policy.md).
CHARS = "0123456789+-:=\n\\boxed{}|?k"
TASK = "repeated-subtraction"
DIVISORS = tuple(range(2, 10))
"""The divisors a of the problem space."""
MAX_LINES = 60
"""The longest quotient of the problem space (``sample_problem``'s default ``max_lines``)."""
SPLITS = ("train", "heldout", "generalisation")
"""The content splits of the problem space (module docstring): training streams draw from ``train``
only, evaluations from ``heldout`` (in-distribution) or ``generalisation`` (unseen quotients)."""
GENERALISATION_QUOTIENTS = frozenset(range(7, MAX_LINES + 1, 7))
"""Quotients (chain lengths, lines) no training stream ever draws: 7, 14, ..., 56."""
_PREFIX = {"train": "sub", "heldout": "held", "generalisation": "gen"}


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


def _check_law(max_lines: int, alpha: float) -> None:
    if not isinstance(max_lines, int) or max_lines < 1:
        raise ValueError(f"scratchpad.max_lines must be an int >= 1, got {max_lines!r}")
    if alpha < 0:
        raise ValueError(f"scratchpad.alpha must be >= 0, got {alpha}")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"scratchpad.split must be one of {list(SPLITS)}, got {split!r}")


@lru_cache(maxsize=64)
def _law(split: Optional[str], max_lines: int, alpha: float) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """(quotients, cumulative weights q^-alpha) of a split's quotients in ``[1, max_lines]`` (None:
    every quotient). Raises ValueError when the split has none there."""
    qs = tuple(q for q in range(1, max_lines + 1)
               if split is None or (q in GENERALISATION_QUOTIENTS) == (split == "generalisation"))
    if not qs:
        raise ValueError(f"scratchpad split {split!r} has no quotient in [1, {max_lines}] (generalisation "
                         f"quotients: {sorted(GENERALISATION_QUOTIENTS)}): raise scratchpad.max_lines")
    return qs, tuple(accumulate(q ** -alpha for q in qs))


def sample_lines(rng: random.Random, max_lines: int, alpha: float, split: Optional[str] = None) -> int:
    """A quotient q in ``[1, max_lines]`` with ``p(q) ~ q^-alpha`` (alpha 0 = uniform), restricted to
    the quotients of ``split`` (``train`` / ``heldout``: not in ``GENERALISATION_QUOTIENTS``;
    ``generalisation``: in it; None: all). Raises ValueError for max_lines < 1, alpha < 0, an unknown
    split, or a split without a quotient in range."""
    _check_law(max_lines, alpha)
    if split is not None:
        _check_split(split)
    qs, cum = _law(split, max_lines, float(alpha))
    return rng.choices(qs, cum_weights=cum)[0]


def heldout_remainder(a: int, q: int) -> int:
    """The remainder of cell (divisor ``a``, quotient ``q``) that the ``heldout`` split holds: a
    salted sha256 of the cell, in ``[0, a)``. Fixed forever (changing it moves prompts between the
    training and evaluation splits)."""
    return int(hashlib.sha256(f"{TASK}:heldout:{a}:{q}".encode()).hexdigest()[:16], 16) % a


def split_of(a: int, n: int) -> str:
    """The split of prompt ``a:n=`` (module docstring): ``generalisation`` when its quotient n // a is
    in ``GENERALISATION_QUOTIENTS``, ``heldout`` when its remainder is the cell's
    ``heldout_remainder``, else ``train``. Raises ValueError for a < 2 or n < 0."""
    if a < 2 or n < 0:
        raise ValueError(f"scratchpad.split_of: needs a >= 2 and n >= 0, got a={a}, n={n}")
    q, r = divmod(n, a)
    if q in GENERALISATION_QUOTIENTS:
        return "generalisation"
    return "heldout" if r == heldout_remainder(a, q) else "train"


def space(max_lines: int = MAX_LINES) -> list[tuple[int, int, str]]:
    """Every prompt of the problem space up to ``max_lines`` as ``(a, n, split)``, divisor-major
    (2,640 at 60 lines: sum over a = 2..9 of 60 a)."""
    return [(a, q * a + r, split_of(a, q * a + r)) for a in DIVISORS for q in range(1, max_lines + 1) for r in range(a)]


def sample_problem(rng: random.Random, uid: str, max_lines: int = MAX_LINES, alpha: float = 1.2,
                   split: str = "train") -> Problem:
    """One problem of ``split``: divisor a uniform in 2..9, quotient q from ``sample_lines`` over the
    split's quotients, remainder uniform over the cell's remainders in the split (``train``: the a - 1
    that are not ``heldout_remainder(a, q)``; ``heldout``: that one; ``generalisation``: all a);
    N = q a + r. Divisor and length laws are therefore the same in every split. Raises ValueError
    for an unknown split or one without a quotient in ``[1, max_lines]``."""
    _check_split(split)
    a = rng.choice(DIVISORS)
    q = sample_lines(rng, max_lines, alpha, split)
    if split == "generalisation":
        r = rng.randrange(a)
    else:
        h = heldout_remainder(a, q)
        r = h if split == "heldout" else (h + 1 + rng.randrange(a - 1)) % a
    return Problem(uid, a, q * a + r)


def problems(seed: int, count: int, max_lines: int = MAX_LINES, alpha: float = 1.2, prefix: Optional[str] = None,
             split: str = "train") -> list[Problem]:
    """``count`` problems of a seeded stream within ``split`` (``uid = f"{prefix}-{seed}-{k}"``; prefix
    ``sub`` / ``held`` / ``gen`` by split unless given). Training streams use the default ``train``;
    held-out sets ``split="heldout"`` or ``"generalisation"``, which are disjoint from every training
    stream by prompt text whatever the seeds (draws within a split repeat prompts: the splits hold
    1,872 / 416 / 352 prompts at 60 lines). Raises ValueError as ``sample_problem``."""
    _check_split(split)
    rng = random.Random(f"{TASK}:{seed}" if split == "train" else f"{TASK}:{split}:{seed}")
    prefix = _PREFIX[split] if prefix is None else prefix
    return [sample_problem(rng, f"{prefix}-{seed}-{k}", max_lines, alpha, split) for k in range(count)]


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
