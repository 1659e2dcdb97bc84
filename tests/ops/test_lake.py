"""Atomic writes: a failed write never half-overwrites the previous table; a local root's tables are
Delta tables (other engines read them, concurrent writers conflict, vacuum, pre-Delta tables)."""

import polars as pl
import pytest

from ops import lake
from ops import lake as ops_lake


def test_failed_write_keeps_previous_version(tmp_path):
    p = tmp_path / "t" / "data.parquet"
    v1 = lake.write_parquet_atomic(pl.DataFrame({"a": [1, 2]}), p)

    class Boom(pl.DataFrame):
        def write_parquet(self, *a, **k):
            raise OSError("disk full")

    with pytest.raises(OSError):
        lake.write_parquet_atomic(Boom({"a": [3]}), p)
    assert pl.read_parquet(p)["a"].to_list() == [1, 2]
    assert lake.file_sha256(p)[:16] == v1
    assert [f.name for f in p.parent.iterdir()] == ["data.parquet"]  # no temp file left behind


def test_same_rows_same_version(tmp_path):
    df = pl.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    assert lake.write_parquet_atomic(df, tmp_path / "1.parquet") == lake.write_parquet_atomic(df, tmp_path / "2.parquet")
    assert lake.write_parquet_atomic(df, tmp_path / "3.parquet") != lake.write_parquet_atomic(df.reverse(), tmp_path / "4.parquet")


def test_hf_dataset_layout_loads_with_datasets(tmp_path):
    import datasets

    df = pl.DataFrame({"problem": ["p1", "p2"], "response": ["r1", "r2"]})
    lake.write_hf_dataset(df, tmp_path / "ds", "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*.parquet\n---\n# card\n")
    ds = datasets.load_dataset("parquet", data_dir=str(tmp_path / "ds"))["train"]
    assert ds["problem"] == ["p1", "p2"]
    lake.write_hf_dataset(df.head(1), tmp_path / "ds", "# v2\n")  # replace in place
    assert datasets.load_dataset("parquet", data_dir=str(tmp_path / "ds"))["train"].num_rows == 1


def test_a_locked_catalog_never_fails_a_write(tmp_path):
    import subprocess
    import sys
    import time

    from resources.lake import LakeResource

    lake = LakeResource(root=str(tmp_path), catalog_lock_timeout_s=0.5)
    lake.write(pl.DataFrame({"a": [1]}), "first")  # creates the catalog
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb, time; c = duckdb.connect({str(tmp_path / 'catalog.duckdb')!r}); print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        t = time.monotonic()
        path, _ = lake.write(pl.DataFrame({"b": [2]}), "second")  # needs a new view: catalog is locked
        assert time.monotonic() - t < 10
        assert pl.read_delta(str(path))["b"].to_list() == [2]
    finally:
        holder.kill()
        holder.wait()
    assert lake.refresh_view("second") is True  # created once the lock is gone
    import duckdb

    with duckdb.connect(str(tmp_path / "catalog.duckdb"), read_only=True) as con:
        assert con.execute('select b from "second"').fetchone() == (2,)


def test_a_local_table_is_a_delta_table_read_without_crucible(tmp_path):
    """A table Crucible writes on a local root is read by Polars' read_delta and by DuckDB (over the
    files the Delta log names) in an isolated interpreter (``python -I``: no Crucible module on the
    path), current version and version 0; its data version is the plain-Parquet content hash."""
    import json
    import subprocess
    import sys

    from resources.lake import LakeResource

    lake = LakeResource(root=str(tmp_path / "lake"))
    v0 = pl.DataFrame({"problem_id": ["p0", "p1"], "level": pl.Series([1, 5], dtype=pl.UInt8)})
    v1 = pl.DataFrame({"problem_id": ["p2"], "level": pl.Series([3], dtype=pl.UInt8)})
    lake.write(v0, "decontaminated_problems", refresh=False)
    path, version = lake.write(v1, "decontaminated_problems", refresh=False)
    assert path == tmp_path / "lake" / "decontaminated_problems" / "data.delta" and (path / "_delta_log").is_dir()
    # the data version is the content hash of the plain Parquet encoding: the same as before the move to Delta
    assert version == lake.table_info("decontaminated_problems")["data_version"] == \
        ops_lake.write_parquet_atomic(v1, tmp_path / "plain.parquet")
    code = (
        "import json, sys\n"
        "import duckdb, polars as pl\n"
        "from deltalake import DeltaTable\n"
        "p = sys.argv[1]\n"
        "files = DeltaTable(p).file_uris()\n"
        "print(json.dumps({'polars': pl.read_delta(p)['problem_id'].to_list(),\n"
        "                  'polars_v0': pl.read_delta(p, version=0)['problem_id'].to_list(),\n"
        "                  'duckdb': [r[0] for r in duckdb.sql(f'select problem_id from read_parquet({files}) order by 1').fetchall()],\n"
        "                  'crucible_loaded': sorted(m for m in sys.modules if m.split('.')[0] in ('ops', 'resources', 'assets'))}))\n")
    out = subprocess.run([sys.executable, "-I", "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got == {"polars": ["p2"], "polars_v0": ["p0", "p1"], "duckdb": ["p2"], "crucible_loaded": []}


_WRITER = """
import sys, time
import polars as pl
from ops.lake import LakeConflictError
from resources.lake import LakeResource
root, who, base, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
lake = LakeResource(root=root)
df = pl.DataFrame({"writer": [who] * 1000})
while time.time() < start:          # both processes commit at the same moment
    time.sleep(0.001)
try:
    lake.write(df, "decontaminated_problems", refresh=False, read_version=base)
    print("committed")
except LakeConflictError as e:
    print("conflict", str(e).splitlines()[0])
"""


def test_two_concurrent_local_writers_one_conflict(tmp_path):
    """Two writer processes that read the same version of a local table commit at the same moment:
    exactly one commits, the other gets LakeConflictError naming the table and its base version,
    and the table holds the winner's rows only (version base + 1)."""
    import subprocess
    import sys
    import time

    from resources.lake import LakeResource

    lake = LakeResource(root=str(tmp_path))
    lake.write(pl.DataFrame({"writer": ["0"]}), "decontaminated_problems", refresh=False)
    base = lake.tables.info("decontaminated_problems/data.parquet")["table_version"]
    start = time.time() + 8                      # both processes imported by then
    procs = {who: subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), who, str(base), str(start)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for who in ("A", "B")}
    out = {}
    for who, p in procs.items():
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        out[who] = stdout.strip()
    assert sorted(o.split()[0] for o in out.values()) == ["committed", "conflict"], out
    [winner] = [w for w, o in out.items() if o == "committed"]
    [loser] = [o for o in out.values() if o != "committed"]
    assert f"data.delta (based on version {base})" in loser
    assert lake.read("decontaminated_problems")["writer"].unique().to_list() == [winner]
    assert lake.tables.info("decontaminated_problems/data.parquet")["table_version"] == base + 1


def test_local_partitions_snapshot_vacuum_and_time_travel(tmp_path):
    """A local root: partitions list the committed Delta tables only, ``table_path`` hands a worker a
    Parquet snapshot whose content hash is the data version, ``read(version=)`` reads an earlier
    version until a vacuum removes its files, and the current version survives the vacuum."""
    from resources.lake import LakeResource

    lake = LakeResource(root=str(tmp_path))
    a, b = pl.DataFrame({"x": [1, 2]}), pl.DataFrame({"x": [3]})
    lake.write(a, "raw_problems", "math", refresh=False)
    _, version = lake.write(b, "raw_problems", "math", refresh=False)
    lake.write(a, "raw_problems", "gsm8k", refresh=False)
    (tmp_path / "raw_problems" / "stray").mkdir()                      # a folder without a table
    assert lake.partitions("raw_problems") == ["gsm8k", "math"]
    snap = lake.table_path("raw_problems", "math")
    assert snap.suffix == ".parquet" and ops_lake.file_sha256(snap)[:16] == version
    assert pl.read_parquet(snap).equals(b)
    assert lake.read("raw_problems", "math", version=0).equals(a)
    assert lake.vacuum(0, dry_run=True, enforce_retention_duration=False)[str(tmp_path / "raw_problems" / "math" / "data.delta")]
    with pytest.raises(ValueError, match="retention"):
        lake.vacuum(0)                                               # shorter than Delta's 168 h: refused
    removed = lake.vacuum(0, enforce_retention_duration=False)
    assert len(removed[str(tmp_path / "raw_problems" / "math" / "data.delta")]) == 1     # version 0's file
    assert removed[str(tmp_path / "raw_problems" / "gsm8k" / "data.delta")] == []
    assert lake.read("raw_problems", "math").equals(b) and lake.table_info("raw_problems", "math")["data_version"] == version
    with pytest.raises(Exception):
        lake.read("raw_problems", "math", version=0)


def test_a_pre_delta_local_table_fails_naming_the_file_and_the_fix(tmp_path):
    """A table left by the pre-Delta local layout (one plain Parquet file) is not read silently:
    read, table_info and table_path raise LegacyTableError naming the file and the fix; an
    optional read does not turn it into 'absent'; a new write makes the Delta table current."""
    from ops.posttrain.stages import read_optional
    from resources.lake import LakeResource

    lake = LakeResource(root=str(tmp_path))
    legacy = tmp_path / "benchmark_problems" / "data.parquet"
    ops_lake.write_parquet_atomic(pl.DataFrame({"x": [1]}), legacy)
    for call in (lambda: lake.read("benchmark_problems"), lambda: lake.table_info("benchmark_problems"),
                 lambda: lake.table_path("benchmark_problems"), lambda: read_optional(lake, "benchmark_problems")):
        with pytest.raises(ops_lake.LegacyTableError, match=rf"{legacy}.*pre-Delta.*rematerialize benchmark_problems"):
            call()
    assert read_optional(lake, "never_written") is None
    lake.write(pl.DataFrame({"x": [2]}), "benchmark_problems", refresh=False)
    assert lake.read("benchmark_problems")["x"].to_list() == [2]


def test_rewriting_the_same_rows_commits_nothing(tmp_path):
    """A rerun of an unchanged step writes the same rows: no new Delta version, the table folder stays
    byte-identical (a failed rerun must leave the committed lake as it was); other rows commit."""
    from resources.lake import LakeResource

    lake = LakeResource(root=str(tmp_path))
    df = pl.DataFrame({"x": [1, 2], "c": pl.Series(["a", "b"], dtype=pl.Categorical)})
    _, v1 = lake.write(df, "t", refresh=False)
    before = sorted((p.relative_to(tmp_path), p.read_bytes()) for p in (tmp_path / "t").rglob("*") if p.is_file())
    assert lake.write(df.clone(), "t", refresh=False)[1] == v1
    assert sorted((p.relative_to(tmp_path), p.read_bytes()) for p in (tmp_path / "t").rglob("*") if p.is_file()) == before
    assert lake.tables.info("t/data.parquet")["table_version"] == 0
    lake.write(df.reverse(), "t", refresh=False)                    # other order: another version
    assert lake.tables.info("t/data.parquet")["table_version"] == 1


def test_a_frame_without_columns_round_trips(tmp_path):
    """A step that has nothing to record writes ``pl.DataFrame()`` (a sync point after the run ended):
    Delta needs a column, so it is stored as one empty column and read back as a frame without
    columns, with the same data version as the plain Parquet file of it."""
    from resources.lake import LakeResource

    lake = LakeResource(root=str(tmp_path))
    _, version = lake.write(pl.DataFrame(), "decontam_sync_1", refresh=False)
    assert version == ops_lake.write_parquet_atomic(pl.DataFrame(), tmp_path / "plain.parquet")
    back = lake.read("decontam_sync_1")
    assert back.width == 0 and back.height == 0 and lake.table_info("decontam_sync_1") == {"data_version": version, "rows": 0}


def test_worker_snapshots_are_reused_by_content_hash_and_do_not_accumulate(tmp_path):
    """``table_path`` reuses a version's snapshot (same file, touched), writing a new version's
    snapshot removes the table's stale ones past ``snapshot_grace_s`` (not the ones handed out within
    it, nor other tables' or other names'), and ``vacuum`` removes the stale snapshots left (a
    superseded version, a table gone, a killed write's temp file) and keeps current ones."""
    import os
    import shutil
    import time

    from resources.lake import LakeResource

    lake = LakeResource(root=str(tmp_path), snapshot_grace_s=600)
    snaps = tmp_path / ".lake-tables"
    old = time.time() - 3600

    def age(p):                                                   # last handed out an hour ago
        os.utime(p, (old, old))

    lake.write(pl.DataFrame({"x": [1]}), "t", refresh=False)
    s1 = lake.table_path("t")
    age(s1)
    # reused and its hand-out recorded in the access time only: the modification time (which workers' run
    # fingerprints read, e.g. GBA's checkpoint resume) stays as it was
    assert lake.table_path("t") == s1 and s1.stat().st_atime > old + 3000 and s1.stat().st_mtime == old
    lake.write(pl.DataFrame({"x": [2]}), "t", refresh=False)
    s2 = lake.table_path("t")                                      # s1 was handed out just now: kept
    assert s2 != s1 and s1.exists() and pl.read_parquet(s2)["x"].to_list() == [2]
    age(s1)
    lake.write(pl.DataFrame({"x": [1, 2]}, schema={"x": pl.UInt8}), "t", name="eval.parquet", refresh=False)
    e1 = lake.table_path("t", name="eval.parquet")
    assert s1.exists() and pl.read_parquet(e1)["x"].dtype == pl.UInt8   # another name: s1 not its sibling
    lake.write(pl.DataFrame({"x": [3]}), "t", refresh=False)
    s3 = lake.table_path("t")
    assert not s1.exists() and s2.exists() and s3.exists() and e1.exists()   # s1 past the grace: removed

    lake.write(pl.DataFrame({"x": [5]}), "p", "a", refresh=False)
    pa = lake.table_path("p", "a")
    lake.write(pl.DataFrame({"x": [6]}), "gone", refresh=False)
    g = lake.table_path("gone")
    shutil.rmtree(tmp_path / "gone")                              # the asset was wiped: its snapshot is stale
    tmp = s3.parent / ".data.0123456789abcdef.parquet.x1y2.tmp"   # a killed snapshot write
    tmp.write_bytes(b"partial")
    other = snaps / "notes.txt"                                   # not a snapshot: left alone
    other.write_text("keep")
    for p in (s2, s3, e1, pa, g, tmp, other):
        age(p)
    assert lake.prune_snapshots(dry_run=True) == sorted(str(p.relative_to(snaps)) for p in (s2, g, tmp))
    assert all(p.exists() for p in (s2, g, tmp))
    assert lake.vacuum(retention_hours=2, enforce_retention_duration=False) == {str(tmp_path / d / f"{n}.delta"): [] for d, n in
                                              (("p/a", "data"), ("t", "data"), ("t", "eval"))}  # an hour < 2 h
    removed = lake.vacuum(retention_hours=0, enforce_retention_duration=False)
    assert removed[str(snaps)] == sorted(str(p.relative_to(snaps)) for p in (s2, g, tmp))
    assert not any(p.exists() for p in (s2, g, tmp)) and all(p.exists() for p in (s3, e1, pa, other))
    assert lake.table_path("t") == s3 and pl.read_parquet(s3)["x"].to_list() == [3]
    with pytest.raises(ValueError, match="grace_s"):
        lake.prune_snapshots(-1)


def test_benchmarks_read_a_local_lake_through_its_delta_tables(tmp_path):
    """The benchmarks that take a lake folder read its Delta tables, not a pre-Delta data.parquet:
    rollpacker_bench's problems are the table's hash-checked snapshot, and a lake without the table
    fails naming it."""
    from benchmarks.rollpacker_bench import problems_file
    from resources.lake import LakeResource

    df = pl.DataFrame({"problem_id": ["a", "b"], "problem": ["1+1?", "2+2?"], "answer": ["2", "4"]})
    _, version = LakeResource(root=str(tmp_path)).write(df, "decontaminated_problems", refresh=False)
    p = problems_file(str(tmp_path))
    assert ops_lake.file_sha256(p)[:16] == version and pl.read_parquet(p).equals(df)
    with pytest.raises(FileNotFoundError, match="decontaminated_problems"):
        problems_file(str(tmp_path / "empty"))
