"""rollarc_run materializes through Dagster Pipes: the monolithic baseline in the launched process,
then RollArc on a local Ray instance with the roles on the four named pools (engines behind the
router, trainer, environment workers, the Ray Serve reward pool). The driver is killed (SIGKILL to
its process group, Ray included) after the baseline's 3 steps and RollArc's step 0:
RetryingComputeResource retries the step, the relaunch skips the baseline and RollArc resumes after
step 0 (one materialization: the resume costs one more Ray start, not another run). The tiny random
policy keeps it fast; the real policy runs in the main job and the benchmark."""

from pathlib import Path

import polars as pl
import pytest

from assets import rollarc
from ops.rl.rollarc.driver import CRASH_ENV
from resources.compute import ComputeResource
from tests.conftest import lake_with_problems, materialize_logged
from resources.lake import LakeResource
from resources.retry import RetryingComputeResource

MODEL_DIR = Path(__file__).resolve().parents[2] / ".models" / "SmolLM2-135M-Instruct"
TINY = {"policy": "tiny", "model_dir": str(MODEL_DIR), "checkpoint_every": 1, "run_timeout_s": 400.0,
        "arc": {"steps": 3, "groups_per_step": 2, "group_size": 2, "redundancy": 1, "async_ratio": 1, "max_turns": 2},
        "roles": {"max_new_tokens": 16, "env_latency": "medium", "env_latency_mean_s": 0.2}}


def test_rollarc_run_compares_monolithic_and_rollarc_on_ray_pools_and_a_killed_driver_resumes_on_retry(
        tmp_path, monkeypatch):
    pytest.importorskip("ray")
    if not (MODEL_DIR / "tokenizer.json").exists():
        pytest.skip("SmolLM2 directory missing: run make setup")
    lake = lake_with_problems(tmp_path)
    monkeypatch.setenv(CRASH_ENV, "4")                   # after the baseline's 3 steps and RollArc's step 0
    compute = RetryingComputeResource(launch_retries=1, retry_backoff_s=0.0)
    res, meta, log, kinds = materialize_logged([rollarc.rollarc_run], {"lake": lake, "compute": compute},
                                               {"ops": {"rollarc_run": {"config": TINY}}})
    assert res.success and kinds.count("STEP_UP_FOR_RETRY") == 1
    assert "launch died (exit code -9)" in log and "after 4 saved steps" in log
    assert "monolithic: finished before this launch (3 steps), skipped" in log
    assert "rollarc: resuming after step 0 (policy version 1 published to the engines) on Dagster retry 1" in log
    assert "rollarc: step 3/3" in log and "monolithic: step 3/3" in log and "ETA" in log
    assert (meta["retry_number"], meta["resumed_from"]) == (1, "monolithic finished before the retry, skipped, rollarc after step 0")
    table = lake.read("rollarc_run")
    assert table["method"].to_list() == ["monolithic"] * 3 + ["rollarc"] * 3
    assert table["step"].to_list() == [0, 1, 2] * 2
    assert max(table.filter(pl.col("method") == "rollarc")["max_staleness"].to_list()) <= 1
    assert table.filter(pl.col("method") == "monolithic")["max_staleness"].to_list() == [0, 0, 0]
    traj = lake.read("rollarc_run", name="trajectories.parquet")
    assert set(traj["env"]) == {"frozenlake", "tool_math"}
    assert set(traj["status"]) <= {"ok", "truncated", "timeout", "env_error"}
    arc = traj.filter(pl.col("method") == "rollarc")
    pools = {p for ps in arc["pools"].to_list() for p in ps.split(",")}
    assert pools == {"gpu_compute", "gpu_bandwidth"}                      # the router used both pools
    assert set(traj.filter(pl.col("method") == "monolithic")["pools"].str.split(",").explode()) == {"colocated"}
    # every trajectory got a reward from the verifiers (FrozenLake replay / math), never a silent 0 for a failure
    assert arc["reward"].null_count() == 0 and set(arc["reward_status"]) <= {"verified", "wrong", "unparseable"}
    util = meta["utilisation"]
    for pool in ("gpu_compute", "gpu_bandwidth", "cpu_env", "reward"):
        assert f"| rollarc | {pool} |" in util
    router = meta["router"]
    routed = [router["pools"][p]["routed"] for p in ("gpu_compute", "gpu_bandwidth")]
    relaunched = arc.filter(pl.col("created_step") >= 1)                   # the router's stats are the relaunch's
    assert min(routed) > 0 and sum(routed) >= relaunched["turns"].sum()   # + redundant / discarded ones
    assert meta["ray_address"] == "local" and meta["max_staleness"] <= 1
    assert meta["sandbox"].startswith("bwrap: kernel-enforced")           # the default: tool code under bubblewrap
    tps = next(v for k, v in meta.items() if k.startswith("run_trajectories_per_s_") and k.endswith("_smoke"))
    assert set(tps) == {"monolithic", "rollarc"} and "speedup_e2e" not in meta and "claim_verdict" in meta
    assert meta["pipes_messages"] == 2                                    # the relaunch ran RollArc's steps 1 and 2
    syncs = meta["weight_syncs"]                                          # every engine ends on version 3, none refused
    assert set(syncs) == {"monolithic", "rollarc"} and len(syncs["rollarc"]["policy_versions"]) == 2
    assert all(set(s["policy_versions"]) == {3} and (s["stale_syncs_refused"], s["failed_syncs"]) == (0, 0)
               for s in syncs.values()), syncs
    assert meta["stale_syncs_refused"] == 0
    assert not list((tmp_path / "rollarc_run").glob(".run-*"))


def test_rollarc_config_errors_name_the_field(tmp_path):
    problems = tmp_path / "p.parquet"
    # the path the user sets in the Launchpad is the path the error names (issue 41 item 1)
    with pytest.raises(ValueError, match=r"^arc\.async_ratio is out of range: -1"):
        rollarc.spec_from(rollarc.RollArcRunConfig(arc={"async_ratio": -1}), problems, None)
    with pytest.raises(ValueError, match=r"^roles\.route_policy must be"):
        rollarc.spec_from(rollarc.RollArcRunConfig(roles={"route_policy": "random"}), problems, None)
    with pytest.raises(ValueError, match=r"^roles\.env_latency must be"):
        rollarc.spec_from(rollarc.RollArcRunConfig(roles={"env_latency": "huge"}), problems, None)
    with pytest.raises(ValueError, match=r"^envs must be"):
        rollarc.spec_from(rollarc.RollArcRunConfig(envs=["chess"]), problems, None)
    with pytest.raises(ValueError, match=r"^roles\.top_p must be in \(0, 1\]"):
        rollarc.spec_from(rollarc.RollArcRunConfig(roles={"top_p": 0.0}), problems, None)
    with pytest.raises(ValueError, match=r"^roles\.temperature must be > 0"):
        rollarc.spec_from(rollarc.RollArcRunConfig(roles={"temperature": -1.0}), problems, None)
    with pytest.raises(ValueError, match=r"^roles\.grpo\.clip_eps must be in \(0, 1\)"):
        rollarc.spec_from(rollarc.RollArcRunConfig(roles={"grpo": {"clip_eps": 1.5}}), problems, None)
    spec = rollarc.spec_from(rollarc.RollArcRunConfig(roles={"top_k": 8, "top_p": 0.95, "temperature": 0.8}), problems, None)
    assert (spec.role_spec.top_k, spec.role_spec.top_p, spec.role_spec.temperature) == (8, 0.95, 0.8)


def test_sizes_are_capped_and_an_unusable_problems_table_fails_before_any_launch(tmp_path):
    problems = tmp_path / "p.parquet"
    with pytest.raises(ValueError, match="arc.group_size"):
        rollarc.spec_from(rollarc.RollArcRunConfig(arc={"group_size": 100_000}), problems, None)
    with pytest.raises(ValueError, match="arc.redundancy"):
        rollarc.spec_from(rollarc.RollArcRunConfig(arc={"group_size": 2, "redundancy": 5}), problems, None)
    assert_fails_without_a_numeric_problem(LakeResource(root=str(tmp_path)))
    assert not (tmp_path / "rollarc_run").exists()                        # no run folder, nothing launched


def assert_fails_without_a_numeric_problem(lake) -> str:
    """Write a ``decontaminated_problems`` of one multiple-choice row to ``lake`` (a ``LakeResource``,
    local or on object storage), materialize ``rollarc_run`` on it and check that the step fails on
    the table's content: no numeric problem for the tool_math environment. Returns the table version
    written."""
    _, version = lake.write(pl.DataFrame({"problem_id": ["p0"], "problem": ["Which is a prime? (A) 4 (B) 5"],
                                          "answer": ["B"], "answer_type": ["multiple_choice"]}),
                            "decontaminated_problems", refresh=False)
    res, _, _, _ = materialize_logged([rollarc.rollarc_run], {"lake": lake, "compute": ComputeResource()},
                                      {"ops": {"rollarc_run": {"config": TINY}}}, raise_on_error=False)
    assert not res.success
    [failure] = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
    err = failure.step_failure_data.error
    assert "has no numeric problem for the tool_math environment (1 rows)" in (err.cause or err).message
    return version


def test_the_run_config_has_one_source_the_scheduler_and_role_defaults():
    from assets._config import MIRRORS
    from assets._rl import OWN
    from ops.rl.rollarc.core import ArcConfig
    from ops.rl.rollarc.driver import RunSpec
    from ops.rl.rollarc.ray_roles import RoleSpec

    # the Launchpad config mirrors the driver's RunSpec itself, nested (no flat copy): arc and roles are
    # nested Config classes with the ops defaults and docstrings
    assert MIRRORS[rollarc.RollArcRunConfig] == (RunSpec, OWN)
    spec = rollarc.spec_from(rollarc.RollArcRunConfig(policy="tiny", model_dir="tok"), Path("p.parquet"), None)
    assert spec.arc == ArcConfig() and spec.roles == RoleSpec(tokenizer_dir="tok", env_latency="heavy")  # curated: heavy
    assert (spec.model_dir, spec.seed, spec.checkpoint_every) == (None, 0, 2)
    fields = rollarc.rollarc_run.op.config_schema.config_type.fields
    assert fields["arc"].config_type.fields["async_ratio"].default_value == ArcConfig.async_ratio
    assert fields["roles"].config_type.fields["grpo"].config_type.fields["agg"].default_value == "seq-mean-token-mean"
    assert fields["arc"].config_type.fields["async_ratio"].description.startswith("Staleness bound")
    assert "tokenizer_dir" not in fields["roles"].config_type.fields and "problems_path" not in fields
    # a nested value set in a run config reaches the spec; the fields beside it keep their defaults
    cfg = rollarc.RollArcRunConfig(policy="tiny", model_dir="tok", arc={"async_ratio": 2},
                                   roles={"grpo": {"kl_coef": 0.1}, "engines": {"gpu_compute": 2, "gpu_bandwidth": 1}})
    spec = rollarc.spec_from(cfg, Path("p.parquet"), None)
    assert (spec.arc.async_ratio, spec.arc.steps, spec.roles.grpo.kl_coef, spec.roles.grpo.agg) == \
        (2, ArcConfig.steps, 0.1, "seq-mean-token-mean")
    assert spec.roles.engines == {"gpu_compute": 2, "gpu_bandwidth": 1}
    assert RunSpec.from_json(spec.to_json()) == spec
