"""Batched MinHash signatures and LSH banding, with datasketch's hash family.

Source: Logics-STEM (arXiv 2601.01562) §2, stage 2 (near-duplicate removal with MinHash); Broder
(1997) for MinHash; Leskovec et al., *Mining of Massive Datasets* §3.4 for banding.

datasketch supplies the permutation family (``MinHash(num_perm, seed).permutations``) and the
false-positive/false-negative optimal (bands, rows) for a Jaccard threshold (``MinHashLSH.b/.r``).
What datasketch does one document and one shingle at a time in Python, this module does for a whole
batch in compiled kernels (:mod:`ops.curation.minhash_native`, Numba, on all cores): tokenising and
shingle hashing, signatures, banding and exact verification. A signature row here equals
``datasketch.MinHash(num_perm, seed)`` updated with the same 32-bit shingle hashes (tested), so rows
can be wrapped in ``LeanMinHash`` when needed.
"""

from __future__ import annotations

import functools
import unicodedata
from dataclasses import dataclass

import numpy as np

from .text import _TOKEN, normalize

_MAX_HASH = np.uint64((1 << 32) - 1)
SCHEME = "affine32"  # datasketch 2.0's permutation scheme: h -> a*fmix32(h) + b mod 2^32


class DedupConfigError(ValueError):
    """A dedup or MinHash parameter is outside its allowed range (the message names it and the range)."""


NUM_PERM_RANGE = (16, 8192)
"""Allowed MinHash permutations: fewer than 16 rows cannot form useful bands; 8192 bounds memory."""


def check_num_perm(num_perm: int, name: str) -> None:
    """Raise :class:`DedupConfigError` (naming ``name``) unless ``num_perm`` is an integer in
    :data:`NUM_PERM_RANGE`."""
    lo, hi = NUM_PERM_RANGE
    if isinstance(num_perm, bool) or not isinstance(num_perm, (int, np.integer)):
        raise DedupConfigError(f"{name} must be an integer in [{lo}, {hi}], got {num_perm!r}")
    if not lo <= int(num_perm) <= hi:
        raise DedupConfigError(f"{name} must be in [{lo}, {hi}], got {num_perm}")


def check_threshold(threshold: float, name: str, allow_exact: bool) -> None:
    """Raise :class:`DedupConfigError` (naming ``name``) unless ``threshold`` is a Jaccard threshold
    in (0, 1] (``allow_exact``: 1.0 means exact shingle-set dedup) or in (0, 1) (LSH only)."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not np.isfinite(threshold):
        raise DedupConfigError(f"{name} must be a number in (0, {'1]' if allow_exact else '1)'}, got {threshold!r}")
    if allow_exact and not 0.0 < float(threshold) <= 1.0:
        raise DedupConfigError(f"{name} (Jaccard threshold) must be in (0, 1], got {threshold}; "
                               "1.0 means exact shingle-set dedup")
    if not allow_exact and not 0.0 < float(threshold) < 1.0:
        raise DedupConfigError(f"{name} (Jaccard threshold) must be in (0, 1), got {threshold}")


def validate_params(threshold: float, num_perm: int) -> None:
    """Raise :class:`DedupConfigError` unless ``0 < threshold <= 1`` and ``16 <= num_perm <= 8192``.

    The near-dedup range check, run once, by ``ops.curation.dedup.NearDedupParams`` (which the
    ``near_deduped_problems`` asset builds from its run config). ``threshold == 1.0`` is allowed
    and means exact shingle-set dedup (no LSH): datasketch cannot build bands for it ("bands too
    small"), so Crucible falls back instead of passing it through (case ``dedup-threshold-edges``).
    """
    check_threshold(threshold, "near_dedup.threshold", allow_exact=True)
    check_num_perm(num_perm, "near_dedup.num_perm")


# Every LSH candidate is verified by exact Jaccard, so a false positive costs one set
# intersection while a false negative loses a duplicate for good: weight FN 19x FP.
LSH_WEIGHTS = (0.05, 0.95)


@functools.lru_cache(maxsize=64)
def lsh_params(threshold: float, num_perm: int, weights: tuple[float, float] = LSH_WEIGHTS) -> tuple[int, int]:
    """(bands, rows) minimising datasketch's weighted FP+FN probability for ``threshold``.

    With :data:`LSH_WEIGHTS` and threshold 0.8, num_perm 128 this is (16, 8): P(candidate) is
    0.947 at J = 0.8 and 0.994 at 0.85. datasketch's equal weights give (9, 13), which finds only
    40% of pairs at J = 0.8 (pair recall 0.88 on the benchmark corpus).

    ``threshold`` in (0, 1) and ``num_perm`` in :data:`NUM_PERM_RANGE` are the caller's config's
    to check (``NearDedupParams``, ``DecontamConfig``, ``SynthesisParams`` do, once). Raises
    DedupConfigError for threshold >= 1, which has no LSH bands (near dedup falls back to exact
    shingle sets instead).
    """
    if threshold >= 1.0:
        raise DedupConfigError(f"Jaccard threshold {threshold} has no LSH bands (1.0 means exact shingle-set dedup)")
    from datasketch import MinHashLSH

    lsh = MinHashLSH(threshold=float(threshold), num_perm=int(num_perm), weights=weights)
    return int(lsh.b), int(lsh.r)


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's (a, b) permutation parameters for :data:`SCHEME`, each shape (num_perm,) uint32
    (computed once per (num_perm, seed); each call returns fresh copies)."""
    a, b = _permutations(int(num_perm), int(seed))
    return a.copy(), b.copy()


@functools.lru_cache(maxsize=16)
def _permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from datasketch import MinHash

    perm = MinHash(num_perm=num_perm, seed=seed, scheme=SCHEME).permutations
    return perm[0].astype(np.uint32), perm[1].astype(np.uint32)


THREADING_LAYER = "workqueue"
"""Numba's threading layer for the kernels unless ``NUMBA_THREADING_LAYER`` is set. Numba's OpenMP layer loads the
system ``libgomp``, and a torch imported later in the process then runs on it: a 30x slower MiniLM encoder in the
demo's one process (docs/operations.md, presets). The kernels never nest and run from one thread at a time."""


@functools.lru_cache(maxsize=1)
def _native():
    """The compiled kernels (:mod:`ops.curation.minhash_native`), imported once, on first use, on
    :data:`THREADING_LAYER`."""
    import os

    os.environ.setdefault("NUMBA_THREADING_LAYER", THREADING_LAYER)  # before Numba reads its configuration
    import numba

    numba.config.THREADING_LAYER = os.environ["NUMBA_THREADING_LAYER"]  # also when Numba was imported earlier
    from . import minhash_native

    return minhash_native


@functools.lru_cache(maxsize=1)
def _unicode_classes() -> np.ndarray:
    return _native().unicode_classes()


@dataclass
class ShingleBatch:
    """Shingle hashes of a batch of texts, flattened.

    Attributes:
        values: shape (S,) uint64 — 64-bit shingle ids (for exact Jaccard).
        offsets: shape (n+1,) int64 — shingles of text i are values[offsets[i]:offsets[i+1]].
    Every text has at least one shingle (short texts use character n-grams).
    """

    values: np.ndarray
    offsets: np.ndarray

    def doc(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def hash32(self) -> np.ndarray:
        """32-bit shingle hashes (xor-folded), the values MinHash permutes. Shape (S,) uint64."""
        v = self.values
        return (v ^ (v >> np.uint64(32))) & _MAX_HASH


def encode_texts(texts: list[str], word_n: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The byte buffer the shingle kernels read (modes in :mod:`ops.curation.minhash_native`).

    An ASCII text goes in as it is (mode 3); any other text NFKC-normalised and lower-cased (mode 0):
    the kernel tokenises both. The rare text with a code point above U+FFFF is tokenised here, by
    :func:`ops.curation.text.tokens`'s rule, and goes in as its tokens joined by spaces (mode 1),
    or, below ``word_n`` tokens, as its normalised form for character n-grams (mode 2). The ASCII
    texts are joined and encoded in one piece, the others after them.

    Returns:
        (buf, lo, hi, modes): buf shape (B,) uint8; text i is buf[lo[i]:hi[i]]; lo, hi shape (n,)
        int64; modes shape (n,) uint8.
    """
    n = len(texts)
    modes = np.full(n, 3, dtype=np.uint8)
    lens = np.fromiter(map(len, texts), dtype=np.int64, count=n)
    is_ascii = np.fromiter(map(str.isascii, texts), dtype=bool, count=n)
    lo = np.empty(n, dtype=np.int64)
    asc = np.flatnonzero(is_ascii)
    ends = np.cumsum(lens[asc])
    lo[asc] = ends - lens[asc]
    parts = ["".join(texts if len(asc) == n else [texts[i] for i in asc.tolist()]).encode("ascii")]
    other = np.flatnonzero(~is_ascii).tolist()
    if other:
        modes[other] = 0
        segs = []
        for i in other:
            t = texts[i]
            u = (t if unicodedata.is_normalized("NFKC", t) else unicodedata.normalize("NFKC", t)).lower()
            if len(u.encode("utf-16-le", "surrogatepass")) != 2 * len(u):  # a code point above U+FFFF
                norm = normalize(t)
                toks = _TOKEN.findall(norm)
                if len(toks) >= word_n:
                    u, modes[i] = " ".join(toks), 1
                else:
                    u, modes[i] = norm, 2
            segs.append(u.encode("utf-8", "surrogatepass"))
        seg_lens = np.fromiter(map(len, segs), dtype=np.int64, count=len(segs))
        lens[other] = seg_lens
        lo[other] = len(parts[0]) + np.cumsum(seg_lens) - seg_lens
        parts.extend(segs)
    buf = np.frombuffer(b"".join(parts), dtype=np.uint8)
    return buf, lo, lo + lens, modes


def sorted_unique(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values of a 1-D array: ``np.unique`` without its cost (numpy 2.4's
    ``np.unique`` on a million int64 takes ~70x as long as one ``np.sort``)."""
    s = np.sort(a)
    if len(s) < 2:
        return s
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def shingle_batch(texts: list[str], word_n: int = 5, char_n: int = 3) -> ShingleBatch:
    """Hash the shingles of every text: word ``word_n``-grams, char ``char_n``-grams below that.

    Matches :func:`ops.curation.text.shingles` (as 64-bit hashes, see
    :mod:`ops.curation.minhash_native`; a text's slice may repeat a shingle, which MinHash ignores
    and :func:`pair_jaccard` removes). Compiled, on all cores. Shape contract in :class:`ShingleBatch`.
    """
    nat = _native()
    buf, lo, hi, modes = encode_texts(texts, word_n)
    ucls = _unicode_classes()
    counts, ntok = nat.shingle_counts(buf, lo, hi, modes, word_n, char_n, ucls)
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    values = nat.shingle_values(buf, lo, hi, modes, offsets, ntok, word_n, char_n, ucls)
    return ShingleBatch(values=values, offsets=offsets)


def signatures(batch: ShingleBatch, num_perm: int = 128, seed: int = 1) -> np.ndarray:
    """MinHash signatures of every text in ``batch``.

    Each row equals ``datasketch.MinHash(num_perm, seed, scheme="affine32")`` updated with that
    text's ``batch.hash32()`` values (tested). Returns shape (n, num_perm) uint32. Compiled, one
    text per task on all cores.
    """
    a, b = permutations(num_perm, seed)
    return _native().signatures(batch.values, batch.offsets, a, b, num_perm)


def band_candidates(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Candidate pairs: texts whose signatures agree on all ``rows`` rows of at least one band.

    Per band the rows are folded into one 64-bit key and equal keys are grouped in a hash table
    (compiled, bands in parallel); every pair inside a group is emitted, and pairs from all bands
    are merged with one sort.

    Args:
        sig: shape (n, num_perm) unsigned ints with ``bands * rows <= num_perm``.
    Returns:
        shape (p, 2) int64, unique pairs (i, j) with i < j, sorted.
    Raises:
        DedupConfigError: ``bands * rows`` exceeds num_perm.
    """
    n = sig.shape[0]
    if bands * rows > sig.shape[1]:
        raise DedupConfigError(f"bands*rows = {bands * rows} exceeds num_perm = {sig.shape[1]}")
    if n < 2 or bands == 0:
        return np.zeros((0, 2), dtype=np.int64)
    codes = _native().band_codes(np.ascontiguousarray(sig, dtype=np.uint32), int(bands), int(rows))
    uniq = sorted_unique(codes)
    return np.stack((uniq // n, uniq % n), axis=1)


def unique_sets(batch: ShingleBatch) -> ShingleBatch:
    """The same batch with each text's shingles sorted and deduplicated (compiled)."""
    n = len(batch.offsets) - 1
    values, offsets = _native().sorted_sets(batch.values, batch.offsets, np.arange(n, dtype=np.int64))
    return ShingleBatch(values=values, offsets=offsets)


def pair_jaccard(batch: ShingleBatch, pairs: np.ndarray) -> np.ndarray:
    """Exact Jaccard of many (i, j) pairs at once, on the texts' shingle *sets*.

    Args:
        batch: shingle hashes (duplicates within a text are ignored).
        pairs: shape (p, 2) int64 indices into the batch.
    Returns:
        shape (p,) float64. Compiled: per pair one small hash set (no sorting, no per-pair
        Python), pairs in parallel.
    """
    pairs = np.ascontiguousarray(pairs, dtype=np.int64).reshape(-1, 2)
    if len(pairs) == 0:
        return np.zeros(0, dtype=np.float64)
    sizes = np.diff(batch.offsets)
    cap = 16
    while cap < 2 * int((sizes[pairs[:, 0]] + sizes[pairs[:, 1]]).max()):
        cap *= 2
    return _native().pair_jaccard(batch.values, batch.offsets, pairs, cap)


def star_clusters(n: int, edges: np.ndarray, edge_sim: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Star clustering of ``n`` texts over verified edges (compiled).

    Texts are visited in ``order`` (most preferred first); an unassigned text becomes a survivor and
    absorbs every still unassigned text it shares an edge with, so a text is only ever removed in
    favour of a text it was verified against (no chains).

    Args:
        edges: shape (e, 2) int64 verified pairs; edge_sim: shape (e,) their Jaccard;
        order: shape (n,) int64, a permutation of range(n).
    Returns:
        (keep bool (n,), survivor int64 (n,), similarity float64 (n,) with the survivor (1.0 when
        kept), number of removed texts).
    """
    edges = np.ascontiguousarray(edges, dtype=np.int64).reshape(-1, 2)
    keep, survivor, sim, absorbed = _native().star_clusters(
        int(n), edges, np.ascontiguousarray(edge_sim, dtype=np.float64), np.ascontiguousarray(order, dtype=np.int64))
    return keep, survivor, sim, int(absorbed)


def estimated_jaccard(sig: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """MinHash estimate of Jaccard for each pair: share of equal signature rows. Shape (p,)."""
    pairs = np.ascontiguousarray(pairs, dtype=np.int64).reshape(-1, 2)
    if len(pairs) == 0:
        return np.zeros(0, dtype=np.float64)
    return _native().estimated_jaccard(np.ascontiguousarray(sig), pairs)


KERNELS = ("shingle_counts", "shingle_values", "signatures", "band_codes", "estimated_jaccard", "sorted_sets",
           "pair_jaccard", "star_clusters")
"""The kernels of :mod:`ops.curation.minhash_native` this module calls from Python (the others are
inlined into them)."""


def compile_kernels() -> dict[str, int]:
    """Compile every kernel of :data:`KERNELS` by running the public functions once on a few tiny texts
    with near duplicates, so the compiled machine code lands in Numba's on-disk cache (``cache=True``:
    ``__pycache__`` next to ops/curation/minhash_native.py, or ``$NUMBA_CACHE_DIR``) and later processes
    load it instead of compiling (a cold compile of all of them is ~25 s on 2 cores). The arrays have
    the dtypes and layouts of every real call (the same functions build them), so the cached
    signatures are the ones the curation steps use. Called by ``crucible setup``.

    Returns:
        kernel name -> number of compiled signatures it now has (>= 1 each).
    Raises:
        RuntimeError: a kernel of :data:`KERNELS` was not compiled (the message names it).
    """
    base = "Find all real x such that x^2 - 5x + 6 = 0 and the sum of the roots is positive."
    texts = [base, base.replace("positive", "negative"), base + " Explain.", "Ünïcödé: ∫ x dx = ?", "2+2", "𝔽 field"]
    batch = shingle_batch(texts)
    unique_sets(batch)                                          # sorted_sets (threshold 1.0, shards)
    sig = signatures(batch, num_perm=128, seed=1)
    bands, rows = lsh_params(0.5, 128)
    cand = band_candidates(sig, bands, rows)
    if len(cand) == 0:                                          # the near duplicates above always collide
        cand = np.array([[0, 1]], dtype=np.int64)
    estimated_jaccard(sig, cand)
    sims = pair_jaccard(batch, cand)
    star_clusters(len(texts), cand, sims, np.arange(len(texts), dtype=np.int64))
    nat = _native()
    compiled = {name: len(getattr(nat, name).signatures) for name in KERNELS}
    missing = [name for name, n in compiled.items() if n == 0]
    if missing:
        raise RuntimeError(f"ops.curation.minhash.compile_kernels: not compiled: {', '.join(missing)}")
    return compiled


def estimate_margin(threshold: float, num_perm: int, z: float = 5.0) -> float:
    """Candidates whose estimate is below ``threshold - margin`` are dropped before exact
    verification: ``z`` standard deviations of the estimator at the threshold (sqrt(t(1-t)/k))
    plus one row. With z = 5 a pair at exactly the threshold is dropped with probability < 3e-7."""
    return z * float(np.sqrt(threshold * (1 - threshold) / num_perm)) + 1.0 / num_perm
