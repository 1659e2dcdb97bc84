"""The D-CPT benchmark's record of the probe points it fitted: a digest that tells two lakes apart."""
import math

import polars as pl

from benchmarks.dcpt_bench import probe_points


def _pts(**change):
    rows = [{"size": s, "n_params": n, "domain_ratio": r, "seed": 0, "tokens": d,
             "loss_general": 5.0 + n * 1e-6 + d * 1e-7, "loss_domain": 6.0 - r - d * 1e-7}
            for s, n in (("xs", 6592), ("s", 25472)) for r in (0.25, 0.75) for d in (4096, 8192)]
    rows[1].update(change)
    return pl.DataFrame(rows)


def test_digest_ignores_row_order_and_sees_a_last_bit_change():
    a = probe_points(_pts())
    assert probe_points(_pts().reverse())["sha256"] == a["sha256"]
    assert len(a["points"]) == 8 and a["points"][0]["size"] == "xs" and a["points"][0]["tokens"] == 4096
    x = _pts()["loss_general"][1]
    changed = probe_points(_pts(loss_general=math.nextafter(x, math.inf)))      # one ulp up
    assert changed["sha256"] != a["sha256"]
    # the rounded table hides such a change, the digest does not
    assert changed["points"] == a["points"]


def test_missing_seed_column_reads_as_seed_zero():
    assert probe_points(_pts().drop("seed"))["sha256"] == probe_points(_pts())["sha256"]


def test_identification_reads_bounds_and_compares_heldout_r2_with_the_ceiling():
    from benchmarks.dcpt_bench import identification

    doc = {"fits": {"domain": {"L3": {"at_bound": {"E": "lower", "A": None, "gamma": "upper"}}}},
           "generalisation": {"domain": {"noise": {"log_std": 0.004},
                                         "unseen_N": {"r2": 0.9, "r2_ceiling": 0.998},
                                         "unseen_D": {"r2": 0.8}}}}
    out = identification(doc, "test")
    assert out["at_bound"] == {"domain": {"L3": ["E", "gamma"]}}
    n = out["heldout_r2_vs_ceiling"]["domain"]["unseen_N"]
    assert abs(n["noise_floor_k2"] - 0.996) < 1e-12 and abs(n["mse_over_noise"] - 50.0) < 1e-9
    assert "unseen_D" not in out["heldout_r2_vs_ceiling"]["domain"]      # no ceiling: not compared
    assert out["seed_noise"]["domain"]["log_std"] == 0.004


def test_signed_error_is_per_checkpoint_and_keeps_its_sign():
    """pred / obs - 1 averaged per D over the ratios: +10% and -10% at one D cancel, a uniform +5% stays."""
    from benchmarks.dcpt_bench import _signed_by_tokens

    test = pl.DataFrame({"tokens": [4096, 4096, 8192, 8192], "loss_domain": [2.0, 4.0, 2.0, 4.0]})
    got = _signed_by_tokens([2.2, 3.6, 2.1, 4.2], test, "loss_domain")
    assert list(got) == ["4096", "8192"]
    assert math.isclose(got["4096"], 0.0, abs_tol=1e-12) and math.isclose(got["8192"], 0.05, rel_tol=1e-12)
