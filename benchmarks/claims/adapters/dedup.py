"""``run_seed`` of the dedup-speed claims: Crucible's near-dedup against datasketch and rensa, every
tool in a fresh process, timed the same way, cold and warm.

One seed = one corpus: ``benchmarks.dedup_bench.build_corpus(n, seed)`` (real texts, DeepMind
``mathematics_dataset`` problems generated with this seed, 30% planted near-duplicates, shuffled with
this seed), its exact ground truth (every pair with shingle Jaccard >= 0.8 by prefix-filtering join,
``dedup_bench.prefix_join``), then each tool in a fresh Python process in the seed's arm order:

* the corpus is read into a list of strings before the clock starts (the same for every tool);
* **cold** = import of the tool + its own tokenisation + the first full call (JIT compilation,
  allocations and all): what a user pays running the tool once on a new corpus;
* **warm** = a second full call in the same process (tokenisation included again).

Tools, each used as its documentation shows, with its own tokenisation:

* ``crucible``: ``ops.curation.dedup.near_dedup(texts, rank, threshold=0.8, num_perm=128)`` (its own
  shingling: normalised word 5-grams, char 3-grams under 5 tokens; exact verification).
* ``datasketch`` 2.x: word 5-grams of ``text.lower().split()``, ``MinHash.bulk(num_perm=128)``,
  ``MinHashLSH(threshold=0.8)`` filled in one ``insertion_session``, ``query`` per document, a
  candidate removed when its MinHash estimate with the survivor is >= 0.8 (star clustering in input
  order).
* ``rensa`` 0.5: the same word 5-grams, ``RMinHashDeduplicator(threshold=0.8, num_perm=128,
  use_lsh=True).add_pairs`` (its streaming deduplicator), ``get_duplicate_sets`` for who matched.

Precision and recall are scored against the ground truth with ``dedup_bench.score`` (precision: share
of removed documents whose exact Jaccard with the document they were mapped to is >= 0.8; recall:
share of ground-truth pairs not both kept). Peak memory: the worker process's VmHWM. A tool that does
not finish within ``timeout_minutes`` (cold and warm calls together) is killed with ``timed_out: 1``,
no warm time and no precision/recall; its cold time is the measured one when the cold call had
finished (the worker writes it before the warm call), else the limit (a lower bound: the speed-up
against it is then a lower bound too).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TOOLS = ("crucible", "datasketch", "rensa")
THRESHOLD, NUM_PERM, WORD_N = 0.8, 128, 5


def _vm_hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _word_shingles(text: str) -> list[str]:
    toks = text.lower().split()
    if len(toks) < WORD_N:
        return [" ".join(toks)]
    return sorted({" ".join(toks[i:i + WORD_N]) for i in range(len(toks) - WORD_N + 1)})


def _star(cands, accept) -> tuple[list[bool], dict[int, list[int]]]:
    n = len(cands)
    keep, assigned, mapped = [True] * n, bytearray(n), {}
    for d in range(n):
        if assigned[d]:
            continue
        assigned[d] = 1
        for c in cands[d]:
            if not assigned[c] and accept(d, c):
                assigned[c] = 1
                keep[c] = False
                mapped[c] = [d]
    return keep, mapped


def _crucible(texts):
    import numpy as np

    from ops.curation.dedup import near_dedup

    res = near_dedup(texts, np.arange(len(texts), dtype=np.int64), threshold=THRESHOLD, num_perm=NUM_PERM)
    keep = res.keep.tolist()
    return keep, {i: [int(res.survivor[i])] for i in range(len(texts)) if not keep[i]}


def _datasketch(texts):
    from datasketch import MinHash, MinHashLSH

    sh = [[s.encode("utf-8") for s in _word_shingles(t)] for t in texts]
    mhs = MinHash.bulk(sh, num_perm=NUM_PERM)
    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM)
    with lsh.insertion_session() as session:
        for i, m in enumerate(mhs):
            session.insert(i, m, check_duplication=False)
    cands = [sorted(lsh.query(m)) for m in mhs]
    return _star(cands, lambda d, c: mhs[d].jaccard(mhs[c]) >= THRESHOLD)


def _rensa(texts):
    from rensa import RMinHashDeduplicator

    sh = [_word_shingles(t) for t in texts]
    keys = [str(i) for i in range(len(texts))]
    ded = RMinHashDeduplicator(threshold=THRESHOLD, num_perm=NUM_PERM, use_lsh=True)
    added = list(ded.add_pairs(zip(keys, sh)))
    removed = [i for i, a in enumerate(added) if not a]
    hits = ded.get_duplicate_sets([sh[i] for i in removed])
    return [bool(a) for a in added], {r: [int(k) for k in h] for r, h in zip(removed, hits)}


def worker(tool: str, corpus: Path, result: Path) -> None:
    """One tool in this fresh process (module docstring): cold and warm wall seconds, peak RSS, and
    the warm call's keep flags and mappings, written to ``result`` (JSON)."""
    with open(corpus, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    base_rss = _vm_hwm_mb()
    t0 = time.perf_counter()
    fn = {"crucible": _crucible, "datasketch": _datasketch, "rensa": _rensa}[tool]
    fn(texts)                                  # imports happen inside: counted in cold
    cold = time.perf_counter() - t0
    # the cold time survives a warm call cut by the time limit (then the cold figure is measured, not the limit)
    result.with_suffix(".cold.json").write_text(json.dumps({"cold_s": cold, "peak_rss_mb": _vm_hwm_mb()}))
    t1 = time.perf_counter()
    keep, mapped = fn(texts)
    warm = time.perf_counter() - t1
    result.write_text(json.dumps({"cold_s": cold, "warm_s": warm, "peak_rss_mb": _vm_hwm_mb(),
                                  "corpus_loaded_rss_mb": base_rss, "keep": keep,
                                  "mapped": {str(k): v for k, v in mapped.items()}}))


def _tree_rss_bytes(pid: int) -> int:
    """Summed RSS (bytes) of ``pid``'s process tree (``benchmarks._proc.process_tree_rss``); 0 once it is gone."""
    import psutil

    from benchmarks._proc import process_tree_rss

    try:
        return process_tree_rss(pid)[0]
    except psutil.Error:
        return 0


def _run_tool(tool: str, corpus: Path, workdir: Path, timeout_s: float, memory_cap_gib: float | None = None) -> dict | None:
    """The tool's worker in a fresh process group. Returns its result; when it ran past ``timeout_s``
    (killed) ``{"cold_only": {cold_s, peak_rss_mb}}`` if its cold call had finished, else None; or
    ``{"memory_capped": peak_bytes}`` when its process tree's RSS passed ``memory_cap_gib`` (killed;
    checked every 0.5 s). Raises RuntimeError when the worker exits non-zero on its own."""
    out = workdir / f"{tool}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cap = None if memory_cap_gib is None else memory_cap_gib * 2**30
    with open(workdir / f"{tool}.log", "w") as log:
        p = subprocess.Popen([sys.executable, "-m", "benchmarks.claims.adapters.dedup", tool, str(corpus), str(out)],
                             cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        rc = None
        while rc is None:
            try:
                rc = p.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                rss = _tree_rss_bytes(p.pid) if cap is not None else 0
                if time.monotonic() > deadline or (cap is not None and rss > cap):
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(timeout=60)
                    if cap is not None and rss > cap:
                        return {"memory_capped": rss}
                    cold = out.with_suffix(".cold.json")
                    return {"cold_only": json.loads(cold.read_text())} if cold.exists() else None
    if rc != 0:
        raise RuntimeError(f"dedup {tool} failed (exit {rc}): {(workdir / f'{tool}.log').read_text()[-2000:]}")
    return json.loads(out.read_text())


def run_seed(seed: int, arm_order: list[str], workdir: Path, n: int = 100_000, plant_frac: float = 0.30,
             timeout_minutes: float = 30.0, corpus: str = "generated", memory_cap_gib: float | None = None,
             base_generated: int = 20_000) -> dict:
    """One corpus of ``n`` problems drawn with ``seed``; every tool of ``arm_order`` (names in
    ``TOOLS``) timed cold and warm in a fresh process.

    ``corpus``: ``"generated"`` (``dedup_bench.build_corpus``: every non-real problem generated by
    ``mathematics_dataset``; the 100k claim) or ``"expanded"`` (``benchmarks/dedup_corpus.py``: real texts
    and ``base_generated`` generated questions expanded by seeded re-numbering, with planted
    near-duplicates; corpus and ground truth cached on disk by seed; the 10M claim). ``memory_cap_gib``:
    a tool whose process tree's RSS passes it is killed and reported with ``memory_capped: 1`` and no
    time (a time limit gives a lower bound of the time; a memory kill gives none); the key is present
    only when a cap is set, so the 100k claim's results keep their fields.

    Returns {tool: {cold_s, warm_s, peak_rss_mb, precision, recall, timed_out, memory_capped}} (seconds,
    MiB, fractions). Raises ValueError for an unknown tool or corpus, RuntimeError when a tool's process
    fails (other than by the time or memory limit)."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import dedup_bench as db

    from ops.curation import minhash

    bad = [a for a in arm_order if a not in TOOLS]
    if bad:
        raise ValueError(f"dedup run_seed: unknown tools {bad}; known {TOOLS}")
    if corpus not in ("generated", "expanded"):
        raise ValueError(f"dedup run_seed: corpus {corpus!r}; known 'generated', 'expanded'")
    cache = ROOT / "benchmarks" / ".work"
    if corpus == "generated":
        texts, _kind, _origin, _info = db.build_corpus(n, seed, plant_frac, cache)
        corpus_path = workdir / "corpus.jsonl"
        with open(corpus_path, "w", encoding="utf-8") as f:
            for i, t in enumerate(texts):
                f.write(json.dumps({"id": str(i), "text": t}) + "\n")
        batch = minhash.shingle_batch(texts)
        ss = db.ShingleSets(batch.values, batch.offsets)
        gt = db.prefix_join(ss, THRESHOLD)[0]
        del batch
    else:
        import dedup_corpus

        corpus_path, truth_path, info = dedup_corpus.cached(n, seed, plant_frac, cache, base_generated=base_generated)
        (workdir / "corpus_info.json").write_text(json.dumps(info, indent=1, default=str))
        gt = np.load(truth_path)["pairs"]
        texts = ss = None  # built after the tools ran: the parent holds no corpus while they run
    out = {}
    for tool in arm_order:
        r = _run_tool(tool, corpus_path, workdir, timeout_minutes * 60, memory_cap_gib)
        if r is not None and "cold_only" in r:  # cold finished, the warm call ran past the limit
            out[tool] = {"cold_s": r["cold_only"]["cold_s"], "warm_s": None, "timed_out": 1,
                         "peak_rss_mb": r["cold_only"]["peak_rss_mb"], "precision": None, "recall": None}
            if memory_cap_gib is not None:
                out[tool]["memory_capped"] = 0
            continue
        if r is None or "memory_capped" in r:
            capped = r is not None
            out[tool] = {"cold_s": None if capped else timeout_minutes * 60, "warm_s": None,
                         "timed_out": 0 if capped else 1,
                         "peak_rss_mb": (r["memory_capped"] / 2**20) if capped else None,
                         "precision": None, "recall": None}
            if memory_cap_gib is not None:
                out[tool]["memory_capped"] = int(capped)
            continue
        out[tool] = r
    if ss is None:
        texts = db._load_texts(corpus_path)
        batch = minhash.shingle_batch(texts)
        del texts
        ss = db.ShingleSets(batch.values, batch.offsets)
        del batch
    for tool, r in list(out.items()):
        if "keep" not in r:
            continue
        keep = np.array(r["keep"], dtype=bool)
        mapped = {int(k): v for k, v in r["mapped"].items()}
        sc = db.score(keep, mapped, ss, gt)
        out[tool] = {"cold_s": r["cold_s"], "warm_s": r["warm_s"], "timed_out": 0,
                     "peak_rss_mb": r["peak_rss_mb"], "precision": sc["precision"], "recall": sc["recall"],
                     "removed": sc["removed"], "ground_truth_pairs": sc["ground_truth_pairs"]}
        if memory_cap_gib is not None:
            out[tool]["memory_capped"] = 0
    return out


if __name__ == "__main__":
    worker(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
