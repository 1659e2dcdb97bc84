"""The production profile without a cluster: the definitions load under it, the resources point at
production, the GPU launch command uses the accelerate config file, and the k8s job/pod specs that
dagster-k8s builds carry the GPU limits."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

EXAMPLE = ROOT / "deploy" / "prod.example.yaml"       # a link to the copy shipped in the package
GPU_8 = str(ROOT / "pipelines" / "deploy" / "accelerate" / "gpu_8.yaml")

PROBE = """
import json, dagster as dg
from pipelines.definitions import defs, PROFILE
dg.Definitions.validate_loadable(defs)
r = defs.resources
job = defs.resolve_job_def("cpt_probe_job")
print(json.dumps({
    "profile": PROFILE.name,
    "lake_root": r["lake"].root, "teacher": [r["teacher"].base_url, r["teacher"].model, r["teacher"].api_key_env],
    "cpu": r["compute"].cpu, "accelerate": r["compute"].accelerate_config_file, "n": r["compute"].num_processes,
    "ray": r["compute"].ray_address, "ray_jobs": r["compute"].ray_jobs_address,
    "rl_gpus": [r["compute"].rl_engine_gpus, r["compute"].rl_trainer_gpus], "executor": job.executor_def.name,
    "gpu_job_tags": {k: v for k, v in job.tags.items() if k.startswith("dagster-k8s")},
}, default=str))
"""


def _load(config: Path | None, tmp_path: Path) -> dict:
    env = {**os.environ, "CRUCIBLE_PROFILE": "prod", "DAGSTER_HOME": str(tmp_path)}
    env.pop("CRUCIBLE_PROD_CONFIG", None)
    if config:
        env["CRUCIBLE_PROD_CONFIG"] = str(config)
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_definitions_load_under_the_prod_profile_with_the_k8s_executor(tmp_path):
    pytest.importorskip("dagster_k8s")
    got = _load(EXAMPLE, tmp_path)
    assert got["profile"] == "prod"
    assert got["lake_root"] == "s3://crucible-lake/crucible"
    assert got["teacher"] == ["http://crucible-teacher:8000/v1", "Qwen/Qwen2.5-Math-7B-Instruct", "TEACHER_API_KEY"]
    assert got["cpu"] is False and got["n"] == 8 and got["ray"] is None
    assert got["ray_jobs"] == "http://crucible-ray-head:8265" and got["rl_gpus"] == [1.0, 1.0]   # Ray Jobs, GPU actors
    assert got["accelerate"] == GPU_8                 # package data, so a wheel has it too
    assert got["executor"] == "crucible_k8s_executor"
    assert got["gpu_job_tags"] == {}            # k8s executor: the step pods hold the GPUs, not the run pod


def test_prod_profile_with_one_pod_per_run_puts_the_gpus_on_the_run_pod(tmp_path):
    cfg = tmp_path / "prod.yaml"
    cfg.write_text(EXAMPLE.read_text().replace("executor: k8s ", "executor: multiprocess ")
                   .replace("accelerate/gpu_8.yaml", GPU_8))
    got = _load(cfg, tmp_path)
    assert got["executor"] != "crucible_k8s_executor"
    tag = json.loads(got["gpu_job_tags"]["dagster-k8s/config"])
    assert tag["container_config"]["resources"]["limits"] == {"nvidia.com/gpu": "8"}


def test_bad_prod_config_names_the_file_and_the_key(tmp_path):
    from pipelines.profiles import ProfileError, load_prod_config

    bad = tmp_path / "prod.yaml"
    for text, needle in [("lake: {roott: s3://x}\n", "lake.roott"),
                         ("compute: {num_processes: eight}\n", "compute.num_processes must be int"),
                         ("executor: slurm\n", "executor = 'slurm'"),
                         ("lake: {root: 's3://b/p', work_dir: ''}\n", "set lake.work_dir"),
                         ("compute: {accelerate_config_file: nope.yaml}\n", "compute.accelerate_config_file"),
                         ("gpus: 8\n", "unknown section 'gpus'")]:
        bad.write_text(text)
        with pytest.raises(ProfileError) as e:
            load_prod_config(str(bad))
        assert str(bad) in str(e.value) and needle in str(e.value), (text, str(e.value))
    with pytest.raises(ProfileError, match="CRUCIBLE_PROFILE='staging'"):
        os.environ["CRUCIBLE_PROFILE"] = "staging"
        try:
            from pipelines.profiles import profile_name

            profile_name()
        finally:
            del os.environ["CRUCIBLE_PROFILE"]


def test_gpu_launch_command_uses_the_accelerate_config_file():
    from pipelines.profiles import load_prod_config, prod_resources

    compute = prod_resources(load_prod_config(str(EXAMPLE)))["compute"]
    cfg_file = GPU_8
    assert compute.launch_command("ops/mixture/probe.py", ["plan.json"], port=29500) == [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", cfg_file,
        "--main_process_ip", "127.0.0.1", "--main_process_port", "29500", "ops/mixture/probe.py", "plan.json"]
    assert "ACCELERATE_USE_CPU" not in compute.launch_env()
    # the file is a valid accelerate config of one 8-GPU node, read by accelerate itself
    from accelerate.commands.config.config_args import load_config_from_file

    acc = load_config_from_file(cfg_file)
    assert (acc.distributed_type.value, acc.num_processes, str(acc.mixed_precision), acc.use_cpu) == \
        ("MULTI_GPU", 8, "bf16", False)


def _gpu_job_spec(user_config: dict):
    from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job

    job_config = DagsterK8sJobConfig(job_image="registry.example.com/crucible:0.1.0", dagster_home="/opt/dagster/dagster_home",
                                     instance_config_map="crucible-instance")
    return construct_dagster_k8s_job(job_config=job_config, args=["dagster", "api", "execute_step"], job_name="crucible-step",
                                     user_defined_k8s_config=UserDefinedDagsterK8sConfig.from_dict(user_config),
                                     pod_name="crucible-step-pod").to_dict()


def test_k8s_step_pod_of_a_gpu_step_requests_the_gpus_and_lands_on_a_gpu_node():
    pytest.importorskip("dagster_k8s")
    from dagster_k8s import k8s_job_executor

    from dagster._config import process_config

    from pipelines.profiles import GPU_OPS, k8s_executor_config, load_prod_config, prod_executor

    cfg = load_prod_config(str(EXAMPLE))
    assert prod_executor(cfg).name == "crucible_k8s_executor"
    config = k8s_executor_config(cfg)
    assert process_config(k8s_job_executor.config_schema.config_type, config).success   # dagster-k8s' own schema
    per_step = config["per_step_k8s_config"]
    # the example submits the RL drivers as Ray Jobs: their pods only submit and poll, no GPUs
    assert cfg.compute.ray_jobs_address and set(per_step) == set(GPU_OPS) - {"rollpacker_run", "rollarc_run"}
    local_ray = type(cfg).model_validate({**cfg.model_dump(), "compute": {**cfg.compute.model_dump(), "ray_jobs_address": ""}})
    assert set(k8s_executor_config(local_ray)["per_step_k8s_config"]) == set(GPU_OPS)
    spec = _gpu_job_spec(per_step["cpt_probe_runs"])
    pod = spec["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert container["resources"]["requests"] == {"nvidia.com/gpu": "8"}
    assert pod["node_selector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_k8s_run_pod_gets_the_gpus_from_the_run_tags():
    pytest.importorskip("dagster_k8s")
    from dagster_k8s.job import get_user_defined_k8s_config

    from pipelines.profiles import gpu_run_tags, load_prod_config

    cfg = load_prod_config(str(EXAMPLE))
    tags = gpu_run_tags(type(cfg).model_validate({**cfg.model_dump(), "executor": "in_process",
                                                   "k8s": {**cfg.k8s.model_dump(), "gpus_per_step": 4}}))
    spec = _gpu_job_spec(get_user_defined_k8s_config(tags).to_dict())
    assert spec["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}
