"""Failure-driven post-training (Logics-STEM, arXiv 2601.01562 §3; docs/posttrain.md):

sft_checkpoint -> failure_regions -> targeted_synthesis -> stage2_checkpoint -> failure_driven_comparison

Stage-1 SFT of a student on the curated set and programmatic problems; evaluation; failure regions
(wrong or high-loss items clustered by annotation and by topic); targeted synthesis around the top
regions (retrieval, the mathematics_dataset generator, optionally the teacher; every item deduped,
decontaminated and verified); stage-2 SFT on the targeted items plus replay, and the control — the
same budget of random items from the same pool (synthesis-side templates only: the evaluation items
use the other templates); three stage-2 seeds per arm; the comparison with 95% intervals over seeds
and items and a verdict.

Student on the embedded default: the GPT-2-style D-CPT probe base of size ``base_size`` (default
``m``: ~150k non-embedding parameters, 2,048-token BPE of ``cpt_tokenizer``) — competition problems
are out of its reach, so the measured slice is programmatic (``ops.posttrain.data.TASK_MODULES``).
In production ``base_dir`` points at any Hugging Face causal-LM folder with a ``tokenizer.json``-
compatible tokenizer dir; the worker and the assets do not change. SFT workers run through Dagster
Pipes with ``accelerate launch`` (resources/compute.py); torch, transformers and scikit-learn load
inside the functions.

This module holds the two SFT stages and gathers failure_regions, targeted_synthesis and
failure_driven_comparison from ``posttrain_synthesis`` so that ``pipelines.definitions`` loads the
group from here. The settings and the work between reading and launching live in
``ops.posttrain.stages``.
"""

import json
from dataclasses import asdict, fields

import dagster as dg
import polars as pl

from ops.lake import write_json_atomic
from ops.lm.checkpoint import describe_saved
from ops.posttrain.sft import SftPlan, Stage2Plan
from ops.posttrain.stages import (ARMS, Stage1Inputs, Stage2Inputs, read_optional, read_predictions, reusable_runs, slice_table,
                                  stage2_runs, stage2_scores)
from resources.compute import ComputeResource
from resources.lake import LakeResource

from ._config import fields_of, mirrors, to_spec
from ._meta import image, md_table, table_result
from .launch import launch, run_dir_for, stage_committed, staged
from .posttrain_synthesis import (ComparisonConfig, FailureRegionsConfig, SynthesisConfig, _teacher_items,
                                  failure_driven_comparison, failure_regions, targeted_synthesis)

__all__ = [  # the group's definitions, and the names tests import from here
    "sft_checkpoint", "sft_checkpoint_learned", "failure_regions", "targeted_synthesis", "stage2_checkpoint",
    "failure_driven_comparison", "SftCheckpointConfig", "Stage2Config", "FailureRegionsConfig", "SynthesisConfig",
    "ComparisonConfig", "_teacher_items", "POSTTRAIN_ASSETS", "POSTTRAIN_CHECKS"]

GROUP = "training"
# asset-only fields (ops.posttrain.stages): where the student and its tokenizer come from, how the
# sets are built, the launch's time limit (and domain_ratio, whose < 0 means "read mixture_plan")
_SFT_OWN = tuple(f.name for f in fields(Stage1Inputs))
_STAGE2_OWN = tuple(f.name for f in fields(Stage2Inputs))


@mirrors(SftPlan, own=_SFT_OWN)
class SftCheckpointConfig(fields_of(Stage1Inputs, base=fields_of(SftPlan,
        exclude=("data_dir", "eval_path", "runs", "domain_ratio", "log_every", "eval_batch")))):
    """Stage-1 SFT and the evaluation set (ops.posttrain.sets): the training fields are the Launchpad
    face of ops.posttrain.sft.SftPlan, the others of ops.posttrain.stages.Stage1Inputs (meanings,
    defaults and ranges there)."""


@mirrors(Stage2Plan, own=_STAGE2_OWN)
class Stage2Config(fields_of(Stage2Inputs, base=fields_of(Stage2Plan,
        exclude=("data_dir", "eval_path", "runs", "domain_ratio", "log_every", "eval_batch",
                 "eot_token")))):
    """Stage-2 SFT of both arms from the stage-1 checkpoint (same steps, replay and hyper-parameters):
    the training fields are the Launchpad face of ops.posttrain.sft.Stage2Plan, the others of
    ops.posttrain.stages.Stage2Inputs (meanings, defaults and ranges there)."""


def _sft_launch(context, compute: ComputeResource, lake: LakeResource, asset: str, plan: SftPlan, timeout_s: float,
                outputs: dict):
    """The SFT worker's launch (``assets.launch.launch``) on compute.num_processes ranks, after
    staging every committed run that ``ops.posttrain.stages.reusable_runs`` finds reusable. The
    worker writes each run's folder under the run folder (``staged``); the step commits ``outputs``
    (name -> lake folder) only when its block succeeds, so a failed step or a late worker never
    replaces a committed model (issue 42 item 8)."""
    return launch(context, compute, base=lake.base, asset=asset, module="ops.posttrain.sft", spec=plan.to_json(),
                  fingerprint=plan.launch_fingerprint(), timeout_s=timeout_s, processes=compute.num_processes, saved=describe_saved,
                  outputs=outputs)


def _stage_runs(context, plan: SftPlan, committed: dict) -> None:
    for src, out_dir, ok in reusable_runs(plan, committed):
        stage_committed(src, out_dir, ok, context.log.info)


@dg.asset(deps=["sft_dataset", "cpt_base_models", "cpt_tokenizer", "mixture_plan", "benchmark_problems"],
          group_name=GROUP, code_version="2", kinds={"pytorch", "accelerate"}, pool="gpu")
def sft_checkpoint(context: dg.AssetExecutionContext, config: SftCheckpointConfig, lake: LakeResource,
                   compute: ComputeResource) -> dg.MaterializeResult:
    """Stage-1 SFT: the student (a D-CPT probe base on the embedded default) fine-tuned on the
    curated sft_dataset responses and generated programmatic problems — loss-masked chat format,
    packed rows, general replay at the mixture ratio, checkpoints with resume — launched through
    Pipes with accelerate; then scored on the evaluation set (exact answers through the verifier).
    Metadata: accuracy per slice and module (before and after SFT, bootstrap 95% intervals), the
    loss curve, world size, mixture ratio and its source."""
    from ops.posttrain.data import TASK_MODULES
    from ops.posttrain.evaluate import score_many
    from ops.posttrain.plots import loss_curves
    from ops.posttrain.sets import stage1_sets

    own = Stage1Inputs(**config.model_dump(include=set(_SFT_OWN))).validate()
    tok_dir, init = own.tokenizer_folder(lake.base), own.student_dir(lake.base)
    ratio, ratio_source = own.mixture_ratio(lake.base)
    if ratio_source.startswith("default"):
        context.log.info("sft_checkpoint: no mixture_plan; SFT data only (domain_ratio 1.0)")
    modules = list(own.modules) or list(TASK_MODULES)
    sft = read_optional(lake, "sft_dataset", "data/*.parquet")
    if sft is None:
        context.log.warning("sft_checkpoint: no sft_dataset; training on generated problems only")
    train, ev = stage1_sets(sft, read_optional(lake, "benchmark_problems"), modules, own.train_per_module, own.eval_per_module,
                            own.train_seed, own.eval_seed, own.heldout_fraction, own.benchmark_items, seed=config.seed,
                            arithmetic_items=own.arithmetic_items)
    prog = ev.filter(pl.col("slice") == "programmatic")
    absent = sorted(set(modules) - set(prog["module"].to_list()))
    if absent:
        context.log.warning(f"sft_checkpoint: no evaluation-side template (ops.posttrain.data.template_side) in modules "
                            f"{absent}: they are trained on but not evaluated")
    folder = lake.base / "sft_checkpoint"
    folder.mkdir(parents=True, exist_ok=True)
    lake.write(train, "sft_checkpoint", name="train.parquet")
    lake.write(ev, "sft_checkpoint", name="eval.parquet")
    # workers open paths: the tables' own files, or on an object store local copies under work_dir
    # the worker writes the model under the run folder; the step commits it to <lake>/sft_checkpoint/model
    stage = staged(run_dir_for(context, lake.base, "sft_checkpoint"), "model")
    plan = to_spec(config, data_dir=str(tok_dir), eval_path=str(lake.table_path("sft_checkpoint", name="eval.parquet")),
                   domain_ratio=ratio,
                   runs=[{"key": "stage1", "init_dir": str(init),
                          "train_path": str(lake.table_path("sft_checkpoint", name="train.parquet")),
                          "out_dir": str(stage), "eval_init": True}]).validate(compute.num_processes)
    _stage_runs(context, plan, {"stage1": folder / "model"})
    with _sft_launch(context, compute, lake, "sft_checkpoint", plan, config.timeout_s, {"model": folder / "model"}) as run:
        metrics = run.result["runs"]["stage1"]
        preds = [read_predictions(stage / f, "sft_checkpoint stage1") for f in ("predictions_init.parquet", "predictions.parquet")]
        base_sc, s1_sc = score_many(ev, preds)
        # stage 2 reuses tokenizer and EOS; the model folder it names is the committed one
        write_json_atomic({**asdict(plan), "runs": [{**r, "out_dir": str(folder / "model")} for r in plan.runs]},
                          folder / "plan.json", indent=1)
        scored = {"base": base_sc, "stage1": s1_sc}
        lake.write(base_sc, "sft_checkpoint", name="scored_base.parquet")  # the learned check reads it
        path, version = lake.write(scored["stage1"], "sft_checkpoint")
        table = slice_table(scored)
        overall = table.filter((pl.col("checkpoint") == "stage1") & (pl.col("slice") == "programmatic (test)")).row(0, named=True)
        return table_result(
            None, path, version, train.height, scored["stage1"].height,
            model_dir=dg.MetadataValue.path(str(folder / "model")),
            student=dg.MetadataValue.text(f"{init} ({metrics['n_params']} parameters, seq_len {metrics['seq_len']})"),
            world_size=dg.MetadataValue.int(run.result["world_size"]),
            distributed_type=dg.MetadataValue.text(run.result["distributed_type"]),
            domain_ratio=dg.MetadataValue.float(ratio), domain_ratio_source=dg.MetadataValue.text(ratio_source),
            train_rows=md_table(train.group_by("origin").len(name="rows").sort("origin")),
            eval_rows=md_table(ev.group_by("slice", "split").len(name="rows").sort("slice", "split")),
            eval_templates=md_table(prog.group_by("module").agg(items=pl.len(), templates=pl.col("template").n_unique())
                                    .sort("module")),
            packing=dg.MetadataValue.json(metrics["pack"]),
            final_train_loss=dg.MetadataValue.float(float(metrics["final_loss"])),
            accuracy_programmatic_test=dg.MetadataValue.float(float(overall["accuracy"])),
            accuracy=md_table(table, 80),
            train_wall_s=dg.MetadataValue.float(float(metrics["wall_s"])),
            loss_curve=image(loss_curves({"stage1": metrics["curve"]}, "stage-1 SFT loss"), "loss", lake=lake, asset="sft_checkpoint"),
            **run.metadata(),
        )


@dg.asset_check(asset="sft_checkpoint", blocking=True, description="Stage-1 training loss finite and the "
                "student learned something: programmatic accuracy above the base model's.")
def sft_checkpoint_learned(lake: LakeResource) -> dg.AssetCheckResult:
    import math

    from ops.posttrain.evaluate import score

    folder = lake.base / "sft_checkpoint"
    m = json.loads((folder / "model" / "metrics.json").read_text())
    ev = lake.read("sft_checkpoint", name="eval.parquet")
    base = lake.read("sft_checkpoint", name="scored_base.parquet") if lake.exists("sft_checkpoint", name="scored_base.parquet") \
        else score(ev, pl.read_parquet(folder / "model" / "predictions_init.parquet"))
    s1 = lake.read("sft_checkpoint")
    prog = pl.col("slice") == "programmatic"
    a0, a1 = float(base.filter(prog)["correct"].mean()), float(s1.filter(prog)["correct"].mean())
    finite = all(math.isfinite(p["loss"]) for p in m["curve"])
    return dg.AssetCheckResult(passed=finite and a1 > a0,
                               description=None if finite and a1 > a0 else f"loss finite: {finite}; accuracy {a0:.3f} -> {a1:.3f}",
                               metadata={"base_accuracy": a0, "stage1_accuracy": a1, "loss_finite": finite})


@dg.asset(deps=["targeted_synthesis", "sft_checkpoint"], group_name=GROUP, code_version="2", kinds={"pytorch", "accelerate"},
          pool="gpu")
def stage2_checkpoint(context: dg.AssetExecutionContext, config: Stage2Config, lake: LakeResource,
                      compute: ComputeResource) -> dg.MaterializeResult:
    """Stage-2 SFT from the stage-1 checkpoint (model and optimizer state) on the targeted items plus
    replay, and the control on the same number of random pool items plus the same replay — one
    launch, ``seeds`` runs per arm (same steps and hyper-parameters, data orders seed, seed + 1, ...);
    every run scored on the test split of the evaluation set (the dev split chose the regions).
    Tables: ``scored_seeds.parquet`` (one row per arm, seed and item), ``scored_<arm>.parquet`` (the
    correctness averaged over seeds)."""
    from ops.posttrain.evaluate import score_many
    from ops.posttrain.plots import loss_curves
    from ops.posttrain.sets import stage2_sets

    Stage2Inputs(**config.model_dump(include=set(_STAGE2_OWN))).validate()
    s1 = lake.base / "sft_checkpoint"
    s1_metrics = json.loads((s1 / "model" / "metrics.json").read_text())
    s1_plan = json.loads((s1 / "plan.json").read_text())
    arms = lake.read("targeted_synthesis")
    train1 = lake.read("sft_checkpoint", name="train.parquet")
    sets = stage2_sets({a: arms.filter(pl.col("arm") == a) for a in ARMS}, train1,
                       config.replay_fraction, config.seed)
    folder = lake.base / "stage2_checkpoint"
    folder.mkdir(parents=True, exist_ok=True)
    ev = lake.read("sft_checkpoint", name="eval.parquet").filter(pl.col("split") == "test")
    lake.write(ev, "stage2_checkpoint", name="eval_test.parquet", refresh=False)
    seeds = [config.seed + k for k in range(config.seeds)]
    # the worker writes every run under the run folder; the step commits them to <lake>/stage2_checkpoint/<arm>/s<k>
    stage = staged(run_dir_for(context, lake.base, "stage2_checkpoint"), "runs")
    for arm, df in sets.items():
        lake.write(df, "stage2_checkpoint", name=f"train_{arm}.parquet", refresh=False)
    runs = stage2_runs(s1 / "model", {a: str(lake.table_path("stage2_checkpoint", name=f"train_{a}.parquet")) for a in ARMS},
                       str(lake.table_path("stage2_checkpoint", name="eval_test.parquet")), stage, seeds)
    plan = to_spec(config, data_dir=s1_plan["data_dir"], eval_path=str(lake.table_path("sft_checkpoint", name="eval.parquet")),
                   eot_token=s1_plan["eot_token"],
                   domain_ratio=float(s1_metrics["domain_ratio"]), runs=runs).validate(compute.num_processes)
    keys = [(arm, k) for arm in ARMS for k in range(len(seeds))]
    committed = {f"stage2_{arm}_s{k}": folder / arm / f"s{k}" for arm, k in keys}
    _stage_runs(context, plan, committed)
    outputs = {f"runs/{arm}/s{k}": folder / arm / f"s{k}" for arm, k in keys}
    with _sft_launch(context, compute, lake, "stage2_checkpoint", plan, config.timeout_s, outputs) as run:
        all_scored = dict(zip(keys, score_many(ev, [read_predictions(stage / arm / f"s{k}" / "predictions.parquet",
                                                                     f"stage2_{arm}_s{k}") for arm, k in keys])))
        res = stage2_scores(run.result["runs"], all_scored, seeds)
        scored = res.scored
        for arm in ARMS:
            lake.write(scored[f"stage2_{arm}"], "stage2_checkpoint", name=f"scored_{arm}.parquet", refresh=False)
        lake.write(res.long, "stage2_checkpoint", name="scored_seeds.parquet", refresh=False)
        summary = pl.concat([sc.select("item_id", "slice", "split", "module", "correct").with_columns(checkpoint=pl.lit(k))
                             for k, sc in scored.items()])
        path, version = lake.write(summary, "stage2_checkpoint")
        table = slice_table(scored)
        return table_result(
            None, path, version, arms.height, summary.height,
            train_rows=md_table(pl.DataFrame([{"arm": a, "rows": d.height, "new": int((d["origin"] != "replay").sum()),
                                               "replay": int((d["origin"] == "replay").sum())} for a, d in sets.items()])),
            domain_ratio=dg.MetadataValue.float(float(s1_metrics["domain_ratio"])),
            seeds=dg.MetadataValue.json(seeds), accuracy_per_seed=md_table(pl.DataFrame(res.per_seed)),
            eval_items=dg.MetadataValue.int(ev.height),
            accuracy=md_table(table, 80), train_wall_s=dg.MetadataValue.json(res.walls),
            loss_curve=image(loss_curves(res.curves, "stage-2 SFT loss (targeted vs random, every seed)"), "loss", lake=lake, asset="stage2_checkpoint"),
            **run.metadata(),
        )


POSTTRAIN_ASSETS = [sft_checkpoint, failure_regions, targeted_synthesis, stage2_checkpoint, failure_driven_comparison]
POSTTRAIN_CHECKS = [sft_checkpoint_learned]
