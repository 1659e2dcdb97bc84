"""The lake's tables as Delta Lake tables (delta-rs): an open format that Spark, Polars, DuckDB and
Trino read, with optimistic concurrency (a conflicting commit fails) and time travel.
docs/operations.md, "Lake on object storage".
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

from ops.lake.errors import LakeConflictError

if TYPE_CHECKING:
    import polars as pl

DATA_VERSION_KEY = "crucible.data_version"
ROWS_KEY = "crucible.rows"
DTYPES_KEY = "crucible.polars_dtypes"
NO_COLUMNS_KEY = "crucible.no_columns"    # a frame without columns (Delta needs one): stored as one empty column
_NO_COLUMNS_COL = "_crucible_no_columns"
_RESTORED_DTYPES = ("UInt8", "UInt16", "UInt32", "UInt64", "Categorical")
_NO_DATA_CHANGE_OPS = ("VACUUM START", "VACUUM END")
DEFAULT_VACUUM_RETENTION_HOURS = 168      # Delta's delta.deletedFileRetentionDuration default (1 week)


def parquet_data_version(df: pl.DataFrame) -> str:
    """The data version of ``df``: the first 16 hex digits of the SHA-256 of its Parquet encoding
    (zstd, statistics: the bytes ``write_parquet_atomic`` writes, so a table has the same version on
    a local root and in a Delta table; same rows in the same order -> same version)."""
    import io

    buf = io.BytesIO()
    df.write_parquet(buf, compression="zstd", statistics=True)
    return hashlib.sha256(buf.getvalue()).hexdigest()[:16]


def delta_storage_options(root: str, endpoint_url: str = "", region: str = "") -> dict[str, str]:
    """delta-rs storage options for ``root``. For ``s3://``: the endpoint (HTTP allowed only when the
    endpoint is ``http://``, e.g. a loopback moto or MinIO), the region, and ``conditional_put=etag``
    so a commit is a put-if-absent of ``_delta_log/<version>.json`` (S3 and S3-compatible servers
    with conditional writes; no DynamoDB lock table needed). Credentials come from the standard AWS
    chain (environment, web identity, instance role), never from here."""
    opts: dict[str, str] = {}
    if root.split("://", 1)[0] in ("s3", "s3a"):
        opts["conditional_put"] = "etag"
        if endpoint_url:
            opts["AWS_ENDPOINT_URL"] = endpoint_url
            if endpoint_url.startswith("http://"):
                opts["AWS_ALLOW_HTTP"] = "true"
        if region:
            opts["AWS_REGION"] = region
    return opts


class DeltaTables:
    """The lake's tables as Delta Lake tables under ``root`` (``s3://bucket/prefix``, a local folder).

    A table key ``<asset>[/<partition>]/<name>.parquet`` lives at ``<root>/<asset>[/<partition>]/<name>.delta``
    (a Delta table: Parquet files plus ``_delta_log/``). Each write is an overwrite commit carrying
    the data version and row count in its commit info (``crucible.data_version``, ``crucible.rows``);
    a commit is the put-if-absent of the next log entry, so two writers that read the same table
    version cannot both commit: the loser gets ``LakeConflictError`` and nothing of its write is
    visible. Earlier versions stay readable (``read(key, version=n)``) until vacuumed.

    A frame without columns (Delta needs one) is stored as one empty Boolean column and read back
    without it (commit info ``crucible.no_columns``).

    Unsigned integer and Categorical columns (Delta has neither) are stored as Int64 (UInt64: the
    same 64 bits, so values >= 2**63 read negative in other engines) / strings and cast back on read
    (top-level columns; the dtypes are in the commit info ``crucible.polars_dtypes``).

    Args:
        root: the lake root URL or folder.
        storage_options: delta-rs options (``delta_storage_options``).
    """

    def __init__(self, root: str, storage_options: dict[str, str] | None = None):
        self.root = str(root).rstrip("/")
        self.storage_options = dict(storage_options or {})

    def uri(self, key: str) -> str:
        """The table folder of ``key`` (``a/b/data.parquet`` -> ``<root>/a/b/data.delta``). Raises
        ValueError for a key that is not ``*.parquet`` or climbs (``..``)."""
        key = key.strip("/")
        if not key.endswith(".parquet") or any(p in ("", ".", "..") for p in key.split("/")):
            raise ValueError(f"table key {key!r} must be '<asset>[/<partition>]/<name>.parquet'")
        return f"{self.root}/{key[: -len('.parquet')]}.delta"

    def _table(self, key: str, version: int | None = None):
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.uri(key), version=version, storage_options=self.storage_options)
        except TableNotFoundError:
            raise FileNotFoundError(f"{self.uri(key)} is not a Delta table (never committed)") from None

    def exists(self, key: str) -> bool:
        """True when ``key`` has a committed version.

        Note: deltalake 1.6.6's ``is_deltatable`` and ``history`` keep the GIL during their
        requests, so an S3 server running inside the same Python process (moto's
        ``ThreadedMotoServer``) deadlocks them until delta-rs' 180 s retry timeout; run test
        servers as a separate process (tests/test_lake_s3.py)."""
        try:
            self._table(key)
        except FileNotFoundError:
            return False
        return True

    def write(self, df: pl.DataFrame, key: str, read_version: int | None = None) -> tuple[str, str]:
        """Commit ``df`` as the new version of ``key`` (overwrite; the schema may change). With
        ``read_version`` the commit is based on that table version, as a step that read the table
        at that version would be: if anyone committed since, it conflicts. A write whose data
        version equals the current version's commits nothing (the same rows in the same order and
        dtypes are already current: a rerun of an unchanged step leaves the table's files and log
        byte-identical). Returns (table URI, data version).

        Raises:
            LakeConflictError: a concurrent commit won (names the table and the base version).
        """
        from deltalake import CommitProperties, WriterProperties, write_deltalake
        from deltalake.exceptions import CommitFailedError

        import polars as pl

        version = parquet_data_version(df)
        restore = {c: str(t) for c, t in df.schema.items() if str(t) in _RESTORED_DTYPES}
        meta = {DATA_VERSION_KEY: version, ROWS_KEY: str(df.height)}
        if restore:
            meta[DTYPES_KEY] = json.dumps(restore, sort_keys=True)
            df = df.with_columns((pl.col(c).reinterpret(signed=True) if t == "UInt64"      # bits kept: > 2**63 too
                                  else pl.col(c).cast(pl.Int64 if t.startswith("UInt") else pl.String))
                                 for c, t in restore.items())
        if df.width == 0:
            meta[NO_COLUMNS_KEY] = "1"
            df = pl.DataFrame({_NO_COLUMNS_COL: pl.Series([], dtype=pl.Boolean)})
        uri = self.uri(key)
        try:
            if self._commit_info(self._table(key)).get(DATA_VERSION_KEY) == version:
                return uri, version
        except FileNotFoundError:
            pass
        target = self._table(key, read_version) if read_version is not None else uri
        try:
            # one chunk: delta-rs 1.6.6 writes the record batches of a multi-chunk frame out of order
            # zstd, as write_parquet_atomic: delta-rs' default (snappy) makes a text table about 2.4x larger
            write_deltalake(target, df.rechunk().to_arrow(), mode="overwrite", schema_mode="overwrite",
                            storage_options=None if read_version is not None else self.storage_options,
                            writer_properties=WriterProperties(compression="ZSTD"),
                            commit_properties=CommitProperties(custom_metadata=meta))
        except CommitFailedError as e:
            base = f"version {read_version}" if read_version is not None else "the version it read"
            raise LakeConflictError(f"commit to {uri} (based on {base}) lost to a concurrent commit: {e}") from None
        return uri, version

    def read(self, key: str, version: int | None = None) -> pl.DataFrame:
        """The table ``key`` at its current version (or ``version``: time travel). Raises
        FileNotFoundError naming the table when it was never committed."""
        import polars as pl

        dt = self._table(key, version)
        info = self._commit_info(dt)
        if info.get(NO_COLUMNS_KEY):
            return pl.DataFrame()
        df = pl.from_arrow(dt.to_pyarrow_table())
        restore = json.loads(info.get(DTYPES_KEY, "{}"))
        if restore:
            df = df.with_columns((pl.col(c).reinterpret(signed=False) if t == "UInt64" else pl.col(c).cast(getattr(pl, t)))
                                 for c, t in restore.items() if c in df.columns)
        return df

    def schema(self, key: str) -> pl.Schema:
        """The Polars schema of ``key``'s current version as ``read`` returns it (unsigned and
        Categorical dtypes restored), from the Delta log only: no data file is read. Raises
        FileNotFoundError naming the table."""
        import polars as pl

        dt = self._table(key)
        info = self._commit_info(dt)
        if info.get(NO_COLUMNS_KEY):
            return pl.Schema()
        restore = json.loads(info.get(DTYPES_KEY, "{}"))
        stored = pl.scan_delta(dt).collect_schema()
        return pl.Schema({c: getattr(pl, restore[c])() if c in restore else t for c, t in stored.items()})

    @staticmethod
    def _commit_info(dt) -> dict:
        """The commit info of the newest commit that wrote the current data: VACUUM's own commits
        (``VACUUM START`` / ``VACUUM END``, no data change) are skipped, so the data version and
        the dtypes to restore survive a vacuum."""
        limit = 5
        while True:
            hist = dt.history(limit)
            for h in hist:
                if h.get("operation") not in _NO_DATA_CHANGE_OPS:
                    return h
            if len(hist) < limit:
                return hist[0] if hist else {}
            limit *= 4

    def info(self, key: str) -> dict:
        """``{"data_version", "rows", "table_version"}`` of the current version (from the commit
        info; a version committed by another engine is read to compute them). Raises
        FileNotFoundError naming the table."""
        dt = self._table(key)
        info = self._commit_info(dt)
        if DATA_VERSION_KEY in info:
            return {"data_version": info[DATA_VERSION_KEY], "rows": int(info[ROWS_KEY]), "table_version": dt.version()}
        df = self.read(key)
        return {"data_version": parquet_data_version(df), "rows": df.height, "table_version": dt.version()}

    def file_uris(self, key: str) -> list[str]:
        """URLs of the Parquet files of the current version (what DuckDB's ``read_parquet`` reads)."""
        return sorted(self._table(key).file_uris())

    def vacuum(self, table_uri: str, retention_hours: int | None = None, dry_run: bool = False,
               enforce_retention_duration: bool = True) -> list[str]:
        """Delta ``VACUUM`` of the table at ``table_uri`` (a full vacuum: every file the log does not
        reference, a killed writer's uncommitted Parquet files included, and files of versions
        overwritten more than the retention ago), deleting only files older than
        ``retention_hours`` (None: the table's ``delta.deletedFileRetentionDuration``, default 168
        h). Time travel to versions whose files were removed stops working. Returns the paths,
        relative to the table, deleted (or, with ``dry_run``, that would be).

        A retention shorter than the table's configured one is refused unless
        ``enforce_retention_duration`` is False: a writer still uploading for longer than the
        retention would lose its files before its commit (Delta Lake protocol, "VACUUM").

        Raises:
            ValueError: a retention below the table's minimum while enforced, or a negative one
                (names the table).
            FileNotFoundError: no Delta table at ``table_uri``.
        """
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError, TableNotFoundError

        if retention_hours is not None and retention_hours < 0:
            raise ValueError(f"vacuum of {table_uri}: retention_hours must be >= 0, got {retention_hours}")
        try:
            dt = DeltaTable(table_uri, storage_options=self.storage_options)
        except TableNotFoundError:
            raise FileNotFoundError(f"{table_uri} is not a Delta table") from None
        try:
            return sorted(dt.vacuum(retention_hours=retention_hours, dry_run=dry_run,
                                    enforce_retention_duration=enforce_retention_duration, full=True))
        except DeltaError as e:
            if "retention" in str(e).lower():
                raise ValueError(f"vacuum of {table_uri}: {e}; pass a longer retention, or disable the "
                                 "enforcement when no writer is running") from None
            raise


def find_delta_tables(fs, prefix: str) -> list[str]:
    """Filesystem paths (no protocol) of the Delta tables under ``prefix``: the folders that hold a
    ``_delta_log/`` (one listing of every object under ``prefix``), sorted."""
    prefix = prefix.rstrip("/")
    try:
        fs.invalidate_cache(prefix)
        paths = fs.find(prefix)
    except FileNotFoundError:
        return []
    return sorted({p.split("/_delta_log/", 1)[0] for p in paths if "/_delta_log/" in p})

