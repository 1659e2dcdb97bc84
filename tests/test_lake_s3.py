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
    """A moto S3 server on 127.0.0.1 (random port) with one bucket; yields its endpoint URL."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)    # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    mp = pytest.MonkeyPatch()
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        mp.setenv(k, v)
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    try:
        yield endpoint
    finally:
        mp.undo()
        server.stop()


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
    # the tables are in the bucket, committed: a manifest per table, the object under _v/
    keys = _keys(s3, "lake/")
    assert "lake/annotated_problems/_latest/data.parquet.json" in keys
    assert "lake/exact_deduped_problems/_latest/clusters.parquet.json" in keys
    assert "lake/raw_problems/user_nodup/_latest/data.parquet.json" in keys
    man = json.loads(s3lake.store.fs.cat_file(f"{BUCKET}/lake/near_deduped_problems/_latest/data.parquet.json"))
    assert man["version"] == got["near_deduped_problems"] and man["rows"] == kept.height
    assert f"lake/near_deduped_problems/_v/data.parquet/{man['id']}/data.parquet" in keys
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
import sys, time
import polars as pl
from resources.lake import LakeResource
lake = LakeResource(root={root!r}, endpoint_url={endpoint!r}, region="us-east-1", work_dir={work!r})
fs = lake.store.fs
def hang(path, data, **kw):              # the manifest PUT: never reached before the kill
    print("uploaded", flush=True)
    time.sleep(120)
fs.pipe_file = hang
lake.write(pl.DataFrame({{"x": [9, 9, 9]}}), "t", {partition!r})
"""


def _killed_write(s3, lake, partition):
    """Run a writer process for ``t[partition]`` and SIGKILL it once its object is uploaded."""
    code = KILLED_WRITER.format(root=lake.root, endpoint=s3, work=lake.work_dir, partition=partition)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = [None]
        reader = threading.Thread(target=lambda: line.__setitem__(0, proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout=120)
        assert line[0] == "uploaded\n", proc.stderr.read() if proc.poll() is not None else "writer did not upload in 120 s"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_a_killed_writer_leaves_the_manifest_and_previous_version(s3, tmp_path):
    lake = _lake(s3, tmp_path, "killed")
    lake.write(pl.DataFrame({"x": [1, 2]}), "t", "k1")
    man = lake.store.fs.cat_file(f"{BUCKET}/killed/t/k1/_latest/data.parquet.json")
    _killed_write(s3, lake, "k1")                # a new version of k1, killed before its commit
    _killed_write(s3, lake, "k2")                # a first version of k2, killed likewise
    assert lake.store.fs.cat_file(f"{BUCKET}/killed/t/k1/_latest/data.parquet.json") == man
    assert lake.read("t", "k1")["x"].to_list() == [1, 2]
    assert lake.partitions("t") == ["k1"] and not lake.exists("t", "k2")      # k2 was never committed
    with pytest.raises(FileNotFoundError, match=r"t\[k2\] has no committed table"):
        lake.read("t", "k2")
    assert lake.refresh_view("t", partitioned=True)
    with lake.connect_catalog() as con:
        assert con.execute("select sum(x) from t").fetchone() == (3,)
    # the killed upload is an orphan: kept within orphan_grace_s, collected by the next commit after it
    objs = lambda: _keys(s3, "killed/t/k1/_v/")  # noqa: E731
    assert len(objs()) == 2
    lake.write(pl.DataFrame({"x": [5]}), "t", "k1", refresh=False)
    assert len(objs()) == 3                      # v1 (previous), v2 (current), the orphan (young)
    eager = _lake(s3, tmp_path, "killed", orphan_grace_s=0.0)
    eager.write(pl.DataFrame({"x": [6]}), "t", "k1", refresh=False)
    ids = json.loads(lake.store.fs.cat_file(f"{BUCKET}/killed/t/k1/_latest/data.parquet.json"))["history"]
    assert len(ids) == 2 and sorted(k.split("/")[5] for k in objs()) == sorted(ids)   # previous and current only
    assert lake.read("t", "k1")["x"].to_list() == [6]


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

    lake.write(frame(1), "t", refresh=False)
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
    lake.write(pl.DataFrame({"x": [1]}), "t", refresh=False)
    lake.store.fs.pipe_file(f"{BUCKET}/badman/t/_latest/data.parquet.json", b'{"format": "other"}')
    with pytest.raises(ValueError, match=rf"s3://{BUCKET}/badman/t/_latest/data.parquet.json: field 'format'"):
        lake.read("t")


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
    assert "prod/benchmark_problems/_latest/data.parquet.json" in _keys(s3, "prod/")
