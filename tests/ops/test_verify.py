"""Answer verification: every verify case of shared/cases/curation.json, timeouts, multiple choice."""

import pytest

from ops.curation import verify as V


def check(gold, pred, solution=None):
    parsed, how = V.parse_gold(gold, solution)
    return V.verify_math(parsed, pred), how


def test_case_verify_distinct_equations(curation_cases):
    inp = curation_cases["verify-distinct-equations"]["input"]
    assert check(inp["gold"], inp["pred"])[0] is False


def test_plain_polynomial_answer_is_not_matched_by_its_leading_coefficient():
    """A plain answer the LaTeX path parses whole gets no extra plain-expression fragments: before,
    ``parse_gold("2x^2-18")`` also held a bare 2, so the prediction 2 verified."""
    assert check("2x^2-18", "$\\boxed{2}$")[0] is False
    assert check("2x^2-18", "$\\boxed{2(x^2-9)}$")[0] is True
    assert check("sqrt(2)/2", "$\\boxed{\\frac{\\sqrt{2}}{2}}$")[0] is True


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


_REAL_VERIFY_ONE = V.verify_one


def _slow(item):  # an ordinary item slowed down, as on a loaded machine: 1 s, then the real verdict
    import time

    time.sleep(1.0)
    return _REAL_VERIFY_ONE(item)


def test_verify_stable_retries_a_slowed_item_and_still_never_verifies_a_hung_one(monkeypatch):
    """A wall-clock timeout that a slow machine trips is retried once with RETRY_FACTOR x the limit
    (so two runs agree); an item that hangs stays ``timeout``."""
    monkeypatch.setattr(V, "verify_one", _slow)
    items = [V.VerifyItem("a", "1", None, "$\\boxed{1}$"), V.VerifyItem("b", "2", None, "$\\boxed{3}$")]
    assert [r["status"] for r in V.verify_many(items, timeout_s=0.5, workers=1)] == ["timeout", "timeout"]
    assert 0.5 * V.RETRY_FACTOR > 1.0
    assert [r["status"] for r in V.verify_stable(items, timeout_s=0.5, workers=1)] == ["verified", "wrong"]
    monkeypatch.setattr(V, "verify_one", _sleepy)
    assert V.verify_stable(items[:1], timeout_s=0.3, workers=1)[0]["status"] == "timeout"


@pytest.mark.parametrize("kw", [{"timeout_s": 0}, {"workers": 0}])
def test_verify_many_rejects_bad_parameters(kw):
    with pytest.raises(ValueError):
        V.verify_many([], **kw)
