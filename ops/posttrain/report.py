"""The control that shows failure-driven post-training works (Logics-STEM, arXiv 2601.01562 §3):
stage 1, stage 2 on failure-targeted data, and stage 2 on the same amount of random extra data,
scored on the failure slices and overall, with bootstrap 95% intervals.

Slices (all on the ``test`` split of the programmatic evaluation items, never the ``dev`` items
that chose the regions): ``failure_slices`` = items in a targeted (module, difficulty) cell;
``other_slices`` = the rest; ``overall`` = all of them; plus one slice per targeted cell, and the
curated held-out and benchmark slices (reported, not part of the claim).

Stage-2 arms are trained with several data-order seeds; each item's correctness is averaged over
them before the bootstrap (``ops.posttrain.evaluate.average_seeds``), so the intervals cover item
sampling and are not fooled by one lucky training order (they do not cover a new stage-1 run).

The claim holds when (1) targeted minus random on the failure slices is positive with a paired
bootstrap 95% interval above 0, and (2) targeted does not lose overall accuracy: the interval of
targeted minus random overall reaches 0 or above (not significantly worse) — stated with the
numbers either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from .evaluate import accuracy_table, paired_difference

CHECKPOINTS = ("stage1", "stage2_targeted", "stage2_random")


@dataclass
class ComparisonParams:
    """Parameters of the comparison (:func:`compare`), the ``failure_driven_comparison`` run config.

    Attributes:
        n_boot: bootstrap resamples of the 95% intervals (percentile; paired for differences; >= 1).
        seed: seed of the resampling.
    Raises:
        ValueError: ``n_boot`` below 1.
    """

    n_boot: int = 1000
    seed: int = 0

    def __post_init__(self):
        if self.n_boot < 1:
            raise ValueError(f"failure_driven_comparison.n_boot must be >= 1, got {self.n_boot}")


def target_expr(targets: list[dict]) -> pl.Expr:
    """Boolean expression: the item lies in one of the targeted (module, difficulty) cells."""
    e = pl.lit(False)
    for t in targets:
        cell = pl.col("module") == t["module"]
        if t.get("difficulty") is not None:
            cell = cell & (pl.col("difficulty") == t["difficulty"])
        e = e | cell
    return e


def compare(scored: dict[str, pl.DataFrame], targets: list[dict], n_boot: int = ComparisonParams.n_boot,
            seed: int = ComparisonParams.seed) -> tuple[pl.DataFrame, dict]:
    """Accuracy table (checkpoint x slice, with intervals) and the verdict on the claim.

    Args:
        scored: ``CHECKPOINTS`` -> scored evaluation table (``ops.posttrain.evaluate.score``).
        targets: the synthesis targets (``module``, ``difficulty``).
    Returns:
        (table with ``checkpoint``, ``slice``, ``n``, ``accuracy``, ``ci_low``, ``ci_high``; verdict dict).
    Raises:
        ValueError: a checkpoint is missing.
    """
    missing = [c for c in CHECKPOINTS if c not in scored]
    if missing:
        raise ValueError(f"compare: no scored evaluation for {missing}")
    test = pl.col("split") == "test"
    prog = test & (pl.col("slice") == "programmatic")
    fail = prog & target_expr(targets).fill_null(False)
    slices = {"failure_slices": fail, "other_slices": prog & ~target_expr(targets).fill_null(False), "overall": prog}
    for t in targets:
        slices[f"cell:{t['module']}|{t.get('difficulty')}"] = prog & target_expr([t]).fill_null(False)
    for s in sorted(set(scored["stage1"].filter(test & (pl.col("slice") != "programmatic"))["slice"].to_list())):
        slices[s] = test & (pl.col("slice") == s)
    table = accuracy_table({c: scored[c] for c in CHECKPOINTS}, slices, n_boot=n_boot, seed=seed)
    d_fail = paired_difference(scored["stage2_targeted"], scored["stage2_random"], fail, n_boot, seed)
    d_all = paired_difference(scored["stage2_targeted"], scored["stage2_random"], prog, n_boot, seed)
    d_fail_s1 = paired_difference(scored["stage2_targeted"], scored["stage1"], fail, n_boot, seed)
    d_all_s1 = paired_difference(scored["stage2_targeted"], scored["stage1"], prog, n_boot, seed)
    beats = bool(d_fail["n"] > 0 and d_fail["ci_low"] > 0)
    keeps = bool(d_all["n"] > 0 and d_all["ci_high"] >= 0)
    verdict = {
        "targeted_minus_random_failure_slices": d_fail, "targeted_minus_random_overall": d_all,
        "targeted_minus_stage1_failure_slices": d_fail_s1, "targeted_minus_stage1_overall": d_all_s1,
        "targeted_beats_random_on_failure_slices": beats, "targeted_keeps_overall_accuracy": keeps,
        "claim_held": beats and keeps,
        "statement": _statement(beats, keeps, d_fail, d_all),
    }
    return table, verdict


def _statement(beats: bool, keeps: bool, d_fail: dict, d_all: dict) -> str:
    f = f"{100 * d_fail['diff']:+.1f} pts [{100 * d_fail['ci_low']:+.1f}, {100 * d_fail['ci_high']:+.1f}] on the failure slices (n={d_fail['n']})"
    o = f"{100 * d_all['diff']:+.1f} pts [{100 * d_all['ci_low']:+.1f}, {100 * d_all['ci_high']:+.1f}] overall (n={d_all['n']})"
    if beats and keeps:
        return f"claim held: targeted minus random {f}; {o}"
    why = []
    if not beats:
        why.append("targeted did not beat random on the failure slices beyond the interval")
    if not keeps:
        why.append("targeted lost overall accuracy against random")
    return f"claim not shown ({'; '.join(why)}): targeted minus random {f}; {o}"


def summary_rows(table: pl.DataFrame) -> list[dict]:
    """The table as JSON-ready rows with accuracies rounded to 4 decimals."""
    return [{k: (round(v, 4) if isinstance(v, float) and np.isfinite(v) else v) for k, v in r.items()}
            for r in table.iter_rows(named=True)]
