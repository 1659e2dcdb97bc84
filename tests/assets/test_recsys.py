"""ctr_events and ctr_model materialize on real MovieLens-100k; DeepFM beats logistic regression."""

import dagster as dg
import polars as pl
import pytest
from safetensors.torch import load_file

from assets import recsys
from resources.lake import LakeResource


def _meta(res, key):
    [m] = [e.materialization.metadata for e in res.get_asset_materialization_events()
           if e.materialization.asset_key.to_user_string() == key]
    return {k: v.value for k, v in m.items()}


def test_training_job_materializes_ctr_events_and_ctr_model_beating_logistic_regression(tmp_path, monkeypatch):
    from pipelines.definitions import defs

    monkeypatch.setenv("CRUCIBLE_HOME", str(tmp_path))       # the job's LakeResource() reads it at run time
    lake = LakeResource(root=str(tmp_path))
    res = defs.resolve_job_def("training_job").execute_in_process(instance=dg.DagsterInstance.ephemeral())
    assert res.success
    ev = _meta(res, "ctr_events")
    assert ev["rows_out"] == 100_000 and ev["users"] == 943 and ev["items"] == 1682
    assert ev["click_rate"] == pytest.approx(0.55375)
    m = _meta(res, "ctr_model")
    assert m["test_auc"] > m["baseline_lr_auc"] and m["beats_baseline"]
    assert 0.68 < m["test_auc"] < 0.80 and 0.68 < m["test_gauc"] < 0.80
    assert m["test_logloss"] < 0.6931                                    # better than a constant 0.5
    assert m["lookups_uncoalesced"] == 10 * m["lookups"]                 # 10 fields, one coalesced table
    preds = lake.read("ctr_model")
    assert preds.height == m["rows_out"] == 20_001 and preds["score"].is_between(0, 1).all()
    tables = load_file(m["sparse_tables"])
    assert tables["table0/ids"].shape[0] == m["table_rows"] == 2949   # every train-split value has exactly one row
    assert tables["table0/rows"].shape == (2949, 9 + 9)                 # dim 8 + first-order, + Adagrad state


def test_user_ctr_source_is_validated(tmp_path):
    lake = LakeResource(root=str(tmp_path))
    p = tmp_path / "mine.parquet"
    pl.DataFrame({"user_id": [1, 2, 3, 4], "item_id": [5, 6, 7, 8], "click": [1, 0, 1, 0], "timestamp": [4, 3, 2, 1],
                  "device": ["ios", "web", "ios", "web"]}).write_parquet(p)
    cfg = {"ops": {"ctr_events": {"config": {"user_events_path": str(p), "test_fraction": 0.25}}}}
    res = dg.materialize([recsys.ctr_events], resources={"lake": lake}, run_config=cfg)
    df = lake.read("ctr_events")
    assert df.filter(pl.col("split") == "test")["timestamp"].to_list() == [4] and "device" in df.columns
    pl.DataFrame({"user_id": [1], "click": [1], "timestamp": [1]}).write_parquet(p)
    res = dg.materialize([recsys.ctr_events], resources={"lake": lake}, run_config=cfg, raise_on_error=False)
    assert not res.success
    [fail] = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "missing required column(s) ['item_id']" in str(fail.step_failure_data.error)
