"""D-CPT Law on the real probe runs: fit accuracy per axis, the chosen ratio vs the exhaustive
probe grid, and fit wall time. Reads the probe tables a `crucible demo` (or a mixture backfill)
left in the lake; writes benchmarks/results/dcpt.json.

    .venv/bin/python benchmarks/dcpt_bench.py [--lake .crucible] [--T 0.03]

Reported:
* per target (general, domain) and form (L3, r_additive, chinchilla): in-sample Huber / R^2 and
  held-out Huber / R^2 along unseen N (leave-one-size-out), unseen D (last 2 checkpoints of every
  run), unseen r (leave-one-ratio-out over interior ratios); fit wall time (one fit, and the full
  generalisation sweep);
* the trade-off answer at the largest probed size and D under T (the law's r_d, searched on
  [0, 1]) next to the best r_d found exhaustively among the probe runs (grid 0, 0.25, ...), both
  judged against the measured base general loss; the law's predicted vs the probes' measured
  domain loss at the probe-grid answer;
* the Cross-Domain law's leave-one-sub-domain-out error.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    import polars as pl

    from assets.mixture import _read_probe_runs, subdomain_points
    from ops.mixture import law
    from resources.lake import LakeResource, default_root

    ap = argparse.ArgumentParser()
    ap.add_argument("--lake", default=default_root())
    ap.add_argument("--T", type=float, default=0.03)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/dcpt.json"))
    args = ap.parse_args()
    lake = LakeResource(root=args.lake)
    runs = _read_probe_runs(lake)
    if runs.is_empty():
        print(f"no probe runs under {lake.base}/cpt_probe_runs: run `make demo` first", file=sys.stderr)
        return 1
    pts = runs.filter(pl.col("tokens") > 0)
    forms = {}
    for target in law.TARGETS:
        for form in law.FORMS:
            t = time.perf_counter()
            fit = law.fit_law(pts, target, form)
            t_fit = time.perf_counter() - t
            t = time.perf_counter()
            g = law.generalisation(pts, target, form)
            t_gen = time.perf_counter() - t
            forms[f"{target}/{form}"] = {
                "in_sample": {"huber": fit.huber, "r2": fit.r2},
                **{ax: {k: g[ax].get(k) for k in ("huber", "r2", "mare", "n_test", "skipped")}
                   for ax in ("unseen_N", "unseen_N_extrapolation", "unseen_D", "unseen_r")},
                "fit_wall_s": round(t_fit, 3), "generalisation_wall_s": round(t_gen, 3), "params": fit.params}
    fg, fd = law.fit_law(pts, "general", "L3"), law.fit_law(pts, "domain", "L3")
    n_max = int(pts["n_params"].max())
    d_max = int(pts["tokens"].max())
    size = runs.filter(pl.col("n_params") == n_max)["size"][0]
    base = json.loads((lake.base / "cpt_base_models" / size / "base.json").read_text())["losses"]["general"]
    law_plan = law.tradeoff_ratio(fg, fd, n_max, d_max, args.T, L_g0=base)
    last = runs.filter((pl.col("n_params") == n_max) & (pl.col("tokens") == d_max)).sort("domain_ratio")
    last = last.with_columns(general_rise=(pl.col("loss_general") - base) / base)
    feasible = last.filter(pl.col("general_rise") <= args.T)
    grid_best = feasible.sort("loss_domain").row(0, named=True) if feasible.height else None
    manifest = json.loads((lake.base / "cpt_tokenizer" / "manifest.json").read_text())
    sub = subdomain_points(runs, manifest["subdomain_share"], 0.03)
    cross = []
    for held in sorted(sub["domain"].unique().to_list()):
        cd = law.fit_cross_domain(sub.filter(pl.col("domain") != held))
        early, later = law.split_early(sub.filter(pl.col("domain") == held), 2)
        ev = law.evaluate_unseen_domain(cd, early, later)
        cross.append({"unseen_domain": held, **{k: float(v) for k, v in ev.items()}})
    result = {
        "command": "python benchmarks/dcpt_bench.py",
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
        "probe": {"runs": int(runs.select(pl.struct("n_params", "domain_ratio").n_unique()).item()),
                  "points_used": pts.height, "sizes_n_params": sorted(int(x) for x in pts["n_params"].unique()),
                  "ratios": sorted(float(x) for x in pts["domain_ratio"].unique()), "max_tokens": d_max},
        "forms": forms,
        "tradeoff_T": args.T,
        "tradeoff_at_probe_grid": {
            "n_params": n_max, "tokens": d_max, "L_g0_measured_base": base,
            "law_r_d": law_plan.r_d, "law_status": law_plan.status,
            "law_loss_domain": law_plan.loss_domain, "law_loss_general": law_plan.loss_general,
            "grid_best_r_d": grid_best["domain_ratio"] if grid_best else None,
            "grid_best_loss_domain": grid_best["loss_domain"] if grid_best else None,
            "grid_best_general_rise": grid_best["general_rise"] if grid_best else None,
            "law_loss_domain_at_grid_best": float(fd.predict(n_max, d_max, grid_best["domain_ratio"])) if grid_best else None,
            "grid": last.select("domain_ratio", "loss_general", "loss_domain", "general_rise").to_dicts()},
        "cross_domain_leave_one_out": cross,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=float))
    print(json.dumps({k: result[k] for k in ("probe", "tradeoff_at_probe_grid")}, indent=1, default=float))
    for k, v in forms.items():
        print(f"{k:22s} in-sample R2 {v['in_sample']['r2']:.3f} | unseen N {v['unseen_N']['r2']:.3f} "
              f"D {v['unseen_D']['r2']:.3f} r {v['unseen_r']['r2']:.3f} | fit {v['fit_wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
