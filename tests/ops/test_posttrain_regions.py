"""Failure regions find a planted failure slice; synthesis keeps only new, clean, verified items;
bootstrap intervals and paired differences behave."""

import numpy as np
import polars as pl
import pytest

from ops.posttrain import evaluate, regions, synthesis

TEMPLATES = {
    "numbers__place_value": "What is the tens digit of {n}?",
    "numbers__is_prime": "Is {n} a prime number?",
    "comparison__pair": "Which is bigger: {n} or {m}?",
    "numbers__gcd": "Calculate the greatest common divisor of {n} and {m}.",
    "numbers__div_remainder": "What is the remainder when {n} is divided by {m}?",
    "algebra__linear_1d": "Solve {n}*x + {m} = 0 for x.",
}


def _scored(planted: str = "numbers__gcd", n: int = 40, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for mod, t in TEMPLATES.items():
        for i in range(n):
            wrong_rate = 0.9 if mod == planted else 0.2
            rows.append({"item_id": f"{mod}/{i}", "problem": t.format(n=rng.integers(10, 999), m=rng.integers(2, 99)),
                         "module": mod, "domain": "math", "difficulty": 1 + 2 * (i % 2), "answer_type": "numeric",
                         "correct": bool(rng.random() >= wrong_rate), "response_loss": float(rng.gamma(2.0, 0.3))})
    return pl.DataFrame(rows)


def test_failure_regions_find_the_planted_slice():
    items, ranked = regions.find_regions(_scored(), k_topics=6, seed=0)
    top_ann = ranked.filter(pl.col("kind") == "annotation").row(0, named=True)
    assert top_ann["module"] == "numbers__gcd" and top_ann["failure_rate"] > 0.7
    top_topic = ranked.filter(pl.col("kind") == "topic").row(0, named=True)
    assert top_topic["module"] == "numbers__gcd" and top_topic["module_share"] >= 0.9
    assert "greatest" in top_topic["description"] or "common" in top_topic["description"]
    assert ranked["rank"].to_list() == list(range(1, ranked.height + 1))
    assert ranked["failure_mass"].is_sorted(descending=True)
    # mass: 1 per wrong item, 0.5 per right-but-high-loss item (top decile of loss)
    assert items["failure_mass"].sum() == pytest.approx((~items["correct"]).sum() + 0.5 * items["high_loss"].sum())
    targets = regions.synthesis_targets(ranked, top_k=3)
    assert targets[0]["module"] == "numbers__gcd" and len({t["module"] for t in targets}) == 3


def test_failure_mass_names_a_missing_column():
    with pytest.raises(ValueError, match="response_loss"):
        regions.failure_mass(pl.DataFrame({"correct": [True]}))


def test_item_filter_rejects_duplicates_contaminated_and_unverifiable_items():
    corpus = ["What is the tens digit of 4321?", "A farmer has 17 sheep and buys 5 more at the market on Sunday morning, "
              "so how many sheep does the farmer have now in total?"]
    bench = [{"benchmark": "gsm8k_test", "item_id": "gsm8k/1",
              "problem": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                         "How many clips did Natalia sell altogether in April and May?"}]
    items = [
        {"item_id": "ok", "problem": "What is the tens digit of 9876?", "answer": "7", "response": "\\boxed{7}", "answer_type": "numeric"},
        {"item_id": "dup", "problem": "what is the tens digit of  4321?", "answer": "2", "response": "\\boxed{2}", "answer_type": "numeric"},
        {"item_id": "near", "problem": "A farmer has 17 sheep and buys 5 more at the market on Sunday morning, "
                                       "so how many sheep does the farmer have now in all?",  # Jaccard 0.85
         "answer": "22", "response": "\\boxed{22}", "answer_type": "numeric"},
        {"item_id": "contam", "problem": "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
                                         "clips in May. How many clips did Natalia sell altogether in April and May?",
         "answer": "72", "response": "\\boxed{72}", "answer_type": "numeric"},
        {"item_id": "bad_gold", "problem": "Is 91 a prime number or not, decide?", "answer": "\\frac{", "response": "\\boxed{\\frac{}",
         "answer_type": "numeric"},
        {"item_id": "wrong", "problem": "What is the units digit of 9876?", "answer": "6", "response": "\\boxed{5}", "answer_type": "numeric"},
        {"item_id": "again", "problem": "What is the tens digit of 9876?", "answer": "7", "response": "\\boxed{7}", "answer_type": "numeric"},
    ]
    kept, rejected, rep = synthesis.ItemFilter(corpus, bench, workers=1).run(items)
    assert [k["item_id"] for k in kept] == ["ok"]
    assert {r["item_id"]: r["reason"] for r in rejected} == {
        "dup": "duplicate_exact", "again": "duplicate_exact", "near": "duplicate_near", "contam": "contaminated",
        "bad_gold": "unverifiable", "wrong": "unverifiable"}
    assert rep.seen == 7 and rep.kept == 1 and rep.rejected["duplicate_exact"] == 2
    assert [r for r in rejected if r["item_id"] == "contam"][0]["contaminated_with"].startswith("gsm8k_test:gsm8k/1")


def test_targeted_selection_follows_failure_mass_and_random_is_the_same_size():
    pool = pl.DataFrame({"item_id": [str(i) for i in range(60)], "module": ["a"] * 20 + ["b"] * 20 + ["c"] * 20,
                         "difficulty": [1] * 60})
    targets = [{"module": "a", "difficulty": 1, "failure_mass": 3.0}, {"module": "b", "difficulty": 1, "failure_mass": 1.0}]
    assert synthesis.allocate(targets, 10) == [8, 2]
    t = synthesis.select_targeted(pool, targets, 10)
    assert t.height == 10 and t["module"].value_counts().sort("module")["count"].to_list() == [8, 2]
    assert synthesis.select_targeted(pool, targets, 30)["module"].value_counts().sort("module")["count"].to_list() == [20, 10]
    r = synthesis.select_random(pool, 10)
    assert r.height == 10 and r["module"].n_unique() >= 2


def test_retriever_returns_the_nearest_document():
    r = synthesis.Retriever(["The greatest common divisor of two integers", "Prime numbers have two divisors",
                             "Rounding to the nearest ten"])
    (best, sim), *_ = r.query(["What is the greatest common divisor of 12 and 18?"], k=2)[0]
    assert best == 0 and sim > 0


def test_teacher_synthesis_output_is_parsed_or_refused():
    assert synthesis.parse_synthesis("Question: What is the gcd of 12 and 18?\nAnswer: \\boxed{6}") == ("What is the gcd of 12 and 18?", "6")
    assert synthesis.parse_synthesis("I cannot do that.") is None


def test_seed_average_is_per_item_and_refuses_mismatched_items():
    a = pl.DataFrame({"item_id": ["x", "y"], "correct": [True, False]})
    b = pl.DataFrame({"item_id": ["x", "y"], "correct": [False, False]})
    assert evaluate.average_seeds([a, b])["correct"].to_list() == [0.5, 0.0]
    with pytest.raises(ValueError, match="different items"):
        evaluate.average_seeds([a, b.reverse()])


def test_bootstrap_interval_and_paired_difference():
    lo, hi = evaluate.bootstrap_ci(np.array([1.0] * 30 + [0.0] * 70), n_boot=2000)
    assert lo < 0.3 < hi and hi - lo < 0.25
    a = pl.DataFrame({"item_id": list("abcd"), "correct": [True, True, True, False], "s": [1, 1, 1, 1]})
    b = pl.DataFrame({"item_id": list("dcba"), "correct": [False, False, True, False], "s": [1, 1, 1, 1]})
    d = evaluate.paired_difference(a, b, pl.col("s") == 1)
    assert d["n"] == 4 and d["diff"] == pytest.approx(0.5)


def test_stage2_arms_share_the_same_replay_rows():
    from ops.posttrain.sets import stage2_sets

    new = {a: pl.DataFrame({"item_id": [f"{a}{i}" for i in range(6)], "problem": [f"{a} q{i}" for i in range(6)],
                            "response": ["\\boxed{1}"] * 6, "origin": ["generator"] * 6, "module": ["m"] * 6,
                            "difficulty": [1] * 6}) for a in ("targeted", "random")}
    s1 = pl.DataFrame({"item_id": [f"s{i}" for i in range(50)], "problem": [f"old {i}" for i in range(50)],
                       "response": ["x"] * 50, "origin": ["generated"] * 50, "module": [None] * 50, "difficulty": [1] * 50},
                      schema_overrides={"module": pl.String})
    sets = stage2_sets(new, s1, replay_fraction=0.5, seed=3)
    rep = {a: df.filter(pl.col("origin") == "replay")["item_id"].to_list() for a, df in sets.items()}
    assert len(rep["targeted"]) == 6 and rep["targeted"] == rep["random"]
    assert sets["targeted"].height == sets["random"].height == 12
    with pytest.raises(ValueError, match="replay_fraction"):
        stage2_sets(new, s1, replay_fraction=1.0)


def test_scoring_decides_integers_and_words_in_process_and_the_rest_with_math_verify():
    items = pl.DataFrame({"item_id": list("abcdefg"), "answer": ["12", "12", "True", "0.5", "-3", "b", "7"],
                          "answer_type": ["numeric", "numeric", "text", "numeric", "numeric", "text", "numeric"]})
    preds = [pl.DataFrame({"item_id": list("abcdefg"),
                           "prediction": ["\\boxed{012}", "\\boxed{13}", "\\boxed{true}", "\\boxed{1/2}", "\\boxed{-3}",
                                          "\\boxed{c}", None],
                           "response_loss": [1.0] * 7}),
             pl.DataFrame({"item_id": list("abcdefg"), "prediction": ["\\boxed{12}"] * 7, "response_loss": [1.0] * 7})]
    first, second = evaluate.score_many(items, preds, workers=1)
    assert first["correct"].to_list() == [True, False, True, True, True, False, False]
    assert first["verify_status"].to_list()[-1] == "missing"
    assert second["correct"].to_list() == [True, True, False, False, False, False, False]
    assert evaluate.score(items, preds[0], workers=1)["correct"].to_list() == first["correct"].to_list()
