"""The code location's Definitions. Loading must stay fast (< 3 s): heavy libraries are imported
inside asset functions, never here."""

import dagster as dg

from assets import curation, curation_checks, distillation, recsys, sources
from resources.lake import LakeResource
from resources.sources import SourcesResource
from resources.teacher import TeacherResource

from .jobs import curation_job, sources_job, training_job
from .schedules import nightly_curation

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([sources, curation, distillation, recsys]),
    asset_checks=dg.load_asset_checks_from_modules([curation_checks]),
    jobs=[sources_job, curation_job, training_job],
    schedules=[nightly_curation],
    resources={"lake": LakeResource(), "sources": SourcesResource(), "teacher": TeacherResource()},
    executor=dg.in_process_executor,
)
