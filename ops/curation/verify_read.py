"""Reading an answer whole, or not at all (case ``verify-truncated-gold-parse``), for :mod:`ops.curation.verify`.

math-verify 0.9.0 reads "1 - \\frac{1}{\\mathrm{e}}" as 1, "3 + \\mathrm{i}" as 3 and "1, 2, \\ldots, n" as 2:
its LaTeX parser fails on the notation and its plain-expression fallback extracts the first number, or
its unit remover drops a trailing "\\mathrm{e}" / variable ("2\\mathrm{e}" -> 2, "5t" -> 5). An answer is
therefore read with the LaTeX extractor only, after the notation normalisation
(:func:`ops.curation.verify_notation.normalize_notation`), and accepted only
when every number, letter and command of it is in what the parser read (``_missing_content``).

:func:`read_gold` reads a reference (its answer field, else the solution's last ``\\boxed{}``),
:func:`read_prediction` a response's final answer; both return what math-verify parsed, or nothing with the reason.
math-verify runs SIGALRM timeouts: call these in a process's main thread (:func:`ops.curation.verify.verify_many`
runs them in worker processes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .verify_notation import (_APPROX, _ELLIPSIS, _PLAIN_CONSTANTS, _missing_content, _qualifier,
                              _sympy_syntax_to_latex, last_boxed, normalize_notation)


def _has_math(parsed: list) -> bool:
    return any(not isinstance(p, str) for p in parsed)


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
