"""The pure parts of the D-CPT and failure-driven claim adapters (benchmarks/claims/adapters/dcpt.py,
posttrain.py) and their designs: the naive baselines' arithmetic on a known curve, the probes' own form
selection, the seeds a failure-driven replicate draws, and that every design's params bind to its
run_seed."""

import inspect
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from benchmarks.claims.adapters import dcpt, posttrain
from benchmarks.claims.child import resolve
from benchmarks.claims.design import DESIGNS, load_design

CLAIMS = ("dcpt-extrapolation", "dcpt-closed-loop", "failure-driven")


def _probe_points() -> pl.DataFrame:
    # two sizes; the largest (N = 400) has two seeds at r_d 0.5 and one at r_d 1.0
    rows = []
    for n, seed, r, toks, lg, ld in [
        (100, 0, 0.5, 10, 5.0, 4.0), (100, 0, 0.5, 20, 4.8, 3.9),
        (400, 0, 0.5, 10, 4.0, 3.0), (400, 0, 0.5, 20, 3.8, 2.8),
        (400, 1, 0.5, 10, 4.2, 3.2), (400, 1, 0.5, 20, 3.6, 2.6),
        (400, 0, 1.0, 10, 4.5, 2.5), (400, 0, 1.0, 20, 4.9, 2.0),
    ]:
        rows.append({"n_params": n, "seed": seed, "domain_ratio": r, "tokens": toks, "loss_general": lg, "loss_domain": ld})
    return pl.DataFrame(rows)


def test_carry_over_is_the_largest_probes_seed_mean_at_the_same_ratio_and_tokens():
    test = pl.DataFrame({"n_params": [1600] * 4, "domain_ratio": [1.0, 0.5, 0.5, 1.0], "tokens": [20, 10, 20, 10]})
    got = dcpt.carry_over_prediction(_probe_points(), test, "loss_general")
    assert got.tolist() == pytest.approx([4.9, 4.1, 3.7, 4.5])     # seed means 4.1 = (4.0 + 4.2) / 2, 3.7 = (3.8 + 3.6) / 2
    got_d = dcpt.carry_over_prediction(_probe_points(), test, "loss_domain")
    assert got_d.tolist() == pytest.approx([2.0, 3.1, 2.7, 2.5])


def test_carry_over_names_a_point_the_largest_probe_never_measured():
    test = pl.DataFrame({"n_params": [1600], "domain_ratio": [0.25], "tokens": [10]})
    with pytest.raises(ValueError, match=r"0\.25, 10"):
        dcpt.carry_over_prediction(_probe_points(), test, "loss_general")


def test_mare_pct_on_known_errors():
    assert dcpt.mare_pct([1.1, 0.9, 2.0], [1.0, 1.0, 2.0]) == pytest.approx(100 * (0.1 + 0.1 + 0.0) / 3)
    # the carried-over curve's error on a validation curve 10% below it everywhere is 100/9 %
    assert dcpt.mare_pct([4.0, 3.0], [4.0 / 1.1 * 1.0, 3.0 / 1.1]) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="finite and > 0"):
        dcpt.mare_pct([1.0], [0.0])
    with pytest.raises(ValueError, match="equal"):
        dcpt.mare_pct([1.0, 2.0], [1.0])


def test_arm_scores_average_the_two_targets_and_split_by_size():
    test = pl.DataFrame({"size": ["xl", "xl", "xxl", "xxl"], "n_params": [1, 1, 2, 2], "tokens": [1, 2, 1, 2],
                         "domain_ratio": [0.5] * 4, "loss_general": [2.0] * 4, "loss_domain": [1.0] * 4})
    preds = {"general": np.array([2.2, 2.0, 2.0, 2.0]), "domain": np.array([1.0, 1.0, 0.9, 1.1])}
    s = dcpt._arm_scores(preds, test)
    assert s["mare_general_pct"] == pytest.approx(2.5) and s["mare_domain_pct"] == pytest.approx(5.0)
    assert s["mare_pct"] == pytest.approx(3.75)
    assert s["mare_pct_xl"] == pytest.approx((5.0 + 0.0) / 2) and s["mare_pct_xxl"] == pytest.approx((0.0 + 10.0) / 2)


def test_the_probes_select_the_form_with_the_lowest_held_out_error():
    assert dcpt.select_on_probes({"L3": 2.5, "r_additive": 1.9, "bimix": 3.0}) == "r_additive"
    assert dcpt.select_on_probes({"L3": 1.0, "L3_d0": 1.0}) == "L3"          # a tie: the earlier form
    with pytest.raises(ValueError, match="no form"):
        dcpt.select_on_probes({})
    with pytest.raises(ValueError, match="non-finite"):
        dcpt.select_on_probes({"L3": float("nan")})


def test_failure_driven_replicate_draws_every_seed_from_the_claim_seed():
    a, b = posttrain.chain_config(2100), posttrain.chain_config(2101)
    sft = a["sft_checkpoint"]["config"]
    assert sft["seed"] == sft["train_seed"] == 2100 and sft["eval_seed"] == 2100 + posttrain.EVAL_SEED_OFFSET
    assert a["targeted_synthesis"]["config"]["pool_seed"] == 2100 + posttrain.POOL_SEED_OFFSET
    assert a["stage2_checkpoint"]["config"]["seed"] == a["failure_regions"]["config"]["seed"] == 2100
    # no generator seed of one replicate is another replicate's, nor a development default (101 / 202 / 303)
    def seeds(c):
        return {c["sft_checkpoint"]["config"][k] for k in ("train_seed", "eval_seed")} | {c["targeted_synthesis"]["config"]["pool_seed"]}
    assert not seeds(a) & seeds(b) and not seeds(a) & {101, 202, 303}
    with pytest.raises(ValueError, match=">= 0"):
        posttrain.chain_config(-1)


def test_failure_driven_arm_metrics_read_the_comparison_table():
    table = [{"checkpoint": ck, "slice": sl, "accuracy": acc, "n": n} for ck, sl, acc, n in [
        ("stage1", "failure_slices", 0.07, 186), ("stage2_targeted", "failure_slices", 0.175, 186),
        ("stage2_random", "failure_slices", 0.158, 186), ("stage2_targeted", "overall", 0.30, 569),
        ("stage2_random", "overall", 0.29, 569), ("stage2_targeted", "other_slices", 0.36, 383),
        ("stage2_random", "other_slices", 0.355, 383)]]
    m = posttrain.arm_metrics(table)
    assert m["targeted"]["failure_slices_pct"] == pytest.approx(17.5) and m["random"]["failure_slices_pct"] == pytest.approx(15.8)
    assert m["targeted"]["stage1_failure_pct"] == pytest.approx(7.0) and m["random"]["failure_items"] == 186
    with pytest.raises(KeyError, match="stage2_random"):
        posttrain.arm_metrics([r for r in table if not (r["checkpoint"] == "stage2_random" and r["slice"] == "overall")])


@pytest.mark.parametrize("claim", CLAIMS)
def test_design_is_valid_and_its_params_bind_to_its_run_seed(claim):
    d = load_design(Path(DESIGNS) / f"{claim}.yaml")
    assert min(d.seeds) >= 1000
    fn = resolve(d.command)
    inspect.signature(fn).bind(seed=d.seeds[0], arm_order=d.arm_order(d.seeds[0]), workdir=Path("."), **d.params)


def test_extrapolation_design_arms_are_the_adapters_and_it_is_judged_against_target_and_baselines():
    d = load_design(Path(DESIGNS) / "dcpt-extrapolation.yaml")
    forms = tuple(d.params["forms"])
    assert set(d.arms) == {"probe_selected", *forms, *dcpt.NAIVE_ARMS, "mare_target_2pct"}
    assert d.arms[0] == "probe_selected" and set(d.against) == {"mare_target_2pct", *dcpt.NAIVE_ARMS}
    assert "chinchilla" not in forms            # the ratio-free fit is a naive baseline, not a registered form
    from ops.mixture import law

    assert set(forms) <= set(law.FORMS) and set(d.params["bounds"]) <= {"E", "alpha", "beta", "eta", "gamma", "eps", "t", "D0"}


def test_titles_corpus_holds_no_validation_title_in_training():
    g = dcpt.general_variant("titles")
    norm = g["text"].str.to_lowercase().str.replace_all(r"[^a-z0-9 ]", "").str.replace_all(r" +", " ").str.strip_chars()
    g = g.with_columns(_n=norm)
    train, val = set(g.filter(pl.col("split") == "train")["_n"]), set(g.filter(pl.col("split") == "val")["_n"])
    assert len(val) > 500 and len(train) > 10_000 and not train & val
    assert g["text"].str.contains("\n").sum() == 0          # titles only: no review body
    with pytest.raises(ValueError, match="titles"):
        dcpt.general_variant("wiki")


def test_closed_loop_never_scores_another_seeds_validation_record(tmp_path):
    # the shared probe lake keeps the previous seed's validation.json; a seed whose validation failed or was
    # interrupted must raise instead of reporting that record as its own
    from benchmarks.claims.adapters.dcpt import read_seed_validation

    path = tmp_path / "validation.json"
    with pytest.raises(RuntimeError, match="wrote no"):
        read_seed_validation(path, 2301, ["step mixture_validation failed"])
    path.write_text(json.dumps({"seeds": [2300], "closed_loop": {"measured_rise": -0.063}}))
    with pytest.raises(RuntimeError, match=r"'seeds' is \[2300\], not \[2301\]"):
        read_seed_validation(path, 2301)
    assert read_seed_validation(path, 2300)["closed_loop"]["measured_rise"] == -0.063


@pytest.mark.parametrize("claim", ["dcpt-closed-loop", "dcpt-extrapolation"])
def test_the_designs_flat_schedules_nest_into_the_probe_configs_and_keep_every_fingerprint(claim, tmp_path):
    """The registered designs name the probe schedules flat (base_lr, warmup_steps, weight_decay, cpt_lr,
    cpt_warmup_steps); the adapter nests them into the assets' configs (base_schedule / cpt_schedule),
    and the plan the assets build from those configs hashes every base and CPT run exactly as the flat
    plan the design was registered against did (the legacy hash, computed here by hand)."""
    import hashlib

    from assets import mixture
    from ops.mixture.probe import ProbePlan

    p = load_design(Path(DESIGNS) / f"{claim}.yaml").params
    base_cfg, probe_cfg = dcpt.probe_configs(p["base"], p["probe"], 60.0)
    assert "base_lr" not in base_cfg and base_cfg["base_schedule"]["lr"] == p["base"]["base_lr"]
    bc, pc = mixture.BaseModelConfig(**base_cfg), mixture.ProbeRunConfig(**probe_cfg)   # Dagster's config takes them
    (tmp_path / "manifest.json").write_text('{"vocab_size": 512}')
    kw = dict(data_dir=str(tmp_path), base_dir="", out_dir="")
    base = ProbePlan.from_settings(phase="base", **kw, **bc.model_dump(exclude={"timeout_s", "inits"})).validate()
    cpt = ProbePlan.from_settings(phase="cpt", **kw, **base.base_settings(),
                                  **pc.model_dump(exclude={"timeout_s", "seeds", "repeat_ratios", "seeds_reinit_base"})
                                  ).validate()
    flat = {**p["base"], **p["probe"]}
    d = {k: flat[k] for k in ProbePlan.BASE_FIELDS if k != "lr_rule_below_ref"}
    legacy = lambda size, ratio, d: hashlib.sha256(json.dumps(['{"vocab_size": 512}', cpt.sizes[size], d, ratio],
                                                               sort_keys=True).encode()).hexdigest()[:16]
    assert base.fingerprint("l") == cpt.fingerprint("l") == legacy("l", None, d)
    assert cpt.fingerprint("l", 0.5) == legacy("l", 0.5, {**d, **{k: flat[k] for k in ProbePlan.CPT_FIELDS}})
    assert cpt.cpt_schedule.weight_decay == p["base"]["weight_decay"]


def test_the_validation_worker_trains_on_one_world_of_two_ranks(tmp_path):
    """The extrapolation claim's validation runs go through ``_worker``: the probe worker launched on 2 gloo
    ranks with the compute resource's environment. Without ``ACCELERATE_USE_CPU`` accelerate started two
    processes that each saw a world of one, trained every run twice into the same folders and once raced
    on a checkpoint (seed 2204's first attempt). The result must record one world of 2 ranks."""
    from ops.mixture.probe import ProbePlan
    from tests.ops.test_mixture_probe import _tiny_streams

    data = _tiny_streams(tmp_path)
    plan = ProbePlan(phase="base", data_dir=str(data), base_dir=str(tmp_path / "base"), out_dir=str(tmp_path / "runs"),
                     runs=[{"size": "xs", "ratio": 0.0, "key": "xs"}, {"size": "s", "ratio": 0.0, "key": "s"}],
                     seq_len=16, global_batch=4, base_tokens=256, cpt_tokens=512, first_checkpoint=128,
                     val_seqs_general=4, val_seqs_per_subdomain=4)
    result = dcpt._worker(plan, tmp_path / ".base", timeout_s=240)
    assert (result["world_size"], result["distributed_type"]) == (2, "DistributedType.MULTI_CPU")
    assert sorted(result["runs"]) == ["s", "xs"] and (tmp_path / "base" / "xs" / "base.json").exists()
