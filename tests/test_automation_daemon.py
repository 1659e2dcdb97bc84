"""Declarative automation under a running ``dagster-daemon`` (issue 43, items 2-4), real processes
end to end: a temp DAGSTER_HOME whose run queue limits ``crucible/stage=curation`` to one run at a
time (as deploy/helm/values.yaml does), the code location loaded by the daemon under the ``prod``
profile (a prod YAML with a local lake, the in-process executor and small ``sizes``), and nothing
launched by the test: the sources sensor adds the partitions and observes the files, the automation
sensor launches every run once the test has turned it on, as a person does.

Checks: on the fresh instance nothing runs while the automation sensor is off by default (the
sources sensor has added the partitions and observed the files); every ``raw_problems`` partition is materialized by an automation run at the *prod
profile's* sizes (``limit: 3`` from the YAML; the default profile would read all 5,000 MATH rows);
a source added to the YAML after the daemon loaded the code becomes a partition through one
sources_sensor tick (no reload) and is materialized; ``annotated_problems`` is launched only after every source partition (the new one
included) is materialized; every automation run carries ``crucible/stage=curation`` and no two of
them ran at once. Slow (about 4-5 minutes on 2 shared cores: each run loads the code location)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import dagster_daemon, wait_for

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BUILTIN = ["math_test", "mathematics_dataset", "mmlu_dev_val", "arc"]
LIMIT = 3

pytestmark = pytest.mark.slow


def _wait(what: str, fn, timeout_s: float, every_s: float = 2.0):
    return wait_for(what, fn, timeout_s, every_s)


def _rows(n: int, start: int = 0) -> str:
    return "".join(json.dumps({"q": f"What is {i} + {i}?", "a": str(2 * i)}) + "\n" for i in range(start, start + n))


AUTOMATION_INTERVAL_S = 30
"""crucible_automation's minimum interval (pipelines/sensors.py)."""


def _sensor_state(instance, name: str):
    """The instance's stored state of the sensor ``name`` (None: never stored)."""
    from dagster._core.scheduler.instigation import InstigatorType

    return next((st for st in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
                 if st.instigator_name == name), None)


def _ids(state) -> tuple[str, str]:
    assert state is not None, "the sensor has no stored state"
    return state.instigator_origin_id, state.selector_id


@pytest.fixture
def prod_daemon(tmp_path):
    """(instance, sources.yaml, daemon log path, workspace.yaml, env) with a dagster-daemon running on a prod-profile
    code location; the daemon's process group is SIGKILLed at the end."""
    import dagster as dg

    (tmp_path / "ua.jsonl").write_text(_rows(5))
    (tmp_path / "ub.jsonl").write_text(_rows(2, 100))
    sources = tmp_path / "sources.yaml"
    sources.write_text("sources:\n  - {name: ua, path: ua.jsonl, fields: {problem: q, answer: a}}\n")
    prod = tmp_path / "prod.yaml"
    prod.write_text(
        f"lake: {{root: {tmp_path / 'lake'}, work_dir: {tmp_path / 'work'}}}\n"
        "executor: in_process\n"
        f"sources_file: {sources}\n"
        "sizes:\n"
        f"  raw_problems: {{limit: {LIMIT}, mathematics_dataset_per_module: 1}}\n"
        "  annotated_problems: {llm_label_max_rows: 0}\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\n"
        "run_coordinator:\n  module: dagster.core.run_coordinator\n  class: QueuedRunCoordinator\n  config:\n"
        "    max_concurrent_runs: 4\n"
        "    tag_concurrency_limits:\n      - {key: crucible/stage, value: curation, limit: 1}\n")
    ws = tmp_path / "workspace.yaml"
    ws.write_text(f"load_from:\n  - python_module:\n      module_name: pipelines.definitions\n      working_directory: {ROOT}\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(ROOT), "CRUCIBLE_PROFILE": "prod",
           "CRUCIBLE_PROD_CONFIG": str(prod)}
    env.pop("CRUCIBLE_SOURCES", None)
    instance = dg.DagsterInstance.from_config(str(home))   # storages exist before two processes race to create them
    instance.get_runs(limit=1)
    instance.get_records_for_run("none", limit=1)
    log_path = tmp_path / "daemon.log"
    try:
        with dagster_daemon(ws, env, log_path):
            yield instance, sources, log_path, ws, env
    finally:
        instance.dispose()


def test_automation_materializes_at_prod_sizes_waits_for_every_parent_and_takes_a_new_source(prod_daemon):
    import dagster as dg
    from dagster._core.scheduler.instigation import InstigatorStatus

    instance, sources, log_path, ws, env = prod_daemon

    def tail() -> str:
        return log_path.read_text()[-3000:]

    def partitions():
        return instance.get_dynamic_partitions("sources")

    # the sources sensor's first tick: built-ins + the YAML's one source
    _wait(f"source partitions added by the sensor\n{tail()}", lambda: partitions() == BUILTIN + ["ua"], 180)
    # a fresh instance starts no work (issue 43, noticed): the automation sensor is off until a person
    # turns it on, while the sources sensor (no runs) has added the partitions and observed the files
    _wait(f"source files observed\n{tail()}", lambda: instance.get_latest_data_version_record(
        dg.AssetKey("source_files"), partition_key="ua"), 120)
    time.sleep(AUTOMATION_INTERVAL_S * 2 + 5)               # two automation ticks, had it been running
    assert instance.get_runs() == [], "a fresh instance started runs nobody asked for"
    state = _sensor_state(instance, "crucible_automation")
    assert state is None or state.status != InstigatorStatus.RUNNING
    on = subprocess.run([str(BIN / "dagster"), "sensor", "start", "crucible_automation", "-w", str(ws)], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=180, start_new_session=True)
    assert on.returncode == 0, on.stderr[-3000:]

    # a source added to the YAML after the daemon loaded the code location: the sources sensor's tick
    # adds it (the partition is in the instance; no reload of the code location is asked for)
    sources.write_text(sources.read_text() + "  - {name: ub, path: ub.jsonl, fields: {problem: q, answer: a}}\n")
    _wait(f"the new source's partition, without a reload\n{tail()}", lambda: partitions() == BUILTIN + ["ua", "ub"], 200)
    ticks = instance.get_ticks(*_ids(_sensor_state(instance, "sources_sensor")))
    assert [list(r.added_partitions) for t in ticks for r in t.dynamic_partitions_request_results
            if r.added_partitions and "ub" in r.added_partitions] == [["ub"]]    # one sources_sensor tick added it

    def raw(key):
        recs = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("raw_problems"), asset_partitions=[key]), limit=1).records
        return recs[0] if recs else None

    _wait(f"every raw_problems partition materialized by automation\n{tail()}",
          lambda: all(raw(k) for k in BUILTIN + ["ua", "ub"]), 420, 3.0)
    mats = {k: raw(k) for k in BUILTIN + ["ua", "ub"]}
    rows = {k: r.asset_materialization.metadata["rows_out"].value for k, r in mats.items()}
    # prod sizes from the YAML (limit 3; mathematics_dataset_per_module 1), not the default profile's
    assert rows == {"math_test": LIMIT, "mathematics_dataset": LIMIT, "mmlu_dev_val": LIMIT, "arc": LIMIT,
                    "ua": LIMIT, "ub": 2}, rows

    def annotated_runs():
        return [r for r in instance.get_runs()
                if r.asset_selection and dg.AssetKey("annotated_problems") in r.asset_selection]

    [first_annotated, *_] = _wait(f"annotated_problems launched by automation\n{tail()}", annotated_runs, 240, 3.0)
    created = instance.get_run_record_by_id(first_annotated.run_id).create_timestamp.timestamp()
    last_parent = max(r.timestamp for r in mats.values())
    assert created >= last_parent, "annotated_problems was launched before every source partition had materialized"

    runs = instance.get_run_records()
    auto = [r for r in runs if r.dagster_run.tags.get("dagster/from_automation_condition") == "true"
            or r.dagster_run.tags.get("crucible/trigger") == "automation"]
    assert auto and len(auto) == len(runs)                  # the test launched nothing; the automation everything
    for r in auto:
        assert r.dagster_run.tags.get("crucible/stage") == "curation", r.dagster_run.tags
    spans = sorted((r.start_time, r.end_time or time.time()) for r in runs if r.start_time)
    for (s1, e1), (s2, _) in zip(spans, spans[1:]):
        assert s2 >= e1 - 0.5, "two curation runs ran at once despite the crucible/stage=curation limit of 1"
