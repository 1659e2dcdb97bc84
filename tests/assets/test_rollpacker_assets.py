"""rollpacker_run materializes through Dagster Pipes: the driver runs baseline and RollPacker steps
on a local Ray instance (engine, reward service and trainer as actors) and the metadata carries the
per-step comparison. The driver is killed (SIGKILL to its process group, Ray included) after its
3rd step: RetryingComputeResource retries the step and the driver resumes after that step. The
tiny random policy keeps it fast; the real policy runs in the benchmark."""

from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from assets import rollpacker
from ops.rl.rollpacker.driver import CRASH_ENV
from resources.compute import ComputeResource
from tests.conftest import lake_with_problems, materialize_logged
from resources.retry import RetryingComputeResource

MODEL_DIR = Path(__file__).resolve().parents[2] / ".models" / "SmolLM2-135M-Instruct"
TINY = {"policy": "tiny", "model_dir": str(MODEL_DIR), "steps": 2, "prompts_per_step": 2, "responses_per_prompt": 2,
        "eta": 1.5, "max_new_tokens": 8, "timeout_s": 60.0, "run_timeout_s": 300.0}


def test_rollpacker_run_compares_methods_per_step_and_a_killed_driver_resumes_on_retry(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    if not (MODEL_DIR / "tokenizer.json").exists():
        pytest.skip("SmolLM2 directory missing: run make setup")
    lake = lake_with_problems(tmp_path)
    monkeypatch.setenv(CRASH_ENV, "3")                   # after baseline's 2 steps and rollpacker's step 0
    compute = RetryingComputeResource(launch_retries=1, retry_backoff_s=0.0)
    res, meta, log, kinds = materialize_logged([rollpacker.rollpacker_run], {"lake": lake, "compute": compute},
                                               {"ops": {"rollpacker_run": {"config": TINY}}})
    assert res.success and kinds.count("STEP_UP_FOR_RETRY") == 1
    assert "launch died (exit code -9)" in log and "baseline: finished before this launch (2 steps), skipped" in log
    assert "rollpacker: resuming after step 0 (policy version 1 published to the engine; 3 of 4 steps of the run done) " \
           "on Dagster retry 1" in log
    assert "rollpacker run: GRPO steps (resumed with 3 of 4 done): 1/1 steps (100%)" in log
    assert (meta["retry_number"], meta["resumed_from"]) == (1, "rollpacker after step 0")
    assert not list((tmp_path / "rollpacker_run").glob(".run-*"))          # run folder removed after success
    table = lake.read("rollpacker_run")
    assert table.height == 4 and table["method"].to_list() == ["baseline"] * 2 + ["rollpacker"] * 2
    assert table["round"].to_list() == ["sync", "sync", "short", "long"]
    assert table["policy_version"].to_list() == [0, 1, 0, 1]
    speedup = meta["run_speedup_2_steps_smoke"]                            # 2 steps: only the second one counts
    assert set(speedup) == {"baseline", "rollpacker"} and speedup["baseline"] == 1.0
    assert "speedup_vs_baseline" not in meta and "claim_verdict" in meta and "seed 0" in meta["run_scope"]
    assert meta["pipes_messages"] == 1 and meta["ray_address"] == "local"     # the relaunch ran the one missing step
    assert "| rollpacker |" in meta["summary"] and "| baseline |" in meta["comparison"]
    assert Path(meta["figure"]).read_bytes()[:4] == b"\x89PNG"                # a figure file in the lake


def test_rollpacker_run_rejects_a_bad_config_naming_the_field(tmp_path):
    lake = lake_with_problems(tmp_path)
    res = dg.materialize([rollpacker.rollpacker_run], raise_on_error=False,
                         resources={"lake": lake, "compute": ComputeResource()},
                         run_config={"ops": {"rollpacker_run": {"config": {**TINY, "eta": 0.5}}}})
    assert not res.success
    [fail] = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "tail_batching.eta" in str(fail.step_failure_data.error)


def test_the_run_config_mirrors_the_driver_spec_and_the_driver_checks_its_spec(tmp_path):
    from assets._config import MIRRORS
    from assets._rl import OWN
    from ops.rl.rollpacker import driver

    assert MIRRORS[rollpacker.RollPackerRunConfig] == (driver.RunSpec, OWN)
    problems = tmp_path / "p.parquet"
    spec = rollpacker.spec_from(rollpacker.RollPackerRunConfig(policy="tiny", model_dir="tok"), problems, None)
    assert spec == driver.RunSpec(problems_path=str(problems), tokenizer_dir="tok", model_dir=None)
    with pytest.raises(ValueError, match=r"rollpacker_run.policy must be one of \['scratchpad', 'smollm2', 'tiny'\]"):
        rollpacker.spec_from(rollpacker.RollPackerRunConfig(policy="big"), problems, None)
    # the launched driver checks the spec file once more, naming the file and the field
    bad = tmp_path / "spec.json"
    bad.write_text(spec.to_json().replace('"eta": 1.25', '"eta": 0.5'))
    with pytest.raises(ValueError, match=r"spec.json: .*tail_batching.eta"):
        driver.main(["--spec", str(bad), "--out", str(tmp_path / "out")])
