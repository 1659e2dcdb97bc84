"""Hashed word n-gram tables, the primitive of the n-gram, sibling and half-ngram layers of decontamination
(:mod:`ops.curation.decontam`), and the half-of-an-item's-n-grams count that the ``no_benchmark_overlap`` check
shares with layer ``half-ngram``.

Every n-gram is a 64-bit hash of its tokens (:data:`ops.curation.text.TOKEN_PATTERN`) in matching form
(:func:`ops.curation.text.match_normalize`), computed in Polars and numpy, so shared n-grams are counted by joins.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from ..text import TOKEN_PATTERN, match_normalize

_WORD = re.compile(r"^[^\W\d_]{2,}$")
_TOKEN = re.compile(TOKEN_PATTERN)


def _grams(toks: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)}


def _informative(toks: Sequence[str], n: int, min_words: int) -> set[tuple[str, ...]]:
    is_word = [bool(_WORD.match(t)) for t in toks]
    return {tuple(toks[i : i + n]) for i in range(len(toks) - n + 1) if sum(is_word[i : i + n]) >= min_words}


_MIX = np.uint64(0x9E3779B97F4A7C15)


def gram_table(texts: list[str], n: int, min_words: int = 0, mask: bool = False, chunk: int = 200_000):
    """Distinct word ``n``-grams of every text as 64-bit hashes, computed in Polars and numpy.

    Args:
        texts: texts already in matching form (:func:`ops.curation.text.match_normalize`).
        n: n-gram length in tokens (tokens as :data:`ops.curation.text.TOKEN_PATTERN`).
        min_words: an n-gram is ``informative`` when it holds at least this many natural-language words.
        mask: replace every digit run by ``0`` first (:func:`ops.curation.text.mask_numbers`).
        chunk: texts per batch (grams are distinct per text, so batching changes nothing but the peak memory).
    Returns:
        (table, grams_per_text): a Polars frame with columns ``doc`` (u32 text index), ``gram`` (u64),
        ``informative`` (bool), one row per distinct (doc, gram); and shape (len(texts),) int64 counts.
    """
    import polars as pl

    parts = [_gram_table_part(texts[s0 : s0 + chunk], s0, n, min_words, mask) for s0 in range(0, len(texts), chunk)]
    table = pl.concat(parts) if parts else _gram_table_part([], 0, n, min_words, mask)
    counts = np.bincount(table["doc"].to_numpy(), minlength=len(texts)).astype(np.int64)
    return table, counts


def _gram_table_part(texts: list[str], offset: int, n: int, min_words: int, mask: bool):
    import polars as pl

    s = pl.Series(texts, dtype=pl.String)
    if mask:
        s = s.str.replace_all(r"\d+", "0")
    toks = s.str.extract_all(TOKEN_PATTERN)
    lengths = toks.list.len().fill_null(0).to_numpy().astype(np.int64)
    flat = toks.explode().drop_nulls()
    h = flat.hash(seed=0x5EED).to_numpy().astype(np.uint64)
    words = np.concatenate([[0], np.cumsum(flat.str.contains(r"^[^\W\d_]{2,}$").to_numpy().astype(np.int64))])
    m = max(len(h) - n + 1, 0)
    g = np.zeros(m, dtype=np.uint64)
    for j in range(n):
        g = g * _MIX + h[j : j + m]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    doc = np.repeat(np.arange(len(texts)), lengths)[:m]
    valid = (np.arange(m) - offsets[:-1][doc]) <= lengths[doc] - n
    inf = (words[n : n + m] - words[:m]) >= min_words
    table = pl.DataFrame({"doc": (doc[valid] + offset).astype(np.uint32), "gram": g[valid], "informative": inf[valid]},
                         schema={"doc": pl.UInt32, "gram": pl.UInt64, "informative": pl.Boolean})
    return table.group_by("doc", "gram").agg(pl.col("informative").max())


def all_ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """All word n-grams of the matching form of ``text`` (:func:`ops.curation.text.match_tokens`)."""
    return _grams(_TOKEN.findall(match_normalize(text)), n)


def informative_ngrams(text: str, n: int, min_words: int) -> set[tuple[str, ...]]:
    """Word n-grams of ``text``'s matching form holding at least ``min_words`` natural-language words."""
    return _informative(_TOKEN.findall(match_normalize(text)), n, min_words)


def half_ngram_overlaps(problems: list[str], items: list[dict], n: int = 8, fraction: float = 0.5,
                        min_words: int | None = None, forms: list[str] | None = None) -> list[tuple[int, int, float]]:
    """Rows that hold at least ``fraction`` of some item's word ``n``-grams (matching form) — the criterion of
    the ``no_benchmark_overlap`` check and of layer ``half-ngram`` (no SFT row may hold half of a MATH-500
    problem's 8-grams). Every n-gram of each side is hashed (:func:`gram_table`) and the shared ones are
    counted by a join, so a million rows cost a few Polars joins, not a Python loop.

    Args:
        problems: training texts; items: dicts with ``problem``.
        min_words: when given, a (row, item) pair counts only if at least one shared n-gram is
            informative (holds ``min_words`` natural-language words): a row that shares only
            notation, a quoted textbook identity, is not a copy (case ``decontam-textbook-identity``).
            Every shared n-gram still counts towards the fraction.
        forms: the problems' matching forms when already computed (``Decontaminator.matching_forms``).
    Returns:
        (row index, item index, fraction of the item's n-grams the row holds), best item per row (the larger
        item index on a tie), in row order.
    """
    itable, icount = gram_table([match_normalize(b["problem"]) for b in items], n)
    forms = forms if forms is not None else [match_normalize(p) for p in problems]
    return _half_hits(forms, itable, icount, n, fraction, min_words)


def _half_hits(norm: list[str], itable, icount: np.ndarray, n: int, fraction: float,
               min_words: int | None) -> list[tuple[int, int, float]]:
    """:func:`half_ngram_overlaps` on texts already in matching form, against an item gram table."""
    import polars as pl

    if not norm or not itable.height:
        return []
    rows, _ = gram_table(norm, n, min_words or 0)
    hits = (rows.join(itable.select("gram", item="doc"), on="gram")
            .group_by("doc", "item").agg(shared=pl.len(), informative=pl.col("informative").any()))
    if min_words is not None:
        hits = hits.filter(pl.col("informative"))
    total = pl.DataFrame({"item": np.arange(len(icount), dtype=np.uint32), "total": icount})
    hits = (hits.join(total, on="item").with_columns(frac=pl.col("shared") / pl.col("total"))
            .sort("frac", "item", descending=[True, True]).unique("doc", keep="first")
            .filter(pl.col("frac") >= fraction).sort("doc"))
    return [(int(d), int(b), float(f)) for d, b, f in hits.select("doc", "item", "frac").iter_rows()]
