"""RollArc vs the monolithic synchronous baseline (docs/rollarc.md, "How it is measured"; RollArc, arXiv 2512.22560).

    .venv/bin/python benchmarks/rollarc_bench.py [--seeds 0,1,2] [--quick] [--real] [--out PATH]

Sections of the JSON (default benchmarks/results/rollarc.json):

* ``latency_sweep``: the unchanged schedulers of ``ops.rl.rollarc.core`` on ``SimRoles`` (scaled
  real time, cost model in ``sim.rollarc_roles``) with environment latency low / medium /
  heavy (same mean): ``run_monolithic`` (lock-step turns, colocated static batches, no overlap) vs
  ``run_rollarc`` at async_ratio 1 and 2 (redundancy 1), plus ``async0`` = ``run_rollarc`` with
  async_ratio 0 and redundancy 0 (trajectory-level asynchrony within a step only: it splits the gain
  into "no per-turn barrier" and "rollout overlaps training"). Same seeds, same tasks (in order),
  same number of optimizer steps. Times are simulated seconds (wall / time_scale). Each method runs
  at its own time_scale (RollArc's event loop is busier: it needs more wall time per simulated second
  for the same fidelity); ``fidelity`` re-runs heavy/seed 0 at twice the scale to show the simulated
  times do not depend on it.
* ``routing_ablation``: ``sim.rollarc.routing_ablation`` (discrete-event, affinity vs uniform
  routing + the same-hardware control) over seeds, at its default size and at the sweep's size.
* ``real``: ``real_section`` — the Ray roles on real engines via ``run_benchmark`` (``ops.rl.rollarc.driver.run``),
  only with ``--real``; otherwise (or when it is not importable) ``{"skipped": ...}``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import bench_parser, command_line, write_results  # noqa: E402

from ops.rl.rollarc.core import ArcConfig, run_rollarc  # noqa: E402
from ops.rl.rollarc.monolithic import run_monolithic  # noqa: E402
from ops.rl.rollarc.types import Task  # noqa: E402
from sim.rollarc import routing_ablation  # noqa: E402
from sim.rollarc_roles import SimConfig, SimRoles  # noqa: E402

PAPER = {"end_to_end_training_time_reduction_vs_monolithic_sync": [1.35, 2.05],
         "source": "RollArc (arXiv 2512.22560), abstract; baselines: monolithic, synchronous"}
KINDS = ("low", "medium", "heavy")
#: name -> (scheduler, async_ratio, redundancy, which time scale); names as the driver's
#: (``ops.rl.rollarc.spec.METHODS``), ``async0`` here without redundancy
METHODS = {"monolithic": (run_monolithic, 0, 0, "baseline"),
           "async0": (run_rollarc, 0, 0, "sync"),
           "rollarc_a1": (run_rollarc, 1, 1, "rollarc"),
           "rollarc_a2": (run_rollarc, 2, 1, "rollarc")}


def _mean(xs):
    return statistics.fmean(xs) if xs else None


def run_one(method: str, kind: str, seed: int, scale: float, args, policy: str = "affinity") -> dict:
    """One scheduler run on SimRoles; times in simulated seconds."""
    fn, ratio, red, _ = METHODS[method]
    cfg = ArcConfig(steps=args.steps, groups_per_step=args.groups, group_size=args.group_size, redundancy=red,
                    async_ratio=ratio, max_turns=args.max_turns, turn_timeout_s=60.0, episode_timeout_s=600.0,
                    group_wait_timeout_s=600.0, train_timeout_s=600.0)
    sim = SimConfig(env_latency=kind, env_mean_s=args.env_mean_s, workload_turns=args.max_turns)
    roles = SimRoles(sim, time_scale=scale, seed=seed, policy=policy)
    tasks = (Task(uid=f"seed{seed}-t{i}", env="synthetic", spec={}) for i in itertools.count())
    t0, c0 = time.perf_counter(), time.process_time()
    res = asyncio.run(fn(roles, cfg, tasks))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    st = roles.stats()
    sim_s = res.wall_s / scale
    return {"sim_s": round(sim_s, 2), "trajectories_per_sim_s": round(res.trained_trajectories / sim_s, 4),
            "mean_step_sim_s": round(sim_s / args.steps, 2),
            "train_publish_sim_s_mean": round(_mean([r["train_s"] for r in res.steps]) / scale, 2),
            "wait_sim_s_per_step": [round(r["wait_s"] / scale, 1) for r in res.steps],
            "staleness_hist": {str(k): v for k, v in sorted(res.staleness_hist.items())},
            "discarded_groups": res.discarded_groups, "trained_trajectories": res.trained_trajectories,
            "generated_trajectories": res.generated_trajectories, "dropped_trajectories": res.dropped_trajectories,
            "statuses": res.statuses, "reward_mean": round(_mean([r["reward_mean"] for r in res.steps
                                                                   if r["reward_mean"] is not None]) or 0, 3),
            "llm_requests_per_pool": {p: sum(v) for p, v in st["engine_requests"].items()},
            "time_scale": scale, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "fidelity": {"late_mean_sim_s": round(st["late_mean_sim_s"], 3), "late_max_sim_s": round(st["late_max_sim_s"], 2),
                         "resyncs": st["resyncs"], "caught_up": st["caught_up"], "sleeps": st["sleeps"]}}


def latency_sweep(args, seeds: list[int]) -> dict:
    scales = {"baseline": args.scale_baseline, "sync": args.scale_sync, "rollarc": args.scale_rollarc}
    out: dict = {"kinds": {}, "time_scales": scales}
    for kind in KINDS:
        runs = {m: {} for m in METHODS}
        for seed in seeds:
            for m, spec in METHODS.items():
                runs[m][str(seed)] = run_one(m, kind, seed, scales[spec[3]], args)
                r = runs[m][str(seed)]
                print(f"[{kind} seed {seed}] {m:13s} sim {r['sim_s']:8.1f} s  wall {r['wall_s']:5.2f} s  "
                      f"staleness {r['staleness_hist']}  discarded {r['discarded_groups']}", flush=True)
        base = runs["monolithic"]
        speed = {}
        for m in METHODS:
            if m == "monolithic":
                continue
            xs = [base[str(s)]["sim_s"] / runs[m][str(s)]["sim_s"] for s in seeds]
            speed[m] = {"mean": round(_mean(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3),
                        "per_seed": [round(x, 3) for x in xs]}
        summary = {m: {"sim_s_mean": round(_mean([r["sim_s"] for r in runs[m].values()]), 1),
                       "trajectories_per_sim_s_mean": round(_mean([r["trajectories_per_sim_s"] for r in runs[m].values()]), 4),
                       "discarded_groups_total": sum(r["discarded_groups"] for r in runs[m].values())}
                   for m in METHODS}
        out["kinds"][kind] = {"speedup_vs_monolithic": speed, "summary": summary, "runs": runs}
    if not args.quick:
        fid = {}
        for m in ("monolithic", "rollarc_a2"):
            s1 = scales[METHODS[m][3]]
            a = out["kinds"]["heavy"]["runs"][m][str(seeds[0])]["sim_s"]
            b = run_one(m, "heavy", seeds[0], 2 * s1, args)["sim_s"]
            fid[m] = {"time_scale": s1, "sim_s": a, "time_scale_x2": 2 * s1, "sim_s_x2": b,
                      "relative_difference": round(a / b - 1, 4)}
            print(f"[fidelity] {m}: {a} s at {s1}, {b} s at {2 * s1}", flush=True)
        out["fidelity"] = fid
    return out


def routing_section(args, seeds: list[int]) -> dict:
    sizes = {"default": dict(n_trajectories=32, turns=8, engines={"gpu_compute": 2, "gpu_bandwidth": 2}),
             "sweep_scale": dict(n_trajectories=args.groups * args.group_size, turns=args.max_turns,
                                 engines=dict(SimConfig().engines))}
    if args.quick:
        sizes = {"default": dict(n_trajectories=8, turns=4, engines={"gpu_compute": 1, "gpu_bandwidth": 1})}
    out = {}
    for name, kw in sizes.items():
        per = [routing_ablation(seed=s, **kw) for s in seeds]

        def agg(xs):
            return {"mean": round(_mean(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}

        out[name] = {"config": {**kw, "seeds": seeds},
                     "speedup_affinity_vs_uniform": agg([r["speedup_affinity_vs_uniform"] for r in per]),
                     "same_hardware_speedup": agg([r["same_hardware"]["speedup_affinity_vs_uniform"] for r in per]),
                     "per_seed": [{"seed": s, "affinity_makespan_s": round(r["affinity"]["makespan_s"], 2),
                                   "uniform_makespan_s": round(r["uniform"]["makespan_s"], 2),
                                   "speedup": round(r["speedup_affinity_vs_uniform"], 3),
                                   "same_hardware_speedup": round(r["same_hardware"]["speedup_affinity_vs_uniform"], 3),
                                   "utilisation_affinity": {k: round(v, 3) for k, v in r["affinity"]["utilisation"].items()},
                                   "utilisation_uniform": {k: round(v, 3) for k, v in r["uniform"]["utilisation"].items()}}
                                  for s, r in zip(seeds, per)]}
    if not args.quick:      # the same policies end to end: RollArc (ratio 1) on SimRoles, medium latency
        e2e = {pol: run_one("rollarc_a1", "medium", seeds[0], args.scale_rollarc, args, policy=pol)
               for pol in ("affinity", "uniform")}
        out["end_to_end_rollarc_a1_medium"] = {
            pol: {k: r[k] for k in ("sim_s", "trajectories_per_sim_s", "llm_requests_per_pool", "wall_s")}
            for pol, r in e2e.items()}
        out["end_to_end_rollarc_a1_medium"]["speedup_affinity_vs_uniform"] = round(
            e2e["uniform"]["sim_s"] / e2e["affinity"]["sim_s"], 3)
    return out


BENCHMARK_ARC = {"steps": 4, "groups_per_step": 2, "group_size": 3, "max_turns": 3}
"""The real-engine benchmark's workload (``run_benchmark``): larger than the embedded default's
ArcConfig; redundancy and async ratio are ArcConfig's."""


def run_benchmark(problems_path: str, tokenizer_dir: str, model_dir: str | None, kinds=("low", "medium", "heavy"),
                  arc: dict | None = None, roles: dict | None = None, seed: int = 0) -> dict:
    """The real-engine benchmark: for each env latency kind, the baseline and RollArc on the same
    tasks and steps (``ops.rl.rollarc.driver.run``, placement split: one Ray start per kind). Returns {"settings", kind: {summary rows per method,
    per-pool utilisation, speedups}} (no per-trajectory rows)."""
    from ops.launch import _LocalPipes
    from ops.rl.rollarc.driver import RunSpec, run
    from ops.rl.rollarc.report import summary_rows, utilisation_rows

    arc = {**BENCHMARK_ARC, **(arc or {})}
    roles = {"env_latency_mean_s": 0.5, **(roles or {})}
    out: dict = {"settings": {"arc": asdict(ArcConfig(**arc)), "roles": roles, "policy": model_dir or "tiny random Llama",
                              "seed": seed}}
    for kind in kinds:
        spec = RunSpec.from_dict({"problems_path": problems_path, "arc": dict(arc),
                                  "roles": {**roles, "tokenizer_dir": tokenizer_dir, "model_dir": model_dir,
                                            "seed": seed, "env_latency": kind}})
        r = run(spec, _LocalPipes(0))
        out[kind] = {"summary": summary_rows(r), "utilisation": utilisation_rows(r), "speedup_e2e": r.get("speedup_e2e"),
                     "speedup_trajectories_per_s": r.get("speedup_trajectories_per_s"), "ray_init_s": r["ray_init_s"]}
    return out


def real_section(args) -> dict:
    """The real run (Ray roles, real engines) through ``run_benchmark``, only
    with ``--real`` (and ``--real-problems`` / ``--real-tokenizer``; ``--real-model`` optional), on
    the first seed. Returns its dict, or {"skipped": why} / {"error": ...}: a failure there never
    loses the simulated sections."""
    if not args.real:
        return {"skipped": "not requested (pass --real to run run_benchmark)"}
    if not (args.real_problems and args.real_tokenizer):
        return {"skipped": "--real needs --real-problems and --real-tokenizer"}
    try:
        import ops.rl.rollarc.driver  # noqa: F401
    except Exception as e:                      # noqa: BLE001 - recorded, the rest of the benchmark stands
        return {"skipped": f"ops.rl.rollarc.driver is not importable: {type(e).__name__}: {e}"}
    try:
        return run_benchmark(problems_path=args.real_problems, tokenizer_dir=args.real_tokenizer,
                             model_dir=args.real_model, kinds=KINDS, seed=int(args.seeds.split(",")[0]))
    except Exception as e:                      # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"[:2000]}


def main(argv=None) -> int:
    ap = bench_parser(__doc__, "rollarc.json", quick="a small smoke run (tests)")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated workload seeds")
    ap.add_argument("--routing-seeds", default="0,1,2,3,4,5,6,7")
    ap.add_argument("--real", action="store_true", help="also run run_benchmark (the driver on real engines)")
    ap.add_argument("--real-problems", default=None, help="--real: problems file for the driver")
    ap.add_argument("--real-tokenizer", default=None, help="--real: tokenizer dir")
    ap.add_argument("--real-model", default=None, help="--real: model dir (optional)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--groups", type=int, default=16, help="groups per step")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=10)
    ap.add_argument("--env-mean-s", type=float, default=1.0, help="mean env step latency (simulated s), every kind")
    ap.add_argument("--scale-baseline", type=float, default=0.005, help="time_scale of run_monolithic")
    ap.add_argument("--scale-sync", type=float, default=0.01, help="time_scale of async0")
    ap.add_argument("--scale-rollarc", type=float, default=0.02, help="time_scale of rollarc_a1/a2")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.groups, args.group_size, args.max_turns = 2, 3, 3, 4
        args.scale_baseline = args.scale_sync = args.scale_rollarc = 0.002
        args.seeds, args.routing_seeds = args.seeds.split(",")[0], "0"
    seeds = [int(s) for s in args.seeds.split(",")]
    out = {"benchmark": "rollarc", "commands": [command_line(__file__, argv)],
           "paper": PAPER,
           "parameters": {"steps": args.steps, "groups_per_step": args.groups, "group_size": args.group_size,
                          "max_turns": args.max_turns, "env_mean_s": args.env_mean_s, "seeds": seeds,
                          "sim_config": SimConfig(env_mean_s=args.env_mean_s, workload_turns=args.max_turns).to_dict()}}
    runtime = {}
    load_start = os.getloadavg()
    t = time.perf_counter()
    out["latency_sweep"] = latency_sweep(args, seeds)
    runtime["latency_sweep"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter()
    out["routing_ablation"] = routing_section(args, [int(s) for s in args.routing_seeds.split(",")])
    runtime["routing_ablation"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter()
    out["real"] = real_section(args)
    runtime["real"] = round(time.perf_counter() - t, 1)
    out["runtime_s"] = runtime
    out["machine"] = {"nproc": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                      "load_average_at_start": load_start,
                      "load_average_at_end": os.getloadavg()}
    out["date"] = time.strftime("%Y-%m-%d")
    write_results(out, args.out)
    brief = {k: {"speedup_vs_monolithic": v["speedup_vs_monolithic"], "summary": v["summary"]}
             for k, v in out["latency_sweep"]["kinds"].items()}
    print(json.dumps({"latency_sweep": brief, "fidelity": out["latency_sweep"].get("fidelity"),
                      "routing_ablation": {k: {kk: vv for kk, vv in v.items() if kk not in ("per_seed", "config")}
                                           for k, v in out["routing_ablation"].items()},
                      "real": out["real"], "runtime_s": runtime}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
