"""Sensors and declarative automation: what runs because something changed.

``user_sources_sensor`` watches the files declared in the ``CRUCIBLE_SOURCES`` YAML. When a file's
content (SHA-256) or its YAML entry (path, field mapping, limits) changes, it launches
``source_refresh_job`` for that source's ``raw_problems`` partition only: the partition and the
curation graph below it (the curation assets read every partition). The cursor holds, per source,
the file's mtime, size and SHA-256 and the entry's hash; the file is hashed only when its mtime or
size moved, so a ``touch`` alone launches nothing.

New sources: ``raw_problems`` partitions are read from the YAML when the code location loads
(static partitions). A new entry is therefore launched after the code location is reloaded
(UI: Deployment -> Reload; or restart ``dagster dev``): until then the sensor reports it in its tick
("reload the code location") and leaves it out of the cursor, so the first tick after the reload
launches it. The first tick of the sensor records the files as they are and launches nothing.

Declarative automation (``FOLLOW_PARENTS``, applied by ``with_automation``): every curation asset is
requested when one of its parents was updated (and nothing upstream is still running) — so a
``raw_problems`` partition materialized from the UI brings the curation graph up to date. Training
assets get no condition: they run only from a schedule, a sensor with an explicit rule, or a person.
"""

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import dagster as dg

from resources.sources import SourcesResource, configured_sources_file, parse_sources_file

from .jobs import source_refresh_job

AUTOMATED_GROUPS = ("curation",)
"""Groups whose assets follow their parents."""

NEVER_AUTOMATIC = ("ctr_model", "gba_run", "cpt_base_models", "cpt_probe_runs")
"""Expensive training: never started by automation (a test holds this)."""

FOLLOW_PARENTS = (
    dg.AutomationCondition.any_deps_updated().since_last_handled()
    & ~dg.AutomationCondition.any_deps_in_progress()
    & ~dg.AutomationCondition.in_progress()
).with_label("follow parents")
"""Like ``eager()`` but without "no parent partition missing": one broken user source must not
stop the curation graph from following the others (``annotated_problems`` reports missing ones)."""


def with_automation(assets: Iterable) -> list:
    """``assets`` with ``FOLLOW_PARENTS`` on every asset of ``AUTOMATED_GROUPS`` (others unchanged)."""

    def policy(spec: dg.AssetSpec) -> dg.AssetSpec:
        if spec.group_name in AUTOMATED_GROUPS and spec.key.to_user_string() not in NEVER_AUTOMATIC:
            return spec.replace_attributes(automation_condition=FOLLOW_PARENTS)
        return spec

    return dg.map_asset_specs(policy, list(assets))


curation_automation = dg.AutomationConditionSensorDefinition(
    "curation_automation",
    target=dg.AssetSelection.groups(*AUTOMATED_GROUPS),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
    description="Curation assets follow their parents (declarative automation); training never starts here.",
)


# ------------------------------------------------------------------------------------------------
# User source files


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _entry_hash(src) -> str:
    doc = {"path": src.path, "fields": src.fields, "max_problem_chars": src.max_problem_chars}
    return hashlib.sha1(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def plan_source_runs(sources_file: str, cursor: dict, partition_keys: Sequence[str]
                     ) -> tuple[list[dg.RunRequest], dict, list[str]]:
    """Which source partitions to refresh: (run requests, new cursor, notes).

    Args:
        sources_file: the sources YAML (see resources/sources.py).
        cursor: the previous cursor, ``{name: {"mtime_ns", "size", "sha256", "entry"}}``; empty on the
            first tick (then every file is recorded and nothing is launched).
        partition_keys: the ``raw_problems`` partitions of the loaded code location.
    Raises:
        SourceError: the YAML itself is missing or malformed (the message names the file).
    """
    good, errors = parse_sources_file(sources_file)
    first = not cursor
    keys = set(partition_keys)
    new_cursor: dict = {}
    requests: list[dg.RunRequest] = []
    notes = [f"{name}: {msg}" for name, msg in errors.items()]
    for name, src in good.items():
        path = Path(src.path)
        try:
            st = path.stat()
        except OSError:
            notes.append(f"{name}: file {path} is missing")
            if name in cursor:
                new_cursor[name] = cursor[name]   # keep: a file that comes back unchanged launches nothing
            continue
        prev = cursor.get(name) or {}
        state = {"mtime_ns": st.st_mtime_ns, "size": st.st_size, "entry": _entry_hash(src), "sha256": prev.get("sha256")}
        if prev and (prev["mtime_ns"], prev["size"], prev["entry"]) == (state["mtime_ns"], state["size"], state["entry"]):
            new_cursor[name] = prev
            continue
        state["sha256"] = _sha256(path)
        if prev and (prev["sha256"], prev["entry"]) == (state["sha256"], state["entry"]):
            new_cursor[name] = state                 # touched, same content: nothing to do
            continue
        if name not in keys:
            notes.append(f"{name}: new source, not yet a raw_problems partition: reload the code location "
                         "(UI: Deployment -> Reload) and the next tick launches it")
            continue
        new_cursor[name] = state
        if first:
            continue
        why = "new" if not prev else ("changed" if prev["sha256"] != state["sha256"] else "entry changed")
        requests.append(dg.RunRequest(
            run_key=f"{name}:{state['sha256'][:16]}:{state['entry'][:8]}",
            partition_key=name,
            tags={"crucible/trigger": "user_source_changed", "crucible/source": name, "crucible/change": why},
        ))
    if first:
        notes.insert(0, f"first tick: recorded {len(new_cursor)} source file(s) as the baseline; nothing launched")
    return requests, new_cursor, notes


@dg.sensor(
    job=source_refresh_job,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="Launch source_refresh_job for a user source (CRUCIBLE_SOURCES) whose file or entry changed.",
)
def user_sources_sensor(context: dg.SensorEvaluationContext, sources: SourcesResource) -> dg.SensorResult:
    """Refresh the ``raw_problems`` partition (and the curation below it) of every changed user source."""
    from assets.sources import SOURCE_PARTITIONS

    sources_file = sources.config_file or configured_sources_file()
    if not sources_file:
        return dg.SensorResult(skip_reason="CRUCIBLE_SOURCES is not set: no user sources to watch")
    cursor = json.loads(context.cursor) if context.cursor else {}
    requests, new_cursor, notes = plan_source_runs(sources_file, cursor, SOURCE_PARTITIONS.get_partition_keys())
    for note in notes:
        context.log.info(note)
    skip = None if requests else ("; ".join(notes) or f"no change in {len(new_cursor)} source file(s)")
    return dg.SensorResult(run_requests=requests, cursor=json.dumps(new_cursor, sort_keys=True), skip_reason=skip)


SENSORS = [user_sources_sensor, curation_automation]
