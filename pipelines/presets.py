"""Run-config presets: ``small`` (the embedded default, 2 CPU cores) and ``full`` (production sizes).

Dagster gives a job one preset (its default run config, shown in the Launchpad and editable there),
so each group job comes twice (pipelines/jobs.py): ``<name>`` with ``small`` and ``<name>_full`` with
``full``. Pick the job in the Launchpad (or ``dagster job launch -j curation_job_full``) and edit any
field before launching. ``small`` is the assets' own defaults, written once in the ops dataclasses
(so it overrides nothing, and launching a ``small`` job and materializing from the asset graph do the
same thing); ``full`` sets only the size knobs, every other field keeps the asset's default.
"""

from collections.abc import Iterable, Mapping
from typing import Any

# Production sizes: a GPU node (8 ranks: global batches are multiples of 8), an OpenAI-compatible
# teacher endpoint with real throughput, the whole generated set, every row through the teacher.
FULL: dict[str, dict[str, Any]] = {
    "raw_problems": {"mathematics_dataset_per_module": 2000, "limit": None},
    "annotated_problems": {"llm_label_max_rows": 50_000},
    "distilled_problems": {"teacher_max_rows": 1_000_000, "k_samples": 8, "max_tokens": 4096, "workers": 32},
    "sft_dataset": {"target_size": 100_000},
    "ctr_model": {"epochs": 10},
    "gba_run": {"epochs": 5.0, "run_timeout_s": 172_800.0},
    # the scratchpad policy's recipe is the same at production scale; a GPU affords more steps
    # and a larger batch before the target stops it
    "rl_policy": {"max_steps": 4000, "batch_problems": 64, "timeout_s": 172_800.0},
    "rollpacker_run": {"steps": 200, "prompts_per_step": 128, "responses_per_prompt": 16, "max_new_tokens": 4096,
                       "timeout_s": 3600.0, "run_timeout_s": 172_800.0},
    "rollarc_run": {"steps": 200, "groups_per_step": 32, "group_size": 8, "redundancy": 2, "max_turns": 10,
                    "max_new_tokens": 2048, "max_prompt_tokens": 32_768, "engines_compute": 4, "engines_bandwidth": 4, "reward_max_replicas": 16,
                    "run_timeout_s": 172_800.0},
    "cpt_base_models": {"base_tokens": 500_000_000, "seq_len": 1024, "global_batch": 256, "timeout_s": 172_800.0},
    "cpt_probe_runs": {"cpt_tokens": 268_435_456, "first_checkpoint": 4_194_304, "timeout_s": 172_800.0},
    "dcpt_law_fit": {"n_boot": 200},
    # every launch of a production-sized run gets a production-sized wall-clock limit (the asset's
    # own limit wins over ComputeResource.launch_timeout_s; the small defaults are 900-3,600 s)
    "mixture_validation": {"timeout_s": 172_800.0},
    "sft_checkpoint": {"timeout_s": 172_800.0},
    "stage2_checkpoint": {"timeout_s": 172_800.0},
}

PRESETS: dict[str, Mapping[str, Mapping[str, Any]]] = {"small": {}, "full": FULL}
"""Preset -> op name (the asset's, or the multi-asset's function name) -> the config fields it sets."""


def preset_run_config(preset: str, ops: Iterable[str]) -> dict[str, Any]:
    """The run config of ``preset`` for a job whose ops are ``ops`` (ops without preset values are
    left out, so the result validates against that job's config schema).

    Raises:
        ValueError: unknown preset name.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown run-config preset {preset!r}; presets are {sorted(PRESETS)}")
    values = PRESETS[preset]
    return {"ops": {op: {"config": dict(values[op])} for op in ops if op in values}}
