"""``run_seed`` of the decontam-rephrase claim: the decontamination asset's call (``Decontaminator`` with the
default config, ``semantic_benchmarks`` [all], ``run_stable``) on the embedded default's curation corpus (MATH test,
DeepMind mathematics_dataset at ``per_module`` per module, MMLU dev/val, ARC validation) plus rule-based rephrasings
of GSM8K and MMLU test items (``benchmarks/decontam_rephrase.py``: ``rephrased_items``, ``run_call``).

One seed = the rephrasings drawn with that seed (which items, which names, synonyms and sentence orders; at most
``per_benchmark`` per benchmark, each holding under half of its item's word 8-grams), one call on a fresh per-lake
embedding cache in the seed's work folder. The rephrasings are stand-ins: no PyPI package ships the public
LLM-rephrased sets, and nothing may come from a hub at run time.

Arms: ``crucible`` (the measured call) and ``target`` (the thresholds the claim is tested against, constants:
``target_recall_pct`` and ``target_control_fp_pct``).

Returned for ``crucible``: ``recall_pct`` (rephrasings removed by any layer, % of all rephrasings),
``control_fp_pct`` (clean controls, the corpus rows outside MATH test, removed by the semantic layer, %),
``control_any_layer_pct`` (controls removed by any layer: mostly MMLU dev/val rows that copy a test item),
``recall_gsm8k_pct``, ``recall_mmlu_pct``, ``rephrased``, ``controls``, ``call_wall_s``, ``call_cpu_s``.
"""

from __future__ import annotations

from pathlib import Path


def run_seed(seed: int, arm_order: list[str], workdir: Path, per_benchmark: int = 300, per_module: int = 20,
             target_recall_pct: float = 80.0, target_control_fp_pct: float = 1.0) -> dict:
    """One call (module docstring). Raises ValueError for an unknown arm, RuntimeError when no rephrasing or no
    control was built."""
    bad = [a for a in arm_order if a not in ("crucible", "target")]
    if bad:
        raise ValueError(f"decontam run_seed: unknown arms {bad}; known ['crucible', 'target']")
    from benchmarks.decontam_rephrase import rephrased_items, run_call
    from ops.curation import sources
    from ops.curation.decontam import ALL_BENCHMARKS

    bench = sources.benchmark_items()
    corpus = sources.math_test() + sources.mathematics_dataset(per_module) + sources.mmlu_dev_val() + sources.arc()
    reph = rephrased_items(bench, per_benchmark, seed=seed)
    problems = [r["problem"] for r in corpus] + [r["problem"] for r in reph]
    controls = [i for i, r in enumerate(corpus) if r["source"] in ("mathematics_dataset", "mmlu_dev_val", "arc")]
    if not reph or not controls:
        raise RuntimeError(f"decontam run_seed: {len(reph)} rephrasings, {len(controls)} controls")
    Path(workdir).mkdir(parents=True, exist_ok=True)
    flags, timing = run_call(bench, problems, [ALL_BENCHMARKS], Path(workdir) / "embeddings.parquet")
    n = len(corpus)

    def pct(idx: list[int], pred) -> float:
        return 100.0 * sum(1 for i in idx if pred(flags[i])) / max(len(idx), 1)

    def by(name: str) -> list[int]:
        return [n + k for k, r in enumerate(reph) if r["benchmark"] == name]

    meas = {"recall_pct": pct(list(range(n, len(problems))), bool),
            "control_fp_pct": pct(controls, lambda f: bool(f) and f["layer"] == "semantic"),
            "control_any_layer_pct": pct(controls, bool),
            "recall_gsm8k_pct": pct(by("gsm8k_test"), bool), "recall_mmlu_pct": pct(by("mmlu_test"), bool),
            "rephrased": len(reph), "controls": len(controls),
            "call_wall_s": timing["wall_s"], "call_cpu_s": timing["cpu_s"]}
    return {"crucible": meas, "target": {"recall_pct": target_recall_pct, "control_fp_pct": target_control_fp_pct}}
