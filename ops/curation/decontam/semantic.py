"""Layer 5 of decontamination (:mod:`ops.curation.decontam`): rephrasings, found by a TF-IDF prefilter and
confirmed by sentence embeddings (all-MiniLM-L6-v2, :mod:`ops.curation.decontam.embedding`).

The prefilter's features are word uni- and bigrams counted in Polars and weighted as scikit-learn's
``TfidfVectorizer(sublinear_tf=True)`` would, with the IDF taken from document frequencies that add up over
shards (:mod:`ops.curation.decontam_shard`). Source: Logics-STEM (arXiv 2601.01562) §2, stage 3; the layer design
is ours (docs/curation.md, "Decontamination").
"""

from __future__ import annotations

import re
import time
from collections import Counter

import numpy as np

from ..text import TOKEN_PATTERN
from .embedding import MiniLMEmbedder

_ASY = re.compile(r"\[asy\].*?(?:\[/asy\]|$)", re.S)  # Asymptote drawing code: noise for a sentence embedding
# sentence ends of the matching form (lower case, one line): the semantic layer's template test splits there
_SEGMENT = re.compile(r"(?<=[.?!:;|])\s+")


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


class SemanticLayer:
    """Layer 5 of :class:`ops.curation.decontam.Decontaminator` (a mixin: it reads the detector's ``cfg``, ``bnorm``,
    ``sem_items``, ``embedder`` and ``stats``, and keeps its own caches ``_templates``, ``_sem_texts`` and
    ``_sem_bench``)."""

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
