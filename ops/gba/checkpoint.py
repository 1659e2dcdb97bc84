"""Checkpoints of a GBA run, so that a relaunched run continues where a killed one stopped
(docs/operations.md, "Retries and resume": training writes checkpoints and resumes on retry).

Layout under a run directory ``DIR`` (the launch's ``--out``)::

    DIR/checkpoints/latest.json                 the commit point (see ``Checkpoints.commit``)
    DIR/checkpoints/step-<samples>/<name>.pt    one writer's state (torch.save: dense parameters,
                                                Adam state, counters, curves, clock, RNG)
    DIR/checkpoints/step-<samples>/<name>.tables.safetensors
                                                that writer's sparse tables: live rows with their
                                                SparseAdagrad state (``ops.sparse.checkpoint``)

Writers: ``ps`` (the parameter server, in the PS modes) or ``rank<r>`` (every rank of ``sync``:
the sparse rows are sharded over the ranks by ID, so each rank saves its shard; rank 0 commits).
Every file is written to a temporary name and renamed; a checkpoint counts only once
``latest.json`` (itself written atomically, after every writer finished) names its folder, and
older folders are removed only after that. A kill at any moment leaves the previous checkpoint
whole. A checkpoint records the run's ``fingerprint``; one from a different run spec is ignored.

torch loads only inside the functions that read or write tensors: the asset imports this module.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

from ops.lake import atomic_path, write_json_atomic

from .errors import CheckpointError

__all__ = ["CRASH_ENV", "CheckpointError", "Checkpoints", "crash_if_asked", "fingerprint", "load_state", "save_state"]

CRASH_ENV = "CRUCIBLE_GBA_CRASH_AFTER_CHECKPOINTS"
"""Fault injection (tests): ``N`` SIGKILLs the whole launch right after the run's N-th checkpoint is
committed — the launcher and every rank or worker, as a node preemption would (so
``RetryingComputeResource`` sees a launch death, exit code -9). Counted over the whole run, so the
relaunch, which resumes past checkpoint N, is not killed again. Only for launches started in their
own session (``ComputeResource.run`` and the tests do): see ``crash_if_asked``."""


def fingerprint(spec) -> str:
    """Hash of what determines a run's trajectory: mode, hyper-parameters (``spec.train``), local
    batch, worker count, mode policies, straggler trace, and the events file (path, size, mtime).
    Timeouts, evaluation and checkpoint cadence and the data cache are left out: changing them
    does not invalidate a checkpoint. 16 hex digits (``ops.launch.spec_fingerprint``)."""
    from ops.launch import spec_fingerprint

    d = json.loads(spec.to_json())
    cluster = d.pop("cluster")
    d.pop("data_cache", None)
    d["workers"] = cluster["workers"]
    return spec_fingerprint(d, spec.events_path)


class Checkpoints:
    """The checkpoints of one run directory (see the module docstring).

    Args:
        run_dir: the run directory (the launch's ``--out``).
        fingerprint: ``fingerprint(spec)`` of the run that reads and writes them.
    Attributes:
        skipped: why a committed checkpoint was ignored by ``find`` (None: it was not).
    """

    def __init__(self, run_dir: str | Path, fingerprint: str):
        self.root = Path(run_dir) / "checkpoints"
        self.fp = fingerprint
        self.skipped: str | None = None

    @property
    def latest_path(self) -> Path:
        return self.root / "latest.json"

    def find(self) -> dict | None:
        """The record of the last committed checkpoint of this run (``fingerprint``, ``dir``,
        ``count``, ``samples``, ``global_step`` and what the writer added), or None when there is
        none or it belongs to another run spec (then ``skipped`` says so). Raises CheckpointError
        when ``latest.json`` is not valid JSON or names a missing folder."""
        p = self.latest_path
        if not p.exists():
            return None
        try:
            rec = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise CheckpointError(f"checkpoint record {p} is not valid JSON ({e}); delete {self.root} to start over") from e
        if rec.get("fingerprint") != self.fp:
            self.skipped = (f"checkpoint {p} is from another run spec (fingerprint {rec.get('fingerprint')}, this run "
                            f"{self.fp}); training from step 0")
            return None
        if not (self.root / rec["dir"]).is_dir():
            raise CheckpointError(f"checkpoint record {p} names folder {rec['dir']!r}, which does not exist under {self.root}")
        return rec

    def folder(self, rec: dict) -> Path:
        return self.root / rec["dir"]

    def stage(self, samples: int) -> Path:
        """An empty folder for the checkpoint at ``samples`` applied samples (a leftover of a kill
        between staging and commit is cleared). Raises CheckpointError for the committed folder."""
        d = self.root / f"step-{samples:012d}"
        if self.latest_path.exists() and json.loads(self.latest_path.read_text()).get("dir") == d.name:
            raise CheckpointError(f"checkpoint folder {d} is the committed one; a run never checkpoints one point twice")
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return d

    def commit(self, folder: Path, record: dict) -> dict:
        """Name ``folder`` in ``latest.json`` (atomically; call once every writer has written into
        it), then remove every other checkpoint folder. Returns the record written."""
        rec = {"fingerprint": self.fp, "dir": folder.name, **record}
        write_json_atomic(rec, self.latest_path, indent=1)
        for other in self.root.glob("step-*"):
            if other.name != folder.name:
                shutil.rmtree(other, ignore_errors=True)
        return rec


def save_state(folder: Path, name: str, state: dict, ec=None) -> None:
    """Write one writer's ``state`` (tensors, numbers, strings, lists and dicts of them) to
    ``folder/<name>.pt`` and, with an EmbeddingCollection ``ec``, its tables' live rows to
    ``folder/<name>.tables.safetensors``; both atomically."""
    import torch

    from ops.sparse.checkpoint import save_tables

    with atomic_path(folder / f"{name}.pt") as tmp:
        torch.save(state, tmp)
    if ec is not None:
        save_tables(ec, folder / f"{name}.tables.safetensors")


def load_state(folder: Path, name: str, ec=None) -> dict:
    """Read what ``save_state`` wrote (restoring ``ec``'s tables bit-exactly when given). Raises
    CheckpointError naming a missing file, ValueError naming a table that does not match."""
    import torch

    from ops.sparse.checkpoint import load_tables

    p = folder / f"{name}.pt"
    if not p.exists():
        raise CheckpointError(f"checkpoint {folder} has no state file {p.name} (writer {name!r})")
    state = torch.load(p, map_location="cpu", weights_only=True)
    if ec is not None:
        t = folder / f"{name}.tables.safetensors"
        if not t.exists():
            raise CheckpointError(f"checkpoint {folder} has no table file {t.name} (writer {name!r})")
        load_tables(ec, t)
    return state


def crash_if_asked(count: int, log: Callable[[str], None]) -> None:
    """Fault injection: when ``CRASH_ENV`` equals ``count`` (the number of the checkpoint just
    committed), SIGKILL the launch. Under torchrun/accelerate (``TORCHELASTIC_RUN_ID`` set; every
    rank calls this) each rank runs in its own session, so it kills the launcher's process group
    (its parent's) and then itself; otherwise (the parameter server, which is the launch and whose
    workers share its group) it kills its own process group. Raises ValueError when the variable
    is not an integer."""
    from ops.launch import crash_after

    n = crash_after(CRASH_ENV, "checkpoints")
    if n is None or n != count:
        return
    log(f"fault injection ({CRASH_ENV}={n}): SIGKILL to the launch after checkpoint {count}")
    if "TORCHELASTIC_RUN_ID" in os.environ:
        os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    os.killpg(os.getpgrp(), signal.SIGKILL)
