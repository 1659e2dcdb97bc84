"""rollpacker_run materializes through Dagster Pipes: the driver runs baseline and RollPacker steps
on a local Ray instance (engine, reward service and trainer as actors) and the metadata carries the
per-step comparison. The tiny random policy keeps it fast; the real policy runs in the benchmark."""

from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from assets import rollpacker
from resources.compute import ComputeResource
from resources.lake import LakeResource

MODEL_DIR = Path(__file__).resolve().parents[2] / ".models" / "SmolLM2-135M-Instruct"
TINY = {"policy": "tiny", "model_dir": str(MODEL_DIR), "steps": 2, "prompts_per_step": 2, "responses_per_prompt": 2,
        "eta": 1.5, "max_new_tokens": 8, "timeout_s": 60.0, "run_timeout_s": 300.0}


def lake_with_problems(tmp_path) -> LakeResource:
    lake = LakeResource(root=str(tmp_path))
    df = pl.DataFrame({"problem_id": [f"p{i:02d}" for i in range(12)],
                       "problem": [f"What is {i} + {i}?" for i in range(12)],
                       "answer": [str(2 * i) for i in range(12)], "solution": [None] * 12,
                       "answer_type": ["numeric"] * 12})
    lake.write(df, "decontaminated_problems", refresh=False)
    return lake


def test_rollpacker_run_compares_methods_per_step(tmp_path):
    pytest.importorskip("ray")
    if not (MODEL_DIR / "tokenizer.json").exists():
        pytest.skip("SmolLM2 directory missing: run make setup")
    lake = lake_with_problems(tmp_path)
    res = dg.materialize([rollpacker.rollpacker_run], resources={"lake": lake, "compute": ComputeResource()},
                         run_config={"ops": {"rollpacker_run": {"config": TINY}}})
    assert res.success
    [m] = [e.materialization.metadata for e in res.get_asset_materialization_events()]
    meta = {k: v.value for k, v in m.items()}
    table = pl.read_parquet(lake.path("rollpacker_run"))
    assert table.height == 4 and table["method"].to_list() == ["baseline"] * 2 + ["rollpacker"] * 2
    assert table["round"].to_list() == ["sync", "sync", "short", "long"]
    assert table["policy_version"].to_list() == [0, 1, 0, 1]
    assert set(meta["speedup_vs_baseline"]) == {"baseline", "rollpacker"} and meta["speedup_vs_baseline"]["baseline"] == 1.0
    assert meta["pipes_messages"] == 4 and meta["ray_address"] == "local"
    assert "| rollpacker |" in meta["summary"] and "| baseline |" in meta["comparison"]
    assert "data:image/png;base64" in meta["figure"]


def test_rollpacker_run_rejects_a_bad_config_naming_the_field(tmp_path):
    lake = lake_with_problems(tmp_path)
    res = dg.materialize([rollpacker.rollpacker_run], raise_on_error=False,
                         resources={"lake": lake, "compute": ComputeResource()},
                         run_config={"ops": {"rollpacker_run": {"config": {**TINY, "eta": 0.5}}}})
    assert not res.success
    [fail] = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "tail_batching.eta" in str(fail.step_failure_data.error)
