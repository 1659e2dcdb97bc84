"""Source assets: the source files (observed), the raw problems (one partition per source) and the
benchmark references.

``raw_problems`` is partitioned by source on a dynamic partitions definition (``sources``): the
keys live in the Dagster instance, added and deleted by the ``sources_sensor`` (pipelines/sensors.py)
as the built-in sources and the entries of the sources YAML come and go, so a new source needs no
code-location reload (``crucible demo`` syncs them itself: :func:`sync_source_partitions`). The
observable source asset ``source_files`` reports each source's data version (the file's SHA-256 and
its YAML entry's hash: resources.sources.source_data_version), so the UI shows "upstream changed"
on ``raw_problems[<source>]`` and declarative automation re-materializes that partition.
"""


import dagster as dg
import polars as pl

from ops.curation import sources as src
from resources.lake import LakeResource
from resources.sources import (SourcesResource, entry_hash, file_sha256, source_data_version,
                               source_partition_keys)

from ops import figures

from ._config import fields_of, mirrors
from ._meta import image, md_table, table_result
from .frames import QUARANTINE_SCHEMA, RAW_SCHEMA, frame

SOURCES_PARTITIONS_NAME = "sources"
SOURCE_PARTITIONS = dg.DynamicPartitionsDefinition(name=SOURCES_PARTITIONS_NAME)
"""One partition per source (built-in, then the YAML's), kept in the instance by the sources sensor."""


def current_source_keys(instance: dg.DagsterInstance) -> list[str]:
    """The ``raw_problems`` partition keys the instance holds now (the UI's), in the order added."""
    return list(instance.get_dynamic_partitions(SOURCES_PARTITIONS_NAME))


def sync_source_partitions(instance: dg.DagsterInstance, keys: list[str] | None = None) -> tuple[list[str], list[str]]:
    """Make the instance's source partitions equal ``keys`` (default: built-in sources, then the
    sources YAML's entries: resources.sources.source_partition_keys): add the missing, delete the
    others. Returns (added, deleted). What the sources sensor does each tick, for where no sensor
    runs (``crucible demo``, tests).

    Raises:
        SourceError: the sources YAML is missing or malformed (the message names the file).
    """
    keys = source_partition_keys() if keys is None else list(keys)
    have = current_source_keys(instance)
    new = [k for k in keys if k not in set(have)]
    gone = [k for k in have if k not in set(keys)]
    if new:
        instance.add_dynamic_partitions(SOURCES_PARTITIONS_NAME, new)
    for k in gone:
        instance.delete_dynamic_partition(SOURCES_PARTITIONS_NAME, k)
    return new, gone


def observe_source_versions(keys: list[str], sources: SourcesResource) -> tuple[dict[str, str], dict[str, str]]:
    """(data version by source key, why no version by key) for ``keys``: built-in sources by their
    data package's version, user sources by file SHA-256 + entry hash; a key with a bad entry, a
    missing file or no entry gets no version (the reason instead)."""
    user = sources.user_sources()
    versions: dict[str, str] = {}
    why: dict[str, str] = {}
    for key in keys:
        if key in src.BUILTIN_SOURCES:
            versions[key] = source_data_version(key)
        elif sources.source_error(key):
            why[key] = sources.source_error(key)
        elif key not in user:
            why[key] = "not declared in the sources file"
        else:
            try:
                versions[key] = source_data_version(key, file_sha256(user[key].path), entry_hash(user[key]))
            except OSError as e:
                why[key] = f"file {user[key].path} unreadable: {e}"
    return versions, why


@dg.observable_source_asset(
    name="source_files",
    partitions_def=SOURCE_PARTITIONS,
    group_name="sources",
    required_resource_keys={"sources"},
    description="The files behind each source partition, observed: data version = the file's SHA-256 and its "
    "YAML entry's hash (built-in sources: their data package's version). Observed by the sources sensor "
    "every minute; a new version marks raw_problems[<source>] stale and automation re-materializes it.",
)
def source_files(context) -> dg.DataVersionsByPartition:
    """Observe every current source partition (the UI's "Observe sources" runs this)."""
    versions, why = observe_source_versions(current_source_keys(context.instance), context.resources.sources)
    for key, reason in why.items():
        context.log.warning(f"source {key}: no data version ({reason})")
    return dg.DataVersionsByPartition(versions)


@mirrors(src.RawProblemsParams)
class RawProblemsConfig(fields_of(src.RawProblemsParams)):
    """Run config of ``raw_problems`` (visible in the Launchpad): the face of
    ops.curation.sources.RawProblemsParams (meanings and ranges there)."""


@dg.asset(
    deps=[source_files],
    partitions_def=SOURCE_PARTITIONS,
    group_name="sources",
    code_version="1",
    kinds={"polars", "parquet"},
    description="Problems from one source (partition): MATH test, generated mathematics_dataset, "
    "MMLU dev+validation, ARC validation, or a user's JSONL/Parquet file. Bad user rows go to "
    "raw_problems_quarantine with file, line and reason.",
)
def raw_problems(
    context: dg.AssetExecutionContext, config: RawProblemsConfig, lake: LakeResource, sources: SourcesResource
) -> dg.MaterializeResult:
    params = src.RawProblemsParams(**config.model_dump())  # ranges checked once, here
    key = context.partition_key
    quarantine: list[dict] = []
    if key == "math_test":
        rows = src.math_test()
    elif key == "mathematics_dataset":
        rows = src.mathematics_dataset(params.mathematics_dataset_per_module, seed=params.mathematics_dataset_seed)
    elif key == "mmlu_dev_val":
        rows = src.mmlu_dev_val()
    elif key == "arc":
        rows = src.arc()
    else:
        user = sources.user_sources()
        if sources.source_error(key):
            raise src.SourceError(sources.source_error(key))
        if key not in user:
            raise src.SourceError(f"raw_problems partition {key!r} is not a built-in source nor declared in the sources file")
        rows, quarantine = src.read_user_source(user[key])
    read = len(rows) + len(quarantine)
    rows = src.sample_rows(rows, params.limit)
    df = frame(rows, RAW_SCHEMA).sort("problem_id")
    qdf = frame(quarantine, QUARANTINE_SCHEMA)
    lake.write(qdf, "raw_problems_quarantine", key, refresh=False)
    if quarantine:
        context.log.warning(f"{len(quarantine)} rows of source {key!r} quarantined; see raw_problems_quarantine/{key}")
        if len(quarantine) > params.max_quarantine_fraction * read or not rows:
            top = qdf.group_by("reason").len(name="rows").sort("rows", descending=True).head(3).rows()
            raise src.SourceError(
                f"source {key!r} ({quarantine[0]['file']}): {len(quarantine)} of {read} rows quarantined "
                f"(> max_quarantine_fraction {params.max_quarantine_fraction}); top reasons: "
                + "; ".join(f"{r} x{n}" for r, n in top) + f". Check the field mapping; rows are in raw_problems_quarantine/{key}"
            )
    path, version = lake.write(df, "raw_problems", key, refresh=False)
    # views over the *declared* sources only: a source removed from the YAML leaves the catalog
    current = [k for k in current_source_keys(context.instance) if lake.exists("raw_problems", k)]
    for asset in ("raw_problems", "raw_problems_quarantine"):
        lake.refresh_view(asset, partitions=[k for k in current if lake.exists(asset, k)])
    reasons = qdf.group_by("reason").len(name="rows").sort("rows", descending=True) if quarantine else qdf
    return table_result(
        None, path, version, read, df.height,
        quarantined=dg.MetadataValue.int(len(quarantine)),
        quarantine_reasons=md_table(reasons),
        sample=md_table(df.select("problem_id", "record", "problem", "answer").head(5)),
        figure=image(figures.funnel([("read", read), ("quarantined", len(quarantine)), ("kept", df.height)],
                                    f"raw_problems[{key}]"), "funnel", lake=lake, asset="raw_problems"),
    )


@dg.asset(
    group_name="sources",
    code_version="1",
    kinds={"polars", "parquet"},
    description="Decontamination references: MATH-500, GSM8K test, MMLU test, ARC-Challenge test, HumanEval.",
)
def benchmark_problems(lake: LakeResource) -> dg.MaterializeResult:
    items = src.benchmark_items()
    df = pl.DataFrame(items, schema={"benchmark": pl.String, "item_id": pl.String, "problem": pl.String,
                                     "answer": pl.String, "solution": pl.String})
    path, version = lake.write(df, "benchmark_problems")
    counts = df.group_by("benchmark").len(name="rows").sort("benchmark")
    fig = figures.funnel(list(counts.iter_rows()), "benchmark items")
    return table_result(None, path, version, df.height, df.height, per_benchmark=md_table(counts),
                        figure=image(fig, "benchmarks", lake=lake, asset="benchmark_problems"))
