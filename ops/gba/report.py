"""The per-mode summary of a run (torch-free: the asset and the benchmark read result files with it).

A result file (``result.json``, written by rank 0 of every mode) holds the raw record: the eval
curve ``[{global_step, samples, train_s, auc, logloss}]`` (train_s = wall seconds of training,
evaluation time excluded), the training-loss curve, the staleness list as a histogram, counters,
lost workers, hyper-parameters and the spec. ``summarize`` turns it into one comparison row.
"""

from __future__ import annotations


def time_to_target(curve: list[dict], target: float) -> float | None:
    """Training seconds at the first evaluation whose test AUC reaches ``target`` (None: never)."""
    for p in curve:
        if p["auc"] >= target:
            return p["train_s"]
    return None


def summarize(result: dict) -> dict:
    """One comparison row: mode, workers, trace, samples/s, time to target, final AUC/log loss,
    global steps, optimizer steps, gradients applied/decayed/dropped, lost workers."""
    g = result["gradients"]
    return {
        "mode": result["mode"],
        "workers": result["workers"],
        "trace": result["trace"],
        "samples_per_s": round(result["samples_per_s"], 1),
        "time_to_target_s": None if result["time_to_target_s"] is None else round(result["time_to_target_s"], 2),
        "target_auc": result["target_auc"],
        "final_auc": round(result["final"]["auc"], 4),
        "final_logloss": round(result["final"]["logloss"], 4),
        "global_steps": round(result["global_steps"], 2),
        "optimizer_steps": result["optimizer_steps"],
        "train_s": round(result["train_seconds"], 2),
        "gradients_applied": g["applied"],
        "decayed": g["decayed"],
        "dropped": g["dropped"],
        "max_staleness": max((int(k) for k in result["staleness_histogram"]), default=0),
        "lost_workers": ",".join(w["worker"] for w in result["lost_workers"]) or "-",
    }


def finish(result: dict, samples_applied: int, train_seconds: float, target_auc: float) -> dict:
    """Fill the derived fields every mode reports the same way (samples/s, time to target)."""
    result["samples_per_s"] = samples_applied / train_seconds if train_seconds > 0 else 0.0
    result["train_seconds"] = train_seconds
    result["target_auc"] = target_auc
    result["time_to_target_s"] = time_to_target(result["curve"], target_auc)
    return result
