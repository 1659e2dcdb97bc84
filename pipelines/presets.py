"""Size defaults by profile: the embedded default's sizes (2 CPU cores) or production sizes.

Sizes are a property of the profile, not of a job: the code location applies the active profile's
sizes to the assets' run-config defaults (:func:`with_size_defaults`, called by
pipelines/definitions.py), so every way of launching an asset — declarative automation, a schedule,
a sensor, the UI's Materialize button, the Launchpad, ``dagster job launch`` — uses the same sizes:
the assets' own defaults (the ops dataclasses) under the ``default`` profile, ``PROD_SIZES`` merged
with the prod YAML's ``sizes`` section under ``prod`` (pipelines/profiles.py). Any field stays
editable per run (Launchpad, ``run_config``).

``PRESETS`` keeps the two size sets by name (``small`` = the assets' defaults, ``full`` = production)
for the run bounds of pipelines/jobs.py (``dagster/max_runtime``).
"""

from collections.abc import Iterable, Mapping
from typing import Any

# Production sizes: a GPU node (8 ranks: global batches are multiples of 8), an OpenAI-compatible
# teacher endpoint with real throughput, the whole generated set, every row through the teacher.
PROD_SIZES: dict[str, dict[str, Any]] = {
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
"""Op name (the asset's, or the multi-asset's function name) -> the size fields production sets.
Every other field keeps the asset's default."""

FULL = PROD_SIZES
"""Former name of ``PROD_SIZES``."""

PRESETS: dict[str, Mapping[str, Mapping[str, Any]]] = {"small": {}, "full": PROD_SIZES}
"""Size set name -> op -> the config fields it sets (``small`` = the assets' own defaults)."""


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


def preset_run_config(preset: str, ops: Iterable[str]) -> dict[str, Any]:
    """The run config of the size set ``preset`` for a job whose ops are ``ops`` (ops without values
    are left out, so the result validates against that job's config schema).

    Raises:
        ValueError: unknown preset name.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown size set {preset!r}; size sets are {sorted(PRESETS)}")
    values = PRESETS[preset]
    return {"ops": {op: {"config": dict(values[op])} for op in ops if op in values}}


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
    import pydantic
    from dagster._config.pythonic_config import infer_schema_from_config_class
    from dagster._config.pythonic_config.config import Config
    from dagster._core.definitions.definition_config_schema import DefinitionConfigSchema

    assets = list(assets)
    if not sizes:
        return assets
    by_op: dict[str, int] = {}
    for i, a in enumerate(assets):
        if isinstance(a, dg.AssetsDefinition) and a.is_executable:
            by_op[a.op.name] = i
    for op, values in sizes.items():
        if op not in by_op:
            raise SizesError(f"{where}: {op!r} is not an op of the code location; ops: {', '.join(sorted(by_op))}")
        a = assets[by_op[op]]
        fn = a.op.compute_fn
        cls = fn.get_config_arg().annotation if hasattr(fn, "has_config_arg") and fn.has_config_arg() else None
        if not (isinstance(cls, type) and issubclass(cls, Config)):
            raise SizesError(f"{where}: op {op!r} has no Pythonic run config to size")
        unknown = sorted(set(values) - set(cls.model_fields))
        if unknown:
            raise SizesError(f"{where}: {op}.{unknown[0]} is not a field of {cls.__name__}; fields: "
                             f"{', '.join(cls.model_fields)}")
        fields = {k: (cls.model_fields[k].annotation, pydantic.Field(default=v, description=cls.model_fields[k].description))
                  for k, v in values.items()}
        sized = pydantic.create_model(cls.__name__, __base__=cls, __module__=cls.__module__, **fields)
        sized.__doc__ = cls.__doc__
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
