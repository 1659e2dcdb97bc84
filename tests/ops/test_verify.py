"""Answer verification: every verify case of tests/cases/curation.json, timeouts, multiple choice."""

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


def _counted(item):  # the real verdict, and one line per call in the file $VERIFY_CALLS (workers are forked)
    import os

    with open(os.environ["VERIFY_CALLS"], "a") as f:
        f.write(item.key + "\n")
    return _REAL_VERIFY_ONE(item)


def test_verify_many_verifies_identical_work_once_and_keeps_every_key(monkeypatch, tmp_path):
    """Items that differ only in ``key`` are one task: 30 copies of a gold check and 10 of a verified
    prediction cost 2 calls (plus 1 for the distinct wrong one), and every key gets its own row."""
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("VERIFY_CALLS", str(calls))
    monkeypatch.setattr(V, "verify_one", _counted)
    items = ([V.VerifyItem(f"g{i}", "True", None, None, "text") for i in range(30)]
             + [V.VerifyItem(f"p{i}", "12", None, "$\\boxed{12}$") for i in range(10)]
             + [V.VerifyItem("w", "12", None, "$\\boxed{13}$")])
    res = V.verify_many(items, timeout_s=20, workers=2)
    assert [r["key"] for r in res] == [it.key for it in items]
    assert [r["status"] for r in res] == ["gold_ok"] * 30 + ["verified"] * 10 + ["wrong"]
    assert len(calls.read_text().split()) == 3
    assert V.work_key(items[0]) == V.work_key(items[29]) != V.work_key(items[30])


def _plain_answers():
    import random

    rng = random.Random(7)

    def value():
        k = rng.randrange(3)
        sign = rng.choice(["", "-", "+"])
        if k == 0:
            return sign + str(rng.randrange(10 ** rng.randrange(1, 30)))
        if k == 1:
            return f"{sign}{rng.randrange(10 ** 6)}.{rng.randrange(10 ** 6):06d}"
        return f"{sign}{rng.randrange(10 ** 6)}/{rng.randrange(1, 10 ** 6)}"

    fixed = ["0", "-2", "+17", "3.", "0.125", "-40.50", "9" * 30, "1" * 30 + "." + "2" * 30, " 12 ", "-1/156",
             "2, 7, 59, 1229", "-45, -3.4959, -3/7, -0.2", "1,2"]
    return fixed + [", ".join(value() for _ in range(rng.randrange(1, 6))) for _ in range(60)]


def test_plain_values_gold_check_decided_without_math_verify_agrees_with_parse_gold():
    """The in-process shortcut for a gold check of plain values (numbers, fractions, lists of them) gives
    what parse_gold (math-verify) says, on fixed and random answers of every shape it accepts."""
    for answer in _plain_answers():
        item = V.VerifyItem("k", answer, None, None)
        assert V.decided_without_math_verify(item), answer
        parsed, how = V.parse_gold(answer)
        assert parsed and how == "answer_wrapped", answer
        assert V.verify_one(item) == {"key": "k", "status": "gold_ok", "gold_source": how, "reason": None}


@pytest.mark.parametrize("item", [V.VerifyItem("k", "2^2^2^2", None, None), V.VerifyItem("k", "1" * 31, None, None),
                                  V.VerifyItem("k", "12", None, "12"), V.VerifyItem("k", "-3/0", None, None),
                                  V.VerifyItem("k", "216*n**2", None, None), V.VerifyItem("k", "2, 7, x", None, None)])
def test_items_that_need_math_verify_go_to_the_pool(item):
    assert not V.decided_without_math_verify(item)


@pytest.mark.parametrize("kw", [{"timeout_s": 0}, {"workers": 0}])
def test_verify_many_rejects_bad_parameters(kw):
    with pytest.raises(ValueError):
        V.verify_many([], **kw)
