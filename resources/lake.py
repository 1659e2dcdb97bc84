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
        catalog_lock_timeout_s: how long to retry when another process holds the catalog's lock.
    """

    root: str = ""
    catalog_lock_timeout_s: float = 30.0

    @property
    def base(self) -> Path:
        return Path(self.root or default_root()).expanduser().resolve()

    def path(self, asset: str, partition: str | None = None, name: str = "data.parquet") -> Path:
        """Path of a table: ``<root>/<asset>[/<partition>]/<name>``."""
        p = self.base / asset
        return (p / partition / name) if partition else (p / name)

    def write(self, df: pl.DataFrame, asset: str, partition: str | None = None, name: str = "data.parquet") -> tuple[Path, str]:
        """Atomically write a table; refresh the asset's catalog view. Returns (path, data_version)."""
        target = self.path(asset, partition, name)
        version = lake.write_parquet_atomic(df, target)
        if name == "data.parquet":
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

    def refresh_view(self, asset: str, partitioned: bool = False, pattern: str | None = None) -> None:
        """(Re)create the DuckDB view ``<asset>`` over the asset's Parquet file(s).

        The catalog is the only DuckDB file Crucible writes; a concurrent writer holding its lock
        is retried until ``catalog_lock_timeout_s``, then the error is raised.
        """
        import duckdb

        pattern = pattern or str(self.base / asset / ("*/data.parquet" if partitioned else "data.parquet"))
        sql = f"CREATE OR REPLACE VIEW \"{asset}\" AS SELECT * FROM read_parquet('{pattern}', union_by_name = true)"
        deadline = time.monotonic() + self.catalog_lock_timeout_s
        while True:
            try:
                con = duckdb.connect(str(self.base / "catalog.duckdb"))
                try:
                    con.execute(sql)
                finally:
                    con.close()
                return
            except duckdb.IOException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
