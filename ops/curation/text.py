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


# --- normalisation for benchmark matching (decontamination only; dedup keeps the light form) ---------------------
#
# A benchmark copy can differ from the benchmark item only in how it was stored or typeset: JSON escaping doubles
# every backslash ("\\frac"), Markdown escapes punctuation ("\*", "\_"), LaTeX has several spellings of one thing
# (\dfrac/\tfrac/\frac, \left( / (, \leq / \le, \, / \! spacing), and Unicode has several code points for one
# character. `match_normalize` maps all of these to one form, so that the exact, n-gram and MinHash layers compare
# what a reader sees (case ``decontam-escaped-latex``). It is a matching key, never shown or stored.

_BACKSLASH_RUN = re.compile(r"\\{2,}")
# JSON control escapes \n \r \t after un-doubling: a LaTeX command continues in lower case (\nu, \theta, \right)
_JSON_CTRL = re.compile(r"\\[nrt](?![a-z])")
_JSON_UNICODE = re.compile(r"\\u([0-9a-fA-F]{4})")
_MATH_DELIM = re.compile(r"\\[()\[\]]")
_DOLLARS = re.compile(r"\${2,}")
_LATEX_SPACE = re.compile(r"\\(?:[,;:!>]|\s|q?quad(?![A-Za-z]))|~")
_LATEX_SIZING = re.compile(r"\\(?:left|right|middle|[bB]igg?[lr]?|displaystyle|textstyle|scriptstyle)(?![A-Za-z])")
_LATEX_FONT = re.compile(r"\\(?:text|textrm|textnormal|textbf|textit|mbox|mathrm|mathbf|mathit|mathsf|bold|boldsymbol|"
                         r"emph|operatorname)\s*\{([^{}]*)\}")
_LATEX_VARIANTS = [(re.compile(p + r"(?![A-Za-z])"), r) for p, r in [
    (r"\\[dtc]frac", r"\\frac"), (r"\\[dt]binom", r"\\binom"), (r"\\leq(?:slant)?", r"\\le"), (r"\\geq(?:slant)?", r"\\ge"),
    (r"\\neq", r"\\ne"), (r"\\(?:ldots|cdots|dotsm|dotsb|dotsc|dotso)", r"\\dots"), (r"\\lbrace", "{"), (r"\\rbrace", "}"),
    (r"\\to", r"\\rightarrow"), (r"\\gets", r"\\leftarrow"),
]]
_ESCAPED_PUNCT = re.compile(r"\\([^\w\s\\]|_)")  # \$ \% \{ \_ \* \# ... -> the character itself
_MD_EMPHASIS = re.compile(r"\*\*|__")
_UNICODE_MATH = str.maketrans({
    "\u2212": "-", "\u2013": "-", "\u2014": "-", "\u00d7": " \\times ", "\u00f7": " \\div ", "\u03c0": " \\pi ",
    "\u2264": " \\le ", "\u2265": " \\ge ", "\u2260": " \\ne ", "\u221a": " \\sqrt ", "\u221e": " \\infty ",
    "\u00b0": "^\\circ ", "\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'", "\u00a0": " ",
})
_DIGITS = re.compile(r"\d+")


def match_normalize(text: str) -> str:
    """The matching form of a problem text, for comparing it with benchmark items.

    Steps, in order: undo JSON escaping (runs of backslashes -> one; ``\\n``/``\\t``/``\\r`` not followed by a
    lower-case letter -> a space; ``\\uXXXX`` -> the character), Unicode NFKC plus the maths code points NFKC
    keeps (minus sign, ×, ≤, π, ° ...), math delimiters ``\\( \\) \\[ \\] $$`` -> ``$``, LaTeX spacing (``\\,``
    ``\\!`` ``\\;`` ``\\quad`` ``~``) -> a space, sizing (``\\left`` ``\\right`` ``\\big``) and style commands
    removed, font and text wrappers (``\\text{cm}``, ``\\mathbf{v}``) -> their content, command variants
    (``\\dfrac``/``\\tfrac``/``\\cfrac`` -> ``\\frac``, ``\\leq`` -> ``\\le``, ``\\cdots`` -> ``\\dots`` ...),
    escaped punctuation (Markdown ``\\*``, LaTeX ``\\$``, ``\\{``) -> the character, Markdown emphasis
    markers removed, ``{,}`` -> ``,``; then :func:`normalize` (lower case, collapsed whitespace).

    Digits are kept: two problems that differ in a number differ here too (the sibling layer of
    decontamination masks them on purpose, see :func:`mask_numbers`).

    Args:
        text: any unicode string (a benchmark item or a training problem).
    Returns:
        the matching form (possibly empty). Idempotent: ``match_normalize(match_normalize(t)) == match_normalize(t)``.
    """
    t = _BACKSLASH_RUN.sub(r"\\", text)
    t = _JSON_CTRL.sub(" ", t)
    t = _JSON_UNICODE.sub(lambda m: chr(int(m.group(1), 16)), t)
    t = unicodedata.normalize("NFKC", t).translate(_UNICODE_MATH)
    t = _MATH_DELIM.sub("$", t)
    t = _LATEX_SPACE.sub(" ", t)
    t = _LATEX_SIZING.sub("", t)
    for _ in range(2):  # \text{\textbf{x}}
        t = _LATEX_FONT.sub(r" \1 ", t)
    for pat, rep in _LATEX_VARIANTS:
        t = pat.sub(rep, t)
    t = _ESCAPED_PUNCT.sub(r"\1", t)
    t = _DOLLARS.sub("$", _MD_EMPHASIS.sub("", t).replace("{,}", ","))
    return normalize(t)


def match_tokens(text: str) -> list[str]:
    """Tokens (as :func:`tokens`) of :func:`match_normalize`'s form of ``text``."""
    return _TOKEN.findall(match_normalize(text))


def mask_numbers(toks: list[str]) -> list[str]:
    """Every digit run in every token replaced by ``0`` (``"141"`` -> ``"0"``, ``"2x"`` -> ``"0x"``): the
    token form under which a template sibling (same question, other numbers) equals its benchmark item."""
    return [_DIGITS.sub("0", t) for t in toks]
