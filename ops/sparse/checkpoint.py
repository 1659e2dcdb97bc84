"""Checkpoints of dynamic tables: only live rows (keys, embedding + optimizer state, last-seen step,
pending admission counts), in safetensors; restore is bit-exact (RecIS, arXiv 2509.20883 §3.4).
Sharded checkpoints record their sharding in a manifest and load at any world size (docs/sparse.md,
"Checkpoint format and resharding").

One file (``save_tables`` / ``load_tables``): tensors ``<table>/ids`` int64 [n] (table keys, sorted),
``<table>/rows`` float32 [n, width] (embedding [dim] | optimizer slots), ``<table>/last_seen`` int64
[n], ``<table>/step`` int64 [2] (step, rows evicted so far), ``<table>/sighting_ids`` and
``<table>/sighting_counts`` int64 [p] (IDs not yet admitted), ``<table>/sighting_steps`` int64 [p] (the
step each was last sighted in; files written before it existed load with the saved step),
``<table>/size_history`` int64 [h, 2].
The safetensors header metadata records the format, the writer's ``rank`` and ``world_size``, the
sharding rule, each table's layout (dim, width, dtype, features in slot order, optimizer and its
slots, step) and ``data_sha256``, the SHA-256 of the tensor bytes, checked on load.

Sharded (``save_sharded`` / ``save_shard`` + ``write_manifest``, then ``load_sharded``): rank r of W
writes ``<prefix>.rank<r>-of-<W>.safetensors`` (the single-file format, holding the keys with
``key % W == r``) and one writer puts ``<prefix>.manifest.json`` beside them: world size, sharding
rule, table layouts, and per file its rank, bytes, SHA-256 and per table row count, key range,
pending sightings and evictions. Rank r' of a new world W' reads, from every file that can hold a
key it owns (``f ≡ r' mod gcd(W, W')``), the keys with ``key % W' == r'``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

import torch

from .collection import EmbeddingCollection

FORMAT = "crucible.sparse-tables/1"
SHARDING = "key % world_size"
KEYS = ("table key: the feature id in a one-feature table; (slot << 52) | id in a coalesced table, slot = the "
        "feature's index in 'features'")
_FIELDS = ("ids", "rows", "last_seen", "step", "sighting_ids", "sighting_counts", "size_history")


class SparseCheckpointError(ValueError):
    """A sparse checkpoint cannot be read (missing, truncated or corrupt file, bad manifest) or does
    not match the collection it is loaded into; the message names the file or the table."""


def table_tensors(ec: EmbeddingCollection) -> dict[str, torch.Tensor]:
    """Flat tensors of every table's live rows, keyed ``<table>/<field>``."""
    out = {}
    for name, t in ec.tables.items():
        ids, full, seen = t.live()
        pend = sorted(t.sightings.items())
        last = t.pending.last_sighted()
        out.update({
            f"{name}/ids": ids, f"{name}/rows": full.contiguous(), f"{name}/last_seen": seen,
            f"{name}/step": torch.tensor([t.step, t.evicted], dtype=torch.int64),
            f"{name}/sighting_ids": torch.tensor([i for i, _ in pend], dtype=torch.int64),
            f"{name}/sighting_counts": torch.tensor([c for _, c in pend], dtype=torch.int64),
            f"{name}/sighting_steps": torch.tensor([last[i] for i, _ in pend], dtype=torch.int64),
            f"{name}/size_history": torch.tensor(t.size_history, dtype=torch.int64).reshape(-1, 2),
        })
    return out


def shard_of(ec: EmbeddingCollection) -> tuple[int, int]:
    """(rank, world size) of a collection: its exchanger's for a ShardedEmbeddingCollection, else (0, 1)."""
    x = getattr(ec, "x", None)
    return (x.rank, x.world) if x is not None else (0, 1)


def _rank_world(ec: EmbeddingCollection, rank: int | None, world: int | None, caller: str,
                verb: str) -> tuple[int, int]:
    """The (rank, world) a sharded save or load acts as: the given ones, each defaulting to the
    collection's (``shard_of``). Raises ValueError naming ``caller`` when they contradict a sharded
    collection's or the rank is outside ``[0, world)``."""
    mine = shard_of(ec)
    rank = mine[0] if rank is None else rank
    world = mine[1] if world is None else world
    if getattr(ec, "x", None) is not None and (rank, world) != mine:
        raise ValueError(f"{caller}: the collection is rank {mine[0]} of {mine[1]}, asked to {verb} as rank {rank} of {world}")
    if not 0 <= rank < world:
        raise ValueError(f"{caller}: rank {rank} outside [0, {world})")
    return rank, world


def table_layout(ec: EmbeddingCollection) -> dict:
    """Per table: dim, width, dtype, id_dtype, key_bits, features (slot order), optimizer {name,
    params, slots [[name, width], ...]} and step. What a checkpoint records and a load checks."""
    out = {}
    for name, t in ec.tables.items():
        opt = t.optimizer
        dtype = t.blocks[0].dtype if t.blocks else torch.get_default_dtype()
        out[name] = {"dim": t.dim, "width": t.width, "dtype": str(dtype).removeprefix("torch."), "id_dtype": "int64",
                     "key_bits": ec.key_bits(name), "features": ec.features_of(name), "step": t.step,
                     "optimizer": {"name": type(opt).__name__,
                                   "params": dataclasses.asdict(opt) if dataclasses.is_dataclass(opt) else {},
                                   "slots": [list(s) for s in opt.slots(t.dim)] if hasattr(opt, "slots") else []}}
    return out


def _header(raw: bytes, path: Path) -> tuple[dict, bytes]:
    """(metadata, tensor bytes) of a safetensors file's bytes; raises SparseCheckpointError naming ``path``."""
    try:
        n = int.from_bytes(raw[:8], "little")
        if len(raw) < 8 or 8 + n > len(raw):
            raise ValueError(f"header of {n} bytes in a {len(raw)}-byte file")
        header = json.loads(raw[8:8 + n])
    except (ValueError, UnicodeDecodeError) as e:
        raise SparseCheckpointError(f"sparse checkpoint file {path} is truncated or not safetensors ({e})") from e
    return header.get("__metadata__") or {}, raw[8 + n:]


def _serialise(ec: EmbeddingCollection, rank: int, world: int) -> tuple[bytes, dict]:
    from safetensors.torch import save

    tensors = table_tensors(ec)
    meta = {"tables": ",".join(ec.tables), "format": FORMAT, "rank": str(rank), "world_size": str(world),
            "sharding": SHARDING, "layout": json.dumps(table_layout(ec), sort_keys=True)}
    _, data = _header(save(tensors, metadata=meta), Path("<memory>"))
    digest = hashlib.sha256(data).hexdigest()
    return save(tensors, metadata={**meta, "data_sha256": digest}), {"sha256": digest, "tensors": tensors}


def _write(ec: EmbeddingCollection, path: Path, rank: int, world: int) -> dict:
    from ops.lake import atomic_path

    raw, info = _serialise(ec, rank, world)
    with atomic_path(path) as tmp:
        tmp.write_bytes(raw)
    tensors = info["tensors"]
    tables = {}
    for name in ec.tables:
        ids = tensors[f"{name}/ids"]
        tables[name] = {"rows": len(ids), "id_min": int(ids[0]) if len(ids) else None,
                        "id_max": int(ids[-1]) if len(ids) else None,
                        "sightings": len(tensors[f"{name}/sighting_ids"]), "evicted": int(tensors[f"{name}/step"][1])}
    return {"rank": rank, "world_size": world, "file": path.name, "bytes": len(raw), "sha256": info["sha256"],
            "tables": tables, "layout": table_layout(ec)}


def save_tables(ec: EmbeddingCollection, path: str | Path) -> Path:
    """Write the live rows of every table to ``path`` (one safetensors file, atomically; the header
    records the collection's rank and world size, see the module docstring). Returns ``path``."""
    path = Path(path)
    rank, world = shard_of(ec)
    _write(ec, path, rank, world)
    return path


def _read(path: Path, expect_sha: str | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """(metadata, tensors) of one table file, its data checked against its recorded SHA-256 (and
    ``expect_sha``, the manifest's). Raises SparseCheckpointError naming the file."""
    from safetensors.torch import load

    if not path.is_file():
        raise SparseCheckpointError(f"sparse checkpoint file {path} is missing")
    raw = path.read_bytes()
    meta, data = _header(raw, path)
    digest = hashlib.sha256(data).hexdigest() if ("data_sha256" in meta or expect_sha) else None
    for want, what in ((meta.get("data_sha256"), "its header"), (expect_sha, "the manifest")):
        if want is not None and digest != want:
            raise SparseCheckpointError(f"sparse checkpoint file {path} is corrupt: SHA-256 of its data {digest} != {want} "
                                        f"recorded in {what}")
    try:
        return meta, load(raw)
    except Exception as e:  # safetensors raises its own SafetensorError
        raise SparseCheckpointError(f"sparse checkpoint file {path} cannot be read ({e})") from e


def _check_layout(name: str, t, ec: EmbeddingCollection, saved: dict | None, where: Path) -> None:
    """Raise SparseCheckpointError naming the table when ``saved`` (a table's recorded layout) does
    not fit table ``name`` of ``ec``: features (slot order), dim, width, optimizer, slots."""
    if saved is None:
        raise SparseCheckpointError(f"checkpoint {where} has no table {name!r}")
    here = table_layout(ec)[name]
    so, ho = saved.get("optimizer", {}), here["optimizer"]
    if so and (so.get("name"), so.get("slots")) != (ho["name"], ho["slots"]):
        raise SparseCheckpointError(f"checkpoint {where}: table {name!r} holds {so.get('name')} state {so.get('slots')}, "
                                    f"this collection's optimizer is {ho['name']} with {ho['slots']}")
    for key in ("features", "dim", "width"):
        if saved.get(key, here[key]) != here[key]:
            raise SparseCheckpointError(f"checkpoint {where}: table {name!r} has {key} {saved[key]}, this collection's has "
                                        f"{here[key]} (build it with the same feature specs)")


def _reset(t) -> None:
    fresh = type(t)(t.dim, t.optimizer, t.admission, t.eviction, t.block_rows, t.init_scale, t.seed, t.name,
                    init=getattr(t, "init", "uniform"))
    t.__dict__.update(fresh.__dict__)


def _fill(t, ids, rows, seen, sightings: dict, step: int, evicted: int, history, sighting_steps: dict | None = None) -> None:
    """Reset table ``t`` and give it exactly these live rows (ids [n] unique) and counters
    (``sighting_steps``: {id: last sighting step} of the pending ids; None = the loaded step)."""
    _reset(t)
    t.step = step
    r = t.insert(ids, rows[:, :t.dim], rows[:, t.dim:])
    t.seen_step[r.numpy()] = seen.numpy()
    t.evicted = evicted
    t.sightings = sightings
    if sighting_steps is not None and len(sightings):
        keys = list(sightings)
        t.pending.load(keys, [sightings[k] for k in keys], [sighting_steps.get(k, step) for k in keys])
    t.size_history = [tuple(x) for x in history]


def load_tables(ec: EmbeddingCollection, path: str | Path) -> None:
    """Restore ``ec``'s tables (built with the same feature specs) from ``save_tables`` output,
    bit-exactly. Raises SparseCheckpointError (a ValueError) naming the file when it is missing,
    truncated or corrupt, or holds another shard (rank/world size) than ``ec``'s — load a sharded
    checkpoint at another world size with ``load_sharded`` — and naming the table when it does not
    match (missing table, features, row width, optimizer)."""
    path = Path(path)
    meta, data = _read(path)
    if "world_size" in meta:
        saved, mine = (int(meta["rank"]), int(meta["world_size"])), shard_of(ec)
        if saved != mine:
            raise SparseCheckpointError(
                f"checkpoint {path} holds shard rank {saved[0]} of {saved[1]} ({SHARDING}); this collection is rank {mine[0]} "
                f"of {mine[1]}: loading it would drop or misplace ids. Load a sharded checkpoint at another world size with "
                f"ops.sparse.checkpoint.load_sharded (it needs the folder's manifest)")
    layout = json.loads(meta["layout"]) if "layout" in meta else {}
    for name, t in ec.tables.items():
        if f"{name}/ids" not in data:
            raise SparseCheckpointError(f"checkpoint {path} has no table {name!r}")
        rows = data[f"{name}/rows"]
        if rows.shape[1] != t.width:
            raise SparseCheckpointError(f"checkpoint {path}: table {name!r} rows are {rows.shape[1]} wide, expected {t.width}")
        if layout:
            _check_layout(name, t, ec, layout.get(name), path)
    for name, t in ec.tables.items():
        step, evicted = data[f"{name}/step"].tolist()
        _fill(t, data[f"{name}/ids"], data[f"{name}/rows"], data[f"{name}/last_seen"],
              dict(zip(data[f"{name}/sighting_ids"].tolist(), data[f"{name}/sighting_counts"].tolist())),
              step, evicted, data[f"{name}/size_history"].tolist(),
              dict(zip(data[f"{name}/sighting_ids"].tolist(), data[f"{name}/sighting_steps"].tolist()))
              if f"{name}/sighting_steps" in data else None)


# -- sharded checkpoints ------------------------------------------------------------------------------

def shard_file(prefix: str, rank: int, world: int) -> str:
    """File name of rank ``rank``'s shard of a ``world``-rank checkpoint."""
    return f"{prefix}.rank{rank:05d}-of-{world:05d}.safetensors"


def manifest_path(folder: str | Path, prefix: str = "tables") -> Path:
    """``<folder>/<prefix>.manifest.json``: the manifest of a sharded save (``save_sharded``)."""
    return Path(folder) / f"{prefix}.manifest.json"


def save_shard(ec: EmbeddingCollection, folder: str | Path, rank: int | None = None, world: int | None = None,
               prefix: str = "tables") -> dict:
    """Write this rank's shard (``shard_file``) into ``folder`` atomically and return its manifest
    entry (rank, file, bytes, sha256, per table rows / id_min / id_max / sightings / evicted).
    ``rank``/``world`` default to the collection's (``shard_of``). Raises ValueError when they
    contradict a sharded collection's, or when a table holds a key another rank owns."""
    rank, world = _rank_world(ec, rank, world, "save_shard", "save")
    for name, t in ec.tables.items():
        keys = t.id_by_row[t.live_rows()]                       # insertion order
        foreign = keys[keys % world != rank].tolist()
        if foreign:
            raise ValueError(f"save_shard: table {name!r} holds key {foreign[0]}, owned by rank {foreign[0] % world} of {world} "
                             f"({SHARDING}), not {rank}")
    return _write(ec, Path(folder) / shard_file(prefix, rank, world), rank, world)


def write_manifest(folder: str | Path, entries: list[dict], prefix: str = "tables") -> Path:
    """Write ``<prefix>.manifest.json`` (atomically) for the shards whose ``save_shard`` entries are
    given, once every rank has written: format, world_size, sharding, key, tables (layouts), files
    (by rank). Raises ValueError when the entries do not cover ranks 0..W-1 of one world size W or
    their table layouts differ."""
    from ops.lake import write_json_atomic

    if not entries:
        raise ValueError("write_manifest: no shard entries")
    world = entries[0]["world_size"]
    entries = sorted(entries, key=lambda e: e["rank"])
    if [e["rank"] for e in entries] != list(range(world)) or any(e["world_size"] != world for e in entries):
        raise ValueError(f"write_manifest: entries cover ranks {[e['rank'] for e in entries]} of world sizes "
                         f"{sorted({e['world_size'] for e in entries})}, expected ranks 0..{world - 1} of {world}")
    layout = entries[0]["layout"]
    for e in entries[1:]:
        if e["layout"] != layout:
            raise ValueError(f"write_manifest: rank {e['rank']}'s tables differ from rank 0's ({e['layout']} vs {layout})")
    path = manifest_path(folder, prefix)
    write_json_atomic({"format": FORMAT, "world_size": world, "sharding": SHARDING, "key": KEYS, "tables": layout,
                       "files": [{k: v for k, v in e.items() if k not in ("layout", "world_size")} for e in entries]},
                      path, indent=1)
    return path


def save_sharded(ec: EmbeddingCollection, folder: str | Path, prefix: str = "tables") -> Path:
    """Save every rank's shard and the manifest into ``folder``; returns the manifest path. On a
    ShardedEmbeddingCollection this is a collective over its process group (every rank calls it:
    each writes its file, rank 0 gathers the entries and writes the manifest, all wait for it); a
    plain collection saves as rank 0 of 1."""
    entry = save_shard(ec, folder, prefix=prefix)
    x = getattr(ec, "x", None)
    if x is None or x.world == 1:
        return write_manifest(folder, [entry], prefix)
    import torch.distributed as dist

    entries = [None] * x.world
    dist.all_gather_object(entries, entry, group=x.group)
    if x.rank == 0:
        write_manifest(folder, entries, prefix)
    dist.barrier(group=x.group)
    return manifest_path(folder, prefix)


def read_manifest(folder: str | Path, prefix: str = "tables") -> dict:
    """The manifest of a sharded checkpoint. Raises SparseCheckpointError naming it when missing,
    not JSON, of another format, or inconsistent (files not ranks 0..W-1)."""
    path = manifest_path(folder, prefix)
    if not path.is_file():
        raise SparseCheckpointError(f"sparse checkpoint manifest {path} is missing (written by save_sharded/write_manifest "
                                    f"after every rank saved)")
    try:
        m = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SparseCheckpointError(f"sparse checkpoint manifest {path} is not valid JSON ({e})") from e
    if m.get("format") != FORMAT or m.get("sharding") != SHARDING:
        raise SparseCheckpointError(f"sparse checkpoint manifest {path}: format {m.get('format')!r}, sharding "
                                    f"{m.get('sharding')!r}; expected {FORMAT!r}, {SHARDING!r}")
    world = m.get("world_size")
    if not isinstance(world, int) or [f.get("rank") for f in m.get("files", [])] != list(range(world)):
        raise SparseCheckpointError(f"sparse checkpoint manifest {path}: files {[f.get('rank') for f in m.get('files', [])]} "
                                    f"do not cover ranks 0..{world}-1")
    return m


def load_sharded(ec: EmbeddingCollection, folder: str | Path, rank: int | None = None, world: int | None = None,
                 prefix: str = "tables") -> None:
    """Load a sharded checkpoint (saved at any world size W) into rank ``rank`` of ``world``: every
    table gets exactly the keys it owns (``key % world == rank``), with bit-exact rows (embedding and
    optimizer slots), last-seen steps and pending sightings; evicted IDs stay absent. ``rank`` and
    ``world`` default to the collection's (``shard_of``); not a collective.

    Counters: the step is the saved one (equal on every file). At ``world == W`` the rank's evicted
    count and size history are its file's; otherwise rank 0 takes the total evicted count (so the sum
    over ranks is kept) and the size history restarts at ``[(step, rows loaded)]``.

    Raises SparseCheckpointError naming the manifest (missing, bad), a rank file (missing, size or
    SHA-256 not as recorded, truncated, a key another rank owns, step differing) or a table that
    does not match the collection (features, dim, width, optimizer)."""
    folder = Path(folder)
    rank, world = _rank_world(ec, rank, world, "load_sharded", "load")
    m = read_manifest(folder, prefix)
    W, mpath = m["world_size"], manifest_path(folder, prefix)
    for f in m["files"]:                                   # every file there, at its recorded size
        p = folder / f["file"]
        if not p.is_file():
            raise SparseCheckpointError(f"sparse checkpoint file {p} (rank {f['rank']} of {W}, listed in {mpath}) is missing")
        if p.stat().st_size != f["bytes"]:
            raise SparseCheckpointError(f"sparse checkpoint file {p} has {p.stat().st_size} bytes, {mpath} records {f['bytes']}")
    for name, t in ec.tables.items():
        _check_layout(name, t, ec, m["tables"].get(name), mpath)
    g = math.gcd(W, world)
    parts: dict[str, list] = {name: [] for name in ec.tables}
    steps = {name: m["tables"][name]["step"] for name in ec.tables}
    for f in m["files"]:
        if (f["rank"] - rank) % g:
            continue                                       # holds no key this rank owns (CRT)
        p = folder / f["file"]
        meta, data = _read(p, f["sha256"])
        if (meta.get("rank"), meta.get("world_size")) != (str(f["rank"]), str(W)):
            raise SparseCheckpointError(f"sparse checkpoint file {p} says rank {meta.get('rank')} of {meta.get('world_size')}, "
                                        f"{mpath} lists it as rank {f['rank']} of {W}")
        for name, t in ec.tables.items():
            if any(f"{name}/{k}" not in data for k in _FIELDS):
                raise SparseCheckpointError(f"sparse checkpoint file {p} has no table {name!r}")
            ids, rows = data[f"{name}/ids"], data[f"{name}/rows"]
            if rows.shape != (len(ids), t.width):
                raise SparseCheckpointError(f"sparse checkpoint file {p}: table {name!r} rows {tuple(rows.shape)}, expected "
                                            f"({len(ids)}, {t.width})")
            if len(ids) != f["tables"][name]["rows"]:
                raise SparseCheckpointError(f"sparse checkpoint file {p}: table {name!r} has {len(ids)} rows, {mpath} records "
                                            f"{f['tables'][name]['rows']}")
            if len(ids) and (ids % W != f["rank"]).any():
                bad = int(ids[ids % W != f["rank"]][0])
                raise SparseCheckpointError(f"sparse checkpoint file {p}: table {name!r} holds key {bad}, which rank "
                                            f"{bad % W} of {W} owns, not {f['rank']}")
            step = int(data[f"{name}/step"][0])
            if step != steps[name]:
                raise SparseCheckpointError(f"sparse checkpoint file {p}: table {name!r} is at step {step}, {mpath} records "
                                            f"{steps[name]}")
            sel = ids % world == rank
            sid, scount = data[f"{name}/sighting_ids"], data[f"{name}/sighting_counts"]
            ssel = sid % world == rank
            ssteps = data.get(f"{name}/sighting_steps", torch.full_like(sid, step))
            parts[name].append((ids[sel], rows[sel], data[f"{name}/last_seen"][sel], sid[ssel], scount[ssel],
                                int(data[f"{name}/step"][1]), data[f"{name}/size_history"], ssteps[ssel]))
    for name, t in ec.tables.items():
        ps = parts[name]
        ids = torch.cat([q[0] for q in ps])
        order = torch.argsort(ids)
        ids = ids[order]
        if len(ids) > 1 and (ids[1:] == ids[:-1]).any():
            dup = int(ids[1:][ids[1:] == ids[:-1]][0])
            raise SparseCheckpointError(f"sparse checkpoint {mpath}: table {name!r} key {dup} is in more than one rank file")
        rows = torch.cat([q[1] for q in ps])[order]
        seen = torch.cat([q[2] for q in ps])[order]
        sightings = dict(sorted(zip(torch.cat([q[3] for q in ps]).tolist(), torch.cat([q[4] for q in ps]).tolist())))
        if world == W:
            evicted, history = ps[0][5], ps[0][6].tolist()
        else:
            evicted = sum(f["tables"][name]["evicted"] for f in m["files"]) if rank == 0 else 0
            history = [(steps[name], len(ids))]
        _fill(t, ids, rows, seen, sightings, steps[name], evicted, history,
              dict(zip(torch.cat([q[3] for q in ps]).tolist(), torch.cat([q[7] for q in ps]).tolist())))
