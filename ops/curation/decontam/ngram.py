"""Layers 1-3 and 6 of decontamination (:mod:`ops.curation.decontam`): copies and light edits.

``exact`` (equal token sequences, or the compact key of a short benchmark item), ``ngram`` (containment of rare,
informative word n-grams, then the verbatim test: a row holding a whole benchmark item), ``minhash`` (MinHash-LSH
on word 5-grams, verified by exact Jaccard; :mod:`ops.curation.minhash`) and ``half-ngram`` (no row may hold half
of a MATH-500 item's word 8-grams). Source: Logics-STEM (arXiv 2601.01562) §2, stage 3; the layer design is ours.
"""

from __future__ import annotations

import numpy as np

from .. import minhash
from ..text import compact, match_normalize
from .config import HALF_NGRAM_BENCHMARKS, HALF_NGRAM_N
from .grams import _TOKEN, _half_hits, gram_table


class NgramLayers:
    """Layers ``exact``, ``ngram`` (with the verbatim test), ``minhash`` and ``half-ngram`` of
    :class:`ops.curation.decontam.Decontaminator` (a mixin: it reads the detector's ``cfg``, ``items``, ``bnorm``,
    ``btoks``, ``exact`` and ``short``, and keeps its own caches ``_bgrams``, ``_anchors`` and ``_half``).

    Each layer takes the round's texts in matching form (``norm``), the results so far (``out``, None: still clean)
    and the detector's ``flag(i, bi, layer, score)``, and flags only rows still clean."""

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
