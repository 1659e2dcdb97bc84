"""Post-training data: the chat format with its loss mask and the programmatic task slice.

Logics-STEM (arXiv 2601.01562) §3, failure-driven post-training. The embedded student is a
GPT-2-style model of a few hundred thousand parameters (a D-CPT probe base): competition problems
are out of its reach, so the measurable slice is DeepMind ``mathematics_dataset`` modules with
short answers (``TASK_MODULES``), generated with seeds by ``ops.curation.mathgen``, next to the
curated ``sft_dataset`` rows.

Chat format (one example): ``PROMPT.format(problem=...)`` followed by ``" " + response`` and the
end-of-text token. Only response tokens (and the end-of-text token) carry loss. Programmatic
responses are ``\\boxed{answer}`` so the project's verifier reads them like any other response.
Packing of the examples into rows and the packed stream are the LM substrate's
(``ops.lm.data.pack``, ``ops.lm.data.PackedStream``).

Held-out templates: every generated problem carries its *template* (``template_of``: the text with
numbers, single-letter variables and option labels, and number/option lists abstracted, e.g.
``calculate the greatest common divisor of # and #.``), and every (module, template) pair has one
fixed *side* (``template_side``: a salted hash): ``eval`` templates are the only ones the
evaluation items use, ``synthesis`` templates the only ones the stage-2 synthesis pool uses, so the
stage-2 data of either arm never shares a template with the items it is scored on
(docs/posttrain.md, "What is held out").
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

from ops.lm.data import Example

PROMPT = "Question: {problem}\nAnswer:"

# Modules with short answers where the embedded student's stage-1 accuracy is neither 0 nor 1 on
# most slices. Measured (size m, 300 steps; benchmarks/results/failure_driven.json): 2-49% per
# module on the test split. Dropped after measuring (size l, 300 steps): arithmetic__add_or_sub,
# arithmetic__add_sub_multiple and numbers__round_number (0% after 300 steps: multi-digit
# arithmetic is out of reach at this size). Answer type per module: "text" (True/False, option
# letters: case-insensitive equality) or "numeric" (math-verify).
TASK_MODULES: dict[str, str] = {
    "comparison__pair": "numeric",
    "comparison__closest": "text",
    "comparison__kth_biggest": "text",
    "numbers__place_value": "numeric",
    "numbers__is_prime": "text",
    "numbers__is_factor": "text",
    "numbers__gcd": "numeric",
    "numbers__div_remainder": "numeric",
    "algebra__linear_1d": "numeric",
}
# mathematics_dataset entropy levels -> the curation difficulty scale (1-5)
DIFFICULTY_OF_LEVEL = {"train-easy": 1, "train-medium": 3, "train-hard": 5}

SIDES = ("eval", "synthesis")
TEMPLATE_SALT = "templates-85"
"""Salt of the template split. Chosen once, before any training, as the first salt in
``templates-0, templates-1, ...`` that leaves every ``TASK_MODULES`` module at least 30% of its items
on each side (measured on 200 problems per module and level, generator seed 7): coverage only, so
every module has evaluation items and synthesis items (tests/ops/test_posttrain_heldout.py)."""
EVAL_TEMPLATE_SHARE = 0.5
"""Probability mass of the hash that goes to the ``eval`` side."""
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
_LETTER = re.compile(r"\b[a-z]\b")
_OPTIONS = re.compile(r"\(v\)\s*#(?:\s*\(v\)\s*#)*")
_LIST = re.compile(r"#(?:\s*,\s*#)+")


def template_of(problem: str) -> str:
    """The template of a generated problem: lower-cased, every number (integer, decimal, fraction,
    sign included) -> ``#``, every single-letter word (variables, option labels) -> ``v``, an
    option list ``(v) # (v) # ...`` -> ``(v) #...`` and a number list ``#, #, ...`` -> ``#...``,
    whitespace collapsed. Two problems of one ``mathematics_dataset`` question template and one
    wording get the same template; ``Which is smaller: 3 or 5?`` and ``Which is bigger: 3 or 5?``
    do not."""
    s = _NUMBER.sub("#", problem.strip().lower())
    s = _LETTER.sub("v", s)
    s = _OPTIONS.sub("(v) #...", s)
    s = _LIST.sub("#...", s)
    return re.sub(r"\s+", " ", s)


def template_side(module: str, template: str, salt: str = TEMPLATE_SALT) -> str:
    """``eval`` or ``synthesis``: a fixed function of (module, template) (sha1 of the salted pair
    below ``EVAL_TEMPLATE_SHARE``: evaluation), so every seed and every run splits alike."""
    h = int(hashlib.sha1(f"{salt}\x1f{module}\x1f{template}".encode()).hexdigest()[:8], 16) / 2 ** 32
    return "eval" if h < EVAL_TEMPLATE_SHARE else "synthesis"


def answer_type_of_module(module: str, answer: str) -> str:
    """``text`` for word/letter answers (True/False, ``a``-``j``), else the module's type."""
    a = answer.strip()
    if a in ("True", "False") or (len(a) == 1 and a.isalpha()):
        return "text"
    return TASK_MODULES.get(module, "numeric")


def boxed(answer: str) -> str:
    """The programmatic response: ``\\boxed{answer}``."""
    return f"\\boxed{{{answer}}}"


def generated_rows(per_module: int, seed: int, modules: list[str] | None = None,
                   levels: tuple[str, ...] = ("train-easy", "train-medium"), origin: str = "generated",
                   side: str | None = None, max_rounds: int = 6) -> list[dict]:
    """Programmatic problems as post-training rows.

    Args:
        per_module: problems per (module, level) (>= 0).
        seed: generator seed; distinct seeds give the train, eval and synthesis pools.
        modules: module names (default ``TASK_MODULES``).
        levels: mathematics_dataset levels kept (generation stops before the first level that
            neither ``levels`` nor a later level needs: ``train-hard`` is not generated for nothing).
        side: None = every template; ``eval`` / ``synthesis`` = only problems whose template is on
            that side (``template_side``): up to ``per_module`` of them per (module, level), topped
            up from further generator streams (seed ``seed * 1000 + round``, rounds 1 ..
            ``max_rounds - 1``) while a (module, level) is short; a module whose templates all lie
            on the other side gives none.
    Returns:
        dicts with ``item_id`` (content hash), ``problem``, ``answer``, ``response`` (boxed),
        ``answer_type``, ``module``, ``level``, ``difficulty`` (1-5), ``domain`` ("math"),
        ``origin``, ``template`` and ``template_side``; no two with one ``item_id``.
    Raises:
        ValueError: unknown module (from the generator), or ``side`` not in ``SIDES``.
    """
    from ops.curation import mathgen

    if side is not None and side not in SIDES:
        raise ValueError(f"generated_rows: side must be one of {SIDES} or None, got {side!r}")
    mods = list(modules or TASK_MODULES)
    last = max(mathgen.DIFFICULTIES.index(lv) for lv in levels) if levels else -1
    out: list[dict] = []
    seen: set[str] = set()
    have: dict[tuple[str, str], int] = {}
    drawn: dict[str, int] = {}
    for rnd in range(max_rounds if side is not None else 1):
        # per module: the largest shortfall over its levels, scaled by the share of its draws that
        # were on the wanted side so far (round 0: twice the count when a side is asked for)
        asks: dict[int, list[str]] = {}
        for m in mods:
            short = max(per_module - have.get((m, lv), 0) for lv in levels) if levels else 0
            if short <= 0:
                continue
            if rnd == 0:
                n = per_module * (2 if side is not None else 1)
            else:
                share = sum(have.get((m, lv), 0) for lv in levels) / max(1, drawn.get(m, 0))
                n = int(np.ceil(1.25 * short / max(share, 0.1))) + 2
            asks.setdefault(n, []).append(m)
        if not asks or per_module == 0:
            break
        stream_seed = seed if rnd == 0 else seed * 1000 + rnd
        for n, group in sorted(asks.items()):
            out += _take(mathgen, n, stream_seed, group, levels, last, side, per_module, have, seen, drawn, origin)
    return out


def _take(mathgen, n: int, seed: int, modules: list[str], levels: tuple[str, ...], last: int, side: str | None,
          per_module: int, have: dict, seen: set, drawn: dict, origin: str) -> list[dict]:
    """One generator stream (``n`` per module and level) turned into rows, keeping what
    ``generated_rows`` wants; updates the counters ``have``, ``seen`` and ``drawn`` in place."""
    out = []
    for g in mathgen.generate(n, seed=seed, modules=modules):
        if mathgen.DIFFICULTIES.index(g["difficulty"]) > last:
            break  # levels come in order: nothing later is wanted
        if g["difficulty"] not in levels:
            continue
        drawn[g["module"]] = drawn.get(g["module"], 0) + 1
        q, a, m = g["question"], g["answer"], g["module"]
        t = template_of(q)
        ts = template_side(m, t)
        key = (m, g["difficulty"])
        if (side is not None and (ts != side or have.get(key, 0) >= per_module)):
            continue
        item_id = hashlib.sha1(f"{m}\x1f{q}".encode()).hexdigest()[:16]
        if item_id in seen:
            continue
        seen.add(item_id)
        have[key] = have.get(key, 0) + 1
        out.append({"item_id": item_id, "problem": q, "answer": a, "response": boxed(a),
                    "answer_type": answer_type_of_module(m, a), "module": m, "level": g["difficulty"],
                    "difficulty": DIFFICULTY_OF_LEVEL[g["difficulty"]], "domain": "math", "origin": origin,
                    "template": t, "template_side": ts})
    return out


def encode_example(tok, problem: str, response: str, eot_id: int) -> Example:
    """Tokenise one chat example; the loss mask is 1 exactly on the response tokens and the final
    end-of-text token, 0 on the prompt.

    ``tok`` is a ``tokenizers.Tokenizer``. Prompt and response are encoded separately (the prompt
    exactly as at evaluation), so the mask boundary is a token boundary.
    """
    p = tok.encode(PROMPT.format(problem=problem)).ids
    r = tok.encode(" " + response).ids + [eot_id]
    ids = np.asarray(p + r, dtype=np.int64)
    mask = np.concatenate([np.zeros(len(p), np.float32), np.ones(len(r), np.float32)])
    return Example(ids, mask)
