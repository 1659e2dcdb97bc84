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

Three modules: :mod:`ops.curation.verify_notation` (answer text: the final answer, notation rewrites, content
tokens), :mod:`ops.curation.verify_read` (reading an answer whole with math-verify, or refusing it with the
reason) and this one (comparing two readings, letters and words; one item, and many in a process pool). Every
public name of the first two is importable from here.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .verify_notation import answers_agree, final_answer_text, last_boxed, normalize_notation
from .verify_read import Reading, _first_expr, parse_gold, read_answer, read_gold, read_prediction

__all__ = [
    "LETTER_PATTERNS", "RETRY_FACTOR", "Reading", "VerifyItem", "answers_agree", "decided_without_math_verify",
    "extract_letter", "final_answer_text", "last_boxed", "normalize_notation", "parse_gold", "read_answer",
    "read_gold", "read_prediction", "verify_many", "verify_math", "verify_one", "verify_parsed", "verify_stable",
    "work_key",
]

LETTER_PATTERNS = [
    re.compile(r"\\boxed\{\s*\(?([A-J])\)?\s*\}"),
    re.compile(r"answer is:?\s*\(?([A-J])\)?\b", re.I),
    re.compile(r"^\s*\(?([A-J])\)?[.)]?\s*$", re.M),
]


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
