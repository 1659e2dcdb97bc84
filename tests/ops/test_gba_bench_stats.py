"""The switching benchmark's statistics: per-seed paired differences and their Student-t CI."""
import pytest

from benchmarks.gba_bench import ci95, paired_differences


def test_paired_differences_are_per_seed_and_use_student_t():
    aucs = {"sync": [0.70, 0.69, 0.71], "sync_to_gba": [0.701, 0.689, 0.712], "sync_to_async": [0.698, 0.686, 0.709]}
    pd = paired_differences(aucs)
    # gba - async per seed: +0.003, +0.003, +0.003 -> zero spread, CI collapses on the mean
    assert pd["sync_to_gba_minus_sync_to_async"]["values"] == [0.003, 0.003, 0.003]
    assert pd["sync_to_gba_minus_sync_to_async"]["ci95"] == [0.003, 0.003]
    # gba - sync: +0.001, -0.001, +0.002 -> mean 0.000667, t(0.975, 2) = 4.3027, sd 0.0015275
    d = pd["sync_to_gba_minus_sync"]
    assert d["mean"] == pytest.approx(0.00067, abs=1e-5)
    assert d["ci95"] == pytest.approx([0.00067 - 0.003795, 0.00067 + 0.003795], abs=2e-5)
    # unpaired CIs of the same runs are far wider than the paired one (the seed's draw is shared)
    assert ci95(aucs["sync_to_gba"])["ci95"][1] - ci95(aucs["sync_to_gba"])["ci95"][0] > 0.05


def test_paired_differences_skip_missing_kinds():
    assert paired_differences({"sync": [0.7], "sync_to_gba": [0.7]}).keys() == {"sync_to_gba_minus_sync"}
