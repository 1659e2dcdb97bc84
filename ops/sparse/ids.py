"""The IDs a sparse table takes and the rows it gives them (RecIS, arXiv 2509.20883 §3.1): validation of ID
batches (:func:`check_ids`, :class:`SparseInputError` naming the feature and the first bad ID) and row
initialisation as a function of (seed, ID) only (:func:`init_rows`, a SplitMix64 counter hash), so that a row's
initial value does not depend on insertion order, process, or shard.
"""

from __future__ import annotations

import numpy as np
import torch

from .data import ID_BITS
from .idmap import MIN_KEY, splitmix64


class SparseInputError(ValueError):
    """Bad IDs or batches given to the sparse engine; the message names the feature."""


def check_ids(ids, feature: str, bits: int = ID_BITS, why: str = "", signed: bool = False) -> torch.Tensor:
    """IDs as int64 (any shape), validated: integer dtype, non-negative, below 2**bits (bits <= 63;
    63 is the whole non-negative int64 range); ``signed``: any int64 from -2**63 + 2 (``MIN_KEY``;
    the two lowest values are the id map's markers) to 2**63 - 1 (``bits`` ignored). Unsigned or
    Python-int input at or above 2**63 is rejected before the cast (it would wrap to a negative
    int64). Raises SparseInputError naming the feature and the first bad id; ``why`` is appended to
    the message (the reason for the limit)."""
    if isinstance(ids, torch.Tensor) and ids.dtype in (torch.uint64, torch.uint32, torch.uint16):
        ids = ids.numpy()
    if not isinstance(ids, torch.Tensor):
        arr = np.asarray(ids)
        if arr.dtype.kind == "O":                       # Python ints beyond int64 and uint64
            lo = MIN_KEY if signed else 0
            big = [x for x in arr.flat if isinstance(x, int) and not lo <= x < 1 << 63]
            if big:
                raise SparseInputError(f"feature {feature!r}: id {big[0]} outside [{lo}, 2**63) (ids are int64){why}")
        if arr.dtype.kind == "u" and arr.size and int(arr.max()) >= 1 << 63:
            bad = int(arr[arr >= np.uint64(1 << 63)].flat[0])
            raise SparseInputError(f"feature {feature!r}: id {bad} outside [0, 2**63) (ids are int64){why}")
        if arr.dtype.kind == "u":
            arr = arr.astype(np.int64)
        try:
            ids = torch.as_tensor(arr)
        except (TypeError, ValueError) as e:
            raise SparseInputError(f"feature {feature!r}: ids must be integers, got {arr.dtype} ({e})") from e
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dtype.is_complex:
        raise SparseInputError(f"feature {feature!r}: ids must be integers, got dtype {ids.dtype}")
    ids = ids.to(torch.int64)
    if signed:
        if ids.numel() and ids.min() < MIN_KEY:
            raise SparseInputError(f"feature {feature!r}: id {int(ids[ids < MIN_KEY][0])} is reserved "
                                   f"(ids are int64 in [-2**63 + 2, 2**63)){why}")
        return ids
    limit = (1 << bits) if bits < 63 else None
    if ids.numel() and (ids.min() < 0 or (limit is not None and ids.max() >= limit)):
        bad = ids[(ids < 0) | ((ids >= limit) if limit is not None else False)][0].item()
        raise SparseInputError(f"feature {feature!r}: id {bad} outside [0, 2**{bits}){why}")
    return ids


INITS = ("uniform", "zeros", "normal", "truncated_normal")
"""Row initialisers: Uniform(-scale, scale) | zeros (RecIS's default) | Normal(0, scale^2) |
Normal(0, scale^2) truncated at +-2 scale (TensorFlow's truncated_normal)."""


def init_rows(ids: torch.Tensor, dim: int, seed: int, scale: float, kind: str = "uniform") -> torch.Tensor:
    """Rows float32 [n, dim] of ids [n] drawn per ``kind`` (``INITS``; ``scale`` the half-width of
    the uniform or the standard deviation of the normals), each value a function of (seed, id,
    column) only. The normals are the inverse normal CDF of the same hashed uniform (one draw per
    value; truncated: the uniform mapped into [Phi(-2), Phi(2)] first). Raises ValueError for an
    unknown ``kind``."""
    if kind not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {kind!r}")
    if kind == "zeros":
        return torch.zeros(len(ids), dim)
    with np.errstate(over="ignore"):
        base = ids.numpy().astype(np.uint64) * np.uint64(0x100000001B3) + np.uint64(seed) * np.uint64(0x2545F4914F6CDD1D)
        x = splitmix64(base[:, None] * np.uint64(1024) + np.arange(dim, dtype=np.uint64)[None, :])
    if kind == "uniform":
        u = (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)
        return torch.from_numpy(((2 * u - 1) * scale).astype(np.float32))
    u = torch.from_numpy(((x >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53))    # in (0, 1)
    if kind == "truncated_normal":
        lo = float(torch.special.ndtr(torch.tensor(-2.0, dtype=torch.float64)))
        u = lo + u * (1 - 2 * lo)
    return (torch.special.ndtri(u) * scale).to(torch.float32)


def _int64s(x) -> np.ndarray:
    """Ids or rows (a torch tensor or array-like, 1-D) as a contiguous int64 numpy array [n]."""
    if isinstance(x, torch.Tensor):
        x = x.detach().to(torch.int64).contiguous().numpy()
    return np.ascontiguousarray(x, dtype=np.int64).reshape(-1)
