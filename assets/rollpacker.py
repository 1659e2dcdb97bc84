"""RollPacker training run (docs/rollpacker.md; Gao et al., arXiv 2509.21009): synchronous GRPO with tail
batching against the synchronous veRL-style baseline, on the same prompts and the same initial
policy.

By default (``policy: scratchpad``) the policy is the warm-started scratchpad GPT-2 of ``rl_policy``
on the long-tailed scratchpad task (docs/rl_policy.md): its rewards carry signal and its response
lengths have the tail tail batching is for, and a held-out pass-rate curve per method shows the
learning against training seconds. With ``policy: smollm2`` the policy is SmolLM2-135M-Instruct and
it learns from ``decontaminated_problems``: the curated problems with their reference answers and
every benchmark overlap removed (RL needs answers, not teacher responses, so it does not wait for
distillation; training on benchmark-clean data keeps later evaluations honest).

The asset launches ``ops.rl.rollpacker.driver`` through Dagster Pipes (``ComputeResource.run``);
the driver starts Ray (local, or ``compute.ray_address``) with the rollout engine, the reward
service and the trainer as actors and streams one message per step. torch, transformers and ray
load only in the launched process.

Launch and resume follow the launch protocol (``assets.launch``; docs/operations.md, "Retries and
resume"): a run trains in ``<lake>/rollpacker_run/.run-<root run id>``, one folder per run lineage,
so a step retry after a launch death (``RetryingComputeResource``), a re-execution from failure and
a run retry relaunch over the same folder: the driver skips the methods that finished and continues
the one in progress after its last completed step (``ops.rl.rollpacker.driver.RunState``), logging
the Dagster retry number. A new materialization starts from the first step. The folder is removed
once the asset is materialized; a launch that finished but whose step failed later is not rerun
(its result is reused).
"""

from pathlib import Path
from typing import Optional

import dagster as dg
import polars as pl

from ops import lake as lakeio
from ops.rl.rollpacker.driver import RunSpec, RunState, fingerprint
from ops.rl.rollpacker.report import comparison_plot, step_rows, summarize
from resources.compute import ComputeResource
from resources.lake import LakeResource

from ._config import fields_of, mirrors
from ._meta import image, md_table, table_result
from ._rl import (ASSET, OWN, PolicyRunConfig, launch_driver, learning_metadata, problems_table, rl_policy_dir,
                  ray_address, role_gpus, run_figures, run_metadata, training_signal)


@mirrors(RunSpec, own=OWN)
class RollPackerRunConfig(fields_of(RunSpec,
        exclude=("tokenizer_dir", "threads", "tiny_hidden", "reward_timeout_s", "reward_retries",
                 "engine_gpus", "trainer_gpus", "problems_path", "max_prompt_tokens", "reward_workers",
                 "ray_address", "task", "task_seed"), base=PolicyRunConfig)):
    """A few steps of each method with a small batch (the embedded default adds < 3 minutes): the
    Launchpad face of ``ops.rl.rollpacker.driver.RunSpec`` (defaults and checks there)."""


def spec_from(config: RollPackerRunConfig, problems: Optional[Path], ray_address: Optional[str],
              rl_policy: str | Path = "", gpus: Optional[dict] = None) -> RunSpec:
    """The driver's RunSpec, validated (the asset's one check): the scratchpad task on the
    ``rl_policy`` folder, or the curated ``problems`` with SmolLM2 / the tiny policy; ``gpus``:
    ``engine_gpus`` / ``trainer_gpus`` from the compute resource (``role_gpus``). Raises
    ValueError naming the field."""
    gpus = gpus or {}
    tokenizer_dir, model_dir = config.policy_dirs("rollpacker_run", rl_policy)
    fields = {"problems_path": str(problems or ""), **config.task_fields("rollpacker_run")}
    return RunSpec(tokenizer_dir=tokenizer_dir, model_dir=model_dir, ray_address=ray_address, **fields,
                   **config.driver_fields(), **gpus).validate()


@dg.asset(**ASSET)
def rollpacker_run(context: dg.AssetExecutionContext, config: RollPackerRunConfig, lake: LakeResource,
                   compute: ComputeResource) -> dg.MaterializeResult:
    """GRPO steps of the synchronous baseline and of RollPacker (tail batching, reward scheduler,
    stream trainer) on Ray, same prompts, same initial policy. The table has one row per step and
    method: round (sync | short | long), rollout and step seconds, reward wait and training tail,
    max / p99 / median response length (tokens), bubble ratio (idle fraction of generation slots),
    mean reward, verified / unparseable / failed rewards, zero-signal groups, finish reasons, loss,
    policy version. Metadata: the per-method summary, the per-step comparison table and plot, this
    run's own time figures labelled with their steps and seed, every method's first (cold) step
    excluded (``_rl.run_figures``: ``run_speedup_<n>_steps[_smoke]``), beside the registered claim's
    verdict from benchmarks/results/claims.json (``claim_verdict``), the Ray address, the retry number and where a retried launch resumed. A
    retried launch continues after its last completed step (see the module docstring). With the
    scratchpad policy also the held-out accuracy curve per method against training seconds
    (evaluation excluded), the response-length distribution and the time per method."""
    if config.task == "scratchpad":
        spec = spec_from(config, None, ray_address(compute), rl_policy_dir(lake, config, "rollpacker_run"),
                         role_gpus(compute))
    else:
        spec = spec_from(config, problems_table(lake), ray_address(compute), gpus=role_gpus(compute))
    with launch_driver(context, compute, lake, "rollpacker_run", "ops.rl.rollpacker.driver", spec, fingerprint(spec), RunState,
                       config.run_timeout_s) as run:
        return _materialize(context, lake, spec, run)


def _materialize(context, lake: LakeResource, spec: RunSpec, run) -> dg.MaterializeResult:
    """The asset's outputs from the launch's result: the per-step table, the result file, metadata.
    The driver writes only its run folder; the step reads and checks its result and builds every
    metadata entry first, and writes the lake's table and result.json last (issue 42 item 8: a step
    that fails after its launch leaves the committed files as they were)."""
    res = run.result
    rows = step_rows(res["steps"])
    table = pl.DataFrame(rows)
    # the summary's speedup_vs_baseline counts every step, the cold first one included: run_figures replaces it
    summary = pl.DataFrame(summarize(res["steps"])).drop("speedup_vs_baseline", strict=False)
    step_s: dict[str, list[float]] = {}
    for r in res["steps"]:
        step_s.setdefault(r["method"], []).append(float(r["step_s"]))
    for r in summary.iter_rows(named=True):
        context.log.info(f"rollpacker_run {r['method']}: {r['steps']} steps, {r['step_s_total']}s (this run only; "
                         "the confirmatory figure is the registered claim's, docs/claims.md)")
    resumed = ", ".join(f"{r['method']} after step {r['after_step']}" for r in res.get("resumes", []))
    signal = training_signal(context, "rollpacker_run", [s.get("zero_signal_groups") for s in res["steps"]])
    meta = dict(
        summary=md_table(summary),
        comparison=md_table(table.select("method", "step", "round", "rollout_s", "step_s", "max_response_len",
                                         "p99_response_len", "bubble_ratio", "reward_mean")),
        figure=image(comparison_plot(res["steps"]), "rollout and step time per step", lake=lake, asset="rollpacker_run"),
        **run_figures(step_s, "baseline", spec.seed, "rollpacker"),
        ray_init_s=dg.MetadataValue.float(round(res["ray_init_s"], 2)),
        **learning_metadata(res, "baseline"),
        **signal,
        **run_metadata(res, spec.model_dir, resumed),
        **run.metadata(),
    )
    path, version = lake.write(table, "rollpacker_run")                 # committed last
    lakeio.write_json_atomic(res, lake.path("rollpacker_run", name="result.json"))
    return table_result(None, path, version, len(res["prompts"]), table.height, **meta)
