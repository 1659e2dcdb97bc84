"""``run_seed`` of the failure-driven post-training claim (Logics-STEM's failure-driven loop; docs/posttrain.md,
issue 39 item 5): one seed = one whole replicate of the post-training chain, exactly as the main job runs it
(``assets.posttrain.POSTTRAIN_ASSETS``: ``sft_checkpoint`` -> ``failure_regions`` -> ``targeted_synthesis`` ->
``stage2_checkpoint`` -> ``failure_driven_comparison``), materialized in a fresh lake under the seed's workdir.

Inputs the chain reads are built as ``benchmarks/failure_driven_bench.py`` builds them for a lake that lacks
them (``build_standins``): the tokenizer over the reviews, the MATH test problems and a
``mathematics_dataset`` sample; the CPT base model of ``size`` through the probe worker (2 ranks, the
pipeline's base settings: the same base in every seed); ``sft_dataset`` = 2,000 MATH test rows with their
reference solutions; ``benchmark_problems`` from ``ops.curation.sources``. Everything the chain draws is
seeded from the claim seed, so no seed repeats a development draw (development used 0-2 and the defaults
101 / 202 / 303): stage-1 data order ``seed``, the regions' k-means ``seed``, programmatic training problems ``train_seed = seed``,
evaluation problems ``eval_seed = seed + 500_000``, the synthesis pool ``pool_seed = seed + 900_000`` and its
selection ``seed``, stage-2 data orders ``seed, seed + 1, seed + 2`` (``stage2_seeds`` runs per arm).

Arms ``targeted`` (stage 2 on the items synthesised for the failure regions + replay) and ``random`` (the
same number of items drawn uniformly from the same filtered pool + the same replay), trained in one launch
with identical settings; each arm's metric is its accuracy (%) on the failure slices of the test split
(items in a targeted cell), averaged over its stage-2 runs; ``overall_pct``, ``other_slices_pct``,
``stage1_failure_pct`` and the slice sizes are reported beside it. The arms share the seed's stage 1,
regions and pool: the difference is paired by construction. ``arm_order`` is recorded only: both arms are
trained in one launch in a fixed order and each run is seeded and deterministic, so the order cannot
change a result.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
ARMS = ("targeted", "random")
EVAL_SEED_OFFSET = 500_000
POOL_SEED_OFFSET = 900_000


def chain_config(seed: int, size: str = "m", domain_ratio: float = 0.85, stage2_seeds: int = 3,
                 stage1_steps: int = 300, stage2_steps: int = 60, budget: int = 600, pool_per_module: int = 150,
                 train_per_module: int = 300, eval_per_module: int = 60) -> dict:
    """The run config (``ops`` mapping) of the chain for one claim seed: every generator and data-order
    seed derived from ``seed`` (module docstring). Raises ValueError for a seed < 0 or a derived
    evaluation seed equal to the training seed."""
    if seed < 0:
        raise ValueError(f"failure-driven chain: seed must be >= 0, got {seed}")
    eval_seed = seed + EVAL_SEED_OFFSET
    if eval_seed == seed:
        raise ValueError("failure-driven chain: eval_seed equals train_seed")
    return {
        "sft_checkpoint": {"config": {"base_size": size, "seed": seed, "train_seed": seed, "eval_seed": eval_seed,
                                      "domain_ratio": domain_ratio, "steps": stage1_steps,
                                      "train_per_module": train_per_module, "eval_per_module": eval_per_module}},
        "failure_regions": {"config": {"seed": seed}},
        "targeted_synthesis": {"config": {"seed": seed, "pool_seed": seed + POOL_SEED_OFFSET, "budget": budget,
                                          "pool_per_module": pool_per_module}},
        "stage2_checkpoint": {"config": {"seed": seed, "seeds": stage2_seeds, "steps": stage2_steps}},
    }


def arm_metrics(table: list[dict]) -> dict:
    """Per arm, from ``failure_driven_comparison``'s table (rows: checkpoint, slice, accuracy as a
    fraction, n): ``failure_slices_pct`` (the claim's metric), ``overall_pct``, ``other_slices_pct`` (%),
    ``failure_items`` and ``stage1_failure_pct``. Raises KeyError naming a missing (checkpoint, slice)."""
    acc = {(r["checkpoint"], r["slice"]): r for r in table}

    def get(ck: str, sl: str) -> dict:
        if (ck, sl) not in acc:
            raise KeyError(f"failure_driven_comparison table has no row ({ck!r}, {sl!r})")
        return acc[(ck, sl)]

    out = {}
    for arm in ARMS:
        ck = f"stage2_{arm}"
        out[arm] = {"failure_slices_pct": 100.0 * get(ck, "failure_slices")["accuracy"],
                    "overall_pct": 100.0 * get(ck, "overall")["accuracy"],
                    "other_slices_pct": 100.0 * get(ck, "other_slices")["accuracy"],
                    "failure_items": float(get(ck, "failure_slices")["n"]),
                    "stage1_failure_pct": 100.0 * get("stage1", "failure_slices")["accuracy"]}
    return out


def run_seed(seed: int, arm_order: list[str], workdir: Path, size: str = "m", domain_ratio: float = 0.85,
             stage2_seeds: int = 3, stage1_steps: int = 300, stage2_steps: int = 60, budget: int = 600,
             pool_per_module: int = 150, train_per_module: int = 300, eval_per_module: int = 60) -> dict:
    """One seed of ``failure-driven`` (module docstring). Raises ValueError for an unknown arm,
    RuntimeError naming the asset whose materialization failed."""
    import json

    import dagster as dg

    bad = [a for a in arm_order if a not in ARMS]
    if bad:
        raise ValueError(f"failure-driven run_seed: unknown arms {bad}; known {ARMS}")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import failure_driven_bench as fdb

    from assets import posttrain
    from resources.compute import ComputeResource
    from resources.lake import LakeResource
    from resources.teacher import TeacherResource

    lake = LakeResource(root=str(Path(workdir) / "lake"))
    t0 = time.monotonic()
    notes = fdb.build_standins(lake, size)
    timings = {"standins_s": round(time.monotonic() - t0, 1)}
    cfg = chain_config(seed, size, domain_ratio, stage2_seeds, stage1_steps, stage2_steps, budget, pool_per_module,
                       train_per_module, eval_per_module)
    res = {"lake": lake, "compute": ComputeResource(), "teacher": TeacherResource()}
    for a in posttrain.POSTTRAIN_ASSETS:
        name = a.key.path[-1]
        t = time.monotonic()
        r = dg.materialize([a], resources=res, run_config={"ops": {k: v for k, v in cfg.items() if k == name}},
                           raise_on_error=False)
        if not r.success:
            errs = [e.step_failure_data.error.to_string()[-2000:] for e in r.all_events
                    if e.event_type_value == "STEP_FAILURE"]
            raise RuntimeError(f"failure-driven seed {seed}: {name} failed: {' | '.join(errs)}")
        timings[f"{name}_s"] = round(time.monotonic() - t, 1)
    cmp = json.loads(lake.path("failure_driven_comparison", name="comparison.json").read_text())
    out = arm_metrics(cmp["table"])
    out["_meta"] = {"standins": notes, "timings_s": timings, "chain_verdict": cmp["verdict"]["verdict"],
                    "chain_interval": cmp["verdict"]["targeted_minus_random_failure_slices"],
                    "targets": cmp.get("targets"), "arm_order": list(arm_order), "config": cfg}
    return out
