"""Size defaults by profile: the embedded default's sizes (2 CPU cores) or production sizes.

Sizes are a property of the profile, not of a job: the code location applies the active profile's
sizes to the assets' run-config defaults (:func:`with_size_defaults`, called by
pipelines/definitions.py), so every way of launching an asset — declarative automation, a schedule,
a sensor, the UI's Materialize button, the Launchpad, ``dagster job launch`` — uses the same sizes:
the assets' own defaults (the ops dataclasses) under the ``default`` profile, ``PROD_SIZES`` merged
with the prod YAML's ``sizes`` section under ``prod`` (pipelines/profiles.py). Any field stays
editable per run (Launchpad, ``run_config``).

``PRESETS`` keeps the size sets by name: ``demo`` (``DEMO_SIZES``: the whole lifecycle, every stage
real, in minutes on 2 CPU cores), ``small`` (the assets' own defaults, what the ``default`` profile's
code location uses) and ``full`` (production, ``PROD_SIZES``). ``crucible demo --preset NAME``
(pipelines/cli.py) passes the chosen set to every run it launches as run config
(:func:`preset_sizes`, :func:`preset_run_config`) and tags the runs with it; the code location's
defaults stay the profile's, so the UI, automation and schedules are unaffected by a demo run. A
preset may also name the partitions its demo materializes (``PRESET_PARTITIONS``: the ``demo`` preset
runs four of GBA's six modes); every other job's demo runs all of its partitions.
The run bounds of pipelines/jobs.py (``dagster/max_runtime``) are computed per size set.
"""

from collections.abc import Iterable, Mapping
from typing import Any

from pipelines.config_paths import field_at, nested_config, sized_config, unknown_paths

# Production sizes: a GPU node (8 ranks: global batches are multiples of 8), an OpenAI-compatible
# teacher endpoint with real throughput, the whole generated set, every row through the teacher.
PROD_SIZES: dict[str, dict[str, Any]] = {
    "raw_problems": {"mathematics_dataset_per_module": 2000, "limit": None},
    "annotated_problems": {"llm_label_max_rows": 50_000},
    "distilled_problems": {"teacher_max_rows": 1_000_000, "k_samples": 8, "max_tokens": 4096, "workers": 32},
    "sft_dataset": {"target_size": 100_000},
    "ctr_model": {"epochs": 10},
    "gba_run": {"train.epochs": 5.0, "cluster.run_timeout_s": 172_800.0},
    # the scratchpad policy's recipe is the same at production scale; a GPU affords more steps
    # and a larger batch before the target stops it
    "rl_policy": {"max_steps": 4000, "batch_problems": 64, "timeout_s": 172_800.0},
    "rollpacker_run": {"steps": 200, "prompts_per_step": 128, "responses_per_prompt": 16, "max_new_tokens": 4096,
                       "timeout_s": 3600.0, "run_timeout_s": 172_800.0},
    "rollarc_run": {"arc.steps": 200, "arc.groups_per_step": 32, "arc.group_size": 8, "arc.redundancy": 2, "arc.max_turns": 10,
                    "roles.max_new_tokens": 2048, "roles.max_prompt_tokens": 32_768,
                    "roles.engines": {"gpu_compute": 4, "gpu_bandwidth": 4}, "roles.reward_autoscaling.max_replicas": 16,
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
"""Op name (the asset's, or the multi-asset's function name) -> the size fields production sets.
Every other field keeps the asset's default."""

FULL = PROD_SIZES
"""Former name of ``PROD_SIZES``."""

# The demo: the whole main job on 2 CPU cores in minutes (issue 41 item 6), every stage doing real
# work (real sources, real teacher calls and verification, real training steps and launches, a real
# D-CPT fit and closed loop), at sizes where the ``small`` defaults are the slow part: the RL warm
# start (the largest single step), the teacher-bound curation steps, the mixture probes' repeats and
# the post-training pool. Figures of a demo run are smoke figures of that run (fewer steps, seeds and
# samples), not claims.
DEMO_SIZES: dict[str, dict[str, Any]] = {
    # Every row of the built-in sources: the curated set is also the CPT domain corpus. Tried (one
    # fresh-clone run, exploratory): raw_problems.limit 2,000 (the MATH test set sampled from 5,000 rows)
    # took the curation graph 90 s (110 s at full size 15 minutes later), but the smaller domain corpus
    # (and the tokenizer trained on it) left the law's held-out R^2 on general/unseen_N at 0.04 (0.044 with the full
    # validation sets), under the blocking check's 0.3 floor
    "raw_problems": {"mathematics_dataset_per_module": 10},
    # LLM domain labels and teacher distillation on a few rows (the teacher runs for real on them). The
    # embedded teacher generates in float64 (batch-invariant seeded samples) at ~0.35 responses/s on 2
    # cores: 6 rows (12 responses) took 29 s of a quiet demo, 4 rows still give a teacher-verified row
    "annotated_problems": {"llm_label_max_rows": 4},
    "distilled_problems": {"teacher_max_rows": 4, "max_tokens": 128},
    "ctr_model": {"epochs": 1},
    # the warm start is training-bound (75% of its time in optimizer steps of 32 problems): it stops at
    # 50 steps (the cosine schedule decays over them) or at a sampled pass rate of 0.1, and evaluates on
    # 32 problems. The RL runs start from a weaker policy (in a 100-step run the pass rate was 0.06 at
    # step 50: RL groups still carry signal, at p = 0.06, R = 4 a fifth of the groups are mixed, at
    # p = 0.1 a third; docs/rl_policy.md)
    "rl_policy": {"max_steps": 50, "target_pass_rate": 0.1, "eval_size": 32, "final_eval_size": 32},
    "rollarc_run": {"arc.steps": 2},
    # one base initialisation per size (4 in `small`; cpt_base_models was 47 s of a quiet demo at two)
    # and two probe seeds at the repeat ratio, both continuing init 0: the repeats measure the CPT
    # data-order noise only (seeds_reinit_base off), which still sets the closed loop's tolerance and
    # regime threshold. The probe grid keeps its `small` tokens and checkpoints: the blocking held-out
    # R^2 check of dcpt_law_fit is near its 0.3 floor there. Exploratory runs, one each, with the full
    # validation sets: these sizes gave domain/unseen_D 0.44, general/unseen_N 0.43 (two inits: 0.48 /
    # 0.56; with the halved sets below, one run: 0.51 / 0.48); half the CPT tokens
    # (64k, checkpoints 2k-64k) gave domain/unseen_D 0.05, with one base init also general/unseen_N 0.17
    # Validation sets of 24 general blocks and 12 per sub-domain (48 / 24 in `small`): evaluation was
    # about a third of a probe run. Every run and checkpoint is scored on the same fixed blocks, so a
    # smaller set moves the losses' common level more than their differences, which the law fits.
    "cpt_base_models": {"inits": [0], "val_seqs_general": 24, "val_seqs_per_subdomain": 12},
    "cpt_probe_runs": {"seeds": [0, 1], "seeds_reinit_base": False},
    # 5 bootstrap refits behind the plan's spread (20 in `small`): the 10-90% band is a rough one.
    # (Comparing 2 law forms instead of 5 saved nothing measurable: one-core 40 s vs 42 s.)
    "dcpt_law_fit": {"n_boot": 5},
    # the target's CPT budget D: 2x the largest probed D (262,144 tokens; `small` derives 4x), so the
    # closed loop's two training runs of the largest size are half as long (one-core 134 -> 79 s) and
    # still extrapolate in D; the verdict, the regime and the plan's acceptance are reported as before
    "mixture_plan": {"target_tokens": 262_144},
    # the closed loop verifies the trade-off answer (the law's r_d and the grid's best: the verdict and
    # the regime); the limited-domain answer's extra training run is left to `small`
    "mixture_validation": {"verify_limited_domain": False},
    # 120 stage-1 steps (300 in `small`): at 200 the demo's student went from 0.0 to 0.18 programmatic
    # accuracy, far above the blocking check's bar (above the base model's)
    "sft_checkpoint": {"steps": 120},
    # a pool of 25 per (module, level) and a budget of 100 per arm: at 50 / 200 the targeted cells
    # held the whole budget, at half the pool they hold half
    "targeted_synthesis": {"pool_per_module": 25, "budget": 100},
    # two seeds per arm of 25 steps (3 of 60 in `small`): stage 2 is launch- and evaluation-bound
    "stage2_checkpoint": {"seeds": 2, "steps": 25},
}
"""Op -> the size fields the ``demo`` preset sets (every other field keeps the asset's default)."""

PRESETS: dict[str, Mapping[str, Mapping[str, Any]]] = {"demo": DEMO_SIZES, "small": {}, "full": PROD_SIZES}
"""Size set name -> op -> the config fields it sets (``small`` = the assets' own defaults)."""

DEMO_PARTITIONS: dict[str, tuple[str, ...]] = {
    # GBA against the two synchronisation modes it sits between (all-reduce sync, plain async PS) and
    # the switching run; SSP and Hop-BW, the paper's other baselines, are left to `small`. A mode's
    # launch is ~8 s of process start and RPC set-up and teardown around ~4 s of training at these sizes
    "gba_job": ("sync", "async", "gba", "auto"),
}
"""Job -> the partitions ``crucible demo --preset demo`` materializes (other presets and jobs: all)."""

PRESET_PARTITIONS: dict[str, Mapping[str, tuple[str, ...]]] = {"demo": DEMO_PARTITIONS, "small": {}, "full": {}}
"""Size set name -> job -> the partition keys its demo runs (a job not named: every partition). Read for
the jobs ``crucible demo`` runs one partition at a time (``sources_job``, ``gba_job``); the jobs it runs
as one partition range (the CPT base and probe jobs) always cover every partition."""


def preset_partitions(preset: str, job: str, keys: Iterable[str]) -> list[str]:
    """The partition keys of ``job`` (all of them: ``keys``) that ``crucible demo --preset preset``
    materializes, in ``keys``' order. Raises ValueError naming a key of ``PRESET_PARTITIONS`` that
    ``job`` does not have."""
    keys = list(keys)
    chosen = PRESET_PARTITIONS.get(preset, {}).get(job)
    if chosen is None:
        return keys
    unknown = [k for k in chosen if k not in keys]
    if unknown:
        raise ValueError(f"PRESET_PARTITIONS[{preset!r}][{job!r}] (pipelines/presets.py): {unknown[0]!r} is not a "
                         f"partition of {job}; partitions: {', '.join(keys)}")
    return [k for k in keys if k in chosen]


class SizesError(ValueError):
    """A size override names an op without run config or a field its op does not have."""


def merge_sizes(base: Mapping[str, Mapping[str, Any]], overrides: Mapping[str, Mapping[str, Any]]
                ) -> dict[str, dict[str, Any]]:
    """``base`` with ``overrides`` applied field by field (an op in ``overrides`` keeps the ``base``
    fields it does not name)."""
    out = {op: dict(values) for op, values in base.items()}
    for op, values in overrides.items():
        out.setdefault(op, {}).update(values)
    return out


def preset_run_config(preset: "str | Mapping[str, Mapping[str, Any]]", ops: Iterable[str]) -> dict[str, Any]:
    """The run config of a size set for a job whose ops are ``ops`` (ops without values are left
    out, so the result validates against that job's config schema).

    Args:
        preset: a size set name (``PRESETS``) or its values, op -> field -> value (e.g. from
            :func:`preset_sizes`).

    Raises:
        ValueError: unknown preset name.
    """
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"unknown size set {preset!r}; size sets are {', '.join(PRESETS)}")
        values = PRESETS[preset]
    else:
        values = preset
    return {"ops": {op: {"config": nested_config(values[op])} for op in ops if op in values}}


def preset_sizes(preset: str, assets: Iterable, profile_set: str = "small",
                 profile_sizes: "Mapping[str, Mapping[str, Any]] | None" = None) -> dict[str, dict[str, Any]]:
    """The sizes a run of the size set ``preset`` must set (op -> field -> value) so that it gets
    that set whatever the code location's defaults are.

    The code location's defaults are the active profile's: ``profile_sizes`` over the assets' own
    defaults, the size set ``profile_set`` (``small`` for the ``default`` profile, ``full`` for
    ``prod``: pipelines/profiles.py). For ``preset == profile_set`` the result is ``profile_sizes``
    (the prod YAML's ``sizes`` included). Otherwise it is ``PRESETS[preset]`` plus, for every field
    the profile's defaults change and the preset does not set, the asset's own default (so
    ``crucible demo --preset small`` under ``prod`` gets the small sizes, not production's).

    Args:
        assets: the code location's assets without size defaults (``dg.load_assets_from_modules``
            of pipelines/definitions.py ``ASSET_MODULES``): the ops and Config classes checked against.

    Raises:
        ValueError: unknown preset name (the message lists the size sets).
        SizesError: the preset names an op without Pythonic run config or a field its op does not
            have (the message names the preset, op and field).
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown size set {preset!r}; size sets are {', '.join(PRESETS)}")
    classes = config_classes(assets)
    where = f"PRESETS[{preset!r}] (pipelines/presets.py)"
    _check_sizes(PRESETS[preset], classes, where)
    if preset == profile_set:
        return {op: dict(v) for op, v in (profile_sizes or {}).items()}
    out = {op: dict(v) for op, v in PRESETS[preset].items()}
    for op, values in (profile_sizes or {}).items():
        _check_sizes({op: values}, classes, "the profile's sizes")
        for field in values:
            if field not in out.get(op, {}):
                f = field_at(classes[op], field)       # a dotted path names a nested field (cluster.run_timeout_s)
                out.setdefault(op, {})[field] = f.default_factory() if f.default_factory is not None else f.default
    return out


def config_classes(assets: Iterable) -> dict[str, Any]:
    """Op name -> its Pythonic ``Config`` class (``None`` for an executable asset without one) for
    every executable AssetsDefinition in ``assets``."""
    import dagster as dg
    from dagster._config.pythonic_config.config import Config

    out: dict[str, Any] = {}
    for a in assets:
        if isinstance(a, dg.AssetsDefinition) and a.is_executable:
            fn = a.op.compute_fn
            cls = fn.get_config_arg().annotation if hasattr(fn, "has_config_arg") and fn.has_config_arg() else None
            out[a.op.name] = cls if isinstance(cls, type) and issubclass(cls, Config) else None
    return out


def _check_sizes(sizes: Mapping[str, Mapping[str, Any]], classes: Mapping[str, Any], where: str) -> None:
    """SizesError unless every op of ``sizes`` has a Config class in ``classes`` with every field."""
    for op, values in sizes.items():
        if op not in classes:
            raise SizesError(f"{where}: {op!r} is not an op of the code location; ops: {', '.join(sorted(classes))}")
        cls = classes[op]
        if cls is None:
            raise SizesError(f"{where}: op {op!r} has no Pythonic run config to size")
        unknown = unknown_paths(cls, values)             # dotted paths name nested fields: train.epochs
        if unknown:
            raise SizesError(f"{where}: {op}.{unknown[0]} is not a field of {cls.__name__}; fields: "
                             f"{', '.join(cls.model_fields)}")


def with_size_defaults(assets: Iterable, sizes: Mapping[str, Mapping[str, Any]], where: str = "sizes") -> list:
    """``assets`` with the run-config defaults of the ops named in ``sizes`` replaced (op -> field ->
    value); other assets, checks and fields unchanged. The new default is what the Launchpad shows
    and what every run that does not set the field gets (automation, sensors, schedules, the UI's
    Materialize, the CLI): Dagster fills a missing op config field from the op's config schema, and
    the asset builds its Config object from that resolved config.

    Args:
        assets: AssetsDefinitions (and anything else, passed through), e.g. from
            ``dg.load_assets_from_modules``.
        sizes: op name -> {field: default}; ``{}`` changes nothing.
        where: named in errors (the YAML file and section the sizes came from).

    Raises:
        SizesError: an op in ``sizes`` is no asset with Pythonic run config in ``assets``, or a
            field is not a field of its op's Config class (the message names ``where``, op and field,
            and lists the op's fields).
    """
    import dagster as dg
    from dagster._config.pythonic_config import infer_schema_from_config_class
    from dagster._core.definitions.definition_config_schema import DefinitionConfigSchema

    assets = list(assets)
    if not sizes:
        return assets
    by_op: dict[str, int] = {}
    for i, a in enumerate(assets):
        if isinstance(a, dg.AssetsDefinition) and a.is_executable:
            by_op[a.op.name] = i
    classes = config_classes(assets)
    _check_sizes(sizes, classes, where)
    for op, values in sizes.items():
        a = assets[by_op[op]]
        cls = classes[op]
        sized = sized_config(cls, dict(values))          # nested parts sized at their dotted paths
        schema = DefinitionConfigSchema(infer_schema_from_config_class(sized))
        node = a.op.with_replaced_properties(name=a.op.name, config_schema=schema)
        assets[by_op[op]] = _with_node(a, node)
    return assets


def _with_node(a, node):
    """``a`` with its op replaced by ``node`` (same name, keys, specs, checks)."""
    import dagster as dg

    attrs = a.get_attributes_dict()
    attrs["node_def"] = node
    return dg.AssetsDefinition.dagster_internal_init(**attrs)
