"""The law and the plan of the ``mixture`` group: ``dcpt_law_fit`` (every law form fitted to the
current probe partitions, held-out scores, bootstrap, Cross-Domain law), its check
``dcpt_fit_heldout_r2``, and ``mixture_plan`` (the paper's three usages). The work is
``ops.mixture.plan`` (``fit_probes``, ``make_plan``); these assets read inputs, call it, and write
fit.json / plan.json, tables and metadata (docs/mixture.md; Que et al., arXiv 2406.01375 §3).
"""

import hashlib
import json

import dagster as dg
import polars as pl

from ops.lake import atomic_path
from ops.mixture.law.config import FitFloorParams, LawFitParams, MixturePlanParams
from ops.mixture.probe_grid import base_losses, read_probe_runs
from resources.lake import LakeResource

from ._config import fields_of, mirrors
from ._meta import image, md_table
from .mixture_probes import current_probe_folders


@mirrors(LawFitParams)
class LawFitConfig(fields_of(LawFitParams)):
    """The Launchpad face of ops.mixture.law.config.LawFitParams (meanings and ranges there)."""


def probe_points(lake: LakeResource, log=None) -> tuple[pl.DataFrame, list[str], list[str]]:
    """(checkpoints of the current probe partitions, the partition keys read, the lake folders left
    out). Raises dagster.Failure when no current partition has a finished table."""
    used, ignored = current_probe_folders(lake)
    if ignored and log:
        log(f"dcpt_law_fit: ignoring {len(ignored)} probe folder(s) of no current cpt_probe_runs partition: {ignored}")
    runs = read_probe_runs(lake, list(used))
    if runs.is_empty():
        raise dg.Failure("dcpt_law_fit: no finished cpt_probe_runs partition in the lake; materialize cpt_probe_runs first")
    return runs, sorted(used.values()), ignored


def _write_json(obj, path) -> str:
    text = json.dumps(obj, indent=1, default=float)
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return text


@dg.asset(deps=["cpt_probe_runs"], group_name="mixture", code_version="2", kinds={"scipy"})
def dcpt_law_fit(context: dg.AssetExecutionContext, config: LawFitConfig, lake: LakeResource) -> dg.MaterializeResult:
    """The D-CPT Law fitted separately to the general and the domain validation loss of every
    finished probe run of the current partitions (arXiv 2406.01375 §3; Huber loss on log residuals,
    L-BFGS-B from a start grid), for each compared form; held-out Huber and R^2 along each axis
    (unseen N, D, r); a bootstrap for the plan's uncertainty; and the Cross-Domain law (a K per
    math sub-domain) scored leave-one-domain-out (``ops.mixture.plan.fit_probes``)."""
    from ops.mixture import law, plots
    from ops.mixture.plan import fit_probes

    params = LawFitParams(**config.model_dump())  # ranges checked once, here
    runs, used_partitions, ignored_folders = probe_points(lake, context.log.warning)
    manifest = json.loads((lake.base / "cpt_tokenizer" / "manifest.json").read_text())
    base = {}
    for s in sorted(runs["size"].unique().to_list()):
        mine = runs.filter(pl.col("size") == s)
        base[str(int(mine["n_params"][0]))] = base_losses(lake, s, mine["init"].unique().to_list())
    res = fit_probes(runs, manifest["subdomain_share"], params, base, used_partitions)
    doc, chosen = res.doc, res.doc["chosen_form"]
    out = lake.base / "dcpt_law_fit" / "fit.json"
    text = _write_json(doc, out)
    gen_table = pl.DataFrame(res.gen_rows)
    lake.write(gen_table, "dcpt_law_fit")
    chosen_fits = {t: law.LawFit.from_dict(doc["fits"][t][chosen]) for t in law.TARGETS}
    png = plots.loss_curves(runs, {t: chosen_fits[t].predict for t in law.TARGETS})
    ident = doc["identification"]
    meta = {"path": dg.MetadataValue.path(str(out)), "chosen_form": chosen, "probe_points": doc["probe"]["points"],
            "forms": md_table(pl.DataFrame(res.form_rows)), "generalisation": md_table(gen_table),
            "fitted_curves": image(png, "probe points and the fitted law", lake=lake, asset="dcpt_law_fit"),
            "params_on_bound": dg.MetadataValue.md("\n".join(
                f"- {t}/{f}: " + (", ".join(f"{k} ({v})" for k, v in ob.items()) + " -> not identified" if ob else "none")
                for t, per in ident.items() for f, ob in per.items())),
            "chosen_form_identified": all(not ident[t][chosen] for t in law.TARGETS),
            "bootstrap_unit": ", ".join(f"{t}: {u}" for t, u in res.boot_units.items()),
            # the probe partitions this fit read: the current partition keys only, never every folder in the lake
            "probe_partitions": dg.MetadataValue.json(used_partitions),
            "ignored_probe_folders": dg.MetadataValue.json(ignored_folders)}
    for t in law.TARGETS:
        for axis in ("unseen_N", "unseen_D", "unseen_r"):
            r2 = doc["generalisation"][t][axis].get("r2")
            if r2 is not None and r2 == r2:
                meta[f"{t}_{axis}_r2"] = dg.MetadataValue.float(float(r2))
    if res.cross_rows:
        cross = pl.DataFrame(res.cross_rows)
        meta["cross_domain"] = md_table(cross)
        meta["cross_domain_mean_mare"] = dg.MetadataValue.float(float(cross["mare"].mean()))
    return dg.MaterializeResult(metadata=meta, data_version=dg.DataVersion(hashlib.sha256(text.encode()).hexdigest()[:16]))


@mirrors(FitFloorParams)
class FitFloorConfig(fields_of(FitFloorParams)):
    """The Launchpad face of ops.mixture.law.config.FitFloorParams (meaning and range there)."""


@dg.asset_check(asset="dcpt_law_fit", blocking=True, description="Held-out R^2 of the chosen law form above a "
                "floor on every axis (unseen N, unseen D, unseen r) for both the general and the domain loss.")
def dcpt_fit_heldout_r2(config: FitFloorConfig, lake: LakeResource) -> dg.AssetCheckResult:
    config = FitFloorParams(**config.model_dump())  # range checked once, here
    doc = json.loads((lake.base / "dcpt_law_fit" / "fit.json").read_text())
    rows, failed = [], []
    for target, g in doc["generalisation"].items():
        for axis in ("unseen_N", "unseen_D", "unseen_r"):
            r2 = g[axis].get("r2")
            ok = r2 is not None and r2 == r2 and r2 >= config.min_heldout_r2
            rows.append({"target": target, "axis": axis, "r2": r2, "passed": ok, "skipped": g[axis].get("skipped")})
            if not ok:
                failed.append(f"{target}/{axis} (R^2 {r2 if r2 is not None else 'n/a'}"
                              + (f"; {g[axis]['skipped']}" if g[axis].get("skipped") else "") + ")")
    return dg.AssetCheckResult(
        passed=not failed,
        description=("held-out R^2 below the floor on: " + ", ".join(failed)) if failed else None,
        metadata={"floor": config.min_heldout_r2, "failed_axes": ", ".join(failed) or "none",
                  "axes": md_table(pl.DataFrame(rows))})


@mirrors(MixturePlanParams)
class MixturePlanConfig(fields_of(MixturePlanParams)):
    """The target of the plan. Zero means: derived from the probe grid (documented per field).
    The Launchpad face of ops.mixture.law.config.MixturePlanParams (meanings and ranges there)."""


@dg.asset(deps=["dcpt_law_fit"], group_name="mixture", code_version="1", kinds={"scipy"})
def mixture_plan(context: dg.AssetExecutionContext, config: MixturePlanConfig, lake: LakeResource) -> dg.MaterializeResult:
    """The paper's three usages of the fitted law for a target model (arXiv 2406.01375 §3):
    (1) trade-off: the domain ratio r_d minimising the domain loss while the general loss rises at
    most T over the base model; (2) limited domain data: r_d and D = D_d / r_d for fixed domain
    tokens D_d; (3) resource allocation: the (N, D) split of a fixed compute budget C = 6 N D at the
    chosen r_d. Each answer carries its predicted losses and the bootstrap spread; beside them the
    exhaustive answer on the probe grid (largest size, largest D) (``ops.mixture.plan.make_plan``)."""
    import numpy as np

    from ops.mixture import plots
    from ops.mixture.plan import make_plan

    params = MixturePlanParams(**config.model_dump())  # ranges checked once, here
    doc = json.loads((lake.base / "dcpt_law_fit" / "fit.json").read_text())
    try:
        plan = make_plan(doc, read_probe_runs(lake), params)
    except ValueError as e:
        raise dg.Failure(str(e)) from None
    result = plan.result
    out = lake.base / "mixture_plan" / "plan.json"
    _write_json(result, out)
    # the lake/catalog table keeps numbers as numbers (the Markdown table is for the UI)
    lake.write(pl.DataFrame(plan.numeric, schema_overrides={k: pl.Float64 for k in plan.numeric[0]
                                                           if k not in ("usage", "status")}), "mixture_plan")
    tgt, r_d = result["target"], result["tradeoff"]["r_d"]
    N, D, T = tgt["n_params"], tgt["tokens"], tgt["T"]
    r = np.linspace(0.0, 1.0, 201)
    png = plots.ratio_curves(r, {"L_d (domain)": plan.predict["domain"](N, D, r), "L_g (general)": plan.predict["general"](N, D, r)},
                             f"target N={N:.3g}, D={D:.3g}: predicted losses vs r_d", marks={f"trade-off r_d={r_d:.2f}": r_d})
    departures, ident = result["paper_departures"], result["identification"]
    meta = {"path": dg.MetadataValue.path(str(out)), "answers": md_table(pl.DataFrame(plan.rows)),
            "tradeoff_r_d": dg.MetadataValue.float(r_d), "target_n_params": dg.MetadataValue.float(N),
            "target_tokens": dg.MetadataValue.float(D), "T": dg.MetadataValue.float(T),
            "probe_grid_best_r_d": dg.MetadataValue.text(str(result["probe_grid"]["best_ratio"])),
            "law_r_d_at_probe_grid": dg.MetadataValue.float(plan.law_r_d_at_grid),
            "limited_domain_r_d_unconstrained": dg.MetadataValue.float(plan.limited_unconstrained_r_d),
            "paper_departures": dg.MetadataValue.md("\n".join(f"- **{d['what']}**: {d['crucible']} (paper: {d['paper']})"
                                                              for d in departures)),
            "identified": dg.MetadataValue.text(", ".join(f"{t}: " + ("yes" if i["identified"] else "NO, on a bound: " + ", ".join(
                f"{k} ({v})" for k, v in i["not_identified"].items())) for t, i in ident.items())),
            "spread_is_interval": all(i["identified"] for i in ident.values()),
            "predicted_losses_vs_ratio": image(png, "predicted losses vs domain ratio", lake=lake, asset="mixture_plan")}
    if tgt["L_g0"] is not None:
        meta["L_g0"] = dg.MetadataValue.float(tgt["L_g0"])
    return dg.MaterializeResult(metadata=meta)
