"""Versioned weight sync from the trainer to rollout engines (docs/rollarc.md, "Versioned weight sync": only a complete sync
publishes a version; every response records the version that generated it).

The trainer's policy version counts its optimizer steps (0 = the initial weights). A sync stages
every tensor of version v on the engine side (``receive``, possibly in several chunks, as a Ray
transfer would); ``commit`` checks that every parameter arrived with the right shape, then, under
the engine's lock (no generation runs meanwhile):

* checks that v is newer than the version the engine holds *now* — two syncs may be staged at once
  (v6 and v7 in flight) and commit in either order; an older or equal commit is refused with
  ``StaleWeightSync`` and counted in ``engine.stale_syncs_refused`` (case ``weight-version-monotone``);
* copies the tensors into the engine's model and only then sets ``engine.version = v``. A copy that
  raises part-way restores every tensor already overwritten, bit for bit, before the lock is
  released, so the engine keeps the old weights with the old version and never generates on a mix
  (case ``weight-sync-commit-atomic``; counted in ``engine.failed_syncs``). The restore keeps a copy
  of the overwritten tensors on their device while the commit runs (one model's weights at most).

A sync that is incomplete, stale or fails leaves the engine's weights and version untouched.
``sync_stats`` reports the engine's version and both counters (for run metadata).
"""

from __future__ import annotations

import threading
from typing import Optional


class WeightSyncError(RuntimeError):
    """A sync was committed without every parameter, with a wrong shape, out of order, or its copy
    failed (the engine then keeps its old weights and version)."""


class StaleWeightSync(WeightSyncError):
    """A sync to a version older than or equal to the one the engine holds (refused at commit,
    under the engine's lock; counted in ``engine.stale_syncs_refused``)."""


def export_state(model) -> dict:
    """The model's parameters and buffers as detached CPU tensors (what a sync transfers)."""
    return {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}


def chunks(state: dict, n: int) -> list[dict]:
    """Split a state dict into ``n`` chunks (a transfer in several messages)."""
    keys = list(state)
    return [{k: state[k] for k in keys[i::n]} for i in range(n)]


class WeightSync:
    """Receiving side of one sync to ``engine`` (anything with ``model``, ``version`` and ``lock``).

    Raises:
        StaleWeightSync: version not newer than the engine's (checked here, to fail early, and again
            at ``commit`` under the lock, which decides).
        WeightSyncError: an unknown parameter or a wrong shape (``receive``), ``commit`` before every
            tensor arrived, or a copy that failed (old weights and version kept).
    """

    def __init__(self, engine, version: int):
        self.engine, self.version = engine, version
        if engine.version is not None and version <= engine.version:
            _refuse(engine, version)
        self.expected = {k: tuple(v.shape) for k, v in engine.model.state_dict().items()}
        self.staged: dict = {}

    def receive(self, chunk: dict) -> None:
        for k, v in chunk.items():
            if k not in self.expected:
                raise WeightSyncError(f"sync v{self.version}: unknown parameter {k!r}")
            if tuple(v.shape) != self.expected[k]:
                raise WeightSyncError(f"sync v{self.version}: parameter {k!r} has shape {tuple(v.shape)}, "
                                      f"expected {self.expected[k]}")
            self.staged[k] = v

    def commit(self) -> int:
        """Check the version and copy the staged weights in, under the engine's lock; then publish
        the version. Returns it. See the module docstring for what a refused or failed commit leaves."""
        import torch

        missing = sorted(set(self.expected) - set(self.staged))
        if missing:
            raise WeightSyncError(f"sync v{self.version} is incomplete: {len(missing)} of {len(self.expected)} "
                                  f"parameters missing (first: {missing[:3]}); version not published")
        eng = self.engine
        with eng.lock:
            if eng.version is not None and self.version <= eng.version:
                _refuse(eng, self.version)
            sd = eng.model.state_dict()
            keys = [k for k in sd if k in self.staged]              # model order
            saved: list = []                                        # (key, old tensor) of what may be overwritten
            i = 0
            with torch.no_grad():
                try:
                    for i, k in enumerate(keys):
                        saved.append((k, sd[k].clone()))
                        sd[k].copy_(self.staged[k])
                except BaseException as e:
                    # reverse order: tied parameters (one storage under two names) end on the first,
                    # i.e. the original, value
                    for k, old in reversed(saved):
                        sd[k].copy_(old)
                    _count(eng, "failed_syncs")
                    if not isinstance(e, Exception):                # KeyboardInterrupt & co: rolled back, re-raised
                        raise
                    raise WeightSyncError(f"commit of version {self.version} failed at parameter {i + 1} of "
                                          f"{len(keys)} ({keys[i]}): {type(e).__name__}: {e}; the engine keeps "
                                          f"version {eng.version} and its weights") from e
            eng.version = self.version
        return self.version


_COUNTERS = threading.Lock()          # the counters' increments (a stale sync may be refused without engine.lock)


def _count(engine, name: str) -> None:
    with _COUNTERS:
        setattr(engine, name, getattr(engine, name, 0) + 1)


def _refuse(engine, version: int) -> None:
    """Count and raise a stale sync."""
    _count(engine, "stale_syncs_refused")
    raise StaleWeightSync(f"sync to version {version} refused: the engine already holds version {engine.version} "
                          f"(older than or equal to it; policy versions only move forward)")


def sync_weights(engine, state: dict, version: int, n_chunks: int = 1) -> int:
    """Stage ``state`` in ``n_chunks`` messages and commit: the whole sync. Returns the published
    version. Raises StaleWeightSync / WeightSyncError as ``WeightSync``."""
    s = WeightSync(engine, version)
    for c in chunks(state, n_chunks):
        s.receive(c)
    return s.commit()


def sync_stats(engine) -> dict:
    """The engine's sync record for run metadata: ``policy_version`` (None mid-sync),
    ``stale_syncs_refused`` (commits older than or equal to the held version) and ``failed_syncs``
    (commits whose copy raised and were rolled back)."""
    return {"policy_version": engine.version, "stale_syncs_refused": getattr(engine, "stale_syncs_refused", 0),
            "failed_syncs": getattr(engine, "failed_syncs", 0)}


def published_version(engines) -> Optional[int]:
    """The version every engine holds (None if they differ or one is mid-sync)."""
    vs = {e.version for e in engines}
    return vs.pop() if len(vs) == 1 else None
