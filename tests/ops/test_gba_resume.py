"""GBA runs resume from their last checkpoint: a sync run interrupted after a checkpoint and
resumed applies exactly the updates of an uninterrupted one (same parameters, AUC and losses); a
parameter-server run SIGKILLed by the fault-injection variable right after its 2nd checkpoint is
relaunched over the same folder and finishes every global step, from the checkpoint's step."""

import dataclasses
import datetime
import json
import os
import subprocess
import sys

import pytest
import torch

from ops.gba.checkpoint import CRASH_ENV, CheckpointError, Checkpoints, fingerprint
from ops.gba.config import Cluster, GBAConfigError, RunSpec, validate
from ops.gba.control import Control
from ops.gba.data import load
from ops.sparse.config import TrainConfig

G, B = 512, 256


class Crash(Exception):
    pass


def test_control_hands_out_the_batches_in_flight_at_a_checkpoint_again_first():
    spec = RunSpec(mode="gba", train=TrainConfig(batch_size=G), local_batch=B, cluster=Cluster(workers=2))
    c = Control(spec, total_samples=100 * G)
    assert c.hello(0) != 0 and c.hello(1) == 0 and c.hello(0) == 1   # start barrier, then batches 0 and 1
    c.pull(0, 1)
    c.pull(1, 0)
    v = c.push(1, 0, 0, B)                                            # batch 0 pushed, worker1 claims batch 2
    assert (v.apply, v.next_batch) == (False, 2)
    v = c.push(0, 0, 1, B)                                            # global step 1 complete; worker0 claims 3
    assert v.apply and c.step == 1 and v.next_batch == 3
    st = c.state()
    assert st["reissue"] == [2, 3] and st["next_batch_no"] == 4 and st["samples_applied"] == G
    fresh = Control(spec, total_samples=100 * G)
    fresh.restore(st)
    assert [fresh.hello(w) for w in (0, 1, 0)][1:] == [2, 3]              # worker1 gets 2, worker0 gets 3
    fresh.pull(0, 3)
    fresh.push(0, 1, 3, B)
    assert fresh.claimed[0] == 4                                      # re-issues used up: fresh batches again
    assert fresh.step == 1 and fresh.samples_applied == G
    with pytest.raises(GBAConfigError, match="cluster.checkpoint_every must be >= 0"):
        validate(dataclasses.replace(spec, cluster=Cluster(workers=2, checkpoint_every=-1)))


def test_a_checkpoint_of_another_spec_is_ignored_and_a_broken_record_names_its_file(ctr_events_file, tmp_path):
    spec = RunSpec(mode="sync", train=TrainConfig(batch_size=G), local_batch=B, events_path=ctr_events_file[0])
    ck = Checkpoints(tmp_path, fingerprint(spec))
    folder = ck.stage(4 * G)
    ck.commit(folder, {"count": 1, "samples": 4 * G, "global_step": 4})
    assert ck.find()["global_step"] == 4
    other = Checkpoints(tmp_path, fingerprint(dataclasses.replace(spec, train=TrainConfig(batch_size=G, dense_lr=0.5))))
    assert other.find() is None and "another run spec" in other.skipped
    assert fingerprint(dataclasses.replace(spec, cluster=Cluster(run_timeout_s=5, eval_every=3))) == ck.fp
    (tmp_path / "checkpoints" / "latest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="latest.json is not valid JSON"):
        ck.find()


def test_sync_run_resumed_from_a_checkpoint_equals_the_uninterrupted_run(ctr_events_file, tmp_path):
    import torch.distributed as dist

    from ops.gba.sync import SyncTrainer

    torch.set_num_threads(1)
    events_path, cache = ctr_events_file
    spec = RunSpec(mode="sync", train=TrainConfig(batch_size=G, epochs=0.25), local_batch=B, events_path=events_path,
                   data_cache=cache, cluster=Cluster(workers=1, eval_every=8, checkpoint_every=8))
    data = load(events_path, spec.train.crosses, cache)
    fp = fingerprint(spec)

    def crash_at_2(rec):
        if rec["count"] == 2:
            raise Crash(rec["global_step"])

    resumed = []
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        whole_t = SyncTrainer(spec, data, checkpoints=Checkpoints(tmp_path / "whole", fp))
        whole = whole_t.run()
        with pytest.raises(Crash):
            SyncTrainer(spec, data, checkpoints=Checkpoints(tmp_path / "cut", fp), on_checkpoint=crash_at_2).run()
        assert json.loads((tmp_path / "cut/checkpoints/latest.json").read_text())["global_step"] == 16
        again_t = SyncTrainer(spec, data, checkpoints=Checkpoints(tmp_path / "cut", fp), on_resume=resumed.append)
        again = again_t.run()
    finally:
        dist.destroy_process_group()

    assert resumed and resumed[0]["global_step"] == 16                       # resumed from the checkpoint, not 0
    assert again["global_steps"] == whole["global_steps"] == 39 and again["samples_applied"] == 39 * G
    assert [p["samples"] for p in again["curve"]] == [p["samples"] for p in whole["curve"]] == [0, 4096, 8192, 12288,
                                                                                                 16384, 19968]
    assert again["checkpoints"]["written"] == whole["checkpoints"]["written"] == 4     # at 8, 16, 24, 32
    # deterministic: same sample stream, dropout RNG restored, tables restored bit-exact
    assert again["final"]["auc"] == pytest.approx(whole["final"]["auc"], abs=1e-6)
    assert [x[1] for x in again["loss_curve"]] == pytest.approx([x[1] for x in whole["loss_curve"]], abs=1e-6)
    for k, v in whole_t.model.net.state_dict().items():
        assert torch.allclose(v, again_t.model.net.state_dict()[k], atol=1e-6), k
    for name, t in whole_t.model.ec.tables.items():
        ids, rows, _ = t.live()
        ids2, rows2, _ = again_t.model.ec.tables[name].live()
        assert torch.equal(ids, ids2) and torch.allclose(rows, rows2, atol=1e-6), name


def test_ps_run_killed_after_a_checkpoint_resumes_and_applies_every_global_step(ctr_events_file, tmp_path):
    events_path, cache = ctr_events_file
    spec = RunSpec(mode="gba", train=TrainConfig(batch_size=G, epochs=0.25), local_batch=B, events_path=events_path,
                   data_cache=cache, cluster=Cluster(workers=2, eval_every=8, checkpoint_every=4, rpc_timeout_s=20,
                                                     stop_timeout_s=10, run_timeout_s=90))
    (tmp_path / "spec.json").write_text(spec.to_json())
    out = tmp_path / "run"

    def launch(**env):
        return subprocess.run([sys.executable, "-m", "ops.gba.launch_ps", "--spec", str(tmp_path / "spec.json"),
                               "--out", str(out)], start_new_session=True, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", **env})

    killed = launch(**{CRASH_ENV: "2"})
    assert killed.returncode == -9, killed.stderr[-2000:]                   # the launch died by SIGKILL
    assert not (out / "result.json").exists()
    rec = json.loads((out / "checkpoints" / "latest.json").read_text())
    assert (rec["count"], rec["global_step"]) == (2, 8.0)
    assert [p.name for p in (out / "checkpoints").glob("step-*")] == [rec["dir"]]      # older ones pruned

    again = launch()
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming from checkpoint 2 at global step 8.0" in again.stderr and "Dagster retry n/a" in again.stderr
    res = json.loads((out / "result.json").read_text())
    [resumed] = res["checkpoints"]["resumes"]
    assert resumed["global_step"] == 8.0 and resumed["reissued_batches"] >= 1
    assert res["failure"] is None and res["global_steps"] == res["global_steps_target"] == 39
    assert res["samples_applied"] == 39 * G and res["optimizer_steps"] == 39
    assert res["checkpoints"]["written"] == 9                                # 2 before the kill, 7 after (4, 8, .. 36)
    assert [p["samples"] for p in res["curve"]] == [0, 4096, 8192, 12288, 16384, 19968]
    assert res["final"]["auc"] > 0.64 and "gba: training (resumed at global step 8.0): 15872/15872 samples" in again.stderr
    assert not (out / "checkpoints").exists()                               # a finished run keeps only its result
