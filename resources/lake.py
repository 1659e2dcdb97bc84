"""The lake resource: table paths under ``CRUCIBLE_HOME`` or an object store, atomic writes, and the
DuckDB catalog (docs/operations.md, "The DuckDB catalog" and "Lake on object storage")."""


import functools
import json
import os
import re
import time
from pathlib import Path

import dagster as dg
import polars as pl

from ops import lake

from ops.docstrings import describe_fields

_RAISE = object()
_SNAPSHOT = re.compile(r"(?P<stem>.+)\.(?P<version>[0-9a-f]{16})\.parquet")   # table_path's <stem>.<data version>.parquet


def _last_handed_out(p: Path) -> float:
    """When the snapshot ``p`` was last handed out (or written): the later of its access and modification
    times (``table_path`` sets the access time on each hand-out and never the modification time, which
    workers' run fingerprints read, e.g. ``ops.gba.checkpoint.fingerprint``)."""
    try:
        st = p.stat()
    except FileNotFoundError:                # removed meanwhile (another pruner): never older than a cutoff
        return float("inf")
    return max(st.st_atime, st.st_mtime)


def default_root() -> str:
    return os.environ.get("CRUCIBLE_HOME", str(Path.cwd() / ".crucible"))


@functools.lru_cache(maxsize=16)
def _object_store(root: str, endpoint_url: str, region: str, keep_versions: int, orphan_grace_s: float) -> "lake.ObjectStoreLake":
    opts: dict = {}
    scheme = root.split("://", 1)[0]
    if scheme in ("s3", "s3a"):
        opts["use_listings_cache"] = False       # partition listings must see other writers' commits
        if endpoint_url:
            opts["endpoint_url"] = endpoint_url
        if region:
            opts["client_kwargs"] = {"region_name": region}
    elif endpoint_url or region:
        raise ValueError(f"lake.endpoint_url / lake.region apply to s3:// roots only, not {root!r}")
    try:
        return lake.ObjectStoreLake(root, opts, keep_versions=keep_versions, orphan_grace_s=orphan_grace_s)
    except ImportError as e:
        raise ImportError(f"lake root {root!r} needs the fsspec backend for {scheme}:// "
                          f"(s3: pip install \"crucible[prod]\", which brings s3fs): {e}") from e


@functools.lru_cache(maxsize=16)
def _delta_tables(root: str, endpoint_url: str, region: str) -> "lake.DeltaTables":
    return lake.DeltaTables(root, lake.delta_storage_options(root, endpoint_url, region))


@describe_fields  # the attribute docstrings are the UI descriptions
class LakeResource(dg.ConfigurableResource):
    """Delta Lake tables under ``root`` (one folder per asset and partition) and a DuckDB catalog with
    one view per asset.

    Tables, on both kinds of root, are Delta Lake tables ``<root>/<asset>[/<partition>]/<name>.delta``
    for the table key ``<name>.parquet`` (``ops.lake.DeltaTables``: an open format that Polars,
    DuckDB, Spark and Trino read; a concurrent commit conflicts with ``ops.lake.LakeConflictError``;
    earlier versions readable by ``read(..., version=n)``; ``vacuum`` removes unreferenced files).
    The data version is the content hash of the table's Parquet encoding, the same in both.

    Two kinds of root:

    - a local folder (default ``$CRUCIBLE_HOME`` or ``./.crucible``): other files (JSON, dataset
      folders) at ``<root>/<asset>[/<partition>]/<name>``, written to a temporary file and renamed
      (``ops.lake.atomic_path``); the catalog is ``<root>/catalog.duckdb``; ``base`` and ``path`` are
      in the lake. A table left by an earlier Crucible as one plain Parquet file
      (``<name>.parquet``) is not read: reading it raises ``ops.lake.LegacyTableError`` (a
      FileNotFoundError) naming the file and the fix (rematerialize the asset).
    - an object store (``s3://bucket/prefix``): JSON
      files and dataset folders are committed without rename (``ops.lake.ObjectStoreLake``: the new
      version's objects under a version-unique key, then the manifest ``_latest/<name>.json`` by a
      conditional PUT, so a concurrent commit conflicts there too). ``base`` and ``path`` then name the POSIX working folder ``work_dir`` (caches, run
      folders, checkpoints: files that need rename, SQLite or mmap), and the catalog is
      ``<work_dir>/catalog.duckdb`` (never on the object store).
    """

    root: str = ""
    """Lake root folder or object-store URL; empty = ``$CRUCIBLE_HOME`` or ``./.crucible``."""
    catalog_lock_timeout_s: float = 5.0
    """How long to retry while another process holds the catalog's lock (s); then the view refresh is
    skipped with a warning (the data is already written)."""
    endpoint_url: str = ""
    """S3-compatible endpoint (MinIO, Ceph RGW, a loopback moto server); empty = AWS. Credentials come
    from the standard AWS chain (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, a profile, IRSA, an
    instance role), never from config."""
    region: str = ""
    """S3 region; empty = the AWS chain's (``AWS_REGION`` / ``AWS_DEFAULT_REGION``)."""
    work_dir: str = ""
    """Object-store roots only: the POSIX working folder; empty = ``$CRUCIBLE_HOME`` or ``./.crucible``."""
    catalog: str = ""
    """The DuckDB catalog file; empty = ``<root>/catalog.duckdb`` (local root) or
    ``<work_dir>/catalog.duckdb`` (object store)."""
    keep_versions: int = 2
    """Object stores: committed versions kept per table (>= 1; 2 = current and previous)."""
    orphan_grace_s: float = 3600.0
    """Object stores: an uncommitted upload (a killed write) older than this (s; >= 0) is deleted by the
    next commit of the same table."""
    snapshot_grace_s: float = 3600.0
    """Worker snapshots (``table_path``, under ``<base>/.lake-tables/``) of a table version that is no
    longer current are deleted once no one has been handed them for this long (s; >= 0): by the next
    ``table_path`` of the same table, and by ``vacuum``."""

    # -- where things are ------------------------------------------------------------------------
    @property
    def remote(self) -> bool:
        """True when ``root`` is an object-store URL."""
        return lake.is_object_store(self.root)

    @property
    def store(self) -> "lake.ObjectStoreLake":
        """The object store of an object-store root. Raises ValueError for a local root."""
        if not self.remote:
            raise ValueError(f"lake root {self.root or default_root()!r} is a local folder, not an object store")
        return _object_store(self.root.rstrip("/"), self.endpoint_url, self.region, self.keep_versions, self.orphan_grace_s)

    @property
    def tables(self) -> "lake.DeltaTables":
        """The Delta tables of the root (a local root: Delta tables in its folder ``base``)."""
        if not self.remote:
            return _delta_tables(str(self.base), "", "")
        return _delta_tables(self.root.rstrip("/"), self.endpoint_url, self.region)

    @property
    def base(self) -> Path:
        """The local lake root; for an object-store root, the POSIX working folder ``work_dir``."""
        if self.remote:
            return Path(self.work_dir or default_root()).expanduser().resolve()
        return Path(self.root or default_root()).expanduser().resolve()

    @property
    def catalog_path(self) -> Path:
        """The DuckDB catalog file (local disk in both modes)."""
        return Path(self.catalog).expanduser().resolve() if self.catalog else self.base / "catalog.duckdb"

    def path(self, asset: str, partition: str | None = None, name: str = "data.parquet") -> Path:
        """Path of a table: ``<root>/<asset>[/<partition>]/<name>`` (object store: under ``work_dir``,
        for files that are not committed to the store)."""
        p = self.base / asset
        return (p / partition / name) if partition else (p / name)

    @staticmethod
    def _key(asset: str, partition: str | None = None, name: str = "data.parquet") -> str:
        return f"{asset}/{partition}/{name}" if partition else f"{asset}/{name}"

    def location(self, asset: str, partition: str | None = None, name: str = "data.parquet") -> str:
        """Where a table is, for messages and metadata: its Delta table's folder or URL (a
        ``*.parquet`` name), or the file's path (local root) or logical URL (object store)."""
        key = self._key(asset, partition, name)
        if name.endswith(".parquet"):
            return self.tables.uri(key)
        return self.store.location(key) if self.remote else str(self.path(asset, partition, name))

    def _missing(self, asset: str, partition: str | None, name: str) -> FileNotFoundError:
        """The error for a table without a committed Delta version: ``ops.lake.LegacyTableError``
        naming the file and the fix on a local root where a table of the pre-Delta layout (one
        plain Parquet file) is, else FileNotFoundError naming the table."""
        what = f"{asset}[{partition}]" if partition else asset
        uri = self.tables.uri(self._key(asset, partition, name))
        legacy = None if self.remote else self.path(asset, partition, name)
        if legacy is not None and legacy.is_file():
            return lake.LegacyTableError(
                f"{legacy} is a table in the pre-Delta local layout (one plain Parquet file); this lake stores "
                f"tables as Delta tables ({uri}): rematerialize {what} (its data version stays the same when its "
                f"rows do), then delete {legacy}")
        return FileNotFoundError(f"{what} has no committed table at {uri}: materialize {what} first")

    # -- tables ----------------------------------------------------------------------------------
    def write(self, df: pl.DataFrame, asset: str, partition: str | None = None, name: str = "data.parquet",
              refresh: bool = True, read_version: int | None = None) -> tuple[Path | str, str]:
        """Commit a table (one Delta overwrite commit); make sure the asset's catalog view exists.
        Returns (location, data_version): the Delta table's folder (a Path, local root) or URL
        (object store).

        ``read_version``: the table version this write is based on; the commit conflicts when
        another one landed since. Without it a commit still conflicts with one that lands between
        this writer's read of the log and its own commit. Rows equal to the current version's
        (same data version) commit nothing.

        Raises:
            ops.lake.LakeConflictError: a concurrent commit won (nothing of this write is visible).
            ValueError: ``name`` is not ``*.parquet``.
        """
        target, version = self.tables.write(df, self._key(asset, partition, name), read_version=read_version)
        if not self.remote:
            target = Path(target)
        if name == "data.parquet" and refresh:
            self.refresh_view(asset, partitioned=partition is not None)
        return target, version

    def read(self, asset: str, partition: str | None = None, name: str = "data.parquet",
             version: int | None = None) -> pl.DataFrame:
        """Read a table: its current version, or Delta table version ``version`` (time travel).
        Raises FileNotFoundError naming the asset when it was never materialized (local root: naming
        a pre-Delta Parquet file found in its place, and the fix)."""
        try:
            return self.tables.read(self._key(asset, partition, name), version)
        except FileNotFoundError:
            raise self._missing(asset, partition, name) from None

    def table_path(self, asset: str, partition: str | None = None, name: str = "data.parquet") -> Path:
        """A local Parquet file of the table's current version, for a worker process that opens a
        path (a ``torchrun`` / Ray worker, a subprocess; workers read it with Polars): a snapshot
        of the committed Delta version under ``base`` (local root: the lake folder; object store:
        ``work_dir``), ``<base>/.lake-tables/<asset>[/<partition>]/<stem>.<data version>.parquet``,
        written once per version (the Parquet bytes whose SHA-256 prefix is the data version:
        checked) and reused by that content hash while the version is current. A snapshot, not the
        Delta folder: a worker reads one plain file with the dtypes Crucible wrote (unsigned and
        categorical columns restored), and a commit landing during its run does not change what it
        reads.

        Snapshots do not accumulate: each hand-out sets the file's access time (never its
        modification time, which run fingerprints read), and
        writing a new version's snapshot deletes the table's snapshots of other versions not handed
        out for ``snapshot_grace_s`` (a worker started within the grace keeps its file); ``vacuum``
        removes the rest (``prune_snapshots``).

        Raises:
            FileNotFoundError: the table was never materialized (names it).
            OSError: the copy's content hash differs from the committed data version.
        """
        key = self._key(asset, partition, name)
        try:
            info = self.tables.info(key)
        except FileNotFoundError:
            raise self._missing(asset, partition, name) from None
        stem = name[: -len(".parquet")] if name.endswith(".parquet") else name
        folder = self.base / ".lake-tables" / asset / (partition or "")
        dest = folder / f"{stem}.{info['data_version']}.parquet"
        if dest.exists():
            try:   # handed out now: the grace of a later prune counts from here. Only the access time: the
                # modification time stays the write's, so a worker's fingerprint of (path, size, mtime) is the
                # same on a retried launch (a touched mtime made GBA's resume discard its checkpoints)
                os.utime(dest, ns=(time.time_ns(), dest.stat().st_mtime_ns))
            except OSError:
                pass
            return dest
        version = lake.write_parquet_atomic(self.tables.read(key, info["table_version"]), dest)
        if version != info["data_version"]:
            dest.unlink(missing_ok=True)
            raise OSError(f"{self.tables.uri(key)} version {info['table_version']}: the local copy hashes to {version}, "
                          f"the commit says {info['data_version']}")
        cutoff = time.time() - self.snapshot_grace_s
        for old in folder.iterdir():
            m = _SNAPSHOT.fullmatch(old.name)
            if old != dest and m and m["stem"] == stem and _last_handed_out(old) < cutoff:
                old.unlink(missing_ok=True)
        return dest

    def prune_snapshots(self, grace_s: float | None = None, dry_run: bool = False) -> list[str]:
        """Delete the worker snapshots under ``<base>/.lake-tables/`` (``table_path``) that are not
        of their table's current version (an older version, or a table that no longer has a
        committed version) and were last handed out more than ``grace_s`` ago (None:
        ``snapshot_grace_s``), and leftover temporary files of a killed snapshot write older than
        that. Snapshots of current versions are kept. Returns the paths removed (with ``dry_run``:
        that would be), relative to ``.lake-tables``, sorted.

        Raises:
            ValueError: a negative ``grace_s``.
        """
        grace = self.snapshot_grace_s if grace_s is None else grace_s
        if grace < 0:
            raise ValueError(f"prune_snapshots: grace_s must be >= 0, got {grace}")
        top = self.base / ".lake-tables"
        if not top.is_dir():
            return []
        cutoff, current, removed = time.time() - grace, {}, []
        for f in sorted(p for p in top.rglob("*") if p.is_file()):
            rel = f.relative_to(top)
            m = _SNAPSHOT.fullmatch(f.name)
            if m and len(rel.parts) in (2, 3):
                key = "/".join(rel.parts[:-1]) + f"/{m['stem']}.parquet"
                if key not in current:
                    try:
                        current[key] = self.tables.info(key)["data_version"]
                    except (FileNotFoundError, ValueError):
                        current[key] = None            # the table is gone (or the path is no table key)
                if current[key] == m["version"]:
                    continue
            elif not (f.name.startswith(".") and f.name.endswith(".tmp")):
                continue                                  # not a file table_path writes: left alone
            if _last_handed_out(f) < cutoff:
                if not dry_run:
                    f.unlink(missing_ok=True)
                removed.append(str(rel))
        return removed

    def exists(self, asset: str, partition: str | None = None, name: str = "data.parquet") -> bool:
        """True when the table (a ``*.parquet`` name: its Delta table) or file has been written
        (object store: committed)."""
        key = self._key(asset, partition, name)
        if name.endswith(".parquet"):
            return self.tables.exists(key)
        return self.store.exists(key) if self.remote else self.path(asset, partition, name).exists()

    def partitions(self, asset: str) -> list[str]:
        """Partition keys that have a committed table."""
        if self.remote:
            return sorted(k for k in self.store.children(asset)
                          if not k.endswith(".delta") and self.tables.exists(self._key(asset, k)))
        d = self.base / asset
        if not d.exists():
            return []
        # a committed Delta table has a log entry (delta-rs writes the first one at its first commit)
        return sorted(p.name for p in d.iterdir() if not p.name.startswith((".", "_")) and not p.name.endswith(".delta")
                      and any((p / "data.delta" / "_delta_log").glob("*.json")))

    def table_info(self, asset: str, partition: str | None = None, name: str = "data.parquet") -> dict:
        """``{"data_version", "rows"}`` of a written table (the version ``write`` returned). Raises
        FileNotFoundError naming the table when it was never written."""
        try:
            info = self.tables.info(self._key(asset, partition, name))
        except FileNotFoundError:
            raise self._missing(asset, partition, name) from None
        return {"data_version": info["data_version"], "rows": info["rows"]}

    def vacuum(self, retention_hours: int | None = None, dry_run: bool = False,
               enforce_retention_duration: bool = True) -> dict[str, list[str]]:
        """Delta ``VACUUM`` of every Delta table under the root (``ops.lake.DeltaTables.vacuum``:
        files the log does not reference, a killed writer's files included, older than
        ``retention_hours``; None = the table's retention, Delta's 168 h by default), then
        ``prune_snapshots`` (worker snapshots of versions no longer current, not handed out for
        ``retention_hours``; None = ``snapshot_grace_s``). Returns {table folder or URL: files
        deleted (dry run: that would be), relative to the table}, plus, when snapshots were
        removed, ``{"<base>/.lake-tables": their paths relative to it}``.

        Raises:
            ValueError: a negative retention, or one shorter than a table's while enforced (names
                the table).
        """
        if not self.remote:
            tables = sorted({str(p.parent) for p in self.base.rglob("_delta_log")
                             if p.is_dir() and ".lake-tables" not in p.relative_to(self.base).parts})
            out = {t: self.tables.vacuum(t, retention_hours, dry_run, enforce_retention_duration) for t in tables}
        else:
            store = self.store
            out = {store.uri(p): self.tables.vacuum(store.uri(p), retention_hours, dry_run, enforce_retention_duration)
                   for p in lake.find_delta_tables(store.fs, store.prefix)}
        snapshots = self.prune_snapshots(None if retention_hours is None else retention_hours * 3600.0, dry_run)
        if snapshots:
            out[str(self.base / ".lake-tables")] = snapshots
        return out

    # -- other committed files ---------------------------------------------------------------------
    def write_json(self, obj, key: str, indent: int = 2) -> None:
        """Write ``obj`` as JSON at ``<root>/<key>`` (e.g. ``decontaminated_problems/config.json``),
        atomically (local: ``ops.lake.write_json_atomic``; object store: committed). Raises
        ops.lake.LakeConflictError (s3 root) when another writer committed the key during this write."""
        if self.remote:
            self.store.write_json(obj, key, indent=indent, staging=self._staging())
        else:
            lake.write_json_atomic(obj, self.base / key, indent=indent)

    def read_json(self, key: str, default=_RAISE):
        """The JSON at ``<root>/<key>``; ``default`` when absent (without one: FileNotFoundError
        naming the key). Raises ValueError naming the key when the file is not JSON."""
        try:
            raw = self.store.read_bytes(key) if self.remote else (self.base / key).read_bytes()
        except FileNotFoundError:
            if default is _RAISE:
                raise FileNotFoundError(f"{self.store.location(key) if self.remote else self.base / key} does not exist") from None
            return default
        try:
            return json.loads(raw)
        except ValueError as e:
            raise ValueError(f"{key} in the lake ({self.root or self.base}) is not JSON: {e}") from None

    def write_hf_dataset(self, df: pl.DataFrame, asset: str, card: str) -> tuple[Path | str, str]:
        """Publish ``df`` as the Hugging Face dataset folder ``<root>/<asset>`` (``data/train-00000-
        of-00001.parquet`` and the card ``README.md``; ``ops.lake.write_hf_dataset``) and point the
        catalog view ``<asset>`` at it. Returns (location, data version of the Parquet file).
        Raises ops.lake.LakeConflictError (s3 root) when another writer committed the folder during
        this write (nothing of this one is visible)."""
        if not self.remote:
            final = self.base / asset
            version = lake.write_hf_dataset(df, final, card)
            self.refresh_view(asset, pattern=str(final / "data" / "*.parquet"))
            return final, version
        import tempfile

        with tempfile.TemporaryDirectory(prefix=".lake-stage.", dir=self._staging()) as d:
            version = lake.write_hf_dataset(df, Path(d) / asset, card)
            self.store.write_dir(Path(d) / asset, asset, version, {"rows": df.height})
        self.refresh_view(asset, files=self._dataset_objects(asset))
        return self.store.location(asset), version

    def read_dataset(self, asset: str) -> pl.DataFrame:
        """The rows of the dataset folder ``<root>/<asset>`` (its ``data/*.parquet``). Raises
        FileNotFoundError naming it when it was never published."""
        if not self.remote:
            return pl.read_parquet(self.base / asset / "data" / "*.parquet")
        import io

        doc = self.store.manifest(asset)
        if doc is None:
            raise FileNotFoundError(f"{self.store.location(asset)} has no committed dataset: materialize {asset} first")
        parts = [rel for rel in sorted(doc["files"]) if rel.startswith("data/") and rel.endswith(".parquet")]
        return pl.concat([pl.read_parquet(io.BytesIO(self.store.read_bytes(asset, rel, manifest=doc))) for rel in parts],
                         how="vertical_relaxed")

    def _dataset_objects(self, asset: str) -> list[str]:
        return [u for u in self.store.resolve(asset) if "/data/" in u and u.endswith(".parquet")]

    def _staging(self) -> str | None:
        """Local folder for files staged before upload (the system temp folder when ``work_dir``
        does not exist)."""
        return str(self.base) if self.base.is_dir() else None

    # -- the DuckDB catalog ------------------------------------------------------------------------
    def connect_catalog(self, read_only: bool = True):
        """A DuckDB connection to the catalog; for an object-store root with the lake's fsspec
        filesystem registered, so the views over ``s3://`` objects can be queried without DuckDB's
        httpfs extension (docs/operations.md, "Lake on object storage"). Close it when done."""
        import duckdb

        con = duckdb.connect(str(self.catalog_path), read_only=read_only)
        if self.remote:
            con.register_filesystem(self.store.fs)
        return con

    def refresh_view(self, asset: str, partitioned: bool = False, pattern: str | None = None,
                     files: list[str] | None = None, partitions: list[str] | None = None) -> bool:
        """Make sure the DuckDB view ``<asset>`` reads the asset's Parquet file(s).

        The view lists the Parquet files of each table's current Delta version (``files``, or the
        tables of ``partitions``, default the asset's table or every partition's, from the Delta
        logs), so each commit refreshes it (``write`` does). ``pattern``: a glob instead, for the
        files of a dataset folder on a local root; not supported on an object store.

        The catalog is only written when a view is missing or its definition changed (tagged by a
        hash in the view's comment). DuckDB allows one writer and no writer beside readers: if
        someone holds the catalog open, the refresh is retried for ``catalog_lock_timeout_s`` and
        then skipped with a warning — a catalog view never fails a materialization. Returns True
        when the view is current.

        Raises:
            ValueError: a ``pattern`` on an object-store root.
        """
        import hashlib

        import duckdb

        if pattern is not None and self.remote:
            raise ValueError(f"refresh_view({asset!r}): a glob pattern needs a local lake root; pass partitions or files")
        def committed_files(keys):                # one log read per table; a table not committed has none
            out = []
            for key in keys:
                try:
                    out += self.tables.file_uris(key)
                except FileNotFoundError:
                    pass
            return out

        if partitions is not None:
            files = committed_files(self._key(asset, k) for k in partitions)
        elif files is None and pattern is None:
            files = committed_files([self._key(asset, k) for k in self.partitions(asset)] if partitioned else [self._key(asset)])
        if files is not None:
            src = "[" + ", ".join(f"'{f}'" for f in files) + "]" if files else None
        else:
            src = f"'{pattern}'"
        if src is None:
            return True
        sql = f'CREATE OR REPLACE VIEW "{asset}" AS SELECT * FROM read_parquet({src}, union_by_name = true)'
        tag = hashlib.sha1(sql.encode()).hexdigest()[:16]
        path = self.catalog_path
        deadline = time.monotonic() + self.catalog_lock_timeout_s
        while True:
            try:
                if path.exists():
                    with duckdb.connect(str(path), read_only=True) as con:
                        row = con.execute("select comment from duckdb_views() where view_name = ?", [asset]).fetchone()
                    if row and row[0] == tag:
                        return True
                path.parent.mkdir(parents=True, exist_ok=True)
                with duckdb.connect(str(path)) as con:
                    if self.remote:
                        con.register_filesystem(self.store.fs)
                    con.execute(sql)
                    con.execute(f"COMMENT ON VIEW \"{asset}\" IS '{tag}'")
                return True
            except duckdb.IOException as e:
                if time.monotonic() > deadline:
                    dg.get_dagster_logger().warning(
                        f"catalog view {asset!r} not refreshed: {path} is locked by another process ({e}); "
                        "the data is written; the view is created on the next run"
                    )
                    return False
                time.sleep(0.2)
