"""RollArc training run (docs/rollarc.md; RollArc, arXiv 2512.22560): disaggregated, trajectory-level
asynchronous agentic RL against the monolithic synchronous baseline, on the same multi-turn
environments, the same initial policy and the same number of optimizer steps.

By default (``policy: scratchpad``) every group is a multi-turn ``checked_subtraction`` episode of
the scratchpad task with the warm-started GPT-2 of ``rl_policy`` (docs/rl_policy.md): the policy
writes a few chain lines per turn and asks the checker, so rewards carry signal, trajectory lengths
have a long tail and a held-out pass-rate curve per method shows the learning against training
seconds. With ``policy: smollm2`` the environments are text FrozenLake (gymnasium) and tool-use math
on the curated problems with a sandboxed Python calculator, and the policy SmolLM2-135M-Instruct.

The asset launches ``ops.rl.rollarc.driver`` through Dagster Pipes (``ComputeResource.run``): the
baseline runs colocated in the launched process, then Ray starts (local, or ``compute.ray_address``)
with the roles placed on named resource pools — engines on ``gpu_compute`` / ``gpu_bandwidth``
behind a hardware-affinity router, the trainer on ``gpu_compute``, environment workers on
``cpu_env``, and an elastic reward pool on Ray Serve (``reward``). torch, transformers and ray load
only in the launched process.

Launch and resume follow the launch protocol (``assets.launch``; docs/operations.md, "Retries and
resume"): a run trains in ``<lake>/rollarc_run/.run-<root run id>``, one folder per run lineage, so
a step retry after a launch death (``RetryingComputeResource``), a re-execution from failure and a
run retry relaunch over the same folder: the driver skips the methods that finished and continues
the one in progress after its last saved step (every ``checkpoint_every`` steps;
``ops.rl.rollarc.driver.RunState``), logging the Dagster retry number. RollArc's groups in flight at
the interruption are lost and regenerated from the next tasks. A new materialization starts from
the first step. The folder is removed once the asset is materialized; a launch that finished but
whose step failed later is not rerun (its result is reused).
"""

from pathlib import Path
from typing import Optional

import dagster as dg
import polars as pl

from ops import lake as lakeio
from ops.rl.rollarc.driver import RunSpec, RunState, fingerprint, tool_math_rows
from ops.rl.rollarc.report import staleness_plot, step_rows, summary_rows, utilisation_rows
from ops.rl.rollarc.sandbox import describe as describe_sandbox
from resources.compute import ComputeResource
from resources.lake import LakeResource

from ._config import fields_of, mirrors, to_spec
from ._meta import image, md_table, table_result
from ._rl import (ASSET, OWN, PolicyChoice, launch_driver, learning_metadata, problems_table, rl_policy_dir,
                  ray_address, role_gpus, run_figures, run_metadata, training_signal)


SET_BY_ASSET = ("problems_path", "task", "task_seed", "ray_address", "roles.tokenizer_dir", "roles.model_dir",
                "roles.engine_gpus", "roles.trainer_gpus")
"""RunSpec fields the Launchpad does not offer: the asset sets them from the policy choice, the lake,
the compute resource (Ray address, GPUs per role)."""


@mirrors(RunSpec, own=OWN)
class RollArcRunConfig(fields_of(RunSpec, exclude=SET_BY_ASSET, base=PolicyChoice)):
    """A few optimizer steps of each method on a small batch (the embedded default adds < 3 minutes;
    the ``full`` preset is production-sized): the Launchpad face of ``ops.rl.rollarc.spec.RunSpec``,
    nested as it is (``arc``: the scheduler, ``core.ArcConfig``; ``roles``: the policy, engines,
    routing, env latency, reward pool and GRPO loss, ``roles_common.RoleSpec``); defaults and checks
    there, and an error names the path set here (``arc.async_ratio``)."""


def spec_from(config: RollArcRunConfig, problems: Optional[Path], ray_address: Optional[str],
              rl_policy: str | Path = "", gpus: Optional[dict] = None) -> RunSpec:
    """The driver's RunSpec, validated (the asset's one check; ``_config.to_spec``): the scratchpad
    task on the ``rl_policy`` folder (no injected env latency unless ``roles.env_latency`` is set, and
    then it is refused: the checker's latency is its real work), or the curated ``problems`` with SmolLM2 / the tiny policy.
    ``gpus``: ``engine_gpus`` / ``trainer_gpus`` of the roles from the compute resource
    (``_rl.role_gpus``). Raises ValueError naming the field by its Launchpad path."""
    tokenizer_dir, model_dir = config.policy_dirs("rollarc_run", rl_policy)
    fill = {"problems_path": str(problems or ""), "ray_address": ray_address,
            "roles.tokenizer_dir": tokenizer_dir, "roles.model_dir": model_dir,
            **{f"roles.{k}": v for k, v in (gpus or {}).items()}}
    fill.update(config.task_fields("rollarc_run"))    # an unset roles.env_latency is the task's (RunSpec)
    return to_spec(config, **fill)


@dg.asset(**ASSET)
def rollarc_run(context: dg.AssetExecutionContext, config: RollArcRunConfig, lake: LakeResource,
                compute: ComputeResource) -> dg.MaterializeResult:
    """Agentic GRPO steps of the monolithic synchronous baseline and of RollArc (trajectory-level
    asynchrony with redundant rollouts and bounded staleness, disaggregated on Ray resource pools).
    The table has one row per method and step: staleness of its groups, trainer wait and train
    seconds, mean reward, trajectories without reward, episode statuses, loss. Metadata: per-method
    summary (wall seconds, staleness histogram, discarded groups); this run's own time figures
    (seconds, speedup, trajectories/s) labelled with their steps and seed, every method's first
    (cold) step excluded (``_rl.run_figures``; a step = its wait for groups + its training), beside
    the registered claim's verdict from benchmarks/results/claims.json (``claim_verdict``); per-pool
    utilisation (engines, trainer, environment workers, reward replicas; of a resumed method's last
    launch), the router's split, the staleness plot, the Ray address, the retry number and where a
    retried launch resumed. A retried launch continues after its last saved step (see the module
    docstring). With the scratchpad policy also the held-out accuracy curve per method against
    training seconds (evaluation excluded), the response-length distribution and the time per
    method; ``sandbox``: the mode the environments ran model-generated code and checkers under
    (``bwrap`` kernel-enforced, or the weaker ``rlimits`` when the config allowed it). Raises
    FileNotFoundError without ``rl_policy`` (scratchpad) or ``decontaminated_problems`` (smollm2, tiny),
    ValueError naming a config field out of range, dg.Failure when the driver leaves no result."""
    if config.task == "scratchpad":
        spec = spec_from(config, None, ray_address(compute), rl_policy_dir(lake, config, "rollarc_run"),
                         role_gpus(compute))
    else:
        spec = spec_from(config, problems_table(lake), ray_address(compute), gpus=role_gpus(compute))
        tool_math_rows(spec)                              # an unusable table fails here, before a launch and a run folder
    with launch_driver(context, compute, lake, "rollarc_run", "ops.rl.rollarc.driver", spec, fingerprint(spec), RunState,
                       config.run_timeout_s) as run:
        return _materialize(context, lake, spec, run)


def _materialize(context, lake: LakeResource, spec: RunSpec, run) -> dg.MaterializeResult:
    """The asset's outputs from the launch's result: per-step and trajectory tables, the result
    file, metadata. The driver writes only its run folder; the step reads and checks its result and
    builds every metadata entry first, and writes the lake's tables and result.json last (issue 42
    item 8: a step that fails after its launch leaves the committed files as they were)."""
    res = run.result
    table = pl.DataFrame(step_rows(res))
    traj = pl.DataFrame([{**t, "method": m, "versions": ",".join(map(str, t["versions"])), "pools": ",".join(t["pools"])}
                         for m, r in res["methods"].items() for t in r["trajectories"]])
    # summary_rows' speedup_vs_monolithic and trajectories_per_s count the cold first step: run_figures replaces them
    summary = pl.DataFrame(summary_rows(res)).drop("speedup_vs_monolithic", "trajectories_per_s", strict=False)
    util = pl.DataFrame(utilisation_rows(res))
    step_s = {m: [float(s.get("wait_s") or 0.0) + float(s.get("train_s") or 0.0) for s in r["steps"]]
              for m, r in res["methods"].items()}
    warm_traj = {m: sum(int(s.get("trajectories") or 0) for s in r["steps"][1:]) for m, r in res["methods"].items()}
    figures = run_figures(step_s, "monolithic", spec.seed, "rollarc")
    tag = next(k for k in figures if k.startswith("run_speedup_"))[len("run_speedup_"):]
    for r in summary.iter_rows(named=True):
        context.log.info(f"rollarc_run {r['method']}: {r['steps']} steps in {r['wall_s']}s, staleness "
                         f"{r['staleness_hist']} (this run only; the confirmatory figure is the registered claim's)")
    signal = training_signal(context, "rollarc_run", [s.get("zero_signal_groups") for m in res["methods"].values()
                                                       for s in m["steps"]])
    arc = res["methods"].get("rollarc", {})
    resumed = ", ".join(f"{r['method']} finished before the retry, skipped" if r.get("skipped")
                        else f"{r['method']} after step {r['after_step']}" for r in res.get("resumes", []))
    meta = dict(
        summary=md_table(summary),
        per_step=md_table(table),
        utilisation=md_table(util),
        router=dg.MetadataValue.json((arc.get("utilisation") or {}).get("router", {})),
        staleness=image(staleness_plot(res), "trained groups by staleness", lake=lake, asset="rollarc_run"),
        **signal,
        **{f"run_trajectories_per_s_{tag}": dg.MetadataValue.json(
            {m: round(warm_traj[m] / sum(v[1:]), 4) if sum(v[1:]) > 0 else None for m, v in step_s.items()})},
        **figures,
        max_staleness=dg.MetadataValue.int(max([int(k) for k in arc.get("staleness_hist", {})] or [0])),
        discarded_groups=dg.MetadataValue.int(arc.get("discarded_groups", 0)),
        sandbox=dg.MetadataValue.text(describe_sandbox(spec.role_spec.sandbox)),
        **learning_metadata(res, "monolithic"),
        **run_metadata(res, spec.model_dir, resumed),
        **run.metadata(),
    )
    path, version = lake.write(table, "rollarc_run")                    # committed last
    lake.write(traj, "rollarc_run", name="trajectories.parquet")
    lakeio.write_json_atomic(res, lake.path("rollarc_run", name="result.json"))
    return table_result(None, path, version, traj.height, table.height, **meta)
