"""The closed loop of the ``mixture`` group: ``mixture_validation`` trains the target model at the
plan's answers and ``mixture_plan_holds`` judges the plan by what it measured (docs/mixture.md,
"Closed loop"). Run lists, base staging and scoring are ``ops.mixture.closed_loop``, the verdict
``ops.mixture.validation``; these read inputs, launch the probe worker, and write validation.json,
tables and metadata.
"""

import json
from dataclasses import replace

import dagster as dg
import polars as pl

from ops.lake import write_json_atomic
from ops.mixture.probe import ProbePlan
from ops.mixture.probe_grid import probe_cpt_settings, probed_bases, read_probe_runs
from ops.mixture.validation import ValidationParams
from resources.compute import ComputeResource
from resources.lake import LakeResource

from ._config import fields_of, mirrors
from ._meta import image, md_table
from .mixture_probes import CPT_SIZES, probe_launch


@mirrors(ValidationParams, own=("timeout_s",))
class MixtureValidationConfig(fields_of(ValidationParams)):
    """The Launchpad face of ops.mixture.validation.ValidationParams (meanings and ranges there)."""

    timeout_s: float = 1800.0
    """Wall-clock limit of each validation launch."""


@dg.asset(deps=["mixture_plan", "dcpt_law_fit", "cpt_tokenizer", dg.AssetDep("cpt_base_models")],
          group_name="mixture", code_version="1", kinds={"pytorch", "accelerate"}, pool="gpu")
def mixture_validation(context: dg.AssetExecutionContext, config: MixtureValidationConfig, lake: LakeResource,
                       compute: ComputeResource) -> dg.MaterializeResult:
    """The closed loop of the plan (docs/mixture.md, "Closed loop"): train the target model -- the
    plan's target N rounded to the nearest probed size, at the plan's target D -- at the law's
    trade-off r_d and at the probe grid's best feasible r_d, through the probes' own launch
    (ops.mixture.probe: Pipes + accelerate, resumable, reused by fingerprint), from the size's
    base model, and measure the general-loss rise over that base model and the domain loss. Usage 2
    (limited domain data) and usage 3 (resource allocation, at the nearest real size, D = C / 6N)
    are each trained once; every run is reported with the law's prediction next to it. The
    blocking check ``mixture_plan_holds`` accepts the plan only if the measured rise at the law's
    r_d is <= T and within the tolerance (``rise_tolerance``, widened to ``noise_multiple`` x the probes'
    seed noise) of the law's predicted rise, and the regime is 'ok' (``regime_status``: plateaued bases,
    a measurable rise at high r_d); otherwise the corrected choice is reported (none outside the regime)."""
    import numpy as np

    from ops.mixture import plots
    from ops.mixture.closed_loop import (rise_curve, runs_table, score_validation, stage_validation_bases,
                                         validation_runs)
    from ops.mixture.validation import nearest_size

    params = ValidationParams(**config.model_dump(exclude={"timeout_s"}))  # ranges checked once, here
    plan = json.loads((lake.base / "mixture_plan" / "plan.json").read_text())
    doc = json.loads((lake.base / "dcpt_law_fit" / "fit.json").read_text())
    bases = probed_bases(lake.base, CPT_SIZES)
    settings = next(iter(bases.values()))["settings"]
    sizes_n = {s: int(b["n_params"]) for s, b in bases.items()}
    target_size = nearest_size(float(plan["target"]["n_params"]), sizes_n)
    out_dir = lake.base / "mixture_validation"
    base_dir, committed = out_dir / "bases", lake.base / "cpt_base_models"
    probe = ProbePlan.from_settings(phase="cpt", data_dir=str(lake.base / "cpt_tokenizer"), base_dir=str(base_dir),
                                    out_dir=str(out_dir / "runs"), **settings, **probe_cpt_settings(lake.base, target_size))
    runs, asks = validation_runs(plan, params, target_size, sizes_n, probe.global_batch * probe.seq_len)
    context.log.info(f"mixture_validation: target N={plan['target']['n_params']:.6g} -> size {target_size} "
                     f"(N={sizes_n[target_size]}), D={plan['target']['tokens']:.6g}; {len(runs)} run(s): {[r['key'] for r in runs]}")
    # Base models: the probes' own, copied (the validation never writes into cpt_base_models); a size
    # no probe used is pre-trained here with the same base settings.
    missing = stage_validation_bases(probe, sorted({r["size"] for r in runs}), bases, committed, base_dir)
    base_meta = {}
    if missing:
        bplan = replace(probe, phase="base", runs=[{"size": s, "ratio": 0.0, "key": s} for s in missing]
                        ).validate(compute.num_processes)
        with probe_launch(context, compute, lake, "mixture_validation", bplan, config.timeout_s, key="base") as brun:
            base_meta = {"bases_trained": ", ".join(missing), "base_launch_reused": brun.reused}
    cplan = replace(probe, runs=[{k: r[k] for k in ("size", "ratio", "seed", "tokens", "key")} for r in runs]
                    ).validate(compute.num_processes)
    with probe_launch(context, compute, lake, "mixture_validation", cplan, config.timeout_s, key="cpt") as run:
        result, tables, verdict = score_validation(run.result["runs"], runs, asks, plan, doc, params, base_dir, committed,
                                                   read_probe_runs(lake), target_size, sizes_n)
        write_json_atomic(result, out_dir / "validation.json", indent=1)
        rows = result["runs"]
        lake.write(pl.DataFrame([{k: v for k, v in x.items() if not k.endswith("_band")} for x in rows]), "mixture_validation")
        lake.write(pl.concat(tables, how="diagonal_relaxed"), "mixture_validation", name="checkpoints.parquet")

    tgt = result["target"]
    r_grid = np.linspace(0.0, 1.0, 201)
    png = plots.closed_loop(r_grid, rise_curve(doc, float(tgt["n_params"]), float(tgt["tokens"]), tgt["L_g0"], r_grid),
                            [(m["r_d"], m["general_rise"]) for m in verdict.measured], verdict.T,
                            [(float(g["domain_ratio"]), float(g["general_rise"])) for g in plan["probe_grid"].get("grid", [])
                             if g.get("general_rise") is not None],
                            f"size {target_size}, D={float(tgt['tokens']):.3g}: general-loss rise vs r_d")
    meta = {"path": dg.MetadataValue.path(str(out_dir / "validation.json")), "verdict": verdict.describe(),
            "holds": verdict.holds, "T": verdict.T, "law_r_d": verdict.law_r_d, "measured_rise": verdict.measured_rise,
            "predicted_rise": verdict.predicted_rise, "rise_tolerance": verdict.rise_tolerance,
            "regime": verdict.regime["regime"],
            "grid_best_r_d": dg.MetadataValue.text(str(verdict.grid_best_r_d)),
            "accepted_r_d": dg.MetadataValue.text(str(verdict.accepted_r_d)),
            "target_size": target_size, "runs": md_table(runs_table(rows)), "world_size": run.result["world_size"],
            "rise_vs_ratio": image(png, "general-loss rise: law vs measured", lake=lake, asset="mixture_validation"),
            **base_meta, **run.metadata()}
    if result["probe_seed_noise_of_rise"] is not None:
        meta["probe_seed_noise_of_rise"] = dg.MetadataValue.float(result["probe_seed_noise_of_rise"])
    return dg.MaterializeResult(metadata=meta)


@dg.asset_check(asset="mixture_validation", blocking=True, description="The plan holds in training, judged both ways: "
                "at the law's trade-off r_d (target model, target D) the measured general-loss rise is at most the plan's "
                "T and within the stated tolerance of the law's own predicted rise, and the loop is in the paper's regime "
                "(plateaued base models; the general loss rises measurably at high r_d).")
def mixture_plan_holds(lake: LakeResource) -> dg.AssetCheckResult:
    from ops.mixture.closed_loop import TRADEOFF
    from ops.mixture.validation import closed_loop_verdict

    doc = json.loads((lake.base / "mixture_validation" / "validation.json").read_text())
    cl = doc["closed_loop"]
    size, D = doc["target"]["size"], doc["target"]["tokens"]
    runs = [r for r in doc["runs"] if TRADEOFF & set(r["usages"].split(","))]
    v = closed_loop_verdict(doc["target"]["T"], cl["law_r_d"], cl["grid_best_r_d"], runs,
                            predicted_rise=cl.get("predicted_rise"),
                            rise_tolerance=cl["rise_tolerance"] if cl.get("rise_tolerance") is not None else 0.0,
                            regime=cl.get("regime"))
    txt = lambda x: dg.MetadataValue.text("-" if x is None else f"{x:.5f}")  # noqa: E731
    meta = {"T": v.T, "law_r_d": v.law_r_d, "measured_rise": v.measured_rise,
            "predicted_rise": txt(v.predicted_rise), "rise_tolerance": txt(v.rise_tolerance),
            "regime": (v.regime or {}).get("regime", "not checked"),
            "regime_reasons": "; ".join((v.regime or {}).get("reasons", [])) or "-",
            "accepted_r_d": dg.MetadataValue.text(str(v.accepted_r_d)),
            "grid_best_r_d": dg.MetadataValue.text(str(v.grid_best_r_d)),
            "grid_best_measured_rise": txt(v.grid_best_measured_rise),
            "target": f"size {size}, D={D}"}
    if doc.get("probe_seed_noise_of_rise") is not None:
        meta["probe_seed_noise_of_rise"] = float(doc["probe_seed_noise_of_rise"])
    # Outside the paper's regime the loop can neither confirm nor correct the law: the plan is not accepted
    # (passed false, accepted_r_d null) at WARN severity, so the main job goes on to its next stage; inside
    # it a failed plan blocks (ERROR).
    outside = v.regime is not None and v.regime.get("regime") != "ok"
    return dg.AssetCheckResult(passed=v.holds, description=v.describe(), metadata=meta,
                               severity=dg.AssetCheckSeverity.WARN if outside else dg.AssetCheckSeverity.ERROR)
