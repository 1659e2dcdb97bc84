"""Schedules: what runs when. All start stopped: a person turns them on (UI: Automation)."""

import dagster as dg

from .jobs import curation_job

# Nightly refresh of the curation graph from the raw sources already in the lake (new user files
# are picked up by pipelines/sensors.py:user_sources_sensor as they change).
nightly_curation = dg.ScheduleDefinition(
    name="nightly_curation",
    job=curation_job,
    cron_schedule="0 2 * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Re-run the curation graph (small preset) every night at 02:00 UTC.",
)

SCHEDULES = [nightly_curation]
