"""Source assets: the raw problems (one partition per source) and the benchmark references."""


import dagster as dg
import polars as pl

from ops.curation import sources as src
from resources.lake import LakeResource
from resources.sources import SourcesResource, source_partition_keys

from ops import figures

from ._config import fields_of, mirrors
from ._meta import image, md_table, table_result
from .frames import QUARANTINE_SCHEMA, RAW_SCHEMA, frame

SOURCE_PARTITIONS = dg.StaticPartitionsDefinition(source_partition_keys())


@mirrors(src.RawProblemsParams)
class RawProblemsConfig(fields_of(src.RawProblemsParams)):
    """Run config of ``raw_problems`` (visible in the Launchpad): the face of
    ops.curation.sources.RawProblemsParams (meanings and ranges there)."""


@dg.asset(
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
    if params.limit is not None:
        rows = rows[: params.limit]
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
    current = [k for k in SOURCE_PARTITIONS.get_partition_keys() if lake.exists("raw_problems", k)]
    for asset in ("raw_problems", "raw_problems_quarantine"):
        lake.refresh_view(asset, partitions=[k for k in current if lake.exists(asset, k)])
    reasons = qdf.group_by("reason").len(name="rows").sort("rows", descending=True) if quarantine else qdf
    return table_result(
        None, path, version, read, df.height,
        quarantined=dg.MetadataValue.int(len(quarantine)),
        quarantine_reasons=md_table(reasons),
        sample=md_table(df.select("problem_id", "record", "problem", "answer").head(5)),
        figure=image(figures.funnel([("read", read), ("quarantined", len(quarantine)), ("kept", df.height)],
                                    f"raw_problems[{key}]"), "funnel"),
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
                        figure=image(fig, "benchmarks"))
