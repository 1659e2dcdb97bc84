"""The lake resource: table paths under ``CRUCIBLE_HOME``, atomic writes, and the DuckDB catalog."""


import os
import time
from pathlib import Path

import dagster as dg
import polars as pl

from ops import lake


def default_root() -> str:
    return os.environ.get("CRUCIBLE_HOME", str(Path.cwd() / ".crucible"))


class LakeResource(dg.ConfigurableResource):
    """Parquet tables under ``root`` (one folder per asset and partition) and a DuckDB catalog
    (``<root>/catalog.duckdb``) with one view per asset.

    Attributes:
        root: lake root folder; defaults to ``$CRUCIBLE_HOME`` or ``./.crucible``.
        catalog_lock_timeout_s: how long to retry when another process holds the catalog's lock
            (then the view refresh is skipped with a warning; the data is already written).
    """

    root: str = ""
    catalog_lock_timeout_s: float = 5.0

    @property
    def base(self) -> Path:
        return Path(self.root or default_root()).expanduser().resolve()

    def path(self, asset: str, partition: str | None = None, name: str = "data.parquet") -> Path:
        """Path of a table: ``<root>/<asset>[/<partition>]/<name>``."""
        p = self.base / asset
        return (p / partition / name) if partition else (p / name)

    def write(self, df: pl.DataFrame, asset: str, partition: str | None = None, name: str = "data.parquet",
              refresh: bool = True) -> tuple[Path, str]:
        """Atomically write a table; make sure the asset's catalog view exists. Returns (path, data_version)."""
        target = self.path(asset, partition, name)
        version = lake.write_parquet_atomic(df, target)
        if name == "data.parquet" and refresh:
            self.refresh_view(asset, partitioned=partition is not None)
        return target, version

    def read(self, asset: str, partition: str | None = None, name: str = "data.parquet") -> pl.DataFrame:
        """Read a table. Raises FileNotFoundError naming the asset when it was never materialized."""
        p = self.path(asset, partition, name)
        if not p.exists():
            what = f"{asset}[{partition}]" if partition else asset
            raise FileNotFoundError(f"{what} has no table at {p}: materialize {what} first")
        return pl.read_parquet(p)

    def partitions(self, asset: str) -> list[str]:
        """Partition keys that have a table on disk."""
        d = self.base / asset
        if not d.exists():
            return []
        return sorted(p.name for p in d.iterdir() if (p / "data.parquet").exists())

    def refresh_view(self, asset: str, partitioned: bool = False, pattern: str | None = None,
                     files: list[str] | None = None) -> bool:
        """Make sure the DuckDB view ``<asset>`` reads the asset's Parquet file(s).

        Views read through globs, so new data needs no refresh; the catalog is only written when a
        view is missing or its definition changed (tagged by a hash in the view's comment). DuckDB
        allows one writer and no writer beside readers: if someone holds the catalog open, the
        refresh is retried for ``catalog_lock_timeout_s`` and then skipped with a warning —
        a catalog view never fails a materialization. Returns True when the view is current.
        """
        import hashlib

        import duckdb

        if files is not None:
            src = "[" + ", ".join(f"'{f}'" for f in files) + "]" if files else None
        else:
            src = "'" + (pattern or str(self.base / asset / ("*/data.parquet" if partitioned else "data.parquet"))) + "'"
        if src is None:
            return True
        sql = f'CREATE OR REPLACE VIEW "{asset}" AS SELECT * FROM read_parquet({src}, union_by_name = true)'
        tag = hashlib.sha1(sql.encode()).hexdigest()[:16]
        path = self.base / "catalog.duckdb"
        deadline = time.monotonic() + self.catalog_lock_timeout_s
        while True:
            try:
                if path.exists():
                    with duckdb.connect(str(path), read_only=True) as con:
                        row = con.execute("select comment from duckdb_views() where view_name = ?", [asset]).fetchone()
                    if row and row[0] == tag:
                        return True
                with duckdb.connect(str(path)) as con:
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
