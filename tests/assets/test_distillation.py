"""The distillation asset: a killed teacher run resumes from the response cache; failures are
recorded as failed, never as wrong answers."""

import sqlite3
import subprocess
import sys
import time

import dagster as dg
import polars as pl

from assets.distillation import distilled_problems
from resources.lake import LakeResource
from resources.teacher import TeacherResource
from tests.conftest import ROOT
from tests.stub_openai import StubOpenAI

ROWS = 8
K = 2


def _seed_lake(root) -> LakeResource:
    lake = LakeResource(root=str(root))
    rows = [{"problem_id": f"p{i}", "source": "user", "record": str(i), "problem": f"What is {i} + {i}?", "solution": None,
             "answer": str(2 * i), "choices": None, "subject": None, "level": None, "split": "user", "domain": "math",
             "difficulty": 1, "answer_type": "numeric", "text_md5": None} for i in range(ROWS)]
    lake.write(pl.DataFrame(rows, schema_overrides={"choices": pl.List(pl.String)}), "decontaminated_problems")
    return lake


def _run_config():
    return {"ops": {"distilled_problems": {"config": {"teacher_max_rows": ROWS, "k_samples": K, "workers": 1}}}}


def _cached_ok(path) -> int:
    try:
        with sqlite3.connect(path, timeout=5) as db:
            return db.execute("select count(*) from responses where status = 'ok'").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def test_killed_run_resumes_without_asking_again(tmp_path):
    lake = _seed_lake(tmp_path)
    cache = lake.base / "teacher" / "cache.sqlite"
    with StubOpenAI(delay_s=0.3, reply="so the answer is \\boxed{0}") as stub:
        script = (
            "import dagster as dg\n"
            "from assets.distillation import distilled_problems\n"
            "from resources.lake import LakeResource\n"
            "from resources.teacher import TeacherResource\n"
            f"dg.materialize([distilled_problems], resources={{'lake': LakeResource(root={str(tmp_path)!r}),"
            f" 'teacher': TeacherResource(base_url={stub.base_url!r}, model='stub', concurrency=1)}},"
            f" run_config={_run_config()!r})\n"
        )
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 90
        while _cached_ok(cache) < 5 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        proc.kill()
        proc.wait(timeout=30)
        cached = _cached_ok(cache)
        assert 5 <= cached < ROWS * K, cached
        assert not lake.exists("distilled_problems")  # killed mid-way: nothing half-written
        before = stub.requests
        res = dg.materialize([distilled_problems], run_config=_run_config(), resources={
            "lake": lake, "teacher": TeacherResource(base_url=stub.base_url, model="stub", concurrency=2)})
        assert res.success
        asked = stub.requests - before
    assert asked == ROWS * K - cached
    teacher = [m for m in res.asset_materializations_for_node("distilled_problems") if m.asset_key.path == ["teacher_responses"]][0]
    client = teacher.metadata["client"].value
    assert client["http_requests"] == ROWS * K - cached and client["cache_hits"] == cached
    samples = lake.read("teacher_responses")
    assert samples.height == ROWS * K
    # the stub always answers 0: only p0 (0 + 0) verifies
    out = lake.read("distilled_problems")
    assert out.filter(pl.col("status") == "verified")["problem_id"].to_list() == ["p0"]
    assert out.filter(pl.col("problem_id") == "p0")["response_source"].item() == "teacher:stub"
    assert out.filter(pl.col("problem_id") == "p1")["pass_rate"].item() == 0.0


def test_failed_requests_are_failed_not_wrong(tmp_path):
    lake = _seed_lake(tmp_path)
    with StubOpenAI(default=503) as stub:
        res = dg.materialize([distilled_problems], run_config=_run_config(), resources={
            "lake": lake, "teacher": TeacherResource(base_url=stub.base_url, model="stub", max_retries=1)})
    assert res.success
    samples = lake.read("teacher_responses")
    assert set(samples["status"].to_list()) == {"failed"}
    out = lake.read("distilled_problems")
    assert set(out["status"].to_list()) == {"needs_teacher"}
    assert out["n_failed"].to_list() == [K] * ROWS and out["pass_rate"].null_count() == ROWS


def test_reference_path_never_lets_a_solution_verify_itself(tmp_path):
    lake = LakeResource(root=str(tmp_path))
    base = {"source": "user", "record": "r", "choices": None, "subject": None, "level": None, "split": "user",
            "domain": "math", "difficulty": 1, "answer_type": "numeric", "text_md5": None}
    rows = [
        dict(base, problem_id="good", problem="What is 3+4?", answer="7", solution="$3+4=\\boxed{7}$"),
        dict(base, problem_id="corrupt", problem="What is 3+4?", answer="\\frac{", solution="$3+4=\\boxed{8}$"),
        dict(base, problem_id="no_answer", problem="What is 3+5?", answer=None, solution="$3+5=\\boxed{8}$"),
        dict(base, problem_id="wrong", problem="What is 3+6?", answer="9", solution="$3+6=\\boxed{10}$"),
    ]
    lake.write(pl.DataFrame(rows, schema_overrides={"choices": pl.List(pl.String)}), "decontaminated_problems")
    res = dg.materialize([distilled_problems], resources={"lake": lake, "teacher": TeacherResource()},
                         run_config={"ops": {"distilled_problems": {"config": {"teacher": False, "workers": 1}}}})
    assert res.success
    out = {r["problem_id"]: r for r in lake.read("distilled_problems").iter_rows(named=True)}
    assert out["good"]["status"] == "verified" and out["good"]["response_source"] == "reference"
    assert out["no_answer"]["status"] == "needs_teacher" and out["no_answer"]["response"] is None
    assert out["wrong"]["status"] == "needs_teacher"
    q = lake.read("distilled_problems_quarantine")
    assert q["problem_id"].to_list() == ["corrupt"] and "disagrees" in q["reason"].item()


# ------------------------------------------------------------------------------------------ seeds


def test_every_teacher_request_carries_its_derived_seed_and_unreported_seeding_is_said(tmp_path):
    from ops.curation.distill import teacher_seed

    lake = _seed_lake(tmp_path)
    with StubOpenAI(reply="\\boxed{0}") as stub:  # an endpoint that says nothing about seeds
        res = dg.materialize([distilled_problems], run_config=_run_config(), resources={
            "lake": lake, "teacher": TeacherResource(base_url=stub.base_url, model="stub")})
        bodies = stub.bodies
    assert res.success
    sent = sorted((b["messages"][1]["content"].split("?")[0], b["seed"]) for b in bodies)
    want = sorted((f"What is {i} + {i}", teacher_seed(0, f"p{i}", s)) for i in range(ROWS) for s in range(K))
    assert sent == want
    samples = lake.read("teacher_responses")
    assert samples.filter(pl.col("problem_id") == "p3", pl.col("sample_index") == 1)["seed"].item() == teacher_seed(0, "p3", 1)
    for m in res.asset_materializations_for_node("distilled_problems"):
        if m.asset_key.path in (["distilled_problems"], ["teacher_responses"]):
            assert m.metadata["teacher_seeded"].value is False and m.metadata["teacher_system_fingerprints"].value == []


def _fresh_lake_with_upstream(root) -> LakeResource:
    """Two problems for the real teacher (simple sums it solves at 40 tokens) and one with a
    verified reference solution, written as every table sft_dataset's lineage reads."""
    lake = LakeResource(root=str(root))
    base = {"source": "user", "record": "r", "choices": None, "subject": None, "level": None, "split": "user",
            "domain": "math", "difficulty": 1, "answer_type": "numeric", "text_md5": None}
    rows = [dict(base, problem_id="one", problem="What is $1+1$?", answer="2", solution=None),
            dict(base, problem_id="two", problem="What is $2+2$?", answer="4", solution=None),
            dict(base, problem_id="ref", problem="What is $3+4$?", answer="7", solution="$3+4=\\boxed{7}$")]
    df = pl.DataFrame(rows, schema_overrides={"choices": pl.List(pl.String)})
    for name in ("annotated_problems", "exact_deduped_problems", "near_deduped_problems", "decontaminated_problems"):
        lake.write(df, name, refresh=False)
    return lake


def test_distillation_is_reproducible_across_fresh_lakes_with_the_real_teacher(tmp_path):
    """Same input, same seed, two fresh lakes (no shared response cache), the embedded teacher
    sampling at temperature 0.7: the same data versions. Unseeded sampling gives other texts."""
    from assets.curation import sft_dataset

    cfg = {"ops": {"distilled_problems": {"config": {"teacher_max_rows": 2, "k_samples": 2, "max_tokens": 40, "workers": 1}},
                   "sft_dataset": {"config": {"target_size": 3, "stratum_floor": 0}}}}
    versions = []
    for run in ("a", "b"):
        lake = _fresh_lake_with_upstream(tmp_path / run)
        res = dg.materialize([distilled_problems, sft_dataset], run_config=cfg,
                             # one long wait per request, no retry: on a CPU-starved machine a retry of a
                             # timed-out request only queues a second copy behind the first on the server
                             resources={"lake": lake, "teacher": TeacherResource(concurrency=4, timeout_s=900, max_retries=0)})
        assert res.success
        mats = {m.asset_key.path[-1]: m for m in res.get_asset_materialization_events()
                for m in [m.event_specific_data.materialization]}
        # every request answered (a request that times out, e.g. on a starved CPU, has no seed to
        # report: teacher_seeded is then absent, and the failure names the errors instead of a KeyError)
        client = mats["teacher_responses"].metadata["client"].value
        errors = lake.read("teacher_responses")["error"].drop_nulls().unique().to_list()
        assert client["failed"] == 0, f"lake {run}: {client['failed']} teacher requests failed: {errors}"
        assert mats["distilled_problems"].metadata["teacher_seeded"].value is True
        fps = mats["teacher_responses"].metadata["teacher_system_fingerprints"].value
        assert len(fps) == 1 and fps[0].startswith("crucible-embedded-")
        versions.append({k: mats[k].metadata["data_version"].value for k in ("teacher_responses", "distilled_problems", "sft_dataset")})
        out = lake.read("distilled_problems")
        # the teacher's text is part of the data: at least one sum is answered by a verified teacher sample
        assert out["response_source"].str.starts_with("teacher:").sum() >= 1, out.select("problem_id", "n_verified")
    assert versions[0] == versions[1]
