"""Operating Crucible: jobs and the profile's sizes, no separate schedules, the sources sensor
(dynamic partitions, observed data versions), declarative automation, launch retries and the
instance's concurrency settings (scripts/setup.sh)."""

import json
import os
import re
import sys
from pathlib import Path

import dagster as dg
import pytest

from tests.conftest import ROOT

CURATION = {"annotated_problems", "exact_deduped_problems", "near_deduped_problems", "dedup_clusters",
            "decontaminated_problems", "contamination_report", "distilled_problems", "verification_report",
            "teacher_responses", "sft_dataset"}
TRAINING = {"ctr_model", "gba_run", "cpt_base_models", "cpt_probe_runs"}
BUILTIN = ["math_test", "mathematics_dataset", "mmlu_dev_val", "arc"]


@pytest.fixture(scope="module")
def defs():
    from pipelines.definitions import defs

    return defs


def _job_assets(defs, name: str) -> set[str]:
    job = defs.resolve_job_def(name)
    return {k.to_user_string() for k in job.asset_layer.selected_asset_keys}


# ---------------------------------------------------------------------------------------------- jobs


def test_group_jobs_together_cover_every_asset_and_each_group(defs):
    from pipelines.jobs import GROUP_JOBS, LIFECYCLE

    graph = defs.resolve_asset_graph()
    all_assets = {k.to_user_string() for k in graph.get_all_asset_keys() if graph.get(k).is_materializable}
    covered = set().union(*(_job_assets(defs, name) for name, _ in LIFECYCLE))
    assert covered == all_assets
    for group, jobs in GROUP_JOBS.items():
        in_group = {k.to_user_string() for k in graph.get_all_asset_keys()
                    if graph.get(k).group_name == group and graph.get(k).is_materializable}
        assert in_group <= set().union(*(_job_assets(defs, j) for j in jobs)), group
    assert _job_assets(defs, "curation_job") == CURATION | {"benchmark_problems"}


def test_source_refresh_job_is_one_source_partition_and_the_curation_below_it(defs):
    job = defs.resolve_job_def("source_refresh_job")
    assert _job_assets(defs, "source_refresh_job") == CURATION | {"raw_problems"}
    assert isinstance(job.partitions_def, dg.DynamicPartitionsDefinition) and job.partitions_def.name == "sources"
    assert job.tags["crucible/stage"] == "curation"


def test_no_full_job_copies_and_jobs_carry_no_run_config(defs):
    """Sizes are the profile's (the assets' defaults): one job per stage, no ``_full`` twin, no
    default run config that would differ from what automation or the UI's Materialize runs."""
    names = {j.name for j in defs.jobs}
    assert not {n for n in names if n.endswith("_full")}
    for name in names:
        job = defs.resolve_job_def(name)
        assert job.run_config is None, name
        assert job.tags["crucible/preset"] == "small", name        # the default profile's size set


def _op_config_fields(assets) -> dict:
    """Op name -> its run-config fields ({name: dagster Field})."""
    out = {}
    for a in assets or ():
        if isinstance(a, dg.AssetsDefinition) and a.is_executable and a.op.config_schema is not None:
            fields = getattr(a.op.config_schema.config_type, "fields", None)
            if fields:
                out[a.op.name] = fields
    return out


def _at(fields, path):
    """The schema field at a dotted size-set path (``cluster.run_timeout_s``: a nested Config field), or None."""
    head, _, rest = path.partition(".")
    f = fields.get(head)
    if f is None or not rest:
        return f
    return _at(getattr(f.config_type, "fields", {}), rest)


def test_every_production_size_is_a_field_of_its_op_and_production_sized(defs):
    """A production value for a field its op does not have would pass silently (Dagster Config
    allows extra keys); one equal to the asset's default would set nothing."""
    from pipelines.presets import PROD_SIZES

    fields = _op_config_fields(defs.assets)
    for op, values in PROD_SIZES.items():
        assert op in fields, f"PROD_SIZES names {op!r}, which is no op with a run config"
        unknown = {k for k in values if _at(fields[op], k) is None}
        assert not unknown, f"PROD_SIZES[{op!r}] sets fields {op} does not have: {sorted(unknown)}"
        for k, v in values.items():
            if v is not None:
                assert v != _at(fields[op], k).default_value, f"PROD_SIZES[{op!r}][{k!r}] = {v!r} is the asset's default"
    assert PROD_SIZES["sft_dataset"]["target_size"] >= 50 * fields["sft_dataset"]["target_size"].default_value
    assert PROD_SIZES["cpt_probe_runs"]["cpt_tokens"] > 1000 * fields["cpt_probe_runs"]["cpt_tokens"].default_value


LAUNCH_LIMITS = {"gba_run": "cluster.run_timeout_s", "rl_policy": "timeout_s", "rollpacker_run": "run_timeout_s",
                 "rollarc_run": "run_timeout_s", "cpt_base_models": "timeout_s", "cpt_probe_runs": "timeout_s",
                 "mixture_validation": "timeout_s", "sft_checkpoint": "timeout_s", "stage2_checkpoint": "timeout_s"}
"""Op -> the run-config field that is its launch's wall-clock limit (it wins over the resource's)."""


def test_production_sizes_become_the_assets_defaults_and_stay_editable(defs):
    """``with_size_defaults`` rewrites the op config schema's defaults (what every launch path
    resolves): each launch limit is at least a day in production, the small defaults elsewhere are
    untouched, and a run config still overrides one field while the others keep the profile's."""
    from pipelines.presets import PROD_SIZES, with_size_defaults

    small = _op_config_fields(defs.assets)
    sized_assets = with_size_defaults(defs.assets, PROD_SIZES)
    sized = _op_config_fields(sized_assets)
    for op, field in LAUNCH_LIMITS.items():
        assert _at(sized[op], field).default_value >= 86_400, (op, field)
        assert _at(small[op], field).default_value < 86_400, (op, field)
    # a nested size replaces that one default; the part's other fields keep theirs
    assert _at(sized["gba_run"], "train.epochs").default_value == 5.0
    assert _at(sized["gba_run"], "train.batch_size").default_value == _at(small["gba_run"], "train.batch_size").default_value
    assert sized["distilled_problems"]["k_samples"].default_value == 8
    assert sized["distilled_problems"]["temperature"].default_value == small["distilled_problems"]["temperature"].default_value
    assert sized["raw_problems"]["limit"].default_value is None
    job = dg.Definitions(assets=sized_assets, jobs=[dg.define_asset_job("c", dg.AssetSelection.groups("curation"))],
                         resources=defs.resources).resolve_job_def("c")
    resolved = dg.validate_run_config(job, {"ops": {"sft_dataset": {"config": {"target_size": 7}}}})
    assert resolved["ops"]["sft_dataset"]["config"]["target_size"] == 7
    assert resolved["ops"]["distilled_problems"]["config"]["k_samples"] == 8


def test_a_size_for_an_unknown_op_or_field_names_the_file_and_the_field(defs):
    from pipelines.presets import SizesError, with_size_defaults

    with pytest.raises(SizesError, match=r"prod.yaml: sizes: sft_dataset.target_sizes is not a field of SftConfig"):
        with_size_defaults(defs.assets, {"sft_dataset": {"target_sizes": 5}}, where="prod.yaml: sizes")
    with pytest.raises(SizesError, match=r"'sft_datasets' is not an op"):
        with_size_defaults(defs.assets, {"sft_datasets": {"target_size": 5}})


# ----------------------------------------------------------------------------------------- schedules


def test_no_cron_schedule_runs_on_top_of_the_automation(defs):
    """A cadence goes on the asset (``on_cron``); the nightly curation schedule is gone."""
    assert not list(defs.schedules or [])
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        cond = graph.get(key).automation_condition
        assert cond is None or "cron" not in str(cond.get_label() or "").lower()


# --------------------------------------------------------------------------------- sources sensor


@pytest.fixture()
def user_dir(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"q": "What is 2+2?", "a": "4"}) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"q": "What is 3+3?", "a": "6"}) + "\n")
    (tmp_path / "sources.yaml").write_text(
        "sources:\n"
        "  - {name: user_nodup, path: a.jsonl, fields: {problem: q, answer: a}}\n"
        "  - {name: user_bad, path: b.jsonl, fields: {problem: q, answer: a}}\n")
    return tmp_path


def _tick(instance, user_dir, cursor=None):
    """One evaluation of the sources sensor; its partition requests and observations applied to
    ``instance`` as the daemon does."""
    from pipelines.sensors import sources_sensor
    from resources.sources import SourcesResource

    ctx = dg.build_sensor_context(instance=instance, cursor=cursor,
                                  resources={"sources": SourcesResource(config_file=str(user_dir / "sources.yaml"))})
    res = sources_sensor.evaluate_tick(ctx)
    for req in res.dynamic_partitions_requests:
        if isinstance(req, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(req.partitions_def_name, req.partition_keys)
        else:
            for k in req.partition_keys:
                instance.delete_dynamic_partition(req.partitions_def_name, k)
    for e in res.asset_events:
        instance.report_runless_asset_event(e)
    return res


def _bump(path: Path, text: str | None = None) -> None:
    if text is not None:
        path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


def _observed(res) -> dict:
    return {e.partition: e.tags["dagster/data_version"] for e in res.asset_events}


def test_sensor_adds_every_source_as_a_partition_and_observes_its_version(user_dir):
    from resources.sources import entry_hash, parse_sources_file, source_data_version

    with dg.instance_for_test() as instance:
        res = _tick(instance, user_dir)
        assert instance.get_dynamic_partitions("sources") == BUILTIN + ["user_nodup", "user_bad"]
        assert res.run_requests == []                        # automation launches, not the sensor
        good, _ = parse_sources_file(str(user_dir / "sources.yaml"))
        import hashlib

        sha = hashlib.sha256((user_dir / "a.jsonl").read_bytes()).hexdigest()
        assert _observed(res)["user_nodup"] == source_data_version("user_nodup", sha, entry_hash(good["user_nodup"]))
        assert set(_observed(res)) == set(BUILTIN) | {"user_nodup", "user_bad"}
        # the instance holds the observation: the UI's data version of source_files[user_nodup]
        rec = instance.get_latest_data_version_record(dg.AssetKey("source_files"), partition_key="user_nodup")
        assert rec.asset_observation.tags["dagster/data_version"] == _observed(res)["user_nodup"]


def test_sensor_observes_only_the_changed_source(user_dir):
    with dg.instance_for_test() as instance:
        first = _tick(instance, user_dir)
        _bump(user_dir / "a.jsonl", json.dumps({"q": "What is 5+5?", "a": "10"}) + "\n")
        res = _tick(instance, user_dir, first.cursor)
        assert set(_observed(res)) == {"user_nodup"} and _observed(res)["user_nodup"] != _observed(first)["user_nodup"]
        # nothing new next tick; a touch (same bytes, new mtime) reports nothing either
        assert _tick(instance, user_dir, res.cursor).asset_events == []
        _bump(user_dir / "a.jsonl")
        assert _tick(instance, user_dir, res.cursor).asset_events == []


def test_sensor_observes_a_source_whose_field_mapping_changed(user_dir):
    with dg.instance_for_test() as instance:
        first = _tick(instance, user_dir)
        yaml = (user_dir / "sources.yaml").read_text().replace("b.jsonl, fields: {problem: q, answer: a}",
                                                               "b.jsonl, fields: {problem: q}")
        (user_dir / "sources.yaml").write_text(yaml)
        assert set(_observed(_tick(instance, user_dir, first.cursor))) == {"user_bad"}


def test_a_new_yaml_entry_becomes_a_partition_without_a_reload_and_a_removed_one_goes(user_dir):
    with dg.instance_for_test() as instance:
        first = _tick(instance, user_dir)
        (user_dir / "c.jsonl").write_text(json.dumps({"q": "What is 1+1?", "a": "2"}) + "\n")
        text = (user_dir / "sources.yaml").read_text()
        (user_dir / "sources.yaml").write_text(text + "  - {name: brand_new, path: c.jsonl, fields: {problem: q, answer: a}}\n")
        res = _tick(instance, user_dir, first.cursor)
        assert instance.get_dynamic_partitions("sources")[-1] == "brand_new"
        assert set(_observed(res)) == {"brand_new"}
        (user_dir / "sources.yaml").write_text(text.replace(
            "  - {name: user_bad, path: b.jsonl, fields: {problem: q, answer: a}}\n", ""))
        _tick(instance, user_dir, res.cursor)
        assert instance.get_dynamic_partitions("sources") == BUILTIN + ["user_nodup"]


# ---------------------------------------------------------------------------------------- automation


def _requested(defs, result) -> dict:
    graph = defs.resolve_asset_graph()
    out = {}
    for r in result.results:
        if r.true_subset.size:
            subset = r.true_subset.get_internal_value()
            keys = sorted(subset.get_partition_keys()) if hasattr(subset, "get_partition_keys") else None
            out[r.key.to_user_string()] = keys
    return {k: v for k, v in out.items() if k in {a.to_user_string() for a in graph.get_all_asset_keys()}}


def test_curation_follows_its_sources_and_training_never_starts_by_itself(defs):
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        cond = graph.get(key).automation_condition
        assert (cond is not None) == (key.to_user_string() in CURATION | {"raw_problems"}), key
    from pipelines.sensors import AUTOMATION_RUN_TAGS

    sensor = defs.resolve_sensor_def("crucible_automation")
    assert sensor.run_tags == AUTOMATION_RUN_TAGS and AUTOMATION_RUN_TAGS["crucible/stage"] == "curation"
    # a fresh instance starts no work: automation is off until turned on; the sources sensor (no runs) is on
    assert sensor.default_status == dg.DefaultSensorStatus.STOPPED
    assert defs.resolve_sensor_def("sources_sensor").default_status == dg.DefaultSensorStatus.RUNNING


def test_child_is_requested_only_after_both_parent_partitions(defs, user_dir):
    """Two source partitions (user_nodup, user_bad): annotated_problems is not requested after one
    of them materialized, only after both; a changed source file re-requests only its partition."""
    from assets.sources import sync_source_partitions

    with dg.instance_for_test() as instance:
        ev = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        sync_source_partitions(instance, ["user_nodup", "user_bad"])
        first = _tick_only_observe(instance, user_dir)
        ev = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=ev.cursor)
        assert _requested(defs, ev) == {"raw_problems": ["user_bad", "user_nodup"]}     # both new: both requested
        instance.report_runless_asset_event(dg.AssetMaterialization("raw_problems", partition="user_nodup"))
        ev = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=ev.cursor)
        assert "annotated_problems" not in _requested(defs, ev)                      # one of two: waits
        instance.report_runless_asset_event(dg.AssetMaterialization("raw_problems", partition="user_bad"))
        ev = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=ev.cursor)
        assert _requested(defs, ev) == {"annotated_problems": None}                   # both: requested, nothing else
        instance.report_runless_asset_event(dg.AssetMaterialization("annotated_problems"))
        ev = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=ev.cursor)
        _bump(user_dir / "b.jsonl", json.dumps({"q": "What is 4+4?", "a": "8"}) + "\n")
        _tick_only_observe(instance, user_dir, first.cursor)
        ev = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=ev.cursor)
        assert _requested(defs, ev) == {"raw_problems": ["user_bad"]}


def _tick_only_observe(instance, user_dir, cursor=None):
    """A sensor tick whose observations are applied, its partition requests not (the test chose the
    partitions)."""
    from pipelines.sensors import sources_sensor
    from resources.sources import SourcesResource

    ctx = dg.build_sensor_context(instance=instance, cursor=cursor,
                                  resources={"sources": SourcesResource(config_file=str(user_dir / "sources.yaml"))})
    res = sources_sensor.evaluate_tick(ctx)
    for e in res.asset_events:
        if e.partition in instance.get_dynamic_partitions("sources"):
            instance.report_runless_asset_event(e)
    return res


# ------------------------------------------------------------------------------------------- retries


def test_launch_death_is_told_apart_from_a_failing_launch():
    import signal

    from resources.retry import is_launch_death, launch_exit_code

    sigs = [int(signal.SIGKILL), int(signal.SIGTERM)]
    assert launch_exit_code(dg.Failure("launch exited with code -9: accelerate launch x.py")) == -9
    assert launch_exit_code(dg.Failure("launch ran past its 10 s timeout and was killed: x")) is None
    assert is_launch_death(-9, sigs) and is_launch_death(137, sigs) and is_launch_death(143, sigs)
    assert not is_launch_death(1, sigs) and not is_launch_death(None, sigs)


def _retry_asset(command: list[str]):
    from resources.retry import RetryingComputeResource

    @dg.asset
    def launched(context: dg.AssetExecutionContext, compute: RetryingComputeResource) -> None:
        context.log.info(f"attempt {context.retry_number}")
        compute.run(context, "", command=command, timeout_s=60)

    return launched, RetryingComputeResource(launch_retries=2, retry_backoff_s=0.0)


def test_a_killed_launch_is_retried_with_backoff_and_a_failing_one_is_not():
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    asset, compute = _retry_asset(killed)
    res = dg.materialize([asset], resources={"compute": compute}, raise_on_error=False)
    kinds = [e.event_type_value for e in res.all_events]
    assert kinds.count("STEP_UP_FOR_RETRY") == 2 and kinds.count("STEP_RESTARTED") == 2 and not res.success
    from resources.retry import RetryingComputeResource

    assert [RetryingComputeResource(retry_backoff_s=30).retry_wait_s(n) for n in range(3)] == [30, 60, 120]

    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    asset, compute = _retry_asset(failing)
    res = dg.materialize([asset], resources={"compute": compute}, raise_on_error=False)
    kinds = [e.event_type_value for e in res.all_events]
    assert "STEP_UP_FOR_RETRY" not in kinds and not res.success


# ------------------------------------------------------------------------------- instance settings


def test_setup_writes_run_retries_and_no_embedded_limits_dagster_accepts(tmp_path):
    from pipelines.cli import ensure_run_retries     # what `crucible setup` (called by scripts/setup.sh) writes

    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    assert ensure_run_retries(tmp_path) and not ensure_run_retries(tmp_path)     # appended once
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    try:
        settings = instance.get_concurrency_config()
        # no pool or run-queue limit on the embedded default: a killed run would hold them (see setup.sh)
        assert settings.pool_config.default_pool_limit is None
        assert not settings.run_queue_config or not settings.run_queue_config.tag_concurrency_limits
        assert instance.run_retries_enabled and instance.run_retries_max_retries == 2
        assert not instance.run_retries_retry_on_asset_or_op_failure
    finally:
        instance.dispose()

