"""Batched MinHash signatures and LSH banding, with datasketch's hash family.

Source: Logics-STEM (arXiv 2601.01562) §2, stage 2 (near-duplicate removal with MinHash); Broder
(1997) for MinHash; Leskovec et al., *Mining of Massive Datasets* §3.4 for banding.

datasketch supplies the permutation family (``MinHash(num_perm, seed).permutations``) and the
false-positive/false-negative optimal (bands, rows) for a Jaccard threshold (``MinHashLSH.b/.r``).
What datasketch does one document and one shingle at a time in Python, this module does for a whole
batch in numpy: a signature row here equals ``datasketch.MinHash(num_perm, seed)`` updated with the
same 32-bit shingle hashes (tested), so rows can be wrapped in ``LeanMinHash`` when needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .text import TOKEN_PATTERN, normalize

_MAX_HASH = np.uint64((1 << 32) - 1)
SCHEME = "affine32"  # datasketch 2.0's permutation scheme: h -> a*fmix32(h) + b mod 2^32
# MurmurHash3 32-bit finaliser constants (public, from MurmurHash3; datasketch pre-mixes with them)
_FMIX32 = (np.uint32(16), np.uint32(0x85EBCA6B), np.uint32(13), np.uint32(0xC2B2AE35), np.uint32(16))
_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constant for polynomial n-gram hashing


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
    """datasketch's (a, b) permutation parameters for :data:`SCHEME`, each shape (num_perm,) uint32."""
    from datasketch import MinHash

    perm = MinHash(num_perm=num_perm, seed=seed, scheme=SCHEME).permutations
    return perm[0].astype(np.uint32), perm[1].astype(np.uint32)


def _fmix32(h: np.ndarray) -> np.ndarray:
    s1, m1, s2, m2, s3 = _FMIX32
    h = h ^ (h >> s1)
    h = h * m1
    h = h ^ (h >> s2)
    h = h * m2
    return h ^ (h >> s3)


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


def token_hashes(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Tokenise (same rule as :func:`ops.curation.text.tokens`) and hash every token, in Polars.

    Returns:
        (hashes, offsets): hashes shape (T,) uint64 (Polars' seeded hash, stable for the pinned
        Polars version); tokens of text i are hashes[offsets[i]:offsets[i+1]]; offsets shape (n+1,).
    """
    import polars as pl

    s = pl.Series(texts, dtype=pl.String)
    # NFKC is the identity on ASCII: normalise only the (few) non-ASCII texts
    df = pl.DataFrame({"s": s}).select(
        pl.when(pl.col("s").str.contains(r"^[\x00-\x7F]*$")).then(pl.col("s")).otherwise(pl.col("s").str.normalize("NFKC"))
    )
    toks = df.to_series().str.to_lowercase().str.extract_all(TOKEN_PATTERN)
    lengths = toks.list.len().fill_null(0).to_numpy().astype(np.int64)
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = toks.explode().drop_nulls()
    return flat.hash(seed=0x5EED).to_numpy().astype(np.uint64), offsets


def shingle_batch(texts: list[str], word_n: int = 5, char_n: int = 3) -> ShingleBatch:
    """Hash the shingles of every text: word ``word_n``-grams, char ``char_n``-grams below that.

    Matches :func:`ops.curation.text.shingles` (as hashes; a text's slice may repeat a shingle,
    which MinHash ignores and :func:`jaccard` removes). Shape contract in :class:`ShingleBatch`.
    """
    import polars as pl

    n = len(texts)
    th, toff = token_hashes(texts)
    lengths = np.diff(toff)
    long_doc = lengths >= word_n
    # word n-grams for all positions of the flat token array, then keep those inside one text
    m = max(len(th) - word_n + 1, 0)
    g = np.zeros(m, dtype=np.uint64)
    for j in range(word_n):
        g = g * _MIX + th[j : j + m]
    doc_of_pos = np.repeat(np.arange(n), lengths)[:m]
    pos_in_doc = np.arange(m) - toff[:-1][doc_of_pos]
    valid = pos_in_doc <= (lengths[doc_of_pos] - word_n)
    word_vals = g[valid]
    word_counts = np.where(long_doc, lengths - word_n + 1, 0)
    # character n-grams for the short texts
    short_idx = np.flatnonzero(~long_doc)
    grams: list[str] = []
    char_counts = np.zeros(n, dtype=np.int64)
    for i in short_idx.tolist():
        s = normalize(texts[i])
        gs = [s] if len(s) <= char_n else [s[k : k + char_n] for k in range(len(s) - char_n + 1)]
        grams.extend(gs)
        char_counts[i] = len(gs)
    char_vals = pl.Series(grams, dtype=pl.String).hash(seed=0xC4A2).to_numpy().astype(np.uint64) | np.uint64(1 << 63)
    counts = word_counts + char_counts
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    values = np.empty(offsets[-1], dtype=np.uint64)
    # scatter: word shingles are contiguous per long text, char shingles per short text
    word_dst = np.repeat(offsets[:-1][long_doc], word_counts[long_doc]) + _ranges(word_counts[long_doc])
    values[word_dst] = word_vals
    if len(char_vals):
        char_dst = np.repeat(offsets[:-1][short_idx], char_counts[short_idx]) + _ranges(char_counts[short_idx])
        values[char_dst] = char_vals
    return ShingleBatch(values=values, offsets=offsets)


def _ranges(counts: np.ndarray) -> np.ndarray:
    """Concatenation of arange(c) for c in counts."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(total, dtype=np.int64) - starts


def signatures(batch: ShingleBatch, num_perm: int = 128, seed: int = 1, chunk: int = 1 << 15) -> np.ndarray:
    """MinHash signatures of every text in ``batch``.

    Each row equals ``datasketch.MinHash(num_perm, seed, scheme="affine32")`` updated with that
    text's ``batch.hash32()`` values. Returns shape (n, num_perm) uint32. Shingles are processed in
    cache-sized chunks of about ``chunk``, one permutation at a time (a few MB of scratch memory).
    """
    n = len(batch.offsets) - 1
    a, b = permutations(num_perm, seed)
    hv = _fmix32(batch.hash32().astype(np.uint32))
    sig = np.empty((n, num_perm), dtype=np.uint32)
    offsets = batch.offsets
    buf = np.empty(max(chunk, 1), dtype=np.uint32)
    d0 = 0
    while d0 < n:
        lo = offsets[d0]
        d1 = int(np.searchsorted(offsets, lo + chunk, side="right")) - 1
        d1 = min(max(d1, d0 + 1), n)
        hi = offsets[d1]
        h = hv[lo:hi]
        if len(buf) < len(h):
            buf = np.empty(len(h), dtype=np.uint32)
        scratch = buf[: len(h)]
        starts = offsets[d0:d1] - lo
        for j in range(num_perm):
            np.multiply(h, a[j], out=scratch)  # wraps mod 2^32
            np.add(scratch, b[j], out=scratch)
            sig[d0:d1, j] = np.minimum.reduceat(scratch, starts)
        d0 = d1
    return sig


def band_candidates(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Candidate pairs: texts whose signatures agree on all ``rows`` rows of at least one band.

    Fully vectorised: per band, rows are folded into one 64-bit key, sorted, and every pair inside
    a run of equal keys is emitted; pairs from all bands are merged with one ``np.unique``.

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
    codes: list[np.ndarray] = []
    for band in range(bands):
        key = np.zeros(n, dtype=np.uint64)
        for j in range(band * rows, (band + 1) * rows):
            key = key * _MIX + sig[:, j].astype(np.uint64)
        order = np.argsort(key, kind="stable")
        k = key[order]
        same = k[1:] == k[:-1]
        if not same.any():
            continue
        starts = np.flatnonzero(np.concatenate(([True], ~same)))
        sizes = np.diff(np.append(starts, n))
        run_end = np.repeat(starts + sizes, sizes)  # exclusive end of each position's run
        later = run_end - np.arange(n) - 1  # members after this position in its run
        left = np.repeat(np.arange(n), later)
        right = left + _ranges(later) + 1
        a, b = order[left], order[right]
        lo, hi = np.minimum(a, b).astype(np.int64), np.maximum(a, b).astype(np.int64)
        codes.append(lo * n + hi)
    if not codes:
        return np.zeros((0, 2), dtype=np.int64)
    uniq = np.unique(np.concatenate(codes))
    return np.stack((uniq // n, uniq % n), axis=1)


def unique_sets(batch: ShingleBatch) -> ShingleBatch:
    """The same batch with each text's shingles sorted and deduplicated (vectorised)."""
    n = len(batch.offsets) - 1
    doc = np.repeat(np.arange(n, dtype=np.int64), np.diff(batch.offsets))
    order = np.lexsort((batch.values, doc))
    v, d = batch.values[order], doc[order]
    keep = np.ones(len(v), dtype=bool)
    keep[1:] = (v[1:] != v[:-1]) | (d[1:] != d[:-1])
    counts = np.bincount(d[keep], minlength=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return ShingleBatch(values=v[keep], offsets=offsets)


def pair_jaccard(batch: ShingleBatch, pairs: np.ndarray) -> np.ndarray:
    """Exact Jaccard of many (i, j) pairs at once, on the texts' shingle *sets*.

    Args:
        batch: shingle hashes (duplicates within a text are ignored).
        pairs: shape (p, 2) int64 indices into the batch.
    Returns:
        shape (p,) float64. Only the texts named in ``pairs`` are touched: a (text, shingle) key
        table is deduplicated, every shingle of text i is probed for text j with one hash-set
        membership test (Polars ``is_in``) — no per-pair Python.
    """
    import polars as pl

    if len(pairs) == 0:
        return np.zeros(0, dtype=np.float64)
    involved = np.unique(pairs)
    counts = np.diff(batch.offsets)[involved]
    gather = np.repeat(batch.offsets[involved], counts) + _ranges(counts)
    doc = np.repeat(involved, counts)
    vals = batch.values[gather]
    key = vals * _MIX + doc.astype(np.uint64)  # (text, shingle) -> one 64-bit key
    first = pl.Series(key).is_first_distinct().to_numpy()  # drop repeats of a shingle in a text
    doc, vals, key = doc[first], vals[first], key[first]
    size = np.bincount(doc, minlength=len(batch.offsets) - 1)
    probe = pl.DataFrame({"pair": np.arange(len(pairs)), "i": pairs[:, 0], "j": pairs[:, 1]}).join(
        pl.DataFrame({"doc": doc, "v": vals}), left_on="i", right_on="doc"
    )
    probe_keys = probe["v"].to_numpy() * _MIX + probe["j"].to_numpy().astype(np.uint64)
    hit = pl.Series(probe_keys).is_in(pl.Series(key).implode()).to_numpy()
    inter = np.bincount(probe["pair"].to_numpy()[hit], minlength=len(pairs)).astype(np.float64)
    union = size[pairs[:, 0]] + size[pairs[:, 1]] - inter
    return np.divide(inter, union, out=np.zeros(len(pairs)), where=union > 0)


def estimated_jaccard(sig: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """MinHash estimate of Jaccard for each pair: share of equal signature rows. Shape (p,)."""
    if len(pairs) == 0:
        return np.zeros(0, dtype=np.float64)
    return (sig[pairs[:, 0]] == sig[pairs[:, 1]]).mean(axis=1)


def estimate_margin(threshold: float, num_perm: int, z: float = 5.0) -> float:
    """Candidates whose estimate is below ``threshold - margin`` are dropped before exact
    verification: ``z`` standard deviations of the estimator at the threshold (sqrt(t(1-t)/k))
    plus one row. With z = 5 a pair at exactly the threshold is dropped with probability < 3e-7."""
    return z * float(np.sqrt(threshold * (1 - threshold) / num_perm)) + 1.0 / num_perm
