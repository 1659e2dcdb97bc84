"""Polars schemas of the problem tables (docs/curation.md, "Problem tables") and dict <-> frame conversion."""


import polars as pl

RAW_SCHEMA = {
    "problem_id": pl.String,
    "source": pl.String,
    "record": pl.String,
    "problem": pl.String,
    "solution": pl.String,
    "answer": pl.String,
    "choices": pl.List(pl.String),
    "subject": pl.String,
    "level": pl.String,
    "split": pl.String,
}
ANNOTATION_SCHEMA = {
    "domain": pl.String,
    "difficulty": pl.Int64,
    "answer_type": pl.String,
    "domain_provenance": pl.String,
    "difficulty_provenance": pl.String,
    "answer_type_provenance": pl.String,
    "domain_confidence": pl.Float64,
    "needs_llm_label": pl.Boolean,
    "is_valid": pl.Boolean,
    "invalid_reason": pl.String,
}
QUARANTINE_SCHEMA = {
    "source": pl.String,
    "file": pl.String,
    "line": pl.Int64,
    "field": pl.String,
    "reason": pl.String,
    "raw": pl.String,
}


def frame(rows: list[dict], schema: dict) -> pl.DataFrame:
    """Rows -> frame with exactly ``schema``'s columns (extra keys dropped, missing ones null)."""
    return pl.DataFrame([{k: r.get(k) for k in schema} for r in rows], schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
