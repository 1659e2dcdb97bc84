"""What a decontamination run reports (Logics-STEM, arXiv 2601.01562 §2, stage 3; docs/curation.md,
"Decontamination"): the kept rows and the contamination report from the detector's flags, the
MATH-500 ground truth (MATH-500 is a verbatim subset of the MATH test set, so a ``math_test`` row
whose normalised text is a MATH-500 item is contaminated by construction), and precision and recall
per layer on the labelled set (``ops.curation.decontam_set``). Shared by ``decontaminated_problems``
and its sharded assembly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl


def decontam_tables(df: pl.DataFrame, bench: pl.DataFrame, flags: list) -> tuple[pl.DataFrame, pl.DataFrame, pl.Series]:
    """(kept, report, removed mask) of a decontamination: ``df``'s rows without the flagged ones, and the
    contamination report (one row per removal: the row, the benchmark item and its text, layer, score,
    needs_review, judge_reply); ``flags`` one detector result per row of ``df`` (None: clean).

    ``df`` needs problem_id, source, record, problem; ``bench`` item_id and problem."""
    mask = pl.Series([f is not None for f in flags], dtype=pl.Boolean)
    flagged = [f or {} for f in flags]
    report = df.select("problem_id", "source", "record", "problem").with_columns(
        benchmark=pl.Series([f.get("benchmark") for f in flagged], dtype=pl.String),
        item_id=pl.Series([f.get("item_id") for f in flagged], dtype=pl.String),
        layer=pl.Series([f.get("layer") for f in flagged], dtype=pl.String),
        score=pl.Series([f.get("score") for f in flagged], dtype=pl.Float64),
        needs_review=pl.Series([bool(f.get("needs_review")) for f in flagged], dtype=pl.Boolean),
        judge_reply=pl.Series([f.get("judge_reply") for f in flagged], dtype=pl.String),
    ).filter(mask)
    report = report.join(bench.select("item_id", benchmark_problem="problem"), on="item_id", how="left")
    return df.filter(~mask), report, mask


def decontam_eval(bench: pl.DataFrame, pool: list[str], params, embedder=None, per_kind: int = 40) -> dict:
    """Precision and recall per layer on the labelled decontamination set built from ``bench``'s MATH-500 items
    (ops.curation.decontam_set), for the run's own settings (``params``: a DecontamConfig) without the judge;
    ``pool``: real clean problems for the set's clean rows."""
    import dataclasses

    from ops.curation.decontam import Decontaminator
    from ops.curation.decontam_set import evaluate, labelled_set

    rows = labelled_set(bench.to_dicts(), pool, per_kind=per_kind)
    det = Decontaminator(bench.filter(pl.col("benchmark") == "math500").to_dicts(), dataclasses.replace(params, judge=False),
                         embedder=embedder)
    return evaluate(rows, det.run([r["problem"] for r in rows]))


@dataclass
class Math500Truth:
    """The MATH-500 ground truth of one run."""

    scores: dict
    """ops.curation.decontam.ground_truth_scores of the removals against MATH-500 on the math_test rows."""
    near_duplicates: pl.DataFrame
    """Report rows of math_test removed for a MATH-500 item whose text is not verbatim one (near copies)."""
    clean_pool: list[str]
    """math_test problems outside MATH-500 and GSM8K test items: real clean rows for the labelled set."""


def math500_truth(df: pl.DataFrame, bench: pl.DataFrame, flags: list, report: pl.DataFrame) -> Math500Truth:
    """Score the removals of ``flags`` (one per row of ``df``) against the MATH-500 ground truth; ``report``
    is ``decontam_tables``' report of the same flags."""
    from ops.curation.decontam import ground_truth_scores
    from ops.curation.text import normalize

    m500 = set(normalize(p) for p in bench.filter(pl.col("benchmark") == "math500")["problem"].to_list())
    is_math = (df["source"] == "math_test").to_numpy()
    truth = np.zeros(df.height, dtype=bool)
    truth[is_math] = [normalize(p) in m500 for p in df.filter(pl.Series(is_math))["problem"].to_list()]
    removed_m500 = pl.Series([bool(f) and f["benchmark"] == "math500" for f in flags]).to_numpy()
    near_dups = report.filter((pl.col("source") == "math_test") & (pl.col("benchmark") == "math500")).filter(
        ~pl.col("problem").map_elements(normalize, return_dtype=pl.String).is_in(list(m500)))
    pool = df.filter((pl.col("source") == "math_test") & ~pl.Series(truth))["problem"].to_list() + \
        bench.filter(pl.col("benchmark") == "gsm8k_test")["problem"].to_list()
    return Math500Truth(ground_truth_scores(removed_m500[is_math], truth[is_math]), near_dups, pool)
