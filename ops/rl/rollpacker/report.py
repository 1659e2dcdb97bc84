"""Per-step comparison of RollPacker and the synchronous baseline (torch-free: the asset and the
benchmark read result files with it)."""

from __future__ import annotations

COLUMNS = ["method", "step", "round", "rollout_s", "step_s", "reward_wait_s", "train_tail_s", "max_response_len",
           "p99_response_len", "median_response_len", "bubble_ratio", "reward_mean", "verified", "unparseable",
           "reward_failed", "zero_signal_groups", "finish_length", "finish_timeout", "finish_abort", "loss",
           "policy_version"]


def step_rows(steps: list[dict]) -> list[dict]:
    """The comparison columns of every step (rounded for display)."""
    out = []
    for s in steps:
        row = {}
        for c in COLUMNS:
            v = s.get(c)
            row[c] = round(v, 3) if isinstance(v, float) else v
        out.append(row)
    return out


def summarize(steps: list[dict]) -> list[dict]:
    """One row per method: steps, total and mean rollout/step seconds, mean max and p99 response
    length, mean bubble ratio, mean reward, long rounds; plus the speedup of each method's total
    step time against ``baseline`` (when present)."""
    methods = list(dict.fromkeys(s["method"] for s in steps))
    rows = []
    for m in methods:
        ss = [s for s in steps if s["method"] == m]
        n = len(ss)
        rows.append({
            "method": m, "steps": n,
            "rollout_s_total": round(sum(s["rollout_s"] for s in ss), 2),
            "step_s_total": round(sum(s["step_s"] for s in ss), 2),
            "step_s_mean": round(sum(s["step_s"] for s in ss) / n, 2),
            "max_response_len_mean": round(sum(s["max_response_len"] for s in ss) / n, 1),
            "p99_response_len_mean": round(sum(s["p99_response_len"] for s in ss) / n, 1),
            "bubble_ratio_mean": round(sum(s["bubble_ratio"] for s in ss) / n, 3),
            "reward_mean": round(sum(s["reward_mean"] for s in ss) / n, 4),
            "long_rounds": sum(s["round"] == "long" for s in ss),
            "trained_responses": sum(s["trained_responses"] for s in ss),
        })
    base = next((r for r in rows if r["method"] == "baseline"), None)
    for r in rows:
        r["speedup_vs_baseline"] = round(base["step_s_total"] / r["step_s_total"], 3) if base and r["step_s_total"] else None
    return rows


def comparison_plot(steps: list[dict]) -> bytes:
    """Per-step rollout and step seconds of every method (bars), PNG."""
    from ops import figures

    methods = list(dict.fromkeys(s["method"] for s in steps))
    n = max(sum(s["method"] == m for s in steps) for m in methods)
    series = {}
    for m in methods:
        ss = [s for s in steps if s["method"] == m]
        series[f"{m} rollout"] = [ss[i]["rollout_s"] if i < len(ss) else 0.0 for i in range(n)]
        series[f"{m} step"] = [ss[i]["step_s"] if i < len(ss) else 0.0 for i in range(n)]
    cats = [f"step {i}" for i in range(n)]
    return figures.grouped_bars(cats, series, "rollout and step time per step", "seconds")


def accuracy_summary(evals: dict) -> list[dict]:
    """One row per method of a result's ``eval`` ({method: [{"step", "train_wall_s", "accuracy", "n",
    "policy_version"}, ...]}, docs/rollpacker.md): held-out accuracy before the first and after the
    last step, the gain in points, steps and the method's training seconds (evaluation excluded)."""
    rows = []
    for m, ev in evals.items():
        if not ev:
            continue
        a, b = ev[0], ev[-1]
        rows.append({"method": m, "accuracy_before": round(a["accuracy"], 4), "accuracy_after": round(b["accuracy"], 4),
                     "gain_points": round(100 * (b["accuracy"] - a["accuracy"]), 2), "n": b["n"], "steps": b["step"],
                     "train_wall_s": round(b["train_wall_s"], 2), "evaluations": len(ev)})
    return rows
