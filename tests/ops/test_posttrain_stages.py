"""ops.posttrain.stages: the SFT stages' own settings name the bad field, the mixture ratio says where
it came from, a committed run is reused only with its fingerprint and files, predictions are checked
before anything is committed, and stage-2 scores refuse a run trained with another seed."""

import json

import polars as pl
import pytest

from ops.posttrain.sets import stage1_sets
from ops.posttrain.sft import SftPlan
from ops.posttrain.stages import (Stage1Inputs, Stage2Inputs, read_predictions, reusable_runs, slice_table, stage2_runs,
                                  stage2_scores)


@pytest.mark.parametrize("kw, field", [({"domain_ratio": 1.5}, "sft_checkpoint.domain_ratio"),
                                       ({"heldout_fraction": 1.0}, "sft_checkpoint.heldout_fraction"),
                                       ({"train_per_module": -1}, "sft_checkpoint.train_per_module")])
def test_stage1_settings_name_the_bad_field(kw, field):
    with pytest.raises(ValueError, match=field):
        Stage1Inputs(**kw).validate()


def test_stage2_settings_name_the_bad_field():
    with pytest.raises(ValueError, match=r"stage2_checkpoint\.seeds must be >= 1, got 0"):
        Stage2Inputs(seeds=0).validate()
    assert Stage2Inputs().validate().seeds == 3


def test_stage1_heldout_default_is_the_one_sets_use():
    import inspect

    assert inspect.signature(stage1_sets).parameters["heldout_fraction"].default == Stage1Inputs().heldout_fraction


def test_mixture_ratio_from_config_plan_or_default(tmp_path):
    assert Stage1Inputs(domain_ratio=0.4).mixture_ratio(tmp_path) == (0.4, "config")
    assert Stage1Inputs().mixture_ratio(tmp_path) == (1.0, "default (no mixture_plan)")
    (tmp_path / "mixture_plan").mkdir()
    (tmp_path / "mixture_plan" / "plan.json").write_text(json.dumps({"tradeoff": {"r_d": 0.625}}))
    r, source = Stage1Inputs().mixture_ratio(tmp_path)
    assert r == 0.625 and source.startswith("mixture_plan trade-off r_d")
    with pytest.raises(ValueError, match="sft_checkpoint.domain_ratio"):
        Stage1Inputs(domain_ratio=2.0).mixture_ratio(tmp_path)


def test_missing_student_and_tokenizer_name_the_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"cpt_base_models/m .*partition 'm'"):
        Stage1Inputs().student_dir(tmp_path)
    with pytest.raises(FileNotFoundError, match="cpt_tokenizer/tokenizer.json"):
        Stage1Inputs().tokenizer_folder(tmp_path)
    (tmp_path / "hf").mkdir()
    for f in ("config.json", "model.safetensors"):
        (tmp_path / "hf" / f).write_text("{}")
    assert Stage1Inputs(base_dir=str(tmp_path / "hf")).student_dir(tmp_path) == tmp_path / "hf"


def _plan_with_run(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    init = tmp_path / "init"
    init.mkdir()
    (init / "model.safetensors").write_bytes(b"w")
    (init / "config.json").write_text("{}")
    (tmp_path / "train.parquet").write_bytes(b"t")
    (tmp_path / "eval.parquet").write_bytes(b"e")
    run = {"key": "stage1", "init_dir": str(init), "train_path": str(tmp_path / "train.parquet"),
           "out_dir": str(tmp_path / "stage"), "eval_init": True}
    return SftPlan(data_dir=str(tok), eval_path=str(tmp_path / "eval.parquet"), runs=[run])


def test_a_committed_run_is_reused_only_with_its_fingerprint_and_files(tmp_path):
    plan = _plan_with_run(tmp_path)
    done = tmp_path / "committed"
    done.mkdir()
    for f in ("model.safetensors", "predictions.parquet", "predictions_init.parquet"):
        (done / f).write_bytes(b"x")
    (done / "metrics.json").write_text(json.dumps({"fingerprint": plan.fingerprint(plan.runs[0])}))
    assert reusable_runs(plan, {"stage1": done}) == [(done, str(tmp_path / "stage"), True)]
    (done / "predictions_init.parquet").unlink()  # eval_init runs need the base model's predictions too
    assert reusable_runs(plan, {"stage1": done})[0][2] is False
    (done / "predictions_init.parquet").write_bytes(b"x")
    (tmp_path / "train.parquet").write_bytes(b"other data")  # the training table changed: retrain
    assert reusable_runs(plan, {"stage1": done})[0][2] is False


def test_predictions_are_checked_naming_run_and_file(tmp_path):
    p = tmp_path / "predictions.parquet"
    with pytest.raises(ValueError, match=r"stage2_targeted_s0: unreadable predictions .*predictions\.parquet"):
        read_predictions(p, "stage2_targeted_s0")
    pl.DataFrame({"item_id": ["a"]}).write_parquet(p)
    with pytest.raises(ValueError, match=r"lack column\(s\) \['prediction'\]"):
        read_predictions(p, "stage1")


def _scored(correct: list[bool]) -> pl.DataFrame:
    n = len(correct)
    return pl.DataFrame({"item_id": [f"i{j}" for j in range(n)], "slice": ["programmatic"] * n, "split": ["test"] * n,
                         "module": ["m"] * n, "difficulty": [1] * n, "correct": correct})


def test_stage2_runs_and_scores(tmp_path):
    runs = stage2_runs(tmp_path / "model", {"targeted": "t.parquet", "random": "r.parquet"}, "ev.parquet", tmp_path / "st", [5, 6])
    assert [r["key"] for r in runs] == ["stage2_targeted_s0", "stage2_targeted_s1", "stage2_random_s0", "stage2_random_s1"]
    assert runs[1]["seed"] == 6 and runs[2]["train_path"] == "r.parquet" and runs[3]["out_dir"].endswith("random/s1")
    metrics = {r["key"]: {"seed": r["seed"], "curve": [], "wall_s": 1.0, "steps": 4, "final_loss": 0.5} for r in runs}
    scored = {("targeted", 0): _scored([True, True]), ("targeted", 1): _scored([True, False]),
              ("random", 0): _scored([False, False]), ("random", 1): _scored([True, False])}
    res = stage2_scores(metrics, scored, [5, 6])
    assert res.long.height == 8 and sorted(res.long["seed"].unique().to_list()) == [5, 6]
    acc = {(r["arm"], r["seed"]): r["accuracy_programmatic_test"] for r in res.per_seed}
    assert acc == {("targeted", 5): 1.0, ("targeted", 6): 0.5, ("random", 5): 0.0, ("random", 6): 0.5}
    assert float(res.scored["stage2_targeted"]["correct"].mean()) == pytest.approx(0.75)
    table = slice_table(res.scored)
    row = table.filter((pl.col("checkpoint") == "stage2_random") & (pl.col("slice") == "programmatic (test)")).row(0, named=True)
    assert row["accuracy"] == pytest.approx(0.25) and row["n"] == 2
    metrics["stage2_random_s1"]["seed"] = 7
    with pytest.raises(ValueError, match="run stage2_random_s1 trained with seed 7, planned 6"):
        stage2_scores(metrics, scored, [5, 6])
