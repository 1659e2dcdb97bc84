"""Seeded distillation requests: the per-request sampler seed and the distillation parameters."""

import hashlib

import pytest

from ops.curation.distill import DistillParams, build_requests, teacher_seed


def test_teacher_seed_is_a_stable_documented_hash():
    # pinned: a change here changes every distilled dataset, so it must be deliberate
    assert teacher_seed(0, "p0", 0) == 1298548592
    assert teacher_seed(0, "math_test:12", 3) == 1734772043
    # the documented formula
    digest = hashlib.sha256(b"crucible-teacher-seed/v1:7:1:user:x").digest()
    assert teacher_seed(7, "user:x", 1) == int.from_bytes(digest[:4], "big") & 0x7FFFFFFF
    # every input matters, and the range fits a signed 32-bit seed
    seeds = {teacher_seed(s, p, i) for s in (0, 1) for p in ("p0", "p1") for i in (0, 1)}
    assert len(seeds) == 8 and all(0 <= x < 2**31 for x in seeds)


def test_build_requests_seeds_each_sample_independently_of_row_order():
    rows = [{"problem_id": f"p{i}", "problem": f"What is {i}?", "answer_type": "numeric"} for i in range(3)]
    fwd = build_requests(rows, 2, {"temperature": 0.7}, seed=5)
    rev = build_requests(rows[::-1], 2, {"temperature": 0.7}, seed=5)
    by_key = {(r.tag, r.sample_index): r.seed for r in fwd}
    assert by_key == {(r.tag, r.sample_index): r.seed for r in rev}
    assert by_key[("p1", 1)] == teacher_seed(5, "p1", 1)
    assert all(r.body("m")["seed"] == r.seed for r in fwd)
    assert [r.seed for r in build_requests(rows, 1, {})] == [None] * 3  # no run seed: no seed sent


def test_distill_params_name_the_bad_field():
    assert DistillParams().seed == 0 and DistillParams().prompt_templates == {}
    with pytest.raises(ValueError, match=r"distilled_problems.k_samples out of range: 0 \(must be >= 1\)"):
        DistillParams(k_samples=0)
    with pytest.raises(ValueError, match="temperature"):
        DistillParams(temperature=-0.1)
    with pytest.raises(ValueError, match="must contain '{problem}'"):
        DistillParams(prompt_templates={"numeric": "no placeholder"})
