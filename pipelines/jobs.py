"""Jobs: what runs together.

One job per stage of each group (a Dagster job holds assets of one partitions definition at most, so
a group with several partitioned assets has one job per partitioned stage), each in two run-config
presets (pipelines/presets.py): ``<name>`` = ``small`` (the embedded default) and ``<name>_full`` =
``full`` (production sizes). ``LIFECYCLE`` is the order in which the stages make the whole lifecycle:
``crucible demo`` runs it; the UI's "Materialize all" on the global asset graph launches the same as
an asset backfill.

Run tags: ``crucible/stage`` (curation runs rewrite the same unpartitioned tables, so the instance
limits them to one at a time, see scripts/setup.sh) and ``crucible/preset``.
"""

from collections.abc import Sequence

import dagster as dg

from .presets import PRESETS, preset_run_config
from .profiles import active_gpu_run_tags

# Run tags of the jobs whose steps launch accelerate/torchrun workers (gpu=True below): {} in the
# default profile; in prod, the GPU limits the K8sRunLauncher gives the run pod (pipelines/profiles.py).
GPU_TAGS = active_gpu_run_tags()


def _jobs(name: str, selection: dg.AssetSelection, ops: Sequence[str], stage: str,
          description: str, gpu: bool = False) -> tuple:
    """The ``small`` job ``name`` and its ``full`` twin ``<name>_full`` over the same selection."""
    out = []
    for preset in PRESETS:
        config = preset_run_config(preset, ops)
        # ``small`` is the assets' own defaults and sets nothing, so the small job carries no default
        # run config: a job with one ignores the resources a caller passes to ``execute_in_process``
        # (Dagster 1.13; measured: the steps wrote to the default lake).
        out.append(dg.define_asset_job(
            name if preset == "small" else f"{name}_{preset}",
            selection=selection,
            config=config if config["ops"] else None,
            tags={"crucible/stage": stage, "crucible/preset": preset, **(GPU_TAGS if gpu else {})},
            description=f"{description} [preset: {preset}]",
        ))
    return out[0], out[1]


# One run per source partition (the UI's "materialize all" launches a backfill of these).
sources_job, sources_job_full = _jobs(
    "sources_job", dg.AssetSelection.assets("raw_problems"), ["raw_problems"], "sources",
    "Materialize one raw_problems partition (one source).")

# Everything downstream of the raw sources, plus the benchmark references, with their checks.
curation_job, curation_job_full = _jobs(
    "curation_job", dg.AssetSelection.groups("curation") | dg.AssetSelection.assets("benchmark_problems"),
    ["annotated_problems", "exact_deduped_problems", "near_deduped_problems", "decontaminated_problems",
     "distilled_problems", "sft_dataset"], "curation",
    "Annotate, dedup, decontaminate, distill and sample the SFT dataset from all raw sources.")

# One source partition and the curation graph below it: what the user-source sensor launches when a
# file changes (pipelines/sensors.py). Partitioned by source; the curation assets read every partition.
source_refresh_job = dg.define_asset_job(
    "source_refresh_job",
    selection=dg.AssetSelection.assets("raw_problems")
    | (dg.AssetSelection.assets("raw_problems").downstream() & dg.AssetSelection.groups("curation")),
    tags={"crucible/stage": "curation", "crucible/preset": "small"},
    description="Re-read one source (partition) and re-run the curation graph below it.",
)

# The recommendation substrate: MovieLens-100k CTR events and the single-process DeepFM model.
training_job, training_job_full = _jobs(
    "training_job", dg.AssetSelection.assets("ctr_events", "ctr_model"), ["ctr_model"], "training",
    "Build the CTR events (MovieLens-100k, time split) and train the DeepFM CTR model on the sparse engine.")

# GBA vs sync all-reduce, async PS, SSP and Hop-BW under one straggler trace, and auto (sync <-> GBA
# switching on a straggler detector): one partition per mode.
gba_job, gba_job_full = _jobs(
    "gba_job", dg.AssetSelection.assets("gba_run"), ["gba_run"], "training",
    "Train the CTR model in one training mode (partition): sync | async | gba | ssp | hopbw | auto "
    "(sync <-> GBA switching).", gpu=True)

# The warm-started scratchpad policy of the RL runs (docs/rl_policy.md), on its own.
rl_policy_job, rl_policy_job_full = _jobs(
    "rl_policy_job", dg.AssetSelection.assets("rl_policy"), ["rl_policy"], "training",
    "Warm-start the scratchpad policy of the RL runs (SFT to the target held-out pass rate).", gpu=True)

# RollPacker (tail batching) vs the synchronous GRPO baseline, a few steps each, on the scratchpad
# policy (warm-started first: rl_policy reuses a published policy of the same spec) or SmolLM2.
rollpacker_job, rollpacker_job_full = _jobs(
    "rollpacker_job", dg.AssetSelection.assets("rl_policy", "rollpacker_run"), ["rl_policy", "rollpacker_run"],
    "training", "Warm-start the scratchpad policy, then RollPacker (tail batching) vs synchronous GRPO baseline, "
    "a few steps each.", gpu=True)

# RollArc (trajectory-level async agentic RL, disaggregated on Ray pools) vs the monolithic baseline.
rollarc_job, rollarc_job_full = _jobs(
    "rollarc_job", dg.AssetSelection.assets("rollarc_run"), ["rollarc_run"], "training",
    "RollArc (disaggregated, trajectory-level async agentic RL) vs the monolithic synchronous baseline.", gpu=True)

# The mixture group (D-CPT Law). Partitioned assets get their own jobs; the main job runs each over
# its whole partition range in one run (the assets' BackfillPolicy.single_run: one launch).
mixture_data_job, mixture_data_job_full = _jobs(
    "mixture_data_job", dg.AssetSelection.assets("general_corpus", "domain_corpus", "cpt_tokenizer"), [], "mixture",
    "The CPT corpora (general reviews, curated STEM problems) and the BPE tokenizer + token streams.")
cpt_base_job, cpt_base_job_full = _jobs(
    "cpt_base_job", dg.AssetSelection.assets("cpt_base_models"), ["cpt_base_models"], "mixture",
    "Pre-train the base model of each probe size (launch a partition range to do all in one run).", gpu=True)
cpt_probe_job, cpt_probe_job_full = _jobs(
    "cpt_probe_job", dg.AssetSelection.assets("cpt_probe_runs"), ["cpt_probe_runs"], "mixture",
    "Continual pre-training probes, size x domain ratio (a partition range runs in one launch).", gpu=True)
mixture_job, mixture_job_full = _jobs(
    "mixture_job", dg.AssetSelection.assets("dcpt_law_fit", "mixture_plan", "mixture_validation"),
    ["dcpt_law_fit", "mixture_validation"], "mixture",
    "Fit the D-CPT Law on every finished probe run, answer the three mixture questions, and train the target "
    "model at the answers (the closed loop).", gpu=True)

# Failure-driven post-training: stage-1 SFT -> failure regions -> targeted synthesis -> stage 2
# (targeted and the random control) -> the comparison.
posttrain_job, posttrain_job_full = _jobs(
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
    sources_job, sources_job_full, source_refresh_job, curation_job, curation_job_full,
    training_job, training_job_full, gba_job, gba_job_full, rl_policy_job, rl_policy_job_full,
    rollpacker_job, rollpacker_job_full,
    rollarc_job, rollarc_job_full,
    mixture_data_job, mixture_data_job_full, cpt_base_job, cpt_base_job_full,
    cpt_probe_job, cpt_probe_job_full, mixture_job, mixture_job_full, posttrain_job, posttrain_job_full,
]
