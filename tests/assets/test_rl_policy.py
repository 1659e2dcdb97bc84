"""rl_policy materializes through the launch protocol: the warm-start worker (ops/rl/warmstart.py)
trains a small scratchpad policy and publishes a folder the RL runs load; the metadata carries the
pass-rate curve, the held-out accuracy by chain length and the RL response lengths. A second
materialization of the same config reuses the published policy. The RL assets default to it."""

import json
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from assets import rl_policy as rp
from assets import rollarc, rollpacker
from ops.rl import scratchpad as sp
from ops.rl.warmstart import WarmStartSpec, length_stats
from resources.compute import ComputeResource
from resources.lake import LakeResource
from tests.conftest import materialize_logged

SMALL = {"n_embd": 32, "n_layer": 1, "n_head": 2, "max_steps": 6, "batch_problems": 4, "max_lines": 12, "eval_every": 3,
         "eval_size": 4, "final_eval_size": 8, "max_new_tokens": 16, "schedule": {"warmup_steps": 1}, "checkpoint_every": 3,
         "target_pass_rate": 1.0, "timeout_s": 300.0}


def test_rl_policy_launches_the_warm_start_and_reports_its_learning(tmp_path):
    from ops.rl.policy import load_policy, load_tokenizer

    lake = LakeResource(root=str(tmp_path))
    cfg = {"ops": {"rl_policy": {"config": SMALL}}}
    res, meta, log, _ = materialize_logged([rp.rl_policy], {"lake": lake, "compute": ComputeResource()}, cfg)
    assert res.success
    folder = tmp_path / "rl_policy" / "policy"
    assert meta["policy_dir"] == str(folder)
    metrics = json.loads((folder / "metrics.json").read_text())
    assert (meta["steps"], meta["stop_reason"]) == (6, "max_steps") == (metrics["steps"], metrics["stop_reason"])
    assert meta["params"] == metrics["params"] == sum(p.numel() for p in load_policy(folder).parameters())
    assert load_tokenizer(folder).eos_token_id == 0
    curve = lake.read("rl_policy")
    assert curve["step"].to_list() == [3, 6] and meta["dagster/row_count"] == 2
    assert meta["pass_rate"] == metrics["eval_curve"][-1]["accuracy"] == curve["accuracy"][-1]
    assert "| 3 |" in meta["pass_rate_curve"] and "| 6 |" in meta["pass_rate_curve"]
    assert "| all | 8 |" in meta["heldout_by_lines"]
    stats = length_stats([sp.response_length(p) for p in sp.problems(99, 8, split="heldout")])  # the held-out split
    assert (meta["rl_response_len_median"], meta["rl_response_len_p90"], meta["rl_response_len_max"]) == \
        (stats["median"], stats["p90"], stats["max"])
    assert meta["train_s"] > 0 and meta["eval_s"] > 0 and meta["reused_finished_launch"] is False
    # the one-process warm start trains on the whole allocation's threads (2 ranks x 1 thread), not one rank's
    compute = ComputeResource()
    assert meta["threads"] == metrics["threads"] == compute.num_processes * compute.threads_per_process == 2
    assert Path(meta["loss_curve"]).read_bytes()[:4] == b"\x89PNG"           # a figure file in the lake
    assert "warmstart: step 6" in log
    assert not list((tmp_path / "rl_policy").glob(".run-*"))            # the run folder is removed after success
    # the same config again: the worker reuses the published folder
    t = (folder / "model.safetensors").stat().st_mtime_ns
    res2, meta2, log2, _ = materialize_logged([rp.rl_policy], {"lake": lake, "compute": ComputeResource()}, cfg)
    assert res2.success and "warmstart: reused" in log2 and meta2["pass_rate"] == meta["pass_rate"]
    assert (folder / "model.safetensors").stat().st_mtime_ns == t


def test_the_config_mirrors_the_spec_and_a_bad_value_fails_naming_the_field(tmp_path):
    from assets._config import MIRRORS

    assert MIRRORS[rp.RlPolicyConfig] == (WarmStartSpec, frozenset({"timeout_s"}))
    lake = LakeResource(root=str(tmp_path))
    assert rp.spec_from(rp.RlPolicyConfig(), lake) == WarmStartSpec(out_dir=str(tmp_path.resolve() / "rl_policy/policy"))
    res = dg.materialize([rp.rl_policy], raise_on_error=False, resources={"lake": lake, "compute": ComputeResource()},
                         run_config={"ops": {"rl_policy": {"config": {**SMALL, "schedule": {"lr": -1.0}}}}})
    assert not res.success
    [fail] = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "warmstart.schedule.lr must be > 0" in str(fail.step_failure_data.error)
    assert not (tmp_path / "rl_policy").exists()                          # nothing launched


def test_the_rl_runs_default_to_the_scratchpad_policy_and_need_it(tmp_path):
    lake = LakeResource(root=str(tmp_path))
    for asset, cfg in ((rollpacker.rollpacker_run, rollpacker.RollPackerRunConfig()),
                       (rollarc.rollarc_run, rollarc.RollArcRunConfig())):
        assert cfg.policy == "scratchpad" and cfg.task == "scratchpad"
        assert dg.AssetKey("rl_policy") in asset.asset_deps[asset.key]
        res = dg.materialize([asset], raise_on_error=False, resources={"lake": lake, "compute": ComputeResource()})
        [fail] = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
        assert "materialize rl_policy first" in str(fail.step_failure_data.error)
    with pytest.raises(ValueError, match=r"rollpacker_run.policy must be one of \['scratchpad', 'smollm2', 'tiny'\]"):
        rollpacker.spec_from(rollpacker.RollPackerRunConfig(policy="big"), None, None)
    with pytest.raises(ValueError, match="rollarc_run.eval_size must be >= 0"):
        rollarc.spec_from(rollarc.RollArcRunConfig(eval_size=-1), None, None, "pol")


def test_the_scratchpad_policy_selects_the_scratchpad_task_and_its_evaluation():
    """The result contract's spec fields (docs/rl_policy.md): task, no problems file, the held-out size."""
    arc = rollarc.spec_from(rollarc.RollArcRunConfig(eval_size=8, eval_every=1), None, None, "/lake/rl_policy/policy")
    assert (arc.task, arc.problems_path, arc.tokenizer_dir, arc.model_dir) == ("scratchpad", "", "/lake/rl_policy/policy",
                                                                             "/lake/rl_policy/policy")
    assert (arc.eval_size, arc.eval_every) == (8, 1) and arc.role_spec.env_latency == "none"
    with pytest.raises(ValueError, match="roles.env_latency"):              # an explicit injected latency is refused
        rollarc.spec_from(rollarc.RollArcRunConfig(roles={"env_latency": "heavy"}), None, None, "pol")
    curated = rollarc.spec_from(rollarc.RollArcRunConfig(policy="tiny", model_dir="tok"), "p.parquet", None)
    assert (curated.task, curated.eval_size, curated.problems_path) == ("curated", 0, "p.parquet")
    pk = rollpacker.spec_from(rollpacker.RollPackerRunConfig(eval_size=8), None, None, "/lake/rl_policy/policy")
    assert (pk.task, pk.problems_path, pk.model_dir, pk.eval_size, pk.eval_every) == \
        ("scratchpad", "", "/lake/rl_policy/policy", 8, 0)
    pk = rollpacker.spec_from(rollpacker.RollPackerRunConfig(policy="smollm2", model_dir="m"), "p.parquet", None)
    assert (pk.task, pk.problems_path, pk.model_dir, pk.eval_size) == ("curated", "p.parquet", "m", 0)
