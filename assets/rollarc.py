"""RollArc training run (SEEDS.md §5; RollArc, arXiv 2512.22560): disaggregated, trajectory-level
asynchronous agentic RL against the monolithic synchronous baseline, on the same multi-turn
environments (text FrozenLake from gymnasium; tool-use math on the curated problems with a sandboxed
Python calculator), the same initial policy (SmolLM2-135M-Instruct on the embedded default) and the
same number of optimizer steps.

The asset launches ``ops.rl.rollarc.driver`` through Dagster Pipes (``ComputeResource.run``): the
baseline runs colocated in the launched process, then Ray starts (local, or ``compute.ray_address``)
with the roles placed on named resource pools — engines on ``gpu_compute`` / ``gpu_bandwidth``
behind a hardware-affinity router, the trainer on ``gpu_compute``, environment workers on
``cpu_env``, and an elastic reward pool on Ray Serve (``reward``). torch, transformers and ray load
only in the launched process.

Resume: a run trains in ``<lake>/rollarc_run/.run-<root run id>`` (the run's id, or for a
re-execution or run-level retry the id of the run it re-executes), so a step retry after a launch
death (``RetryingComputeResource``), a re-execution from failure and a run retry relaunch over the
same folder: the driver skips the methods that finished and continues the one in progress after its
last saved step (every ``checkpoint_every`` steps; ``ops.rl.rollarc.driver.RunState``), logging the
Dagster retry number. RollArc's groups in flight at the interruption are lost and regenerated from
the next tasks. A new materialization starts from the first step. The folder is removed once the
asset is materialized; a launch that finished but whose step failed later is not rerun (its result
is reused).
"""

import dataclasses
import shutil
from pathlib import Path
from typing import Optional

import dagster as dg
import polars as pl

from ops import lake as lakeio
from ops.rl.rollarc.core import ArcConfig
from ops.rl.rollarc.driver import RunSpec, tool_math_problems, RunState, fingerprint
from ops.rl.rollarc.ray_roles import RoleSpec
from ops.rl.rollarc.report import staleness_plot, step_rows, summary_rows, utilisation_rows
from resources.compute import ComputeResource
from resources.lake import LakeResource
from resources.teacher import default_model_dir

from ._meta import image, md_table, resumable_launch, table_result

# Defaults: the roles' RoleSpec and the scheduler's ArcConfig, with the batch sized for the embedded
# default (2 CPU cores, SmolLM2: the asset adds < 3 minutes to the main job; the `full` preset is
# production-sized).
_A = {**{f.name: f.default for f in dataclasses.fields(ArcConfig)},
      "steps": 3, "groups_per_step": 1, "group_size": 2, "redundancy": 1, "async_ratio": 1, "max_turns": 2}
_R = {f.name: f.default for f in dataclasses.fields(RoleSpec) if f.default is not dataclasses.MISSING}
_D = {f.name: f.default for f in dataclasses.fields(RunSpec) if f.default is not dataclasses.MISSING}


class RollArcRunConfig(dg.Config):
    """A few optimizer steps of each method on a small batch (the embedded default adds < 3 minutes)."""

    policy: str = "smollm2"
    """``smollm2`` (the model directory) or ``tiny`` (a random 2-layer Llama: wiring checks only)."""
    model_dir: str = ""
    """Hugging Face directory of the policy; empty = $CRUCIBLE_MODELS/SmolLM2-135M-Instruct."""
    methods: list[str] = ["monolithic", "rollarc"]
    envs: list[str] = ["frozenlake", "tool_math"]
    """Environments, round-robin over groups."""
    steps: int = _A["steps"]
    """Optimizer steps per method."""
    groups_per_step: int = _A["groups_per_step"]
    group_size: int = _A["group_size"]
    """Trajectories per group that are trained (the GRPO group)."""
    redundancy: int = _A["redundancy"]
    """Extra trajectories launched per group (RollArc): the first group_size to finish win."""
    async_ratio: int = _A["async_ratio"]
    """Staleness bound in optimizer steps (0 = synchronous)."""
    max_turns: int = _A["max_turns"]
    turn_timeout_s: float = _A["turn_timeout_s"]
    episode_timeout_s: float = _A["episode_timeout_s"]
    max_failed_fraction: float = _A["max_failed_fraction"]
    """A step fails when more than this fraction of its trajectories has no reward."""
    max_new_tokens: int = _R["max_new_tokens"]
    max_prompt_tokens: int = _R["max_prompt_tokens"]
    """Context kept per LLM call (left-truncated: the latest turns stay)."""
    route_policy: str = _R["route_policy"]
    """``affinity`` (prefill-heavy requests to gpu_compute, decode-heavy to gpu_bandwidth) or ``uniform``."""
    prefill_heavy_ratio: float = _R["prefill_heavy_ratio"]
    engines_compute: int = 1
    """Engine actors on the gpu_compute pool."""
    engines_bandwidth: int = 1
    """Engine actors on the gpu_bandwidth pool."""
    env_latency: str = _R["env_latency"]
    """Injected env step latency: none | low | medium | heavy (same mean)."""
    env_latency_mean_s: float = _R["env_latency_mean_s"]
    reward_max_replicas: int = _R["reward_max_replicas"]
    lr: float = _R["lr"]
    seed: int = 0
    num_cpus: int = 2
    """CPUs of the local Ray instance (ignored with compute.ray_address)."""
    checkpoint_every: int = _D["checkpoint_every"]
    """Save the trainer state (weights, AdamW state, version) every this many steps of a method, so a
    retried launch resumes after the last save. SmolLM2's state is 1.6 GB: 1.6-6.3 s per save here
    (median 2 s), against ~5 s of optimizer step."""
    run_timeout_s: float = 900.0


def spec_from(config: RollArcRunConfig, problems: Path, ray_address: Optional[str]) -> RunSpec:
    """The driver's RunSpec. Raises ValueError naming the field when a value is out of range."""
    if config.policy not in ("smollm2", "tiny"):
        raise ValueError(f"rollarc_run.policy must be 'smollm2' or 'tiny', got {config.policy!r}")
    model_dir = config.model_dir or default_model_dir()
    arc = {k: getattr(config, k) for k in ("steps", "groups_per_step", "group_size", "redundancy", "async_ratio",
                                           "max_turns", "turn_timeout_s", "episode_timeout_s", "max_failed_fraction")}
    roles = {"max_new_tokens": config.max_new_tokens, "max_prompt_tokens": config.max_prompt_tokens, "route_policy": config.route_policy,
             "prefill_heavy_ratio": config.prefill_heavy_ratio,
             "engines": {"gpu_compute": config.engines_compute, "gpu_bandwidth": config.engines_bandwidth},
             "env_latency": config.env_latency, "env_latency_mean_s": config.env_latency_mean_s,
             "reward_max_replicas": config.reward_max_replicas, "lr": config.lr}
    return RunSpec(problems_path=str(problems), tokenizer_dir=model_dir,
                   model_dir=model_dir if config.policy == "smollm2" else None, methods=list(config.methods),
                   envs=list(config.envs), arc=arc, roles=roles, seed=config.seed, ray_address=ray_address,
                   num_cpus=config.num_cpus, checkpoint_every=config.checkpoint_every).validate()


@dg.asset(deps=["decontaminated_problems"], group_name="training", code_version="1", kinds={"ray", "pytorch", "parquet"},
          pool="gpu")
def rollarc_run(context: dg.AssetExecutionContext, config: RollArcRunConfig, lake: LakeResource,
                compute: ComputeResource) -> dg.MaterializeResult:
    """Agentic GRPO steps of the monolithic synchronous baseline and of RollArc (trajectory-level
    asynchrony with redundant rollouts and bounded staleness, disaggregated on Ray resource pools).
    The table has one row per method and step: staleness of its groups, trainer wait and train
    seconds, mean reward, trajectories without reward, episode statuses, loss. Metadata: per-method
    summary (wall seconds, trajectories/s, speedup, staleness histogram, discarded groups), per-pool
    utilisation (engines, trainer, environment workers, reward replicas; of a resumed method's last
    launch), the router's split, the staleness plot, the Ray address, the retry number and where a
    retried launch resumed. A retried launch continues after its last saved step (see the module
    docstring). Raises FileNotFoundError without ``decontaminated_problems``, ValueError naming a
    config field out of range, dg.Failure when the driver leaves no result."""
    problems = lake.path("decontaminated_problems")
    if not problems.exists():
        raise FileNotFoundError(f"decontaminated_problems has no table at {problems}: materialize it first")
    spec = spec_from(config, problems, compute.ray_address)
    if "tool_math" in spec.envs:                      # fail here, before a launch and a run folder
        df = pl.read_parquet(problems)
        missing = {"problem_id", "problem", "answer"} - set(df.columns)
        if missing:
            raise ValueError(f"decontaminated_problems ({problems}) lacks columns {sorted(missing)}")
        if tool_math_problems(df).is_empty():
            raise ValueError(f"decontaminated_problems ({problems}) has no numeric problem for the tool_math "
                             f"environment ({df.height} rows); use envs ['frozenlake'] or curate more problems")
    fp = fingerprint(spec)

    def saved_steps(run_dir: Path) -> int:
        state = RunState(run_dir, fp)
        return state.steps_done if state.load() else 0

    res, messages, run_dir = resumable_launch(context, compute, lake.base, "rollarc_run", "ops.rl.rollarc.driver",
                                              spec.to_json(), fp, saved_steps, config.run_timeout_s)
    table = pl.DataFrame(step_rows(res))
    path, version = lake.write(table, "rollarc_run")
    traj = pl.DataFrame([{**t, "method": m, "versions": ",".join(map(str, t["versions"])), "pools": ",".join(t["pools"])}
                         for m, r in res["methods"].items() for t in r["trajectories"]])
    lake.write(traj, "rollarc_run", name="trajectories.parquet")
    lakeio.write_json_atomic(res, lake.path("rollarc_run", name="result.json"))
    summary = pl.DataFrame(summary_rows(res))
    util = pl.DataFrame(utilisation_rows(res))
    for r in summary.iter_rows(named=True):
        context.log.info(f"rollarc_run {r['method']}: {r['steps']} steps in {r['wall_s']}s, {r['trajectories_per_s']} "
                         f"trajectories/s, speedup {r['speedup_vs_monolithic']}, staleness {r['staleness_hist']}")
    zero = [s.get("zero_signal_groups") for m in res["methods"].values() for s in m["steps"]]
    no_signal = bool(zero) and all(z == 1.0 for z in zero)
    if no_signal:
        context.log.warning("rollarc_run: every group had equal rewards (zero-signal groups, advantage 0): the "
                            "optimizer steps changed nothing. The policy never solved a task here (small model, "
                            "few turns); the run measures the systems path, not learning.")
    arc = res["methods"].get("rollarc", {})
    resumes = res.get("resumes", [])
    result = table_result(
        None, path, version, traj.height, table.height,
        summary=md_table(summary),
        per_step=md_table(table),
        utilisation=md_table(util),
        router=dg.MetadataValue.json((arc.get("utilisation") or {}).get("router", {})),
        staleness=image(staleness_plot(res), "trained groups by staleness"),
        speedup_e2e=dg.MetadataValue.float(round(res["speedup_e2e"], 3)) if res.get("speedup_e2e") else dg.MetadataValue.text("n/a"),
        speedup_incl_setup=(dg.MetadataValue.float(round(res["speedup_incl_setup"], 3)) if res.get("speedup_incl_setup")
                            else dg.MetadataValue.text("n/a")),
        training_signal=dg.MetadataValue.text("none: every group zero-signal (equal rewards)" if no_signal else
                                              "yes: some groups had reward variance"),
        trajectories_per_s=dg.MetadataValue.json({r["method"]: r["trajectories_per_s"] for r in summary.iter_rows(named=True)}),
        max_staleness=dg.MetadataValue.int(max([int(k) for k in arc.get("staleness_hist", {})] or [0])),
        discarded_groups=dg.MetadataValue.int(arc.get("discarded_groups", 0)),
        policy=dg.MetadataValue.text(spec.model_dir or "tiny random Llama"),
        ray_address=dg.MetadataValue.text(res["ray_address"]),
        wall_s=dg.MetadataValue.float(round(res["wall_s"], 2)),
        pipes_messages=dg.MetadataValue.int(len(messages)),
        hyper_parameters=dg.MetadataValue.json(res["spec"]),
        retry_number=dg.MetadataValue.int(context.retry_number),
        resumed_from=dg.MetadataValue.text(", ".join(
            f"{r['method']} finished before the retry, skipped" if r.get("skipped") else f"{r['method']} after step {r['after_step']}"
            for r in resumes) or "none"),
        state_save_s=dg.MetadataValue.float(round(res.get("state_save_s", 0.0), 3)),
    )
    shutil.rmtree(run_dir, ignore_errors=True)          # only now: every failure above may be retried over it
    return result
