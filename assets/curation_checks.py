"""Blocking asset checks on the curation hand-offs (docs/curation.md, "Asset checks").

A failed blocking check stops the run before any downstream asset reads the table.
"""


import dagster as dg
import polars as pl

from resources.lake import LakeResource

from ._meta import md_table

REQUIRED = ["problem_id", "source", "problem", "domain", "answer_type"]


@dg.asset_check(asset="decontaminated_problems", blocking=True, description="No benchmark overlap is left: "
                "the detector, re-run on the output with the run's settings (judge off), flags nothing, and no row holds "
                "half or more of any MATH-500 problem's word 8-grams with at least one informative 8-gram among the shared "
                "(so neither does sft_dataset, a subset).")
def no_benchmark_overlap(lake: LakeResource) -> dg.AssetCheckResult:
    import dataclasses

    from ops.curation.decontam import HALF_NGRAM_N, DecontamConfig, Decontaminator, MiniLMEmbedder, half_ngram_overlaps

    df = lake.read("decontaminated_problems")
    bench = lake.read("benchmark_problems")
    saved = lake.read_json("decontaminated_problems/config.json", None)
    cfg = DecontamConfig(**saved) if saved is not None else DecontamConfig()
    cfg = dataclasses.replace(cfg, judge=False)  # pairs the judge cleared sit below semantic_threshold
    embedder = MiniLMEmbedder(cfg.semantic_max_tokens, cache_path=lake.base / "decontam" / "embeddings.parquet")
    det = Decontaminator(bench.to_dicts(), cfg, embedder=embedder)
    problems = df["problem"].to_list()
    ids = df["problem_id"].to_list()
    flags = det.run(problems)
    hits = [(pid, f["benchmark"], f["item_id"], f["layer"]) for pid, f in zip(ids, flags) if f]
    m500 = bench.filter(pl.col("benchmark") == "math500").to_dicts()
    forms = det.matching_forms(problems) if cfg.match_normalization else None  # normalised once, by the detector
    half = half_ngram_overlaps(problems, m500, n=HALF_NGRAM_N, fraction=0.5, min_words=cfg.min_words, forms=forms)
    half_rows = [(ids[i], m500[b]["item_id"], round(frac, 3)) for i, b, frac in half]
    return dg.AssetCheckResult(
        passed=not hits and not half_rows,
        metadata={"overlapping_rows": len(hits),
                  "rows_with_half_of_a_math500_problems_8grams": len(half_rows),
                  "examples": md_table(pl.DataFrame(hits[:20], schema=["problem_id", "benchmark", "item_id", "layer"], orient="row")),
                  "half_8gram_examples": md_table(pl.DataFrame(half_rows[:20], schema=["problem_id", "item_id", "fraction"], orient="row"))},
    )


@dg.asset_check(asset="dedup_clusters", blocking=True, description="Every dedup cluster keeps exactly one "
                "member: one survivor per cluster, present in near_deduped_problems; removed members absent.")
def one_survivor_per_cluster(lake: LakeResource) -> dg.AssetCheckResult:
    clusters = lake.read("dedup_clusters")
    kept = set(lake.read("near_deduped_problems")["problem_id"].to_list())
    per = clusters.group_by("cluster_id").agg(survivors=pl.col("is_survivor").sum())
    bad_counts = per.filter(pl.col("survivors") != 1)
    survivors = clusters.filter(pl.col("is_survivor"))["problem_id"].to_list()
    removed = clusters.filter(~pl.col("is_survivor"))["problem_id"].to_list()
    missing_survivors = [p for p in survivors if p not in kept]
    leaked = [p for p in removed if p in kept]
    passed = bad_counts.is_empty() and not missing_survivors and not leaked
    return dg.AssetCheckResult(
        passed=passed,
        metadata={
            "clusters": per.height,
            "clusters_without_exactly_one_survivor": bad_counts.height,
            "survivors_missing_from_output": len(missing_survivors),
            "removed_rows_still_in_output": len(leaked),
        },
    )


def _required_fields(df: pl.DataFrame, cols: list[str]) -> dg.AssetCheckResult:
    empty = {c: int(df.select((pl.col(c).is_null() | (pl.col(c).cast(pl.String).str.strip_chars() == "")).sum()).item())
             for c in cols}
    dup_ids = df.height - df["problem_id"].n_unique()
    return dg.AssetCheckResult(
        passed=all(v == 0 for v in empty.values()) and dup_ids == 0,
        metadata={"empty_by_field": empty, "duplicate_problem_ids": dup_ids, "rows": df.height},
    )


@dg.asset_check(asset="annotated_problems", blocking=True, description="Required fields non-empty; problem_id unique.")
def annotated_required_fields(lake: LakeResource) -> dg.AssetCheckResult:
    return _required_fields(lake.read("annotated_problems"), REQUIRED + ["difficulty"])


@dg.asset_check(asset="distilled_problems", blocking=True, description="Required fields non-empty; every "
                "verified row has a response.")
def distilled_required_fields(lake: LakeResource) -> dg.AssetCheckResult:
    df = lake.read("distilled_problems")
    res = _required_fields(df, REQUIRED + ["status"])
    verified = df.filter(pl.col("status") == "verified")
    no_resp = int((verified["response"].is_null() | (verified["response"].str.strip_chars() == "")).sum())
    return dg.AssetCheckResult(passed=res.passed and no_resp == 0,
                               metadata={**res.metadata, "verified_without_response": no_resp})


@dg.asset_check(asset="sft_dataset", blocking=True, description="Required fields and responses non-empty; "
                "each stratum within tolerance of the sampling plan.")
def sft_strata_match_plan(lake: LakeResource) -> dg.AssetCheckResult:
    df = lake.read_dataset("sft_dataset")
    spec = lake.read_json("sft_dataset.plan.json")
    plan, tol = spec["plan"], spec["tolerance"]
    actual = {"|".join(str(x) for x in r[:3]): r[3] for r in df.group_by("domain", "difficulty", "answer_type").len(name="rows").iter_rows()}
    off = []
    for k in sorted(set(plan) | set(actual)):
        want, got = plan.get(k, 0), actual.get(k, 0)
        if abs(got - want) > max(1.0, tol * want):
            off.append((k, want, got))
    fields = _required_fields(df, REQUIRED + ["response"])
    planned_total = sum(plan.values())
    return dg.AssetCheckResult(
        passed=not off and fields.passed and df.height > 0 and df.height == planned_total,
        metadata={**fields.metadata, "strata": len(plan), "strata_out_of_tolerance": len(off), "planned_rows": planned_total,
                  "out_of_tolerance": md_table(pl.DataFrame(off, schema=["stratum", "planned", "actual"], orient="row"))},
    )
