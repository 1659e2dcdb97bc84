"""The control that shows failure-driven post-training works (Logics-STEM, arXiv 2601.01562 §3):
stage 1, stage 2 on failure-targeted data, and stage 2 on the same amount of random extra data,
scored on the failure slices and overall, with 95% intervals over training seeds *and* items.

Slices (all on the ``test`` split of the programmatic evaluation items, never the ``dev`` items
that chose the regions; every programmatic evaluation item has an evaluation-side template that no
stage-2 item has: ``ops.posttrain.data.template_side``): ``failure_slices`` = items in a targeted
(module, difficulty) cell; ``other_slices`` = the rest; ``overall`` = all of them; plus one slice
per targeted cell, and the curated held-out and benchmark slices (reported, not part of the claim).

Intervals: a two-level (hierarchical) percentile bootstrap (Davison & Hinkley 1997, §3.8, resampling
both stages of a nested design; the seed-and-item version used for model comparisons in e.g.
Bouthillier et al., MLSys 2021, "Accounting for variance in machine learning benchmarks"). Each
resample draws the items with replacement — the same draw for every arm, so differences are paired
over items — and, independently per arm, that arm's training seeds with replacement; the statistic
is the mean correctness over the drawn seeds and items (``hierarchical_bootstrap``). With one seed
(stage 1) it is the ordinary item bootstrap.

Verdict (``verdict_of``), from the interval of targeted minus random on the failure slices:
``targeted better`` when its lower end is above 0, ``targeted worse`` when its upper end is below 0,
else ``no difference``. Everything that feeds it is deterministic (seeded data orders, deterministic
kernels, seeded resampling, verification retried instead of timing out), so two runs on the same
inputs give the same interval and the same verdict; ``flip_margin`` says how far the interval would
have to move to change it. ``claim_held`` (the paper's claim) = ``targeted better`` on the failure
slices and not ``targeted worse`` overall.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

CHECKPOINTS = ("stage1", "stage2_targeted", "stage2_random")
VERDICTS = ("targeted better", "no difference", "targeted worse")


@dataclass
class ComparisonParams:
    """Parameters of the comparison (:func:`compare`), the ``failure_driven_comparison`` run config.

    Raises:
        ValueError: ``n_boot`` below 1.
    """

    n_boot: int = 2000
    """Bootstrap resamples of the 95% intervals (>= 1; two-level percentile bootstrap over training seeds
    and items; paired over items for differences)."""
    seed: int = 0
    """Seed of the bootstrap resampling."""

    def __post_init__(self):
        if self.n_boot < 1:
            raise ValueError(f"failure_driven_comparison.n_boot must be >= 1, got {self.n_boot}")


def hierarchical_bootstrap(arms: list[np.ndarray], weights: list[float], n_boot: int = ComparisonParams.n_boot,
                           level: float = 0.95, seed: int = ComparisonParams.seed) -> dict:
    """Point estimate and percentile interval of ``sum_k weights[k] * mean(arms[k])``, resampling
    items (shared by all arms) and each arm's seeds (independently) with replacement.

    Args:
        arms: per arm a (seeds, items) array of correctness in [0, 1]; every arm has the same items
            in the same column order (columns = items, rows = training seeds).
        weights: one weight per arm: ``[1]`` for an accuracy, ``[1, -1]`` for a difference.
        n_boot: resamples (>= 1).
        level: interval coverage in (0, 1).
    Returns:
        ``{"n": items, "seeds": [seeds per arm], "diff" (the point estimate over every seed and item),
        "ci_low", "ci_high"}`` (NaN estimate and interval when there are no items).
    Raises:
        ValueError: no arms, weights of another length, an arm that is not 2-D or has no seeds, arms
            with different item counts, n_boot < 1, level outside (0, 1).
    """
    if not arms or len(arms) != len(weights):
        raise ValueError(f"hierarchical_bootstrap: {len(arms)} arms and {len(weights)} weights")
    if n_boot < 1 or not 0 < level < 1:
        raise ValueError(f"hierarchical_bootstrap: n_boot must be >= 1 and level in (0, 1), got {n_boot}, {level}")
    mats = [np.asarray(a, dtype=float) for a in arms]
    for k, m in enumerate(mats):
        if m.ndim != 2 or m.shape[0] < 1:
            raise ValueError(f"hierarchical_bootstrap: arm {k} must be (seeds >= 1, items), got shape {m.shape}")
    n = mats[0].shape[1]
    if any(m.shape[1] != n for m in mats):
        raise ValueError(f"hierarchical_bootstrap: arms hold different item counts {[m.shape[1] for m in mats]}")
    out = {"n": int(n), "seeds": [int(m.shape[0]) for m in mats]}
    if n == 0:
        return {**out, "diff": float("nan"), "ci_low": float("nan"), "ci_high": float("nan")}
    rng = np.random.default_rng(seed)
    item_w = rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot) / n                      # (B, n)
    stat = np.zeros(n_boot)
    point = 0.0
    for w, m in zip(weights, mats):
        s = m.shape[0]
        seed_w = rng.multinomial(s, np.full(s, 1.0 / s), size=n_boot) / s                  # (B, S)
        stat += w * ((item_w @ m.T) * seed_w).sum(1)
        point += w * float(m.mean())
    # rounded to 1e-12: float noise of the weighted sums (~1e-16) must not put an interval that
    # is exactly 0 on one side of it
    stat = np.round(stat, 12)
    a = (1 - level) / 2
    return {**out, "diff": round(point, 12), "ci_low": float(np.quantile(stat, a)), "ci_high": float(np.quantile(stat, 1 - a))}


def verdict_of(ci_low: float, ci_high: float) -> str:
    """``targeted better`` (interval above 0), ``targeted worse`` (below 0) or ``no difference``
    (it contains 0, or is missing: NaN). Raises ValueError when ``ci_low > ci_high``."""
    if ci_low > ci_high:
        raise ValueError(f"verdict_of: ci_low {ci_low} above ci_high {ci_high}")
    if ci_low > 0:
        return VERDICTS[0]
    if ci_high < 0:
        return VERDICTS[2]
    return VERDICTS[1]


def flip_margin(ci_low: float, ci_high: float) -> float:
    """How far (same units as the interval) the interval must shift for ``verdict_of`` to change:
    the distance of the bound nearest to 0 (for ``no difference`` the smaller of ``-ci_low`` and
    ``ci_high``). NaN for a missing interval."""
    if not (np.isfinite(ci_low) and np.isfinite(ci_high)):
        return float("nan")
    if ci_low > 0:
        return float(ci_low)
    if ci_high < 0:
        return float(-ci_high)
    return float(min(-ci_low, ci_high))


def target_expr(targets: list[dict]) -> pl.Expr:
    """Boolean expression: the item lies in one of the targeted (module, difficulty) cells."""
    e = pl.lit(False)
    for t in targets:
        cell = pl.col("module") == t["module"]
        if t.get("difficulty") is not None:
            cell = cell & (pl.col("difficulty") == t["difficulty"])
        e = e | cell
    return e


def seed_matrix(per_seed: pl.DataFrame, checkpoint: str, item_ids: list[str]) -> np.ndarray:
    """(seeds, items) correctness of ``checkpoint`` in ``per_seed`` (``checkpoint``, ``seed``,
    ``item_id``, ``correct``), columns in ``item_ids`` order, rows by ascending seed.

    Raises:
        ValueError: the checkpoint is absent, or a seed lacks one of the items (named).
    """
    d = per_seed.filter(pl.col("checkpoint") == checkpoint)
    if d.is_empty():
        raise ValueError(f"seed_matrix: no per-seed scores for {checkpoint!r}")
    rows = []
    for s in sorted(set(d["seed"].to_list())):
        one = d.filter(pl.col("seed") == s)
        m = dict(zip(one["item_id"].to_list(), one["correct"].cast(pl.Float64).to_list()))
        missing = [i for i in item_ids if i not in m]
        if missing:
            raise ValueError(f"seed_matrix: {checkpoint} seed {s} has no score for {len(missing)} item(s), e.g. {missing[0]!r}")
        rows.append([m[i] for i in item_ids])
    return np.asarray(rows, dtype=float).reshape(len(rows), len(item_ids))


def per_seed_frame(scored: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Per-seed scores from one scored table per checkpoint (each a single seed 0): the form
    ``compare`` takes for stage 1 (and for a stage 2 trained once)."""
    return pl.concat([df.select("item_id", pl.col("correct").cast(pl.Float64)).with_columns(checkpoint=pl.lit(ck), seed=pl.lit(0))
                      for ck, df in scored.items()], how="vertical")


def compare(scored: dict[str, pl.DataFrame], targets: list[dict], n_boot: int = ComparisonParams.n_boot,
            seed: int = ComparisonParams.seed, per_seed: pl.DataFrame | None = None) -> tuple[pl.DataFrame, dict]:
    """Accuracy table (checkpoint x slice, intervals over seeds and items) and the verdict.

    Args:
        scored: ``CHECKPOINTS`` -> scored evaluation table (``ops.posttrain.evaluate.score``; the
            stage-2 tables may hold the seed-averaged correctness); its rows give the slices.
        targets: the synthesis targets (``module``, ``difficulty``).
        per_seed: ``checkpoint``, ``seed``, ``item_id``, ``correct`` — one row per training seed and
            item of the stage-2 arms (and of stage 1, else taken from ``scored`` as one seed).
            None: every checkpoint is one seed (``per_seed_frame(scored)``).
    Returns:
        (table with ``checkpoint``, ``slice``, ``n``, ``seeds``, ``accuracy``, ``ci_low``, ``ci_high``;
        verdict dict: the differences with their intervals, ``verdict``, ``verdict_overall``,
        ``flip_margin``, ``claim_held``, ``seeds``, ``per_seed`` accuracies, ``statement``).
    Raises:
        ValueError: a checkpoint is missing, or a seed lacks an item of a slice.
    """
    missing = [c for c in CHECKPOINTS if c not in scored]
    if missing:
        raise ValueError(f"compare: no scored evaluation for {missing}")
    ps = per_seed_frame({c: scored[c] for c in CHECKPOINTS}) if per_seed is None else per_seed
    if "stage1" not in set(ps["checkpoint"].to_list()):
        ps = pl.concat([ps.select("item_id", pl.col("correct").cast(pl.Float64), "checkpoint", "seed"),
                        per_seed_frame({"stage1": scored["stage1"]}).select("item_id", "correct", "checkpoint", "seed")],
                       how="vertical_relaxed")
    test = pl.col("split") == "test"
    prog = test & (pl.col("slice") == "programmatic")
    in_t = target_expr(targets).fill_null(False)
    slices = {"failure_slices": prog & in_t, "other_slices": prog & ~in_t, "overall": prog}
    for t in targets:
        slices[f"cell:{t['module']}|{t.get('difficulty')}"] = prog & target_expr([t]).fill_null(False)
    for s in sorted(set(scored["stage1"].filter(test & (pl.col("slice") != "programmatic"))["slice"].to_list())):
        slices[s] = test & (pl.col("slice") == s)
    base = scored["stage1"]
    ids = {name: base.filter(expr)["item_id"].to_list() for name, expr in slices.items()}
    mats = {(ck, name): seed_matrix(ps, ck, ids[name]) for ck in CHECKPOINTS for name in slices}
    rows = []
    for ck in CHECKPOINTS:
        for name in slices:
            r = hierarchical_bootstrap([mats[(ck, name)]], [1.0], n_boot, seed=seed)
            rows.append({"checkpoint": ck, "slice": name, "n": r["n"], "seeds": r["seeds"][0], "accuracy": r["diff"],
                         "ci_low": r["ci_low"], "ci_high": r["ci_high"]})
    table = pl.DataFrame(rows)

    def diff(a: str, b: str, name: str) -> dict:
        return hierarchical_bootstrap([mats[(a, name)], mats[(b, name)]], [1.0, -1.0], n_boot, seed=seed)

    d_fail, d_all = diff("stage2_targeted", "stage2_random", "failure_slices"), diff("stage2_targeted", "stage2_random", "overall")
    verdict = verdict_of(d_fail["ci_low"], d_fail["ci_high"])
    verdict_all = verdict_of(d_all["ci_low"], d_all["ci_high"])
    seeds = {ck: sorted(int(s) for s in set(ps.filter(pl.col("checkpoint") == ck)["seed"].to_list())) for ck in CHECKPOINTS}
    seed_acc = []
    for ck in ("stage2_targeted", "stage2_random"):
        for k, s in enumerate(seeds[ck]):
            seed_acc.append({"checkpoint": ck, "seed": s,
                             **{f"accuracy_{name}": round(float(mats[(ck, name)][k].mean()), 4) if ids[name] else None
                                for name in ("failure_slices", "other_slices", "overall")}})
    out = {
        "targeted_minus_random_failure_slices": d_fail, "targeted_minus_random_overall": d_all,
        "targeted_minus_stage1_failure_slices": diff("stage2_targeted", "stage1", "failure_slices"),
        "targeted_minus_stage1_overall": diff("stage2_targeted", "stage1", "overall"),
        "random_minus_stage1_failure_slices": diff("stage2_random", "stage1", "failure_slices"),
        "verdict": verdict, "verdict_overall": verdict_all,
        "flip_margin": flip_margin(d_fail["ci_low"], d_fail["ci_high"]),
        "targeted_beats_random_on_failure_slices": verdict == VERDICTS[0],
        "targeted_keeps_overall_accuracy": verdict_all != VERDICTS[2],
        "claim_held": verdict == VERDICTS[0] and verdict_all != VERDICTS[2],
        "seeds": seeds, "per_seed": seed_acc,
        "interval": "95% two-level percentile bootstrap: items (paired across arms) and each arm's training seeds, "
                    f"{n_boot} resamples, seed {seed}",
    }
    out["statement"] = _statement(out, d_fail, d_all)
    return table, out


def _pts(d: dict) -> str:
    return f"{100 * d['diff']:+.1f} pts [{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}]"


def _statement(v: dict, d_fail: dict, d_all: dict) -> str:
    s_t, s_r = d_fail["seeds"]
    head = f"verdict: {v['verdict']}"
    body = (f"targeted minus random {_pts(d_fail)} on the failure slices (n={d_fail['n']} items, {s_t}+{s_r} seeds); "
            f"{_pts(d_all)} overall (n={d_all['n']}; {v['verdict_overall']})")
    claim = "claim held" if v["claim_held"] else "claim not shown"
    return f"{head} ({claim}): {body}"


def summary_rows(table: pl.DataFrame) -> list[dict]:
    """The table as JSON-ready rows with accuracies rounded to 4 decimals."""
    return [{k: (round(v, 4) if isinstance(v, float) and np.isfinite(v) else v) for k, v in r.items()}
            for r in table.iter_rows(named=True)]
