"""The shrunk D-CPT regime (issue 39 item 1): the general corpus's role shrunk to a few hundred review
titles (``ops.mixture.corpus.GeneralCorpusParams``), the named configuration ``ops.mixture.regimes.PLATEAU_SMALL``
that the mixture group's assets accept, and the ``dcpt-closed-loop`` design trained at exactly it."""

from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from ops.mixture.corpus import GeneralCorpusParams, general_corpus

ROOT = Path(__file__).resolve().parents[2]


def _norm(s: pl.Expr) -> pl.Expr:
    return s.str.to_lowercase().str.replace_all(r"[^a-z0-9 ]", "").str.replace_all(r" +", " ").str.strip_chars()


def test_shrunk_titles_keep_the_first_training_titles_and_the_whole_validation_split():
    full = general_corpus(variant="titles")
    small = general_corpus(variant="titles", max_train_docs=300)
    tr_full, tr = (df.filter(pl.col("split") == "train") for df in (full, small))
    # the first 300 training titles in corpus order, nothing else from the training split
    assert tr.height == 300 and tr["doc_id"].to_list() == tr_full["doc_id"].head(300).to_list()
    # the validation split is the full titles' one, and no validation title is a training title
    assert small.filter(pl.col("split") == "val").equals(full.filter(pl.col("split") == "val"))
    assert small.filter(pl.col("split") == "val").height > 500
    n = small.with_columns(_n=_norm(pl.col("text")))
    assert not set(n.filter(pl.col("split") == "train")["_n"]) & set(n.filter(pl.col("split") == "val")["_n"])
    assert small["text"].str.contains("\n").sum() == 0                   # titles only
    # the default is the whole review corpus (title + text), unchanged
    assert general_corpus().height > 20_000 and general_corpus()["text"].str.contains("\n").sum() > 10_000


@pytest.mark.parametrize("kw, field", [({"variant": "wiki"}, "variant"), ({"max_train_docs": -1}, "max_train_docs"),
                                       ({"max_train_docs": True}, "max_train_docs")])
def test_general_corpus_params_name_the_bad_field(kw, field):
    with pytest.raises(ValueError, match=f"general_corpus.{field}"):
        GeneralCorpusParams(**kw)


def test_plateau_small_is_accepted_by_the_assets_configs_and_their_ops_dataclasses():
    from assets import mixture
    from ops.mixture.probe import ProbePlan
    from ops.mixture.regimes import PLATEAU_SMALL, PLATEAU_SMALL_SIZES, run_config
    from ops.mixture.tokens import TokenizerParams

    classes = {"general_corpus": mixture.GeneralCorpusConfig, "cpt_tokenizer": mixture.TokenizerConfig,
               "cpt_base_models": mixture.BaseModelConfig, "cpt_probe_runs": mixture.ProbeRunConfig,
               "dcpt_law_fit": mixture.LawFitConfig}
    cfg = run_config()["ops"]
    assert set(cfg) == set(PLATEAU_SMALL) <= set(classes)
    for op, fields in PLATEAU_SMALL.items():
        model = classes[op](**fields)
        assert {k: getattr(model, k) for k in fields} == fields
        assert set(fields) <= set(type(model).model_fields)
    GeneralCorpusParams(**PLATEAU_SMALL["general_corpus"])
    TokenizerParams(**PLATEAU_SMALL["cpt_tokenizer"])
    base = {k: v for k, v in PLATEAU_SMALL["cpt_base_models"].items() if k != "inits"}
    cpt = {k: v for k, v in PLATEAU_SMALL["cpt_probe_runs"].items() if k not in ("seeds", "repeat_ratios")}
    plan = ProbePlan(phase="base", data_dir="", base_dir="", out_dir="", **base, **cpt).validate(2)
    assert plan.base_tokens % (plan.global_batch * plan.seq_len) == 0      # the 80% point is a whole step
    assert set(PLATEAU_SMALL_SIZES) <= set(plan.sizes)
    with pytest.raises(KeyError, match="plateau_small"):
        run_config("huge")


def test_the_closed_loop_design_trains_at_plateau_small():
    from benchmarks.claims.design import load_design
    from ops.mixture.regimes import PLATEAU_SMALL, PLATEAU_SMALL_SIZES

    p = load_design(ROOT / "benchmarks/claims/designs/dcpt-closed-loop.yaml").params
    assert tuple(p["sizes"]) == PLATEAU_SMALL_SIZES
    assert {"variant": p["general"], "max_train_docs": p["general_docs"]} == PLATEAU_SMALL["general_corpus"]
    assert p["tokenizer"] == PLATEAU_SMALL["cpt_tokenizer"]
    assert {k: p["base"][k] for k in PLATEAU_SMALL["cpt_base_models"]} == PLATEAU_SMALL["cpt_base_models"]
    assert {k: p["probe"][k] for k in PLATEAU_SMALL["cpt_probe_runs"]} == PLATEAU_SMALL["cpt_probe_runs"]
    assert p["law_fit"]["forms"] == PLATEAU_SMALL["dcpt_law_fit"]["forms"]


def test_general_corpus_asset_writes_the_shrunk_corpus(tmp_path):
    from assets import mixture
    from resources.lake import LakeResource

    lake = LakeResource(root=str(tmp_path / "lake"))
    r = dg.materialize([mixture.general_corpus], resources={"lake": lake},
                       run_config={"ops": {"general_corpus": {"config": {"variant": "titles", "max_train_docs": 300}}}})
    m = r.asset_materializations_for_node("general_corpus")[0].metadata
    df = lake.read("general_corpus")
    assert m["train_docs"].value == 300 == df.filter(pl.col("split") == "train").height
    assert m["variant"].value == "titles" and m["val_docs"].value == df.filter(pl.col("split") == "val").height > 500
