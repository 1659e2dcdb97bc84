"""Annotation rules and classifier; stratified allocation."""

import polars as pl
import pytest

from ops.curation import annotate as A
from ops.curation.sampling import allocate, stratified_sample


def test_rule_labels_from_source_metadata():
    math = A.rule_labels({"source": "math_test", "subject": "algebra", "level": "Level 4", "answer": "\\frac{1}{2}", "problem": "p"})
    assert (math["domain"], math["difficulty"], math["answer_type"]) == ("math", 4, "numeric")
    mmlu = A.rule_labels({"source": "mmlu_dev_val", "subject": "college_physics", "choices": ["a", "b"], "problem": "p", "answer": "A"})
    assert (mmlu["domain"], mmlu["difficulty"], mmlu["answer_type"]) == ("physics", 3, "multiple_choice")
    hist = A.rule_labels({"source": "mmlu_dev_val", "subject": "high_school_us_history", "choices": ["a"], "problem": "p", "answer": "A"})
    assert hist["out_of_scope"] and hist["domain"] == "other"
    gen = A.rule_labels({"source": "mathematics_dataset", "level": "train-hard", "answer": "x**2 + 1", "problem": "p"})
    assert (gen["difficulty"], gen["answer_type"]) == (3, "expression")


def test_validity_reasons():
    labels = {"answer_type": "numeric", "out_of_scope": False}
    assert A.validity({"problem": "", "answer": "1"}, labels) == (False, "empty_problem")
    assert A.validity({"problem": "p", "answer": None, "solution": "no box"}, labels) == (False, "no_reference_answer")
    assert A.validity({"problem": "p", "answer": None, "solution": "so \\boxed{3}"}, labels) == (True, "ok")


def test_classifier_fills_missing_domains_with_provenance():
    rows = []
    for i in range(30):
        rows.append({"source": "mmlu_dev_val", "subject": "college_chemistry", "problem": f"Which molecule has the stronger covalent bond, case {i}? acid base pH titration",
                     "choices": ["a", "b"], "answer": "A"})
        rows.append({"source": "mmlu_dev_val", "subject": "college_physics", "problem": f"A block slides down a frictionless incline, case {i}; find its velocity and momentum",
                     "choices": ["a", "b"], "answer": "B"})
    rows.append({"source": "arc", "subject": "ARC-Easy", "problem": "What is the pH of an acid after titration with a base?", "choices": ["a"], "answer": "A"})
    out, report = A.annotate(rows)
    arc = out[-1]
    assert arc["domain"] == "chemistry" and arc["domain_provenance"] == "classifier"
    assert out[0]["domain_provenance"] == "rule"
    assert 0.0 <= report["domain_classifier"]["heldout_accuracy"] <= 1.0


def test_allocate_floor_keeps_small_strata_and_sums_to_target():
    plan = allocate({"a": 100, "b": 5, "c": 1000}, target=300, floor=20)
    assert plan["b"] == 5  # smaller than the floor: kept whole
    assert sum(plan.values()) == 300
    assert plan["c"] > plan["a"] >= 20
    assert allocate({"a": 3}, target=10, floor=1) == {"a": 3}
    with pytest.raises(ValueError, match="target_size"):
        allocate({"a": 3}, target=-1, floor=1)


def test_stratified_sample_is_deterministic_and_matches_plan():
    df = pl.DataFrame({"problem_id": [f"p{i}" for i in range(200)],
                       "domain": ["math"] * 150 + ["physics"] * 50,
                       "difficulty": [1, 2] * 100})
    s1, plan = stratified_sample(df, ["domain", "difficulty"], target=40, floor=5, seed=3)
    s2, _ = stratified_sample(df.reverse(), ["domain", "difficulty"], target=40, floor=5, seed=3)
    assert s1["problem_id"].to_list() == s2["problem_id"].to_list()
    counts = {f"{d}|{k}": n for d, k, n in s1.group_by("domain", "difficulty").len().iter_rows()}
    assert counts == plan and sum(plan.values()) == 40
