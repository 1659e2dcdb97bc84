"""Run datatrove 0.10.1's MinHash dedup pipeline on the benchmark corpus (called by dedup_bench.py).

Runs in the separate venv ``.venv-bench`` (datatrove pins its own dependency set):

    PYTHONPATH=benchmarks .venv-bench/bin/python benchmarks/datatrove_runner.py \
        --corpus benchmarks/.work/corpus_100000_0.jsonl --work benchmarks/.work/datatrove_crucible \
        --result benchmarks/.work/datatrove.json --config crucible

The four stages of datatrove's own MinHash example (signatures -> buckets -> cluster -> filter) are
run one after the other, each on a ``LocalPipelineExecutor`` with 2 workers. Writing the input JSONL
shards is not timed; everything from the first executor's start to the last one's end is.

Configs:
  crucible  closest to Crucible: 5-gram words, --buckets x --rows hashes (dedup_bench.py passes
            Crucible's own lsh_params(0.8, 128), e.g. 16 x 8 = 128 or 9 x 13 = 117 hashes), seed 1,
            64-bit xxhash shingles, Crucible's word tokenizer
            (benchmarks/dt_crucible_tokenizer.py) and light normalisation (lowercase + whitespace only;
            numbers and punctuation kept, no diacritic stripping).
  defaults  datatrove's own defaults: MinhashConfig() (5-gram, 14 buckets x 8 hashes, seed 1,
            64-bit xxhash) with TextNormConfig() (numbers -> 0, punctuation removed, diacritics
            stripped) and the English spaCy word tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--result", type=Path, required=True)
    ap.add_argument("--config", choices=["crucible", "defaults"], default="crucible")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--buckets", type=int, default=9, help="crucible config: Crucible's LSH bands")
    ap.add_argument("--rows", type=int, default=13, help="crucible config: Crucible's LSH rows")
    args = ap.parse_args()

    import datatrove
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig
    from datatrove.utils.text import TextNormConfig

    if args.work.exists():
        shutil.rmtree(args.work)
    inp = args.work / "input"
    inp.mkdir(parents=True)
    # two contiguous shards, one per task: datatrove's doc index within shard r maps to start[r] + index
    lines = args.corpus.read_text(encoding="utf-8").splitlines(keepends=True)
    n = len(lines)
    tasks = args.workers
    bounds = [round(n * k / tasks) for k in range(tasks + 1)]
    for k in range(tasks):
        (inp / f"{k:05d}.jsonl").write_text("".join(lines[bounds[k] : bounds[k + 1]]), encoding="utf-8")
    del lines

    if args.config == "crucible":
        from dt_crucible_tokenizer import CrucibleTokenizer

        config = MinhashConfig(
            n_grams=5,
            num_buckets=args.buckets,
            hashes_per_bucket=args.rows,
            seed=1,
            norm_config=TextNormConfig(
                lowercase=True, norm_whitespace=True, remove_punctuation=False,
                norm_unicode_diacritics=False, norm_numbers=False,
            ),
            hash_config=HashConfig(precision=64, hash_fc="xxhash"),
        )
        language = CrucibleTokenizer()
        tok_desc = "CrucibleTokenizer (ops.curation.text.tokens rule)"
    else:
        config = MinhashConfig()
        language = "eng"
        tok_desc = "datatrove default English word tokenizer (spaCy blank 'en')"

    w = args.work
    common = dict(skip_completed=False)
    stages = [
        ("1_signatures", LocalPipelineExecutor(
            pipeline=[JsonlReader(str(inp)), MinhashDedupSignature(output_folder=str(w / "sigs"), config=config, language=language)],
            tasks=tasks, workers=args.workers, logging_dir=str(w / "logs/1"), **common)),
        ("2_buckets", LocalPipelineExecutor(
            pipeline=[MinhashDedupBuckets(input_folder=str(w / "sigs"), output_folder=str(w / "buckets"), config=config)],
            tasks=config.num_buckets, workers=args.workers, logging_dir=str(w / "logs/2"), **common)),
        ("3_cluster", LocalPipelineExecutor(
            pipeline=[MinhashDedupCluster(input_folder=str(w / "buckets"), output_folder=str(w / "remove_ids"),
                                          config=config, save_cluster_id=True)],
            tasks=1, workers=1, logging_dir=str(w / "logs/3"), **common)),
        ("4_filter", LocalPipelineExecutor(
            pipeline=[
                JsonlReader(str(inp)),
                MinhashDedupFilter(input_folder=str(w / "remove_ids"), load_cluster_ids=True,
                                   exclusion_writer=JsonlWriter(str(w / "removed"), compression=None)),
                JsonlWriter(str(w / "kept"), compression=None),
            ],
            tasks=tasks, workers=args.workers, logging_dir=str(w / "logs/4"), **common)),
    ]
    stage_secs = {}
    t0 = time.perf_counter()
    for name, ex in stages:
        s = time.perf_counter()
        ex.run()
        stage_secs[name] = round(time.perf_counter() - s, 3)
    total = time.perf_counter() - t0

    removed, cluster_of = [], {}
    for sub, is_removed in (("removed", True), ("kept", False)):
        folder = w / sub
        for f in sorted(folder.glob("*.jsonl")) if folder.exists() else []:
            for line in f.open(encoding="utf-8"):
                d = json.loads(line)
                i = int(d["id"])
                c = d.get("metadata", {}).get("minhash_cluster_id", -1)
                if c is not None and c >= 0:
                    cluster_of[i] = int(c)
                if is_removed:
                    removed.append(i)
    kept_count = sum(1 for f in (w / "kept").glob("*.jsonl") for _ in f.open(encoding="utf-8"))
    peak_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    peak_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {
        "what": "datatrove MinHash pipeline: JsonlReader -> MinhashDedupSignature | MinhashDedupBuckets | "
                "MinhashDedupCluster(save_cluster_id) | JsonlReader -> MinhashDedupFilter(load_cluster_ids, "
                "exclusion_writer) -> JsonlWriter (uncompressed)",
        "datatrove_version": datatrove.__version__ if hasattr(datatrove, "__version__") else "0.10.1",
        "config_name": args.config,
        "minhash_config": {
            "n_grams": config.n_grams, "num_buckets": config.num_buckets, "hashes_per_bucket": config.hashes_per_bucket,
            "total_hashes": config.num_buckets * config.hashes_per_bucket, "seed": config.seed,
            "hash_config": str(config.hash_config), "norm_config": vars(config.norm_config),
            "word_tokenizer": tok_desc,
        },
        "executor": f"LocalPipelineExecutor, workers={args.workers}; tasks: signatures {tasks}, buckets "
                    f"{config.num_buckets}, cluster 1, filter {tasks}; start_method forkserver",
        "pipeline_seconds": total,
        "stage_seconds": stage_secs,
        "kept": kept_count,
        "peak_rss_mb": round(max(peak_self, peak_children), 1),
        "peak_rss_note": "largest single process (driver or one worker), not the sum over workers",
        "removed_ids": sorted(removed),
        "cluster_of": {str(k): v for k, v in cluster_of.items()},
    }
    args.result.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
