"""gba_run partitions materialize through Dagster Pipes: sync launches 2 real gloo ranks with
accelerate (world size and distributed type asserted), gba 1 PS + 2 workers over RPC; both with
one run config, so the same hyper-parameters; the comparison covers every mode materialized. The
sync launch is killed (SIGKILL to its process group) after its first checkpoint: the step is
retried by RetryingComputeResource and resumes from that checkpoint."""

import dataclasses
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from assets import gba, recsys
from ops.gba.checkpoint import CRASH_ENV
from assets._config import MIRRORS
from ops.gba.config import GLOBAL_BATCH, JOB, LOCAL_BATCH, MODES, RunSpec
from resources.compute import ComputeResource
from resources.lake import LakeResource
from resources.retry import RetryingComputeResource
from tests.conftest import materialize_logged

TINY = {"train": {"epochs": 0.1}, "cluster": {"eval_every": 4, "checkpoint_every": 4, "run_timeout_s": 120.0},
        "trace": {"kind": "persistent"}}


def test_every_partition_gets_the_same_hyper_parameters_from_one_run_config():
    cfg = gba.GBARunConfig(**TINY)
    specs = {m: cfg.spec(m, workers=2) for m in MODES}
    assert all(dataclasses.replace(s, mode="gba") == specs["gba"] for s in specs.values())
    assert gba.gba_run.partitions_def.get_partition_keys() == list(MODES)
    # one source: the Launchpad config mirrors ops.gba.config.RunSpec, nested as it is, defaults JOB's;
    # cluster.workers is the one field shown differently (unset = the launcher's process count)
    assert MIRRORS[gba.GBARunConfig] == (RunSpec, frozenset({"cluster.workers"}))
    default = gba.GBARunConfig().spec("gba", workers=2)
    assert default == dataclasses.replace(JOB, mode="gba", cluster=dataclasses.replace(JOB.cluster, workers=2))
    assert (default.global_batch, default.local_batch) == (GLOBAL_BATCH, LOCAL_BATCH) == (512, 256)
    assert default.trace.kind == "persistent" and specs["gba"].train.epochs == 0.1
    assert specs["gba"].cluster.eval_every == 4 and specs["gba"].train.batch_size == GLOBAL_BATCH  # unset nested fields keep JOB's
    assert gba.GBARunConfig(cluster={"workers": 3}).spec("gba", workers=2).cluster.workers == 3     # the config wins
    # the spec JSON the launch writes is read back as the same spec (one way: JsonSpec)
    assert RunSpec.from_json(specs["auto"].to_json()) == specs["auto"]


def test_an_error_names_the_launchpad_path_the_user_set():
    """Issue 41 item 1: a user who sets policy.decay.threshold reads policy.decay.threshold in the error;
    a bad switch schedule entry is named by its index under switching.schedule."""
    from ops.gba.errors import GBAConfigError

    with pytest.raises(GBAConfigError, match=r"^policy\.decay\.threshold must be >= 0, got -1$"):
        gba.GBARunConfig(policy={"decay": {"threshold": -1}}).spec("gba", workers=2)
    with pytest.raises(GBAConfigError, match=r"^cluster\.run_timeout_s must be > 0"):
        gba.GBARunConfig(cluster={"run_timeout_s": 0.0}).spec("sync", workers=2)
    bad = gba.GBARunConfig(switching={"schedule": [{"step": 4, "to": "gba"}, {"step": 3, "to": "sync"}]})
    with pytest.raises(GBAConfigError, match=r"switching\.schedule\[1\]\.step must be an integer global step > 4"):
        bad.spec("auto", workers=2)
    ok = gba.GBARunConfig(switching={"schedule": [{"step": 4, "to": "gba"}]}).spec("auto", workers=2)
    assert [tuple(s) for s in ok.switching.schedule] == [(4, "gba")]
    # the Launchpad schema is nested and carries the ops docstrings
    fields = gba.gba_run.op.config_schema.config_type.fields
    assert fields["policy"].config_type.fields["decay"].config_type.fields["threshold"].default_value == 1
    assert fields["train"].config_type.fields["batch_size"].default_value == GLOBAL_BATCH
    assert "mode" not in fields and "events_path" not in fields


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
    # the path the user sets is the path the error names (issue 41 item 1)
    ({"train": {"batch_size": 500}}, "train.batch_size (global batch 500) must be a multiple of local_batch (256)"),
    ({"cluster": {"workers": 0}}, "cluster.workers must be >= 1"),
    ({"policy": {"decay": {"rate": 1.5}}}, "policy.decay.rate must be in [0, 1], got 1.5"),
])
def test_gba_run_rejects_a_bad_config_with_an_error_naming_the_field(tmp_path, bad, message):
    lake = LakeResource(root=str(tmp_path))
    lake.write(pl.DataFrame({"user_id": [1]}), "ctr_events", refresh=False)   # never trained on: the config fails first
    res = dg.materialize([gba.gba_run], partition_key="gba", raise_on_error=False,
                         resources={"lake": lake, "compute": ComputeResource()},
                         run_config={"ops": {"gba_run": {"config": bad}}})
    assert not res.success
    [fail] = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
    assert message in str(fail.step_failure_data.error)
