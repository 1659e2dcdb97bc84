"""Stratified sampling to a target size with a per-stratum floor.

Source: Logics-STEM (arXiv 2601.01562) §2, stage 5 — 10M -> 2.2M preserving coverage over the
annotation strata (domain x difficulty x answer type). Our allocation: every stratum gets
``min(size, floor)`` rows (small strata are kept whole); the rest of the budget is split in
proportion to the remaining stratum sizes by the largest-remainder method, so the plan sums to
exactly ``target`` (or to the population when it is smaller).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl


@dataclass
class SftParams:
    """Parameters of the stratified SFT sample (:func:`stratified_sample`), the ``sft_dataset`` run
    config.

    Raises:
        ValueError: a field out of range (the message names it and every range).
    """

    target_size: int = 2000
    """Rows in the SFT dataset (>= 1; all verified rows when fewer)."""
    stratum_floor: int = 20
    """Minimum rows per stratum (domain x difficulty x answer type; >= 0); smaller strata are kept whole."""
    seed: int = 0
    """Seed of the within-stratum ranking (a seeded hash of ``problem_id``)."""
    tolerance: float = 0.05
    """Allowed relative deviation of a stratum from the plan, in [0, 0.5] (at least one row either way;
    checked by the blocking asset check ``sft_strata_match_plan``)."""

    def __post_init__(self):
        for name, ok in (("target_size", self.target_size >= 1), ("stratum_floor", self.stratum_floor >= 0),
                         ("tolerance", 0.0 <= self.tolerance <= 0.5)):
            if not ok:
                raise ValueError(f"sft_dataset.{name} out of range: {getattr(self, name)} "
                                 "(target_size >= 1, stratum_floor >= 0, 0 <= tolerance <= 0.5)")


def allocate(sizes: dict[tuple, int], target: int, floor: int) -> dict[tuple, int]:
    """Rows to take from each stratum.

    Args:
        sizes: stratum -> population size (>= 0).
        target: total rows wanted (>= 0).
        floor: minimum per stratum (>= 0); strata smaller than the floor are kept whole.
    Returns:
        stratum -> allocated count, with 0 <= count <= size and sum == min(target, sum(sizes)).
    Raises:
        ValueError: negative target or floor.
    """
    if target < 0 or floor < 0:
        raise ValueError(f"sft_dataset.target_size and stratum_floor must be >= 0, got {target}, {floor}")
    total = sum(sizes.values())
    if target >= total:
        return dict(sizes)
    alloc = {k: min(v, floor) for k, v in sizes.items()}
    base = sum(alloc.values())
    if base > target:  # floors alone exceed the budget: shrink floors proportionally
        scale = target / base
        alloc = {k: math.floor(v * scale) for k, v in alloc.items()}
        base = sum(alloc.values())
    budget = target - base
    rest = {k: sizes[k] - alloc[k] for k in sizes}
    rest_total = sum(rest.values())
    if budget > 0 and rest_total > 0:
        quotas = {k: budget * rest[k] / rest_total for k in sizes}
        extra = {k: min(math.floor(q), rest[k]) for k, q in quotas.items()}
        left = budget - sum(extra.values())
        order = sorted(sizes, key=lambda k: (-(quotas[k] - math.floor(quotas[k])), str(k)))
        for k in order:
            if left == 0:
                break
            if extra[k] < rest[k]:
                extra[k] += 1
                left -= 1
        alloc = {k: alloc[k] + extra[k] for k in sizes}
    # any remainder left by floors/caps goes to strata with room, largest first
    left = target - sum(alloc.values())
    for k in sorted(sizes, key=lambda k: (-(sizes[k] - alloc[k]), str(k))):
        if left <= 0:
            break
        take = min(left, sizes[k] - alloc[k])
        alloc[k] += take
        left -= take
    return alloc


def stratified_sample(df: pl.DataFrame, strata: list[str], target: int, floor: int, seed: int = SftParams.seed) -> tuple[pl.DataFrame, dict]:
    """Sample ``df`` by :func:`allocate` over the ``strata`` columns; deterministic for a seed.

    Within a stratum rows are ranked by a seeded hash of ``problem_id``, so the choice does not
    depend on input order. Returns (sample, plan) where plan maps "a|b|c" -> allocated count.
    """
    if df.is_empty():
        return df, {}
    sizes_df = df.group_by(strata).len()
    sizes = {tuple(r[:-1]): r[-1] for r in sizes_df.iter_rows()}
    alloc = allocate(sizes, target, floor)
    alloc_df = pl.DataFrame(
        [list(k) + [v] for k, v in alloc.items()], schema=strata + ["_alloc"], orient="row"
    ).cast({c: df.schema[c] for c in strata})
    ranked = df.with_columns(_h=pl.col("problem_id").hash(seed=seed)).with_columns(
        _r=pl.col("_h").rank("ordinal").over(strata)
    )
    sample = ranked.join(alloc_df, on=strata, how="left").filter(pl.col("_r") <= pl.col("_alloc"))
    plan = {"|".join(str(x) for x in k): v for k, v in sorted(alloc.items(), key=lambda kv: str(kv[0]))}
    return sample.drop("_h", "_r", "_alloc").sort("problem_id"), plan


STRATA = ["domain", "difficulty", "answer_type"]
"""The annotation strata of the SFT sample (domain x difficulty x answer type)."""
SFT_COLUMNS = ["problem_id", "source", "record", "domain", "difficulty", "answer_type", "problem", "answer",
               "response", "response_source"]
"""The columns ``sft_dataset`` publishes, before the chat ``messages``."""


def sft_rows(sample: pl.DataFrame) -> pl.DataFrame:
    """``sample``'s :data:`SFT_COLUMNS` plus ``messages``: the user's problem and the assistant's
    response, the chat layout the Hugging Face SFT trainers read. Raises polars' ColumnNotFoundError
    naming a missing column."""
    return sample.select(SFT_COLUMNS).with_columns(
        messages=pl.concat_list(
            pl.struct(role=pl.lit("user"), content=pl.col("problem")),
            pl.struct(role=pl.lit("assistant"), content=pl.col("response")),
        )
    )


def stratum_histogram(before: pl.DataFrame, after: pl.DataFrame) -> tuple[list[str], dict[str, list[int]]]:
    """Rows per stratum before and after sampling: (labels ``domain|difficulty|answer_type``,
    {"verified (before)": counts, "sft_dataset (after)": counts}), strata of ``before`` in order."""
    b = before.group_by(STRATA).len(name="rows").sort(STRATA)
    joined = b.join(after.group_by(STRATA).len(name="rows"), on=STRATA, how="left", suffix="_after").fill_null(0)
    labels = ["|".join(str(x) for x in r[:3]) for r in joined.iter_rows()]
    return labels, {"verified (before)": joined["rows"].to_list(), "sft_dataset (after)": joined["rows_after"].to_list()}


def dataset_card(df: pl.DataFrame, lineage: dict, run_id: str) -> str:
    """The Hugging Face dataset card (README.md with a ``configs`` header) of the SFT dataset ``df``:
    row count, the Dagster run, lineage (table -> {data_version, rows}) and rows per stratum."""
    strata = df.group_by(STRATA).len(name="rows").sort(STRATA)
    rows = "\n".join(f"| {d} | {k} | {a} | {n} |" for d, k, a, n in strata.iter_rows())
    lin = "\n".join(f"| {name} | {v['data_version']} | {v['rows']} |" for name, v in lineage.items())
    return f"""---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*.parquet
license: other
task_categories: [text-generation]
---
# Crucible STEM SFT dataset

Verified responses to curated STEM problems (Logics-STEM curation: annotate, exact + MinHash dedup,
benchmark decontamination, verified distillation, stratified sampling).
Rows: {df.height}. Dagster run: `{run_id}`.

Load: `datasets.load_dataset("parquet", data_dir="<this folder>")["train"]`

## Lineage (upstream tables and their data versions)
| table | data version | rows |
|---|---|---|
{lin}

## Strata (domain x difficulty x answer type)
| domain | difficulty | answer type | rows |
|---|---|---|---|
{rows}
"""
