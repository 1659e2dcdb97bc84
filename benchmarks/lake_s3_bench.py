"""Object-store lake benchmark (docs/operations.md, "Lake on object storage"): the table format
decision of issue 40 item 4, measured.

    .venv/bin/python benchmarks/lake_s3_bench.py            # -> benchmarks/results/lake_s3.json

For one table of ``--rows`` rows, median commit and read latency of

- ``local_parquet``: a local root's table (``write_parquet_atomic``: temp file + rename);
- ``local_delta``: the same table as a Delta table in a local folder (``ops.lake.DeltaTables``);
- ``s3_manifest``: the home-made object-store format (``ops.lake.ObjectStoreLake``: objects, then the manifest);
- ``s3_delta``: a Delta table on the same S3 server (delta-rs, ``conditional_put=etag``),

plus the demo path's cost on small tables (``--small-rows`` rows, ``--small-tables`` tables), and two
writers that both read version N and then commit: the manifest format keeps the last one silently,
Delta rejects the second (``LakeConflictError``).

Real measurements, but of moto (a Python server in its own process on 127.0.0.1), not of AWS S3: a
real store adds the network round trips.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import add_table_sizes, bench_parser, command_line, median_ms as _timed, write_results  # noqa: E402


def main(argv=None) -> None:
    ap = add_table_sizes(bench_parser(__doc__, "lake_s3.json"), rows=10_000, repeats=10, small_tables=20)
    a = ap.parse_args(argv)

    import polars as pl

    from ops import lake as L
    from tests.moto_s3 import moto_s3_server

    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(k, "bench")
    df = pl.DataFrame({"i": range(a.rows), "s": [f"problem {i}" for i in range(a.rows)]})
    small = pl.DataFrame({"i": range(a.small_rows), "s": [f"problem {i}" for i in range(a.small_rows)]})
    out = {"command": command_line(__file__, argv), "rows": a.rows, "repeats": a.repeats,
           "label": "real (moto in its own process on loopback, not AWS; 2 shared cores)",
           "versions": {"deltalake": __import__("deltalake").__version__, "polars": pl.__version__}}
    with moto_s3_server("bench-lake") as endpoint, tempfile.TemporaryDirectory() as d:
        store = L.ObjectStoreLake("s3://bench-lake/manifest", {"endpoint_url": endpoint, "use_listings_cache": False,
                                                               "client_kwargs": {"region_name": "us-east-1"}})
        s3_delta = L.DeltaTables("s3://bench-lake/delta", L.delta_storage_options("s3://bench", endpoint, "us-east-1"))
        local_delta = L.DeltaTables(f"{d}/delta")
        formats = {
            "local_parquet": (lambda t, f: L.write_parquet_atomic(f, f"{d}/pq/{t}/data.parquet"),
                              lambda t: pl.read_parquet(f"{d}/pq/{t}/data.parquet")),
            "local_delta": (lambda t, f: local_delta.write(f, f"{t}/data.parquet"),
                            lambda t: local_delta.read(f"{t}/data.parquet")),
            "s3_manifest": (lambda t, f: store.write_parquet(f, f"{t}/data.parquet", staging=d),
                            lambda t: store.read_parquet(f"{t}/data.parquet")),
            "s3_delta": (lambda t, f: s3_delta.write(f, f"{t}/data.parquet"),
                         lambda t: s3_delta.read(f"{t}/data.parquet")),
        }
        for name, (write, read) in formats.items():
            write("t", df)                                   # the table exists: commits are overwrites
            row = {"commit_ms_median": _timed(lambda: write("t", df), a.repeats),
                   "read_ms_median": _timed(lambda: read("t").height, a.repeats)}
            assert read("t").height == a.rows
            t0 = time.perf_counter()                         # the demo path: many small first-time tables
            for k in range(a.small_tables):
                write(f"small{k}", small)
            row["small_tables_first_write_ms_per_table"] = round(1000 * (time.perf_counter() - t0) / a.small_tables, 1)
            out[name] = row
            print(name, row, flush=True)

        # two writers that read the same version, then commit one after the other
        a_df, b_df = pl.DataFrame({"writer": ["A"]}), pl.DataFrame({"writer": ["B"]})
        store.write_parquet(pl.DataFrame({"writer": ["0"]}), "race/data.parquet", staging=d)
        # (the manifest format has no base version: a writer cannot say what it read)
        store.write_parquet(a_df, "race/data.parquet", staging=d)
        store.write_parquet(b_df, "race/data.parquet", staging=d)
        manifest_result = {"error": None, "table_after": store.read_parquet("race/data.parquet")["writer"].to_list()}
        s3_delta.write(pl.DataFrame({"writer": ["0"]}), "race/data.parquet")
        base = s3_delta.info("race/data.parquet")["table_version"]
        s3_delta.write(a_df, "race/data.parquet", read_version=base)
        try:
            s3_delta.write(b_df, "race/data.parquet", read_version=base)
            err = None
        except L.LakeConflictError as e:
            err = f"LakeConflictError: {str(e).splitlines()[0][:160]}"
        out["two_writers_same_base"] = {
            "s3_manifest": {**manifest_result, "note": "A's commit is overwritten by B without an error: lost silently"},
            "s3_delta": {"error": err, "table_after": s3_delta.read("race/data.parquet")["writer"].to_list(),
                         "table_version": s3_delta.info("race/data.parquet")["table_version"]}}
        print(out["two_writers_same_base"], flush=True)
    write_results(out, a.out)


if __name__ == "__main__":
    main()
