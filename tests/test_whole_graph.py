"""The whole curation graph on a small configuration of the real sources, checks included."""

import dagster as dg
import polars as pl

from ops.curation.text import normalize
from pipelines.definitions import defs
from resources.lake import LakeResource
from resources.sources import SourcesResource, source_partition_keys
from resources.teacher import TeacherResource


def test_whole_curation_graph_on_real_sources(tmp_path):
    import datasets

    lake = LakeResource(root=str(tmp_path / "lake"))
    resources = {"lake": lake, "sources": SourcesResource(), "teacher": TeacherResource()}
    instance = dg.DagsterInstance.ephemeral()
    from assets.sources import sync_source_partitions

    sync_source_partitions(instance)          # raw_problems' partitions are dynamic: no sensor runs here
    raw_cfg = {"ops": {"raw_problems": {"config": {"mathematics_dataset_per_module": 1, "limit": 600}}}}
    for key in [k for k in source_partition_keys() if k != "user_wrongmap"]:  # that one fails on purpose
        res = defs.resolve_job_def("sources_job").execute_in_process(
            instance=instance, partition_key=key, run_config=raw_cfg, resources=resources
        )
        assert res.success, key
    res = defs.resolve_job_def("curation_job").execute_in_process(
        instance=instance, resources=resources,
        run_config={"ops": {
            "annotated_problems": {"config": {"llm_label_max_rows": 2, "allow_missing_sources": True}},
            "sft_dataset": {"config": {"target_size": 300, "stratum_floor": 5}},
            # the embedded teacher (real ops.teacher.serve), on a tiny slice to keep CI fast
            "distilled_problems": {"config": {"teacher_max_rows": 2, "k_samples": 2, "max_tokens": 24}},
        }},
    )
    assert res.success
    # one embedded teacher server for the run: annotated_problems starts it, distilled_problems reuses it
    # (two starts before), and Dagster's teardown stops it at the end of the run
    started = [e.message for e in instance.all_logs(res.run_id) if "embedded teacher server on" in (e.message or "")]
    assert len(started) == 1 and "for this run" in started[0], started
    ann_md = instance.get_latest_materialization_event(dg.AssetKey("annotated_problems")).asset_materialization.metadata
    assert ann_md["llm_labels"].value["asked"] > 0           # both steps used the teacher: one start is a reuse
    from ops.teacher.server import port_in_use

    port = int(started[0].split("http://127.0.0.1:")[1].split("/")[0])
    assert not port_in_use(port)
    checks = [e for e in res.get_asset_check_evaluations()]
    assert len(checks) == 5 and all(c.passed for c in checks)

    bench = lake.read("benchmark_problems")
    m500 = {normalize(p) for p in bench.filter(pl.col("benchmark") == "math500")["problem"].to_list()}
    near = lake.read("near_deduped_problems")
    in_math500 = [normalize(p) in m500 for p in near.filter(pl.col("source") == "math_test")["problem"].to_list()]
    assert sum(in_math500) > 0  # the small slice of MATH test does contain MATH-500 problems...
    decon = lake.read("decontaminated_problems")
    assert not any(normalize(p) in m500 for p in decon["problem"].to_list())  # ...and none survive

    samples = lake.read("teacher_responses")
    assert samples.height == 4 and set(samples["status"].to_list()) <= {"verified", "wrong", "unparseable_prediction"}
    ann = lake.read("annotated_problems")
    assert ann.filter(pl.col("domain_provenance") == "llm").height <= 2

    sft = datasets.load_dataset("parquet", data_dir=str(tmp_path / "lake" / "sft_dataset"))["train"]
    assert sft.num_rows == 300
    assert not any(normalize(p) in m500 for p in sft["problem"])
    assert all(m[1]["content"] for m in sft["messages"])
    card = (tmp_path / "lake" / "sft_dataset" / "README.md").read_text()
    assert "decontaminated_problems" in card and "Lineage" in card

    # lineage audit from the instance alone: every upstream step with its run and data version
    from pipelines.lineage import lineage_report

    rows = lineage_report(instance, defs.resolve_asset_graph(), "sft_dataset")
    steps = {r["asset"] + (f"[{r['partition']}]" if r["partition"] else "") for r in rows}
    assert {"sft_dataset", "distilled_problems", "decontaminated_problems", "benchmark_problems", "near_deduped_problems",
            "exact_deduped_problems", "annotated_problems", "raw_problems[math_test]", "raw_problems[user_bad]"} <= steps
    by = {r["asset"]: r for r in rows if not r["partition"]}
    from ops.lake import parquet_data_version

    # the recorded version is the content hash of the rows in the lake (a Delta table on a local root too)
    assert by["decontaminated_problems"]["data_version"] == parquet_data_version(lake.read("decontaminated_problems"))
    assert by["decontaminated_problems"]["checks"] == {"no_benchmark_overlap": "SUCCEEDED"}
    assert by["decontaminated_problems"]["figures"]["math500_recall"] == 1.0
    assert by["sft_dataset"]["run_id"] == res.run_id

    import duckdb

    con = duckdb.connect(str(tmp_path / "lake" / "catalog.duckdb"), read_only=True)
    assert con.execute("select count(*) from sft_dataset").fetchone()[0] == 300
    assert con.execute("select count(*) from raw_problems_quarantine").fetchone()[0] == 6
    import os

    umask = os.umask(0)
    os.umask(umask)
    for p in (tmp_path / "lake" / "sft_dataset" / "data", tmp_path / "lake" / "sft_dataset" / "data" / "train-00000-of-00001.parquet"):
        full = 0o777 if p.is_dir() else 0o666
        assert p.stat().st_mode & 0o777 == full & ~umask  # published with normal permissions, not mkstemp's 0600
