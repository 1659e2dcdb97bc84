"""Size presets (issue 41 item 6): ``demo`` / ``small`` / ``full`` name only real ops and fields,
``crucible demo --preset`` parses and rejects an unknown one in one line, and a run launched with a
preset carries its sizes as run config and its own ``crucible/preset`` / ``dagster/max_runtime`` tags."""

import os
import subprocess
import sys

import dagster as dg
import pytest

from pipelines.definitions import ASSET_MODULES
from pipelines.presets import DEMO_SIZES, PRESETS, PROD_SIZES, SizesError, preset_run_config, preset_sizes
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def unsized():
    """The code location's assets without the profile's size defaults."""
    return dg.load_assets_from_modules(ASSET_MODULES)


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_names_only_existing_ops_and_fields(unsized, name):
    sizes = preset_sizes(name, unsized)                       # SizesError otherwise
    assert sizes == {op: dict(v) for op, v in PRESETS[name].items()}


def test_the_demo_preset_shrinks_the_slow_steps_and_keeps_every_stage(unsized):
    """Fewer steps / rows / seeds than the assets' defaults, never zero: every stage still does work."""
    from pipelines.config_paths import field_at
    from pipelines.presets import config_classes

    classes = config_classes(unsized)
    for op, values in DEMO_SIZES.items():
        for field, v in values.items():
            own = field_at(classes[op], field).default        # a dotted path names a nested field (arc.steps)
            if (op, field) == ("mixture_plan", "target_tokens"):  # 0 = derived: 4x the largest probed D
                assert own == 0
                own = 4 * field_at(classes["cpt_probe_runs"], "cpt_tokens").default
            if isinstance(v, bool):                           # an extra verification switched off
                assert v is False and own is True, (op, field)
            elif isinstance(v, list):
                assert 0 < len(v) < len(own), (op, field)
            else:
                assert 0 < v < own, (op, field)
    assert {"rl_policy", "distilled_problems", "cpt_probe_runs", "targeted_synthesis"} <= set(DEMO_SIZES)


def test_the_demo_preset_runs_a_subset_of_gba_modes_and_other_presets_all(monkeypatch):
    from ops.gba.config import MODES
    from pipelines.presets import preset_partitions

    assert preset_partitions("demo", "gba_job", MODES) == ["sync", "async", "gba", "auto"]
    assert preset_partitions("small", "gba_job", MODES) == list(MODES) == preset_partitions("full", "gba_job", MODES)
    assert preset_partitions("demo", "cpt_probe_job", ["a", "b"]) == ["a", "b"]
    with pytest.raises(ValueError, match=r"PRESET_PARTITIONS\['demo'\]\['gba_job'\] \(pipelines/presets.py\): 'sync' "
                                         r"is not a partition of gba_job; partitions: gba, auto"):
        preset_partitions("demo", "gba_job", ["gba", "auto"])


def test_a_preset_with_a_wrong_op_or_field_is_a_sizes_error(unsized, monkeypatch):
    monkeypatch.setitem(PRESETS, "broken", {"rl_policy": {"max_step": 5}})
    with pytest.raises(SizesError, match=r"PRESETS\['broken'\] \(pipelines/presets.py\): rl_policy.max_step is not a "
                                         r"field of RlPolicyConfig; fields: .*max_steps"):
        preset_sizes("broken", unsized)
    monkeypatch.setitem(PRESETS, "broken", {"rl_polic": {"max_steps": 5}})
    with pytest.raises(SizesError, match=r"'rl_polic' is not an op of the code location"):
        preset_sizes("broken", unsized)
    with pytest.raises(ValueError, match=r"unknown size set 'nope'; size sets are demo, small, full"):
        preset_sizes("nope", unsized)


def test_a_preset_other_than_the_profiles_resets_what_the_profile_changed(unsized):
    """Under ``prod`` (code-location defaults = production sizes) ``--preset small`` passes the assets'
    own defaults for every field production changed; ``--preset full`` passes the profile's sizes
    (the prod YAML's included)."""
    prod = {**PROD_SIZES, "sft_dataset": {"target_size": 50_000}}
    small = preset_sizes("small", unsized, "full", prod)
    assert small["sft_dataset"] == {"target_size": 2000}
    assert small["rl_policy"] == {"max_steps": 1000, "batch_problems": 32, "timeout_s": 3600.0}
    assert small["raw_problems"] == {"mathematics_dataset_per_module": 20, "limit": None}
    demo = preset_sizes("demo", unsized, "full", prod)
    assert demo["rl_policy"]["max_steps"] == DEMO_SIZES["rl_policy"]["max_steps"] and demo["rl_policy"]["timeout_s"] == 3600.0
    assert preset_sizes("full", unsized, "full", prod)["sft_dataset"] == {"target_size": 50_000}
    assert preset_run_config(small, ["sft_dataset", "benchmark_problems"]) == {
        "ops": {"sft_dataset": {"config": {"target_size": 2000}}}}


def test_run_tags_follow_the_preset():
    from pipelines.jobs import LAUNCH_OPS, max_runtime_s, preset_run_tags

    assert set(LAUNCH_OPS) >= {"sources_job", "curation_job", "rollpacker_job", "posttrain_job", "source_refresh_job"}
    demo = preset_run_tags("rollpacker_job", "demo", DEMO_SIZES)
    small = preset_run_tags("rollpacker_job", "small", {})
    full = preset_run_tags("rollpacker_job", "full", PROD_SIZES)
    assert demo["crucible/preset"] == "demo" and small["crucible/preset"] == "small"
    # rl_policy 3600 s + rollpacker_run 900 s, three attempts and two backoffs each, + the unlaunched allowance + margin
    assert int(demo["dagster/max_runtime"]) == 3 * 3600 + 90 + 3 * 900 + 90 + 1800 + 900
    assert int(small["dagster/max_runtime"]) == int(demo["dagster/max_runtime"]) + 1800
    assert int(full["dagster/max_runtime"]) == max_runtime_s(["rl_policy", "rollpacker_run"], "full") > 3 * 172_800


def test_a_demo_run_carries_the_presets_sizes_and_tags(tmp_path, monkeypatch):
    """One real run through the CLI's runner (``raw_problems[math_test]`` from the MATH package): the
    run's config is the demo preset's, its tags name the preset and its bound, not the job's ``small``."""
    monkeypatch.setenv("CRUCIBLE_HOME", str(tmp_path / "lake"))
    from assets.sources import sync_source_partitions
    from pipelines.cli import _run, demo_sizes
    from pipelines.definitions import defs
    from pipelines.jobs import preset_run_tags

    instance = dg.DagsterInstance.ephemeral()
    sync_source_partitions(instance)
    job = defs.resolve_job_def("sources_job")
    assert job.tags["crucible/preset"] == "small"
    sizes = demo_sizes("demo", limit=50)
    assert sizes["raw_problems"] == {"mathematics_dataset_per_module": 10, "limit": 50}
    tags = preset_run_tags("sources_job", "demo", sizes)
    assert _run(job, instance, "raw_problems[math_test]", {}, partition_key="math_test",
                run_config=preset_run_config(sizes, [n.name for n in job.graph.nodes]), tags=tags)
    (run,) = instance.get_runs()
    assert run.tags["crucible/preset"] == "demo" and run.tags["dagster/max_runtime"] == "2700" == tags["dagster/max_runtime"]
    assert run.run_config["ops"]["raw_problems"]["config"] == {"mathematics_dataset_per_module": 10, "limit": 50}
    mat = instance.get_latest_materialization_event(dg.AssetKey("raw_problems"))
    assert mat.asset_materialization.partition == "math_test"
    from resources.lake import LakeResource

    assert LakeResource().read("raw_problems", "math_test").height == 50


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "DAGSTER_HOME": "/nonexistent-not-created"})


def test_crucible_demo_rejects_an_unknown_preset_in_one_line():
    res = _cli("demo", "--preset", "huge")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "argument --preset: invalid choice: 'huge' (choose from demo, small, full)" in res.stderr.replace("'demo', 'small', 'full'", "demo, small, full")
    assert not os.path.exists("/nonexistent-not-created")
    res = _cli("demo", "--help")
    assert res.returncode == 0 and "--preset {demo,small,full}" in res.stdout


def test_crucible_demo_refuses_a_bad_size_or_stage_before_launching_anything():
    for args, message in ((("--limit", "-5"), "argument --limit: must be an integer >= 0, got -5"),
                          (("--per-module", "0"), "argument --per-module: must be an integer >= 1, got 0"),
                          (("--target-size", "many"), "argument --target-size: 'many' is not an integer"),
                          (("--skip", "bogus"), "argument --skip: unknown stage(s) ['bogus']")):
        res = _cli("demo", *args)
        assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, (args, res.stderr)
        assert not os.path.exists("/nonexistent-not-created")
