"""Real sources read from installed packages, and a user's file with every kind of bad row."""

import json

import polars as pl
import pytest

from ops.curation import sources as S
from tests.conftest import BAD_LINES


def test_builtin_sources_have_expected_sizes(math_test_rows, benchmark):
    assert len(math_test_rows) == 5000
    assert {r["subject"] for r in math_test_rows} == set(S.MATH_SUBJECTS)
    counts = {}
    for b in benchmark:
        counts[b["benchmark"]] = counts.get(b["benchmark"], 0) + 1
    assert counts == {"math500": 500, "gsm8k_test": 1319, "mmlu_test": 14042, "arc_challenge_test": 1172, "humaneval": 164}
    m500 = {b["problem"] for b in benchmark if b["benchmark"] == "math500"}
    assert len(m500 & {r["problem"] for r in math_test_rows}) == 500


def test_arc_gold_is_always_a_letter():
    rows = S.arc()
    assert len(rows) == 869
    assert {r["answer"] for r in rows} <= set("ABCDE")


def test_problem_ids_are_stable_and_unique(math_test_rows):
    again = S.math_test()
    assert [r["problem_id"] for r in again] == [r["problem_id"] for r in math_test_rows]
    assert len({r["problem_id"] for r in math_test_rows}) == 5000


def test_limit_is_a_content_keyed_sample_not_a_prefix(math_test_rows):
    """The MATH test set is ordered by subject: a prefix of 2,000 rows holds three of its seven
    subjects; ``sample_rows`` keeps every subject near its share and the same rows in any order."""
    import random

    assert {r["subject"] for r in math_test_rows[:2000]} == {"algebra", "counting_and_probability", "geometry"}
    kept = S.sample_rows(math_test_rows, 2000)
    assert len(kept) == 2000 and kept == [r for r in math_test_rows if r in kept]       # input order kept
    for subject in S.MATH_SUBJECTS:
        share = sum(r["subject"] == subject for r in math_test_rows) / 5000
        assert abs(sum(r["subject"] == subject for r in kept) / 2000 - share) < 0.03, subject
    shuffled = list(math_test_rows)
    random.Random(0).shuffle(shuffled)
    assert {r["problem_id"] for r in S.sample_rows(shuffled, 2000)} == {r["problem_id"] for r in kept}
    assert S.sample_rows(math_test_rows, None) is math_test_rows and S.sample_rows(math_test_rows, 0) == []
    assert S.sample_rows(math_test_rows[:10], 50) == math_test_rows[:10]


def test_user_jsonl_quarantines_bad_rows_with_file_line_and_reason(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_bytes(b"\n".join(BAD_LINES) + b"\n")
    src = S.UserSource(name="mine", path=str(f), fields={"problem": "q", "answer": "a", "solution": "sol"})
    rows, quarantine = S.read_user_source(src)
    assert [r["problem"] for r in rows] == [json.loads(BAD_LINES[0])["q"], "Compute $3 \\cdot 7$ and give the product."]
    assert rows[1]["solution"].endswith("\\boxed{21}$")
    by_line = {q["line"]: q for q in quarantine}
    assert sorted(by_line) == [2, 3, 4, 5, 6, 7]
    assert by_line[2]["reason"].startswith("malformed JSON")
    assert by_line[3]["reason"].startswith("invalid UTF-8")
    assert by_line[4]["reason"] == "missing mapped field 'q'" and by_line[4]["field"] == "q"
    assert by_line[5]["reason"] == "empty problem"
    assert by_line[6]["reason"].startswith("problem too long")
    assert by_line[7]["reason"] == "record is not a JSON object"
    assert all(q["file"] == str(f) for q in quarantine)


def test_user_parquet_with_missing_mapped_field_fails_naming_it(tmp_path):
    f = tmp_path / "mine.parquet"
    pl.DataFrame({"text": ["What is 1+1?"]}).write_parquet(f)
    ok = S.UserSource(name="mine", path=str(f), fields={"problem": "text"})
    rows, q = S.read_user_source(ok)
    assert len(rows) == 1 and not q
    bad = S.UserSource(name="mine", path=str(f), fields={"problem": "text", "answer": "gold"})
    with pytest.raises(S.SourceError, match=r"\['gold'\] not in .*mine.parquet"):
        S.read_user_source(bad)


def test_missing_file_and_unmapped_problem_fail_clearly(tmp_path):
    with pytest.raises(S.SourceError, match="file not found: .*nope.jsonl"):
        S.read_user_source(S.UserSource(name="x", path=str(tmp_path / "nope.jsonl")))
    with pytest.raises(S.SourceError, match="no 'problem' entry"):
        S.UserSource(name="x", path="y.jsonl", fields={"answer": "a"})
    with pytest.raises(S.SourceError, match="clashes with a built-in"):
        S.UserSource(name="math_test", path="y.jsonl")
