"""The mode-independent hand-over between the all-reduce trainer (``ops.gba.sync``) and the
parameter server (``ops.gba.server``): the switch of the GBA paper (arXiv 2205.11048 §1, §3:
a job moves between synchronous all-reduce training and GBA on a PS "without retuning").

A switch is two launches: job A runs with ``RunSpec.stop_at = S`` and writes the hand-over at
global step S; job B (any mode, same hyper-parameters) starts with ``RunSpec.handover_from``.
Unlike a checkpoint (``ops.gba.checkpoint``: one run's private resume state, keyed by the run's
fingerprint, which includes the mode, with sync rows saved per rank), the hand-over holds only
what both trainers mean the same way, so either can read what the other wrote.

Layout of a hand-over folder ``H``::

    H/handover.json                          the record, written last (its presence commits the folder)
    H/state.pt                               dense parameters (DeepFM ``net.state_dict()``), Adam state
                                             (``opt.state_dict()``), per-worker torch CPU RNG states
    H/tables.manifest.json                   every embedding row with its SparseAdagrad state, sharded
    H/tables.rank<r>-of-<n>.safetensors      by ``key % n`` (``ops.sparse.checkpoint``: reshardable, so
                                             W sync ranks write and num_ps PS processes read, or back)

``handover.json``: ``format``, ``from_mode``, ``global_step`` (= samples / G), ``optimizer_steps``,
``samples``, ``hyper_parameters`` (``config.hyper_parameters``: a reader refuses any difference),
``data`` (events file name and size, train rows, local batch b, seed: the sample stream), the data
position ``next_batch`` (first local batch number never handed out) and ``reissue`` (batch numbers
below it whose samples were not applied: in flight at the stop; they are trained first), ``workers``
(W of the writer), ``trace_position`` (per worker: local batches it computed, the straggler trace's
counter), ``state_sha256``.

Data position: the sample stream (``ops.gba.data.SampleStream``) is a function of (seed, b), so a
position is a set of local batch numbers; sync's step s covers the next M of ``reissue + [next_batch,
next_batch + 1, ...]``, the PS hands out ``reissue`` first (``Control.reissue``), then fresh ones.
RNG: worker w's dropout stream is sync rank w's (both seed ``seed * 1000 + w + 1``); a worker without
a saved state (W differs between the jobs) is seeded fresh.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ops.lake import atomic_path, file_sha256, write_json_atomic

FORMAT = "crucible.gba-handover/1"
RECORD = "handover.json"
STATE = "state.pt"
TABLES = "tables"

__all__ = ["FORMAT", "HandoverError", "batches", "advance", "write", "read", "check", "load_tables", "load_state",
           "worker_rng"]


class HandoverError(ValueError):
    """A hand-over cannot be used: missing or corrupt file, another format, or a run whose
    hyper-parameters or data differ from the writer's; the message names the file and the field."""


def batches(next_batch: int, reissue: list[int], start: int, count: int) -> list[int]:
    """Local batch numbers ``start .. start + count - 1`` of the order ``reissue + [next_batch, ...]``."""
    out = []
    for i in range(start, start + count):
        out.append(reissue[i] if i < len(reissue) else next_batch + i - len(reissue))
    return out


def advance(next_batch: int, reissue: list[int], consumed: int) -> tuple[int, list[int]]:
    """The position after ``consumed`` batches of that order: (next fresh batch, batches still to reissue)."""
    if consumed <= len(reissue):
        return next_batch, list(reissue[consumed:])
    return next_batch + consumed - len(reissue), []


def data_record(spec, n_train: int) -> dict:
    """What identifies the sample stream: events file name and size, train rows, b, seed."""
    p = Path(spec.events_path)
    return {"events": p.name, "events_bytes": p.stat().st_size if p.exists() else None, "n_train": n_train,
            "local_batch": spec.local_batch, "seed": spec.train.seed}


def write(folder: str | Path, spec, *, net: dict, opt: dict, rng: list, global_step: float, optimizer_steps: int,
          next_batch: int, reissue: list[int], trace_position: list[int], n_train: int, writers: list[str]) -> dict:
    """Write ``state.pt`` and then ``handover.json`` into ``folder`` (the tables must already be there:
    ``ops.sparse.checkpoint.save_shard`` per writer + ``write_manifest``). Returns the record.
    ``rng``: per worker a torch RNG state (uint8 tensor) or None. Raises HandoverError when the
    folder already holds a committed hand-over or the table manifest is missing."""
    import torch

    from ops.sparse.checkpoint import manifest_path

    folder = Path(folder)
    if (folder / RECORD).exists():
        raise HandoverError(f"hand-over {folder / RECORD} exists: a hand-over folder is written once")
    if not manifest_path(folder, TABLES).is_file():
        raise HandoverError(f"hand-over {folder}: the table manifest {manifest_path(folder, TABLES).name} was not written")
    from .config import hyper_parameters

    with atomic_path(folder / STATE) as tmp:
        torch.save({"net": net, "opt": opt, "rng": list(rng)}, tmp)
    rec = {"format": FORMAT, "from_mode": spec.mode, "global_step": global_step, "optimizer_steps": optimizer_steps,
           "samples": int(round(global_step * spec.global_batch)), "hyper_parameters": hyper_parameters(spec),
           "data": data_record(spec, n_train), "next_batch": int(next_batch), "reissue": sorted(int(b) for b in reissue),
           "workers": spec.cluster.workers, "trace_position": [int(k) for k in trace_position], "writers": writers,
           "state_sha256": file_sha256(folder / STATE), "written_at": time.time()}
    write_json_atomic(rec, folder / RECORD, indent=1)
    return rec


def read(folder: str | Path) -> dict:
    """The record of a committed hand-over. Raises HandoverError naming the file when it is missing,
    not JSON, of another format, or when ``state.pt`` does not match its recorded SHA-256."""
    folder = Path(folder)
    p = folder / RECORD
    if not p.is_file():
        raise HandoverError(f"hand-over {p} is missing: job A writes it when it stops at stop_at (RunSpec.handover_to)")
    try:
        rec = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HandoverError(f"hand-over {p} is not valid JSON ({e})") from e
    if rec.get("format") != FORMAT:
        raise HandoverError(f"hand-over {p}: format {rec.get('format')!r}, expected {FORMAT!r}")
    st = folder / STATE
    if not st.is_file():
        raise HandoverError(f"hand-over {folder}: {STATE} is missing")
    if file_sha256(st) != rec.get("state_sha256"):
        raise HandoverError(f"hand-over {st}: SHA-256 differs from {RECORD}'s state_sha256 (truncated or replaced)")
    return rec


def check(rec: dict, spec, n_train: int, folder: str | Path = "") -> None:
    """Refuse a hand-over the run ``spec`` cannot continue without retuning or without changing its
    data: every hyper-parameter equal (GBA's point), the same sample stream, a step within the run.
    Raises HandoverError naming the hand-over and the field."""
    from .config import hyper_parameters

    where = Path(folder) / RECORD
    mine = hyper_parameters(spec)
    for k in sorted(set(mine) | set(rec["hyper_parameters"])):
        if mine.get(k) != rec["hyper_parameters"].get(k):
            raise HandoverError(f"hand-over {where}: hyper-parameter {k!r} is {rec['hyper_parameters'].get(k)!r}, this run "
                                f"has {mine.get(k)!r}; a switch changes no hyper-parameter")
    d, want = rec["data"], data_record(spec, n_train)
    for k in ("events", "events_bytes", "n_train", "local_batch", "seed"):
        if d.get(k) != want[k]:
            raise HandoverError(f"hand-over {where}: data field {k!r} is {d.get(k)!r}, this run has {want[k]!r} "
                                f"(the sample stream would differ)")
    if rec["global_step"] > spec.global_steps(n_train):
        raise HandoverError(f"hand-over {where}: global step {rec['global_step']} is past this run's end "
                            f"({spec.global_steps(n_train)} global steps)")


def load_tables(folder: str | Path, ec, rank: int, world: int) -> None:
    """Load the rows ``key % world == rank`` (every row when world = 1) with their optimizer state,
    bit-exactly, into the plain collection ``ec`` (``ops.sparse.checkpoint.load_sharded``)."""
    from ops.sparse.checkpoint import SparseCheckpointError, load_sharded

    try:
        load_sharded(ec, folder, rank=rank, world=world, prefix=TABLES)
    except SparseCheckpointError as e:
        raise HandoverError(f"hand-over {folder}: {e}") from e


def load_state(folder: str | Path) -> dict:
    """``state.pt``: {"net", "opt", "rng": per worker RNG state or None}."""
    import torch

    return torch.load(Path(folder) / STATE, map_location="cpu", weights_only=True)


def worker_rng(folder: str | Path, worker: int):
    """Worker ``worker``'s saved RNG state (uint8 tensor), or None when the writer had no such worker."""
    rng = load_state(folder)["rng"]
    return rng[worker] if worker < len(rng) else None
