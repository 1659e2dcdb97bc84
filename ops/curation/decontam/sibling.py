"""Layer 4 of decontamination (:mod:`ops.curation.decontam`): template siblings, the same question with other
numbers. Word n-grams of the question stems with every digit run masked (:func:`ops.curation.text.mask_numbers`),
and the plain n-grams, so that no row keeps half of a benchmark item's n-grams. Source: Logics-STEM
(arXiv 2601.01562) §2, stage 3; the layer design is ours (docs/curation.md, "Decontamination").
"""

from __future__ import annotations

import re

import numpy as np

from .grams import gram_table

# trailing option lines of a rendered multiple-choice item ("A. 4" ... "D. 7", ops.curation.sources.render_choices)
_CHOICE_LINES = re.compile(r"(?:\n[ \t]*\(?[A-J][.)][^\n]*)+\s*$")


def stem(text: str) -> str:
    """``text`` without the trailing option lines of a multiple-choice item: the sibling layer compares
    question stems, since option lists such as "A. True, True / B. False, False" are shared by hundreds of
    unrelated MMLU items."""
    return _CHOICE_LINES.sub("", text)


class SiblingLayer:
    """Layer ``sibling`` of :class:`ops.curation.decontam.Decontaminator` (a mixin: it reads the detector's ``cfg``,
    ``items`` and ``btoks`` and its matching-form caches ``_bench_normed``/``_normed``, and keeps its own cache
    ``_sib``)."""

    #: the plain half-of-the-n-grams rule skips n-grams found in this many benchmark items or more (boilerplate such
    #: as MMLU's option lists), to bound its join; they still count in an item's total, so skipping never helps a row
    SIBLING_MAX_DF = 50

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
