"""The failure-driven half of post-training (Logics-STEM, arXiv 2601.01562 §3; docs/posttrain.md):
failure_regions -> targeted_synthesis, and failure_driven_comparison at the end of the chain.

The work lives in ``ops.posttrain.regions``, ``ops.posttrain.synthesis`` (``targeted_arms``) and
``ops.posttrain.report``; these assets read the lake, call them and write tables and metadata.
``assets.posttrain`` gathers them with the SFT stages so that ``pipelines.definitions`` loads the
group from one module.
"""

import json

import dagster as dg
import polars as pl

from ops.lake import write_json_atomic
from ops.posttrain.regions import RegionParams
from ops.posttrain.report import ComparisonParams
from ops.posttrain.stages import read_optional
from ops.posttrain.synthesis import SynthesisParams
from resources.lake import LakeResource
from resources.teacher import TeacherResource

from ._config import fields_of, mirrors
from ._meta import image, md_table, table_result

GROUP = "training"


@mirrors(RegionParams)
class FailureRegionsConfig(fields_of(RegionParams, exclude=("min_module_share",))):
    """ops.posttrain.regions: failure mass, annotation and topic regions, synthesis targets (the
    Launchpad face of RegionParams: meanings and ranges there)."""


@dg.asset(deps=["sft_checkpoint"], group_name=GROUP, code_version="1", kinds={"scikit-learn", "parquet"})
def failure_regions(context: dg.AssetExecutionContext, config: FailureRegionsConfig, lake: LakeResource) -> dg.MaterializeResult:
    """Wrong or high-loss stage-1 items (dev split of the programmatic evaluation) clustered by
    annotation (domain x difficulty x answer type x mathematics_dataset module) and by topic
    (TF-IDF + k-means), ranked by failure mass; the top regions become synthesis targets."""
    from ops.posttrain.plots import failure_mass_bars
    from ops.posttrain.regions import find_regions, synthesis_targets

    params = RegionParams(**config.model_dump())  # ranges checked once, here
    scored = lake.read("sft_checkpoint")
    dev = scored.filter((pl.col("split") == "dev") & (pl.col("slice") == "programmatic"))
    if dev.is_empty():
        raise ValueError("failure_regions: sft_checkpoint has no dev-split programmatic items to analyse")
    items, ranked = find_regions(dev, params.k_topics, params.min_items, params.high_loss_quantile,
                                 params.high_loss_weight, params.seed)
    targets = synthesis_targets(ranked, params.top_k, params.min_module_share)
    if not targets:
        raise dg.Failure("failure_regions: no top region maps to a generator module; raise top_k")
    path, version = lake.write(ranked, "failure_regions")
    lake.write(items, "failure_regions", name="items.parquet")
    write_json_atomic({"targets": targets, "config": config.model_dump()}, lake.path("failure_regions", name="targets.json"))
    context.log.info(f"failure_regions: targets {[(t['module'], t['difficulty']) for t in targets]}")
    return table_result(
        None, path, version, dev.height, ranked.height,
        failure_mass_total=dg.MetadataValue.float(float(items["failure_mass"].sum())),
        wrong=dg.MetadataValue.int(int((~items["correct"]).sum())),
        high_loss=dg.MetadataValue.int(int(items["high_loss"].sum())),
        regions=md_table(ranked.select("rank", "kind", "description", "n", "wrong", "high_loss", "failure_mass",
                                       "accuracy", "module_share", "examples").with_columns(
            pl.col("failure_mass", "accuracy", "module_share").round(3)), 30),
        targets=md_table(pl.DataFrame([{**t, "regions": ", ".join(t["regions"])} for t in targets])),
        figure=image(failure_mass_bars(ranked), "failure mass per region", lake=lake, asset="failure_regions"),
    )


@mirrors(SynthesisParams)
class SynthesisConfig(fields_of(SynthesisParams, exclude=("num_perm",))):
    """ops.posttrain.synthesis: the pool, the budget, retrieval, the filter and the teacher (the
    Launchpad face of SynthesisParams: meanings and ranges there)."""


def _teacher_items(context, config: SynthesisConfig, targets: list[dict], failed: pl.DataFrame, retr, docs: list[str],
                   lake: LakeResource, teacher: TeacherResource) -> tuple[list[dict], dict]:
    """Teacher synthesis (ops.posttrain.synthesis.teacher_synthesis) in a teacher session; calls
    are cached under the lake like every teacher call."""
    from ops.posttrain.synthesis import teacher_synthesis

    if config.teacher_requests <= 0 or not targets:
        return [], {"requested": 0, "parsed": 0, "agreed": 0}
    with teacher.session(lake.base / "teacher" / "cache.sqlite", log=context.log) as client:
        return teacher_synthesis(client, targets, failed, retr, docs, config.teacher_requests, config.teacher_max_tokens,
                                 config.retrieval_k, config.seed, config.verify_timeout_s, config.workers)


@dg.asset(deps=["failure_regions", "decontaminated_problems", "benchmark_problems"], group_name=GROUP, code_version="2",
          kinds={"scikit-learn", "parquet"})
def targeted_synthesis(context: dg.AssetExecutionContext, config: SynthesisConfig, lake: LakeResource,
                       teacher: TeacherResource) -> dg.MaterializeResult:
    """New verified items around the top failure regions, and the random control from the same pool.

    Retrieval: TF-IDF nearest neighbours (scikit-learn) over the curated corpus for each region's
    failed items. Synthesis: the mathematics_dataset generator for the regions' modules (a fresh
    seed; primary on the embedded default), and the teacher from retrieved documents when
    ``teacher_requests`` > 0. Every item: exact + MinHash dedup against the corpus (curated problems
    and stage-1 training data), decontamination against the benchmarks and the evaluation items,
    verification; rejections counted by reason (ops.posttrain.synthesis.targeted_arms). Table: both
    arms (column ``arm``)."""
    from ops.posttrain.synthesis import targeted_arms

    params = SynthesisParams(**config.model_dump())  # ranges checked once, here
    targets = json.loads(lake.path("failure_regions", name="targets.json").read_text())["targets"]
    res = targeted_arms(params, targets, lake.read("failure_regions", name="items.parquet"),
                        lake.read("sft_checkpoint", name="train.parquet"), lake.read("sft_checkpoint", name="eval.parquet"),
                        read_optional(lake, "decontaminated_problems"), read_optional(lake, "benchmark_problems"),
                        teacher=lambda failed, retr, docs: _teacher_items(context, params, targets, failed, retr, docs, lake, teacher))
    if res.targeted.height < params.budget:
        context.log.warning(f"targeted_synthesis: {res.targeted.height} targeted items < budget {params.budget} "
                            "(targeted cells ran out of pool items; raise pool_per_module)")
    path, version = lake.write(res.both, "targeted_synthesis")
    lake.write(res.rejected, "targeted_synthesis", name="rejected.parquet")
    t_rep = res.teacher_report
    return table_result(
        None, path, version, res.inputs, res.both.height,
        targeted_items=dg.MetadataValue.int(res.targeted.height), random_items=dg.MetadataValue.int(res.random.height),
        pool_filter=md_table(pl.DataFrame(res.report.as_rows())),
        held_out_templates=dg.MetadataValue.json({
            "evaluation_templates": res.eval_templates, "synthesis_pool_templates": res.pool_templates,
            "shared": 0, "rule": "ops.posttrain.data.template_side (salted hash of module and template)"}),
        rejected_by_reason=dg.MetadataValue.json(res.report.rejected),
        targeted_by_cell=md_table(res.targeted.group_by("target").len(name="items").sort("target")),
        random_by_module=md_table(res.random.group_by("module").len(name="items").sort("module")),
        embedding_cache=dg.MetadataValue.json(res.embedding),
        retrieval_library=dg.MetadataValue.text("scikit-learn TfidfVectorizer + NearestNeighbors (cosine)"),
        retrieved=md_table(pl.DataFrame(res.retrieved) if res.retrieved else pl.DataFrame({"target": []}), 20),
        teacher=dg.MetadataValue.json({**res.teacher_stats, "kept_after_filter": res.teacher_kept,
                                       "rejected_after_filter": t_rep.rejected if t_rep else {},
                                       "note": "off by default on the embedded profile (teacher_requests=0)"
                                       if params.teacher_requests <= 0 else ""}),
    )


@mirrors(ComparisonParams)
class ComparisonConfig(fields_of(ComparisonParams)):
    """The Launchpad face of ops.posttrain.report.ComparisonParams (meanings and ranges there)."""


@dg.asset(deps=["stage2_checkpoint", "failure_regions"], group_name="evaluation", code_version="2", kinds={"parquet"})
def failure_driven_comparison(context: dg.AssetExecutionContext, config: ComparisonConfig, lake: LakeResource) -> dg.MaterializeResult:
    """Stage 1 vs stage 2 targeted vs stage 2 random: accuracy on the failure slices (the targeted
    cells, test split), the other slices and overall, plus curated held-out and benchmark slices,
    with bootstrap 95% intervals; the verdict on the claim (targeted beats random on the failure
    slices without losing overall accuracy) with its numbers. Also comparison.json."""
    from ops.posttrain.plots import accuracy_bars
    from ops.posttrain.report import CHECKPOINTS, compare, summary_rows

    targets = json.loads(lake.path("failure_regions", name="targets.json").read_text())["targets"]
    scored = {"stage1": lake.read("sft_checkpoint"),
              "stage2_targeted": lake.read("stage2_checkpoint", name="scored_targeted.parquet"),
              "stage2_random": lake.read("stage2_checkpoint", name="scored_random.parquet")}
    per_seed = lake.read("stage2_checkpoint", name="scored_seeds.parquet")
    params = ComparisonParams(**config.model_dump())  # range checked once, here
    table, verdict = compare(scored, targets, params.n_boot, params.seed, per_seed=per_seed)
    path, version = lake.write(table, "failure_driven_comparison")
    doc = {"targets": targets, "table": summary_rows(table), "verdict": verdict}
    write_json_atomic(doc, lake.path("failure_driven_comparison", name="comparison.json"))
    context.log.info(verdict["statement"])
    shown = ["failure_slices", "other_slices", "overall"] + [s for s in table["slice"].unique(maintain_order=True).to_list()
                                                            if s.startswith("cell:")]
    return table_result(
        None, path, version, table.height, table.height,
        verdict_label=dg.MetadataValue.text(verdict["verdict"]),
        claim_held=dg.MetadataValue.bool(verdict["claim_held"]),
        seeds=dg.MetadataValue.json(verdict["seeds"]),
        statement=dg.MetadataValue.text(verdict["statement"]),
        comparison=md_table(table.with_columns(pl.col("accuracy", "ci_low", "ci_high").round(3)), 60),
        verdict=dg.MetadataValue.json(verdict),
        figure=image(accuracy_bars(table, shown, list(CHECKPOINTS), "accuracy (test split), 95% CI over seeds and items"),
                     "comparison", lake=lake, asset="failure_driven_comparison"),
    )
