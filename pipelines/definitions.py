"""The code location's Definitions. Loading must stay fast (< 3 s): heavy libraries are imported
inside asset functions, never here."""

import dagster as dg

from assets import curation, curation_checks, distillation, gba, mixture, recsys, sources
from resources.compute import ComputeResource
from resources.lake import LakeResource
from resources.sources import SourcesResource
from resources.teacher import TeacherResource

from .jobs import (cpt_base_job, cpt_probe_job, curation_job, gba_job, mixture_data_job, mixture_job, sources_job,
                   training_job)
from .schedules import nightly_curation

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([sources, curation, distillation, recsys, gba, mixture]),
    asset_checks=dg.load_asset_checks_from_modules([curation_checks, mixture]),
    jobs=[sources_job, curation_job, training_job, gba_job, mixture_data_job, cpt_base_job, cpt_probe_job, mixture_job],
    schedules=[nightly_curation],
    resources={"lake": LakeResource(), "sources": SourcesResource(), "teacher": TeacherResource(),
               "compute": ComputeResource()},
    executor=dg.in_process_executor,
)
