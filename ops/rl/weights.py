"""Versioned weight sync from the trainer to rollout engines (SEEDS.md §5: only a complete sync
publishes a version; every response records the version that generated it).

The trainer's policy version counts its optimizer steps (0 = the initial weights). A sync stages
every tensor of version v on the engine side (``receive``, possibly in several chunks, as a Ray
transfer would); ``commit`` checks that every parameter arrived with the right shape, then copies
them into the engine's model under the engine's lock (no generation runs meanwhile) and only then
sets ``engine.version = v``. A sync that is incomplete or fails leaves the engine's weights and
version untouched.
"""

from __future__ import annotations

from typing import Optional


class WeightSyncError(RuntimeError):
    """A sync was committed without every parameter, with a wrong shape, or out of order."""


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
        WeightSyncError: version not newer than the engine's, or ``commit`` before every tensor arrived.
    """

    def __init__(self, engine, version: int):
        if engine.version is not None and version <= engine.version:
            raise WeightSyncError(f"sync to version {version} but the engine already holds version {engine.version}")
        self.engine, self.version = engine, version
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
        """Copy the staged weights in and publish the version. Returns it."""
        import torch

        missing = sorted(set(self.expected) - set(self.staged))
        if missing:
            raise WeightSyncError(f"sync v{self.version} is incomplete: {len(missing)} of {len(self.expected)} "
                                  f"parameters missing (first: {missing[:3]}); version not published")
        with self.engine.lock:
            sd = self.engine.model.state_dict()
            with torch.no_grad():
                for k, v in self.staged.items():
                    sd[k].copy_(v)
            self.engine.version = self.version
        return self.version


def sync_weights(engine, state: dict, version: int, n_chunks: int = 1) -> int:
    """Stage ``state`` in ``n_chunks`` messages and commit: the whole sync. Returns the published version."""
    s = WeightSync(engine, version)
    for c in chunks(state, n_chunks):
        s.receive(c)
    return s.commit()


def published_version(engines) -> Optional[int]:
    """The version every engine holds (None if they differ or one is mid-sync)."""
    vs = {e.version for e in engines}
    return vs.pop() if len(vs) == 1 else None
