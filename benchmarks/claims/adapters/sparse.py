"""``run_seed`` of the sparse-throughput claim: the embedding engine alone against its peers, the
peers section of ``benchmarks/sparse_bench.py`` (RecIS-style dynamic tables, arXiv 2509.20883 §3).

One seed = one ID stream (``sparse_bench.zipf_stream`` with this seed: ``features`` features, Zipf
exponent ``zipf_s`` over ``vocab`` IDs, ``steps`` x ``batch`` lookups per feature, >= 1M distinct IDs),
then every arm in a fresh spawned process (``sparse_bench._peer_run``: build the table, one untimed
first step for every arm, then ``steps - 1`` timed steps of lookup, pooled forward, backward and sparse
update, one torch thread):

* ``dynamic``: Crucible's dynamic tables (``ops.sparse.EmbeddingCollection``), one row per distinct ID;
* ``hashed``: one ``torch.nn.EmbeddingBag`` with as many buckets as the stream has distinct IDs,
  ``splitmix64(key) % buckets``, sparse gradients, ``torch.optim.Adagrad``;
* ``torchrec``: torchrec's ``FusedEmbeddingBagCollection`` on CPU at the same buckets and hash. It is
  not a Crucible dependency; when it does not import (FACTS: torchrec 1.9.2 on CPU with torch 2.13),
  its metrics are null and ``error`` says why.

Returned per arm: ``rows_per_s`` (looked-up rows per second), ``peak_rss_delta_mib`` (peak RSS growth
over the stream-loaded baseline), ``table_bytes`` and ``collision_rate`` (distinct IDs sharing a row).
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
ARMS = ("dynamic", "hashed", "torchrec")


def run_seed(seed: int, arm_order: list[str], workdir: Path, features: int = 8, vocab: int = 10_000_000,
             zipf_s: float = 1.15, batch: int = 4096, steps: int = 300, dim: int = 16, lr: float = 0.05,
             block_rows: int = 65536, timeout_minutes: float = 15.0) -> dict:
    """Every arm of ``arm_order`` (names in ``ARMS``) on the seed's stream. Raises ValueError for an
    unknown arm or a stream under 1M distinct IDs, RuntimeError when the dynamic engine fails."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import sparse_bench as sb

    bad = [a for a in arm_order if a not in ARMS]
    if bad:
        raise ValueError(f"sparse run_seed: unknown arms {bad}; known {ARMS}")
    cfg = dict(features=features, vocab=vocab, zipf_s=zipf_s, batch=batch, steps=steps, dim=dim, lr=lr,
               block_rows=block_rows, repeats=1, seed=seed)
    ids = sb.zipf_stream(features, vocab, zipf_s, steps * batch, seed)
    keys = sb.namespaced(ids).reshape(-1)
    distinct = int(len(np.unique(keys)))
    if distinct < sb.MIN_DISTINCT:
        raise ValueError(f"sparse run_seed: the stream has {distinct:,} distinct ids, < {sb.MIN_DISTINCT:,}")
    stream = workdir / "stream.npy"
    np.save(stream, ids)
    ctx = mp.get_context("spawn")
    out = {}
    for arm in arm_order:
        q = ctx.Queue()
        p = ctx.Process(target=sb._peer_run, args=(arm, 0 if arm == "dynamic" else distinct, cfg, str(stream), q))
        p.start()
        try:
            res = q.get(timeout=timeout_minutes * 60)
        finally:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        if "error" in res:
            if arm == "dynamic":
                raise RuntimeError(f"sparse run_seed: the dynamic engine failed: {res['error']}")
            out[arm] = {"rows_per_s": None, "peak_rss_delta_mib": None, "table_bytes": None, "collision_rate": None,
                        "error": res["error"]}
            continue
        if arm == "dynamic":
            collision = 1 - res["distinct_rows_of_live_ids"] / distinct
        else:
            collision = sb.collision_stats(keys, distinct)["collision_rate"]
        out[arm] = {"rows_per_s": res["rows_per_s"], "peak_rss_delta_mib": res["peak_rss_delta_mib"],
                    "table_bytes": res["table_bytes"], "collision_rate": collision, "distinct_ids": distinct}
    return out
