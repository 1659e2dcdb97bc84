"""GBA's switch as the paper means it (arXiv 2205.11048 §1, §3; issue 38 item 3b): a job stops on
the all-reduce trainer, writes the mode-independent hand-over (``ops.gba.handover``) and continues
on the parameter server, and back, without changing a hyper-parameter.

Real launches: sync is 2 gloo ranks started by ``accelerate launch`` (``ops.launcher.Launcher``, the
command ``ComputeResource`` builds), the PS run is ``ops/gba/launch_ps.py`` (PS + 2 worker
processes over RPC). One module-scoped chain of 5 launches (1-3 min on 2 shared cores) serves
the three hand-over tests: A sync 0 -> 4, B gba 4 -> 8 from A, C sync 8 -> 12 from B, the
unswitched sync 0 -> 12, and Z sync from a zero-training PS hand-over of A (the round trip)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ops.gba import handover
from ops.gba.config import Cluster, RunSpec
from ops.gba.data import SampleStream, load
from ops.gba.model import TableShard
from ops.gba.server import ParameterServer
from ops.gba.trace import StragglerTrace
from ops.sparse.config import TrainConfig
from ops.sparse.train import CTRModel

pytestmark = pytest.mark.slow      # 5 real launches, ~1-3 min on 2 shared cores (the chain is shared)

ROOT = Path(__file__).resolve().parents[2]
G, B, W = 512, 256, 2
STEPS = 12                          # global steps of the whole job (epochs chosen to give exactly this)


def _launch(spec: RunSpec, out: Path) -> dict:
    """One fresh launch of ``spec`` as the asset launches it; returns its result.json."""
    from ops.launcher import Launcher

    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(spec.to_json())
    args = ["--spec", str(out / "spec.json"), "--out", str(out)]
    compute = Launcher(num_processes=spec.cluster.workers)
    if spec.mode == "sync":
        cmd = compute.command(str(ROOT / "ops" / "gba" / "launch_sync.py"), args)
    else:
        cmd = [sys.executable, str(ROOT / "ops" / "gba" / "launch_ps.py"), *args]
    env = {**os.environ, **compute.env(), "TORCH_CPP_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, timeout=240, capture_output=True, text=True, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "result.json").read_text())


@pytest.fixture(scope="module")
def chain(ctr_events_file, tmp_path_factory):
    events_path, cache = ctr_events_file
    data = load(events_path, [*TrainConfig().crosses], cache)
    tmp = tmp_path_factory.mktemp("handover")
    epochs = (STEPS * G + G // 2) / data.n_train
    base = RunSpec(mode="sync", train=TrainConfig(batch_size=G, epochs=epochs), local_batch=B, events_path=events_path,
                   data_cache=cache, cluster=Cluster(workers=W, eval_every=4, checkpoint_every=0, rpc_timeout_s=30,
                                                     run_timeout_s=180, stop_timeout_s=15),
                   trace=StragglerTrace(kind="none"))
    assert base.global_steps(data.n_train) == STEPS
    h = {k: tmp / k for k in ("A", "B", "PS0", "Z")}
    res = {"A": _launch(dataclasses.replace(base, stop_at=4, handover_to=str(h["A"])), tmp / "run-A")}
    res["B"] = _launch(dataclasses.replace(base, mode="gba", stop_at=8, handover_from=str(h["A"]),
                                           handover_to=str(h["B"])), tmp / "run-B")
    res["C"] = _launch(dataclasses.replace(base, handover_from=str(h["B"])), tmp / "run-C")
    res["whole"] = _launch(base, tmp / "run-whole")
    # the round trip with no training in between: PS (3 processes' worth of shards, in-process)
    # loads A and stops at once; sync (2 ranks) loads that and stops at once
    ps_spec = dataclasses.replace(base, mode="gba", stop_at=4, handover_from=str(h["A"]), handover_to=str(h["PS0"]),
                                  cluster=dataclasses.replace(base.cluster, num_ps=3))
    server = ParameterServer(ps_spec, data, shards=[TableShard(data.fields, base.train) for _ in range(2)])
    res["PS0"] = server.result()
    res["Z"] = _launch(dataclasses.replace(base, stop_at=4, handover_from=str(h["PS0"]), handover_to=str(h["Z"])),
                       tmp / "run-Z")
    return {"base": base, "data": data, "h": h, "res": res}


def _contents(folder: Path, base: RunSpec, data) -> dict:
    """Every tensor of a hand-over, the rows merged into one table set (world 1)."""
    st = handover.load_state(folder)
    model = CTRModel(data.fields, base.train)
    handover.load_tables(folder, model.ec, 0, 1)
    tables = {t: tab.live() for t, tab in model.ec.tables.items()}
    steps = {t: tab.step for t, tab in model.ec.tables.items()}
    return {"rec": handover.read(folder), "net": st["net"], "opt": st["opt"], "rng": st["rng"], "tables": tables,
            "steps": steps}


def _same_tensors(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _same_tensors(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same_tensors(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def test_round_trip_sync_to_ps_to_sync_without_training_is_bit_identical(chain):
    """Hand-over A (2 sync ranks) -> PS with 3 table shards (rows resharded key % 3) -> 2 sync ranks
    again, no step in between: dense weights, Adam state (exp_avg, exp_avg_sq, step), every
    embedding row with its SparseAdagrad slots and last-seen step, table step counters, per-worker
    RNG, global step and data position are bit-identical to what job A wrote."""
    base, data, h = chain["base"], chain["data"], chain["h"]
    a, ps0, z = (_contents(h[k], base, data) for k in ("A", "PS0", "Z"))
    assert a["rec"]["from_mode"] == "sync" and ps0["rec"]["from_mode"] == "gba" and z["rec"]["from_mode"] == "sync"
    assert ps0["rec"]["writers"] == ["ps0", "ps1", "ps2"] and a["rec"]["writers"] == ["rank0", "rank1"]
    n_rows = sum(len(ids) for ids, _, _ in a["tables"].values())
    assert n_rows > 1000 and all(s == 4 for s in a["steps"].values())
    assert a["opt"]["state"][0]["step"].item() == 4                            # Adam took 4 steps
    assert all(r is not None for r in a["rng"]) and not torch.equal(a["rng"][0], a["rng"][1])
    for other, name in ((ps0, "PS0"), (z, "Z")):
        for k in ("net", "opt", "rng", "tables", "steps"):
            _same_tensors(a[k], other[k], f"{name}.{k}")
        for k in ("global_step", "next_batch", "reissue", "trace_position", "hyper_parameters", "data"):
            assert other["rec"][k] == a["rec"][k], (name, k)
    assert a["rec"]["global_step"] == 4 and a["rec"]["next_batch"] == 8 and a["rec"]["reissue"] == []
    assert a["rec"]["trace_position"] == [4, 4]
    # a hand-over of other hyper-parameters is refused, naming the field
    spec = dataclasses.replace(base, train=dataclasses.replace(base.train, dense_lr=2e-3), handover_from=str(h["A"]))
    with pytest.raises(handover.HandoverError, match="hyper-parameter 'dense_lr'"):
        handover.check(handover.read(h["A"]), spec, data.n_train, h["A"])


def test_switched_run_continues_the_data_position_by_sample_ids(chain):
    """sync (0-4) -> gba on the PS (4-8) -> sync (8-12): every local batch 0 .. 23 of the sample
    stream is applied exactly once over the three launches (batches in flight at the PS's stop are
    handed to the next job), so no sample is seen twice or skipped; the same samples as the
    unswitched run."""
    base, data, res, h = chain["base"], chain["data"], chain["res"], chain["h"]
    A, Bps, C, whole = res["A"], res["B"], res["C"], res["whole"]
    assert (A["start_global_step"], Bps["start_global_step"], C["start_global_step"]) == (0, 4, 8)
    assert A["global_steps"] == 4 and Bps["global_steps"] == 8 and C["global_steps"] == STEPS
    assert Bps["handover"]["from"]["from_mode"] == "sync" and C["handover"]["from"]["from_mode"] == "gba"
    rb = handover.read(h["B"])
    assert sorted(Bps["batches_applied"] + rb["reissue"]) == list(range(8, rb["next_batch"]))
    applied = A["batches_applied"] + Bps["batches_applied"] + C["batches_applied"]
    assert sorted(applied) == list(range(STEPS * G // B)) == sorted(whole["batches_applied"])
    stream = SampleStream(data.n_train, B, base.train.seed)
    ids = torch.cat([stream.indices(b) for b in applied])
    assert len(ids) == STEPS * G < data.n_train and len(torch.unique(ids)) == len(ids)     # one epoch: all distinct
    whole_ids = torch.cat([stream.indices(b) for b in whole["batches_applied"]])
    assert torch.equal(torch.sort(ids).values, torch.sort(whole_ids).values)


def test_switched_run_ends_within_tolerance_of_the_unswitched_run(chain):
    """The switched run (2 launches of 2 sync ranks around a GBA PS launch with 2 workers, same
    hyper-parameters) ends where the never-switched sync run ends: final test AUC within 0.005
    and log loss within 0.005; its training loss over the last 4 global steps within 0.01."""
    res = chain["res"]
    C, whole = res["C"], res["whole"]
    da = abs(C["final"]["auc"] - whole["final"]["auc"])
    dl = abs(C["final"]["logloss"] - whole["final"]["logloss"])
    lc, lw = np.array(C["loss_curve"])[-4:, 1], np.array(whole["loss_curve"])[-4:, 1]
    print(f"switched AUC {C['final']['auc']:.4f} vs {whole['final']['auc']:.4f}, logloss {dl:.4f}, "
          f"train loss last 4 {lc.mean():.4f} vs {lw.mean():.4f}")
    assert whole["final"]["auc"] > 0.6
    assert da < 0.005 and dl < 0.005 and abs(lc.mean() - lw.mean()) < 0.01
    assert C["final"]["samples"] == whole["final"]["samples"] == STEPS * G
