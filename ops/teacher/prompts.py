"""Prompt templates per answer type (Logics-STEM §2, stage 4: long chain-of-thought responses whose
final answer can be verified). Math answers end in ``\\boxed{}``; multiple choice ends with the
letter in ``\\boxed{}``."""

from __future__ import annotations

SYSTEM = "You are a careful STEM tutor. Reason step by step, then state the final answer."
TEMPLATES = {  # "{problem}" is replaced by the problem text (no other formatting: LaTeX braces are literal)
    "numeric": "{problem}\n\nSolve the problem step by step. Put the final numeric answer in \\boxed{}.",
    "expression": "{problem}\n\nSolve the problem step by step. Put the final answer (an expression) in \\boxed{}.",
    "text": "{problem}\n\nThink it through step by step. Put the final answer in \\boxed{}.",
    "proof": "{problem}\n\nWrite a complete, rigorous proof. End with \\boxed{\\text{QED}}.",
    "multiple_choice": "{problem}\n\nThink step by step, then answer with the letter of the correct option in \\boxed{}, e.g. \\boxed{B}.",
}
LABEL_SYSTEM = "You label exam questions by school subject. Reply with the subject name only, never the answer."
LABEL_PROMPT = (
    "Question:\n{problem}\n\nDo not answer the question. Which subject is it from? "
    "Choose one of: {domains}.\nSubject:"
)
# reply words -> taxonomy domain (small models answer "Biology", "Earth science", ...)
LABEL_WORDS = {
    "math": "math", "mathematics": "math", "algebra": "math", "geometry": "math", "statistics": "math",
    "physics": "physics", "astronomy": "physics", "chemistry": "chemistry", "biology": "biology_medicine",
    "medicine": "biology_medicine", "anatomy": "biology_medicine", "computer": "computer_science",
    "programming": "computer_science", "engineering": "engineering", "earth": "other", "geology": "other",
    "other": "other",
}


def validate_templates(templates: dict[str, str]) -> None:
    """Raise ValueError naming the answer type whose template lacks ``{problem}`` or is unknown."""
    for answer_type, template in templates.items():
        if answer_type not in TEMPLATES:
            raise ValueError(f"prompt template for unknown answer type {answer_type!r}; known: {sorted(TEMPLATES)}")
        if "{problem}" not in template:
            raise ValueError(f"prompt template for {answer_type!r} must contain '{{problem}}'")


def solve_messages(problem: str, answer_type: str, templates: dict[str, str] | None = None) -> list[dict]:
    """Chat messages asking the teacher to solve ``problem`` in the format of ``answer_type``.

    ``templates`` overrides :data:`TEMPLATES` per answer type (run config).

    Raises:
        KeyError: unknown answer type (names it).
    """
    table = {**TEMPLATES, **(templates or {})}
    if answer_type not in table:
        raise KeyError(f"no prompt template for answer type {answer_type!r}; known: {sorted(table)}")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": table[answer_type].replace("{problem}", problem)}]


def label_messages(problem: str, domains: list[str]) -> list[dict]:
    """Chat messages asking for the domain label of ``problem`` (the ``llm`` annotation path)."""
    names = ", ".join(d.replace("_medicine", "").replace("_", " ") for d in domains)
    return [{"role": "system", "content": LABEL_SYSTEM},
            {"role": "user", "content": LABEL_PROMPT.format(domains=names, problem=problem[:2000])}]


def parse_label(text: str, domains: list[str]) -> str | None:
    """The domain named by the reply's *first* word (see LABEL_WORDS), else None. Strict on
    purpose: a reply that answers the question instead ("A. Do algae consume other organisms?")
    must not be read as the label "other"."""
    import re

    words = re.findall(r"[a-z]+", (text or "").lower())
    label = LABEL_WORDS.get(words[0]) if words else None
    return label if label in domains else None
