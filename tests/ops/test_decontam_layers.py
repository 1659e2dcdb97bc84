"""Decontamination layers beyond n-grams (issue 19): matching normalisation, template siblings, rephrasings,
the fail-closed judge, and the labelled set — cases decontam-escaped-latex, decontam-rephrased-and-siblings and
llm-judge-fail-closed of tests/cases/curation.json."""

import random
import time

import numpy as np
import pytest

from ops.curation.decontam import (DecontamConfig, Decontaminator, half_ngram_overlaps, layer_counts,
                                   parse_judge_reply)
from ops.curation.decontam_set import HAND_REPHRASED, HAND_SIBLINGS, HAND_UNRELATED, evaluate, labelled_set, sibling
from ops.curation.text import match_normalize


@pytest.fixture(scope="module")
def math500(benchmark):
    return [b for b in benchmark if b["benchmark"] == "math500"]


@pytest.fixture(scope="module")
def detector(benchmark):
    return Decontaminator(benchmark)  # the default: policy strict, every benchmark


def test_match_normalize_unifies_storage_and_spelling():
    base = match_normalize("Find $\\frac{1}{2}(x + 1)$ if $x \\le 3$, in cm.")
    for variant in ["Find $\\\\frac{1}{2}(x + 1)$ if $x \\\\le 3$, in cm.",              # JSON-escaped
                    "Find $\\dfrac{1}{2}\\left(x + 1\\right)$ if $x \\leq 3$, in cm.",   # LaTeX variants
                    "Find \\(\\tfrac{1}{2}\\,(x+1)\\) if \\(x \\le 3\\), in \\text{cm}.",
                    "**Find** $\\frac{1}{2}(x + 1)$ if $x ≤ 3$, in cm."]:            # Markdown, Unicode
        assert match_normalize(variant).replace(" ", "") == base.replace(" ", ""), variant
    assert match_normalize("Simplify $\\sqrt{242}$.") != match_normalize("Simplify $\\sqrt{243}$.")  # digits kept


def test_case_decontam_escaped_latex(detector, math500, benchmark, curation_cases):
    assert "every MATH-500 problem that contains a backslash" in curation_cases["decontam-escaped-latex"]["input"]
    items = [b for b in math500 if "\\" in b["problem"]]
    escaped = [b["problem"].replace("\\", "\\\\") for b in items]
    flags = detector.run(escaped)
    assert len(items) == 281
    assert all(f is not None and f["item_id"] == b["item_id"] for f, b in zip(flags, items))
    # the former light normalisation (kept for comparison) misses most of them: the issue measured 85 of 281
    legacy = Decontaminator(math500, DecontamConfig(policy="ngram", match_normalization=False)).run(escaped)
    assert sum(f is not None for f in legacy) < 0.5 * len(items)


def test_case_decontam_rephrased_and_siblings(detector, math500, curation_cases):
    case = curation_cases["decontam-rephrased-and-siblings"]
    assert "(b) 10 template siblings" in case["input"]
    by_id = {b["item_id"]: b for b in math500}
    rng = random.Random(3)
    rephrased = list(HAND_REPHRASED.items())
    assert len(rephrased) == 10
    sib_items = [b for b in math500 if "[asy]" not in b["problem"] and len(b["problem"]) > 120 and sibling(b["problem"], rng)]
    siblings = list(HAND_SIBLINGS.items()) + [(b["item_id"], sibling(b["problem"], rng)) for b in rng.sample(sib_items, 9)]
    unrelated = HAND_UNRELATED
    assert len(siblings) == 10 and len(unrelated) == 10
    texts = [t for _, t in rephrased] + [t for _, t in siblings] + [t for _, t in unrelated]
    flags = detector.run(texts)
    for (iid, text), f in zip(rephrased + siblings, flags[:20]):
        assert f is not None, text                                   # (a) and (b) flagged by default...
        assert f["item_id"] == iid and f["benchmark"] == "math500"   # ...by their own item...
        assert f["layer"] in {"exact", "ngram", "minhash", "sibling", "semantic"}  # ...with the layer that caught it
    assert {f["layer"] for f in flags[10:20]} >= {"sibling"}
    assert {f["layer"] for f in flags[:10]} >= {"semantic"}
    assert flags[20:] == [None] * 10                                 # (c) kept
    # the former policy keeps the siblings and the rephrasings, as the issue measured
    old = Decontaminator(math500, DecontamConfig(policy="ngram")).run(texts)
    assert sum(f is not None for f in old[:20]) <= 5
    # precision and recall on such a labelled set
    rows = [{"problem": t, "label": k < 20, "kind": "x", "item_id": iid}
            for k, (iid, t) in enumerate(rephrased + siblings + list(unrelated))]
    ev = evaluate(rows, flags)
    assert (ev["precision"], ev["recall"], ev["matched_own_item"]) == (1.0, 1.0, 1.0)
    assert set(ev["layers"]) >= {"sibling", "semantic"}


class _BandEmbedder:
    """Embeds a benchmark item as e0 and anything else at cosine 0.8 to it: inside the judge's band [0.75, 0.85)."""

    def __init__(self, bench_texts):
        self.bench = {match_normalize(t) for t in bench_texts}

    def encode(self, texts):
        e0, e1 = np.eye(2, dtype=np.float32)
        return np.stack([e0 if t in self.bench else 0.8 * e0 + 0.6 * e1 for t in texts])


BENCH = [{"benchmark": "math500", "item_id": "math500/x",
          "problem": "Four distinct circles are drawn in a plane. What is the maximum number of points where at least "
                     "two of the circles intersect?"}]
ROW = "Four different circles lie in one plane. At most how many points can lie on two or more of them?"


def _judged(judge, **kw):
    cfg = DecontamConfig(judge=True, semantic_prefilter=0.0, judge_timeout_s=kw.pop("timeout", 30.0), **kw)
    det = Decontaminator(BENCH, cfg, embedder=_BandEmbedder([BENCH[0]["problem"]]), judge=judge)
    [flag] = det.run([ROW])
    return flag, det.stats["judge"]


def test_case_llm_judge_fail_closed(curation_cases):
    assert "fail" in curation_cases["llm-judge-fail-closed"]["id"]
    flag, st = _judged(lambda pairs: ["Yes." for _ in pairs])
    assert flag["layer"] == "llm-judge" and not flag["needs_review"] and st["yes"] == 1
    flag, st = _judged(lambda pairs: ["No, they differ." for _ in pairs])
    assert flag is None and st["no"] == 1                                   # a clear no keeps the row
    flag, st = _judged(lambda pairs: ["%%## banana" for _ in pairs])
    assert flag["layer"] == "llm-judge-fail-closed" and flag["needs_review"] and st["unparseable"] == 1

    def boom(pairs):
        raise ConnectionError("teacher unreachable")

    flag, st = _judged(boom)
    assert flag["layer"] == "llm-judge-fail-closed" and flag["needs_review"] and st["failed"] == 1
    assert "teacher unreachable" in st["error"]

    def slow(pairs):
        time.sleep(30)
        return ["No"] * len(pairs)

    flag, st = _judged(slow, timeout=0.5)
    assert flag["layer"] == "llm-judge-fail-closed" and "timed out" in st["error"]
    flag, st = _judged(lambda pairs: ["No"] * len(pairs), judge_max_pairs=0)   # over budget: not judged, removed
    assert flag["layer"] == "llm-judge-fail-closed" and st["over_budget"] == 1
    assert layer_counts([flag, None]) == {**{k: 0 for k in layer_counts([])}, "llm-judge-fail-closed": 1, "needs_review": 1}
    assert [parse_judge_reply(x) for x in ("Yes.", " no", "", None, "maybe")] == [True, False, None, None, None]


def test_half_of_the_8grams_is_removed_and_found_by_the_check_criterion(detector, math500):
    item = next(b for b in math500 if b["item_id"] == "math500/438")
    row = HAND_SIBLINGS["math500/438"] + " Give the digit only."
    assert half_ngram_overlaps([row, HAND_UNRELATED[0][1]], [item]) and half_ngram_overlaps([HAND_UNRELATED[0][1]], [item]) == []
    [f] = detector.run([row])
    assert f is not None and f["item_id"] == "math500/438"


def test_labelled_set_per_layer_precision_and_recall(benchmark, math_test_rows):
    pool = [r["problem"] for r in math_test_rows]
    rows = labelled_set(benchmark, pool, per_kind=25, seed=1)
    kinds = {r["kind"] for r in rows}
    assert kinds == {"light_edit", "escaped", "sibling", "rephrased", "unrelated"}
    math500 = [b for b in benchmark if b["benchmark"] == "math500"]
    strict = evaluate(rows, Decontaminator(math500).run([r["problem"] for r in rows]))
    ngram = evaluate(rows, Decontaminator(math500, DecontamConfig(policy="ngram")).run([r["problem"] for r in rows]))
    assert strict["recall"] >= 0.9 and strict["precision"] >= 0.95
    assert ngram["kinds"]["sibling"]["removed_fraction"] < 0.3 < strict["kinds"]["sibling"]["removed_fraction"]
    for layer, s in strict["layers"].items():
        assert 0 <= s["precision"] <= 1 and s["flagged"] > 0, layer
    assert abs(sum(s["recall"] for s in strict["layers"].values()) - strict["recall"]) < 1e-9


@pytest.mark.parametrize("kw, match", [({"policy": "fuzzy"}, "decontam.policy"),
                                       ({"judge_low": 0.9, "semantic_threshold": 0.85}, "decontam.judge_low"),
                                       ({"sibling_containment": 0}, "decontam.sibling_containment"),
                                       ({"semantic_top_k": 0}, "decontam.semantic_top_k")])
def test_new_fields_are_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        DecontamConfig(**kw)
