"""Text normalisation, tokenisation and shingling shared by dedup and decontamination.

Source: Logics-STEM (arXiv 2601.01562) §2, stage 2 — "normalise lightly". We keep digits and LaTeX
operators because in STEM the numbers *are* the question: a normaliser that maps every number to 0
merges distinct problems (case ``dedup-numbers-matter``).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

_WS = re.compile(r"\s+")
# A token is a LaTeX command (\frac), a run of word characters (letters, digits, _), or one symbol.
TOKEN_PATTERN = r"\\[A-Za-z]+|\w+|[^\w\s]"
_TOKEN = re.compile(TOKEN_PATTERN)


def normalize(text: str) -> str:
    """NFKC, lowercase, collapse whitespace, strip. Digits and LaTeX are kept verbatim.

    Args:
        text: any unicode string.
    Returns:
        the normalised string (possibly empty).
    """
    return _WS.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


def compact(text: str) -> str:
    """A stricter key for very short texts: normalised, without whitespace, ``$`` and final dots.

    Used by the exact layer of decontamination, where "Simplify $\\sqrt{242}$." must equal
    "simplify \\sqrt{242}" but "\\sqrt{243}" must not.
    """
    return re.sub(r"[\s$]", "", normalize(text)).rstrip(".")


def tokens(text: str) -> list[str]:
    """Tokens of the *normalised* text: LaTeX commands, words/numbers, single symbols."""
    return _TOKEN.findall(normalize(text))


def word_ngrams(toks: list[str], n: int) -> list[str]:
    """Contiguous n-grams of ``toks`` joined by a space; empty when ``len(toks) < n``."""
    return [" ".join(toks[i : i + n]) for i in range(len(toks) - n + 1)]


def char_ngrams(text: str, n: int) -> list[str]:
    """Character n-grams of the normalised text; the whole text when it is shorter than n."""
    s = normalize(text)
    if len(s) <= n:
        return [s]
    return [s[i : i + n] for i in range(len(s) - n + 1)]


def shingles(text: str, word_n: int = 5, char_n: int = 3) -> set[str]:
    """Shingle set of a problem for MinHash: word ``word_n``-grams, or character ``char_n``-grams
    for texts with fewer than ``word_n`` tokens — so a short text never gets an empty or shared
    signature (case ``dedup-short-texts``). Word shingles are prefixed ``w:`` and char shingles
    ``c:`` so the two kinds never collide.

    Returns:
        a non-empty set of strings for any non-empty text.
    """
    toks = tokens(text)
    if len(toks) >= word_n:
        return {"w:" + g for g in word_ngrams(toks, word_n)}
    return {"c:" + g for g in char_ngrams(text, char_n)}


def text_hash(text: str) -> str:
    """MD5 hex digest of the normalised text: the exact-dedup key (Logics-STEM §2, stage 2)."""
    return hashlib.md5(normalize(text).encode("utf-8")).hexdigest()


def stable_id(*parts: str) -> str:
    """A 16-hex-digit content id from the given parts (sha1), stable across runs and machines."""
    h = hashlib.sha1("\x1f".join(parts).encode("utf-8")).hexdigest()
    return h[:16]
