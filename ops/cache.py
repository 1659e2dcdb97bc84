"""The machine-wide cache folder shared by every lake, run and process: content-addressed files that are
expensive to recompute and fixed by their inputs (benchmark embeddings of decontamination's semantic layer,
:class:`ops.curation.decontam.BenchmarkEmbeddingCache`; GBA's encoded CTR data, ``assets/gba.py``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def default_cache_dir() -> Path:
    """Where the shared caches live: ``$CRUCIBLE_CACHE``, else ``<repo>/.data/cache`` in a source checkout, else
    ``<venv>/share/crucible/cache`` (beside the data packages' folder, :mod:`ops.data_packages`).

    Returns a path that may not exist yet (each cache creates its own sub-folder when it first writes)."""
    from ops.data_packages import checkout_root

    env = os.environ.get("CRUCIBLE_CACHE")
    if env:
        return Path(env)
    root = checkout_root()
    return root / ".data" / "cache" if root else Path(sys.prefix) / "share" / "crucible" / "cache"
