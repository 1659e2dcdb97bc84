"""Run-config presets: ``small`` (the embedded default, 2 CPU cores) and ``full`` (production sizes).

Dagster gives a job one preset (its default run config, shown in the Launchpad and editable there),
so each group job comes twice (pipelines/jobs.py): ``<name>`` with ``small`` and ``<name>_full`` with
``full``. Pick the job in the Launchpad (or ``dagster job launch -j curation_job_full``) and edit any
field before launching. Only the size knobs are set here; every other field keeps the asset's
default. ``small`` mirrors the assets' own defaults (a test keeps them equal), so launching a
``small`` job and materializing from the asset graph do the same thing.
"""

from collections.abc import Iterable, Mapping
from typing import Any

from ops.gba.config import RunConfig as GBARun
from ops.rl.rollarc.driver import RunConfig as RollArcRun
from ops.rl.rollpacker.driver import RunSpec as RollPackerRun
from ops.rl.warmstart import WarmStartSpec as RlPolicyRun


def _defaults(source: type, *names: str) -> dict[str, Any]:
    """The ops dataclass defaults of ``names``: the ``small`` sizes of an asset whose config mirrors
    ``source`` (one source: the asset's defaults are the same)."""
    return {n: getattr(source, n) for n in names}


# Op name (the asset's, or the multi-asset's function name) -> config fields.
SMALL: dict[str, dict[str, Any]] = {
    "raw_problems": {"mathematics_dataset_per_module": 20, "limit": None},
    "annotated_problems": {"llm_label_max_rows": 16},
    "distilled_problems": {"teacher_max_rows": 24, "k_samples": 2, "max_tokens": 160, "workers": 2},
    "sft_dataset": {"target_size": 2000},
    "ctr_model": {"epochs": 3},
    "gba_run": _defaults(GBARun, "epochs"),
    "rl_policy": _defaults(RlPolicyRun, "max_steps", "batch_problems", "target_pass_rate"),
    "rollpacker_run": _defaults(RollPackerRun, "steps", "prompts_per_step", "responses_per_prompt", "max_new_tokens"),
    "rollarc_run": _defaults(RollArcRun, "steps", "groups_per_step", "group_size", "redundancy", "max_turns",
                             "max_new_tokens"),
    "cpt_base_models": {"base_tokens": 200_000, "seq_len": 128, "global_batch": 16, "timeout_s": 1800.0},
    "cpt_probe_runs": {"cpt_tokens": 131_072, "first_checkpoint": 4_096, "timeout_s": 1800.0},
    "dcpt_law_fit": {"n_boot": 20},
}

# Production sizes: a GPU node (8 ranks: global batches are multiples of 8), an OpenAI-compatible
# teacher endpoint with real throughput, the whole generated set, every row through the teacher.
FULL: dict[str, dict[str, Any]] = {
    "raw_problems": {"mathematics_dataset_per_module": 2000, "limit": None},
    "annotated_problems": {"llm_label_max_rows": 50_000},
    "distilled_problems": {"teacher_max_rows": 1_000_000, "k_samples": 8, "max_tokens": 4096, "workers": 32},
    "sft_dataset": {"target_size": 100_000},
    "ctr_model": {"epochs": 10},
    "gba_run": {"epochs": 5.0},
    # the scratchpad policy's recipe is the same at production scale; a GPU affords more steps
    # and a larger batch before the target stops it
    "rl_policy": {"max_steps": 4000, "batch_problems": 64, "target_pass_rate": 0.4},
    "rollpacker_run": {"steps": 200, "prompts_per_step": 128, "responses_per_prompt": 16, "max_new_tokens": 4096,
                       "timeout_s": 3600.0},
    "rollarc_run": {"steps": 200, "groups_per_step": 32, "group_size": 8, "redundancy": 2, "max_turns": 10,
                    "max_new_tokens": 2048, "max_prompt_tokens": 32_768, "engines_compute": 4, "engines_bandwidth": 4, "reward_max_replicas": 16,
                    "run_timeout_s": 172_800.0},
    "cpt_base_models": {"base_tokens": 500_000_000, "seq_len": 1024, "global_batch": 256, "timeout_s": 172_800.0},
    "cpt_probe_runs": {"cpt_tokens": 268_435_456, "first_checkpoint": 4_194_304, "timeout_s": 172_800.0},
    "dcpt_law_fit": {"n_boot": 200},
}

PRESETS: dict[str, Mapping[str, Mapping[str, Any]]] = {"small": SMALL, "full": FULL}


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
