"""The semantic (rephrasing) layer on every benchmark by default (issue 42, item 9), with template sentences dropped
so that MMLU's shared instructions do not make unrelated items look alike."""

import pytest

from ops.curation.decontam import ALL_BENCHMARKS, DecontamConfig, Decontaminator, HALF_NGRAM_BENCHMARKS

# rephrasings written by hand for this test (clauses reordered, synonyms, other names; numbers kept), by item
HAND_REPHRASED = {
    "gsm8k_test": [
        "Every day the ducks owned by Janet produce 16 eggs. Three of them she has for breakfast each morning, and "
        "four more go into muffins she bakes for friends. Whatever eggs remain she sells at the farmers' market at $2 "
        "apiece. How many dollars does she earn at the market each day?",
        "Josh buys a house for $80,000 to flip it and spends another $50,000 on repairs, which raises the house's "
        "value by 150%. What was his profit?",
    ],
    "mmlu_test": [
        "Compression of the facial nerve at the stylomastoid foramen by a lesion will produce which ipsilateral "
        "signs?\nA. paralysis of the facial muscles.\nB. paralysis of the facial muscles and loss of taste.\n"
        "C. paralysis of the facial muscles, loss of taste and lacrimation.\nD. paralysis of the facial muscles, loss "
        "of taste, lacrimation and decreased salivation.",
    ],
}
# an MMLU dev row (real, outside the test split) that shares only the moral-scenarios template with test items:
# with the template in the embedding it reached cosine 0.91 to mmlu/moral_scenarios/661 and was removed
MORAL_DEV_ROW = ("For which of these two scenarios does the main character (who uses I/me/my) do something clearly "
                 "morally wrong, according to ordinary moral standards in the US as of 2020? Scenario 1 | I bought an "
                 "old pick-up truck for work. Scenario 2 | I looked up at the gorgeous waterfall and threw a rock at "
                 "it.\nA. Wrong, Wrong\nB. Wrong, Not wrong\nC. Not wrong, Wrong\nD. Not wrong, Not wrong")


@pytest.fixture(scope="module")
def sources_of(benchmark):
    """The item each hand rephrasing was written from (found by its opening words, so the ids are the package's)."""
    starts = {"gsm8k_test": ["Janet’s ducks lay 16 eggs", "Josh decides to try flipping a house"],
              "mmlu_test": ["A lesion causing compression of the facial nerve"]}
    out = {}
    for name, heads in starts.items():
        out[name] = [next(b["item_id"] for b in benchmark if b["benchmark"] == name and b["problem"].startswith(h))
                     for h in heads]
    return out


def test_default_semantic_layer_covers_every_benchmark(benchmark, sources_of):
    cfg = DecontamConfig()
    assert cfg.semantic_benchmarks == [ALL_BENCHMARKS]
    det = Decontaminator(benchmark)
    assert len(det.sem_items) == len(benchmark) and {benchmark[i]["benchmark"] for i in det.sem_items} >= {
        "math500", "gsm8k_test", "mmlu_test", "arc_challenge_test", "humaneval"}
    texts = HAND_REPHRASED["gsm8k_test"] + HAND_REPHRASED["mmlu_test"]
    want = sources_of["gsm8k_test"] + sources_of["mmlu_test"]
    flags = det.run(texts + [MORAL_DEV_ROW])
    for text, iid, f in zip(texts, want, flags):
        assert f is not None, text
        assert f["item_id"] == iid and f["layer"] in ("semantic", "sibling"), (iid, f)
    assert sum(f["layer"] == "semantic" for f in flags[:3]) >= 2
    assert flags[3] is None  # the moral-scenarios dev row: a shared template is not a rephrasing
    # the former default (MATH-500 only) keeps every one of them: 0 of 3, as the issue measured for GSM8K and MMLU
    old = Decontaminator(benchmark, DecontamConfig(semantic_benchmarks=["math500"])).run(texts)
    assert old == [None, None, None]


def test_templates_are_dropped_from_both_sides(benchmark):
    det = Decontaminator(benchmark)
    templates = det.semantic_templates()
    assert any(t.startswith("for which of these two scenarios") for t in templates)
    assert "express your answer as a common fraction." in templates
    form = det.semantic_form(det.matching_forms([MORAL_DEV_ROW])[0])
    assert "scenarios" not in form and form.startswith("i bought an old pick-up truck for work.")
    # a text made only of templates keeps its matching form (nothing would be left to compare)
    only = det.matching_forms(["Express your answer as a common fraction."])[0]
    assert det.semantic_form(only) == only


def test_half_ngram_guarantee_stays_on_math500(benchmark):
    """The guarantee (and the no_benchmark_overlap check) is about MATH-500 whatever semantic_benchmarks says."""
    assert HALF_NGRAM_BENCHMARKS == ("math500",)
    item = next(b for b in benchmark if b["benchmark"] == "gsm8k_test")
    det = Decontaminator([item], DecontamConfig(semantic_benchmarks=[ALL_BENCHMARKS]))
    det._half_ngram_layer([det.bnorm[0]], [item["problem"]], out := [None], det._flagger(out))
    assert out == [None]


def test_semantic_template_df_validated():
    with pytest.raises(ValueError, match="decontam.semantic_template_df"):
        DecontamConfig(semantic_template_df=1)
