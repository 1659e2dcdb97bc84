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


def resumable_launch(context, compute, base, asset: str, module: str, spec_json: str, fp: str,
                     saved_steps, timeout_s: float) -> tuple[dict, list, "object"]:
    """Launch ``python -m module --spec DIR/spec.json --out DIR`` through Pipes in the run folder of
    this run lineage, ``<base>/<asset>/.run-<root run id>``: a retry (step retry, run retry,
    re-execution from failure) finds the state the killed launch saved there and the driver resumes
    after it; a finished launch's ``result.json`` with the same spec ``fp`` is reused without
    launching. ``saved_steps(run_dir)`` tells how many steps are saved (logged).

    Returns (result dict, Pipes custom messages, run folder). The caller removes the folder once its
    outputs are written. Raises dg.Failure when the driver leaves no result file.
    """
    import json
    import sys
    from pathlib import Path

    run_dir = Path(base) / asset / f".run-{context.run.root_run_id or context.run.run_id}"
    run_dir.mkdir(parents=True, exist_ok=True)
    res_path = run_dir / "result.json"
    done = json.loads(res_path.read_text()) if res_path.exists() else None
    attempt = context.retry_number + 1
    if done is not None and done.get("fingerprint") == fp:
        context.log.info(f"{asset}: attempt {attempt} reuses the finished launch's result in {run_dir}")
        return done, [], run_dir
    res_path.unlink(missing_ok=True)                   # another spec's result must not pass for this launch's
    n = saved_steps(run_dir)
    context.log.info(f"{asset}: attempt {attempt} in {run_dir}: " + (
        f"{n} finished step(s) saved, the driver resumes after them" if n else "no saved steps, starting from the first step"))
    spec_path, tmp = run_dir / "spec.json", run_dir / ".spec.json.tmp"
    tmp.write_text(spec_json)
    tmp.replace(spec_path)
    inv = compute.run(context, "", command=[sys.executable, "-m", module, "--spec", str(spec_path), "--out", str(run_dir)],
                      timeout_s=timeout_s, env={"RAY_DEDUP_LOGS": "0"})
    if not res_path.exists():
        raise dg.Failure(f"{asset}: the driver finished without a result file at {res_path}")
    return json.loads(res_path.read_text()), inv.get_custom_messages(), run_dir
