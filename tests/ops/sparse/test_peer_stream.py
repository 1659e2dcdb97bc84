"""The peers section of benchmarks/sparse_bench.py: the Zipf ID stream and the collision count."""

import sys

import numpy as np
import pytest

@pytest.fixture(scope="module")
def bench():
    import benchmarks.sparse_bench as mod

    assert "torchrec" not in sys.modules          # the peer is imported only inside its own process
    return mod


def test_zipf_stream_follows_the_law_and_maps_ranks_one_to_one(bench):
    s, vocab, n = 1.15, 1000, 200_000
    ids = bench.zipf_stream(2, vocab, s, n, seed=3)
    assert ids.shape == (n, 2) and ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 1 << 40
    assert np.array_equal(ids, bench.zipf_stream(2, vocab, s, n, seed=3))
    p = np.arange(1, vocab + 1, dtype=np.float64) ** -s
    p /= p.sum()
    uniq, counts = np.unique(ids[:, 0], return_counts=True)
    assert len(uniq) <= vocab
    freq = np.sort(counts)[::-1] / n
    assert abs(freq[0] - p[0]) < 0.01 and abs(freq[9] - p[9]) < 0.005     # rank 1 ~ 0.17, rank 10 ~ 0.012
    assert not set(ids[:, 0].tolist()) & set(ids[:, 1].tolist())          # features use disjoint ids
    ranks = np.arange(1, 5001, dtype=np.uint64)                            # the multiplier is a bijection
    assert len(np.unique((ranks * np.uint64(bench._MULT)) & np.uint64(bench._MASK40))) == 5000
    with pytest.raises(ValueError, match="zipf_s"):
        bench.zipf_stream(1, vocab, 0.0, 10, seed=0)


def test_collision_stats_count_ids_that_share_a_row(bench):
    keys = np.array([1, 2, 3, 4, 5, 1, 1], dtype=np.int64)
    b = bench.bucket_of(np.array([1, 2, 3, 4, 5], dtype=np.int64), 3)
    st = bench.collision_stats(keys, 3)
    per = np.bincount(b, minlength=3)
    shared = per[b] > 1
    assert st["distinct_ids"] == 5 and st["rows_used"] == int((per > 0).sum())
    assert st["ids_sharing_a_row"] == int(shared.sum()) >= 2                  # 5 ids in 3 rows: pigeonhole
    weights = np.array([3, 1, 1, 1, 1])
    assert st["lookup_collision_rate"] == pytest.approx(weights[shared].sum() / 7)
    big = bench.collision_stats(np.arange(1000, dtype=np.int64), 1 << 40)
    assert big["ids_sharing_a_row"] == 0 and big["collision_rate"] == 0.0
