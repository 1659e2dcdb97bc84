"""A killed run commits nothing, leaves nothing running, is marked failed and resumed (issue 42
items 5 and 8, issue 43 item 1; case orchestrator-killed-mid-training).

Real processes end to end: a ``dagster-daemon run`` (its own process group) against a temp
DAGSTER_HOME whose dagster.yaml is what ``crucible setup`` writes (run_retries, run_monitoring with
pipelines.run_launcher.LocalRunLauncher; only the poll interval is shortened to 2 s), a run of
tests/_kill_defs.py's ``kill_job`` submitted with ``dagster job launch`` (as the UI does), whose asset launches tests/_kill_driver.py through the launch
protocol. The test SIGKILLs the run worker's process group mid-training (what an OOM kill or a
preempted node does) and checks every outcome the case expects. About a minute on 2 cores.

The instance queues runs (Dagster's default QueuedRunCoordinator), so the daemon's code server
starts the run worker and the worker shares that server's (the daemon's) process group: the test
SIGKILLs the run worker process itself, as the OOM killer does; the launch it started has a group
and a session of its own, which is what used to survive."""

import hashlib
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
BOUND_S = 5.0
"""Seconds within which every process of the killed run must be gone."""
POLL_S = 2
"""The run-monitoring poll interval of this test's instance (crucible setup writes 30 s)."""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux-only")


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _wait(what: str, fn, timeout_s: float, every_s: float = 0.5):
    return wait_for(what, fn, timeout_s, every_s)


def _assert_gone_within_bound(tree: list[int], what: str) -> None:
    """Every pid of ``tree`` gone within BOUND_S; a survivor is SIGKILLed (nothing left behind) and fails
    the test naming ``what``."""
    from ops.launch import alive

    t0 = time.monotonic()
    while alive(tree) and time.monotonic() - t0 < BOUND_S:
        time.sleep(0.1)
    left = alive(tree)
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"processes of {what} left after {BOUND_S} s"


@pytest.fixture
def daemon_home(tmp_path):
    """(DAGSTER_HOME, workspace.yaml, env) with a dagster-daemon running on them; the daemon's
    process group is SIGKILLed at the end."""
    from pipelines.cli import ensure_run_monitoring, ensure_run_retries

    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    assert ensure_run_retries(home) and ensure_run_monitoring(home, poll_interval_s=POLL_S)
    ws = tmp_path / "workspace.yaml"
    ws.write_text(f"load_from:\n  - python_module:\n      module_name: tests._kill_defs\n      working_directory: {ROOT}\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(ROOT)}
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(home))     # the SQLite storages exist before two processes race to create them
    instance.get_runs(limit=1)
    instance.get_records_for_run("none", limit=1)
    instance.dispose()
    with dagster_daemon(ws, env, tmp_path / "daemon.log") as daemon:
        yield home, ws, env, daemon


def test_a_killed_run_commits_nothing_leaves_nothing_and_is_resumed(daemon_home, tmp_path):
    """Case orchestrator-killed-mid-training: SIGKILL of the run worker mid-training ->
    within BOUND_S no launched process is left; the committed output is byte-identical; the daemon
    marks the run failed (not STARTED forever) within a few poll intervals; the instance's run retry
    re-executes it, the relaunch resumes from the last checkpoint, and only that retry's recorded
    materialization changes the committed output."""
    import dagster as dg

    from ops.launch import process_tree
    from resources.compute import ComputeResource
    from tests._kill_defs import kill_model

    home, ws, env, daemon = daemon_home
    lake = tmp_path / "lake"
    committed = lake / "kill_model" / "committed" / "model.txt"
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        # the committed output of an earlier materialization
        first = dg.materialize([kill_model], instance=instance, resources={"compute": ComputeResource()},
                               run_config={"ops": {"kill_model": {"config": {"lake": str(lake), "steps": 1, "step_s": 0.1}}}})
        assert first.success and committed.read_text() == "trained 1 steps, tag a\n"
        before = _sha(committed)

        # a new materialization, launched as the UI does, killed mid-training
        cfg = {"ops": {"kill_model": {"config": {"lake": str(lake), "steps": 12, "step_s": 1.0, "tag": "b"}}}}
        cli = subprocess.run([str(BIN / "dagster"), "job", "launch", "-w", str(ws), "-j", "kill_job",
                              "--config-json", json.dumps(cfg)], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120, start_new_session=True)
        assert cli.returncode == 0, cli.stderr[-3000:]
        runs = lambda: instance.get_runs(dg.RunsFilter(job_name="kill_job"))
        run = _wait("the launched run", lambda: next((r for r in runs() if r.run_id != first.run_id), None), 60)
        state = lake / "kill_model" / f".run-{run.run_id}" / "state" / "state.json"
        _wait("two training steps saved", lambda: state.exists() and json.loads(state.read_text())["step"] >= 2, 90, 0.2)
        start = instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.RUN_START).records
        worker = start[0].event_log_entry.dagster_event.pid
        assert worker not in (os.getpid(), daemon.pid)
        tree = process_tree(worker)                       # the run worker, its launch and the launch's watchdog
        cmds = " ".join(Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace") for p in tree
                        if Path(f"/proc/{p}/cmdline").exists())
        assert "tests._kill_driver" in cmds and "ops.launch" in cmds         # the driver and its watchdog
        os.kill(worker, signal.SIGKILL)
        # the launched driver lives until its watchdog sees the worker gone (within the bound) and may save one
        # more step meanwhile: the step the run was killed at is the one saved when the whole tree is gone
        _assert_gone_within_bound(tree, "the killed run")
        killed_at_step = json.loads(state.read_text())["step"]
        time.sleep(3.0)                                   # what an orphan would have written by now
        assert _sha(committed) == before and json.loads(state.read_text())["step"] == killed_at_step

        # run monitoring's own verdict on this run, whichever watcher reports first below: the launcher's
        # health check (what the daemon polls every POLL_S) finds the killed worker gone
        from dagster._core.launcher import WorkerStatus

        health = instance.run_launcher.check_run_worker_health(instance.get_run_by_id(run.run_id))
        assert health.status == WorkerStatus.FAILED and f"pid {worker}" in health.msg, health
        assert instance.run_monitoring_enabled and instance.run_monitoring_settings["poll_interval_seconds"] == POLL_S
        failed = _wait("the run marked failed (not left STARTED)", lambda: (r := instance.get_run_by_id(run.run_id)).status
                       == dg.DagsterRunStatus.FAILURE and r, 10 * POLL_S + 20)
        msgs = [e.message for e in instance.all_logs(run.run_id) if e.message]
        # marked failed by whichever watcher saw the death first: the code server that started the run
        # process ("[DagsterApiServer] Run execution process ... was terminated") or, when that server is gone
        # too, the daemon's run monitoring through LocalRunLauncher's health check ("no longer running")
        assert any((f"run worker (pid {worker}" in m and "no longer running" in m)
                   or ("[DagsterApiServer]" in m and "Run execution process" in m) for m in msgs), msgs[-5:]
        assert _sha(committed) == before                  # nothing committed by the failure either

        retry = _wait("the retry run", lambda: next((r for r in runs() if r.tags.get("dagster/parent_run_id") == run.run_id),
                                                  None), 90)
        done = _wait("the retry's end", lambda: (r := instance.get_run_by_id(retry.run_id)).is_finished and r, 120)
        assert done.status == dg.DagsterRunStatus.SUCCESS, [e.message for e in instance.all_logs(retry.run_id)][-10:]
        assert retry.root_run_id == run.run_id and retry.tags.get("dagster/retry_number") == "1"
        logs = " ".join(e.message or "" for e in instance.all_logs(retry.run_id))
        assert f"kill driver: starting at step {killed_at_step} of 12" in logs, logs[-3000:]
        mat = instance.get_latest_materialization_event(dg.AssetKey("kill_model")).asset_materialization
        assert mat.metadata["resumed_from_step"].value == killed_at_step and mat.metadata["retry_number"].value == 0
        assert committed.read_text() == "trained 12 steps, tag b\n"  # committed by the retry's recorded materialization
        assert not (lake / "kill_model" / f".run-{run.run_id}").exists()
    finally:
        instance.dispose()


def test_setup_turns_on_run_monitoring_with_a_launcher_that_reports_dead_workers(tmp_path):
    """What ``crucible setup`` writes (issue 43 item 1): run monitoring on (poll 30 s, slots of
    ended runs freed), the local launcher whose health check the daemon uses; an instance that
    has its own run launcher keeps it and gets only the monitoring."""
    import dagster as dg

    from pipelines.cli import RUN_MONITORING_POLL_S, ensure_run_monitoring
    from pipelines.run_launcher import LocalRunLauncher

    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false")
    assert ensure_run_monitoring(tmp_path) is True and ensure_run_monitoring(tmp_path) is False
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    try:
        assert instance.run_monitoring_enabled and RUN_MONITORING_POLL_S == 30
        assert instance.run_monitoring_settings["poll_interval_seconds"] == 30
        assert instance.run_monitoring_settings["free_slots_after_run_end_seconds"] == 60
        assert isinstance(instance.run_launcher, LocalRunLauncher)
        assert instance.run_launcher.supports_check_run_worker_health
    finally:
        instance.dispose()
    own = tmp_path / "own"
    own.mkdir()
    (own / "dagster.yaml").write_text("run_launcher:\n  module: dagster\n  class: DefaultRunLauncher\n")
    assert ensure_run_monitoring(own)
    text = (own / "dagster.yaml").read_text()
    assert text.count("run_launcher:") == 1 and "run_monitoring:\n  enabled: true" in text


def test_every_job_carries_a_max_runtime_from_its_presets_launch_limits():
    """Issue 43 item 1: dagster/max_runtime on every job = each launch's limit in the job's preset,
    times the launch attempts, plus the retries' backoff, the allowance for unlaunched work and the
    margin; the small preset's limits are the assets' config defaults."""
    from assets import gba, mixture, posttrain, rl_policy, rollarc, rollpacker
    from pipelines import jobs
    from pipelines.config_paths import field_at

    defaults = {"gba_run": gba.GBARunConfig, "rl_policy": rl_policy.RlPolicyConfig,
                "rollpacker_run": rollpacker.RollPackerRunConfig, "rollarc_run": rollarc.RollArcRunConfig,
                "cpt_base_models": mixture.BaseModelConfig, "cpt_probe_runs": mixture.ProbeRunConfig,
                "mixture_validation": mixture.MixtureValidationConfig, "sft_checkpoint": posttrain.SftCheckpointConfig,
                "stage2_checkpoint": posttrain.Stage2Config}
    assert set(defaults) == set(jobs.SMALL_LAUNCH_LIMIT_S)
    for op, cls in defaults.items():
        field = jobs.LAUNCH_LIMIT_FIELD.get(op, "timeout_s")
        assert field_at(cls, field).default == jobs.SMALL_LAUNCH_LIMIT_S[op], op
    tags = {j.name: int(j.tags["dagster/max_runtime"]) for j in jobs.ALL_JOBS}
    assert set(tags) == {j.name for j in jobs.ALL_JOBS}
    assert tags["cpt_base_job"] == 3 * 1800 + 90 + 3600 + 900                 # one launch, three attempts
    assert tags["mixture_job"] == 2 * (3 * 1800 + 90) + 3600 + 900            # mixture_validation: two launches
    assert tags["gba_job"] == 3 * (600 + 120) + 90 + 3600 + 900               # run_timeout_s + the asset's 120 s
    assert jobs.max_runtime_s(["cpt_base_models"], "full") == 3 * 172_800 + 90 + 259_200 + 900   # the prod sizes
    assert tags["curation_job"] == 3600 + 900 and tags["source_refresh_job"] == 4500


def test_max_runtime_follows_the_prod_yamls_launch_timeouts(tmp_path):
    """Issue 43 item 1 (review): the bound comes from the launch limits the run itself uses. A prod
    YAML whose ``sizes`` raise cpt_base_models' timeout_s (and rollpacker_run's run_timeout_s) to
    400,000 s: the code location's effective run-config default (what a launch gets) is that value,
    and cpt_base_job's / rollpacker_job's dagster/max_runtime are computed from it, not from the
    built-in 172,800 s. Loads the code location in a subprocess (the tags are set at import)."""
    (tmp_path / "prod.yaml").write_text(
        f"lake: {{root: {tmp_path / 'lake'}, work_dir: {tmp_path / 'work'}}}\nexecutor: in_process\n"
        "sizes:\n  cpt_base_models: {timeout_s: 400000.0}\n  rollpacker_run: {run_timeout_s: 400000.0}\n")
    probe = (
        "import json, warnings; warnings.simplefilter('ignore')\n"
        "from pipelines.definitions import defs\n"
        "from pipelines import sensors\n"
        "fields = lambda op: defs.get_assets_def(op).op.config_schema.config_type.fields\n"
        "print(json.dumps({'launch': fields('cpt_base_models')['timeout_s'].default_value,\n"
        "  'rp_launch': fields('rollpacker_run')['run_timeout_s'].default_value,\n"
        "  'rp_step': fields('rollpacker_run')['timeout_s'].default_value,\n"
        "  'base': int(defs.get_job_def('cpt_base_job').tags['dagster/max_runtime']),\n"
        "  'rp': int(defs.get_job_def('rollpacker_job').tags['dagster/max_runtime']),\n"
        "  'auto': int(sensors.AUTOMATION_RUN_TAGS['dagster/max_runtime'])}))\n")
    env = {**os.environ, "CRUCIBLE_PROFILE": "prod", "CRUCIBLE_PROD_CONFIG": str(tmp_path / "prod.yaml"),
           "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["launch"] == 400_000.0 and got["rp_launch"] == 400_000.0 and got["rp_step"] == 3600.0
    assert got["base"] == 3 * 400_000 + 90 + 259_200 + 900                       # not 3 * 172_800 + ...
    # rollpacker_job: rl_policy at the prod default (172,800 s) and rollpacker_run at the YAML's 400,000 s
    assert got["rp"] == (3 * 172_800 + 90) + (3 * 400_000 + 90) + 259_200 + 900
    assert got["auto"] == 259_200 + 900                                          # automation runs: no launch


def test_a_run_past_its_max_runtime_is_ended_and_marked_failed_by_run_monitoring(daemon_home, tmp_path):
    """Issue 43 item 1, the hung run: a run whose ``dagster/max_runtime`` (8 s here) passes while its
    launched training still runs (60 steps of 1 s: from the bound's view, hung) is canceled and marked
    FAILURE by the daemon's run monitoring ("Exceeded maximum runtime"), within a few poll intervals
    of the bound; every process of the run (worker, launch, watchdog) is gone within BOUND_S of the
    verdict, and nothing is committed."""
    import dagster as dg

    from ops.launch import process_tree

    home, ws, env, daemon = daemon_home
    lake = tmp_path / "lake"
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        cfg = {"ops": {"kill_model": {"config": {"lake": str(lake), "steps": 60, "step_s": 1.0, "tag": "h"}}}}
        cli = subprocess.run([str(BIN / "dagster"), "job", "launch", "-w", str(ws), "-j", "kill_job",
                              "--config-json", json.dumps(cfg), "--tags", json.dumps({"dagster/max_runtime": "8"})],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, start_new_session=True)
        assert cli.returncode == 0, cli.stderr[-3000:]
        run = _wait("the launched run", lambda: next(iter(instance.get_runs(dg.RunsFilter(job_name="kill_job"))), None), 60)
        assert run.tags["dagster/max_runtime"] == "8"
        state = lake / "kill_model" / f".run-{run.run_id}" / "state" / "state.json"
        _wait("training under way", lambda: state.exists() and json.loads(state.read_text())["step"] >= 1, 90, 0.2)
        start = instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.RUN_START).records
        tree = process_tree(start[0].event_log_entry.dagster_event.pid)
        failed = _wait("the run failed by its max_runtime", lambda: (r := instance.get_run_by_id(run.run_id)).status
                       == dg.DagsterRunStatus.FAILURE and r, 8 + 10 * POLL_S + 30)
        msgs = [e.message for e in instance.all_logs(run.run_id) if e.message]
        assert any("Exceeded maximum runtime of 8 seconds" in m or "exceeding maximum runtime of 8 seconds" in m
                   for m in msgs), msgs[-8:]
        assert json.loads(state.read_text())["step"] < 60          # ended by the bound, not by finishing
        _assert_gone_within_bound(tree, "the run ended by max_runtime")
        assert not (lake / "kill_model" / "committed" / "model.txt").exists()   # nothing committed
        assert failed.status == dg.DagsterRunStatus.FAILURE
    finally:
        instance.dispose()
