"""Decontamination beyond one machine (docs/curation.md, "Beyond one machine"): shard steps as Dagster partitions
and one merge per synchronisation point give the single-machine decontaminated_problems and contamination_report
row for row."""

from collections import Counter

import dagster as dg
import polars as pl

from assets import curation, curation_sharded
from assets.curation_sharded import DECONTAM_SYNCS, DEDUP_SHARDS, step_name, sync_name
from ops.curation.decontam_shard import max_syncs
from resources.lake import LakeResource
from resources.teacher import TeacherResource
from tests.conftest import planted_decontam_corpus

ASSETS = [curation.decontaminated_problems, *curation_sharded.DECONTAM_STEPS, *curation_sharded.DECONTAM_SYNC_POINTS,
          curation_sharded.decontam_assemble]


def test_sharded_decontamination_equals_the_single_machine_tables(tmp_path, benchmark, math_test_rows):
    lake = LakeResource(root=str(tmp_path))
    resources = {"lake": lake, "teacher": TeacherResource()}
    lake.write(pl.DataFrame([{k: b[k] for k in ("benchmark", "item_id", "problem")} for b in benchmark
                             if b["benchmark"] in ("math500", "gsm8k_test")]), "benchmark_problems")
    corpus = planted_decontam_corpus(benchmark, math_test_rows)
    lake.write(pl.DataFrame(corpus).drop("kind"), "near_deduped_problems")
    assert dg.materialize(ASSETS, selection=["decontaminated_problems", "contamination_report"], resources=resources).success
    keys = DEDUP_SHARDS.get_partition_keys()
    for k in range(1, DECONTAM_SYNCS + 2):  # one run per shard and step, as a backfill launches them
        for key in keys:
            assert dg.materialize(ASSETS, selection=[step_name(k)], partition_key=key, resources=resources).success
        if k <= DECONTAM_SYNCS:
            assert dg.materialize(ASSETS, selection=[sync_name(k)], resources=resources).success
    res = dg.materialize(ASSETS, selection=["decontaminated_problems_sharded", "contamination_report_sharded"],
                         resources=resources)
    assert res.success
    single, sharded = lake.read("decontaminated_problems"), lake.read("decontaminated_problems_sharded")
    report, sharded_report = lake.read("contamination_report"), lake.read("contamination_report_sharded")
    assert single.equals(sharded) and report.equals(sharded_report)
    # not a vacuous equality: the planted contaminants are gone, by several layers, and the shards were real
    kind = {r["problem_id"]: r["kind"] for r in corpus}
    removed = Counter(kind[p] for p in report["problem_id"].to_list())
    assert report.height >= 150 and set(report["layer"].to_list()) >= {"exact", "ngram", "sibling", "semantic"}
    for k in ("light_edit", "escaped", "sibling", "rephrased", "exemplar"):  # every planted contaminant
        assert removed[k] == sum(1 for v in kind.values() if v == k) > 0, k
    assert removed["unrelated"] == 0 and removed["real"] >= 60  # the MATH-500 items among the real problems
    # the 60 fragment rows: their n-grams are in 60 training rows, over max_train_df = 50, so the n-gram layer takes
    # them for a template of the corpus and MiniLM removes them as rephrasings; no shard holds 50 of them, so with
    # shard-local counts the n-gram layer would have (tests/ops/test_decontam_shard.py)
    layer = dict(zip(report["problem_id"].to_list(), report["layer"].to_list()))
    assert Counter(layer[p] for p, k in kind.items() if k == "fragment") == {"semantic": 60}
    shard_rows = [lake.read(step_name(1), key, name="rows.parquet") for key in keys]
    for template in ("exemplar", "fragment"):
        per_shard = [sum(kind[p] == template for p in r["problem_id"].to_list()) for r in shard_rows]
        assert sum(per_shard) == 60 and max(per_shard) < 50, template
    assert sum(r.height for r in shard_rows) == len(corpus) and min(r.height for r in shard_rows) > 0
    meta = res.asset_materializations_for_node("decontam_assemble")[0].metadata
    points = meta["synchronisation_points"].value
    assert points[:3] == ["ngram (round 1)", "sibling (round 1)", "semantic (round 1)"]
    assert len(points) == 3 * meta["rounds"].value + (meta["rounds"].value < 3) and DECONTAM_SYNCS == max_syncs(3)
    assert meta["removed"].value == report.height and meta["merged_statistics_bytes"].value > 0
