"""The decontamination detector: the layers of :mod:`ops.curation.decontam` run in order on a corpus, the first
that fires reported. The layers live in their own modules (:mod:`.ngram`, :mod:`.sibling`, :mod:`.semantic`,
:mod:`.judge`); this module holds the benchmark side they share (matching forms, tokens, exact keys), the flag
record, and the runs over a corpus (:meth:`Decontaminator.run`, :meth:`Decontaminator.run_stable`), which are the
sharded path (:mod:`ops.curation.decontam_shard`) with one shard.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from ..text import compact, match_normalize, normalize
from .config import ALL_BENCHMARKS, LAYERS, DecontamConfig
from .grams import _TOKEN
from .judge import Judge, JudgeLayer
from .ngram import NgramLayers
from .semantic import SemanticLayer
from .sibling import SiblingLayer

_BENCH_NORM: dict[bool, dict[str, str]] = {}  # match_normalization -> benchmark text -> its matching form


class Decontaminator(NgramLayers, SiblingLayer, SemanticLayer, JudgeLayer):
    """Flags training problems that overlap evaluation benchmark items.

    Args:
        benchmark: dicts with ``benchmark``, ``item_id`` and ``problem``.
        config: :class:`DecontamConfig` (default: policy ``strict``).
        embedder: an object with ``encode(texts) -> (n, d) unit rows`` for the semantic layer
            (default :class:`~ops.curation.decontam.embedding.MiniLMEmbedder`, loaded only when a pair survives the prefilter).
        judge: optional :data:`Judge` for the borderline band (used only when ``config.judge``).
    Raises:
        ValueError: a benchmark item without text (names the item).
    """

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
        from ..decontam_shard import DecontamShard, run_shards

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

    def run_stable(self, problems: list[str], max_rounds: int = 3) -> list[dict | None]:
        """:meth:`run`, repeated on the rows still clean until a round flags nothing (at most ``max_rounds``).

        Two statistics depend on the set of rows — the training-side frequency caps (``max_train_df``) and the
        TF-IDF prefilter's IDF — so a row can look different once its neighbours are gone; the
        ``no_benchmark_overlap`` check re-runs the detector on the output, and this makes the output a fixed
        point of it. Rounds after the first skip the :attr:`ROW_LOCAL` layers (their verdicts cannot change).
        ``self.stats`` holds the first round's figures plus ``rounds`` and the seconds of all rounds.
        A round r >= 3 runs only when round r - 1 flagged a row (round 2 always runs).
        """
        from ..decontam_shard import DecontamShard, run_shards

        shard = DecontamShard(self, problems, max_rounds=max_rounds)
        run_shards(self, [shard])
        self.stats = shard.summary(stable=True)
        return shard.flags


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
