"""The probe grid's and the closed loop's plumbing in ops (ops.mixture.probe_grid, ops.mixture.closed_loop):
the grid from the environment, run lists and keys, the rise over each run's own base, and the runs that
verify a plan. Pure functions on small frames; the assets that call them are tested end to end in
tests/assets/test_mixture_assets.py."""

import polars as pl
import pytest

from ops.mixture.closed_loop import validation_runs
from ops.mixture.probe_grid import (distinct_ints, final_rises, grid_at_largest, grid_from_env, probe_runs, ratio_key,
                                    run_key, seeds_at)
from ops.mixture.validation import ValidationParams


def test_grid_from_env_defaults_and_errors_name_the_variable():
    assert grid_from_env({}) == (["xs", "s", "m", "l"], ["0.00", "0.25", "0.50", "0.75", "1.00"])
    assert grid_from_env({"CRUCIBLE_CPT_SIZES": " s, l ", "CRUCIBLE_CPT_RATIOS": "0.1,1"}) == (["s", "l"], ["0.10", "1.00"])
    with pytest.raises(ValueError, match=r"CRUCIBLE_CPT_SIZES: unknown size 'huge'"):
        grid_from_env({"CRUCIBLE_CPT_SIZES": "xs,huge"})
    with pytest.raises(ValueError, match=r"CRUCIBLE_CPT_RATIOS: ratio 1.5 outside \[0, 1\]"):
        grid_from_env({"CRUCIBLE_CPT_RATIOS": "0,1.5"})
    with pytest.raises(ValueError, match=r"CRUCIBLE_CPT_RATIOS: 'half' is not a number"):
        grid_from_env({"CRUCIBLE_CPT_RATIOS": "half"})


def test_distinct_ints_names_the_field():
    assert distinct_ints([3, 0, 1], "cpt_base_models.inits", need_zero=True) == [0, 1, 3]
    with pytest.raises(ValueError, match=r"cpt_probe_runs.seeds must be distinct integers >= 0 \(at least one\), got \[1, 1\]"):
        distinct_ints([1, 1], "cpt_probe_runs.seeds")
    with pytest.raises(ValueError, match=r"cpt_base_models.inits must be distinct integers >= 0 including 0"):
        distinct_ints([1, 2], "cpt_base_models.inits", need_zero=True)


def test_probe_runs_repeat_seeds_only_at_the_repeat_ratios_and_pair_seed_with_init():
    dims = [{"size": "l", "ratio": "0.50"}, {"size": "xs", "ratio": "0.25"}, {"size": "l", "ratio": "0.25"}]
    runs = probe_runs(dims, [0, 1, 2], [0.5], reinit_base=True, size_order=["xs", "s", "m", "l"])
    assert [r["key"] for r in runs] == ["xs|0.25", "l|0.25", "l|0.50", "l|0.50|s1", "l|0.50|s2"]
    assert all(r["init"] == r["seed"] for r in runs)
    assert [r["init"] for r in probe_runs(dims[:1], [0, 1], [], reinit_base=False, size_order=["l"])] == [0, 0]
    assert seeds_at("0.25", [0, 1], []) == [0, 1] and seeds_at("0.25", [0, 1], [0.5]) == [0]
    assert run_key("m", ratio_key(0.5), 0) == "m|0.50"
    with pytest.raises(ValueError, match="cpt_probe_runs: no run in partitions"):
        probe_runs([], [0], [], True, ["l"])


def test_final_rises_measure_each_run_against_its_own_base():
    # two seeds at r_d 0.5 continuing different bases (D = 0 rows), one seed at r_d 1.0
    rows = [(0.5, 0, 0, 5.0), (0.5, 0, 100, 5.5), (0.5, 1, 0, 4.0), (0.5, 1, 100, 4.2), (1.0, 0, 0, 5.0), (1.0, 0, 100, 6.0)]
    runs = pl.DataFrame([{"n_params": 7, "domain_ratio": r, "seed": s, "tokens": d, "loss_general": lg, "loss_domain": 3.0}
                         for r, s, d, lg in rows] + [{"n_params": 9, "domain_ratio": 0.5, "seed": 0, "tokens": 100,
                                                      "loss_general": 1.0, "loss_domain": 1.0}])
    fr = final_rises(runs, 7).sort("domain_ratio", "seed")
    assert fr["general_rise"].to_list() == pytest.approx([0.1, 0.05, 0.2])
    g = grid_at_largest(runs, 7)
    assert g["domain_ratio"].to_list() == [0.5, 1.0] and g["seeds"].to_list() == [2, 1]
    assert g["general_rise"].to_list() == pytest.approx([0.075, 0.2])
    assert g["loss_general"].to_list() == pytest.approx([4.85, 6.0])


def test_validation_runs_merge_equal_asks_and_round_D_up_to_whole_steps():
    plan = {"target": {"tokens": 1000.0}, "tradeoff": {"r_d": 0.7504}, "probe_grid": {"best_ratio": 0.75},
            "limited_domain": {"r_d": 0.5, "tokens": 600.0}, "allocate_compute": {"n_params": 90.0, "tokens": 5000.0, "r_d": 0.75}}
    params = ValidationParams(seeds=[2, 3], verify_allocate_compute=True)
    runs, asks = validation_runs(plan, params, "l", {"m": 100, "l": 400}, per_step=256)
    assert asks["tradeoff_law"] == {"size": "l", "ratio": 0.75, "tokens": 1000}
    assert asks["limited_domain"]["tokens"] == 600                       # D = D_d / r_d = 0.5 * 600 / 0.5
    assert asks["allocate_compute"] == {"size": "m", "ratio": 0.75, "tokens": int(round(90.0 * 5000.0 / 100))}
    by_key = {r["key"]: r for r in runs}
    # the law's and the grid's ratio round to the same run: one run per seed carrying both usages
    assert by_key["l|r0.75|D1024|s2"]["usages"] == ["tradeoff_law", "tradeoff_grid"]
    assert by_key["l|r0.5|D768|s3"]["usages"] == ["limited_domain"] and by_key["l|r0.5|D768|s3"]["tokens"] == 768
    assert len(runs) == 2 * 3 and {r["seed"] for r in runs} == {2, 3}
