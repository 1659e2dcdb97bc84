"""GBA's pure logic, in-process: token control and staleness accounting on scripted traces, the
baselines' scheduling (SSP, Hop-BW), lost workers, the averaging rule, the straggler trace, config
validation, and the one-set-of-hyper-parameters rule."""

import dataclasses

import numpy as np
import pytest
import torch

from ops.gba.aggregate import Aggregator, Gradient
from ops.gba.config import MODES, Cluster, GBAConfigError, Policy, RunSpec, hyper_parameters, validate
from ops.gba.control import STOP, Control, ProtocolError, Wait, Work
from ops.gba.staleness import StalenessDecay, histogram
from ops.gba.trace import StragglerTrace
from ops.sparse.config import TrainConfig


def _spec(mode="gba", workers=2, G=4, b=2, **policy):
    return validate(RunSpec(mode=mode, train=TrainConfig(batch_size=G, epochs=1), local_batch=b,
                            cluster=Cluster(workers=workers), policy=Policy(**policy)))


def _start(c: Control) -> dict:
    """Every worker says hello; returns their first batch numbers."""
    assert isinstance(c.hello(0), Wait)                     # the start barrier holds the first worker
    first = {w: c.hello(w) for w in range(1, c.spec.cluster.workers)}
    first[0] = c.hello(0)
    return first


def test_gba_token_control_counts_staleness_exactly_and_applies_every_global_batch_of_G_samples():
    c = Control(_spec("gba"), total_samples=12)             # G = 4 = 2 local batches of 2; 3 global steps
    b = _start(c)
    assert c.pull(1, b[1]) == Work(0)                       # worker 1 takes token 0 and becomes a straggler
    assert c.pull(0, b[0]) == Work(0)
    applied, verdicts = [], []

    def push(w, token, batch):
        v = c.push(w, token, batch, 2)
        verdicts.append((w, v.tau, v.weight, v.apply))
        if v.apply:
            applied.append(c.samples_applied - sum(applied))
        return v.next_batch

    n = push(0, 0, b[0])                                    # step 0: 2 of 4 samples
    assert c.pull(0, n) == Work(0)
    n = push(0, 0, n)                                       # step 0 complete -> step 1
    assert c.pull(0, n) == Work(1)
    n = push(0, 1, n)
    assert c.pull(0, n) == Work(1)
    n = push(0, 1, n)                                       # -> step 2
    n1 = push(1, 0, b[1])                                   # the straggler's token 0 returns at step 2: tau = 2 > 1
    assert c.pull(0, n) == Work(2)
    assert push(0, 2, n) is None                            # step 2 complete = 12 samples: the run is over
    assert c.pull(1, n1) == STOP
    assert verdicts == [(0, 0, 1.0, False), (0, 0, 1.0, True), (0, 0, 1.0, False), (0, 0, 1.0, True),
                        (1, 2, 0.5, False), (0, 0, 1.0, True)]
    assert c.taus == [0, 0, 0, 0, 2, 0] and histogram(c.taus) == {0: 5, 1: 0, 2: 1}
    assert applied == [4, 4, 4] and c.step == 3 and c.gradients.decayed == 1 and c.gradients.dropped == 0
    assert c.batches_by_worker == [5, 1] and c.done


def test_staleness_decay_default_is_documented_and_pluggable():
    f = StalenessDecay()
    assert [f(t) for t in range(5)] == [1.0, 1.0, 0.5, 0.25, 0.125]
    assert StalenessDecay(threshold=0, rate=0.5, drop_after=1)(2) == 0.0
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        f(-1)
    spec = dataclasses.replace(_spec("gba"), policy=Policy(decay=lambda tau: 0.0 if tau > 0 else 1.0))   # any callable
    c = Control(spec, total_samples=8)
    b = _start(c)
    c.pull(0, b[0]), c.pull(1, b[1])
    n = c.push(0, 0, b[0], 2).next_batch
    c.pull(0, n)
    c.push(0, 0, n, 2)                                      # step 1
    v = c.push(1, 0, b[1], 2)
    assert (v.tau, v.weight, v.apply) == (1, 0.0, False) and c.gradients.dropped == 1 and c.pending_samples == 0


def test_async_applies_every_gradient_and_ssp_holds_a_worker_beyond_the_bound():
    c = Control(_spec("async"), total_samples=100)
    b = _start(c)
    c.pull(0, b[0])
    assert c.push(0, 0, b[0], 2).apply and c.step == 1

    c = Control(_spec("ssp", ssp_bound=1), total_samples=100)
    b = _start(c)
    n = b[0]
    for _ in range(2):                                      # worker 0 runs 2 local batches ahead of worker 1
        assert isinstance(c.pull(0, n), Work)
        n = c.push(0, c.step, n, 2).next_batch
    w = c.pull(0, n)
    assert isinstance(w, Wait) and "more than 1 ahead" in w.reason
    c.pull(1, b[1])
    c.push(1, c.outstanding[1][0], b[1], 2)                 # the slowest catches up by one
    assert isinstance(c.pull(0, n), Work)
    c.push(0, c.step, n, 2)
    assert isinstance(c.pull(0, c.claimed[0]), Wait)
    assert not c.worker_lost(1, "killed by SIGKILL")         # a lost worker no longer holds the others back
    assert isinstance(c.pull(0, c.claimed[0]), Work)


def test_hopbw_applies_the_first_M_minus_b_gradients_and_drops_the_late_ones():
    c = Control(_spec("hopbw", backup_workers=1), total_samples=100)   # M = W = 2, one backup worker
    b = _start(c)
    assert c.pull(0, b[0]) == Work(0) and c.pull(1, b[1]) == Work(0)
    v = c.push(0, 0, b[0], 2)
    assert v.apply and c.step == 1                          # the first 1 of 2 gradients makes the step
    assert c.pull(0, v.next_batch) == Work(1)
    late = c.push(1, 0, b[1], 2)
    assert (late.tau, late.weight, late.apply) == (1, 0.0, False) and c.gradients.dropped == 1

    c = Control(_spec("hopbw", backup_workers=0), total_samples=100)   # no backup: wait for both
    b = _start(c)
    c.pull(0, b[0])
    n = c.push(0, 0, b[0], 2).next_batch
    assert isinstance(c.pull(0, n), Wait)                   # worker 0 has used its token of step 0
    c.pull(1, b[1])
    assert c.push(1, 0, b[1], 2).apply and c.pull(0, n) == Work(1)


def test_a_lost_worker_drops_its_token_and_batch_and_the_others_finish():
    c = Control(_spec("gba"), total_samples=8)
    b = _start(c)
    c.pull(0, b[0]), c.pull(1, b[1])
    c.worker_lost(1, "killed by SIGKILL")
    assert c.lost_work == [(1, 0, b[1])] and c.lost == {1: "killed by SIGKILL"}
    assert c.pull(1, b[1]) == STOP
    n = c.push(0, 0, b[0], 2).next_batch                  # worker 0 alone fills every global batch
    while n is not None:
        tok = c.pull(0, n).token
        n = c.push(0, tok, n, 2).next_batch
    assert c.done and c.samples_applied == 8 and c.step == 2 and c.batches_by_worker == [4, 0]
    with pytest.raises(ProtocolError, match="worker0 pushed"):
        c.push(0, 0, 99, 2)

    c = Control(_spec("hopbw", workers=2, backup_workers=0), total_samples=100)
    b = _start(c)
    c.pull(0, b[0]), c.pull(1, b[1])
    c.push(0, 0, b[0], 2)
    assert c.worker_lost(1, "exited") and c.step == 1      # Hop-BW stops waiting for the dead worker's gradient


def test_aggregator_averages_dense_over_the_samples_and_rows_over_the_samples_that_touched_them():
    g1 = Gradient(torch.tensor([1.0, 2.0]), {"t": (torch.tensor([5, 7]), torch.tensor([[1.0], [2.0]]), torch.tensor([1, 2]))}, 2, 1.0)
    g2 = Gradient(torch.tensor([3.0, 4.0]), {"t": (torch.tensor([7]), torch.tensor([[6.0]]), torch.tensor([2]))}, 2, 3.0)
    agg = Aggregator()
    agg.add(g1, 1.0)
    agg.add(g2, 0.5)
    up = agg.take()
    assert torch.allclose(up.dense, torch.tensor([(1 + 1.5) / 4, (2 + 2) / 4]))
    ids, rows = up.sparse["t"]
    assert ids.tolist() == [5, 7] and torch.allclose(rows, torch.tensor([[1.0], [(2 + 3) / 4]]))
    assert (up.samples, up.gradients, up.loss) == (4, 2, 1.0)
    with pytest.raises(ValueError, match="nothing to apply"):
        agg.take()
    with pytest.raises(ValueError, match="weight must be in"):
        agg.add(g1, 0.0)


def test_straggler_trace_is_seeded_and_the_same_for_every_mode():
    p = StragglerTrace(kind="persistent", slowdown=4.0)
    assert [p.multiplier(w, 7, 3) for w in range(3)] == [1.0, 1.0, 4.0]          # -1 = the last worker
    assert [p.passes(w, 7, 3) for w in range(3)] == [1, 1, 4]                     # real extra forward/backward passes
    frac = StragglerTrace(kind="persistent", slowdown=2.5, seed=1)
    n = [frac.passes(1, k, 2) for k in range(4000)]
    assert set(n) == {2, 3} and abs(np.mean(n) - 2.5) < 0.05                     # expected work = m passes
    window = StragglerTrace(kind="persistent", slowdown=4.0, onset=10, recovery=20)
    assert [window.multiplier(1, k, 2) for k in (9, 10, 19, 20)] == [1.0, 4.0, 4.0, 1.0]
    for dist in ("exponential", "pareto"):
        r = StragglerTrace(kind="random", distribution=dist, mean_extra=1.0, seed=3)
        draws = np.array([r.multiplier(w, k, 2) for w in range(2) for k in range(2000)])
        assert draws.min() >= 1.0 and abs(draws.mean() - 2.0) < 0.15
        assert r.multiplier(1, 5, 2) == StragglerTrace(kind="random", distribution=dist, seed=3).multiplier(1, 5, 2)
        assert r.multiplier(1, 5, 2) != StragglerTrace(kind="random", distribution=dist, seed=4).multiplier(1, 5, 2)


@pytest.mark.parametrize("change, field", [
    (dict(train=TrainConfig(batch_size=500)), "train.batch_size (global batch 500) must be a multiple of local_batch (256)"),
    (dict(cluster=Cluster(workers=0)), "cluster.workers must be >= 1"),
    (dict(mode="sync", train=TrainConfig(batch_size=768), cluster=Cluster(workers=2)), "multiple of workers x local_batch = 512"),
    (dict(mode="hopbw", policy=Policy(backup_workers=2)), "policy.backup_workers must be in [0, workers=2)"),
    (dict(mode="fast"), "mode must be one of"),
    (dict(trace=StragglerTrace(kind="persistent", slowdown=0.5)), "trace.slowdown must be >= 1"),
    (dict(cluster=Cluster(rpc_timeout_s=0)), "cluster.rpc_timeout_s must be > 0"),
])
def test_bad_config_raises_a_clear_error_naming_the_field(change, field):
    with pytest.raises(GBAConfigError) as e:
        validate(dataclasses.replace(RunSpec(), **change))
    assert field in str(e.value)


def test_switching_modes_changes_no_hyper_parameter():
    spec = RunSpec(events_path="x.parquet")
    runs = {m: spec.with_mode(m) for m in MODES}
    assert all(r.train is spec.train and r.local_batch == spec.local_batch for r in runs.values())
    assert all(dataclasses.replace(r, mode="gba") == runs["gba"] for r in runs.values())
    assert len({str(hyper_parameters(r)) for r in runs.values()}) == 1
    assert RunSpec.from_json(runs["sync"].to_json()) == runs["sync"]


def test_auc_and_log_loss_match_scikit_learn_with_ties():
    from sklearn.metrics import log_loss, roc_auc_score

    from ops.gba.model import metrics

    rng = np.random.default_rng(0)
    y = (rng.random(500) < 0.4).astype(np.float32)
    s = np.round(rng.random(500) * 0.5 + 0.3 * y, 2)                             # rounded: many ties
    m = metrics(torch.from_numpy(y), s)
    assert m["auc"] == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert m["logloss"] == pytest.approx(log_loss(y, np.clip(s, 1e-7, 1 - 1e-7)), rel=1e-9)


def test_sync_launch_check_rejects_the_silent_single_process_cpu_launch():
    from ops.gba.sync import LaunchError, check_launch

    check_launch(2, "MULTI_CPU", 2)
    check_launch(1, "NO", 1)
    with pytest.raises(LaunchError, match="world size 1 with distributed type NO, but the run asked for 2 rank"):
        check_launch(1, "NO", 2)                              # `accelerate launch --cpu --num_processes 2`
    with pytest.raises(LaunchError, match="distributed type NO"):
        check_launch(2, "NO", 2)                              # two processes training without gradient sync


@pytest.mark.parametrize("entry", ["ops.gba.ps", "ops.gba.sync"])
def test_a_launched_process_checks_its_spec_file_naming_the_file_and_the_field(entry, tmp_path):
    import importlib

    from ops.gba.config import JOB

    spec = JOB.with_mode("gba" if entry.endswith("ps") else "sync").validate()
    bad = tmp_path / "spec.json"
    bad.write_text(spec.to_json().replace('"workers": 2', '"workers": 0'))
    with pytest.raises(ValueError, match=r"spec.json: cluster.workers must be >= 1"):
        importlib.import_module(entry).main(["--spec", str(bad), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()                       # nothing started
