"""Rephrasings of every benchmark through the decontamination asset's own call (issue 42, item 9): recall on
rephrased GSM8K and MMLU test items, the false-positive rate on clean controls, and the call's wall time, with the
semantic layer on MATH-500 only (the former default) and on every benchmark (the default now).

    .venv/bin/python benchmarks/decontam_rephrase.py        # -> benchmarks/results/decontam_rephrase.json

The rephrased sets: no PyPI package ships the public rephrased test sets (the LLM-rephrased GSM8K and MMLU of the
"rephrased samples" study, BenBench, GSM-Plus; checked: pypi.tsv and the wheels of llmsanitize, benchleak,
contamination-audit), and nothing may come from a hub at run time. So the positives here are Crucible's own
rule-based rephrasings (:func:`ops.curation.decontam_set.rephrase_deep`: names changed, synonyms, sentence order),
kept only when they hold under half of their item's word 8-grams (what the copy layers would catch): a stand-in,
easier for an embedding than an LLM's rephrasing, and never to be quoted as the public sets' figure.

The corpus is what the curation group decontaminates on the embedded default (MATH test, DeepMind
mathematics_dataset at 20 per module, MMLU dev/val, ARC validation) plus the rephrasings; the call is the asset's
(``Decontaminator(...).run_stable`` with a fresh on-disk embedding cache, then again with that cache warm). Clean
controls: the corpus rows that are not MATH test problems (MATH test holds MATH-500 and real rephrasings of it):
mathematics_dataset, MMLU dev/val and ARC validation — real problems outside every test split; every control the
semantic layer removes is listed for a reader to judge.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import bench_parser, command_line, write_results  # noqa: E402


def rephrased_items(bench: list[dict], per_benchmark: int, seed: int = 0) -> list[dict]:
    """Rule-based rephrasings of GSM8K and MMLU test items: dicts ``problem``, ``benchmark``, ``item_id`` (the
    source item), at most ``per_benchmark`` per benchmark, each holding under half of its item's word 8-grams."""
    from ops.curation.decontam import all_ngrams
    from ops.curation.decontam_set import rephrase_deep

    rng = random.Random(seed)
    out = []
    for name in ("gsm8k_test", "mmlu_test"):
        items = [b for b in bench if b["benchmark"] == name]
        rng.shuffle(items)
        kept = 0
        for b in items:
            if kept >= per_benchmark:
                break
            r = rephrase_deep(b["problem"], rng)
            g = all_ngrams(b["problem"], 8)
            if not g or len(g & all_ngrams(r, 8)) >= 0.5 * len(g):
                continue
            out.append({"problem": r, "benchmark": name, "item_id": b["item_id"]})
            kept += 1
    return out


def run_call(bench, problems, semantic_benchmarks, cache: Path) -> tuple[list, dict]:
    """The asset's call: a detector with the default config (``semantic_benchmarks`` as given) and the on-disk
    embedding cache ``cache``, ``run_stable`` over ``problems``. Returns (flags, timings and stats)."""
    from ops.curation.decontam import DecontamConfig, Decontaminator, MiniLMEmbedder

    cfg = DecontamConfig(semantic_benchmarks=semantic_benchmarks)
    t0, c0 = time.perf_counter(), time.process_time()
    # the shared benchmark cache beside the per-lake file, so that a fresh ``cache`` is a cold run
    det = Decontaminator(bench, cfg, embedder=MiniLMEmbedder(cfg.semantic_max_tokens, cache_path=cache,
                                                             shared_dir=cache.parent / f"{cache.stem}-shared"))
    flags = det.run_stable(problems)
    return flags, {"wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(time.process_time() - c0, 1),
                   "seconds_per_layer": {k: round(v, 1) for k, v in det.stats["seconds"].items()},
                   "semantic": {k: (round(v, 1) if isinstance(v, float) else v) for k, v in det.stats["semantic"].items()},
                   "rounds": det.stats.get("rounds")}


def main() -> None:
    ap = bench_parser(__doc__, "decontam_rephrase.json")
    ap.add_argument("--per-benchmark", type=int, default=400, help="rephrased items per benchmark (GSM8K, MMLU)")
    ap.add_argument("--mathematics-per-module", type=int, default=20)
    args = ap.parse_args()

    from ops.curation import sources
    from ops.curation.decontam import ALL_BENCHMARKS, layer_counts

    bench = sources.benchmark_items()
    by_id = {b["item_id"]: b for b in bench}
    corpus = (sources.math_test() + sources.mathematics_dataset(args.mathematics_per_module) + sources.mmlu_dev_val()
              + sources.arc())
    reph = rephrased_items(bench, args.per_benchmark)
    problems = [r["problem"] for r in corpus] + [r["problem"] for r in reph]
    kind = [r["source"] for r in corpus] + [f"rephrased:{r['benchmark']}" for r in reph]
    control = [k in ("mathematics_dataset", "mmlu_dev_val", "arc") for k in kind]
    out: dict = {"command": command_line(__file__), "real_or_simulated":
                 "real detector, real corpus and controls; the rephrasings are rule-based stand-ins (no PyPI package "
                 "ships the public rephrased sets)",
                 "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()},
                 "corpus_rows": len(corpus), "rephrased": dict(Counter(r["benchmark"] for r in reph)),
                 "controls": dict(Counter(k for k, c in zip(kind, control) if c)), "runs": {}}
    print("rows", len(problems), out["rephrased"], out["controls"], flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, sem in (("math500_only", ["math500"]), ("every_benchmark", [ALL_BENCHMARKS])):
            cache = Path(tmp) / f"{name}.parquet"
            flags, timing = run_call(bench, problems, sem, cache)
            run: dict = {"semantic_benchmarks": sem, "cold_cache": timing, "removed_per_layer": layer_counts(flags)}
            if name == "every_benchmark":
                run["warm_cache"] = run_call(bench, problems, sem, cache)[1]
            n = len(corpus)
            rec = {}
            for b in ("gsm8k_test", "mmlu_test"):
                idx = [n + i for i, r in enumerate(reph) if r["benchmark"] == b]
                own = [i for i in idx if flags[i] and flags[i]["item_id"] == reph[i - n]["item_id"]]
                rec[b] = {"items": len(idx), "flagged": sum(1 for i in idx if flags[i]), "flagged_by_own_item": len(own),
                          "recall": round(sum(1 for i in idx if flags[i]) / max(len(idx), 1), 4),
                          "by_layer": dict(Counter(flags[i]["layer"] for i in idx if flags[i]))}
            tot = sum(v["flagged"] for v in rec.values())
            rec["all"] = {"items": len(reph), "flagged": tot, "recall": round(tot / max(len(reph), 1), 4)}
            run["rephrased_recall"] = rec
            ctrl = [i for i in range(len(problems)) if control[i]]
            fp = [i for i in ctrl if flags[i]]
            sem_fp = [i for i in fp if flags[i]["layer"] == "semantic"]
            run["controls"] = {"rows": len(ctrl), "flagged_any_layer": len(fp),
                               "flagged_rate": round(len(fp) / len(ctrl), 4),
                               "by_source_and_layer": dict(Counter(f"{kind[i]}/{flags[i]['layer']}" for i in fp)),
                               "flagged_by_semantic": len(sem_fp),
                               "semantic_rate": round(len(sem_fp) / len(ctrl), 4),
                               "semantic_examples": [{"row": problems[i][:300], "item_id": flags[i]["item_id"],
                                                      "item": by_id[flags[i]["item_id"]]["problem"][:300],
                                                      "cosine": round(flags[i]["score"], 3)} for i in sem_fp]}
            run["math_test_removed_per_benchmark"] = dict(Counter(
                f"{flags[i]['benchmark']}/{flags[i]['layer']}" for i in range(len(problems)) if kind[i] == "math_test" and flags[i]))
            out["runs"][name] = run
            print(name, {k: v for k, v in run.items() if k not in ("controls",)},
                  {k: v for k, v in run["controls"].items() if k != "semantic_examples"}, flush=True)
    out["machine"]["load_average_at_end"] = os.getloadavg()
    write_results(out, args.out, indent=2)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
