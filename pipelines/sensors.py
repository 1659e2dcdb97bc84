"""Sensors and declarative automation: what runs because something changed.

Sources (``sources_sensor``, running by default, every 60 s): keeps the dynamic partitions of
``raw_problems`` equal to the built-in sources plus the entries of the sources YAML
(``$CRUCIBLE_SOURCES``, or the prod config's ``sources_file``) — a new entry becomes a partition
without a code-location reload, a removed entry's partition is deleted — and reports an observation
of the observable source asset ``source_files`` for every source whose data version changed (the
file's SHA-256 and the entry's hash: resources.sources.source_data_version). The file is hashed only
when its mtime or size moved, so a ``touch`` reports nothing. The sensor launches no run: the new
data version marks ``raw_problems[<source>]`` stale and declarative automation re-materializes it.

Declarative automation (evaluated by ``crucible_automation``): ``raw_problems`` follows its source
files (``SOURCE_CONDITION``: a missing partition whose last run did not fail, or a new data version of
its file); every curation asset has ``CURATION_CONDITION``: Dagster's ``eager()`` (a parent was
updated, or the asset is newly missing; no parent partition missing; nothing upstream or of the asset
in progress) and ``all_deps_blocking_checks_passed()`` (no parent's blocking check failed). No asset
tolerates a missing parent: ``annotated_problems`` reads every current source partition and raises
when one is missing, so it waits for all of them. The automation sensor's runs carry
``crucible/stage: curation``, so the instance's one-curation-run limit (deploy/helm/values.yaml)
applies to them as to every curation job. Training assets get no condition: they run only from a
person, a job, or an explicit rule.

Default status: ``sources_sensor`` runs (it launches nothing); ``crucible_automation`` is stopped
until a person turns it on (``AUTOMATION_DEFAULT_STATUS``), so a fresh instance starts no work.
"""

import json
import os
from collections.abc import Iterable, Sequence

import dagster as dg

from resources.sources import SourcesResource, configured_sources_file, entry_hash, file_sha256, parse_sources_file
from resources.sources import source_data_version, source_partition_keys

from .jobs import SIZE_SET, SIZES, max_runtime_s

AUTOMATED_GROUPS = ("curation",)
"""Groups whose assets follow their parents."""

AUTOMATED_ASSETS = ("raw_problems",)
"""Assets outside those groups that follow their parents (raw_problems follows its source files)."""

NEVER_AUTOMATIC = ("ctr_model", "gba_run", "cpt_base_models", "cpt_probe_runs")
"""Expensive training: never started by automation (a test holds this)."""

AUTOMATION_RUN_TAGS = {"crucible/stage": "curation", "crucible/trigger": "automation",
                       "dagster/max_runtime": str(max_runtime_s((), SIZE_SET, SIZES))}
"""Tags of every run the automation sensor launches (the instance's tag concurrency limits key on them;
``dagster/max_runtime``: the bound of a run without launches, as on curation_job, pipelines/jobs.py)."""

CURATION_CONDITION = (dg.AutomationCondition.eager() & dg.AutomationCondition.all_deps_blocking_checks_passed()
                      ).with_label("eager, parents' blocking checks passed")
"""Requested when a parent was updated (or the asset is newly missing), once every parent partition
exists, nothing upstream is in progress and no parent's blocking check failed."""


_A = dg.AutomationCondition
SOURCE_CONDITION = (
    ((_A.missing() & ~_A.execution_failed()).with_label("missing, last run not failed")
     | _A.any_deps_updated().since_last_handled())
    & ~_A.any_deps_missing() & ~_A.any_deps_in_progress() & ~_A.in_progress()
).with_label("source partition missing or its source file changed")
"""raw_problems: requested when its partition is missing and its last run did not fail (so a source
added before the automation's first evaluation is still materialized, and a broken source is not
retried every tick), or when its source file's observed data version changed; never while the
source file is unobserved (missing) or a run of it is in progress."""


def _automated(spec: dg.AssetSpec) -> bool:
    name = spec.key.to_user_string()
    return (spec.group_name in AUTOMATED_GROUPS or name in AUTOMATED_ASSETS) and name not in NEVER_AUTOMATIC


def with_automation(assets: Iterable) -> list:
    """``assets`` with ``SOURCE_CONDITION`` on ``raw_problems`` and ``CURATION_CONDITION`` on every
    asset of ``AUTOMATED_GROUPS`` (others unchanged)."""

    def policy(spec: dg.AssetSpec) -> dg.AssetSpec:
        if not _automated(spec):
            return spec
        cond = SOURCE_CONDITION if spec.key.to_user_string() in AUTOMATED_ASSETS else CURATION_CONDITION
        return spec.replace_attributes(automation_condition=cond)

    return dg.map_asset_specs(policy, list(assets))


AUTOMATION_DEFAULT_STATUS = dg.DefaultSensorStatus.STOPPED
"""``crucible_automation`` is off on an instance that has never had it switched on: a fresh ``dagster
dev`` (or a new deployment) must not start the curation graph — source generation, the teacher,
every curation stage — that nobody asked for. A person turns it on once (the UI's Automation page, or
``dagster sensor start crucible_automation -m pipelines.definitions``); the instance keeps that state
across restarts and code reloads. ``sources_sensor`` stays on by default: it launches no run, it only
keeps the partitions and the source files' data versions current."""

crucible_automation = dg.AutomationConditionSensorDefinition(
    "crucible_automation",
    target=dg.AssetSelection.groups(*AUTOMATED_GROUPS) | dg.AssetSelection.assets(*AUTOMATED_ASSETS),
    run_tags=AUTOMATION_RUN_TAGS,
    default_status=AUTOMATION_DEFAULT_STATUS,
    minimum_interval_seconds=30,
    description="raw_problems follows its source files and the curation assets follow their parents "
    "(declarative automation); training never starts here. Runs are tagged crucible/stage=curation.",
)


# ------------------------------------------------------------------------------------------------
# Sources: dynamic partitions and observations


def plan_sources(sources_file: str, cursor: dict, existing: Sequence[str]) -> dict:
    """What the sources sensor does this tick.

    Args:
        sources_file: the sources YAML ("" = built-in sources only; resources/sources.py).
        cursor: the previous cursor, ``{name: {"version", and for user sources "mtime_ns", "size",
            "sha256", "entry"}}`` ({} on the first tick).
        existing: the ``sources`` dynamic partition keys the instance holds.
    Returns:
        ``{"add": [keys], "delete": [keys], "observe": {key: data version}, "cursor": {...},
        "notes": [str]}``: partitions to add (built-ins, then the YAML's, in file order) and to
        delete (no longer declared), data versions to report (new or changed), the next cursor.
    Raises:
        SourceError: the YAML itself is missing or malformed (the message names the file).
    """
    good, errors = parse_sources_file(sources_file)
    wanted = source_partition_keys(sources_file)
    have = set(existing)
    out = {"add": [k for k in wanted if k not in have], "delete": [k for k in existing if k not in set(wanted)],
           "observe": {}, "cursor": {}, "notes": [f"{name}: {msg}" for name, msg in errors.items()]}
    for name in wanted:
        prev = cursor.get(name) or {}
        if name not in good:
            if name not in errors:                                  # built-in
                version = source_data_version(name)
                out["cursor"][name] = {"version": version}
                if prev.get("version") != version:
                    out["observe"][name] = version
            continue
        path = good[name].path
        try:
            st = os.stat(path)
        except OSError:
            out["notes"].append(f"{name}: file {path} is missing")
            if prev:
                out["cursor"][name] = prev   # keep: a file that comes back unchanged reports nothing
            continue
        state = {"mtime_ns": st.st_mtime_ns, "size": st.st_size, "entry": entry_hash(good[name])}
        if prev.get("sha256") and all(prev.get(k) == v for k, v in state.items()):
            out["cursor"][name] = prev                               # untouched: not hashed again
            continue
        state["sha256"] = file_sha256(path)
        state["version"] = source_data_version(name, state["sha256"], state["entry"])
        out["cursor"][name] = state
        if prev.get("version") != state["version"]:
            out["observe"][name] = state["version"]
            out["notes"].append(f"{name}: {'new' if not prev else 'changed'} (data version {state['version']})")
    return out


@dg.sensor(
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Keep raw_problems' source partitions equal to the built-in and declared sources (CRUCIBLE_SOURCES) "
    "and report each source file's data version (source_files); automation re-materializes what changed.",
)
def sources_sensor(context: dg.SensorEvaluationContext, sources: SourcesResource) -> dg.SensorResult:
    """Add/delete ``sources`` partitions and observe ``source_files`` (see the module docstring)."""
    from assets.sources import SOURCES_PARTITIONS_NAME, current_source_keys

    sources_file = sources.config_file or configured_sources_file()
    cursor = json.loads(context.cursor) if context.cursor else {}
    plan = plan_sources(sources_file, cursor, current_source_keys(context.instance))
    for note in plan["notes"]:
        context.log.info(note)
    requests = []
    if plan["add"]:
        requests.append(dg.AddDynamicPartitionsRequest(SOURCES_PARTITIONS_NAME, plan["add"]))
    if plan["delete"]:
        requests.append(dg.DeleteDynamicPartitionsRequest(SOURCES_PARTITIONS_NAME, plan["delete"]))
    events = [dg.AssetObservation("source_files", partition=k, tags={"dagster/data_version": v},
                                  metadata={"data_version": v, "observed_by": "sources_sensor"})
              for k, v in plan["observe"].items()]
    did = requests or events
    skip = None if did else ("; ".join(plan["notes"]) or f"no change in {len(plan['cursor'])} source(s)")
    return dg.SensorResult(dynamic_partitions_requests=requests, asset_events=events,
                           cursor=json.dumps(plan["cursor"], sort_keys=True), skip_reason=skip)


SENSORS = [sources_sensor, crucible_automation]
