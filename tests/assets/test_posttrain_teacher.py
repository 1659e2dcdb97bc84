"""Teacher synthesis: a question the teacher writes is kept only when an independent solve verifies
against its answer, and it still passes the dedup/decontamination/verification filter."""

import logging
from types import SimpleNamespace

import polars as pl

from assets.posttrain import SynthesisConfig, _teacher_items
from ops.posttrain.synthesis import ItemFilter, Retriever
from resources.lake import LakeResource
from resources.teacher import TeacherResource
from tests.stub_openai import StubOpenAI

TARGETS = [{"module": "numbers__place_value", "difficulty": 1, "failure_mass": 3.0, "regions": ["ann:x"]}]
FAILED = pl.DataFrame({"module": ["numbers__place_value"], "problem": ["What is the tens digit of 4321?"]})


def _run(tmp_path, reply: str, n: int = 3):
    ctx = SimpleNamespace(log=logging.getLogger("test"))
    docs = ["The tens digit of 4321 is 2.", "Place value: units, tens, hundreds."]
    cfg = SynthesisConfig(teacher_requests=n, workers=1)
    with StubOpenAI(reply=reply) as stub:
        return _teacher_items(ctx, cfg, TARGETS, FAILED, Retriever(docs), docs, LakeResource(root=str(tmp_path)),
                              TeacherResource(base_url=stub.base_url, model="stub", concurrency=2))


def test_agreeing_teacher_items_are_kept_once(tmp_path):
    items, stats = _run(tmp_path, "Question: What is the tens digit of 98765?\nAnswer: \\boxed{6}")
    assert stats == {"requested": 3, "parsed": 3, "agreed": 3}
    assert items[0]["answer"] == "6" and items[0]["origin"] == "teacher" and items[0]["module"] == "numbers__place_value"
    kept, rejected, rep = ItemFilter(["What is the tens digit of 4321?"], [], workers=1).run(items)
    assert len(kept) == 1 and rep.rejected["duplicate_exact"] == 2  # the stub says the same thing thrice


def test_unparseable_teacher_output_gives_no_item(tmp_path):
    items, stats = _run(tmp_path, "Sure! Here is a nice exercise for you.", n=2)
    assert items == [] and stats["parsed"] == 0


def _check_lake(tmp_path, stage1_right: bool, loss: float) -> LakeResource:
    import json

    lake = LakeResource(root=str(tmp_path / "lake"))
    folder = lake.base / "sft_checkpoint" / "model"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"curve": [{"step": 1, "loss": 2.0}, {"step": 2, "loss": loss}]}))
    ev = pl.DataFrame({"item_id": ["a", "b"], "answer": ["1", "2"], "answer_type": ["numeric"] * 2, "slice": ["programmatic"] * 2})
    lake.write(ev, "sft_checkpoint", name="eval.parquet", refresh=False)
    pl.DataFrame({"item_id": ["a", "b"], "prediction": ["\\boxed{7}", "\\boxed{7}"], "response_loss": [1.0, 1.0]}).write_parquet(
        folder / "predictions_init.parquet")
    lake.write(ev.with_columns(correct=pl.Series([stage1_right, False])), "sft_checkpoint", refresh=False)
    return lake


def test_learned_check_blocks_a_student_that_learned_nothing_or_diverged(tmp_path):
    from assets.posttrain import sft_checkpoint_learned

    assert sft_checkpoint_learned(lake=_check_lake(tmp_path / "ok", True, 1.0)).passed
    assert not sft_checkpoint_learned(lake=_check_lake(tmp_path / "flat", False, 1.0)).passed
    bad = sft_checkpoint_learned(lake=_check_lake(tmp_path / "nan", True, float("nan")))
    assert not bad.passed and "loss finite: False" in bad.description
