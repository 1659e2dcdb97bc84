"""Metadata helpers shared by the asset modules (figures, tables, counts)."""


import hashlib
from pathlib import Path

import dagster as dg
import polars as pl

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURES_DIR = "_figures"
"""Folder of an asset's figures, beside its output: ``<lake root>/<asset>/_figures/`` (a leading
``_``: never taken for a partition, locally or on an object store)."""


def figure_key(png: bytes, asset: str) -> str:
    """The lake key of a figure: ``<asset>/_figures/<first 16 hex digits of the PNG's SHA-256>.png``
    (content-addressed: the same bytes always get the same name)."""
    return f"{asset}/{FIGURES_DIR}/{hashlib.sha256(png).hexdigest()[:16]}.png"


def write_figure(png: bytes, lake, asset: str) -> tuple[str, bool]:
    """Write a PNG figure to the lake beside ``asset``'s output (``figure_key``), once.

    Local root: ``<root>/<asset>/_figures/<sha>.png``, written through ``ops.lake.atomic_path``
    (temporary file + rename). Object-store root (``s3://...``): one PUT of the object
    ``<root>/<asset>/_figures/<sha>.png`` (a PUT is atomic; the name is the content, so the figure
    needs no manifest). A figure already there with the same size is not written again.

    Args:
        png: the PNG's bytes.
        lake: the ``LakeResource`` of the run.
        asset: the asset key's name (e.g. ``"gba_run"``).
    Returns:
        (where: the local path, or the object's ``s3://`` URL; True when this call wrote it).
    Raises:
        ValueError: ``png`` is not a PNG (names the asset).
    """
    if not isinstance(png, (bytes, bytearray)) or not bytes(png[:8]) == PNG_SIGNATURE:
        raise ValueError(f"figure of {asset}: not a PNG (the first bytes are {bytes(png[:8])!r}, "
                         f"expected {PNG_SIGNATURE!r})")
    key = figure_key(png, asset)
    if lake.remote:
        store = lake.store
        path = f"{store.prefix}/{key}"
        store.fs.invalidate_cache(path.rpartition("/")[0])
        if store.fs.exists(path) and store.fs.info(path)["size"] == len(png):
            return store.uri(path), False
        store.fs.pipe_file(path, bytes(png))
        return store.uri(path), True
    from ops.lake import atomic_path

    target = lake.base / key
    if target.is_file() and target.stat().st_size == len(png):
        return str(target), False
    with atomic_path(target) as tmp:
        tmp.write_bytes(png)
    return str(target), True


def image(png: bytes, alt: str = "figure", *, lake, asset: str) -> dg.MetadataValue:
    """A PNG figure written to the lake beside ``asset``'s output and linked from the metadata (issue
    43.5: figures used to be inlined as base64 Markdown, about 40 kB per figure in the event log).

    The file: ``write_figure`` (content-addressed, atomic, written once). The metadata value: a
    ``MetadataValue.path`` to the file on a local root, a ``MetadataValue.url`` (``s3://...``) on an
    object store; the UI shows it with a copy button (a browser does not display a ``file://`` or
    ``s3://`` image inside the UI page, so an inline Markdown image by that URL would show nothing).

    Args:
        png: the PNG's bytes.
        alt: what the figure shows (named in the error for a bad figure).
        lake: the run's ``LakeResource``.
        asset: the asset key's name.
    Raises:
        ValueError: ``png`` is not a PNG (names the asset and ``alt``).
    """
    try:
        where, _ = write_figure(png, lake, asset)
    except ValueError as e:
        raise ValueError(f"{e} ({alt!r})") from None
    return dg.MetadataValue.url(where) if "://" in where else dg.MetadataValue.path(where)


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
    """:func:`column_schema` of a local Parquet file (from its footer) or a local Delta table
    (``<name>.delta``, from its log, with the dtypes ``LakeResource.read`` returns); no data read.
    None for an object-store URI or a path that is neither."""
    p = Path(str(path))
    if "://" in str(path):
        return None
    if p.suffix == ".delta" and (p / "_delta_log").is_dir():
        from ops.lake import DeltaTables

        return column_schema(DeltaTables(str(p.parent)).schema(f"{p.stem}.parquet"))
    if p.suffix != ".parquet" or not p.is_file():
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


def range_data_version(versions: "dict[str, str]") -> dg.DataVersion:
    """The data version of a step that materializes several partitions at once (a range run of an
    asset with ``BackfillPolicy.single_run()``).

    Dagster (1.13) gives every partition of one step the same ``dagster/data_version`` tag, so a range
    run cannot record each partition's own version there. This version *names* every partition's
    version: compact JSON ``{"<partition key>": "<its version>", ...}`` with the keys sorted, so it
    changes exactly when one partition's content changes, and ``parse_range_data_version`` (or any
    JSON reader) recovers each partition's version from the tag alone. One partition: its own
    version, as a single-partition run records it.

    Args:
        versions: partition key -> that partition's own data version (e.g. a content hash).
    Raises:
        ValueError: ``versions`` is empty.
    """
    import json

    if not versions:
        raise ValueError("range_data_version: no partition versions (the step materialized no partition?)")
    if len(versions) == 1:
        return dg.DataVersion(str(next(iter(versions.values()))))
    return dg.DataVersion(json.dumps({str(k): str(v) for k, v in sorted(versions.items())}, separators=(",", ":")))


def parse_range_data_version(value: str) -> "dict[str, str] | None":
    """Partition key -> version of a ``range_data_version`` value; None for a single partition's
    version (not a JSON object)."""
    import json

    if not value.startswith("{"):
        return None
    try:
        doc = json.loads(value)
    except ValueError:
        return None
    return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else None


def partition_versions(context: dg.AssetExecutionContext, per_key: "dict[str, dict]") -> dg.DataVersion:
    """Record each partition's own data version and figures on its materialization, and return the
    step's data version (``range_data_version``). For the range runs of a ``single_run`` asset.

    Args:
        context: the step's context (``context.partition_keys`` are the keys of ``per_key``).
        per_key: partition key -> metadata of that partition, with ``partition_data_version``
            (its own version); each partition's materialization gets its entries.
    Raises:
        ValueError: a partition's metadata has no ``partition_data_version`` (names the key).
    """
    for key, meta in per_key.items():
        if "partition_data_version" not in meta:
            raise ValueError(f"partition {key!r}: metadata has no 'partition_data_version'")
        context.add_asset_metadata(dict(meta), partition_key=key)
    return range_data_version({str(k): str(m["partition_data_version"]) for k, m in per_key.items()})
