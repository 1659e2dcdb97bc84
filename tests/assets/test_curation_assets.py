"""Asset tests with dagster.materialize on small inputs (user sources), and the checks failing."""

import dagster as dg
import polars as pl
import pytest

from assets import curation, curation_checks, sources
from resources.lake import LakeResource
from resources.sources import SourcesResource
from resources.teacher import TeacherResource

ASSETS = [sources.raw_problems, sources.benchmark_problems, curation.annotated_problems, curation.exact_deduped_problems,
          curation.near_deduped_problems]


def _instance() -> dg.DagsterInstance:
    """An ephemeral instance holding the declared source partitions (raw_problems' are dynamic)."""
    instance = dg.DagsterInstance.ephemeral()
    sources.sync_source_partitions(instance)
    return instance


def _mat(selection, lake, partition=None, run_config=None, assets=ASSETS):
    return dg.materialize(assets, selection=selection, partition_key=partition, instance=_instance(),
                          resources={"lake": lake, "sources": SourcesResource(), "teacher": TeacherResource()},
                          run_config=run_config or {})


def _meta(result, key):
    [mat] = [m for m in result.asset_materializations_for_node(result.all_node_events[0].node_name) if m.asset_key.to_user_string() == key] or [None]
    return mat


def test_user_source_quarantine_and_no_duplicates_case(tmp_path):
    lake = LakeResource(root=str(tmp_path))
    res = _mat(["raw_problems"], lake, "user_bad")
    assert res.success
    q = lake.read("raw_problems_quarantine", "user_bad")
    assert sorted(q["line"].to_list()) == [2, 3, 4, 5, 6, 7]
    assert set(q["file"].to_list()) == {str(SourcesResource().user_sources()["user_bad"].path)}
    assert lake.read("raw_problems", "user_bad").height == 6
    mat = res.asset_materializations_for_node("raw_problems")[0]
    assert mat.metadata["quarantined"].value == 6 and mat.metadata["rows_in"].value == 12

    # case dedup-no-duplicates: 100 distinct problems -> 100 rows, zero clusters, 0 removed
    assert _mat(["raw_problems"], lake, "user_nodup").success
    res = _mat(["annotated_problems", "exact_deduped_problems", "near_deduped_problems", "dedup_clusters"], lake,
               run_config={"ops": {"annotated_problems": {"config": {"allow_missing_sources": True, "llm_label_max_rows": 0}}}})
    assert res.success
    near = [m for m in res.asset_materializations_for_node("near_deduped_problems") if m.asset_key.path == ["near_deduped_problems"]][0]
    assert near.metadata["near_duplicates_removed"].value == 0
    kept = lake.read("near_deduped_problems")
    assert kept.filter(pl.col("source") == "user_nodup").height == 100
    assert lake.read("dedup_clusters").height == 0


def test_a_wrong_field_mapping_fails_the_partition_naming_file_and_reason(tmp_path):
    lake = LakeResource(root=str(tmp_path))
    with pytest.raises(Exception, match=r"user_wrongmap.*user_nodup.jsonl.*100 of 100 rows quarantined.*missing mapped field 'prompt'"):
        _mat(["raw_problems"], lake, "user_wrongmap")
    assert lake.read("raw_problems_quarantine", "user_wrongmap").height == 100  # kept for inspection
    assert not lake.exists("raw_problems", "user_wrongmap")


def test_missing_partitions_fail_with_their_names(tmp_path):
    lake = LakeResource(root=str(tmp_path))
    _mat(["raw_problems"], lake, "user_nodup")
    with pytest.raises(Exception, match=r"not materialized: \['math_test'"):
        _mat(["annotated_problems"], lake)


def test_near_dedup_config_error_is_clear(tmp_path):
    lake = LakeResource(root=str(tmp_path))
    _mat(["raw_problems"], lake, "user_nodup")
    _mat(["annotated_problems", "exact_deduped_problems"], lake,
         run_config={"ops": {"annotated_problems": {"config": {"allow_missing_sources": True, "llm_label_max_rows": 0}}}})
    with pytest.raises(Exception, match=r"threshold.*must be in \(0, 1\]"):
        _mat(["near_deduped_problems", "dedup_clusters"], lake,
             run_config={"ops": {"near_deduped_problems": {"config": {"threshold": 1.5}}}})
    assert not lake.exists("near_deduped_problems")  # nothing half-written


def test_one_survivor_check_fails_on_a_broken_cluster_table(tmp_path):
    lake = LakeResource(root=str(tmp_path))
    lake.write(pl.DataFrame({"problem_id": ["a", "c"]}), "near_deduped_problems")
    good = pl.DataFrame({"cluster_id": ["a", "a"], "problem_id": ["a", "b"], "source": ["s", "s"], "is_survivor": [True, False],
                         "stage": ["survivor", "near"], "matched_to": ["a", "a"], "jaccard": [1.0, 0.9]})
    lake.write(good, "dedup_clusters")
    assert curation_checks.one_survivor_per_cluster(lake=lake).passed
    lake.write(good.with_columns(is_survivor=pl.lit(True)), "dedup_clusters")  # two survivors in one cluster
    bad = curation_checks.one_survivor_per_cluster(lake=lake)
    assert not bad.passed and bad.metadata["clusters_without_exactly_one_survivor"].value == 1
    lake.write(good.with_columns(problem_id=pl.Series(["a", "c"])), "dedup_clusters")  # removed row still in output
    assert not curation_checks.one_survivor_per_cluster(lake=lake).passed


def test_merge_clusters_repoints_exact_members_to_the_final_survivor():
    exact = pl.DataFrame({"cluster_id": ["x", "x"], "problem_id": ["x", "y"], "source": ["s", "s"], "is_survivor": [True, False],
                          "stage": ["survivor", "exact"], "matched_to": ["x", "x"], "jaccard": [1.0, 1.0]})
    near = pl.DataFrame({"cluster_id": ["z", "z"], "problem_id": ["z", "x"], "source": ["s", "s"], "is_survivor": [True, False],
                         "stage": ["survivor", "near"], "matched_to": ["z", "z"], "jaccard": [1.0, 0.85]})
    merged = curation.merge_clusters(exact, near)
    assert set(merged["cluster_id"].to_list()) == {"z"}
    assert merged.filter(pl.col("is_survivor"))["problem_id"].to_list() == ["z"]
    assert sorted(merged["problem_id"].to_list()) == ["x", "y", "z"]


def test_one_bad_source_entry_fails_only_its_own_partition(tmp_path):
    from resources.sources import parse_sources_file, source_partition_keys

    (tmp_path / "a.jsonl").write_text('{"problem": "What is 1 + 1?", "answer": "2"}\n')
    cfg = tmp_path / "s.yaml"
    cfg.write_text("sources:\n  - {name: fine, path: a.jsonl}\n  - {name: broken, path: a.jsonl, fields: {answer: a}}\n")
    assert source_partition_keys(str(cfg))[-2:] == ["fine", "broken"]
    good, errors = parse_sources_file(str(cfg))
    assert list(good) == ["fine"] and "no 'problem' entry" in errors["broken"]
    res = SourcesResource(config_file=str(cfg))
    assert res.source_error("broken") and res.source_error("fine") is None


def test_llm_label_path_sets_provenance_from_the_teacher_reply(tmp_path):
    from tests.stub_openai import StubOpenAI

    lake = LakeResource(root=str(tmp_path))
    assert _mat(["raw_problems"], lake, "user_nodup").success
    with StubOpenAI(reply="Physics") as stub:
        teacher = TeacherResource(base_url=stub.base_url, model="stub")
        res = dg.materialize(ASSETS, selection=["annotated_problems"], instance=_instance(),
                             resources={"lake": lake, "sources": SourcesResource(), "teacher": teacher},
                             run_config={"ops": {"annotated_problems": {"config": {"allow_missing_sources": True, "llm_label_max_rows": 3,
                                                                                     "min_confidence": 1.01}}}})
    assert res.success
    ann = lake.read("annotated_problems")
    llm = ann.filter(pl.col("domain_provenance") == "llm")
    assert llm.height == 3 and set(llm["domain"].to_list()) == {"physics"}
    assert stub.requests == 3
