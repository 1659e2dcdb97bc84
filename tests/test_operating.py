"""Operating Crucible: jobs and presets, the nightly schedule, the user-source sensor, declarative
automation, launch retries and the instance's concurrency settings (scripts/setup.sh)."""

import datetime as dt
import hashlib
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
    all_assets = {k.to_user_string() for k in graph.get_all_asset_keys()}
    covered = set().union(*(_job_assets(defs, name) for name, _ in LIFECYCLE))
    assert covered == all_assets
    for group, jobs in GROUP_JOBS.items():
        in_group = {k.to_user_string() for k in graph.get_all_asset_keys() if graph.get(k).group_name == group}
        assert in_group <= set().union(*(_job_assets(defs, j) for j in jobs)), group
    assert _job_assets(defs, "curation_job") == CURATION | {"benchmark_problems"}


def test_source_refresh_job_is_one_source_partition_and_the_curation_below_it(defs):
    job = defs.resolve_job_def("source_refresh_job")
    assert _job_assets(defs, "source_refresh_job") == CURATION | {"raw_problems"}
    assert job.partitions_def.get_partition_keys()[:4] == ["math_test", "mathematics_dataset", "mmlu_dev_val", "arc"]
    assert job.tags["crucible/stage"] == "curation"


def test_both_presets_validate_against_every_job_config_schema(defs):
    from pipelines.jobs import LIFECYCLE
    from pipelines.presets import PRESETS, preset_run_config

    assert PRESETS["small"] == {}  # small = the assets' own defaults: nothing to set
    for name, _ in LIFECYCLE:
        for preset in PRESETS:
            job = defs.resolve_job_def(name if preset == "small" else f"{name}_{preset}")
            ops = [n.name for n in job.graph.node_defs]
            cfg = preset_run_config(preset, ops)
            assert dg.validate_run_config(job, cfg) is not None
            assert dg.validate_run_config(job, {}) is not None            # the job's own default = its preset
            assert job.tags["crucible/preset"] == preset
            if preset == "small":  # no default run config on the job
                assert job.run_config is None and cfg == {"ops": {}}
                if job.partitions_def:
                    key = job.partitions_def.get_partition_keys()[0]
                    assert not job.partitioned_config.get_run_config_for_partition_key(key).get("ops")
                continue
            if cfg["ops"] and job.partitions_def:                          # loaded with the partition
                key = job.partitions_def.get_partition_keys()[0]
                assert job.partitioned_config.get_run_config_for_partition_key(key) == cfg
            elif cfg["ops"]:
                assert job.run_config == cfg                               # the Launchpad's preset


def _op_config_fields(defs) -> dict:
    """Op name -> its run-config fields ({name: dagster Field}), from the code location's assets."""
    out = {}
    for a in defs.assets or ():
        if isinstance(a, dg.AssetsDefinition) and a.op.config_schema is not None:
            fields = getattr(a.op.config_schema.config_type, "fields", None)
            if fields:
                out[a.op.name] = fields
    return out


def test_every_full_knob_is_a_field_of_its_op_and_production_sized(defs):
    """A ``full`` value for a field its op does not have would pass silently (Dagster Config allows
    extra keys); one equal to the asset's default would set nothing."""
    from pipelines.presets import FULL

    fields = _op_config_fields(defs)
    for op, values in FULL.items():
        assert op in fields, f"FULL names {op!r}, which is no op with a run config"
        unknown = set(values) - set(fields[op])
        assert not unknown, f"FULL[{op!r}] sets fields {op} does not have: {sorted(unknown)}"
        for k, v in values.items():
            if v is not None:
                assert v != fields[op][k].default_value, f"FULL[{op!r}][{k!r}] = {v!r} is the asset's default"
    # full is production-sized where it matters
    assert FULL["sft_dataset"]["target_size"] >= 50 * fields["sft_dataset"]["target_size"].default_value
    assert FULL["cpt_probe_runs"]["cpt_tokens"] > 1000 * fields["cpt_probe_runs"]["cpt_tokens"].default_value


LAUNCH_LIMITS = {"gba_run": "run_timeout_s", "rl_policy": "timeout_s", "rollpacker_run": "run_timeout_s",
                 "rollarc_run": "run_timeout_s", "cpt_base_models": "timeout_s", "cpt_probe_runs": "timeout_s",
                 "mixture_validation": "timeout_s", "sft_checkpoint": "timeout_s", "stage2_checkpoint": "timeout_s"}
"""Op -> the run-config field that is its launch's wall-clock limit (it wins over the resource's)."""


def test_every_full_job_gives_its_launches_a_production_sized_limit(defs):
    """A ``_full`` job trains at production sizes: each launch limit it loads is at least a day,
    never the embedded default of 900-3,600 s (which would kill a healthy production run)."""
    from pipelines.jobs import LIFECYCLE

    seen = set()
    for name, _ in LIFECYCLE:
        job = defs.resolve_job_def(f"{name}_full")
        cfg = (job.partitioned_config.get_run_config_for_partition_key(job.partitions_def.get_partition_keys()[0])
               if job.partitions_def else job.run_config) or {}
        for node in job.graph.node_defs:
            if node.name in LAUNCH_LIMITS:
                limit = cfg.get("ops", {}).get(node.name, {}).get("config", {}).get(LAUNCH_LIMITS[node.name])
                assert limit is not None and limit >= 86_400, f"{name}_full: {node.name}.{LAUNCH_LIMITS[node.name]} = {limit}"
                seen.add(node.name)
    assert seen == set(LAUNCH_LIMITS)  # every launching asset is in some lifecycle job


def test_a_partial_run_config_keeps_the_preset_for_the_other_ops(defs):
    """``crucible demo`` passes config for some ops only; the others keep the job's preset."""
    job = defs.resolve_job_def("curation_job_full")
    resolved = dg.validate_run_config(job, {"ops": {"sft_dataset": {"config": {"target_size": 7}}}})
    assert resolved["ops"]["sft_dataset"]["config"]["target_size"] == 7
    assert resolved["ops"]["distilled_problems"]["config"]["k_samples"] == 8


# ------------------------------------------------------------------------------------------ schedule


def test_nightly_curation_requests_one_curation_run_at_two_utc(defs):
    from pipelines.schedules import nightly_curation

    assert nightly_curation.cron_schedule == "0 2 * * *" and nightly_curation.execution_timezone == "UTC"
    assert nightly_curation.default_status == dg.DefaultScheduleStatus.STOPPED
    ctx = dg.build_schedule_context(scheduled_execution_time=dt.datetime(2026, 11, 30, 2, 0, tzinfo=dt.timezone.utc))
    data = nightly_curation.evaluate_tick(ctx)
    assert len(data.run_requests) == 1
    req = data.run_requests[0]
    assert req.run_key is None and req.partition_key is None and not req.asset_selection
    assert defs.resolve_schedule_def("nightly_curation").job_name == "curation_job"


# -------------------------------------------------------------------------------------------- sensor


@pytest.fixture()
def user_dir(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"q": "What is 2+2?", "a": "4"}) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"q": "What is 3+3?", "a": "6"}) + "\n")
    (tmp_path / "sources.yaml").write_text(
        "sources:\n"
        "  - {name: user_nodup, path: a.jsonl, fields: {problem: q, answer: a}}\n"
        "  - {name: user_bad, path: b.jsonl, fields: {problem: q, answer: a}}\n")
    return tmp_path


def _tick(user_dir, cursor=None):
    from pipelines.sensors import user_sources_sensor
    from resources.sources import SourcesResource

    ctx = dg.build_sensor_context(cursor=cursor, resources={"sources": SourcesResource(config_file=str(user_dir / "sources.yaml"))})
    return user_sources_sensor(ctx)


def _bump(path: Path, text: str | None = None) -> None:
    if text is not None:
        path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


def _entry(path: str, fields: dict) -> str:
    doc = {"path": path, "fields": fields, "max_problem_chars": 20_000}
    return hashlib.sha1(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def test_sensor_first_tick_records_a_baseline_and_launches_nothing(user_dir):
    res = _tick(user_dir)
    assert res.run_requests == [] and "baseline" in res.skip_reason.skip_message
    assert set(json.loads(res.cursor)) == {"user_nodup", "user_bad"}


def test_sensor_requests_only_the_changed_source_partition(user_dir):
    cursor = _tick(user_dir).cursor
    new = json.dumps({"q": "What is 5+5?", "a": "10"}) + "\n"
    _bump(user_dir / "a.jsonl", new)
    res = _tick(user_dir, cursor)
    sha = hashlib.sha256(new.encode()).hexdigest()
    entry = _entry(str((user_dir / "a.jsonl").resolve()), {"problem": "q", "answer": "a"})
    assert res.run_requests == [dg.RunRequest(
        run_key=f"user_nodup:{sha[:16]}:{entry[:8]}", partition_key="user_nodup",
        tags={"crucible/trigger": "user_source_changed", "crucible/source": "user_nodup", "crucible/change": "changed"})]
    # the next tick sees nothing new; a touch (same bytes, new mtime) launches nothing either
    assert _tick(user_dir, res.cursor).run_requests == []
    _bump(user_dir / "a.jsonl")
    assert _tick(user_dir, res.cursor).run_requests == []


def test_sensor_requests_a_source_whose_field_mapping_changed(user_dir):
    cursor = _tick(user_dir).cursor
    yaml = (user_dir / "sources.yaml").read_text().replace("b.jsonl, fields: {problem: q, answer: a}",
                                                           "b.jsonl, fields: {problem: q}")
    (user_dir / "sources.yaml").write_text(yaml)
    res = _tick(user_dir, cursor)
    assert [(r.partition_key, r.tags["crucible/change"]) for r in res.run_requests] == [("user_bad", "entry changed")]


def test_sensor_waits_for_a_reload_before_launching_a_new_source(user_dir):
    cursor = _tick(user_dir).cursor
    (user_dir / "c.jsonl").write_text(json.dumps({"q": "What is 1+1?", "a": "2"}) + "\n")
    with (user_dir / "sources.yaml").open("a") as f:
        f.write("  - {name: brand_new, path: c.jsonl, fields: {problem: q, answer: a}}\n")
    res = _tick(user_dir, cursor)
    assert res.run_requests == []
    assert "brand_new" in res.skip_reason.skip_message and "reload the code location" in res.skip_reason.skip_message
    assert "brand_new" not in json.loads(res.cursor)            # launched by the first tick after the reload

    from pipelines.sensors import plan_source_runs

    reqs, _, _ = plan_source_runs(str(user_dir / "sources.yaml"), json.loads(res.cursor),
                                  ["math_test", "user_nodup", "user_bad", "brand_new"])
    assert [(r.partition_key, r.tags["crucible/change"]) for r in reqs] == [("brand_new", "new")]


def test_sensor_targets_source_refresh_job(defs):
    assert defs.resolve_sensor_def("user_sources_sensor").job_name == "source_refresh_job"


# ---------------------------------------------------------------------------------------- automation


def test_curation_follows_a_new_source_partition_and_training_never_starts_by_itself(defs):
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        cond = graph.get(key).automation_condition
        assert (cond is not None) == (key.to_user_string() in CURATION), key
    instance = dg.DagsterInstance.ephemeral()
    first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
    assert first.total_requested == 0
    for key, partition in [("raw_problems", "user_nodup"), ("ctr_events", None), ("cpt_tokenizer", None),
                           ("general_corpus", None)]:
        instance.report_runless_asset_event(dg.AssetMaterialization(key, partition=partition))
    second = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
    requested = {k.to_user_string() for k in graph.get_all_asset_keys() if second.get_num_requested(k)}
    assert requested == CURATION
    assert not requested & TRAINING


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


def test_sensor_run_request_resolves_to_a_partition_of_source_refresh_job(defs, user_dir):
    from pipelines.sensors import user_sources_sensor
    from resources.sources import SourcesResource

    instance = dg.DagsterInstance.ephemeral()
    resources = {"sources": SourcesResource(config_file=str(user_dir / "sources.yaml"))}
    first = user_sources_sensor.evaluate_tick(dg.build_sensor_context(instance=instance, resources=resources, definitions=defs))
    _bump(user_dir / "b.jsonl", json.dumps({"q": "What is 4+4?", "a": "8"}) + "\n")
    data = user_sources_sensor.evaluate_tick(
        dg.build_sensor_context(instance=instance, resources=resources, definitions=defs, cursor=first.cursor))
    [req] = data.run_requests
    job = defs.resolve_job_def("source_refresh_job")
    assert req.partition_key == "user_bad" and job.partitions_def.has_partition_key(req.partition_key)
    assert req.tags["dagster/partition"] == "user_bad"
