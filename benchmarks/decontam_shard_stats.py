"""Decontamination beyond one machine: what crosses the network at each synchronisation point, and the sharded
result against the single process, on the curation corpus of the embedded default (docs/curation.md, "Beyond one
machine").

    .venv/bin/python benchmarks/decontam_shard_stats.py [--shards 8]   # -> benchmarks/results/decontam_shard.json

Corpus: what the curation group decontaminates on the embedded default (MATH test, DeepMind mathematics_dataset at
20 per module, MMLU dev/val, ARC) plus the labelled set's planted contaminants of MATH-500 (40 per kind), against
every benchmark item, policy ``strict`` (judge off), ``run_stable`` (3 rounds at most). The single process runs
first and fills the embedding cache (``benchmarks/.work/decontam_shard/``); the shards, in this process, split the
rows by normalised-text MD5 as ``decontam_step_01`` does and read that cache, so MiniLM returns the same vectors to
both. Per point: the shards' statistics (Parquet, zstd, as the lake stores them) summed, and the merged table each
shard reads back. Then the same shards with only their own statistics, to count the rows that would differ.
Last, ``embedding_batch_invariance``: the first 300 MATH test problems (matching form) encoded by MiniLM, uncached,
in one batch and in batches of 37: how many vectors differ and by how much (why the shards read the cache).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _bytes(df) -> int:
    buf = io.BytesIO()
    df.write_parquet(buf, compression="zstd")
    return buf.getbuffer().nbytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "decontam_shard.json"))
    ap.add_argument("--shards", type=int, default=8)
    args = ap.parse_args()

    import polars as pl

    from ops import lake
    from ops.curation import shard as dedup_shard
    from ops.curation import sources
    from ops.curation.decontam import Decontaminator, MiniLMEmbedder, layer_counts
    from ops.curation.decontam_set import labelled_set
    from ops.curation.decontam_shard import DecontamShard, merge_stats
    from ops.curation.text import text_hash

    bench = sources.benchmark_items()
    corpus = sources.math_test() + sources.mathematics_dataset(20) + sources.mmlu_dev_val() + sources.arc()
    problems = [r["problem"] for r in corpus] + [r["problem"] for r in labelled_set(bench, None, per_kind=40) if r["label"]]
    work = ROOT / "benchmarks" / ".work" / "decontam_shard"
    work.mkdir(parents=True, exist_ok=True)
    det = Decontaminator(bench, embedder=MiniLMEmbedder(128, cache_path=work / "embeddings.parquet"))
    t = time.perf_counter()
    single = det.run_stable(problems)
    single_s = time.perf_counter() - t
    rounds = det.stats["rounds"]
    print("single", round(single_s, 1), "s, rounds", rounds, layer_counts(single), flush=True)

    part = dedup_shard.shard_of(pl.Series([text_hash(p) for p in problems], dtype=pl.String), args.shards)

    def shards():
        return [DecontamShard(det, [problems[i] for i in np.nonzero(part == s)[0]], np.nonzero(part == s)[0],
                              max_rounds=3) for s in range(args.shards)]

    def flags_of(sh):
        out = [None] * len(problems)
        for s in sh:
            for o, f in zip(s.ordinals, s.flags):
                out[o] = f
        return out

    sh = shards()
    points = []
    t = time.perf_counter()
    local = [s.step() for s in sh]
    while local[0] is not None:
        merged = merge_stats(local, det)
        points.append({"point": f"{merged.kind} (round {merged.round})", "keys_per_shard_max": max(x.table.height for x in local),
                       "shard_bytes_total": sum(_bytes(x.table) for x in local), "merged_keys": merged.table.height,
                       "merged_bytes": _bytes(merged.table), "rows": merged.rows})
        print(points[-1], flush=True)
        local = [s.step(merged) for s in sh]
    sharded_s = time.perf_counter() - t
    sharded = flags_of(sh)
    loc = shards()
    for s in loc:
        x = s.step()
        while x is not None:
            x = s.step(merge_stats([x], det))
    lflags = flags_of(loc)
    diff = [i for i in range(len(problems)) if lflags[i] != single[i]]
    out = {"command": "python benchmarks/decontam_shard_stats.py", "machine": {"cpus": os.cpu_count(),
           "load_average": os.getloadavg()},
           "rows": len(problems), "benchmark_items": len(bench), "shards": args.shards,
           "shard_rows": [int((part == s).sum()) for s in range(args.shards)], "rounds": rounds,
           "single_process_s": round(single_s, 1), "sharded_in_one_process_s": round(sharded_s, 1),
           "removed_per_layer": layer_counts(single), "sharded_equals_single": sharded == single,
           "synchronisation_points": points,
           "merged_bytes_total": sum(p["merged_bytes"] for p in points),
           "shard_bytes_total": sum(p["shard_bytes_total"] for p in points),
           "local_statistics": {"rows_that_differ": len(diff),
                                "single_layer_of_those": dict(Counter((single[i] or {}).get("layer") for i in diff)),
                                "local_layer_of_those": dict(Counter((lflags[i] or {}).get("layer") for i in diff)),
                                "removed": sum(f is not None for f in lflags)}}
    texts = det.matching_forms([r["problem"] for r in sources.math_test()[:300]])
    whole = MiniLMEmbedder(128).encode(texts)
    parts = np.concatenate([MiniLMEmbedder(128).encode(texts[i : i + 37]) for i in range(0, len(texts), 37)])
    out["embedding_batch_invariance"] = {"texts": len(texts), "batch_of": 37,
                                         "vectors_that_differ": int((whole != parts).any(axis=1).sum()),
                                         "max_abs_difference": float(np.abs(whole - parts).max())}
    lake.write_json_atomic(out, args.out)
    print("wrote", args.out, "equal", out["sharded_equals_single"], "local differs", len(diff))


if __name__ == "__main__":
    main()
