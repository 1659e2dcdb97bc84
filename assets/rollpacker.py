"""RollPacker training run (SEEDS.md §4; Gao et al., arXiv 2509.21009): synchronous GRPO with tail
batching against the synchronous veRL-style baseline, on the same curated problems and the same
initial policy (SmolLM2-135M-Instruct on the embedded default).

The policy learns from ``decontaminated_problems``: the curated problems with their reference
answers and every benchmark overlap removed (RL needs answers, not teacher responses, so it does
not wait for distillation; training on benchmark-clean data keeps later evaluations honest).

The asset launches ``ops.rl.rollpacker.driver`` through Dagster Pipes (``ComputeResource.run``);
the driver starts Ray (local, or ``compute.ray_address``) with the rollout engine, the reward
service and the trainer as actors and streams one message per step. torch, transformers and ray
load only in the launched process.

Resume: a run trains in ``<lake>/rollpacker_run/.run-<root run id>`` (the run's id, or for a
re-execution or run-level retry the id of the run it re-executes), so a step retry after a launch
death (``RetryingComputeResource``), a re-execution from failure and a run retry relaunch over the
same folder: the driver skips the methods that finished and continues the one in progress after
its last completed step (``ops.rl.rollpacker.driver.RunState``), logging the Dagster retry number.
A new materialization starts from the first step. The folder is removed once the asset is
materialized; a launch that finished but whose step failed later is not rerun (its result is reused).
"""

import dataclasses
import shutil
from pathlib import Path
from typing import Optional

import dagster as dg
import polars as pl

from ops import lake as lakeio
from ops.rl.rollpacker.driver import RunSpec, RunState, fingerprint
from ops.rl.rollpacker.report import comparison_plot, step_rows, summarize
from resources.compute import ComputeResource
from resources.lake import LakeResource
from resources.teacher import default_model_dir

from ._meta import image, md_table, resumable_launch, table_result

# One source of truth for the run defaults: the driver's RunSpec (torch-free import).
_D = {f.name: f.default for f in dataclasses.fields(RunSpec) if f.default is not dataclasses.MISSING}


class RollPackerRunConfig(dg.Config):
    """A few steps of each method with a small batch (the embedded default adds < 3 minutes)."""

    policy: str = "smollm2"
    """``smollm2`` (the model directory) or ``tiny`` (a random 2-layer Llama: wiring checks only)."""
    model_dir: str = ""
    """Hugging Face directory of the policy; empty = $CRUCIBLE_MODELS/SmolLM2-135M-Instruct."""
    methods: list[str] = ["baseline", "rollpacker"]
    """Subset of baseline | tail_batching | tail_batching+reward | rollpacker (tail batching + reward
    scheduler + stream trainer)."""
    steps: int = _D["steps"]
    """GRPO steps per method (with eta 1.25 and P0 2: a short round, then a long round)."""
    prompts_per_step: int = _D["prompts_per_step"]
    """P0: prompts per step."""
    responses_per_prompt: int = _D["responses_per_prompt"]
    """R0: responses per prompt (the GRPO group)."""
    eta: float = _D["eta"]
    """Short-round over-provisioning (paper: 1.25)."""
    max_new_tokens: int = _D["max_new_tokens"]
    timeout_s: float = _D["timeout_s"]
    """Wall-clock limit of one rollout."""
    lr: float = _D["lr"]
    seed: int = _D["seed"]
    max_failed_fraction: float = _D["max_failed_fraction"]
    """A step fails when more than this fraction of its rewards could not be computed."""
    num_cpus: int = 2
    """CPUs of the local Ray instance (ignored with compute.ray_address)."""
    run_timeout_s: float = 900.0


def spec_from(config: RollPackerRunConfig, problems: Path, ray_address: Optional[str]) -> RunSpec:
    """The driver's RunSpec. Raises ValueError naming the field when a value is out of range."""
    if config.policy not in ("smollm2", "tiny"):
        raise ValueError(f"rollpacker_run.policy must be 'smollm2' or 'tiny', got {config.policy!r}")
    model_dir = config.model_dir or default_model_dir()
    return RunSpec(problems_path=str(problems), tokenizer_dir=model_dir,
                   model_dir=model_dir if config.policy == "smollm2" else None, methods=list(config.methods),
                   prompts_per_step=config.prompts_per_step, responses_per_prompt=config.responses_per_prompt,
                   eta=config.eta, steps=config.steps, max_new_tokens=config.max_new_tokens, timeout_s=config.timeout_s,
                   lr=config.lr, seed=config.seed, max_failed_fraction=config.max_failed_fraction,
                   ray_address=ray_address, num_cpus=config.num_cpus).validate()


@dg.asset(deps=["decontaminated_problems"], group_name="training", code_version="1", kinds={"ray", "pytorch", "parquet"},
          pool="gpu")
def rollpacker_run(context: dg.AssetExecutionContext, config: RollPackerRunConfig, lake: LakeResource,
                   compute: ComputeResource) -> dg.MaterializeResult:
    """GRPO steps of the synchronous baseline and of RollPacker (tail batching, reward scheduler,
    stream trainer) on Ray, same prompts, same initial policy. The table has one row per step and
    method: round (sync | short | long), rollout and step seconds, reward wait and training tail,
    max / p99 / median response length (tokens), bubble ratio (idle fraction of generation slots),
    mean reward, verified / unparseable / failed rewards, zero-signal groups, finish reasons, loss,
    policy version. Metadata: the per-method summary with the speedup, the per-step comparison
    table and plot, the Ray address, the retry number and where a retried launch resumed. A
    retried launch continues after its last completed step (see the module docstring)."""
    problems = lake.path("decontaminated_problems")
    if not problems.exists():
        raise FileNotFoundError(f"decontaminated_problems has no table at {problems}: materialize it first")
    spec = spec_from(config, problems, compute.ray_address)
    fp = fingerprint(spec)

    def saved_steps(run_dir: Path) -> int:
        state = RunState(run_dir, fp)
        return len(state.rows) if state.load() else 0

    res, messages, run_dir = resumable_launch(context, compute, lake.base, "rollpacker_run", "ops.rl.rollpacker.driver",
                                              spec.to_json(), fp, saved_steps, config.run_timeout_s)
    rows = step_rows(res["steps"])
    table = pl.DataFrame(rows)
    path, version = lake.write(table, "rollpacker_run")
    lakeio.write_json_atomic(res, lake.path("rollpacker_run", name="result.json"))
    summary = pl.DataFrame(summarize(res["steps"]))
    for r in summary.iter_rows(named=True):
        context.log.info(f"rollpacker_run {r['method']}: {r['steps']} steps, {r['step_s_total']}s, "
                         f"speedup vs baseline {r['speedup_vs_baseline']}")
    resumes = res.get("resumes", [])
    result = table_result(
        None, path, version, len(res["prompts"]), table.height,
        summary=md_table(summary),
        comparison=md_table(table.select("method", "step", "round", "rollout_s", "step_s", "max_response_len",
                                         "p99_response_len", "bubble_ratio", "reward_mean")),
        figure=image(comparison_plot(res["steps"]), "rollout and step time per step"),
        speedup_vs_baseline=dg.MetadataValue.json({r["method"]: r["speedup_vs_baseline"] for r in summary.iter_rows(named=True)}),
        policy=dg.MetadataValue.text(spec.model_dir or "tiny random Llama"),
        ray_address=dg.MetadataValue.text(res["ray_address"]),
        ray_init_s=dg.MetadataValue.float(round(res["ray_init_s"], 2)),
        wall_s=dg.MetadataValue.float(round(res["wall_s"], 2)),
        pipes_messages=dg.MetadataValue.int(len(messages)),
        hyper_parameters=dg.MetadataValue.json(res["spec"]),
        retry_number=dg.MetadataValue.int(context.retry_number),
        resumed_from=dg.MetadataValue.text(", ".join(f"{r['method']} after step {r['after_step']}" for r in resumes) or "none"),
        state_save_s=dg.MetadataValue.float(round(res.get("state_save_s", 0.0), 3)),
    )
    shutil.rmtree(run_dir, ignore_errors=True)          # only now: every failure above may be retried over it
    return result
