"""The decontamination call on the default corpus with the shared benchmark-embedding cache cold and warm (issue:
the semantic layer covers every benchmark within the curation budget).

    .venv/bin/python benchmarks/decontam_embcache.py        # -> benchmarks/results/decontam_embcache.json

The call is the decontaminated_problems asset's detector call: ``Decontaminator(benchmark_items, DecontamConfig())
.run_stable(corpus)`` with a ``MiniLMEmbedder`` on a fresh per-lake cache (as in a fresh lake) and the shared
benchmark cache (:class:`ops.curation.decontam.BenchmarkEmbeddingCache`) in a folder of its own. The corpus is what
the curation group decontaminates on the embedded default (MATH test, DeepMind mathematics_dataset at 20 per module,
MMLU dev/val, ARC validation), against every benchmark item (``semantic_benchmarks`` [all], the default).

Runs, each in a fresh Python process (so the model load and imports count, as in a Dagster step):

- ``cold``: no shared cache (empty folder), fresh per-lake cache: every prefiltered row and item is embedded;
- ``warm``: the shared cache ``cold`` left, a fresh per-lake cache (a fresh lake, e.g. a new ``make demo``): only
  the training rows are embedded;
- ``warm_lake``: both caches warm (a rerun in the same lake).

Wall and CPU seconds (``time.process_time``: every thread of the process) of the process from start to end; the
machine is shared (2 cores), so the load average is recorded with each run. Real figures, not simulated.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks._cli import bench_parser, command_line, write_results  # noqa: E402


def child(shared: str, lake_cache: str, per_module: int) -> dict:
    """One run of the call in this process; returns its figures."""
    from ops.curation import sources
    from ops.curation.decontam import DecontamConfig, Decontaminator, MiniLMEmbedder, layer_counts

    bench = sources.benchmark_items()
    corpus = (sources.math_test() + sources.mathematics_dataset(per_module) + sources.mmlu_dev_val() + sources.arc())
    cfg = DecontamConfig()
    emb = MiniLMEmbedder(cfg.semantic_max_tokens, cache_path=lake_cache, shared_dir=shared)
    t0, c0 = time.perf_counter(), time.process_time()
    det = Decontaminator(bench, cfg, embedder=emb)
    flags = det.run_stable([r["problem"] for r in corpus])
    return {"call_wall_s": round(time.perf_counter() - t0, 1), "call_cpu_s": round(time.process_time() - c0, 1),
            "corpus_rows": len(corpus), "benchmark_items": len(bench), "encoded": emb.encoded,
            "encoded_benchmark": emb.encoded_benchmark, "removed_per_layer": layer_counts(flags),
            "seconds_per_layer": {k: round(v, 1) for k, v in det.stats["seconds"].items()},
            "semantic": {k: (round(v, 1) if isinstance(v, float) else v) for k, v in det.stats["semantic"].items()},
            "benchmark_cache_files": [os.path.relpath(p, shared) for p in emb.benchmark_cache_paths]}


def run_child(shared: Path, lake_cache: Path, per_module: int, timeout_s: float) -> dict:
    load = os.getloadavg()
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, __file__, "--child", str(shared), str(lake_cache), str(per_module)],
                         capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    if res.returncode != 0:
        raise RuntimeError(f"child run failed ({res.returncode}): {res.stderr[-3000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    ru = out.pop("_process_cpu_s")
    out.update(process_wall_s=round(time.perf_counter() - t0, 1), process_cpu_s=ru, load_average_at_start=load)
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        shared, lake_cache, per_module = sys.argv[2], sys.argv[3], int(sys.argv[4])
        out = child(shared, lake_cache, per_module)
        out["_process_cpu_s"] = round(time.process_time(), 1)
        print(json.dumps(out))
        return
    ap = bench_parser(__doc__, "decontam_embcache.json")
    ap.add_argument("--mathematics-per-module", type=int, default=20)
    ap.add_argument("--timeout-s", type=float, default=3600.0, help="per run")
    args = ap.parse_args()
    out: dict = {"command": command_line(__file__), "real_or_simulated": "real (real corpus, model and cache files)",
                 "machine": {"cpus": os.cpu_count()}, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        shared = Path(tmp) / "shared"
        for name, lake in (("cold", "lake1"), ("warm", "lake2"), ("warm_lake", "lake2")):
            out["runs"][name] = r = run_child(shared, Path(tmp) / lake / "embeddings.parquet",
                                              args.mathematics_per_module, args.timeout_s)
            print(name, json.dumps(r), flush=True)
        out["shared_cache_bytes"] = sum(p.stat().st_size for p in shared.rglob("*.parquet"))
    out["machine"]["load_average_at_end"] = os.getloadavg()
    write_results(out, args.out, indent=2)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
