"""Metadata helpers shared by the asset modules (figures, tables, counts)."""


import base64

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


def table_result(asset_key: str | None, path, version: str, rows_in: int, rows_out: int, **extra) -> dg.MaterializeResult:
    """The standard result of a table-writing asset: path, counts, data version, extra metadata."""
    meta = {
        "path": dg.MetadataValue.path(str(path)),
        "rows_in": dg.MetadataValue.int(rows_in),
        "rows_out": dg.MetadataValue.int(rows_out),
        "dagster/row_count": dg.MetadataValue.int(rows_out),
        "data_version": dg.MetadataValue.text(version),
    }
    meta.update(extra)
    kw = {"asset_key": asset_key} if asset_key else {}
    return dg.MaterializeResult(metadata=meta, data_version=dg.DataVersion(version), **kw)
