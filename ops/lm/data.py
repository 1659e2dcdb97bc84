"""Training data of the LM substrate: token block streams, loss-masked packed examples, and the mixed
global batch of two streams at a ratio.

Every stream is a deterministic function of how many rows were taken before (its ``taken``), so a
checkpoint records the data position as integers and a resumed run continues with the very rows
an uninterrupted run would have seen (docs/mixture.md, "Probe grid"; docs/posttrain.md, "Student
and data"). numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np


def mixture_counts(step: int, global_batch: int, ratio: float) -> int:
    """Rows of the first stream in optimizer step ``step`` (0-based) of a two-stream mixture: a
    deterministic schedule whose running total is ``round(steps * global_batch * ratio)``, so the
    realised ratio is exact up to one sequence at every prefix (the D-CPT mixture ratio r_d,
    arXiv 2406.01375 §3; docs/mixture.md, "Probe grid")."""
    return int(math.floor((step + 1) * global_batch * ratio + 0.5) - math.floor(step * global_batch * ratio + 0.5))


def first_blocks(tokens: np.ndarray, seq_len: int, n: int) -> np.ndarray:
    """The first ``n`` whole blocks of ``seq_len`` tokens of a (validation) stream, shape
    (min(n, len // seq_len), seq_len); fewer when the stream is short."""
    k = min(n, tokens.size // seq_len)
    return tokens[: k * seq_len].reshape(k, seq_len)


class BlockStream:
    """A token stream read as non-overlapping blocks of ``seq_len`` tokens in a seeded order that is
    reshuffled each epoch. ``take(n)`` is deterministic given how many blocks were taken before.

    Raises:
        ValueError: the stream holds fewer tokens than one block (the message names it).
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int, name: str):
        self.n_blocks = tokens.size // seq_len
        if self.n_blocks == 0:
            raise ValueError(f"token stream {name!r} has {tokens.size} tokens, fewer than one block of {seq_len}")
        self.blocks = tokens[: self.n_blocks * seq_len].reshape(self.n_blocks, seq_len)
        self.seed, self.taken, self._epoch, self._perm = seed, 0, -1, None

    def _order(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n_blocks)
            self._epoch = epoch
        return self._perm

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` blocks, shape (n, seq_len), the stream's dtype."""
        out = []
        for i in range(self.taken, self.taken + n):
            out.append(self.blocks[self._order(i // self.n_blocks)[i % self.n_blocks]])
        self.taken += n
        return np.stack(out) if out else np.zeros((0, self.blocks.shape[1]), dtype=self.blocks.dtype)

    def rows(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``n`` blocks with their loss mask: ids (n, seq_len), mask float32 of ones (every
        token of a corpus block carries loss)."""
        ids = self.take(n)
        return ids, np.ones(ids.shape, np.float32)


@dataclass
class Example:
    """One tokenised example: ``ids`` (int64, (T,)), ``mask`` (float32, (T,), 1 on loss tokens)."""

    ids: np.ndarray
    mask: np.ndarray


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
    continues by setting ``taken`` (the same contract as ``BlockStream``).

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

    rows = take


class MixedBatches:
    """The global batches of a run: optimizer step ``s`` takes ``mixture_counts(s, global_batch,
    ratio)`` rows of ``first`` and the rest of ``second``, in that order (the first stream's rows
    lead the batch). Either stream may be None when the ratio never draws from it.

    ``position()`` / ``seek()`` are the data position a checkpoint records.

    Raises:
        ValueError: ``ratio`` outside [0, 1], or a stream the ratio draws from is None.
    """

    def __init__(self, first, second, global_batch: int, ratio: float, name: str = "batches"):
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"{name}: mixture ratio {ratio} outside [0, 1]")
        if (ratio > 0 and first is None) or (ratio < 1 and second is None):
            raise ValueError(f"{name}: ratio {ratio} draws from a stream that is missing")
        self.first, self.second, self.global_batch, self.ratio = first, second, global_batch, ratio

    def take(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """The global batch of step ``step`` (steps are taken in order): ids int64 (G, T), mask
        float32 (G, T)."""
        n = mixture_counts(step, self.global_batch, self.ratio)
        parts = [s.rows(k) for s, k in ((self.first, n), (self.second, self.global_batch - n)) if s is not None]
        ids = np.concatenate([p[0] for p in parts]).astype(np.int64, copy=False)
        return ids, np.concatenate([p[1] for p in parts])

    def position(self) -> dict[str, Optional[int]]:
        """Rows taken so far from each stream (None for a missing one)."""
        return {"first": getattr(self.first, "taken", None), "second": getattr(self.second, "taken", None)}

    def seek(self, position: dict) -> None:
        """Continue from a recorded ``position()``."""
        for name in ("first", "second"):
            stream = getattr(self, name)
            if stream is not None:
                stream.taken = int(position[name])
