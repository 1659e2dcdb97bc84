"""Range runs name every partition's data version (issue 43.5): a ``BackfillPolicy.single_run()``
asset materialized over a partition range in one run, on a real (temporary) Dagster instance. Dagster
writes one ``dagster/data_version`` for all partitions of the step, so ``assets._meta.partition_versions``
makes that one version the JSON of every partition's own version, and puts each partition's own
version in its materialization's metadata."""

import hashlib
import json

import dagster as dg
import pytest

from assets._meta import parse_range_data_version, partition_versions, range_data_version

PARTS = dg.StaticPartitionsDefinition(["s1", "s2", "s3"])


class RangeConfig(dg.Config):
    salt: str = ""


@dg.asset(partitions_def=PARTS, backfill_policy=dg.BackfillPolicy.single_run())
def probes(context: dg.AssetExecutionContext, config: RangeConfig) -> dg.MaterializeResult:
    per_key = {k: {"partition_data_version": _version(k, config.salt if k == "s2" else ""), "rows": len(k)}
               for k in context.partition_keys}
    return dg.MaterializeResult(data_version=partition_versions(context, per_key))


def _version(key: str, salt: str = "") -> str:
    return hashlib.sha256(f"{key}{salt}".encode()).hexdigest()[:16]


def _latest(instance, key: str):
    rec = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("probes"), asset_partitions=[key]), limit=1).records[0]
    return rec.asset_materialization


def _range_run(instance, salt: str = "", start: str = "s1", end: str = "s3"):
    job = dg.Definitions(assets=[probes], jobs=[dg.define_asset_job("probe_job", [probes])]).resolve_job_def("probe_job")
    return job.execute_in_process(instance=instance, run_config={"ops": {"probes": {"config": {"salt": salt}}}},
                                  tags={"dagster/asset_partition_range_start": start, "dagster/asset_partition_range_end": end})


def test_a_range_run_names_every_partitions_version_and_each_partition_keeps_its_own(tmp_path):
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        assert _range_run(instance).success
        own = {k: _version(k) for k in ("s1", "s2", "s3")}
        tags = {k: _latest(instance, k).tags["dagster/data_version"] for k in own}
        assert len(set(tags.values())) == 1                              # Dagster: one version for the step
        assert parse_range_data_version(tags["s1"]) == own == json.loads(tags["s1"])   # ... naming every partition's
        for k, v in own.items():
            assert _latest(instance, k).metadata["partition_data_version"].value == v   # and each partition's own

        # one partition's content changes: only its entry in the range version changes
        assert _range_run(instance, salt="x").success
        after = parse_range_data_version(_latest(instance, "s1").tags["dagster/data_version"])
        assert after == {**own, "s2": _version("s2", "x")}

        # a single-partition run records that partition's own version
        assert _range_run(instance, start="s3", end="s3").success
        assert _latest(instance, "s3").tags["dagster/data_version"] == own["s3"]
        assert parse_range_data_version(own["s3"]) is None


def test_partition_versions_refuses_a_partition_without_its_version(tmp_path):
    @dg.asset(partitions_def=PARTS, backfill_policy=dg.BackfillPolicy.single_run(), name="probes")
    def broken(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        return dg.MaterializeResult(data_version=partition_versions(context, {k: {"rows": 1} for k in context.partition_keys}))

    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        res = dg.materialize([broken], instance=instance, partition_key="s1", raise_on_error=False)
        assert not res.success
        err = res.get_step_failure_events()[0].step_failure_data.error
        assert "partition 's1': metadata has no 'partition_data_version'" in err.to_string()
    with pytest.raises(ValueError, match="no partition versions"):
        range_data_version({})
