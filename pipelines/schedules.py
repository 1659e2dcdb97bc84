"""Schedules: none. A cadence belongs on the asset (``AutomationCondition.on_cron``, evaluated by the
automation sensor, pipelines/sensors.py), not in a separate cron schedule running on top of it.

The curation graph needs no cadence: it follows its sources (``eager()``), and the sources sensor
reports a new data version as soon as a file or its YAML entry changes. (``nightly_curation``, a
02:00 UTC run of curation_job, was removed: it re-ran the graph whether or not anything changed, and
outside the automation's accounting.)
"""

SCHEDULES: list = []
