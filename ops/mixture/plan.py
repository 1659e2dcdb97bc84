"""From probe tables to a mixture plan: fit every D-CPT Law form to the probes with its held-out
scores, bootstrap and the Cross-Domain law (``fit_probes``, the ``dcpt_law_fit`` asset's work), and
answer the paper's three usages for a target model (``make_plan``, the ``mixture_plan`` asset's).

Source: Que et al., "D-CPT Law", arXiv 2406.01375: §3 (the law, its fit and its three usages:
trade-off, limited domain data, resource allocation), §3.2 (the Cross-Domain law and K). Where
the plan departs from the paper on purpose, ``paper_departures`` says so (written into plan.json).
docs/mixture.md documents the defaults. numpy, scipy, Polars and joblib; no torch, no Dagster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import polars as pl

from .law.config import LawFitParams, MixturePlanParams
from .probe_grid import grid_at_largest, subdomain_points


def run_tasks(tasks: list, workers: int) -> dict:
    """``{key: fn(*args, **kwargs)}`` for ``tasks = [(key, fn, args, kwargs)]``, on ``workers``
    loky processes (joblib; 0 = joblib.cpu_count(), capped at the number of tasks) or in this
    process when that is 1. Tasks are dispatched in list order, one at a time per free worker, so
    listing the longest first balances the cores. A task's exception is raised here unchanged."""
    import joblib

    n = min(len(tasks), joblib.cpu_count() if workers == 0 else workers)
    if n <= 1:
        return {key: fn(*args, **kw) for key, fn, args, kw in tasks}
    out = joblib.Parallel(n_jobs=n, backend="loky", batch_size=1, pre_dispatch="n_jobs")(
        joblib.delayed(fn)(*args, **kw) for _key, fn, args, kw in tasks)
    return {key: r for (key, *_rest), r in zip(tasks, out)}


@dataclass
class ProbeFit:
    """What ``fit_probes`` returns: ``doc`` (fit.json's content) and the tables the asset shows."""

    doc: dict
    """fit.json: chosen_form, huber_delta, fits {target: {form: LawFit dict}}, identification {target: {form:
    {param: 'lower'|'upper'}}}, bootstrap, bootstrap_summary, generalisation, cross_domain, probe."""
    form_rows: list[dict]
    """Per (target, form): huber, r2, params, identified ('yes'/'NO'), on_bound."""
    gen_rows: list[dict]
    """Per (target, axis in in_sample, unseen_N, unseen_D, unseen_r): huber, r2, mare, n_test, skipped."""
    cross_rows: list[dict]
    """Per held-out sub-domain: the Cross-Domain law's leave-one-domain-out scores."""
    boot_units: dict[str, str]
    """{target: the bootstrap's resampled unit ('runs' or 'residuals')}."""


def fit_probes(runs: pl.DataFrame, subdomain_share: Mapping[str, float], params: LawFitParams,
               base_loss: Mapping[str, tuple[dict, list]], partitions: list[str]) -> ProbeFit:
    """Fit the D-CPT Law separately to the general and the domain validation loss of the probe
    checkpoints ``runs`` (rows with tokens > 0; ``read_probe_runs``' columns) for each form of
    ``params.forms`` (the first is the chosen one), with held-out scores along each axis (unseen N,
    D, r), a bootstrap of the chosen form, and the Cross-Domain law (a K per math sub-domain,
    leave-one-domain-out; needs >= 3 sub-domains of share >= ``min_subdomain_share`` in
    ``subdomain_share``). ``base_loss``: {n_params as str: (base losses, inits averaged)}, recorded
    in the doc for the plan; ``partitions``: the probe partition keys read. Independent fits run on
    ``params.workers`` processes (``run_tasks``); every fit is deterministic. Raises ValueError from
    the fits (too few points, bad columns). Source: arXiv 2406.01375 §3, §3.2."""
    from . import law

    pts = runs.filter(pl.col("tokens") > 0)
    forms = list(dict.fromkeys(params.forms))
    chosen = forms[0]
    sub = subdomain_points(runs, subdomain_share, params.min_subdomain_share)
    domains = sorted(sub["domain"].unique().to_list()) if sub.height else []
    domains = domains if len(domains) >= 3 else []  # the Cross-Domain law needs 2 training domains per fold
    hd = params.huber_delta
    # every fit is independent of the others: one task each, the longest first
    tasks = [(("boot", t), law.bootstrap, (pts, t, chosen), {"n_boot": params.n_boot, "huber_delta": hd}) for t in law.TARGETS]
    tasks += [(("gen", t), law.generalisation, (pts, t, chosen), {"huber_delta": hd, "holdout_last_k": params.holdout_last_k})
              for t in law.TARGETS]
    tasks += [(("cross", held), law.leave_one_domain_out, (sub, held),
               {"huber_delta": hd, "early_checkpoints": params.early_checkpoints}) for held in domains]
    tasks += [(("fit", t, f), law.fit_law, (pts, t, f), {"huber_delta": hd}) for t in law.TARGETS for f in forms]
    done = run_tasks(tasks, params.workers)
    fits, form_rows, identification = {}, [], {}
    for target in law.TARGETS:
        for f in forms:
            fit = done[("fit", target, f)]
            fits.setdefault(target, {})[f] = fit.to_dict()
            on_bound = {k: v for k, v in (fit.at_bound or {}).items() if v}
            form_rows.append({"target": target, "form": f, "huber": fit.huber, "r2": round(fit.r2, 5),
                              "params": ", ".join(f"{k}={v:.4g}" for k, v in fit.params.items()),
                              "identified": "yes" if not on_bound else "NO",
                              "on_bound": ", ".join(f"{k} ({v})" for k, v in on_bound.items()) or "-"})
            identification.setdefault(target, {})[f] = on_bound
    gen_rows, generalisation = [], {}
    for target in law.TARGETS:
        g = generalisation[target] = done[("gen", target)]
        for axis in ("in_sample", "unseen_N", "unseen_D", "unseen_r"):
            m = g[axis]
            gen_rows.append({"target": target, "axis": axis, "huber": m.get("huber"), "r2": m.get("r2"),
                             "mare": m.get("mare"), "n_test": m.get("n_test"), "skipped": m.get("skipped")})
    boots = {t: done[("boot", t)] for t in law.TARGETS}
    cross_rows = [done[("cross", held)] for held in domains]
    doc = {"chosen_form": chosen, "huber_delta": hd, "fits": fits,
           # every parameter on a bound, per target and form: such a fit is not identified, and its bootstrap
           # percentiles are the refits' range, not a confidence interval (docs/mixture.md, "Identification")
           "identification": identification,
           "bootstrap": {t: [f.to_dict() for f in b.fits] for t, b in boots.items()},
           "bootstrap_summary": {t: b.summary() for t, b in boots.items()},
           "generalisation": generalisation, "cross_domain": cross_rows,
           "probe": {"n_params": sorted(int(n) for n in pts["n_params"].unique()),
                     "ratios": sorted(float(r) for r in pts["domain_ratio"].unique()),
                     "max_tokens": int(pts["tokens"].max()), "points": pts.height, "runs": runs["size"].n_unique(),
                     "base_losses": {n: v[0] for n, v in base_loss.items()},
                     "base_inits": {n: v[1] for n, v in base_loss.items()}, "partitions": partitions}}
    return ProbeFit(doc, form_rows, gen_rows, cross_rows, {t: b.unit for t, b in boots.items()})


def paper_departures(L_g0_measured: bool, limited, limited_paper) -> list[dict]:
    """Where the plan departs on purpose from the D-CPT paper (arXiv 2406.01375 §3 usages, §3.2 Cross-Domain
    law), each {what, paper, crucible, effect}: written into plan.json and the plan's metadata."""
    out = [{"what": "usage 2 (limited domain data) carries the general-loss constraint",
            "paper": "minimises the domain loss at fixed domain tokens D_d = r_d D; no general-loss constraint is stated",
            "crucible": "the same minimisation subject to the trade-off's constraint (L_g - L_g0) / L_g0 <= T; the "
                        "unconstrained answer is reported beside it (limited_domain_unconstrained)",
            "effect": f"r_d {limited.r_d:.4g} constrained vs {limited_paper.r_d:.4g} unconstrained"},
           {"what": "Cross-Domain coefficient K",
            "paper": "K of a new domain from its initial loss and early rate of decline, combined with weights learned "
                     "across domains; the law adds F / K^mu",
            "crucible": "K = F / Phi per domain (E = 0, mu = 1, geometric mean of K over training domains = 1), Phi of an "
                        "unseen domain fitted to its first early_checkpoints checkpoints with the shared terms frozen "
                        "(ops.mixture.law.crossdomain)",
            "effect": "not the paper's estimator; with as many training points as domains (six) a learned map would be "
                      "fitted on six points"}]
    if not L_g0_measured:
        out.append({"what": "L_g0 of an unprobed target size",
                    "paper": "the base model's general loss before CPT",
                    "crucible": "the general law at r_d = 0 with the same N and D (general-only CPT of the same budget): "
                                "the law has no D = 0 point, and no base of this size was trained",
                    "effect": "a stricter baseline than the base model whenever general-only CPT lowers the general loss"})
    return out


def _spread_fmt(x) -> str:
    return "-" if not x else f"[{x[0]:.4g}, {x[1]:.4g}]"


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


@dataclass
class Plan:
    """What ``make_plan`` returns: plan.json's content and what the asset shows and plots."""

    result: dict
    """plan.json: target, tradeoff, limited_domain, limited_domain_unconstrained, paper_departures,
    identification, allocate_compute, probe_grid."""
    numeric: list[dict]
    """One row per usage with numbers as numbers (the lake table)."""
    rows: list[dict]
    """One row per usage formatted for the UI (spreads as [lo, hi])."""
    predict: dict[str, Callable]
    """{'general', 'domain'}: the chosen form's predict(N, D, r_d) (nats/token)."""
    law_r_d_at_grid: float
    """The law's trade-off r_d at the probe grid's largest size and D."""
    limited_unconstrained_r_d: float
    """Usage 2 without the general-loss constraint (the paper's form)."""


def make_plan(doc: Mapping[str, Any], runs: pl.DataFrame, params: MixturePlanParams) -> Plan:
    """The paper's three usages of the fitted law ``doc`` (fit.json) for a target model (arXiv
    2406.01375 §3): (1) trade-off: the domain ratio r_d minimising the domain loss while the general
    loss rises at most T = ``max_general_degradation`` over the base model L_g0 (the measured base of
    the target size when probed, else the law at r_d = 0); (2) limited domain data: r_d and D = D_d /
    r_d for fixed domain tokens D_d (also without the constraint, the paper's form); (3) resource
    allocation: the (N, D) split of C = 6 N D FLOPs at the trade-off r_d, N searched where N and D stay
    within ``max_extrapolation`` x the probed range. Each answer carries the bootstrap spread at
    ``quantiles``. Beside them, the exhaustive answer on the probe grid ``runs`` (largest size, largest
    D, seed means). Zero-valued targets derive from the probes: N the largest probed, D 4x the largest
    probed D, D_d 0.25 D, C 6 N D. Raises ValueError when C is outside what the probes support."""
    from . import law

    chosen = doc["chosen_form"]
    fg = law.LawFit.from_dict(doc["fits"]["general"][chosen])
    fd = law.LawFit.from_dict(doc["fits"]["domain"][chosen])
    bg = law.Bootstrap(fg, tuple(law.LawFit.from_dict(d) for d in doc["bootstrap"]["general"]), 0)
    bd = law.Bootstrap(fd, tuple(law.LawFit.from_dict(d) for d in doc["bootstrap"]["domain"]), 0)
    probe = doc["probe"]
    N = params.target_n_params or float(max(probe["n_params"]))
    D = params.target_tokens or 4.0 * probe["max_tokens"]
    T = params.max_general_degradation
    q = tuple(params.quantiles)
    base = probe["base_losses"].get(str(int(N)))
    L_g0 = float(base["general"]) if base else None
    plan1 = law.tradeoff_ratio(fg, fd, N, D, T, L_g0=L_g0, boot=(bg, bd), q=q)
    Dd = params.domain_tokens or 0.25 * D
    plan2 = law.limited_domain(fg, fd, N, Dd, T, L_g0=L_g0, boot=(bg, bd), q=q)
    plan2_paper = law.limited_domain(fg, fd, N, Dd, math.inf)   # usage 2 without the general-loss constraint
    C = params.compute_flops or 6.0 * N * D
    # Usage 3 at the trade-off ratio: the general-loss budget is already spent by choosing r_d, so
    # N is chosen for the domain loss alone, inside max_extrapolation x the probed N and D.
    ext = params.max_extrapolation
    n_lo = max(float(min(probe["n_params"])), C / (6.0 * ext * probe["max_tokens"]))
    n_hi = float(max(probe["n_params"])) * ext
    if n_lo >= n_hi:
        raise ValueError(f"mixture_plan: compute_flops {C:.3g} is outside what the probes support "
                         f"(N and D within {ext}x of the probed sizes and tokens)")
    plan3 = law.allocate_compute(fd, C, plan1.r_d, n_bounds=(n_lo, n_hi), boot=bd, q=q)
    plan3_general = float(fg.predict(plan3.n_params, plan3.tokens, plan3.r_d))
    plan3_at_bound = bool(plan3.n_params <= n_lo * 1.001 or plan3.n_params >= n_hi * 0.999)

    # The exhaustive answer on the probe grid: the largest size at its largest D (seed means).
    n_max = max(probe["n_params"])
    last = grid_at_largest(runs, n_max)
    grid_answer, base_probe = None, probe["base_losses"].get(str(n_max))
    if last["general_rise"].is_null().any() and base_probe:   # a table without D = 0 points: the size's base
        last = last.with_columns(general_rise=pl.coalesce(
            "general_rise", (pl.col("loss_general") - base_probe["general"]) / base_probe["general"]))
    if last["general_rise"].is_not_null().all():
        ok = last.filter(pl.col("general_rise") <= T)
        if ok.height:
            grid_answer = ok.sort("loss_domain").row(0, named=True)
    law_at_grid = law.tradeoff_ratio(fg, fd, float(n_max), float(probe["max_tokens"]), T,
                                     L_g0=base_probe["general"] if base_probe else None)

    rows, numeric = [], []
    for p in (plan1, plan2, plan3):
        sp = p.to_dict().get("spread") or {}
        lg = plan3_general if p is plan3 else p.loss_general
        status = p.status + (" (N at search bound)" if p is plan3 and plan3_at_bound else "")
        lo_hi = lambda k: (sp.get(k) or [None, None])  # noqa: E731
        numeric.append({"usage": p.usage, "r_d": float(p.r_d), "r_d_lo": lo_hi("r_d")[0], "r_d_hi": lo_hi("r_d")[1],
                        "n_params": float(p.n_params), "tokens": float(p.tokens), "domain_tokens": float(p.domain_tokens),
                        "loss_domain": p.loss_domain, "loss_domain_lo": lo_hi("loss_domain")[0],
                        "loss_domain_hi": lo_hi("loss_domain")[1], "loss_general": lg,
                        "loss_general_base": p.loss_general_base, "status": status})
        rows.append({"usage": p.usage, "r_d": _fmt(p.r_d), "r_d_spread": _spread_fmt(sp.get("r_d")),
                     "N": _fmt(p.n_params), "N_spread": _spread_fmt(sp.get("n_params")), "D": _fmt(p.tokens),
                     "domain_tokens": _fmt(p.domain_tokens), "loss_domain": _fmt(p.loss_domain),
                     "loss_domain_spread": _spread_fmt(sp.get("loss_domain")), "loss_general": _fmt(lg),
                     "L_g0": _fmt(p.loss_general_base), "status": status})
    departures = paper_departures(L_g0_measured=base is not None, limited=plan2, limited_paper=plan2_paper)
    identification = {t: {"form": chosen, "identified": f.identified,
                          "not_identified": {k: v for k, v in (f.at_bound or {}).items() if v}}
                      for t, f in (("general", fg), ("domain", fd))}
    result = {"target": {"n_params": N, "tokens": D, "T": T, "L_g0": L_g0, "L_g0_source":
                         "measured base model" if base else "law at r_d=0 (general-only CPT at the same N and D)"},
              "tradeoff": plan1.to_dict(), "limited_domain": plan2.to_dict(),
              "limited_domain_unconstrained": {**plan2_paper.to_dict(), "max_rel_increase": None},
              "paper_departures": departures, "identification": identification,
              "allocate_compute": {**plan3.to_dict(), "loss_general": plan3_general, "n_at_search_bound": plan3_at_bound,
                                   "n_search_range": [n_lo, n_hi]},
              "probe_grid": {"n_params": n_max, "tokens": probe["max_tokens"],
                             "best_ratio": grid_answer["domain_ratio"] if grid_answer else None,
                             "law_ratio": law_at_grid.r_d, "grid": last.to_dicts()}}
    return Plan(result, numeric, rows, {"general": fg.predict, "domain": fd.predict}, law_at_grid.r_d, plan2_paper.r_d)
