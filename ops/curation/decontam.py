"""Benchmark decontamination of training problems, in three layers.

Source: Logics-STEM (arXiv 2601.01562) §2, stage 3 (decontamination against evaluation
benchmarks); our layer design (the paper leaves it open; docs/curation.md, "Decontamination"):

1. ``exact`` — the normalised text equals a benchmark item's, or (for benchmark items under
   ``short_words`` tokens, which an n-gram layer cannot see: 32 of MATH-500's problems) the
   compact key (no whitespace, no ``$``, no final dot) matches — case ``decontam-short-benchmark-item``.
2. ``ngram`` — word ``n``-gram overlap (default 8). An n-gram counts only if it is *informative*:
   it holds at least ``min_words`` natural-language words (letters, length >= 2, not a LaTeX
   command) — so a quoted identity such as the tan addition formula, which is all notation, never
   counts (case ``decontam-textbook-identity``) — and it is not frequent: present in fewer than
   ``max_benchmark_df`` benchmark items and fewer than ``max_train_df`` training rows. A row is
   flagged when it shares ``min_shared`` such n-grams with one benchmark item, or covers at least
   ``containment`` of that item's informative n-grams.
3. ``minhash`` — MinHash-LSH (word 5-grams) between training rows and benchmark items, verified by
   exact Jaccard >= ``minhash_threshold``: catches light edits.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from . import minhash
from .text import compact, normalize, tokens

_WORD = re.compile(r"^[^\W\d_]{2,}$")


@dataclass
class DecontamConfig:
    """Parameters of :class:`Decontaminator` (see the module docstring for their meaning); the
    ``decontaminated_problems`` run config mirrors them.

    Raises:
        ValueError: a field outside its range (``ops.curation.minhash.DedupConfigError`` for the
            MinHash layer's ``minhash_threshold`` in (0, 1) and ``num_perm`` in [16, 8192]).
    """

    ngram: int = 8
    short_words: int = 8
    min_words: int = 3
    max_benchmark_df: int = 4
    max_train_df: int = 50
    containment: float = 0.8
    minhash_threshold: float = 0.75
    num_perm: int = 128

    def __post_init__(self):
        if self.ngram < 2:
            raise ValueError(f"decontam.ngram must be >= 2, got {self.ngram}")
        if not 0 <= self.min_words <= self.ngram:
            raise ValueError(f"decontam.min_words must be in [0, ngram={self.ngram}], got {self.min_words}")
        for name in ("short_words", "max_benchmark_df", "max_train_df"):
            if getattr(self, name) < (0 if name == "short_words" else 1):
                raise ValueError(f"decontam.{name} must be >= {0 if name == 'short_words' else 1}, got {getattr(self, name)}")
        if not 0 < self.containment <= 1:
            raise ValueError(f"decontam.containment must be in (0, 1], got {self.containment}")
        minhash.check_threshold(self.minhash_threshold, "decontam.minhash_threshold", allow_exact=False)
        minhash.check_num_perm(self.num_perm, "decontam.num_perm")


def all_ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """All word n-grams of ``text`` (tokens as in :func:`ops.curation.text.tokens`)."""
    toks = tokens(text)
    return {tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)}


def informative_ngrams(text: str, n: int, min_words: int) -> set[tuple[str, ...]]:
    """Word n-grams of ``text`` holding at least ``min_words`` natural-language words."""
    toks = tokens(text)
    is_word = [bool(_WORD.match(t)) for t in toks]
    out = set()
    for i in range(len(toks) - n + 1):
        if sum(is_word[i : i + n]) >= min_words:
            out.add(tuple(toks[i : i + n]))
    return out


class Decontaminator:
    """Flags training problems that overlap evaluation benchmark items.

    Args:
        benchmark: dicts with ``benchmark``, ``item_id`` and ``problem``.
        config: :class:`DecontamConfig`.
    Raises:
        ValueError: a benchmark item without text (names the item).
    """

    def __init__(self, benchmark: list[dict], config: DecontamConfig | None = None):
        self.cfg = config or DecontamConfig()
        self.items = benchmark
        for b in benchmark:
            if not isinstance(b.get("problem"), str) or not b["problem"].strip():
                raise ValueError(f"benchmark item {b.get('item_id')!r} ({b.get('benchmark')}) has no problem text")
        self.exact: dict[str, int] = {}
        self.short: dict[str, int] = {}
        for i, b in enumerate(benchmark):
            self.exact.setdefault(normalize(b["problem"]), i)
            if len(tokens(b["problem"])) < self.cfg.short_words:
                self.short.setdefault(compact(b["problem"]), i)
        self.grams = [informative_ngrams(b["problem"], self.cfg.ngram, self.cfg.min_words) for b in benchmark]
        self.index: dict[tuple, list[int]] = defaultdict(list)
        for i, gs in enumerate(self.grams):
            for g in gs:
                self.index[g].append(i)

    def run(self, problems: list[str]) -> list[dict | None]:
        """One result per problem: None when clean, else a dict with ``benchmark``, ``item_id``,
        ``layer`` (exact | ngram | minhash), ``score`` (shared n-grams, containment or Jaccard)."""
        cfg = self.cfg
        out: list[dict | None] = [None] * len(problems)

        def flag(i, bi, layer, score):
            if out[i] is None:
                b = self.items[bi]
                out[i] = {"benchmark": b["benchmark"], "item_id": b["item_id"], "layer": layer, "score": float(score)}

        # layer 1: exact and short-item keys
        for i, p in enumerate(problems):
            bi = self.exact.get(normalize(p))
            if bi is None:
                bi = self.short.get(compact(p))
            if bi is not None:
                flag(i, bi, "exact", 1.0)
        # layer 2: informative, infrequent n-grams
        train_grams = [informative_ngrams(p, cfg.ngram, cfg.min_words) for p in problems]
        train_df = Counter(g for gs in train_grams for g in gs if g in self.index)
        bench_all: dict[int, set] = {}
        for i, gs in enumerate(train_grams):
            if out[i] is not None or not gs:
                continue
            cands: set[int] = set()
            for g in gs:
                hits = self.index.get(g)
                if not hits or len(hits) >= cfg.max_benchmark_df or train_df[g] >= cfg.max_train_df:
                    continue
                cands.update(hits)
            if not cands:
                continue
            tg = all_ngrams(problems[i], cfg.ngram)
            best = None
            for bi in cands:
                bg = bench_all.get(bi)
                if bg is None:
                    bg = bench_all[bi] = all_ngrams(self.items[bi]["problem"], cfg.ngram)
                cont = len(bg & tg) / max(min(len(bg), len(tg)), 1)
                if cont >= cfg.containment and (best is None or cont > best[1]):
                    best = (bi, cont)
            if best:
                flag(i, best[0], "ngram", best[1])
        # layer 3: MinHash-LSH against the benchmark, verified by exact Jaccard
        rest = [i for i in range(len(problems)) if out[i] is None]
        if rest:
            texts = [problems[i] for i in rest] + [b["problem"] for b in self.items]
            batch = minhash.shingle_batch(texts)
            bands, rows = minhash.lsh_params(cfg.minhash_threshold, cfg.num_perm)
            sig = minhash.signatures(batch, cfg.num_perm)
            cand = minhash.band_candidates(sig, bands, rows)
            n_train = len(rest)
            cross = cand[(cand[:, 0] < n_train) & (cand[:, 1] >= n_train)]
            sims = minhash.pair_jaccard(batch, cross)
            for (t, b), j in zip(cross.tolist(), sims.tolist()):
                i = rest[t]
                if j >= cfg.minhash_threshold and (out[i] is None or out[i]["score"] < j):
                    out[i] = None
                    flag(i, b - n_train, "minhash", j)
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
