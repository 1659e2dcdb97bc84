"""Distillation (Logics-STEM §2, stage 4): the reference path and the teacher path.

Reference path: a row's source solution is its response only if the solution's final answer
verifies against the reference answer. Teacher path: for a slice of rows still ``needs_teacher``
(optionally also rows with a reference), the teacher writes k samples; each is verified; the kept
response is the shortest verified one (see ops/curation/distill.py). Every teacher response is
cached as it arrives (SQLite under the lake), so a killed run resumes without re-asking.

Seeded samples (docs/curation.md, "Seeded distillation"): every teacher request carries the sampler
seed ``teacher_seed(seed, problem_id, sample_index)``; the metadata says whether the teacher honoured
the seeds (``teacher_seeded``) and which backends answered (``teacher_system_fingerprints``).
"""

import dagster as dg
import polars as pl

from ops import figures
from ops.curation.distill import DistillParams
from resources.lake import LakeResource
from resources.teacher import TeacherResource

from ._config import fields_of, mirrors
from ._meta import image, md_table, table_result

GROUP = "curation"


@mirrors(DistillParams)
class DistillConfig(fields_of(DistillParams)):
    """Launchpad face of ``ops.curation.distill.DistillParams`` (meanings, ranges, defaults there)."""


def _reference_path(df: pl.DataFrame, config: DistillParams, log=None) -> pl.DataFrame:
    """Verify each source solution's final answer against the reference answer.

    A solution cannot verify itself: when the answer field does not parse and the gold falls back
    to the solution's own last ``\\boxed{}``, the row counts as verified only if the answer field
    says the same thing textually (e.g. a list MATH writes without delimiters). Otherwise the row
    is quarantined (a present but corrupt answer) or left to the teacher (no answer field at all),
    whose samples are then checked against the solution's boxed answer.
    """
    from ops.curation.verify import VerifyItem, answers_agree, last_boxed, verify_stable

    items = []
    for r in df.select("problem_id", "answer", "solution", "answer_type").iter_rows(named=True):
        has_solution = bool(r["solution"] and r["solution"].strip())
        items.append(VerifyItem(r["problem_id"], r["answer"], r["solution"],
                                r["solution"] if has_solution and r["answer_type"] != "multiple_choice" else None,
                                r["answer_type"]))
    results = verify_stable(items, timeout_s=config.verify_timeout_s, workers=config.workers, log=log)
    res = pl.DataFrame([{k: r.get(k) for k in ("key", "status", "gold_source", "reason")} for r in results],
                       schema={"key": pl.String, "status": pl.String, "gold_source": pl.String, "reason": pl.String})
    res = res.rename({"key": "problem_id", "status": "verify_status", "reason": "_verify_reason"})
    out = df.join(res, on="problem_id", how="left")
    reasons = []
    for r in out.select("verify_status", "gold_source", "answer", "solution", "_verify_reason").iter_rows(named=True):
        if r["verify_status"] == "unparseable_gold":  # read in part or not at all (ops.curation.verify.read_gold)
            reasons.append("no parseable gold answer (answer field, nor the solution's \\boxed{})"
                           + (f": {r['_verify_reason']}" if r["_verify_reason"] else ""))
        elif r["verify_status"] == "verified" and r["gold_source"] == "solution_boxed":
            answer = (r["answer"] or "").strip()
            if not answer:
                reasons.append("self")  # nothing independent to check the solution against
            elif answers_agree(answer, last_boxed(r["solution"]) or ""):
                reasons.append(None)
            else:
                reasons.append("answer field does not parse and disagrees with the solution's \\boxed{}")
        else:
            reasons.append(None)
    out = out.with_columns(_reason=pl.Series(reasons, dtype=pl.String))
    return out.with_columns(
        status=pl.when(pl.col("_reason") == "self").then(pl.lit("needs_teacher"))
        .when(pl.col("_reason").is_not_null()).then(pl.lit("quarantined"))
        .when(pl.col("verify_status") == "verified").then(pl.lit("verified"))
        .otherwise(pl.lit("needs_teacher")),
        reason=pl.when(pl.col("_reason") != "self").then(pl.col("_reason")),
    ).with_columns(
        response=pl.when(pl.col("status") == "verified").then(pl.col("solution")),
        response_source=pl.when(pl.col("status") == "verified").then(pl.lit("reference")),
    ).drop("_reason", "_verify_reason")


SAMPLE_SCHEMA = {"problem_id": pl.String, "sample_index": pl.Int64, "seed": pl.Int64, "status": pl.String, "text": pl.String,
                 "completion_tokens": pl.Int64, "chars": pl.Int64, "error": pl.String, "cached": pl.Boolean,
                 "system_fingerprint": pl.String}


def _seeding(results) -> dict:
    """``teacher_seeded`` (every answered sample was seeded and the teacher honoured the seed) and
    the sorted ``system_fingerprints`` the answers came with; {} when nothing was answered."""
    ok = [r for r in results if r.status == "ok"]
    if not ok:
        return {}
    return {"teacher_seeded": all(r.request.seed is not None and r.seed_honoured for r in ok),
            "system_fingerprints": sorted({r.system_fingerprint for r in ok if r.system_fingerprint})}


def _teacher_path(context, out: pl.DataFrame, config: DistillParams, lake: LakeResource, teacher: TeacherResource):
    from ops.curation.distill import build_requests, select_rows, summarize, verify_samples

    eligible = out.filter(pl.col("status") == "needs_teacher")
    if config.teacher_also_reference_rows:
        eligible = out.filter(pl.col("status").is_in(["needs_teacher", "verified"]))
    rows = select_rows(eligible.to_dicts(), config.teacher_max_rows, seed=config.seed)
    if not rows or not config.teacher:
        return out, pl.DataFrame(schema=SAMPLE_SCHEMA), {}, {}
    params = {"temperature": config.temperature, "max_tokens": config.max_tokens}
    requests = build_requests(rows, config.k_samples, params, config.prompt_templates, seed=config.seed)
    from ops.progress import Progress

    tracker = Progress(len(requests), "teacher", context.log.info, every_s=10.0, unit="responses")

    def progress(res):
        tracker.update()

    import time

    t0 = time.monotonic()
    with teacher.session(lake.base / "teacher" / "cache.sqlite", log=context.log) as client:
        results = client.complete(requests, on_result=progress)
        stats = {"http_requests": client.stats.http_requests, "retries": client.stats.retries,
                 "cache_hits": client.stats.cache_hits, "failed": client.stats.failed}
    stats["teacher_seconds"] = round(time.monotonic() - t0, 1)
    seeding = _seeding(results)
    if seeding and not seeding["teacher_seeded"]:
        context.log.warning("the teacher did not report honouring the request seeds (OpenAI `seed` is best effort): "
                            "distilled_problems may differ between runs with the same seed; fingerprints seen: "
                            f"{seeding['system_fingerprints'] or 'none'}")
    samples = verify_samples(rows, results, timeout_s=config.verify_timeout_s, workers=config.workers)
    per = summarize(samples, keep=config.keep_per_problem)
    source = f"teacher:{teacher.model_name()}"
    upd = pl.DataFrame(
        [{"problem_id": pid, "n_samples": p["n_samples"], "n_verified": p["n_verified"], "n_failed": p["n_failed"],
          "pass_rate": p["pass_rate"], "teacher_response": p["best"][0]["text"] if p["best"] else None}
         for pid, p in per.items()],
        schema={"problem_id": pl.String, "n_samples": pl.Int64, "n_verified": pl.Int64, "n_failed": pl.Int64,
                "pass_rate": pl.Float64, "teacher_response": pl.String},
    )
    out = out.drop("n_samples", "n_verified", "n_failed", "pass_rate").join(upd, on="problem_id", how="left")
    teacher_ok = pl.col("teacher_response").is_not_null()
    out = out.with_columns(
        response=pl.when(pl.col("status") == "verified").then(pl.col("response")).when(teacher_ok).then(pl.col("teacher_response")),
        response_source=pl.when(pl.col("status") == "verified").then(pl.col("response_source")).when(teacher_ok).then(pl.lit(source)),
        status=pl.when(teacher_ok).then(pl.lit("verified")).otherwise(pl.col("status")),
    ).drop("teacher_response")
    return out, pl.DataFrame(samples, schema=SAMPLE_SCHEMA), stats, seeding


def _seeding_meta(seeding: dict) -> dict:
    if not seeding:
        return {}
    return {"teacher_seeded": dg.MetadataValue.bool(seeding["teacher_seeded"]),
            "teacher_system_fingerprints": dg.MetadataValue.json(seeding["system_fingerprints"])}


@dg.multi_asset(
    specs=[
        dg.AssetSpec("distilled_problems", deps=["decontaminated_problems"], group_name=GROUP, code_version="3",
                     kinds={"parquet"},
                     description="Problems with a verified response (reference solution or teacher sample) or status "
                     "needs_teacher; per row n_samples, n_verified, pass_rate. Unparseable gold answers go to "
                     "distilled_problems_quarantine."),
        dg.AssetSpec("verification_report", deps=["decontaminated_problems"], group_name=GROUP, code_version="2",
                     kinds={"parquet"}, description="Verification outcomes per source, domain and path."),
        dg.AssetSpec("teacher_responses", deps=["decontaminated_problems"], group_name=GROUP, code_version="2",
                     kinds={"parquet"}, description="Every teacher sample with its verification status."),
    ]
)
def distilled_problems(context: dg.AssetExecutionContext, config: DistillConfig, lake: LakeResource, teacher: TeacherResource):
    params = DistillParams(**config.model_dump())  # ranges and templates checked once, here
    df = lake.read("decontaminated_problems")
    out = _reference_path(df, params, context.log.info).with_columns(
        n_samples=pl.lit(None, pl.Int64), n_verified=pl.lit(None, pl.Int64), n_failed=pl.lit(None, pl.Int64),
        pass_rate=pl.lit(None, pl.Float64),
    )
    quarantine = out.filter(pl.col("status") == "quarantined")
    out = out.filter(pl.col("status") != "quarantined").drop("reason")
    out, samples, tstats, seeding = _teacher_path(context, out, params, lake, teacher)
    lake.write(quarantine, "distilled_problems_quarantine")
    path, version = lake.write(out, "distilled_problems")
    spath, sversion = lake.write(samples, "teacher_responses")
    report = (
        out.with_columns(path=pl.coalesce(pl.col("response_source"), pl.lit("none")))
        .group_by("source", "domain", "difficulty", "path", "status").len(name="rows")
        .sort("source", "domain", "difficulty", "path", "status")
    )
    rpath, rversion = lake.write(report, "verification_report")
    if quarantine.height:
        context.log.warning(f"{quarantine.height} rows quarantined (no trustworthy gold answer); see distilled_problems_quarantine")
    n_ver = int((out["status"] == "verified").sum())
    n_teacher = int(out["response_source"].fill_null("").str.starts_with("teacher:").sum())
    meta = dict(
        verified=dg.MetadataValue.int(n_ver),
        verified_reference=dg.MetadataValue.int(int((out["response_source"] == "reference").sum())),
        verified_teacher=dg.MetadataValue.int(n_teacher),
        needs_teacher=dg.MetadataValue.int(out.height - n_ver),
        quarantined=dg.MetadataValue.int(quarantine.height),
        gold_from_solution_fallback=dg.MetadataValue.int(int((out["gold_source"] == "solution_boxed").sum())),
        figure=image(figures.funnel(list(out.group_by("status").len(name="rows").sort("status").iter_rows()), "distillation status"), "status", lake=lake, asset="distilled_problems"),
        **_seeding_meta(seeding),
    )
    yield table_result("distilled_problems", path, version, df.height, out.height, **meta)
    yield table_result("verification_report", rpath, rversion, report.height, report.height, report=md_table(report, 60))
    yield _teacher_result(spath, sversion, samples, out, tstats, seeding, lake)


def _teacher_result(path, version, samples: pl.DataFrame, out: pl.DataFrame, tstats: dict, seeding: dict,
                    lake: LakeResource) -> dg.MaterializeResult:
    answered = samples.filter(pl.col("status") != "failed")
    acceptance = (
        out.filter(pl.col("n_samples").is_not_null())
        .group_by("source", "domain", "difficulty")
        .agg(rows=pl.len(), samples=pl.col("n_samples").sum(), verified=pl.col("n_verified").sum(),
             failed=pl.col("n_failed").sum(), rows_with_verified=(pl.col("n_verified") > 0).sum())
        .with_columns(acceptance=pl.col("verified") / (pl.col("samples") - pl.col("failed")).clip(lower_bound=1))
        .sort("source", "domain", "difficulty")
    )
    lengths = answered["completion_tokens"].drop_nulls().to_list()
    meta = {
        "samples": dg.MetadataValue.int(samples.height),
        "samples_verified": dg.MetadataValue.int(int((samples["status"] == "verified").sum())),
        "samples_failed": dg.MetadataValue.int(int((samples["status"] == "failed").sum())),
        "acceptance_rate": dg.MetadataValue.float(float((answered["status"] == "verified").mean()) if answered.height else 0.0),
        "acceptance_by_source_domain_difficulty": md_table(acceptance, 60),
        "status_counts": md_table(samples.group_by("status").len(name="rows").sort("status")),
        "client": dg.MetadataValue.json(tstats),
        **_seeding_meta(seeding),
    }
    if lengths:
        meta["response_length_figure"] = image(figures.histogram(lengths, 20, "teacher response length", "completion tokens"), "lengths",
                                                  lake=lake, asset="teacher_responses")
    return table_result("teacher_responses", path, version, samples.height, samples.height, **meta)
