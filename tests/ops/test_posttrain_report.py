"""The comparison's intervals over seeds and items and its verdict, on constructed inputs whose
interval is known."""

import numpy as np
import polars as pl
import pytest

from ops.posttrain.report import (VERDICTS, compare, flip_margin, hierarchical_bootstrap, per_seed_frame, seed_matrix,
                                  verdict_of)


def _diff(t, r, **kw):
    return hierarchical_bootstrap([np.asarray(t, float), np.asarray(r, float)], [1.0, -1.0], **kw)


def test_a_constant_difference_has_a_point_interval_and_the_verdict_follows_its_sign():
    n = 40
    better = _diff(np.ones((3, n)), np.zeros((3, n)))
    assert better["diff"] == 1.0 and better["ci_low"] == pytest.approx(1.0) and better["ci_high"] == pytest.approx(1.0)
    assert verdict_of(better["ci_low"], better["ci_high"]) == "targeted better"
    worse = _diff(np.zeros((3, n)), np.ones((3, n)))
    assert verdict_of(worse["ci_low"], worse["ci_high"]) == "targeted worse" and worse["ci_high"] == pytest.approx(-1.0)
    # identical arms (same pattern in every seed): exactly 0, never a spurious sign from float noise
    same = np.tile((np.arange(n) % 3 == 0).astype(float), (3, 1))
    tie = _diff(same, same.copy())
    assert tie["ci_low"] == tie["ci_high"] == 0.0 and verdict_of(tie["ci_low"], tie["ci_high"]) == "no difference"
    # every item gains exactly 0.25 in every seed (correctness as fractions): interval [0.25, 0.25]
    base = np.tile(np.linspace(0, 0.5, n), (3, 1))
    shift = _diff(base + 0.25, base)
    assert shift["ci_low"] == pytest.approx(0.25) and shift["ci_high"] == pytest.approx(0.25)


def test_seed_resampling_widens_what_one_lucky_seed_would_claim():
    """Targeted: one seed gets every item right, two get none; random: none. Averaging seeds first
    gives +1/3 on every item (interval [1/3, 1/3], 'better'); resampling seeds too, the targeted
    mean over 3 drawn seeds is 0 with probability (2/3)^3 = 0.30 and 1 with (1/3)^3 = 0.037, so the
    95% interval is exactly [0, 1] and the verdict is 'no difference'."""
    n = 30
    t = np.zeros((3, n))
    t[0] = 1.0
    r = np.zeros((3, n))
    d = _diff(t, r, n_boot=4000)
    assert d["diff"] == pytest.approx(1 / 3) and d["seeds"] == [3, 3]
    assert d["ci_low"] == 0.0 and d["ci_high"] == pytest.approx(1.0)
    assert verdict_of(d["ci_low"], d["ci_high"]) == "no difference"
    avg = _diff(t.mean(0, keepdims=True), r.mean(0, keepdims=True))
    assert avg["ci_low"] == pytest.approx(1 / 3) and verdict_of(avg["ci_low"], avg["ci_high"]) == "targeted better"


def test_item_resampling_matches_the_normal_interval_of_a_paired_difference():
    rng = np.random.default_rng(0)
    n = 2000
    d_item = rng.choice([-1.0, 0.0, 1.0], size=n, p=[0.2, 0.5, 0.3])  # one seed per arm: the paired item bootstrap
    t = np.where(d_item > 0, 1.0, 0.0)[None]
    r = np.where(d_item < 0, 1.0, 0.0)[None]
    res = _diff(t, r, n_boot=4000)
    se = d_item.std() / np.sqrt(n)
    assert res["diff"] == pytest.approx(d_item.mean())
    assert res["ci_low"] == pytest.approx(d_item.mean() - 1.96 * se, abs=0.15 * 1.96 * se)
    assert res["ci_high"] == pytest.approx(d_item.mean() + 1.96 * se, abs=0.15 * 1.96 * se)
    assert _diff(t, r, n_boot=500, seed=3) == _diff(t, r, n_boot=500, seed=3)  # seeded: the same numbers every run


def test_verdict_and_margin_on_the_interval_edges():
    assert verdict_of(0.001, 0.2) == "targeted better" and verdict_of(-0.2, -0.001) == "targeted worse"
    assert verdict_of(0.0, 0.2) == verdict_of(-0.1, 0.0) == verdict_of(float("nan"), float("nan")) == "no difference"
    assert flip_margin(0.02, 0.2) == 0.02 and flip_margin(-0.2, -0.05) == 0.05 and flip_margin(-0.01, 0.3) == 0.01
    with pytest.raises(ValueError, match="above ci_high"):
        verdict_of(0.3, 0.1)
    with pytest.raises(ValueError, match="different item counts"):
        hierarchical_bootstrap([np.ones((2, 3)), np.ones((2, 4))], [1, -1])
    assert np.isnan(hierarchical_bootstrap([np.ones((2, 0))], [1])["ci_low"])


def _scored(n: int) -> pl.DataFrame:
    mods = ["m_fail"] * n + ["m_other"] * n
    return pl.DataFrame({"item_id": [f"i{k}" for k in range(2 * n)], "module": mods, "difficulty": [1] * (2 * n),
                         "slice": ["programmatic"] * (2 * n), "split": ["test"] * (2 * n), "correct": [False] * (2 * n)})


def test_compare_reads_every_seed_and_gives_the_verdict():
    n = 25
    s1 = _scored(n)
    rows = []
    for ck, right in (("stage2_targeted", lambda k, s: k < n and k % 2 == 0),     # half the failure items, every seed
                      ("stage2_random", lambda k, s: k < n and k % 5 == 0)):      # a fifth of them
        for s in (10, 11, 12):
            rows += [{"checkpoint": ck, "seed": s, "item_id": f"i{k}", "correct": float(right(k, s))} for k in range(2 * n)]
    per_seed = pl.DataFrame(rows)
    avg = lambda ck: s1.with_columns(correct=pl.Series(seed_matrix(per_seed, ck, s1["item_id"].to_list()).mean(0)))  # noqa: E731
    scored = {"stage1": s1, "stage2_targeted": avg("stage2_targeted"), "stage2_random": avg("stage2_random")}
    table, v = compare(scored, [{"module": "m_fail", "difficulty": None}], n_boot=500, per_seed=per_seed)
    assert v["seeds"] == {"stage1": [0], "stage2_targeted": [10, 11, 12], "stage2_random": [10, 11, 12]}
    d = v["targeted_minus_random_failure_slices"]
    assert d["n"] == n and d["seeds"] == [3, 3] and d["diff"] == pytest.approx(13 / 25 - 5 / 25)
    assert v["verdict"] == "targeted better" and v["claim_held"] and v["verdict"] in VERDICTS
    assert v["targeted_minus_random_overall"]["n"] == 2 * n
    row = table.filter((pl.col("checkpoint") == "stage2_targeted") & (pl.col("slice") == "failure_slices")).row(0, named=True)
    assert row["seeds"] == 3 and row["accuracy"] == pytest.approx(13 / 25)
    assert [p["seed"] for p in v["per_seed"]] == [10, 11, 12, 10, 11, 12]
    assert v["statement"].startswith("verdict: targeted better (claim held)")
    # a seed that lacks an item is refused, named
    with pytest.raises(ValueError, match="seed 12 has no score"):
        compare(scored, [{"module": "m_fail", "difficulty": None}], n_boot=10,
                per_seed=per_seed.filter(~((pl.col("seed") == 12) & (pl.col("item_id") == "i3"))))
    # one seed per checkpoint (the frame built from the scored tables) still works
    assert per_seed_frame(scored).height == 3 * 2 * n
