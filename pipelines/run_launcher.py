"""The run launcher of the embedded instance that ``crucible setup`` writes (docs/operations.md,
"Killed runs, monitoring and retries").

Dagster's ``DefaultRunLauncher`` (run workers as local processes) cannot tell the daemon's run
monitoring whether a run's worker is alive (``supports_check_run_worker_health`` is False in
Dagster 1.13), so a run whose process was SIGKILLed (OOM killer, a killed ``make demo``, a
preempted machine) stayed STARTED forever and its retry never came. ``LocalRunLauncher`` launches
exactly as ``DefaultRunLauncher`` does and answers the health check from the process table: the run
worker is the process that reported the run's ``RUN_START`` event (its pid is in the event); when no
process with that pid and a start time before that event is running any more, the worker is
``FAILED`` and the monitoring daemon marks the run failed within one ``poll_interval_seconds``; the
instance's ``run_retries`` then re-executes it from failure, and the launch protocol resumes the
retried step from its last checkpoint (``assets.launch``: same run folder for one run lineage).

Valid where the daemon runs on the machine of the run workers (the embedded, one-machine instance);
a cluster deployment uses its own launcher's health check (deploy/helm/values.yaml).
"""

from __future__ import annotations

import os
from typing import Optional

from dagster import DagsterEventType, DagsterRun
from dagster._core.launcher import CheckRunHealthResult, WorkerStatus
from dagster._core.launcher.default_run_launcher import DefaultRunLauncher

START_SLACK_S = 5.0
"""A process that started more than this many seconds after the RUN_START event is not the run
worker (its pid was reused)."""


def _process_start_epoch(pid: int) -> Optional[float]:
    """The start time (Unix seconds) of the live, non-zombie process ``pid``; None when there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f.read().decode().splitlines() if line.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")


class LocalRunLauncher(DefaultRunLauncher):
    """``DefaultRunLauncher`` with a run-worker health check for run monitoring (module docstring).
    Instance YAML: ``run_launcher: {module: pipelines.run_launcher, class: LocalRunLauncher}``."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        import sys

        return sys.platform.startswith("linux")

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        """RUNNING while the process that started ``run`` lives (or before it reported RUN_START),
        FAILED (naming the pid) once it is gone."""
        records = self._instance.get_records_for_run(run.run_id, of_type=DagsterEventType.RUN_START, limit=1).records
        ev = records[0].event_log_entry if records else None
        pid = ev.dagster_event.pid if ev is not None and ev.dagster_event is not None else None
        if pid is None:
            return CheckRunHealthResult(WorkerStatus.RUNNING, "no RUN_START event yet")
        started = _process_start_epoch(pid)
        if started is not None and started <= ev.timestamp + START_SLACK_S:
            return CheckRunHealthResult(WorkerStatus.RUNNING, f"run worker pid {pid} is running")
        return CheckRunHealthResult(WorkerStatus.FAILED,
                                    f"the run worker (pid {pid}, which started run {run.run_id}) is no longer running: "
                                    "it was killed or crashed without reporting an end")
