"""The closed loop's plumbing: which runs verify a mixture plan (``validation_runs``), which base
models they start from (``stage_validation_bases``), and the scoring of the finished runs against
the law's predictions into validation.json (``score_validation``). The verdict itself (two-sided
tolerance, the paper's regime) is ``ops.mixture.validation``.

Source: Que et al., "D-CPT Law", arXiv 2406.01375 §3 (the three usages the runs verify); the loop
and its regime criterion are Crucible's (docs/mixture.md, "Closed loop"). Errors: ValueError for a
plan or fit that names a usage or form it lacks (KeyError from the JSON otherwise). numpy and
Polars; no torch, no Dagster.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

import polars as pl

from ops.lake import replace_dir_atomic

from .probe import ProbePlan
from .probe_grid import final_rises, probe_table
from .validation import ValidationParams, closed_loop_verdict, general_rise, nearest_size, regime_status

TRADEOFF = frozenset({"tradeoff_law", "tradeoff_grid"})
"""The usages whose runs sit at the target (N, D): the runs the verdict reads."""


def validation_runs(plan: Mapping, params: ValidationParams, target_size: str, sizes_n: Mapping[str, int],
                    per_step: int) -> tuple[list[dict], dict]:
    """The runs that verify ``plan`` (plan.json): usage 1 at the law's and the grid's ratio (target N
    and D), usage 2 at its (r_d, D = D_d / r_d), usage 3 at the nearest real size with D = C / 6N;
    ratios rounded to ``params.ratio_decimals``, D rounded up to whole steps of ``per_step`` tokens,
    one run per seed of ``params.seeds``. Returns (launch runs, deduplicated, each {size, ratio, seed,
    tokens, key, usages}; {usage: {size, ratio, tokens}} asked)."""
    rnd = lambda r: round(float(r), params.ratio_decimals)  # noqa: E731
    D = int(round(plan["target"]["tokens"]))
    asks = {"tradeoff_law": {"size": target_size, "ratio": rnd(plan["tradeoff"]["r_d"]), "tokens": D}}
    grid_best = plan["probe_grid"].get("best_ratio")
    if grid_best is not None:
        asks["tradeoff_grid"] = {"size": target_size, "ratio": rnd(grid_best), "tokens": D}
    if params.verify_limited_domain:
        ld = plan["limited_domain"]
        r2 = rnd(ld["r_d"])
        if r2 > 0:
            asks["limited_domain"] = {"size": target_size, "ratio": r2,
                                      "tokens": int(round(ld["r_d"] * ld["tokens"] / r2))}   # D = D_d / r_d
    if params.verify_allocate_compute:
        ac = plan["allocate_compute"]
        cands = {s: sizes_n[s] for s in (params.allocation_sizes or sizes_n) if s in sizes_n}
        size3 = nearest_size(ac["n_params"], cands)
        C = 6.0 * ac["n_params"] * ac["tokens"]
        asks["allocate_compute"] = {"size": size3, "ratio": rnd(ac["r_d"]),
                                    "tokens": int(round(C / (6.0 * sizes_n[size3])))}
    runs: dict[tuple, dict] = {}
    for usage, a in asks.items():
        steps = max(1, -(-a["tokens"] // per_step))
        for seed in params.seeds:
            k = (a["size"], a["ratio"], seed, steps * per_step)
            r = runs.setdefault(k, {"size": a["size"], "ratio": a["ratio"], "seed": seed, "tokens": steps * per_step,
                                    "key": f"{a['size']}|r{a['ratio']:g}|D{steps * per_step}|s{seed}", "usages": []})
            r["usages"].append(usage)
    return list(runs.values()), asks


def stage_validation_bases(probe: ProbePlan, sizes: Sequence[str], probed: Mapping[str, Mapping],
                           committed: Path, base_dir: Path) -> list[str]:
    """Copy each size's committed probe base (``committed``/<size>, when its fingerprint is ``probe``'s)
    into ``base_dir``/<size> (atomic; the validation never writes into cpt_base_models); a copy already
    there with the right fingerprint is kept. Returns the sizes that have no such base (to be trained)."""
    missing = []
    for s in sizes:
        dst = base_dir / s
        fp = probe.fingerprint(s)
        have = json.loads((dst / "base.json").read_text()).get("fingerprint") if (dst / "base.json").exists() else None
        if have == fp:
            continue
        if s in probed and probed[s].get("fingerprint") == fp:
            tmp = base_dir / f".{s}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(committed / s, tmp)
            replace_dir_atomic(tmp, dst)
        else:
            missing.append(s)
    return missing


def target_regime(base_dir: Path, committed: Path, size: str, probe_rises: pl.DataFrame, target_rows: list[dict],
                  noise, params: ValidationParams) -> dict:
    """``validation.regime_status`` for the target size: its base models' plateau records (the
    validation's copy of init 0 under ``base_dir`` and the committed inits > 0 under ``committed``) and
    the general-loss rise at the highest r_d measured at it (the probes' seed mean at their largest
    ratio and D; without probes of the size, the validation's highest trained ratio)."""
    paths = [base_dir / size / "base.json"] + sorted(committed.glob(f"{size}_i*/base.json"))
    bases = [json.loads(p.read_text()) for p in paths if p.exists()]
    high_r, high = None, None
    if probe_rises.height and probe_rises["general_rise"].is_not_null().any():
        high_r = float(probe_rises["domain_ratio"].max())
        high = float(probe_rises.filter(pl.col("domain_ratio") == high_r)["general_rise"].mean())
    elif target_rows:
        high_r = max(x["r_d"] for x in target_rows)
        high = float(sum(x["general_rise"] for x in target_rows if x["r_d"] == high_r)
                     / sum(1 for x in target_rows if x["r_d"] == high_r))
    return regime_status(bases, high_r, high, noise, params.noise_multiple, params.plateau_tolerance)


def score_validation(result_runs: Mapping[str, Mapping], runs: Sequence[Mapping], asks: Mapping[str, Mapping],
                     plan: Mapping, fit_doc: Mapping, params: ValidationParams, base_dir: Path, committed: Path,
                     probes: pl.DataFrame, target_size: str, sizes_n: Mapping[str, int]
                     ) -> tuple[dict, list[pl.DataFrame], Any]:
    """Score the finished validation runs (``result_runs``: the worker's records by key) against the
    chosen law form of ``fit_doc``: per run the measured and predicted general and domain losses
    (nats/token) and general-loss rises over its base (``base_dir``/<size>/base.json), with the
    bootstrap band at the plan's percentiles; per usage the measured answer beside the plan's; the
    probes' seed noise of the rise at the target size (``probes``: ``read_probe_runs``); the regime
    (``target_regime``) and the closed-loop verdict (``validation.closed_loop_verdict``, tolerance
    max(rise_tolerance, noise_multiple x noise)). Returns (validation.json's content, the runs'
    checkpoint tables, the ClosedLoopVerdict)."""
    import numpy as np

    from . import law

    chosen = fit_doc["chosen_form"]
    fits = {t: law.LawFit.from_dict(fit_doc["fits"][t][chosen]) for t in law.TARGETS}
    boots = {t: [law.LawFit.from_dict(d) for d in fit_doc.get("bootstrap", {}).get(t, [])] for t in law.TARGETS}
    need = sorted({r["size"] for r in runs})
    base_info = {s: json.loads((base_dir / s / "base.json").read_text()) for s in need}
    rows, tables = [], []
    quantiles = (plan["tradeoff"].get("spread") or {}).get("q") or [10, 90]   # the plan's bootstrap percentiles
    for r in runs:
        info = result_runs[r["key"]]
        df = probe_table(info).with_columns(tokens_budget=pl.lit(r["tokens"]))
        tables.append(df)
        last = df.filter(pl.col("tokens") == pl.col("tokens").max()).row(0, named=True)
        N, Dm, rd = float(info["n_params"]), float(last["tokens"]), float(r["ratio"])
        lg0 = float(base_info[r["size"]]["losses"]["general"])
        pred = {t: float(fits[t].predict(N, Dm, rd)) for t in law.TARGETS}
        band = {t: ([float(np.percentile([b.predict(N, Dm, rd) for b in boots[t]], q)) for q in quantiles]
                    if boots[t] else None) for t in law.TARGETS}
        rows.append({"usages": ",".join(r["usages"]), "size": r["size"], "n_params": int(N), "r_d": rd,
                     "seed": int(r["seed"]), "tokens": int(Dm), "L_g0": lg0,
                     "loss_general": float(last["loss_general"]), "loss_domain": float(last["loss_domain"]),
                     "general_rise": general_rise(last["loss_general"], lg0),
                     "predicted_loss_general": pred["general"], "predicted_loss_domain": pred["domain"],
                     "predicted_general_rise": general_rise(pred["general"], lg0),
                     "predicted_loss_domain_band": band["domain"], "predicted_loss_general_band": band["general"],
                     "wall_s": info.get("wall_s")})
    T = float(plan["target"]["T"])
    target_rows = [x for x in rows if TRADEOFF & set(x["usages"].split(","))]
    # context for the verdict: the seed spread of the rise among the probes of the target size
    lg0_t = float(base_info[target_size]["losses"]["general"])
    at = final_rises(probes, sizes_n[target_size]) if probes.height else probes   # no probe of it: no spread
    spread = (at.group_by("domain_ratio").agg(sd=pl.col("general_rise").std(), n=pl.len())
              .filter((pl.col("n") >= 2) & pl.col("sd").is_not_null())) if at.height else at
    noise = float(np.sqrt((spread["sd"] ** 2).mean())) if spread.height else None
    regime = target_regime(base_dir, committed, target_size, at, target_rows, noise, params)
    law_r = asks["tradeoff_law"]["ratio"]
    law_rows = [x for x in target_rows if x["r_d"] == law_r]
    tolerance = max(params.rise_tolerance, params.noise_multiple * noise if noise is not None else 0.0)
    verdict = closed_loop_verdict(T, law_r, asks["tradeoff_grid"]["ratio"] if "tradeoff_grid" in asks else None,
                                  target_rows, predicted_rise=float(np.mean([x["predicted_general_rise"] for x in law_rows])),
                                  rise_tolerance=tolerance, regime=regime)
    usages = {}
    for usage, a in asks.items():
        mine = [x for x in rows if usage in x["usages"].split(",") and x["r_d"] == a["ratio"] and x["size"] == a["size"]]
        answer = (plan["tradeoff"] if usage == "tradeoff_law" else plan[usage] if usage in plan
                  else {"r_d": plan["probe_grid"].get("best_ratio"), "n_params": plan["probe_grid"]["n_params"],
                        "tokens": plan["probe_grid"]["tokens"]})          # tradeoff_grid: the grid's own answer
        mean = lambda k: float(np.mean([x[k] for x in mine]))  # noqa: E731
        usages[usage] = {"asked": a, "plan_answer": {k: answer.get(k) for k in ("r_d", "n_params", "tokens",
                                                                              "loss_domain", "loss_general")},
                         "measured_loss_domain": mean("loss_domain"), "measured_loss_general": mean("loss_general"),
                         "measured_general_rise": mean("general_rise"),
                         "predicted_loss_domain": mine[0]["predicted_loss_domain"],
                         "predicted_loss_general": mine[0]["predicted_loss_general"],
                         "predicted_general_rise": mine[0]["predicted_general_rise"],
                         "rel_error_loss_domain": float(np.mean([x["predicted_loss_domain"] / x["loss_domain"] - 1 for x in mine])),
                         "rel_error_loss_general": float(np.mean([x["predicted_loss_general"] / x["loss_general"] - 1 for x in mine])),
                         "holds_T": bool(mean("general_rise") <= T), "seeds": [x["seed"] for x in mine]}
    n_target = int(base_info[target_size]["n_params"])
    N_plan = float(plan["target"]["n_params"])
    result = {"target": {"n_params_plan": N_plan, "size": target_size, "n_params": n_target,
                         "n_params_source": "exact probed size" if n_target == int(N_plan) else "nearest probed size",
                         "tokens": int(max(x["tokens"] for x in target_rows)), "T": T, "L_g0": lg0_t},
              "chosen_form": chosen, "closed_loop": verdict.to_dict(), "usages": usages, "runs": rows,
              "probe_seed_noise_of_rise": noise, "seeds": params.seeds}
    return result, tables, verdict


def rise_curve(fit_doc: Mapping, n_params: float, tokens: float, L_g0: float, r_grid) -> Any:
    """The chosen general-loss law's predicted rise (L_g - L_g0) / L_g0 over ``r_grid`` (array of
    r_d) at N = ``n_params``, D = ``tokens``."""
    from . import law

    fg = law.LawFit.from_dict(fit_doc["fits"]["general"][fit_doc["chosen_form"]])
    return (fg.predict(n_params, tokens, r_grid) - L_g0) / L_g0



def runs_table(rows: Sequence[Mapping]) -> pl.DataFrame:
    """The validation runs as the UI shows them: measured beside predicted (losses rounded, rises as %)."""
    return pl.DataFrame([{"usages": x["usages"], "size": x["size"], "r_d": x["r_d"], "D": x["tokens"], "seed": x["seed"],
                          "L_g measured": round(x["loss_general"], 4), "L_g predicted": round(x["predicted_loss_general"], 4),
                          "rise measured": f"{x['general_rise']:+.2%}", "rise predicted": f"{x['predicted_general_rise']:+.2%}",
                          "L_d measured": round(x["loss_domain"], 4), "L_d predicted": round(x["predicted_loss_domain"], 4)}
                         for x in rows])
