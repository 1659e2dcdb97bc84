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

OWNERS = {"sources": ["team:data"], "curation": ["team:data"], "training": ["team:training"],
          "evaluation": ["team:training"], "mixture": ["team:pretraining"]}
"""Owners by asset group (the UI's owner filter and each asset's page); a group not listed: ``DEFAULT_OWNERS``."""
DEFAULT_OWNERS = ["team:crucible"]


def with_owners(assets) -> list:
    """``assets`` with owners on every asset spec that has none (by group: ``OWNERS``). A SourceAsset
    (``source_files``: an observable source asset has no owners field) is first turned into the
    external AssetsDefinition Dagster itself makes of it when it builds the Definitions."""
    from dagster._core.definitions.external_asset import create_external_asset_from_source_asset

    def own(spec: dg.AssetSpec) -> dg.AssetSpec:
        return spec if spec.owners else spec.replace_attributes(owners=OWNERS.get(spec.group_name, DEFAULT_OWNERS))

    assets = [create_external_asset_from_source_asset(a) if isinstance(a, dg.SourceAsset) else a for a in assets]
    return dg.map_asset_specs(own, assets)


defs = dg.Definitions(
    assets=with_owners(with_automation(with_size_defaults(dg.load_assets_from_modules(ASSET_MODULES), PROFILE.sizes or {},
                                              where=f"{PROFILE.config.source if PROFILE.config else 'profile'}: sizes"))),
    asset_checks=dg.load_asset_checks_from_modules(CHECK_MODULES),
    jobs=ALL_JOBS,
    schedules=SCHEDULES,
    sensors=SENSORS,
    resources=PROFILE.resources,
    executor=PROFILE.executor,
)
