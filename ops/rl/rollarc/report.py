"""Tables and figures of a RollArc run's ``result.json`` (torch-free, ray-free: the asset and the
benchmark read result files with it)."""

from __future__ import annotations

STEP_COLUMNS = ["method", "step", "max_staleness", "wait_s", "train_s", "reward_mean", "failed_rewards", "trajectories",
                "zero_signal_groups", "segments", "loss", "grad_norm", "clip_fraction"]


def step_rows(result: dict) -> list[dict]:
    """One row per (method, optimizer step), rounded for display; ``staleness`` as a string."""
    out = []
    for method, r in result["methods"].items():
        for s in r["steps"]:
            row = {c: s.get(c) for c in STEP_COLUMNS}
            row["method"] = method
            row["staleness"] = ",".join(str(x) for x in s.get("staleness", []))
            row["statuses"] = ", ".join(f"{k} {v}" for k, v in sorted(s.get("statuses", {}).items()))
            out.append({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
    return out


def summary_rows(result: dict) -> list[dict]:
    """One row per method: wall seconds (first rollout to last publish), setup seconds, trajectories
    trained / generated, trajectories/s, speedup over the monolithic baseline, staleness histogram,
    discarded groups, dropped redundant trajectories, episode statuses, mean reward."""
    base = result["methods"].get("monolithic")
    rows = []
    for m, r in result["methods"].items():
        rewards = [s["reward_mean"] for s in r["steps"] if s.get("reward_mean") is not None]
        rows.append({
            "method": m, "steps": len(r["steps"]), "wall_s": round(r["wall_s"], 2), "setup_s": round(r.get("setup_s", 0.0), 2),
            "trained_trajectories": r["trained_trajectories"], "generated_trajectories": r["generated_trajectories"],
            "trajectories_per_s": round(r["trajectories_per_s"], 4),
            "speedup_vs_monolithic": round(base["wall_s"] / r["wall_s"], 3) if base and r["wall_s"] > 0 else None,
            "staleness_hist": " ".join(f"{k}:{v}" for k, v in r["staleness_hist"].items()),
            "discarded_groups": r["discarded_groups"], "dropped_trajectories": r["dropped_trajectories"],
            "statuses": ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items())),
            "reward_mean": round(sum(rewards) / len(rewards), 4) if rewards else None,
        })
    return rows


def utilisation_rows(result: dict) -> list[dict]:
    """Per method and pool: busy fraction of the run's wall time and what served it."""
    rows = []
    for m, r in result["methods"].items():
        for pool, u in (r.get("utilisation") or {}).items():
            if not isinstance(u, dict) or pool in ("router", "weight_syncs"):
                continue
            if "utilisation" in u:
                rows.append({"method": m, "pool": pool, "utilisation": u["utilisation"],
                             "detail": ", ".join(f"{k} {v}" for k, v in u.items() if k != "utilisation")})
            else:
                rows += [{"method": m, "pool": f"{pool}/{k}", "utilisation": v, "detail": ""} for k, v in u.items()]
    return rows


def staleness_plot(result: dict) -> bytes:
    """Histogram of trained groups by staleness (trainer step - oldest policy version), per method."""
    from ops import figures

    hists = {m: r["staleness_hist"] for m, r in result["methods"].items()}
    keys = sorted({int(k) for h in hists.values() for k in h})
    return figures.grouped_bars([f"staleness {k}" for k in keys],
                                {m: [h.get(str(k), h.get(k, 0)) for k in keys] for m, h in hists.items()},
                                "trained groups by staleness", "groups")


def eval_rows(result: dict) -> list[dict]:
    """Held-out accuracy against training wall time (evaluation excluded), one row per (method,
    evaluation): ``result["eval"]`` of a scratchpad run (the result contract; empty otherwise)."""
    return [{"method": m, "step": e["step"], "train_wall_s": round(e["train_wall_s"], 3),
             "accuracy": round(e["accuracy"], 4), "n": e["n"], "policy_version": e["policy_version"]}
            for m, evs in (result.get("eval") or {}).items() for e in evs]
