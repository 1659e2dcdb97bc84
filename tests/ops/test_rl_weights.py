"""Versioned weight sync: versions only move forward (case weight-version-monotone) and a commit
that raises part-way leaves the old weights and version intact (case weight-sync-commit-atomic)."""

import threading

import pytest
import torch

from ops.rl.engine import HFEngine
from ops.rl.policy import tiny_policy
from ops.rl.weights import StaleWeightSync, WeightSync, WeightSyncError, export_state, sync_stats, sync_weights

TOK = type("Tok", (), {"eos_token_id": 2, "pad_token_id": 2})()
STATES = {v: export_state(tiny_policy(97, seed=v)) for v in (0, 1, 5, 6, 7)}


def engine_at(version: int) -> HFEngine:
    m = tiny_policy(97, seed=version)
    return HFEngine(m, TOK, version=version)


def holds(engine, version) -> bool:
    return all(torch.equal(STATES[version][k], v) for k, v in engine.model.state_dict().items())


def test_case_weight_version_monotone_two_updates_in_every_order():
    ends, refused_total = [], 0
    for trial in range(40):
        engine = engine_at(5)
        order = ("v6-first", "v7-first", "race")[trial % 3]
        staged = threading.Barrier(2)
        first_done = threading.Event()
        results, bad_views, seen = {}, [], []
        stop = threading.Event()

        def update(v):
            s = WeightSync(engine, v)                 # both staged while the engine holds v5
            s.receive(STATES[v])
            staged.wait(10)
            first = 6 if order == "v6-first" else 7
            if order != "race" and v != first:
                first_done.wait(10)
            try:
                results[v] = s.commit()
            except StaleWeightSync as e:
                results[v] = e
            finally:
                first_done.set() if v == first else None

        def watch():                                  # the weights always match the served version
            while not stop.is_set():
                with engine.lock:
                    v = engine.version
                    if not holds(engine, v):
                        bad_views.append(v)
                seen.append(v)

        w = threading.Thread(target=watch)
        w.start()
        ts = [threading.Thread(target=update, args=(v,)) for v in (6, 7)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        stop.set()
        w.join(30)
        ends.append(engine.version)
        assert engine.version == 7 and holds(engine, 7), (trial, order, results)
        assert not bad_views and seen == sorted(seen), (trial, order)
        assert results[7] == 7
        if isinstance(results[6], StaleWeightSync):
            refused_total += 1
            assert "already holds version 7 (older than or equal to it" in str(results[6])
            assert sync_stats(engine)["stale_syncs_refused"] == 1
        else:
            assert results[6] == 6 and sync_stats(engine)["stale_syncs_refused"] == 0
        if order == "v7-first":
            assert isinstance(results[6], StaleWeightSync)
    assert ends == [7] * 40 and refused_total >= 40 // 3


def test_an_equal_or_older_sync_is_refused_and_counted():
    engine = engine_at(5)
    for v in (5, 4):
        with pytest.raises(StaleWeightSync, match=f"version {v}.*holds version 5"):
            sync_weights(engine, STATES[6], v)
    assert engine.version == 5 and holds(engine, 5)
    assert sync_stats(engine) == {"policy_version": 5, "stale_syncs_refused": 2, "failed_syncs": 0}
    assert issubclass(StaleWeightSync, WeightSyncError)


def test_case_weight_sync_commit_atomic():
    engine = engine_at(0)
    keys = list(STATES[1])
    assert len(keys) == 21
    bad = dict(STATES[1])
    bad[keys[9]] = torch.empty(STATES[1][keys[9]].shape, device="meta")   # copying it raises: the 10th of 21
    s = WeightSync(engine, 1)
    s.receive(bad)
    with pytest.raises(WeightSyncError, match=f"commit of version 1 failed at parameter 10 of 21 \\({keys[9]}\\)"):
        s.commit()
    assert engine.version == 0 and holds(engine, 0)                        # old weights bit for bit, old version
    assert sync_stats(engine)["failed_syncs"] == 1
    # the engine still serves version 0, and the next complete update commits normally
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        want = tiny_policy(97, seed=0)(input_ids=ids).logits
        assert torch.equal(engine.model(input_ids=ids).logits, want)
    assert sync_weights(engine, STATES[1], 1, n_chunks=3) == 1 and engine.version == 1 and holds(engine, 1)
