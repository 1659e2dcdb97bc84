"""The shared, content-addressed cache of benchmark embeddings (ops.curation.decontam.BenchmarkEmbeddingCache): a
fresh lake does not embed the benchmark texts again, concurrent writers both succeed, a corrupt file is recomputed."""

import multiprocessing as mp
import warnings

import numpy as np
import polars as pl
import pytest

from ops.curation.decontam import (EMBEDDING_MODEL, BenchmarkEmbeddingCache, DecontamConfig, Decontaminator,
                                   MiniLMEmbedder, text_key)

TEXTS = [f"benchmark item number {i}: how many apples are left after eating {i} of them?" for i in range(100)]


def unit_vectors(keys: list[str]) -> dict:
    """A deterministic unit vector per key (seeded by the key), so two processes compute the same ones."""
    out = {}
    for k in keys:
        v = np.random.default_rng(int(k[:8], 16)).normal(size=384).astype(np.float32)
        out[k] = v / np.linalg.norm(v)
    return out


def _writer(root: str, lo: int, hi: int, rounds: int, start) -> None:
    """Subprocess body: wait for the start event, then add keys [lo, hi) in ``rounds`` writes."""
    cache = BenchmarkEmbeddingCache(TEXTS, EMBEDDING_MODEL, 128, root)
    keys = [text_key(t) for t in TEXTS[lo:hi]]
    if not start.wait(60):
        raise SystemExit(3)
    step = max(1, len(keys) // rounds)
    for i in range(0, len(keys), step):
        assert cache.add(unit_vectors(keys[i : i + step]))


def test_concurrent_writers_both_succeed_and_the_file_holds_the_union(tmp_path):
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), lo, hi, 10, start)) for lo, hi in ((0, 70), (30, 100))]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    cache = BenchmarkEmbeddingCache(TEXTS, EMBEDDING_MODEL, 128, tmp_path)
    got = cache.read()
    want = unit_vectors([text_key(t) for t in TEXTS])
    assert set(got) == set(want)  # nothing lost: each write merged what the other had written
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert pl.read_parquet(cache.path)["key"].to_list() == sorted(want)  # sorted: same embeddings, same file


def test_file_is_content_addressed(tmp_path):
    a = BenchmarkEmbeddingCache(TEXTS, EMBEDDING_MODEL, 128, tmp_path)
    assert BenchmarkEmbeddingCache(list(reversed(TEXTS)), EMBEDDING_MODEL, 128, tmp_path).path == a.path
    assert BenchmarkEmbeddingCache(TEXTS[:-1], EMBEDDING_MODEL, 128, tmp_path).path != a.path
    assert BenchmarkEmbeddingCache(TEXTS, EMBEDDING_MODEL, 64, tmp_path).path != a.path
    with pytest.raises(ValueError, match="not a text of this benchmark set"):
        a.add(unit_vectors([text_key("not a benchmark text")]))


@pytest.mark.parametrize("damage", ["garbage", "wrong_model", "not_unit", "stray_key"])
def test_invalid_file_is_ignored_with_a_warning(tmp_path, damage):
    cache = BenchmarkEmbeddingCache(TEXTS, EMBEDDING_MODEL, 128, tmp_path)
    keys = [text_key(t) for t in TEXTS[:5]]
    cache.add(unit_vectors(keys))
    assert len(cache.read()) == 5
    df = pl.read_parquet(cache.path)
    if damage == "garbage":
        cache.path.write_bytes(cache.path.read_bytes()[:100])
    else:
        if damage == "wrong_model":
            df = df.with_columns(model=pl.lit("another-model"))
        elif damage == "not_unit":
            df = df.with_columns(vector=pl.Series(df["vector"].to_numpy() * 2, dtype=df["vector"].dtype))
        else:
            df = df.with_columns(key=pl.Series([text_key("stray")] + df["key"].to_list()[1:]))
        df.write_parquet(cache.path)
    with pytest.warns(UserWarning, match=str(cache.path.name)):
        assert cache.read() == {}
    cache.add(unit_vectors(keys[:2]))  # the next write replaces the bad file
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sorted(cache.read()) == sorted(keys[:2])


@pytest.fixture(scope="module")
def small_case(benchmark):
    """40 GSM8K test items and a rule-based rephrasing of each of the first four (names, synonyms, sentence order:
    ops.curation.decontam_set.rephrase_deep), so the semantic layer's prefilter keeps pairs and it embeds both rows
    and items."""
    import random

    from ops.curation.decontam_set import rephrase_deep

    items = [b for b in benchmark if b["benchmark"] == "gsm8k_test"][:40]
    rng = random.Random(0)
    rows = [rephrase_deep(b["problem"], rng) for b in items[:4]]
    return items, rows


def test_second_detector_encodes_no_benchmark_text(tmp_path, small_case):
    """A fresh lake (its own per-lake cache) with the shared cache present embeds only its training rows."""
    items, rows = small_case
    shared = tmp_path / "shared"
    first = MiniLMEmbedder(128, cache_path=tmp_path / "lake1" / "embeddings.parquet", shared_dir=shared)
    det1 = Decontaminator(items, DecontamConfig(), embedder=first)
    flags1 = det1.run(rows)
    n_items, n_texts = det1.stats["semantic"]["benchmark_texts"], det1.stats["semantic"]["texts_embedded"]
    assert n_items > 0 and first.encoded_benchmark == n_items and first.encoded == n_texts
    second = MiniLMEmbedder(128, cache_path=tmp_path / "lake2" / "embeddings.parquet", shared_dir=shared)
    det2 = Decontaminator(items, DecontamConfig(), embedder=second)
    assert det2.run(rows) == flags1
    assert second.encoded_benchmark == 0 and second.encoded == n_texts - n_items  # only the rows
    assert second.benchmark_cache_paths == first.benchmark_cache_paths
    # the benchmark texts went to the shared file, not the lake's
    lake_keys = set(pl.read_parquet(tmp_path / "lake1" / "embeddings.parquet")["key"].to_list())
    assert not lake_keys & set(BenchmarkEmbeddingCache(det1.semantic_item_texts(), EMBEDDING_MODEL, 128, shared).keys)


def test_corrupt_shared_file_is_recomputed(tmp_path, small_case):
    items, rows = small_case
    shared = tmp_path / "shared"
    first = MiniLMEmbedder(128, shared_dir=shared)
    det1 = Decontaminator(items, DecontamConfig(), embedder=first)
    flags1 = det1.run(rows)
    path = first.benchmark_cache_paths[0]
    with open(path, "r+b") as f:  # flip bytes in the middle of the file
        f.seek(200)
        f.write(b"\x00" * 64)
    again = MiniLMEmbedder(128, shared_dir=shared)
    with pytest.warns(UserWarning, match="recomputed"):
        assert Decontaminator(items, DecontamConfig(), embedder=again).run(rows) == flags1
    assert again.encoded_benchmark == det1.stats["semantic"]["benchmark_texts"] > 0
    third = MiniLMEmbedder(128, shared_dir=shared)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        Decontaminator(items, DecontamConfig(), embedder=third).run(rows)
    assert third.encoded_benchmark == 0
