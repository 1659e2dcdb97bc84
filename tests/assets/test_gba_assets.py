"""gba_run partitions materialize through Dagster Pipes: sync launches 2 real gloo ranks with
accelerate (world size and distributed type asserted), gba 1 PS + 2 workers over RPC; both with
one run config, so the same hyper-parameters; the comparison covers every mode materialized."""

import dataclasses

import dagster as dg
import pytest

from assets import gba, recsys
from ops.gba.config import MODES
from resources.compute import ComputeResource
from resources.lake import LakeResource

TINY = {"epochs": 0.1, "eval_every": 4, "straggler": "persistent", "run_timeout_s": 120.0}


def _meta(res):
    [m] = [e.materialization.metadata for e in res.get_asset_materialization_events()]
    return {k: v.value for k, v in m.items()}


def test_every_partition_gets_the_same_hyper_parameters_from_one_run_config():
    cfg = gba.GBARunConfig(**TINY)
    specs = {m: cfg.spec(m, workers=2) for m in MODES}
    assert all(dataclasses.replace(s, mode="gba") == specs["gba"] for s in specs.values())
    assert gba.gba_run.partitions_def.get_partition_keys() == list(MODES)


def test_gba_run_sync_and_gba_partitions_materialize_and_compare(tmp_path):
    lake = LakeResource(root=str(tmp_path))
    compute = ComputeResource(num_processes=2, launch_timeout_s=300)
    assert dg.materialize([recsys.ctr_events], resources={"lake": lake}).success
    run_config = {"ops": {"gba_run": {"config": TINY}}}
    meta = {}
    for mode in ("sync", "gba"):
        res = dg.materialize([gba.gba_run], partition_key=mode, resources={"lake": lake, "compute": compute},
                             run_config=run_config)
        assert res.success
        meta[mode] = _meta(res)
    s, g = meta["sync"], meta["gba"]
    assert (s["world_size"], s["distributed_type"], s["launcher"]) == (2, "MULTI_CPU", "accelerate launch")
    assert (g["world_size"], g["distributed_type"]) == (3, "PS_RPC")
    assert s["hyper_parameters"] == g["hyper_parameters"] and s["hyper_parameters"]["global_batch"] == 512
    for m in (s, g):
        assert m["global_steps"] == 15.0 and m["pipes_messages"] >= 2 and 0.55 < m["test_auc"] < 0.75
        assert m["samples_per_s"] > 0 and m["lost_workers"] == "none" and m["dagster/row_count"] >= 2
    assert s["staleness_histogram"] == {"0": 30} and s["gradients_dropped"] == 0
    assert "| sync |" in g["comparison"] and "| gba |" in g["comparison"] and "data:image/png;base64" in g["figure"]
    assert lake.partitions("gba_run") == ["gba", "sync"]


@pytest.mark.parametrize("bad, message", [
    ({"global_batch": 500}, "train.batch_size (global batch 500) must be a multiple of local_batch (256)"),
    ({"workers": 0}, "cluster.workers must be >= 1"),
])
def test_gba_run_rejects_a_bad_config_with_an_error_naming_the_field(tmp_path, bad, message):
    lake = LakeResource(root=str(tmp_path))
    (tmp_path / "ctr_events").mkdir()
    (tmp_path / "ctr_events" / "data.parquet").write_bytes(b"")       # never read: the config fails first
    res = dg.materialize([gba.gba_run], partition_key="gba", raise_on_error=False,
                         resources={"lake": lake, "compute": ComputeResource()},
                         run_config={"ops": {"gba_run": {"config": bad}}})
    assert not res.success
    [fail] = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
    assert message in str(fail.step_failure_data.error)
