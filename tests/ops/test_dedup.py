"""Near/exact dedup: every near_dedup case of tests/cases/curation.json, plus the datasketch contract."""

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


# --- the compiled shingle kernel against a plain-Python reference of the same hashes -----------------------------

_M64 = (1 << 64) - 1


def _ref_hash(data: bytes) -> int:
    """FNV-1a 64 + MurmurHash3 fmix64, as documented in ops.curation.minhash_native."""
    h = 0xCBF29CE484222325
    for c in data:
        h = ((h ^ c) * 0x100000001B3) & _M64
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & _M64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & _M64
    return h ^ (h >> 33)


def _ref_values(text: str, word_n: int = 5, char_n: int = 3) -> list[int]:
    from ops.curation.text import char_ngrams, tokens

    toks = tokens(text)
    if len(toks) < word_n:
        return [_ref_hash(g.encode("utf-8")) | (1 << 63) for g in char_ngrams(text, char_n)]
    th = [_ref_hash(t.encode("utf-8")) for t in toks]
    out = []
    for k in range(len(toks) - word_n + 1):
        g = 0
        for j in range(word_n):
            g = (g * 0x9E3779B97F4A7C15 + th[k + j]) & _M64
        out.append(g & ((1 << 63) - 1))
    return out


TRICKY = [
    "Find x.", "", "   ", "a", "ab", "abc", "abcd", "Compute $7!$", "one two three four", "one two three four five",
    "A rectangle has a length of 12 cm and a width of 5 cm. What is its diagonal?",
    "Simplify \\frac{3}{4} + \\dfrac{1}{2}\\cdot\\sqrt{2}  \\ 3 \\\\ x_1^2 snake_case_word",
    "tabs\tand\nnewlines\x0band\x0cfeeds\rand\x1cfile\x1dgroup\x1erecord\x1funit sep", "NUL\x00in \x01the\x7f middle of text",
    "UPPER Case MiXeD 123abc ABC_def", "Ünïcode tèxt with \\frac{1}{2} × 3 ≤ 4 and more words here", "é", "Ñ x",
    "ﬁve ligature ｆｕｌｌｗｉｄｔｈ words are NFKC folded here", "  leading and   trailing   spaces   ",
    "\\alpha\\beta\\gamma \\ \\1 \\_ end of the line", "a\u00a0b\u2003c non breaking and em spaces between words",
    "\U0001d465 + 1 = 2 \U0001f642 astral code points here", "\U0001f642", "ΣΑΣ ΣΟΦΟΣ Straße İstanbul ǅ title case",
    "e\u0301 combining acute and \u212b angstrom sign", "x\u0085y\u2028z\u3000w next line, line separator, ideographic space",
    "٣ arabic-indic digit ² superscript ½ fraction",
]


@pytest.mark.parametrize("word_n,char_n", [(5, 3), (3, 2), (1, 1)])
def test_shingle_kernel_equals_python_reference(word_n, char_n):
    rng = np.random.default_rng(word_n)
    alphabet = [chr(c) for c in range(128)] + ["é", "ß", "×", "\u00a0", "\u2028", "İ", "\u0301", "\U0001f642", "ｆ", "ﬁ", "Σ"]
    fuzz = ["".join(rng.choice(alphabet, size=rng.integers(0, 40))) for _ in range(300)]
    fuzz += ["".join(rng.choice(list("ab \\{}1_\t"), size=rng.integers(0, 30))) for _ in range(300)]
    texts = TRICKY + fuzz
    batch = minhash.shingle_batch(texts, word_n=word_n, char_n=char_n)
    for i, t in enumerate(texts):
        assert batch.doc(i).tolist() == _ref_values(t, word_n, char_n), repr(t)


def _band_candidates_numpy(sig, bands, rows):
    """The former all-numpy banding (sort per band, all pairs of each run), as the reference."""
    n = sig.shape[0]
    mix = np.uint64(0x9E3779B97F4A7C15)
    codes = set()
    for band in range(bands):
        key = np.zeros(n, dtype=np.uint64)
        for j in range(band * rows, (band + 1) * rows):
            key = key * mix + sig[:, j].astype(np.uint64)
        groups: dict[int, list[int]] = {}
        for d, k in enumerate(key.tolist()):
            groups.setdefault(k, []).append(d)
        for g in groups.values():
            codes.update((a, b) for x, a in enumerate(g) for b in g[x + 1 :])
    return np.array(sorted(codes), dtype=np.int64).reshape(-1, 2)


def test_band_candidates_equal_reference_on_colliding_signatures():
    rng = np.random.default_rng(3)
    sig = rng.integers(0, 3, size=(400, 12), dtype=np.uint32)  # few values: many buckets of many members
    for bands, rows in [(1, 12), (3, 4), (6, 2), (12, 1)]:
        assert np.array_equal(minhash.band_candidates(sig, bands, rows), _band_candidates_numpy(sig, bands, rows))


def test_star_clusters_never_chain():
    # edges A-B (0.9), B-C (0.85); A first: B goes to A, C stays (not verified against A)
    keep, surv, sim, absorbed = minhash.star_clusters(3, np.array([[0, 1], [1, 2]]), np.array([0.9, 0.85]), np.array([0, 1, 2]))
    assert keep.tolist() == [True, False, True] and surv.tolist() == [0, 0, 2] and absorbed == 1
    keep, surv, sim, _ = minhash.star_clusters(3, np.array([[0, 1], [1, 2]]), np.array([0.9, 0.85]), np.array([1, 0, 2]))
    assert keep.tolist() == [False, True, False] and surv.tolist() == [1, 1, 1] and sim.tolist() == [0.9, 1.0, 0.85]


def test_near_dedup_is_deterministic_and_thread_count_free():
    import numba

    base = [f"problem {i}: compute the sum of {i} and {i + 7} then divide the result by {i % 5 + 2}" for i in range(300)]
    texts = base + [t.replace("compute", "Compute") + " ." for t in base[::3]]
    ref = run(texts)
    assert (~ref.keep).sum() == 100
    was = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = run(texts)
    finally:
        numba.set_num_threads(was)
    assert np.array_equal(ref.keep, one.keep) and np.array_equal(ref.survivor, one.survivor)
    assert np.array_equal(minhash.shingle_batch(texts).values, minhash.shingle_batch(texts).values)


def test_shingle_kernel_splits_every_bmp_code_point_like_re():
    cps = [c for c in range(0x80, 0x10000) if not 0xD800 <= c < 0xE000]
    texts = [f"x{chr(c)}y {chr(c)}{chr(c)}" for c in cps]
    batch = minhash.shingle_batch(texts, word_n=1, char_n=1)
    for i, t in enumerate(texts):
        assert batch.doc(i).tolist() == _ref_values(t, 1, 1), hex(cps[i])
