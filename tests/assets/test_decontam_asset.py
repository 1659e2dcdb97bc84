"""decontaminated_problems on a small lake: layers, per-layer counts and the labelled set in the metadata, and the
no_benchmark_overlap check (issue 19)."""

import dagster as dg
import polars as pl

from assets import curation, curation_checks
from ops.curation.decontam_set import HAND_REPHRASED, HAND_SIBLINGS, HAND_UNRELATED
from resources.lake import LakeResource
from resources.teacher import TeacherResource


def test_decontaminated_problems_reports_layers_and_passes_its_check(tmp_path, benchmark):
    lake = LakeResource(root=str(tmp_path))
    bench = pl.DataFrame([{k: b[k] for k in ("benchmark", "item_id", "problem")} for b in benchmark
                          if b["benchmark"] in ("math500", "gsm8k_test")])
    lake.write(bench, "benchmark_problems")
    m500 = {b["item_id"]: b["problem"] for b in benchmark if b["benchmark"] == "math500"}
    texts = [m500["math500/55"].replace("\\", "\\\\"), HAND_SIBLINGS["math500/438"], HAND_REPHRASED["math500/140"]] + \
        [t for _, t in HAND_UNRELATED[:3]]
    rows = pl.DataFrame({"problem_id": [f"p{i}" for i in range(len(texts))], "source": ["user"] * len(texts),
                         "record": [str(i) for i in range(len(texts))], "problem": texts})
    lake.write(rows, "near_deduped_problems")
    res = dg.materialize([curation.decontaminated_problems], resources={"lake": lake, "teacher": TeacherResource()})
    assert res.success
    [mat] = [m for m in res.asset_materializations_for_node("decontaminated_problems")
             if m.asset_key.path == ["decontaminated_problems"]]
    per_layer = mat.metadata["removed_per_layer"].value
    assert (per_layer["exact"], per_layer["sibling"], per_layer["semantic"]) == (1, 1, 1)
    assert mat.metadata["policy"].value == "strict"
    labelled = mat.metadata["labelled_set"].value
    assert labelled["recall"] >= 0.9 and set(labelled["layers"]) >= {"exact", "sibling", "semantic"}
    report = lake.read("contamination_report").sort("problem_id")
    assert report["item_id"].to_list() == ["math500/55", "math500/438", "math500/140"]
    assert report["layer"].to_list() == ["exact", "sibling", "semantic"]
    assert lake.read("decontaminated_problems").height == 3
    assert (tmp_path / "decontam" / "embeddings.parquet").exists()
    check = curation_checks.no_benchmark_overlap(lake=lake)
    assert check.passed and check.metadata["rows_with_half_of_a_math500_problems_8grams"].value == 0
    # a sibling slipped into the output fails the check, by the detector and by the 8-gram criterion
    lake.write(pl.concat([lake.read("decontaminated_problems"), rows.filter(pl.col("problem_id") == "p1")]),
               "decontaminated_problems")
    check = curation_checks.no_benchmark_overlap(lake=lake)
    assert not check.passed and check.metadata["rows_with_half_of_a_math500_problems_8grams"].value == 1
