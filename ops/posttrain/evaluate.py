"""Scoring of a checkpoint's predictions: exact-answer accuracy through the project's verifier, per
slice, with bootstrap confidence intervals (Logics-STEM §3: evaluate, then find failure regions).

A prediction is correct when its final answer verifies against the item's reference answer with
``ops.curation.verify`` (math-verify with its guards for numbers and expressions, case-insensitive
equality for words and option letters). A boxed answer textually equal to the reference is accepted
without calling math-verify (same verdict, no process pool). An item whose verification timed out
or crashed is verified again once with ``RETRY_FACTOR`` times the time limit
(``ops.curation.verify.verify_stable``), so a loaded machine does not turn a right answer into a
wrong one and two runs score alike.
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl


_INTEGER = re.compile(r"-?\d+")


def score(items: pl.DataFrame, predictions: pl.DataFrame, timeout_s: float = 5.0, workers: int = 2) -> pl.DataFrame:
    """Join predictions to their items and mark each correct or not (``score_many`` of one frame).

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
    return score_many(items, [predictions], timeout_s, workers)[0]


def score_many(items: pl.DataFrame, predictions: list[pl.DataFrame], timeout_s: float = 5.0,
               workers: int = 2) -> list[pl.DataFrame]:
    """``score`` for several checkpoints' predictions of the same items, with one verifier pool.

    Per prediction: no prediction -> ``missing``; a last ``\\boxed{}`` textually equal to the answer
    -> ``verified``; a ``text`` answer (True/False, option letters) -> the verifier's word rule
    (``ops.curation.verify.verify_one``: pure Python, run here); a boxed integer against an integer
    reference -> integer equality (what math-verify decides for two integers); the rest -> math-verify in one
    ``verify_stable`` call for all frames (timeouts retried once). Returns one scored frame per
    element of ``predictions``, in order. Raises ValueError naming a missing column.
    """
    from ops.curation.verify import VerifyItem, last_boxed, verify_one, verify_stable

    for name, df, cols in [("items", items, ("item_id", "answer", "answer_type"))] + \
            [(f"predictions[{k}]", p, ("item_id", "prediction", "response_loss")) for k, p in enumerate(predictions)]:
        missing = [c for c in cols if c not in df.columns]
        if missing:
            raise ValueError(f"score: {name} lacks column(s) {missing}")
    frames = [items.join(p.select("item_id", "prediction", "response_loss"), on="item_id", how="left") for p in predictions]
    status: list[dict[str, str]] = [{} for _ in frames]
    todo, where = [], []
    for k, df in enumerate(frames):
        for r in df.select("item_id", "answer", "answer_type", "prediction").iter_rows(named=True):
            pred, iid = r["prediction"], r["item_id"]
            if pred is None:
                status[k][iid] = "missing"
                continue
            final = last_boxed(pred)
            if final is not None and final.strip() == str(r["answer"]).strip():
                status[k][iid] = "verified"
                continue
            item = VerifyItem(f"{k}\x1f{iid}", str(r["answer"]), None, pred, r["answer_type"])
            if r["answer_type"] == "text":
                status[k][iid] = verify_one(item)["status"]
                continue
            gold = str(r["answer"]).strip()
            if final is not None and _INTEGER.fullmatch(gold) and _INTEGER.fullmatch(final.strip()):
                status[k][iid] = "verified" if int(final) == int(gold) else "wrong"  # math-verify's numeric equality
                continue
            todo.append(item)
            where.append((k, iid))
    for (k, iid), res in zip(where, verify_stable(todo, timeout_s, workers)):
        status[k][iid] = res["status"]
    out = []
    for k, df in enumerate(frames):
        st = [status[k][i] for i in df["item_id"].to_list()]
        out.append(df.with_columns(verify_status=pl.Series(st, dtype=pl.String),
                                   correct=pl.Series([x == "verified" for x in st], dtype=pl.Boolean)))
    return out


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
