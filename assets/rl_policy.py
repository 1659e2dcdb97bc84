"""The scratchpad policy of the RL runs (docs/rl_policy.md): the SFT warm start of a small GPT-2 on
the remainder-by-repeated-subtraction task (``ops.rl.scratchpad``), stopped once its held-out
sampled pass rate reaches the target, so that ``rollpacker_run`` and ``rollarc_run`` start from a
policy whose GRPO groups carry signal.

The asset launches ``ops.rl.warmstart`` through the launch protocol (``assets.launch``): the worker
trains in ``<lake>/rl_policy/.run-<root run id>`` (checkpoints there; a retried launch resumes after
its last one) and writes the policy folder (config.json, model.safetensors, tokenizer files,
metrics.json) under that run folder (``assets.launch.staged``); the step checks it (files present,
metrics.json of this spec's fingerprint) and only then commits it to ``<lake>/rl_policy/policy``
(issue 42 item 8: a failed step or a late worker never replaces the committed policy). A later
materialization with the same spec stages the committed folder back (hard links) and the worker
reuses it instead of retraining. The evaluation curve is also the asset's table
(the Delta table ``<lake>/rl_policy/data.delta``: step, train_s, accuracy, n, mean_len).
"""

import dataclasses
from pathlib import Path

import dagster as dg
import polars as pl

from ops.lm.checkpoint import describe_saved
from ops.rl.warmstart import WarmStartSpec
from resources.compute import ComputeResource
from resources.lake import LakeResource

from ._config import fields_of, mirrors, to_spec
from ._meta import image, md_table, table_result
from .launch import committed_fingerprint, launch, run_dir_for, stage_committed, staged

_OWN = ("timeout_s",)


def policy_dir(lake: LakeResource) -> Path:
    """The published policy folder of ``rl_policy``: ``<lake>/rl_policy/policy``."""
    return lake.base / "rl_policy" / "policy"


@mirrors(WarmStartSpec, own=_OWN)
class RlPolicyConfig(fields_of(WarmStartSpec, exclude=("out_dir",))):
    """The warm start's recipe: the Launchpad face of ``ops.rl.warmstart.WarmStartSpec`` (meanings,
    defaults and ranges there). The default is the full recipe: on 2 quiet CPU cores it reaches a
    sampled pass rate of 0.4 in about 550 steps, 7-14 minutes in one process (docs/rl_policy.md)."""

    timeout_s: float = 3600.0
    """Wall-clock limit of the launch (s); its whole process group is killed after it."""


def spec_from(config: RlPolicyConfig, lake: LakeResource) -> WarmStartSpec:
    """The worker's spec, validated. Raises ValueError naming the field (``warmstart.<field>``,
    ``warmstart.schedule.<field>``)."""
    return to_spec(config, out_dir=str(policy_dir(lake)))


def _bucket_table(heldout: dict) -> pl.DataFrame:
    order = ["1", "2-3", "4-7", "8-15", "16-31", "32+"]
    rows = []
    for b in order:
        g, s = heldout["greedy"]["by_lines"].get(b), heldout["sampled"]["by_lines"].get(b)
        if g is None and s is None:
            continue
        rows.append({"lines": b, "n": (g or s)[1], "greedy": round(g[0], 3) if g else None,
                     "sampled_T1": round(s[0], 3) if s else None})
    rows.append({"lines": "all", "n": heldout["n"], "greedy": round(heldout["greedy"]["accuracy"], 3),
                 "sampled_T1": round(heldout["sampled"]["accuracy"], 3)})
    return pl.DataFrame(rows)


@dg.asset(group_name="training", code_version="1", kinds={"pytorch", "safetensors"}, pool="gpu")
def rl_policy(context: dg.AssetExecutionContext, config: RlPolicyConfig, lake: LakeResource,
              compute: ComputeResource) -> dg.MaterializeResult:
    """The warm-started scratchpad policy (GPT-2, 0.84 M parameters, character-level tokenizer):
    SFT on single-turn and multi-turn correct responses, stopped at the first held-out evaluation
    whose sampled pass rate reaches ``target_pass_rate`` (or at ``max_steps``). Metadata: parameters,
    steps and stop reason, training / evaluation seconds, the pass-rate curve, the loss curve,
    held-out accuracy by chain length (greedy and sampled), and the response-length median / p90 /
    max of the RL prompt distribution; the policy folder's path."""
    from ops.posttrain.plots import loss_curves

    committed = policy_dir(lake)
    stage = staged(run_dir_for(context, lake.base, "rl_policy"), "policy")
    spec = dataclasses.replace(spec_from(config, lake), out_dir=str(stage))
    fp = spec.fingerprint()                                  # out_dir is cadence: the same as the committed folder's
    stage_committed(committed, stage, committed_fingerprint(committed / "metrics.json") == fp
                    and all((committed / f).exists() for f in ("model.safetensors", "tokenizer.json")), context.log.info)
    # one process: it gets the intra-op threads of the whole allocation (what a launch of num_processes ranks
    # would share), not one rank's threads_per_process
    threads = max(1, compute.num_processes * compute.threads_per_process)
    with launch(context, compute, base=lake.base, asset="rl_policy", module="ops.rl.warmstart", spec=spec.to_json(),
                fingerprint=fp, timeout_s=config.timeout_s, saved=describe_saved, outputs={"policy": committed},
                env={"OMP_NUM_THREADS": str(threads)}) as run:
        m = run.result
        if committed_fingerprint(stage / "metrics.json") != fp or not (stage / "model.safetensors").exists():
            raise dg.Failure(f"rl_policy: the staged policy {stage} is not this spec's (metrics.json fingerprint "
                             f"{committed_fingerprint(stage / 'metrics.json')}, expected {fp}) or lacks model.safetensors")
        curve = pl.DataFrame(m["eval_curve"], schema={"step": pl.Int64, "train_s": pl.Float64, "accuracy": pl.Float64,
                                                     "n": pl.Int64, "mean_len": pl.Float64})
        lengths = m["rl_response_lengths"]
        context.log.info(f"rl_policy: {m['steps']} steps ({m['stop_reason']}), pass rate {m['pass_rate']}, "
                         f"{m['train_s']} s training")
        meta = dict(
            policy_dir=dg.MetadataValue.path(str(committed)),
            params=dg.MetadataValue.int(m["params"]),
            steps=dg.MetadataValue.int(m["steps"]),
            stop_reason=dg.MetadataValue.text(m["stop_reason"]),
            pass_rate=dg.MetadataValue.float(float(m["pass_rate"] if m["pass_rate"] is not None else float("nan"))),
            target_pass_rate=dg.MetadataValue.float(spec.target_pass_rate),
            pass_rate_curve=md_table(curve.select("step", "train_s", "accuracy", "mean_len"), 80),
            heldout_by_lines=md_table(_bucket_table(m["heldout"])),
            heldout_greedy=dg.MetadataValue.float(round(m["heldout"]["greedy"]["accuracy"], 4)),
            heldout_sampled=dg.MetadataValue.float(round(m["heldout"]["sampled"]["accuracy"], 4)),
            rl_response_len_median=dg.MetadataValue.float(lengths["median"]),
            rl_response_len_p90=dg.MetadataValue.float(lengths["p90"]),
            rl_response_len_max=dg.MetadataValue.float(lengths["max"]),
            final_train_loss=dg.MetadataValue.float(float(m["final_loss"])),
            loss_curve=image(loss_curves({"warm start": m["loss_curve"]}, "warm-start SFT loss"), "loss", lake=lake, asset="rl_policy"),
            train_s=dg.MetadataValue.float(m["train_s"]),
            eval_s=dg.MetadataValue.float(m["eval_s"]),
            wall_s=dg.MetadataValue.float(m["wall_s"]),
            # a policy folder reused from before threads were recorded has none: then none is claimed
            **({"threads": dg.MetadataValue.int(int(m["threads"]))} if "threads" in m else {}),
            **run.metadata(),
        )
        path, version = lake.write(curve, "rl_policy")      # the table last; the policy folder at the block's end
        return table_result(None, path, version, m["steps"] * spec.batch_problems, curve.height, **meta)
