"""Curation beyond one machine: dedup and decontamination as shards (Dagster partitions) and global merge steps.

docs/curation.md, "Beyond one machine". ``dedup_shards`` is partitioned by shard (``CRUCIBLE_DEDUP_SHARDS``,
default 8): each partition is its own run (on the k8s executor, its own pod) that exact-dedups the rows whose
normalised-text MD5 falls in the shard and writes their MinHash band keys (ops/curation/shard.py).
``near_dedup_merge`` then joins the band keys of every shard, runs near dedup on the rows that collide with
another row, and writes ``near_deduped_problems_sharded`` and ``dedup_clusters_sharded``: the same tables, row
for row, as ``near_deduped_problems`` and ``dedup_clusters`` (tests/assets/test_curation_sharded.py).

Decontamination runs on the same shard partitions as a chain of shard steps (``decontam_step_NN``, partitioned)
and merges of their corpus statistics (``decontam_sync_NN``), ops/curation/decontam_shard.py; the assembly writes
``decontaminated_problems_sharded`` and ``contamination_report_sharded``, the single-process tables row for row
(tests/assets/test_decontam_sharded.py).

Not in the default code location (pipelines/definitions.py loads the single-machine stages); a deployment that
needs them adds this module to ``ASSET_MODULES`` with a job (or a backfill) over its assets.
"""

import os

import dagster as dg
import polars as pl

from ops.curation.decontam_shard import max_syncs, parquet_bytes
from resources.lake import LakeResource
from resources.teacher import TeacherResource

from ._meta import table_result
from .curation import DedupConfig

GROUP = "curation_sharded"
N_SHARDS = int(os.environ.get("CRUCIBLE_DEDUP_SHARDS", "8"))
DEDUP_SHARDS = dg.StaticPartitionsDefinition([f"{i:03d}" for i in range(N_SHARDS)])


@dg.asset(partitions_def=DEDUP_SHARDS, deps=["annotated_problems"], group_name=GROUP, code_version="1",
          kinds={"polars", "parquet"})
def dedup_shards(context: dg.AssetExecutionContext, config: DedupConfig, lake: LakeResource) -> dg.MaterializeResult:
    """One shard: its valid rows exact-deduped (``kept`` with ``text_md5``), its exact clusters and the band keys
    of its survivors (``band_keys.parquet``: problem_id, band, key)."""
    from ops.curation import dedup, shard

    params = dedup.NearDedupParams(**config.model_dump())
    rows = shard.rows_of_shard(lake.read("annotated_problems").filter(pl.col("is_valid")), N_SHARDS, context.partition_key)
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
    clusters = dedup.merge_clusters(exact_clusters, near_clusters)
    path, version = lake.write(out, "near_deduped_problems_sharded")
    cpath, cversion = lake.write(clusters, "dedup_clusters_sharded")
    yield table_result("near_deduped_problems_sharded", path, version, kept.height, out.height,
                       shards=dg.MetadataValue.int(len(keys)), colliding_rows=dg.MetadataValue.int(colliding.height),
                       lsh=dg.MetadataValue.json(stats))
    yield table_result("dedup_clusters_sharded", cpath, cversion, clusters.height, clusters.height)


# --- decontamination ------------------------------------------------------------------------------------------------
# docs/curation.md, "Beyond one machine". The detector (ops/curation/decontam/) runs as shard steps between
# synchronisation points (ops/curation/decontam_shard.py): decontam_step_01 .. _13 are partitioned like dedup_shards
# (one run, one pod, per shard), decontam_sync_01 .. _12 each merge every shard's statistics at one point, and
# decontaminated_problems_sharded / contamination_report_sharded assemble the shards' removals. A run uses as many
# points as its configuration and data need (7 under the defaults when round 2 removes nothing); the steps and
# syncs after its last point only carry the shards' state forward.

DECONTAM_ROUNDS = 3  # Decontaminator.run_stable's max_rounds, as decontaminated_problems runs it


DECONTAM_SYNCS = max_syncs(DECONTAM_ROUNDS)  # 12: ngram, sibling, semantic and judge points per round, at most


def step_name(k: int) -> str:
    return f"decontam_step_{k:02d}"


def sync_name(k: int) -> str:
    return f"decontam_sync_{k:02d}"


def _saved_config(lake: LakeResource):
    """The run configuration every shard's first step saved (they must agree)."""
    from ops.curation.decontam import DecontamConfig

    saved = [lake.read_json(f"{step_name(1)}/{k}/config.json") for k in DEDUP_SHARDS.get_partition_keys()]
    if any(s != saved[0] for s in saved):
        raise ValueError(f"{step_name(1)} partitions ran with different configurations; rerun them with one")
    return DecontamConfig(**saved[0])


def _detector(params, lake: LakeResource, key: str | None = None, judge=None):
    """The shard's detector: the benchmark, the run's settings, MiniLM reading the single-process embedding cache
    and writing the shard's own file (shards run at once) for the training rows, and the shared benchmark cache
    outside the lake for the benchmark items (its writes are locked), no judge (the judge runs in the merge)."""
    from ops.curation.decontam import Decontaminator, MiniLMEmbedder, default_cache_dir

    bench = lake.read("benchmark_problems")
    folder = lake.base / "decontam"
    embedder = MiniLMEmbedder(params.semantic_max_tokens, cache_path=folder / "embeddings" / f"shard-{key}.parquet",
                              read_paths=[folder / "embeddings.parquet"], shared_dir=default_cache_dir()) \
        if key is not None else None
    return Decontaminator(bench.to_dicts(), params, embedder=embedder, judge=judge)


def _shard_rows(lake: LakeResource, key: str) -> pl.DataFrame:
    """The shard's rows of near_deduped_problems (``ordinal``: the row's position there), by normalised-text MD5
    as dedup_shards splits."""
    from ops.curation.shard import rows_of_shard

    df = lake.read("near_deduped_problems").with_row_index("ordinal").select(pl.col("ordinal").cast(pl.Int64),
                                                                             "problem_id", "problem")
    return rows_of_shard(df, N_SHARDS, key)


def _run_step(context: dg.AssetExecutionContext, lake: LakeResource, k: int, config=None) -> dg.MaterializeResult:
    from ops.curation.decontam import DecontamConfig
    from ops.curation.decontam_shard import DecontamShard, SyncStats

    key, name = context.partition_key, step_name(k)
    if k == 1:
        params = DecontamConfig(**config.model_dump())  # ranges checked once, here
        rows = _shard_rows(lake, key)
        lake.write(rows, name, key, name="rows.parquet", refresh=False)
        lake.write_json(config.model_dump(), f"{name}/{key}/config.json")
        shard = DecontamShard(_detector(params, lake, key), rows["problem"].to_list(), rows["ordinal"].to_numpy(),
                              max_rounds=DECONTAM_ROUNDS)
        local = shard.step()
    else:
        rows = lake.read(step_name(1), key, name="rows.parquet")
        prev = step_name(k - 1)
        flags, meta = lake.read(prev, key), lake.read_json(f"{prev}/{key}/state.json")
        if meta["done"]:  # the run ended at an earlier point: carry the state forward
            shard, local = None, None
        else:
            shard = DecontamShard.restore(_detector(_saved_config(lake), lake, key), rows["problem"].to_list(),
                                          rows["ordinal"].to_numpy(), flags, meta)
            merged_meta = lake.read_json(f"{sync_name(k - 1)}/stats.json")
            local = shard.step(SyncStats.from_meta(merged_meta, lake.read(sync_name(k - 1))))
    if shard is not None:
        flags, meta = shard.state()
    if local is not None and k > DECONTAM_SYNCS:
        raise RuntimeError(f"the decontamination run needs more than {DECONTAM_SYNCS} synchronisation points")
    path, version = lake.write(flags, name, key, refresh=False)
    lake.write_json(meta, f"{name}/{key}/state.json")
    stats_bytes = 0
    if local is not None:
        lake.write(local.table, name, key, name="stats.parquet", refresh=False)
        stats_bytes = parquet_bytes(local.table)
    lake.write_json(local.meta() if local is not None else {"kind": None}, f"{name}/{key}/stats.json")
    return table_result(None, path, version, rows.height, flags.height,
                        removed=dg.MetadataValue.int(flags.height),
                        waits_at=dg.MetadataValue.text(f"{local.kind} (round {local.round})" if local else "done"),
                        local_statistics_rows=dg.MetadataValue.int(local.table.height if local else 0),
                        local_statistics_bytes=dg.MetadataValue.int(stats_bytes))


def _step_asset(k: int) -> dg.AssetsDefinition:
    deps = ["near_deduped_problems", "benchmark_problems"] if k == 1 else [step_name(k - 1), sync_name(k - 1)]
    desc = (f"Decontamination, shard step {k}: the shard's rows run through the detector's layers up to synchronisation "
            f"point {k}" + (" (the last)" if k > DECONTAM_SYNCS else "") + "; the table is the shard's removals so far.")
    spec = dict(name=step_name(k), partitions_def=DEDUP_SHARDS, deps=deps, group_name=GROUP, code_version="1",
                kinds={"polars", "parquet"}, description=desc)
    if k == 1:
        from .curation import DecontaminationConfig

        @dg.asset(**spec)
        def first(context: dg.AssetExecutionContext, config: DecontaminationConfig, lake: LakeResource) -> dg.MaterializeResult:
            return _run_step(context, lake, 1, config)

        return first

    @dg.asset(**spec)
    def later(context: dg.AssetExecutionContext, lake: LakeResource) -> dg.MaterializeResult:
        return _run_step(context, lake, k)

    return later


def _sync_asset(k: int) -> dg.AssetsDefinition:
    @dg.asset(name=sync_name(k), deps=[step_name(k)], group_name=GROUP, code_version="1", kinds={"polars", "parquet"},
              description=f"Decontamination, synchronisation point {k}: every shard's statistics merged (a sum; for the "
                          "judge, the corpus's best borderline pairs judged in one call).")
    def sync(context: dg.AssetExecutionContext, lake: LakeResource, teacher: TeacherResource) -> dg.MaterializeResult:
        from ops.curation.decontam_shard import SyncStats, merge_stats

        from .curation import _teacher_judge

        step, keys = step_name(k), DEDUP_SHARDS.get_partition_keys()
        missing = [key for key in keys if not lake.exists(step, key, name="stats.json")]
        if missing:
            raise ValueError(f"{step} partitions not materialized: {missing}")
        metas = [lake.read_json(f"{step}/{key}/stats.json") for key in keys]
        if any(m["kind"] is None for m in metas):
            if not all(m["kind"] is None for m in metas):
                raise RuntimeError(f"{step}: some shards finished, others wait at a synchronisation point")
            path, version = lake.write(pl.DataFrame(), sync_name(k), refresh=False)
            lake.write_json({"kind": None}, f"{sync_name(k)}/stats.json")
            return table_result(None, path, version, 0, 0, point=dg.MetadataValue.text("none: the run ended earlier"))
        parts = [SyncStats.from_meta(m, lake.read(step, key, name="stats.parquet")) for m, key in zip(metas, keys)]
        det = None
        if parts[0].kind == "judge":
            params = _saved_config(lake)
            det = _detector(params, lake, judge=_teacher_judge(context, lake, teacher) if params.judge else None)
        merged = merge_stats(parts, det)
        path, version = lake.write(merged.table, sync_name(k), refresh=False)
        lake.write_json(merged.meta(), f"{sync_name(k)}/stats.json")
        local_bytes = sum(parquet_bytes(p.table) for p in parts)
        return table_result(None, path, version, sum(p.table.height for p in parts), merged.table.height,
                            point=dg.MetadataValue.text(f"{merged.kind} (round {merged.round})"),
                            shard_statistics_bytes=dg.MetadataValue.int(local_bytes),
                            merged_statistics_bytes=dg.MetadataValue.int(parquet_bytes(merged.table)),
                            rows=dg.MetadataValue.int(merged.rows))

    return sync


DECONTAM_STEPS = [_step_asset(k) for k in range(1, DECONTAM_SYNCS + 2)]
DECONTAM_SYNC_POINTS = [_sync_asset(k) for k in range(1, DECONTAM_SYNCS + 1)]


@dg.multi_asset(
    specs=[
        dg.AssetSpec("decontaminated_problems_sharded", deps=[step_name(DECONTAM_SYNCS + 1)], group_name=GROUP,
                     code_version="1", kinds={"parquet"}, description="decontaminated_problems, computed from the shards."),
        dg.AssetSpec("contamination_report_sharded", deps=[step_name(DECONTAM_SYNCS + 1)], group_name=GROUP,
                     code_version="1", kinds={"parquet"}, description="contamination_report, computed from the shards."),
    ]
)
def decontam_assemble(context: dg.AssetExecutionContext, lake: LakeResource):
    """The shards' removals on near_deduped_problems' rows, in its order: the single-process tables."""
    from ops.curation.decontam import layer_counts
    from ops.curation.decontam.report import decontam_tables
    from ops.curation.decontam_shard import flags_of_shards

    last, keys = step_name(DECONTAM_SYNCS + 1), DEDUP_SHARDS.get_partition_keys()
    missing = [k for k in keys if k not in set(lake.partitions(last))]
    if missing:
        raise ValueError(f"{last} partitions not materialized: {missing}")
    df, bench = lake.read("near_deduped_problems"), lake.read("benchmark_problems")
    sizes = [lake.read(step_name(1), k, name="rows.parquet").height for k in keys]
    if sum(sizes) != df.height:
        raise ValueError(f"the shards hold {sum(sizes)} rows, near_deduped_problems {df.height}: rerun {step_name(1)}")
    metas = [lake.read_json(f"{last}/{k}/state.json") for k in keys]
    flags = flags_of_shards(df.height, [lake.read(last, k) for k in keys])
    kept, report, mask = decontam_tables(df, bench, flags)
    points = [lake.read_json(f"{sync_name(j)}/stats.json") for j in range(1, DECONTAM_SYNCS + 1)]
    used = [p for p in points if p["kind"] is not None]
    moved = sum(parquet_bytes(lake.read(sync_name(j))) for j, p in enumerate(points, 1) if p["kind"] is not None)
    path, version = lake.write(kept, "decontaminated_problems_sharded")
    rpath, rversion = lake.write(report, "contamination_report_sharded")
    by_layer = layer_counts(flags)
    yield table_result("decontaminated_problems_sharded", path, version, df.height, kept.height,
                       removed=dg.MetadataValue.int(int(mask.sum())), removed_per_layer=dg.MetadataValue.json(by_layer),
                       shards=dg.MetadataValue.int(len(keys)), shard_rows=dg.MetadataValue.json(dict(zip(keys, sizes))),
                       rounds=dg.MetadataValue.int(max(len(m["round_stats"]) for m in metas)),
                       synchronisation_points=dg.MetadataValue.json([f"{p['kind']} (round {p['round']})" for p in used]),
                       merged_statistics_bytes=dg.MetadataValue.int(moved))
    yield table_result("contamination_report_sharded", rpath, rversion, report.height, report.height,
                       removed_per_layer=dg.MetadataValue.json(by_layer))
