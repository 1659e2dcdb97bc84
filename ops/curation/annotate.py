"""Annotation: domain, difficulty, answer type and validity, each with its provenance.

Source: Logics-STEM (arXiv 2601.01562) §2, stage 1. The paper labels with an LLM; we label from
source metadata where it exists (provenance ``rule``), else with a scikit-learn classifier trained
on the rule-labelled rows (provenance ``classifier``); the teacher LLM (provenance ``llm``) is a
later path for rows the classifier is unsure of (``domain_confidence`` below a threshold).

Domain taxonomy (fixed): math, physics, chemistry, biology_medicine, computer_science,
engineering, other.

Difficulty scale (ordinal 1-5, one scale for every source):
  1 elementary / grade school (MMLU elementary_*, ARC-Easy, mathematics_dataset train-easy,
    MATH Level 1);
  2 middle/high school (MMLU high_school_*, ARC-Challenge, mathematics_dataset train-medium,
    MATH Level 2);
  3 advanced high school / intro college (MMLU college_* and other STEM subjects,
    mathematics_dataset train-hard, MATH Level 3);
  4 competition / professional (MMLU abstract_algebra, professional_*, MATH Level 4);
  5 olympiad-style (MATH Level 5).

Answer types: numeric, expression, multiple_choice, proof, text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DOMAINS = ("math", "physics", "chemistry", "biology_medicine", "computer_science", "engineering", "other")
ANSWER_TYPES = ("numeric", "expression", "multiple_choice", "proof", "text")
DIFFICULTIES = (1, 2, 3, 4, 5)


@dataclass
class AnnotateParams:
    """Parameters of annotation (:func:`annotate` and the teacher's ``llm`` labels), the
    ``annotated_problems`` run config.

    Raises:
        ValueError: a field outside its range (the message names it).
    """

    seed: int = 0
    """Seed of the per-class subsampling, the classifiers and the rows sent to the teacher."""
    max_per_class: int = 2000
    """Rule-labelled rows per class used to fit each classifier (>= 1; larger classes are subsampled)."""
    min_confidence: float = 0.5
    """Domain labels from the classifier below this confidence are flagged needs_llm_label (>= 0; above 1
    flags every classifier domain label). Rows with no domain at all are flagged too; difficulty labels
    never are."""
    llm_label_max_rows: int = 16
    """Rows the classifier is unsure of (needs_llm_label) sent to the teacher for a domain label
    (>= 0; 0 = no teacher call)."""

    def __post_init__(self):
        if self.max_per_class < 1:
            raise ValueError(f"annotate.max_per_class must be >= 1, got {self.max_per_class}")
        if not self.min_confidence >= 0.0:
            raise ValueError(f"annotate.min_confidence must be >= 0 (above 1 flags every classifier label), got {self.min_confidence}")
        if self.llm_label_max_rows < 0:
            raise ValueError(f"annotate.llm_label_max_rows must be >= 0, got {self.llm_label_max_rows}")

_MMLU_DOMAIN = {
    "math": ("abstract_algebra", "college_mathematics", "elementary_mathematics", "high_school_mathematics",
             "high_school_statistics", "econometrics", "formal_logic"),
    "physics": ("astronomy", "college_physics", "conceptual_physics", "high_school_physics"),
    "chemistry": ("college_chemistry", "high_school_chemistry"),
    "biology_medicine": ("anatomy", "clinical_knowledge", "college_biology", "college_medicine", "high_school_biology",
                         "medical_genetics", "nutrition", "professional_medicine", "virology", "human_aging"),
    "computer_science": ("college_computer_science", "computer_security", "high_school_computer_science",
                         "machine_learning"),
    "engineering": ("electrical_engineering",),
}
MMLU_SUBJECT_DOMAIN = {s: d for d, subs in _MMLU_DOMAIN.items() for s in subs}
# Subject words a user's ``subject`` field may carry (case-insensitive), besides the taxonomy's own
# names, MMLU subject names and the MATH subjects.
SUBJECT_SYNONYMS = {
    "mathematics": "math", "maths": "math", "algebra": "math", "calculus": "math", "geometry": "math",
    "statistics": "math", "probability": "math", "number_theory": "math", "combinatorics": "math",
    "counting_and_probability": "math", "intermediate_algebra": "math", "prealgebra": "math", "precalculus": "math",
    "trigonometry": "math", "linear_algebra": "math",
    "biology": "biology_medicine", "medicine": "biology_medicine", "genetics": "biology_medicine",
    "chem": "chemistry", "organic_chemistry": "chemistry",
    "computer_science": "computer_science", "cs": "computer_science", "programming": "computer_science",
    "mechanics": "physics", "electromagnetism": "physics", "thermodynamics": "physics",
    "engineering": "engineering", "electrical_engineering": "engineering",
}


def subject_domain(subject: str | None) -> str | None:
    """Domain for a user-supplied subject (taxonomy name, MMLU/MATH subject or a known synonym)."""
    key = (subject or "").strip().lower().replace(" ", "_").replace("-", "_")
    if key in DOMAINS:
        return key
    return MMLU_SUBJECT_DOMAIN.get(key) or SUBJECT_SYNONYMS.get(key)
_NUMERIC = re.compile(r"^\s*-?\s*(\d+(\.\d+)?|\.\d+|\\[dt]?frac\{-?\d+\}\{\d+\}|-?\d+/\d+|\d{1,3}(,\d{3})+)\s*$")
_PROOF = re.compile(r"\b(prove|show that|demonstrate that)\b", re.I)


def answer_type_of(answer: str | None, choices, problem: str, solution: str | None) -> str:
    """Rule for the answer type from the reference answer's form."""
    if choices:
        return "multiple_choice"
    if answer is None or not str(answer).strip():
        return "proof" if _PROOF.search(problem or "") else "text"
    a = str(answer).strip().strip("$")
    if _NUMERIC.match(a):
        return "numeric"
    if a in ("True", "False") or re.fullmatch(r"[A-Za-z ]+", a):
        return "text"
    return "expression"


def _mmlu_difficulty(subject: str) -> int:
    if subject.startswith("elementary_"):
        return 1
    if subject.startswith("high_school_"):
        return 2
    if subject == "abstract_algebra" or subject.startswith("professional_"):
        return 4
    return 3


def rule_labels(row: dict) -> dict:
    """Labels derivable from a raw row's source metadata; missing ones are None.

    Returns:
        dict with ``domain``, ``difficulty`` (1-5), ``answer_type`` (always set) and
        ``out_of_scope`` (True for MMLU subjects outside the STEM taxonomy).
    """
    src, subject, level = row["source"], row.get("subject") or "", row.get("level") or ""
    out = {"domain": None, "difficulty": None, "out_of_scope": False}
    if src == "math_test":
        out["domain"] = "math"
        m = re.search(r"(\d)", level)
        out["difficulty"] = int(m.group(1)) if m else None
    elif src == "mathematics_dataset":
        out["domain"] = "math"
        out["difficulty"] = {"train-easy": 1, "train-medium": 2, "train-hard": 3}.get(level)
    elif src == "mmlu_dev_val":
        out["domain"] = MMLU_SUBJECT_DOMAIN.get(subject, "other")
        out["out_of_scope"] = subject not in MMLU_SUBJECT_DOMAIN
        out["difficulty"] = _mmlu_difficulty(subject)
    elif src == "arc":
        out["difficulty"] = 1 if subject == "ARC-Easy" else 2
    else:  # user sources: a mapped subject is used when it names a known subject (subject_domain)
        out["domain"] = subject_domain(subject)
        if str(level).strip() in {"1", "2", "3", "4", "5"}:
            out["difficulty"] = int(str(level).strip())
    out["answer_type"] = answer_type_of(row.get("answer"), row.get("choices"), row.get("problem", ""), row.get("solution"))
    return out


def validity(row: dict, labels: dict, max_chars: int = 20_000) -> tuple[bool, str]:
    """(is_valid, reason). Reasons: ok, empty_problem, problem_too_long, out_of_scope_non_stem,
    no_reference_answer (neither an answer nor a \\boxed{} in the solution)."""
    from .verify import last_boxed

    p = row.get("problem") or ""
    if not p.strip():
        return False, "empty_problem"
    if len(p) > max_chars:
        return False, "problem_too_long"
    if labels.get("out_of_scope"):
        return False, "out_of_scope_non_stem"
    has_answer = bool(row.get("answer") and str(row["answer"]).strip()) or last_boxed(row.get("solution")) is not None
    if not has_answer and labels.get("answer_type") != "proof":
        return False, "no_reference_answer"
    return True, "ok"


class LabelClassifier:
    """TF-IDF (word 1-2 grams) + logistic regression for one label, with held-out accuracy.

    Args:
        seed: random state of the split and the model.
        test_size: held-out fraction for the reported accuracy.
    """

    def __init__(self, seed: int = 0, test_size: float = 0.2, max_features: int = 50_000):
        self.seed, self.test_size, self.max_features = seed, test_size, max_features
        self.model = None
        self.report: dict = {}

    def fit(self, texts: list[str], labels: list) -> "LabelClassifier":
        """Fit on the labelled rows; ``report`` gets held-out accuracy, macro-F1 and sizes.

        Raises:
            ValueError: fewer than 2 classes or fewer than 10 rows.
        """
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.metrics import accuracy_score, f1_score
        from sklearn.model_selection import train_test_split
        from sklearn.pipeline import make_pipeline

        if len(texts) < 10 or len(set(labels)) < 2:
            raise ValueError(f"classifier needs >= 10 rows and >= 2 classes, got {len(texts)} rows, {len(set(labels))} classes")

        def make():
            return make_pipeline(
                TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2, max_features=self.max_features),
                LogisticRegression(max_iter=1000, class_weight="balanced", random_state=self.seed),
            )

        counts = {c: labels.count(c) for c in set(labels)}
        strat = labels if min(counts.values()) >= 2 else None
        xtr, xte, ytr, yte = train_test_split(texts, labels, test_size=self.test_size, random_state=self.seed, stratify=strat)
        held = make().fit(xtr, ytr)
        pred = held.predict(xte)
        self.report = {
            "heldout_accuracy": float(accuracy_score(yte, pred)),
            "heldout_macro_f1": float(f1_score(yte, pred, average="macro")),
            "train_rows": len(xtr),
            "heldout_rows": len(xte),
            "classes": {str(k): v for k, v in sorted(counts.items(), key=lambda kv: str(kv[0]))},
        }
        self.model = make().fit(texts, labels)
        return self

    def predict(self, texts: list[str]) -> tuple[list, list[float]]:
        """(labels, confidence = max class probability) for each text."""
        if self.model is None:
            raise RuntimeError("LabelClassifier.predict called before fit")
        if not texts:
            return [], []
        proba = self.model.predict_proba(texts)
        classes = self.model.classes_
        idx = proba.argmax(axis=1)
        return [classes[i].item() if hasattr(classes[i], "item") else classes[i] for i in idx], proba.max(axis=1).tolist()


def annotate(rows: list[dict], seed: int = AnnotateParams.seed, max_per_class: int = AnnotateParams.max_per_class,
             min_confidence: float = AnnotateParams.min_confidence) -> tuple[list[dict], dict]:
    """Annotate raw rows: rule labels first, classifier labels for the gaps, then validity.

    Each output row gains ``domain``, ``difficulty``, ``answer_type``, ``<label>_provenance``
    (rule | classifier), ``domain_confidence`` (1.0 for rules), ``needs_llm_label`` (classifier
    confidence below ``min_confidence``), ``is_valid`` and ``invalid_reason``.

    ``seed``, ``max_per_class`` and ``min_confidence`` mean (and are validated) as in
    :class:`AnnotateParams`.

    Returns:
        (rows, report): report holds each classifier's held-out accuracy and label counts.
    """
    import random

    labels = [rule_labels(r) for r in rows]
    report: dict = {}
    rng = random.Random(seed)
    for key in ("domain", "difficulty"):
        known = [i for i, lab in enumerate(labels) if lab[key] is not None]
        missing = [i for i, lab in enumerate(labels) if lab[key] is None]
        by_class: dict = {}
        for i in known:
            by_class.setdefault(labels[i][key], []).append(i)
        train_idx = []
        for cls in sorted(by_class, key=str):
            idx = by_class[cls]
            train_idx.extend(idx if len(idx) <= max_per_class else rng.sample(idx, max_per_class))
        clf = None
        if len(train_idx) >= 10 and len(by_class) >= 2:
            clf = LabelClassifier(seed=seed).fit([rows[i]["problem"] for i in train_idx], [labels[i][key] for i in train_idx])
            report[f"{key}_classifier"] = clf.report
        preds, conf = clf.predict([rows[i]["problem"] for i in missing]) if clf else ([None] * len(missing), [0.0] * len(missing))
        for i in known:
            labels[i][f"{key}_provenance"] = "rule"
            labels[i][f"{key}_confidence"] = 1.0
        for i, p, c in zip(missing, preds, conf):
            labels[i][key] = p
            labels[i][f"{key}_provenance"] = "classifier" if p is not None else None
            labels[i][f"{key}_confidence"] = float(c)
    out = []
    for r, lab in zip(rows, labels):
        ok, reason = validity(r, lab)
        o = dict(r)
        o.update(
            domain=lab["domain"] or "other",
            difficulty=int(lab["difficulty"]) if lab["difficulty"] is not None else 3,
            answer_type=lab["answer_type"],
            domain_provenance=lab["domain_provenance"] or "default",
            difficulty_provenance=lab["difficulty_provenance"] or "default",
            answer_type_provenance="rule",
            domain_confidence=lab["domain_confidence"],
            needs_llm_label=lab["domain"] is None
            or (lab["domain_provenance"] == "classifier" and lab["domain_confidence"] < min_confidence),
            is_valid=ok,
            invalid_reason=reason,
        )
        out.append(o)
    return out, report


def llm_label_requests(rows: list[dict], params: AnnotateParams) -> list:
    """The ``llm`` provenance path's requests: for up to ``params.llm_label_max_rows`` rows the
    classifier is unsure of (``needs_llm_label``; ops.curation.distill.select_rows, seeded), one
    greedy 8-token teacher request asking for the domain (tag = problem_id). Returns ChatRequests."""
    from ops.curation.distill import select_rows
    from ops.teacher.client import ChatRequest
    from ops.teacher.prompts import label_messages

    unsure = select_rows([r for r in rows if r["needs_llm_label"]], params.llm_label_max_rows, seed=params.seed)
    return [ChatRequest.make(label_messages(r["problem"], list(DOMAINS)), {"temperature": 0.0, "max_tokens": 8}, tag=r["problem_id"])
            for r in unsure]


def apply_llm_labels(rows: list[dict], results: list) -> dict:
    """Set the teacher's domain (provenance ``llm``) on ``rows`` (in place) from the results of
    :func:`llm_label_requests`; a failed request or a reply that names no domain leaves the row as
    it was. Returns counts: asked, labelled, unparsed, failed."""
    from ops.teacher.prompts import parse_label

    by_id = {r["problem_id"]: r for r in rows}
    labelled = failed = unparsed = 0
    for res in results:
        if res.status != "ok":
            failed += 1
            continue
        label = parse_label(res.text, list(DOMAINS))
        if label is None:
            unparsed += 1
            continue
        by_id[res.request.tag].update(domain=label, domain_provenance="llm", needs_llm_label=False)
        labelled += 1
    return {"asked": len(results), "labelled": labelled, "unparsed": unparsed, "failed": failed}
