"""Post-training data: the chat format with its loss mask, packing, and the programmatic task slice.

Logics-STEM (arXiv 2601.01562) §3, failure-driven post-training. The embedded student is a
GPT-2-style model of a few hundred thousand parameters (a D-CPT probe base): competition problems
are out of its reach, so the measurable slice is DeepMind ``mathematics_dataset`` modules with
short answers (``TASK_MODULES``), generated with seeds by ``ops.curation.mathgen``, next to the
curated ``sft_dataset`` rows.

Chat format (one example): ``PROMPT.format(problem=...)`` followed by ``" " + response`` and the
end-of-text token. Only response tokens (and the end-of-text token) carry loss. Programmatic
responses are ``\\boxed{answer}`` so the project's verifier reads them like any other response.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

PROMPT = "Question: {problem}\nAnswer:"

# Modules with short answers where the embedded student's stage-1 accuracy is neither 0 nor 1 on
# most slices. Measured (size m, 300 steps; benchmarks/results/failure_driven.json): 2-49% per
# module on the test split. Dropped after measuring (size l, 300 steps): arithmetic__add_or_sub,
# arithmetic__add_sub_multiple and numbers__round_number (0% after 300 steps: multi-digit
# arithmetic is out of reach at this size). Answer type per module: "text" (True/False, option
# letters: case-insensitive equality) or "numeric" (math-verify).
TASK_MODULES: dict[str, str] = {
    "comparison__pair": "numeric",
    "comparison__closest": "text",
    "comparison__kth_biggest": "text",
    "numbers__place_value": "numeric",
    "numbers__is_prime": "text",
    "numbers__is_factor": "text",
    "numbers__gcd": "numeric",
    "numbers__div_remainder": "numeric",
    "algebra__linear_1d": "numeric",
}
# mathematics_dataset entropy levels -> the curation difficulty scale (1-5)
DIFFICULTY_OF_LEVEL = {"train-easy": 1, "train-medium": 3, "train-hard": 5}


def answer_type_of_module(module: str, answer: str) -> str:
    """``text`` for word/letter answers (True/False, ``a``-``j``), else the module's type."""
    a = answer.strip()
    if a in ("True", "False") or (len(a) == 1 and a.isalpha()):
        return "text"
    return TASK_MODULES.get(module, "numeric")


def boxed(answer: str) -> str:
    """The programmatic response: ``\\boxed{answer}``."""
    return f"\\boxed{{{answer}}}"


def generated_rows(per_module: int, seed: int, modules: list[str] | None = None,
                   levels: tuple[str, ...] = ("train-easy", "train-medium"), origin: str = "generated") -> list[dict]:
    """Programmatic problems as post-training rows.

    Args:
        per_module: problems per (module, level) (>= 0).
        seed: generator seed; distinct seeds give the train, eval and synthesis pools.
        modules: module names (default ``TASK_MODULES``).
        levels: mathematics_dataset levels kept.
    Returns:
        dicts with ``item_id`` (content hash), ``problem``, ``answer``, ``response`` (boxed),
        ``answer_type``, ``module``, ``level``, ``difficulty`` (1-5), ``domain`` ("math"), ``origin``.
    Raises:
        ValueError: unknown module (from the generator).
    """
    from ops.curation import mathgen

    mods = list(modules or TASK_MODULES)
    out = []
    for g in mathgen.generate(per_module, seed=seed, modules=mods):
        if g["difficulty"] not in levels:
            continue
        q, a = g["question"], g["answer"]
        out.append({"item_id": hashlib.sha1(f"{g['module']}\x1f{q}".encode()).hexdigest()[:16], "problem": q,
                    "answer": a, "response": boxed(a), "answer_type": answer_type_of_module(g["module"], a),
                    "module": g["module"], "level": g["difficulty"], "difficulty": DIFFICULTY_OF_LEVEL[g["difficulty"]],
                    "domain": "math", "origin": origin})
    return out


@dataclass
class Example:
    """One tokenised example: ``ids`` (int64, (T,)), ``mask`` (float32, (T,), 1 on response tokens)."""

    ids: np.ndarray
    mask: np.ndarray


def encode_example(tok, problem: str, response: str, eot_id: int) -> Example:
    """Tokenise one chat example; the loss mask is 1 exactly on the response tokens and the final
    end-of-text token, 0 on the prompt.

    ``tok`` is a ``tokenizers.Tokenizer``. Prompt and response are encoded separately (the prompt
    exactly as at evaluation), so the mask boundary is a token boundary.
    """
    p = tok.encode(PROMPT.format(problem=problem)).ids
    r = tok.encode(" " + response).ids + [eot_id]
    ids = np.asarray(p + r, dtype=np.int64)
    mask = np.concatenate([np.zeros(len(p), np.float32), np.ones(len(r), np.float32)])
    return Example(ids, mask)


def pack(examples: list[Example], seq_len: int, pad_id: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """Greedy packing of whole examples, in the given order, into rows of ``seq_len`` tokens.

    An example never spans two rows: when the next one does not fit, the row is padded (``pad_id``,
    mask 0) and a new row starts. Examples longer than ``seq_len`` are cut to ``seq_len`` tokens
    (their response tail is lost; counted as ``truncated``); examples whose prompt alone fills the
    row carry no loss and are dropped (``dropped``). Attention is not blocked between examples of
    a row (plain causal packing; each example starts after an end-of-text token).

    Returns:
        ids (int64, (R, seq_len)), mask (float32, (R, seq_len)), counts
        {"rows", "examples", "truncated", "dropped", "fill"} (fill = share of non-pad tokens).
    """
    rows_i, rows_m = [], []
    cur_i: list[np.ndarray] = []
    cur_m: list[np.ndarray] = []
    used = truncated = dropped = packed = 0

    def flush():
        nonlocal cur_i, cur_m, used
        if not cur_i:
            return
        ids = np.full(seq_len, pad_id, dtype=np.int64)
        mask = np.zeros(seq_len, dtype=np.float32)
        ids[:used] = np.concatenate(cur_i)
        mask[:used] = np.concatenate(cur_m)
        rows_i.append(ids)
        rows_m.append(mask)
        cur_i, cur_m, used = [], [], 0

    for ex in examples:
        ids, mask = ex.ids, ex.mask
        if len(ids) > seq_len:
            ids, mask = ids[:seq_len], mask[:seq_len]
            truncated += 1
        if mask.sum() == 0:
            dropped += 1
            continue
        if used + len(ids) > seq_len:
            flush()
        cur_i.append(ids)
        cur_m.append(mask)
        used += len(ids)
        packed += 1
    flush()
    if not rows_i:
        return (np.zeros((0, seq_len), np.int64), np.zeros((0, seq_len), np.float32),
                {"rows": 0, "examples": 0, "truncated": truncated, "dropped": dropped, "fill": 0.0})
    ids, mask = np.stack(rows_i), np.stack(rows_m)
    fill = float((np.cumsum(ids[:, ::-1] != pad_id, axis=1)[:, ::-1] > 0).mean())
    return ids, mask, {"rows": len(rows_i), "examples": packed, "truncated": truncated, "dropped": dropped, "fill": fill}


class PackedStream:
    """Packed rows of an example set, epoch after epoch, each epoch in a seeded order.

    ``take(n)`` is a deterministic function of how many rows were taken before, so a resumed run
    fast-forwards by setting ``taken`` (the same contract as ``ops.mixture.probe.BlockStream``).

    Raises:
        ValueError: the examples pack into no row.
    """

    def __init__(self, examples: list[Example], seq_len: int, pad_id: int, seed: int, name: str = "sft"):
        self.examples, self.seq_len, self.pad_id, self.seed = examples, seq_len, pad_id, seed
        self.taken, self._epoch, self._rows = 0, -1, None
        self._epoch_rows: list[int] = []
        if not examples or self._pack(0)[0].shape[0] == 0:
            raise ValueError(f"{name}: no example packs into a row of {seq_len} tokens (empty or prompt-only data)")

    def _pack(self, epoch: int):
        if epoch != self._epoch:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))
            ids, mask, self.counts = pack([self.examples[i] for i in order], self.seq_len, self.pad_id)
            self._rows, self._epoch = (ids, mask), epoch
        return self._rows

    def _rows_in(self, epoch: int) -> int:
        while len(self._epoch_rows) <= epoch:
            self._epoch_rows.append(self._pack(len(self._epoch_rows))[0].shape[0])
        return self._epoch_rows[epoch]

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Next ``n`` rows: ids (int64, (n, seq_len)), mask (float32, (n, seq_len))."""
        out_i, out_m = [], []
        # locate (epoch, offset) of row number `taken`
        epoch, offset = 0, self.taken
        while offset >= self._rows_in(epoch):
            offset -= self._rows_in(epoch)
            epoch += 1
        for _ in range(n):
            if offset >= self._rows_in(epoch):
                epoch, offset = epoch + 1, 0
            ids, mask = self._pack(epoch)
            out_i.append(ids[offset])
            out_m.append(mask[offset])
            offset += 1
        self.taken += n
        if not out_i:
            return np.zeros((0, self.seq_len), np.int64), np.zeros((0, self.seq_len), np.float32)
        return np.stack(out_i), np.stack(out_m)
