"""The lake on object storage (docs/operations.md, "Lake on object storage"), against a real
S3-compatible server on loopback: moto's server mode on 127.0.0.1 and a random port, reached by
s3fs through ``LakeResource(endpoint_url=...)`` with credentials from the environment.

- real curation assets materialized through Dagster into ``s3://bucket/lake`` and read back: the
  same data versions as on a local lake, no table on local disk, the DuckDB views (a local catalog
  file) answering over the S3 objects;
- a write that fails half-way (in-process) and a writer process SIGKILLed after its uploads,
  before its manifest: the manifest and the previous version stay, readers see the previous one;
- readers polling while versions are committed only ever see committed, complete versions;
- the production profile's ``s3://`` root with a configurable endpoint.
"""

import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import dagster as dg
import polars as pl
import pytest

from tests.conftest import ROOT

BUCKET = "crucible-test"


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 (random port, its own process) with one bucket; yields its endpoint URL."""
    from tests.moto_s3 import moto_s3_server

    mp = pytest.MonkeyPatch()
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        mp.setenv(k, v)
    try:
        with moto_s3_server(BUCKET) as endpoint:
            yield endpoint
    finally:
        mp.undo()


def _lake(s3, tmp_path, prefix, **kw):
    from resources.lake import LakeResource

    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return LakeResource(root=f"s3://{BUCKET}/{prefix}", endpoint_url=s3, region="us-east-1", work_dir=str(work), **kw)


def _keys(s3, prefix):
    import boto3

    c = boto3.client("s3", endpoint_url=s3, region_name="us-east-1")
    return sorted(o["Key"] for page in c.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
                  for o in page.get("Contents", []))


def test_curation_group_into_s3_and_back(s3, tmp_path):
    from assets import curation, curation_checks, sources
    from resources.lake import LakeResource
    from resources.sources import SourcesResource
    from resources.teacher import TeacherResource

    assets = [sources.raw_problems, curation.annotated_problems, curation.exact_deduped_problems,
              curation.near_deduped_problems, curation.sft_dataset]
    chain = ["annotated_problems", "exact_deduped_problems", "near_deduped_problems", "dedup_clusters"]
    cfg = {"ops": {"annotated_problems": {"config": {"allow_missing_sources": True, "llm_label_max_rows": 0}}}}

    def run(lake):
        res = {"lake": lake, "sources": SourcesResource(), "teacher": TeacherResource()}
        instance = dg.DagsterInstance.ephemeral()
        sources.sync_source_partitions(instance, ["user_nodup", "user_bad"])   # dynamic partitions: the two read here
        for part in ("user_nodup", "user_bad"):
            assert dg.materialize(assets, selection=["raw_problems"], partition_key=part, resources=res,
                                  instance=instance).success
        out = dg.materialize(assets, selection=chain, resources=res, run_config=cfg, instance=instance)
        assert out.success
        mats = [e.event_specific_data.materialization for e in out.get_asset_materialization_events()]
        return {m.asset_key.to_user_string(): m.metadata["data_version"].value for m in mats}

    local = LakeResource(root=str(tmp_path / "local"))
    s3lake = _lake(s3, tmp_path, "lake")
    want, got = run(local), run(s3lake)
    assert set(got) == set(chain) and got == want        # same bytes written: the same data versions
    for t in chain:
        assert s3lake.read(t).equals(local.read(t)), t
    assert s3lake.partitions("raw_problems") == ["user_bad", "user_nodup"] == local.partitions("raw_problems")
    assert s3lake.read("raw_problems_quarantine", "user_bad").height == 6
    kept = s3lake.read("near_deduped_problems")
    assert kept.filter(pl.col("source") == "user_nodup").height == 100
    # the tables are Delta tables in the bucket; the commit info carries the data version and rows
    keys = _keys(s3, "lake/")
    first = "_delta_log/00000000000000000000.json"
    assert f"lake/annotated_problems/data.delta/{first}" in keys
    assert f"lake/exact_deduped_problems/clusters.delta/{first}" in keys
    assert f"lake/raw_problems/user_nodup/data.delta/{first}" in keys
    log = [json.loads(line) for line in s3lake.store.fs.cat_file(f"{BUCKET}/lake/near_deduped_problems/data.delta/{first}").splitlines()]
    info = next(a["commitInfo"] for a in log if "commitInfo" in a)
    assert info["crucible.data_version"] == got["near_deduped_problems"] and info["crucible.rows"] == str(kept.height)
    assert [a["add"]["path"] for a in log if "add" in a]
    stray = [k for k in _keys(s3, "lake/near_deduped_problems/")           # figures: assets/_meta.py, content-named PNGs
             if not k.startswith(("lake/near_deduped_problems/data.delta/", "lake/near_deduped_problems/_figures/"))]
    assert not stray, stray
    # no table or JSON on local disk: only the catalog
    local_files = [p for p in (tmp_path / "work").rglob("*") if p.is_file()]
    assert not [p for p in local_files if p.suffix in (".parquet", ".json")], local_files
    assert (tmp_path / "work" / "catalog.duckdb") in local_files
    with s3lake.connect_catalog() as con:
        assert con.execute("select count(*) from near_deduped_problems").fetchone() == (kept.height,)
        assert con.execute("select count(*) from raw_problems").fetchone() == (s3lake.read("raw_problems", "user_nodup").height
                                                                               + s3lake.read("raw_problems", "user_bad").height,)
    # the blocking checks read the S3 lake
    assert curation_checks.one_survivor_per_cluster(lake=s3lake).passed
    assert curation_checks.annotated_required_fields(lake=s3lake).passed

    # the end of the group: sft_dataset as a committed Hugging Face folder (decontamination and the
    # teacher are stood in for by tables derived from the real near-dedup output)
    distilled = kept.with_columns(status=pl.lit("verified"), response=pl.format("The answer is {}.", pl.col("answer")),
                                  response_source=pl.lit("reference"))
    sft_versions = []
    for lake in (local, s3lake):
        lake.write(kept, "decontaminated_problems")
        lake.write(distilled, "distilled_problems")
        out = dg.materialize(assets, selection=["sft_dataset"],
                             resources={"lake": lake, "sources": SourcesResource(), "teacher": TeacherResource()})
        assert out.success
        sft_versions.append(out.get_asset_materialization_events()[0].event_specific_data.materialization.metadata["data_version"].value)
    assert sft_versions[0] == sft_versions[1]
    ds = s3lake.read_dataset("sft_dataset")
    assert ds.equals(local.read_dataset("sft_dataset"))
    assert (tmp_path / "local" / "sft_dataset" / "data" / "train-00000-of-00001.parquet").exists()   # local layout unchanged
    assert ds.height == distilled.height and set(ds["problem_id"]) == set(kept["problem_id"])
    assert s3lake.read_json("sft_dataset.plan.json")["target_size"] == 2000
    assert "lake/_latest/sft_dataset.json" in _keys(s3, "lake/_latest/")
    card = s3lake.store.read_bytes("sft_dataset", "README.md").decode()
    assert f"| near_deduped_problems | {got['near_deduped_problems']} | {kept.height} |" in card   # lineage from the manifests
    assert curation_checks.sft_strata_match_plan(lake=s3lake).passed and curation_checks.sft_strata_match_plan(lake=local).passed
    with s3lake.connect_catalog() as con:
        assert con.execute("select count(*) from sft_dataset").fetchone() == (ds.height,)


def test_a_write_failing_half_way_leaves_the_previous_version(s3, tmp_path, monkeypatch):
    lake = _lake(s3, tmp_path, "halfway")
    v1 = pl.DataFrame({"problem_id": ["a", "b"], "x": [1, 2]})
    lake.write_hf_dataset(v1, "ds", "# card v1\n")
    before = lake.store.fs.cat_file(f"{BUCKET}/halfway/_latest/ds.json")
    fs, calls = lake.store.fs, []
    real_put = fs.put_file

    def put_then_fail(lpath, rpath, **kw):       # the second object of the new version fails
        calls.append(rpath)
        if len(calls) == 2:
            raise OSError("connection reset (injected)")
        return real_put(lpath, rpath, **kw)

    monkeypatch.setattr(fs, "put_file", put_then_fail)
    with pytest.raises(OSError, match="injected"):
        lake.write_hf_dataset(pl.DataFrame({"problem_id": ["c"], "x": [3]}), "ds", "# card v2\n")
    monkeypatch.undo()
    assert len(calls) == 2                      # one object of the new version had been uploaded
    assert lake.store.fs.cat_file(f"{BUCKET}/halfway/_latest/ds.json") == before
    assert lake.read_dataset("ds").equals(v1)
    assert lake.store.read_bytes("ds", "README.md") == b"# card v1\n"
    with lake.connect_catalog() as con:
        assert con.execute("select sum(x) from ds").fetchone() == (3,)
    vid = json.loads(before)["id"]
    assert [k.split("/")[3] for k in _keys(s3, "halfway/_v/ds/")] == [vid, vid]   # the partial upload was removed


KILLED_WRITER = """
import polars as pl
from resources.lake import LakeResource
lake = LakeResource(root={root!r}, endpoint_url={endpoint!r}, region="us-east-1", work_dir={work!r})
big = pl.DataFrame({{"x": pl.int_range(0, 3_000_000, eager=True) % 7}})
print("writing", flush=True)
lake.write(big, "t", {partition!r})
"""


def _killed_write(s3, lake, partition):
    """Run a writer process of a 3M-row version of ``t[partition]`` and SIGKILL it as it starts
    writing (encoding and uploading take far longer than the kill)."""
    code = KILLED_WRITER.format(root=lake.root, endpoint=s3, work=lake.work_dir, partition=partition)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = [None]
        reader = threading.Thread(target=lambda: line.__setitem__(0, proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout=120)
        assert line[0] == "writing\n", proc.stderr.read() if proc.poll() is not None else "writer did not start in 120 s"
        time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_a_killed_writer_leaves_a_whole_committed_version(s3, tmp_path):
    lake = _lake(s3, tmp_path, "killed")
    lake.write(pl.DataFrame({"x": [1, 2]}), "t", "k1")
    files = lake.tables.file_uris("t/k1/data.parquet")
    _killed_write(s3, lake, "k1")                # a new version of k1, killed before its commit
    _killed_write(s3, lake, "k2")                # a first version of k2, killed likewise
    assert lake.tables.file_uris("t/k1/data.parquet") == files       # the log names only the committed file
    assert lake.read("t", "k1")["x"].to_list() == [1, 2]
    assert lake.tables.info("t/k1/data.parquet")["table_version"] == 0
    assert lake.partitions("t") == ["k1"] and not lake.exists("t", "k2")      # k2 was never committed
    with pytest.raises(FileNotFoundError, match=r"t\[k2\] has no committed table"):
        lake.read("t", "k2")
    assert lake.refresh_view("t", partitioned=True)
    with lake.connect_catalog() as con:
        assert con.execute("select sum(x) from t").fetchone() == (3,)
    lake.write(pl.DataFrame({"x": [5]}), "t", "k1", refresh=False)   # the next commit is version 1: no gap, no loss
    assert lake.tables.info("t/k1/data.parquet")["table_version"] == 1 and lake.read("t", "k1")["x"].to_list() == [5]
    assert lake.read("t", "k1", version=0)["x"].to_list() == [1, 2]  # time travel


def test_readers_never_see_an_uncommitted_version(s3, tmp_path):
    lake = _lake(s3, tmp_path, "readers")
    fs = lake.store.fs
    announced: dict[str, set[int]] = {"t/data.parquet": set(), "ds": set()}
    real_pipe = fs.pipe_file
    n_versions = 6

    def slow_commit(path, data, **kw):           # between the uploads and the manifest: 0.3 s
        if "/_latest/" in path:
            time.sleep(0.3)
            doc = json.loads(data)
            announced[doc["key"]].add(doc["rows"])
        return real_pipe(path, data, **kw)

    def frame(i):
        return pl.DataFrame({"v": [i] * i, "k": list(range(i))})

    lake.write(frame(1), "t", refresh=False)           # a Delta table: its commit is atomic in delta-rs
    lake.write_hf_dataset(frame(1), "ds", "version 1\n")
    announced["t/data.parquet"].add(1)
    announced["ds"].add(1)
    seen, bad, stop = [], [], threading.Event()

    def reader():
        try:
            read_loop()
        except BaseException as e:               # an exception would otherwise end the thread unseen
            bad.append(("reader raised", repr(e)))

    def read_loop():
        deadline = time.monotonic() + 120
        while not stop.is_set() and time.monotonic() < deadline:
            df = lake.read("t")
            i = df["v"][0]
            if df.height != i or set(df["v"]) != {i} or i not in announced["t/data.parquet"]:
                bad.append(("table", df.height, i))
            ds = lake.read_dataset("ds")
            j = ds["v"][0]
            if ds.height != j or set(ds["v"]) != {j} or j not in announced["ds"]:
                bad.append(("dataset", ds.height, j))
            doc = lake.store.manifest("ds")          # one version's two files: never a mix
            try:
                card = lake.store.read_bytes("ds", "README.md", manifest=doc).decode()
                data = pl.read_parquet(io.BytesIO(lake.store.read_bytes("ds", "data/train-00000-of-00001.parquet", manifest=doc)))
            except FileNotFoundError:                # that version aged out (keep_versions) meanwhile: documented
                continue
            if card != f"version {data.height}\n" or doc["rows"] != data.height:
                bad.append(("dataset files", card, data.height, doc["rows"]))
            seen.append((i, j))

    fs.pipe_file = slow_commit
    try:
        t = threading.Thread(target=reader, daemon=True)
        t.start()
        for i in range(2, n_versions + 1):
            announced["t/data.parquet"].add(i)        # before: a reader must still see only whole versions
            lake.write(frame(i), "t", refresh=False)
            lake.write_hf_dataset(frame(i), "ds", f"version {i}\n")
        time.sleep(0.5)
        stop.set()
        t.join(timeout=120)
    finally:
        fs.pipe_file = real_pipe
    assert not t.is_alive()
    assert not bad, bad[:5]
    assert len({i for i, _ in seen}) >= 2       # the reader overlapped several commits
    assert lake.read("t").height == n_versions


def test_a_bad_manifest_is_an_error_naming_it(s3, tmp_path):
    lake = _lake(s3, tmp_path, "badman")
    lake.write_json({"x": 1}, "t/config.json")        # JSON files and dataset folders keep the manifest commit
    assert lake.read_json("t/config.json") == {"x": 1}
    lake.store.fs.pipe_file(f"{BUCKET}/badman/t/_latest/config.json.json", b'{"format": "other"}')
    with pytest.raises(ValueError, match=rf"s3://{BUCKET}/badman/t/_latest/config.json.json: field 'format'"):
        lake.read_json("t/config.json")


def test_prod_profile_s3_root_with_a_configurable_endpoint(s3, tmp_path):
    from pipelines.profiles import load_prod_config, prod_resources

    cfg_file = tmp_path / "prod.yaml"
    cfg_file.write_text(f"lake: {{root: 's3://{BUCKET}/prod', endpoint_url: '{s3}', region: us-east-1, "
                        f"work_dir: '{tmp_path / 'work'}'}}\n")
    lake = prod_resources(load_prod_config(str(cfg_file)))["lake"]
    assert lake.remote and lake.root == f"s3://{BUCKET}/prod" and lake.catalog_path == tmp_path / "work" / "catalog.duckdb"
    (tmp_path / "work").mkdir()
    _, version = lake.write(pl.DataFrame({"a": [1, 2, 3]}), "benchmark_problems")
    assert lake.read("benchmark_problems")["a"].to_list() == [1, 2, 3]
    assert lake.table_info("benchmark_problems") == {"data_version": version, "rows": 3}
    assert "prod/benchmark_problems/data.delta/_delta_log/00000000000000000000.json" in _keys(s3, "prod/")


# -- Delta Lake: conflicts, versions, a second engine (issue 40 item 4) ------------------------------

def test_a_stale_writer_conflicts_loudly_and_nothing_is_lost(s3, tmp_path):
    """Two writers read version 0 of a table; the first commit wins, the second gets
    LakeConflictError naming the table (the old manifest format let the last manifest win silently)."""
    from ops.lake import LakeConflictError

    lake = _lake(s3, tmp_path, "conflict")
    lake.write(pl.DataFrame({"x": [0]}), "t", refresh=False)
    base = lake.tables.info("t/data.parquet")["table_version"]
    lake.write(pl.DataFrame({"x": [1, 1]}), "t", refresh=False, read_version=base)          # writer A
    with pytest.raises(LakeConflictError, match=rf"s3://{BUCKET}/conflict/t/data.delta \(based on version 0\)"):
        lake.write(pl.DataFrame({"x": [2, 2, 2]}), "t", refresh=False, read_version=base)   # writer B, stale
    assert lake.read("t")["x"].to_list() == [1, 1]
    assert lake.tables.info("t/data.parquet")["table_version"] == 1                      # B left no commit
    assert lake.read("t", version=0)["x"].to_list() == [0]


RACING_WRITER = """
import json, sys
import polars as pl
from ops.lake import LakeConflictError
from resources.lake import LakeResource
lake = LakeResource(root={root!r}, endpoint_url={endpoint!r}, region="us-east-1", work_dir={work!r})
won, lost = [], 0
for i in range({n}):
    df = pl.DataFrame({{"writer": [{w}] * 50, "i": [i] * 50}})
    try:
        won.append(lake.write(df, "t", refresh=False)[1])
    except LakeConflictError:
        lost += 1
print(json.dumps({{"won": won, "lost": lost}}))
"""


def test_two_racing_writer_processes_lose_nothing_silently(s3, tmp_path):
    """Two processes overwrite one table 15 times each at once: every write either committed (its
    data version is in the Delta log, in its own commit) or raised LakeConflictError."""
    lake = _lake(s3, tmp_path, "race")
    lake.write(pl.DataFrame({"writer": [0], "i": [0]}), "t", refresh=False)
    n = 15
    procs = [subprocess.Popen([sys.executable, "-c", RACING_WRITER.format(root=lake.root, endpoint=s3, work=lake.work_dir, n=n, w=w)],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}) for w in (1, 2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    won = [v for r in results for v in r["won"]]
    assert len(won) + sum(r["lost"] for r in results) == 2 * n
    from deltalake import DeltaTable

    dt = DeltaTable(lake.tables.uri("t/data.parquet"), storage_options=lake.tables.storage_options)
    committed = [h["crucible.data_version"] for h in dt.history() if h["version"] > 0]
    assert dt.version() == len(won) and sorted(committed) == sorted(won)   # one commit per win, none lost or doubled


SECOND_ENGINE = """
import json, sys
import polars as pl
from deltalake import DeltaTable
opts = {opts!r}
uri = {uri!r}
now = pl.read_delta(uri, storage_options=opts)
first = pl.read_delta(uri, version=0, storage_options=opts)
files = DeltaTable(uri, storage_options=opts).file_uris()
print(json.dumps({{"rows": now.height, "sum": int(now["x"].sum()), "rows_v0": first.height,
                  "files": len(files), "crucible_loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("ops", "resources", "assets"))}}))
"""


def test_a_second_engine_reads_the_tables_without_crucible(s3, tmp_path):
    """Polars' own Delta reader (current version and time travel) reads a table the lake wrote, in
    an isolated interpreter (``-I``: no repo on sys.path) that imports nothing of Crucible."""
    lake = _lake(s3, tmp_path, "engine")
    lake.write(pl.DataFrame({"x": [1, 2, 3]}), "t", refresh=False)
    lake.write(pl.DataFrame({"x": [10, 20, 30, 40]}), "t", refresh=False)
    code = SECOND_ENGINE.format(opts=lake.tables.storage_options, uri=lake.tables.uri("t/data.parquet"))
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ""}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got == {"rows": 4, "sum": 100, "rows_v0": 3, "files": 1, "crucible_loaded": []}


def test_data_versions_and_dtypes_match_a_local_lake(s3, tmp_path):
    """The Delta table's data version equals the local Parquet file's content hash for the same
    rows; unsigned (UInt64 beyond 2**63 too) and Categorical columns read back with their dtypes."""
    from resources.lake import LakeResource

    df = pl.DataFrame({"h": pl.Series([1, 2**64 - 1], dtype=pl.UInt64), "n": pl.Series([3, 4], dtype=pl.UInt32),
                       "c": pl.Series(["a", "b"], dtype=pl.Categorical), "s": ["x", None],
                       "l": [[{"k": 1}], []]})
    remote, local = _lake(s3, tmp_path, "dtypes"), LakeResource(root=str(tmp_path / "local"))
    _, v_remote = remote.write(df, "t", "p", refresh=False)
    _, v_local = local.write(df, "t", "p", refresh=False)
    assert v_remote == v_local and remote.table_info("t", "p") == local.table_info("t", "p") == {"data_version": v_local, "rows": 2}
    back = remote.read("t", "p")
    assert back.schema == df.schema and back.equals(df)
    assert remote.write(df.reverse(), "t", "p", refresh=False)[1] != v_remote
    # a frame of several chunks keeps its row order (delta-rs 1.6.6 reorders record batches otherwise)
    chunks = pl.concat([pl.DataFrame({"i": range(k * 100, k * 100 + n)}) for k, n in enumerate([48, 10, 1, 1, 3])], rechunk=False)
    assert chunks.n_chunks() == 5
    _, v = remote.write(chunks, "chunks", refresh=False)
    assert remote.read("chunks").equals(chunks) and v == local.write(chunks, "chunks", refresh=False)[1]


def test_table_path_gives_workers_a_local_copy_of_the_committed_version(s3, tmp_path):
    """Workers that open a path get a local Parquet file of the current Delta version under
    work_dir, whose content hash is the data version; a new commit gives a new file."""
    from ops.lake import file_sha256
    from resources.lake import LakeResource

    lake = _lake(s3, tmp_path, "workers")
    df = pl.DataFrame({"problem_id": ["a", "b", "c"], "n": pl.Series([1, 2, 3], dtype=pl.UInt32)})
    _, v1 = lake.write(df, "decontaminated_problems", refresh=False)
    p1 = lake.table_path("decontaminated_problems")
    assert p1 == tmp_path / "work" / ".lake-tables" / "decontaminated_problems" / f"data.{v1}.parquet"
    assert file_sha256(p1)[:16] == v1 and pl.read_parquet(p1).equals(df) and pl.read_parquet(p1).schema == df.schema
    inode = p1.stat().st_ino
    assert lake.table_path("decontaminated_problems") == p1 and p1.stat().st_ino == inode   # reused, not rewritten
    _, v2 = lake.write(df.head(1), "decontaminated_problems", refresh=False)
    p2 = lake.table_path("decontaminated_problems")
    assert p2 != p1 and pl.read_parquet(p2).height == 1 and file_sha256(p2)[:16] == v2
    with pytest.raises(FileNotFoundError, match=r"gba_run\[sync\] has no committed table"):
        lake.table_path("gba_run", "sync")
    local = LakeResource(root=str(tmp_path / "local"))                  # a local root: a snapshot the same way
    _, v_local = local.write(df, "decontaminated_problems", refresh=False)
    snap = local.table_path("decontaminated_problems")
    assert snap == tmp_path / "local" / ".lake-tables" / "decontaminated_problems" / f"data.{v_local}.parquet"
    assert file_sha256(snap)[:16] == v_local


def test_an_rl_run_reads_its_problems_through_the_lake_on_s3(s3, tmp_path):
    """rollarc_run on an s3 root: the driver's spec reads decontaminated_problems from the lake's
    local copy of the committed Delta version (before the issue: FileNotFoundError, the table was
    looked for under work_dir); here the table has no numeric problem, so the run fails on its
    content before any launch."""
    from tests.assets.test_rollarc_assets import assert_fails_without_a_numeric_problem

    version = assert_fails_without_a_numeric_problem(_lake(s3, tmp_path, "rl"))
    assert (tmp_path / "work" / ".lake-tables" / "decontaminated_problems" / f"data.{version}.parquet").is_file()


@pytest.mark.slow
def test_post_training_group_materializes_on_an_s3_root(s3, tmp_path):
    """The whole post-training chain (stage-1 SFT on 2 gloo ranks, failure regions, targeted
    synthesis, stage 2 with three seeds per arm, the comparison) on an s3:// root: its input tables
    only in the bucket, its tables committed as Delta tables, workers reading local copies, run
    folders and checkpoints under work_dir. About 2 min on the shared 2-core machine."""
    import shutil

    from assets import posttrain
    from resources.compute import ComputeResource
    from resources.lake import LakeResource
    from resources.teacher import TeacherResource
    from tests.assets.test_posttrain_assets import RUN_CONFIG
    from tests.assets.test_posttrain_assets import _lake as posttrain_inputs

    local = posttrain_inputs(tmp_path)          # tokenizer, student, plan.json under tmp/lake; tables there too
    work = tmp_path / "lake"
    lake = LakeResource(root=f"s3://{BUCKET}/post", endpoint_url=s3, region="us-east-1", work_dir=str(work))
    for t in ("benchmark_problems", "decontaminated_problems"):
        lake.write(local.read(t), t, refresh=False)
        shutil.rmtree(work / t)                 # the inputs are in the bucket only
    lake.write_hf_dataset(pl.read_parquet(work / "sft_dataset" / "data" / "*.parquet"), "sft_dataset", "# sft\n")
    shutil.rmtree(work / "sft_dataset")
    res = {"lake": lake, "compute": ComputeResource(num_processes=2, launch_timeout_s=300), "teacher": TeacherResource()}
    r = dg.materialize(posttrain.POSTTRAIN_ASSETS, resources=res, run_config=RUN_CONFIG)
    assert r.success
    meta = r.asset_materializations_for_node("sft_checkpoint")[0].metadata
    assert meta["world_size"].value == 2
    ev = lake.read("sft_checkpoint", name="eval.parquet")
    assert {"programmatic", "curated_heldout", "benchmark:gsm8k_test"} <= set(ev["slice"].to_list())
    arms = lake.read("targeted_synthesis")
    assert arms.filter(pl.col("arm") == "targeted").height == arms.filter(pl.col("arm") == "random").height > 0
    per_seed = lake.read("stage2_checkpoint", name="scored_seeds.parquet")
    assert per_seed.group_by("checkpoint").agg(pl.col("seed").n_unique())["seed"].to_list() == [3, 3]
    keys = _keys(s3, "post/")
    for table in ("sft_checkpoint/data", "sft_checkpoint/train", "failure_regions/data", "targeted_synthesis/data",
                  "stage2_checkpoint/data", "failure_driven_comparison/data"):
        assert f"post/{table}.delta/_delta_log/00000000000000000000.json" in keys, table
    assert not list(work.glob("*/data.parquet"))                # no table on local disk
    assert (work / ".lake-tables" / "sft_checkpoint").is_dir()  # the workers' local copies
    for arm in ("targeted", "random"):                           # run folders and checkpoints under work_dir
        assert (work / "stage2_checkpoint" / arm / "s0" / "model.safetensors").is_file()
    cmp = json.loads((work / "failure_driven_comparison" / "comparison.json").read_text())
    assert {row["checkpoint"] for row in cmp["table"]} == {"stage1", "stage2_targeted", "stage2_random"}


@pytest.mark.slow
def test_mixture_group_materializes_on_an_s3_root(s3, tmp_path):
    """The mixture group on an s3:// root: the tokenizer, a base-model partition and a probe partition
    (2 gloo ranks) from corpora in the bucket, then the law fit, its blocking check and the plan over
    law-generated probe tables committed to the bucket (20 partitions, read through the lake, not by
    globbing work_dir). Tables are Delta tables; tokenizer, models, run folders, fit.json and
    plan.json under work_dir. About 2 min on the shared 2-core machine."""
    from assets import mixture
    from resources.compute import ComputeResource
    from tests.assets import test_mixture_assets as tm

    lake = _lake(s3, tmp_path, "mix")
    work = tmp_path / "work"
    tm._corpora(lake)
    res = {"lake": lake, "compute": ComputeResource(num_processes=2, launch_timeout_s=300)}
    assert dg.materialize([mixture.cpt_tokenizer], resources=res,
                          run_config={"ops": {"cpt_tokenizer": {"config": {"vocab_size": 300}}}}).success
    assert dg.materialize([mixture.cpt_base_models], resources=res, partition_key="xs",
                          run_config={"ops": {"cpt_base_models": {"config": tm.TINY_BASE}}}).success
    key = dg.MultiPartitionKey({"size": "xs", "ratio": "0.50"})
    r = dg.materialize([mixture.cpt_probe_runs], resources=res, partition_key=key,
                       run_config={"ops": {"cpt_probe_runs": {"config": tm.TINY_CPT}}})
    assert r.success and r.asset_materializations_for_node("cpt_probe_runs")[0].metadata["world_size"].value == 2
    df = lake.read("cpt_probe_runs", "xs_r0.500")
    assert df["seed"].to_list() == [0] * 4 + [1] * 4 and df["tokens"].to_list() == [0, 128, 256, 512] * 2
    assert df["loss_domain"][-1] < df["loss_domain"][0]
    keys = _keys(s3, "mix/")
    assert "mix/cpt_probe_runs/xs_r0.500/data.delta/_delta_log/00000000000000000000.json" in keys
    assert (work / "cpt_tokenizer" / "tokenizer.json").is_file() and (work / "cpt_base_models" / "xs" / "base.json").is_file()
    assert not list(work.glob("*/data.parquet")) and not list(work.glob("*/*/data.parquet"))   # no table on local disk

    # the law fit and the plan over law-generated probe tables in the bucket (as tests/assets/test_mixture_assets.py)
    (tmp_path / "law").mkdir()
    law = _lake(s3, tmp_path / "law", "law")
    local = tm._law_lake(tmp_path / "law")                       # manifest.json and base.json under law/lake
    law_work = tmp_path / "law" / "work"
    import shutil

    shutil.copytree(tmp_path / "law" / "lake" / "cpt_tokenizer", law_work / "cpt_tokenizer")
    shutil.copytree(tmp_path / "law" / "lake" / "cpt_base_models", law_work / "cpt_base_models")
    for part in local.partitions("cpt_probe_runs"):
        law.write(local.read("cpt_probe_runs", part), "cpt_probe_runs", part, refresh=False)
    r = dg.materialize([mixture.dcpt_law_fit, mixture.mixture_plan, mixture.dcpt_fit_heldout_r2], resources={"lake": law},
                       run_config={"ops": {"dcpt_law_fit": {"config": {"n_boot": 4}}}})
    assert r.success and r.get_asset_check_evaluations()[0].passed
    fit = json.loads((law_work / "dcpt_law_fit" / "fit.json").read_text())
    local_fit = r.asset_materializations_for_node("dcpt_law_fit")[0].metadata
    assert fit["chosen_form"] == "L3" and len(local_fit["probe_partitions"].value) == 20
    plan = json.loads((law_work / "mixture_plan" / "plan.json").read_text())
    assert law.read("mixture_plan")["r_d"][0] == pytest.approx(plan["tradeoff"]["r_d"])
    assert "law/mixture_plan/data.delta/_delta_log/00000000000000000000.json" in _keys(s3, "law/")


@pytest.mark.slow
def test_training_group_materializes_on_an_s3_root(s3, tmp_path):
    """The training group on an s3:// root: ctr_events (real MovieLens-100k) into the bucket, ctr_model
    (DeepFM) reading it through the lake, gba_run's sync partition (2 gloo ranks) and gba partition
    (1 PS + 2 workers over RPC) reading the events from the lake's local copy under work_dir, their
    curves committed as Delta tables and the comparison across both modes. About 2 min on the shared
    2-core machine."""
    from assets import gba, recsys
    from resources.compute import ComputeResource
    from tests.assets.test_gba_assets import TINY
    from tests.conftest import materialize_logged

    lake = _lake(s3, tmp_path, "train")
    work = tmp_path / "work"
    assert dg.materialize([recsys.ctr_events], resources={"lake": lake}).success
    r = dg.materialize([recsys.ctr_model], resources={"lake": lake})
    assert r.success
    m = {k: v.value for k, v in r.asset_materializations_for_node("ctr_model")[0].metadata.items()}
    assert m["test_auc"] > m["baseline_lr_auc"] and lake.read("ctr_model").height == 20_001
    compute = ComputeResource(num_processes=2, launch_timeout_s=300)
    meta = {}
    for mode in ("sync", "gba"):
        res, meta[mode], _, _ = materialize_logged([gba.gba_run], {"lake": lake, "compute": compute},
                                                   {"ops": {"gba_run": {"config": TINY}}}, partition_key=mode)
        assert res.success
    s, g = meta["sync"], meta["gba"]
    assert (s["world_size"], g["world_size"]) == (2, 3)
    for x in (s, g):
        assert x["global_steps"] == 15.0 and 0.55 < x["test_auc"] < 0.75
    assert "| sync |" in g["comparison"] and "| gba |" in g["comparison"]
    assert lake.partitions("gba_run") == ["gba", "sync"]
    v = lake.table_info("ctr_events")["data_version"]
    assert (work / ".lake-tables" / "ctr_events" / f"data.{v}.parquet").is_file()       # the workers' copy
    keys = _keys(s3, "train/")
    for t in ("ctr_events/data", "ctr_model/data", "gba_run/sync/data", "gba_run/gba/data"):
        assert f"train/{t}.delta/_delta_log/00000000000000000000.json" in keys, t
    assert not list(work.glob("*/data.parquet")) and not list(work.glob("*/*/data.parquet"))   # no table on local disk


def test_two_writers_of_one_json_file_or_folder_conflict_loudly(s3, tmp_path):
    """ObjectStoreLake's manifest commit is a conditional PUT (If-Match on the manifest's ETag,
    If-None-Match on a new key): of two writers based on the same manifest, the second loses."""
    from ops.lake import LakeConflictError, ObjectStoreLake

    lake = _lake(s3, tmp_path, "jsonrace")
    store = lake.store
    assert store.conditional_commits
    lake.write_json({"v": 0}, "t/config.json")
    base = store.manifest_etag("t/config.json")
    assert base[0]["id"] and base[1]
    other = ObjectStoreLake(lake.root, {"endpoint_url": s3, "use_listings_cache": False,
                                        "client_kwargs": {"region_name": "us-east-1"}})   # a second writer
    other.write_json({"v": "winner"}, "t/config.json", base=base)
    with pytest.raises(LakeConflictError, match=rf"s3://{BUCKET}/jsonrace/t/config.json \(based on version {base[0]['id']}\)"):
        store.write_json({"v": "loser"}, "t/config.json", base=base)
    assert lake.read_json("t/config.json") == {"v": "winner"}
    doc = store.manifest("t/config.json")
    assert doc["history"] == [doc["id"], base[0]["id"]]          # the winner's history: nothing lost
    assert sorted(k.split("/")[4] for k in _keys(s3, "jsonrace/t/_v/config.json/")) == sorted(doc["history"])  # loser's objects gone

    # a new key: both saw no manifest (If-None-Match: *); a dataset folder
    empty = store.manifest_etag("ds")
    assert empty == (None, None)
    build = tmp_path / "build"
    (build / "data").mkdir(parents=True)
    pl.DataFrame({"x": [1, 2]}).write_parquet(build / "data" / "train-00000-of-00001.parquet")
    (build / "README.md").write_text("# first\n")
    other.write_dir(build, "ds", "v1", {"rows": 2}, base=empty)
    (build / "README.md").write_text("# second\n")
    with pytest.raises(LakeConflictError, match=rf"s3://{BUCKET}/jsonrace/ds \(based on no committed version\)"):
        store.write_dir(build, "ds", "v2", {"rows": 2}, base=empty)
    assert store.read_bytes("ds", "README.md") == b"# first\n"
    assert lake.read_dataset("ds")["x"].to_list() == [1, 2]

    # without an explicit base, a commit is based on the manifest read before its uploads
    fs, real_put = store.fs, store.fs.put_file

    def put_after_a_rival_commit(lpath, rpath, **kw):   # the rival commits while this writer uploads
        fs.put_file = real_put
        other.write_json({"v": "rival"}, "t/config.json")
        return real_put(lpath, rpath, **kw)

    fs.put_file = put_after_a_rival_commit
    try:
        with pytest.raises(LakeConflictError, match="lost to a concurrent commit"):
            lake.write_json({"v": "late"}, "t/config.json")
    finally:
        fs.put_file = real_put
    assert lake.read_json("t/config.json") == {"v": "rival"}
    lake.write_json({"v": "next"}, "t/config.json")              # based on the rival's version: commits
    assert lake.read_json("t/config.json") == {"v": "next"}


def test_a_killed_loser_leaves_an_orphan_the_next_commit_removes(s3, tmp_path):
    """When the loser cannot clean up (its delete fails), its version folder is an orphan that no
    reader sees and the next commit's gc removes once older than orphan_grace_s."""
    from ops.lake import LakeConflictError

    lake = _lake(s3, tmp_path, "orphan", orphan_grace_s=0.0)
    store = lake.store
    lake.write_json({"v": 0}, "c.json")
    base = store.manifest_etag("c.json")
    lake.write_json({"v": 1}, "c.json")
    fs, real_rm = store.fs, store.fs.rm
    fs.rm = lambda *a, **k: (_ for _ in ()).throw(OSError("connection reset (injected)"))
    try:
        with pytest.raises(LakeConflictError):
            store.write_json({"v": "loser"}, "c.json", base=base)
    finally:
        fs.rm = real_rm
    doc = store.manifest("c.json")
    present = {k.split("/")[3] for k in _keys(s3, "orphan/_v/c.json/")}
    assert len(present) == 3 and set(doc["history"]) < present   # the loser's folder is left over
    assert lake.read_json("c.json") == {"v": 1}
    lake.write_json({"v": 2}, "c.json")
    doc = store.manifest("c.json")
    assert {k.split("/")[3] for k in _keys(s3, "orphan/_v/c.json/")} == set(doc["history"])


def _vacuum_cli(s3, root, *args):
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "lake", "vacuum", "--root", root, "--endpoint-url", s3,
                           "--region", "us-east-1", *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "CRUCIBLE_PROFILE": "default"})


def test_lake_vacuum_removes_unreferenced_delta_files_and_the_tables_still_read(s3, tmp_path):
    lake = _lake(s3, tmp_path, "vac")
    v0 = pl.DataFrame({"x": pl.Series([1, 2], dtype=pl.UInt8), "s": ["a", "b"]})
    v1 = pl.DataFrame({"x": pl.Series([3], dtype=pl.UInt8), "s": ["c"]})
    lake.write(v0, "t", refresh=False)
    lake.write(v1, "t", refresh=False)                   # v0's file is now unreferenced (overwritten)
    lake.write(pl.DataFrame({"y": [7]}), "p", "k1", refresh=False)
    before = lake.table_info("t")
    table = f"{BUCKET}/vac/t/data.delta"
    current = lake.tables.file_uris("t/data.parquet")
    assert len(current) == 1
    buf = io.BytesIO()
    pl.DataFrame({"x": [99]}).write_parquet(buf)             # what a writer killed before its commit leaves
    orphan = "part-00000-killed-writer-c000.snappy.parquet"
    lake.store.fs.pipe_file(f"{table}/{orphan}", buf.getvalue())
    overwritten = {k.rpartition("/")[2] for k in _keys(s3, "vac/t/data.delta/part-")} - {orphan} - \
        {u.rpartition("/")[2] for u in current}
    assert len(overwritten) == 1

    res = _vacuum_cli(s3, lake.root, "--dry-run")           # default retention (168 h): everything is younger
    assert res.returncode == 0, res.stderr
    assert f"s3://{table}: would remove 0 files" in res.stdout and f"s3://{BUCKET}/vac/p/k1/data.delta: would remove 0 files" in res.stdout
    res = _vacuum_cli(s3, lake.root, "--retention-hours", "1")   # below Delta's 168 h: refused while enforced
    assert res.returncode == 2 and "minimum retention" in res.stderr and "Traceback" not in res.stderr
    assert "vac/" in res.stderr and ".delta" in res.stderr     # names the table

    res = _vacuum_cli(s3, lake.root, "--retention-hours", "0", "--no-enforce-retention", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert f"s3://{table}: would remove 2 files" in res.stdout and orphan in res.stdout
    assert orphan in {k.rpartition("/")[2] for k in _keys(s3, "vac/t/data.delta/")}      # a dry run deletes nothing
    res = _vacuum_cli(s3, lake.root, "--retention-hours", "0", "--no-enforce-retention")
    assert res.returncode == 0, res.stderr
    assert f"s3://{table}: removed 2 files" in res.stdout and "total: removed 2 files" in res.stdout
    left = {k.rpartition("/")[2] for k in _keys(s3, "vac/t/data.delta/part-")}
    assert left == {u.rpartition("/")[2] for u in current}   # the orphan and the overwritten file went; the current one stays
    assert lake.read("t").equals(v1)                         # reads, dtypes restored (UInt8) past VACUUM's own commits
    assert lake.table_info("t") == before
    assert lake.read("p", "k1")["y"].to_list() == [7]
    lake.write(pl.DataFrame({"x": pl.Series([4], dtype=pl.UInt8), "s": ["d"]}), "t", refresh=False)   # still writable
    assert lake.read("t")["x"].to_list() == [4]


def test_lake_vacuum_on_a_local_root(tmp_path):
    """A local root's tables are Delta tables too: ``crucible lake vacuum`` removes the overwritten
    version's file and the worker snapshot of that version, refuses a retention below Delta's in one
    line, and the table still reads."""
    from resources.lake import LakeResource

    lake = LakeResource(root=str(tmp_path))
    lake.write(pl.DataFrame({"x": [1]}), "t", refresh=False)
    snap = lake.table_path("t")                              # a worker's snapshot of version 0
    os.utime(snap, (snap.stat().st_mtime - 60,) * 2)
    lake.write(pl.DataFrame({"x": [2]}), "t", refresh=False)

    def cli(*extra):
        return subprocess.run([sys.executable, "-m", "pipelines.cli", "lake", "vacuum", "--root", str(tmp_path), *extra],
                              cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "CRUCIBLE_PROFILE": "default"})
    refused = cli("--retention-hours", "0")
    assert refused.returncode == 2 and "retention" in refused.stderr and "Traceback" not in refused.stderr
    res = cli("--retention-hours", "0", "--no-enforce-retention")
    assert res.returncode == 0, res.stderr
    assert f"{tmp_path / 't' / 'data.delta'}: removed 1 files" in res.stdout and "total: removed 2 files" in res.stdout
    assert "1 Delta tables" in res.stdout and "snapshots of versions no longer current): removed 1 files" in res.stdout
    assert not snap.exists() and lake.read("t")["x"].to_list() == [2]
