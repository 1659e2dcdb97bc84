"""Does synchronous GRPO raise the scratchpad policy's held-out pass rate over a longer run? (docs/rl_policy.md,
"How RollPacker and RollArc use it"). One baseline (synchronous GRPO) run of the RollPacker driver on Ray
actors, from the ``rl_policy`` warm start, with ``benchmarks.rl_real``'s sizes (P0 8, R0 8, 256 new tokens)
except ``steps`` and ``lr``; the held-out pass rate (256 problems, T = 1) every steps/4 steps. Real.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rl_gain.py --policy <rl_policy folder> --steps 40 --lrs 3e-5,6e-5

Merges one entry per (lr, seed) into ``benchmarks/results/rl_gain.json``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import RESULTS, bench_parser, command_line, previous_results, write_results  # noqa: E402

OUT = RESULTS / "rl_gain.json"


def run_one(policy: str, steps: int, lr: float, seed: int, work: Path) -> dict:
    import ray

    from benchmarks.rl_real import SIZES, _make_actors, _spec
    from ops.rl.policy import load_tokenizer
    from ops.rl.rollpacker.driver import RunState, fingerprint, load_prompts, run_methods
    from tests.conftest import RecordingPipes

    sizes = {**SIZES["full"], "steps": steps, "lr": lr, "eval_every": max(1, steps // 4), "eval_size": 256}
    spec = _spec(seed, sizes, policy, ["baseline"])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actors = _make_actors(spec, "ray")
        state = RunState(work / f"state-{seed}-{lr}", fingerprint(spec))
        t = time.time()
        rows = run_methods(spec, load_prompts(spec, load_tokenizer(policy)), RecordingPipes(0), actors, state)
        actors.kill()
    finally:
        ray.shutdown()
    ev = state.evals["baseline"]
    r = [x["reward_mean"] for x in rows]
    return {"steps": steps, "lr": lr, "seed": seed, "wall_s": round(time.time() - t, 1),
            "heldout": [{"step": e["step"], "accuracy": e["accuracy"], "n": e["n"]} for e in ev],
            "gain_points": round(100 * (ev[-1]["accuracy"] - ev[0]["accuracy"]), 1),
            "train_reward_mean_per_quarter": [round(sum(r[i:i + steps // 4]) / (steps // 4), 3)
                                              for i in range(0, steps, steps // 4)]}


def summarise(runs: list[dict], steps: int, lr: float) -> dict | None:
    """Held-out pass rate before/after and the gain over the seeds of one (steps, lr): means with 95%
    t intervals over seeds (each seed's accuracy is itself on 256 problems, ~3 points of binomial
    noise, which the spread over seeds includes)."""
    import numpy as np
    from scipy import stats

    sel = sorted((r for r in runs if r["steps"] == steps and r["lr"] == lr), key=lambda r: r["seed"])
    if len(sel) < 2:
        return None

    def ci(xs):
        xs = np.asarray(xs, float)
        h = stats.t.ppf(0.975, len(xs) - 1) * xs.std(ddof=1) / np.sqrt(len(xs))
        return {"mean": round(float(xs.mean()), 4), "ci95": [round(float(xs.mean() - h), 4), round(float(xs.mean() + h), 4)]}

    before = [r["heldout"][0]["accuracy"] for r in sel]
    after = [r["heldout"][-1]["accuracy"] for r in sel]
    curve = [{"step": e["step"], **ci([r["heldout"][i]["accuracy"] for r in sel])} for i, e in enumerate(sel[0]["heldout"])]
    gain = ci([100 * (a - b) for a, b in zip(after, before)])
    return {"steps": steps, "lr": lr, "seeds": len(sel), "accuracy_before": ci(before), "accuracy_after": ci(after),
            "gain_points": gain, "curve": curve, "target_gain_points": 10.0,
            "meets_target": gain["mean"] >= 10.0, "gain_ci_excludes_zero": gain["ci95"][0] > 0}


def main(argv=None) -> int:
    ap = bench_parser(__doc__, seeds=1)
    ap.add_argument("--policy", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lrs", default="3e-5,6e-5")
    a = ap.parse_args(argv)

    work = Path("/tmp/crucible-rl-gain")
    work.mkdir(parents=True, exist_ok=True)
    doc = previous_results(OUT) or {"label": "real", "runs": []}
    doc["command"] = command_line(__file__, argv, env="OMP_NUM_THREADS=1")
    for lr in (float(x) for x in a.lrs.split(",")):
        for seed in range(a.seeds):
            res = run_one(a.policy, a.steps, lr, seed, work)
            print(json.dumps(res))
            doc["runs"] = [x for x in doc["runs"] if (x["lr"], x["seed"], x["steps"]) != (lr, seed, a.steps)] + [res]
            write_results(doc, OUT)
        summary = summarise(doc["runs"], a.steps, lr)
        if summary is not None:
            doc.setdefault("summary", {})[f"{a.steps}@{lr:g}"] = summary
            print(json.dumps(summary))
            write_results(doc, OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
