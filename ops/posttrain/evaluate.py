"""Scoring of a checkpoint's predictions: exact-answer accuracy through the project's verifier, per
slice, with bootstrap confidence intervals (Logics-STEM §3: evaluate, then find failure regions).

A prediction is correct when its final answer verifies against the item's reference answer with
``ops.curation.verify`` (math-verify with its guards for numbers and expressions, case-insensitive
equality for words and option letters). A boxed answer textually equal to the reference is accepted
without calling math-verify (same verdict, no process pool).
"""

from __future__ import annotations

import numpy as np
import polars as pl


def score(items: pl.DataFrame, predictions: pl.DataFrame, timeout_s: float = 5.0, workers: int = 2) -> pl.DataFrame:
    """Join predictions to their items and mark each correct or not.

    Args:
        items: ``item_id``, ``answer``, ``answer_type`` (and any slice columns, kept).
        predictions: ``item_id``, ``prediction``, ``response_loss`` (from ``ops.posttrain.sft``).
        timeout_s: verifier wall-clock seconds per item.
    Returns:
        ``items`` with ``prediction``, ``response_loss``, ``verify_status`` and ``correct`` (bool);
        an item without a prediction is not correct (status ``missing``).
    Raises:
        ValueError: a required column is missing (named).
    """
    from ops.curation.verify import VerifyItem, last_boxed, verify_many

    for name, df, cols in (("items", items, ("item_id", "answer", "answer_type")),
                           ("predictions", predictions, ("item_id", "prediction", "response_loss"))):
        missing = [c for c in cols if c not in df.columns]
        if missing:
            raise ValueError(f"score: {name} lacks column(s) {missing}")
    df = items.join(predictions.select("item_id", "prediction", "response_loss"), on="item_id", how="left")
    status: dict[str, str] = {}
    todo = []
    for r in df.select("item_id", "answer", "answer_type", "prediction").iter_rows(named=True):
        pred = r["prediction"]
        if pred is None:
            status[r["item_id"]] = "missing"
            continue
        final = last_boxed(pred)
        if final is not None and final.strip() == str(r["answer"]).strip():
            status[r["item_id"]] = "verified"
            continue
        todo.append(VerifyItem(r["item_id"], str(r["answer"]), None, pred, r["answer_type"]))
    if todo:
        for res in verify_many(todo, timeout_s=timeout_s, workers=workers):
            status[res["key"]] = res["status"]
    st = [status[i] for i in df["item_id"].to_list()]
    return df.with_columns(verify_status=pl.Series(st, dtype=pl.String),
                           correct=pl.Series([s == "verified" for s in st], dtype=pl.Boolean))


def average_seeds(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """Per-item correctness averaged over training seeds (scored frames of the same items).

    Returns the first frame with ``correct`` replaced by the mean over frames (Float64 in [0, 1])
    and ``seeds`` (int). Bootstrap over items of this mean averages out training-order noise.
    Raises:
        ValueError: no frames, or frames over different items.
    """
    if not frames:
        raise ValueError("average_seeds: no scored frames")
    ids = frames[0]["item_id"].to_list()
    for f in frames[1:]:
        if f["item_id"].to_list() != ids:
            raise ValueError("average_seeds: scored frames hold different items")
    mean = np.mean([f["correct"].cast(pl.Float64).to_numpy() for f in frames], axis=0)
    return frames[0].with_columns(correct=pl.Series(mean, dtype=pl.Float64), seeds=pl.lit(len(frames)))


def bootstrap_ci(values: np.ndarray, n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (shape (n,)); (nan, nan) when empty."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n_boot, v.size))].mean(1)
    a = (1 - level) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def accuracy_table(scored: dict[str, pl.DataFrame], slices: dict[str, pl.Expr], n_boot: int = 1000,
                   seed: int = 0) -> pl.DataFrame:
    """Accuracy with a bootstrap 95% interval for every (checkpoint, slice).

    Args:
        scored: checkpoint name -> ``score`` output (same items in each).
        slices: slice name -> boolean polars expression selecting its items.
    Returns:
        rows ``checkpoint``, ``slice``, ``n``, ``accuracy``, ``ci_low``, ``ci_high``.
    """
    rows = []
    for ck, df in scored.items():
        for name, expr in slices.items():
            v = df.filter(expr)["correct"].cast(pl.Float64).to_numpy()
            lo, hi = bootstrap_ci(v, n_boot, seed=seed)
            rows.append({"checkpoint": ck, "slice": name, "n": int(v.size),
                         "accuracy": float(v.mean()) if v.size else float("nan"), "ci_low": lo, "ci_high": hi})
    return pl.DataFrame(rows)


def paired_difference(a: pl.DataFrame, b: pl.DataFrame, expr: pl.Expr, n_boot: int = 1000, seed: int = 0) -> dict:
    """Accuracy of ``a`` minus ``b`` on the same items (paired bootstrap over items).

    Returns ``{"n", "diff", "ci_low", "ci_high"}``.
    Raises:
        ValueError: the two frames do not hold the same items.
    """
    x = a.filter(expr).select("item_id", ca=pl.col("correct").cast(pl.Float64))
    y = b.filter(expr).select("item_id", cb=pl.col("correct").cast(pl.Float64))
    j = x.join(y, on="item_id", how="inner")
    if j.height != x.height or j.height != y.height:
        raise ValueError(f"paired_difference: {x.height} vs {y.height} items, {j.height} shared")
    d = (j["ca"] - j["cb"]).to_numpy()
    lo, hi = bootstrap_ci(d, n_boot, seed=seed)
    return {"n": int(d.size), "diff": float(d.mean()) if d.size else float("nan"), "ci_low": lo, "ci_high": hi}
