"""The lake agrees with the partitions and the metadata is Dagster's own (issue 43, item 5):
dcpt_law_fit reads only the current cpt_probe_runs partitions and records which; table assets carry
dagster/uri and dagster/column_schema; every asset has owners."""

import json

import dagster as dg
import numpy as np
import polars as pl

from assets import mixture, sources
from resources.lake import LakeResource
from resources.sources import SourcesResource
from tests.assets.test_mixture_assets import _law_lake


def test_law_fit_reads_only_current_probe_partitions_and_records_them(tmp_path):
    lake = _law_lake(tmp_path)
    # a folder left by an earlier probe grid (ratio 0.3 is no current partition): absurd losses that
    # would wreck the fit if read
    D = np.array([4096.0 * 2 ** k for k in range(6)])
    stale = pl.DataFrame({"step": np.arange(1, 7), "tokens": D.astype(int), "loss_general": np.full(6, 50.0),
                          "loss_domain": np.full(6, 50.0), "size": "m", "domain_ratio": 0.3, "n_params": 150_000,
                          "n_params_total": 151_000})
    lake.write(stale, "cpt_probe_runs", "m_r0.300", refresh=False)
    r = dg.materialize([mixture.dcpt_law_fit], resources={"lake": lake},
                       run_config={"ops": {"dcpt_law_fit": {"config": {"n_boot": 2}}}})
    assert r.success
    meta = r.asset_materializations_for_node("dcpt_law_fit")[0].metadata
    current = sorted(str(k) for k in mixture.probe_partitions.get_partition_keys())
    assert len(current) == 20 and meta["probe_partitions"].value == current
    assert meta["ignored_probe_folders"].value == ["m_r0.300"]
    fit = json.loads((tmp_path / "lake/dcpt_law_fit/fit.json").read_text())
    assert fit["probe"]["partitions"] == current
    assert 0.3 not in fit["probe"]["ratios"] and fit["probe"]["points"] == 4 * 5 * 6
    assert fit["generalisation"]["domain"]["unseen_r"]["r2"] > 0.9          # the stale folder did not enter


def test_table_assets_carry_dagster_uri_and_column_schema(tmp_path):
    from assets.frames import RAW_SCHEMA

    lake = LakeResource(root=str(tmp_path))
    instance = dg.DagsterInstance.ephemeral()
    sources.sync_source_partitions(instance)
    res = dg.materialize([sources.source_files, sources.raw_problems], selection=["raw_problems"], partition_key="user_nodup",
                         instance=instance, resources={"lake": lake, "sources": SourcesResource()})
    meta = res.asset_materializations_for_node("raw_problems")[0].metadata
    path = lake.path("raw_problems", "user_nodup", "data.delta")          # the Delta table's folder
    assert meta["dagster/uri"].value == path.resolve().as_uri() and (path / "_delta_log").is_dir()
    cols = meta["dagster/column_schema"].schema.columns
    assert [c.name for c in cols] == list(RAW_SCHEMA)
    assert {c.name: c.type for c in cols}["problem"] == "String"


def test_every_asset_has_owners():
    from pipelines.definitions import defs

    graph = defs.resolve_asset_graph()
    missing = [k.to_user_string() for k in graph.get_all_asset_keys() if not graph.get(k).owners]
    assert not missing
    assert graph.get(dg.AssetKey("sft_dataset")).owners == ["team:data"]
    assert graph.get(dg.AssetKey("cpt_probe_runs")).owners == ["team:pretraining"]
