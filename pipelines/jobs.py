"""Jobs: what runs together.

One job per stage of each group (a Dagster job holds assets of one partitions definition at most, so
a group with several partitioned assets has one job per partitioned stage). Jobs carry no run
config: sizes are the active profile's (pipelines/presets.py: the assets' run-config defaults, the
same for a job, automation, a sensor or the UI's Materialize). ``LIFECYCLE`` is the order in which the stages make the whole lifecycle:
``crucible demo`` runs it; the UI's "Materialize all" on the global asset graph launches the same as
an asset backfill.

Run tags: ``crucible/stage`` (curation runs rewrite the same unpartitioned tables, so the instance
limits them to one at a time, see scripts/setup.sh), ``crucible/preset`` (the size set the run uses:
the active profile's, ``small`` or ``full``, on the job; ``crucible demo --preset`` replaces it with
its own, ``demo`` by default: :func:`preset_run_tags`) and ``dagster/max_runtime``
(``max_runtime_s``: the run's bound in seconds, from the launch limits the run itself uses — the
active profile's size defaults, prod YAML ``sizes`` included — plus a margin; with run monitoring on, which ``crucible setup`` turns on, the daemon terminates and fails a run past it).
"""

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from .presets import PRESETS
from .profiles import active_gpu_run_tags, profile_name, profile_sizes

# Run tags of the jobs whose steps launch accelerate/torchrun workers (gpu=True below): {} in the
# default profile; in prod, the GPU limits the K8sRunLauncher gives the run pod (pipelines/profiles.py).
GPU_TAGS = active_gpu_run_tags()


SMALL_LAUNCH_LIMIT_S: dict[str, float] = {
    "gba_run": 600.0, "rl_policy": 3600.0, "rollpacker_run": 900.0, "rollarc_run": 900.0,
    "cpt_base_models": 1800.0, "cpt_probe_runs": 1800.0, "mixture_validation": 1800.0,
    "sft_checkpoint": 1200.0, "stage2_checkpoint": 1200.0,
}
"""The launched assets' wall-clock limit of one launch (s) in the ``small`` preset: their config
defaults (``cluster.run_timeout_s`` for gba_run, ``run_timeout_s`` for rollpacker_run and rollarc_run, else ``timeout_s``; a test
checks they agree with the config classes)."""
LAUNCH_LIMIT_FIELD = {"gba_run": "cluster.run_timeout_s", "rollpacker_run": "run_timeout_s", "rollarc_run": "run_timeout_s"}
LAUNCH_EXTRA_S = {"gba_run": 120.0}
"""Seconds an asset adds to its configured limit (gba_run: process start and teardown)."""
LAUNCHES = {"mixture_validation": 2}
"""Launches per step where more than one (mixture_validation: the base models, then the CPT runs)."""
LAUNCH_ATTEMPTS = 3
"""Attempts of one launch: the first and ``resources.retry.RetryingComputeResource.launch_retries``
(2) retries after launch deaths, with 30 + 60 s of backoff (``RETRY_BACKOFF_S``)."""
RETRY_BACKOFF_S = 90.0
UNLAUNCHED_S = {"demo": 1800.0, "small": 3600.0, "full": 259_200.0}
"""Allowance for a job's work outside launches (curation, tables, fits): 30 min demo, 1 h small,
3 days full."""
RUN_MARGIN_S = 900.0
"""Margin on top: run start, code loading, step start-up."""


def _size_values(sizes: "str | Mapping[str, Mapping[str, Any]]") -> Mapping[str, Mapping[str, Any]]:
    """A size set by name (``PRESETS``) or as op -> field -> value."""
    return PRESETS[sizes] if isinstance(sizes, str) else sizes


def launch_limit_s(op: str, sizes: "str | Mapping[str, Mapping[str, Any]]") -> float:
    """One launch's wall-clock limit (s) of ``op`` under ``sizes`` (0 for an op that launches nothing):
    the op's limit field (``LAUNCH_LIMIT_FIELD``, else ``timeout_s``) as ``sizes`` sets it, else the
    asset's own default (``SMALL_LAUNCH_LIMIT_S``), plus ``LAUNCH_EXTRA_S``.

    Args:
        sizes: a size set name (``small`` / ``full``: pipelines/presets.py ``PRESETS``) or the
            effective size defaults, op -> field -> value (``profiles.profile_sizes()``: what the
            launch itself uses, prod YAML overrides included).
    """
    if op not in SMALL_LAUNCH_LIMIT_S:
        return 0.0
    field = LAUNCH_LIMIT_FIELD.get(op, "timeout_s")
    return float(_size_values(sizes).get(op, {}).get(field, SMALL_LAUNCH_LIMIT_S[op])) + LAUNCH_EXTRA_S.get(op, 0.0)


def max_runtime_s(ops: Sequence[str], preset: str, sizes: "Mapping[str, Mapping[str, Any]] | None" = None) -> int:
    """The ``dagster/max_runtime`` of a job of ``ops`` (s): every launch of every op at its limit
    (``launch_limit_s`` under ``sizes``, default the size set ``preset``), each attempted
    ``LAUNCH_ATTEMPTS`` times with the retries' backoff, plus ``UNLAUNCHED_S[preset]`` and
    ``RUN_MARGIN_S``. A bound for a hung or lost run, not an estimate. Raises KeyError for an
    unknown ``preset``."""
    sizes = PRESETS[preset] if sizes is None else sizes
    launched = [(op, launch_limit_s(op, sizes)) for op in ops if op in SMALL_LAUNCH_LIMIT_S]
    total = sum(LAUNCHES.get(op, 1) * (LAUNCH_ATTEMPTS * limit + RETRY_BACKOFF_S) for op, limit in launched)
    return int(total + UNLAUNCHED_S[preset] + RUN_MARGIN_S)


SIZE_SET = "full" if profile_name() == "prod" else "small"
"""The active profile's size set (pipelines/presets.py): the assets' defaults carry it, the jobs' tags name it."""
SIZES = profile_sizes()
"""The active profile's effective size defaults (op -> field -> value; prod: ``PROD_SIZES`` with the
prod YAML's ``sizes`` over them): the same values the code location makes the assets' run-config
defaults, so a launch's limit and its job's bound come from one place."""


LAUNCH_OPS: dict[str, tuple[str, ...]] = {}
"""Job name -> the ops of the job whose launches its ``dagster/max_runtime`` counts."""


def preset_run_tags(job_name: str, preset: str, sizes: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """The run tags of a run of ``job_name`` that uses the size set ``preset`` with the effective
    sizes ``sizes`` (op -> field -> value: the run config it passes over the code location's
    defaults, pipelines/presets.py ``preset_sizes``): ``crucible/preset`` and ``dagster/max_runtime``
    (:func:`max_runtime_s` of the job's launches under those sizes). Tags given to a run replace
    the job's own. Raises KeyError for an unknown job or preset."""
    return {"crucible/preset": preset,
            "dagster/max_runtime": str(max_runtime_s(LAUNCH_OPS[job_name], preset, sizes))}


def _jobs(name: str, selection: dg.AssetSelection, ops: Sequence[str], stage: str,
          description: str, gpu: bool = False):
    """The job ``name`` over ``selection``, without run config: its assets' defaults are the active
    profile's sizes (a job with a default run config would also ignore the resources a caller passes
    to ``execute_in_process``: Dagster 1.13, measured)."""
    LAUNCH_OPS[name] = tuple(ops)
    return dg.define_asset_job(
        name,
        selection=selection,
        tags={"crucible/stage": stage, "crucible/preset": SIZE_SET, "dagster/max_runtime": str(max_runtime_s(ops, SIZE_SET, SIZES)),
              **(GPU_TAGS if gpu else {})},
        description=description,
    )


# One run per source partition (the UI's "materialize all" launches a backfill of these).
sources_job = _jobs(
    "sources_job", dg.AssetSelection.assets("raw_problems"), ["raw_problems"], "sources",
    "Materialize one raw_problems partition (one source).")

# Everything downstream of the raw sources, plus the benchmark references, with their checks.
curation_job = _jobs(
    "curation_job", dg.AssetSelection.groups("curation") | dg.AssetSelection.assets("benchmark_problems"),
    ["annotated_problems", "exact_deduped_problems", "near_deduped_problems", "decontaminated_problems",
     "distilled_problems", "sft_dataset"], "curation",
    "Annotate, dedup, decontaminate, distill and sample the SFT dataset from all raw sources.")

# One source partition and the curation graph below it: what the user-source sensor launches when a
# file changes (pipelines/sensors.py). Partitioned by source; the curation assets read every partition.
LAUNCH_OPS["source_refresh_job"] = ()
source_refresh_job = dg.define_asset_job(
    "source_refresh_job",
    selection=dg.AssetSelection.assets("raw_problems")
    | (dg.AssetSelection.assets("raw_problems").downstream() & dg.AssetSelection.groups("curation")),
    tags={"crucible/stage": "curation", "crucible/preset": SIZE_SET, "dagster/max_runtime": str(max_runtime_s((), SIZE_SET, SIZES))},
    description="Re-read one source (partition) and re-run the curation graph below it.",
)

# The recommendation substrate: MovieLens-100k CTR events and the single-process DeepFM model.
training_job = _jobs(
    "training_job", dg.AssetSelection.assets("ctr_events", "ctr_model"), ["ctr_model"], "training",
    "Build the CTR events (MovieLens-100k, time split) and train the DeepFM CTR model on the sparse engine.")

# GBA vs sync all-reduce, async PS, SSP and Hop-BW under one straggler trace, and auto (sync <-> GBA
# switching on a straggler detector): one partition per mode.
gba_job = _jobs(
    "gba_job", dg.AssetSelection.assets("gba_run"), ["gba_run"], "training",
    "Train the CTR model in one training mode (partition): sync | async | gba | ssp | hopbw | auto "
    "(sync <-> GBA switching).", gpu=True)

# The warm-started scratchpad policy of the RL runs (docs/rl_policy.md), on its own.
rl_policy_job = _jobs(
    "rl_policy_job", dg.AssetSelection.assets("rl_policy"), ["rl_policy"], "training",
    "Warm-start the scratchpad policy of the RL runs (SFT to the target held-out pass rate).", gpu=True)

# RollPacker (tail batching) vs the synchronous GRPO baseline, a few steps each, on the scratchpad
# policy (warm-started first: rl_policy reuses a published policy of the same spec) or SmolLM2.
rollpacker_job = _jobs(
    "rollpacker_job", dg.AssetSelection.assets("rl_policy", "rollpacker_run"), ["rl_policy", "rollpacker_run"],
    "training", "Warm-start the scratchpad policy, then RollPacker (tail batching) vs synchronous GRPO baseline, "
    "a few steps each.", gpu=True)

# RollArc (trajectory-level async agentic RL, disaggregated on Ray pools) vs the monolithic baseline.
rollarc_job = _jobs(
    "rollarc_job", dg.AssetSelection.assets("rollarc_run"), ["rollarc_run"], "training",
    "RollArc (disaggregated, trajectory-level async agentic RL) vs the monolithic synchronous baseline.", gpu=True)

# The mixture group (D-CPT Law). Partitioned assets get their own jobs; the main job runs each over
# its whole partition range in one run (the assets' BackfillPolicy.single_run: one launch).
mixture_data_job = _jobs(
    "mixture_data_job", dg.AssetSelection.assets("general_corpus", "domain_corpus", "cpt_tokenizer"), [], "mixture",
    "The CPT corpora (general reviews, curated STEM problems) and the BPE tokenizer + token streams.")
cpt_base_job = _jobs(
    "cpt_base_job", dg.AssetSelection.assets("cpt_base_models"), ["cpt_base_models"], "mixture",
    "Pre-train the base model of each probe size (launch a partition range to do all in one run).", gpu=True)
cpt_probe_job = _jobs(
    "cpt_probe_job", dg.AssetSelection.assets("cpt_probe_runs"), ["cpt_probe_runs"], "mixture",
    "Continual pre-training probes, size x domain ratio (a partition range runs in one launch).", gpu=True)
mixture_job = _jobs(
    "mixture_job", dg.AssetSelection.assets("dcpt_law_fit", "mixture_plan", "mixture_validation"),
    ["dcpt_law_fit", "mixture_validation"], "mixture",
    "Fit the D-CPT Law on every finished probe run, answer the three mixture questions, and train the target "
    "model at the answers (the closed loop).", gpu=True)

# Failure-driven post-training: stage-1 SFT -> failure regions -> targeted synthesis -> stage 2
# (targeted and the random control) -> the comparison.
posttrain_job = _jobs(
    "posttrain_job",
    dg.AssetSelection.assets("sft_checkpoint", "failure_regions", "targeted_synthesis", "stage2_checkpoint",
                             "failure_driven_comparison"),
    ["sft_checkpoint", "stage2_checkpoint"], "training",
    "Stage-1 SFT, failure regions, targeted synthesis, stage 2 vs the random control.", gpu=True)

GROUP_JOBS = {
    "curation": ["curation_job"],
    "training": ["training_job", "gba_job", "rl_policy_job", "rollpacker_job", "rollarc_job", "posttrain_job"],
    "evaluation": ["posttrain_job"],
    "mixture": ["mixture_data_job", "cpt_base_job", "cpt_probe_job", "mixture_job"],
}
"""The jobs that together materialize each asset group (no ``evaluation`` assets exist yet)."""

LIFECYCLE: tuple[tuple[str, str], ...] = (
    ("sources_job", "each partition"),
    ("curation_job", "one run"),
    ("training_job", "one run"),
    ("gba_job", "each partition"),
    ("rollpacker_job", "one run"),
    ("rollarc_job", "one run"),
    ("mixture_data_job", "one run"),
    ("cpt_base_job", "partition range, one run"),
    ("cpt_probe_job", "partition range, one run"),
    ("mixture_job", "one run"),
    ("posttrain_job", "one run"),
)
"""The full lifecycle, in order: (job, how its partitions are launched). One Dagster job cannot hold it
(its stages have different partitions definitions); ``crucible demo`` runs these runs in this order."""

ALL_JOBS = [
    sources_job, source_refresh_job, curation_job, training_job, gba_job, rl_policy_job, rollpacker_job, rollarc_job,
    mixture_data_job, cpt_base_job, cpt_probe_job, mixture_job, posttrain_job,
]
