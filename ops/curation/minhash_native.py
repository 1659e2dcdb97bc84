"""Compiled (Numba) kernels behind :mod:`ops.curation.minhash`: tokenising, shingle hashing, MinHash
signatures, LSH banding, exact pair Jaccard and star clustering.

Imported lazily by :mod:`ops.curation.minhash` (importing Numba costs about a second). Every kernel is
compiled once per machine and cached next to this file (``cache=True``, ``__pycache__``); a cold
compile takes a few seconds. Loops over documents run on all cores (``prange``); each document's
output is written to a position fixed before the loop, so results do not depend on the thread count
or scheduling.

Text contract (the rule of :func:`ops.curation.text.tokens` on :func:`ops.curation.text.normalize`):
the caller passes each text as UTF-8 in one byte buffer, in one of three *modes*:

* 0 ``lower-case-ready UTF-8``: an ASCII text as it is (NFKC is the identity on ASCII), or a text
  already NFKC-normalised and lower-cased in Python, with no code point above U+FFFF. The kernel
  lower-cases A-Z and splits tokens itself: ``\\[a-z]+`` (a LaTeX command), a run of word code points,
  or any other single non-whitespace code point. Word and whitespace are Python ``re``'s ``\\w`` and
  ``\\s``, from a per-code-point table built with ``re`` itself (:func:`unicode_classes`).
* 1 ``pre-tokenised``: the text's tokens (computed in Python) joined by single spaces.
* 2 ``normalised short text``: :func:`normalize` of a text with fewer than ``word_n`` tokens, for
  character n-grams over its code points.

* 3 ``pure ASCII``: as mode 0, on a faster path (one pass over the bytes, no UTF-8 decoding).

Modes 1 and 2 are the fallback for the rare texts with code points above U+FFFF.

Hashes: a token (or character n-gram) is hashed as the 64-bit FNV-1a of its UTF-8 bytes followed by
the MurmurHash3 ``fmix64`` finaliser; a word n-gram is the polynomial ``sum_k t_k * M^(n-1-k)`` mod
2^64 of its token hashes with bit 63 cleared; a character n-gram has bit 63 set (so the two kinds
never collide). All constants are fixed: hashes are the same on every machine and run.
"""

from __future__ import annotations

import numba as nb
import numpy as np

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_MIX = np.uint64(0x9E3779B97F4A7C15)
_TOP = np.uint64(1 << 63)
_LOW63 = np.uint64((1 << 63) - 1)
_M32 = np.uint64(0xFFFFFFFF)


def _byte_class() -> np.ndarray:
    """0 = whitespace (Python ``re`` ``\\s`` on ASCII), 1 = word (``\\w``: letters, digits, ``_``),
    2 = upper-case letter (a word byte that lower-cases), 3 = anything else (a one-byte symbol)."""
    cls = np.full(256, 3, dtype=np.uint8)
    for c in (9, 10, 11, 12, 13, 28, 29, 30, 31, 32):
        cls[c] = 0
    for c in range(ord("a"), ord("z") + 1):
        cls[c] = 1
    for c in range(ord("0"), ord("9") + 1):
        cls[c] = 1
    cls[ord("_")] = 1
    for c in range(ord("A"), ord("Z") + 1):
        cls[c] = 2
    return cls


_CLS = _byte_class()
_LOWER = np.array([c + 32 if 65 <= c <= 90 else c for c in range(256)], dtype=np.uint64)


def _ascii_machine() -> tuple[np.ndarray, np.ndarray]:
    """The pure-ASCII tokeniser as a table-driven state machine (no data-dependent branches).

    Byte classes: 0 whitespace, 1 letter, 2 digit or ``_``, 3 other symbol, 4 backslash. States:
    0 outside a token, 1 in a word (``\\w+``), 2 in a LaTeX command (``\\`` + letters), 3 just after a
    backslash, 4 just after a one-byte symbol. ``code = TRANS[5 * state + class]`` packs 5 x the
    next state (``code >> 2``, so the next lookup needs no multiply), whether this byte continues the current token (bit 1; otherwise it
    starts a new one or is whitespace) and whether the token before this byte ended (bit 0).
    """
    cls = np.full(256, 3, dtype=np.uint8)
    cls[_CLS == 0] = 0
    cls[[c for c in range(256) if chr(c).isascii() and chr(c).isalpha()]] = 1
    cls[[ord(c) for c in "0123456789_"]] = 2
    cls[92] = 4
    trans = np.zeros(25, dtype=np.uint8)
    start_state = {0: 0, 1: 1, 2: 1, 3: 4, 4: 3}  # the state a byte of each class opens
    for state in range(5):
        for k in range(5):
            cont = (state == 1 and k in (1, 2)) or (state in (2, 3) and k == 1)
            nxt = (2 if state in (2, 3) else 1) if cont else start_state[k]
            ended = state != 0 and not cont
            trans[5 * state + k] = ((5 * nxt) << 2) | (int(cont) << 1) | int(ended)
    return cls, trans


_CLS5, _TRANS = _ascii_machine()


@nb.njit(inline="always", cache=True)
def _fmix64(h):
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


def unicode_classes() -> np.ndarray:
    """Class of every code point U+0000..U+FFFF as in :func:`_byte_class` (0 space, 1 word, 3 other),
    computed with Python's ``re`` (``\\w``, ``\\s`` on ``str``), so the kernel splits exactly where
    :func:`ops.curation.text.tokens` does. Shape (65536,) uint8."""
    import re

    s = "".join(map(chr, range(0x80, 0x10000)))
    w = re.sub(r"[^\x00\x01]", "\x03", re.sub(r"\s", "\x00", re.sub(r"\w", "\x01", s)))
    cls = np.empty(0x10000, dtype=np.uint8)
    cls[:0x80] = _CLS[:0x80]
    cls[0x80:] = np.frombuffer(w.encode("latin-1"), dtype=np.uint8)
    return cls


@nb.njit(inline="always", cache=True)
def _lower(c):
    if _CLS[c] == 2:
        return np.uint64(c + 32)
    return np.uint64(c)


@nb.njit(inline="always", cache=True)
def _is_alpha(c):
    return (c >= 97 and c <= 122) or _CLS[c] == 2


@nb.njit(inline="always", cache=True)
def _cp_class(buf, pos, ucls):
    """(class, byte length) of the code point at ``pos`` (0 space, 1 word, 3 other)."""
    c = buf[pos]
    if c < 0x80:
        k = _CLS[c]
        return (1 if k == 2 else k), 1
    if c < 0xE0:
        return ucls[((c & 0x1F) << 6) | (buf[pos + 1] & 0x3F)], 2
    if c < 0xF0:
        return ucls[((c & 0x0F) << 12) | ((buf[pos + 1] & 0x3F) << 6) | (buf[pos + 2] & 0x3F)], 3
    return 3, 4  # above U+FFFF: never passed in mode 0 (the caller routes those texts to mode 1/2)


@nb.njit(inline="always", cache=True)
def _next_token(buf, pos, end, mode, ucls):
    """(start, stop) of the next token at or after ``pos`` (stop <= end), or (-1, end) when none."""
    if mode == 1:
        while pos < end and buf[pos] == 32:
            pos += 1
        if pos >= end:
            return -1, end
        s = pos
        while pos < end and buf[pos] != 32:
            pos += 1
        return s, pos
    while pos < end:
        k, ln = _cp_class(buf, pos, ucls)
        if k != 0:
            break
        pos += ln
    if pos >= end:
        return -1, end
    s = pos
    if buf[pos] == 92 and pos + 1 < end and _is_alpha(buf[pos + 1]):  # backslash + letters: a LaTeX command
        pos += 2
        while pos < end and _is_alpha(buf[pos]):
            pos += 1
        return s, pos
    k, ln = _cp_class(buf, pos, ucls)
    pos += ln
    if k == 1:
        while pos < end:
            k, ln = _cp_class(buf, pos, ucls)
            if k != 1:
                break
            pos += ln
    return s, pos


@nb.njit(inline="always", cache=True)
def _hash_bytes(buf, s, e, lower):
    h = _FNV_OFFSET
    for p in range(s, e):
        c = _lower(buf[p]) if lower else np.uint64(buf[p])
        h = (h ^ c) * _FNV_PRIME
    return _fmix64(h)


@nb.njit(cache=True)
def _normalised(buf, s, e, ucls):
    """Python's ``normalize`` of a mode-0 text: ASCII lower case, whitespace runs -> one space, stripped."""
    out = np.empty(e - s, dtype=np.uint8)
    m = 0
    pending = False
    p = s
    while p < e:
        k, ln = _cp_class(buf, p, ucls)
        if k == 0:
            pending = m > 0
            p += ln
            continue
        if pending:
            out[m] = 32
            m += 1
            pending = False
        for q in range(p, p + ln):
            out[m] = np.uint8(_lower(buf[q]))
            m += 1
        p += ln
    return out[:m]


@nb.njit(cache=True)
def _char_count(s_bytes, char_n):
    """Number of character ``char_n``-grams of a normalised text (code points; 1 when it is shorter)."""
    cps = 0
    for c in s_bytes:
        if (c & 0xC0) != 0x80:
            cps += 1
    return 1 if cps <= char_n else cps - char_n + 1


@nb.njit(cache=True)
def _char_grams(s_bytes, char_n, out, o):
    """Write the hashes of the character n-grams of ``s_bytes`` (UTF-8) to ``out[o:]``; returns the count."""
    m = len(s_bytes)
    starts = np.empty(m + 1, dtype=np.int64)
    cps = 0
    for p in range(m):
        if (s_bytes[p] & 0xC0) != 0x80:
            starts[cps] = p
            cps += 1
    starts[cps] = m
    if cps <= char_n:
        out[o] = _hash_bytes(s_bytes, 0, m, False) | _TOP
        return 1
    for k in range(cps - char_n + 1):
        out[o + k] = _hash_bytes(s_bytes, starts[k], starts[k + char_n], False) | _TOP
    return cps - char_n + 1


@nb.njit(inline="always", cache=True)
def _push(h, ring, slot, t, g, pw, word_n, out, o):
    """Add token hash ``fmix64(h)`` to the rolling word n-gram; write the n-gram once ``word_n`` are in."""
    h = _fmix64(h)
    if t >= word_n:
        g -= ring[slot] * pw
    g = g * _MIX + h
    ring[slot] = h
    slot += 1
    if slot == word_n:
        slot = 0
    t += 1
    if t >= word_n:
        out[o + t - word_n] = g & _LOW63
    return slot, t, g


@nb.njit(cache=True)
def _ascii_count(buf, s, e):
    """Number of tokens of a pure-ASCII text (``ops.curation.text.tokens``'s rule)."""
    row = 0  # 5 x state
    t = 0
    for p in range(s, e):
        code = np.int64(_TRANS[row + np.int64(_CLS5[buf[p]])])
        t += code & 1
        row = code >> 2
    return t + (row != 0)


@nb.njit(cache=True)
def _ascii_hashes(buf, s, e, tok):
    """Raw FNV-1a hashes (before ``fmix64``) of the tokens of a pure-ASCII text into ``tok``; returns
    their number. One pass over the bytes with no data-dependent branch: the running hash is stored
    at every byte and the slot moves on when a token has ended."""
    row = 0  # 5 x state
    t = 0
    h = _FNV_OFFSET
    for p in range(s, e):
        c = buf[p]
        code = np.int64(_TRANS[row + np.int64(_CLS5[c])])
        tok[t] = h
        t += code & 1
        keep = np.uint64(0) - np.uint64((code >> 1) & 1)  # all ones when this byte continues the token
        h = (((h & keep) | (_FNV_OFFSET & ~keep)) ^ _LOWER[c]) * _FNV_PRIME
        row = code >> 2
    if row != 0:
        tok[t] = h
        t += 1
    return t


@nb.njit(parallel=True, cache=True)
def shingle_counts(buf, lo, hi, modes, word_n, char_n, ucls):
    """(shingles per text, tokens per text), each shape (n,) int64: ``tokens - word_n + 1`` shingles,
    or the character n-gram count below ``word_n`` tokens (mode 2: always)."""
    n = len(modes)
    out = np.zeros(n, dtype=np.int64)
    ntok = np.zeros(n, dtype=np.int64)
    for d in nb.prange(n):
        s, e, mode = lo[d], hi[d], modes[d]
        if mode == 2:
            out[d] = _char_count(buf[s:e], char_n)
            continue
        if mode == 3:
            t = _ascii_count(buf, s, e)
        else:
            t = 0
            pos = s
            while True:
                a, pos = _next_token(buf, pos, e, mode, ucls)
                if a < 0:
                    break
                t += 1
        ntok[d] = t
        if t >= word_n:
            out[d] = t - word_n + 1
        else:
            out[d] = _char_count(_normalised(buf, s, e, ucls), char_n)
    return out, ntok


@nb.njit(parallel=True, cache=True)
def shingle_values(buf, lo, hi, modes, offsets, ntok, word_n, char_n, ucls):
    """Shingle hashes of every text (shape (offsets[-1],) uint64) at ``offsets``, with ``ntok`` the
    token counts, both from :func:`shingle_counts`."""
    n = len(modes)
    out = np.empty(offsets[n], dtype=np.uint64)
    pw = np.uint64(1)  # M^(word_n - 1): weight of the token that leaves the rolling window
    for _ in range(word_n - 1):
        pw *= _MIX
    for d in nb.prange(n):
        s, e, mode, o = lo[d], hi[d], modes[d], offsets[d]
        if mode == 2:
            _char_grams(buf[s:e], char_n, out, o)
            continue
        if ntok[d] < word_n:  # a short text takes character n-grams
            _char_grams(_normalised(buf, s, e, ucls), char_n, out, o)
            continue
        ring = np.empty(word_n, dtype=np.uint64)
        if mode == 3:
            tok = np.empty(e - s + 1, dtype=np.uint64)
            m = _ascii_hashes(buf, s, e, tok)
            slot = 0
            t = 0
            g = np.uint64(0)
            for q in range(m):
                slot, t, g = _push(tok[q], ring, slot, t, g, pw, word_n, out, o)
            continue
        slot = 0
        t = 0
        g = np.uint64(0)
        pos = s
        while t < ntok[d]:
            a, pos = _next_token(buf, pos, e, mode, ucls)
            h = _FNV_OFFSET
            for q in range(a, pos):
                h = (h ^ _lower(buf[q])) * _FNV_PRIME
            slot, t, g = _push(h, ring, slot, t, g, pw, word_n, out, o)
    return out


@nb.njit(parallel=True, cache=True)
def signatures(values, offsets, a, b, num_perm):
    """MinHash rows (shape (n, num_perm) uint32): min over a text's shingles of
    ``a_j * fmix32(fold32(v)) + b_j mod 2^32`` (datasketch's ``affine32`` scheme)."""
    n = len(offsets) - 1
    sig = np.empty((n, num_perm), dtype=np.uint32)
    for d in nb.prange(n):
        row = np.full(num_perm, 0xFFFFFFFF, dtype=np.uint32)
        for k in range(offsets[d], offsets[d + 1]):
            v = values[k]
            h = (v ^ (v >> np.uint64(32))) & _M32
            h ^= h >> np.uint64(16)
            h = (h * np.uint64(0x85EBCA6B)) & _M32
            h ^= h >> np.uint64(13)
            h = (h * np.uint64(0xC2B2AE35)) & _M32
            h ^= h >> np.uint64(16)
            h32 = np.uint32(h)
            for j in range(num_perm):  # branch-free, so LLVM vectorises it over the permutations
                row[j] = min(row[j], np.uint32(a[j] * h32 + b[j]))
        sig[d, :] = row
    return sig


@nb.njit(inline="always", cache=True)
def _offsets(counts):
    """Exclusive prefix sums: shape (len(counts) + 1,) int64, starting at 0."""
    off = np.zeros(len(counts) + 1, dtype=np.int64)
    off[1:] = np.cumsum(counts)
    return off


@nb.njit(cache=True)
def _band_keys(sig, band, rows):
    n = sig.shape[0]
    key = np.zeros(n, dtype=np.uint64)
    for d in range(n):
        k = np.uint64(0)
        for j in range(band * rows, (band + 1) * rows):
            k = k * _MIX + np.uint64(sig[d, j])
        key[d] = k
    return key


@nb.njit(cache=True)
def _band_chain(key):
    """Hash-table grouping of equal keys: ``prev[d]`` = the previous text with the same key (-1 if none)."""
    n = len(key)
    cap = 1
    while cap < 2 * n:
        cap *= 2
    mask = np.uint64(cap - 1)
    tkey = np.empty(cap, dtype=np.uint64)
    thead = np.full(cap, -1, dtype=np.int64)
    prev = np.full(n, -1, dtype=np.int64)
    for d in range(n):
        k = key[d]
        slot = np.int64(_fmix64(k) & mask)
        while thead[slot] >= 0 and tkey[slot] != k:
            slot = (slot + 1) & (cap - 1)
        if thead[slot] >= 0:
            prev[d] = thead[slot]
        tkey[slot] = k
        thead[slot] = d
    return prev


@nb.njit(parallel=True, cache=True)
def band_codes(sig, bands, rows):
    """Every (i < j) pair that agrees on one band, as ``i * n + j`` (int64, unsorted, with repeats
    across bands). A band's rows are folded into one 64-bit key, as in the numpy original."""
    n = sig.shape[0]
    prevs = np.empty((bands, n), dtype=np.int64)
    counts = np.zeros(bands, dtype=np.int64)
    for band in nb.prange(bands):
        prev = _band_chain(_band_keys(sig, band, rows))
        c = 0
        for d in range(n):
            p = prev[d]
            while p >= 0:
                c += 1
                p = prev[p]
        prevs[band, :] = prev
        counts[band] = c
    start = _offsets(counts)
    out = np.empty(start[bands], dtype=np.int64)
    for band in nb.prange(bands):
        o = start[band]
        prev = prevs[band]
        for d in range(n):
            p = prev[d]
            while p >= 0:
                out[o] = p * n + d
                o += 1
                p = prev[p]
    return out


@nb.njit(parallel=True, cache=True)
def estimated_jaccard(sig, pairs):
    """Share of equal signature rows for each pair (shape (p,) float64)."""
    p = pairs.shape[0]
    k = sig.shape[1]
    out = np.empty(p, dtype=np.float64)
    for q in nb.prange(p):
        i, j = pairs[q, 0], pairs[q, 1]
        same = 0
        for c in range(k):
            if sig[i, c] == sig[j, c]:
                same += 1
        out[q] = same / k
    return out


@nb.njit(parallel=True, cache=True)
def sorted_sets(values, offsets, docs):
    """Sorted, de-duplicated shingles of the texts ``docs``: (values, offsets) of the subset."""
    m = len(docs)
    tmp_off = _offsets(offsets[docs + 1] - offsets[docs])
    tmp = np.empty(tmp_off[m], dtype=np.uint64)
    sizes = np.zeros(m, dtype=np.int64)
    for q in nb.prange(m):
        d = docs[q]
        seg = np.sort(values[offsets[d] : offsets[d + 1]])
        o = tmp_off[q]
        c = 0
        for k in range(len(seg)):
            if k == 0 or seg[k] != seg[k - 1]:
                tmp[o + c] = seg[k]
                c += 1
        sizes[q] = c
    off = _offsets(sizes)
    out = np.empty(off[m], dtype=np.uint64)
    for q in nb.prange(m):
        out[off[q] : off[q + 1]] = tmp[tmp_off[q] : tmp_off[q] + sizes[q]]
    return out, off


@nb.njit(inline="always", cache=True)
def _probe(tab, tag, v, m, t_i, t_x):
    """Slot of ``v`` in the open-addressing table of size ``m`` (a power of two), or the empty slot
    where it goes; a slot is taken when its tag is ``t_i`` or ``t_x`` (the current pair's)."""
    slot = np.int64((v ^ (v >> np.uint64(31))) & np.uint64(m - 1))
    while (tag[slot] == t_i or tag[slot] == t_x) and tab[slot] != v:
        slot = (slot + 1) & (m - 1)
    return slot


@nb.njit(parallel=True, cache=True)
def pair_jaccard(values, offsets, pairs, cap):
    """Exact Jaccard of the shingle *sets* of each pair (shape (p,) float64), repeats ignored.

    Per pair, text i's shingles go into a small open-addressing hash set (``cap``: a power of two
    >= 2 x the largest pair's shingle count), then text j's are looked up and added; slots are
    tagged with the pair's number, so the table is never cleared. Pairs run in parallel, in blocks
    that each own one table.
    """
    p = pairs.shape[0]
    out = np.zeros(p, dtype=np.float64)
    block = 256
    nblocks = (p + block - 1) // block
    for blk in nb.prange(nblocks):
        tab = np.empty(cap, dtype=np.uint64)
        tag = np.zeros(cap, dtype=np.int64)  # 2q+1: shingle of i (unmatched), 2q+2: matched or only in j
        for q in range(blk * block, min(p, (blk + 1) * block)):
            i, j = pairs[q, 0], pairs[q, 1]
            size = (offsets[i + 1] - offsets[i]) + (offsets[j + 1] - offsets[j])
            m = 16
            while m < 2 * size:
                m *= 2
            t_i = 2 * q + 1
            t_x = 2 * q + 2
            na = 0
            for k in range(offsets[i], offsets[i + 1]):
                v = values[k]
                slot = _probe(tab, tag, v, m, t_i, t_x)
                if tag[slot] != t_i and tag[slot] != t_x:
                    tag[slot] = t_i
                    tab[slot] = v
                    na += 1
            inter = 0
            only_j = 0
            for k in range(offsets[j], offsets[j + 1]):
                v = values[k]
                slot = _probe(tab, tag, v, m, t_i, t_x)
                if tag[slot] == t_i:  # in i, first time seen in j
                    tag[slot] = t_x
                    inter += 1
                elif tag[slot] != t_x:  # new: only in j
                    tag[slot] = t_x
                    tab[slot] = v
                    only_j += 1
            union = na + only_j
            if union > 0:
                out[q] = inter / union
    return out


@nb.njit(cache=True)
def star_clusters(n, edges, edge_sim, order):
    """Star clustering over verified edges: texts visited in ``order``; an unassigned text becomes a
    survivor and absorbs every unassigned neighbour. Returns (keep bool (n,), survivor int64 (n,),
    similarity float64 (n,), absorbed count)."""
    deg = np.zeros(n + 1, dtype=np.int64)
    for q in range(edges.shape[0]):
        deg[edges[q, 0] + 1] += 1
        deg[edges[q, 1] + 1] += 1
    for d in range(n):
        deg[d + 1] += deg[d]
    nbr = np.empty(deg[n], dtype=np.int64)
    nsim = np.empty(deg[n], dtype=np.float64)
    fill = deg[:n].copy()
    for q in range(edges.shape[0]):
        i, j = edges[q, 0], edges[q, 1]
        nbr[fill[i]] = j
        nsim[fill[i]] = edge_sim[q]
        fill[i] += 1
        nbr[fill[j]] = i
        nsim[fill[j]] = edge_sim[q]
        fill[j] += 1
    keep = np.ones(n, dtype=np.bool_)
    survivor = np.arange(n)
    sim = np.ones(n, dtype=np.float64)
    assigned = np.zeros(n, dtype=np.bool_)
    absorbed = 0
    for d in order:
        if assigned[d]:
            continue
        assigned[d] = True
        for k in range(deg[d], deg[d + 1]):
            c = nbr[k]
            if not assigned[c]:
                assigned[c] = True
                keep[c] = False
                survivor[c] = d
                sim[c] = nsim[k]
                absorbed += 1
    return keep, survivor, sim, absorbed
