"""Decontamination beyond one machine: shard steps between exact merges of additive corpus statistics.

docs/curation.md, "Beyond one machine". :class:`ops.curation.decontam.Decontaminator` compares each row with a
fixed reference (the benchmark), but three of its decisions also read statistics of the corpus itself, and
:meth:`~ops.curation.decontam.Decontaminator.run_stable` repeats the detector until its output is a fixed point.
Each statistic is a count over rows, so shards' counts add up to the corpus's; but each is taken over the rows
still clean at its layer, so it can only be summed once the layers before it have run on every shard. Per round
of the fixed point, in the detector's own order, the synchronisation points (``SYNC_KINDS``) are:

1. ``ngram`` — the n-gram layer's training-side document frequencies (``max_train_df``) over the round's rows
   (:meth:`~ops.curation.decontam.Decontaminator.ngram_df`); the merge also sums each shard's removals of the
   round before, which decides whether the round runs (a round r >= 3 runs only after a round that removed a row);
2. ``sibling`` — the sibling layer's masked-gram document frequencies over the rows still clean after layers
   1-3 (:meth:`~ops.curation.decontam.Decontaminator.sibling_df`);
3. ``semantic`` — the TF-IDF document frequencies and row count of the prefilter over the rows still clean after
   layer 4 (:meth:`~ops.curation.decontam.Decontaminator.semantic_df`), from which every shard computes the
   corpus IDF (:func:`~ops.curation.decontam.smooth_idf`);
4. ``judge`` (``judge`` on) — the borderline pairs of every shard: the judge's budget (``judge_max_pairs``)
   goes to the best pairs of the corpus, judged in one call by the merge.

A shard (:class:`DecontamShard`) runs the layers between two points and returns its local statistics; the merge
(:func:`merge_stats`) sums them (for ``judge``: ranks the pairs and judges them); every shard continues from the
merged figures. The single-process detector is one shard whose merge sums its own statistics
(:func:`run_shards`), so the sharded result equals it row for row (tests/ops/test_decontam_shard.py,
tests/assets/test_decontam_sharded.py) while the embedder returns the same vectors for the same texts (MiniLM's
last bits depend on the batch a text runs in: docs/curation.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

SYNC_KINDS = ("ngram", "sibling", "semantic", "judge")


def max_syncs(max_rounds: int) -> int:
    """Synchronisation points of a run of at most ``max_rounds`` rounds, with every layer and the judge on."""
    return len(SYNC_KINDS) * max_rounds


_KEY = {"ngram": ("gram", pl.UInt64), "sibling": ("gram", pl.UInt64), "semantic": ("feat", pl.String)}
JUDGE_ENTRY_SCHEMA = {"score": pl.Float64, "ordinal": pl.Int64, "item": pl.Int64, "problem": pl.String}
VERDICT_SCHEMA = {"ordinal": pl.Int64, "item": pl.Int64, "layer": pl.String, "score": pl.Float64,
                  "needs_review": pl.Boolean, "judge_reply": pl.String}
#: one row per removed row of a shard (its state between steps, and the sharded path's output)
FLAG_SCHEMA = {"ordinal": pl.Int64, "benchmark": pl.String, "item_id": pl.String, "layer": pl.String,
               "score": pl.Float64, "needs_review": pl.Boolean, "judge_reply": pl.String, "round": pl.Int32}


@dataclass
class SyncStats:
    """One synchronisation point's statistics: a shard's local ones, or their merge.

    Attributes:
        kind: one of :data:`SYNC_KINDS`; round: the fixed point's round (from 1).
        table: ``ngram``/``sibling``: ``gram`` (u64), ``n`` (i64 rows); ``semantic``: ``feat`` (str), ``n``;
            ``judge``: local, :data:`JUDGE_ENTRY_SCHEMA` (cosine, row ordinal, item index, row text); merged,
            :data:`VERDICT_SCHEMA` (the rows the judge layer removes).
        rows: ``semantic``: the rows the TF-IDF counts; ``ngram``: rows removed in the round before.
        info: ``judge`` merged: the judge's counts.
    """

    kind: str
    round: int
    table: pl.DataFrame
    rows: int = 0
    info: dict = field(default_factory=dict)

    def meta(self) -> dict:
        """Everything but the table, as JSON-ready values (with ``table_rows``)."""
        return {"kind": self.kind, "round": self.round, "rows": self.rows, "info": self.info,
                "table_rows": self.table.height}

    @classmethod
    def from_meta(cls, meta: dict, table: pl.DataFrame) -> SyncStats:
        return cls(meta["kind"], int(meta["round"]), table, int(meta["rows"]), dict(meta.get("info") or {}))


def parquet_bytes(df: pl.DataFrame) -> int:
    """Bytes of ``df`` as the lake's Parquet (zstd): what a table costs to move between machines."""
    import io

    buf = io.BytesIO()
    df.write_parquet(buf, compression="zstd")
    return buf.getbuffer().nbytes


def flags_of_shards(n_rows: int, tables: Sequence[pl.DataFrame]) -> list[dict | None]:
    """The detector's flags over the whole table (None: clean) from the shards' removal tables (columns in
    order: ordinal, benchmark, item_id, layer, score, needs_review, judge_reply, and one more). Raises
    IndexError naming the ordinal when a shard names a row past ``n_rows``."""
    flags: list[dict | None] = [None] * n_rows
    for t in tables:
        for o, bench, item, layer, score, review, reply, _ in t.iter_rows():
            if not 0 <= o < n_rows:
                raise IndexError(f"shard removal names row ordinal {o}; the table has {n_rows} rows")
            flags[o] = {"benchmark": bench, "item_id": item, "layer": layer, "score": score, "needs_review": review,
                        "judge_reply": reply}
    return flags


def _empty(kind: str) -> pl.DataFrame:
    if kind == "judge":
        return pl.DataFrame(schema=JUDGE_ENTRY_SCHEMA)
    key, dtype = _KEY[kind]
    return pl.DataFrame(schema={key: dtype, "n": pl.Int64})


def merge_stats(parts: Sequence[SyncStats], det=None) -> SyncStats:
    """The exact merge of every shard's statistics at one synchronisation point.

    Counts (``ngram``, ``sibling``, ``semantic``): summed per key, keys sorted; ``rows`` summed. ``judge``: the
    entries of every shard ranked as the single process ranks them (cosine, row ordinal, item; descending) and
    judged by ``det`` (:meth:`~ops.curation.decontam.Decontaminator.judge_borderline`: one call, its budget).

    Raises:
        ValueError: no parts, parts of different points, or ``judge`` without ``det``.
    """
    if not parts:
        raise ValueError("merge_stats: no shard statistics")
    kind, rnd = parts[0].kind, parts[0].round
    if any((p.kind, p.round) != (kind, rnd) for p in parts):
        raise ValueError(f"merge_stats: shards at different points: {sorted({(p.kind, p.round) for p in parts})}")
    if kind == "judge":
        if det is None:
            raise ValueError("merge_stats: the judge point needs the detector (its judge and budget)")
        entries = pl.concat([p.table for p in parts]).sort("score", "ordinal", "item", descending=True)
        if not entries.height:  # nothing borderline anywhere: the judge is not called, its counts stay empty
            return SyncStats(kind, rnd, pl.DataFrame(schema=VERDICT_SCHEMA), info={"judge": {}})
        verdicts, js = det.judge_borderline(list(entries.select("score", "ordinal", "problem", "item").iter_rows()))
        table = pl.DataFrame(verdicts, schema=VERDICT_SCHEMA, orient="row")
        return SyncStats(kind, rnd, table, info={"judge": js})
    key = _KEY[kind][0]
    table = pl.concat([p.table for p in parts]).group_by(key).agg(pl.col("n").sum()).sort(key)
    return SyncStats(kind, rnd, table, rows=sum(p.rows for p in parts))


def run_shards(det, shards: Sequence[DecontamShard],
               merge: Callable[[Sequence[SyncStats]], SyncStats] | None = None) -> int:
    """Run every shard to the end in this process, merging at each point (``merge``: default
    :func:`merge_stats` with ``det``). Returns the number of synchronisation points.

    Raises:
        RuntimeError: shards that stop at different points (they always agree: each point follows from merged
            figures and the configuration only).
    """
    merge = merge or (lambda parts: merge_stats(parts, det))
    local = [s.step() for s in shards]
    points = 0
    while any(x is not None for x in local):
        if any(x is None for x in local):
            raise RuntimeError("run_shards: some shards finished while others wait at a synchronisation point")
        merged = merge(local)
        points += 1
        local = [s.step(merged) for s in shards]
    return points


class DecontamShard:
    """One shard of a decontamination run: its rows, their removals so far, and where it waits.

    :meth:`step` runs the detector's layers up to the next synchronisation point and returns the shard's
    local statistics there (None once the run is over); the next call takes the merge of every shard's.
    The state between steps (:meth:`state`) is the removed rows and a small JSON dict, so each step can run in
    its own process (:meth:`restore`); a step recomputes what it needs from the rows.

    Args:
        det: the :class:`~ops.curation.decontam.Decontaminator` (benchmark, configuration, embedder, judge).
        problems: the shard's problem texts.
        ordinals: each row's position in the whole corpus (increasing; default 0..n-1): the judge's tie order.
        max_rounds: rounds of the fixed point (1: :meth:`~ops.curation.decontam.Decontaminator.run`).
        skip: layers of ``Decontaminator.ROW_LOCAL`` not to run in round 1 (later rounds skip all of them).
    """

    def __init__(self, det, problems: Sequence[str], ordinals=None, max_rounds: int = 1, skip: Sequence[str] = ()):
        if max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
        self.det, self.problems = det, list(problems)
        n = len(self.problems)
        self.ordinals = np.arange(n, dtype=np.int64) if ordinals is None else np.asarray(ordinals, dtype=np.int64)
        if len(self.ordinals) != n:
            raise ValueError(f"{len(self.ordinals)} ordinals for {n} problems")
        self.flags: list[dict | None] = [None] * n
        self.flag_round = np.zeros(n, dtype=np.int32)
        self.max_rounds, self.skip = max_rounds, tuple(skip)
        self.round = 1
        self.wait: str | None = None  # the point this shard waits at; None before its first step
        self.done = False
        self.round_stats: list[dict] = []
        self._norm = None
        self._cache: dict = {}  # what a step computed for the next, when both run in this process

    # -- state ---------------------------------------------------------------------------------------------------

    def state(self) -> tuple[pl.DataFrame, dict]:
        """(removed rows as :data:`FLAG_SCHEMA`, JSON-ready dict): everything :meth:`restore` needs."""
        rows = [(int(self.ordinals[i]), f["benchmark"], f["item_id"], f["layer"], f["score"], f["needs_review"],
                 f["judge_reply"], int(self.flag_round[i])) for i, f in enumerate(self.flags) if f is not None]
        meta = {"round": self.round, "wait": self.wait, "done": self.done, "max_rounds": self.max_rounds,
                "skip": list(self.skip), "round_stats": self.round_stats}
        return pl.DataFrame(rows, schema=FLAG_SCHEMA, orient="row"), meta

    @classmethod
    def restore(cls, det, problems: Sequence[str], ordinals, flags: pl.DataFrame, meta: dict) -> DecontamShard:
        """The shard :meth:`state` described, on the same rows."""
        shard = cls(det, problems, ordinals, max_rounds=int(meta["max_rounds"]), skip=meta["skip"])
        pos = {int(o): i for i, o in enumerate(shard.ordinals)}
        for o, bench, item, layer, score, review, reply, rnd in flags.select(FLAG_SCHEMA.keys()).iter_rows():
            i = pos[int(o)]
            shard.flags[i] = {"benchmark": bench, "item_id": item, "layer": layer, "score": float(score),
                              "needs_review": bool(review), "judge_reply": reply}
            shard.flag_round[i] = rnd
        shard.round, shard.wait, shard.done = int(meta["round"]), meta["wait"], bool(meta["done"])
        shard.round_stats = list(meta["round_stats"])
        return shard

    def summary(self, stable: bool = True) -> dict:
        """The detector's ``stats``: round 1's figures; with ``stable``, the seconds of every round and ``rounds``."""
        first = self.round_stats[0]
        if not stable:
            return first
        total: dict[str, float] = {}
        for st in self.round_stats:
            for k, v in st["seconds"].items():
                total[k] = total.get(k, 0.0) + v
        return {**first, "seconds": total, "rounds": len(self.round_stats)}

    # -- the steps -----------------------------------------------------------------------------------------------

    def step(self, merged: SyncStats | None = None) -> SyncStats | None:
        """Run up to the next synchronisation point; returns this shard's statistics there, None when the run is
        over. ``merged``: the merge of every shard's statistics at the point this shard waits at.

        Raises:
            ValueError: ``merged`` missing, or of another point than the one this shard waits at.
        """
        if self.done:
            return None
        if self.wait is None:
            self.round_stats.append({"seconds": {}, "semantic": {}, "judge": {}})
            return self._ngram_point()
        if merged is None or (merged.kind, merged.round) != (self.wait, self.round):
            got = None if merged is None else (merged.kind, merged.round)
            raise ValueError(f"shard waits at {(self.wait, self.round)}, got merged statistics of {got}")
        return {"ngram": self._after_ngram, "sibling": self._after_sibling, "semantic": self._after_semantic,
                "judge": self._after_judge}[self.wait](merged)

    @property
    def norm(self) -> list[str]:
        if self._norm is None:
            self._norm = self.det.matching_forms(self.problems)
        return self._norm

    def _view(self):
        """The round's rows (clean when it began): indices, their matching forms, texts and current results."""
        idx = [i for i, f in enumerate(self.flags) if f is None or self.flag_round[i] == self.round]
        return idx, [self.norm[i] for i in idx], [self.problems[i] for i in idx], [self.flags[i] for i in idx]

    def _commit(self, idx, out):
        for j, i in enumerate(idx):
            if out[j] is not None and self.flags[i] is None:
                self.flags[i], self.flag_round[i] = out[j], self.round

    def _skipped(self) -> tuple[str, ...]:
        return self.skip if self.round == 1 else tuple(self.det.ROW_LOCAL)

    def _timed(self, layer: str, t0: float):
        sec = self.round_stats[-1]["seconds"]
        sec[layer] = sec.get(layer, 0.0) + time.perf_counter() - t0

    def _cached(self, kind: str, make):
        hit = self._cache.pop((kind, self.round), None)
        return hit if hit is not None else make()

    def _ngram_point(self) -> SyncStats:
        t0 = time.perf_counter()
        _, norm, _, _ = self._view()
        rows = self.det.ngram_rows(norm)
        self._cache[("ngram", self.round)] = rows
        table = self.det.ngram_df(rows[0])
        self._timed("ngram", t0)
        self.wait = "ngram"
        removed_before = int((self.flag_round == self.round - 1).sum()) if self.round > 1 else 0
        return SyncStats("ngram", self.round, table, rows=removed_before)

    def _after_ngram(self, merged: SyncStats) -> SyncStats | None:
        if self.round >= 3 and merged.rows == 0:  # round r - 1 >= 2 removed nothing anywhere: the fixed point
            self._cache.clear()
            self.round_stats.pop()
            self.round -= 1
            return self._finish()
        det, skip = self.det, self._skipped()
        det.stats = self.round_stats[-1]
        idx, norm, _, out = self._view()
        flag = det._flagger(out)
        t0 = time.perf_counter()
        if "exact" not in skip:
            det._exact_layer(norm, out, flag)
        self._timed("exact", t0)
        t0 = time.perf_counter()
        rows = self._cached("ngram", lambda: det.ngram_rows(norm))
        det._ngram_layer(norm, out, flag, tdf=merged.table, rows=rows)
        self._timed("ngram", t0)
        t0 = time.perf_counter()
        if "minhash" not in skip:
            det._minhash_layer(norm, out, flag)
        self._timed("minhash", t0)
        self._commit(idx, out)
        return self._next_after("minhash")

    def _next_after(self, layer: str) -> SyncStats | None:
        layers = self.det.cfg.layers
        if layer == "minhash" and "sibling" in layers:
            return self._sibling_point()
        if layer in ("minhash", "sibling") and "semantic" in layers:
            return self._semantic_point()
        return self._finish_round()

    def _sibling_point(self) -> SyncStats:
        t0 = time.perf_counter()
        _, norm, problems, out = self._view()
        tables = self.det.sibling_rows(norm, problems, out)
        self._cache[("sibling", self.round)] = tables
        table = self.det.sibling_df(tables[1])
        self._timed("sibling", t0)
        self.wait = "sibling"
        return SyncStats("sibling", self.round, table)

    def _after_sibling(self, merged: SyncStats) -> SyncStats | None:
        det = self.det
        det.stats = self.round_stats[-1]
        t0 = time.perf_counter()
        idx, norm, problems, out = self._view()
        tables = self._cached("sibling", lambda: det.sibling_rows(norm, problems, out))
        det._sibling_layer(norm, problems, out, det._flagger(out), tdf=merged.table, tables=tables)
        self._commit(idx, out)
        self._timed("sibling", t0)
        return self._next_after("sibling")

    def _semantic_point(self) -> SyncStats:
        t0 = time.perf_counter()
        _, norm, _, out = self._view()
        rows, forms = self.det.semantic_rows(norm, out)
        counts = self.det.semantic_counts(rows, forms)
        self._cache[("semantic", self.round)] = counts
        table = self.det.semantic_df(counts)
        self._timed("semantic", t0)
        self.wait = "semantic"
        return SyncStats("semantic", self.round, table, rows=len(rows))

    def _after_semantic(self, merged: SyncStats) -> SyncStats | None:
        det = self.det
        det.stats = self.round_stats[-1]
        t0 = time.perf_counter()
        idx, norm, problems, out = self._view()
        counts = self._cached("semantic", lambda: det.semantic_counts(*det.semantic_rows(norm, out)))
        borderline = det._semantic_layer(norm, out, det._flagger(out), df=merged.table, n_rows=merged.rows,
                                         counts=counts)
        self._commit(idx, out)
        self._timed("semantic", t0)
        if not det.cfg.judge:
            return self._finish_round()
        entries = [(cos, int(self.ordinals[idx[r]]), b, problems[r]) for cos, r, b in borderline]
        self.wait = "judge"
        return SyncStats("judge", self.round, pl.DataFrame(entries, schema=JUDGE_ENTRY_SCHEMA, orient="row")
                         if entries else _empty("judge"))

    def _after_judge(self, merged: SyncStats) -> SyncStats | None:
        det = self.det
        if merged.info.get("judge"):  # empty when no pair was borderline: the judge was not called
            self.round_stats[-1]["judge"] = dict(merged.info["judge"])
        pos = {int(self.ordinals[i]): i for i in range(len(self.problems))}
        out = list(self.flags)
        flag = det._flagger(out)
        for o, b, layer, cos, review, reply in merged.table.select(VERDICT_SCHEMA.keys()).iter_rows():
            i = pos.get(int(o))
            if i is not None:
                flag(i, int(b), layer, cos, **({"needs_review": True} if review else {}), judge_reply=reply)
        self._commit(range(len(out)), out)
        return self._finish_round()

    def _finish_round(self) -> SyncStats | None:
        det, skip = self.det, self._skipped()
        if "half-ngram" in det.cfg.layers and "half-ngram" not in skip:
            det.stats = self.round_stats[-1]
            t0 = time.perf_counter()
            idx, norm, problems, out = self._view()
            det._half_ngram_layer(norm, problems, out, det._flagger(out))
            self._commit(idx, out)
            self._timed("half-ngram", t0)
        if self.round >= self.max_rounds:
            return self._finish()
        self.round += 1
        self.round_stats.append({"seconds": {}, "semantic": {}, "judge": {}})
        return self._ngram_point()

    def _finish(self) -> None:
        self.done, self.wait = True, None
        return None
