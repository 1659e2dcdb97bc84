"""The probe grid of the ``mixture`` group: its partitions, ``cpt_base_models`` (per size) and
``cpt_probe_runs`` (size x domain ratio), launched through the probe worker ``ops.mixture.probe``
(docs/mixture.md, "Probe grid"). The run lists, keys, reuse and tables are ``ops.mixture.probe_grid``;
these assets read inputs, build the ``ProbePlan``, launch, and write tables and metadata.
"""

import warnings

import dagster as dg
import polars as pl

from ops.lm.checkpoint import describe_saved
from ops.mixture.probe import PROBE_BASE_INITS, PROBE_REPEAT_RATIOS, PROBE_SEEDS, ProbePlan, base_dir_name, run_dir_name
from ops.mixture.probe_grid import (base_partition_meta, base_rows, base_runs, base_settings,
                                    distinct_ints, grid_from_env, partition_table, probe_partition_meta, probe_runs,
                                    read_probe_runs, seeds_at, stage_committed_bases)
from resources.compute import ComputeResource
from resources.lake import LakeResource

from ._config import fields_of, mirrors
from ._meta import image, md_table, partition_versions
from .launch import committed_fingerprint, launch, run_dir_for, stage_committed, staged

# single-run backfills and the multi-to-single-dimension mapping are marked beta in Dagster 1.13
warnings.filterwarnings("ignore", category=dg.BetaWarning)

# The probe grid. A larger grid is an environment variable away (the partition set is fixed when the
# code location loads): CRUCIBLE_CPT_SIZES from ops.mixture.probe.SIZES, CRUCIBLE_CPT_RATIOS in [0, 1].
CPT_SIZES, CPT_RATIOS = grid_from_env()
size_partitions = dg.StaticPartitionsDefinition(CPT_SIZES)
probe_partitions = dg.MultiPartitionsDefinition({"size": size_partitions,
                                                 "ratio": dg.StaticPartitionsDefinition(CPT_RATIOS)})


def _dims(key) -> dict:
    """{'size': ..., 'ratio': ...} of a multi-partition key (a MultiPartitionKey or 'ratio|size' string)."""
    if hasattr(key, "keys_by_dimension"):
        return dict(key.keys_by_dimension)
    return dict(probe_partitions.get_partition_key_from_str(str(key)).keys_by_dimension)


def current_probe_folders(lake: LakeResource) -> tuple[dict[str, str], list[str]]:
    """({lake folder: partition key} of the current ``cpt_probe_runs`` partitions that have a finished
    table, [lake folders that are no current partition]): a folder left by an earlier probe grid
    (another ``CRUCIBLE_CPT_RATIOS`` or size list) is not a partition the UI shows."""
    keys = {run_dir_name(_dims(k)["size"], float(_dims(k)["ratio"])): str(k) for k in probe_partitions.get_partition_keys()}
    present = lake.partitions("cpt_probe_runs")
    return {n: keys[n] for n in present if n in keys}, [n for n in present if n not in keys]


def _partition_versions(context: dg.AssetExecutionContext, per_key: dict) -> dg.DataVersion:
    """Record each partition's own data version, row count and figures on its materialization
    (``per_key``: partition key -> metadata with ``partition_data_version``) and return the step's
    data version: that partition's version for a one-partition run; for a range run, the JSON that
    names every partition's version (``assets._meta.range_data_version``: Dagster (1.13) writes one
    data-version tag for all partitions of a step). ``crucible lineage`` reports the per-partition
    version (case ``partition-data-versions``, docs/operations.md "Range runs")."""
    return partition_versions(context, per_key)


def probe_launch(context, compute: ComputeResource, lake: LakeResource, asset: str, plan: ProbePlan, timeout_s: float,
                 key: str = "", outputs=None):
    """The probe worker's launch (``assets.launch.launch``) on compute.num_processes ranks; ``key``
    separates the run folders of two launches of one asset; ``outputs``: staged outputs the step
    commits (``assets.launch.launch``)."""
    context.log.info(f"probe {plan.phase}: {len(plan.runs)} run(s) on {compute.num_processes} process(es)")
    return launch(context, compute, base=lake.base, asset=asset, module="ops.mixture.probe", spec=plan.to_json(),
                  fingerprint=plan.launch_fingerprint(), timeout_s=timeout_s, processes=compute.num_processes,
                  saved=describe_saved, key=key, outputs=outputs)


@mirrors(ProbePlan, own=("timeout_s", "inits"))
class BaseModelConfig(fields_of(ProbePlan,
        exclude=("phase", "data_dir", "base_dir", "out_dir", "runs", "sizes", "cpt_tokens",
                 "first_checkpoint", "cpt_schedule"))):
    """Pre-training of the shared base model of each probe size: the Launchpad face of the base
    fields of ops.mixture.probe.ProbePlan (meanings, defaults and ranges there)."""

    inits: list[int] = list(PROBE_BASE_INITS)
    """Base initialisations per size (distinct integers >= 0; default 0, 1, 2, 3:
    ops.mixture.probe.PROBE_BASE_INITS). Init 0 is the size's base at cpt_base_models/<size>/, init
    k at <size>_i<k>/; each re-draws the weights and the base's data order. CPT seed k continues
    init k (cpt_probe_runs.seeds_reinit_base)."""
    timeout_s: float = 1800.0
    """Wall-clock limit of the launch (all partitions of the run)."""


@dg.asset(deps=["cpt_tokenizer"], partitions_def=size_partitions, backfill_policy=dg.BackfillPolicy.single_run(),
          group_name="mixture", code_version="1", kinds={"pytorch", "accelerate"}, pool="gpu")
def cpt_base_models(context: dg.AssetExecutionContext, config: BaseModelConfig, lake: LakeResource,
                    compute: ComputeResource) -> dg.MaterializeResult:
    """GPT-2-style causal LMs per probe size, pre-trained on the general corpus, one per base
    initialisation (``inits``): the starts of that size's CPT probe runs (CPT seed k continues init
    k). Non-embedding parameters N and each init's losses are in the metadata. A killed launch is
    relaunched over its run folder (``assets.launch``); a finished base is reused."""
    runs = base_runs(list(context.partition_keys), distinct_ints(config.inits, "cpt_base_models.inits", need_zero=True))
    # the worker trains into the run folder; the step commits each base folder after the launch
    # (assets.launch: a killed or late worker never replaces a committed base)
    committed = lake.base / "cpt_base_models"
    stage = staged(run_dir_for(context, lake.base, "cpt_base_models"), "cpt_base_models")
    plan = ProbePlan.from_settings(phase="base", data_dir=str(lake.base / "cpt_tokenizer"), base_dir=str(stage),
                                   out_dir=str(lake.base / "cpt_probe_runs"), runs=runs,
                                   **config.model_dump(exclude={"timeout_s", "inits"})).validate(compute.num_processes)
    stage.mkdir(parents=True, exist_ok=True)
    stage_committed_bases(plan, committed, stage, context.log.info)
    names = sorted({base_dir_name(r["size"], r["init"]) for r in runs})
    outputs = {f"cpt_base_models/{n}": committed / n for n in names + ["launch.json"]}
    with probe_launch(context, compute, lake, "cpt_base_models", plan, config.timeout_s, outputs=outputs) as run:
        rows = base_rows(run.result["runs"], runs)
        per_key = {key: base_partition_meta(rows, key, stage) for key in context.partition_keys}  # committed at the block's end
        return dg.MaterializeResult(
            data_version=_partition_versions(context, per_key),
            metadata={"bases": md_table(pl.DataFrame(rows)), "path": dg.MetadataValue.path(str(committed)),
                      "world_size": run.result["world_size"], "parallelism": run.result.get("parallelism", "data"), **run.metadata()})


@mirrors(ProbePlan, own=("timeout_s", "seeds", "repeat_ratios", "seeds_reinit_base"))
class ProbeRunConfig(fields_of(ProbePlan,
        exclude=("phase", "data_dir", "base_dir", "out_dir", "runs", "sizes", "seq_len", "global_batch",
                 "base_tokens", "base_schedule", "lr_ref_width", "lr_rule_below_ref", "val_seqs_general",
                 "val_seqs_per_subdomain", "seed"))):
    """Continual pre-training of each (size, domain ratio) probe: the Launchpad face of the CPT
    fields of ops.mixture.probe.ProbePlan (meanings, defaults and ranges there). The base settings
    (sequence length, global batch, validation sets) are those of cpt_base_models."""

    seeds: list[int] = list(PROBE_SEEDS)
    """Probe replicates: every (size, ratio) partition trains one run per seed in the same launch
    (ops.mixture.probe.PROBE_SEEDS; >= 2 measure the noise floor). Seed k draws the CPT data order k
    and, with seeds_reinit_base, continues base init k. The partition's table holds every seed's
    checkpoints, with seed and init columns."""
    seeds_reinit_base: bool = True
    """Seed k continues the size's base initialisation k (cpt_base_models.inits must hold it), so
    repeats measure initialisation and data-order noise together; false: every seed continues init
    0 and the repeats measure the CPT data order alone (the behaviour before inits)."""
    repeat_ratios: list[float] = list(PROBE_REPEAT_RATIOS)
    """The ratios at which the seeds after the first are trained (empty = every ratio; default the
    middle ratio 0.5 of every size: ops.mixture.probe.PROBE_REPEAT_RATIOS)."""
    timeout_s: float = 1800.0
    """Wall-clock limit of the launch (all partitions of the run)."""


@dg.asset(deps=["cpt_tokenizer", dg.AssetDep("cpt_base_models", partition_mapping=dg.MultiToSingleDimensionPartitionMapping("size"))],
          partitions_def=probe_partitions, backfill_policy=dg.BackfillPolicy.single_run(),
          group_name="mixture", code_version="1", kinds={"pytorch", "accelerate", "parquet"}, pool="gpu")
def cpt_probe_runs(context: dg.AssetExecutionContext, config: ProbeRunConfig, lake: LakeResource,
                   compute: ComputeResource) -> dg.MaterializeResult:
    """Continual pre-training of a size's base model on a general/domain mixture at one domain ratio
    r_d, with validation losses (general, domain, each sub-domain; nats/token) at exponentially spaced
    token counts D, one run per seed (seed k from base init k). One Parquet table per (size, ratio)
    partition."""
    from ops.mixture import plots

    seeds = distinct_ints(config.seeds, "cpt_probe_runs.seeds")
    dims = [_dims(k) for k in context.partition_keys]
    runs = probe_runs(dims, seeds, config.repeat_ratios, config.seeds_reinit_base, CPT_SIZES)
    base_dir = lake.base / "cpt_base_models"
    settings = base_settings(base_dir, runs)
    # the worker writes each run's metrics.json under the run folder; the step commits them after its
    # tables (assets.launch: a failed step or a late worker never replaces a committed metrics.json)
    committed, stage = lake.base / "cpt_probe_runs", staged(run_dir_for(context, lake.base, "cpt_probe_runs"), "cpt_probe_runs")
    # the bases' settings by flat name (base.json), the CPT schedule the config's own part
    plan = ProbePlan.from_settings(phase="cpt", data_dir=str(lake.base / "cpt_tokenizer"), base_dir=str(base_dir),
                                   out_dir=str(stage), runs=runs, **settings,
                                   **config.model_dump(exclude={"timeout_s", "seeds", "repeat_ratios", "seeds_reinit_base"})
                                   ).validate(compute.num_processes)
    outputs = {"cpt_probe_runs/launch.json": committed / "launch.json"}
    for r in runs:
        name = run_dir_name(r["size"], r["ratio"], r["seed"], r.get("tokens"), r["init"])
        fp = plan.fingerprint(r["size"], r["ratio"], r["seed"], r.get("tokens"), r["init"])
        stage_committed(committed / name / "metrics.json", stage / name / "metrics.json",
                        committed_fingerprint(committed / name / "metrics.json") == fp, context.log.info)
        outputs[f"cpt_probe_runs/{name}/metrics.json"] = committed / name / "metrics.json"
    with probe_launch(context, compute, lake, "cpt_probe_runs", plan, config.timeout_s, outputs=outputs) as run:
        finals, per_key = [], {}
        for key, d in zip(context.partition_keys, dims):
            mine = seeds_at(d["ratio"], seeds, config.repeat_ratios)
            df, rows = partition_table(run.result["runs"], d["size"], d["ratio"], mine)
            finals += rows
            lake.write(df, "cpt_probe_runs", run_dir_name(d["size"], float(d["ratio"])), refresh=False)
            per_key[key] = probe_partition_meta(df, d["ratio"], len(mine))
        lake.refresh_view("cpt_probe_runs", partitioned=True)
        all_runs = read_probe_runs(lake)
        png = plots.loss_curves(all_runs) if all_runs.height else None
        meta = {"runs": md_table(pl.DataFrame(finals)), "runs_in_this_launch": len(runs),
                "probe_points_in_lake": all_runs.height, "world_size": run.result["world_size"],
                "parallelism": run.result.get("parallelism", "data"), **run.metadata()}
        if png:
            meta["loss_curves"] = image(png, "validation loss vs CPT tokens", lake=lake, asset="cpt_probe_runs")
        return dg.MaterializeResult(metadata=meta, data_version=_partition_versions(context, per_key))
