"""Local lake table format benchmark (issue 40 item 4; docs/operations.md, "Lake on object storage",
the format decision): plain Parquet against Delta Lake on a local root, on a problems-like table.

    nice -n 15 .venv/bin/python benchmarks/lake_local_bench.py   # -> benchmarks/results/lake_local.json

For one table of ``--rows`` rows shaped like ``decontaminated_problems`` (id, source, subject as
Categorical, level as UInt8, problem / solution / answer text), median over ``--repeats`` of

- ``commit_ms``: an overwrite of the existing table with other rows (the table and its reverse
  alternate, so every write is a real change) (Parquet: ``write_parquet_atomic``, temp file +
  rename; Delta: ``DeltaTables.write``, one overwrite commit with the data version in its commit
  info);
- ``read_ms``: the whole table into Polars (Delta: ``DeltaTables.read``, dtypes restored);
- ``info_ms``: the data version and row count of the current version (Parquet: SHA-256 of the file
  plus a row count from the footer; Delta: the last commit's info);
- ``worker_path_ms`` (Delta only): a worker's snapshot (what ``LakeResource.table_path`` does on an
  object-store root), the current version written once as a Parquet file;

plus the demo path: ``--small-tables`` first-time writes and one read each of ``--small-rows``-row
tables, in ms per table. Labelled exploratory: a development measurement on a shared 2-core machine,
not a registered claim.
"""

from __future__ import annotations

import hashlib
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import add_table_sizes, bench_parser, command_line, median_ms as _timed, write_results  # noqa: E402


def _alternating(write, t, frames):
    """A ``write(t, frame)`` that cycles through ``frames``: every call commits other rows."""
    state = {"k": 0}

    def step():
        state["k"] += 1
        return write(t, frames[state["k"] % len(frames)])
    return step


def problems_table(rows: int, seed: int = 0):
    """A ``rows``-row table with the columns and sizes of a curated problems table (about 250
    characters of problem and 600 of solution per row; text varies per row, so it compresses as
    real text does rather than to nothing)."""
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(seed)
    words = np.array([hashlib.md5(str(i).encode()).hexdigest()[: 3 + i % 7] for i in range(5000)])

    def text(n_words: int) -> list[str]:
        idx = rng.integers(0, len(words), size=(rows, n_words))
        return [" ".join(r) for r in words[idx]]

    subjects = ["algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory",
                "prealgebra", "precalculus"]
    return pl.DataFrame({
        "id": [f"p{i:07d}" for i in range(rows)],
        "source": rng.choice(["math", "gsm8k", "mathgen"], rows).tolist(),
        "subject": pl.Series(rng.choice(subjects, rows).tolist(), dtype=pl.Categorical),
        "level": pl.Series(rng.integers(1, 6, rows), dtype=pl.UInt8),
        "problem": text(40),
        "solution": text(100),
        "answer": [str(v) for v in rng.integers(-1000, 1000, rows)],
    })


def main(argv=None) -> None:
    ap = add_table_sizes(bench_parser(__doc__, "lake_local.json"), rows=100_000, repeats=7, small_tables=40)
    a = ap.parse_args(argv)

    import polars as pl

    from ops import lake as L

    df = problems_table(a.rows)
    small = problems_table(a.small_rows, seed=1)
    out = {"command": command_line(__file__, argv), "label": "exploratory",
           "note": "real, local disk, shared 2-core machine under load (a benchmark queue at normal priority; this ran at nice 15)",
           "rows": a.rows, "repeats": a.repeats, "small_rows": a.small_rows, "small_tables": a.small_tables,
           "machine": {"platform": platform.platform(), "cpu": platform.processor()},
           "versions": {"deltalake": __import__("deltalake").__version__, "polars": pl.__version__}}
    with tempfile.TemporaryDirectory() as d:
        delta = L.DeltaTables(f"{d}/delta")
        pq = lambda t: f"{d}/pq/{t}/data.parquet"                          # noqa: E731

        def pq_info(t):
            return L.file_sha256(pq(t))[:16], pl.scan_parquet(pq(t)).select(pl.len()).collect().item()

        def delta_snapshot(t):
            info = delta.info(f"{t}/data.parquet")
            return L.write_parquet_atomic(delta.read(f"{t}/data.parquet", info["table_version"]),
                                          f"{d}/snap/{t}.{info['data_version']}.parquet")

        formats = {
            "local_parquet": (lambda t, f: L.write_parquet_atomic(f, pq(t)), lambda t: pl.read_parquet(pq(t)), pq_info),
            "local_delta": (lambda t, f: delta.write(f, f"{t}/data.parquet"), lambda t: delta.read(f"{t}/data.parquet"),
                            lambda t: delta.info(f"{t}/data.parquet")),
        }
        versions = {}
        for name, (write, read, info) in formats.items():
            versions[name] = write("t", df) if name == "local_parquet" else write("t", df)[1]
            flipped = df.reverse()
            row = {"commit_ms": _timed(_alternating(write, "t", [df, flipped]), a.repeats),
                   "read_ms": _timed(lambda: read("t").height, a.repeats),
                   "info_ms": _timed(lambda: info("t"), a.repeats)}
            if a.repeats % 2:                                   # the table ends as df either way
                write("t", df)
            back = read("t")
            assert back.equals(df), f"{name}: the table read back differs from the one written"
            if name == "local_delta":
                row["worker_path_ms"] = _timed(lambda: delta_snapshot("t"), a.repeats)
                assert delta_snapshot("t") == versions[name]
            t0 = time.perf_counter()
            for k in range(a.small_tables):
                write(f"small{k}", small)
                read(f"small{k}")
            row["small_table_write_and_read_ms_per_table"] = round(1000 * (time.perf_counter() - t0) / a.small_tables, 1)
            out[name] = row
            print(name, row, flush=True)
        assert versions["local_parquet"] == versions["local_delta"], versions
        out["data_version_same_in_both_formats"] = versions["local_parquet"]
        out["disk_bytes"] = {"local_parquet": Path(pq("t")).stat().st_size,
                             "local_delta_current_version": sum(Path(u.removeprefix("file://")).stat().st_size
                                                                for u in delta.file_uris("t/data.parquet"))}
    write_results(out, a.out)


if __name__ == "__main__":
    main()
