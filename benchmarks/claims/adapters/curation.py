"""``run_seed`` of the curation-scale claim: ``benchmarks/curation_scale.py`` once, from ingest
(``raw_problems`` of every source partition and ``benchmark_problems``: its ``sources`` stage) to
``sft_dataset``, in one invocation on one commit, on a fresh lake in the seed's work folder.

One seed = one invocation with ``--seed`` (the planted duplicates and contaminants are drawn with it;
the generated chunks are cached by ``curation_scale`` under ``benchmarks/.work/curation_scale/gen``,
shared by every seed (their generator seeds are fixed), keyed by the generator and the allocation; they
are input data, not pipeline work: their generation is not timed, nor is writing the corpus files).
Arms: ``crucible`` (the measured run) and ``target`` (the budget the claim is tested against:
``target_wall_s`` seconds and ``target_peak_mb`` MiB, constants), so the claim's ratio is
target / measured: > 1 when the run is within the budget.

Returned for ``crucible``: ``wall_s`` (sum of every stage's subprocess wall time, ingest included),
``peak_rss_mb`` (the largest process-tree peak of any stage, MiB), ``ingest_s`` and ``<stage>_s`` per
stage, ``rows_sft`` (rows of sft_dataset).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def run_seed(seed: int, arm_order: list[str], workdir: Path, n: int = 1_000_000, target_wall_s: float = 900.0,
             target_peak_mb: float = 8192.0, timeout_minutes: float = 120.0) -> dict:
    """One full invocation (module docstring). Raises RuntimeError when the invocation fails or a stage
    did not succeed, ValueError for an unknown arm."""
    bad = [a for a in arm_order if a not in ("crucible", "target")]
    if bad:
        raise ValueError(f"curation run_seed: unknown arms {bad}; known ['crucible', 'target']")
    work = workdir / f"n{n}"
    out_json = workdir / "curation_scale.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "curation_scale.py"), "--n", str(n), "--seed", str(seed),
           "--work", str(work), "--gen-cache", str(ROOT / "benchmarks" / ".work" / "curation_scale"),
           "--stages", "all", "--out", str(out_json)]
    with open(workdir / "curation_scale.log", "w") as log:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            rc = p.wait(timeout=timeout_minutes * 60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=60)
            raise RuntimeError(f"curation_scale did not finish within {timeout_minutes} min")
    if rc != 0 or not out_json.exists():
        raise RuntimeError(f"curation_scale failed (exit {rc}): {(workdir / 'curation_scale.log').read_text()[-2000:]}")
    res = json.loads(out_json.read_text())
    stages = res.get("stages", {})
    failed = [s for s, v in stages.items() if not v.get("success")]
    if failed or "sources" not in stages or "sample" not in stages:
        raise RuntimeError(f"curation_scale: stages failed or missing: {failed or sorted(stages)}")
    meas = {"wall_s": sum(v["subprocess_wall_s"] for v in stages.values()),
            "peak_rss_mb": max(v["peak_tree_rss_mb"] for v in stages.values()),
            "ingest_s": stages["sources"]["subprocess_wall_s"],
            **{f"{s}_s": v["subprocess_wall_s"] for s, v in stages.items() if s != "sources"},
            "rows_in": res.get("corpus", {}).get("n")}
    return {"crucible": meas, "target": {"wall_s": target_wall_s, "peak_rss_mb": target_peak_mb}}
