"""The curation work moved out of the assets (issue 41.2): the decontamination tables and the MATH-500
ground truth, the teacher judge, the SFT rows, card and stratum histogram, the shard split and the
shards' flags."""

import polars as pl
import pytest

from ops.curation.decontam.judge import teacher_judge
from ops.curation.decontam.report import decontam_tables, math500_truth
from ops.curation.decontam_shard import flags_of_shards, parquet_bytes
from ops.curation.sampling import dataset_card, sft_rows, stratum_histogram
from ops.curation.shard import rows_of_shard

BENCH = pl.DataFrame({"benchmark": ["math500", "math500", "gsm8k_test"], "item_id": ["m/0", "m/1", "g/0"],
                      "problem": ["What is 2+3?", "Find the area of a unit circle.", "Tom has 3 apples and eats one."]})
DF = pl.DataFrame({"problem_id": ["a", "b", "c", "d"], "source": ["math_test", "math_test", "math_test", "arc"],
                   "record": [0, 1, 2, 0],
                   "problem": ["What is 2+3?", "What is 2 + 3 ?!", "Solve x^2 = 4.", "Which gas do plants absorb?"]})


def _flag(item: str, layer: str = "exact") -> dict:
    return {"benchmark": item.split("/")[0].replace("m", "math500"), "item_id": item, "layer": layer, "score": 1.0,
            "needs_review": False, "judge_reply": None}


def test_decontam_tables_and_math500_truth():
    # a: verbatim MATH-500 item (true positive); b: a near copy flagged too; c: a clean MATH row missed by nothing
    flags = [_flag("m/0"), _flag("m/0", "ngram"), None, None]
    kept, report, mask = decontam_tables(DF, BENCH, flags)
    assert kept["problem_id"].to_list() == ["c", "d"] and mask.to_list() == [True, True, False, False]
    assert report["benchmark_problem"].to_list() == ["What is 2+3?"] * 2 and report["layer"].to_list() == ["exact", "ngram"]
    truth = math500_truth(DF, BENCH, flags, report)
    # ground truth on math_test rows: only a is verbatim; b is removed but is not the item's text
    assert truth.scores["recall"] == 1.0 and truth.scores["precision"] == pytest.approx(0.5)
    assert truth.near_duplicates["problem_id"].to_list() == ["b"]
    assert truth.clean_pool == ["What is 2 + 3 ?!", "Solve x^2 = 4.", "Tom has 3 apples and eats one."]


def test_teacher_judge_asks_once_per_pair_and_fails_closed_on_errors(tmp_path):
    from resources.teacher import TeacherResource
    from tests.stub_openai import StubOpenAI

    pairs = [("What is 2+3?", "What is 2+3?"), ("Solve x.", "Find y.")]
    with StubOpenAI(script=["ok"], default=500, reply="yes") as stub:
        res = TeacherResource(base_url=stub.base_url, model="stub", concurrency=1)
        replies = teacher_judge(lambda: res.session(tmp_path / "cache.sqlite"))(pairs)
    assert replies[0] == "yes" and replies[1] is None  # the failed request is None: the detector fails closed


def test_sft_rows_card_and_histogram():
    verified = pl.DataFrame({"problem_id": ["p1", "p2", "p3"], "source": ["s"] * 3, "record": [0, 1, 2],
                             "domain": ["math", "math", "physics"], "difficulty": [1, 1, 2], "answer_type": ["numeric"] * 3,
                             "problem": ["1+1?", "2+2?", "F=ma?"], "answer": ["2", "4", "yes"],
                             "response": ["\\boxed{2}", "\\boxed{4}", "\\boxed{yes}"], "response_source": ["teacher"] * 3,
                             "status": ["verified"] * 3})
    rows = sft_rows(verified.head(2))
    assert rows["messages"][1].to_list() == [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "\\boxed{4}"}]
    assert "status" not in rows.columns
    labels, series = stratum_histogram(verified, rows)
    assert labels == ["math|1|numeric", "physics|2|numeric"]
    assert series == {"verified (before)": [2, 1], "sft_dataset (after)": [2, 0]}
    card = dataset_card(rows, {"distilled_problems": {"data_version": "abc", "rows": 3}}, "run-1")
    assert "Rows: 2. Dagster run: `run-1`." in card and "| distilled_problems | abc | 3 |" in card
    assert "| math | 1 | numeric | 2 |" in card and "physics" not in card.split("## Strata")[1]


def test_shards_partition_the_rows_and_their_flags_rebuild_the_table():
    df = pl.DataFrame({"problem": [f"problem number {i}" for i in range(40)]}).with_row_index("ordinal")
    parts = [rows_of_shard(df, 4, f"{k:03d}") for k in range(4)]
    assert sorted(o for p in parts for o in p["ordinal"].to_list()) == list(range(40))
    assert all(p.height < 40 for p in parts)
    cols = {"ordinal": [3, 7], "benchmark": ["math500"] * 2, "item_id": ["m/0", "m/1"], "layer": ["exact", "ngram"],
            "score": [1.0, 0.9], "needs_review": [False, True], "judge_reply": [None, None], "round": [1, 1]}
    table = pl.DataFrame(cols, schema_overrides={"judge_reply": pl.String})
    flags = flags_of_shards(10, [table.head(1), table.tail(1)])
    assert [i for i, f in enumerate(flags) if f] == [3, 7] and flags[7]["layer"] == "ngram" and flags[7]["needs_review"]
    with pytest.raises(IndexError, match="row ordinal 7; the table has 5 rows"):
        flags_of_shards(5, [table])
    assert parquet_bytes(table) > 0
