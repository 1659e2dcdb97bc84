"""The data claims' inputs: the 10M near-dedup corpus (benchmarks/dedup_corpus.py: re-numbered variants,
planted near-duplicates, exact ground truth) on the real sources at a small size, and the dedup adapter's
argument checks."""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import dedup_corpus as dc  # noqa: E402


def test_renumber_redraws_digit_runs_of_the_same_length_and_keeps_the_rest():
    text = "Let f(x) = 12*x**3 - 7. What is f(305)? Round to 0 decimals."
    rng = random.Random(3)
    outs = {dc.renumber(text, rng) for _ in range(50)}
    for o in outs:
        assert re.sub(r"\d", "0", o) == re.sub(r"\d", "0", text)  # same text, same digit-run lengths
        runs = re.findall(r"\d+", o)
        assert all(len(r) == 1 or r[0] != "0" for r in runs)  # no leading zero on multi-digit runs
    assert len(outs) > 45  # 9*10 * 10 * 9*10*10 * 10 draws: repeats are rare
    assert dc.renumber(text, random.Random(3)) == dc.renumber(text, random.Random(3))
    with pytest.raises(ValueError, match="no digit"):
        dc.renumber("What is x plus y?", rng)


def test_digit_share_counts_shingles_holding_a_digit():
    share = dc.digit_share(["What is 3 plus 4?", "What is the capital of France today?", ""])
    assert share[0] == 1.0  # five tokens: one word 5-gram, and it holds the digits
    assert share[1] == 0.0 and share[2] == 0.0


@pytest.fixture(scope="module")
def small_corpus():
    bases, _, _ = dc._bases(5, 0, ROOT / "benchmarks" / ".work")
    n = len(bases) + 6000 + 3000  # 6,000 variants and 3,000 planted (plant_frac chosen to give 3,000)
    texts, cols, info = dc.build(n, 5, 3000 / n, ROOT / "benchmarks" / ".work", base_generated=0)
    return bases, texts, cols, info


@pytest.mark.slow  # reads every real source and builds a 33k-row corpus with its ground truth
def test_expanded_corpus_rows_are_what_their_kind_says(small_corpus):
    from ops.curation.text import normalize

    bases, texts, cols, info = small_corpus
    kind, family, origin = cols["kind"], cols["family"], cols["origin"]
    assert len(texts) == info["n"] == len(bases) + 9000
    assert np.bincount(kind, minlength=4).tolist() == [len(bases), 0, 6000, 3000]
    # a variant is its base with other numbers (digit runs of the same lengths), never a repeat
    for i in np.flatnonzero(kind == 2)[:2000]:
        b = bases[family[i]]
        assert texts[i] != b and re.sub(r"\d", "0", texts[i]) == re.sub(r"\d", "0", b)
    background = np.flatnonzero(kind != 3)
    assert len({normalize(texts[i]) for i in background}) == len(background)
    # a planted row copies a background row of its family, in the shuffled order
    p = np.flatnonzero(kind == 3)
    assert (origin[p] >= 0).all() and (kind[origin[p]] != 3).all() and (family[origin[p]] == family[p]).all()
    assert (origin[kind != 3] == -1).all()
    assert info["bases_renumberable"] > 1000


@pytest.mark.slow  # reads every real source and builds a 33k-row corpus with its ground truth
def test_expanded_corpus_ground_truth_is_exact(small_corpus):
    from ops.curation.text import shingles

    _, texts, cols, _ = small_corpus
    pairs, jac, stats = dc.ground_truth(texts)
    assert stats["verified_pairs"] == len(pairs) > 1000
    # every reported pair holds (exact Jaccard of Crucible's shingle sets, recomputed in Python on a sample)
    rng = np.random.default_rng(0)
    for a, b in pairs[rng.choice(len(pairs), 200, replace=False)]:
        sa, sb = shingles(texts[a]), shingles(texts[b])
        assert len(sa & sb) / len(sa | sb) >= 0.8 - 1e-9
    # no pair is missed among planted rows and their origins: every planted copy within the threshold is listed
    found = {(int(a), int(b)) for a, b in pairs}
    kind, origin = cols["kind"], cols["origin"]
    checked = missed = 0
    for i in np.flatnonzero(kind == 3)[:1500]:
        o = int(origin[i])
        sa, sb = shingles(texts[i]), shingles(texts[o])
        if sa and sb and len(sa & sb) / len(sa | sb) >= 0.8 + 1e-9:
            checked += 1
            missed += (min(i, o), max(i, o)) not in found
    assert checked > 300 and missed == 0


def test_dedup_adapter_refuses_an_unknown_corpus(tmp_path):
    from benchmarks.claims.adapters import dedup

    with pytest.raises(ValueError, match="corpus 'bogus'"):
        dedup.run_seed(7, ["crucible"], tmp_path, n=10, corpus="bogus")
    with pytest.raises(ValueError, match="unknown tools"):
        dedup.run_seed(7, ["minhashx"], tmp_path, n=10)


@pytest.mark.slow  # waits out a 30 s limit
def test_a_tool_cut_by_the_time_limit_keeps_its_measured_cold_time(tmp_path, monkeypatch):
    """A worker whose warm call runs past the limit (a real subprocess, killed by _run_tool): the cold time
    the worker measured comes back, not the limit (run_seed reports it with ``timed_out: 1``)."""
    import json

    from benchmarks.claims.adapters import dedup

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": f"problem {i} of the test"}) + "\n" for i in range(50)))

    # a worker module whose 'crucible' tool sleeps in its warm call: run it through _run_tool's real subprocess
    mod = tmp_path / "slowtool.py"
    mod.write_text(
        "import sys, time\n"
        "from pathlib import Path\n"
        "from benchmarks.claims.adapters import dedup\n"
        "calls = []\n"
        "def tool(texts):\n"
        "    calls.append(1)\n"
        "    if len(calls) > 1:\n"
        "        time.sleep(600)\n"
        "    return [True] * len(texts), {}\n"
        "dedup._crucible = tool\n"
        "dedup.worker('crucible', Path(sys.argv[2]), Path(sys.argv[3]))\n")
    real_popen = dedup.subprocess.Popen

    def popen(cmd, **kw):
        cmd = [cmd[0], str(mod), *cmd[-3:]]
        kw["env"] = {**kw["env"], "PYTHONPATH": str(ROOT)}
        return real_popen(cmd, **kw)

    monkeypatch.setattr(dedup.subprocess, "Popen", popen)
    r = dedup._run_tool("crucible", corpus, tmp_path, timeout_s=30)
    assert r is not None and "cold_only" in r and 0 < r["cold_only"]["cold_s"] < 30
