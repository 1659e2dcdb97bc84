"""Profiles: one switch moves Crucible from the embedded default to production (docs/operations.md, "Profiles").

    CRUCIBLE_PROFILE=prod                        # default: "default" (2 CPU cores, offline)
    CRUCIBLE_PROD_CONFIG=/etc/crucible/prod.yaml # optional; deploy/prod.example.yaml documents every key

Production swaps resources and the executor, never asset code:

- lake: an object-store root (``s3://bucket/prefix``) mounted at ``lake.mount`` in every pod
  (Mountpoint for S3 / gcsfuse CSI driver): ``LakeResource`` writes POSIX paths (atomic renames,
  memory-mapped token streams), so the resource's ``root`` is the mount (the URI stays in
  ``Profile.config.lake_root``);
- teacher: an OpenAI-compatible endpoint (vLLM, SGLang, a provider): ``base_url``, ``model``, and the
  name of the variable holding the key;
- compute: a GPU accelerate config file, ranks per launch, mixed precision, the Ray cluster address;
- executor: ``k8s`` (dagster-k8s ``k8s_job_executor``: one pod per step; the GPU steps' pods get GPU
  limits, a GPU node selector and tolerations), ``multiprocess`` or ``in_process`` (one pod per run,
  launched by the ``K8sRunLauncher``: then the GPU jobs carry the ``dagster-k8s/config`` run tag and
  the run pod gets the GPUs).

Every error names the file and the key. Loading stays fast: yaml and dagster_k8s are imported only
for the prod profile.
"""

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import dagster as dg

PROFILE_ENV = "CRUCIBLE_PROFILE"
CONFIG_ENV = "CRUCIBLE_PROD_CONFIG"
PROFILES = ("default", "prod")
REPO = Path(__file__).resolve().parents[1]

GPU_OPS = ("cpt_base_models", "cpt_probe_runs", "gba_run", "rl_policy", "rollpacker_run", "rollarc_run", "sft_checkpoint", "stage2_checkpoint")
"""Steps that launch accelerate/torchrun workers (the assets that belong in ``pool="gpu"``)."""


class ProfileError(ValueError):
    """A bad profile name or production config (the message names the file and the key)."""


@dataclass(frozen=True)
class ProdConfig:
    """The production settings (defaults match deploy/; override any in the YAML)."""

    lake_root: str = "s3://crucible-lake/crucible"
    lake_mount: str = "/mnt/crucible-lake"
    teacher_base_url: str = "http://crucible-teacher:8000/v1"
    teacher_model: str = "Qwen/Qwen2.5-Math-7B-Instruct"
    teacher_api_key_env: str = "TEACHER_API_KEY"
    teacher_concurrency: int = 64
    accelerate_config_file: str = str(REPO / "deploy" / "accelerate" / "gpu_8.yaml")
    num_processes: int = 8
    mixed_precision: str = "bf16"
    launcher: str = "accelerate"
    ray_address: str = "ray://crucible-ray-head:10001"
    sources_file: str = ""
    executor: str = "k8s"
    job_namespace: str = "crucible"
    gpu_resource: str = "nvidia.com/gpu"
    gpus_per_step: int = 8
    node_selector: dict = field(default_factory=lambda: {"nvidia.com/gpu.present": "true"})
    tolerations: list = field(default_factory=lambda: [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    max_concurrent_steps: int = 8
    source: str = "<defaults>"


# YAML section -> {key: (ProdConfig field, type)}
_SCHEMA: dict[str, dict[str, tuple[str, type | tuple[type, ...]]]] = {
    "lake": {"root": ("lake_root", str), "mount": ("lake_mount", str)},
    "teacher": {"base_url": ("teacher_base_url", str), "model": ("teacher_model", str),
                "api_key_env": ("teacher_api_key_env", str), "concurrency": ("teacher_concurrency", int)},
    "compute": {"accelerate_config_file": ("accelerate_config_file", str), "num_processes": ("num_processes", int),
                "mixed_precision": ("mixed_precision", str), "launcher": ("launcher", str),
                "ray_address": ("ray_address", str)},
    "k8s": {"job_namespace": ("job_namespace", str), "gpu_resource": ("gpu_resource", str),
            "gpus_per_step": ("gpus_per_step", int), "node_selector": ("node_selector", dict),
            "tolerations": ("tolerations", list), "max_concurrent_steps": ("max_concurrent_steps", int)},
}
_TOP = {"executor": ("executor", str), "sources_file": ("sources_file", str)}
_CHOICES = {"executor": ("k8s", "multiprocess", "in_process"), "mixed_precision": ("no", "fp16", "bf16"),
            "launcher": ("accelerate", "torchrun")}


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
        ProfileError: missing file, not YAML, an unknown section or key, a wrong type, a bad choice,
            an object-store root without a mount, or a missing accelerate config file.
    """
    path = path if path is not None else os.environ.get(CONFIG_ENV, "")
    values: dict[str, Any] = {}
    where = "<defaults>"
    if path:
        from ops.yamlfile import read_yaml_mapping

        p, doc = read_yaml_mapping(path, ProfileError, CONFIG_ENV)
        where = str(p)
        for section, body in doc.items():
            if section in _TOP:
                name, typ = _TOP[section]
                values[name] = _typed(p, section, body, typ)
                continue
            if section not in _SCHEMA:
                raise ProfileError(f"{p}: unknown section {section!r}; known: {', '.join([*_SCHEMA, *_TOP])}")
            if not isinstance(body, dict):
                raise ProfileError(f"{p}: section {section!r} must be a mapping")
            for key, value in body.items():
                if key not in _SCHEMA[section]:
                    raise ProfileError(f"{p}: unknown key {section}.{key}; known: {', '.join(_SCHEMA[section])}")
                name, typ = _SCHEMA[section][key]
                values[name] = _typed(p, f"{section}.{key}", value, typ)
        for key in ("accelerate_config_file", "sources_file"):
            if values.get(key) and not Path(values[key]).expanduser().is_absolute():
                values[key] = str((p.parent / values[key]).resolve())
    cfg = ProdConfig(**values, source=where)
    for key, allowed in _CHOICES.items():
        if getattr(cfg, key) not in allowed:
            raise ProfileError(f"{where}: {key} = {getattr(cfg, key)!r}; one of {', '.join(allowed)}")
    if "://" in cfg.lake_root and not cfg.lake_mount:
        raise ProfileError(f"{where}: lake.root {cfg.lake_root!r} is an object-store URI: set lake.mount, the path "
                           "where every pod mounts it (LakeResource writes POSIX paths)")
    if cfg.accelerate_config_file and not Path(cfg.accelerate_config_file).expanduser().exists():
        raise ProfileError(f"{where}: compute.accelerate_config_file {cfg.accelerate_config_file} does not exist")
    if cfg.num_processes < 1 or cfg.gpus_per_step < 0:
        raise ProfileError(f"{where}: compute.num_processes must be >= 1 and k8s.gpus_per_step >= 0")
    return cfg


def _typed(path: Path, key: str, value: Any, typ) -> Any:
    if typ is int and isinstance(value, bool) or not isinstance(value, typ):
        raise ProfileError(f"{path}: {key} must be {typ.__name__}, got {type(value).__name__} {value!r}")
    return value


def prod_resources(cfg: ProdConfig) -> dict[str, dg.ConfigurableResource]:
    """The resources of the production profile (same keys as the default profile)."""
    from resources.lake import LakeResource
    from resources.retry import RetryingComputeResource
    from resources.sources import SourcesResource
    from resources.teacher import TeacherResource

    return {
        "lake": LakeResource(root=cfg.lake_mount if "://" in cfg.lake_root else cfg.lake_root),
        "sources": SourcesResource(config_file=cfg.sources_file),
        "teacher": TeacherResource(base_url=cfg.teacher_base_url, model=cfg.teacher_model,
                                   api_key_env=cfg.teacher_api_key_env, concurrency=cfg.teacher_concurrency),
        "compute": RetryingComputeResource(cpu=False, launcher=cfg.launcher,  # type: ignore[arg-type]
                                           accelerate_config_file=cfg.accelerate_config_file or None,
                                           num_processes=cfg.num_processes,
                                           mixed_precision=cfg.mixed_precision,  # type: ignore[arg-type]
                                           ray_address=cfg.ray_address or None, launch_timeout_s=172_800.0),
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
    limits = {cfg.gpu_resource: str(cfg.gpus_per_step)} if cfg.gpus_per_step else {}
    return {"container_config": {"resources": {"limits": limits, "requests": dict(limits)}},
            "pod_spec_config": {"node_selector": dict(cfg.node_selector), "tolerations": list(cfg.tolerations)}}


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
    """The production executor. ``k8s``: one pod per step; the GPU steps (``GPU_OPS``) get
    ``gpu_k8s_config`` through ``per_step_k8s_config``."""
    if cfg.executor == "in_process":
        return dg.in_process_executor
    if cfg.executor == "multiprocess":
        return dg.multiprocess_executor.configured({"max_concurrent": cfg.max_concurrent_steps})
    try:
        from dagster_k8s import k8s_job_executor
    except ImportError as e:
        raise ProfileError(f"{cfg.source}: executor 'k8s' needs dagster-k8s: pip install -e '.[prod]' ({e})") from e
    return k8s_job_executor.configured(k8s_executor_config(cfg), name="crucible_k8s_executor")


def k8s_executor_config(cfg: ProdConfig) -> dict[str, Any]:
    """Config of dagster-k8s' ``k8s_job_executor``: namespace, step concurrency, and the GPU steps'
    pod config (``per_step_k8s_config``, keyed by step = op name)."""
    return {"job_namespace": cfg.job_namespace, "max_concurrent": cfg.max_concurrent_steps,
            "per_step_k8s_config": {op: gpu_k8s_config(cfg) for op in GPU_OPS}}


@dataclass(frozen=True)
class Profile:
    """What a profile contributes to the Definitions."""

    name: str
    resources: dict
    executor: dg.ExecutorDefinition
    gpu_run_tags: dict
    config: Optional[ProdConfig] = None


def load_profile(name: Optional[str] = None) -> Profile:
    """The active profile (``$CRUCIBLE_PROFILE`` unless ``name``). Raises ProfileError."""
    name = name or profile_name()
    if name == "default":
        return Profile("default", default_resources(), dg.in_process_executor, {})
    cfg = load_prod_config()
    return Profile("prod", prod_resources(cfg), prod_executor(cfg), gpu_run_tags(cfg), cfg)
