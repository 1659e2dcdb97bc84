"""The Dagster code location ``crucible``: definitions, jobs, schedules."""
