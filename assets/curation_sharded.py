"""Exact and near dedup beyond one machine: shards as Dagster partitions, one global LSH merge step.

docs/curation.md, "Beyond one machine". ``dedup_shards`` is partitioned by shard (``CRUCIBLE_DEDUP_SHARDS``,
default 8): each partition is its own run (on the k8s executor, its own pod) that exact-dedups the rows whose
normalised-text MD5 falls in the shard and writes their MinHash band keys (ops/curation/shard.py).
``near_dedup_merge`` then joins the band keys of every shard, runs near dedup on the rows that collide with
another row, and writes ``near_deduped_problems_sharded`` and ``dedup_clusters_sharded``: the same tables, row
for row, as ``near_deduped_problems`` and ``dedup_clusters`` (tests/assets/test_curation_sharded.py).

Not in the default code location (pipelines/definitions.py loads the single-machine stages); a deployment that
needs it adds this module to ``ASSET_MODULES`` with a job over the two assets.
"""

import os

import dagster as dg
import polars as pl

from resources.lake import LakeResource

from ._meta import table_result
from .curation import DedupConfig, merge_clusters

GROUP = "curation_sharded"
N_SHARDS = int(os.environ.get("CRUCIBLE_DEDUP_SHARDS", "8"))
DEDUP_SHARDS = dg.StaticPartitionsDefinition([f"{i:03d}" for i in range(N_SHARDS)])


@dg.asset(partitions_def=DEDUP_SHARDS, deps=["annotated_problems"], group_name=GROUP, code_version="1",
          kinds={"polars", "parquet"})
def dedup_shards(context: dg.AssetExecutionContext, config: DedupConfig, lake: LakeResource) -> dg.MaterializeResult:
    """One shard: its valid rows exact-deduped (``kept`` with ``text_md5``), its exact clusters and the band keys
    of its survivors (``band_keys.parquet``: problem_id, band, key)."""
    from ops.curation import dedup, shard
    from ops.curation.text import text_hash

    params = dedup.NearDedupParams(**config.model_dump())
    valid = lake.read("annotated_problems").filter(pl.col("is_valid"))
    md5 = pl.Series([text_hash(p) for p in valid["problem"].to_list()], dtype=pl.String)
    rows = valid.filter(pl.Series(shard.shard_of(md5, N_SHARDS) == int(context.partition_key)))
    kept, clusters = dedup.exact_dedup(rows, params.source_priority)
    keys = shard.key_table(kept["problem_id"].to_list(), shard.band_keys(kept["problem"].to_list(), params))
    key = context.partition_key
    lake.write(clusters, "dedup_shards", key, name="clusters.parquet")
    lake.write(keys, "dedup_shards", key, name="band_keys.parquet")
    path, version = lake.write(kept, "dedup_shards", key)
    return table_result(None, path, version, rows.height, kept.height,
                        exact_duplicates_removed=dg.MetadataValue.int(rows.height - kept.height),
                        band_keys=dg.MetadataValue.int(keys.height))


@dg.multi_asset(
    specs=[
        dg.AssetSpec("near_deduped_problems_sharded", deps=["dedup_shards"], group_name=GROUP, code_version="1",
                     kinds={"parquet"}, description="near_deduped_problems, computed from the shards."),
        dg.AssetSpec("dedup_clusters_sharded", deps=["dedup_shards"], group_name=GROUP, code_version="1",
                     kinds={"parquet"}, description="dedup_clusters, computed from the shards."),
    ]
)
def near_dedup_merge(context: dg.AssetExecutionContext, config: DedupConfig, lake: LakeResource):
    """The global step: rows whose band key another row shares, near-deduped together; every other row kept."""
    from ops.curation import dedup, shard

    params = dedup.NearDedupParams(**config.model_dump())
    keys = DEDUP_SHARDS.get_partition_keys()
    missing = [k for k in keys if k not in set(lake.partitions("dedup_shards"))]
    if missing:
        raise ValueError(f"dedup_shards partitions not materialized: {missing}")
    kept = pl.concat([lake.read("dedup_shards", k) for k in keys], how="vertical_relaxed").drop("text_md5")
    exact_clusters = pl.concat([lake.read("dedup_shards", k, name="clusters.parquet") for k in keys])
    groups = shard.colliding_rows([lake.read("dedup_shards", k, name="band_keys.parquet") for k in keys])
    colliding = kept.filter(pl.col("problem_id").is_in(groups["problem_id"].unique().implode()))
    _, near_clusters, stats = dedup.near_dedup_frame(colliding, params=params)
    removed = near_clusters.filter(~pl.col("is_survivor"))["problem_id"]
    out = kept.filter(~pl.col("problem_id").is_in(removed.implode()))
    out = out.with_columns(_rank=pl.Series(dedup.survivor_rank(out, params.source_priority))).sort("_rank").drop("_rank")
    clusters = merge_clusters(exact_clusters, near_clusters)
    path, version = lake.write(out, "near_deduped_problems_sharded")
    cpath, cversion = lake.write(clusters, "dedup_clusters_sharded")
    yield table_result("near_deduped_problems_sharded", path, version, kept.height, out.height,
                       shards=dg.MetadataValue.int(len(keys)), colliding_rows=dg.MetadataValue.int(colliding.height),
                       lsh=dg.MetadataValue.json(stats))
    yield table_result("dedup_clusters_sharded", cpath, cversion, clusters.height, clusters.height)
