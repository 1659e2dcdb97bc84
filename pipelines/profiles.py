"""Profiles: one switch moves Crucible from the embedded default to production (docs/operations.md, "Profiles").

    CRUCIBLE_PROFILE=prod                        # default: "default" (2 CPU cores, offline)
    CRUCIBLE_PROD_CONFIG=/etc/crucible/prod.yaml # optional; prod.example.yaml documents every key

The example and the accelerate configs are package data (``pipelines/deploy/``; the repository's
``deploy/`` links to them), so the profile loads from an installed wheel: a relative
``compute.accelerate_config_file`` that is not beside the YAML is taken from there. Copy the example
out of an installed package with ``python -m pipelines.profiles example > /etc/crucible/prod.yaml``.

Production swaps resources and the executor, never asset code:

- lake: an object-store root (``s3://bucket/prefix``, an S3-compatible ``endpoint_url``): tables
  are Delta Lake tables (``ops.lake.DeltaTables``), JSON files and dataset folders versioned objects
  plus a manifest (``ops.lake.ObjectStoreLake``); the
  files that need POSIX (caches, run folders, checkpoints, the DuckDB catalog) go to ``lake.work_dir``,
  a volume every pod mounts;
- teacher: an OpenAI-compatible endpoint (vLLM, SGLang, a provider): ``base_url``, ``model``, and the
  name of the variable holding the key;
- compute: a GPU accelerate config file, ranks per launch, mixed precision, the Ray cluster address;
- executor: ``k8s`` (dagster-k8s ``k8s_job_executor``: one pod per step; the GPU steps' pods get GPU
  limits, a GPU node selector and tolerations), ``multiprocess`` or ``in_process`` (one pod per run,
  launched by the ``K8sRunLauncher``: then the GPU jobs carry the ``dagster-k8s/config`` run tag and
  the run pod gets the GPUs).

The YAML is validated by the pydantic model :class:`ProdConfig` (``extra="forbid"``, strict types):
every error names the file and the key, and a typo'd key is reported with its nearest known key.
Loading stays fast: yaml and dagster_k8s are imported only for the prod profile (pydantic is already
loaded by dagster).
"""

import difflib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import dagster as dg
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator, model_validator

PROFILE_ENV = "CRUCIBLE_PROFILE"
CONFIG_ENV = "CRUCIBLE_PROD_CONFIG"
PROFILES = ("default", "prod")
BUNDLED = Path(__file__).resolve().parent / "deploy"
"""The configs shipped inside the package (wheel included): ``prod.example.yaml``, ``accelerate/*.yaml``."""

GPU_OPS = ("cpt_base_models", "cpt_probe_runs", "gba_run", "rl_policy", "rollpacker_run", "rollarc_run", "sft_checkpoint", "stage2_checkpoint")
"""Steps that launch accelerate/torchrun workers (the assets that belong in ``pool="gpu"``)."""
RAY_JOB_OPS = ("rollpacker_run", "rollarc_run")
"""Steps whose driver is submitted as a Ray Job when ``compute.ray_jobs_address`` is set: their pod
then only submits and polls, and the GPUs are the Ray cluster's (``num_gpus`` of the actors)."""


def gpu_step_ops(cfg: "ProdConfig") -> tuple[str, ...]:
    """The steps whose k8s pods request GPUs: ``GPU_OPS`` less ``RAY_JOB_OPS`` in Ray Jobs mode."""
    return tuple(op for op in GPU_OPS if not (cfg.compute.ray_jobs_address and op in RAY_JOB_OPS))


class ProfileError(ValueError):
    """A bad profile name or production config (the message names the file and the key)."""


class _Strict(BaseModel):
    """A config block: unknown keys are errors (``extra="forbid"``), types are not coerced
    (``strict``: ``"8"`` is not an int, ``true`` is not an int), values are frozen."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class LakeConfig(_Strict):
    """``lake``: the object store holding the lake (``LakeResource``: docs/operations.md, "Lake on
    object storage") and the POSIX working folder every pod mounts."""

    root: str = "s3://crucible-lake/crucible"
    endpoint_url: str = ""
    region: str = ""
    work_dir: str = "/var/lib/crucible"
    keep_versions: int = Field(2, ge=1)


class TeacherConfig(_Strict):
    """``teacher``: an OpenAI-compatible endpoint (vLLM, SGLang, a provider)."""

    base_url: str = "http://crucible-teacher:8000/v1"
    model: str = "Qwen/Qwen2.5-Math-7B-Instruct"
    api_key_env: str = "TEACHER_API_KEY"
    concurrency: int = Field(64, ge=1)


class ComputeConfig(_Strict):
    """``compute``: GPU launches (accelerate config file, ranks, precision) and the Ray cluster."""

    accelerate_config_file: str = str(BUNDLED / "accelerate" / "gpu_8.yaml")
    num_processes: int = Field(8, ge=1)
    mixed_precision: Literal["no", "fp16", "bf16"] = "bf16"
    launcher: Literal["accelerate", "torchrun"] = "accelerate"
    ray_jobs_address: str = "http://crucible-ray-head:8265"
    """The Ray Jobs API: the RL drivers are submitted as Ray Jobs (docs/operations.md, "Ray clusters")."""
    ray_address: str = ""
    """A GCS address (host:6379) for a step that runs on a cluster node; ignored with ray_jobs_address."""
    rl_engine_gpus: float = Field(1.0, ge=0)
    rl_trainer_gpus: float = Field(1.0, ge=0)
    tracking_uri: str = ""
    """An MLflow tracking server (``http://mlflow:5000``): every launch's training curves go there
    (docs/operations.md, "Experiment tracking"); "" = no tracking."""
    tracking_experiment: str = "crucible"

    @field_validator("accelerate_config_file")
    @classmethod
    def _relative_to_the_file(cls, value: str, info: ValidationInfo) -> str:
        """Relative to the YAML's folder; a relative path that is not there but is among the configs
        shipped in the package (``BUNDLED``: the example's ``accelerate/gpu_8.yaml``, when only the
        example was copied to /etc/crucible) is taken from there."""
        resolved = _resolve(value, info)
        if value and not Path(value).expanduser().is_absolute() and not Path(resolved).exists():
            bundled = BUNDLED / value
            if bundled.exists():
                return str(bundled.resolve())
        return resolved


class K8sConfig(_Strict):
    """``k8s``: the step pods of dagster-k8s' executor (GPU limits, node selector, tolerations)."""

    job_namespace: str = "crucible"
    gpu_resource: str = "nvidia.com/gpu"
    gpus_per_step: int = Field(8, ge=0)
    node_selector: dict[str, str] = Field(default_factory=lambda: {"nvidia.com/gpu.present": "true"})
    tolerations: list[dict[str, Any]] = Field(default_factory=lambda: [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    max_concurrent_steps: int = Field(8, ge=1)


class ProdConfig(_Strict):
    """The production settings: the YAML named by ``$CRUCIBLE_PROD_CONFIG``, one field per key
    (prod.example.yaml, shipped in the package, lists every key with its default). Every key is optional.

    Validation (pydantic, ``extra="forbid"``): an unknown section or key, a wrong type, a value
    outside its choices or range, an object-store ``lake.root`` without ``lake.work_dir``, or a missing
    ``compute.accelerate_config_file`` is an error. Relative paths (``compute.accelerate_config_file``,
    ``sources_file``) are resolved against the directory given as ``context={"base": dir}`` (the YAML's).
    ``source`` (not a key) is the file the values came from, or ``<defaults>``.
    """

    lake: LakeConfig = Field(default_factory=LakeConfig)
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    compute: ComputeConfig = Field(default_factory=ComputeConfig)
    executor: Literal["k8s", "multiprocess", "in_process"] = "k8s"
    k8s: K8sConfig = Field(default_factory=K8sConfig)
    sources_file: str = ""
    sizes: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Size overrides, op -> field -> value, merged field by field over the production sizes
    (pipelines/presets.py ``PROD_SIZES``); they become the assets' run-config defaults in this
    profile. A field the op does not have is an error when the code location loads."""
    _source: str = PrivateAttr("<defaults>")

    @property
    def source(self) -> str:
        return self._source

    @field_validator("sources_file")
    @classmethod
    def _relative_to_the_file(cls, value: str, info: ValidationInfo) -> str:
        return _resolve(value, info)

    @model_validator(mode="after")
    def _consistent(self) -> "ProdConfig":
        if "://" in self.lake.root and not self.lake.work_dir:
            raise ValueError(f"lake.root {self.lake.root!r} is an object-store URI: set lake.work_dir, the POSIX folder "
                             "every pod mounts (caches, run folders, checkpoints, the DuckDB catalog)")
        acc = self.compute.accelerate_config_file
        if acc and not Path(acc).expanduser().exists():
            raise ValueError(f"compute.accelerate_config_file {acc} does not exist (a relative path is resolved "
                             f"against the YAML's folder, then against the package's {BUNDLED})")
        return self


def _resolve(value: str, info: ValidationInfo) -> str:
    """``value`` made absolute against ``info.context["base"]`` when relative (no context: as is)."""
    base = (info.context or {}).get("base")
    if value and base is not None and not Path(value).expanduser().is_absolute():
        return str((Path(base) / value).resolve())
    return value


def _profile_error(err: ValidationError, where: str) -> ProfileError:
    """One ProfileError naming the file and every bad key (with the close match for a typo)."""
    msgs = []
    for e in err.errors():
        loc = tuple(str(x) for x in e["loc"])
        key, kind, value = ".".join(loc), e["type"], e.get("input")
        if kind == "extra_forbidden":
            known = list(_model_at(loc[:-1]).model_fields)
            near = difflib.get_close_matches(loc[-1], known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            what = f"unknown key {key}" if len(loc) > 1 else f"unknown section {key!r}"
            msgs.append(f"{what}{hint}; known: {', '.join(known)}")
        elif kind == "literal_error":
            msgs.append(f"{key} = {value!r}; one of {e['ctx']['expected']}")
        elif kind in _TYPE_NAMES:
            msgs.append(f"{key} must be {_TYPE_NAMES[kind]}, got {type(value).__name__} {value!r}")
        elif kind == "value_error":
            msgs.append(str(e["ctx"]["error"]))
        else:
            msgs.append(f"{key}: {e['msg']} (got {value!r})")
    return ProfileError(f"{where}: " + "; ".join(msgs))


_TYPE_NAMES = {"int_type": "int", "string_type": "str", "dict_type": "a mapping", "list_type": "a list",
               "model_type": "a mapping", "bool_type": "bool", "float_type": "float"}


def _model_at(loc: tuple[str, ...]) -> type[BaseModel]:
    """The config block at ``loc`` (``()`` = ProdConfig, ``("lake",)`` = LakeConfig)."""
    model: type[BaseModel] = ProdConfig
    for part in loc:
        model = model.model_fields[part].annotation  # type: ignore[assignment]
    return model


def profile_name() -> str:
    """``$CRUCIBLE_PROFILE`` (default ``default``). Raises ProfileError on an unknown name."""
    name = os.environ.get(PROFILE_ENV, "").strip() or "default"
    if name not in PROFILES:
        raise ProfileError(f"{PROFILE_ENV}={name!r} is not a profile; profiles are {', '.join(PROFILES)}")
    return name


def load_prod_config(path: Optional[str] = None) -> ProdConfig:
    """The production config: defaults, overridden by the YAML at ``path`` (default
    ``$CRUCIBLE_PROD_CONFIG``; none = defaults). Relative paths in the file are relative to it.

    Raises:
        ProfileError: missing file, not YAML, or a document :class:`ProdConfig` rejects (the
            message names the file and every bad key: an unknown section or key, a wrong type, a bad
            choice, an object-store root without a work_dir, a missing accelerate config file).
    """
    path = path if path is not None else os.environ.get(CONFIG_ENV, "")
    doc: dict[str, Any] = {}
    where, base = "<defaults>", None
    if path:
        from ops.yamlfile import read_yaml_mapping

        p, doc = read_yaml_mapping(path, ProfileError, CONFIG_ENV)
        where, base = str(p), p.parent
    try:
        cfg = ProdConfig.model_validate(doc, context={"base": base})
    except ValidationError as e:
        raise _profile_error(e, where) from None
    cfg._source = where
    return cfg


def sources_file() -> str:
    """The user sources file of the active profile: ``$CRUCIBLE_SOURCES``; else, under the prod profile, the
    prod config's ``sources_file`` (so the partitions the code location creates are the ones the prod
    ``SourcesResource`` reads); else "". Raises ProfileError on a bad prod config."""
    env = os.environ.get("CRUCIBLE_SOURCES", "")
    if env or profile_name() != "prod":
        return env
    return load_prod_config().sources_file


def prod_resources(cfg: ProdConfig) -> dict[str, dg.ConfigurableResource]:
    """The resources of the production profile (same keys as the default profile)."""
    from resources.lake import LakeResource
    from resources.retry import RetryingComputeResource
    from resources.sources import SourcesResource
    from resources.teacher import TeacherResource

    return {
        "lake": LakeResource(root=cfg.lake.root, endpoint_url=cfg.lake.endpoint_url, region=cfg.lake.region,
                             work_dir=cfg.lake.work_dir, keep_versions=cfg.lake.keep_versions),
        "sources": SourcesResource(config_file=cfg.sources_file),
        "teacher": TeacherResource(base_url=cfg.teacher.base_url, model=cfg.teacher.model,
                                   api_key_env=cfg.teacher.api_key_env, concurrency=cfg.teacher.concurrency),
        "compute": RetryingComputeResource(cpu=False, launcher=cfg.compute.launcher,
                                           accelerate_config_file=cfg.compute.accelerate_config_file or None,
                                           num_processes=cfg.compute.num_processes,
                                           mixed_precision=cfg.compute.mixed_precision,
                                           ray_address=cfg.compute.ray_address or None,
                                           ray_jobs_address=cfg.compute.ray_jobs_address or None,
                                           rl_engine_gpus=cfg.compute.rl_engine_gpus,
                                           rl_trainer_gpus=cfg.compute.rl_trainer_gpus, launch_timeout_s=172_800.0,
                                           tracking_uri=cfg.compute.tracking_uri or None,
                                           tracking_experiment=cfg.compute.tracking_experiment),
    }


def default_resources() -> dict[str, dg.ConfigurableResource]:
    """The embedded default's resources: local lake, embedded teacher, CPU launches, local Ray."""
    from resources.lake import LakeResource
    from resources.retry import RetryingComputeResource
    from resources.sources import SourcesResource
    from resources.teacher import TeacherResource

    return {"lake": LakeResource(), "sources": SourcesResource(), "teacher": TeacherResource(),
            "compute": RetryingComputeResource()}


def gpu_k8s_config(cfg: ProdConfig) -> dict[str, Any]:
    """The ``dagster-k8s/config`` of a GPU step or run: GPU limits, node selector, tolerations."""
    k8s = cfg.k8s
    limits = {k8s.gpu_resource: str(k8s.gpus_per_step)} if k8s.gpus_per_step else {}
    return {"container_config": {"resources": {"limits": limits, "requests": dict(limits)}},
            "pod_spec_config": {"node_selector": dict(k8s.node_selector), "tolerations": [dict(t) for t in k8s.tolerations]}}


def gpu_run_tags(cfg: ProdConfig) -> dict[str, str]:
    """Run tags of GPU jobs: ``dagster-k8s/config``, read by the K8sRunLauncher for the run pod — the
    pod that trains when the executor runs steps in it (``in_process``/``multiprocess``). With the
    ``k8s`` executor the run pod only orchestrates and the GPU steps' pods get the GPUs
    (``per_step_k8s_config``), so no tag: the GPUs would be held twice."""
    if cfg.executor == "k8s":
        return {}
    return {"dagster-k8s/config": json.dumps(gpu_k8s_config(cfg))}


def active_gpu_run_tags() -> dict[str, str]:
    """``gpu_run_tags`` of the active profile ({} for the default profile)."""
    return {} if profile_name() == "default" else gpu_run_tags(load_prod_config())


def prod_executor(cfg: ProdConfig) -> dg.ExecutorDefinition:
    """The production executor. ``k8s``: one pod per step; the GPU steps (``gpu_step_ops``) get
    ``gpu_k8s_config`` through ``per_step_k8s_config``."""
    if cfg.executor == "in_process":
        return dg.in_process_executor
    if cfg.executor == "multiprocess":
        return dg.multiprocess_executor.configured({"max_concurrent": cfg.k8s.max_concurrent_steps})
    try:
        from dagster_k8s import k8s_job_executor
    except ImportError as e:
        raise ProfileError(f"{cfg.source}: executor 'k8s' needs dagster-k8s, in the prod extra: "
                           f"pip install \"crucible[prod]\" ({e})") from e
    return k8s_job_executor.configured(k8s_executor_config(cfg), name="crucible_k8s_executor")


def k8s_executor_config(cfg: ProdConfig) -> dict[str, Any]:
    """Config of dagster-k8s' ``k8s_job_executor``: namespace, step concurrency, and the GPU steps'
    pod config (``per_step_k8s_config``, keyed by step = op name)."""
    return {"job_namespace": cfg.k8s.job_namespace, "max_concurrent": cfg.k8s.max_concurrent_steps,
            "per_step_k8s_config": {op: gpu_k8s_config(cfg) for op in gpu_step_ops(cfg)}}


@dataclass(frozen=True)
class Profile:
    """What a profile contributes to the Definitions."""

    name: str
    resources: dict
    executor: dg.ExecutorDefinition
    gpu_run_tags: dict
    config: Optional[ProdConfig] = None
    sizes: Optional[dict] = None
    """Op -> field -> the run-config default this profile gives it ({} = the assets' own defaults,
    the default profile; prod: ``PROD_SIZES`` merged with the YAML's ``sizes``)."""

    def size_set(self) -> str:
        """``small`` (the assets' own defaults) or ``full`` (production): pipelines/presets.py."""
        return "full" if self.name == "prod" else "small"


def profile_sizes(name: Optional[str] = None, cfg: Optional[ProdConfig] = None) -> dict[str, dict[str, Any]]:
    """The size defaults of a profile (``$CRUCIBLE_PROFILE`` unless ``name``): op -> field -> value.
    ``{}`` for ``default`` (the assets' own defaults); for ``prod``, ``PROD_SIZES`` merged field by
    field with the prod YAML's ``sizes`` (``cfg``, else ``$CRUCIBLE_PROD_CONFIG``). The one source of
    what a launch uses (the assets' run-config defaults, pipelines/presets.py ``with_size_defaults``)
    and of the jobs' ``dagster/max_runtime`` bounds (pipelines/jobs.py). Raises ProfileError."""
    name = name or profile_name()
    if name == "default":
        return {}
    from .presets import PROD_SIZES, merge_sizes

    return merge_sizes(PROD_SIZES, (cfg or load_prod_config()).sizes)


def load_profile(name: Optional[str] = None) -> Profile:
    """The active profile (``$CRUCIBLE_PROFILE`` unless ``name``). Raises ProfileError."""
    name = name or profile_name()
    if name == "default":
        return Profile("default", default_resources(), dg.in_process_executor, {}, sizes=profile_sizes("default"))
    cfg = load_prod_config()
    return Profile("prod", prod_resources(cfg), prod_executor(cfg), gpu_run_tags(cfg), cfg,
                   sizes=profile_sizes("prod", cfg))


def _main(argv: Optional[list] = None) -> int:
    """``python -m pipelines.profiles example``: print the shipped prod.example.yaml (works from a wheel)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if args != ["example"]:
        print("usage: python -m pipelines.profiles example > prod.yaml   (the production config's example)", file=sys.stderr)
        return 2
    sys.stdout.write((BUNDLED / "prod.example.yaml").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
