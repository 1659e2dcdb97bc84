"""Near/exact dedup: every near_dedup case of shared/cases/curation.json, plus the datasketch contract."""

import numpy as np
import polars as pl
import pytest

from ops.curation import dedup, minhash
from ops.curation.text import shingles


def run(texts, rank=None, **kw):
    rank = np.arange(len(texts)) if rank is None else np.asarray(rank)
    return dedup.near_dedup(texts, rank, **kw)


def test_signatures_equal_datasketch_minhash():
    from datasketch import MinHash

    texts = ["Find x.", "A rectangle has a length of 12 cm and a width of 5 cm. What is its diagonal?", "Compute $7!$"]
    batch = minhash.shingle_batch(texts)
    sig = minhash.signatures(batch, num_perm=128, seed=1)
    h32 = batch.hash32()
    for i in range(len(texts)):
        m = MinHash(num_perm=128, seed=1, hashfunc=int, scheme=minhash.SCHEME)
        m.update_batch([int(v) for v in h32[batch.offsets[i] : batch.offsets[i + 1]]])
        assert np.array_equal(m.hashvalues, sig[i])


def test_shingle_batch_matches_python_shingles():
    texts = ["Find x.", "Janet has 3 apples and buys 5 more at the market.", "Evaluate $2^{10}$ please now"]
    batch = minhash.shingle_batch(texts)
    for i, t in enumerate(texts):
        assert len(np.unique(batch.doc(i))) == len(shingles(t))


def test_lsh_params_weight_recall_over_precision():
    assert minhash.lsh_params(0.8, 128) == (16, 8)
    assert minhash.lsh_params(0.8, 128, weights=(0.5, 0.5)) == (9, 13)  # datasketch's equal weights


def test_band_candidates_emits_every_pair_of_a_bucket():
    sig = np.array([[1, 1], [2, 2], [1, 1], [1, 1], [3, 3]], dtype=np.uint32)
    pairs = minhash.band_candidates(sig, bands=1, rows=2)
    assert pairs.tolist() == [[0, 2], [0, 3], [2, 3]]
    sig2 = np.array([[1, 5], [1, 6], [2, 6]], dtype=np.uint32)  # band 0 pairs (0,1), band 1 pairs (1,2)
    assert minhash.band_candidates(sig2, bands=2, rows=1).tolist() == [[0, 1], [1, 2]]


def test_case_dedup_short_texts(curation_cases):
    texts = [r["problem"] for r in curation_cases["dedup-short-texts"]["input"]]
    res = run(texts)
    assert res.keep.tolist() == [True, True, True, False]
    assert res.survivor[3] == 0


def test_case_dedup_cluster_keeps_one(curation_cases):
    texts = [r["problem"] for r in curation_cases["dedup-cluster-keeps-one"]["input"]]
    res = run(texts)
    assert res.keep.sum() == 2
    assert res.keep[3]  # the distinct circle problem survives
    assert res.keep[:3].sum() == 1  # exactly one of the three copies


def test_case_dedup_no_transitive_chain(curation_cases):
    case = curation_cases["dedup-no-transitive-chain"]
    texts = [r["problem"] for r in case["input"]]
    j = minhash.pair_jaccard(minhash.shingle_batch(texts), np.array([[0, 1], [1, 2], [0, 2]]))
    assert j == pytest.approx([case["exact_jaccard_word5"][k] for k in ("AB", "BC", "AC")], abs=1e-3)
    res = run(texts)  # A ranked first: A survives, B merges into A, C (J(A,C)=0.75) survives
    assert res.keep.tolist() == [True, False, True]
    for i in np.flatnonzero(~res.keep):
        assert res.similarity[i] >= 0.8
    # B first: A and C are each within 0.8 of B, so they may merge into B (LSH finds a pair at
    # J=0.867 with probability ~0.78), but only ever with B as the survivor — never A into C.
    res_b = run(texts, rank=[1, 0, 2])
    assert res_b.keep[1]
    for i in np.flatnonzero(~res_b.keep):
        assert res_b.survivor[i] == 1 and res_b.similarity[i] >= 0.8


def test_case_dedup_no_duplicates():
    texts = [f"What is {i} times {i + 3}?" for i in range(1, 101)]
    res = run(texts)
    assert res.keep.all()
    assert res.stats["verified_pairs"] == 0


def test_case_dedup_numbers_matter(curation_cases):
    texts = [r["problem"] for r in curation_cases["dedup-numbers-matter"]["input"]]
    assert run(texts).keep.all()


@pytest.mark.parametrize("threshold", [0.0, -0.1, 1.5, float("nan")])
def test_case_dedup_threshold_edges_rejected(threshold):
    with pytest.raises(minhash.DedupConfigError, match=r"threshold.*\(0, 1\]"):
        run(["a b c d e f", "a b c d e g"], threshold=threshold)


@pytest.mark.parametrize("num_perm", [0, 1])
def test_case_dedup_num_perm_edges_rejected(num_perm):
    with pytest.raises(minhash.DedupConfigError, match=r"num_perm.*\[16, 8192\]"):
        run(["a b c d e f", "a b c d e g"], num_perm=num_perm)


def test_case_dedup_threshold_one_falls_back_to_exact_sets():
    texts = ["one two three four five six", "one two three four five six", "one two three four five seven"]
    res = run(texts, threshold=1.0, num_perm=128)
    assert res.keep.tolist() == [True, False, True]
    assert res.stats["bands"] == 0  # no LSH index was built


def test_exact_dedup_survivor_rule_is_content_based():
    df = pl.DataFrame({
        "problem_id": ["b", "a", "c"],
        "source": ["mathematics_dataset", "mmlu_dev_val", "math_test"],
        "problem": ["Same  TEXT", "same text", "same text "],
        "solution": [None, None, "has a solution"],
    })
    kept, clusters = dedup.exact_dedup(df, ["math_test", "mmlu_dev_val"])
    assert kept["problem_id"].to_list() == ["c"]  # solution beats source priority and id
    assert clusters.filter(pl.col("is_survivor"))["problem_id"].to_list() == ["c"]
    shuffled, _ = dedup.exact_dedup(df.reverse(), ["math_test", "mmlu_dev_val"])
    assert shuffled["problem_id"].to_list() == ["c"]


def test_near_dedup_frame_clusters_point_at_survivor():
    base = "a rectangle has a length of 12 cm and a width of 5 cm what is the length of its diagonal in centimetres"
    df = pl.DataFrame({
        "problem_id": ["p1", "p2", "p3"],
        "source": ["arc", "math_test", "arc"],
        "problem": [base, base + " ?", "a circle has a radius of 7 cm what is its circumference in terms of pi"],
        "solution": [None, None, None],
    })
    kept, clusters, _ = dedup.near_dedup_frame(df, ["math_test", "arc"])
    assert sorted(kept["problem_id"].to_list()) == ["p2", "p3"]  # math_test outranks arc
    removed = clusters.filter(~pl.col("is_survivor")).row(0, named=True)
    assert removed["problem_id"] == "p1" and removed["cluster_id"] == "p2" and removed["jaccard"] >= 0.8


def test_pair_jaccard_equals_set_jaccard():
    rng = np.random.default_rng(0)
    words = [f"w{k}" for k in range(40)]
    texts = [" ".join(rng.choice(words, size=rng.integers(1, 30))) for _ in range(60)]
    batch = minhash.shingle_batch(texts)
    pairs = np.array([(i, j) for i in range(60) for j in range(i + 1, 60)], dtype=np.int64)
    fast = minhash.pair_jaccard(batch, pairs)
    for (i, j), f in zip(pairs.tolist(), fast.tolist()):
        a, b = set(batch.doc(i).tolist()), set(batch.doc(j).tolist())
        assert f == pytest.approx(len(a & b) / len(a | b))
