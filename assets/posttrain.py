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
"""

import json
from dataclasses import asdict
from pathlib import Path

import dagster as dg
import polars as pl

from ops.lake import write_json_atomic
from ops.lm.checkpoint import describe_saved
from ops.posttrain.regions import RegionParams
from ops.posttrain.report import ComparisonParams
from ops.posttrain.sft import SftPlan, Stage2Plan
from ops.posttrain.synthesis import SynthesisParams
from resources.compute import ComputeResource
from resources.lake import LakeResource
from resources.teacher import TeacherResource

from ._config import fields_of, mirrors
from ._meta import image, md_table, table_result
from .launch import committed_fingerprint, launch, run_dir_for, stage_committed, staged

GROUP = "training"
# asset-only fields: where the student and its tokenizer come from, how the sets are built, the
# launch's time limit (and domain_ratio, whose < 0 means "read mixture_plan")
_SFT_OWN = ("base_size", "base_dir", "tokenizer_dir", "modules", "train_per_module", "eval_per_module", "train_seed",
            "eval_seed", "heldout_fraction", "benchmark_items", "arithmetic_items", "domain_ratio", "timeout_s")
_STAGE2_OWN = ("replay_fraction", "seeds", "timeout_s")


@mirrors(SftPlan, own=_SFT_OWN)
class SftCheckpointConfig(fields_of(SftPlan,
        exclude=("data_dir", "eval_path", "runs", "min_lr_ratio", "domain_ratio", "log_every", "eval_batch"))):
    """Stage-1 SFT and the evaluation set (ops.posttrain.sets): the training fields are the Launchpad
    face of ops.posttrain.sft.SftPlan (meanings, defaults and ranges there)."""

    base_size: str = "m"
    """cpt_base_models size the student starts from (ops.mixture.probe.SIZES). Measured on 2 cores:
    size m (150k non-embedding parameters) reaches 21% programmatic accuracy after 300 steps in
    ~85 s; size l reaches 9-10% in 200-300 steps at 2x the time per step."""
    base_dir: str = ""
    """A model folder (config.json + model.safetensors) to start from instead; empty = the CPT base."""
    tokenizer_dir: str = ""
    """Folder with the student's tokenizer.json (and general_train.npy for general replay); empty =
    cpt_tokenizer. Set it with base_dir for a Hugging Face model."""
    modules: list[str] = []
    """mathematics_dataset modules of the programmatic slice; empty = ops.posttrain.data.TASK_MODULES."""
    train_per_module: int = 300
    """Generated training problems per (module, level)."""
    eval_per_module: int = 60
    """Generated evaluation problems per (module, level), evaluation-side templates only
    (ops.posttrain.data.template_side); half dev (regions), half test (report)."""
    train_seed: int = 101
    """Generator seed of the programmatic training problems (must differ from eval_seed)."""
    eval_seed: int = 202
    """Generator seed of the programmatic evaluation problems (a different draw from training's)."""
    heldout_fraction: float = 0.05
    """Share of sft_dataset rows held out of training and evaluated (slice curated_heldout)."""
    benchmark_items: int = 16
    """MATH-500 and GSM8K test items attempted per benchmark (slice benchmark:<name>)."""
    arithmetic_items: int = 64
    """OLMES basic-skills arithmetic items attempted, exact answer (slice benchmark:basic_arithmetic;
    ops.posttrain.sets.basic_arithmetic_items): the real benchmark nearest to the student's reach."""
    domain_ratio: float = -1.0
    """Share of SFT sequences per step, the rest general-corpus replay; < 0 = mixture_plan's
    trade-off r_d when mixture_plan exists, else 1.0 (no general data)."""
    timeout_s: float = 1200.0
    """Wall-clock limit of the launch."""


def _model_dir(lake: LakeResource, config: SftCheckpointConfig) -> Path:
    d = Path(config.base_dir) if config.base_dir else lake.base / "cpt_base_models" / config.base_size
    if not (d / "model.safetensors").exists() or not (d / "config.json").exists():
        raise FileNotFoundError(f"sft_checkpoint: no student model at {d} (config.json + model.safetensors); "
                                f"materialize cpt_base_models partition {config.base_size!r} or set base_dir")
    return d


def _domain_ratio(context, lake: LakeResource, configured: float) -> tuple[float, str]:
    if configured >= 0:
        if configured > 1:
            raise ValueError(f"sft_checkpoint.domain_ratio must be <= 1, got {configured}")
        return configured, "config"
    plan = lake.base / "mixture_plan" / "plan.json"
    if plan.exists():
        r = json.loads(plan.read_text())["tradeoff"]["r_d"]
        return float(r), f"mixture_plan trade-off r_d ({plan})"
    context.log.info("sft_checkpoint: no mixture_plan; SFT data only (domain_ratio 1.0)")
    return 1.0, "default (no mixture_plan)"


def _read_optional(lake: LakeResource, asset: str, pattern: str | None = None) -> pl.DataFrame | None:
    if lake.remote:                                # object store: committed tables / dataset folders only
        try:
            return lake.read_dataset(asset) if pattern else lake.read(asset)
        except FileNotFoundError:
            return None
    if pattern:
        files = sorted((lake.base / asset).glob(pattern))
        return pl.concat([pl.read_parquet(f) for f in files], how="vertical_relaxed") if files else None
    p = lake.path(asset)
    return pl.read_parquet(p) if p.exists() else None


def _sft_launch(context, compute: ComputeResource, lake: LakeResource, asset: str, plan: SftPlan, timeout_s: float,
                outputs: dict[str, Path]):
    """The SFT worker's launch (``assets.launch.launch``) on compute.num_processes ranks. The worker
    writes each run's folder under the run folder (``staged``); the step commits ``outputs`` (name ->
    lake folder) only when its block succeeds, so a failed step or a late worker never replaces a
    committed model (issue 42 item 8)."""
    return launch(context, compute, base=lake.base, asset=asset, module="ops.posttrain.sft", spec=plan.to_json(),
                  fingerprint=plan.launch_fingerprint(), timeout_s=timeout_s, processes=compute.num_processes, saved=describe_saved,
                  outputs=outputs)


def _stage_runs(context, plan: SftPlan, committed: dict[str, Path]) -> None:
    """Stage every committed run folder (run key -> lake folder) whose ``metrics.json`` carries that
    run's fingerprint and whose predictions exist, so the worker reuses it instead of retraining."""
    for r in plan.runs:
        src = committed[r["key"]]
        needs = [src / "model.safetensors", src / "predictions.parquet"] + ([src / "predictions_init.parquet"] if r.get("eval_init") else [])
        ok = committed_fingerprint(src / "metrics.json") == plan.fingerprint(r) and all(p.exists() for p in needs)
        stage_committed(src, r["out_dir"], ok, context.log.info)


def _read_predictions(path: Path, run_key: str) -> pl.DataFrame:
    """A run's staged predictions, checked before anything is committed: dg.Failure naming the file
    when it is missing or lacks ``item_id`` / ``prediction``."""
    try:
        df = pl.read_parquet(path)
    except (OSError, pl.exceptions.ComputeError) as e:
        raise dg.Failure(f"{run_key}: unreadable predictions {path}: {e}") from e
    missing = [c for c in ("item_id", "prediction") if c not in df.columns]
    if missing:
        raise dg.Failure(f"{run_key}: predictions {path} lack column(s) {missing}")
    return df


def _slice_table(scored: dict[str, pl.DataFrame]) -> pl.DataFrame:
    from ops.posttrain.evaluate import accuracy_table

    slices = {"programmatic (test)": (pl.col("slice") == "programmatic") & (pl.col("split") == "test"),
              "programmatic (dev)": (pl.col("slice") == "programmatic") & (pl.col("split") == "dev")}
    any_df = next(iter(scored.values()))
    for s in sorted(set(any_df["slice"].to_list()) - {"programmatic"}):
        slices[s] = pl.col("slice") == s
    for m in sorted(set(any_df["module"].drop_nulls().to_list())):
        slices[f"module:{m}"] = pl.col("module") == m
    table = accuracy_table(scored, slices).filter(pl.col("n") > 0)  # stage 2 scores the test split only
    return table.with_columns(pl.col("accuracy", "ci_low", "ci_high").round(3))


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

    tok_dir = Path(config.tokenizer_dir) if config.tokenizer_dir else lake.base / "cpt_tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        raise FileNotFoundError(f"sft_checkpoint: no tokenizer at {tok_dir / 'tokenizer.json'}; materialize cpt_tokenizer "
                                "first (or set tokenizer_dir)")
    init = _model_dir(lake, config)
    ratio, ratio_source = _domain_ratio(context, lake, config.domain_ratio)
    modules = list(config.modules) or list(TASK_MODULES)
    sft = _read_optional(lake, "sft_dataset", "data/*.parquet")
    bench = _read_optional(lake, "benchmark_problems")
    if sft is None:
        context.log.warning("sft_checkpoint: no sft_dataset; training on generated problems only")
    train, ev = stage1_sets(sft, bench, modules, config.train_per_module, config.eval_per_module, config.train_seed,
                            config.eval_seed, config.heldout_fraction, config.benchmark_items, seed=config.seed,
                            arithmetic_items=config.arithmetic_items)
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
    plan = SftPlan(data_dir=str(tok_dir), eval_path=str(lake.table_path("sft_checkpoint", name="eval.parquet")),
                   domain_ratio=ratio,
                   runs=[{"key": "stage1", "init_dir": str(init),
                          "train_path": str(lake.table_path("sft_checkpoint", name="train.parquet")),
                          "out_dir": str(stage), "eval_init": True}],
                   **config.model_dump(exclude=set(_SFT_OWN))).validate(compute.num_processes)
    _stage_runs(context, plan, {"stage1": folder / "model"})
    with _sft_launch(context, compute, lake, "sft_checkpoint", plan, config.timeout_s, {"model": folder / "model"}) as run:
        metrics = run.result["runs"]["stage1"]
        preds = [_read_predictions(stage / f, "sft_checkpoint stage1") for f in ("predictions_init.parquet", "predictions.parquet")]
        base_sc, s1_sc = score_many(ev, preds)
        # stage 2 reuses tokenizer and EOS; the model folder it names is the committed one
        write_json_atomic({**asdict(plan), "runs": [{**r, "out_dir": str(folder / "model")} for r in plan.runs]},
                          folder / "plan.json", indent=1)
        scored = {"base": base_sc, "stage1": s1_sc}
        lake.write(base_sc, "sft_checkpoint", name="scored_base.parquet")  # the learned check reads it
        path, version = lake.write(scored["stage1"], "sft_checkpoint")
        table = _slice_table(scored)
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


@mirrors(RegionParams)
class FailureRegionsConfig(fields_of(RegionParams, exclude=("min_module_share",))):
    """ops.posttrain.regions: failure mass, annotation and topic regions, synthesis targets (the
    Launchpad face of RegionParams: meanings and ranges there)."""


@dg.asset(deps=["sft_checkpoint"], group_name=GROUP, code_version="1", kinds={"scikit-learn", "parquet"})
def failure_regions(context: dg.AssetExecutionContext, config: FailureRegionsConfig, lake: LakeResource) -> dg.MaterializeResult:
    """Wrong or high-loss stage-1 items (dev split of the programmatic evaluation) clustered by
    annotation (domain x difficulty x answer type x mathematics_dataset module) and by topic
    (TF-IDF + k-means), ranked by failure mass; the top regions become synthesis targets."""
    from ops import lake as lakeio
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
    lakeio.write_json_atomic({"targets": targets, "config": config.model_dump()}, lake.path("failure_regions", name="targets.json"))
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
    verification; rejections counted by reason. Table: both arms (column ``arm``)."""
    from ops.posttrain.sets import pool_rows
    from ops.posttrain.synthesis import ItemFilter, Retriever, select_random, select_targeted

    config = SynthesisParams(**config.model_dump())  # ranges checked once, here
    targets = json.loads(lake.path("failure_regions", name="targets.json").read_text())["targets"]
    items = lake.read("failure_regions", name="items.parquet")
    train = lake.read("sft_checkpoint", name="train.parquet")
    ev = lake.read("sft_checkpoint", name="eval.parquet")
    curated = _read_optional(lake, "decontaminated_problems")
    bench = _read_optional(lake, "benchmark_problems")
    modules = sorted(set(ev.filter(pl.col("module").is_not_null())["module"].to_list()))
    corpus = train["problem"].to_list() + (curated["problem"].to_list() if curated is not None else [])
    benchmarks = ([{"benchmark": b, "item_id": i, "problem": p} for b, i, p in bench.select("benchmark", "item_id", "problem").iter_rows()]
                  if bench is not None else [])
    benchmarks += [{"benchmark": "posttrain_eval", "item_id": i, "problem": p} for i, p in ev.select("item_id", "problem").iter_rows()]
    flt = ItemFilter(corpus, benchmarks, near_threshold=config.near_threshold, num_perm=config.num_perm,
                     verify_timeout_s=config.verify_timeout_s, workers=config.workers)

    # retrieval over the curated corpus (problem + solution), else the stage-1 training rows
    if curated is not None and curated.height:
        docs = [f"{p}\n{s or ''}".strip() for p, s in curated.select("problem", "solution").iter_rows()]
    else:
        docs = [f"{p}\n{r}" for p, r in train.select("problem", "response").iter_rows()]
    retr = Retriever(docs)
    failed = items.filter(pl.col("failure_mass") > 0)
    retrieved = []
    for t in targets:
        q = failed.filter(pl.col("module") == t["module"])["problem"].head(5).to_list()
        if q:
            for j, sim in retr.query([" ".join(q)], k=config.retrieval_k)[0]:
                retrieved.append({"target": f"{t['module']}|{t['difficulty']}", "similarity": round(sim, 3), "document": docs[j][:160]})

    pool = pool_rows(modules, config.pool_per_module, config.pool_seed)  # synthesis-side templates only
    eval_templates = set(ev.filter(pl.col("template").is_not_null()).select(pl.concat_str("module", "template", separator="\x1f"))
                         .to_series().to_list())
    pool_templates = set(pool.select(pl.concat_str("module", "template", separator="\x1f")).to_series().to_list())
    if eval_templates & pool_templates:  # template_side makes this impossible; a broken split must not go unseen
        raise RuntimeError(f"targeted_synthesis: {len(eval_templates & pool_templates)} (module, template) pairs are both "
                           "evaluation and synthesis templates")
    kept, rejected, rep = flt.run(pool.to_dicts())
    kept_df = pl.DataFrame(kept, schema=pool.schema) if kept else pool.head(0)
    t_items, t_stats = _teacher_items(context, config, targets, failed, retr, docs, lake, teacher)
    if t_items:  # a teacher question in an evaluation template is dropped (the held-out rule covers every source)
        from ops.posttrain.data import template_of

        n0 = len(t_items)
        t_items = [it for it in t_items if f"{it['module']}\x1f{template_of(it['problem'])}" not in eval_templates]
        t_stats["dropped_eval_template"] = n0 - len(t_items)
    t_kept, t_rej, t_rep = flt.run(t_items) if t_items else ([], [], None)
    n_gen = max(0, config.budget - len(t_kept))
    targeted = select_targeted(kept_df, targets, n_gen, seed=config.seed)
    if t_kept:
        targeted = pl.concat([targeted, pl.DataFrame(t_kept).with_columns(target=pl.lit("teacher"))], how="diagonal_relaxed")
    random = select_random(kept_df, targeted.height, seed=config.seed).with_columns(target=pl.lit(None, pl.String))
    if targeted.height < config.budget:
        context.log.warning(f"targeted_synthesis: {targeted.height} targeted items < budget {config.budget} "
                            "(targeted cells ran out of pool items; raise pool_per_module)")
    both = pl.concat([targeted.with_columns(arm=pl.lit("targeted")), random.with_columns(arm=pl.lit("random"))],
                     how="diagonal_relaxed")
    path, version = lake.write(both, "targeted_synthesis")
    rej = pl.DataFrame(rejected + t_rej) if (rejected or t_rej) else pl.DataFrame({"reason": []}, schema={"reason": pl.String})
    lake.write(rej, "targeted_synthesis", name="rejected.parquet")
    funnel = pl.DataFrame(rep.as_rows())
    by_target = targeted.group_by("target").len(name="items").sort("target")
    return table_result(
        None, path, version, pool.height + len(t_items), both.height,
        targeted_items=dg.MetadataValue.int(targeted.height), random_items=dg.MetadataValue.int(random.height),
        pool_filter=md_table(funnel),
        held_out_templates=dg.MetadataValue.json({
            "evaluation_templates": len(eval_templates), "synthesis_pool_templates": len(pool_templates),
            "shared": 0, "rule": "ops.posttrain.data.template_side (salted hash of module and template)"}),
        rejected_by_reason=dg.MetadataValue.json(rep.rejected),
        targeted_by_cell=md_table(by_target),
        random_by_module=md_table(random.group_by("module").len(name="items").sort("module")),
        retrieval_library=dg.MetadataValue.text("scikit-learn TfidfVectorizer + NearestNeighbors (cosine)"),
        retrieved=md_table(pl.DataFrame(retrieved) if retrieved else pl.DataFrame({"target": []}), 20),
        teacher=dg.MetadataValue.json({**t_stats, "kept_after_filter": len(t_kept),
                                       "rejected_after_filter": t_rep.rejected if t_rep else {},
                                       "note": "off by default on the embedded profile (teacher_requests=0)"
                                       if config.teacher_requests <= 0 else ""}),
    )


@mirrors(Stage2Plan, own=_STAGE2_OWN)
class Stage2Config(fields_of(Stage2Plan,
        exclude=("data_dir", "eval_path", "runs", "min_lr_ratio", "domain_ratio", "log_every", "eval_batch",
                 "eot_token"))):
    """Stage-2 SFT of both arms from the stage-1 checkpoint (same steps, replay and hyper-parameters):
    the training fields are the Launchpad face of ops.posttrain.sft.Stage2Plan (meanings, defaults
    and ranges there)."""

    replay_fraction: float = 0.3
    """Share of stage-2 rows replayed from the stage-1 training set (the same rows in both arms)."""
    seeds: int = 3
    """Training runs per arm (>= 1; 3 by default), each with its own data order (seed, seed + 1,
    ...), all in one launch; the comparison's intervals resample these seeds as well as the items
    (ops.posttrain.report.hierarchical_bootstrap), so training-order noise is not read as an effect."""
    timeout_s: float = 1200.0
    """Wall-clock limit of the launch (every run of both arms)."""


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
    from ops.posttrain.evaluate import average_seeds, score_many
    from ops.posttrain.plots import loss_curves
    from ops.posttrain.sets import stage2_sets

    if config.seeds < 1:
        raise ValueError(f"stage2_checkpoint.seeds must be >= 1, got {config.seeds}")
    s1 = lake.base / "sft_checkpoint"
    s1_metrics = json.loads((s1 / "model" / "metrics.json").read_text())
    s1_plan = json.loads((s1 / "plan.json").read_text())
    arms = lake.read("targeted_synthesis")
    train1 = lake.read("sft_checkpoint", name="train.parquet")
    sets = stage2_sets({a: arms.filter(pl.col("arm") == a) for a in ("targeted", "random")}, train1,
                       config.replay_fraction, config.seed)
    folder = lake.base / "stage2_checkpoint"
    folder.mkdir(parents=True, exist_ok=True)
    ev = lake.read("sft_checkpoint", name="eval.parquet").filter(pl.col("split") == "test")
    lake.write(ev, "stage2_checkpoint", name="eval_test.parquet", refresh=False)
    seeds = [config.seed + k for k in range(config.seeds)]
    # the worker writes every run under the run folder; the step commits them to <lake>/stage2_checkpoint/<arm>/s<k>
    stage = staged(run_dir_for(context, lake.base, "stage2_checkpoint"), "runs")
    runs = []
    for arm, df in sets.items():
        lake.write(df, "stage2_checkpoint", name=f"train_{arm}.parquet", refresh=False)
        for k, sd in enumerate(seeds):
            runs.append({"key": f"stage2_{arm}_s{k}", "init_dir": str(s1 / "model"),
                         "init_optimizer": str(s1 / "model" / "optimizer.pt"), "seed": sd,
                         "train_path": str(lake.table_path("stage2_checkpoint", name=f"train_{arm}.parquet")),
                         "out_dir": str(stage / arm / f"s{k}"),
                         "eval_path": str(lake.table_path("stage2_checkpoint", name="eval_test.parquet"))})
    plan = Stage2Plan(data_dir=s1_plan["data_dir"], eval_path=str(lake.table_path("sft_checkpoint", name="eval.parquet")),
                      eot_token=s1_plan["eot_token"],
                      domain_ratio=float(s1_metrics["domain_ratio"]), runs=runs,
                      **config.model_dump(exclude=set(_STAGE2_OWN))).validate(compute.num_processes)
    keys = [(arm, k) for arm in ("targeted", "random") for k in range(len(seeds))]
    committed = {f"stage2_{arm}_s{k}": folder / arm / f"s{k}" for arm, k in keys}
    _stage_runs(context, plan, committed)
    outputs = {f"runs/{arm}/s{k}": folder / arm / f"s{k}" for arm, k in keys}
    with _sft_launch(context, compute, lake, "stage2_checkpoint", plan, config.timeout_s, outputs) as run:
        scored, curves, walls, per_seed, long = {}, {}, {}, [], []
        prog = (pl.col("slice") == "programmatic") & (pl.col("split") == "test")
        all_scored = dict(zip(keys, score_many(ev, [_read_predictions(stage / arm / f"s{k}" / "predictions.parquet",
                                                                      f"stage2_{arm}_s{k}") for arm, k in keys])))
        for arm in ("targeted", "random"):
            frames = []
            for k, sd in enumerate(seeds):
                m = run.result["runs"][f"stage2_{arm}_s{k}"]
                if int(m["seed"]) != sd:
                    raise RuntimeError(f"stage2_checkpoint: run stage2_{arm}_s{k} trained with seed {m['seed']}, planned {sd}")
                sc = all_scored[(arm, k)]
                frames.append(sc)
                long.append(sc.select("item_id", "slice", "split", "module", "difficulty", "correct")
                            .with_columns(checkpoint=pl.lit(f"stage2_{arm}"), seed=pl.lit(sd)))
                curves[f"{arm} seed {sd}"], walls[f"{arm}_s{k}"] = m["curve"], m["wall_s"]
                per_seed.append({"arm": arm, "seed": sd, "steps": m["steps"], "final_loss": round(float(m["final_loss"]), 4),
                                 "accuracy_programmatic_test": round(float(sc.filter(prog)["correct"].mean()), 4)})
            sc = average_seeds(frames)
            lake.write(sc, "stage2_checkpoint", name=f"scored_{arm}.parquet", refresh=False)
            scored[f"stage2_{arm}"] = sc
        lake.write(pl.concat(long), "stage2_checkpoint", name="scored_seeds.parquet", refresh=False)
        summary = pl.concat([sc.select("item_id", "slice", "split", "module", "correct").with_columns(checkpoint=pl.lit(k))
                             for k, sc in scored.items()])
        path, version = lake.write(summary, "stage2_checkpoint")
        table = _slice_table(scored)
        return table_result(
            None, path, version, arms.height, summary.height,
            train_rows=md_table(pl.DataFrame([{"arm": a, "rows": d.height, "new": int((d["origin"] != "replay").sum()),
                                               "replay": int((d["origin"] == "replay").sum())} for a, d in sets.items()])),
            domain_ratio=dg.MetadataValue.float(float(s1_metrics["domain_ratio"])),
            seeds=dg.MetadataValue.json(seeds), accuracy_per_seed=md_table(pl.DataFrame(per_seed)),
            eval_items=dg.MetadataValue.int(ev.height),
            accuracy=md_table(table, 80), train_wall_s=dg.MetadataValue.json(walls),
            loss_curve=image(loss_curves(curves, "stage-2 SFT loss (targeted vs random, every seed)"), "loss", lake=lake, asset="stage2_checkpoint"),
            **run.metadata(),
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
    from ops import lake as lakeio
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
    lakeio.write_json_atomic(doc, lake.path("failure_driven_comparison", name="comparison.json"))
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


POSTTRAIN_ASSETS = [sft_checkpoint, failure_regions, targeted_synthesis, stage2_checkpoint, failure_driven_comparison]
POSTTRAIN_CHECKS = [sft_checkpoint_learned]
