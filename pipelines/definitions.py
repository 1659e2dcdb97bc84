"""The code location's Definitions. Loading must stay fast (< 3 s): heavy libraries are imported
inside asset functions, never here.

The profile (``CRUCIBLE_PROFILE``: ``default`` | ``prod``, pipelines/profiles.py) chooses the resources,
the executor and the assets' size defaults (pipelines/presets.py: every launch path uses them); the
assets, checks, jobs, schedules and sensors are the same in every profile. To add
an asset module, append it to ``ASSET_MODULES``.
"""

import dagster as dg

from assets import (curation, curation_checks, distillation, gba, mixture, posttrain, recsys, rl_policy, rollarc, rollpacker,
                    sources)

from .jobs import ALL_JOBS
from .presets import with_size_defaults
from .profiles import load_profile
from .schedules import SCHEDULES
from .sensors import SENSORS, with_automation

ASSET_MODULES = [sources, curation, distillation, recsys, gba, rl_policy, rollpacker, rollarc, mixture, posttrain]
CHECK_MODULES = [curation_checks, mixture, posttrain]

PROFILE = load_profile()

defs = dg.Definitions(
    assets=with_automation(with_size_defaults(dg.load_assets_from_modules(ASSET_MODULES), PROFILE.sizes or {},
                                              where=f"{PROFILE.config.source if PROFILE.config else 'profile'}: sizes")),
    asset_checks=dg.load_asset_checks_from_modules(CHECK_MODULES),
    jobs=ALL_JOBS,
    schedules=SCHEDULES,
    sensors=SENSORS,
    resources=PROFILE.resources,
    executor=PROFILE.executor,
)
