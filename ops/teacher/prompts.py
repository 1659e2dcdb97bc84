"""Prompt templates per answer type (Logics-STEM §2, stage 4: long chain-of-thought responses whose
final answer can be verified). Math answers end in ``\\boxed{}``; multiple choice ends with the
letter in ``\\boxed{}``."""

from __future__ import annotations

SYSTEM = "You are a careful STEM tutor. Reason step by step, then state the final answer."
TEMPLATES = {
    "numeric": "{problem}\n\nSolve the problem step by step. Put the final numeric answer in \\boxed{{}}.",
    "expression": "{problem}\n\nSolve the problem step by step. Put the final answer (an expression) in \\boxed{{}}.",
    "text": "{problem}\n\nThink it through step by step. Put the final answer in \\boxed{{}}.",
    "proof": "{problem}\n\nWrite a complete, rigorous proof. End with \\boxed{{\\text{{QED}}}}.",
    "multiple_choice": "{problem}\n\nThink step by step, then answer with the letter of the correct option in \\boxed{{}}, e.g. \\boxed{{B}}.",
}
LABEL_PROMPT = (
    "Classify the following question into exactly one domain from this list: {domains}.\n"
    "Answer with the domain name only.\n\nQuestion:\n{problem}"
)


def solve_messages(problem: str, answer_type: str) -> list[dict]:
    """Chat messages asking the teacher to solve ``problem`` in the format of ``answer_type``.

    Raises:
        KeyError: unknown answer type (names it).
    """
    if answer_type not in TEMPLATES:
        raise KeyError(f"no prompt template for answer type {answer_type!r}; known: {sorted(TEMPLATES)}")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TEMPLATES[answer_type].format(problem=problem)}]


def label_messages(problem: str, domains: list[str]) -> list[dict]:
    """Chat messages asking for the domain label of ``problem`` (the ``llm`` annotation path)."""
    return [{"role": "user", "content": LABEL_PROMPT.format(domains=", ".join(domains), problem=problem[:2000])}]


def parse_label(text: str, domains: list[str]) -> str | None:
    """The first domain name mentioned in the reply (longest names first), else None."""
    low = (text or "").lower().replace(" ", "_")
    for d in sorted(domains, key=len, reverse=True):
        if d in low:
            return d
    return None
