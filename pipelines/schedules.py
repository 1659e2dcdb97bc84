"""Schedules: what runs when."""

import dagster as dg

from .jobs import curation_job

# Nightly refresh of the curation graph from the raw sources already in the lake.
nightly_curation = dg.ScheduleDefinition(
    name="nightly_curation",
    job=curation_job,
    cron_schedule="0 2 * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.STOPPED,
)
