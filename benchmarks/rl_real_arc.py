"""RollArc for real on the scratchpad policy: monolithic synchronous vs trajectory-level asynchronous
(async_ratio 0) vs RollArc (async_ratio 1 and 2), same process and thread budget, >= 3 seeds
(docs/rollarc.md, "How it is measured"; RollArc, arXiv 2512.22560 §4).

    .venv/bin/python benchmarks/rl_real_arc.py [--seeds 3] [--quick] [--policy DIR] [--out PATH]

Workload: the multi-turn ``checked_subtraction`` environment (``ops.rl.rollarc.envs``): every
policy turn writes up to 8 chain lines and asks ``?``; a sandboxed Python subprocess recomputes
them (interpreter start + ``check_work`` loop iterations per line: the environment latency is real
work, never a sleep) and replies ``ok``; turns per trajectory = q // 8 + 1 with q long-tailed
(``ops.rl.scratchpad.problems``). The policy is the multi-turn warm start (GPT-2, 0.84M
parameters, char-level tokenizer), trained with GRPO at the same learning rate for every method.

Budget (``driver.RunSpec.placement = "local"``): every method runs in one process with the same
two engine servers (dynamic batching), the trainer on a thread, environment steps on threads (one
subprocess per check) and one reward process; only the scheduler differs. Ray is not used: on a
2-core machine its actors would only add processes, and the disaggregated placement is what
``placement = "split"`` / the asset run.

Measures, per seed (task stream = seed, role seed = seed): the end-to-end time of the same number
of optimizer steps (so the same number of trained trajectories) with evaluation excluded;
speed-ups of ``rollarc_a1`` (the headline RollArc row, async_ratio 1; async_ratio 2 is reported
alongside, not picked after the fact) over ``monolithic`` and over ``async0``; held-out accuracy
(``_TrainerImpl.heldout``: single-turn sampled pass rate at T=1 on ``problems(task_seed + 1000,
eval_size)``) before and after training; staleness histograms. 95% CIs: Student t over seeds.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import bench_parser, command_line, write_results  # noqa: E402

METHODS = ("monolithic", "async0", "rollarc_a1", "rollarc_a2")
HEADLINE = "rollarc_a1"
from resources.lake import LakeResource  # noqa: E402

DEFAULT_POLICY = os.environ.get("CRUCIBLE_POLICY") or str(LakeResource().base / "rl_policy" / "policy")
"""The warm-started policy folder: ``$CRUCIBLE_POLICY``, else the ``rl_policy`` asset's output in the
default lake (materialize it with ``crucible`` / the Dagster UI, job ``rl_policy_job``)."""

#: The full section's workload (sized for <= 12 minutes on a quiet 2-core machine, 4 methods x 3 seeds).
FULL = {"arc": {"steps": 6, "groups_per_step": 4, "group_size": 4, "redundancy": 1, "max_turns": 8},
        "eval_size": 64, "check_work": 300_000}
#: ``--quick`` (tests, wiring): the same shape, smaller.
QUICK = {"arc": {"steps": 2, "groups_per_step": 2, "group_size": 2, "redundancy": 1, "max_turns": 8},
         "eval_size": 32, "check_work": 20_000}
ROLES = {"max_new_tokens": 48, "max_prompt_tokens": 270, "lr": 5e-5, "threads": 1, "max_batch": 16,
         "engines": {"gpu_compute": 1, "gpu_bandwidth": 1}, "route_policy": "uniform"}
"""Roles of every method. ``route_policy`` uniform (least outstanding requests): both "pools" are the
same CPU here, so affinity routing has nothing to exploit (docs/rollarc.md, routing ablation control),
and with the scratchpad's short contexts it would send every request to one engine."""


def ci95(xs: list) -> dict:
    """Mean and the 95% confidence interval of the mean (Student t over seeds); ``ci95`` None for n < 2."""
    xs = [x for x in xs if x is not None]
    n = len(xs)
    if n == 0:
        return {"mean": None, "ci95": None, "n": 0}
    m = statistics.fmean(xs)
    if n < 2:
        return {"mean": m, "ci95": None, "n": n}
    from scipy.stats import t

    h = t.ppf(0.975, n - 1) * statistics.stdev(xs) / math.sqrt(n)
    return {"mean": m, "ci95": [m - h, m + h], "n": n}


class _QuietPipes:
    """The driver's pipes without output (``log.info`` kept as lines)."""

    retry_number = None

    def __init__(self):
        self.lines: list = []
        pipes = self

        class _Log:
            def info(self, msg):
                pipes.lines.append(msg)

            warning = info

        self.log = _Log()

    def report_custom_message(self, msg):
        pass


def workload(quick: bool = False, steps: int | None = None) -> dict:
    """``QUICK`` or ``FULL``, with the optimizer steps per method replaced by ``steps`` when given."""
    w = json.loads(json.dumps(QUICK if quick else FULL))
    if steps is not None:
        if steps < 1:
            raise ValueError(f"rl_real_arc: steps must be >= 1, got {steps}")
        w["arc"]["steps"] = steps
    return w


def spec_for(seed: int, policy: str, quick: bool = False, methods=METHODS, placement: str = "local",
             steps: int | None = None):
    """The validated RunSpec of one seed."""
    from ops.rl.rollarc.driver import RunSpec

    w = workload(quick, steps)
    roles = {**json.loads(json.dumps(ROLES)), "tokenizer_dir": policy, "model_dir": policy, "seed": seed,
             "env_latency": "none"}                     # the scratchpad checker's latency is its real work
    return RunSpec.from_dict({"problems_path": "", "methods": list(methods), "task": "scratchpad", "task_seed": seed,
                              "placement": placement, "num_cpus": 2, "arc": dict(w["arc"]), "roles": roles,
                              "eval_size": w["eval_size"], "eval_every": 0, "eval_temperature": 1.0,
                              "check_work": w["check_work"]})


def run_section(seeds: int = 3, quick: bool = False, policy: str = DEFAULT_POLICY, placement: str = "local",
                steps: int | None = None) -> dict:
    """Every method x seed. Returns {"speedup_vs_monolithic", "speedup_vs_async0" (of ``HEADLINE``:
    mean, ci95), "accuracy" {method: final held-out accuracy mean, ci95}, "seeds", "staleness_histogram"
    {method: {staleness: groups over seeds}}, "per_method" {method: wall_s, speedups, accuracy
    before/after, trajectories/s, generated vs trained trajectories, statuses, eval curves per seed},
    "budget", "settings", "section_s"}. ``steps``: optimizer steps per method (default: the
    workload's). ``placement``: ``local`` (default: every method in one
    process) or ``ray`` (every method on the same Ray actors: engines, trainer actor, env worker,
    reward pool; Ray and actor start-up excluded from the times). Raises FileNotFoundError when ``policy`` has no model."""
    from ops.rl.rollarc.driver import run

    if not (Path(policy) / "config.json").exists():
        raise FileNotFoundError(f"rl_real_arc: no policy at {policy} (config.json missing)")
    t0 = time.monotonic()
    runs = []
    for seed in range(seeds):
        spec = spec_for(seed, policy, quick, placement=placement, steps=steps)
        r = run(spec, _QuietPipes())
        runs.append(r)
    per: dict = {}
    for m in METHODS:
        rows = [r["methods"][m] for r in runs]
        walls = [x["wall_s"] for x in rows]
        sp_mono = [r["methods"]["monolithic"]["wall_s"] / r["methods"][m]["wall_s"] for r in runs]
        sp_a0 = [r["methods"]["async0"]["wall_s"] / r["methods"][m]["wall_s"] for r in runs]
        hist: dict = {}
        for x in rows:
            for k, v in x["staleness_hist"].items():
                hist[str(k)] = hist.get(str(k), 0) + v
        per[m] = {"wall_s": ci95(walls), "wall_s_per_seed": [round(w, 3) for w in walls],
                  "speedup_vs_monolithic": ci95(sp_mono), "speedup_vs_async0": ci95(sp_a0),
                  "accuracy_before": ci95([x["eval"][0]["accuracy"] for x in rows]),
                  "accuracy_after": ci95([x["eval"][-1]["accuracy"] for x in rows]),
                  "trajectories_per_s": ci95([x["trajectories_per_s"] for x in rows]),
                  "trained_trajectories": [x["trained_trajectories"] for x in rows],
                  "generated_trajectories": [x["generated_trajectories"] for x in rows],
                  "discarded_groups": [x["discarded_groups"] for x in rows],
                  "statuses": [x["statuses"] for x in rows],
                  "reward_mean": ci95([statistics.fmean([s["reward_mean"] for s in x["steps"] if s.get("reward_mean") is not None] or [0.0])
                                       for x in rows]),
                  "mean_response_tokens": ci95([statistics.fmean(r["response_lengths"][m]) if r["response_lengths"][m] else None
                                                for r in runs]),
                  "setup_s": [round(x["setup_s"], 2) for x in rows],
                  "staleness_histogram": hist,
                  "accuracy_vs_wall_s": [[(e["train_wall_s"], e["accuracy"]) for e in x["eval"]] for x in rows]}
    return {"speedup_vs_monolithic": per[HEADLINE]["speedup_vs_monolithic"],
            "speedup_vs_async0": per[HEADLINE]["speedup_vs_async0"],
            "headline_method": HEADLINE,
            "accuracy": {m: per[m]["accuracy_after"] for m in METHODS},
            "seeds": seeds,
            "staleness_histogram": {m: per[m]["staleness_histogram"] for m in METHODS},
            "per_method": per,
            "budget": runs[0]["budget"],
            "settings": {"policy": policy, "quick": quick, "placement": placement, "workload": workload(quick, steps), "roles": ROLES,
                         "task": "scratchpad / checked_subtraction", "eval": "single-turn sampled pass rate, T=1"},
            "section_s": round(time.monotonic() - t0, 1)}


def main(argv=None) -> int:
    ap = bench_parser(__doc__, seeds=3, quick="the quick workload (a smoke run)")
    ap.add_argument("--policy", default=DEFAULT_POLICY)
    ap.add_argument("--placement", default="local", choices=("local", "ray"))
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per method (default: the workload's)")
    ap.add_argument("--out", default=None, help="also write the JSON here (atomic)")
    a = ap.parse_args(argv)
    res = run_section(a.seeds, a.quick, a.policy, a.placement, a.steps)
    res["command"] = command_line(__file__, argv)
    print(json.dumps(res, indent=1, default=str))
    if a.out:
        write_results(res, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
