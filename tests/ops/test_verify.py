"""Answer verification: every verify case of shared/cases/curation.json, timeouts, multiple choice."""

import pytest

from ops.curation import verify as V


def check(gold, pred, solution=None):
    parsed, how = V.parse_gold(gold, solution)
    return V.verify_math(parsed, pred), how


def test_case_verify_distinct_equations(curation_cases):
    inp = curation_cases["verify-distinct-equations"]["input"]
    assert check(inp["gold"], inp["pred"])[0] is False


def test_equations_equal_up_to_a_factor_still_verify():
    assert check("$6x - 2y + 26 = 0$", "$3x - y + 13 = 0$")[0] is True


def test_case_verify_tiny_values(curation_cases):
    for item in curation_cases["verify-tiny-values"]["input"]:
        assert check(item["gold"], item["pred"])[0] is False


def test_exact_numbers_that_are_equal_still_verify():
    assert check("$\\frac{1}{2^{99}}$", "$2^{-99}$")[0] is True
    assert check("0.5", "$\\boxed{\\frac{1}{2}}$")[0] is True


def test_case_verify_undelimited_gold(curation_cases):
    for item in curation_cases["verify-undelimited-gold"]["input"]:
        ok, how = check(item["gold"], item["pred"])
        assert ok is True and how == "answer_wrapped"


def test_case_verify_corrupted_gold_falls_back_to_solution(curation_cases):
    inp = curation_cases["verify-corrupted-gold"]["input"]
    ok, how = check(inp["answer"], inp["pred"], inp["solution"])
    assert ok is True and how == "solution_boxed"


def test_unparseable_gold_is_reported_not_scored_wrong():
    res = V.verify_one(V.VerifyItem("k", "\\le(", "no boxed answer here", "$\\boxed{3}$"))
    assert res["status"] == "unparseable_gold"


def test_sympy_syntax_gold_from_mathematics_dataset():
    assert check("-sqrt(7)/4", "$\\boxed{-\\frac{\\sqrt{7}}{4}}$")[0] is True
    assert check("x**(589/99)", "$\\boxed{x^{589/99}}$")[0] is True
    assert check("x**(589/99)", "$\\boxed{x^{589/98}}$")[0] is False


def test_multiple_choice_by_letter():
    item = V.VerifyItem("k", "C", None, "The answer is (C).", "multiple_choice")
    assert V.verify_one(item)["status"] == "verified"
    item.prediction = "\\boxed{B}"
    assert V.verify_one(item)["status"] == "wrong"
    item.answer = "7"
    assert V.verify_one(item)["status"] == "unparseable_gold"


def test_verify_many_in_process_pool_keeps_order():
    items = [V.VerifyItem(str(i), str(i), None, f"$\\boxed{{{i if i % 3 else i + 1}}}$") for i in range(12)]
    res = V.verify_many(items, timeout_s=20, workers=2, chunk=4)
    assert [r["key"] for r in res] == [str(i) for i in range(12)]
    assert [r["status"] for r in res] == ["wrong" if i % 3 == 0 else "verified" for i in range(12)]


def _sleepy(item):  # module-level so the pool can pickle it
    import time

    time.sleep(30)


def test_verify_many_times_out_and_never_counts_as_verified(monkeypatch):
    monkeypatch.setattr(V, "verify_one", _sleepy)
    items = [V.VerifyItem("a", "1", None, "$\\boxed{1}$")]
    res = V.verify_many(items, timeout_s=0.5, workers=1)
    assert res[0]["status"] == "timeout"


@pytest.mark.parametrize("kw", [{"timeout_s": 0}, {"workers": 0}])
def test_verify_many_rejects_bad_parameters(kw):
    with pytest.raises(ValueError):
        V.verify_many([], **kw)


_REAL_VERIFY_ONE = V.verify_one


def _crash_on_boom(item):  # module-level: the forked worker calls it through the patched module
    import os

    if item.key == "boom":
        os._exit(3)
    return _REAL_VERIFY_ONE(item)


def test_a_worker_that_dies_costs_only_its_item_and_the_rest_of_its_batch_still_runs(monkeypatch):
    monkeypatch.setattr(V, "verify_one", _crash_on_boom)
    items = [V.VerifyItem(str(i), str(i), None, f"$\\boxed{{{i}}}$") for i in range(40)]
    items.insert(17, V.VerifyItem("boom", "12345", None, "$\\boxed{12345}$"))  # its own work (no twin)
    res = V.verify_many(items, timeout_s=20, workers=2, batch=16)
    assert [r["key"] for r in res] == [it.key for it in items]
    assert res[17]["status"] == "error" and "died" in res[17]["error"]
    assert [r["status"] for k, r in enumerate(res) if k != 17] == ["verified"] * 40


def test_identical_items_are_verified_once_and_reported_under_each_key(monkeypatch):
    calls = []
    real = V.verify_one
    monkeypatch.setattr(V, "verify_one", lambda it: calls.append(it.key) or real(it))
    items = [V.VerifyItem(f"k{i}", "Paris", None, None, "text") for i in range(5)]   # string-only gold check
    res = V.verify_many(items, timeout_s=5, workers=1)
    assert [r["key"] for r in res] == [f"k{i}" for i in range(5)] and {r["status"] for r in res} == {"gold_ok"}
    assert calls == ["k0"]  # in this process, once
