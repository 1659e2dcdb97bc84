"""Decontamination benchmark: per-layer precision and recall on the labelled set, MATH-500 ground truth on the MATH
test set, the escaped-LaTeX case, and the wall time of each layer on the curation corpus (issue 19).

    .venv/bin/python benchmarks/decontam_bench.py            # -> benchmarks/results/decontam.json

Policies compared: ``legacy`` (n-gram layers on the former light normalisation: the behaviour before issue 19),
``ngram`` (the same layers on the matching normalisation) and ``strict`` (the default: + siblings + rephrasings).
The corpus for the wall times is what the curation group decontaminates on the embedded default (MATH test,
DeepMind mathematics_dataset at 20 per module, MMLU dev/val, ARC), against every benchmark item. The embedding
cache is off here (no per-lake file, no shared benchmark cache), so the semantic layer's time is a cold
run's.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import bench_parser, command_line, write_results  # noqa: E402


def main() -> None:
    ap = bench_parser(__doc__, "decontam.json")
    ap.add_argument("--per-kind", type=int, default=60)
    ap.add_argument("--skip-corpus", action="store_true", help="no wall-time run on the curation corpus")
    args = ap.parse_args()

    from ops.curation import sources
    from ops.curation.decontam import DecontamConfig, Decontaminator, MiniLMEmbedder, ground_truth_scores, layer_counts
    from ops.curation.decontam_set import evaluate, labelled_set
    from ops.curation.text import normalize

    policies = {"legacy": DecontamConfig(policy="ngram", match_normalization=False),
                "ngram": DecontamConfig(policy="ngram"), "strict": DecontamConfig()}
    bench = sources.benchmark_items()
    m500 = [b for b in bench if b["benchmark"] == "math500"]
    math_test = sources.math_test()
    pool = [r["problem"] for r in math_test] + [b["problem"] for b in bench if b["benchmark"] == "gsm8k_test"]
    rows = labelled_set(bench, pool, per_kind=args.per_kind)
    out: dict = {"command": command_line(__file__), "machine": {"cpus": os.cpu_count(),
                 "load_average_at_start": os.getloadavg()}, "labelled_set": {}, "math500_ground_truth": {},
                 "escaped_latex_case": {}, "corpus": {}}
    from collections import Counter

    out["labelled_set_kinds"] = dict(Counter(f"{r['kind']}:{'contaminated' if r['label'] else 'clean'}" for r in rows))
    for name, cfg in policies.items():
        det = Decontaminator(m500, cfg, embedder=MiniLMEmbedder(cfg.semantic_max_tokens, shared_dir=None))
        t = time.perf_counter()
        flags = det.run([r["problem"] for r in rows])
        ev = evaluate(rows, flags)
        ev["seconds"] = round(time.perf_counter() - t, 2)
        out["labelled_set"][name] = ev
        print(name, "labelled set: precision %.3f recall %.3f" % (ev["precision"], ev["recall"]), flush=True)

    escaped_items = [b for b in m500 if "\\" in b["problem"]]
    escaped = [b["problem"].replace("\\", "\\\\") for b in escaped_items]
    full = {name: Decontaminator(bench, cfg, embedder=MiniLMEmbedder(cfg.semantic_max_tokens, shared_dir=None))
            for name, cfg in policies.items()}
    m500_norm = {normalize(b["problem"]) for b in m500}
    truth = np.array([normalize(r["problem"]) in m500_norm for r in math_test])
    for name, det in full.items():
        f = det.run(escaped)
        out["escaped_latex_case"][name] = {"items": len(escaped), "flagged_by_own_item": sum(
            1 for x, b in zip(f, escaped_items) if x and x["item_id"] == b["item_id"])}
        flags = det.run([r["problem"] for r in math_test])
        removed = np.array([x is not None and x["benchmark"] == "math500" for x in flags])
        gt = ground_truth_scores(removed, truth)
        gt["removed_per_layer"] = layer_counts(flags)
        out["math500_ground_truth"][name] = gt
        print(name, "escaped", out["escaped_latex_case"][name], "MATH test: recall %.3f precision %.3f"
              % (gt["recall"], gt["precision"]), flush=True)

    if not args.skip_corpus:
        corpus = (math_test + sources.mathematics_dataset(20) + sources.mmlu_dev_val() + sources.arc())
        problems = [r["problem"] for r in corpus]
        for name in ("ngram", "strict"):
            t = time.perf_counter()
            det = Decontaminator(bench, policies[name], embedder=MiniLMEmbedder(
                policies[name].semantic_max_tokens, shared_dir=None))
            init = time.perf_counter() - t
            t = time.perf_counter()
            cpu = time.process_time()
            flags = det.run(problems)
            out["corpus"][name] = {"rows": len(problems), "benchmark_items": len(bench), "init_s": round(init, 2),
                                   "run_s": round(time.perf_counter() - t, 2),
                                   "run_cpu_s": round(time.process_time() - cpu, 2),
                                   "seconds_per_layer": {k: round(v, 2) for k, v in det.stats["seconds"].items()},
                                   "semantic": {k: (round(v, 2) if isinstance(v, float) else v)
                                                for k, v in det.stats.get("semantic", {}).items()},
                                   "removed_per_layer": layer_counts(flags)}
            print(name, "corpus", out["corpus"][name], flush=True)
    out["machine"]["load_average_at_end"] = os.getloadavg()
    write_results(out, args.out, indent=2)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
