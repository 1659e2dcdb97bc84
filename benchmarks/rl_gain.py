"""Does synchronous GRPO raise the scratchpad policy's held-out pass rate over a longer run? (docs/rl_policy.md,
"How RollPacker and RollArc use it"). One baseline (synchronous GRPO) run of the RollPacker driver on Ray
actors, from the ``rl_policy`` warm start, with ``benchmarks.rl_real``'s sizes (P0 8, R0 8, 256 new tokens)
except ``steps`` and ``lr``; the pass rate (256 problems, T = 1) on the scratchpad ``heldout`` split every
steps/4 steps and on the ``generalisation`` split before and after (docs/rl_policy.md, "Splits": both
disjoint by prompt text from every training stream). Real.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rl_gain.py --policy <rl_policy folder> --steps 10 --lrs 6e-5 --seeds 1

Development runs: merged, one entry per (steps, lr, seed), into ``benchmarks/results/rl_gain_exploratory.json``
(label ``exploratory``; seeds 0, 1, ...). The confirmatory claim ``grpo-gain`` runs ``run_seed`` on its
registered fresh seeds through ``python -m benchmarks.claims run grpo-gain``
(benchmarks/claims/designs/grpo-gain.yaml). ``benchmarks/results/rl_gain.json`` holds the runs of
before the content split: their held-out prompts were mostly training prompts (200 of 256).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import RESULTS, bench_parser, command_line, previous_results, write_results  # noqa: E402

OUT = RESULTS / "rl_gain_exploratory.json"


EVAL_SIZE = 256
"""Held-out problems per split and evaluation (one sampled response each at T = 1)."""
RECIPE = 2
"""The warm-start recipe (``ops.rl.warmstart.RECIPE_VERSION``) whose training rows come from the
scratchpad ``train`` split only: an older warm start has trained on the held-out prompts."""


def grpo_spec(policy: str, steps: int, lr: float, seed: int, eval_size: int = EVAL_SIZE, eval_every: int = 0):
    """The RollPacker driver's RunSpec of one GRPO gain run: ``benchmarks.rl_real``'s full sizes (P0 8,
    R0 8, 256 new tokens), the synchronous baseline only, ``steps`` and ``lr`` given, task stream,
    policy and sampling seeded with ``seed``; held-out evaluation of ``eval_size`` problems every
    ``eval_every`` steps (0: every steps/4)."""
    from benchmarks.rl_real import SIZES, _spec

    sizes = {**SIZES["full"], "steps": steps, "lr": lr, "eval_every": eval_every or max(1, steps // 4),
             "eval_size": eval_size}
    return _spec(seed, sizes, policy, ["baseline"])


def eval_sets(spec) -> dict:
    """The two evaluation sets of a run (``spec.eval_size`` problems each; docs/rl_policy.md, "Splits"):
    ``heldout`` (the driver's ``heldout_problems``: in-distribution, content-disjoint from every
    training stream) and ``generalisation`` (quotients never trained on), both of stream
    ``task_seed + 1000``."""
    from ops.rl import scratchpad as sp
    from ops.rl.rollpacker.driver import heldout_problems

    return {"heldout": heldout_problems(spec),
            "generalisation": sp.problems(spec.task_seed + 1000, spec.eval_size, split="generalisation")}


def check_policy(policy: str) -> dict:
    """The warm start's ``metrics.json`` (fingerprint, recipe version, steps). Raises ValueError when the
    folder's recipe predates the content split (its training rows held evaluation prompts) and
    FileNotFoundError when it holds no metrics.json."""
    p = Path(policy) / "metrics.json"
    if not p.exists():
        raise FileNotFoundError(f"rl_gain: no warm-start metrics at {p}: materialize rl_policy (or pass --policy)")
    m = json.loads(p.read_text())
    if m.get("recipe_version", 1) < RECIPE:
        raise ValueError(f"rl_gain: the warm start at {policy} has recipe_version {m.get('recipe_version', 1)} < {RECIPE}: "
                         "it trained on the whole problem space, held-out prompts included; retrain rl_policy")
    return {"fingerprint": m.get("fingerprint"), "recipe_version": m.get("recipe_version"), "steps": m.get("steps")}


def run_one(policy: str, steps: int, lr: float, seed: int, work: Path, eval_size: int = EVAL_SIZE,
            eval_every: int = 0) -> dict:
    """One GRPO run (Ray actors, as the driver launches them) from the warm start ``policy``: the
    held-out pass rate on the ``heldout`` split before the first step, every ``eval_every`` steps and
    after the last (the driver's ``run_method``), and on the ``generalisation`` split before and
    after. Pass rates in [0, 1]; ``gain_points`` = 100 x (after - before). Evaluation seconds are
    reported apart (``eval_s``), never in ``train_s``. Raises as ``check_policy``."""
    import ray

    from benchmarks.rl_real import _make_actors, _Pipes
    from ops.rl.policy import load_tokenizer
    from ops.rl.rollpacker.driver import RunState, evaluate, fingerprint, load_prompts, run_methods

    warm = check_policy(policy)
    spec = grpo_spec(policy, steps, lr, seed, eval_size, eval_every)
    sets = eval_sets(spec)
    t0 = time.time()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actors = _make_actors(spec, "ray")
        te = time.time()
        gen = [evaluate(actors, sets["generalisation"], spec)]           # the warm start (fresh actors)
        gen_s = time.time() - te
        state = RunState(work / f"state-{seed}-{lr}-{steps}", fingerprint(spec))
        t = time.time()
        rows = run_methods(spec, load_prompts(spec, load_tokenizer(policy)), _Pipes(), actors, state)
        run_s = time.time() - t
        te = time.time()
        gen.append(evaluate(actors, sets["generalisation"], spec))       # the GRPO-trained policy
        gen_s += time.time() - te
        actors.kill()
    finally:
        ray.shutdown()
    ev = state.evals["baseline"]
    r = [x["reward_mean"] for x in rows]
    q = max(1, steps // 4)
    train_s = sum(x["step_s"] for x in rows)
    return {"steps": steps, "lr": lr, "seed": seed, "split": "content-disjoint (scratchpad heldout split)",
            "warm_start": warm, "wall_s": round(time.time() - t0, 1), "train_s": round(train_s, 1),
            "eval_s": round(run_s - train_s + gen_s, 1),
            "step_s": [round(x["step_s"], 2) for x in rows],
            "heldout": [{"step": e["step"], "accuracy": e["accuracy"], "n": e["n"]} for e in ev],
            "generalisation": [{"step": s, "accuracy": g["accuracy"], "n": g["n"]} for s, g in zip((0, len(rows)), gen)],
            "gain_points": round(100 * (ev[-1]["accuracy"] - ev[0]["accuracy"]), 1),
            "generalisation_gain_points": round(100 * (gen[-1]["accuracy"] - gen[0]["accuracy"]), 1),
            "train_reward_mean_per_quarter": [round(sum(r[i:i + q]) / len(r[i:i + q]), 3) for i in range(0, len(r), q)]}


def run_seed(seed: int, arm_order: list[str], workdir: Path, policy: str = "", steps: int = 240, lr: float = 6e-5,
             eval_size: int = EVAL_SIZE) -> dict:
    """The ``grpo-gain`` claim's replication (benchmarks/claims/designs/grpo-gain.yaml; the format of
    ``benchmarks.claims``): one ``run_one`` with task, policy and sampling seed ``seed`` from the warm
    start ``policy`` ("" = ``benchmarks.rl_real.POLICY``: $CRUCIBLE_POLICY or the lake's rl_policy).

    Returns ``{arm: {"heldout_pass_rate_pct", "generalisation_pass_rate_pct", ...}}`` for the arms
    ``grpo`` (the policy after ``steps`` GRPO steps) and ``warm_start`` (the same run's step-0 policy,
    i.e. the warm start it started from), pass rates in percent of ``eval_size`` problems. Both arms
    are scored by the same trainer actor with the same problems and sampling seed; the warm start is
    necessarily scored before training, so ``arm_order`` (recorded in the result) cannot change the
    order; the pass rate does not depend on it (each evaluation forks torch's RNG with the seed).
    Raises ValueError for arms other than these two, and as ``check_policy``."""
    import os

    from benchmarks.rl_real import POLICY

    os.environ.setdefault("OMP_NUM_THREADS", "1")               # as the development runs (Ray actors inherit it)
    if sorted(arm_order) != ["grpo", "warm_start"]:
        raise ValueError(f"grpo-gain arms are ['grpo', 'warm_start'], got {arm_order}")
    res = run_one(policy or POLICY, steps, lr, seed, Path(workdir), eval_size)
    common = {"steps": steps, "seed": seed, "n": eval_size, "warm_start_fingerprint": res["warm_start"]["fingerprint"],
              "train_s": res["train_s"], "eval_s": res["eval_s"], "arm_order_given": list(arm_order)}
    return {"grpo": {"heldout_pass_rate_pct": 100 * res["heldout"][-1]["accuracy"],
                     "generalisation_pass_rate_pct": 100 * res["generalisation"][-1]["accuracy"], **common},
            "warm_start": {"heldout_pass_rate_pct": 100 * res["heldout"][0]["accuracy"],
                           "generalisation_pass_rate_pct": 100 * res["generalisation"][0]["accuracy"], **common}}


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

    work = Path(tempfile.mkdtemp(prefix="crucible-rl-gain-"))
    work.mkdir(parents=True, exist_ok=True)
    doc = previous_results(OUT) or {"label": "exploratory (real: measured on this machine; development seeds, not "
                                              "the registered claim)", "runs": []}
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
