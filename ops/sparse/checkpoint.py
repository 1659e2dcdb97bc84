"""Checkpoints of dynamic tables: only live rows (IDs, embedding + optimizer state, last-seen step,
pending admission counts), in safetensors; restore is bit-exact (RecIS, arXiv 2509.20883 §3.4)."""

from __future__ import annotations

from pathlib import Path

import torch

from .collection import EmbeddingCollection


def table_tensors(ec: EmbeddingCollection) -> dict[str, torch.Tensor]:
    """Flat tensors of every table's live rows, keyed ``<table>/<field>``."""
    out = {}
    for name, t in ec.tables.items():
        ids, full, seen = t.live()
        pend = sorted(t.sightings.items())
        out.update({
            f"{name}/ids": ids, f"{name}/rows": full.contiguous(), f"{name}/last_seen": seen,
            f"{name}/step": torch.tensor([t.step, t.evicted], dtype=torch.int64),
            f"{name}/sighting_ids": torch.tensor([i for i, _ in pend], dtype=torch.int64),
            f"{name}/sighting_counts": torch.tensor([c for _, c in pend], dtype=torch.int64),
            f"{name}/size_history": torch.tensor(t.size_history, dtype=torch.int64).reshape(-1, 2),
        })
    return out


def save_tables(ec: EmbeddingCollection, path: str | Path) -> Path:
    """Write the live rows of every table to ``path`` (safetensors, written to a temp file then renamed)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    save_file(table_tensors(ec), str(tmp), metadata={"tables": ",".join(ec.tables)})
    tmp.replace(path)
    return path


def load_tables(ec: EmbeddingCollection, path: str | Path) -> None:
    """Restore ``ec``'s tables (built with the same feature specs) from ``save_tables`` output.
    Raises ValueError naming the table when the file does not match (missing table, row width)."""
    from safetensors.torch import load_file

    data = load_file(str(path))
    for name, t in ec.tables.items():
        if f"{name}/ids" not in data:
            raise ValueError(f"checkpoint {path} has no table {name!r}")
        rows = data[f"{name}/rows"]
        if rows.shape[1] != t.width:
            raise ValueError(f"checkpoint {path}: table {name!r} rows are {rows.shape[1]} wide, expected {t.width}")
        fresh = type(t)(t.dim, t.optimizer, t.admission, t.eviction, t.block_rows, t.init_scale, t.seed, t.name)
        t.__dict__.update(fresh.__dict__)
        step, evicted = data[f"{name}/step"].tolist()
        t.step = step
        r = t.insert(data[f"{name}/ids"], rows[:, :t.dim], rows[:, t.dim:])
        for row, seen in zip(r.tolist(), data[f"{name}/last_seen"].tolist()):
            t.last_seen[row] = seen
        t.evicted = evicted
        t.sightings = dict(zip(data[f"{name}/sighting_ids"].tolist(), data[f"{name}/sighting_counts"].tolist()))
        t.size_history = [tuple(x) for x in data[f"{name}/size_history"].tolist()]
