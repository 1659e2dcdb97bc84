"""The code location: loads fast, validates, and keeps the asset graph contract (names + lineage)."""

import os
import subprocess
import sys

import dagster as dg

from tests.conftest import ROOT

EXPECTED_DEPS = {
    "source_files": set(),
    "raw_problems": {"source_files"},
    "benchmark_problems": set(),
    "annotated_problems": {"raw_problems"},
    "exact_deduped_problems": {"annotated_problems"},
    "near_deduped_problems": {"exact_deduped_problems"},
    "dedup_clusters": {"exact_deduped_problems"},
    "decontaminated_problems": {"near_deduped_problems", "benchmark_problems"},
    "contamination_report": {"near_deduped_problems", "benchmark_problems"},
    "distilled_problems": {"decontaminated_problems"},
    "verification_report": {"decontaminated_problems"},
    "teacher_responses": {"decontaminated_problems"},
    "sft_dataset": {"distilled_problems"},
    "ctr_events": set(),
    "ctr_model": {"ctr_events"},
    "gba_run": {"ctr_events"},
    "rl_policy": set(),
    "rollpacker_run": {"decontaminated_problems", "rl_policy"},
    "rollarc_run": {"decontaminated_problems", "rl_policy"},
    "sft_checkpoint": {"benchmark_problems", "cpt_base_models", "cpt_tokenizer", "mixture_plan", "sft_dataset"},
    "failure_regions": {"sft_checkpoint"},
    "targeted_synthesis": {"benchmark_problems", "decontaminated_problems", "failure_regions"},
    "stage2_checkpoint": {"sft_checkpoint", "targeted_synthesis"},
    "failure_driven_comparison": {"failure_regions", "stage2_checkpoint"},
    "general_corpus": set(),
    "domain_corpus": {"decontaminated_problems"},
    "cpt_tokenizer": {"general_corpus", "domain_corpus"},
    "cpt_base_models": {"cpt_tokenizer"},
    "cpt_probe_runs": {"cpt_tokenizer", "cpt_base_models"},
    "dcpt_law_fit": {"cpt_probe_runs"},
    "mixture_plan": {"dcpt_law_fit"},
    "mixture_validation": {"mixture_plan", "dcpt_law_fit", "cpt_tokenizer", "cpt_base_models"},
}


def test_code_location_imports_under_3s_without_heavy_libraries():
    code = (
        # CPU time of the import, not wall time: what the code location costs, independent of how
        # busy the machine is (on a loaded 2-core CI box wall time doubles or triples).
        "import time, sys; t = time.process_time(); import pipelines.definitions; "
        "dt = time.process_time() - t; "
        "heavy = [m for m in ('torch', 'transformers', 'ray', 'sklearn', 'datasketch', 'math_verify', 'matplotlib', 'duckdb', 'openai', 'sentence_transformers', 's3fs') if m in sys.modules]; "
        "print(dt, ','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60,
                         env={**os.environ}).stdout.split()
    assert float(out[0]) < 3.0
    assert len(out) == 1, f"heavy modules imported at load: {out[1:]}"


def test_definitions_validate_and_keep_the_asset_graph_contract():
    from pipelines.definitions import defs

    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    deps = {k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys} for k in graph.get_all_asset_keys()}
    assert deps == EXPECTED_DEPS
    checks = {c.name for c in graph.asset_check_keys}
    assert checks == {"no_benchmark_overlap", "one_survivor_per_cluster", "annotated_required_fields",
                      "distilled_required_fields", "sft_strata_match_plan", "dcpt_fit_heldout_r2", "sft_checkpoint_learned",
                      "mixture_plan_holds"}
    for key in graph.asset_check_keys:  # every check blocks
        assert graph.get_check_spec(key).blocking


def test_partitions_are_builtin_sources_then_user_sources():
    """raw_problems' partitions are dynamic (kept in the instance by the sources sensor); the keys
    the sensor and ``crucible demo`` add are the built-in sources, then the YAML's entries."""
    from assets.sources import SOURCE_PARTITIONS, current_source_keys, sync_source_partitions
    from resources.sources import source_partition_keys

    assert isinstance(SOURCE_PARTITIONS, dg.DynamicPartitionsDefinition)
    assert source_partition_keys() == ["math_test", "mathematics_dataset", "mmlu_dev_val", "arc", "user_bad", "user_nodup", "user_wrongmap"]
    with dg.instance_for_test() as instance:
        assert sync_source_partitions(instance) == (source_partition_keys(), [])
        assert sync_source_partitions(instance, ["arc", "user_bad"]) == ([], ["math_test", "mathematics_dataset", "mmlu_dev_val",
                                                                              "user_nodup", "user_wrongmap"])
        assert current_source_keys(instance) == ["arc", "user_bad"]
