"""The curation group: annotate -> exact dedup -> near dedup -> decontaminate -> distill -> sample.

Logics-STEM (arXiv 2601.01562) §2, stages 1-5, with the defaults in docs/curation.md ("Defaults"). Each asset reads
its parent's Parquet table from the lake, writes its own atomically, and returns counts, its data
version and a figure. Heavy libraries (scikit-learn, datasketch, math-verify) load inside the
functions in ``ops``.
"""


import dagster as dg
import polars as pl

from ops import figures
from ops.curation import dedup
from ops.curation.annotate import AnnotateParams
from ops.curation.decontam import DecontamConfig
from ops.curation.decontam.report import decontam_eval, decontam_tables, math500_truth
from ops.curation.sampling import SftParams
from ops.curation.sources import SourceError
from resources.lake import LakeResource
from resources.teacher import TeacherResource

from ._config import fields_of, mirrors
from ._meta import image, md_table, table_result
from .frames import ANNOTATION_SCHEMA, RAW_SCHEMA, frame
from .sources import current_source_keys

GROUP = "curation"
PROBLEM_SCHEMA = {**RAW_SCHEMA, **ANNOTATION_SCHEMA}
# Run-config defaults, meanings and validation live in the ops dataclasses (assets/_config.py), the work in ops.curation
merge_clusters = dedup.merge_clusters  # its former home; tests/assets/test_curation_assets.py reads it here


@mirrors(AnnotateParams, own=("allow_missing_sources",))
class AnnotateConfig(fields_of(AnnotateParams)):
    """The Launchpad face of ops.curation.annotate.AnnotateParams (meanings and ranges there)."""

    allow_missing_sources: bool = False
    """By default every raw_problems partition must be materialized; True annotates what exists."""


def _llm_labels(context, rows: list[dict], config: AnnotateParams, lake: LakeResource, teacher: TeacherResource) -> dict:
    """The ``llm`` provenance path: the teacher labels the domain of rows the classifier is unsure of
    (ops.curation.annotate.llm_label_requests / apply_llm_labels)."""
    from ops.curation.annotate import apply_llm_labels, llm_label_requests

    reqs = llm_label_requests(rows, config)
    if not reqs:
        return {"asked": 0}
    with teacher.session(lake.base / "teacher" / "cache.sqlite", log=context.log) as client:
        return apply_llm_labels(rows, client.complete(reqs))


@dg.asset(deps=["raw_problems"], group_name=GROUP, code_version="2", kinds={"scikit-learn", "parquet"})
def annotated_problems(context: dg.AssetExecutionContext, config: AnnotateConfig, lake: LakeResource,
                       teacher: TeacherResource) -> dg.MaterializeResult:
    """Domain, difficulty (1-5), answer type and validity per problem, each with provenance
    (rule | classifier | llm); classifier held-out accuracy in the metadata."""
    from ops.curation.annotate import annotate

    params = AnnotateParams(**config.model_dump(exclude={"allow_missing_sources"}))
    wanted = current_source_keys(context.instance)       # the partitions the UI shows, not every lake folder
    if not wanted:
        raise SourceError("raw_problems has no partitions in this Dagster instance: the sources sensor adds them "
                          "(or crucible demo; in code: assets.sources.sync_source_partitions(instance))")
    present = set(lake.partitions("raw_problems"))
    missing = [k for k in wanted if k not in present]
    if missing and not config.allow_missing_sources:
        raise SourceError(f"raw_problems partitions not materialized: {missing}; materialize them or set allow_missing_sources")
    if missing:
        context.log.warning(f"annotating without sources {missing}")
    keys = [k for k in wanted if k in present]
    raw = pl.concat([lake.read("raw_problems", k) for k in keys], how="vertical_relaxed") if keys else frame([], RAW_SCHEMA)
    if params.llm_label_max_rows > 0:                    # the embedded teacher loads while the classifiers train
        teacher.prestart(lake.base / "teacher" / "cache.sqlite")
    rows, report = annotate(raw.to_dicts(), seed=params.seed, max_per_class=params.max_per_class, min_confidence=params.min_confidence)
    llm = _llm_labels(context, rows, params, lake, teacher) if params.llm_label_max_rows > 0 else {"asked": 0}
    df = frame(rows, PROBLEM_SCHEMA).sort("problem_id")
    path, version = lake.write(df, "annotated_problems")
    by = df.group_by("source", "domain", "domain_provenance").len(name="rows").sort("source", "domain")
    domains = sorted(df["domain"].unique().to_list())
    series = {p: [df.filter((pl.col("domain") == d) & (pl.col("domain_provenance") == p)).height for d in domains]
              for p in sorted(df["domain_provenance"].unique().to_list())}
    meta = {
        "sources": dg.MetadataValue.json(keys),
        "invalid": dg.MetadataValue.int(int((~df["is_valid"]).sum())),
        "invalid_reasons": md_table(df.group_by("invalid_reason").len(name="rows").sort("rows", descending=True)),
        "labels_by_source": md_table(by, 60),
        "needs_llm_label": dg.MetadataValue.int(int(df["needs_llm_label"].sum())),
        "llm_labels": dg.MetadataValue.json(llm),
        "figure": image(figures.grouped_bars(domains, series, "domain labels by provenance"), "domains", lake=lake, asset="annotated_problems"),
    }
    for name, rep in report.items():
        meta[f"{name}_heldout_accuracy"] = dg.MetadataValue.float(rep["heldout_accuracy"])
        meta[f"{name}_report"] = dg.MetadataValue.json(rep)
    return table_result(None, path, version, raw.height, df.height, **meta)


@mirrors(dedup.ExactDedupParams)
class ExactDedupConfig(fields_of(dedup.ExactDedupParams)):
    """The Launchpad face of ops.curation.dedup.ExactDedupParams (meanings and checks there)."""


@mirrors(dedup.NearDedupParams)
class DedupConfig(fields_of(dedup.NearDedupParams, exclude=("word_n", "char_n"), base=ExactDedupConfig)):
    """The Launchpad face of ops.curation.dedup.NearDedupParams (meanings and ranges there)."""


def _check_priority(context, priority: list[str]) -> None:
    known = current_source_keys(context.instance)
    unknown = [s for s in priority if s not in known]
    if unknown:
        context.log.warning(f"source_priority names unknown sources {unknown}; known: {known}")


@dg.asset(deps=["annotated_problems"], group_name=GROUP, code_version="1", kinds={"polars", "parquet"})
def exact_deduped_problems(context: dg.AssetExecutionContext, config: ExactDedupConfig, lake: LakeResource) -> dg.MaterializeResult:
    """Valid problems with exact duplicates (MD5 of normalised text) removed."""
    params = dedup.ExactDedupParams(**config.model_dump())
    _check_priority(context, params.source_priority)
    ann = lake.read("annotated_problems")
    valid = ann.filter(pl.col("is_valid"))
    kept, clusters = dedup.exact_dedup(valid, params.source_priority)
    lake.write(clusters, "exact_deduped_problems", name="clusters.parquet")
    path, version = lake.write(kept, "exact_deduped_problems")
    stages = [("annotated", ann.height), ("valid", valid.height), ("exact-deduped", kept.height)]
    return table_result(
        None, path, version, ann.height, kept.height,
        invalid_dropped=dg.MetadataValue.int(ann.height - valid.height),
        exact_duplicates_removed=dg.MetadataValue.int(valid.height - kept.height),
        figure=image(figures.funnel(stages, "exact dedup funnel"), "funnel", lake=lake, asset="exact_deduped_problems"),
    )


@dg.multi_asset(
    specs=[
        dg.AssetSpec("near_deduped_problems", deps=["exact_deduped_problems"], group_name=GROUP, code_version="1",
                     kinds={"datasketch", "parquet"},
                     description="MinHash-LSH near-duplicates removed, each verified against its survivor."),
        dg.AssetSpec("dedup_clusters", deps=["exact_deduped_problems"], group_name=GROUP, code_version="1",
                     kinds={"parquet"},
                     description="Every dedup cluster (exact and near): its survivor and removed members."),
    ]
)
def near_deduped_problems(context: dg.AssetExecutionContext, config: DedupConfig, lake: LakeResource):
    params = dedup.NearDedupParams(**config.model_dump())  # the one range check (DedupConfigError names the field)
    _check_priority(context, params.source_priority)
    ex = lake.read("exact_deduped_problems")
    exact_clusters = lake.read("exact_deduped_problems", name="clusters.parquet")
    kept, near_clusters, stats = dedup.near_dedup_frame(ex.drop("text_md5"), params=params)
    clusters = dedup.merge_clusters(exact_clusters, near_clusters)
    path, version = lake.write(kept, "near_deduped_problems")
    cpath, cversion = lake.write(clusters, "dedup_clusters")
    removed = near_clusters.filter(~pl.col("is_survivor"))
    sims = removed["jaccard"].to_list()
    yield table_result(
        "near_deduped_problems", path, version, ex.height, kept.height,
        near_duplicates_removed=dg.MetadataValue.int(ex.height - kept.height),
        lsh=dg.MetadataValue.json({**stats, "threshold": params.threshold, "num_perm": params.num_perm}),
        removed_by_source=md_table(removed.group_by("source").len(name="rows").sort("rows", descending=True)),
        figure=image(figures.histogram(sims or [params.threshold], 20, "Jaccard of removed rows with their survivor", "exact Jaccard"), "jaccard",
                     lake=lake, asset="near_deduped_problems"),
    )
    n_clusters = clusters.filter(pl.col("is_survivor")).height
    yield table_result(
        "dedup_clusters", cpath, cversion, clusters.height, clusters.height,
        clusters=dg.MetadataValue.int(n_clusters),
        by_stage=md_table(clusters.group_by("stage").len(name="rows").sort("stage")),
    )


@mirrors(DecontamConfig)
class DecontaminationConfig(fields_of(DecontamConfig, exclude=("num_perm",))):
    """The Launchpad face of ops.curation.decontam.DecontamConfig (meanings and defaults there)."""


def _teacher_judge(context, lake: LakeResource, teacher: TeacherResource):
    """A decontamination judge (ops.curation.decontam.judge.teacher_judge) on the teacher resource, its calls
    cached under the lake."""
    from ops.curation.decontam.judge import teacher_judge

    return teacher_judge(lambda: teacher.session(lake.base / "teacher" / "cache.sqlite", log=context.log))


@dg.multi_asset(
    specs=[
        dg.AssetSpec("decontaminated_problems", deps=["near_deduped_problems", "benchmark_problems"], group_name=GROUP,
                     code_version="2", kinds={"parquet"},
                     description="Problems with every benchmark overlap removed: copies (exact, 8-gram, MinHash on the "
                                 "matching form), and under the strict policy template siblings and rephrasings."),
        dg.AssetSpec("contamination_report", deps=["near_deduped_problems", "benchmark_problems"], group_name=GROUP,
                     code_version="2", kinds={"parquet"},
                     description="Each removed problem: the benchmark item it matched, the layer that caught it, the "
                                 "score, and needs_review when the judge could not decide (fail-closed)."),
    ]
)
def decontaminated_problems(context: dg.AssetExecutionContext, config: DecontaminationConfig, lake: LakeResource,
                            teacher: TeacherResource):
    import time

    from ops.curation.decontam import DecontamConfig, Decontaminator, MiniLMEmbedder, default_cache_dir, layer_counts

    params = DecontamConfig(**config.model_dump())  # ranges checked once, here
    df = lake.read("near_deduped_problems")
    bench = lake.read("benchmark_problems")
    # training-corpus texts: the lake's own cache; benchmark texts: the shared cache outside the lake ($CRUCIBLE_CACHE)
    embedder = MiniLMEmbedder(params.semantic_max_tokens, cache_path=lake.base / "decontam" / "embeddings.parquet",
                              shared_dir=default_cache_dir())
    judge = _teacher_judge(context, lake, teacher) if params.judge else None
    det = Decontaminator(bench.to_dicts(), params, embedder=embedder, judge=judge)
    t0 = time.perf_counter()
    flags = det.run_stable(df["problem"].to_list())
    wall = time.perf_counter() - t0
    kept, report, mask = decontam_tables(df, bench, flags)
    truth = math500_truth(df, bench, flags, report)  # MATH-500 is a verbatim subset of the MATH test set
    # the labelled set: real MATH test problems outside MATH-500 (and GSM8K test items) as its clean rows
    labelled = decontam_eval(bench, truth.clean_pool, params, embedder) if bench.filter(pl.col("benchmark") == "math500").height else {}
    path, version = lake.write(kept, "decontaminated_problems")
    lake.write_json(config.model_dump(), "decontaminated_problems/config.json")
    rpath, rversion = lake.write(report, "contamination_report")
    summary = report.group_by("source", "benchmark", "layer").len(name="rows").sort("source", "benchmark", "layer")
    by_layer = layer_counts(flags)
    yield table_result(
        "decontaminated_problems", path, version, df.height, kept.height,
        removed=dg.MetadataValue.int(int(mask.sum())),
        policy=dg.MetadataValue.text(params.policy),
        removed_per_layer=dg.MetadataValue.json(by_layer),
        needs_review=dg.MetadataValue.int(by_layer["needs_review"]),
        judge=dg.MetadataValue.json(det.stats.get("judge") or {"enabled": params.judge}),
        semantic_layer=dg.MetadataValue.json({k: (round(v, 3) if isinstance(v, float) else v)
                                              for k, v in det.stats.get("semantic", {}).items()}),
        seconds_per_layer=dg.MetadataValue.json({k: round(v, 3) for k, v in det.stats["seconds"].items()}),
        detector_wall_s=dg.MetadataValue.float(round(wall, 3)),
        embedding_cache=dg.MetadataValue.json({"encoded": embedder.encoded, "encoded_benchmark": embedder.encoded_benchmark,
                                               "benchmark_cache_files": embedder.benchmark_cache_paths}),
        math500_recall=dg.MetadataValue.float(truth.scores["recall"]),
        math500_precision=dg.MetadataValue.float(truth.scores["precision"]),
        math500_ground_truth=dg.MetadataValue.json(truth.scores),
        labelled_set=dg.MetadataValue.json(labelled),
        labelled_set_precision=dg.MetadataValue.float(labelled.get("precision", float("nan"))),
        labelled_set_recall=dg.MetadataValue.float(labelled.get("recall", float("nan"))),
        removed_by_layer=md_table(summary),
        figure=image(figures.funnel([("near-deduped", df.height), ("decontaminated", kept.height)]
                                    + [(f"- {b}", n) for b, n in report.group_by("benchmark").len(name="rows").sort("benchmark").iter_rows()],
                                    "decontamination"), "funnel", lake=lake, asset="decontaminated_problems"),
    )
    yield table_result(
        "contamination_report", rpath, rversion, report.height, report.height,
        summary=md_table(summary),
        removed_per_layer=dg.MetadataValue.json(by_layer),
        math_test_near_duplicates_of_math500=md_table(truth.near_duplicates.select("problem_id", "record", "item_id", "layer", "score"), 50),
    )


@mirrors(SftParams)
class SftConfig(fields_of(SftParams)):
    """The Launchpad face of ops.curation.sampling.SftParams (meanings and ranges there)."""


@dg.asset(deps=["distilled_problems"], group_name=GROUP, code_version="1", kinds={"huggingface", "parquet"})
def sft_dataset(context: dg.AssetExecutionContext, config: SftConfig, lake: LakeResource) -> dg.MaterializeResult:
    """Stratified sample of verified problems, in the Hugging Face datasets layout with a card."""
    from ops.curation.sampling import STRATA, dataset_card, sft_rows, stratified_sample, stratum_histogram

    params = SftParams(**config.model_dump())  # ranges checked once, here
    dist = lake.read("distilled_problems")
    verified = dist.filter(pl.col("status") == "verified")
    if verified.is_empty():
        raise ValueError("sft_dataset: distilled_problems has no verified row; nothing to publish")
    if verified.height < params.target_size:
        context.log.warning(f"sft_dataset: target_size {params.target_size} > {verified.height} verified rows; publishing all of them")
    sample, plan = stratified_sample(verified, STRATA, params.target_size, params.stratum_floor, seed=params.seed)
    sample = sft_rows(sample)
    lineage = {}
    for name in ("raw_problems", "annotated_problems", "exact_deduped_problems", "near_deduped_problems",
                 "decontaminated_problems", "distilled_problems"):
        if name == "raw_problems":
            for k in lake.partitions(name):
                lineage[f"raw_problems[{k}]"] = lake.table_info(name, k)
        else:
            lineage[name] = lake.table_info(name)
    final, version = lake.write_hf_dataset(sample, "sft_dataset", dataset_card(sample, lineage, context.run.run_id))
    lake.write_json({"plan": plan, "target_size": params.target_size, "stratum_floor": params.stratum_floor,
                     "tolerance": params.tolerance}, "sft_dataset.plan.json")
    fig = figures.grouped_bars(*stratum_histogram(verified, sample), "stratum histogram before / after sampling")
    return table_result(
        None, final, version, verified.height, sample.height,
        strata=dg.MetadataValue.int(len(plan)),
        target_size=dg.MetadataValue.int(params.target_size),
        shortfall=dg.MetadataValue.int(max(0, params.target_size - sample.height)),
        plan=md_table(pl.DataFrame({"stratum": list(plan), "planned": list(plan.values())}), 60),
        lineage=dg.MetadataValue.json(lineage),
        load_with=dg.MetadataValue.md(f"```python\nimport datasets\nds = datasets.load_dataset('parquet', data_dir='{final}')['train']\n```"),
        figure=image(fig, "strata", lake=lake, asset="sft_dataset"),
    )
