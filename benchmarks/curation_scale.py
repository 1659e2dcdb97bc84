"""The curation group at a million problems: wall time and peak memory per stage, planted duplicates and
contaminants caught (issue 19, item 5).

Run from the repository root:

    .venv/bin/python benchmarks/curation_scale.py [--n 1000000] [--out benchmarks/results/curation_scale.json]

What it does (details in benchmarks/README.md, "curation_scale"):

1. builds a lake whose sources are the corpus: the four built-in ``raw_problems`` partitions as the
   asset reads them (MATH test, MMLU dev+val, ARC validation: real; ``mathematics_dataset`` at its
   default 20 per module), plus three user sources declared in a sources YAML (the README's "Bring
   your own problems" path):

   * ``bulk_generated``: DeepMind ``mathematics_dataset`` problems (``ops.curation.mathgen``) in chunks
     of ``CHUNK`` rows, each chunk with its own generator seed, the rows per module inversely
     proportional to the module's measured cost (``GEN_MS``: equal CPU time per module);
   * ``planted_dups``: near-duplicates of training rows (half real, half generated), made by
     ``benchmarks/dedup_bench.py:perturb`` (0-3 word edits plus case/whitespace);
   * ``planted_contaminants``: benchmark items (MATH-500, GSM8K test, MMLU test, ARC-Challenge test,
     HumanEval) copied verbatim, lightly edited, escaped, given other numbers (template siblings) and
     rephrased, with the builders of the labelled decontamination set (``ops.curation.decontam_set``);

2. materializes the real assets of the curation group against that lake, one stage per fresh
   subprocess (as Dagster's multiprocess executor runs each step), with their blocking checks and the
   default run config except that nothing calls the teacher (``llm_label_max_rows = 0``,
   ``teacher = false``): annotate, exact dedup, near dedup, decontaminate (policy ``strict``, semantic
   layer included), distil (the reference path: every row's reference answer verified), sample;

3. records per stage: wall time (and the asset's and each check's step time from the event log),
   peak RSS of the stage process (``wait4``) and of its whole process tree (sampled every 0.2 s),
   rows in/out; then scores the planted rows against the lake's tables: duplicates removed by
   exact/near dedup (recall over the ones whose shingle Jaccard with their origin is >= 0.8, the
   near-dedup threshold), contaminants that did not reach ``decontaminated_problems`` (themselves, or
   the survivor that absorbed them) per benchmark and kind.

Corpus files and the lake go to ``benchmarks/.work/curation_scale/`` (git-ignored); generated chunks
are cached there, keyed by the generator's source and the allocation.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import ROOT, bench_parser, command_line, previous_results, write_results  # noqa: E402
from benchmarks._proc import process_tree_rss  # noqa: E402

BENCH = ROOT / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

CHUNK = 50_000  # generated rows per chunk (one generator seed each)
PLANT_FRAC = 0.10  # near-duplicates planted, as a share of the corpus
CONTAM_PER_KIND = 0.0002  # contaminants per (benchmark, kind), as a share of the corpus (at least 20)
THRESHOLD = 0.8  # the near-dedup default (ops.curation.dedup.NearDedupParams)

# Milliseconds per generated problem and module (mean over the three difficulties), measured on this
# 2-core machine on 2026-12-02 with 8 problems per stream (mathgen.generate(8, modules=[m])). Fixed here
# so that the allocation, hence the corpus, does not depend on the machine's load.
GEN_MS = {
    "probability__swr_p_level_set": 202.2, "probability__swr_p_sequence": 124.7, "arithmetic__simplify_surd": 79.9,
    "calculus__differentiate": 75.4, "polynomials__expand": 71.2, "polynomials__coefficient_named": 57.0,
    "algebra__polynomial_roots_composed": 34.6, "polynomials__add": 32.2, "algebra__polynomial_roots": 30.4,
    "calculus__differentiate_composed": 26.4, "polynomials__compose": 24.4, "polynomials__evaluate_composed": 23.2,
    "algebra__linear_1d_composed": 18.8, "algebra__linear_2d_composed": 13.3, "numbers__is_prime_composed": 12.6,
    "numbers__list_prime_factors_composed": 12.5, "comparison__pair_composed": 12.4, "measurement__conversion": 12.2,
    "numbers__place_value_composed": 11.7, "numbers__gcd_composed": 11.2, "comparison__closest_composed": 10.9,
    "numbers__lcm_composed": 10.6, "algebra__sequence_next_term": 10.0, "numbers__div_remainder_composed": 9.7,
    "polynomials__simplify_power": 9.6, "algebra__sequence_nth_term": 9.0, "comparison__kth_biggest_composed": 8.2,
    "comparison__sort_composed": 8.0, "polynomials__evaluate": 7.8, "numbers__is_factor_composed": 7.7,
    "polynomials__collect": 7.7, "numbers__round_number_composed": 5.8, "algebra__linear_2d": 5.2,
    "comparison__closest": 4.7, "comparison__kth_biggest": 4.6, "comparison__pair": 4.2, "comparison__sort": 4.0,
    "arithmetic__mul_div_multiple": 3.7, "arithmetic__nearest_integer_root": 3.5, "algebra__linear_1d": 3.3,
    "arithmetic__mixed": 3.3, "arithmetic__add_sub_multiple": 3.1, "numbers__lcm": 2.3, "numbers__gcd": 1.7,
    "numbers__is_factor": 1.5, "arithmetic__add_or_sub": 1.4, "arithmetic__mul": 1.3, "numbers__round_number": 1.2,
    "numbers__div_remainder": 1.1, "numbers__list_prime_factors": 1.1, "numbers__is_prime": 1.1,
    "numbers__base_conversion": 0.8, "numbers__place_value": 0.7, "arithmetic__add_or_sub_in_base": 0.7,
    "arithmetic__div": 0.6, "measurement__time": 0.3,
}

USER_SOURCES = ("bulk_generated", "planted_dups", "planted_contaminants")
BUILTIN = ("math_test", "mathematics_dataset", "mmlu_dev_val", "arc")
CONTAM_KINDS = ("copy", "light_edit", "escaped", "sibling", "rephrased")
# rephrasings only where the semantic layer looks (semantic_benchmarks = [math500]) and GSM8K (to show the limit)
REPHRASE_BENCHMARKS = ("math500", "gsm8k_test")

# The curation group, stage by stage: (name, asset keys materialized together, run config). Each selection's
# blocking checks run with it.
NO_TEACHER = {
    "annotated_problems": {"llm_label_max_rows": 0},
    "distilled_problems": {"teacher": False},
}
STAGES = [
    ("annotate", ["annotated_problems"]),
    ("exact_dedup", ["exact_deduped_problems"]),
    ("near_dedup", ["near_deduped_problems", "dedup_clusters"]),
    ("decontaminate", ["decontaminated_problems", "contamination_report"]),
    ("verify", ["distilled_problems", "verification_report", "teacher_responses"]),
    ("sample", ["sft_dataset"]),
]


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------ corpus


def gen_allocation(chunk: int = CHUNK) -> dict[str, int]:
    """Problems per (module, difficulty) in one chunk: the chunk's rows split over the modules in proportion
    to 1 / GEN_MS (equal generation time per module), at least 1 per stream."""
    inv = {m: 1.0 / t for m, t in GEN_MS.items()}
    tot = sum(inv.values())
    return {m: max(1, round(chunk * v / tot / 3)) for m, v in sorted(inv.items())}


def _code_key() -> str:
    h = hashlib.md5((ROOT / "ops/curation/mathgen.py").read_bytes())
    h.update(json.dumps(gen_allocation(), sort_keys=True).encode())
    return h.hexdigest()[:10]


def worker_gen(seed: int, out: Path) -> None:
    """One generated chunk (subprocess): every module at its allocation, generator seed ``seed``."""
    import polars as pl

    from ops.curation import mathgen

    rows = []
    for module, per in gen_allocation().items():
        for g in mathgen.generate(per, seed=seed, modules=[module]):
            level = {"train-easy": "1", "train-medium": "2", "train-hard": "3"}[g["difficulty"]]
            rows.append({"record": f"s{seed}/{g['difficulty']}/{module}/{g['index']}", "problem": g["question"],
                         "answer": g["answer"], "subject": "mathematics", "level": level, "module": module})
    from ops.lake import atomic_path

    with atomic_path(out) as tmp:
        pl.DataFrame(rows).write_parquet(tmp)


def generated_chunks(n_chunks: int, work: Path, procs: int = 2) -> tuple[list[Path], dict]:
    """Paths of ``n_chunks`` generated chunks (seeds 1..n_chunks), generating the missing ones in ``procs``
    parallel subprocesses."""
    key = _code_key()
    paths = [work / "gen" / f"chunk_s{s}_{CHUNK}_{key}.parquet" for s in range(1, n_chunks + 1)]
    missing = [(s, p) for s, p in zip(range(1, n_chunks + 1), paths) if not p.exists()]
    (work / "gen").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    running: list[subprocess.Popen] = []
    for s, p in missing:
        while len(running) >= procs:
            running = [j for j in running if j.poll() is None]
            time.sleep(0.5)
        _log(f"generating chunk seed {s} -> {p.name}")
        running.append(subprocess.Popen([sys.executable, __file__, "--worker", "gen", "--seed", str(s), "--result", str(p)],
                                        cwd=ROOT))
    for j in running:
        if j.wait() != 0:
            raise SystemExit("mathgen chunk generation failed")
    return paths, {"chunks": n_chunks, "chunk_rows_planned": sum(3 * v for v in gen_allocation().values()),
                   "generated_now": len(missing), "generation_seconds": round(time.perf_counter() - t0, 1),
                   "key": key}


def _plant_fields(row: dict) -> dict:
    """answer, solution, subject and a digit level of a planted copy, from its origin row."""
    level = row.get("level") or ""
    digit = next((c for c in level if c.isdigit()), None) if row["source"] == "math_test" else level or None
    return {"answer": row.get("answer"), "solution": row.get("solution"), "subject": row.get("subject"), "level": digit}


def contaminants(bench: list[dict], n: int, seed: int) -> list[dict]:
    """Planted contaminants: per benchmark and kind, ``max(20, CONTAM_PER_KIND * n)`` rows (at most the items
    available): ``copy`` (verbatim), ``light_edit``, ``escaped``, ``sibling`` (other numbers) from
    ops.curation.decontam_set, and ``rephrased`` (its rule-based rephrasing plus the hand-written ones) for
    REPHRASE_BENCHMARKS."""
    from ops.curation import decontam_set as ds
    from ops.curation.text import match_normalize, match_tokens

    rng = random.Random(seed + 11)
    per = max(20, round(CONTAM_PER_KIND * n))
    by: dict[str, list[dict]] = {}
    for b in bench:
        by.setdefault(b["benchmark"], []).append(b)
    out = []

    def add(b, kind, text):
        out.append({"problem": text, "answer": b.get("answer"), "benchmark": b["benchmark"], "item_id": b["item_id"],
                    "kind": kind})

    for name, items in sorted(by.items()):
        long_items = [b for b in items if len(match_tokens(b["problem"])) >= 12]
        for b in rng.sample(items, min(per, len(items))):
            add(b, "copy", b["problem"])
        for b in rng.sample(long_items, min(per, len(long_items))):
            add(b, "light_edit", ds.light_edit(b["problem"], rng))
        for b in rng.sample(items, min(per, len(items))):
            add(b, "escaped", ds.escape(b["problem"], rng))
        sib = [(b, ds.sibling(b["problem"], rng)) for b in rng.sample(long_items, min(4 * per, len(long_items)))]
        sib = [(b, s) for b, s in sib if s and match_normalize(s) != match_normalize(b["problem"])]
        for b, s in sib[:per]:
            add(b, "sibling", s)
        if name in REPHRASE_BENCHMARKS:
            prose = [b for b in long_items if "[asy]" not in b["problem"] and len(b["problem"]) < 600]
            for b in rng.sample(prose, min(per, len(prose))):
                add(b, "rephrased", ds.rephrase(b["problem"]))
            if name == "math500":
                ids = {b["item_id"]: b for b in items}
                for iid, text in ds.HAND_REPHRASED.items():
                    add(ids[iid], "rephrased", text)
    return out


def build_corpus(n: int, seed: int, work: Path, procs: int = 2, gen_cache: Path | None = None) -> dict:
    """Write the user sources (Parquet), the sources YAML and the truth table of planted rows; return the
    composition. The built-in partitions are read by the raw_problems asset itself (next step). Generated
    chunks are read from (or generated into) ``gen_cache/gen`` (default: ``work``'s parent folder); their
    generator seeds are 1..k whatever ``seed``, so one cache serves every seed."""
    import polars as pl

    from dedup_bench import perturb
    from ops.curation import sources

    t0 = time.perf_counter()
    real = sources.math_test() + sources.mmlu_dev_val() + sources.arc()
    n_builtin_gen = 3 * len(GEN_MS) * sources.RawProblemsParams().mathematics_dataset_per_module
    bench = sources.benchmark_items()
    cont = contaminants(bench, n, seed)
    n_plant = round(PLANT_FRAC * n)
    n_gen = n - len(real) - n_builtin_gen - n_plant - len(cont)
    if n_gen < 1:
        raise SystemExit(f"--n {n} is too small")
    chunk_rows = sum(3 * v for v in gen_allocation().values())
    paths, gen_info = generated_chunks(math.ceil(n_gen / chunk_rows), gen_cache or work.parent, procs)
    gen = pl.concat([pl.read_parquet(p) for p in paths]).sample(n=n_gen, seed=seed, shuffle=True)
    # planted near-duplicates: half of real rows, half of generated ones (origins drawn with replacement)
    rng = random.Random(seed)
    gen_rows = gen.select("record", "problem", "answer", "subject", "level").to_dicts()
    plants, truth = [], []
    for k in range(n_plant):
        if k % 2 == 0:
            o = real[rng.randrange(len(real))]
            fields, origin = _plant_fields(o), (o["source"], o["record"])
        else:
            o = gen_rows[rng.randrange(len(gen_rows))]
            fields, origin = {kk: o[kk] for kk in ("answer", "subject", "level")}, ("bulk_generated", o["record"])
        text, ops = perturb(o["problem"], rng)
        rec = f"dup/{k}"
        plants.append({"record": rec, "problem": text, **{f: fields.get(f) for f in ("answer", "solution", "subject", "level")}})
        truth.append({"source": "planted_dups", "record": rec, "kind": "near_dup", "ops": ",".join(ops),
                      "origin_source": origin[0], "origin_record": origin[1], "benchmark": None, "item_id": None})
    cont_rows = []
    for k, c in enumerate(cont):
        rec = f"contam/{k}"
        cont_rows.append({"record": rec, "problem": c["problem"], "answer": c["answer"]})
        truth.append({"source": "planted_contaminants", "record": rec, "kind": c["kind"], "ops": None, "origin_source": None,
                      "origin_record": None, "benchmark": c["benchmark"], "item_id": c["item_id"]})
    src_dir = work / "sources"
    src_dir.mkdir(parents=True, exist_ok=True)
    gen.drop("module").write_parquet(src_dir / "bulk_generated.parquet")
    pl.DataFrame(plants, schema={"record": pl.String, "problem": pl.String, "answer": pl.String, "solution": pl.String,
                                 "subject": pl.String, "level": pl.String}).write_parquet(src_dir / "planted_dups.parquet")
    pl.DataFrame(cont_rows, schema={"record": pl.String, "problem": pl.String, "answer": pl.String}).write_parquet(
        src_dir / "planted_contaminants.parquet")
    pl.DataFrame(truth, infer_schema_length=None).write_parquet(work / "truth.parquet")
    fields = {"problem": "problem", "answer": "answer", "subject": "subject", "level": "level", "record": "record"}
    yaml = ["sources:"]
    for name, fl in (("bulk_generated", fields), ("planted_dups", {**fields, "solution": "solution"}),
                     ("planted_contaminants", {"problem": "problem", "answer": "answer", "record": "record"})):
        yaml += [f"  - name: {name}", f"    path: {src_dir / (name + '.parquet')}", "    fields:"]
        yaml += [f"      {k}: {v}" for k, v in fl.items()]
    (work / "sources.yaml").write_text("\n".join(yaml) + "\n")
    return {
        "n": len(real) + n_builtin_gen + n_gen + n_plant + len(cont),
        "real": {**{s: sum(1 for r in real if r["source"] == s) for s in ("math_test", "mmlu_dev_val", "arc")}, "total": len(real)},
        "builtin_mathematics_dataset": n_builtin_gen,
        "bulk_generated": n_gen,
        "bulk_generated_distinct": int(gen["problem"].n_unique()),
        "bulk_generation": {**gen_info, "seeds": f"1..{len(paths)}", "rows_per_module_and_difficulty": gen_allocation(),
                            "rule": "rows per module proportional to 1 / GEN_MS (equal generation time per module)"},
        "planted_dups": n_plant,
        "planted_dups_recipe": "benchmarks/dedup_bench.py:perturb of a uniformly drawn origin: even k a real row "
                               "(MATH test, MMLU dev/val, ARC), odd k a bulk_generated row; answer/solution/subject carried over",
        "planted_contaminants": len(cont),
        "planted_contaminants_by_benchmark_kind": pl.DataFrame(cont).group_by("benchmark", "kind").len()
        .sort("benchmark", "kind").rows() if cont else [],
        "build_seconds": round(time.perf_counter() - t0, 1),
    }


# ------------------------------------------------------------------------------------------ stages


def _dagster_env(work: Path) -> None:
    os.environ["CRUCIBLE_SOURCES"] = str(work / "sources.yaml")
    os.environ["CRUCIBLE_HOME"] = str(work / "lake")
    os.environ.pop("CRUCIBLE_PROFILE", None)


def _defs():
    import dagster as dg

    from assets import curation, curation_checks, distillation, sources
    from resources.lake import LakeResource
    from resources.sources import SourcesResource
    from resources.teacher import TeacherResource

    assets = dg.load_assets_from_modules([sources, curation, distillation])
    checks = dg.load_asset_checks_from_modules([curation_checks])
    return assets, checks, {"lake": LakeResource(root=os.environ["CRUCIBLE_HOME"]), "sources": SourcesResource(),
                            "teacher": TeacherResource()}


def _step_times(instance, run_id: str) -> dict:
    """Seconds per step (asset op and each check op) from the run's event log."""
    start, end = {}, {}
    for e in instance.all_logs(run_id):
        ev = e.dagster_event
        if ev is None or ev.step_key is None:
            continue
        if ev.event_type_value == "STEP_START":
            start[ev.step_key] = e.timestamp
        elif ev.event_type_value in ("STEP_SUCCESS", "STEP_FAILURE"):
            end[ev.step_key] = e.timestamp
    return {k: round(end[k] - start[k], 2) for k in start if k in end}


def _small(value) -> bool:
    """Numbers, and JSON metadata (dicts, lists) short enough for the results file."""
    if isinstance(value, (int, float, bool)):
        return True
    return isinstance(value, (dict, list)) and len(json.dumps(value, default=str)) < 3000


def _materialize(selection: list[str], partition: str | None, run_config: dict) -> dict:
    import dagster as dg

    from assets.sources import sync_source_partitions

    assets, checks, resources = _defs()
    instance = dg.DagsterInstance.ephemeral()
    # raw_problems is partitioned by source on a dynamic partitions definition: an ephemeral instance holds
    # none until they are added (built-in sources, then the sources YAML's: what the sources sensor keeps)
    sync_source_partitions(instance)
    t0 = time.perf_counter()
    run_config = {**run_config, "loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    res = dg.materialize([*assets, *checks], selection=selection, partition_key=partition, resources=resources,
                         run_config=run_config, instance=instance, raise_on_error=False)
    wall = time.perf_counter() - t0
    meta, checks_out = {}, {}
    for ev in res.all_events:
        if ev.event_type_value == "ASSET_MATERIALIZATION":
            m = ev.event_specific_data.materialization
            meta[m.asset_key.to_user_string()] = {k: v.value for k, v in m.metadata.items() if _small(v.value)}
        elif ev.event_type_value == "ASSET_CHECK_EVALUATION":
            c = ev.event_specific_data
            checks_out[c.check_name] = {"passed": c.passed, **{k: v.value for k, v in c.metadata.items()
                                                               if isinstance(v.value, (int, float, bool))}}
    failure = None
    if not res.success:
        for ev in res.all_events:
            if ev.event_type_value == "STEP_FAILURE":
                failure = str(ev.event_specific_data.error.message)[:2000]
    return {"success": res.success, "wall_s": round(wall, 2), "steps_s": _step_times(instance, res.run_id),
            "metadata": meta, "checks": checks_out, "failure": failure}


def worker_stage(work: Path, stage: str, result: Path) -> None:
    """Materialize one stage (subprocess); write its report to ``result``."""
    _dagster_env(work)
    t0 = time.perf_counter()
    if stage == "sources":
        out = {"partitions": {}}
        cfg = {"ops": {"raw_problems": {"config": {}}}}
        for key in BUILTIN + USER_SOURCES:
            out["partitions"][key] = _materialize(["raw_problems"], key, cfg)
            _log(f"raw_problems[{key}]: {out['partitions'][key]['wall_s']} s")
            if not out["partitions"][key]["success"]:
                raise SystemExit(out["partitions"][key]["failure"])
        out["benchmark_problems"] = _materialize(["benchmark_problems"], None, {})
        out["success"] = all(v["success"] for v in out["partitions"].values()) and out["benchmark_problems"]["success"]
    else:
        sel = dict(STAGES)[stage]
        cfg = {"ops": {op: {"config": c} for op, c in NO_TEACHER.items() if op in sel}}
        out = _materialize(sel, None, cfg)
    out["process_wall_s"] = round(time.perf_counter() - t0, 2)
    result.write_text(json.dumps(out, default=str))


class TreeSampler:
    """Peak summed RSS of a process and all its descendants, sampled every ``every`` seconds (psutil)."""

    def __init__(self, pid: int, every: float = 0.2):
        self.pid = pid
        self.every, self.peak, self.peak_procs = every, 0, 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        import psutil

        while not self._stop.is_set():
            try:
                total, procs = process_tree_rss(self.pid)
            except psutil.Error:
                return
            if total > self.peak:
                self.peak, self.peak_procs = total, procs
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._t.join()


def run_stage(work: Path, stage: str) -> dict:
    """Run ``stage`` in a fresh subprocess; its report plus wall time, peak RSS (wait4) and tree peak."""
    result = work / f"stage_{stage}.json"
    result.unlink(missing_ok=True)
    _log(f"stage {stage} ...")
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--worker", "stage", "--stage", stage, "--work", str(work),
                             "--result", str(result)], cwd=ROOT)
    sampler = TreeSampler(proc.pid)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    sampler.stop()
    proc.returncode = os.waitstatus_to_exitcode(status)
    rep = json.loads(result.read_text()) if result.exists() else {"success": False, "failure": f"exit {proc.returncode}"}
    rep.update(stage=stage, subprocess_wall_s=round(wall, 2), peak_rss_mb=round(ru.ru_maxrss / 1024, 1),
               peak_tree_rss_mb=round(sampler.peak / 2**20, 1), tree_processes_at_peak=sampler.peak_procs,
               cpu_s=round(ru.ru_utime + ru.ru_stime, 1), loadavg_1m_before=round(load0, 2),
               loadavg_1m_after=round(os.getloadavg()[0], 2), exit_code=proc.returncode)
    _log(f"stage {stage}: {wall:.1f} s, peak {rep['peak_rss_mb']} MB (tree {rep['peak_tree_rss_mb']} MB), "
         f"success {rep.get('success')}")
    return rep


# ------------------------------------------------------------------------------------------ scoring


def score(work: Path) -> dict:
    """Planted duplicates and contaminants against the lake's tables."""
    import numpy as np
    import polars as pl

    from ops.curation import minhash
    from ops.curation.text import normalize

    from resources.lake import LakeResource

    lake = LakeResource(root=str(work / "lake"))           # the lake's tables are Delta tables: read through it
    truth = pl.read_parquet(work / "truth.parquet")
    raw = pl.concat([lake.read("raw_problems", k).select("problem_id", "source", "record", "problem")
                     for k in BUILTIN + USER_SOURCES])
    ids = raw.select("source", "record", "problem_id")
    valid = set(lake.read("annotated_problems").filter(pl.col("is_valid"))["problem_id"].to_list())
    clusters = lake.read("dedup_clusters")
    removed = clusters.filter(~pl.col("is_survivor")).select("problem_id", "cluster_id", "stage")
    near_kept = set(lake.read("near_deduped_problems")["problem_id"].to_list())
    decon_kept = lake.read("decontaminated_problems").select("problem_id")
    report = lake.read("contamination_report").select("problem_id", "layer", rep_item="item_id")
    # survivor's fate: the final cluster id of every removed row, then whether that survivor was decontaminated
    fate = removed.join(report.rename({"problem_id": "cluster_id", "layer": "survivor_layer", "rep_item": "survivor_item"}),
                        on="cluster_id", how="left")
    t = truth.join(ids, on=["source", "record"], how="left")
    out: dict = {}
    # -- duplicates
    d = t.filter(pl.col("kind") == "near_dup").join(
        ids.rename({"source": "origin_source", "record": "origin_record", "problem_id": "origin_id"}),
        on=["origin_source", "origin_record"], how="left")
    d = d.join(raw.select("problem_id", "problem"), on="problem_id").join(
        raw.select(origin_id="problem_id", origin_problem="problem"), on="origin_id")
    texts = d["problem"].to_list() + d["origin_problem"].to_list()
    batch = minhash.shingle_batch([normalize(x) for x in texts])
    m = d.height
    jac = minhash.pair_jaccard(batch, np.stack([np.arange(m), np.arange(m) + m], axis=1).astype(np.int64))
    same = np.array([normalize(a) == normalize(b) for a, b in zip(d["problem"].to_list(), d["origin_problem"].to_list())])
    d = d.with_columns(jaccard=pl.Series(jac), identical=pl.Series(same))
    d = d.join(removed, on="problem_id", how="left")
    both_valid = [p in valid and o in valid for p, o in zip(d["problem_id"].to_list(), d["origin_id"].to_list())]
    d = d.with_columns(both_valid=pl.Series(both_valid))
    # detectable: both rows reach dedup (annotation drops invalid rows, e.g. MMLU subjects outside STEM) and the copy
    # is within the near-dedup threshold of its origin
    d = d.with_columns(detectable=pl.col("both_valid") & (pl.col("identical") | (pl.col("jaccard") >= THRESHOLD - 1e-12)),
                       caught=pl.col("stage").is_not_null())
    det = d.filter(pl.col("detectable"))
    out["duplicates"] = {
        "planted": m,
        "copy_or_origin_invalid (dropped by annotation, never reach dedup)": int((~d["both_valid"]).sum()),
        "detectable (both valid; normalised copy or shingle Jaccard >= 0.8 with the origin)": det.height,
        "removed_by_dedup": int(d["caught"].sum()),
        "recall_on_detectable": round(float(det["caught"].mean()), 4) if det.height else None,
        "removed_by_stage": dict(d.filter(pl.col("caught")).group_by("stage").len().rows()),
        "identical_after_normalize": int(same.sum()),
        "recall_identical": round(float(d.filter(pl.col("identical"))["caught"].mean()), 4) if same.any() else None,
        "removed_among_not_detectable": int(d.filter(~pl.col("detectable"))["caught"].sum()),
        "recall_by_origin": {s: round(float(g["caught"].mean()), 4) for (s,), g in det.group_by("origin_source")},
    }
    # -- contaminants: leak = the row, or the survivor that absorbed it, reached decontaminated_problems
    c = t.filter(pl.col("kind") != "near_dup").join(fate.select("problem_id", "stage", "cluster_id", "survivor_layer"),
                                                     on="problem_id", how="left")
    c = c.join(report, on="problem_id", how="left").with_columns(
        valid=pl.col("problem_id").is_in(pl.Series(list(valid), dtype=pl.String).implode()))
    kept = set(decon_kept["problem_id"].to_list())
    leaked = [(pid in kept) or (cid is not None and cid in kept) for pid, cid in zip(c["problem_id"].to_list(), c["cluster_id"].to_list())]
    c = c.with_columns(leaked=pl.Series(leaked),
                       caught_by=pl.coalesce(pl.col("layer"), pl.when(pl.col("survivor_layer").is_not_null())
                                             .then(pl.lit("dedup->") + pl.col("survivor_layer")),
                                             pl.when(~pl.col("valid")).then(pl.lit("invalid (annotation)"))))
    per = (c.group_by("benchmark", "kind").agg(planted=pl.len(), leaked=pl.col("leaked").sum())
           .with_columns(recall=(1 - pl.col("leaked") / pl.col("planted")).round(4)).sort("benchmark", "kind"))
    out["contaminants"] = {
        "planted": c.height,
        "leaked": int(c["leaked"].sum()),
        "recall": round(1 - float(c["leaked"].mean()), 4),
        "recall_excluding_rephrased_outside_semantic_benchmarks": round(1 - float(
            c.filter(~((pl.col("kind") == "rephrased") & (pl.col("benchmark") != "math500")))["leaked"].mean()), 4),
        "by_benchmark_kind": [dict(zip(per.columns, r)) for r in per.rows()],
        "caught_by_layer": dict(c.filter(~pl.col("leaked")).group_by("caught_by").len().sort("caught_by").rows()),
        "leaked_examples": c.filter(pl.col("leaked")).join(raw.select("problem_id", "problem"), on="problem_id")
        .select("benchmark", "kind", "item_id", pl.col("problem").str.slice(0, 160)).head(12).rows(),
    }
    # -- what decontamination removed that was not planted (no ground truth beyond MATH-500 for those)
    rep = report.join(raw.select("problem_id", "source"), on="problem_id")
    out["decontamination_removed_by_source_layer"] = rep.group_by("source", "layer").len().sort("source", "layer").rows()
    out["near_deduped_rows"] = len(near_kept)
    return out


# ------------------------------------------------------------------------------------------ main


def machine() -> dict:
    import psutil

    return {"nproc": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "memory_available_gib_at_start": round(psutil.virtual_memory().available / 2**30, 1),
            "platform": platform.platform(), "python": platform.python_version(),
            "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def main() -> int:
    ap = bench_parser(__doc__, "curation_scale.json", full_doc=True, out_help="'' = do not write")
    ap.add_argument("--n", type=int, default=1_000_000, help="problems in the corpus")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None, help="default benchmarks/.work/curation_scale/n<N>")
    ap.add_argument("--procs", type=int, default=2, help="parallel generator processes")
    ap.add_argument("--gen-cache", type=Path, default=None,
                    help="folder whose gen/ holds the generated chunks (default: the parent of --work)")
    ap.add_argument("--stages", default="all", help="comma-separated subset of: sources," + ",".join(s for s, _ in STAGES) + "; or score (rescore the lake)")
    ap.add_argument("--worker", choices=["gen", "stage"], help=argparse.SUPPRESS)
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "gen":
        worker_gen(args.seed, args.result)
        return 0
    if args.worker == "stage":
        worker_stage(args.work, args.stage, args.result)
        return 0
    work = (args.work or BENCH / ".work" / "curation_scale" / f"n{args.n}").resolve()
    work.mkdir(parents=True, exist_ok=True)
    wanted = [s.strip() for s in args.stages.split(",")] if args.stages != "all" else ["sources"] + [s for s, _ in STAGES]
    score_only = wanted == ["score"]
    if score_only:
        wanted = []
    command = command_line(__file__)
    result = {"commands": [command], "machine": machine(), "target": {"curation_group_wall_s": 900, "peak_memory_gb": 8}}
    prev = work / "result.json"
    if prev.exists() and args.stages != "all":  # a partial run adds to the previous one's record
        old = previous_results(prev)
        result = {**old, "machine": result["machine"], "commands": old.get("commands", []) + [command]}
    if "sources" in wanted:
        result["corpus"] = build_corpus(args.n, args.seed, work, args.procs, args.gen_cache)
        _log(f"corpus: {json.dumps({k: v for k, v in result['corpus'].items() if not isinstance(v, (dict, list))})}")
    stages = result.setdefault("stages", {})
    for stage in wanted:
        stages[stage] = run_stage(work, stage)
        write_results(result, prev, indent=2)
        if not stages[stage].get("success"):
            _log(f"stage {stage} failed: {stages[stage].get('failure')}")
            break
    done = [s for s, _ in STAGES if stages.get(s, {}).get("success")]
    if len(done) == len(STAGES):
        result["score"] = score(work)
        group_wall = sum(stages[s]["subprocess_wall_s"] for s, _ in STAGES)
        peak = max(stages[s]["peak_tree_rss_mb"] for s, _ in STAGES)
        result["summary"] = {
            "corpus_rows": result.get("corpus", {}).get("n"),
            "curation_group_wall_s": round(group_wall, 1),
            "wall_s_by_stage": {s: stages[s]["subprocess_wall_s"] for s, _ in STAGES},
            "peak_rss_mb_by_stage": {s: stages[s]["peak_tree_rss_mb"] for s, _ in STAGES},
            "peak_memory_mb": peak,
            "meets_time_target": group_wall < 900,
            "meets_memory_target": peak < 8 * 1024,
            "rows_out_by_stage": {s: {k: v.get("rows_out") for k, v in stages[s].get("metadata", {}).items()} for s, _ in STAGES},
        }
        _log(json.dumps(result["summary"], indent=2))
    write_results(result, prev, indent=2)
    if args.out:
        write_results(result, args.out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
