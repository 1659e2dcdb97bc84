"""gba_run partitions materialize through Dagster Pipes: sync launches 2 real gloo ranks with
accelerate (world size and distributed type asserted), gba 1 PS + 2 workers over RPC; both with
one run config, so the same hyper-parameters; the comparison covers every mode materialized. The
sync launch is killed (SIGKILL to its process group) after its first checkpoint: the step is
retried by RetryingComputeResource and resumes from that checkpoint."""

import dataclasses
from pathlib import Path

import dagster as dg
import pytest

from assets import gba, recsys
from ops.gba.checkpoint import CRASH_ENV
from assets._config import MIRRORS
from ops.gba.config import GLOBAL_BATCH, LOCAL_BATCH, MODES, RunConfig
from resources.compute import ComputeResource
from resources.lake import LakeResource
from resources.retry import RetryingComputeResource
from tests.conftest import materialize_logged

TINY = {"epochs": 0.1, "eval_every": 4, "checkpoint_every": 4, "straggler": "persistent", "run_timeout_s": 120.0}


def test_every_partition_gets_the_same_hyper_parameters_from_one_run_config():
    cfg = gba.GBARunConfig(**TINY)
    specs = {m: cfg.spec(m, workers=2) for m in MODES}
    assert all(dataclasses.replace(s, mode="gba") == specs["gba"] for s in specs.values())
    assert gba.gba_run.partitions_def.get_partition_keys() == list(MODES)
    # one source: the Launchpad config is ops.gba.config.RunConfig, defaults included; switch_at is
    # declared by the asset only to type its entries (SwitchAt), its default is RunConfig's
    assert MIRRORS[gba.GBARunConfig] == (RunConfig, frozenset({"switch_at"}))
    assert gba.GBARunConfig().switch_at == RunConfig().switch_at == []
    assert cfg.spec("gba", workers=2) == RunConfig(**TINY).spec("gba", workers=2)
    default = gba.GBARunConfig().spec("gba", workers=2)
    assert (default.global_batch, default.local_batch) == (GLOBAL_BATCH, LOCAL_BATCH) == (512, 256)
    assert gba.GBARunConfig(workers=3).spec("gba", workers=2).cluster.workers == 3     # the config wins


def test_gba_run_partitions_materialize_compare_and_a_killed_sync_launch_resumes_on_retry(tmp_path, monkeypatch):
    lake = LakeResource(root=str(tmp_path))
    compute = RetryingComputeResource(num_processes=2, launch_timeout_s=300, launch_retries=1, retry_backoff_s=0.0)
    assert dg.materialize([recsys.ctr_events], resources={"lake": lake}).success
    run_config = {"ops": {"gba_run": {"config": TINY}}}
    meta, logs, kinds = {}, {}, {}
    for mode in ("sync", "gba"):
        if mode == "sync":
            monkeypatch.setenv(CRASH_ENV, "1")               # SIGKILL the launch after checkpoint 1 (global step 4)
        else:
            monkeypatch.delenv(CRASH_ENV)
        res, meta[mode], logs[mode], kinds[mode] = materialize_logged(
            [gba.gba_run], {"lake": lake, "compute": compute}, run_config, partition_key=mode)
        assert res.success
    s, g = meta["sync"], meta["gba"]
    # the killed sync launch died by SIGKILL, was retried once and resumed from its checkpoint at global step 4
    assert kinds["sync"].count("STEP_UP_FOR_RETRY") == 1 and "STEP_UP_FOR_RETRY" not in kinds["gba"]
    assert "launch died (exit code -9)" in logs["sync"]
    assert "gba_run[sync]: attempt 2 in" in logs["sync"] and "checkpoint 1 at global step 4.0; the driver resumes" in logs["sync"]
    assert "gba_run[gba]: attempt 1 in" in logs["gba"] and "nothing saved, starting from the first step" in logs["gba"]
    assert "sync: resuming from checkpoint 1 at global step 4 (2048 of 7680 samples applied) on Dagster retry 1" in logs["sync"]
    assert "sync: training (resumed at global step 4): 5632/5632 samples (100%)" in logs["sync"]
    assert "gba: training: 7680/7680 samples (100%)" in logs["gba"] and "ETA" in logs["gba"]
    assert (s["retry_number"], s["resumed_from"], s["checkpoints_written"]) == (1, "global step 4", 3)   # at 4, 8, 12
    assert (g["retry_number"], g["resumed_from"], g["checkpoints_written"]) == (0, "none", 3)
    assert (s["resumed_from_saved"], g["resumed_from_saved"]) == ("checkpoint 1 at global step 4.0", "none")
    assert s["reused_finished_launch"] is False and g["reused_finished_launch"] is False
    assert not list((tmp_path / "gba_run").glob(".run-*"))                 # run folders removed after success
    assert (s["world_size"], s["distributed_type"], s["launcher"]) == (2, "MULTI_CPU", "accelerate launch")
    assert (g["world_size"], g["distributed_type"]) == (3, "PS_RPC")
    assert s["hyper_parameters"] == g["hyper_parameters"] and s["hyper_parameters"]["global_batch"] == 512
    for m in (s, g):
        assert m["global_steps"] == 15.0 and m["pipes_messages"] >= 2 and 0.55 < m["test_auc"] < 0.75
        assert m["samples_per_s"] > 0 and m["lost_workers"] == "none" and m["dagster/row_count"] >= 2
    assert s["staleness_histogram"] == {"0": 30} and s["gradients_dropped"] == 0
    assert "| sync |" in g["comparison"] and "| gba |" in g["comparison"] and Path(g["figure"]).read_bytes()[:4] == b"\x89PNG"
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
