"""Decontamination: the decontam cases, and recall/precision against MATH-500 on the real data."""

import numpy as np
import pytest

from ops.curation.decontam import DecontamConfig, Decontaminator, ground_truth_scores
from ops.curation.text import normalize


@pytest.fixture(scope="module")
def detector(benchmark):
    return Decontaminator(benchmark)


def test_case_decontam_short_benchmark_item(detector, curation_cases):
    case = curation_cases["decontam-short-benchmark-item"]
    problem = case["input"]["train"][0]["problem"]
    [flag] = detector.run([problem])
    assert flag is not None and flag["benchmark"] == "math500" and flag["layer"] == "exact"
    # the short-item key keeps numbers: a neighbouring radicand is not the benchmark item
    assert detector.run(["Simplify $\\sqrt{243}$."]) == [None]


def test_case_decontam_textbook_identity(curation_cases):
    case = curation_cases["decontam-textbook-identity"]
    train = case["input"]["train"][0]["problem"]
    bench = [
        {"benchmark": "math500", "item_id": "b1",
         "problem": "Given $\\tan(A+B) = \\frac{\\tan A + \\tan B}{1 - \\tan A \\tan B}$, compute $\\tan 105^\\circ$ "
                    "exactly, writing the result in simplest radical form."},
    ]
    assert Decontaminator(bench).run([train]) == [None]
    # ...while the benchmark item itself, embedded in a longer prompt, is caught by the n-gram layer
    copy = "Solve the following problem carefully. " + bench[0]["problem"] + " Show your work."
    [flag] = Decontaminator(bench).run([copy])
    assert flag is not None and flag["layer"] == "ngram" and flag["score"] == 1.0


def test_math500_recall_and_precision_on_math_test(detector, benchmark, math_test_rows):
    problems = [r["problem"] for r in math_test_rows]
    flags = detector.run(problems)
    m500 = {normalize(b["problem"]) for b in benchmark if b["benchmark"] == "math500"}
    truth = np.array([normalize(p) in m500 for p in problems])
    removed = np.array([f is not None and f["benchmark"] == "math500" for f in flags])
    scores = ground_truth_scores(removed, truth)
    assert truth.sum() == 500
    assert scores["recall"] == 1.0
    # the strict default also removes MATH test problems that are template siblings or rephrasings of a MATH-500
    # item (not copies, so false positives against this ground truth); the copy layers alone stay precise
    copies = np.array([f is not None and f["benchmark"] == "math500" and f["layer"] in ("exact", "ngram", "minhash")
                       for f in flags])
    assert ground_truth_scores(copies, truth)["precision"] >= 0.95
    extra = [f["layer"] for f, t in zip(flags, truth) if f is not None and f["benchmark"] == "math500" and not t]
    assert set(extra) <= {"ngram", "minhash", "sibling", "semantic", "half-ngram"} and scores["precision"] >= 0.75


def test_math500_ground_truth_under_the_ngram_policy(benchmark, math_test_rows):
    problems = [r["problem"] for r in math_test_rows]
    flags = Decontaminator(benchmark, DecontamConfig(policy="ngram")).run(problems)
    m500 = {normalize(b["problem"]) for b in benchmark if b["benchmark"] == "math500"}
    truth = np.array([normalize(p) in m500 for p in problems])
    scores = ground_truth_scores(np.array([f is not None and f["benchmark"] == "math500" for f in flags]), truth)
    assert scores["recall"] == 1.0 and scores["precision"] >= 0.95


def test_config_validation_names_the_parameter():
    with pytest.raises(ValueError, match="decontam.containment"):
        DecontamConfig(containment=0)
