"""CPT probe mechanics: checkpoint spacing, exact mixture schedule, deterministic block streams,
corpora, and a crashed probe run resuming to the same result as an uninterrupted one."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ops.mixture import corpus
from ops.mixture.probe import BlockStream, ProbePlan, checkpoint_tokens, domain_counts, run_dir_name

ROOT = Path(__file__).resolve().parents[2]


def test_checkpoints_are_exponentially_spaced_and_end_at_the_budget():
    plan = ProbePlan(phase="cpt", data_dir="", base_dir="", out_dir="", seq_len=128, global_batch=16,
                     cpt_tokens=131_072, first_checkpoint=4_096)
    marks = checkpoint_tokens(plan)
    assert marks == [4096, 8192, 16384, 32768, 65536, 131072]
    # not a power-of-two budget: still ends exactly at the (batch-rounded) budget
    plan.cpt_tokens = 100_000
    assert checkpoint_tokens(plan)[-1] == 100_352 and checkpoint_tokens(plan)[-2] == 65536


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.25, 1 / 3, 0.5, 0.9, 1.0])
def test_domain_schedule_realises_the_ratio_exactly(ratio):
    G = 16
    counts = [domain_counts(s, G, ratio) for s in range(250)]
    assert all(0 <= c <= G for c in counts)
    for steps in (1, 7, 64, 250):  # at every prefix the total is the rounded target: error < 1 sequence
        assert abs(sum(counts[:steps]) - steps * G * ratio) <= 0.5 + 1e-9


def test_block_stream_is_deterministic_across_a_resume():
    tokens = np.arange(10 * 8, dtype=np.uint16)
    whole = BlockStream(tokens, 8, seed=3, name="t").take(25)  # crosses two epoch boundaries
    a = BlockStream(tokens, 8, seed=3, name="t")
    first = a.take(11)
    b = BlockStream(tokens, 8, seed=3, name="t")
    b.taken = 11  # what the probe does when it resumes
    np.testing.assert_array_equal(np.concatenate([first, b.take(14)]), whole)
    # each epoch is a permutation of all blocks
    assert sorted(whole[:10, 0].tolist()) == list(range(0, 80, 8))
    with pytest.raises(ValueError, match="fewer than one block"):
        BlockStream(np.arange(5, dtype=np.uint16), 8, 0, "tiny")


def test_domain_corpus_labels_subdomains_and_names_missing_columns():
    problems = pl.DataFrame({
        "problem_id": ["a", "b", "c", "d", "e"],
        "problem": ["Solve x+1=2.", "Area of a circle of radius 2?", "Derivative of x^2?", "What is 3+4?", "Which gas do plants absorb?"],
        "solution": ["x = 1", "4 pi", None, "", None],
        "answer": ["1", "4\\pi", "2x", "7", "B"],
        "subject": ["intermediate_algebra", "geometry", "calculus__differentiate", "arithmetic__add_or_sub", "high_school_biology"],
        "domain": ["math", "math", "math", "math", "biology"],
    })
    df = corpus.domain_corpus(problems)
    assert df["subdomain"].to_list() == ["algebra", "geometry", "calculus", "arithmetic", "science"]
    assert df["text"][2].endswith("Answer: 2x") and df["text"][0].endswith("x = 1")
    assert set(df["split"]) <= {"train", "val"}
    with pytest.raises(ValueError, match=r"\['subject'\]"):
        corpus.domain_corpus(problems.drop("subject"))


def _tiny_streams(tmp: Path) -> Path:
    from ops.mixture.tokens import build_streams

    rng = np.random.default_rng(0)
    words = ["the", "dress", "fits", "well", "colour", "fabric", "soft", "small", "large", "love"]
    general = pl.DataFrame({"text": [" ".join(rng.choice(words, 30)) for _ in range(300)],
                            "split": ["val" if i % 10 == 0 else "train" for i in range(300)]})
    maths = ["x + 1 = 2", "area = pi r^2", "3 * 7 = 21", "d/dx x^2 = 2x"]
    domain = pl.DataFrame({"text": [" ".join(rng.choice(maths, 12)) for _ in range(300)],
                           "subdomain": ["algebra" if i % 2 else "geometry" for i in range(300)],
                           "split": ["val" if i % 10 < 2 else "train" for i in range(300)]})
    build_streams(general, domain, tmp / "tok", vocab_size=300)
    return tmp / "tok"


def _plan(tmp: Path, data: Path, out: str, phase: str) -> Path:
    plan = ProbePlan(phase=phase, data_dir=str(data), base_dir=str(tmp / "base"), out_dir=str(tmp / out),
                     runs=[{"size": "xs", "ratio": 0.5, "key": "0.50|xs"}], seq_len=16, global_batch=4,
                     base_tokens=512, cpt_tokens=1024, first_checkpoint=128, val_seqs_general=4,
                     val_seqs_per_subdomain=4)
    p = tmp / f"{out}-{phase}.json"
    p.write_text(json.dumps(plan.__dict__))
    return p


def _launch(plan: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "ops/mixture/probe.py"), str(plan)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1", **env})


def test_crashed_probe_resumes_from_its_checkpoint_to_the_uninterrupted_result(tmp_path):
    data = _tiny_streams(tmp_path)
    assert _launch(_plan(tmp_path, data, "runs", "base")).returncode == 0
    assert (tmp_path / "base/xs/optimizer.pt").exists()

    whole = _launch(_plan(tmp_path, data, "whole", "cpt"))
    assert whole.returncode == 0, whole.stderr[-2000:]
    crashed = _launch(_plan(tmp_path, data, "runs", "cpt"), CRUCIBLE_PROBE_CRASH_AFTER_CHECKPOINTS="2")
    assert crashed.returncode == 3, crashed.stderr[-2000:]
    run = tmp_path / "runs" / run_dir_name("xs", 0.5)
    assert (run / "checkpoint.pt").exists() and not (run / "metrics.json").exists()
    resumed = _launch(_plan(tmp_path, data, "runs", "cpt"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed at step" in resumed.stderr
    got = json.loads((run / "metrics.json").read_text())["points"]
    want = json.loads((tmp_path / "whole" / run_dir_name("xs", 0.5) / "metrics.json").read_text())["points"]
    assert [p["tokens"] for p in got] == [0, 128, 256, 512, 1024]
    for g, w in zip(got, want):
        assert g["loss_general"] == pytest.approx(w["loss_general"], rel=1e-5)
        assert g["loss_domain"] == pytest.approx(w["loss_domain"], rel=1e-5)
    assert not (run / "checkpoint.pt").exists()  # a finished run keeps only its metrics

    again = _launch(_plan(tmp_path, data, "runs", "cpt"))  # same plan, same data: reused, not retrained
    assert again.returncode == 0 and "reused" in again.stderr
