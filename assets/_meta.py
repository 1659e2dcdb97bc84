"""Metadata helpers shared by the asset modules (figures, tables, counts)."""


import base64
from pathlib import Path

import dagster as dg
import polars as pl


def image(png: bytes, alt: str = "figure") -> dg.MetadataValue:
    """A PNG shown inline in the Dagster UI (Markdown with a data URI)."""
    return dg.MetadataValue.md(f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})")


def md_table(df: pl.DataFrame, max_rows: int = 40) -> dg.MetadataValue:
    """A small frame as a Markdown table (first ``max_rows`` rows)."""
    cols = df.columns
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.head(max_rows).iter_rows():
        lines.append("| " + " | ".join("" if v is None else str(v).replace("|", "\\|").replace("\n", " ")[:80] for v in row) + " |")
    if df.height > max_rows:
        lines.append(f"\n... {df.height - max_rows} more rows")
    return dg.MetadataValue.md("\n".join(lines))


def uri_of(path) -> str:
    """The URI of a lake object: an object-store URI as is, a local path as an absolute ``file://`` URI."""
    s = str(path)
    return s if "://" in s else Path(s).resolve().as_uri()


def column_schema(schema: "pl.Schema | dict") -> dg.TableSchema:
    """A Polars schema (column -> dtype) as Dagster's ``dagster/column_schema`` (name, Polars type name)."""
    return dg.TableSchema(columns=[dg.TableColumn(name, str(dtype)) for name, dtype in dict(schema).items()])


def parquet_column_schema(path) -> dg.TableSchema | None:
    """:func:`column_schema` of a local Parquet file, read from its footer (no data read); None for an
    object-store URI or a path that is not a Parquet file."""
    p = Path(str(path))
    if "://" in str(path) or p.suffix != ".parquet" or not p.is_file():
        return None
    return column_schema(pl.read_parquet_schema(p))


def table_result(asset_key: str | None, path, version: str, rows_in: int, rows_out: int, schema=None,
                 **extra) -> dg.MaterializeResult:
    """The standard result of a table-writing asset: ``dagster/uri`` (and ``path``), counts
    (``dagster/row_count``), ``dagster/column_schema`` (from ``schema``, a Polars schema, else from
    the Parquet footer of a local ``path``), the data version, and ``extra`` metadata."""
    meta = {
        "path": dg.MetadataValue.path(str(path)),
        "dagster/uri": dg.MetadataValue.text(uri_of(path)),
        "rows_in": dg.MetadataValue.int(rows_in),
        "rows_out": dg.MetadataValue.int(rows_out),
        "dagster/row_count": dg.MetadataValue.int(rows_out),
        "data_version": dg.MetadataValue.text(version),
    }
    cols = column_schema(schema) if schema is not None else parquet_column_schema(path)
    if cols is not None:
        meta["dagster/column_schema"] = dg.MetadataValue.table_schema(cols)
    meta.update(extra)
    kw = {"asset_key": asset_key} if asset_key else {}
    return dg.MaterializeResult(metadata=meta, data_version=dg.DataVersion(version), **kw)
