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
"""

from __future__ import annotations

import hashlib

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
                   levels: tuple[str, ...] = ("train-easy", "train-medium"), origin: str = "generated") -> list[dict]:
    """Programmatic problems as post-training rows.

    Args:
        per_module: problems per (module, level) (>= 0).
        seed: generator seed; distinct seeds give the train, eval and synthesis pools.
        modules: module names (default ``TASK_MODULES``).
        levels: mathematics_dataset levels kept.
    Returns:
        dicts with ``item_id`` (content hash), ``problem``, ``answer``, ``response`` (boxed),
        ``answer_type``, ``module``, ``level``, ``difficulty`` (1-5), ``domain`` ("math"), ``origin``.
    Raises:
        ValueError: unknown module (from the generator).
    """
    from ops.curation import mathgen

    mods = list(modules or TASK_MODULES)
    out = []
    for g in mathgen.generate(per_module, seed=seed, modules=mods):
        if g["difficulty"] not in levels:
            continue
        q, a = g["question"], g["answer"]
        out.append({"item_id": hashlib.sha1(f"{g['module']}\x1f{q}".encode()).hexdigest()[:16], "problem": q,
                    "answer": a, "response": boxed(a), "answer_type": answer_type_of_module(g["module"], a),
                    "module": g["module"], "level": g["difficulty"], "difficulty": DIFFICULTY_OF_LEVEL[g["difficulty"]],
                    "domain": "math", "origin": origin})
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
