"""The statistics and verdicts of benchmarks/rl_sim.py (the simulations themselves: test_des.py)."""

import math

import pytest

@pytest.fixture(scope="module")
def rl_sim():
    import benchmarks.rl_sim as mod

    return mod


def test_ci95_is_the_student_t_interval(rl_sim):
    c = rl_sim.ci95([1.0, 2.0, 3.0])
    # mean 2, sd 1, n 3: t(0.975, 2) = 4.302653 -> half-width 4.302653 / sqrt(3)
    h = 4.302652729911275 / math.sqrt(3)
    assert c["mean"] == 2.0 and c["ci95"] == pytest.approx([2 - h, 2 + h], rel=1e-9)
    assert rl_sim.ci95([5.0])["ci95"] is None


def test_verdict_against_the_paper_band(rl_sim):
    assert rl_sim._verdict(2.2, [2.1, 2.3], [2.03, 2.56]) == {"verdict": "within", "holds": True, "ci_overlaps_band": True}
    assert rl_sim._verdict(3.0, [2.5, 3.5], [2.03, 2.56])["verdict"] == "above"
    assert rl_sim._verdict(3.0, [2.5, 3.5], [2.03, 2.56])["ci_overlaps_band"] is True
    assert rl_sim._verdict(1.0, [0.9, 1.1], [1.35, 2.05]) == {"verdict": "below", "holds": False, "ci_overlaps_band": False}
