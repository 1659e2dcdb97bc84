"""The CTR data every process of a run loads, and the shared sample stream.

Every mode consumes the same stream of training samples: the concatenation of seeded permutations
of the train split (epoch e uses seed + e), cut into local batches of b samples numbered 0, 1, 2, ...
Synchronous global step s covers local batches s*M .. s*M + M - 1 (rank r the r-th W-th of them);
the parameter server hands batch numbers out in order. So with no stragglers and zero staleness a
GBA global step sees exactly the samples of the synchronous one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class CTRData:
    """Encoded train/test tensors: feats are ``{field: (ids int64 [N, L], lengths int64 [N])}``."""

    fields: list[str]
    """Feature names in model order: the feature columns, then the crosses 'a*b'."""
    train: dict
    """Train split features, ``{field: (ids, lengths)}`` over its N rows."""
    y_train: torch.Tensor
    """Train split click labels, float32 [N] in {0, 1}."""
    test: dict
    """Test split features, ``{field: (ids, lengths)}``."""
    y_test: torch.Tensor
    """Test split click labels, float32 in {0, 1}."""

    @property
    def n_train(self) -> int:
        return len(self.y_train)


def load(events_path: str, crosses: list[str], cache_dir: str = "") -> CTRData:
    """Read a CTR events Parquet (``ctr_events``: a ``split`` column, ``click`` label) and encode it
    with ``ops.sparse`` (same fields and IDs as ``ctr_model``). With ``cache_dir`` the encoded tensors
    are kept there (``torch.save``, written atomically), keyed by the file's size, mtime and the
    crosses, so the processes of later runs skip the encoding. Raises FileNotFoundError for a
    missing file and CTRDataError for a bad table."""
    import hashlib

    p = Path(events_path)
    if not p.exists():
        raise FileNotFoundError(f"CTR events not found at {p} (materialize ctr_events first)")
    cached = None
    if cache_dir:
        st = p.stat()
        key = hashlib.sha1(f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}|{sorted(crosses)}".encode()).hexdigest()[:16]
        cached = Path(cache_dir) / f"ctr-{key}.pt"
        if cached.exists():
            d = torch.load(cached, weights_only=True)
            return CTRData(d["fields"], d["train"], d["y_train"], d["test"], d["y_test"])
    import polars as pl

    from ops.sparse.data import feature_columns
    from ops.sparse.train import split_frames, tensors

    events = pl.read_parquet(p)
    train, test = split_frames(events)
    fields = feature_columns(events) + list(crosses)
    y = lambda df: torch.tensor(df["click"].to_numpy(), dtype=torch.float32)  # noqa: E731
    data = CTRData(fields, tensors(train, fields), y(train), tensors(test, fields), y(test))
    if cached is not None:
        from ops.lake import atomic_path

        with atomic_path(cached) as tmp:
            torch.save({"fields": data.fields, "train": data.train, "y_train": data.y_train, "test": data.test,
                        "y_test": data.y_test}, tmp)
    return data


def take(feats: dict, idx: torch.Tensor) -> dict:
    return {k: (ids[idx], lens[idx]) for k, (ids, lens) in feats.items()}


class SampleStream:
    """Local batch number -> sample indices [b] into the train split (see the module docstring)."""

    def __init__(self, n: int, local_batch: int, seed: int):
        if n < 1 or local_batch < 1:
            raise ValueError(f"sample stream needs n >= 1 and local_batch >= 1, got {n}, {local_batch}")
        self.n, self.b, self.seed = n, local_batch, seed
        self._perms: dict[int, torch.Tensor] = {}

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            if len(self._perms) > 4:
                self._perms.pop(min(self._perms))
            self._perms[epoch] = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + epoch))
        return self._perms[epoch]

    def indices(self, batch: int) -> torch.Tensor:
        pos = torch.arange(batch * self.b, (batch + 1) * self.b)
        epochs = pos // self.n
        out = torch.empty(self.b, dtype=torch.int64)
        for e in torch.unique(epochs).tolist():
            m = epochs == e
            out[m] = self._perm(e)[pos[m] % self.n]
        return out

    def batches(self, first: int, count: int) -> torch.Tensor:
        """Indices of local batches first .. first + count - 1, concatenated [count * b]."""
        return torch.cat([self.indices(first + i) for i in range(count)])
