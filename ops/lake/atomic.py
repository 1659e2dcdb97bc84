"""Atomic local writes: the one rename-based writer of the project, and content hashes.

Writes go to a temporary file in the same folder, then ``os.replace`` — a reader never sees a
half-written file and a failed step leaves the previous version in place (docs/operations.md,
"Failure behaviour").
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the atomic writers are stdlib-only: a results JSON is written without polars
    import polars as pl


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish_mode(path: Path, directory: bool = False) -> None:
    """Give a temp file/dir the permissions a normal create would (mkstemp/mkdtemp use 0600/0700)."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def write_parquet_atomic(df: pl.DataFrame, path: str | Path) -> str:
    """Write ``df`` to ``path`` atomically (``atomic_path``). Returns the data version
    (first 16 hex digits of the file's SHA-256; same rows in the same order -> same version)."""
    with atomic_path(path) as tmp:
        df.write_parquet(tmp, compression="zstd", statistics=True)
        version = file_sha256(tmp)[:16]
    return version


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """The one atomic write of the project: yield a temporary path in ``path``'s folder; when the
    block finishes, the temporary file gets the permissions of a normal create and is renamed onto
    ``path`` (``os.replace``); when the block raises, it is removed and ``path`` keeps its previous
    content. A reader sees the old file or the new one, never a half-written one.

    Usage::

        with atomic_path(out / "model.safetensors") as tmp:
            save_file(tensors, str(tmp))
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        _publish_mode(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(obj, path: str | Path, indent: int = 2, *, sort_keys: bool = True, default=str) -> None:
    """Write ``obj`` as JSON atomically (``atomic_path``); keys sorted (``sort_keys``), other values
    through ``default`` (``str``; ``float`` keeps numpy scalars as numbers)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=indent, sort_keys=sort_keys, default=default), encoding="utf-8")


def replace_dir_atomic(build: Path, final: Path) -> None:
    """Swap a fully built directory into place: the old one is renamed aside, then removed.

    Between the two renames ``final`` is briefly absent, never partially written.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    old = final.with_name(f".{final.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(build, final)
    if old.exists():
        shutil.rmtree(old)


def write_hf_dataset(df: pl.DataFrame, final_dir: str | Path, card: str) -> str:
    """Write ``df`` in the Hugging Face ``datasets`` Parquet layout, atomically.

    Layout: ``<final_dir>/data/train-00000-of-00001.parquet`` and ``<final_dir>/README.md`` (the
    dataset card, YAML header with ``configs``). Loadable with
    ``datasets.load_dataset("parquet", data_dir=final_dir)`` or ``load_dataset(final_dir)``.
    Returns the data version of the Parquet file.
    """
    final = Path(final_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{final.name}.build.", dir=final.parent))
    _publish_mode(build, directory=True)
    try:
        version = write_parquet_atomic(df, build / "data" / "train-00000-of-00001.parquet")
        (build / "README.md").write_text(card, encoding="utf-8")
        _publish_mode(build / "data", directory=True)
        replace_dir_atomic(build, final)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    return version

