"""Exact and near dedup beyond one machine: shard-local work, one global band merge, the same result.

docs/curation.md, "Beyond one machine". The single-machine stages (:func:`ops.curation.dedup.exact_dedup`,
:func:`ops.curation.dedup.near_dedup_frame`) hold every row in one process. Here the rows are split into
shards that can run anywhere (Dagster partitions of ``assets/curation_sharded.py``, one run each, on the
k8s executor in production):

1. **shard** (parallel): the rows whose normalised-text MD5 falls in the shard (:func:`shard_of`), so exact
   duplicates always share a shard and :func:`ops.curation.dedup.exact_dedup` on the shard is the global
   exact dedup restricted to it; then the MinHash band keys of the survivors (:func:`band_keys`: the same
   shingles, signatures and banding as ``near_dedup``, each band's rows folded into one 64-bit key);
2. **merge** (global, small): every (band, key) seen in more than one row joins those rows
   (:func:`colliding_rows`). Only rows that collide with another row can be a near-dedup candidate, and every
   candidate pair of ``near_dedup`` lies inside that set; so ``near_dedup`` on those rows alone gives the
   global result (rows that collide with nothing are kept, as ``near_dedup`` keeps them). The merge reads
   ``bands`` 8-byte keys per row (16 x 8 B = 128 B; 13 GB for 100M rows), and the set can be split further
   by connected component of the collision graph (:func:`collision_components`), each component verified on
   its own, since near dedup never links rows of different components.

Equality with the single-machine stages is the contract (tests/assets/test_curation_sharded.py); it holds
while ``near_dedup`` builds its candidates from ``minhash.signatures`` and ``minhash.lsh_params`` as
:func:`band_keys` does.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from . import minhash
from .dedup import NearDedupParams

_MIX = np.uint64(0x9E3779B97F4A7C15)


def shard_of(text_md5: pl.Series, n_shards: int) -> np.ndarray:
    """Shard of each row from its normalised-text MD5 (hex, ``ops.curation.text.text_hash``): the first 8 hex
    digits mod ``n_shards``. Shape (n,) int64; equal texts always get the same shard.

    Raises:
        ValueError: n_shards < 1.
    """
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1, got {n_shards}")
    return (text_md5.str.slice(0, 8).str.to_integer(base=16).to_numpy().astype(np.int64) % n_shards)


def rows_of_shard(df: pl.DataFrame, n_shards: int, key: str | int) -> pl.DataFrame:
    """The rows of ``df`` (column ``problem``) whose normalised-text MD5 falls in shard ``key`` of
    ``n_shards`` (:func:`shard_of`): how ``dedup_shards`` and the decontamination steps split a table."""
    from .text import text_hash

    md5 = pl.Series([text_hash(p) for p in df["problem"].to_list()], dtype=pl.String)
    return df.filter(pl.Series(shard_of(md5, n_shards) == int(key)))


def band_keys(texts: list[str], params: NearDedupParams | None = None) -> np.ndarray:
    """Per text, one 64-bit key per LSH band of its MinHash signature (near_dedup's shingles, signatures,
    ``lsh_params`` banding); with ``threshold == 1.0`` one key: the hash of the sorted shingle set.

    Returns:
        shape (n, bands) uint64. Two texts are a near_dedup candidate only if they share a key in some column.
    """
    cfg = params or NearDedupParams()
    n = len(texts)
    if n == 0:
        return np.zeros((0, 1), dtype=np.uint64)
    batch = minhash.shingle_batch(texts, word_n=cfg.word_n, char_n=cfg.char_n)
    if cfg.threshold >= 1.0:
        sets = minhash.unique_sets(batch)
        keys = np.zeros(n, dtype=np.uint64)
        counts = np.diff(sets.offsets)
        doc = np.repeat(np.arange(n), counts)
        # a position-weighted sum of the sorted set's values: equal sets, equal keys
        pos = np.arange(len(sets.values)) - np.repeat(sets.offsets[:-1], counts)
        contrib = (sets.values + np.uint64(1)) * (_MIX ** (pos.astype(np.uint64) + np.uint64(1)))
        np.add.at(keys, doc, contrib)
        return (keys ^ counts.astype(np.uint64)).reshape(n, 1)
    bands, rows = minhash.lsh_params(cfg.threshold, cfg.num_perm)
    sig = minhash.signatures(batch, num_perm=cfg.num_perm, seed=cfg.seed)
    out = np.zeros((n, bands), dtype=np.uint64)
    for band in range(bands):
        key = np.zeros(n, dtype=np.uint64)
        for j in range(band * rows, (band + 1) * rows):
            key = key * _MIX + sig[:, j].astype(np.uint64)
        out[:, band] = key
    return out


def key_table(problem_ids: list[str], keys: np.ndarray) -> pl.DataFrame:
    """Long form of :func:`band_keys`: columns ``problem_id``, ``band`` (u16), ``key`` (u64), one row per band."""
    n, bands = keys.shape if len(problem_ids) else (0, 1)
    return pl.DataFrame({"problem_id": np.repeat(np.asarray(problem_ids, dtype=object), bands).tolist() if n else [],
                         "band": np.tile(np.arange(bands, dtype=np.uint16), n),
                         "key": keys.reshape(-1)},
                        schema={"problem_id": pl.String, "band": pl.UInt16, "key": pl.UInt64})


def colliding_rows(tables: list[pl.DataFrame]) -> pl.DataFrame:
    """The merge: (problem_id, group) for every row whose (band, key) is shared with another row, over all
    shards' :func:`key_table` frames; ``group`` numbers the (band, key) collisions."""
    keys = pl.concat(tables) if tables else key_table([], np.zeros((0, 1), np.uint64))
    groups = (keys.group_by("band", "key").agg(pl.col("problem_id"), n=pl.len()).filter(pl.col("n") > 1)
              .with_row_index("group").select("group", "problem_id").explode("problem_id"))
    return groups


def collision_components(groups: pl.DataFrame) -> pl.DataFrame:
    """Connected components of the collision graph: (problem_id, component), component numbered from 0 in
    order of the smallest problem_id. Near dedup never links rows of different components, so each can be
    verified apart (by its own worker)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    ids = groups["problem_id"].unique().sort()
    if not len(ids):
        return pl.DataFrame(schema={"problem_id": pl.String, "component": pl.Int64})
    idx = pl.DataFrame({"problem_id": ids, "i": np.arange(len(ids))})
    g = groups.join(idx, on="problem_id")
    first = g.group_by("group").agg(root=pl.col("i").min())
    e = g.join(first, on="group")
    m = coo_matrix((np.ones(e.height, dtype=np.int8), (e["i"].to_numpy(), e["root"].to_numpy())), shape=(len(ids), len(ids)))
    _, label = connected_components(m, directed=False)
    comp = pl.DataFrame({"problem_id": ids, "label": label})
    order = comp.group_by("label").agg(first=pl.col("problem_id").min()).sort("first").with_row_index("component")
    return (comp.join(order.select("label", pl.col("component").cast(pl.Int64)), on="label")
            .select("problem_id", "component").sort("problem_id"))
